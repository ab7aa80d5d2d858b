// cuda/pool.cu — max and average pooling on the GPU, forward and backward.
//
// The one design idea: one thread per output element, visiting its
// contributions in the order ops/cpu/pool.cpp does, so the GPU gives the CPU's
// bits and no sum depends on scheduling.
//   - Forwards: a thread per pooled output scans its window's taps (kh, kw)
//     row-major, skipping padding taps: padding never wins a max, and counts
//     as zeros in the average (count_include_pad).
//   - avg_pool2d_backward: a thread per input pixel gathers dy / (kH·kW) from
//     the windows that cover it, in the CPU's (oh, ow) order.
//   - max_pool2d_backward: the same gather, adding dy only from the windows
//     whose saved index is this pixel.
#include <cuda_runtime.h>

#include <type_traits>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/window.cuh>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cuda {

namespace {

template <class M>
__device__ __forceinline__ bool is_nan(M v) {
  return v != v;
}

template <class M>
__device__ __forceinline__ M minus_infinity() {
  if constexpr (std::is_same_v<M, double>)
    return -__longlong_as_double(0x7ff0000000000000ll);
  else
    return -__int_as_float(0x7f800000);
}

/// y = max over each window's taps inside the plane, indices = the winning tap's flat position in H·W (-1, y = -inf,
/// for a window of padding only). The first of equal maxima wins; a NaN wins and stays. Overwrites y and indices.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) max_pool2d_fwd_kernel(T* __restrict__ y,               // (N, C, H_out, W_out)
                                                                     int32_t* __restrict__ indices,   // (N, C, H_out, W_out)
                                                                     const T* __restrict__ x,         // (N, C, H, W), contiguous
                                                                     Planes p, Window2d w, int64_t total) {
  using M = opmath_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t ow = i % p.wo, oh = (i / p.wo) % p.ho, nc = i / (p.wo * p.ho);
    const T* src = x + nc * p.h * p.w;
    M best = minus_infinity<M>();
    int64_t idx = -1;
    bool found_nan = false;  // the first NaN wins and stays, as on the CPU
    for (int64_t kh = 0; kh < w.kernel[0] && !found_nan; ++kh) {
      const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
      if (ih < 0 || ih >= p.h) continue;
      for (int64_t kw = 0; kw < w.kernel[1] && !found_nan; ++kw) {
        const int64_t iw = ow * w.stride[1] - w.padding[1] + kw * w.dilation[1];
        if (iw < 0 || iw >= p.w) continue;
        const M v = static_cast<M>(src[ih * p.w + iw]);
        if (idx < 0 || v > best || is_nan(v)) {
          best = v;
          idx = ih * p.w + iw;
          found_nan = is_nan(v);
        }
      }
    }
    y[i] = idx >= 0 ? src[idx] : convert<T>(best);
    indices[i] = static_cast<int32_t>(idx);  // a plane has fewer than 2^31 pixels (ops/pool.cpp checks)
  }
}

/// Calls f(oh·W_out + ow) for every window (oh, ow) that covers input pixel (ih, iw), with (oh, ow) ascending:
/// the order the CPU's backward adds their contributions in (taps from the last to the first).
template <class F>
__device__ __forceinline__ void for_each_covering_window(int64_t ih, int64_t iw, const Planes& p, const Window2d& w,
                                                         F&& f) {
  // Not unrolled: unrolled, each tap's 64-bit division by a runtime stride made ptxas spill (check_cuda_resources).
#pragma unroll 1
  for (int64_t kh = w.kernel[0] - 1; kh >= 0; --kh) {
    const int64_t oh = output_of_tap<int64_t>(ih, kh, w.stride[0], w.padding[0], w.dilation[0], p.ho);
    if (oh < 0) continue;
#pragma unroll 1
    for (int64_t kw = w.kernel[1] - 1; kw >= 0; --kw) {
      const int64_t ow = output_of_tap<int64_t>(iw, kw, w.stride[1], w.padding[1], w.dilation[1], p.wo);
      if (ow >= 0) f(oh * p.wo + ow);
    }
  }
}

/// dx[n, c, ih, iw] = Σ of dy over the windows covering the pixel whose max it was (indices), visited with
/// (oh, ow) ascending: the CPU's order, so the sum is bit-identical to it. Overwrites dx.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) max_pool2d_bwd_kernel(T* __restrict__ dx,                   // (N, C, H, W)
                                                                     const T* __restrict__ dy,             // (N, C, H_out, W_out)
                                                                     const int32_t* __restrict__ indices,  // (N, C, H_out, W_out)
                                                                     Planes p, Window2d w, int64_t total) {
  using M = opmath_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t iw = i % p.w, ih = (i / p.w) % p.h, nc = i / (p.w * p.h);
    const int64_t at = ih * p.w + iw, plane = nc * p.ho * p.wo;
    M acc = M(0);
    for_each_covering_window(ih, iw, p, w, [&](int64_t o) {
      if (indices[plane + o] == at) acc += static_cast<M>(dy[plane + o]);
    });
    dx[i] = convert<T>(acc);
  }
}

/// y = (Σ of the window's taps inside the plane) / (kH·kW). Overwrites y.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) avg_pool2d_fwd_kernel(T* __restrict__ y,        // (N, C, H_out, W_out)
                                                                     const T* __restrict__ x,  // (N, C, H, W), contiguous
                                                                     Planes p, Window2d w, int64_t total) {
  using M = opmath_t<T>;
  const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t ow = i % p.wo, oh = (i / p.wo) % p.ho, nc = i / (p.wo * p.ho);
    const T* src = x + nc * p.h * p.w;
    M sum = M(0);
    for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
      const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
      if (ih < 0 || ih >= p.h) continue;
      for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
        const int64_t iw = ow * w.stride[1] - w.padding[1] + kw * w.dilation[1];
        if (iw < 0 || iw >= p.w) continue;
        sum += static_cast<M>(src[ih * p.w + iw]);
      }
    }
    y[i] = convert<T>(sum / divisor);
  }
}

/// dx[n, c, ih, iw] = Σ over the windows covering it of dy / (kH·kW). Overwrites dx.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) avg_pool2d_bwd_kernel(T* __restrict__ dx,        // (N, C, H, W)
                                                                     const T* __restrict__ dy,  // (N, C, H_out, W_out), contiguous
                                                                     Planes p, Window2d w, int64_t total) {
  using M = opmath_t<T>;
  const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t iw = i % p.w, ih = (i / p.w) % p.h, nc = i / (p.w * p.h);
    const T* g = dy + nc * p.ho * p.wo;
    M acc = M(0);
    for_each_covering_window(ih, iw, p, w, [&](int64_t o) { acc += static_cast<M>(g[o]) / divisor; });
    dx[i] = convert<T>(acc);
  }
}

}  // namespace

MaxPoolResult max_pool2d(const Tensor& x_in, const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(x_in.device());  // launch on the tensor's device
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  const Shape out_shape{x.size(0), x.size(1), p.ho, p.wo};
  MaxPoolResult r{empty(out_shape, TensorOptions(x.dtype()).device(x.device())),
                  empty(out_shape, TensorOptions(DType::kI32).device(x.device()))};
  const int64_t total = r.y.numel();
  if (total == 0) return r;
  dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool2d_fwd_kernel<T><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(
        r.y.data<T>(), r.indices.data<int32_t>(), x.data<T>(), p, w, total);
    MT_CUDA_CHECK_LAUNCH("max_pool2d_fwd_kernel (", x.dtype(), ", input ", x.shape(), " on ", x.device(), ")");
  });
  return r;
}

Tensor max_pool2d_backward(const Tensor& dy_in, const Tensor& indices_in, const Shape& input_shape,
                           const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(dy_in.device());  // launch on the tensor's device
  const Tensor dy = raw::contiguous(dy_in), indices = raw::contiguous(indices_in);
  Tensor dx = empty(input_shape, TensorOptions(dy.dtype()).device(dy.device()));  // (N, C, H, W)
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  const Planes p = planes_of(input_shape, w);
  dispatch_floating(dy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool2d_bwd_kernel<T><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(
        dx.data<T>(), dy.data<T>(), indices.data<int32_t>(), p, w, total);
    MT_CUDA_CHECK_LAUNCH("max_pool2d_bwd_kernel (", dy.dtype(), ", dy ", dy.shape(), " on ", dy.device(), ")");
  });
  return dx;
}

Tensor avg_pool2d(const Tensor& x_in, const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(x_in.device());  // launch on the tensor's device
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  Tensor y = empty({x.size(0), x.size(1), p.ho, p.wo}, TensorOptions(x.dtype()).device(x.device()));
  const int64_t total = y.numel();
  if (total == 0) return y;
  dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool2d_fwd_kernel<T><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(y.data<T>(), x.data<T>(), p, w,
                                                                                  total);
    MT_CUDA_CHECK_LAUNCH("avg_pool2d_fwd_kernel (", x.dtype(), ", input ", x.shape(), " on ", x.device(), ")");
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& dy_in, const Shape& input_shape, const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(dy_in.device());  // launch on the tensor's device
  const Tensor dy = raw::contiguous(dy_in);
  const Planes p = planes_of(input_shape, w);
  Tensor dx = empty(input_shape, TensorOptions(dy.dtype()).device(dy.device()));
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  dispatch_floating(dy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool2d_bwd_kernel<T><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(dx.data<T>(), dy.data<T>(), p, w,
                                                                                  total);
    MT_CUDA_CHECK_LAUNCH("avg_pool2d_bwd_kernel (", dy.dtype(), ", dy ", dy.shape(), " on ", dy.device(), ")");
  });
  return dx;
}

}  // namespace mixtape::kernels::cuda
