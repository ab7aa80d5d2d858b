// ops/cpu/window.h — the (N, C, H, W) planes and window taps the CPU's conv and pool kernels share (internal).
//
// The one design idea: work one (n, c) plane at a time, planes in parallel
// with OpenMP. A plane's scatter-adds (col2im, the pooling backwards) then
// never race, and each sum goes into an opmath_t<T> buffer the size of one
// plane that is rounded to T once per output (accumulate_into, loops.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cpu {

/// The sizes of an (N, C, H, W) problem and its window's output plane.
struct Planes {
  int64_t n, c, h, w;    // input (N, C, H, W)
  int64_t ho, wo;        // output plane (H_out, W_out)
  int64_t count() const { return n * c; }
  int64_t in_plane() const { return h * w; }
  int64_t out_plane() const { return ho * wo; }
};

inline Planes planes_of(const Shape& input_shape, const Window2d& w) {
  return {input_shape[0], input_shape[1], input_shape[2], input_shape[3],
          window_output_size(input_shape[2], w, 0), window_output_size(input_shape[3], w, 1)};
}

/// The outputs o in [0, n_out) whose tap o·stride + offset lands inside [0, n_in): [lo, hi).
struct Valid {
  int64_t lo, hi;
};
inline Valid valid_outputs(int64_t offset, int64_t stride, int64_t n_in, int64_t n_out) {
  const int64_t lo = std::min(n_out, offset >= 0 ? int64_t{0} : (-offset + stride - 1) / stride);
  const int64_t last = n_in - 1 - offset;  // o·stride <= last
  const int64_t hi = last < 0 ? lo : std::clamp(last / stride + 1, lo, n_out);
  return {lo, hi};
}

/// Calls `visit(input_pos, output_pos)` for each tap of each window of one plane
/// that lands inside the input (padding taps are skipped).
template <class F>
inline void for_each_tap(const Planes& p, const Window2d& w, F&& visit) {
  for (int64_t oh = 0; oh < p.ho; ++oh)
    for (int64_t ow = 0; ow < p.wo; ++ow)
      for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
        const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
        if (ih < 0 || ih >= p.h) continue;
        for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
          const int64_t iw = ow * w.stride[1] - w.padding[1] + kw * w.dilation[1];
          if (iw < 0 || iw >= p.w) continue;
          visit(ih * p.w + iw, oh * p.wo + ow);
        }
      }
}

}  // namespace mixtape::kernels::cpu
