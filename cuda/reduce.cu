// cuda/reduce.cu — sum, mean, max, min, argmax, argmin over any dims on the GPU.
//
// The one design idea: like the CPU (ops/cpu/reduce.cpp), x is viewed with its
// kept dims first and its reduced dims last (a permute, no copy), and every
// result is a pure function of the data: each output's elements are combined
// in an order fixed by the reduction length alone, never by the GPU's size or
// timing. Three layouts, three kernels:
//   - rows (the reduced elements contiguous, e.g. a softmax statistic, a full
//     sum): a group of threads per output, each thread striding through the
//     row, then cub::WarpReduce (short rows: a warp per row) or
//     cub::BlockReduce (a block per row). Rows longer than 2·kChunk are cut
//     into kChunk pieces reduced by separate blocks into partials (a u8 tensor
//     from the allocator), which a second kernel combines: the two-pass full
//     reduction.
//   - columns (adjacent outputs adjacent in memory, reduced elements one
//     stride apart, e.g. a bias gradient): a thread per output walks its
//     column; neighbouring threads read neighbouring addresses. Fewer than
//     kMinColumns short columns (a Linear's bias gradient over a batch) get
//     kSplitRuns threads each, one run of the column apiece, combined in run
//     order: no copy (it was the MNIST MLP's 0.25 MiB above the CPU's peak).
//   - anything else (reduced dims that do not coalesce into one run, few
//     long columns): one raw::contiguous copy of the permuted view turns it
//     into rows.
// Policies say what a thread accumulates and how partials combine; argmax's
// combine breaks ties by the smaller index, so any combination order gives
// the CPU's "first index wins", and NaN is the extreme (first NaN wins).
//
// Accumulation as on the CPU: f64 in double, f32/f16/bf16 in float (double
// when the result is f64), integers and bool in i64; max/min in opmath. The
// kernels write that type; the host converts to out_dtype once. Outputs are
// freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/ops/backend/scalar_math.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
// Rows up to this long get a warp each, longer ones a block each.
constexpr int64_t kShortRow = 1024;
// Elements per piece of a long row; rows over 2·kChunk are split (a fixed function of the row length).
constexpr int64_t kChunk = 1 << 16;
// Column reductions with fewer outputs than this split each column among kSplitRuns threads (a thread per output
// would idle the GPU); over kSplitMaxCount elements a column they copy to rows instead, which the rows kernels cut
// among many more threads.
constexpr int64_t kMinColumns = 1024;
constexpr int kSplitColumns = 32;
constexpr int kSplitRuns = 8;
constexpr int64_t kSplitMaxCount = 4096;
// Elements a thread folds into a leaf before adding the leaf to its total: sequential float sums then err like
// (kLeaf + n / kLeaf) ulps, not n.
constexpr int64_t kLeaf = 64;

// ---- policies --------------------------------------------------------------------------------

template <class T, class Acc>
struct SumPolicy {
  using Elem = T;
  using Partial = Acc;
  using Result = Acc;
  __device__ static Partial identity() { return Acc(0); }
  __device__ static void step(Partial& p, T v, int64_t /*index*/) { p = math::add(p, convert<Acc>(v)); }
  __device__ static Partial combine(Partial a, Partial b) { return math::add(a, b); }
  /// Mean divides in the accumulator type (only floating sums are means).
  __device__ static Result finish(Partial s, int64_t count, bool mean) {
    if constexpr (std::is_floating_point_v<Acc>)
      return mean ? s / static_cast<Acc>(count) : s;
    else
      return s;
  }
};

/// max or min in opmath; a NaN anywhere makes the result NaN (torch.amax).
template <class T, bool kMax>
struct ExtremumPolicy {
  using M = opmath_t<T>;
  using Elem = T;
  using Partial = M;
  using Result = M;
  __device__ static bool better(M v, M best) { return kMax ? v > best : v < best; }
  __device__ static Partial identity() {
    if constexpr (std::numeric_limits<M>::has_infinity)
      return kMax ? -std::numeric_limits<M>::infinity() : std::numeric_limits<M>::infinity();
    else
      return kMax ? std::numeric_limits<M>::lowest() : std::numeric_limits<M>::max();
  }
  __device__ static void step(Partial& best, T x, int64_t /*index*/) {
    const M v = static_cast<M>(x);
    if (v != v || better(v, best)) best = v;  // once best is NaN, nothing replaces it but NaN
  }
  __device__ static Partial combine(Partial a, Partial b) { return (b != b || better(b, a)) ? b : a; }
  __device__ static Result finish(Partial v, int64_t, bool) { return v; }
};

template <class M>
struct ArgPartial {
  M value;
  int64_t index;  // within the reduced sub-tensor (row-major); -1: nothing seen
};

/// argmax/argmin; the first of equal values wins, NaN is the extreme and the first NaN wins (torch.argmax).
template <class T, bool kMax>
struct ArgPolicy {
  using M = opmath_t<T>;
  using Elem = T;
  using Partial = ArgPartial<M>;
  using Result = int64_t;
  __device__ static bool better(M v, M best) { return kMax ? v > best : v < best; }
  __device__ static Partial identity() { return {M(0), -1}; }
  /// Elements arrive in increasing index order within a thread: only a strictly better one (or a first NaN) replaces.
  __device__ static void step(Partial& best, T x, int64_t index) {
    const M v = static_cast<M>(x);
    if (best.index < 0 || (best.value == best.value && (v != v || better(v, best.value)))) best = {v, index};
  }
  /// Commutative: ties (and two NaNs) go to the smaller index, so any tree of combines agrees with a scan.
  __device__ static Partial combine(Partial a, Partial b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan) {
      if (better(b.value, a.value)) return b;
      if (better(a.value, b.value)) return a;
    }
    return a.index < b.index ? a : b;
  }
  __device__ static Result finish(Partial v, int64_t, bool) { return v.index; }
};

template <class P>
struct Combine {
  __device__ __forceinline__ typename P::Partial operator()(const typename P::Partial& a,
                                                            const typename P::Partial& b) const {
    return P::combine(a, b);
  }
};

/// Folds elements [begin, end) of `row`, `step` apart in index (stride `stride` in memory), in leaves of kLeaf.
template <class P>
__device__ __forceinline__ typename P::Partial fold(const typename P::Elem* row, int64_t stride, int64_t begin,
                                                    int64_t end, int64_t step) {
  using Partial = typename P::Partial;
  Partial total = P::identity();
  for (int64_t leaf_begin = begin; leaf_begin < end; leaf_begin += kLeaf * step) {
    Partial leaf = P::identity();
    const int64_t leaf_end = leaf_begin + kLeaf * step < end ? leaf_begin + kLeaf * step : end;
    for (int64_t i = leaf_begin; i < leaf_end; i += step) P::step(leaf, row[i * stride], i);
    total = P::combine(total, leaf);
  }
  return total;
}

/// Element offsets of the kept (output) index space: up to kMaxDims coalesced dims.
struct OffsetLayout {
  int ndim;                           // in [1, kMaxDims]
  int64_t sizes[Shape::kMaxDims];     // (ndim), innermost last
  int64_t strides[Shape::kMaxDims];   // (ndim), in elements of x
};

OffsetLayout offset_layout(const Shape& shape, const Shape& strides) {
  const StridedLayout<1> S = make_strided_layout<1>(shape, {&strides}, {1});
  OffsetLayout L{};
  L.ndim = S.ndim;
  for (int d = 0; d < S.ndim; ++d) L.sizes[d] = S.sizes[d], L.strides[d] = S.byte_strides[0][d];
  return L;
}

/// Element offset of output `i`; unrolled with a uniform guard so nothing lands in local memory.
__device__ __forceinline__ int64_t offset_of(const OffsetLayout& L, int64_t i) {
  int64_t off = 0;
#pragma unroll
  for (int d = Shape::kMaxDims - 1; d > 0; --d) {
    if (d < L.ndim) {
      const int64_t q = i / L.sizes[d];
      off += (i - q * L.sizes[d]) * L.strides[d];
      i = q;
    }
  }
  return off + i * L.strides[0];
}

// ---- kernels -----------------------------------------------------------------------------

/// Reduces `rows` rows of `count` contiguous elements in `pieces` pieces of `chunk` elements: a work item is
/// (row, piece), run by kGroup threads (a warp, or the whole block). With one piece the result is final
/// (out: Result (rows)); otherwise out holds Partial (rows, pieces). Overwrites out.
template <class P, int kGroup>
__global__ void __launch_bounds__(kThreads) reduce_rows_kernel(const typename P::Elem* x,  // rows at `kept` offsets
                                                               OffsetLayout kept, int64_t rows, int64_t count,
                                                               int64_t chunk, int64_t pieces, bool mean, void* out) {
  using Partial = typename P::Partial;
  using Result = typename P::Result;
  constexpr int kGroups = kThreads / kGroup;
  using WarpReduce = cub::WarpReduce<Partial>;
  using BlockReduce = cub::BlockReduce<Partial, kThreads>;
  __shared__ std::conditional_t<kGroup == kWarp, typename WarpReduce::TempStorage[kGroups],
                                typename BlockReduce::TempStorage> temp;
  const int group = static_cast<int>(threadIdx.x) / kGroup, lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t items = rows * pieces;
  // The loop bound is uniform over a group, so every collective below sees its whole group.
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGroups + group; item < items;
       item += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t r = item / pieces, c = item - r * pieces;
    const int64_t begin = c * chunk, end = begin + chunk < count ? begin + chunk : count;
    const typename P::Elem* row = x + offset_of(kept, r);
    const Partial mine = fold<P>(row, 1, begin + lane, end, kGroup);
    Partial total;
    if constexpr (kGroup == kWarp) {
      total = WarpReduce(temp[group]).Reduce(mine, Combine<P>{});
      __syncwarp();
    } else {
      total = BlockReduce(temp).Reduce(mine, Combine<P>{});
      __syncthreads();  // temp is reused by the next item
    }
    if (lane == 0) {
      if (pieces == 1)
        static_cast<Result*>(out)[r] = P::finish(total, count, mean);
      else
        static_cast<Partial*>(out)[item] = total;
    }
  }
}

/// out[r] = the pieces of row r (Partial (rows, pieces)) combined; a block per row. Overwrites out.
template <class P>
__global__ void __launch_bounds__(kThreads) reduce_partials_kernel(const typename P::Partial* partials, int64_t rows,
                                                                   int64_t pieces, int64_t count, bool mean,
                                                                   typename P::Result* out) {  // (rows)
  using BlockReduce = cub::BlockReduce<typename P::Partial, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    typename P::Partial mine = P::identity();
    for (int64_t c = threadIdx.x; c < pieces; c += kThreads) mine = P::combine(mine, partials[r * pieces + c]);
    const typename P::Partial total = BlockReduce(temp).Reduce(mine, Combine<P>{});
    __syncthreads();
    if (threadIdx.x == 0) out[r] = P::finish(total, count, mean);
  }
}

/// out[o] = the `count` elements at x + offset(o) + i * red_stride, one thread per output. Overwrites out.
template <class P>
__global__ void __launch_bounds__(kThreads) reduce_columns_kernel(const typename P::Elem* x,  // outputs at `kept`
                                                                  OffsetLayout kept, int64_t outputs, int64_t count,
                                                                  int64_t red_stride, bool mean,
                                                                  typename P::Result* out) {  // (outputs)
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[o] = P::finish(fold<P>(x + offset_of(kept, o), red_stride, 0, count, 1), count, mean);
}

/// Few outputs (under kMinColumns), each reduced over `count` ≤ kSplitMaxCount elements `red_stride` apart: a bias
/// gradient's column sums over a batch. A block takes kSplitColumns outputs with kSplitRuns rows of threads; row s
/// folds run s of the reduced index (consecutive elements, in leaves) and the runs are combined in run order, an
/// order fixed by count alone. Overwrites out.
template <class P>
__global__ void __launch_bounds__(kSplitColumns * kSplitRuns) reduce_columns_split_kernel(
    const typename P::Elem* x,  // outputs at `kept`
    OffsetLayout kept, int64_t outputs, int64_t count, int64_t red_stride, bool mean,
    typename P::Result* out) {  // (outputs)
  using Partial = typename P::Partial;
  __shared__ Partial runs[kSplitRuns][kSplitColumns];
  const int lane = static_cast<int>(threadIdx.x), run = static_cast<int>(threadIdx.y);
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kSplitColumns + lane;
  const int64_t per_run = (count + kSplitRuns - 1) / kSplitRuns;
  const int64_t begin = run * per_run < count ? run * per_run : count;
  const int64_t end = begin + per_run < count ? begin + per_run : count;
  runs[run][lane] = o < outputs ? fold<P>(x + offset_of(kept, o), red_stride, begin, end, 1) : P::identity();
  __syncthreads();
  if (run != 0 || o >= outputs) return;
  Partial total = runs[0][lane];
#pragma unroll
  for (int s = 1; s < kSplitRuns; ++s) total = P::combine(total, runs[s][lane]);
  out[o] = P::finish(total, count, mean);
}

// ---- host ------------------------------------------------------------------------------------

/// Runs P over `xp`, whose first `n_kept` dims are kept and the rest reduced. Returns a contiguous tensor of the
/// kept shape in P's Result dtype on xp's device.
template <class P>
Tensor reduce_with(Tensor xp, int64_t n_kept, bool mean) {
  using T = typename P::Elem;
  using Partial = typename P::Partial;
  using Result = typename P::Result;
  Shape kept_shape, red_shape;
  for (int64_t d = 0; d < xp.dim(); ++d) (d < n_kept ? kept_shape : red_shape).push_back(xp.size(d));
  auto split_strides = [n_kept](const Tensor& t, Shape& kept, Shape& red) {
    kept = Shape{}, red = Shape{};
    for (int64_t d = 0; d < t.dim(); ++d) (d < n_kept ? kept : red).push_back(t.stride(d));
  };
  Shape kept_strides, red_strides;
  split_strides(xp, kept_strides, red_strides);

  const Device device = xp.device();
  Tensor out = mixtape::empty(kept_shape, TensorOptions(dtype_v<Result>).device(device));
  const int64_t outputs = kept_shape.numel(), count = red_shape.numel();
  if (outputs == 0) return out;
  if (count == 0) {  // only sums and means get here (dispatch rejects empty max/min/arg*): 0, and 0 / 0 for a mean
    raw::fill_(out, mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return out;
  }
  DeviceGuard guard(device);
  Result* o = static_cast<Result*>(out.data_ptr());

  const StridedLayout<1> red = make_strided_layout<1>(red_shape, {&red_strides}, {1});
  const int64_t red_stride = red.byte_strides[0][0];
  const bool one_run = red.ndim == 1;
  const bool columns = one_run && red_stride != 1 && count > 1;  // each output's elements one stride apart
  if (columns && (outputs >= kMinColumns || count <= kSplitMaxCount)) {
    const OffsetLayout kept = offset_layout(kept_shape, kept_strides);
    const T* x = static_cast<const T*>(xp.data_ptr());
    if (outputs >= kMinColumns) {
      reduce_columns_kernel<P><<<grid_blocks(outputs, kThreads), kThreads, 0, launch_stream()>>>(
          x, kept, outputs, count, red_stride, mean, o);
    } else {
      reduce_columns_split_kernel<P><<<static_cast<unsigned>((outputs + kSplitColumns - 1) / kSplitColumns),
                                       dim3(kSplitColumns, kSplitRuns), 0, launch_stream()>>>(
          x, kept, outputs, count, red_stride, mean, o);
    }
    MT_CUDA_CHECK_LAUNCH(outputs >= kMinColumns ? "reduce_columns_kernel" : "reduce_columns_split_kernel", " (dtype ",
                         xp.dtype(), ", kept ", kept_shape, ", reduced ", red_shape, " on ", device, ")");
    return out;
  }
  if (!(one_run && (red_stride == 1 || count == 1))) {
    xp = raw::contiguous(xp);  // the reduced dims become one contiguous run per output
    split_strides(xp, kept_strides, red_strides);
  }
  const OffsetLayout kept = offset_layout(kept_shape, kept_strides);
  const T* x = static_cast<const T*>(xp.data_ptr());

  const int64_t pieces = count > 2 * kChunk ? (count + kChunk - 1) / kChunk : 1;
  if (pieces == 1) {
    if (count <= kShortRow) {
      const int grid = grid_blocks(outputs * kWarp, kThreads);
      reduce_rows_kernel<P, kWarp><<<grid, kThreads, 0, launch_stream()>>>(x, kept, outputs, count, count, 1, mean, o);
    } else {
      const int grid = grid_blocks(outputs * kThreads, kThreads);
      reduce_rows_kernel<P, kThreads><<<grid, kThreads, 0, launch_stream()>>>(x, kept, outputs, count, count, 1, mean,
                                                                              o);
    }
    MT_CUDA_CHECK_LAUNCH("reduce_rows_kernel (dtype ", xp.dtype(), ", kept ", kept_shape, ", reduced ", red_shape,
                         " on ", device, ")");
    return out;
  }
  // Two passes: pieces of every row into partials (temporary storage through the allocator), then a block per row.
  const Tensor partials = mixtape::empty({outputs * pieces * static_cast<int64_t>(sizeof(Partial))},
                                         TensorOptions(DType::kU8).device(device));
  const int grid = grid_blocks(outputs * pieces * kThreads, kThreads);
  reduce_rows_kernel<P, kThreads><<<grid, kThreads, 0, launch_stream()>>>(x, kept, outputs, count, kChunk, pieces,
                                                                          mean, partials.data_ptr());
  MT_CUDA_CHECK_LAUNCH("reduce_rows_kernel (pieces, dtype ", xp.dtype(), ", kept ", kept_shape, ", reduced ",
                       red_shape, " on ", device, ")");
  reduce_partials_kernel<P><<<grid_blocks(outputs * kThreads, kThreads), kThreads, 0, launch_stream()>>>(
      static_cast<const Partial*>(partials.data_ptr()), outputs, pieces, count, mean, o);
  MT_CUDA_CHECK_LAUNCH("reduce_partials_kernel (dtype ", xp.dtype(), ", kept ", kept_shape, ", reduced ", red_shape,
                       " on ", device, ")");
  return out;
}

}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype) {
  // View x as (kept dims..., reduced dims...), each group in its original order (as ops/cpu/reduce.cpp does).
  bool reduced[Shape::kMaxDims] = {};
  for (int64_t d : dims) reduced[d] = true;
  Shape perm, keep_shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!reduced[d]) perm.push_back(d);
  const int64_t n_kept = perm.size();
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) perm.push_back(d);
    keep_shape.push_back(reduced[d] ? 1 : x.size(d));
  }
  const Tensor xp = x.dim() == 0 ? x : raw::permute(x, perm);

  Tensor result = dispatch(x.dtype(), [&](auto tag) -> Tensor {
    using T = typename decltype(tag)::type;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: {
        const bool mean = op == ReduceOp::kMean;
        if constexpr (math::is_floating_v<T>) {
          if constexpr (std::is_same_v<T, double>) {
            return reduce_with<SumPolicy<T, double>>(xp, n_kept, mean);
          } else {
            if (out_dtype == DType::kF64) return reduce_with<SumPolicy<T, double>>(xp, n_kept, mean);
            return reduce_with<SumPolicy<T, float>>(xp, n_kept, mean);
          }
        } else {
          MT_CHECK(!mean, "mean: expected a floating dtype, got ", x.dtype(), " (shape ", x.shape(), ")");
          return reduce_with<SumPolicy<T, int64_t>>(xp, n_kept, false);
        }
      }
      case ReduceOp::kMax: return reduce_with<ExtremumPolicy<T, true>>(xp, n_kept, false);
      case ReduceOp::kMin: return reduce_with<ExtremumPolicy<T, false>>(xp, n_kept, false);
      case ReduceOp::kArgmax: return reduce_with<ArgPolicy<T, true>>(xp, n_kept, false);
      case ReduceOp::kArgmin: return reduce_with<ArgPolicy<T, false>>(xp, n_kept, false);
    }
    MT_ERROR("reduce: unknown reduction ", static_cast<int>(op));
  });
  if (result.dtype() != out_dtype) result = raw::to(result, out_dtype);  // the one rounding to the result dtype
  return keepdim ? raw::view(result, keep_shape) : result;
}

}  // namespace mixtape::kernels::cuda
