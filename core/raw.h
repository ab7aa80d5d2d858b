// core/raw.h — views and copies of tensors without autograd (internal).
//
// What core itself, the op layer's forwards and backwards, and the kernels
// use: the same views and copies as the Tensor methods, recording nothing on
// the tape and never autocast. User code wants the Tensor methods
// (core/tensor.h), which do record.
#pragma once

#include <cstdint>

#include <mixtape/core/tensor.h>

namespace mixtape {

namespace raw {
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// A view with new shape/strides/offset over the same storage (bounds-checked).
Tensor as_strided(const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);
Tensor to(const Tensor& x, Device device, DType dtype);
/// dst = src broadcast to dst's shape, converting dtype and device; bumps dst's version.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
}  // namespace raw

/// The scalar `value` written into `dtype` by `op` (full, fill_, set, arange): an error naming the op and `shape`
/// unless it fits (fits() in dtype.h, PyTorch's "value cannot be converted to type ... without overflow").
void check_fits(const char* op, double value, DType dtype, const Shape& shape);

}  // namespace mixtape
