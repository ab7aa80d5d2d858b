// ops/common.h — small helpers the op definitions share (internal to ops/).
#pragma once

#include <numeric>
#include <vector>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::ops {

/// Every dim of `t`, ascending: the dims of a full reduction.
inline std::vector<int64_t> all_dims(const Tensor& t) {
  std::vector<int64_t> dims(static_cast<size_t>(t.dim()));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  return dims;
}

/// A 0-d tensor holding `value` (rounded to `dtype`) on `device`: an operand that broadcasts against anything.
/// Unlike scalar_tensor, a value past a 16-bit dtype's range becomes its infinity (clamp(x_f16, max=1e5)'s bound,
/// as PyTorch's ops take their scalars).
inline Tensor scalar_like(double value, DType dtype, Device device) {
  Tensor t = empty({}, TensorOptions(dtype).device(device));
  raw::fill_(t, value);
  return t;
}
/// The same in `like`'s dtype and on its device.
inline Tensor scalar_like(double value, const Tensor& like) { return scalar_like(value, like.dtype(), like.device()); }

/// `op` over every element of `t`: a 0-d tensor in `out_dtype`.
inline Tensor reduce_all(kernels::ReduceOp op, const Tensor& t, DType out_dtype) {
  return kernels::reduce(op, t, all_dims(t), /*keepdim=*/false, out_dtype);
}

/// Sums `grad` down to `shape` (the inverse of broadcasting `shape` to grad's shape), in grad's dtype.
inline Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - shape.size();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && grad.shape()[i] != 1)) dims.push_back(i);
  Tensor s = kernels::reduce(kernels::ReduceOp::kSum, grad, dims, /*keepdim=*/true, grad.dtype());
  return raw::reshape(s, shape);
}

}  // namespace mixtape::ops
