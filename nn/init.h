// nn/init.h — nn::init: torch.nn.init's initializers, same names, arguments, defaults and numbers.
//
// Each fills its tensor in place under NoGradGuard (so it works on parameters that require grad) with values
// drawn from `generator`, or from the default generator (mixtape::manual_seed) when it is null, and returns the
// tensor. uniform_ (and the kaiming/xavier uniforms) draw in the tensor's dtype on its device; normal_ (and the
// kaiming/xavier normals) draw f64 on the CPU and round mean + std·z once into the tensor.
//
//   mt::manual_seed(0);
//   mt::nn::init::kaiming_normal_(conv.weight, 0.0, "fan_out", "relu");
//   mt::nn::init::zeros_(conv.bias);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>

namespace mixtape::nn::init {

/// The recommended gain for a nonlinearity (torch.nn.init.calculate_gain): 1 for "linear", "conv1d", "conv2d",
/// "conv3d", "conv_transpose1d/2d/3d" and "sigmoid"; 5/3 for "tanh"; √2 for "relu"; √(2 / (1 + slope²)) for
/// "leaky_relu" (slope `param`, default 0.01); 3/4 for "selu". Anything else is an error.
double calculate_gain(const std::string& nonlinearity, std::optional<double> param = std::nullopt);

/// (fan_in, fan_out) of a weight of at least 2 dims: size(1)·receptive field and size(0)·receptive field, the
/// receptive field being the product of the dims after the first two.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

/// Values uniform in [a, b).
Tensor uniform_(const Tensor& tensor, double a = 0.0, double b = 1.0, Generator* generator = nullptr);
/// Values from N(mean, std²).
Tensor normal_(const Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
Tensor constant_(const Tensor& tensor, double value);
Tensor zeros_(const Tensor& tensor);
Tensor ones_(const Tensor& tensor);

/// He et al. (2015), uniform: U(−bound, bound), bound = gain·√(3 / fan), gain = calculate_gain(nonlinearity, a);
/// mode "fan_in" (keeps the forward's variance) or "fan_out" (the backward's).
Tensor kaiming_uniform_(const Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu", Generator* generator = nullptr);
/// He et al. (2015), normal: N(0, std²), std = gain / √fan.
Tensor kaiming_normal_(const Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                       const std::string& nonlinearity = "leaky_relu", Generator* generator = nullptr);
/// Glorot & Bengio (2010), uniform: U(−a, a), a = gain·√(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(const Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);
/// Glorot & Bengio (2010), normal: N(0, std²), std = gain·√(2 / (fan_in + fan_out)).
Tensor xavier_normal_(const Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);

}  // namespace mixtape::nn::init
