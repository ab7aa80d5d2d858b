// ops/cpu/nn.cpp — softmax, log_softmax, gather/scatter_add, fused cross-entropy and layer norm on the CPU.
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
// Outputs are freshly allocated and overwritten.
#include <mixtape/ops/cpu/nn_kernels.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/core/loss_math.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/scalar_math.h>

namespace mixtape::kernels::cpu {

namespace {

// Elements below which a kernel runs on one thread.
constexpr int64_t kParallelMin = 1 << 15;
// Adjacent rows reduced together when the reduced dim is not the last one.
constexpr int64_t kLanes = 64;
// Interleaved accumulators of a contiguous row sum (vectorisable, and the
// error grows like n/8 instead of n).
constexpr int kAccs = 8;

/// The type statistics of T data written as O are computed in.
template <class T, class O = T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<O, double>, double, float>;

template <class Acc>
constexpr DType acc_dtype_v = std::is_same_v<Acc, double> ? DType::kF64 : DType::kF32;

/// x viewed as (outer, C, inner) around `dim` (a 0-d tensor is one row of one element).
struct RowLayout {
  int64_t outer = 1, C = 1, inner = 1;
};
RowLayout row_layout(const Shape& shape, int64_t dim) {
  RowLayout L;
  if (shape.empty()) return L;
  for (int64_t d = 0; d < dim; ++d) L.outer *= shape[d];
  L.C = shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) L.inner *= shape[d];
  return L;
}

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

// ---- layer norm ------------------------------------------------------------------------

/// `t` (undefined allowed) as a contiguous Acc tensor: the per-column parameters, read once.
template <class Acc>
Tensor params_as(const Tensor& t) {
  return t.defined() ? raw::contiguous(raw::to(t, acc_dtype_v<Acc>)) : Tensor();
}

}  // namespace

// ---- softmax ---------------------------------------------------------------------------

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

// ---- gather / scatter_add ----------------------------------------------------------------

namespace {

/// Throws when an index value is outside [0, size) (index is contiguous kI64).
void check_indices(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  const int64_t* p = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i)
    MT_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " is out of bounds for dim ", dim, " of size ", size,
             " (index shape ", index.shape(), ")");
}

/// `strides` with the entry of `dim` zeroed: a pointer built from them lands
/// on coordinate 0 along dim, and the index value adds the rest.
Shape without_dim(const Shape& strides, int64_t dim) {
  Shape s = strides;
  if (!s.empty()) s[dim] = 0;
  return s;
}

template <int N>
struct Bytes {
  unsigned char b[N];
};

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index_in) {
  const Tensor index = raw::contiguous(index_in);
  Tensor out = empty(index.shape(), x.dtype());
  if (out.numel() == 0) return out;
  const int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  check_indices("gather", index, dim, size);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim) * static_cast<int64_t>(x.itemsize());
  const Shape x_strides = without_dim(x.strides(), dim);
  const auto item = static_cast<int64_t>(x.itemsize());
  const auto L = make_strided_layout<3>(index.shape(), {&out.strides(), &index.strides(), &x_strides},
                                        {item, static_cast<int64_t>(sizeof(int64_t)), item});
  const std::array<char*, 3> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(index.data_ptr()),
                                  static_cast<char*>(x.data_ptr())};
  // A copy of itemsize bytes: gather moves elements of any dtype without converting them.
  auto copy_runs = [&](auto bytes_tag) {
    using E = decltype(bytes_tag);
    auto run = [&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        std::memcpy(p[0] + i * s[0], p[2] + i * s[2] + k * step, sizeof(E));
      }
    };
    const int64_t chunks = (L.numel + kParallelMin - 1) / kParallelMin;
    parallel_items(chunks, chunks > 1, [&](int64_t c) {
      for_each_run<3>(L, base, c * kParallelMin, std::min(L.numel, (c + 1) * kParallelMin), run);
    });
  };
  switch (item) {
    case 1: copy_runs(Bytes<1>{}); break;
    case 2: copy_runs(Bytes<2>{}); break;
    case 4: copy_runs(Bytes<4>{}); break;
    default: copy_runs(Bytes<8>{}); break;
  }
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index_in, const Tensor& src) {
  const Tensor index = raw::contiguous(index_in);
  Tensor out = zeros(shape, src.dtype());
  if (index.numel() == 0) return out;
  const int64_t size = shape.empty() ? 1 : shape[dim];
  check_indices("scatter_add", index, dim, size);
  dispatch_floating(src.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = opmath_t<T>;
    // Sums in Acc, rounded once: colliding indices do not round after every add.
    std::vector<Acc> acc(static_cast<size_t>(shape.numel()), Acc(0));
    const Shape acc_strides = without_dim(contiguous_strides(shape), dim);
    const int64_t step = shape.empty() ? 0 : contiguous_strides(shape)[dim] * static_cast<int64_t>(sizeof(Acc));
    const auto L = make_strided_layout<3>(index.shape(), {&src.strides(), &index.strides(), &acc_strides},
                                          {static_cast<int64_t>(sizeof(T)), static_cast<int64_t>(sizeof(int64_t)),
                                           static_cast<int64_t>(sizeof(Acc))});
    const std::array<char*, 3> base{static_cast<char*>(src.data_ptr()), static_cast<char*>(index.data_ptr()),
                                    reinterpret_cast<char*>(acc.data())};
    // One thread: different index elements may add into the same slot.
    auto run = [&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        const T v = *reinterpret_cast<const T*>(p[0] + i * s[0]);
        *reinterpret_cast<Acc*>(p[2] + i * s[2] + k * step) += static_cast<Acc>(v);
      }
    };
    for_each_run<3>(L, base, 0, L.numel, run);
    T* o = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) o[i] = convert<T>(acc[i]);
  });
  return out;
}

// ---- fused cross-entropy -------------------------------------------------------------------

namespace {

/// Throws unless every target (contiguous kI64) is a class in [0, C) or ignore_index.
void check_class_targets(const char* op, const Tensor& target, int64_t C, int64_t ignore_index) {
  const int64_t* p = target.data<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i)
    MT_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < C), op, ": target value ", p[i], " (at row ", i,
             ") is out of range for ", C, " classes; expected a class index in [0, ", C, ") or ignore_index ",
             ignore_index);
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target_in, int64_t ignore_index,
                                 double label_smoothing) {
  const Tensor x = raw::contiguous(logits), target = raw::contiguous(target_in);
  const int64_t rows = x.size(0), C = x.size(1);
  const DType A = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  CrossEntropyResult r{empty({rows}, A), empty({rows}, A), empty({}, A), empty({}, A), empty({}, A)};
  check_class_targets("cross_entropy", target, C, ignore_index);
  dispatch_floating(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const math::CrossEntropyConsts<Acc> k = math::cross_entropy_consts<Acc>(label_smoothing, C);
    const T* xp = x.data<T>();
    const int64_t* tp = target.data<int64_t>();
    Acc* loss = r.loss.data<Acc>();
    Acc* lse = r.lse.data<Acc>();
    parallel_items(rows, rows * C >= kParallelMin, [&](int64_t i) {
      const T* xr = xp + i * C;
      auto ld = [xr](int64_t c) { return static_cast<Acc>(xr[c]); };
      Acc mx = -std::numeric_limits<Acc>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = max_with_nan(mx, ld(c));
      const Acc s = interleaved_sum<Acc>(C, [&](int64_t c) { return math::detail::exp(ld(c) - mx); });
      const Acc d = k.eps != Acc(0) ? interleaved_sum<Acc>(C, [&](int64_t c) { return ld(c) - mx; }) : Acc(0);
      const Acc ls = math::detail::log(s);
      lse[i] = mx + ls;
      // A select, not a product: an ignored row of −inf logits gives 0, not NaN.
      loss[i] = tp[i] == ignore_index ? Acc(0) : math::cross_entropy_row_loss(ld(tp[i]) - mx, ls, d, k);
    });
    // The reductions, in the order of the rows (the sum as every CPU sum: interleaved accumulators).
    const Acc sum = interleaved_sum<Acc>(rows, [&](int64_t i) { return loss[i]; });
    int64_t counted = 0;
    for (int64_t i = 0; i < rows; ++i) counted += tp[i] != ignore_index;
    *r.sum.data<Acc>() = sum;
    *r.count.data<Acc>() = static_cast<Acc>(counted);
    *r.mean.data<Acc>() = sum / static_cast<Acc>(counted);
  });
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target_in, const Tensor& lse_in,
                              const Tensor& row_scale_in, int64_t ignore_index, double label_smoothing,
                              const Tensor& divisor) {
  const Tensor x = raw::contiguous(logits), target = raw::contiguous(target_in);
  // The scale widened to the acc dtype (exact), as the CUDA kernel reads it.
  const Tensor lse = raw::contiguous(lse_in), row_scale = raw::contiguous(raw::to(row_scale_in, lse_in.dtype()));
  Tensor dx = empty(x.shape(), x.dtype());
  const int64_t rows = x.size(0), C = x.size(1);
  if (dx.numel() == 0) return dx;
  check_class_targets("cross_entropy_backward", target, C, ignore_index);
  const int64_t scale_step = row_scale.numel() == 1 ? 0 : 1;
  dispatch_floating(x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const math::CrossEntropyConsts<Acc> k = math::cross_entropy_consts<Acc>(label_smoothing, C);
    const T* xp = x.data<T>();
    const int64_t* tp = target.data<int64_t>();
    const Acc* lp = lse.data<Acc>();
    const Acc* wp = row_scale.data<Acc>();
    const Acc div = divisor.defined() ? *divisor.data<Acc>() : Acc(1);
    T* out = dx.data<T>();
    parallel_items(rows, rows * C >= kParallelMin, [&](int64_t i) {
      const T* xr = xp + i * C;
      T* o = out + i * C;
      const int64_t t = tp[i];
      if (t == ignore_index) {  // 0 whatever the row's scale and logits (0 · NaN would not be)
        std::fill(o, o + C, convert<T>(Acc(0)));
        return;
      }
      const Acc l = lp[i], w = divisor.defined() ? wp[i * scale_step] / div : wp[i * scale_step];
      for (int64_t c = 0; c < C; ++c) o[c] = convert<T>(math::cross_entropy_grad(static_cast<Acc>(xr[c]), l, c == t, w, k));
    });
  });
  return dx;
}

// ---- layer norm ------------------------------------------------------------------------

LayerNormResult layer_norm(const Tensor& x_in, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps) {
  const Tensor x = raw::contiguous(x_in);
  const int64_t M = normalized_numel, rows = x.numel() / M;
  LayerNormResult r;
  r.y = empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    r.mean = empty({rows}, acc_dtype_v<Acc>);
    r.rstd = empty({rows}, acc_dtype_v<Acc>);
    if (rows == 0) return;
    const Tensor w = params_as<Acc>(weight), b = params_as<Acc>(bias);
    const Acc* wp = w.defined() ? w.template data<Acc>() : nullptr;
    const Acc* bp = b.defined() ? b.template data<Acc>() : nullptr;
    const T* xp = x.data<T>();
    T* yp = r.y.data<T>();
    Acc* mean = r.mean.data<Acc>();
    Acc* rstd = r.rstd.data<Acc>();
    parallel_items(rows, x.numel() >= kParallelMin, [&](int64_t i) {
      const T* xr = xp + i * M;
      T* yr = yp + i * M;
      // Two passes (mean, then squared deviations), the mean summed relative to
      // the row's first element: a row far from 0 (f16 values near 1000) has
      // neither a large running sum nor cancellation.
      const Acc x0 = static_cast<Acc>(xr[0]);
      const Acc mu =
          x0 + interleaved_sum<Acc>(M, [&](int64_t j) { return static_cast<Acc>(xr[j]) - x0; }) / static_cast<Acc>(M);
      const Acc var = interleaved_sum<Acc>(M, [&](int64_t j) {
                        const Acc d = static_cast<Acc>(xr[j]) - mu;
                        return d * d;
                      }) / static_cast<Acc>(M);  // biased, like PyTorch
      const Acc rs = Acc(1) / math::detail::sqrt(var + static_cast<Acc>(eps));
      mean[i] = mu;
      rstd[i] = rs;
      for (int64_t j = 0; j < M; ++j) {
        Acc v = (static_cast<Acc>(xr[j]) - mu) * rs;
        if (wp) v *= wp[j];
        if (bp) v += bp[j];
        yr[j] = convert<T>(v);
      }
    });
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& rstd_in, const Tensor& weight, bool bias_defined) {
  const Tensor dy = raw::contiguous(dy_in), x = raw::contiguous(x_in);
  const Tensor mean_t = raw::contiguous(mean_in), rstd_t = raw::contiguous(rstd_in);
  const int64_t rows = mean_t.numel(), M = rows == 0 ? 1 : x.numel() / rows;
  LayerNormGrads g;
  g.dx = empty(x.shape(), x.dtype());
  const bool want_w = weight.defined();
  const DType param_dtype = want_w ? weight.dtype() : x.dtype();
  const Shape param_shape = want_w ? weight.shape() : Shape{M};
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Tensor w = params_as<Acc>(weight);
    const Acc* wp = w.defined() ? w.template data<Acc>() : nullptr;
    const T* xp = x.data<T>();
    const T* gp = dy.data<T>();
    const Acc* mean = mean_t.data<Acc>();
    const Acc* rstd = rstd_t.data<Acc>();
    T* dxp = g.dx.data<T>();

    // dweight/dbias sum over rows: fixed chunks of rows give partials that
    // are added in chunk order, so the result does not depend on the thread count.
    const bool want_params = want_w || bias_defined;
    const int64_t rows_per_chunk = std::max<int64_t>(16, kParallelMin / M);
    const int64_t chunks = want_params ? (rows + rows_per_chunk - 1) / rows_per_chunk : 0;
    std::vector<Acc> dw_part(static_cast<size_t>(want_w ? chunks * M : 0), Acc(0));
    std::vector<Acc> db_part(static_cast<size_t>(bias_defined ? chunks * M : 0), Acc(0));

    auto do_row = [&](int64_t i, Acc* dw, Acc* db) {
      const T *xr = xp + i * M, *gr = gp + i * M;
      T* dxr = dxp + i * M;
      const Acc mu = mean[i], rs = rstd[i];
      auto xhat = [&](int64_t j) { return (static_cast<Acc>(xr[j]) - mu) * rs; };
      auto gw = [&](int64_t j) { return wp ? static_cast<Acc>(gr[j]) * wp[j] : static_cast<Acc>(gr[j]); };
      // dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · weight.
      const Acc mg = interleaved_sum<Acc>(M, gw) / static_cast<Acc>(M);
      const Acc mgx = interleaved_sum<Acc>(M, [&](int64_t j) { return gw(j) * xhat(j); }) / static_cast<Acc>(M);
      for (int64_t j = 0; j < M; ++j) dxr[j] = convert<T>(rs * (gw(j) - mg - xhat(j) * mgx));
      if (dw)
        for (int64_t j = 0; j < M; ++j) dw[j] += static_cast<Acc>(gr[j]) * xhat(j);
      if (db)
        for (int64_t j = 0; j < M; ++j) db[j] += static_cast<Acc>(gr[j]);
    };
    const bool parallel = x.numel() >= kParallelMin;
    if (!want_params) {
      parallel_items(rows, parallel, [&](int64_t i) { do_row(i, nullptr, nullptr); });
      return;
    }
    parallel_items(chunks, parallel, [&](int64_t c) {
      Acc* dw = want_w ? dw_part.data() + c * M : nullptr;
      Acc* db = bias_defined ? db_part.data() + c * M : nullptr;
      for (int64_t i = c * rows_per_chunk; i < std::min(rows, (c + 1) * rows_per_chunk); ++i) do_row(i, dw, db);
    });
    // Partials in chunk order, rounded once to the parameters' dtype.
    auto finish = [&](const std::vector<Acc>& part) {
      Tensor sum = zeros(param_shape, acc_dtype_v<Acc>);
      Acc* s = sum.data<Acc>();
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t j = 0; j < M; ++j) s[j] += part[static_cast<size_t>(c * M + j)];
      return raw::to(sum, param_dtype);
    };
    if (want_w) g.dweight = finish(dw_part);
    if (bias_defined) g.dbias = finish(db_part);
  });
  // No rows: the parameter gradients are zeros.
  if (want_w && !g.dweight.defined()) g.dweight = zeros(param_shape, param_dtype);
  if (bias_defined && !g.dbias.defined()) g.dbias = zeros(param_shape, param_dtype);
  return g;
}

}  // namespace mixtape::kernels::cpu
