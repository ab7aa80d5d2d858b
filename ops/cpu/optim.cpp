// ops/cpu/optim.cpp — the optimizer step kernels on the CPU: SGD, Adam and AdamW over a list of parameters.
//
// One pass over each parameter: its gradient, state buffers, master and the parameter itself walked together with
// the strided loops of core/strided_loop.h (any layouts), each element loaded once, updated by the formula of
// ops/backend/optim_math.h and stored once. The element types, where the parameter lives (optim_math::Store) and
// whether the optional buffer exists are template parameters, so each combination is one tight loop; a run whose
// operands are all contiguous takes a loop over plain arrays, which the compiler vectorises (f16/bf16 parameters
// with masters in blocks: widen the gradients, the f32 update, round into the parameters). Large tensors are cut
// into fixed chunks spread over OpenMP threads; no result depends on the thread count (stochastic rounding keys on
// the element's position, not on the thread).
//
// Vectorising Adam's loop needs -fno-math-errno for this file: with errno, GCC guards every √ with a branch to the
// library call that would set it, and the branch keeps the loop scalar (4x slower in f32; bench/RESULTS.md).
// Nothing reads errno, and √'s value is the same IEEE-rounded one either way.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <mixtape/core/convert.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/optim_math.h>
#include <mixtape/ops/cpu/cpu_features.h>
#include <mixtape/ops/cpu/loops.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MT_OPTIM_F16C 1
#endif

namespace mixtape::kernels::cpu {

namespace {

using optim_math::dispatch_store;
using optim_math::Store;

/// The operands of one parameter's update, in this order; absent ones (no master, no optional buffer) are null.
enum Slot : int { kParam, kGrad, kState0, kState1, kState2, kMaster, kSlots };

/// Elements a thread takes at a time from a large tensor: a multiple of every vector width, so chunks stay aligned.
constexpr int64_t kChunk = int64_t{1} << 16;

/// Calls run(ptrs, byte_strides, count, first_element) for each run of elements of `param`'s shape walked over the
/// operands `ts` (null entries are absent: no address, stride 0), chunks of a large tensor in parallel.
template <class Run>
void walk(const std::array<const Tensor*, kSlots>& ts, Run&& run) {
  const Tensor& param = *ts[kParam];
  std::array<const Shape*, kSlots> strides;
  std::array<int64_t, kSlots> itemsizes;
  std::array<char*, kSlots> base;
  for (int k = 0; k < kSlots; ++k) {
    const bool present = ts[k] != nullptr;
    strides[k] = present ? &ts[k]->strides() : &param.strides();
    itemsizes[k] = present ? static_cast<int64_t>(ts[k]->itemsize()) : 0;
    base[k] = present ? static_cast<char*>(ts[k]->data_ptr()) : nullptr;
  }
  const StridedLayout<kSlots> L = make_strided_layout<kSlots>(param.shape(), strides, itemsizes);
  const int64_t chunks = (L.numel + kChunk - 1) / kChunk;
  parallel_items(chunks, L.numel >= kParallelMin, [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(L.numel, begin + kChunk);
    int64_t element = begin;
    for_each_run<kSlots>(L, base, begin, end,
                         [&](const std::array<char*, kSlots>& p, const std::array<int64_t, kSlots>& s, int64_t n) {
                           const bool contiguous = std::equal(s.begin(), s.end(), itemsizes.begin());
                           run(p, s, n, element, contiguous);
                           element += n;
                         });
  });
}

// ---- element conversions that vectorise ---------------------------------------------------------
//
// core's f16/bf16 conversions (core/half.h) are integer code with branches (a loop for f16 subnormals): correct
// everywhere, but they keep the compiler from vectorising a loop, and without F16C (no -march) they cost more than
// the memory traffic of an f16 step. These compute the same bits without branches — every case computed, one
// chosen by a mask (optim_math::select) — so the step's loop vectorises. Checked against core's conversions for
// every f16 and bf16 pattern and every float (all 2^32) when they were written; tests/test_optim.cpp checks, through
// the kernels, every 16-bit pattern widened and floats at and around every f16/bf16 value and midpoint narrowed.

MT_FORCE_INLINE uint32_t bits_of(float f) { return __builtin_bit_cast(uint32_t, f); }
MT_FORCE_INLINE float float_of(uint32_t u) { return __builtin_bit_cast(float, u); }

using optim_math::select;  // a mask, not a branch, on the host

/// f16 bits -> float, exactly (core's half_bits_to_float).
MT_FORCE_INLINE float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and fraction in float's place
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + ((127u - 15u) << 23);
  const uint32_t infinite = shifted + ((255u - 31u) << 23);
  const uint32_t subnormal = bits_of(float_of(shifted + (113u << 23)) - float_of(113u << 23));  // fraction · 2^-24
  const uint32_t magnitude = select(exponent == 0x0f800000u, infinite, select(exponent == 0u, subnormal, normal));
  return float_of(select((h & 0x7fffu) > 0x7c00u, detail::nan_half_to_float_bits(h), magnitude | sign));
}

/// float -> f16 bits, rounded to nearest even (core's float_to_half_bits).
MT_FORCE_INLINE uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t sign = (x >> 16) & 0x8000u;
  // Below 2^-14 the result is subnormal: adding 0.5, whose ulp is f16's least subnormal 2^-24, rounds to it by
  // the hardware's rounding (nearest even) and leaves its count in the low bits.
  const uint32_t subnormal = bits_of(float_of(a) + 0.5f) - bits_of(0.5f);
  // Normal: rebias, then round the 13 dropped bits to nearest even (a carry rounds into the next binade or inf).
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // From 65520 (f16's largest finite value plus half an ulp) on, inf.
  const uint32_t magnitude = select(a >= 0x477ff000u, 0x7c00u, select(a < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(select(a > 0x7f800000u, uint32_t{detail::nan_float_to_half_bits(x)}, magnitude | sign));
}

/// float -> bf16 bits, rounded to nearest even (core's float_to_bf16_bits).
MT_FORCE_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(
      select((x & 0x7fffffffu) > 0x7f800000u, uint32_t{detail::nan_float_to_bf16_bits(x)}, rounded));
}

/// The CPU loop's element conversions (optim_math's Cvt): the functions above for f16/bf16, casts otherwise.
struct FastConvert {
  template <class To, class From>
  static MT_FORCE_INLINE To to(From v) {
    if constexpr (std::is_same_v<To, From>) return v;
    else if constexpr (std::is_same_v<From, Half>) return static_cast<To>(half_to_float(v.bits));
    else if constexpr (std::is_same_v<From, BFloat16>)
      return static_cast<To>(float_of(detail::bf16_to_float_bits(v.bits)));
    else if constexpr (std::is_same_v<To, Half>) return Half::from_bits(float_to_half(static_cast<float>(v)));
    else if constexpr (std::is_same_v<To, BFloat16>) return BFloat16::from_bits(float_to_bf16(static_cast<float>(v)));
    else return static_cast<To>(v);
  }
};
static_assert(std::is_same_v<opmath_t<Half>, float> && std::is_same_v<opmath_t<BFloat16>, float>,
              "f16/bf16 convert to and from float only");

/// Element i of a run at `base` with byte stride `stride`: plain array indexing when kContiguous.
template <bool kContiguous, class X>
MT_FORCE_INLINE X* at(char* base, int64_t stride, int64_t i) {
  if constexpr (kContiguous) return reinterpret_cast<X*>(base) + i;
  else return reinterpret_cast<X*>(base + i * stride);
}

// ---- f16 blocks in hardware ---------------------------------------------------------------------
//
// Where the CPU has F16C (x86-64 since 2012), master_blocks converts f16 blocks with it, 8 elements an
// instruction, chosen at run time (the build has no -march). The hardware's conversions are IEEE round-to-nearest-
// even with subnormals and keep a NaN's sign and leading payload bits, quieting it: core's rule, so the bits are
// the same as FastConvert's (tests/test_optim.cpp converts every pattern through both paths).

#if defined(MT_OPTIM_F16C)
__attribute__((target("avx,f16c"))) void widen_f16c(const Half* in, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j))));
  for (; j < n; ++j) out[j] = _cvtsh_ss(in[j].bits);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* in, Half* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT));
  for (; j < n; ++j) out[j] = Half::from_bits(_cvtss_sh(in[j], _MM_FROUND_TO_NEAREST_INT));
}
#endif

/// out[0, n) = in[0, n) widened to float.
template <class T>
void widen_block(const T* in, float* out, int64_t n) {
#if defined(MT_OPTIM_F16C)
  if constexpr (std::is_same_v<T, Half>) {
    if (has_f16c()) return widen_f16c(in, out, n);
  }
#endif
  if constexpr (std::is_same_v<T, BFloat16>) return convert_n(in, out, n);  // core/convert.h: vector, same bits
  for (int64_t j = 0; j < n; ++j) out[j] = FastConvert::to<float>(in[j]);
}

/// out[0, n) = in[0, n) rounded to T (nearest even).
template <class T>
void narrow_block(const float* in, T* out, int64_t n) {
#if defined(MT_OPTIM_F16C)
  if constexpr (std::is_same_v<T, Half>) {
    if (has_f16c()) return narrow_f16c(in, out, n);
  }
#endif
  if constexpr (std::is_same_v<T, BFloat16>) return convert_n(in, out, n);  // core/convert.h: vector, same bits
  for (int64_t j = 0; j < n; ++j) out[j] = FastConvert::to<T>(in[j]);
}

/// A contiguous run of f16/bf16 parameters with f32 masters and f32 state, in blocks: the block's gradients widened
/// into a buffer, then `f32_run(operands, count)` — the plain f32 update with the master as its parameter, on the
/// same values in the same order, hence the same bits — then the masters rounded into the parameters. Three simple
/// loops vectorise where one loop holding the conversions and the update runs out of registers.
template <class T, class F32Run>
void master_blocks(const std::array<char*, kSlots>& p, int64_t n, F32Run&& f32_run) {
  constexpr int64_t kBlock = 512;
  alignas(64) float grad[kBlock];
  auto offset = [](char* base, int64_t i) { return base != nullptr ? base + i * int64_t{sizeof(float)} : nullptr; };
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    const T* g = reinterpret_cast<const T*>(p[kGrad]) + i;
    widen_block(g, grad, len);
    std::array<char*, kSlots> q{};
    q[kParam] = offset(p[kMaster], i);
    q[kGrad] = reinterpret_cast<char*>(grad);
    for (int k : {kState0, kState1, kState2}) q[k] = offset(p[k], i);
    f32_run(q, len);
    T* param = reinterpret_cast<T*>(p[kParam]) + i;
    const float* master = reinterpret_cast<const float*>(q[kParam]);
    narrow_block(master, param, len);
  }
}

// ---- SGD ---------------------------------------------------------------------------------------

/// One run of SGD: param T, state S, in opmath M.
template <class T, class S, Store kStore, bool kMomentum, bool kContiguous>
void sgd_run(const std::array<char*, kSlots>& p, const std::array<int64_t, kSlots>& s, int64_t n, int64_t first,
             optim_math::SgdCoeffs<opmath_t<T>> c, uint64_t key) {  // c by value: no store may alias it
  using M = opmath_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    T* param = at<kContiguous, T>(p[kParam], s[kParam], i);
    float* master = nullptr;
    if constexpr (kStore == Store::kMaster) master = at<kContiguous, float>(p[kMaster], s[kMaster], i);
    const M g = FastConvert::to<M>(*at<kContiguous, const T>(p[kGrad], s[kGrad], i));
    M buf = M(0);
    S* buf_at = nullptr;
    if constexpr (kMomentum) {
      buf_at = at<kContiguous, S>(p[kState0], s[kState0], i);
      buf = FastConvert::to<M>(*buf_at);
    }
    const M value = optim_math::load_param<kStore, FastConvert, T, M>(param, master);
    const M updated = optim_math::sgd_update<kMomentum>(value, g, buf, c);
    if constexpr (kMomentum) *buf_at = FastConvert::to<S>(buf);
    optim_math::store_param<kStore, FastConvert, T, M>(param, master, updated, key, first + i);
  }
}

/// A parameter's update count including this update: read from its counter when it has one.
int64_t update_count(const OptimStep& step) { return step.count != nullptr ? *step.count : step.step; }

template <class T, class S, Store kStore, bool kMomentum>
void sgd_tensor(const std::array<const Tensor*, kSlots>& ts, const SgdHyper& hyper, const OptimStep& step) {
  const SgdHyper& h = hyper.on_device != nullptr ? *hyper.on_device : hyper;  // same_kernels as hyper
  const auto c = optim_math::sgd_coeffs<opmath_t<T>>(h, step.first_momentum);
  const uint64_t key = optim_math::rounding_key(h.seed, update_count(step), step.index);
  walk(ts, [&](const auto& p, const auto& s, int64_t n, int64_t first, bool contiguous) {
    if (!contiguous) return sgd_run<T, S, kStore, kMomentum, false>(p, s, n, first, c, key);
    if constexpr (kStore == Store::kMaster)
      master_blocks<T>(p, n, [&](const auto& q, int64_t len) {
        sgd_run<float, float, Store::kNearest, kMomentum, true>(q, s, len, 0, c, key);
      });
    else sgd_run<T, S, kStore, kMomentum, true>(p, s, n, first, c, key);
  });
}

// ---- Adam and AdamW --------------------------------------------------------------------------------

/// One run of Adam: param T, state S, in opmath M.
template <class T, class S, Store kStore, bool kAmsgrad, bool kContiguous>
void adam_run(const std::array<char*, kSlots>& p, const std::array<int64_t, kSlots>& s, int64_t n, int64_t first,
              optim_math::AdamCoeffs<opmath_t<T>> c, uint64_t key) {  // c by value: no store may alias it
  using M = opmath_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    T* param = at<kContiguous, T>(p[kParam], s[kParam], i);
    float* master = nullptr;
    if constexpr (kStore == Store::kMaster) master = at<kContiguous, float>(p[kMaster], s[kMaster], i);
    const M g = FastConvert::to<M>(*at<kContiguous, const T>(p[kGrad], s[kGrad], i));
    S* m_at = at<kContiguous, S>(p[kState0], s[kState0], i);
    S* v_at = at<kContiguous, S>(p[kState1], s[kState1], i);
    M m = FastConvert::to<M>(*m_at), v = FastConvert::to<M>(*v_at), vmax = M(0);
    S* vmax_at = nullptr;
    if constexpr (kAmsgrad) {
      vmax_at = at<kContiguous, S>(p[kState2], s[kState2], i);
      vmax = FastConvert::to<M>(*vmax_at);
    }
    const M value = optim_math::load_param<kStore, FastConvert, T, M>(param, master);
    const M updated = optim_math::adam_update<kAmsgrad>(value, g, m, v, vmax, c);
    *m_at = FastConvert::to<S>(m);
    *v_at = FastConvert::to<S>(v);
    if constexpr (kAmsgrad) *vmax_at = FastConvert::to<S>(vmax);
    optim_math::store_param<kStore, FastConvert, T, M>(param, master, updated, key, first + i);
  }
}

#if defined(MT_OPTIM_F16C)
// GCC 12's AVX-512 intrinsics start some results from an undefined register, which -Wmaybe-uninitialized reports
// once inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/// adam_run<float, float, Store::kNearest, false, true> (no AMSGrad) sixteen elements at a time with AVX-512,
/// chosen at run time: the build's baseline vectorises the loop four wide, and its √ and division then take ~15% of
/// an MLP's bf16 training step. The same IEEE operations in the same order as optim_math::adam_update (no FMA), so
/// the same bits. Returns how many leading elements it updated; the portable loop does the rest.
__attribute__((target("avx512f"))) int64_t adam_f32_avx512(float* p, const float* grad, float* m, float* v, int64_t n,
                                                            const optim_math::AdamCoeffs<float>& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), beta2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), wd = _mm512_set1_ps(c.weight_decay), decay = _mm512_set1_ps(c.decay);
  const __m512 neg_step = _mm512_set1_ps(c.neg_step_size), bc2 = _mm512_set1_ps(c.bias_correction2_sqrt);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(p + i), g = _mm512_loadu_ps(grad + i);
    if (c.maximize) g = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign));  // −g: the sign bit
    if (c.decay_grad) g = _mm512_add_ps(g, _mm512_mul_ps(wd, x));         // g + wd·p
    if (c.decay_param) x = _mm512_mul_ps(x, decay);                       // p·(1 − lr·wd)
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), beta1), _mm512_mul_ps(omb1, g));
    const __m512 vi =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), beta2), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, _mm512_add_ps(x, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom)));
  }
  return i;
}
#pragma GCC diagnostic pop
#endif

/// A contiguous f32 run of Adam (parameters or masters, f32 state): the AVX-512 loop where it applies, then the
/// portable one.
template <bool kAmsgrad>
void adam_run_f32(const std::array<char*, kSlots>& p, const std::array<int64_t, kSlots>& s, int64_t n,
                  const optim_math::AdamCoeffs<float>& c, uint64_t key) {
  int64_t done = 0;
#if defined(MT_OPTIM_F16C)
  if constexpr (!kAmsgrad) {
    if (has_avx512f())
      done = adam_f32_avx512(reinterpret_cast<float*>(p[kParam]), reinterpret_cast<const float*>(p[kGrad]),
                             reinterpret_cast<float*>(p[kState0]), reinterpret_cast<float*>(p[kState1]), n, c);
  }
#endif
  if (done == n) return;
  std::array<char*, kSlots> rest{};
  for (int k = 0; k < kSlots; ++k) rest[k] = p[k] ? p[k] + done * int64_t{sizeof(float)} : nullptr;
  adam_run<float, float, Store::kNearest, kAmsgrad, true>(rest, s, n - done, done, c, key);
}

template <class T, class S, Store kStore, bool kAmsgrad>
void adam_tensor(const std::array<const Tensor*, kSlots>& ts, const AdamHyper& hyper, const OptimStep& step) {
  const AdamHyper& h = hyper.on_device != nullptr ? *hyper.on_device : hyper;  // same_kernels as hyper
  const int64_t count = update_count(step);
  const auto c = optim_math::adam_coeffs<opmath_t<T>>(h, count);
  const uint64_t key = optim_math::rounding_key(h.seed, count, step.index);
  walk(ts, [&](const auto& p, const auto& s, int64_t n, int64_t first, bool contiguous) {
    if (!contiguous) return adam_run<T, S, kStore, kAmsgrad, false>(p, s, n, first, c, key);
    if constexpr (kStore == Store::kMaster)
      master_blocks<T>(p, n, [&](const auto& q, int64_t len) { adam_run_f32<kAmsgrad>(q, s, len, c, key); });
    else if constexpr (std::is_same_v<T, float> && std::is_same_v<S, float> && kStore == Store::kNearest)
      adam_run_f32<kAmsgrad>(p, s, n, c, key);
    else adam_run<T, S, kStore, kAmsgrad, true>(p, s, n, first, c, key);
  });
}

// ---- choosing the instantiation ------------------------------------------------------------------

/// Whether a step's found_inf (undefined: never) says to skip it.
bool skipped(const Tensor& found_inf) {
  return found_inf.defined() && *static_cast<const float*>(found_inf.data_ptr()) != 0.0f;
}

}  // namespace

void sgd_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
               std::span<const Tensor> masters, std::span<const OptimStep> steps, const SgdHyper& hyper,
               const Tensor& found_inf, const std::function<SgdHyper()>& /*at_replay: no graphs here*/) {
  if (skipped(found_inf)) return;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    const bool momentum = hyper.momentum != 0, master = !masters.empty();
    const std::array<const Tensor*, kSlots> ts = {&params[i], &grads[i], momentum ? &momentum_buffers[i] : nullptr,
                                                  nullptr,    nullptr,   master ? &masters[i] : nullptr};
    dispatch_store(params[i].dtype(), master, hyper.stochastic_rounding, "sgd_step_", [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      if (momentum) sgd_tensor<T, S, decltype(store)::value, true>(ts, hyper, steps[i]);
      else sgd_tensor<T, S, decltype(store)::value, false>(ts, hyper, steps[i]);
    });
  }
}

void adam_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avgs,
                std::span<const Tensor> exp_avg_sqs, std::span<const Tensor> max_exp_avg_sqs,
                std::span<const Tensor> masters, std::span<const OptimStep> steps, const AdamHyper& hyper,
                const Tensor& found_inf, const std::function<AdamHyper()>& /*at_replay: no graphs here*/) {
  if (skipped(found_inf)) return;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    const bool master = !masters.empty();
    const std::array<const Tensor*, kSlots> ts = {&params[i],     &grads[i],
                                                  &exp_avgs[i],   &exp_avg_sqs[i],
                                                  hyper.amsgrad ? &max_exp_avg_sqs[i] : nullptr,
                                                  master ? &masters[i] : nullptr};
    const bool stochastic = hyper.stochastic_rounding;
    dispatch_store(params[i].dtype(), master, stochastic, "adam_step_", [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      if (hyper.amsgrad) adam_tensor<T, S, decltype(store)::value, true>(ts, hyper, steps[i]);
      else adam_tensor<T, S, decltype(store)::value, false>(ts, hyper, steps[i]);
    });
  }
}

void optim_count_steps_(std::span<const Tensor> counts, const Tensor& found_inf) {
  if (skipped(found_inf)) return;
  for (const Tensor& c : counts) {
    int32_t& count = *static_cast<int32_t*>(c.data_ptr());
    if (count < INT32_MAX) ++count;  // saturates (kernels.h); Adam's bias corrections are 1 in f64 from step ~37k
  }
}

}  // namespace mixtape::kernels::cpu
