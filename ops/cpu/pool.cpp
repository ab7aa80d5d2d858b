// ops/cpu/pool.cpp — max and average pooling, forward and backward, on the CPU.
//
// Planes in parallel (window.h): the backwards scatter-add into one plane's
// opmath buffer, rounded once per pixel. max_pool2d keeps the first maximum
// of a window and lets NaN win. Inputs of any layout are made contiguous
// first; outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <mixtape/ops/cpu/cpu_features.h>
#include <mixtape/ops/cpu/loops.h>
#include <mixtape/ops/cpu/window.h>

namespace mixtape::kernels::cpu {

namespace {

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start some results from an undefined register, which -Wmaybe-uninitialized reports
// once inlined into a function with a target attribute (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/// The windows where tap v (at positions pos) is greater than the best so far, or is the first NaN, take it.
__attribute__((target("avx512f"))) inline void take_tap(__m512 v, __m512i pos, __m512& best, __m512i& at) {
  const __mmask16 wins = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) |
                         (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q));
  best = _mm512_mask_mov_ps(best, wins, v);
  at = _mm512_mask_mov_epi32(at, wins, pos);
}

/// One f32 plane's 2x2 max-pool of stride 2 (no padding), sixteen windows per step: the taps in (kh, kw) order, a
/// tap taking the window when it is greater than the best so far or is the first NaN (the rule of the scalar loop).
/// Positions are computed in 32 bits, as the int32 indices hold them (ops/pool.cpp refuses planes of 2^31 pixels).
__attribute__((target("avx512f"))) void max_pool_2x2_avx512(const float* src, int64_t w, int64_t ho, int64_t wo,
                                                             float* dst, int32_t* idx) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i down = _mm512_set1_epi32(static_cast<int>(w));
  for (int64_t oh = 0; oh < ho; ++oh) {
    const float* r0 = src + 2 * oh * w;
    const float* r1 = r0 + w;
    for (int64_t ow = 0; ow < wo; ow += 16) {
      const int64_t n = std::min<int64_t>(16, wo - ow);  // windows in this step
      const __mmask16 lo = static_cast<__mmask16>(n >= 8 ? 0xffff : (1u << (2 * n)) - 1u);
      const __mmask16 hi = static_cast<__mmask16>(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1u);
      const __m512 r0a = _mm512_maskz_loadu_ps(lo, r0 + 2 * ow), r0b = _mm512_maskz_loadu_ps(hi, r0 + 2 * ow + 16);
      const __m512 r1a = _mm512_maskz_loadu_ps(lo, r1 + 2 * ow), r1b = _mm512_maskz_loadu_ps(hi, r1 + 2 * ow + 16);
      __m512 best = _mm512_permutex2var_ps(r0a, even, r0b);
      __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(2 * oh * w + 2 * ow)), even);
      const __m512i at0 = at;
      const __m512i right = _mm512_add_epi32(at0, _mm512_set1_epi32(1)), below = _mm512_add_epi32(at0, down);
      take_tap(_mm512_permutex2var_ps(r0a, odd, r0b), right, best, at);
      take_tap(_mm512_permutex2var_ps(r1a, even, r1b), below, best, at);
      take_tap(_mm512_permutex2var_ps(r1a, odd, r1b), _mm512_add_epi32(below, _mm512_set1_epi32(1)), best, at);
      const __mmask16 out = static_cast<__mmask16>((1u << n) - 1u);
      _mm512_mask_storeu_ps(dst + oh * wo + ow, out, best);
      _mm512_mask_storeu_epi32(idx + oh * wo + ow, out, at);
    }
  }
}
#pragma GCC diagnostic pop

/// take_tap with AVX2: eight windows.
__attribute__((target("avx2"))) inline void take_tap(__m256 v, __m256i pos, __m256& best, __m256i& at) {
  const __m256 first_nan = _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(best, best, _CMP_ORD_Q));
  const __m256 wins = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), first_nan);
  best = _mm256_blendv_ps(best, v, wins);
  at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(pos), wins));
}

/// The even and the odd elements of p[0 .. 16).
__attribute__((target("avx2"))) inline void deinterleave(const float* p, __m256& even, __m256& odd) {
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  // Per 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6; then the 64-bit pairs in order 0, 2, 1, 3.
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}

/// max_pool_2x2_avx512 with AVX2: eight windows per step. A row's last windows (fewer than eight) go through a
/// buffer holding their taps, the rest of it zeros, whose windows are computed and not stored.
__attribute__((target("avx2"))) void max_pool_2x2_avx2(const float* src, int64_t w, int64_t ho, int64_t wo,
                                                       float* dst, int32_t* idx) {
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), one = _mm256_set1_epi32(1);
  const __m256i down = _mm256_set1_epi32(static_cast<int>(w));
  for (int64_t oh = 0; oh < ho; ++oh) {
    const float* r0 = src + 2 * oh * w;
    const float* r1 = r0 + w;
    for (int64_t ow = 0; ow < wo; ow += 8) {
      const int64_t n = std::min<int64_t>(8, wo - ow);  // windows in this step
      __m256 e0, o0, e1, o1;
      if (n == 8) {
        deinterleave(r0 + 2 * ow, e0, o0);
        deinterleave(r1 + 2 * ow, e1, o1);
      } else {
        float taps[2][16] = {};
        std::copy_n(r0 + 2 * ow, 2 * n, taps[0]);
        std::copy_n(r1 + 2 * ow, 2 * n, taps[1]);
        deinterleave(taps[0], e0, o0);
        deinterleave(taps[1], e1, o1);
      }
      __m256 best = e0;
      const __m256i at0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(2 * oh * w + 2 * ow)), even);
      const __m256i below = _mm256_add_epi32(at0, down);
      __m256i at = at0;
      take_tap(o0, _mm256_add_epi32(at0, one), best, at);
      take_tap(e1, below, best, at);
      take_tap(o1, _mm256_add_epi32(below, one), best, at);
      if (n == 8) {
        _mm256_storeu_ps(dst + oh * wo + ow, best);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + oh * wo + ow), at);
      } else {
        alignas(32) float best_out[8];
        alignas(32) int32_t at_out[8];
        _mm256_store_ps(best_out, best);
        _mm256_store_si256(reinterpret_cast<__m256i*>(at_out), at);
        std::copy_n(best_out, n, dst + oh * wo + ow);
        std::copy_n(at_out, n, idx + oh * wo + ow);
      }
    }
  }
}
#else
void max_pool_2x2_avx512(const float*, int64_t, int64_t, int64_t, float*, int32_t*) {}
void max_pool_2x2_avx2(const float*, int64_t, int64_t, int64_t, float*, int32_t*) {}
#endif

}  // namespace

MaxPoolResult max_pool2d(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  MaxPoolResult r{empty({p.n, p.c, p.ho, p.wo}, x.dtype()), empty({p.n, p.c, p.ho, p.wo}, DType::kI32)};
  if (r.y.numel() == 0) return r;
  dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* xp = x.data<T>();
    T* yp = r.y.data<T>();
    int32_t* ip = r.indices.data<int32_t>();
    // The window at (oh, ow) of one plane: the position of its first maximum, or of its first NaN (NaN wins), or -1
    // when every tap is padding. Only taps inside the plane are compared (padding is -inf that never wins), the best
    // value kept in a register (the MNIST net's 2x2 pool: 4x faster than a per-plane buffer of running maxima).
    auto window_argmax = [&](const T* src, int64_t oh, int64_t ow) -> int64_t {
      M best = -std::numeric_limits<M>::infinity();
      int64_t at = -1;
      for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
        const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
        if (ih < 0 || ih >= p.h) continue;
        for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
          const int64_t iw = ow * w.stride[1] - w.padding[1] + kw * w.dilation[1];
          if (iw < 0 || iw >= p.w) continue;
          const M v = static_cast<M>(src[ih * p.w + iw]);
          if (std::isnan(v)) return ih * p.w + iw;
          if (at < 0 || v > best) best = v, at = ih * p.w + iw;
        }
      }
      return at;
    };
    // 2x2 windows of stride 2 without padding (the MNIST net's, and most CNNs'): every tap is inside, so the four
    // comparisons go without branches (a NaN is taken when the best so far is not one: the first NaN wins).
    const bool two_by_two = w.kernel[0] == 2 && w.kernel[1] == 2 && w.stride[0] == 2 && w.stride[1] == 2 &&
                            w.padding[0] == 0 && w.padding[1] == 0 && w.dilation[0] == 1 && w.dilation[1] == 1;
    // The f32 vector kernel of this CPU for those windows (f16/bf16 planes are widened for it), or none.
    const auto pool_f32 = has_avx512f() ? max_pool_2x2_avx512 : has_avx2() ? max_pool_2x2_avx2 : nullptr;
    auto pool_2x2 = [&](const T* src, T* dst, int32_t* idx) {
      for (int64_t oh = 0; oh < p.ho; ++oh) {
        const T* r0 = src + 2 * oh * p.w;
        const T* r1 = r0 + p.w;
        for (int64_t ow = 0; ow < p.wo; ++ow) {
          const int64_t at0 = 2 * oh * p.w + 2 * ow;
          M best = static_cast<M>(r0[2 * ow]);
          int64_t at = at0;
          auto take = [&](T t, int64_t pos) {
            const M v = static_cast<M>(t);
            const bool wins = v > best || (v != v && best == best);
            best = wins ? v : best;
            at = wins ? pos : at;
          };
          take(r0[2 * ow + 1], at0 + 1);
          take(r1[2 * ow], at0 + p.w);
          take(r1[2 * ow + 1], at0 + p.w + 1);
          idx[oh * p.wo + ow] = static_cast<int32_t>(at);
          dst[oh * p.wo + ow] = convert<T>(best);  // exact: best is one of the taps
        }
      }
    };
#pragma omp parallel if (x.numel() >= kParallelMin)
    {
      std::vector<float> wide;  // f16/bf16: a plane widened to f32, and the f32 kernel's outputs
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        const T* src = xp + nc * p.in_plane();
        T* dst = yp + nc * p.out_plane();
        int32_t* idx = ip + nc * p.out_plane();
        if (two_by_two) {
          if constexpr (std::is_same_v<T, float>) {
            if (pool_f32) {
              pool_f32(src, p.w, p.ho, p.wo, dst, idx);
              continue;
            }
          } else if constexpr (is_reduced_float(dtype_v<T>)) {
            // The plane widened exactly in one vector pass (element by element the conversions cost more than the
            // comparisons), pooled by the f32 kernel; each output is then the tap it chose, copied bit for bit.
            if (pool_f32) {
              wide.resize(static_cast<size_t>(p.in_plane() + p.out_plane()));
              convert_run(src, wide.data(), p.in_plane());
              pool_f32(wide.data(), p.w, p.ho, p.wo, wide.data() + p.in_plane(), idx);
              for (int64_t o = 0; o < p.out_plane(); ++o) dst[o] = src[idx[o]];
              continue;
            }
          }
          pool_2x2(src, dst, idx);
          continue;
        }
        for (int64_t oh = 0; oh < p.ho; ++oh)
          for (int64_t ow = 0; ow < p.wo; ++ow) {
            const int64_t o = oh * p.wo + ow, at = window_argmax(src, oh, ow);
            idx[o] = static_cast<int32_t>(at);
            // A window whose every tap is padding (only possible with a dilation wider than the input) gives -inf.
            dst[o] = at >= 0 ? src[at] : convert<T>(-std::numeric_limits<M>::infinity());
          }
      }
    }
  });
  return r;
}

Tensor max_pool2d_backward(const Tensor& dy_in, const Tensor& indices_in, const Shape& input_shape, const Window2d&) {
  const Tensor dy = raw::contiguous(dy_in), indices = raw::contiguous(indices_in);
  Tensor dx = empty(input_shape, dy.dtype());  // (N, C, H, W)
  if (dx.numel() == 0) return dx;
  const int64_t count = input_shape[0] * input_shape[1], in_plane = input_shape[2] * input_shape[3];
  const int64_t out_plane = dy.size(2) * dy.size(3);
  dispatch_floating(dy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* gp = dy.data<T>();
    const int32_t* ip = indices.data<int32_t>();
    T* xp = dx.data<T>();
#pragma omp parallel if (dx.numel() >= kParallelMin)
    {
      std::vector<M> scratch, wide;  // wide: f16/bf16 dy's plane in f32, widened in one vector pass
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < count; ++nc) {
        const T* g = gp + nc * out_plane;
        const int32_t* idx = ip + nc * out_plane;
        const M* gm;
        if constexpr (std::is_same_v<T, M>) {
          gm = g;
        } else {
          wide.resize(static_cast<size_t>(out_plane));
          convert_run(g, wide.data(), out_plane);
          gm = wide.data();
        }
        accumulate_into(xp + nc * in_plane, in_plane, scratch, [&](M* acc) {
          for (int64_t o = 0; o < out_plane; ++o)
            if (idx[o] >= 0) acc[idx[o]] += gm[o];
        });
      }
    }
  });
  return dx;
}

Tensor avg_pool2d(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  Tensor y = empty({p.n, p.c, p.ho, p.wo}, x.dtype());
  if (y.numel() == 0) return y;
  dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);  // count_include_pad: padding counts as zeros
#pragma omp parallel if (x.numel() >= kParallelMin)
    {
      std::vector<M> sums;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        const T* src = xp + nc * p.in_plane();
        sums.assign(static_cast<size_t>(p.out_plane()), M(0));
        for_each_tap(p, w, [&](int64_t in, int64_t out) { sums[static_cast<size_t>(out)] += static_cast<M>(src[in]); });
        T* dst = yp + nc * p.out_plane();
        for (int64_t o = 0; o < p.out_plane(); ++o) dst[o] = convert<T>(sums[static_cast<size_t>(o)] / divisor);
      }
    }
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& dy_in, const Shape& input_shape, const Window2d& w) {
  const Tensor dy = raw::contiguous(dy_in);
  const Planes p = planes_of(input_shape, w);
  Tensor dx = empty(input_shape, dy.dtype());  // (N, C, H, W)
  if (dx.numel() == 0) return dx;
  dispatch_floating(dy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* gp = dy.data<T>();
    T* xp = dx.data<T>();
    const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);
#pragma omp parallel if (dx.numel() >= kParallelMin)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        const T* g = gp + nc * p.out_plane();
        accumulate_into(xp + nc * p.in_plane(), p.in_plane(), scratch, [&](M* acc) {
          for_each_tap(p, w, [&](int64_t in, int64_t out) { acc[in] += static_cast<M>(g[out]) / divisor; });
        });
      }
    }
  });
  return dx;
}

}  // namespace mixtape::kernels::cpu
