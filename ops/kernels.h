// ops/kernels.h — the primitive kernels every op is built from, for any device.
//
// These are not differentiable and do no dtype promotion: the op layer
// (ops/*.cpp, with the tape and autocast) decides dtypes and calls these.
// Each function validates its inputs, then dispatches on the device: the CPU
// kernels in ops/cpu/ are the reference, CUDA kernels must agree with them.
// All outputs are freshly allocated (they overwrite, never accumulate).
// f16/bf16 inputs are computed in f32 (opmath_t) with one rounding per output.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include <mixtape/core/kernel_table.h>
#include <mixtape/core/tensor.h>

namespace mixtape::kernels {

const char* name(UnaryOp op);
const char* name(BinaryOp op);
const char* name(ScalarOp op);
const char* name(ReduceOp op);

/// y = op(x), same shape and dtype as x (floating dtypes; kNeg/kAbs/kSign/kSquare also integers).
Tensor unary(UnaryOp op, const Tensor& x);

/// op(a, b) broadcast to a common shape. a and b must have the same dtype and
/// device; the result has that dtype (kBool for comparisons).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);

/// op(x, s), same shape and dtype as x.
Tensor scalar(ScalarOp op, const Tensor& x, double s);

/// cond ? a : b, broadcast; cond is kBool, a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

/// Reduces `x` over `dims` (empty: every dim), keeping them as size 1 when
/// `keepdim`. Sums and means of f16/bf16 accumulate in f32; the result dtype
/// is `out_dtype` if given (e.g. f32 statistics of f16 data), else x's dtype
/// (kI64 for argmax/argmin; sum of bool/integers gives kI64, mean requires a
/// floating dtype). max/min/argmax/argmin reject empty reductions; ties in
/// argmax/argmin pick the first index. NaN propagates through max/min.
Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim,
              std::optional<DType> out_dtype = std::nullopt);

/// Matrix product with torch.matmul's shape rules: 1-D operands are promoted
/// (and the added dim removed), >= 3-D operands are batches whose batch dims
/// broadcast. Same dtype for both; f16/bf16 accumulate in f32 and round once,
/// f32 accumulates in f32, f64 in f64. The result has `out_dtype` if given
/// (f32 output of f16 inputs), else the inputs' dtype. Transposed views are
/// read in place, never copied.
Tensor matmul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt);
/// a (m, k) · b (k, n) + bias (n), all of one floating dtype and device: the sum is formed in f32 (f64) and
/// rounded once to out_dtype (default: a's). On CUDA the bias is the GEMM's epilogue.
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt);

// ---- softmax, losses and normalisation (ops/cpu/nn.cpp) --------------------------------
// Statistics (max, sum of exponentials, mean, variance) are computed in f32 for
// f16/bf16 inputs (f64 for f64), whatever the output dtype.

/// softmax (or log_softmax when `log`) of `x` along `dim`; result in `out_dtype` (default: x's dtype).
Tensor softmax(const Tensor& x, int64_t dim, bool log, std::optional<DType> out_dtype = std::nullopt);
/// Gradient of softmax/log_softmax given the output `y` (same dtype as dy):
/// softmax: y·(dy − Σ dy·y); log_softmax: dy − exp(y)·Σ dy.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim, bool log);

/// out[i][j] = x[i][index[i][j]] along `dim` (torch.gather); index kI64, same rank as x.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// zeros(shape) with src added at index along `dim` (the gradient of gather).
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

/// Fused cross-entropy of logits (rows, C) and class targets (rows, kI64), every row in one pass:
/// per-row loss −[(1 − ε)·log p[t] + (ε/C)·Σ_c log p_c] (0 on rows whose target is ignore_index) and
/// per-row log-sum-exp (saved for the backward), both (rows) in f32 (f64 for f64 logits), with
/// ε = label_smoothing in [0, 1], and the loss's sum, count of counted rows and mean (0-d, same dtype: what a
/// sum or mean reduction returns, without more kernels). A target outside [0, C) that is not ignore_index
/// throws on the CPU; on CUDA (where checking would need a synchronisation) its row's loss is NaN.
///   const kernels::CrossEntropyResult r = kernels::cross_entropy(logits, target, -100, 0.0);  // r.mean
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double label_smoothing);
/// dlogits (logits' shape and dtype) = (exp(x − lse) − (1 − ε)·[c == t] − ε/C) · row_scale / divisor,
/// rounded once; row_scale (in lse's acc dtype or the logits' dtype) holds d loss / d per-row loss: (rows)
/// values, or one value for every row; divisor, when defined, is one acc-dtype value (the mean's count:
/// d mean / d loss_i = dy / count without kernels of its own). Rows whose target is ignore_index get 0
/// whatever their scale; an out-of-range target throws on the CPU and gives a NaN row on CUDA.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_scale,
                              int64_t ignore_index, double label_smoothing, const Tensor& divisor = Tensor());

/// Layer norm over the trailing `normalized_numel` elements of each row. Returns
/// y (x's dtype), and per-row mean and rstd (f32, or f64 for f64 input) for the backward.
LayerNormResult layer_norm(const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps);
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool bias_defined);

// ---- convolution, pooling, dropout, indexing (ops/cpu/conv.cpp, pool.cpp, index.cpp) -------

/// (N, C, H, W) -> (N, C·kH·kW, L) columns, L = H_out·W_out; zero padding.
Tensor im2col(const Tensor& x, const Window2d& w);
/// The adjoint of im2col: sums columns back into an (N, C, H, W) tensor of `input_shape`.
Tensor col2im(const Tensor& cols, const Shape& input_shape, const Window2d& w);

/// max over each window (padding never wins); indices (kI64) are flat positions in each H·W plane.
MaxPoolResult max_pool2d(const Tensor& x, const Window2d& w);
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Shape& input_shape, const Window2d& w);
/// mean over each window, padding counted in the divisor (count_include_pad).
Tensor avg_pool2d(const Tensor& x, const Window2d& w);
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const Window2d& w);

/// A kBool keep-mask of `shape`: element i is kept when the Philox draw for
/// (seed, offset + i) is >= p. The same (seed, offset) gives the same mask on every device.
Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device);

/// x's slices at `index` (1-D kI64/kI32) along `dim`.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// zeros(shape) with src's slices added at `index` along `dim` (the gradient of index_select).
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

namespace cpu {
/// The reference triple loop (f64 accumulation for every dtype; no BLAS, no
/// threads): what tests and bench/ compare the fast path against. 2-D only.
Tensor matmul_naive(const Tensor& a, const Tensor& b);
}  // namespace cpu

}  // namespace mixtape::kernels
