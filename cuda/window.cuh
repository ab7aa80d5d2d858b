// cuda/window.cuh — the (N, C, H, W) planes and window taps cuda/conv.cu and cuda/pool.cu share (internal).
//
// The one design idea (as ops/cpu/window.h): no sum is an atomic scatter.
// Each output element (an input pixel for col2im and avg_pool2d_backward) is
// owned by one thread that visits its contributions in the CPU reference's
// order, sums in opmath_t<T> and rounds once, so these results are run-to-run
// deterministic and bit-identical to the CPU's.
#pragma once

#include <cstdint>

#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cuda {

/// The sizes of an (N, C, H, W) problem and its window's output plane, passed to kernels by value.
struct Planes {
  int64_t count;   // N·C planes
  int64_t h, w;    // input plane (H, W)
  int64_t ho, wo;  // output plane (H_out, W_out)
};

inline Planes planes_of(const Shape& input_shape, const Window2d& w) {
  return {input_shape[0] * input_shape[1], input_shape[2], input_shape[3], window_output_size(input_shape[2], w, 0),
          window_output_size(input_shape[3], w, 1)};
}

/// The output o along one axis whose tap k reads input position i (o·stride − padding + k·dilation = i),
/// or -1 when there is none in [0, n_out). `I` is the index type the kernel computes positions in.
template <class I>
__device__ __forceinline__ I output_of_tap(I i, I k, I stride, I padding, I dilation, I n_out) {
  const I t = i + padding - k * dilation;  // o·stride
  if (t < 0 || t % stride != 0) return -1;
  const I o = t / stride;
  return o < n_out ? o : -1;
}

}  // namespace mixtape::kernels::cuda
