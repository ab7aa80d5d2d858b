// cuda/conv.cu — conv2d on the GPU: im2col + a GEMM for each chunk of the batch
// whose columns fit mixtape::cuda::conv_column_limit (or for the whole batch)
// (ops/backend/conv_gemm.h, through this backend's kernels), and the column
// transforms it is built on, im2col and col2im.
//
// The one design idea: both kernels give each thread one element of their
// output, in the output's memory order. im2col's writes are then coalesced
// (consecutive threads write consecutive columns of one row). col2im is the
// gather form of the adjoint: a thread owns one input pixel and sums the
// kH·kW column entries that read it (at most one per kernel tap) in the
// CPU's (kh, kw) order, in opmath_t<T>, rounding once. No atomics, so the
// result is deterministic and bit-identical to ops/cpu/conv.cpp.
#include <cuda_runtime.h>

#include <algorithm>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/window.cuh>
#include <mixtape/ops/backend/conv_gemm.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cuda {

namespace {

/// The window and plane sizes in the index type `I` a kernel computes positions in.
template <class I>
struct Geometry {
  I h, w, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw;
};

template <class I>
Geometry<I> geometry(const Planes& p, const Window2d& w) {
  return {static_cast<I>(p.h),         static_cast<I>(p.w),         static_cast<I>(p.ho),
          static_cast<I>(p.wo),        static_cast<I>(w.kernel[0]), static_cast<I>(w.kernel[1]),
          static_cast<I>(w.stride[0]), static_cast<I>(w.stride[1]), static_cast<I>(w.padding[0]),
          static_cast<I>(w.padding[1]), static_cast<I>(w.dilation[0]), static_cast<I>(w.dilation[1])};
}

/// cols[n, (c·kH + kh)·kW + kw, oh·W_out + ow] = x[n, c, oh·sh − ph + kh·dh, ow·sw − pw + kw·dw], 0 outside.
/// Positions are computed in I: int32_t when every offset fits (integer division is several times cheaper), else
/// int64_t. Overwrites cols.
template <class T, class I>
__global__ void __launch_bounds__(kBlockThreads) im2col_kernel(T* __restrict__ cols,        // (N, C·kH·kW, H_out·W_out)
                                                             const T* __restrict__ x,     // (N, C, H, W), contiguous
                                                             Geometry<I> g, int64_t total) {
  for (int64_t i64 = first_index(); i64 < total; i64 += grid_stride()) {
    // i = ((nc·kH + kh)·kW + kw)·L + oh·W_out + ow
    I r = static_cast<I>(i64);
    const I ow = r % g.wo;
    r /= g.wo;
    const I oh = r % g.ho;
    r /= g.ho;
    const I kw = r % g.kw;
    r /= g.kw;
    const I kh = r % g.kh;
    const I nc = r / g.kh;
    const I ih = oh * g.sh - g.ph + kh * g.dh;
    const I iw = ow * g.sw - g.pw + kw * g.dw;
    const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
    cols[i64] = inside ? x[(nc * g.h + ih) * g.w + iw] : convert<T>(0.0f);
  }
}

/// x[n, c, ih, iw] = Σ over taps (kh, kw) reading it of cols[n, (c·kH + kh)·kW + kw, oh·W_out + ow], in (kh, kw)
/// order. Positions in I as for im2col. Overwrites x.
template <class T, class I>
__global__ void __launch_bounds__(kBlockThreads) col2im_kernel(T* __restrict__ x,           // (N, C, H, W)
                                                             const T* __restrict__ cols,  // (N, C·kH·kW, L), contiguous
                                                             Geometry<I> g, int64_t total) {
  using M = opmath_t<T>;
  const I L = g.ho * g.wo, kk = g.kh * g.kw;
  for (int64_t i64 = first_index(); i64 < total; i64 += grid_stride()) {
    const I i = static_cast<I>(i64);
    const I iw = i % g.w, ih = (i / g.w) % g.h, nc = i / (g.w * g.h);
    const T* plane_cols = cols + nc * kk * L;
    M acc = M(0);
    // Not unrolled: unrolled 4 times, each tap's division by a runtime stride made ptxas spill (a stack
    // frame in every instance, check_cuda_resources); the loads dominate the taps' integer work anyway.
#pragma unroll 1
    for (I kh = 0; kh < g.kh; ++kh) {
      const I oh = output_of_tap<I>(ih, kh, g.sh, g.ph, g.dh, g.ho);
      if (oh < 0) continue;
#pragma unroll 1
      for (I kw = 0; kw < g.kw; ++kw) {
        const I ow = output_of_tap<I>(iw, kw, g.sw, g.pw, g.dw, g.wo);
        if (ow < 0) continue;
        acc += static_cast<M>(plane_cols[(kh * g.kw + kw) * L + oh * g.wo + ow]);
      }
    }
    x[i64] = convert<T>(acc);
  }
}

/// Runs f(TypeTag<int32_t>) when every position below `largest` (the bigger operand's numel) fits in 32 bits.
template <class F>
void with_index_type(int64_t largest, F&& f) {
  if (largest <= int64_t{0x7fffffff})
    f(TypeTag<int32_t>{});
  else
    f(TypeTag<int64_t>{});
}

}  // namespace

Tensor im2col(const Tensor& x_in, const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(x_in.device());  // launch on the tensor's device
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  const int64_t kk = w.kernel[0] * w.kernel[1];
  Tensor cols = empty({x.size(0), x.size(1) * kk, p.ho * p.wo}, TensorOptions(x.dtype()).device(x.device()));
  const int64_t total = cols.numel();
  if (total == 0) return cols;
  dispatch_floating(x.dtype(), "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(std::max(total, x.numel()), [&](auto itag) {
      using I = typename decltype(itag)::type;
      im2col_kernel<T, I><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(cols.data<T>(), x.data<T>(),
                                                                                geometry<I>(p, w), total);
      MT_CUDA_CHECK_LAUNCH("im2col_kernel (", x.dtype(), ", input ", x.shape(), " on ", x.device(), ")");
    });
  });
  return cols;
}

Tensor col2im(const Tensor& cols_in, const Shape& input_shape, const Window2d& w) {
  ::mixtape::cuda::DeviceGuard guard(cols_in.device());  // launch on the tensor's device
  const Tensor cols = raw::contiguous(cols_in);
  const Planes p = planes_of(input_shape, w);
  Tensor x = empty(input_shape, TensorOptions(cols.dtype()).device(cols.device()));
  const int64_t total = x.numel();
  if (total == 0) return x;
  dispatch_floating(cols.dtype(), "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(std::max(total, cols.numel()), [&](auto itag) {
      using I = typename decltype(itag)::type;
      col2im_kernel<T, I><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(x.data<T>(), cols.data<T>(),
                                                                                geometry<I>(p, w), total);
      MT_CUDA_CHECK_LAUNCH("col2im_kernel (", cols.dtype(), ", input shape ", input_shape, " on ", cols.device(),
                           ")");
    });
  });
  return x;
}

namespace {

/// The samples a GEMM of conv2d takes: as many as conv_column_limit()'s bytes hold of the f32 columns (in the
/// accumulation dtype: the input gradient's), at least one; under kConvColumnLimitAuto the limit of `dtype`, the
/// convolution's; under 0 the whole batch (one launch beats many, at the cost of the columns).
int64_t chunk_samples(const Shape& input_shape, DType dtype, const Window2d& w) {
  namespace rt = ::mixtape::cuda;
  int64_t limit = rt::conv_column_limit();
  if (limit == rt::kConvColumnLimitAuto)
    limit = dtype == DType::kF16 || dtype == DType::kBF16 ? rt::kDefaultConvColumnLimitF16
                                                          : rt::kDefaultConvColumnLimitF32;
  return limit == 0 ? input_shape[0] : conv_chunk_samples(input_shape, dtype, w, limit);
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w) {
  return conv2d_gemm(x, weight, bias, w, chunk_samples(x.shape(), x.dtype(), w));
}

Tensor conv2d_backward_input(const Tensor& dy, const Tensor& weight, const Shape& input_shape, const Window2d& w) {
  return conv2d_gemm_backward_input(dy, weight, input_shape, w, chunk_samples(input_shape, dy.dtype(), w));
}

Conv2dWeightGrads conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Window2d& w, bool bias) {
  return conv2d_gemm_backward_weight(dy, x, w, bias, chunk_samples(x.shape(), x.dtype(), w));
}

}  // namespace mixtape::kernels::cuda
