// core/strided_loop.h — walking K strided operands over one index space.
//
// Every CPU loop over tensors (copy, cast, elementwise, reductions' outer
// loops) goes through here: dims are coalesced once, then a linear range of
// elements is cut into runs along the innermost dim, so a caller can split
// [0, numel) across threads and hand each run to a tight inner loop.
#pragma once

#include <array>
#include <cstdint>

#include <mixtape/core/shape.h>

namespace mixtape {

template <int K>
struct StridedLayout {
  int ndim = 0;                                        // after coalescing; >= 1
  std::array<int64_t, Shape::kMaxDims> sizes{};        // innermost last
  std::array<std::array<int64_t, Shape::kMaxDims>, K> byte_strides{};
  int64_t numel = 1;
};

/// Builds the layout of `shape` for K operands with element `strides[k]` and
/// `itemsize[k]`, merging dims that are contiguous for every operand and dropping size-1 dims.
template <int K>
StridedLayout<K> make_strided_layout(const Shape& shape, const std::array<const Shape*, K>& strides,
                                     const std::array<int64_t, K>& itemsize) {
  StridedLayout<K> L;
  L.numel = shape.numel();
  int n = 0;
  for (int64_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (int k = 0; k < K && merge; ++k)
      merge = L.byte_strides[k][n - 1] == (*strides[k])[d] * itemsize[k] * shape[d];
    if (merge) {
      L.sizes[n - 1] *= shape[d];
      for (int k = 0; k < K; ++k) L.byte_strides[k][n - 1] = (*strides[k])[d] * itemsize[k];
    } else {
      L.sizes[n] = shape[d];
      for (int k = 0; k < K; ++k) L.byte_strides[k][n] = (*strides[k])[d] * itemsize[k];
      ++n;
    }
  }
  if (n == 0) {  // a scalar or all-ones shape: one element
    L.sizes[0] = 1;
    for (int k = 0; k < K; ++k) L.byte_strides[k][0] = 0;
    n = 1;
  }
  L.ndim = n;
  return L;
}

/// Calls `run(ptrs, inner_byte_strides, count)` for each maximal run of
/// elements along the innermost dim within the linear range [begin, end).
template <int K, class F>
void for_each_run(const StridedLayout<K>& L, const std::array<char*, K>& base, int64_t begin, int64_t end, F&& run) {
  if (begin >= end) return;
  const int nd = L.ndim;
  std::array<int64_t, Shape::kMaxDims> idx{};
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % L.sizes[d];
    rem /= L.sizes[d];
  }
  std::array<char*, K> ptr;
  for (int k = 0; k < K; ++k) {
    ptr[k] = base[k];
    for (int d = 0; d < nd; ++d) ptr[k] += idx[d] * L.byte_strides[k][d];
  }
  std::array<int64_t, K> inner;
  for (int k = 0; k < K; ++k) inner[k] = L.byte_strides[k][nd - 1];

  int64_t pos = begin;
  while (pos < end) {
    int64_t count = L.sizes[nd - 1] - idx[nd - 1];
    if (count > end - pos) count = end - pos;
    run(ptr, inner, count);
    pos += count;
    if (pos >= end) break;
    // Step to the start of the next run: carry through the outer dims.
    for (int k = 0; k < K; ++k) ptr[k] += count * inner[k];
    idx[nd - 1] += count;
    for (int d = nd - 1; d > 0 && idx[d] == L.sizes[d]; --d) {
      for (int k = 0; k < K; ++k) ptr[k] += L.byte_strides[k][d - 1] - L.sizes[d] * L.byte_strides[k][d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

}  // namespace mixtape
