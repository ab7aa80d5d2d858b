// nn/layers.cpp — the layers of nn/layers.h: argument checks, PyTorch's initialisation, forwards through the ops
// of ops/ops.h, and extra_repr strings as PyTorch prints them (its bools, floats and tuples).
#include <mixtape/nn/layers.h>

#include <charconv>
#include <cmath>
#include <sstream>

#include <mixtape/autograd/autograd.h>
#include <mixtape/nn/init.h>
#include <mixtape/ops/ops.h>

namespace mixtape::nn {

namespace {

const char* py_bool(bool b) { return b ? "True" : "False"; }

/// Python's repr of a float: the shortest digits that read back the same, fixed notation for exponents in
/// [−4, 16) (with ".0" on whole numbers), scientific otherwise with at least two exponent digits: 0.1, 1.0,
/// 0.0001, 1e-05, 1e+16.
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // "-1.2345e-05"
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exponent = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      const size_t int_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_digits) {
        out = digits + std::string(int_digits - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
      }
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
  const int mag = exponent < 0 ? -exponent : exponent;
  return sign + mantissa + "e" + (exponent < 0 ? "-" : "+") + (mag < 10 ? "0" : "") + std::to_string(mag);
}

/// PyTorch's default initialisation of a layer with a weight whose fan_in is the product of its dims after the
/// first: weight kaiming_uniform_ with a = √5, which is U(±1/√fan_in); bias U(±1/√fan_in) (0 when fan_in is 0).
void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

void check_positive(const char* layer, const char* what, int64_t v) {
  MT_CHECK(v > 0, layer, ": ", what, " must be positive, got ", v);
}

void check_positive(const char* layer, const char* what, const Size2& v) {
  MT_CHECK(v[0] > 0 && v[1] > 0, layer, ": ", what, " must be positive, got ", v.str());
}

void check_non_negative(const char* layer, const char* what, const Size2& v) {
  MT_CHECK(v[0] >= 0 && v[1] >= 0, layer, ": ", what, " must be non-negative, got ", v.str());
}

/// A pooling layer's input: (N, C, H, W) or (C, H, W).
void check_pool_input(const Module& layer, const Tensor& x) {
  MT_CHECK(x.defined(), layer.type_name(), ": the input is an undefined tensor");
  MT_CHECK(x.dim() == 3 || x.dim() == 4, layer.type_name(),
           ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ", x.shape());
}

Pool2dOptions pool_options(const Size2& kernel, const Size2& stride, const Size2& padding) {
  Pool2dOptions o;
  for (int i = 0; i < 2; ++i) {
    o.kernel_size[i] = kernel[i];
    o.stride[i] = stride[i];
    o.padding[i] = padding[i];
  }
  return o;
}

/// PyTorch's pooling rule, checked when the layer is built: padding at most half the kernel.
void check_pool_args(const char* layer, const Size2& kernel, const Size2& stride, const Size2& padding) {
  check_positive(layer, "kernel_size", kernel);
  check_positive(layer, "stride", stride);
  check_non_negative(layer, "padding", padding);
  MT_CHECK(padding[0] * 2 <= kernel[0] && padding[1] * 2 <= kernel[1], layer,
           ": pad should be at most half of effective kernel size, but got padding=", padding.str(),
           " and kernel_size=", kernel.str());
}

}  // namespace

std::string Size2::str() const { return scalar ? std::to_string(value[0]) : tuple(); }
std::string Size2::tuple() const { return "(" + std::to_string(value[0]) + ", " + std::to_string(value[1]) + ")"; }

// ---- Linear ------------------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features_, int64_t out_features_, bool with_bias)
    : in_features(in_features_), out_features(out_features_) {
  check_positive("Linear", "in_features", in_features);
  check_positive("Linear", "out_features", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() { default_init(weight, bias); }

Tensor Linear::forward(const Tensor& x) const {
  MT_CHECK(x.defined(), "Linear: the input is an undefined tensor");
  MT_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear(in_features=", in_features, ", out_features=",
           out_features, "): expected an input whose last dim is ", in_features, ", got shape ", x.shape());
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features << ", bias=" << py_bool(bias.defined());
  return os.str();
}

// ---- Conv2d --------------------------------------------------------------------------------------------------

Conv2d::Conv2d(const Conv2dOptions& o) : options(o) {
  check_positive("Conv2d", "in_channels", o.in_channels);
  check_positive("Conv2d", "out_channels", o.out_channels);
  check_positive("Conv2d", "kernel_size", o.kernel_size);
  check_positive("Conv2d", "stride", o.stride);
  check_non_negative("Conv2d", "padding", o.padding);
  check_positive("Conv2d", "dilation", o.dilation);
  weight = register_parameter("weight", empty({o.out_channels, o.in_channels, o.kernel_size[0], o.kernel_size[1]}));
  if (o.bias) bias = register_parameter("bias", empty({o.out_channels}));
  reset_parameters();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
               Size2 dilation)
    : Conv2d(Conv2dOptions{.in_channels = in_channels,
                           .out_channels = out_channels,
                           .kernel_size = kernel_size,
                           .stride = stride,
                           .padding = padding,
                           .dilation = dilation}) {}

void Conv2d::reset_parameters() { default_init(weight, bias); }

Tensor Conv2d::forward(const Tensor& x) const {
  MT_CHECK(x.defined(), "Conv2d: the input is an undefined tensor");
  const bool batched = x.dim() == 4;
  MT_CHECK((x.dim() == 3 || batched) && x.size(batched ? 1 : 0) == options.in_channels, "Conv2d(",
           options.in_channels, ", ", options.out_channels, ", kernel_size=", options.kernel_size.tuple(),
           "): expected a 4-D input (N, ", options.in_channels, ", H, W) or a 3-D one (", options.in_channels,
           ", H, W), got shape ", x.shape());
  mixtape::Conv2dOptions op;
  for (int i = 0; i < 2; ++i) {
    op.stride[i] = options.stride[i];
    op.padding[i] = options.padding[i];
    op.dilation[i] = options.dilation[i];
  }
  if (batched) return conv2d(x, weight, bias, op);
  return conv2d(x.unsqueeze(0), weight, bias, op).squeeze(0);  // unbatched (C, H, W), as PyTorch
}

std::string Conv2d::extra_repr() const {
  // PyTorch's _ConvNd.extra_repr: the non-default options only, tuples throughout.
  std::ostringstream os;
  os << options.in_channels << ", " << options.out_channels << ", kernel_size=" << options.kernel_size.tuple()
     << ", stride=" << options.stride.tuple();
  if (options.padding[0] != 0 || options.padding[1] != 0) os << ", padding=" << options.padding.tuple();
  if (options.dilation[0] != 1 || options.dilation[1] != 1) os << ", dilation=" << options.dilation.tuple();
  if (!bias.defined()) os << ", bias=False";
  return os.str();
}

// ---- pooling -------------------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Size2 kernel_size_, std::optional<Size2> stride_, Size2 padding_)
    : kernel_size(kernel_size_), stride(stride_.value_or(kernel_size_)), padding(padding_) {
  check_pool_args("MaxPool2d", kernel_size, stride, padding);
}

Tensor MaxPool2d::forward(const Tensor& x) const {
  check_pool_input(*this, x);
  return max_pool2d(x, pool_options(kernel_size, stride, padding));
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() + ", padding=" + padding.str() +
         ", dilation=1, ceil_mode=False";
}

AvgPool2d::AvgPool2d(Size2 kernel_size_, std::optional<Size2> stride_, Size2 padding_)
    : kernel_size(kernel_size_), stride(stride_.value_or(kernel_size_)), padding(padding_) {
  check_pool_args("AvgPool2d", kernel_size, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) const {
  check_pool_input(*this, x);
  return avg_pool2d(x, pool_options(kernel_size, stride, padding));
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() + ", padding=" + padding.str();
}

// ---- activations, dropout, flatten ---------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& x) const { return relu(x); }
Tensor Tanh::forward(const Tensor& x) const { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) const { return sigmoid(x); }

GELU::GELU(std::string approximate_) : approximate(std::move(approximate_)) {
  MT_CHECK(approximate == "none" || approximate == "tanh", "GELU: approximate must be \"none\" or \"tanh\", got \"",
           approximate, "\"");
}

Tensor GELU::forward(const Tensor& x) const { return gelu(x, approximate.c_str()); }

std::string GELU::extra_repr() const { return "approximate='" + approximate + "'"; }

Dropout::Dropout(double p_) : p(p_) {
  MT_CHECK(p >= 0.0 && p <= 1.0, "Dropout: dropout probability has to be between 0 and 1, but got ", p);
}

Tensor Dropout::forward(const Tensor& x) const {
  MT_CHECK(x.defined(), "Dropout: the input is an undefined tensor");
  return dropout(x, p, is_training());
}

std::string Dropout::extra_repr() const { return "p=" + py_float(p) + ", inplace=False"; }

Flatten::Flatten(int64_t start_dim_, int64_t end_dim_) : start_dim(start_dim_), end_dim(end_dim_) {}

Tensor Flatten::forward(const Tensor& x) const {
  MT_CHECK(x.defined(), "Flatten: the input is an undefined tensor");
  const int64_t n = x.dim() == 0 ? 1 : x.dim();  // a 0-d tensor flattens as one of shape [1]
  auto wrap = [&](int64_t d) { return d < 0 ? d + n : d; };
  const int64_t s = wrap(start_dim), e = wrap(end_dim);
  MT_CHECK(s >= 0 && s < n && e >= 0 && e < n, "Flatten(start_dim=", start_dim, ", end_dim=", end_dim,
           "): dims out of range for an input of shape ", x.shape());
  MT_CHECK(s <= e, "Flatten(start_dim=", start_dim, ", end_dim=", end_dim,
           "): start_dim comes after end_dim for an input of shape ", x.shape());
  return flatten(x, start_dim, end_dim);
}

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

// ---- LayerNorm -------------------------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape_, double eps_, bool elementwise_affine_, bool with_bias)
    : normalized_shape(normalized_shape_), eps(eps_), elementwise_affine(elementwise_affine_) {
  MT_CHECK(normalized_shape.size() > 0, "LayerNorm: normalized_shape must have at least one dim");
  for (int64_t i = 0; i < normalized_shape.size(); ++i)
    MT_CHECK(normalized_shape[i] > 0, "LayerNorm: normalized_shape must be positive, got ", normalized_shape);
  MT_CHECK(eps >= 0, "LayerNorm: eps must be >= 0, got ", eps);
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (with_bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

LayerNorm::LayerNorm(int64_t n, double eps_, bool elementwise_affine_, bool with_bias)
    : LayerNorm(Shape{n}, eps_, elementwise_affine_, with_bias) {}

Tensor LayerNorm::forward(const Tensor& x) const {
  MT_CHECK(x.defined(), "LayerNorm: the input is an undefined tensor");
  bool match = normalized_shape.size() <= x.dim();
  for (int64_t i = 0; match && i < normalized_shape.size(); ++i)
    match = x.size(x.dim() - normalized_shape.size() + i) == normalized_shape[i];
  MT_CHECK(match, "LayerNorm(", normalized_shape, "): expected an input whose trailing dims are ", normalized_shape,
           ", got shape ", x.shape());
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::string shape = "(";
  for (int64_t i = 0; i < normalized_shape.size(); ++i)
    shape += (i ? ", " : "") + std::to_string(normalized_shape[i]);
  shape += normalized_shape.size() == 1 ? ",)" : ")";  // Python's one-element tuple
  return shape + ", eps=" + py_float(eps) + ", elementwise_affine=" + py_bool(elementwise_affine);
}

// ---- BatchNorm -------------------------------------------------------------------------------------------------

BatchNormBase::BatchNormBase(const BatchNormOptions& o, const char* name, std::vector<int64_t> input_dims)
    : num_features(o.num_features),
      eps(o.eps),
      momentum(o.momentum),
      affine(o.affine),
      track_running_stats(o.track_running_stats),
      m_input_dims(std::move(input_dims)) {
  MT_CHECK(num_features > 0, name, ": num_features must be positive, got ", num_features);
  MT_CHECK(eps >= 0, name, ": eps must be >= 0, got ", eps);
  MT_CHECK(!momentum || std::isfinite(*momentum), name, ": momentum must be a finite number or std::nullopt, got ",
           momentum.value_or(0.0));
  if (affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::kI64));
  }
}

void BatchNormBase::reset_running_stats() {
  if (!track_running_stats) return;
  autograd::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

DType BatchNormBase::converted_buffer_dtype(const std::string& name, DType dtype) const {
  // The statistics stay in the dtype the kernels keep them in: f32 in an f16/bf16 model, f64 in an f64 one.
  if (name == "running_mean" || name == "running_var") return acc_dtype(dtype);
  return dtype;
}

Tensor BatchNormBase::forward(const Tensor& x) {
  MT_CHECK(x.defined(), type_name(), ": the input is an undefined tensor");
  bool dims_ok = false;
  for (int64_t d : m_input_dims) dims_ok = dims_ok || x.dim() == d;
  MT_CHECK(dims_ok, type_name(), ": expected ", m_input_dims.size() == 1 ? "4D input (N, C, H, W)" : "2D or 3D input",
           ", got input of shape ", x.shape());
  MT_CHECK(x.size(1) == num_features, type_name(), "(", num_features, "): expected ", num_features,
           " channels (dim 1), got input of shape ", x.shape());
  // PyTorch's _BatchNorm.forward: count the batch, and with momentum=None average over all the batches seen.
  double factor = momentum.value_or(0.0);
  if (is_training() && track_running_stats) {
    autograd::NoGradGuard no_grad;
    num_batches_tracked.copy_(add(num_batches_tracked, 1.0));
    if (!momentum) factor = 1.0 / num_batches_tracked.item<double>();  // reads the count (a sync on a GPU)
  }
  const bool use_running = !is_training() || track_running_stats;
  return batch_norm(x, use_running ? running_mean : Tensor(), use_running ? running_var : Tensor(), weight, bias,
                    is_training() || !running_mean.defined(), factor, eps);
}

std::string BatchNormBase::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << py_float(eps) << ", momentum=" << (momentum ? py_float(*momentum) : "None")
     << ", affine=" << py_bool(affine) << ", track_running_stats=" << py_bool(track_running_stats);
  return os.str();
}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm1d(BatchNormOptions{num_features, eps, momentum, affine, track_running_stats}) {}
BatchNorm1d::BatchNorm1d(const BatchNormOptions& options) : BatchNormBase(options, "BatchNorm1d", {2, 3}) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm2d(BatchNormOptions{num_features, eps, momentum, affine, track_running_stats}) {}
BatchNorm2d::BatchNorm2d(const BatchNormOptions& options) : BatchNormBase(options, "BatchNorm2d", {4}) {}

// ---- containers --------------------------------------------------------------------------------------------------

Module& Sequential::operator[](size_t i) const {
  MT_CHECK(i < size(), "Sequential: index ", i, " is out of range for ", size(), " modules");
  return *child_entries()[i].module;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& f : m_forwards) y = f(y);
  return y;
}

Module& ModuleList::operator[](size_t i) const {
  MT_CHECK(i < size(), "ModuleList: index ", i, " is out of range for ", size(), " modules");
  return *m_items[i];
}

std::string ModuleList::repr() const {
  // PyTorch's ModuleList.__repr__: runs of modules that print the same are folded into "(i-j): n x module".
  if (m_items.empty()) return type_name() + "()";
  std::vector<std::string> reprs;
  for (const Module* m : m_items) reprs.push_back(m->repr());
  std::string out = type_name() + "(";
  for (size_t start = 0; start < reprs.size();) {
    size_t end = start;
    while (end + 1 < reprs.size() && reprs[end + 1] == reprs[start]) ++end;
    std::string line = start == end ? "(" + std::to_string(start) + "): " + reprs[start]
                                    : "(" + std::to_string(start) + "-" + std::to_string(end) +
                                          "): " + std::to_string(end - start + 1) + " x " + reprs[start];
    std::string indented;
    for (char c : line) {
      indented += c;
      if (c == '\n') indented += "  ";
    }
    out += "\n  " + indented;
    start = end + 1;
  }
  return out + "\n)";
}

}  // namespace mixtape::nn
