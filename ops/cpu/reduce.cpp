// ops/cpu/reduce.cpp — sum, mean, max, min, argmax, argmin over any dims on the CPU.
//
// The one design idea: results never depend on the thread count. x is viewed
// with its kept dims first and its reduced dims last (a permute, no copy), so
// each output element reduces one strided sub-tensor of R elements, walked
// with for_each_run. That walk is cut into fixed chunks of kChunk elements;
// a chunk gives a partial result, and partials are combined in index order
// by a pairwise cascade. OpenMP only decides who computes which partial:
// many outputs are spread over threads whole; a few long reductions (a full
// sum of a big tensor) are spread by chunk. Sums inside a run are pairwise as
// well (NumPy's scheme), so the error of a float sum grows like log n.
// When the outputs are adjacent in memory and the reduced elements far apart
// (a column sum, a bias gradient), reduce_tile walks 64 outputs at once, row
// by row, instead of 64 strided walks: same per-output order, ~100x faster.
//
// Accumulation: f64 in double, f32/f16/bf16 in float (double when the result
// is f64), integers and bool in i64. The kernel writes the accumulator type
// (or the opmath type for max/min), then converts to the requested dtype
// once. Outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/core/convert.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::kernels::cpu {

namespace {

// Reduction elements per partial result: fixed, so the summation order, and
// hence every bit of the result, is the same on 1 or 64 threads.
constexpr int64_t kChunk = 1 << 15;
// Input elements below which a reduction runs on one thread.
constexpr int64_t kParallelMin = 1 << 16;

/// Pairwise sum of n elements of T, `stride` bytes apart, accumulated in Acc.
/// Leaves of up to 128 elements use 8 interleaved accumulators (vectorisable);
/// the error bound is O(log n) ulps instead of O(n).
template <class T, class Acc>
Acc pairwise_sum(const char* p, int64_t stride, int64_t n) {
  constexpr int64_t kLeaf = 128;
  if (n <= kLeaf) {
    auto at = [p, stride](int64_t i) { return convert<Acc>(*reinterpret_cast<const T*>(p + i * stride)); };
    Acc r[8] = {};
    int64_t i = 0;
    if (stride == static_cast<int64_t>(sizeof(T))) {
      const T* q = reinterpret_cast<const T*>(p);
      for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) r[j] = math::add(r[j], convert<Acc>(q[i + j]));
    } else {
      for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) r[j] = math::add(r[j], at(i + j));
    }
    Acc sum = math::add(math::add(math::add(r[0], r[1]), math::add(r[2], r[3])),
                        math::add(math::add(r[4], r[5]), math::add(r[6], r[7])));
    for (; i < n; ++i) sum = math::add(sum, at(i));
    return sum;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return math::add(pairwise_sum<T, Acc>(p, stride, half), pairwise_sum<T, Acc>(p + half * stride, stride, n - half));
}

/// Combines a stream of partials as a binary counter does: slot k holds the
/// combination of 2^k consecutive partials, so sums see O(log n) error
/// growth and combine(a, b) always has a before b (first index wins ties).
template <class Policy>
class Cascade {
  using P = typename Policy::Partial;

 public:
  void push(P v) {
    int k = 0;
    for (uint64_t c = m_count; c & 1; c >>= 1, ++k) v = Policy::combine(m_slots[k], v);
    m_slots[k] = v;
    ++m_count;
  }
  /// Everything pushed, combined oldest first; Policy::identity() when nothing was.
  P result() const {
    P r = Policy::identity();
    bool any = false;
    for (int k = 63; k >= 0; --k) {
      if (((m_count >> k) & 1) == 0) continue;
      r = any ? Policy::combine(r, m_slots[k]) : m_slots[k];
      any = true;
    }
    return r;
  }

 private:
  P m_slots[64];
  uint64_t m_count = 0;
};

// ---- policies: what a run computes, how partials combine, how a result is finished ----

template <class T, class Acc, bool kMean>
struct SumPolicy {
  using Elem = T;
  using Partial = Acc;
  using Result = Acc;
  static Partial identity() { return Acc(0); }
  template <class V>  // T, or T widened to float (reduce_tile)
  static void step(Partial& p, V v, int64_t /*index*/) { p = math::add(p, convert<Acc>(v)); }
  static Partial run(const char* p, int64_t stride, int64_t n, int64_t /*first*/) {
    return pairwise_sum<T, Acc>(p, stride, n);
  }
  static Partial combine(Partial a, Partial b) { return math::add(a, b); }
  /// Mean divides in the accumulator type; 0 / 0 gives NaN for an empty mean.
  static Result finish(Partial s, int64_t count) { return kMean ? s / static_cast<Acc>(count) : s; }
};

/// max or min in opmath; a NaN anywhere makes the result NaN (torch.amax).
template <class T, bool kMax>
struct ExtremumPolicy {
  using M = opmath_t<T>;
  using Elem = T;
  using Partial = M;
  using Result = M;
  static bool better(M v, M best) { return kMax ? v > best : v < best; }
  template <class V>  // T, or T widened to float (reduce_tile)
  static void step(Partial& best, V x, int64_t /*index*/) {
    const M v = static_cast<M>(x);
    if (v != v || better(v, best)) best = v;
  }
  static Partial identity() {
    if constexpr (std::numeric_limits<M>::has_infinity)
      return kMax ? -std::numeric_limits<M>::infinity() : std::numeric_limits<M>::infinity();
    else
      return kMax ? std::numeric_limits<M>::lowest() : std::numeric_limits<M>::max();
  }
  static Partial run(const char* p, int64_t stride, int64_t n, int64_t /*first*/) {
    M best = identity();  // once best is NaN, nothing replaces it but NaN
    for (int64_t i = 0; i < n; ++i) step(best, *reinterpret_cast<const T*>(p + i * stride), 0);
    return best;
  }
  static Partial combine(Partial a, Partial b) { return (b != b || better(b, a)) ? b : a; }
  static Result finish(Partial v, int64_t /*count*/) { return v; }
};

/// argmax/argmin: index into the reduced sub-tensor (row-major over the
/// reduced dims); the first of equal values wins; NaN counts as the extreme
/// and the first NaN wins (torch.argmax).
template <class T, bool kMax>
struct ArgPolicy {
  using M = opmath_t<T>;
  struct Partial {
    M value;
    int64_t index;  // -1: nothing seen
  };
  using Elem = T;
  using Result = int64_t;
  /// Whether v, seen after best, replaces it.
  static bool takes(M v, M best) { return best == best && (v != v || (kMax ? v > best : v < best)); }
  static Partial identity() { return {M(0), -1}; }
  template <class V>  // T, or T widened to float (reduce_tile)
  static void step(Partial& best, V x, int64_t index) {
    const M v = static_cast<M>(x);
    if (best.index < 0 || takes(v, best.value)) best = {v, index};
  }
  static Partial run(const char* p, int64_t stride, int64_t n, int64_t first) {
    Partial best = identity();
    for (int64_t i = 0; i < n; ++i) step(best, *reinterpret_cast<const T*>(p + i * stride), first + i);
    return best;
  }
  static Partial combine(Partial a, Partial b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    return takes(b.value, a.value) ? b : a;
  }
  static Result finish(Partial v, int64_t /*count*/) { return v.index; }
};

// Outputs reduced together by reduce_tile: their accumulators stay in L1.
constexpr int64_t kTile = 64;
// Reduction elements per leaf of a tile's cascade (pairwise above the leaves).
constexpr int64_t kLeafRows = 32;

/// The outer-reduction layout (a column sum: the reduced dims step over
/// rows, the outputs are adjacent in memory): reduces `w` <= kTile adjacent
/// outputs at once, reading each reduced "row" of w contiguous elements in
/// one vectorisable pass instead of w strided walks. Each output still sees
/// its elements in index order, in leaves of kLeafRows combined pairwise, so
/// its result does not depend on w or on the thread that ran it.
template <class Policy>
void reduce_tile(const StridedLayout<1>& red, char* x, int64_t w, int64_t count, char* out, int64_t out_stride) {
  using P = typename Policy::Partial;
  using T = typename Policy::Elem;
  P leaf[kTile];
  for (int64_t j = 0; j < w; ++j) leaf[j] = Policy::identity();
  // slots[k] combines 2^k consecutive leaves (the binary counter of Cascade, kTile wide).
  const uint64_t leaves_max = static_cast<uint64_t>((count + kLeafRows - 1) / kLeafRows);
  std::vector<std::array<P, kTile>> slots(static_cast<size_t>(std::bit_width(leaves_max)) + 1);
  uint64_t leaves = 0;
  int64_t rows_in_leaf = 0, r = 0;
  auto flush = [&] {
    size_t k = 0;
    for (uint64_t c = leaves; c & 1; c >>= 1, ++k)
      for (int64_t j = 0; j < w; ++j) leaf[j] = Policy::combine(slots[k][j], leaf[j]);
    for (int64_t j = 0; j < w; ++j) slots[k][j] = leaf[j], leaf[j] = Policy::identity();
    ++leaves;
    rows_in_leaf = 0;
  };
  for_each_run<1>(red, {x}, 0, count, [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
    for (int64_t i = 0; i < n; ++i, ++r) {
      const T* row = reinterpret_cast<const T*>(p[0] + i * s[0]);
      if constexpr (is_reduced_float(dtype_v<T>)) {
        // f16/bf16 widen to f32 (exactly) a row at a time, with the CPU's vector conversions (core/convert.h):
        // element by element the conversion costs more than the sums.
        float wide[kTile];
        convert_n(row, wide, w);
        for (int64_t j = 0; j < w; ++j) Policy::step(leaf[j], wide[j], r);
      } else {
        for (int64_t j = 0; j < w; ++j) Policy::step(leaf[j], row[j], r);
      }
      if (++rows_in_leaf == kLeafRows) flush();
    }
  });
  if (rows_in_leaf > 0) flush();
  for (int64_t j = 0; j < w; ++j) {
    P total = Policy::identity();
    bool any = false;
    for (size_t k = slots.size(); k-- > 0;) {
      if (((leaves >> k) & 1) == 0) continue;
      total = any ? Policy::combine(total, slots[k][j]) : slots[k][j];
      any = true;
    }
    *reinterpret_cast<typename Policy::Result*>(out + j * out_stride) = Policy::finish(total, count);
  }
}

/// Runs Policy over `xp`, whose first `n_kept` dims are kept and the rest
/// reduced. Returns a contiguous tensor of the kept shape in Policy's Result dtype.
template <class Policy>
Tensor reduce_with(const Tensor& xp, int64_t n_kept, int64_t itemsize) {
  using Partial = typename Policy::Partial;
  using Result = typename Policy::Result;
  Shape kept_shape, kept_strides, red_shape, red_strides;
  for (int64_t d = 0; d < xp.dim(); ++d) {
    (d < n_kept ? kept_shape : red_shape).push_back(xp.size(d));
    (d < n_kept ? kept_strides : red_strides).push_back(xp.stride(d));
  }
  Tensor out = empty(kept_shape, dtype_v<Result>);
  const int64_t outputs = kept_shape.numel(), count = red_shape.numel();
  if (outputs == 0) return out;

  const auto red = make_strided_layout<1>(red_shape, {&red_strides}, {itemsize});
  // The partial of reduction elements [begin, end) of the sub-tensor at `base`.
  auto reduce_range = [&red](char* base, int64_t begin, int64_t end) {
    Cascade<Policy> cascade;
    int64_t pos = begin;
    for_each_run<1>(red, {base}, begin, end,
                    [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
                      cascade.push(Policy::run(p[0], s[0], n, pos));
                      pos += n;
                    });
    return cascade.result();
  };

  char* x_base = static_cast<char*>(xp.data_ptr());
  Result* o = static_cast<Result*>(out.data_ptr());
  const bool parallel = outputs * std::max<int64_t>(count, 1) >= kParallelMin;
  const int64_t chunks = std::max<int64_t>(1, (count + kChunk - 1) / kChunk);

  const Shape out_strides = contiguous_strides(kept_shape);
  const auto kept = make_strided_layout<2>(kept_shape, {&out_strides, &kept_strides},
                                           {static_cast<int64_t>(sizeof(Result)), itemsize});
  const std::array<char*, 2> base{reinterpret_cast<char*>(o), x_base};

  // Outputs adjacent in x, reduced elements far apart (a column sum): tiles of adjacent outputs.
  const int64_t kept_inner = kept.byte_strides[1][kept.ndim - 1];
  const int64_t red_inner = red.byte_strides[0][red.ndim - 1];
  if (kept_inner == itemsize && kept.sizes[kept.ndim - 1] >= 8 && red_inner != itemsize && count > 1) {
    auto run = [&](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
      for (int64_t j = 0; j < n; j += kTile)
        reduce_tile<Policy>(red, p[1] + j * itemsize, std::min(kTile, n - j), count, p[0] + j * s[0], s[0]);
    };
    const int64_t grain = std::max<int64_t>(kTile, kChunk / count);  // outputs per work item
    const int64_t items = (outputs + grain - 1) / grain;
#pragma omp parallel for schedule(static) if (parallel && items > 1)
    for (int64_t it = 0; it < items; ++it)
      for_each_run<2>(kept, base, it * grain, std::min(outputs, (it + 1) * grain), run);
    return out;
  }

  if (chunks == 1) {
    // Each output in one piece; threads take blocks of outputs.
    auto run = [&](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Result*>(p[0] + i * s[0]) = Policy::finish(reduce_range(p[1] + i * s[1], 0, count), count);
    };
    const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(count, 1));  // outputs per work item
    const int64_t items = (outputs + grain - 1) / grain;
#pragma omp parallel for schedule(static) if (parallel && items > 1)
    for (int64_t it = 0; it < items; ++it)
      for_each_run<2>(kept, base, it * grain, std::min(outputs, (it + 1) * grain), run);
    return out;
  }

  // Few outputs, long reductions: the work items are (output, chunk) pairs.
  std::vector<int64_t> x_offsets;  // byte offset of each output's sub-tensor, in output order
  x_offsets.reserve(static_cast<size_t>(outputs));
  const auto kept_x = make_strided_layout<1>(kept_shape, {&kept_strides}, {itemsize});
  for_each_run<1>(kept_x, {x_base}, 0, outputs,
                  [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
                    for (int64_t i = 0; i < n; ++i) x_offsets.push_back(p[0] - x_base + i * s[0]);
                  });
  std::vector<Partial> partials(static_cast<size_t>(outputs * chunks));
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t item = 0; item < outputs * chunks; ++item) {
    const int64_t m = item / chunks, c = item % chunks;
    partials[static_cast<size_t>(item)] =
        reduce_range(x_base + x_offsets[static_cast<size_t>(m)], c * kChunk, std::min(count, (c + 1) * kChunk));
  }
  for (int64_t m = 0; m < outputs; ++m) {
    Cascade<Policy> cascade;
    for (int64_t c = 0; c < chunks; ++c) cascade.push(partials[static_cast<size_t>(m * chunks + c)]);
    o[m] = Policy::finish(cascade.result(), count);
  }
  return out;
}

}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype) {
  // View x as (kept dims..., reduced dims...), each group in its original order.
  bool reduced[Shape::kMaxDims] = {};
  for (int64_t d : dims) reduced[d] = true;
  Shape perm, out_shape, keep_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) continue;
    perm.push_back(d);
    out_shape.push_back(x.size(d));
  }
  const int64_t n_kept = perm.size();
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) perm.push_back(d);
    keep_shape.push_back(reduced[d] ? 1 : x.size(d));
  }
  const Tensor xp = x.dim() == 0 ? x : raw::permute(x, perm);
  const auto itemsize = static_cast<int64_t>(x.itemsize());

  Tensor result = dispatch(x.dtype(), [&](auto tag) -> Tensor {
    using T = typename decltype(tag)::type;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: {
        const bool mean = op == ReduceOp::kMean;
        if constexpr (math::is_floating_v<T>) {
          if (std::is_same_v<T, double> || out_dtype == DType::kF64)
            return mean ? reduce_with<SumPolicy<T, double, true>>(xp, n_kept, itemsize)
                        : reduce_with<SumPolicy<T, double, false>>(xp, n_kept, itemsize);
          return mean ? reduce_with<SumPolicy<T, float, true>>(xp, n_kept, itemsize)
                      : reduce_with<SumPolicy<T, float, false>>(xp, n_kept, itemsize);
        } else {
          MT_CHECK(!mean, "mean: expected a floating dtype, got ", x.dtype(), " (shape ", x.shape(), ")");
          return reduce_with<SumPolicy<T, int64_t, false>>(xp, n_kept, itemsize);
        }
      }
      case ReduceOp::kMax: return reduce_with<ExtremumPolicy<T, true>>(xp, n_kept, itemsize);
      case ReduceOp::kMin: return reduce_with<ExtremumPolicy<T, false>>(xp, n_kept, itemsize);
      case ReduceOp::kArgmax: return reduce_with<ArgPolicy<T, true>>(xp, n_kept, itemsize);
      case ReduceOp::kArgmin: return reduce_with<ArgPolicy<T, false>>(xp, n_kept, itemsize);
    }
    MT_ERROR(name(op), ": unknown reduction");
  });
  if (result.dtype() != out_dtype) result = raw::to(result, out_dtype);  // the one rounding to the result dtype
  return keepdim ? raw::view(result, keep_shape) : result;
}

}  // namespace mixtape::kernels::cpu
