// ops/cpu/loss.cpp — the fused cross-entropy, forward and backward, on the CPU.
//
// One pass over each row of (rows, C) logits, its statistics (max, Σ exp,
// the smoothing sum) in Acc and the formulas of ops/backend/loss_math.h, the
// very ones the CUDA rows use. Targets are checked here (a CPU pass can throw
// where the GPU's cannot). Outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/loss_math.h>
#include <mixtape/ops/backend/scalar_math.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

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
  const DType A = acc_dtype(x.dtype());
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

}  // namespace mixtape::kernels::cpu
