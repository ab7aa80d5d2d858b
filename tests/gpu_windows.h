// tests/gpu_windows.h — what the GPU tests of the window kernels share: the convolution columns
// (tests/test_conv.cpp) and the pools (tests/test_pool.cpp), each against the CPU's kernel.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include <mixtape/core/raw.h>
#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::test {

inline std::string describe(const kernels::Window2d& w) {
  std::ostringstream os;
  os << "kernel " << w.kernel[0] << "x" << w.kernel[1] << " stride " << w.stride[0] << "x" << w.stride[1]
     << " padding " << w.padding[0] << "x" << w.padding[1] << " dilation " << w.dilation[0] << "x" << w.dilation[1];
  return os.str();
}

inline kernels::Window2d window(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                                int64_t dw) {
  return kernels::Window2d{{kh, kw}, {sh, sw}, {ph, pw}, {dh, dw}};
}
inline kernels::Window2d window(int64_t k, int64_t s, int64_t p, int64_t d) { return window(k, k, s, s, p, p, d, d); }

/// A tensor of `shape` whose dims 2 and 3 are swapped in memory: the transpose of a contiguous (…, d3, d2) tensor.
inline Tensor transposed_23(const Tensor& contiguous_swapped) { return raw::transpose(contiguous_swapped, 2, 3); }

struct WindowCase {
  const char* name;
  Shape input;  // (N, C, H, W)
  kernels::Window2d w;
};

inline std::string label(const char* kernel, const WindowCase& c, DType dt, const char* layout = "contiguous") {
  std::ostringstream os;
  os << kernel << " [" << c.name << "; " << describe(c.w) << "; input " << c.input << "; " << dt << "; " << layout
     << "]";
  return os.str();
}

/// The window's output plane for `input`.
inline Shape pooled(const Shape& input, const kernels::Window2d& w) {
  return {input[0], input[1], kernels::window_output_size(input[2], w, 0), kernels::window_output_size(input[3], w, 1)};
}

}  // namespace mixtape::test
