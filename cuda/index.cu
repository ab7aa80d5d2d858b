// cuda/index.cu — index_select and its gradient, index_add, on the GPU.
//
// Both view their tensors as (outer, size, inner) around `dim`.
//   - index_select moves bytes: one thread per output unit, where the unit is
//     the widest of 16/8/4/2/1 bytes that divides a slice (and the
//     pointers), so a row of f32 moves as 16-byte loads and stores (STYLE.md
//     §2's Packed128) and every dtype shares one kernel per unit width.
//   - index_add is deterministic without atomics: the index is stably sorted
//     by value on the device (CUB radix sort of (index, position) pairs, only
//     over the bits `size` needs), a binary search per index value finds
//     where its run of positions starts, and one thread per output element
//     sums its run's src elements in ascending position, the CPU's order, in
//     opmath_t<T>, rounding once. The result is bit-identical to
//     ops/cpu/nn2.cpp whatever the duplicates. Cost: a radix sort of k keys
//     (bit_width(size) bits), size·log2(k) for the run starts, then each
//     output element reads 2 starts plus its contributions:
//     O(k + size·log k + out + src) work, no atomics, 4 small launches.
//
// Out-of-range indices: ops/dispatch_nn2.cpp checks every index value on the
// host before these run, so none arrive here today. Should that check move to
// the device, these kernels stay memory-safe on their own: index_select
// writes zeros for an out-of-range index, index_add drops its slice.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/nn2.h>

namespace mixtape::kernels::cuda {

namespace {

/// Sizes of a tensor around `dim`: (outer, size, inner).
struct Around {
  int64_t outer = 1, size = 1, inner = 1;
};

Around around(const Shape& shape, int64_t dim) {
  Around a;
  for (int64_t d = 0; d < dim; ++d) a.outer *= shape[d];
  a.size = shape.size() == 0 ? 1 : shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) a.inner *= shape[d];
  return a;
}

/// Calls f(TypeTag<I>{}) for an index dtype (kI64 or kI32; dispatch_nn2.cpp has checked which).
template <class F>
void dispatch_index(DType t, F&& f) {
  if (t == DType::kI32)
    f(TypeTag<int32_t>{});
  else
    f(TypeTag<int64_t>{});
}

/// out[o, j, :] = x[o, index[j], :] in units U of a slice of `inner_units` units; zeros for an index outside
/// [0, size). Overwrites out.
template <class U, class I>
__global__ void __launch_bounds__(kNn2Threads) index_select_kernel(U* __restrict__ out,          // (outer, k, inner_units)
                                                                   const U* __restrict__ x,      // (outer, size, inner_units)
                                                                   const I* __restrict__ index,  // (k)
                                                                   int64_t k, int64_t size, int64_t inner_units,
                                                                   int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t e = i % inner_units, row = i / inner_units;
    const int64_t j = row % k, o = row / k;
    const int64_t at = static_cast<int64_t>(index[j]);
    out[i] = at >= 0 && at < size ? x[(o * size + at) * inner_units + e] : U{};
  }
}

/// keys[j] = index[j], or `size` (sorts last, matches no output) when outside [0, size); positions[j] = j. Overwrites.
template <class I>
__global__ void __launch_bounds__(kNn2Threads) index_keys_kernel(int64_t* __restrict__ keys,       // (k)
                                                                 int64_t* __restrict__ positions,  // (k)
                                                                 const I* __restrict__ index,      // (k)
                                                                 int64_t k, int64_t size) {
  for (int64_t j = first_index(); j < k; j += grid_stride()) {
    const int64_t at = static_cast<int64_t>(index[j]);
    keys[j] = at >= 0 && at < size ? at : size;
    positions[j] = j;
  }
}

/// The first t in [0, k) with sorted[t] >= value (k when none).
__device__ __forceinline__ int64_t lower_bound(const int64_t* sorted, int64_t k, int64_t value) {
  int64_t lo = 0, hi = k;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// starts[d] = the first sorted position whose key is >= d, for d in [0, size]: positions starts[d] .. starts[d + 1]
/// hold index value d. Overwrites starts.
__global__ void __launch_bounds__(kNn2Threads) run_starts_kernel(int64_t* __restrict__ starts,      // (size + 1)
                                                                 const int64_t* __restrict__ keys,  // (k) sorted
                                                                 int64_t k, int64_t size) {
  for (int64_t d = first_index(); d <= size; d += grid_stride()) starts[d] = lower_bound(keys, k, d);
}

/// out[o, d, e] = Σ over positions j with index[j] == d, ascending, of src[o, j, e]; 0 when there is none.
/// Overwrites out.
template <class T>
__global__ void __launch_bounds__(kNn2Threads) index_add_kernel(T* __restrict__ out,                    // (outer, size, inner)
                                                                const T* __restrict__ src,              // (outer, k, inner)
                                                                const int64_t* __restrict__ starts,     // (size + 1)
                                                                const int64_t* __restrict__ positions,  // (k) by key, stable
                                                                int64_t k, int64_t size, int64_t inner, int64_t total) {
  using M = opmath_t<T>;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t e = i % inner, row = i / inner;
    const int64_t d = row % size, o = row / size;
    M acc = M(0);
    const int64_t end = starts[d + 1];
    for (int64_t t = starts[d]; t < end; ++t) acc += static_cast<M>(src[(o * k + positions[t]) * inner + e]);
    out[i] = convert<T>(acc);
  }
}

/// The widest unit (16, 8, 4, 2 or 1 bytes) that divides `row_bytes` and both addresses.
int unit_bytes(int64_t row_bytes, const void* a, const void* b) {
  const auto misalignment = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  for (int u = 16; u > 1; u /= 2)
    if (row_bytes % u == 0 && misalignment % static_cast<uintptr_t>(u) == 0) return u;
  return 1;
}

template <class U, class I>
void launch_index_select(const Tensor& out, const Tensor& x, const Tensor& index, int64_t k, const Around& a) {
  const int64_t inner_units = static_cast<int64_t>(a.inner * x.itemsize() / sizeof(U));
  const int64_t total = a.outer * k * inner_units;
  index_select_kernel<U, I><<<nn2_blocks(total), kNn2Threads, 0, ::mixtape::cuda::launch_stream()>>>(
      static_cast<U*>(out.data_ptr()), static_cast<const U*>(x.data_ptr()), index.data<I>(), k, a.size, inner_units,
      total);
  MT_CUDA_CHECK_LAUNCH("index_select_kernel (", x.dtype(), ", x ", x.shape(), ", ", k, " indices, ", sizeof(U),
                       "-byte units on ", x.device(), ")");
}

}  // namespace

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index_in) {
  ::mixtape::cuda::DeviceGuard guard(x_in.device());  // launch on the tensor's device
  const Tensor x = raw::contiguous(x_in);
  const Tensor index = raw::contiguous(index_in);  // 0-D or 1-D: its k values in order
  const int64_t k = index.numel();
  Shape out_shape = x.shape();
  out_shape[dim] = k;
  Tensor out = empty(out_shape, TensorOptions(x.dtype()).device(x.device()));
  if (out.numel() == 0) return out;
  const Around a = around(x.shape(), dim);
  const int unit = unit_bytes(a.inner * static_cast<int64_t>(x.itemsize()), x.data_ptr(), out.data_ptr());
  dispatch_index(index.dtype(), [&](auto itag) {
    using I = typename decltype(itag)::type;
    switch (unit) {
      case 16: launch_index_select<uint4, I>(out, x, index, k, a); break;
      case 8: launch_index_select<uint2, I>(out, x, index, k, a); break;
      case 4: launch_index_select<uint32_t, I>(out, x, index, k, a); break;
      case 2: launch_index_select<uint16_t, I>(out, x, index, k, a); break;
      default: launch_index_select<uint8_t, I>(out, x, index, k, a); break;
    }
  });
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index_in, const Tensor& src_in) {
  ::mixtape::cuda::DeviceGuard guard(src_in.device());  // launch on the tensor's device
  const Tensor src = raw::contiguous(src_in);
  const Tensor index = raw::contiguous(index_in);
  const int64_t k = index.numel();
  const Device device = src.device();
  Tensor out = empty(shape, TensorOptions(src.dtype()).device(device));
  const int64_t total = out.numel();
  if (total == 0) return out;
  const Around a = around(shape, dim);
  const TensorOptions i64 = TensorOptions(DType::kI64).device(device);

  // Sorted (index, position) pairs; keys only span [0, size], so the sort needs bit_width(size) bits. Then where
  // each index value's run starts. Without indices every run is empty.
  Tensor keys_sorted = empty({k}, i64), positions_sorted = empty({k}, i64), starts = empty({a.size + 1}, i64);
  if (k > 0) {
    Tensor keys = empty({k}, i64), positions = empty({k}, i64);
    dispatch_index(index.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      index_keys_kernel<I><<<nn2_blocks(k), kNn2Threads, 0, ::mixtape::cuda::launch_stream()>>>(
          keys.data<int64_t>(), positions.data<int64_t>(), index.data<I>(), k, a.size);
      MT_CUDA_CHECK_LAUNCH("index_keys_kernel (", k, " indices on ", device, ")");
    });
    int end_bit = 1;
    while (end_bit < 63 && (int64_t{1} << end_bit) <= a.size) ++end_bit;
    size_t temp_bytes = 0;
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys.data<int64_t>(),
                                                  keys_sorted.data<int64_t>(), positions.data<int64_t>(),
                                                  positions_sorted.data<int64_t>(), k, 0, end_bit, ::mixtape::cuda::launch_stream()),
                  "index_add: sizing the radix sort of ", k, " indices");
    Tensor temp = empty({static_cast<int64_t>(temp_bytes) + 1}, TensorOptions(DType::kU8).device(device));
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys.data<int64_t>(),
                                                  keys_sorted.data<int64_t>(), positions.data<int64_t>(),
                                                  positions_sorted.data<int64_t>(), k, 0, end_bit, ::mixtape::cuda::launch_stream()),
                  "index_add: radix sort of ", k, " indices on ", device);
  }
  run_starts_kernel<<<nn2_blocks(a.size + 1), kNn2Threads, 0, ::mixtape::cuda::launch_stream()>>>(starts.data<int64_t>(),
                                                                              keys_sorted.data<int64_t>(), k, a.size);
  MT_CUDA_CHECK_LAUNCH("run_starts_kernel (", k, " indices, size ", a.size, " on ", device, ")");
  dispatch_floating(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_add_kernel<T><<<nn2_blocks(total), kNn2Threads, 0, ::mixtape::cuda::launch_stream()>>>(
        out.data<T>(), src.data<T>(), starts.data<int64_t>(), positions_sorted.data<int64_t>(), k, a.size,
        a.inner, total);
    MT_CUDA_CHECK_LAUNCH("index_add_kernel (", src.dtype(), ", shape ", shape, ", ", k, " indices on ", device, ")");
  });
  return out;
}

}  // namespace mixtape::kernels::cuda
