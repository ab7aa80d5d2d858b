// ops/common.h — small helpers the op definitions share.
#pragma once

#include <vector>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/kernels.h>

namespace mixtape::ops {

/// Sums `grad` down to `shape` (the inverse of broadcasting `shape` to grad's shape).
inline Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - shape.size();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && grad.shape()[i] != 1)) dims.push_back(i);
  Tensor s = kernels::reduce(kernels::ReduceOp::kSum, grad, dims, /*keepdim=*/true);
  return raw::reshape(s, shape);
}

}  // namespace mixtape::ops

namespace mixtape::ops {

/// The dtype a multi-step formula on `t` runs in: f32 for f16/bf16 (so the
/// result is rounded once, at the end), otherwise t's own.
inline DType opmath_dtype(DType t) { return is_reduced_float(t) ? DType::kF32 : t; }

}  // namespace mixtape::ops
