// ops/common.h — small helpers the op definitions share (internal to ops/).
#pragma once

#include <cmath>
#include <cstdint>
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
/// Unlike scalar_tensor, it takes what PyTorch's ops take: a value past a 16-bit dtype's range becomes its infinity
/// (clamp(x_f16, max=1e5)'s bound), and an integer into i32 or u8 wraps as integer arithmetic does (where(c, x_u8,
/// -1) holds 255), on the CPU and on a GPU alike, where a floating-to-integer cast would saturate.
inline Tensor scalar_like(double value, DType dtype, Device device) {
  if ((dtype == DType::kI32 || dtype == DType::kU8) && fits(value, DType::kI64) && value == std::trunc(value)) {
    const auto wide = static_cast<int64_t>(value);
    value = dtype == DType::kI32 ? static_cast<double>(static_cast<int32_t>(wide))
                                 : static_cast<double>(static_cast<uint8_t>(wide));
  }
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
