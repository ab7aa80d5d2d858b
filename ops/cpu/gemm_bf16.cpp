// ops/cpu/gemm_bf16.cpp — gemm_bf16 (ops/cpu/gemm_bf16.h): packed k-pair panels and a vdpbf16ps micro-kernel.
//
// The loops are BLIS's, with the k loop inside the micro-kernel: for each block of columns of c, pack that block
// of b into panels of kNr columns; for each block of rows, pack those rows of a into panels of kMr rows; then the
// threads share the kMr x kNr tiles, b's panel outermost, so that one b panel stays in cache while a's panels
// stream past. A tile keeps its f32 sums in registers over the whole of k and is stored once (f32, or rounded to
// bf16), so a bf16 result never makes an f32 round trip through memory, and the blocks are bounded in bytes (a's
// within L2, b's within a share of L3) rather than by k: a long k only narrows them. Tile: 12 x 32, i.e. 24
// independent sums and 24 vdpbf16ps per k-pair against 2 vector loads and 12 broadcasts (measured on this Zen 5:
// 12 independent vdpbf16ps chains reach 95% of its two-a-cycle throughput, 16 all of it).
#include <mixtape/ops/cpu/gemm_bf16.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include <omp.h>

#include <mixtape/core/error.h>
#include <mixtape/ops/cpu/cpu_features.h>
#include <mixtape/ops/cpu/transpose16.h>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start their results from `__m512i __Y = __Y;` (_mm512_undefined_epi32), which
// -Wuninitialized reports once inlined into a function with a target attribute (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define MT_GEMM_BF16_X86 1
#endif

namespace mixtape::kernels::cpu {

namespace {

std::atomic<Bf16GemmPath> g_path{Bf16GemmPath::kAuto};

// Below this many multiply-adds a product is faster widened to f32 (bench/gemm_bf16.cpp, this 2-core Zen 5 VM,
// kernels::matmul allocation included: kernel / widen 0.6x at 8^3, 0.9x at 16^3, 1.2x at 32^3, 2.7x at 64^3).
constexpr int64_t kMinMacs = int64_t{1} << 14;

#if defined(MT_GEMM_BF16_X86)

#define MT_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int kMr = 12;         // rows of a tile: one broadcast pair each
constexpr int kNv = 2;          // 16-lane vectors across a tile
constexpr int kNr = 16 * kNv;   // columns of a tile
constexpr int64_t kABlockBytes = 512 << 10;  // a packed block of a: half of this CPU's 1 MiB L2
constexpr int64_t kBBlockBytes = 4 << 20;    // a packed block of b: a share of L3
// Below this many multiply-adds one thread does the product: waking the second costs more than it saves. Measured
// on the MNIST MLP's fc3 products (128 x 512 by 512 x 10 and its two gradients, 0.66M multiply-adds each), on the
// 2-core Zen 4 VM: one thread 0.012-0.024 ms; two 0.008-0.018 ms when OpenMP's idle thread spins, 0.11-0.13 ms
// under OMP_WAIT_POLICY=passive (a sleeping thread's wake-up), which README recommends on a shared machine.
constexpr int64_t kParallelMinMacs = int64_t{1} << 20;

/// The lanes holding fewer than 16 (or 32) valid elements.
MT_AVX512_BF16 inline __mmask16 mask16(int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(valid, 0)) - 1u);
}
MT_AVX512_BF16 inline __mmask32 mask32(int64_t valid) {
  return valid >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << std::max<int64_t>(valid, 0)) - 1u);
}

/// Packs `lines` (<= W) lines whose k runs contiguously (line i at src + i * ld) into a panel
/// dst[kp * W + i] = (x[2kp], x[2kp + 1]) of line i: the pairs already lie as 32-bit lanes, so packing is a
/// transpose of 16 x 16 blocks of them. Lines >= `lines` and the pair past an odd k are zeros.
template <int W>
MT_AVX512_BF16 void pack_k_contiguous(const BFloat16* src, int64_t ld, int64_t lines, int64_t k, uint32_t* dst) {
  const int64_t kpairs = (k + 1) / 2;
  for (int64_t i0 = 0; i0 < W; i0 += 16) {
    const __mmask16 store = mask16(W - i0);
    for (int64_t kp0 = 0; kp0 < kpairs; kp0 += 16) {
      const __mmask32 load = mask32(k - 2 * kp0);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i)
        r[i] = i0 + i < lines ? _mm512_maskz_loadu_epi16(load, src + (i0 + i) * ld + 2 * kp0) : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t q = 0; q < 16 && kp0 + q < kpairs; ++q) _mm512_mask_storeu_epi32(dst + (kp0 + q) * W + i0, store, r[q]);
    }
  }
}

/// Packs `lines` (<= W) lines that run contiguously across k's rows (element (p, i) at src[p * ld + i]) into the
/// same panel layout: rows 2kp and 2kp + 1 interleaved. Lines >= `lines` and the pair past an odd k are zeros.
template <int W>
MT_AVX512_BF16 void pack_k_strided(const BFloat16* src, int64_t ld, int64_t lines, int64_t k, uint32_t* dst) {
  const int64_t kpairs = (k + 1) / 2;
  for (int64_t kp = 0; kp < kpairs; ++kp) {
    const BFloat16* even = src + 2 * kp * ld;
    const bool has_odd = 2 * kp + 1 < k;
    for (int64_t i0 = 0; i0 < W; i0 += 16) {
      const __mmask16 load = mask16(lines - i0);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load, even + i0));
      const __m512i hi = has_odd ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load, even + ld + i0))
                                 : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(dst + kp * W + i0, mask16(W - i0), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

/// Packs `lines` lines (rows of a, or columns of b) of an operand into one panel of width W.
/// `k_contiguous`: whether a line's k runs contiguously; `src` points at the line's first element.
template <int W>
MT_AVX512_BF16 void pack_panel(bool k_contiguous, const BFloat16* src, int64_t ld, int64_t lines, int64_t k,
                               uint32_t* dst) {
  if (k_contiguous)
    pack_k_contiguous<W>(src, ld, lines, k, dst);
  else
    pack_k_strided<W>(src, ld, lines, k, dst);
}

/// The bf16 patterns of 16 floats, one per 32-bit lane: core/half.h's rounding (nearest even by adding 0x7fff
/// plus the kept lsb; a NaN keeps its sign and top payload bits, quieted), as core/convert.cpp's AVX2 loop.
MT_AVX512_BF16 inline __m256i round_to_bf16(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

/// c (rows x cols of a kMr x kNr tile, leading dim ldc) = the panels' product over kpairs pairs, overwriting c.
template <class Out>
MT_AVX512_BF16 void micro_kernel(int64_t kpairs, const uint32_t* a, const uint32_t* b, Out* c, int64_t ldc,
                                 int64_t rows, int64_t cols) {
  // Every loop over r and v is unrolled, so that acc lives in registers (GCC keeps arrays indexed by a rolled
  // loop on the stack).
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kpairs; ++kp, a += kMr, b += kNr) {
    __m512bh bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  __mmask16 col_mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) col_mask[v] = mask16(cols - 16 * v);
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      if constexpr (std::is_same_v<Out, float>)
        _mm512_mask_storeu_ps(c + r * ldc + 16 * v, col_mask[v], acc[r][v]);
      else
        _mm256_mask_storeu_epi16(c + r * ldc + 16 * v, col_mask[v], round_to_bf16(acc[r][v]));
    }
  }
}

/// The packed panels, reused from call to call by the calling thread: fresh pages cost more than a small product.
uint32_t* workspace(int64_t words) {
  struct alignas(64) Line {
    uint32_t w[16];
  };
  thread_local std::vector<Line> lines;
  const size_t need = static_cast<size_t>(std::max<int64_t>((words + 15) / 16, 1));
  if (lines.size() < need) lines.resize(need);
  return lines.front().w;
}

template <class Out>
MT_AVX512_BF16 void gemm_bf16_avx512(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, Out* c,
                                     int64_t ldc) {
  const int64_t kpairs = (k + 1) / 2;
  const int64_t panel_words = std::max<int64_t>(kpairs, 1);  // words per line of a panel
  auto round_up = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
  const int64_t mc = std::clamp(kABlockBytes / (4 * panel_words) / kMr * kMr, int64_t{kMr}, round_up(m, kMr));
  const int64_t nc = std::clamp(kBBlockBytes / (4 * panel_words) / kNr * kNr, int64_t{kNr}, round_up(n, kNr));
  uint32_t* const packed_b = workspace((mc + nc) * kpairs);  // b first: its panels stay 64-byte aligned
  uint32_t* const packed_a = packed_b + nc * kpairs;
  // Line i of a: row i. k runs along it when a lies as is; element (i, p) at data[i * ld + p] or [p * ld + i].
  auto a_line = [&](int64_t i) { return a.trans ? a.data + i : a.data + i * a.ld; };
  auto b_line = [&](int64_t j) { return b.trans ? b.data + j * b.ld : b.data + j; };
  const int threads = m * n * k >= kParallelMinMacs ? omp_get_max_threads() : 1;

#pragma omp parallel num_threads(threads)
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t b_panels = (std::min(nc, n - jc) + kNr - 1) / kNr;
#pragma omp for schedule(static)
    for (int64_t jp = 0; jp < b_panels; ++jp) {
      const int64_t j = jc + jp * kNr;
      pack_panel<kNr>(b.trans, b_line(j), b.ld, std::min<int64_t>(kNr, n - j), k, packed_b + jp * kpairs * kNr);
    }
    for (int64_t ic = 0; ic < m; ic += mc) {
      const int64_t a_panels = (std::min(mc, m - ic) + kMr - 1) / kMr;
#pragma omp for schedule(static)
      for (int64_t ip = 0; ip < a_panels; ++ip) {
        const int64_t i = ic + ip * kMr;
        pack_panel<kMr>(!a.trans, a_line(i), a.ld, std::min<int64_t>(kMr, m - i), k, packed_a + ip * kpairs * kMr);
      }
      // Tiles in b-panel-major order: a thread's static share walks the a panels under one b panel at a time.
#pragma omp for schedule(static)
      for (int64_t t = 0; t < b_panels * a_panels; ++t) {
        const int64_t jp = t / a_panels, ip = t % a_panels;
        const int64_t i = ic + ip * kMr, j = jc + jp * kNr;
        micro_kernel<Out>(kpairs, packed_a + ip * kpairs * kMr, packed_b + jp * kpairs * kNr, c + i * ldc + j, ldc,
                          std::min<int64_t>(kMr, m - i), std::min<int64_t>(kNr, n - j));
      }
    }
  }
}

#pragma GCC diagnostic pop
#endif  // MT_GEMM_BF16_X86

template <class Out>
void gemm_bf16_checked(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, Out* c, int64_t ldc) {
  MT_CHECK(gemm_bf16_supported(), "gemm_bf16: no AVX512-BF16 (this CPU lacks it or MIXTAPE_CPU_CAPABILITY ",
           "withholds it; ", m, "x", k, " by ", k, "x", n, ")");
  MT_CHECK(m >= 0 && n >= 0 && k >= 0 && ldc >= n, "gemm_bf16: bad sizes m=", m, " n=", n, " k=", k, " ldc=", ldc);
  if (m == 0 || n == 0) return;
#if defined(MT_GEMM_BF16_X86)
  gemm_bf16_avx512(m, n, k, a, b, c, ldc);
#else
  (void)a, (void)b, (void)c;
#endif
}

}  // namespace

bool gemm_bf16_supported() {
#if defined(MT_GEMM_BF16_X86)
  return has_avx512_bf16();
#else
  return false;
#endif
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc) {
  gemm_bf16_checked(m, n, k, a, b, c, ldc);
}
void gemm_bf16(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, BFloat16* c, int64_t ldc) {
  gemm_bf16_checked(m, n, k, a, b, c, ldc);
}

bool use_gemm_bf16(int64_t m, int64_t n, int64_t k) {
  switch (g_path.load(std::memory_order_relaxed)) {
    case Bf16GemmPath::kWidenSgemm: return false;
    case Bf16GemmPath::kAvx512Bf16:
      MT_CHECK(gemm_bf16_supported(), "matmul: the AVX512-BF16 path was forced on a CPU without it (", m, "x", k,
               " by ", k, "x", n, ")");
      return true;
    case Bf16GemmPath::kAuto: break;
  }
  return gemm_bf16_supported() && m * n * k >= kMinMacs;
}

ForceBf16GemmPath::ForceBf16GemmPath(Bf16GemmPath path) : m_previous(g_path.exchange(path)) {}
ForceBf16GemmPath::~ForceBf16GemmPath() { g_path.store(m_previous); }

}  // namespace mixtape::kernels::cpu
