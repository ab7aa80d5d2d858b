// nn/init.cpp — nn::init: the initializers of torch.nn.init.
//
// Every draw is made in f64 (normal) or in the tensor's dtype (uniform, whose draws are exact in it), scaled in
// f64 and copied into the tensor once, under NoGradGuard: one rounding per value, whatever the tensor's dtype.
#include <mixtape/nn/init.h>

#include <cmath>

#include <mixtape/autograd/autograd.h>
#include <mixtape/ops/ops.h>

namespace mixtape::nn::init {

namespace {

void check_tensor(const char* fn, const Tensor& t) {
  MT_CHECK(t.defined(), "nn::init::", fn, ": the tensor is undefined");
  MT_CHECK(is_floating(t.dtype()), "nn::init::", fn, ": expected a floating tensor, got ", t.dtype(), " (shape ",
           t.shape(), ")");
}

/// Writes `values` (any dtype, on the CPU or t's device) into t, rounding once.
Tensor fill_from(const Tensor& t, const Tensor& values) {
  autograd::NoGradGuard no_grad;
  Tensor out = t;
  out.copy_(values);
  return out;
}

int64_t fan(const char* fn, const Tensor& t, const std::string& mode) {
  MT_CHECK(mode == "fan_in" || mode == "fan_out", "nn::init::", fn, ": mode \"", mode,
           "\" not supported, please use one of fan_in, fan_out");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return mode == "fan_in" ? fan_in : fan_out;
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, std::optional<double> param) {
  for (const char* linear : {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                             "conv_transpose3d", "sigmoid"})
    if (nonlinearity == linear) return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    const double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (nonlinearity == "selu") return 3.0 / 4.0;
  MT_CHECK(false, "nn::init::calculate_gain: unsupported nonlinearity \"", nonlinearity, "\"");
  return 0.0;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  MT_CHECK(tensor.defined(), "nn::init::calculate_fan_in_and_fan_out: the tensor is undefined");
  MT_CHECK(tensor.dim() >= 2, "nn::init: fan in and fan out can not be computed for a tensor with fewer than 2 "
           "dimensions (shape ", tensor.shape(), ")");
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

Tensor uniform_(const Tensor& tensor, double a, double b, Generator* generator) {
  check_tensor("uniform_", tensor);
  MT_CHECK(std::isfinite(a) && std::isfinite(b) && a <= b, "nn::init::uniform_: expected a finite range a <= b, "
           "got [", a, ", ", b, ")");
  return fill_from(tensor, uniform(tensor.shape(), a, b, TensorOptions(tensor.dtype()).device(tensor.device()),
                                   generator));
}

Tensor normal_(const Tensor& tensor, double mean, double std, Generator* generator) {
  check_tensor("normal_", tensor);
  MT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "nn::init::normal_: expected a finite mean and "
           "std >= 0, got mean ", mean, ", std ", std);
  autograd::NoGradGuard no_grad;
  return fill_from(tensor, add(mul(randn(tensor.shape(), TensorOptions(DType::kF64), generator), std), mean));
}

Tensor constant_(const Tensor& tensor, double value) {
  check_tensor("constant_", tensor);
  autograd::NoGradGuard no_grad;
  Tensor out = tensor;
  out.fill_(value);
  return out;
}

Tensor zeros_(const Tensor& tensor) { return constant_(tensor, 0.0); }
Tensor ones_(const Tensor& tensor) { return constant_(tensor, 1.0); }

Tensor kaiming_uniform_(const Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity,
                        Generator* generator) {
  check_tensor("kaiming_uniform_", tensor);
  if (tensor.numel() == 0) return tensor;  // nothing to draw (PyTorch warns and returns)
  const double fan_value = static_cast<double>(fan("kaiming_uniform_", tensor, mode));
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan_value);
  const double bound = std::sqrt(3.0) * std;  // U(−b, b) has standard deviation b / √3
  return uniform_(tensor, -bound, bound, generator);
}

Tensor kaiming_normal_(const Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity,
                       Generator* generator) {
  check_tensor("kaiming_normal_", tensor);
  if (tensor.numel() == 0) return tensor;
  const double fan_value = static_cast<double>(fan("kaiming_normal_", tensor, mode));
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan_value);
  return normal_(tensor, 0.0, std, generator);
}

Tensor xavier_uniform_(const Tensor& tensor, double gain, Generator* generator) {
  check_tensor("xavier_uniform_", tensor);
  if (tensor.numel() == 0) return tensor;
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double a = std::sqrt(3.0) * std;
  return uniform_(tensor, -a, a, generator);
}

Tensor xavier_normal_(const Tensor& tensor, double gain, Generator* generator) {
  check_tensor("xavier_normal_", tensor);
  if (tensor.numel() == 0) return tensor;
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return normal_(tensor, 0.0, std, generator);
}

}  // namespace mixtape::nn::init
