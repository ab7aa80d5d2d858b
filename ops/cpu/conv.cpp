// ops/cpu/conv.cpp — the convolution columns on the CPU: im2col and its adjoint col2im.
//
// A convolution is a GEMM over im2col columns (ops/conv.cpp). Planes in
// parallel (window.h); col2im sums each pixel's taps in opmath and rounds
// once. Inputs of any layout are made contiguous first; outputs are freshly
// allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/ops/cpu/loops.h>
#include <mixtape/ops/cpu/window.h>

namespace mixtape::kernels::cpu {

Tensor im2col(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  const int64_t kk = w.kernel[0] * w.kernel[1], L = p.out_plane();
  Tensor cols = empty({p.n, p.c * kk, L}, x.dtype());  // (N, C·kH·kW, L)
  if (cols.numel() == 0) return cols;
  dispatch_floating(x.dtype(), "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.data<T>();
    T* cp = cols.data<T>();
    const T zero = convert<T>(0.0f);
    // Rows (c·kH + kh)·kW + kw of sample n: plane (n, c) owns kH·kW consecutive rows.
#pragma omp parallel for schedule(static) if (cols.numel() >= kParallelMin)
    for (int64_t nc = 0; nc < p.count(); ++nc) {
      const T* src = xp + nc * p.in_plane();
      for (int64_t kh = 0; kh < w.kernel[0]; ++kh)
        for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
          T* row = cp + (nc * kk + kh * w.kernel[1] + kw) * L;
          const int64_t off_w = kw * w.dilation[1] - w.padding[1];
          const Valid cols_in = valid_outputs(off_w, w.stride[1], p.w, p.wo);
          for (int64_t oh = 0; oh < p.ho; ++oh) {
            T* __restrict dst = row + oh * p.wo;
            const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
            if (ih < 0 || ih >= p.h) {
              std::fill(dst, dst + p.wo, zero);
              continue;
            }
            // Padding on the left and right of the row, the input's pixels in between. The rows are short (24
            // pixels in the MNIST net) and many: plain loops the compiler vectorises, not memcpy calls.
            const T* __restrict line = src + ih * p.w;
            for (int64_t ow = 0; ow < cols_in.lo; ++ow) dst[ow] = zero;
            if (w.stride[1] == 1) {
              for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) dst[ow] = line[ow + off_w];
            } else {
              for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) dst[ow] = line[ow * w.stride[1] + off_w];
            }
            for (int64_t ow = cols_in.hi; ow < p.wo; ++ow) dst[ow] = zero;
          }
        }
    }
  });
  return cols;
}

Tensor col2im(const Tensor& cols_in, const Shape& input_shape, const Window2d& w) {
  const Tensor cols = raw::contiguous(cols_in);
  const Planes p = planes_of(input_shape, w);
  const int64_t kk = w.kernel[0] * w.kernel[1], L = p.out_plane();
  Tensor x = empty(input_shape, cols.dtype());  // (N, C, H, W)
  if (x.numel() == 0) return x;
  dispatch_floating(cols.dtype(), "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* cp = cols.data<T>();
    T* xp = x.data<T>();
#pragma omp parallel if (cols.numel() >= kParallelMin)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        accumulate_into(xp + nc * p.in_plane(), p.in_plane(), scratch, [&](M* acc) {
          for (int64_t kh = 0; kh < w.kernel[0]; ++kh)
            for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
              const T* row = cp + (nc * kk + kh * w.kernel[1] + kw) * L;
              const int64_t off_w = kw * w.dilation[1] - w.padding[1];
              const Valid cols_in = valid_outputs(off_w, w.stride[1], p.w, p.wo);
              for (int64_t oh = 0; oh < p.ho; ++oh) {
                const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
                if (ih < 0 || ih >= p.h) continue;
                M* line = acc + ih * p.w;
                const T* g = row + oh * p.wo;
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow)
                  line[ow * w.stride[1] + off_w] += static_cast<M>(g[ow]);
              }
            }
        });
      }
    }
  });
  return x;
}

}  // namespace mixtape::kernels::cpu
