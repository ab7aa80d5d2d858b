// ops/cpu/transpose16.h — the 16 x 16 transpose of 32-bit lanes held in AVX-512 registers (internal to ops/cpu).
//
// Shared by the bf16 GEMM's packing (pairs of bf16 as 32-bit lanes, ops/cpu/gemm_bf16.cpp) and the Winograd
// convolution's channels-last packing (f32, ops/cpu/conv_winograd.cpp). Compiled with a function target attribute
// (the build has no -march): callers are AVX-512 functions chosen at run time, into which it inlines.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace mixtape::kernels::cpu {

/// Transposes the 16 x 16 matrix of 32-bit lanes in r: r[i] lane j becomes r[j] lane i.
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + e], 128-bit lane L: element 4L + e of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Output row 4L + e gathers lane L of u[e], u[4 + e], u[8 + e], u[12 + e].
  for (int e = 0; e < 4; ++e) {
    const __m512i v_even = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), v_odd = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);
    const __m512i w_even = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    const __m512i w_odd = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
    r[e] = _mm512_shuffle_i32x4(v_even, w_even, 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(v_even, w_even, 0xdd);
    r[4 + e] = _mm512_shuffle_i32x4(v_odd, w_odd, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(v_odd, w_odd, 0xdd);
  }
}

/// The same for 16 vectors of 16 floats.
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  __m512i q[16];
  for (int i = 0; i < 16; ++i) q[i] = _mm512_castps_si512(r[i]);
  transpose16(q);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(q[i]);
}

}  // namespace mixtape::kernels::cpu

#endif  // __x86_64__
