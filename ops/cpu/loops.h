// ops/cpu/loops.h — what the CPU kernels share: thread thresholds, row layouts and accumulators (internal).
//
// The one design idea: every statistic of a row (max, sum of exponentials,
// mean, variance, the backward's dot products) lives in an accumulator of
// type Acc — float for f16/bf16/f32 data, double when f64 is involved — and
// each output element is computed from those in Acc and rounded once on the
// store. An f16 row of 4096 values near +1000 therefore gives the same
// softmax as f32 data would, rounded to f16; f16 statistics would lose it.
//
// Layout: inputs are made contiguous, then viewed as (outer, C, inner) around
// the reduced dim. inner == 1 (the last dim) walks contiguous rows; otherwise
// blocks of kLanes adjacent "rows" are reduced together, reading each class
// slice of kLanes contiguous elements in one pass. OpenMP splits rows (or
// lane blocks) over threads; no result depends on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <mixtape/core/convert.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/shape.h>

namespace mixtape::kernels::cpu {

// Elements below which a kernel runs on one thread.
inline constexpr int64_t kParallelMin = 1 << 15;
// Adjacent rows reduced together when the reduced dim is not the last one.
inline constexpr int64_t kLanes = 64;
// Interleaved accumulators of a contiguous row sum (vectorisable, and the
// error grows like n/8 instead of n).
inline constexpr int kAccs = 8;

/// The type statistics of T data written as O are computed in: acc_dtype of the wider of the two (float, or
/// double when either is double).
template <class T, class O = T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<O, double>, double, float>;

template <class M>
M max_with_nan(M best, M v) {
  return (v != v || v > best) ? v : best;  // a NaN, once seen, stays (PyTorch's softmax gives NaN rows)
}

/// Σ f(i) for i in [0, n), in kAccs interleaved accumulators.
template <class M, class F>
M interleaved_sum(int64_t n, F&& f) {
  M r[kAccs] = {};
  int64_t i = 0;
  for (; i + kAccs <= n; i += kAccs)
    for (int j = 0; j < kAccs; ++j) r[j] += f(i + j);
  M s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) s += f(i);
  return s;
}

/// Runs body(item) for item in [0, items), over threads when `parallel`.
template <class F>
void parallel_items(int64_t items, bool parallel, F&& body) {
#pragma omp parallel for schedule(static) if (parallel && items > 1)
  for (int64_t it = 0; it < items; ++it) body(it);
}

/// Runs `add(acc)` on a zeroed opmath buffer of `n` elements, then stores it
/// into out[0, n) with one rounding. For f32/f64 the buffer is `out` itself.
template <class T, class F>
inline void accumulate_into(T* out, int64_t n, std::vector<opmath_t<T>>& scratch, F&& add) {
  using M = opmath_t<T>;
  if constexpr (std::is_same_v<T, M>) {
    std::fill(out, out + n, M(0));
    add(out);
  } else {
    scratch.assign(static_cast<size_t>(n), M(0));
    add(scratch.data());
    convert_run(scratch.data(), out, n);
  }
}

}  // namespace mixtape::kernels::cpu
