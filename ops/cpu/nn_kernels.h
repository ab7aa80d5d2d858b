// ops/cpu/nn_kernels.h — the CPU implementations behind the "softmax, losses
// and normalisation" kernels of ops/kernels.h (internal).
//
// ops/dispatch_nn.cpp validates every argument (dtypes, devices, shapes,
// dims) and resolves defaults, then calls these; they assume valid CPU inputs
// (except index values, which only a pass over the data can check: gather and
// scatter_add throw on an index out of range). Outputs are freshly allocated
// and overwritten. Statistics run in f32 for f16/bf16 (f64 for f64) and every
// output element is rounded once.
#pragma once

#include <cstdint>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/kernels.h>

namespace mixtape::kernels::cpu {

/// softmax / log_softmax of x (any shape) along `dim` (wrapped); y has x's shape, in `out_dtype`.
Tensor softmax(const Tensor& x, int64_t dim, bool log, DType out_dtype);
/// dx (dy's shape and dtype) from dy and the forward output y (same dtype and shape); `dim` wrapped.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim, bool log);

/// out (index's shape, x's dtype) = x with coordinate `dim` (wrapped) replaced by index's value;
/// index kI64 of x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// zeros(shape) in src's (floating) dtype with src (index's shape) added along `dim` (wrapped), summed in opmath.
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

/// Fused cross-entropy of logits (rows, C), any floating dtype, and target (rows) kI64 (ops/kernels.h).
/// Throws on a target outside [0, C) that is not ignore_index.
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double label_smoothing);
/// dlogits (logits' shape and dtype); row_scale holds rows values or one for every row.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_scale,
                              int64_t ignore_index, double label_smoothing, const Tensor& divisor);

/// x (rows, normalized_numel) in any shape whose trailing dims hold normalized_numel elements;
/// weight/bias (normalized_numel elements, any floating dtype) may be undefined. y has x's shape
/// and dtype; mean/rstd are (rows) in f32 (f64 for f64 x).
LayerNormResult layer_norm(const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps);
/// dy has x's dtype and shape; mean/rstd (rows) as layer_norm returned them, rows >= 1. dx has x's
/// shape and dtype; dweight has weight's shape and dtype; dbias has weight's shape and dtype, or is
/// (normalized_numel) in x's dtype without a weight.
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool bias_defined);

}  // namespace mixtape::kernels::cpu
