// ops/ops.h — the differentiable ops: what models are written with.
//
// Every function here runs through autograd::apply<Op>, so it records on the
// tape when an input requires grad and follows its op's precision category
// under autocast (the category of each is listed by amp::precision_table()).
// Names, arguments and defaults follow PyTorch's.
//
//   mt::Tensor h = mt::relu(mt::linear(x, w1, b1));
//   mt::Tensor loss = mt::cross_entropy(mt::linear(h, w2, b2), labels);
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>

namespace mixtape {

// ---- elementwise (ops/elementwise.cpp) ---------------------------------------------
// Binary ops broadcast (NumPy rules) and promote their inputs to the wider dtype.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
/// A scalar operand (here and in the operators below) takes the tensor's dtype, as PyTorch's does for a scalar of
/// the tensor's kind. The scalar is a double, and for an integer tensor it must be integral and acts as an integer:
/// `x_u8 - 6.0` is u8 255 (PyTorch's `x_u8 - 6` too; its `x_u8 - 6.0` promotes to f32: -1); 0.5 is an error.
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& x);
/// x ^ exponent, for a scalar exponent.
Tensor pow(const Tensor& x, double exponent);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor relu(const Tensor& x);
/// approximate: "none" (exact, with erf) or "tanh".
Tensor gelu(const Tensor& x, const char* approximate = "none");
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
/// |x|; the gradient is dy·sign(x) (0 at x = 0), as PyTorch's.
Tensor abs(const Tensor& x);
/// torch.clamp: min(max(x, min), max) with either bound left out (not both); max wins where min > max, NaN stays
/// NaN. The bounds compare in x's dtype, and the gradient passes where min <= x <= max (at a bound too), 0
/// elsewhere. Integer tensors take integral bounds.
///   mt::clamp(p, 1e-7, 1 - 1e-7);   mt::clamp(x, 0.0);   mt::clamp(x, std::nullopt, 6.0);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max = std::nullopt);
/// Elementwise max / min of a and b, promoted and broadcast (torch.maximum / torch.minimum): NaN from either side
/// propagates; where a == b each side gets half the gradient.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
/// torch.where: a where `condition` (kBool) holds, b elsewhere, at the broadcast shape of the three; a and b
/// promote to one dtype. A scalar operand takes the tensor's dtype: an integral value for an integer tensor, and one
/// the dtype holds, or an error as PyTorch's ("cannot be converted to f16 without overflow": f16 holds no -1e9; -inf
/// or -65504 mask an f16 tensor), a u8 taking -255..-1 as they wrap (-1 is 255).
///   mt::where(mt::gt(x, mt::zeros({})), x, 0.01 * x);   mt::where(mask, logits_f32, -1e9);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, double b);
Tensor where(const Tensor& condition, double a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(const Tensor& a, double b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(const Tensor& a, double b);
/// a / b elementwise: `a` as a 0-d tensor of b's dtype on b's device, divided by b (LibTorch's `a / b`; Python's
/// `a / b` multiplies by b.reciprocal() instead, two roundings). `1.0 / (1.0 + mt::exp(-x))`.
Tensor operator/(double a, const Tensor& b);
/// Comparisons (no gradient): a kBool tensor, after promoting a and b to their common dtype and broadcasting,
/// like torch.eq/ne/lt/le/gt/ge. Accuracy: `mt::mean(mt::eq(mt::argmax(logits, 1), y).to(mt::kF32))`.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// ---- reductions (ops/reduce.cpp) --------------------------------------------------------
/// Sum over every element (a 0-D tensor), or over `dims`.
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Largest element (0-D; the gradient is shared equally by all maximal elements, every NaN when the result is NaN),
/// and along a dim (values; the gradient goes to the first maximal element), as torch.max's both.
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Index of the largest element along `dim` (kI64; not differentiable).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Index of the largest element of the flattened tensor (0-D kI64).
Tensor argmax(const Tensor& x);
/// Smallest element, and along a dim, as max (torch.min's both).
Tensor min(const Tensor& x);
Tensor min(const Tensor& x, int64_t dim, bool keepdim = false);
/// Index of the smallest element along `dim`, and of the flattened tensor (kI64; not differentiable).
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x);

// ---- softmax and losses (ops/softmax.cpp, ops/loss.cpp) -------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { kNone, kMean, kSum };

struct CrossEntropyOptions {
  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
/// logits (N, C) or (N, C, d1, ...); target kI64 class indices (N) or (N, d1, ...).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, CrossEntropyOptions options = {});

struct NllLossOptions {
  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
};
/// log_probs (N, C) or (N, C, d1, ...); target kI64 (N) or (N, d1, ...).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, NllLossOptions options = {});
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);

// ---- normalisation (ops/norm.cpp) ---------------------------------------------------------
/// Normalises over the trailing `normalized_shape` dims; weight/bias may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
/// F.batch_norm: x (N, C), (N, C, L) or (N, C, H, W) normalised per channel. training (or undefined running
/// statistics): the batch's mean and biased variance, and running_mean/running_var (C), when defined, updated in
/// place: running = (1 − momentum)·running + momentum·batch, with the unbiased variance. Otherwise the running
/// statistics. weight/bias (C) may be undefined. Statistics in f32 for f16/bf16 x; the output in x's dtype.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight = {},
                  const Tensor& bias = {}, bool training = false, double momentum = 0.1, double eps = 1e-5);

// ---- matmul family (ops/matmul.cpp, ops/conv.cpp) ------------------------------------------
/// torch.matmul: 2-D, batched (batch dims broadcast), 1-D promoted.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x · weightᵀ + bias; weight (out_features, in_features), bias (out_features) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

struct Conv2dOptions {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
};
/// x (N, C_in, H, W), weight (C_out, C_in, kH, kW), bias (C_out) or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Conv2dOptions options = {});
/// Whether conv2d may convolve by Winograd's F(4x4, 3x3) on the CPU (default true; f32, f16 and bf16 data, 3x3
/// windows of stride 1, dilation 1, padding <= 2, on a CPU with AVX-512 or with AVX2 and FMA; f64 never): a quarter
/// of im2col + GEMM's multiplications, for f32 rounding errors of a few 1e-6 of the largest output instead of a few
/// 1e-7, as with cuDNN's and oneDNN's Winograd (f16/bf16 outputs: their one rounding dominates either way). false
/// keeps every convolution a direct sum. Process-wide, like cuda::set_allow_tf32.
///   mixtape::set_allow_winograd(false);   // direct sums from here on
void set_allow_winograd(bool allow) noexcept;
/// Whether conv2d may use Winograd on the CPU (set_allow_winograd).
bool allow_winograd() noexcept;

// ---- pooling and dropout (ops/pool.cpp, ops/dropout.cpp) -------------------------------------
struct Pool2dOptions {
  int64_t kernel_size[2] = {2, 2};
  int64_t stride[2] = {0, 0};  // 0: equal to kernel_size (PyTorch's default)
  int64_t padding[2] = {0, 0};
};
/// x (N, C, H, W) or (C, H, W).
Tensor max_pool2d(const Tensor& x, Pool2dOptions options = {});
/// Average over each window, padding counted (PyTorch's count_include_pad=true).
Tensor avg_pool2d(const Tensor& x, Pool2dOptions options = {});
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* generator = nullptr);

// ---- shape and indexing (ops/views.cpp, ops/index.cpp) ----------------------------------------
// The Tensor methods (view, reshape, transpose, permute, slice, select, expand,
// squeeze, unsqueeze, flatten, contiguous, clone, to) are differentiable too.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor view(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// Rows of `x` along `dim` at `index` (1-D kI64 or kI32).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// Concatenates along `dim`; all inputs share every other size.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Joins tensors of one shape along a new dim `dim` (in [-(rank + 1), rank]): cat of each unsqueezed at dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// A random permutation of 0, 1, ..., n−1 (torch.randperm), kI64 on `device`, drawn there: n counters of `gen`
/// (the default generator when null) key a sort, so the same generator state gives the same permutation on every
/// device. For shuffling a dataset that lives on the GPU without a host round trip:
///
///     mt::Generator g(seed);
///     const mt::Tensor order = mt::randperm(images.size(0), mt::Device::cuda(), &g);
///     const mt::Tensor x = mt::index_select(images, 0, order.slice(0, 0, 128));  // the first batch
Tensor randperm(int64_t n, Device device = Device::cpu(), Generator* gen = nullptr);

}  // namespace mixtape
