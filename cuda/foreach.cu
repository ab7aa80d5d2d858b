// cuda/foreach.cu — the multi-tensor kernels on the GPU: one pass over a list of tensors.
//
// For the optimizers, the loss scaler and gradient clipping (optim/). Everything that depends on data stays on
// the device: the unscale reads the scale and writes its found-inf flag there, the scale's update is a one-thread
// kernel, a clip coefficient is read from a one-element tensor, and a norm is written to device memory. So a
// training step never waits for the host. The scalar formulas are ops/backend/amp_math.h's, the CPU's
// (ops/cpu/foreach.cpp).
//
// Today each tensor of a list is one grid-stride launch over its elements (any layout, cuda/launch.cuh's offsets);
// a launch that covers many tensors at once is the GPU issue's work, and will take these launchers' place without
// changing their contract. A norm is two launches a tensor: up to kMaxNormBlocks blocks each reduce their
// grid-stride share (cub::BlockReduce) to one partial, then one block combines the partials in order and takes the
// root. No atomics: the result depends only on the grid size, which is fixed for a device.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/ops/backend/amp_math.h>

namespace mixtape::kernels::cuda {

namespace {

using math::NormKind;

/// The threads of a norm block, and the most partial results (blocks) one tensor's norm is cut into.
constexpr int kNormThreads = 256;
constexpr int kMaxNormBlocks = 1024;

/// x = x · inv_scale over x's elements, and *found_inf = 1 (and *tensor_flag, when given) when an element (before
/// scaling) is inf or NaN.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) unscale_kernel(T* x,                      // (L's shape), strides L[0]
                                                                OffsetLayout<1> L,
                                                                float* found_inf,          // (1)
                                                                float* tensor_flag,        // (1) or null
                                                                const float* inv_scale) {  // (1)
  using M = opmath_t<T>;
  const M inv = static_cast<M>(*inv_scale);
  bool non_finite = false;
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    const M v = static_cast<M>(x[off[0]]);
    non_finite |= !math::finite(v);
    x[off[0]] = convert<T>(v * inv);
  }
  if (non_finite) {  // every writer writes the same value
    *found_inf = 1.0f;
    if (tensor_flag) *tensor_flag = 1.0f;
  }
}

/// The loss scale's state machine, by one thread: it overwrites *scale and *growth_tracker.
__global__ void __launch_bounds__(1) amp_update_scale_kernel(float* scale,           // (1)
                                                             int32_t* growth_tracker,  // (1)
                                                             const float* found_inf,   // (1)
                                                             double growth_factor, double backoff_factor,
                                                             int32_t growth_interval) {
  math::amp_update_scale(*scale, *growth_tracker, *found_inf, growth_factor, backoff_factor, growth_interval);
}

template <NormKind K>
struct NormCombine {
  template <class M>
  __device__ __forceinline__ M operator()(const M& a, const M& b) const {
    return math::norm_combine<K>(a, b);
  }
};

/// partial[blockIdx.x] = the K-combination of the terms of this block's grid-stride share of x (overwritten).
template <NormKind K, class T>
__global__ void __launch_bounds__(kNormThreads) norm_partial_kernel(const T* __restrict__ x,  // (L's shape)
                                                                    OffsetLayout<1> L, opmath_t<T> p,
                                                                    opmath_t<T>* __restrict__ partial) {  // (grid)
  using M = opmath_t<T>;
  using Reduce = cub::BlockReduce<M, kNormThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  M acc = 0;
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    acc = math::norm_combine<K>(acc, math::norm_term<K, M>(static_cast<M>(x[off[0]]), p));
  }
  const M block = Reduce(tmp).Reduce(acc, NormCombine<K>{});
  if (threadIdx.x == 0) partial[blockIdx.x] = block;
}

/// *out = the norm from n partial results (0 for n = 0: an empty tensor), by one block (overwritten).
template <NormKind K, class M, class Out>
__global__ void __launch_bounds__(kNormThreads) norm_finish_kernel(const M* __restrict__ partial,  // (n)
                                                                   int n, M p, Out* __restrict__ out) {  // (1)
  using Reduce = cub::BlockReduce<M, kNormThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  M acc = 0;
  for (int i = threadIdx.x; i < n; i += kNormThreads) acc = math::norm_combine<K>(acc, partial[i]);
  const M total = Reduce(tmp).Reduce(acc, NormCombine<K>{});
  if (threadIdx.x == 0) *out = static_cast<Out>(math::norm_finish<K>(total, p));
}

/// x = x · factor over x's elements; factor is one f32 or f64 element (`factor_f64` says which), used in opmath.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) mul_kernel(T* x,  // (L's shape)
                                                            OffsetLayout<1> L,
                                                            const void* factor,  // (1)
                                                            bool factor_f64) {
  using M = opmath_t<T>;
  const M f = factor_f64 ? static_cast<M>(*static_cast<const double*>(factor))
                         : static_cast<M>(*static_cast<const float*>(factor));
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    x[off[0]] = convert<T>(static_cast<M>(x[off[0]]) * f);
  }
}

/// x = clamp(x, lo, hi) over x's elements (NaN stays NaN).
template <class T>
__global__ void __launch_bounds__(kBlockThreads) clamp_kernel(T* x,  // (L's shape)
                                                              OffsetLayout<1> L, opmath_t<T> lo, opmath_t<T> hi) {
  using M = opmath_t<T>;
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    x[off[0]] = convert<T>(math::clamp(static_cast<M>(x[off[0]]), lo, hi));
  }
}

OffsetLayout<1> element_layout(const Tensor& t) {
  return offset_layout(make_strided_layout<1>(t.shape(), {&t.strides()}, {int64_t{1}}));
}

/// Writes the K-norm of t into out[0] (Out: the output's dtype), through `scratch` (kMaxNormBlocks slots of M).
template <NormKind K, class T, class Out>
void launch_norm(const Tensor& t, opmath_t<T> p, opmath_t<T>* scratch, Out* out) {
  using M = opmath_t<T>;
  int blocks = 0;
  if (t.numel() > 0) {
    blocks = std::min(grid_blocks(t.numel(), kNormThreads), kMaxNormBlocks);
    norm_partial_kernel<K, T><<<blocks, kNormThreads, 0, launch_stream()>>>(t.data<T>(), element_layout(t), p,
                                                                              scratch);
    MT_CUDA_CHECK_LAUNCH("norm_partial_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
  }
  norm_finish_kernel<K, M, Out><<<1, kNormThreads, 0, launch_stream()>>>(scratch, blocks, p, out);
  MT_CUDA_CHECK_LAUNCH("norm_finish_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
}

}  // namespace

void non_finite_check_and_unscale_(std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale) {
  if (tensors.empty()) return;
  DeviceGuard guard(found_inf.device());
  float* tensor_flags = found_inf.numel() > 1 ? found_inf.data<float>() + 1 : nullptr;  // one per tensor
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      unscale_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(
          t.data<T>(), element_layout(t), found_inf.data<float>(), tensor_flags ? tensor_flags + i : nullptr,
          inv_scale.data<float>());
      MT_CUDA_CHECK_LAUNCH("unscale_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
    });
  }
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  DeviceGuard guard(scale.device());
  amp_update_scale_kernel<<<1, 1, 0, launch_stream()>>>(scale.data<float>(), growth_tracker.data<int32_t>(),
                                                        found_inf.data<float>(), growth_factor, backoff_factor,
                                                        static_cast<int32_t>(growth_interval));
  MT_CUDA_CHECK_LAUNCH("amp_update_scale_kernel (on ", scale.device(), ")");
}

Tensor foreach_norm(std::span<const Tensor> tensors, double ord) {
  const Device device = tensors.front().device();
  const bool any_f64 = std::any_of(tensors.begin(), tensors.end(), [](const Tensor& t) {
    return t.dtype() == DType::kF64;
  });
  const Tensor out = empty({static_cast<int64_t>(tensors.size())},
                           TensorOptions(any_f64 ? DType::kF64 : DType::kF32).device(device));
  // One row of partials, reused by every tensor: the launches run in order on one stream.
  const Tensor scratch = empty({kMaxNormBlocks}, TensorOptions(DType::kF64).device(device));
  DeviceGuard guard(device);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    dispatch_floating(t.dtype(), "foreach_norm", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      M* partial = static_cast<M*>(scratch.data_ptr());
      const M p = static_cast<M>(ord);
      auto run = [&](auto* o) {
        switch (math::norm_kind(ord)) {
          case NormKind::kOne: launch_norm<NormKind::kOne, T>(t, p, partial, o); break;
          case NormKind::kTwo: launch_norm<NormKind::kTwo, T>(t, p, partial, o); break;
          case NormKind::kInf: launch_norm<NormKind::kInf, T>(t, p, partial, o); break;
          case NormKind::kP: launch_norm<NormKind::kP, T>(t, p, partial, o); break;
        }
      };
      if (any_f64) run(out.data<double>() + i);
      else if constexpr (std::is_same_v<M, float>) run(out.data<float>() + i);  // no f64 tensor: M is float
    });
  }
  return out;
}

void foreach_mul_(std::span<const Tensor> tensors, const Tensor& factor) {
  if (tensors.empty()) return;
  DeviceGuard guard(factor.device());
  const bool f64 = factor.dtype() == DType::kF64;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "foreach_mul_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      mul_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(t.data<T>(), element_layout(t),
                                                                                  factor.data_ptr(), f64);
      MT_CUDA_CHECK_LAUNCH("mul_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
    });
  }
}

void foreach_clamp_(std::span<const Tensor> tensors, double lo, double hi) {
  if (tensors.empty()) return;
  DeviceGuard guard(tensors.front().device());
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "foreach_clamp_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      clamp_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(
          t.data<T>(), element_layout(t), static_cast<M>(lo), static_cast<M>(hi));
      MT_CUDA_CHECK_LAUNCH("clamp_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
    });
  }
}

}  // namespace mixtape::kernels::cuda
