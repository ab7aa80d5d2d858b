// cuda/foreach.cu — the multi-tensor kernels on the GPU: one pass over a list of tensors.
//
// For the optimizers, the loss scaler and gradient clipping (optim/). Everything that depends on data stays on
// the device: the unscale reads the scale and writes its found-inf flag there, the scale's update is a one-thread
// kernel, a clip coefficient is read from a one-element tensor, and a norm is written to device memory. So a
// training step never waits for the host. The scalar formulas are ops/backend/amp_math.h's, the CPU's
// (ops/cpu/foreach.cpp).
//
// The in-place kernels (unscale, mul, clamp) take many tensors a launch (cuda/chunks.cuh: the contiguous ones,
// grouped by dtype, cut into chunks of a table passed as a kernel parameter); a strided tensor gets a grid-stride
// launch of its own (cuda/launch.cuh's offsets). Each element's arithmetic is one function both kernels call. A
// norm is two launches a tensor: up to kMaxNormBlocks blocks each reduce their grid-stride share
// (cub::BlockReduce) to one partial, then one block combines the partials in order and takes the root. No atomics:
// the result depends only on the grid size, which is fixed for a device.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/chunks.cuh>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/ops/backend/amp_math.h>

namespace mixtape::kernels::cuda {

namespace {

using math::NormKind;

/// The threads of a norm block, and the most partial results (blocks) one tensor's norm is cut into.
constexpr int kNormThreads = 256;
constexpr int kMaxNormBlocks = 1024;

/// x = x · inv in opmath, rounded once; `non_finite` |= whether x (before scaling) was inf or NaN.
template <class T>
__device__ __forceinline__ void unscale_element(T* x, opmath_t<T> inv, bool& non_finite) {
  using M = opmath_t<T>;
  const M v = static_cast<M>(*x);
  non_finite |= !math::finite(v);
  if (math::rescales(v)) *x = convert<T>(v * inv);
}

/// *found_inf = 1 (and *tensor_flag, when given) when this thread saw a non-finite element; every writer writes the
/// same value.
__device__ __forceinline__ void flag_non_finite(bool non_finite, float* found_inf, float* tensor_flag) {
  if (non_finite) {
    *found_inf = 1.0f;
    if (tensor_flag) *tensor_flag = 1.0f;
  }
}

/// x = x · inv_scale over x's elements (any layout), and the flags for a non-finite element.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) unscale_kernel(T* x,                      // (L's shape), strides L[0]
                                                                OffsetLayout<1> L,
                                                                float* found_inf,          // (1)
                                                                float* tensor_flag,        // (1) or null
                                                                const float* inv_scale) {  // (1)
  const opmath_t<T> inv = static_cast<opmath_t<T>>(*inv_scale);
  bool non_finite = false;
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    unscale_element(x + off[0], inv, non_finite);
  }
  flag_non_finite(non_finite, found_inf, tensor_flag);
}

/// A multi-tensor table of one operand a run (64 runs: about 2.3 KiB); Extra: the unscale's per-tensor flag.
template <class Extra = NoExtra>
using InPlaceChunks = ChunkList<1, 64, Extra>;

/// The unscale over the chunks of many contiguous tensors of one dtype; a run's extra is its tensor's flag (or
/// null).
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    unscale_chunks_kernel(const __grid_constant__ InPlaceChunks<float*> l, float* found_inf, const float* inv_scale) {
  const opmath_t<T> inv = static_cast<opmath_t<T>>(*inv_scale);
  const BlockChunk b = block_chunk(l);
  T* x = static_cast<T*>(l.ptr[b.run][0]);
  bool non_finite = false;
  for (int64_t i = b.start + threadIdx.x; i < b.stop; i += blockDim.x) unscale_element(x + i, inv, non_finite);
  flag_non_finite(non_finite, found_inf, l.extra[b.run]);
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

/// The factor of foreach_mul_ in opmath: one f32 or f64 element (`f64` says which) in device memory.
template <class M>
__device__ __forceinline__ M load_factor(const void* factor, bool f64) {
  return f64 ? static_cast<M>(*static_cast<const double*>(factor)) : static_cast<M>(*static_cast<const float*>(factor));
}

/// x = x · factor over x's elements (any layout), in opmath.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) mul_kernel(T* x,  // (L's shape)
                                                            OffsetLayout<1> L,
                                                            const void* factor,  // (1)
                                                            bool factor_f64) {
  using M = opmath_t<T>;
  const M f = load_factor<M>(factor, factor_f64);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    const M v = static_cast<M>(x[off[0]]);
    if (math::rescales(v)) x[off[0]] = convert<T>(v * f);
  }
}

/// x = x · factor over the chunks of many contiguous tensors of one dtype.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    mul_chunks_kernel(const __grid_constant__ InPlaceChunks<> l, const void* factor, bool factor_f64) {
  using M = opmath_t<T>;
  const M f = load_factor<M>(factor, factor_f64);
  const BlockChunk b = block_chunk(l);
  T* x = static_cast<T*>(l.ptr[b.run][0]);
  for (int64_t i = b.start + threadIdx.x; i < b.stop; i += blockDim.x) {
    const M v = static_cast<M>(x[i]);
    if (math::rescales(v)) x[i] = convert<T>(v * f);
  }
}

/// x = clamp(x, lo, hi) over x's elements (any layout; NaN stays NaN).
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

/// x = clamp(x, lo, hi) over the chunks of many contiguous tensors of one dtype.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    clamp_chunks_kernel(const __grid_constant__ InPlaceChunks<> l, opmath_t<T> lo, opmath_t<T> hi) {
  using M = opmath_t<T>;
  const BlockChunk b = block_chunk(l);
  T* x = static_cast<T*>(l.ptr[b.run][0]);
  for (int64_t i = b.start + threadIdx.x; i < b.stop; i += blockDim.x)
    x[i] = convert<T>(math::clamp(static_cast<M>(x[i]), lo, hi));
}

/// Runs an in-place operation over a list: for each dtype of its contiguous tensors, one or more multi-tensor
/// launches chunks(TypeTag<T>, list, blocks) with each run's extra set by extra(i) (i: the tensor's place in the
/// list); then strided(TypeTag<T>, i) for each non-empty strided tensor.
template <class Extra, class ExtraOf, class Chunks, class Strided>
void for_each_in_place(std::span<const Tensor> tensors, const char* op, ExtraOf&& extra, Chunks&& chunks,
                       Strided&& strided) {
  const ChunkGroups groups = group_for_chunks(
      tensors.size(), [&](size_t i) { return tensors[i].dtype(); }, [&](size_t i) { return tensors[i].numel(); },
      [&](size_t i) { return tensors[i].is_contiguous(); });
  for (int d = 0; d < 4; ++d) {
    if (groups.chunked[d].empty()) continue;
    dispatch_floating(ChunkGroups::kDTypes[d], op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_chunks<InPlaceChunks<Extra>>(
          groups.chunked[d],
          [&](InPlaceChunks<Extra>& l, int r, int i) {
            l.ptr[r][0] = tensors[static_cast<size_t>(i)].data_ptr();
            if constexpr (!std::is_same_v<Extra, NoExtra>) l.extra[r] = extra(static_cast<size_t>(i));
          },
          [&](const InPlaceChunks<Extra>& l, int blocks) { chunks(TypeTag<T>{}, l, blocks); });
    });
  }
  for (size_t i : groups.strided)
    dispatch_floating(tensors[i].dtype(), op, [&](auto tag) { strided(tag, i); });
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
  float* flag = found_inf.data<float>();
  float* tensor_flags = found_inf.numel() > 1 ? flag + 1 : nullptr;  // one per tensor
  auto tensor_flag = [&](size_t i) { return tensor_flags ? tensor_flags + i : nullptr; };
  const float* inv = inv_scale.data<float>();
  const Device device = found_inf.device();
  for_each_in_place<float*>(
      tensors, "non_finite_check_and_unscale_", tensor_flag,
      [&](auto tag, const InPlaceChunks<float*>& l, int blocks) {
        using T = typename decltype(tag)::type;
        unscale_chunks_kernel<T><<<blocks, kBlockThreads, 0, launch_stream()>>>(l, flag, inv);
        MT_CUDA_CHECK_LAUNCH("unscale_chunks_kernel (", dtype_v<T>, ", ", l.n, " tensors on ", device, ")");
      },
      [&](auto tag, size_t i) {
        using T = typename decltype(tag)::type;
        const Tensor& t = tensors[i];
        unscale_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(
            t.data<T>(), element_layout(t), flag, tensor_flag(i), inv);
        MT_CUDA_CHECK_LAUNCH("unscale_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
      });
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
  const Device device = factor.device();
  for_each_in_place<NoExtra>(
      tensors, "foreach_mul_", [](size_t) { return NoExtra{}; },
      [&](auto tag, const InPlaceChunks<>& l, int blocks) {
        using T = typename decltype(tag)::type;
        mul_chunks_kernel<T><<<blocks, kBlockThreads, 0, launch_stream()>>>(l, factor.data_ptr(), f64);
        MT_CUDA_CHECK_LAUNCH("mul_chunks_kernel (", dtype_v<T>, ", ", l.n, " tensors on ", device, ")");
      },
      [&](auto tag, size_t i) {
        using T = typename decltype(tag)::type;
        const Tensor& t = tensors[i];
        mul_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(t.data<T>(), element_layout(t),
                                                                                    factor.data_ptr(), f64);
        MT_CUDA_CHECK_LAUNCH("mul_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
      });
}

void foreach_clamp_(std::span<const Tensor> tensors, double lo, double hi) {
  if (tensors.empty()) return;
  DeviceGuard guard(tensors.front().device());
  const Device device = tensors.front().device();
  for_each_in_place<NoExtra>(
      tensors, "foreach_clamp_", [](size_t) { return NoExtra{}; },
      [&](auto tag, const InPlaceChunks<>& l, int blocks) {
        using T = typename decltype(tag)::type;
        using M = opmath_t<T>;
        clamp_chunks_kernel<T><<<blocks, kBlockThreads, 0, launch_stream()>>>(l, static_cast<M>(lo),
                                                                               static_cast<M>(hi));
        MT_CUDA_CHECK_LAUNCH("clamp_chunks_kernel (", dtype_v<T>, ", ", l.n, " tensors on ", device, ")");
      },
      [&](auto tag, size_t i) {
        using T = typename decltype(tag)::type;
        using M = opmath_t<T>;
        const Tensor& t = tensors[i];
        clamp_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(
            t.data<T>(), element_layout(t), static_cast<M>(lo), static_cast<M>(hi));
        MT_CUDA_CHECK_LAUNCH("clamp_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
      });
}

}  // namespace mixtape::kernels::cuda
