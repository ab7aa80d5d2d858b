// cuda/index.cu — gather, scatter_add, index_select, index_add and randperm on the GPU.
//
// gather: one thread per output element maps its coordinates to the index
// element and the x element it names; elements are moved as raw bytes of
// their size, so every dtype is one of four instantiations and nothing is
// converted. An index value out of [0, x.size(dim)) reads nothing and writes
// NaN (0 for integer and bool dtypes): the host cannot check CUDA index values
// without a synchronisation, and a NaN loss is how a bad target shows up.
//
// scatter_add is deterministic without float atomics by ownership: one thread
// owns each line of the output along `dim` (fixed coordinates off `dim`) and
// adds the index line's j = 0, 1, ... contributions into it in that order —
// the order the CPU adds them, in the same opmath accumulator (an f32 buffer
// for f16/bf16, rounded once at the end), so the two backends agree exactly.
// No two threads touch one output element. For cross-entropy (index (N, 1)
// along the class dim) a thread does one add; a scatter whose index has few
// lines and long ones runs serially per line (correct, not fast). Out-of-range
// index values are skipped: nothing is written out of bounds.
//
// index_select and index_add view their tensors as (outer, size, inner) around `dim`.
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
//     ops/cpu/index.cpp whatever the duplicates. Cost: a radix sort of k keys
//     (bit_width(size) bits), size·log2(k) for the run starts, then each
//     output element reads 2 starts plus its contributions:
//     O(k + size·log k + out + src) work, no atomics, 4 small launches.
//
// randperm: a Philox key per position (core/random.h's permutation_key), then one CUB radix sort of the (key,
// position) pairs over all 64 bits; the sort is stable, so ties (vanishingly rare) keep position order, as the CPU's
// sort by (key, position) does: both devices give the same permutation.
//
// Out-of-range indices: the index_select op checks every CPU index value on
// the host; CUDA index values are not read back (that would synchronise), so
// these kernels stay memory-safe on their own: index_select writes zeros for
// an out-of-range index, index_add drops its slice.
// Outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/core/random.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

// ---- gather and scatter_add --------------------------------------------------------------

namespace {


/// The index's shape and the operands' strides (in elements), passed to the kernels by value.
struct IndexLayout {
  int ndim;                          // 0 for 0-d tensors
  int64_t sizes[Shape::kMaxDims];    // (ndim): gather: the index's shape; scatter_add: its lines (1 along dim)
  int64_t a_strides[Shape::kMaxDims];      // gather: x's strides; scatter_add: the accumulator's. 0 along dim
  int64_t b_strides[Shape::kMaxDims];      // src's strides (scatter_add)
  int64_t index_strides[Shape::kMaxDims];  // the index's strides
};

/// Offsets (in elements) of linear element `i` of L.sizes in the three operands.
__device__ __forceinline__ void offsets(const IndexLayout& L, int64_t i, int64_t& a, int64_t& b, int64_t& idx) {
  a = b = idx = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t q = i / L.sizes[d], c = i - q * L.sizes[d];
    a += c * L.a_strides[d];
    b += c * L.b_strides[d];
    idx += c * L.index_strides[d];
    i = q;
  }
}



/// out[i] = x[coords(i) with coordinate dim = index[i]]; E is an unsigned integer of the element's size.
/// `bad` (the bits of NaN, or 0) is written for an index value out of [0, size). Overwrites out.
template <class E>
__global__ void __launch_bounds__(kBlockThreads) gather_kernel(E* __restrict__ out,               // (index shape), contiguous
                                                          const E* __restrict__ x,           // strides L.a_strides
                                                          const int64_t* __restrict__ index,  // strides L.index_strides
                                                          IndexLayout L, int64_t numel, int64_t size, int64_t step,
                                                          E bad) {
  for (int64_t i = first_index(); i < numel; i += grid_stride()) {
    int64_t xo, unused, io;
    offsets(L, i, xo, unused, io);
    const int64_t k = index[io];
    out[i] = (k >= 0 && k < size) ? x[xo + k * step] : bad;
  }
}

/// For each line of the index along dim (L.sizes has 1 there): acc[line, index[line, j]] += src[line, j] for
/// j = 0 .. J−1 in order; out-of-range index values are skipped. Accumulates into acc (zero-filled by the caller).
template <class T>
__global__ void __launch_bounds__(kBlockThreads) scatter_add_kernel(opmath_t<T>* __restrict__ acc,    // (shape), contiguous
                                                               const T* __restrict__ src,         // strides L.b_strides
                                                               const int64_t* __restrict__ index,  // strides L.index_strides
                                                               IndexLayout L, int64_t lines, int64_t J, int64_t size,
                                                               int64_t acc_step, int64_t src_step,
                                                               int64_t index_step) {
  using Acc = opmath_t<T>;
  for (int64_t line = first_index(); line < lines; line += grid_stride()) {
    int64_t ao, so, io;
    offsets(L, line, ao, so, io);
    for (int64_t j = 0; j < J; ++j) {
      const int64_t k = index[io + j * index_step];
      if (k >= 0 && k < size) acc[ao + k * acc_step] += static_cast<Acc>(src[so + j * src_step]);
    }
  }
}

/// The bits gather writes for an out-of-range index: a quiet NaN for floating dtypes, 0 otherwise.
uint64_t bad_value_bits(DType t) {
  switch (t) {
    case DType::kF64: return 0x7ff8000000000000ull;
    case DType::kF32: return 0x7fc00000u;
    case DType::kF16: return 0x7e00u;
    case DType::kBF16: return 0x7fc0u;
    default: return 0;
  }
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = empty(index.shape(), TensorOptions(x.dtype()).device(x.device()));
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  IndexLayout L{};
  L.ndim = static_cast<int>(index.dim());
  for (int d = 0; d < L.ndim; ++d) {
    L.sizes[d] = index.size(d);
    L.a_strides[d] = d == dim ? 0 : x.stride(d);
    L.index_strides[d] = index.stride(d);
  }
  const int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim);
  DeviceGuard guard(x.device());
  const uint64_t bad = bad_value_bits(x.dtype());
  auto launch = [&](auto bytes_tag) {
    using E = decltype(bytes_tag);
    gather_kernel<E><<<grid_blocks(numel), kBlockThreads, 0, launch_stream()>>>(
        static_cast<E*>(out.data_ptr()), static_cast<const E*>(x.data_ptr()), index.data<int64_t>(), L, numel, size,
        step, static_cast<E>(bad));
    MT_CUDA_CHECK_LAUNCH("gather_kernel (", x.dtype(), " x of shape ", x.shape(), ", index of shape ", index.shape(),
                         ", dim ", dim, ")");
  };
  switch (x.itemsize()) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(uint64_t{}); break;
  }
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  const auto out_options = TensorOptions(src.dtype()).device(src.device());
  if (index.numel() == 0) return zeros(shape, out_options);
  const DType acc = acc_dtype(src.dtype());
  // f32/f64 accumulate in the output itself; f16/bf16 in an f32 buffer rounded once below.
  Tensor sums = zeros(shape, TensorOptions(acc).device(src.device()));
  const Shape acc_strides = contiguous_strides(shape);
  IndexLayout L{};
  L.ndim = static_cast<int>(index.dim());
  int64_t lines = 1;
  for (int d = 0; d < L.ndim; ++d) {
    L.sizes[d] = d == dim ? 1 : index.size(d);
    L.a_strides[d] = d == dim ? 0 : acc_strides[d];
    L.b_strides[d] = src.stride(d);
    L.index_strides[d] = index.stride(d);
    lines *= L.sizes[d];
  }
  const bool zero_d = shape.empty();
  const int64_t J = zero_d ? 1 : index.size(dim), size = zero_d ? 1 : shape[dim];
  const int64_t acc_step = zero_d ? 0 : acc_strides[dim];
  const int64_t src_step = zero_d ? 0 : src.stride(dim), index_step = zero_d ? 0 : index.stride(dim);
  DeviceGuard guard(src.device());
  dispatch_floating(src.dtype(), "scatter_add_kernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_kernel<T><<<grid_blocks(lines), kBlockThreads, 0, launch_stream()>>>(
        sums.data<opmath_t<T>>(), src.data<T>(), index.data<int64_t>(), L, lines, J, size, acc_step, src_step,
        index_step);
    MT_CUDA_CHECK_LAUNCH("scatter_add_kernel (", src.dtype(), " src of shape ", src.shape(), " into shape ", shape,
                         ", dim ", dim, ")");
  });
  return src.dtype() == acc ? sums : raw::to(sums, src.dtype());
}

// ---- index_select and index_add ----------------------------------------------------------

namespace {

/// One CUB radix sort (stable) of (key, value) pairs over key bits [0, end_bit): keys_in/values (positions, i64)
/// into keys_out/values_out, on the launch stream, its scratch from the caching allocator. `op` names the caller.
template <class K>
void sort_pairs(const K* keys_in, K* keys_out, const Tensor& values, const Tensor& values_out, int end_bit,
                const char* op) {
  const int64_t n = values.numel();
  auto sort = [&](void* temp, size_t& temp_bytes) {
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, values.data<int64_t>(),
                                           values_out.data<int64_t>(), n, 0, end_bit, launch_stream());
  };
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(sort(nullptr, temp_bytes), op, ": sizing the radix sort of ", n, " keys");
  Tensor temp = empty({static_cast<int64_t>(temp_bytes) + 1}, TensorOptions(DType::kU8).device(values.device()));
  MT_CUDA_CHECK(sort(temp.data_ptr(), temp_bytes), op, ": radix sort of ", n, " keys on ", values.device());
}

/// Calls f(TypeTag<I>{}) for an index dtype (kI64 or kI32; the entry point has checked which).
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
__global__ void __launch_bounds__(kBlockThreads) index_select_kernel(U* __restrict__ out,          // (outer, k, inner_units)
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
__global__ void __launch_bounds__(kBlockThreads) index_keys_kernel(int64_t* __restrict__ keys,       // (k)
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
__global__ void __launch_bounds__(kBlockThreads) run_starts_kernel(int64_t* __restrict__ starts,      // (size + 1)
                                                                 const int64_t* __restrict__ keys,  // (k) sorted
                                                                 int64_t k, int64_t size) {
  for (int64_t d = first_index(); d <= size; d += grid_stride()) starts[d] = lower_bound(keys, k, d);
}

/// out[o, d, e] = Σ over positions j with index[j] == d, ascending, of src[o, j, e]; 0 when there is none.
/// Overwrites out.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) index_add_kernel(T* __restrict__ out,                    // (outer, size, inner)
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
void launch_index_select(const Tensor& out, const Tensor& x, const Tensor& index, int64_t k, const RowLayout& a) {
  const int64_t inner_units = static_cast<int64_t>(a.inner * x.itemsize() / sizeof(U));
  const int64_t total = a.outer * k * inner_units;
  index_select_kernel<U, I><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(
      static_cast<U*>(out.data_ptr()), static_cast<const U*>(x.data_ptr()), index.data<I>(), k, a.C, inner_units,
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
  const RowLayout a = row_layout(x.shape(), dim);
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
  const RowLayout a = row_layout(shape, dim);
  const TensorOptions i64 = TensorOptions(DType::kI64).device(device);

  // Sorted (index, position) pairs; keys only span [0, size], so the sort needs bit_width(size) bits. Then where
  // each index value's run starts. Without indices every run is empty.
  Tensor keys_sorted = empty({k}, i64), positions_sorted = empty({k}, i64), starts = empty({a.C + 1}, i64);
  if (k > 0) {
    Tensor keys = empty({k}, i64), positions = empty({k}, i64);
    dispatch_index(index.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      index_keys_kernel<I><<<grid_blocks(k), kBlockThreads, 0, launch_stream()>>>(
          keys.data<int64_t>(), positions.data<int64_t>(), index.data<I>(), k, a.C);
      MT_CUDA_CHECK_LAUNCH("index_keys_kernel (", k, " indices on ", device, ")");
    });
    int end_bit = 1;
    while (end_bit < 63 && (int64_t{1} << end_bit) <= a.C) ++end_bit;
    sort_pairs(keys.data<int64_t>(), keys_sorted.data<int64_t>(), positions, positions_sorted, end_bit, "index_add");
  }
  run_starts_kernel<<<grid_blocks(a.C + 1), kBlockThreads, 0, launch_stream()>>>(starts.data<int64_t>(),
                                                                              keys_sorted.data<int64_t>(), k, a.C);
  MT_CUDA_CHECK_LAUNCH("run_starts_kernel (", k, " indices, size ", a.C, " on ", device, ")");
  dispatch_floating(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_add_kernel<T><<<grid_blocks(total), kBlockThreads, 0, launch_stream()>>>(
        out.data<T>(), src.data<T>(), starts.data<int64_t>(), positions_sorted.data<int64_t>(), k, a.C,
        a.inner, total);
    MT_CUDA_CHECK_LAUNCH("index_add_kernel (", src.dtype(), ", shape ", shape, ", ", k, " indices on ", device, ")");
  });
  return out;
}

namespace {

/// keys[i] = permutation_key(seed, offset, i), positions[i] = i.
__global__ void __launch_bounds__(kBlockThreads)
    permutation_keys_kernel(uint64_t* keys, int64_t* positions, int64_t n, uint64_t seed, uint64_t offset) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    keys[i] = permutation_key(seed, offset, i);
    positions[i] = i;
  }
}

}  // namespace

Tensor randperm(int64_t n, uint64_t seed, uint64_t offset, Device device) {
  ::mixtape::cuda::detail::refuse_in_capture("randperm (its seed and offset are the capture's: every replay would "
                                             "draw the same permutation)");
  ::mixtape::cuda::DeviceGuard guard(device);
  const TensorOptions i64 = TensorOptions(DType::kI64).device(device);
  Tensor out = empty({n}, i64);
  if (n == 0) return out;
  // The keys and positions, then one stable radix sort of the pairs over all 64 key bits: the CPU's sort by (key,
  // position), so both devices give the same permutation.
  Tensor keys = empty({n}, i64), keys_sorted = empty({n}, i64);  // u64 keys, held as i64 storage
  Tensor positions = empty({n}, i64);
  permutation_keys_kernel<<<grid_blocks(n), kBlockThreads, 0, launch_stream()>>>(
      static_cast<uint64_t*>(keys.data_ptr()), positions.data<int64_t>(), n, seed, offset);
  MT_CUDA_CHECK_LAUNCH("permutation_keys_kernel (", n, " positions on ", device, ")");
  sort_pairs(static_cast<const uint64_t*>(keys.data_ptr()), static_cast<uint64_t*>(keys_sorted.data_ptr()), positions,
             out, 64, "randperm");
  return out;
}

}  // namespace mixtape::kernels::cuda
