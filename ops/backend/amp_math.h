// ops/backend/amp_math.h — the scalar formulas of the loss scaler and of gradient clipping, for host and device
// (internal).
//
// One design idea (STYLE.md §2): the CPU loops (ops/cpu/foreach.cpp) and the CUDA kernels (cuda/foreach.cu) call
// these MT_HD functions, so the two backends differ only in how they walk memory: the scale's state machine is the
// same branch on both, and a norm is the same per-element term, the same combination of partial results and the
// same final root. M is the opmath type (float, or double for f64 data).
#pragma once

#include <cstdint>

#include <mixtape/core/macros.h>

namespace mixtape::math {

/// Finite (neither inf nor NaN), without the host-only std:: overload set: x − x is 0 exactly for finite x.
template <class M>
MT_HD inline bool finite(M x) {
  return x - x == M(0);
}

/// Whether the in-place passes over gradients (the unscale, foreach_mul_) write x · factor over the element x holds
/// (v: its value in opmath): every element but a NaN, which keeps its bits. A GPU's f32 multiply returns its one
/// canonical NaN and the CPU's the input's payload, so only an untouched NaN is the same on both backends (and a NaN
/// times anything is NaN anyway).
template <class M>
MT_HD inline bool rescales(M v) {
  return v == v;
}

/// PyTorch's _amp_update_scale_ on one scale and tracker (AmpKernels.cu's rules). The products are formed in
/// double, as there (float · double), and rounded once to the f32 scale.
MT_HD inline void amp_update_scale(float& scale, int32_t& growth_tracker, float found_inf, double growth_factor,
                                   double backoff_factor, int32_t growth_interval) {
  if (found_inf != 0.0f) {  // NaN counts as found, as in C++'s `if (*found_inf)`
    scale = static_cast<float>(static_cast<double>(scale) * backoff_factor);
    growth_tracker = 0;
    return;
  }
  const int32_t successful = growth_tracker + 1;  // this step was a successful one
  if (successful == growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale) * growth_factor);
    if (finite(grown)) scale = grown;  // never grow past f32's range to inf
    growth_tracker = 0;
  } else {
    growth_tracker = successful;
  }
}

/// Which formula a norm of order `ord` uses; kP is the general |x|^p.
enum class NormKind : uint8_t { kOne, kTwo, kInf, kP };

inline NormKind norm_kind(double ord) {
  if (ord == 1.0) return NormKind::kOne;
  if (ord == 2.0) return NormKind::kTwo;
  if (ord > 1.7976931348623157e308) return NormKind::kInf;
  return NormKind::kP;
}

namespace detail {
MT_HD inline float abs_(float x) { return ::fabsf(x); }
MT_HD inline double abs_(double x) { return ::fabs(x); }
MT_HD inline float sqrt_(float x) { return ::sqrtf(x); }
MT_HD inline double sqrt_(double x) { return ::sqrt(x); }
MT_HD inline float pow_(float x, float y) { return ::powf(x, y); }
MT_HD inline double pow_(double x, double y) { return ::pow(x, y); }
}  // namespace detail

/// One element's contribution to a norm: |x|, x², |x| (for the max), |x|^p.
template <NormKind K, class M>
MT_HD inline M norm_term(M x, M p) {
  if constexpr (K == NormKind::kTwo) return x * x;
  else if constexpr (K == NormKind::kP) return detail::pow_(detail::abs_(x), p);
  else return detail::abs_(x);
}

/// Two partial results combined: a sum, or for the inf-norm a max that keeps a NaN once seen (torch.max).
template <NormKind K, class M>
MT_HD inline M norm_combine(M a, M b) {
  if constexpr (K == NormKind::kInf) return (b != b || b > a) ? b : a;
  else return a + b;
}

/// The norm from the combined terms: the sum, its square root, the max, the sum^(1/p).
template <NormKind K, class M>
MT_HD inline M norm_finish(M acc, M p) {
  if constexpr (K == NormKind::kTwo) return detail::sqrt_(acc);
  else if constexpr (K == NormKind::kP) return detail::pow_(acc, M(1) / p);
  else return acc;
}

/// min(max(x, lo), hi) with NaN kept (torch.clamp); lo <= hi.
template <class M>
MT_HD inline M clamp(M x, M lo, M hi) {
  if (x != x) return x;
  return x < lo ? lo : (x > hi ? hi : x);
}

}  // namespace mixtape::math
