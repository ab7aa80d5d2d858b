// nn/layers.h — the layers of torch.nn, with PyTorch's names, arguments, defaults, initialisation and printout.
//
// Each layer is a Module holding its parameters as public Tensor members (`fc.weight`, `fc.bias`, registered
// under those names), with `forward(x)` and `operator()(x)` as the call. Layers are values: members of a model
// (registered by reference) or moved into a container (Sequential, ModuleList: owned).
//
//   mt::nn::Sequential net{mt::nn::Conv2d(1, 32, 3), mt::nn::ReLU(), mt::nn::MaxPool2d(2), mt::nn::Flatten(),
//                          mt::nn::Linear(32 * 13 * 13, 10)};
//   mt::Tensor logits = net(x);          // x (N, 1, 28, 28)
//   net[0];                              // Module& of the Conv2d; net.at<mt::nn::Conv2d>(0) typed
//
// Constructors check their arguments and forwards their inputs' shapes: errors name the layer.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/tensor.h>
#include <mixtape/nn/module.h>

namespace mixtape::nn {

/// A size along (H, W) given as one number or as two, PyTorch's int-or-tuple arguments: `MaxPool2d(2)`,
/// `Conv2d(3, 8, {3, 5})`. Remembers which, for the printout (`kernel_size=2` or `kernel_size=(3, 5)`).
struct Size2 {
  Size2(int64_t v) : value{v, v}, scalar(true) {}  // NOLINT: implicit on purpose, like PyTorch's int argument
  Size2(int64_t h, int64_t w) : value{h, w}, scalar(false) {}
  int64_t operator[](int i) const { return value[i]; }
  /// "2" when given as one number, "(2, 3)" otherwise (PyTorch's printout of an int or a tuple).
  std::string str() const;
  /// "(2, 2)": the tuple PyTorch's conv layers store and print.
  std::string tuple() const;

  int64_t value[2];
  bool scalar;
};

/// A module with `Tensor forward(const Tensor&)`: what Sequential chains.
template <class M>
concept UnaryModule = std::is_base_of_v<Module, M> && requires(M& m, const Tensor& x) {
  { m.forward(x) } -> std::convertible_to<Tensor>;
};

// ---- linear and convolution ---------------------------------------------------------------------------

/// y = x·weightᵀ + bias over the last dim of x (…, in_features). weight (out_features, in_features) and bias
/// (out_features) start as PyTorch's: U(−1/√in_features, 1/√in_features) (kaiming_uniform_ with a = √5).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  /// Draws weight and bias again (PyTorch's reset_parameters).
  void reset_parameters();
  std::string extra_repr() const override;

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features), or undefined with bias = false
};

/// Conv2d's arguments by name (LibTorch's Conv2dOptions, as designated initializers):
/// `nn::Conv2d conv({.in_channels = 3, .out_channels = 8, .kernel_size = 3, .padding = 1, .bias = false});`
struct Conv2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Size2 kernel_size = 0;  // required
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  bool bias = true;
};

/// 2-D convolution of x (N, in_channels, H, W) or (in_channels, H, W). weight (out_channels, in_channels, kH, kW),
/// bias (out_channels), initialised as PyTorch's (kaiming_uniform_ with a = √5; bias U(±1/√fan_in)).
class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  /// PyTorch's positional order (groups is not supported; bias through Conv2dOptions).
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  void reset_parameters();
  std::string extra_repr() const override;

  Conv2dOptions options;
  Tensor weight;  // (out_channels, in_channels, kH, kW)
  Tensor bias;    // (out_channels), or undefined
};

// ---- pooling -------------------------------------------------------------------------------------------

/// Max over kernel_size windows of x (N, C, H, W) or (C, H, W); stride defaults to kernel_size; padding at most
/// half the kernel (PyTorch's rule). dilation 1 and ceil_mode false, as PyTorch's defaults.
class MaxPool2d : public Module {
 public:
  MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding;
};

/// Average over kernel_size windows, padding counted (count_include_pad = true, ceil_mode = false).
class AvgPool2d : public Module {
 public:
  AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding;
};

// ---- activations, dropout, flatten -----------------------------------------------------------------------

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
};

/// approximate: "none" (exact, with erf) or "tanh".
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  std::string approximate;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
};

/// Zeroes elements with probability p and scales the rest by 1/(1 − p) in training mode; the identity in eval
/// mode. Draws from the default generator (mixtape::manual_seed).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  double p;
};

/// Flattens dims start_dim..end_dim (negative counts from the end) into one.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  int64_t start_dim, end_dim;
};

// ---- normalisation -----------------------------------------------------------------------------------------

/// Normalises over the trailing normalized_shape dims; with elementwise_affine, weight (ones) and bias (zeros,
/// unless bias = false) of normalized_shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  /// normalized_shape (n): PyTorch's `LayerNorm(512)`.
  explicit LayerNorm(int64_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  std::string extra_repr() const override;

  Shape normalized_shape;
  double eps;
  bool elementwise_affine;
  Tensor weight;  // (normalized_shape) or undefined
  Tensor bias;    // (normalized_shape) or undefined
};

/// BatchNorm1d/BatchNorm2d's arguments by name.
struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  /// The running statistics' update factor; std::nullopt: a cumulative average (1 / batches seen, PyTorch's
  /// momentum=None).
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

/// What BatchNorm1d and BatchNorm2d share (PyTorch's _BatchNorm): in training mode each channel is normalised
/// with the batch's mean and biased variance, and (with track_running_stats) running_mean/running_var are updated
/// with the unbiased one and num_batches_tracked counts the batches; in eval mode the running statistics are used
/// (the batch's without track_running_stats). running_mean/running_var are f32 in f32, f16 and bf16 models (f64
/// in an f64 one): to(dtype) keeps them in acc_dtype(dtype).
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// Running statistics back to mean 0, variance 1, no batches (PyTorch's reset_running_stats).
  void reset_running_stats();
  std::string extra_repr() const override;

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                    // (num_features) when affine
  Tensor running_mean, running_var, num_batches_tracked;  // (num_features) f32, 0-d i64; with track_running_stats

 protected:
  /// `name`: the layer, for the constructor's errors; `input_dims`: the numbers of dims a forward accepts.
  BatchNormBase(const BatchNormOptions& options, const char* name, std::vector<int64_t> input_dims);
  DType converted_buffer_dtype(const std::string& name, DType dtype) const override;

 private:
  std::vector<int64_t> m_input_dims;
};

/// x (N, C) or (N, C, L).
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  explicit BatchNorm1d(const BatchNormOptions& options);
};

/// x (N, C, H, W).
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  explicit BatchNorm2d(const BatchNormOptions& options);
};

// ---- containers ----------------------------------------------------------------------------------------------

/// Modules owned in order under the names "0", "1", …; forward chains them. Built from layers by value
/// (`Sequential seq{nn::Linear(784, 512), nn::ReLU()}`: moved in), or from std::shared_ptr to share one.
class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... Ms>
    requires(sizeof...(Ms) > 0 && ((UnaryModule<Ms> && !std::is_reference_v<Ms>) && ...))
  explicit Sequential(Ms&&... modules) {
    (push_back(std::move(modules)), ...);
  }
  /// Appends `module`, moved in.
  template <class M>
    requires(UnaryModule<M> && !std::is_reference_v<M>)
  void push_back(M&& module) {
    push_back(std::make_shared<M>(std::move(module)));
  }
  /// Appends `module`, shared.
  template <class M>
    requires UnaryModule<M>
  void push_back(std::shared_ptr<M> module) {
    MT_CHECK(module != nullptr, "Sequential.push_back: a null module");
    M* raw = module.get();
    register_module(std::to_string(m_forwards.size()), std::move(module));
    m_forwards.push_back([raw](const Tensor& x) -> Tensor { return raw->forward(x); });
  }
  /// The i-th module (an error past the end).
  Module& operator[](size_t i) const;
  /// The i-th module as an M (an error past the end or when it is not an M).
  template <class M>
  M& at(size_t i) const {
    M* m = dynamic_cast<M*>(&(*this)[i]);
    MT_CHECK(m != nullptr, "Sequential.at: module ", i, " is a ", (*this)[i].type_name(), ", not the type asked for");
    return *m;
  }
  size_t size() const { return m_forwards.size(); }
  /// The modules applied in order (x itself when empty).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

 private:
  // Each module's forward, bound to its object (owned through the registration, so moves keep it valid).
  std::vector<std::function<Tensor(const Tensor&)>> m_forwards;
};

/// Modules owned in order under the names "0", "1", …, with no forward of its own (PyTorch's ModuleList): for
/// models that loop over their layers. Printed as PyTorch does, runs of identical modules folded ("(0-2): 3 x
/// Linear(...)").
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <class... Ms>
    requires(sizeof...(Ms) > 0 && ((std::is_base_of_v<Module, Ms> && !std::is_reference_v<Ms>) && ...))
  explicit ModuleList(Ms&&... modules) {
    (push_back(std::move(modules)), ...);
  }
  template <class M>
    requires(std::is_base_of_v<Module, M> && !std::is_reference_v<M>)
  void push_back(M&& module) {
    push_back(std::make_shared<M>(std::move(module)));
  }
  template <class M>
    requires std::is_base_of_v<Module, M>
  void push_back(std::shared_ptr<M> module) {
    MT_CHECK(module != nullptr, "ModuleList.push_back: a null module");
    Module* raw = module.get();
    register_module(std::to_string(m_items.size()), std::move(module));
    m_items.push_back(raw);
  }
  Module& operator[](size_t i) const;
  template <class M>
  M& at(size_t i) const {
    M* m = dynamic_cast<M*>(&(*this)[i]);
    MT_CHECK(m != nullptr, "ModuleList.at: module ", i, " is a ", (*this)[i].type_name(), ", not the type asked for");
    return *m;
  }
  size_t size() const { return m_items.size(); }
  std::vector<Module*>::const_iterator begin() const { return m_items.begin(); }
  std::vector<Module*>::const_iterator end() const { return m_items.end(); }
  std::string repr() const override;

 private:
  std::vector<Module*> m_items;  // owned through the registrations
};

}  // namespace mixtape::nn
