// ops/cpu/softmax.cpp — softmax and log_softmax, forward and backward, on the CPU.
//
// Rows as ops/cpu/loops.h lays them out: the max and the sum of exponentials
// in Acc (f32 for f16/bf16), every output rounded once. Outputs are freshly
// allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/scalar_math.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

namespace {

// ---- softmax ---------------------------------------------------------------------------

/// One contiguous row of C elements.
template <class T, class O, class Acc>
void softmax_row(const T* x, O* y, int64_t C, bool log) {
  Acc mx = -std::numeric_limits<Acc>::infinity();
  for (int64_t c = 0; c < C; ++c) mx = max_with_nan(mx, static_cast<Acc>(x[c]));
  const Acc s = interleaved_sum<Acc>(C, [&](int64_t c) { return math::detail::exp(static_cast<Acc>(x[c]) - mx); });
  if (log) {
    // (x − max) − log s: x − max is exact for f16/bf16 data, so the one rounding is the subtraction of log s.
    const Acc ls = math::detail::log(s);
    for (int64_t c = 0; c < C; ++c) y[c] = convert<O>((static_cast<Acc>(x[c]) - mx) - ls);
  } else {
    for (int64_t c = 0; c < C; ++c) y[c] = convert<O>(math::detail::exp(static_cast<Acc>(x[c]) - mx) / s);
  }
}

/// w <= kLanes adjacent rows: element (c, j) at x[c * inner + j].
template <class T, class O, class Acc>
void softmax_lanes(const T* x, O* y, int64_t C, int64_t inner, int64_t w, bool log) {
  Acc mx[kLanes], s[kLanes];
  for (int64_t j = 0; j < w; ++j) mx[j] = -std::numeric_limits<Acc>::infinity(), s[j] = 0;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < w; ++j) mx[j] = max_with_nan(mx[j], static_cast<Acc>(x[c * inner + j]));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < w; ++j) s[j] += math::detail::exp(static_cast<Acc>(x[c * inner + j]) - mx[j]);
  if (log) {
    for (int64_t j = 0; j < w; ++j) s[j] = math::detail::log(s[j]);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < w; ++j)
        y[c * inner + j] = convert<O>((static_cast<Acc>(x[c * inner + j]) - mx[j]) - s[j]);
  } else {
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < w; ++j)
        y[c * inner + j] = convert<O>(math::detail::exp(static_cast<Acc>(x[c * inner + j]) - mx[j]) / s[j]);
  }
}

/// Calls row(offset) for each contiguous row (inner == 1) or lanes(offset, w)
/// for each block of adjacent rows, offsets in elements of the (outer, C, inner) layout.
template <class Row, class Lanes>
void for_each_row_block(const RowLayout& L, Row&& row, Lanes&& lanes) {
  const bool parallel = L.outer * L.C * L.inner >= kParallelMin;
  if (L.inner == 1) {
    parallel_items(L.outer, parallel, [&](int64_t o) { row(o * L.C); });
    return;
  }
  const int64_t blocks = (L.inner + kLanes - 1) / kLanes;
  parallel_items(L.outer * blocks, parallel, [&](int64_t it) {
    const int64_t o = it / blocks, j0 = (it % blocks) * kLanes;
    lanes(o * L.C * L.inner + j0, std::min(kLanes, L.inner - j0));
  });
}

}  // namespace

Tensor softmax(const Tensor& x_in, int64_t dim, bool log, DType out_dtype) {
  const Tensor x = raw::contiguous(x_in);
  Tensor y = empty(x.shape(), out_dtype);
  if (x.numel() == 0) return y;
  const RowLayout L = row_layout(x.shape(), dim);
  dispatch_floating(x.dtype(), "softmax", [&](auto tx) {
    using T = typename decltype(tx)::type;
    dispatch_floating(out_dtype, "softmax", [&](auto to) {
      using O = typename decltype(to)::type;
      using Acc = acc_t<T, O>;
      const T* xp = x.data<T>();
      O* yp = y.data<O>();
      for_each_row_block(
          L, [&](int64_t off) { softmax_row<T, O, Acc>(xp + off, yp + off, L.C, log); },
          [&](int64_t off, int64_t w) { softmax_lanes<T, O, Acc>(xp + off, yp + off, L.C, L.inner, w, log); });
    });
  });
  return y;
}

Tensor softmax_backward(const Tensor& dy_in, const Tensor& y_in, int64_t dim, bool log) {
  const Tensor dy = raw::contiguous(dy_in), y = raw::contiguous(y_in);
  Tensor dx = empty(dy.shape(), dy.dtype());
  if (dy.numel() == 0) return dx;
  const RowLayout L = row_layout(dy.shape(), dim);
  dispatch_floating(dy.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const T* g = dy.data<T>();
    const T* yp = y.data<T>();
    T* out = dx.data<T>();
    auto ld = [](const T* p, int64_t i) { return static_cast<Acc>(p[i]); };
    // softmax: dx = y·(dy − Σ dy·y); log_softmax: dx = dy − exp(y)·Σ dy.
    auto row = [&](int64_t off) {
      const T *gr = g + off, *yr = yp + off;
      T* o = out + off;
      if (log) {
        const Acc s = interleaved_sum<Acc>(L.C, [&](int64_t c) { return ld(gr, c); });
        for (int64_t c = 0; c < L.C; ++c) o[c] = convert<T>(ld(gr, c) - math::detail::exp(ld(yr, c)) * s);
      } else {
        const Acc dot = interleaved_sum<Acc>(L.C, [&](int64_t c) { return ld(gr, c) * ld(yr, c); });
        for (int64_t c = 0; c < L.C; ++c) o[c] = convert<T>(ld(yr, c) * (ld(gr, c) - dot));
      }
    };
    auto lanes = [&](int64_t off, int64_t w) {
      const T *gr = g + off, *yr = yp + off;
      T* o = out + off;
      const int64_t in = L.inner;
      Acc s[kLanes] = {};
      for (int64_t c = 0; c < L.C; ++c)
        for (int64_t j = 0; j < w; ++j) s[j] += log ? ld(gr, c * in + j) : ld(gr, c * in + j) * ld(yr, c * in + j);
      for (int64_t c = 0; c < L.C; ++c)
        for (int64_t j = 0; j < w; ++j) {
          const int64_t i = c * in + j;
          o[i] = convert<T>(log ? ld(gr, i) - math::detail::exp(ld(yr, i)) * s[j] : ld(yr, i) * (ld(gr, i) - s[j]));
        }
    };
    for_each_row_block(L, row, lanes);
  });
  return dx;
}

}  // namespace mixtape::kernels::cpu
