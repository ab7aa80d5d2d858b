// ops/backend/kernels.h — the backend interface: every kernel a device provides, declared once.
//
// The one design idea: a kernel's signature is written once, in the lists
// below (MT_BACKEND_KERNELS), and everything else is generated from them —
// the Backend table a device fills, the declarations of the CPU kernels
// (ops/cpu/) and the CUDA ones (cuda/), and the `kernels::` entry points the
// op layer calls. An entry point finds the backend of its tensors' device and
// checks only invariants a kernel cannot be handed wrongly without reading
// memory wrongly: every tensor on one device, the dtypes each kernel is
// instantiated for, the dim of softmax and the index kernels (in [0, rank):
// they view their tensors around it; the op wraps a negative one). Other
// shapes, dims and options are the op's to check, in its forward
// (ops/check.h), where the message can name what the user called; kernels
// receive valid arguments.
//
// A list entry is X(return type, name, (parameters), (arguments), dtype invariant): the invariant is an
// expression over the parameters, checked by the entry point (and printed when it fails).
//
// Outputs: kernels allocate fresh outputs and overwrite them, except the in-place ones, whose names end in
// `_` (binary_, ..., the multi-tensor kernels): they write into their first tensor argument. f16/bf16 inputs are
// computed in f32 (opmath_t, acc_dtype) with one rounding per output. The CPU kernels are the reference the CUDA
// ones are tested against (tests/test_parity.cpp).
//
// Internal: ops/, cuda/, tests and bench/ include this; it is not installed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include <mixtape/core/device_memory.h>
#include <mixtape/core/random.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/tensor.h>

namespace mixtape::kernels {

// ---- the op enums of the elementwise and reduction kernels -------------------------------

enum class UnaryOp {
  kNeg, kAbs, kSign, kSquare, kReciprocal,
  kExp, kLog, kSqrt, kRsqrt,
  kRelu, kGelu, kGeluTanh, kSigmoid, kTanh,
};

/// Binary ops with NumPy broadcasting. The *Backward ops take (dy, saved) and return dx: for relu/gelu/gelu_tanh
/// `saved` is the input x, for sigmoid/tanh it is the output y. Comparisons return kBool.
enum class BinaryOp {
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kPow,
  kReluBackward, kGeluBackward, kGeluTanhBackward, kSigmoidBackward, kTanhBackward,
  kEq, kNe, kLt, kLe, kGt, kGe,
};

/// Ops of a tensor and a double `s`: x + s, x * s, x ^ s, s - x, s / x, x / s, max(x, s), min(x, s).
enum class ScalarOp { kAdd, kMul, kPow, kRsub, kRdiv, kDiv, kMaximum, kMinimum };

enum class ReduceOp { kSum, kMean, kMax, kMin, kArgmax, kArgmin };

const char* name(UnaryOp op);
const char* name(BinaryOp op);
const char* name(ScalarOp op);
const char* name(ReduceOp op);

// ---- what the window and row kernels take and return ----------------------------------------

/// A 2-D sliding window: kernel size, stride, zero padding and dilation along (H, W).
struct Window2d {
  int64_t kernel[2], stride[2], padding[2], dilation[2];
};

/// Output length along `axis` (0: H, 1: W) of a window sliding over `in` elements:
/// floor((in + 2·padding − dilation·(kernel − 1) − 1) / stride) + 1 (0 for a window that does not fit).
inline int64_t window_output_size(int64_t in, const Window2d& w, int axis) {
  const int64_t span = w.dilation[axis] * (w.kernel[axis] - 1) + 1;
  const int64_t room = in + 2 * w.padding[axis] - span;
  return room < 0 ? 0 : room / w.stride[axis] + 1;
}

/// A tensor viewed as (outer, C, inner) around `dim`: the rows of the softmax and the slices of the index kernels
/// (a 0-d tensor is one row of one element).
struct RowLayout {
  int64_t outer = 1, C = 1, inner = 1;
};
inline RowLayout row_layout(const Shape& shape, int64_t dim) {
  RowLayout L;
  if (shape.empty()) return L;
  for (int64_t d = 0; d < dim; ++d) L.outer *= shape[d];
  L.C = shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) L.inner *= shape[d];
  return L;
}

struct LayerNormResult {
  Tensor y;           // x's shape and dtype
  Tensor mean, rstd;  // (rows) in acc_dtype(x)
};
struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // dweight/dbias undefined when weight/bias are
};
struct BatchNormResult {
  Tensor y;             // x's shape and dtype
  Tensor mean, invstd;  // (C) in acc_dtype(x): the statistics y was normalised with
  Tensor var;           // (C) in acc_dtype(x): the batch's biased variance; undefined with running statistics
};
struct BatchNormGrads {
  Tensor dx, dweight, dbias;  // dweight/dbias undefined when weight/bias are
};
/// The fused cross-entropy forward: per-row loss and log-sum-exp, (rows) each in acc_dtype(logits), and the
/// reductions of the loss, 0-d in the same dtype: sum = Σ loss, count = rows whose target is not ignore_index,
/// mean = sum / count (NaN when no row counts, as PyTorch's).
struct CrossEntropyResult {
  Tensor loss, lse;
  Tensor sum, count, mean;
};
struct Conv2dWeightGrads {
  Tensor dweight;  // (C_out, C_in, kH, kW)
  Tensor dbias;    // (C_out), or undefined when not asked for
};

struct MaxPoolResult {
  Tensor y, indices;  // (N, C, H_out, W_out); indices kI32, flat positions in each H·W plane (of < 2^31 pixels)
};

// ---- the kernels -------------------------------------------------------------------------------

// Elementwise (ops/cpu/elementwise.cpp, cuda/elementwise.cu). Inputs broadcast (NumPy rules) to a common shape.
//   unary(op, x)            y = op(x), x's shape and dtype (floating; kNeg/kAbs/kSign/kSquare also integers).
//   binary(op, a, b)        op(a, b) at the broadcast shape, a's dtype (kBool for comparisons).
//   scalar(op, x, s)        op(x, s), x's shape and dtype; s is applied in opmath (an integer for integer x).
//   where(cond, a, b)       cond ? a : b at the broadcast shape of the three; cond kBool.
//   unary_(op, x)           x = op(x), in place.
//   binary_(op, a, b)       a = op(a, b), in place; b broadcasts to a's shape (not a comparison). b is a itself or
//                           shares no memory with it: gradient accumulation (grad += g) without an allocation.
//   scalar_(op, x, s)       x = op(x, s), in place.
#define MT_KERNELS_ELEMENTWISE(X)                                                                              \
  X(Tensor, unary, (UnaryOp op, const Tensor& x), (op, x), unary_dtype_ok(op, x))                              \
  X(Tensor, binary, (BinaryOp op, const Tensor& a, const Tensor& b), (op, a, b),                              \
    a.dtype() == b.dtype() && binary_dtype_ok(op, a))                                                          \
  X(Tensor, scalar, (ScalarOp op, const Tensor& x, double s), (op, x, s), scalar_dtype_ok(op, x, s))         \
  X(Tensor, where, (const Tensor& cond, const Tensor& a, const Tensor& b), (cond, a, b),                      \
    cond.dtype() == DType::kBool && a.dtype() == b.dtype())                                                    \
  X(void, unary_, (UnaryOp op, const Tensor& x), (op, x), unary_dtype_ok(op, x) && writable(x))               \
  X(void, binary_, (BinaryOp op, const Tensor& a, const Tensor& b), (op, a, b),                               \
    a.dtype() == b.dtype() && binary_dtype_ok(op, a) && in_place_operands(op, a, b))                           \
  X(void, scalar_, (ScalarOp op, const Tensor& x, double s), (op, x, s), scalar_dtype_ok(op, x, s) && writable(x))

// Reductions (ops/cpu/reduce.cpp, cuda/reduce.cu).
//   reduce(op, x, dims, keepdim, out_dtype)  reduces x over `dims` (wrapped, sorted, unique; every dim for a full
//       reduction), keeping them as size 1 when `keepdim`. Sums and means accumulate in acc_dtype (f32 for
//       f16/bf16), in f64 when out_dtype is f64; max/min propagate NaN; argmax/argmin give the first index of ties
//       (kI64). max/min/argmax/argmin need a non-empty reduction.
#define MT_KERNELS_REDUCE(X)                                                                                   \
  X(Tensor, reduce, (ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype), \
    (op, x, dims, keepdim, out_dtype), reduce_dtypes_ok(op, x, out_dtype))

// Matrix products (ops/cpu/matmul.cpp, cuda/matmul.cu).
//   matmul(a, b, out_dtype)   torch.matmul's shape rules (1-D promoted, batch dims broadcast); a and b of one floating
//                             dtype, accumulated in f32 (f64 for f64) and rounded once to out_dtype. Transposed views
//                             are read in place. CUDA: f16/bf16 (and TF32 when allowed) on the Tensor Cores.
//   addmm(bias, a, b, out_dtype)  a (m, k) · b (k, n) + bias (n), the sum formed in f32 (f64) and rounded once; on
//                             CUDA the bias is the GEMM's epilogue.
#define MT_KERNELS_MATMUL(X)                                                                                   \
  X(Tensor, matmul, (const Tensor& a, const Tensor& b, DType out_dtype), (a, b, out_dtype),                   \
    a.dtype() == b.dtype() && is_floating(a.dtype()) && is_floating(out_dtype))                                \
  X(Tensor, addmm, (const Tensor& bias, const Tensor& a, const Tensor& b, DType out_dtype), (bias, a, b, out_dtype), \
    a.dtype() == b.dtype() && bias.dtype() == a.dtype() && is_floating(a.dtype()) && is_floating(out_dtype))

// Softmax (ops/cpu/softmax.cpp, cuda/softmax.cu). The row max and the sum of exponentials are f32 for f16/bf16.
//   softmax(x, dim, log, out_dtype)    softmax (log_softmax when `log`) along `dim` (wrapped), in out_dtype.
//   softmax_backward(dy, y, dim, log)  from the forward's output y (dy's dtype and shape): softmax:
//                                      y·(dy − Σ dy·y); log_softmax: dy − exp(y)·Σ dy.
#define MT_KERNELS_SOFTMAX(X)                                                                                  \
  X(Tensor, softmax, (const Tensor& x, int64_t dim, bool log, DType out_dtype), (x, dim, log, out_dtype),     \
    is_floating(x.dtype()) && is_floating(out_dtype) && dim_of(dim, x.dim()))                                  \
  X(Tensor, softmax_backward, (const Tensor& dy, const Tensor& y, int64_t dim, bool log), (dy, y, dim, log),  \
    dy.dtype() == y.dtype() && is_floating(y.dtype()) && dim_of(dim, y.dim()))

// Losses (ops/cpu/loss.cpp, cuda/loss.cu): the fused cross-entropy of logits (rows, C) and kI64 targets (rows).
//   cross_entropy(logits, target, ignore_index, label_smoothing)  every row in one pass: loss
//       −[(1 − ε)·log p[t] + (ε/C)·Σ_c log p_c] (0 on rows whose target is ignore_index) and log-sum-exp (saved for
//       the backward), with ε = label_smoothing in [0, 1]; see CrossEntropyResult. A target outside [0, C) that is
//       not ignore_index throws on the CPU; on CUDA (checking would need a synchronisation) its row's loss is NaN.
//   cross_entropy_backward(logits, target, lse, row_scale, ignore_index, label_smoothing, divisor)
//       dlogits (logits' shape and dtype) = (exp(x − lse) − (1 − ε)·[c == t] − ε/C) · row_scale / divisor, rounded
//       once; row_scale (lse's dtype or the logits') holds d loss / d per-row loss, (rows) values or one for every
//       row; divisor, when defined, is one value in lse's dtype (the mean's count). Ignored rows get 0.
#define MT_KERNELS_LOSS(X)                                                                                     \
  X(CrossEntropyResult, cross_entropy,                                                                         \
    (const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing),                \
    (logits, target, ignore_index, label_smoothing), is_floating(logits.dtype()) && target.dtype() == DType::kI64) \
  X(Tensor, cross_entropy_backward,                                                                            \
    (const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_scale, int64_t ignore_index, \
     double label_smoothing, const Tensor& divisor),                                                           \
    (logits, target, lse, row_scale, ignore_index, label_smoothing, divisor),                                  \
    cross_entropy_backward_dtypes_ok(logits, target, lse, row_scale, divisor))

// Normalisation (ops/cpu/norm.cpp, cuda/norm.cu). Statistics in acc_dtype(x).
//   layer_norm(x, normalized_numel, weight, bias, eps)  over the trailing normalized_numel elements of each row;
//       weight/bias (normalized_numel elements, any floating dtype) may be undefined.
//   layer_norm_backward(dy, x, mean, rstd, weight, bias_defined)  dx (x's dtype), dweight (weight's dtype), dbias
//       (weight's dtype, x's without a weight) when bias_defined.
//   batch_norm(x, running_mean, running_var, weight, bias, eps)  x (N, C, *) normalised per channel over N and the
//       trailing dims; running_mean/running_var (C) in acc_dtype(x), or both undefined: the batch's mean and
//       biased variance (returned in .var too). Reads the running statistics, never writes them (the op updates
//       them); weight/bias (C, any floating dtype) may be undefined.
//   batch_norm_backward(dy, x, mean, invstd, weight, batch_stats, bias_defined)  dx (x's dtype; with batch_stats,
//       through the batch's statistics too), dweight (weight's dtype) when weight is defined, dbias (weight's
//       dtype, x's without a weight) when bias_defined.
#define MT_KERNELS_NORM(X)                                                                                     \
  X(LayerNormResult, layer_norm,                                                                               \
    (const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias, double eps),         \
    (x, normalized_numel, weight, bias, eps), is_floating(x.dtype()) && floating_or_undefined(weight) &&       \
    floating_or_undefined(bias))                                                                               \
  X(LayerNormGrads, layer_norm_backward,                                                                       \
    (const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,           \
     bool bias_defined),                                                                                       \
    (dy, x, mean, rstd, weight, bias_defined),                                                                 \
    is_floating(x.dtype()) && dy.dtype() == x.dtype() && mean.dtype() == acc_dtype(x.dtype()) &&               \
    rstd.dtype() == acc_dtype(x.dtype()) && floating_or_undefined(weight))                                     \
  X(BatchNormResult, batch_norm,                                                                               \
    (const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,              \
     const Tensor& bias, double eps),                                                                          \
    (x, running_mean, running_var, weight, bias, eps),                                                         \
    is_floating(x.dtype()) && running_mean.defined() == running_var.defined() &&                               \
    (!running_mean.defined() || (running_mean.dtype() == acc_dtype(x.dtype()) &&                               \
                                 running_var.dtype() == acc_dtype(x.dtype()))) &&                              \
    floating_or_undefined(weight) && floating_or_undefined(bias))                                              \
  X(BatchNormGrads, batch_norm_backward,                                                                       \
    (const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,         \
     bool batch_stats, bool bias_defined),                                                                     \
    (dy, x, mean, invstd, weight, batch_stats, bias_defined),                                                  \
    is_floating(x.dtype()) && dy.dtype() == x.dtype() && mean.dtype() == acc_dtype(x.dtype()) &&               \
    invstd.dtype() == acc_dtype(x.dtype()) && floating_or_undefined(weight))

// Convolution (ops/cpu/conv.cpp, cuda/conv.cu). The window fits the padded input; x (N, C_in, H, W), weight
// (C_out, C_in, kH, kW), dy (N, C_out, H_out, W_out). Each backend picks its algorithm: the CPU runs 3x3 windows of
// stride 1 through Winograd F(4x4, 3x3) where it has AVX-512 or AVX2 and FMA (ops/cpu/conv_winograd.h; f64
// excepted), the rest as im2col + GEMM in cache-sized chunks; CUDA as im2col + one GEMM (ops/backend/conv_gemm.h).
// Sums in acc_dtype, one rounding per output.
//   conv2d(x, weight, bias, w)                      y (N, C_out, H_out, W_out) = x ⋆ weight + bias (bias (C_out) or
//                                                   undefined), in x's dtype.
//   conv2d_backward_input(dy, weight, input_shape, w)  dx (input_shape), the adjoint of conv2d in x.
//   conv2d_backward_weight(dy, x, w, bias)          dweight (C_out, C_in, kH, kW) and, when `bias`, dbias (C_out),
//                                                   each summed over the batch in acc (Conv2dWeightGrads).
//   im2col(x, w)                    x (N, C, H, W) -> columns (N, C·kH·kW, H_out·W_out); padding reads as 0.
//   col2im(cols, input_shape, w)    the adjoint: each column entry added to the pixel it came from, (N, C, H, W).
#define MT_KERNELS_CONV(X)                                                                                     \
  X(Tensor, conv2d, (const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w),           \
    (x, weight, bias, w),                                                                                      \
    is_floating(x.dtype()) && weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()))   \
  X(Tensor, conv2d_backward_input,                                                                             \
    (const Tensor& dy, const Tensor& weight, const Shape& input_shape, const Window2d& w),                     \
    (dy, weight, input_shape, w), is_floating(dy.dtype()) && weight.dtype() == dy.dtype())                     \
  X(Conv2dWeightGrads, conv2d_backward_weight, (const Tensor& dy, const Tensor& x, const Window2d& w, bool bias), \
    (dy, x, w, bias), is_floating(dy.dtype()) && x.dtype() == dy.dtype())                                      \
  X(Tensor, im2col, (const Tensor& x, const Window2d& w), (x, w), is_floating(x.dtype()))                     \
  X(Tensor, col2im, (const Tensor& cols, const Shape& input_shape, const Window2d& w), (cols, input_shape, w), \
    is_floating(cols.dtype()))

// Pooling (ops/cpu/pool.cpp, cuda/pool.cu). x (N, C, H, W); padding at most half the kernel.
//   max_pool2d(x, w)                               y and indices (MaxPoolResult); padding never wins, NaN wins.
//   max_pool2d_backward(dy, indices, input_shape, w)  dx (input_shape), dy added at each index.
//   avg_pool2d(x, w)                               window means, padding counted in the divisor.
//   avg_pool2d_backward(dy, input_shape, w)        dx (input_shape).
#define MT_KERNELS_POOL(X)                                                                                     \
  X(MaxPoolResult, max_pool2d, (const Tensor& x, const Window2d& w), (x, w), is_floating(x.dtype()))          \
  X(Tensor, max_pool2d_backward, (const Tensor& dy, const Tensor& indices, const Shape& input_shape,           \
    const Window2d& w), (dy, indices, input_shape, w), is_floating(dy.dtype()) && indices.dtype() == DType::kI32) \
  X(Tensor, avg_pool2d, (const Tensor& x, const Window2d& w), (x, w), is_floating(x.dtype()))                 \
  X(Tensor, avg_pool2d_backward, (const Tensor& dy, const Shape& input_shape, const Window2d& w),              \
    (dy, input_shape, w), is_floating(dy.dtype()))

// Dropout (ops/cpu/dropout.cpp, cuda/dropout.cu).
//   dropout_mask(shape, p, generator, device)  a kBool keep-mask on `device`, drawn from `generator`: with
//       (seed, first) = generator.reserve(numel), element i is kept when uniform_float(philox(seed, 0, first + i)[0])
//       >= p; the same generator state gives the same mask on every device. The backend reserves the counters (as
//       PyTorch's kernels take theirs from the generator), so a CUDA graph capture knows which generator a draw is
//       from: only the default generator's can be replayed (cuda/dropout.cu).
#define MT_KERNELS_DROPOUT(X)                                                                                  \
  X(Tensor, dropout_mask, (const Shape& shape, double p, Generator& generator, Device device),                \
    (shape, p, generator, device), true)

// Indexing (ops/cpu/index.cpp, cuda/index.cu). Index values are in range: the op checks CPU indices; on CUDA
// (where reading them would synchronise) gather gives NaN (0 for integers) and the adds skip an out-of-range index.
//   gather(x, dim, index)                 out (index's shape) = x with coordinate `dim` replaced by index (kI64,
//                                         x's rank): torch.gather.
//   scatter_add(shape, dim, index, src)   zeros(shape) in src's dtype with src added at index along `dim`.
//   index_select(x, dim, index)           x's slices at `index` (0-D or 1-D, kI64/kI32) along `dim`.
//   index_add(shape, dim, index, src)     zeros(shape) with src's slices added at `index` along `dim`.
//   randperm(n, seed, offset, device)     (n) kI64 on `device`: 0..n-1 sorted by (permutation_key(seed, offset, i),
//                                         i) (core/random.h), so every device draws the same permutation.
// Sums accumulate in opmath and round once per output.
#define MT_KERNELS_INDEX(X)                                                                                    \
  X(Tensor, randperm, (int64_t n, uint64_t seed, uint64_t offset, Device device), (n, seed, offset, device),   \
    n >= 0)                                                                                                    \
  X(Tensor, gather, (const Tensor& x, int64_t dim, const Tensor& index), (x, dim, index),                     \
    index.dtype() == DType::kI64 && dim_of(dim, x.dim()))                                                      \
  X(Tensor, scatter_add, (const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src),            \
    (shape, dim, index, src), index.dtype() == DType::kI64 && is_floating(src.dtype()) &&                      \
    dim_of(dim, shape.size()))                                                                                 \
  X(Tensor, index_select, (const Tensor& x, int64_t dim, const Tensor& index), (x, dim, index),               \
    (index.dtype() == DType::kI64 || index.dtype() == DType::kI32) && dim_of(dim, x.dim()))                    \
  X(Tensor, index_add, (const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src),              \
    (shape, dim, index, src), (index.dtype() == DType::kI64 || index.dtype() == DType::kI32) &&                \
    is_floating(src.dtype()) && dim_of(dim, shape.size()))

// Multi-tensor kernels (ops/cpu/foreach.cpp, cuda/foreach.cu): one pass over a list of tensors, for the
// optimizers, the loss scaler and gradient clipping (optim/). All on one device; the lists may mix floating dtypes;
// the in-place ones update each tensor in place, and their tensors must not overlap (one launch updates them all at
// once on a GPU: a tensor given twice would race there; the optimizers and the scaler never pass one twice). None
// reads a value back to the host: scalars that depend on data (inv_scale, a clip coefficient, found_inf) are
// one-element tensors on the list's device. Scalar formulas: ops/backend/amp_math.h.
//   non_finite_check_and_unscale_(tensors, found_inf, inv_scale)  t *= inv_scale for every tensor (a NaN element
//       keeps its bits, as in foreach_mul_: math::rescales), and found_inf[0] (f32) is set to 1 when any element
//       (before scaling) is inf or NaN; left alone otherwise. found_inf has one element, or 1 + tensors.size():
//       then found_inf[1 + i] is also set to 1 when tensors[i] held one (which parameter's gradient tripped the
//       scaler, without another pass). inv_scale is one f32 element on the same device.
//   amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)  the loss
//       scale's state machine (PyTorch's _amp_update_scale_), overwriting scale (one f32) and growth_tracker (one
//       i32): found_inf != 0: scale *= backoff_factor, tracker = 0; else tracker + 1 == growth_interval: scale *=
//       growth_factor (kept when the product is not finite), tracker = 0; else tracker += 1.
//   foreach_norm(tensors, ord)  a fresh (n) tensor of each tensor's ord-norm (ord > 0, or +inf: max |x|), summed in
//       opmath (f32 for f16/bf16/f32, f64 for f64); its dtype is f64 when the list holds an f64 tensor, else f32.
//       An empty tensor's norm is 0; a NaN element gives NaN, an inf one inf. The list is not empty.
//   foreach_mul_(tensors, factor)  t *= factor, factor one f32 or f64 element on the list's device (in opmath_t<T>);
//       a NaN element keeps its bits (the backends' multiplies give NaNs of different payloads).
//   foreach_clamp_(tensors, lo, hi)  t = min(max(t, lo), hi), lo <= hi (in opmath_t<T>); NaN stays NaN.
#define MT_KERNELS_FOREACH(X)                                                                                  \
  X(void, non_finite_check_and_unscale_,                                                                       \
    (std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale),                       \
    (tensors, found_inf, inv_scale), foreach_unscale_ok(tensors, found_inf, inv_scale))                        \
  X(void, amp_update_scale_,                                                                                   \
    (const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,         \
     double backoff_factor, int64_t growth_interval),                                                          \
    (scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval),                        \
    amp_update_scale_ok(scale, growth_tracker, found_inf, growth_interval))                                    \
  X(Tensor, foreach_norm, (std::span<const Tensor> tensors, double ord), (tensors, ord),                       \
    foreach_norm_ok(tensors, ord))                                                                             \
  X(void, foreach_mul_, (std::span<const Tensor> tensors, const Tensor& factor), (tensors, factor),            \
    foreach_mul_ok(tensors, factor))                                                                           \
  X(void, foreach_clamp_, (std::span<const Tensor> tensors, double lo, double hi), (tensors, lo, hi),          \
    foreach_writable(tensors) && lo <= hi)

// ---- what the optimizer kernels take ---------------------------------------------------------

/// What an optimizer step kernel needs of each parameter of its lists besides its tensors.
struct OptimStep {
  int64_t step = 1;             // the parameter's update count including this one (>= 1): Adam's bias corrections
  const int32_t* count = nullptr;  // when set, the count is read here instead, in the memory of the call's device
                                   // (the optimizer's counters, which optim_count_steps_ advanced: a step that is
                                   // skipped on the device never reads the host)
  int64_t index = 0;            // the parameter's index in its optimizer: with step and the seed, the key of its
                                // stochastic rounding, so the bits do not depend on how the lists are cut
  bool first_momentum = false;  // SGD: its momentum buffer is new and takes the direction itself (PyTorch's first
                                // step) instead of being decayed
};

/// torch.optim.SGD's options, for one sgd_step_ call.
struct SgdHyper {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
  bool stochastic_rounding = false;  // bf16 parameters without masters: the f32 result is rounded stochastically
  uint64_t seed = 0;                 // of the stochastic rounding
  const SgdHyper* on_device = nullptr;  // when set: the options are read there (memory of the call's device) when
                                        // the kernels run, but for those that choose them (see below)
};

/// torch.optim.Adam's and AdamW's options, for one adam_step_ call.
struct AdamHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW: p *= 1 − lr·weight_decay before the update;
                                        // Adam: g += weight_decay·p
  bool amsgrad = false, maximize = false;
  bool stochastic_rounding = false;  // as SgdHyper's
  uint64_t seed = 0;
  const AdamHyper* on_device = nullptr;  // as SgdHyper's
};

/// Whether options `b` run the kernels and operands options `a` chose: the same momentum (zero or not: a momentum
/// buffer or none), amsgrad, weight decay (Adam's or AdamW's) and stochastic rounding. The others (lr, betas, ...)
/// are arguments of the kernels, which may read them on the device (on_device).
inline bool same_kernels(const SgdHyper& a, const SgdHyper& b) {
  return (a.momentum != 0) == (b.momentum != 0) && a.stochastic_rounding == b.stochastic_rounding;
}
inline bool same_kernels(const AdamHyper& a, const AdamHyper& b) {
  return a.amsgrad == b.amsgrad && a.decoupled_weight_decay == b.decoupled_weight_decay &&
         a.stochastic_rounding == b.stochastic_rounding;
}

// Optimizer steps (ops/cpu/optim.cpp, cuda/optim.cu): one update of the parameters of a param group on one device,
// torch.optim's single-tensor formulas (ops/backend/optim_math.h) in one pass that reads each element of the
// gradient and the state once and writes the parameter and the state once. The lists are parallel: entry i of each
// belongs to params[i] and has its shape, steps[i] is its OptimStep; grads have their parameter's dtype and are only
// read. Where a parameter's value lives, and the dtype of its state (momentum_buffers, exp_avgs, ...):
//   masters given (one per parameter: f32 for f16/bf16 parameters): the master is read and updated, and the
//       parameter is overwritten with it rounded to nearest (its old value is not read); state f32.
//   no masters, hyper.stochastic_rounding, a bf16 parameter: updated from its value in f32 and overwritten with the
//       result rounded stochastically (optim_math.h: a hash of seed, step, index and the element's position);
//       state f32.
//   otherwise: the parameter is updated in its own dtype (opmath_t arithmetic, one rounding per store); state in the
//       parameter's dtype.
// found_inf: undefined, or a one-element f32 tensor on the call's device (the GradScaler's): when it is nonzero the
// call changes nothing, decided on the device (the sync-free step of mixed precision training).
// hyper.on_device: when set, the kernels take the options from that struct as it is when they run, except the ones
// that chose the kernels and operands (same_kernels): those are hyper's, and *on_device must agree.
// at_replay: empty, or the options as they are now (it may throw). A CUDA graph that captures the call runs it
// before each replay and the replayed kernels read its result (on_device): a schedule's learning rate, set between
// replays, reaches them as it would reach eager steps (PyTorch's capturable optimizers with a tensor lr). A replay
// is refused when it throws or its options select other kernels (same_kernels). Elsewhere it is not called.
//   sgd_step_(params, grads, momentum_buffers, masters, steps, hyper, found_inf, at_replay)  momentum_buffers: one
//       per parameter when hyper.momentum != 0, else none.
//   adam_step_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, hyper, found_inf, at_replay)
//       Adam, or AdamW with hyper.decoupled_weight_decay; max_exp_avg_sqs: one per parameter when hyper.amsgrad,
//       else none.
//   optim_count_steps_(counts, found_inf)  each count (a one-element i32 tensor) += 1 unless found_inf is nonzero
//       or the count is already 2^31 − 1, where it stays: the parameters' update counts, advanced before the step
//       that reads them.
#define MT_KERNELS_OPTIM(X)                                                                                    \
  X(void, sgd_step_,                                                                                           \
    (std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,  \
     std::span<const Tensor> masters, std::span<const OptimStep> steps, const SgdHyper& hyper,                 \
     const Tensor& found_inf, const std::function<SgdHyper()>& at_replay),                                     \
    (params, grads, momentum_buffers, masters, steps, hyper, found_inf, at_replay),                            \
    sgd_step_ok(params, grads, momentum_buffers, masters, steps, hyper) && found_inf_ok(found_inf))            \
  X(void, adam_step_,                                                                                          \
    (std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avgs,          \
     std::span<const Tensor> exp_avg_sqs, std::span<const Tensor> max_exp_avg_sqs,                             \
     std::span<const Tensor> masters, std::span<const OptimStep> steps, const AdamHyper& hyper,                \
     const Tensor& found_inf, const std::function<AdamHyper()>& at_replay),                                    \
    (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, hyper, found_inf, at_replay),      \
    adam_step_ok(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, hyper) &&              \
    found_inf_ok(found_inf))                                                                                   \
  X(void, optim_count_steps_, (std::span<const Tensor> counts, const Tensor& found_inf), (counts, found_inf),  \
    count_steps_ok(counts) && found_inf_ok(found_inf))

// Numerics statistics (ops/cpu/numerics.cpp, cuda/numerics.cu), for the numerics inspector (optim/inspect.h). The
// fields and the exact definition of every count: ops/backend/numerics_math.h. Neither reads a value back to the
// host: the counts stay on the device until a report reads them. Each count is an integer, so CUDA gives the CPU's
// result bit for bit whatever the order the blocks add in.
//   numerics_stats(x, multiplier)  a fresh (kNumericsFields) i64 tensor of statistics of x's values read as f32
//       (an f64 rounded to f32 first) and, when multiplier is defined (one f32 element), each multiplied by it with
//       the product rounded to f32 (a gradient's unscaled statistics: multiplier = 1 / scale): the counts, the f32
//       bits of the amax and the log2-magnitude histogram. x contiguous and floating.
//   lost_updates(before, after, model_dtype)  a fresh (kLostUpdateFields = 3) i64 tensor [numel, unchanged, lost] of
//       the update u = after − before (exact): unchanged u == 0, lost 0 < |u| < half the spacing of model_dtype
//       (f16, bf16 or f32) at before; an element with a non-finite value is in neither. before and after contiguous,
//       of one shape and floating dtype.
#define MT_KERNELS_NUMERICS(X)                                                                                 \
  X(Tensor, numerics_stats, (const Tensor& x, const Tensor& multiplier), (x, multiplier),                     \
    numerics_stats_ok(x, multiplier))                                                                          \
  X(Tensor, lost_updates, (const Tensor& before, const Tensor& after, DType model_dtype),                      \
    (before, after, model_dtype), lost_updates_ok(before, after, model_dtype))

/// Every kernel, in table order.
#define MT_BACKEND_KERNELS(X)                                                                                  \
  MT_KERNELS_ELEMENTWISE(X)                                                                                    \
  MT_KERNELS_REDUCE(X)                                                                                         \
  MT_KERNELS_MATMUL(X)                                                                                         \
  MT_KERNELS_SOFTMAX(X)                                                                                        \
  MT_KERNELS_LOSS(X)                                                                                           \
  MT_KERNELS_NORM(X)                                                                                           \
  MT_KERNELS_CONV(X)                                                                                           \
  MT_KERNELS_POOL(X)                                                                                           \
  MT_KERNELS_DROPOUT(X)                                                                                        \
  MT_KERNELS_INDEX(X)                                                                                          \
  MT_KERNELS_FOREACH(X)                                                                                        \
  MT_KERNELS_OPTIM(X)                                                                                          \
  MT_KERNELS_NUMERICS(X)

// ---- what is generated from the list -----------------------------------------------------------

#define MT_KERNEL_DECLARE(ret, name, params, args, invariant) ret name params;
#define MT_KERNEL_MEMBER(ret, name, params, args, invariant) ret(*name) params = nullptr;
#define MT_KERNEL_NAME(ret, name, params, args, invariant) #name,

/// The entry points: pick the backend of the arguments' device, check the invariants, run its kernel.
MT_BACKEND_KERNELS(MT_KERNEL_DECLARE)

/// The CPU kernels (ops/cpu/<family>.cpp): the reference.
namespace cpu {
MT_BACKEND_KERNELS(MT_KERNEL_DECLARE)
}  // namespace cpu

/// The CUDA kernels (cuda/<family>.cu); defined only in builds with CUDA, referenced only by cuda/backend.cu.
namespace cuda {
MT_BACKEND_KERNELS(MT_KERNEL_DECLARE)
}  // namespace cuda

/// What one kind of device provides: memory and copies for core, every kernel for the op layer.
struct Backend {
  DeviceType type = DeviceType::kCPU;
  DeviceMemory* memory = nullptr;
  MT_BACKEND_KERNELS(MT_KERNEL_MEMBER)
};

/// The kernel names in table order, for tests that walk the table.
inline constexpr const char* kKernelNames[] = {MT_BACKEND_KERNELS(MT_KERNEL_NAME)};
inline constexpr int kNumKernels = static_cast<int>(sizeof(kKernelNames) / sizeof(kKernelNames[0]));

/// Whether each of `backend`'s kernels is set, in kKernelNames' order.
bool has_kernel(const Backend& backend, int index);

/// Installs the backend of a device type and its memory (core's device_memory then finds it); the CUDA layer
/// calls it when the library loads. The CPU's backend is built in.
void register_backend(const Backend& backend) noexcept;

/// The backend of `device`'s type; throws mixtape::Error naming `op` when mixtape was built without it.
const Backend& backend_of(Device device, const char* op);
/// The CPU's backend (the reference every other is tested against).
const Backend& cpu_backend();
/// The CUDA backend when this build has one, else nullptr.
const Backend* cuda_backend() noexcept;

/// Names the kernel a backend chose for the op running on this thread ("wmma f16", "simt f32"; a string literal),
/// for autograd::PrecisionTrace, which takes it (and clears it) after each traced op.
void note_kernel(const char* name) noexcept;
/// The last noted kernel name since the previous call, or nullptr; clears it.
const char* take_noted_kernel() noexcept;

namespace cpu {
/// The reference triple loop (f64 accumulation for every dtype; no BLAS, no threads): what tests and bench/
/// compare the fast path against. 2-D only. Not in the table.
Tensor matmul_naive(const Tensor& a, const Tensor& b);
}  // namespace cpu

}  // namespace mixtape::kernels
