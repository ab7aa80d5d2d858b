// cuda/numerics.cu — the numerics inspector's statistics on the GPU: numerics_stats and lost_updates.
//
// The one design idea: the statistics never leave the device until a report reads them. The output is zeroed by
// an async memset on the launch stream, then one grid-stride kernel classifies each element with
// ops/backend/numerics_math.h's predicates (the CPU's, ops/cpu/numerics.cpp): counts in registers, the
// histogram in shared memory, each block's totals reduced with cub::BlockReduce and added to the output with
// global atomics (the amax with atomicMax on its bits). Every field is an integer, so the order the blocks add in
// does not change the result, which is the CPU's bit for bit.
//
// Per-thread and per-block counts are 32-bit: the launcher gives each block fewer than 2^32 elements.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/ops/backend/numerics_math.h>

namespace mixtape::kernels::cuda {

namespace {

using Total = unsigned long long;  // what CUDA's 64-bit atomics take: an i64 output field, never negative

struct MaxOf {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

/// out (zeroed) += the statistics of x[0, n) · *multiplier (1 when null), read as f32; out[kAmaxBits] = max.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) numerics_stats_kernel(const T* __restrict__ x,  // (n)
                                                                       int64_t n,
                                                                       const float* __restrict__ multiplier,  // (1)
                                                                       Total* __restrict__ out) {  // (kNumericsFields)
  using Reduce = cub::BlockReduce<uint32_t, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ uint32_t histogram[math::kHistogramBins];
  for (int k = threadIdx.x; k < math::kHistogramBins; k += kBlockThreads) histogram[k] = 0;
  __syncthreads();

  const float m = multiplier ? *multiplier : 1.0f;  // × 1 changes no f32 value
  math::ValueCounts<uint32_t> c;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const uint32_t a = math::magnitude_bits(static_cast<float>(x[i]) * m);  // an f64 is rounded to f32 first
    c.add(a);
    if (math::has_histogram_bin(a)) atomicAdd(&histogram[math::histogram_bin(a)], 1u);
  }

#pragma unroll
  for (int f = 0; f < math::kAmaxBits; ++f) {
    const uint32_t total = Reduce(tmp).Sum(c.n[f]);
    if (threadIdx.x == 0 && total != 0) atomicAdd(&out[f], static_cast<Total>(total));
    __syncthreads();  // tmp is reused
  }
  const uint32_t amax = Reduce(tmp).Reduce(c.amax_bits, MaxOf{});
  if (threadIdx.x == 0 && amax != 0) atomicMax(&out[math::kAmaxBits], static_cast<Total>(amax));
  // The histogram is complete: every thread passed the barriers above after its last shared atomic.
  for (int k = threadIdx.x; k < math::kHistogramBins; k += kBlockThreads)
    if (histogram[k] != 0) atomicAdd(&out[math::kHistogram + k], static_cast<Total>(histogram[k]));
}

/// out (zeroed) += [elements, unchanged, lost] of the updates before[i] → after[i], i in [0, n).
template <class T>
__global__ void __launch_bounds__(kBlockThreads) lost_updates_kernel(const T* __restrict__ before,  // (n)
                                                                     const T* __restrict__ after,   // (n)
                                                                     int64_t n, math::FloatFormat format,
                                                                     Total* __restrict__ out) {  // (3)
  using Reduce = cub::BlockReduce<uint32_t, kBlockThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  uint32_t counts[math::kLostUpdateFields] = {};
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double w = static_cast<opmath_t<T>>(before[i]), w_next = static_cast<opmath_t<T>>(after[i]);  // exact
    ++counts[math::kUpdateCount];
    counts[math::kUnchanged] += math::update_unchanged(w, w_next);
    counts[math::kLost] += math::update_lost(w, w_next, format);
  }
#pragma unroll
  for (int f = 0; f < math::kLostUpdateFields; ++f) {
    const uint32_t total = Reduce(tmp).Sum(counts[f]);
    if (threadIdx.x == 0 && total != 0) atomicAdd(&out[f], static_cast<Total>(total));
    __syncthreads();
  }
}

/// The grid of a statistics kernel over n elements: grid_blocks' policy, with enough blocks that each gets
/// fewer than 2^32 elements (at most ceil(n / (blocks · threads)) · threads <= 2^31 + threads of them).
int stats_blocks(int64_t n) {
  return static_cast<int>(std::max<int64_t>(grid_blocks(n), (n >> 31) + 1));
}

/// A fresh (fields) i64 tensor of zeros on `device`, zeroed on the launch stream (no host wait).
Tensor zeroed_counts(int64_t fields, Device device) {
  Tensor out = empty({fields}, TensorOptions(DType::kI64).device(device));
  MT_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(fields) * sizeof(int64_t), launch_stream()),
                "numerics: zeroing ", fields, " counts on ", device);
  return out;
}

}  // namespace

Tensor numerics_stats(const Tensor& x, const Tensor& multiplier) {
  DeviceGuard guard(x.device());
  Tensor out = zeroed_counts(math::kNumericsFields, x.device());
  const int64_t n = x.numel();
  if (n == 0) return out;
  dispatch_floating(x.dtype(), "numerics_stats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    numerics_stats_kernel<T><<<stats_blocks(n), kBlockThreads, 0, launch_stream()>>>(
        x.data<T>(), n, multiplier.defined() ? multiplier.data<float>() : nullptr,
        reinterpret_cast<Total*>(out.data<int64_t>()));
    MT_CUDA_CHECK_LAUNCH("numerics_stats_kernel (", x.dtype(), ", shape ", x.shape(), " on ", x.device(), ")");
  });
  return out;
}

Tensor lost_updates(const Tensor& before, const Tensor& after, DType model_dtype) {
  DeviceGuard guard(before.device());
  Tensor out = zeroed_counts(math::kLostUpdateFields, before.device());
  const int64_t n = before.numel();
  if (n == 0) return out;
  dispatch_floating(before.dtype(), "lost_updates", [&](auto tag) {
    using T = typename decltype(tag)::type;
    lost_updates_kernel<T><<<stats_blocks(n), kBlockThreads, 0, launch_stream()>>>(
        before.data<T>(), after.data<T>(), n, math::float_format(model_dtype),
        reinterpret_cast<Total*>(out.data<int64_t>()));
    MT_CUDA_CHECK_LAUNCH("lost_updates_kernel (", before.dtype(), ", shape ", before.shape(), " on ",
                         before.device(), ")");
  });
  return out;
}

}  // namespace mixtape::kernels::cuda
