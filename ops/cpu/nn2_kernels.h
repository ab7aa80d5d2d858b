// ops/cpu/nn2_kernels.h — the CPU implementations of the convolution, pooling,
// dropout and indexing kernels of ops/kernels.h (internal).
//
// ops/dispatch_nn2.cpp validates every argument (ranks, windows, dtypes,
// devices, index ranges) and then calls these; they assume valid CPU inputs
// of any layout and allocate their outputs (they overwrite, never
// accumulate into a caller's tensor). Sums (col2im, the pooling backwards,
// index_add, avg_pool2d) accumulate in opmath_t<T> and round once per output.
#pragma once

#include <cstdint>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/kernels.h>

namespace mixtape::kernels::cpu {

/// x (N, C, H, W) -> columns (N, C·kH·kW, H_out·W_out); padding reads as 0.
Tensor im2col(const Tensor& x, const Window2d& w);
/// cols (N, C·kH·kW, H_out·W_out) -> (N, C, H, W) of `input_shape`: each column entry added to the pixel it came from.
Tensor col2im(const Tensor& cols, const Shape& input_shape, const Window2d& w);

/// x (N, C, H, W) -> y (N, C, H_out, W_out) and indices (N, C, H_out, W_out, kI64, flat in H·W); NaN wins.
MaxPoolResult max_pool2d(const Tensor& x, const Window2d& w);
/// dy, indices (N, C, H_out, W_out) -> dx (N, C, H, W) of `input_shape`, dy added at each index.
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Shape& input_shape, const Window2d& w);
/// x (N, C, H, W) -> (N, C, H_out, W_out): window sums over kH·kW (padding counted as zeros).
Tensor avg_pool2d(const Tensor& x, const Window2d& w);
/// dy (N, C, H_out, W_out) -> dx (N, C, H, W) of `input_shape`.
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const Window2d& w);

/// kBool mask of `shape` on `device`, drawn on the CPU: element i is kept when
/// uniform_float(philox(seed, 0, offset + i)[0]) >= p.
Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device);

/// x's slices at `index` (0-D or 1-D, kI64/kI32, values in range) along `dim` (wrapped); any dtype.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// zeros(shape) in src's dtype with src's slices added at `index` along `dim` (wrapped); floating src.
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace mixtape::kernels::cpu
