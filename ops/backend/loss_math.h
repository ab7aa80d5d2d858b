// ops/backend/loss_math.h — the scalar formulas of the fused cross-entropy, for host and device (internal).
//
// One design idea (STYLE.md §2, as scalar_math.h): the CPU rows
// (ops/cpu/loss.cpp) and the CUDA rows (cuda/loss.cu) call these MT_HD
// functions on the same Acc values (float for f16/bf16/f32 logits, double for
// f64), so the backends differ only in how they walk a row and in the order
// they add its terms.
//
// A row's statistics are m = max_c x_c, s = Σ_c exp(x_c − m) and, with label
// smoothing, d = Σ_c (x_c − m) ≤ 0. From them, with ls = log s:
//   log p_t       = (x_t − m) − ls
//   Σ_c log p_c   = d − C·ls
//   loss          = −[(1 − ε)·log p_t + (ε/C)·Σ_c log p_c] = −[(1 − ε)·((x_t − m) − ls) + (ε/C)·d − ε·ls]
//   d loss / d x_c = exp(x_c − lse) − (1 − ε)·[c == t] − ε/C,   lse = m + ls
// Every term is a difference from the max, so logits near +1000 lose nothing
// (Σ_c x_c − C·lse would cancel catastrophically); both smoothing terms are
// ≤ 0 and add without cancellation.
#pragma once

#include <cstdint>

#include <mixtape/core/macros.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::math {

/// The per-call constants, rounded once from double on the host so both backends use the same bits.
template <class Acc>
struct CrossEntropyConsts {
  Acc hot;         // 1 − ε: the weight of the target class
  Acc eps;         // ε
  Acc eps_over_C;  // ε / C: the weight of every class
};

template <class Acc>
inline CrossEntropyConsts<Acc> cross_entropy_consts(double label_smoothing, int64_t C) {
  const double e_c = C > 0 ? label_smoothing / static_cast<double>(C) : 0.0;
  return {static_cast<Acc>(1.0 - label_smoothing), static_cast<Acc>(label_smoothing), static_cast<Acc>(e_c)};
}

/// One row's loss from xt_minus_max = x_t − m, log_sum = log s and sum_minus_max = d (read only when ε > 0).
/// A term whose weight is 0 is skipped, not multiplied: ε = 1 with x_t = −inf is +inf (the smoothing term's, as
/// Σ_c log p_c is −inf), not the NaN of 0 · −inf (PyTorch 1.13 returns that NaN).
template <class Acc>
MT_HD inline Acc cross_entropy_row_loss(Acc xt_minus_max, Acc log_sum, Acc sum_minus_max,
                                        const CrossEntropyConsts<Acc>& k) {
  Acc r = 0;
  if (k.hot != Acc(0)) r += k.hot * (xt_minus_max - log_sum);
  if (k.eps != Acc(0)) r += k.eps_over_C * sum_minus_max - k.eps * log_sum;
  return -r;
}

/// d loss / d x_c of a counted row, times the row's scale (d total / d row loss).
template <class Acc>
MT_HD inline Acc cross_entropy_grad(Acc x, Acc lse, bool is_target, Acc scale, const CrossEntropyConsts<Acc>& k) {
  Acc g = detail::exp(x - lse) - k.eps_over_C;
  if (is_target) g -= k.hot;
  return g * scale;
}

}  // namespace mixtape::math
