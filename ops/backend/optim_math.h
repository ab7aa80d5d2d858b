// ops/backend/optim_math.h — the per-element update of every optimizer, for host and device (internal).
//
// One design idea (STYLE.md §2): ops/cpu/optim.cpp and cuda/optim.cu call these MT_HD functions for each element,
// so the two backends differ only in how they walk memory, never in the arithmetic. The formulas are torch.optim's
// single-tensor ones (sgd.py, adam.py, adamw.py), op for op and in the same order, each PyTorch in-place op one
// rounding here in opmath (f32 for f16/bf16/f32 data, f64 for f64): an f32 update is PyTorch's to an ulp or so. The
// scalars PyTorch computes in Python (1 − dampening, the bias corrections, 1 − lr·weight_decay) are computed in
// double once per tensor (sgd_coeffs, adam_coeffs: on the host, or in the kernel when the update count lives on the
// device, with the same bits) and rounded to opmath, as PyTorch's scalar arguments are. Products and sums go through
// mul/add, which in device code forbid nvcc's contraction into an FMA: the CUDA kernels give the CPU's bits.
//
// Where the parameter lives (kernels.h, MT_KERNELS_OPTIM): in the parameter itself (Store::kNearest), in an f32
// master that is written back rounded to nearest (Store::kMaster), or in a bf16 parameter that receives the f32
// result rounded stochastically (Store::kStochastic). Stochastic rounding adds 16 random bits to the f32 pattern
// and truncates to bf16: a value x between neighbours lo < x < hi becomes hi with probability (x − lo) / (hi − lo),
// so E[result] = x and updates far below bf16's resolution still move the weight on average (llm.c's scheme). The
// 16 bits are the top of SplitMix64 (Steele et al., 2014) at counter `element + 1` of a stream whose key hashes
// (seed, step, parameter index): a pure function of those four numbers, so the CPU and CUDA round alike, any
// thread count gives the same bits, and a run is reproducible from its seed.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <mixtape/core/dtype.h>
#include <mixtape/core/half.h>
#include <mixtape/core/macros.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::optim_math {

// ---- one rounding per operation ------------------------------------------------------------

MT_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MT_HD inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MT_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MT_HD inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// ---- stochastic rounding ---------------------------------------------------------------------

/// SplitMix64's output function: a bijective mix of 64 bits.
MT_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// SplitMix64's increment (2^64 / φ, odd).
inline constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

/// The key of one parameter's stochastic rounding at one step: the stream its elements' bits are drawn from.
MT_HD inline uint64_t rounding_key(uint64_t seed, int64_t step, int64_t index) {
  const uint64_t at_step = mix64(mix64(seed) + static_cast<uint64_t>(step) * kGamma);
  return mix64(at_step + static_cast<uint64_t>(index) * kGamma);
}

/// The 16 random bits of element `element` (its row-major position in the parameter) under `key`.
MT_HD inline uint32_t rounding_bits(uint64_t key, int64_t element) {
  return static_cast<uint32_t>(mix64(key + static_cast<uint64_t>(element + 1) * kGamma) >> 48);
}

/// x rounded to a neighbouring bf16 value, up (in magnitude) with probability equal to x's distance from the lower
/// one in units of their spacing (bits16 uniform in [0, 2^16)). NaN takes the nearest rounding's NaN rule; ±inf and
/// values bf16 holds exactly are kept; a value past bf16's largest finite one may round to inf.
MT_HD inline BFloat16 round_stochastic(float x, uint32_t bits16) {
  if (x != x) return BFloat16(x);
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  return BFloat16::from_bits(static_cast<uint16_t>((bits + bits16) >> 16));
}

// ---- where the parameter lives -----------------------------------------------------------------

enum class Store {
  kNearest,     // the parameter holds the value, updated in its dtype
  kMaster,      // an f32 master holds it; the parameter receives it rounded to nearest
  kStochastic,  // a bf16 parameter holds it and receives the f32 result rounded stochastically
};

/// Calls f(TypeTag<T>, TypeTag<S>, std::integral_constant<Store, ...>) for a parameter of an optimizer step's list
/// (host code): its dtype T, its state's S and where its value lives (kernels.h, MT_KERNELS_OPTIM).
template <class F>
void dispatch_store(DType param, bool has_master, bool stochastic_rounding, const char* kernel, F&& f) {
  dispatch_floating(param, kernel, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      if (has_master) return f(tag, TypeTag<float>{}, std::integral_constant<Store, Store::kMaster>{});
      if constexpr (std::is_same_v<T, BFloat16>)
        if (stochastic_rounding) return f(tag, TypeTag<float>{}, std::integral_constant<Store, Store::kStochastic>{});
    }
    return f(tag, tag, std::integral_constant<Store, Store::kNearest>{});
  });
}

/// The element conversions of the CUDA kernels: core's convert (the hardware's on the device). The CPU loop passes
/// its own branch-free ones (ops/cpu/optim.cpp), which give the same bits and vectorise.
struct CoreConvert {
  template <class To, class From>
  MT_HD static To to(From v) {
    return convert<To>(v);
  }
};

/// The value an element's update starts from.
template <Store kStore, class Cvt, class T, class M>
MT_HD inline M load_param(const T* param, const float* master) {
  if constexpr (kStore == Store::kMaster) return *master;
  else return Cvt::template to<M>(*param);
}

/// Stores the updated value p of element `element` (its row-major position: stochastic rounding's counter).
template <Store kStore, class Cvt, class T, class M>
MT_HD inline void store_param(T* param, float* master, M p, uint64_t key, int64_t element) {
  if constexpr (kStore == Store::kMaster) {
    *master = p;
    *param = Cvt::template to<T>(p);
  } else if constexpr (kStore == Store::kStochastic) {
    static_assert(std::is_same_v<T, BFloat16> && std::is_same_v<M, float>, "stochastic rounding is f32 -> bf16");
    *param = round_stochastic(p, rounding_bits(key, element));
  } else {
    *param = Cvt::template to<T>(p);
  }
}

// ---- SGD --------------------------------------------------------------------------------------
//
// The update functions compute both sides of each option and select one (select(c.maximize, -g, g)) rather than
// branch, so the CPU loop vectorises; the options are the same for every element of a tensor, so the selects cost
// a few instructions, not memory traffic.

/// take_a ? a : b. On the host as a bit mask: both operands are then used whatever the condition, so GCC cannot sink
/// the arithmetic of one into a branch, where -ftrapping-math (the default) forbids if-converting it back and the
/// loop stays scalar.
template <class M>
MT_HD inline M select(bool take_a, M a, M b) {
#if defined(__CUDA_ARCH__)
  return take_a ? a : b;
#else
  using U = std::conditional_t<sizeof(M) == 8, uint64_t, uint32_t>;
  const U mask = U{0} - static_cast<U>(take_a);
  return __builtin_bit_cast(M, (__builtin_bit_cast(U, a) & mask) | (__builtin_bit_cast(U, b) & ~mask));
#endif
}

/// max(a, b) propagating a NaN from either side (torch.maximum).
template <class M>
MT_HD inline M maximum(M a, M b) {
  return select(a > b || a != a, a, b);
}

/// One parameter's SGD scalars in opmath M.
template <class M>
struct SgdCoeffs {
  M lr, momentum, one_minus_dampening, weight_decay;
  bool decay_grad;  // weight_decay != 0
  bool nesterov, maximize, first_momentum;
};

template <class M>
MT_HD inline SgdCoeffs<M> sgd_coeffs(const kernels::SgdHyper& h, bool first_momentum) {
  return {static_cast<M>(h.lr),
          static_cast<M>(h.momentum),
          static_cast<M>(add(1.0, -h.dampening)),
          static_cast<M>(h.weight_decay),
          h.weight_decay != 0,
          h.nesterov,
          h.maximize,
          first_momentum};
}

/// torch.optim.SGD on one element: returns the new parameter; with kMomentum (momentum != 0) updates the momentum
/// buffer `buf`:  d = ±g (+ wd·p); buf = d on its first step, else momentum·buf + (1 − dampening)·d;
/// d = nesterov ? d + momentum·buf : buf; then p − lr·d.
template <bool kMomentum, class M>
MT_HD inline M sgd_update(M p, M g, M& buf, const SgdCoeffs<M>& c) {
  M d = select(c.maximize, -g, g);
  const M d_decayed = add(d, mul(c.weight_decay, p));  // d_p.add(param, alpha=weight_decay)
  d = select(c.decay_grad, d_decayed, d);
  if constexpr (kMomentum) {
    const M buf_decayed = add(mul(buf, c.momentum), mul(c.one_minus_dampening, d));  // buf.mul_(m).add_(d_p, 1-damp)
    buf = select(c.first_momentum, d, buf_decayed);                                    // clone(d_p) on its first step
    const M d_nesterov = add(d, mul(c.momentum, buf));                                // d_p.add(buf, alpha=momentum)
    d = select(c.nesterov, d_nesterov, buf);
  }
  return add(p, mul(-c.lr, d));  // param.add_(d_p, alpha=-lr)
}

// ---- Adam and AdamW ---------------------------------------------------------------------------------

/// One parameter's Adam scalars in opmath M, with its bias corrections at its step.
template <class M>
struct AdamCoeffs {
  M beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  M decay;                  // AdamW: 1 − lr·weight_decay
  M neg_step_size;          // −lr / (1 − beta1^step)
  M bias_correction2_sqrt;  // √(1 − beta2^step)
  bool decay_grad;          // Adam with weight_decay != 0: g += weight_decay·p
  bool decay_param;         // AdamW: p *= 1 − lr·weight_decay
  bool maximize;
};

/// base^exponent (exponent >= 0) by repeated squaring, each product rounded once: the same bits on the host and on
/// a GPU (whose pow is not correctly rounded, where glibc's is). Within a few ulps of pow for the counts of training
/// runs: the f32 coefficients made from it are pow's but for a rounding tie once in ~10^8.
MT_HD inline double power(double base, int64_t exponent) {
  double result = 1.0;
  while (exponent > 0) {
    if (exponent & 1) result = mul(result, base);
    base = mul(base, base);
    exponent >>= 1;
  }
  return result;
}

/// sqrt in double, correctly rounded on both sides (IEEE's sqrt; CUDA's double sqrt is too).
MT_HD inline double sqrt_rn(double x) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

/// a / b in double, correctly rounded on both sides.
MT_HD inline double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

/// Adam's scalars at update `step` (>= 1), computed in double and rounded to M: on the host from a count it knows,
/// or in a kernel from a count in device memory (the sync-free step), with the same bits.
template <class M>
MT_HD inline AdamCoeffs<M> adam_coeffs(const kernels::AdamHyper& h, int64_t step) {
  const double bias_correction1 = add(1.0, -power(h.beta1, step));
  const double bias_correction2 = add(1.0, -power(h.beta2, step));
  return {static_cast<M>(h.beta1),
          static_cast<M>(h.beta2),
          static_cast<M>(add(1.0, -h.beta1)),
          static_cast<M>(add(1.0, -h.beta2)),
          static_cast<M>(h.eps),
          static_cast<M>(h.weight_decay),
          static_cast<M>(add(1.0, -mul(h.lr, h.weight_decay))),
          static_cast<M>(-div_rn(h.lr, bias_correction1)),
          static_cast<M>(sqrt_rn(bias_correction2)),
          !h.decoupled_weight_decay && h.weight_decay != 0,
          h.decoupled_weight_decay,
          h.maximize};
}

/// torch.optim.Adam (AdamW when c.decay_param) on one element: returns the new parameter, updates exp_avg m,
/// exp_avg_sq v and, with kAmsgrad, max_exp_avg_sq vmax:  g = ±g; Adam: g += wd·p; AdamW: p *= 1 − lr·wd;
/// m = beta1·m + (1 − beta1)·g; v = beta2·v + (1 − beta2)·g·g; vmax = max(vmax, v);
/// then p − step_size · m / (√(v or vmax) / √bias_correction2 + eps).
template <bool kAmsgrad, class M>
MT_HD inline M adam_update(M p, M g, M& m, M& v, M& vmax, const AdamCoeffs<M>& c) {
  g = select(c.maximize, -g, g);
  const M g_decayed = add(g, mul(c.weight_decay, p));  // grad.add(param, alpha=weight_decay)
  const M p_decayed = mul(p, c.decay);                 // param.mul_(1 - lr * weight_decay)
  g = select(c.decay_grad, g_decayed, g);
  p = select(c.decay_param, p_decayed, p);
  m = add(mul(m, c.beta1), mul(c.one_minus_beta1, g));          // exp_avg.mul_(beta1).add_(grad, alpha=1-beta1)
  v = add(mul(v, c.beta2), mul(mul(c.one_minus_beta2, g), g));  // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
  M second = v;
  if constexpr (kAmsgrad) {
    vmax = maximum(vmax, v);  // torch.maximum(max_exp_avg_sq, exp_avg_sq)
    second = vmax;
  }
  const M denom = add(math::detail::sqrt(second) / c.bias_correction2_sqrt, c.eps);  // (sqrt / bc2_sqrt).add_(eps)
  return add(p, mul(c.neg_step_size, m) / denom);  // param.addcdiv_(exp_avg, denom, value=-step_size)
}

}  // namespace mixtape::optim_math
