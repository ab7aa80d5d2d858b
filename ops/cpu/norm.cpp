// ops/cpu/norm.cpp — layer norm and batch norm, forward and backward, on the CPU.
//
// Layer norm: each row's mean and variance in Acc (f32 for f16/bf16, f64 for
// f64), kept for the backward; the parameters are read once as Acc columns;
// dweight and dbias sum over rows in Acc and round once.
// Batch norm: a channel is one task (OpenMP over channels), its N planes of
// `inner` elements summed in Acc, in a fixed order, so the result does not
// depend on the thread count. Outputs are freshly allocated and overwritten.
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

/// `t` (undefined allowed) as a contiguous Acc tensor: the per-column parameters, read once.
template <class Acc>
Tensor params_as(const Tensor& t) {
  return t.defined() ? raw::contiguous(raw::to(t, dtype_v<Acc>)) : Tensor();
}

/// Batch norm sees x as row_layout(shape, 1) = (N = L.outer, C, inner): channel c's elements are the planes
/// n·C + c of `inner` contiguous elements.
/// Σ f(n, i) over channel c's N planes of `inner` elements, in Acc: interleaved accumulators along a plane, the
/// planes in order (along N when a plane is one element, the (N, C) case).
template <class Acc, class F>
Acc channel_sum(const RowLayout& L, F&& f) {
  if (L.inner == 1) return interleaved_sum<Acc>(L.outer, [&](int64_t n) { return f(n, int64_t{0}); });
  Acc s = 0;
  for (int64_t n = 0; n < L.outer; ++n) s += interleaved_sum<Acc>(L.inner, [&](int64_t i) { return f(n, i); });
  return s;
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x_in, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps) {
  const Tensor x = raw::contiguous(x_in);
  const int64_t M = normalized_numel, rows = x.numel() / M;
  LayerNormResult r;
  r.y = empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    r.mean = empty({rows}, dtype_v<Acc>);
    r.rstd = empty({rows}, dtype_v<Acc>);
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
      Tensor sum = zeros(param_shape, dtype_v<Acc>);
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

BatchNormResult batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor x = raw::contiguous(x_in);
  const RowLayout L = row_layout(x.shape(), 1);  // (N, C, inner)
  const int64_t count = L.outer * L.inner;  // elements a channel
  const bool batch_stats = !running_mean.defined();
  BatchNormResult r;
  r.y = empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    r.mean = empty({L.C}, dtype_v<Acc>);
    r.invstd = empty({L.C}, dtype_v<Acc>);
    if (batch_stats) r.var = empty({L.C}, dtype_v<Acc>);
    const Tensor w = params_as<Acc>(weight), b = params_as<Acc>(bias);
    const Tensor rm = params_as<Acc>(running_mean), rv = params_as<Acc>(running_var);
    const Acc* wp = w.defined() ? w.template data<Acc>() : nullptr;
    const Acc* bp = b.defined() ? b.template data<Acc>() : nullptr;
    const T* xp = x.data<T>();
    T* yp = r.y.data<T>();
    Acc* mean = r.mean.data<Acc>();
    Acc* invstd = r.invstd.data<Acc>();
    Acc* var_out = batch_stats ? r.var.data<Acc>() : nullptr;
    parallel_items(L.C, x.numel() >= kParallelMin, [&](int64_t c) {
      auto at = [&](int64_t n, int64_t i) { return static_cast<Acc>(xp[(n * L.C + c) * L.inner + i]); };
      Acc mu, var;
      if (!batch_stats) {
        mu = rm.template data<Acc>()[c];
        var = rv.template data<Acc>()[c];
      } else if (count == 0) {
        mu = var = std::numeric_limits<Acc>::quiet_NaN();  // no values: as PyTorch's mean of nothing
      } else {
        // Two passes, as layer_norm's rows: the mean summed relative to the channel's first element, then the
        // squared deviations, so channels far from 0 neither grow a large sum nor cancel.
        const Acc x0 = at(0, 0);
        mu = x0 + channel_sum<Acc>(L, [&](int64_t n, int64_t i) { return at(n, i) - x0; }) / static_cast<Acc>(count);
        var = channel_sum<Acc>(L, [&](int64_t n, int64_t i) {
                const Acc d = at(n, i) - mu;
                return d * d;
              }) / static_cast<Acc>(count);  // biased: what the batch is normalised with
        var_out[c] = var;
      }
      const Acc is = Acc(1) / math::detail::sqrt(var + static_cast<Acc>(eps));
      mean[c] = mu;
      invstd[c] = is;
      // y = (x − mean)·(invstd·weight) + bias, one rounding on the store.
      const Acc scale = wp ? is * wp[c] : is, shift = bp ? bp[c] : Acc(0);
      for (int64_t n = 0; n < L.outer; ++n) {
        const T* xr = xp + (n * L.C + c) * L.inner;
        T* yr = yp + (n * L.C + c) * L.inner;
        for (int64_t i = 0; i < L.inner; ++i) yr[i] = convert<T>((static_cast<Acc>(xr[i]) - mu) * scale + shift);
      }
    });
  });
  return r;
}

BatchNormGrads batch_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& invstd_in, const Tensor& weight, bool batch_stats,
                                   bool bias_defined) {
  const Tensor dy = raw::contiguous(dy_in), x = raw::contiguous(x_in);
  const Tensor mean_t = raw::contiguous(mean_in), invstd_t = raw::contiguous(invstd_in);
  const RowLayout L = row_layout(x.shape(), 1);  // (N, C, inner)
  const int64_t count = L.outer * L.inner;
  const bool want_w = weight.defined();
  const DType param_dtype = want_w ? weight.dtype() : x.dtype();
  BatchNormGrads g;
  g.dx = empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Tensor w = params_as<Acc>(weight);
    const Acc* wp = w.defined() ? w.template data<Acc>() : nullptr;
    const T* xp = x.data<T>();
    const T* gp = dy.data<T>();
    T* dxp = g.dx.data<T>();
    const Acc* mean = mean_t.data<Acc>();
    const Acc* invstd = invstd_t.data<Acc>();
    Tensor dw_sum = zeros({L.C}, dtype_v<Acc>), db_sum = zeros({L.C}, dtype_v<Acc>);
    Acc* dw = dw_sum.data<Acc>();
    Acc* db = db_sum.data<Acc>();
    parallel_items(L.C, x.numel() >= kParallelMin, [&](int64_t c) {
      const Acc mu = mean[c], is = invstd[c];
      auto idx = [&](int64_t n, int64_t i) { return (n * L.C + c) * L.inner + i; };
      auto xhat = [&](int64_t n, int64_t i) { return (static_cast<Acc>(xp[idx(n, i)]) - mu) * is; };
      // dbias = Σ dy, dweight = Σ dy·x̂ over the channel.
      const Acc sum_dy = channel_sum<Acc>(L, [&](int64_t n, int64_t i) { return static_cast<Acc>(gp[idx(n, i)]); });
      const Acc sum_dy_xhat = channel_sum<Acc>(
          L, [&](int64_t n, int64_t i) { return static_cast<Acc>(gp[idx(n, i)]) * xhat(n, i); });
      dw[c] = sum_dy_xhat;
      db[c] = sum_dy;
      const Acc scale = wp ? is * wp[c] : is;
      // Batch statistics: dx = weight·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)); running ones are constants:
      // dx = weight·invstd·dy.
      const Acc mdy = batch_stats && count > 0 ? sum_dy / static_cast<Acc>(count) : Acc(0);
      const Acc mdyx = batch_stats && count > 0 ? sum_dy_xhat / static_cast<Acc>(count) : Acc(0);
      for (int64_t n = 0; n < L.outer; ++n)
        for (int64_t i = 0; i < L.inner; ++i) {
          const Acc d = static_cast<Acc>(gp[idx(n, i)]);
          dxp[idx(n, i)] = convert<T>(batch_stats ? scale * (d - mdy - xhat(n, i) * mdyx) : scale * d);
        }
    });
    if (want_w) g.dweight = raw::to(dw_sum, param_dtype);  // one rounding to the parameters' dtype
    if (bias_defined) g.dbias = raw::to(db_sum, param_dtype);
  });
  return g;
}

}  // namespace mixtape::kernels::cpu
