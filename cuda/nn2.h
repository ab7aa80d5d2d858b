// cuda/nn2.h — the CUDA convolution-column, pooling, dropout and indexing
// kernels of core/kernel_table.h (internal: cuda/table.cu and cuda/{conv,pool,dropout,index}.cu).
//
// The launchers have the table's exact signatures, so cuda/table.cu lists
// them as they are. ops/dispatch_nn2.cpp has validated every argument before
// they run (ranks, windows that fit, dtypes, devices, index ranges); inputs
// may have any layout; outputs are freshly allocated and overwritten, never
// accumulated into.
//
// The one design idea: no sum is an atomic scatter. Each output element (an
// input pixel for col2im and avg_pool2d_backward, an output slice element for
// index_add) is owned by one thread that visits its contributions in
// the CPU reference's order, sums in opmath_t<T> and rounds once. The CUDA
// results are then run-to-run deterministic and, for these sums, bit-identical
// to ops/cpu/nn2.cpp.
//
// No CUDA header here: the part below `__CUDACC__` is what the .cu files
// share (the stream they launch on, the grid shape), and nvcc has already
// included cuda_runtime.h when it compiles them.
#pragma once

#include <cstdint>

#include <mixtape/core/kernel_table.h>
#include <mixtape/core/tensor.h>

#if defined(__CUDACC__)
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/stream.cuh>
#endif

namespace mixtape::kernels::cuda {

// ---- cuda/conv.cu ---------------------------------------------------------------------
/// x (N, C, H, W) -> columns (N, C·kH·kW, H_out·W_out); padding reads as 0.
Tensor im2col(const Tensor& x, const Window2d& w);
/// cols (N, C·kH·kW, H_out·W_out) -> (N, C, H, W) of `input_shape`; each pixel gathers the entries read from it.
Tensor col2im(const Tensor& cols, const Shape& input_shape, const Window2d& w);

// ---- cuda/pool.cu ---------------------------------------------------------------------
/// x (N, C, H, W) -> y and kI64 indices (N, C, H_out, W_out), flat in H·W; padding never wins, NaN wins.
MaxPoolResult max_pool2d(const Tensor& x, const Window2d& w);
/// dy, indices (N, C, H_out, W_out) -> dx (N, C, H, W) of `input_shape`.
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Shape& input_shape, const Window2d& w);
/// x (N, C, H, W) -> (N, C, H_out, W_out), divisor kH·kW (count_include_pad).
Tensor avg_pool2d(const Tensor& x, const Window2d& w);
/// dy (N, C, H_out, W_out) -> dx (N, C, H, W) of `input_shape`.
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const Window2d& w);

// ---- cuda/dropout.cu ------------------------------------------------------------------
/// kBool mask of `shape` drawn on `device` (a CUDA device): element i kept when
/// uniform_float(philox4x32_10(seed, 0, offset + i)[0]) >= p, the CPU's very draw.
Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device);

// ---- cuda/index.cu --------------------------------------------------------------------
/// x's slices at `index` (0-D or 1-D, kI64/kI32, on x's device) along `dim`; any dtype.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// zeros(shape) in src's dtype with src's slices added at `index` along `dim`; floating src.
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

#if defined(__CUDACC__)
// ---- shared by the .cu files of this family ---------------------------------------------

inline constexpr int kNn2Threads = 256;

/// Blocks for a grid-stride loop over `n` > 0 items: one item per thread up to 2^16 blocks, then the loop.
inline unsigned nn2_blocks(int64_t n) {
  const int64_t blocks = (n + kNn2Threads - 1) / kNn2Threads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 16) ? blocks : (int64_t{1} << 16));
}


/// The sizes of an (N, C, H, W) problem and its window's output plane, passed to kernels by value.
struct Nn2Planes {
  int64_t count;   // N·C planes
  int64_t h, w;    // input plane (H, W)
  int64_t ho, wo;  // output plane (H_out, W_out)
};

inline Nn2Planes nn2_planes(const Shape& input_shape, const Window2d& w) {
  return {input_shape[0] * input_shape[1], input_shape[2], input_shape[3], window_output_size(input_shape[2], w, 0),
          window_output_size(input_shape[3], w, 1)};
}

/// The output o along one axis whose tap k reads input position i (o·stride − padding + k·dilation = i),
/// or -1 when there is none in [0, n_out). `I` is the index type the kernel computes positions in.
template <class I>
__device__ __forceinline__ I nn2_output_of_tap(I i, I k, I stride, I padding, I dilation, I n_out) {
  const I t = i + padding - k * dilation;  // o·stride
  if (t < 0 || t % stride != 0) return -1;
  const I o = t / stride;
  return o < n_out ? o : -1;
}
#endif  // __CUDACC__

}  // namespace mixtape::kernels::cuda
