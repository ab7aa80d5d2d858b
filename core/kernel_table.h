// core/kernel_table.h — what a device must provide to run every op: the
// kernel enums, their result types, and one table of function pointers.
//
// ops/dispatch*.cpp validate arguments, then call through the table of the
// tensor's device: the CPU table (ops/cpu/) or the CUDA one (cuda/), which
// core only knows as a symbol, as it knows the CUDA DeviceBackend. Kernels
// receive valid arguments and allocate their outputs (they overwrite, never
// accumulate). A null entry is a kernel the device does not have yet.
#pragma once

#include <cstdint>
#include <span>

#include <mixtape/core/tensor.h>

namespace mixtape::kernels {

enum class UnaryOp {
  kNeg, kAbs, kSign, kSquare, kReciprocal,
  kExp, kLog, kSqrt, kRsqrt,
  kRelu, kGelu, kGeluTanh, kSigmoid, kTanh,
};

/// Binary ops with NumPy broadcasting. The *Backward ops take (dy, saved) and
/// return dx: for relu/gelu/gelu_tanh `saved` is the input x, for sigmoid/tanh
/// it is the output y. Comparisons return kBool.
enum class BinaryOp {
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kPow,
  kReluBackward, kGeluBackward, kGeluTanhBackward, kSigmoidBackward, kTanhBackward,
  kEq, kNe, kLt, kLe, kGt, kGe,
};

/// Ops of a tensor and a double `s`: x + s, x * s, x ^ s, s - x, s / x, x / s, max(x, s), min(x, s).
enum class ScalarOp { kAdd, kMul, kPow, kRsub, kRdiv, kDiv, kMaximum, kMinimum };

enum class ReduceOp { kSum, kMean, kMax, kMin, kArgmax, kArgmin };

struct Window2d {
  int64_t kernel[2], stride[2], padding[2], dilation[2];
};

/// Output length along `axis` (0: H, 1: W) of a window sliding over `in` elements:
/// floor((in + 2·padding − dilation·(kernel − 1) − 1) / stride) + 1 (may be <= 0 for a window that does not fit).
inline int64_t window_output_size(int64_t in, const Window2d& w, int axis) {
  const int64_t span = w.dilation[axis] * (w.kernel[axis] - 1) + 1;
  const int64_t room = in + 2 * w.padding[axis] - span;
  return room < 0 ? 0 : room / w.stride[axis] + 1;
}

struct LayerNormResult {
  Tensor y, mean, rstd;
};
struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // dweight/dbias undefined when weight/bias are
};
/// The fused cross-entropy forward: per-row loss and log-sum-exp, (rows) each in f32 (f64 for f64 logits), and the
/// reductions of the loss, 0-d in the same dtype: sum = Σ loss, count = rows whose target is not ignore_index, mean
/// = sum / count (NaN when no row counts, as PyTorch's).
struct CrossEntropyResult {
  Tensor loss, lse;
  Tensor sum, count, mean;
};
struct MaxPoolResult {
  Tensor y, indices;
};

/// The kernels of one kind of device. Arguments are validated and defaults
/// resolved by ops/dispatch*.cpp (see ops/kernels.h for what each computes).
struct DeviceKernels {
  // elementwise, reductions, matmul
  Tensor (*unary)(UnaryOp, const Tensor& x) = nullptr;
  Tensor (*binary)(BinaryOp, const Tensor& a, const Tensor& b) = nullptr;
  Tensor (*scalar)(ScalarOp, const Tensor& x, double s) = nullptr;
  Tensor (*where)(const Tensor& cond, const Tensor& a, const Tensor& b) = nullptr;
  /// dims wrapped, sorted, unique (every dim for a full reduction); result in out_dtype.
  Tensor (*reduce)(ReduceOp, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype) = nullptr;
  Tensor (*matmul)(const Tensor& a, const Tensor& b, DType out_dtype) = nullptr;
  /// a (m, k) · b (k, n) + bias (n), accumulated and biased in f32 (f64 for f64) and rounded once.
  Tensor (*addmm)(const Tensor& bias, const Tensor& a, const Tensor& b, DType out_dtype) = nullptr;
  // softmax, losses, normalisation
  Tensor (*softmax)(const Tensor& x, int64_t dim, bool log, DType out_dtype) = nullptr;
  Tensor (*softmax_backward)(const Tensor& dy, const Tensor& y, int64_t dim, bool log) = nullptr;
  Tensor (*gather)(const Tensor& x, int64_t dim, const Tensor& index) = nullptr;
  Tensor (*scatter_add)(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) = nullptr;
  LayerNormResult (*layer_norm)(const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                                double eps) = nullptr;
  LayerNormGrads (*layer_norm_backward)(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& weight, bool bias_defined) = nullptr;
  CrossEntropyResult (*cross_entropy)(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                      double label_smoothing) = nullptr;
  Tensor (*cross_entropy_backward)(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   const Tensor& row_scale, int64_t ignore_index, double label_smoothing,
                                   const Tensor& divisor) = nullptr;
  // convolution, pooling, dropout, indexing
  Tensor (*im2col)(const Tensor& x, const Window2d& w) = nullptr;
  Tensor (*col2im)(const Tensor& cols, const Shape& input_shape, const Window2d& w) = nullptr;
  MaxPoolResult (*max_pool2d)(const Tensor& x, const Window2d& w) = nullptr;
  Tensor (*max_pool2d_backward)(const Tensor& dy, const Tensor& indices, const Shape& input_shape,
                                const Window2d& w) = nullptr;
  Tensor (*avg_pool2d)(const Tensor& x, const Window2d& w) = nullptr;
  Tensor (*avg_pool2d_backward)(const Tensor& dy, const Shape& input_shape, const Window2d& w) = nullptr;
  Tensor (*dropout_mask)(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device) = nullptr;
  Tensor (*index_select)(const Tensor& x, int64_t dim, const Tensor& index) = nullptr;
  Tensor (*index_add)(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) = nullptr;
};

/// The CPU's table (ops/cpu/table.cpp).
const DeviceKernels& cpu_kernels();
/// The CUDA table: defined by cuda/ in builds with CUDA, never referenced otherwise.
const DeviceKernels& cuda_kernels();

/// Names the kernel a backend chose for the op running on this thread ("wmma f16", "simt f32"; a string
/// literal), for autograd::PrecisionTrace, which takes it (and clears it) after each traced op.
void note_kernel(const char* name) noexcept;
/// The last noted kernel name since the previous call, or nullptr; clears it.
const char* take_noted_kernel() noexcept;

}  // namespace mixtape::kernels
