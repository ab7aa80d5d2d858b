// ops/cpu/conv.cpp — convolution on the CPU: conv2d and its gradients, and the columns im2col and col2im.
//
// conv2d picks its algorithm per call: Winograd F(4x4, 3x3) (ops/cpu/conv_winograd.h) for the f32, f16 and bf16
// 3x3 windows of stride 1 it covers on a CPU with AVX-512 (computed in f32), else im2col + GEMM
// (ops/backend/conv_gemm.h) in chunks of samples whose columns fit the cache. The columns: planes in parallel
// (window.h); col2im sums each pixel's taps in opmath and rounds once. Inputs of any layout are made contiguous
// first; outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <mixtape/ops/backend/conv_gemm.h>
#include <mixtape/ops/cpu/conv_winograd.h>
#include <mixtape/ops/cpu/loops.h>
#include <mixtape/ops/cpu/window.h>

namespace mixtape::kernels::cpu {

namespace {

/// The column budget per chunk of samples: six samples of the MNIST net's second conv (663 KB of f32 columns each),
/// inside the last-level cache. Measured on the 2-core AVX-512 VM, CNN training step time over the time of its GEMMs
/// alone: 1.4 to 4 MiB ~1.38 (within noise of each other), 8 MiB 1.42, the whole batch 1.54, one sample per chunk
/// (0.7 MB) 1.85.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

/// How many samples of x (N, C_in, H, W) go through im2col and the GEMMs together.
int64_t chunk_samples(const Shape& x_shape, DType dtype, const Window2d& w) {
  return conv_chunk_samples(x_shape, dtype, w, kChunkBytes);
}

/// f(tag) with tag's ::type the element type of `dtype`: f32, f16 or bf16 (what the Winograd path takes).
template <class F>
void dispatch_winograd(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(TypeTag<float>{});
    case DType::kF16: return f(TypeTag<Half>{});
    case DType::kBF16: return f(TypeTag<BFloat16>{});
    default: MT_ERROR("conv2d: the Winograd path takes f32, f16 or bf16, not ", dtype);
  }
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Window2d& w) {
  const std::optional<WinogradShape> s = use_winograd(x_in.dtype(), x_in.shape(), weight_in.size(0), w);
  if (!s) return conv2d_gemm(x_in, weight_in, bias_in, w, chunk_samples(x_in.shape(), x_in.dtype(), w));
  const Tensor x = raw::contiguous(x_in), weight = raw::contiguous(weight_in);
  const Tensor bias = bias_in.defined() ? raw::contiguous(bias_in) : Tensor();
  Tensor y = empty({s->n, s->c_out, s->ho(), s->wo()}, x.dtype());  // (N, C_out, H_out, W_out)
  if (y.numel() == 0) return y;
  dispatch_winograd(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd_conv2d<T>(*s, x.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr, y.data<T>());
  });
  return y;
}

Tensor conv2d_backward_input(const Tensor& dy_in, const Tensor& weight_in, const Shape& input_shape,
                             const Window2d& w) {
  const std::optional<WinogradShape> s = use_winograd(dy_in.dtype(), input_shape, weight_in.size(0), w);
  if (!s)
    return conv2d_gemm_backward_input(dy_in, weight_in, input_shape, w, chunk_samples(input_shape, dy_in.dtype(), w));
  const Tensor dy = raw::contiguous(dy_in), weight = raw::contiguous(weight_in);
  Tensor dx = empty(input_shape, dy.dtype());  // (N, C_in, H, W)
  if (dx.numel() == 0) return dx;
  dispatch_winograd(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd_conv2d_backward_input<T>(*s, dy.data<T>(), weight.data<T>(), dx.data<T>());
  });
  return dx;
}

Conv2dWeightGrads conv2d_backward_weight(const Tensor& dy_in, const Tensor& x_in, const Window2d& w, bool bias) {
  const int64_t c_out = dy_in.size(1);
  const std::optional<WinogradShape> s = use_winograd(x_in.dtype(), x_in.shape(), c_out, w);
  if (!s)
    return conv2d_gemm_backward_weight(dy_in, x_in, w, bias, chunk_samples(x_in.shape(), x_in.dtype(), w));
  const Tensor dy = raw::contiguous(dy_in), x = raw::contiguous(x_in);
  Conv2dWeightGrads grads{empty({c_out, x.size(1), 3, 3}, dy.dtype()),  // (C_out, C_in, 3, 3)
                          bias ? empty({c_out}, dy.dtype()) : Tensor()};
  dispatch_winograd(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd_conv2d_backward_weight<T>(*s, dy.data<T>(), x.data<T>(), grads.dweight.data<T>(),
                                       bias ? grads.dbias.data<T>() : nullptr);
  });
  return grads;
}

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
        // Captured by value: clang 16 rejects a reference to the function's locals from a lambda in an OpenMP region.
        accumulate_into(xp + nc * p.in_plane(), p.in_plane(), scratch, [cp, nc, kk, L, w, p](M* acc) {
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
