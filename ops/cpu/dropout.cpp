// ops/cpu/dropout.cpp — the dropout keep-mask on the CPU.
//
// The mask is a pure function of (seed, offset + i): one Philox counter per
// element, so the CUDA kernel draws the very same mask. On a CPU with
// AVX-512 (checked at run time) sixteen counters go through Philox's ten
// rounds side by side, with AVX2 eight, several times faster than
// philox4x32_10 one element after another, which stays the portable path
// and the definition.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <mixtape/core/random.h>
#include <mixtape/ops/cpu/cpu_features.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

namespace {

/// Element i is kept when uniform_float(word) >= p, word = philox4x32_10(seed, 0, offset + i)[0]. uniform_float is
/// (word >> 8) · 2^-24, exact, so that is the integer test (word >> 8) >= ceil(p · 2^24).
uint32_t keep_threshold(double p) { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }

void keep_scalar(uint64_t seed, uint64_t first, int64_t count, uint32_t threshold, bool* m) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t words[4];
    philox4x32_10(seed, 0, first + static_cast<uint64_t>(i), words);
    m[i] = (words[0] >> 8) >= threshold;
  }
}

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused merge source, which -Wmaybe-uninitialized
// reports once inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#if !defined(__clang__)  // a GCC warning clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/// keep_scalar, sixteen counters per vector. _mm512_mul_epu32 multiplies the even 32-bit lanes into 64-bit
/// products; the odd lanes go through it shifted down, and blends put the high and low halves back in lane order.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void keep_avx512(uint64_t seed, uint64_t first, int64_t count,
                                                                      uint32_t threshold, bool* m) {
  const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  constexpr __mmask16 kOdd = 0xAAAA;
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    // Counters first + i + j as (lo, hi) words: two vectors of 64-bit counters, split into 32-bit lanes.
    const __m512i base = _mm512_set1_epi64(static_cast<long long>(first + static_cast<uint64_t>(i)));
    const __m512i ca = _mm512_add_epi64(base, lane), cb = _mm512_add_epi64(ca, _mm512_set1_epi64(8));
    const __m512i idx_lo = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i idx_hi = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512i c0 = _mm512_permutex2var_epi32(ca, idx_lo, cb), c1 = _mm512_permutex2var_epi32(ca, idx_hi, cb);
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i e0 = _mm512_mul_epu32(c0, m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i e1 = _mm512_mul_epu32(c2, m1), o1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(e0, 32), o0);
      const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, e0, _mm512_slli_epi64(o0, 32));
      const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(e1, 32), o1);
      const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, e1, _mm512_slli_epi64(o1, 32));
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(c0, 8), t);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(m + i), _mm_maskz_set1_epi8(keep, 1));
  }
  keep_scalar(seed, first + static_cast<uint64_t>(i), count - i, threshold, m + i);
}
#pragma GCC diagnostic pop

/// keep_avx512 with AVX2: eight counters per vector, the odd lanes' products put back in place by blends.
__attribute__((target("avx2"))) void keep_avx2(uint64_t seed, uint64_t first, int64_t count, uint32_t threshold,
                                               bool* m) {
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3), four = _mm256_set1_epi64x(4);
  const __m256i words_in_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // (lo, hi) pairs -> 4 lo, 4 hi
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
  // (word >> 8) and the threshold are below 2^24 + 1, so a signed comparison orders them as unsigned ones.
  const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold)), one = _mm256_set1_epi32(1);
  constexpr int kOdd = 0xAA;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // Counters first + i + j as (lo, hi) words: two vectors of four 64-bit counters, split into 32-bit lanes.
    const __m256i ca = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + static_cast<uint64_t>(i))),
                                        lane);
    const __m256i pa = _mm256_permutevar8x32_epi32(ca, words_in_order);
    const __m256i pb = _mm256_permutevar8x32_epi32(_mm256_add_epi64(ca, four), words_in_order);
    __m256i c0 = _mm256_permute2x128_si256(pa, pb, 0x20), c1 = _mm256_permute2x128_si256(pa, pb, 0x31);
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, kOdd);
      const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), kOdd);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, kOdd);
      const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), kOdd);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const __m256i keep = _mm256_andnot_si256(_mm256_cmpgt_epi32(t, _mm256_srli_epi32(c0, 8)), one);  // 1 or 0
    const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(keep), _mm256_extracti128_si256(keep, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(m + i), _mm_packus_epi16(halves, halves));  // eight bytes
  }
  keep_scalar(seed, first + static_cast<uint64_t>(i), count - i, threshold, m + i);
}
#endif  // __x86_64__

}  // namespace

Tensor dropout_mask(const Shape& shape, double p, Generator& generator, Device device) {
  Tensor mask = empty(shape, DType::kBool);
  bool* m = mask.data<bool>();
  const int64_t n = mask.numel();
  // Plain variables, not a structured binding: clang 16 crashes on one used inside an OpenMP region.
  const GeneratorState at = generator.reserve(static_cast<uint64_t>(n));
  const uint64_t seed = at.seed, offset = at.offset;
  const uint32_t threshold = keep_threshold(p);
#if defined(__x86_64__)
  const auto keep = has_avx512bw_vl() ? keep_avx512 : has_avx2() ? keep_avx2 : keep_scalar;
#else
  const auto keep = keep_scalar;
#endif
  constexpr int64_t kGrain = 1 << 14;
  const int64_t ranges = (n + kGrain - 1) / kGrain;
  // Element i depends on (seed, offset + i) only, never on the thread count, the range or the device.
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t r = 0; r < ranges; ++r) {
    const int64_t first = r * kGrain;
    keep(seed, offset + static_cast<uint64_t>(first), std::min(kGrain, n - first), threshold, m + first);
  }
  return raw::to(mask, device);
}

}  // namespace mixtape::kernels::cpu
