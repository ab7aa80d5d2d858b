// ops/cpu/conv_winograd.cpp — Winograd F(4x4, 3x3) on AVX-512 (ops/cpu/conv_winograd.h).
//
// Per image: the input is packed channels-last into a zero-bordered buffer covering every tile (xt, (hp, wp, K_p)),
// so that a tile's 36 pixels are 36 aligned vector loads of 16 channels; then groups of tiles go through
// the input transform (V, (36, group, K_p)), 36 register-blocked GEMMs against the transformed filters (U, (36, K,
// N_p)) into M (36, group, N_p), and the output transform into a channels-last output (yt), which is finally
// transposed into the (C, H, W) planes. K is the convolution's input channels, N its outputs; both padded to 16
// (K_p, N_p) with zeros. Tensors travel channels-last only inside an image's scratch, which stays in L2.
#include <mixtape/ops/cpu/conv_winograd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <omp.h>

#include <mixtape/core/convert.h>
#include <mixtape/core/error.h>
#include <mixtape/ops/cpu/cpu_features.h>
#include <mixtape/ops/cpu/transpose16.h>
#include <mixtape/ops/ops.h>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start some results from an undefined register, which -Wuninitialized reports once
// inlined into a function with a target attribute (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC warning clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define MT_WINOGRAD_X86 1
#endif

namespace mixtape::kernels::cpu {

namespace {

std::atomic<ConvPath> g_path{ConvPath::kAuto};
std::atomic<bool> g_allow{true};  // set_allow_winograd

constexpr int kTile = 4;    // outputs per tile side
constexpr int kAlpha = 6;   // inputs per tile side: kTile + 3 − 1
constexpr int kXi = 36;     // positions of a transformed tile
// Tiles transformed and multiplied together (a group): their V and M (36 x group x channels) stay in L2 beside the
// packed image. The forward's GEMMs have depth C_in whatever the group: 12 tiles, two register blocks of rows,
// leave room for the transformed filters U. The weight gradient's GEMMs have the group's tiles as their depth and
// load and store the accumulated dU once per group, so its groups are as long as kGroupBytesWeight allows.
constexpr int64_t kGroupForward = 12;
constexpr int64_t kGroupBytesWeight = 512 << 10;
constexpr int64_t kMaxGroup = 64;
// The scratch of one image beyond which the automatic choice keeps im2col: such images are far from what the
// Winograd path was measured on, and each thread would hold this much.
constexpr int64_t kMaxImageScratchBytes = int64_t{256} << 20;

/// G (6x3) of F(4x4, 3x3): U = G g Gᵀ (Lavin & Gray's interpolation points 0, ±1, ±2, ∞).
constexpr double kG[kAlpha][3] = {{1.0 / 4, 0.0, 0.0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                  {-1.0 / 6, 1.0 / 6, -1.0 / 6},  {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                  {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0.0, 0.0, 1.0}};

int64_t round_up16(int64_t v) { return (v + 15) / 16 * 16; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// A 64-byte aligned float buffer that only grows: one per thread and role, reused from call to call.
class Floats {
 public:
  float* get(int64_t count) {
    if (count > m_capacity) {
      const size_t bytes = (static_cast<size_t>(count) * sizeof(float) + 63) / 64 * 64;
      m_data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      MT_CHECK(m_data != nullptr, "conv2d: out of memory allocating ", bytes, " bytes of Winograd scratch");
      m_capacity = count;
    }
    return m_data.get();
  }

 private:
  struct Free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float, Free> m_data;
  int64_t m_capacity = 0;
};

/// One convolution as the kernels see it: K input channels, N output channels, and the tiles covering its output.
struct Plan {
  WinogradShape s;  // K = s.c_in, N = s.c_out
  int64_t ho, wo;
  int64_t tiles_h, tiles_w, tiles;  // tiles of kTile x kTile outputs covering (ho, wo)
  int64_t hp, wp;                   // the packed input: every tile's kAlpha x kAlpha pixels
  int64_t ht, wt;                   // the packed output / output gradient: tiles_h·kTile x tiles_w·kTile
  int64_t k_p, n_p;                 // channels padded to 16
  int64_t group = 1;                // tiles per group (kGroupBytes*): V's and M's rows per ξ
};

/// The plan of a forward (group: kGroupForward tiles) or of a weight gradient (weight: kGroupBytesWeight).
Plan plan_of(const WinogradShape& s, bool weight) {
  Plan p{s, s.ho(), s.wo(), 0, 0, 0, 0, 0, 0, 0, round_up16(s.c_in), round_up16(s.c_out)};
  p.tiles_h = ceil_div(p.ho, kTile);
  p.tiles_w = ceil_div(p.wo, kTile);
  p.tiles = p.tiles_h * p.tiles_w;
  p.ht = p.tiles_h * kTile;
  p.wt = p.tiles_w * kTile;
  p.hp = p.ht + 2;  // >= h + 2·pad: the padded input fits
  p.wp = p.wt + 2;
  // The weight gradient's: as many tiles as fit its budget, in whole register blocks of rows (6 or 12) if it can.
  int64_t fit = kGroupForward;
  if (weight) {
    fit = std::clamp<int64_t>(kGroupBytesWeight / (4 * kXi * (p.k_p + p.n_p)), 1, kMaxGroup);
    if (fit >= 12) fit -= fit % 12;
  }
  p.group = std::clamp<int64_t>(p.tiles, 1, fit);
  return p;
}

/// The bytes of one image's scratch (xt, yt, V and M of a group), for the automatic choice's bound.
int64_t image_scratch_bytes(const Plan& p) {
  return 4 * (p.hp * p.wp * p.k_p + p.ht * p.wt * std::max(p.n_p, p.k_p) + kXi * p.group * (p.k_p + p.n_p));
}

/// U[ξ][k][n] (rows of n_p, zeros past N) = (G g Gᵀ)[ξ] of the filter from input channel k to output n, computed in
/// f64 and rounded once. The forward's filter g(n, k) is weight[n][k]; the input gradient's (flip) is weight[k][n]
/// turned by 180°, the layer's C_out then being K.
template <class T>
void transform_filters(const T* weight, int64_t K, int64_t N, int64_t n_p, bool flip, float* U) {
  std::fill(U, U + kXi * K * n_p, 0.0f);
#pragma omp parallel for schedule(static) if (K * N >= 256)
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const T* src = flip ? weight + (k * N + n) * 9 : weight + (n * K + k) * 9;
      double g[3][3], t[kAlpha][3];
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) g[a][b] = static_cast<float>(flip ? src[(2 - a) * 3 + (2 - b)] : src[a * 3 + b]);
      for (int i = 0; i < kAlpha; ++i)
        for (int b = 0; b < 3; ++b) t[i][b] = kG[i][0] * g[0][b] + kG[i][1] * g[1][b] + kG[i][2] * g[2][b];
      for (int i = 0; i < kAlpha; ++i)
        for (int j = 0; j < kAlpha; ++j)
          U[((i * kAlpha + j) * K + k) * n_p + n] =
              static_cast<float>(t[i][0] * kG[j][0] + t[i][1] * kG[j][1] + t[i][2] * kG[j][2]);
    }
}

/// v rounded once to T.
template <class T>
T round_to(double v) {
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(v);
}

/// dweight[n][k] = (Gᵀ dU G) from dU[ξ][k][n] (rows of n_p), in f64, rounded once to T; overwrites.
template <class T>
void untransform_filter_gradients(const float* dU, int64_t K, int64_t N, int64_t n_p, T* dweight) {
#pragma omp parallel for schedule(static) if (K * N >= 256)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double t[3][kAlpha] = {};  // Gᵀ dU, (3, 6)
      for (int i = 0; i < kAlpha; ++i)
        for (int j = 0; j < kAlpha; ++j) {
          const double du = dU[((i * kAlpha + j) * K + k) * n_p + n];
          for (int a = 0; a < 3; ++a) t[a][j] += kG[i][a] * du;
        }
      T* dst = dweight + (n * K + k) * 9;
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
          double v = 0.0;
          for (int j = 0; j < kAlpha; ++j) v += t[a][j] * kG[j][b];
          dst[a * 3 + b] = round_to<T>(v);
        }
    }
}

#if defined(MT_WINOGRAD_X86)

#define MT_AVX512 __attribute__((target("avx512f")))

MT_AVX512 inline __mmask16 mask16(int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(valid, 0)) - 1u);
}

/// dst[j·ldd + i] = src[i·lds + j] for i < rows, j < cols (both <= 16). Each of the cols rows of dst gets
/// `lanes` lanes: those past `rows` are zeros.
MT_AVX512 inline void transpose_block(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                      int64_t ldd, int64_t lanes) {
  const __mmask16 load = mask16(cols), store = mask16(lanes);
  __m512 r[16];
  for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(load, src + i * lds) : _mm512_setzero_ps();
  transpose16(r);
  for (int64_t j = 0; j < cols; ++j) _mm512_mask_storeu_ps(dst + j * ldd, store, r[j]);
}

/// dst (hd, wd, c_p) = src (c, h, w) placed at [off_h + y][off_w + x][c], zeros around it and in the channels
/// past c (the transposed blocks write all 16 lanes of every pixel they cover, zeros past c).
MT_AVX512 void pack_channels_last(const float* src, int64_t c, int64_t h, int64_t w, float* dst, int64_t hd,
                                  int64_t wd, int64_t c_p, int64_t off_h, int64_t off_w) {
  auto zero = [&](int64_t y, int64_t x0, int64_t x1) {
    if (x1 > x0) std::memset(dst + (y * wd + x0) * c_p, 0, sizeof(float) * static_cast<size_t>((x1 - x0) * c_p));
  };
  for (int64_t y = 0; y < hd; ++y) {
    if (y < off_h || y >= off_h + h) {
      zero(y, 0, wd);
    } else {
      zero(y, 0, off_w);
      zero(y, off_w + w, wd);
    }
  }
  for (int64_t c0 = 0; c0 < c; c0 += 16)  // 16 planes at a time, each read front to back
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x0 = 0; x0 < w; x0 += 16)
        transpose_block(src + (c0 * h + y) * w + x0, h * w, std::min<int64_t>(16, c - c0),
                        std::min<int64_t>(16, w - x0),
                        dst + ((off_h + y) * wd + off_w + x0) * c_p + c0, c_p, 16);
}

/// dst[c][y][x] = src[y][x][c] for dst (c, h, w) and src (·, ws, c_p): the channels-last output back into planes.
MT_AVX512 void unpack_channels_first(const float* src, int64_t ws, int64_t c_p, float* dst, int64_t c, int64_t h,
                                     int64_t w) {
  for (int64_t c0 = 0; c0 < c; c0 += 16)  // 16 planes at a time, each written front to back
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x0 = 0; x0 < w; x0 += 16) {
        const int64_t pixels = std::min<int64_t>(16, w - x0);
        transpose_block(src + (y * ws + x0) * c_p + c0, c_p, pixels, std::min<int64_t>(16, c - c0),
                        dst + (c0 * h + y) * w + x0, h * w, pixels);
      }
}

/// Bᵀ d of six inputs along one axis: v = Bᵀ (d0 .. d5).
MT_AVX512 inline void input_1d(const __m512* d, __m512* v) {  // d[6] -> v[6]
  const __m512 four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(-5.0f), two = _mm512_set1_ps(2.0f);
  const __m512 d42 = _mm512_sub_ps(d[4], d[2]);
  v[0] = _mm512_fmadd_ps(four, d[0], _mm512_fmadd_ps(five, d[2], d[4]));  // 4 d0 − 5 d2 + d4
  v[1] = _mm512_fnmadd_ps(four, _mm512_add_ps(d[1], d[2]), _mm512_add_ps(d[3], d[4]));  // −4 (d1 + d2) + d3 + d4
  v[2] = _mm512_fmadd_ps(four, _mm512_sub_ps(d[1], d[2]), _mm512_sub_ps(d[4], d[3]));   // 4 (d1 − d2) + d4 − d3
  v[3] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[3], d[1]), d42);                         // 2 (d3 − d1) + d4 − d2
  v[4] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[1], d[3]), d42);                         // 2 (d1 − d3) + d4 − d2
  v[5] = _mm512_fmadd_ps(four, d[1], _mm512_fmadd_ps(five, d[3], d[5]));               // 4 d1 − 5 d3 + d5
}

/// Aᵀ m of six transformed values along one axis: four outputs.
MT_AVX512 inline void output_1d(const __m512 m[6], __m512 y[4]) {
  const __m512 a = _mm512_add_ps(m[1], m[2]), b = _mm512_sub_ps(m[1], m[2]);
  const __m512 c = _mm512_add_ps(m[3], m[4]), d = _mm512_sub_ps(m[3], m[4]);
  y[0] = _mm512_add_ps(_mm512_add_ps(m[0], a), c);                                  // m0 + m1 + m2 + m3 + m4
  y[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), d, b);                              // m1 − m2 + 2 (m3 − m4)
  y[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), c, a);                              // m1 + m2 + 4 (m3 + m4)
  y[3] = _mm512_fmadd_ps(_mm512_set1_ps(8.0f), d, _mm512_add_ps(b, m[5]));         // m1 − m2 + 8 (m3 − m4) + m5
}

/// A dy, the adjoint of output_1d: six transformed gradients from four output gradients.
MT_AVX512 inline void output_adjoint_1d(const __m512* g, __m512* m) {  // g[4] -> m[6]
  const __m512 e = _mm512_add_ps(g[0], g[2]), o = _mm512_add_ps(g[1], g[3]);
  const __m512 e4 = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), g[2], g[0]);           // g0 + 4 g2
  const __m512 o8 = _mm512_fmadd_ps(_mm512_set1_ps(8.0f), g[3], _mm512_add_ps(g[1], g[1]));  // 2 g1 + 8 g3
  m[0] = g[0];
  m[1] = _mm512_add_ps(e, o);
  m[2] = _mm512_sub_ps(e, o);
  m[3] = _mm512_add_ps(e4, o8);
  m[4] = _mm512_sub_ps(e4, o8);
  m[5] = g[3];
}

/// The 36 transformed positions of each tile in [t0, t0 + count): out[ξ][t − t0][·] = (T d Tᵀ)[ξ], ξ = 6·row +
/// column, where `transform` maps R values to 6 along one axis and d is the tile's R x R pixels in a packed
/// channels-last image (rows of `ws` pixels of `lanes` channels; tiles kTile pixels apart). out's rows are p.group
/// tiles apart per ξ. The input transform reads 6 x 6 pixels of xt with Bᵀ (input_1d); the weight gradient's
/// adjoint of the output transform reads 4 x 4 output gradients of dyt with A (output_adjoint_1d).
template <int R, void (*transform)(const __m512*, __m512*)>
MT_AVX512 void transform_tiles(const Plan& p, const float* image, int64_t ws, int64_t lanes, int64_t t0, int64_t count,
                               float* out) {
  for (int64_t tl = 0; tl < count; ++tl) {
    const int64_t th = (t0 + tl) / p.tiles_w, tw = (t0 + tl) % p.tiles_w;
    const float* tile = image + (th * kTile * ws + tw * kTile) * lanes;
    for (int64_t c = 0; c < lanes; c += 16) {
      __m512 rows[R][kAlpha];  // transformed along each row of the tile
      for (int i = 0; i < R; ++i) {
        __m512 d[R];
        for (int j = 0; j < R; ++j) d[j] = _mm512_load_ps(tile + (i * ws + j) * lanes + c);
        transform(d, rows[i]);
      }
      for (int j = 0; j < kAlpha; ++j) {
        __m512 col[R], v[kAlpha];
        for (int i = 0; i < R; ++i) col[i] = rows[i][j];
        transform(col, v);
        for (int i = 0; i < kAlpha; ++i) _mm512_store_ps(out + ((i * kAlpha + j) * p.group + tl) * lanes + c, v[i]);
      }
    }
  }
}

/// The outputs of each tile in [t0, t0 + count): yt[4·th + i][4·tw + j][·] = (Aᵀ M A)[i][j] + bias, into the
/// packed output yt (ht, wt, n_p).
MT_AVX512 void output_transform(const Plan& p, const float* M, const float* bias, int64_t t0, int64_t count,
                                float* yt) {
  for (int64_t tl = 0; tl < count; ++tl) {
    const int64_t th = (t0 + tl) / p.tiles_w, tw = (t0 + tl) % p.tiles_w;
    float* tile = yt + (th * kTile * p.wt + tw * kTile) * p.n_p;
    for (int64_t c = 0; c < p.n_p; c += 16) {
      __m512 rows[kAlpha][kTile];  // Aᵀ along each row of M
      for (int i = 0; i < kAlpha; ++i) {
        __m512 m[kAlpha];
        for (int j = 0; j < kAlpha; ++j) m[j] = _mm512_load_ps(M + ((i * kAlpha + j) * p.group + tl) * p.n_p + c);
        output_1d(m, rows[i]);
      }
      const __m512 b = _mm512_load_ps(bias + c);
      for (int j = 0; j < kTile; ++j) {
        __m512 col[kAlpha], y[kTile];
        for (int i = 0; i < kAlpha; ++i) col[i] = rows[i][j];
        output_1d(col, y);
        for (int i = 0; i < kTile; ++i) _mm512_store_ps(tile + (i * p.wt + j) * p.n_p + c, _mm512_add_ps(y[i], b));
      }
    }
  }
}

/// c (MR x 16·NV, rows ldc apart) = (or +=, accumulate) Σ_q a(i, q) · b[q][·] over q < depth, where a(i, q) =
/// a[i·a_rs + q·a_ks] and b's rows are ldb apart (64-byte aligned): MR·NV sums in registers over the whole depth.
template <int MR, int NV>
MT_AVX512 void micro(int64_t depth, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t ldb, float* c,
                     int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = accumulate ? _mm512_load_ps(c + i * ldc + 16 * j) : _mm512_setzero_ps();
  for (int64_t q = 0; q < depth; ++q) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_load_ps(b + q * ldb + 16 * j);
    const float* aq = a + q * a_ks;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(aq[i * a_rs]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_store_ps(c + i * ldc + 16 * j, acc[i][j]);
}

/// Rows of a register tile with NV vectors of columns: 24 accumulators, or as many as fit.
template <int NV>
constexpr int kRows = NV == 4 ? 6 : NV == 3 ? 8 : 12;

/// The last rows < kRows<NV> of a block: one micro-kernel of exactly that many rows.
template <int NV, int R = kRows<NV> - 1>
MT_AVX512 void micro_rows(int64_t rows, int64_t depth, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                          int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return micro<R, NV>(depth, a, a_rs, a_ks, b, ldb, c, ldc, accumulate);
    micro_rows<NV, R - 1>(rows, depth, a, a_rs, a_ks, b, ldb, c, ldc, accumulate);
  }
}

template <int NV>
MT_AVX512 void gemm_columns(int64_t rows, int64_t depth, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                            int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = kRows<NV>;
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) micro<MR, NV>(depth, a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc, accumulate);
  if (r < rows) micro_rows<NV>(rows - r, depth, a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc, accumulate);
}

/// c (rows x cols, cols a multiple of 16) = (or +=) a (rows x depth, strided as in micro) · b (depth x cols).
MT_AVX512 void gemm(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_rs, int64_t a_ks,
                    const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t c0 = 0; c0 < cols; c0 += 64) {
    const float* bc = b + c0;
    float* cc = c + c0;
    switch (std::min<int64_t>(4, (cols - c0) / 16)) {
      case 4: gemm_columns<4>(rows, depth, a, a_rs, a_ks, bc, ldb, cc, ldc, accumulate); break;
      case 3: gemm_columns<3>(rows, depth, a, a_rs, a_ks, bc, ldb, cc, ldc, accumulate); break;
      case 2: gemm_columns<2>(rows, depth, a, a_rs, a_ks, bc, ldb, cc, ldc, accumulate); break;
      default: gemm_columns<1>(rows, depth, a, a_rs, a_ks, bc, ldb, cc, ldc, accumulate); break;
    }
  }
}

/// Each thread's scratch, kept from call to call.
struct Scratch {
  Floats xt, yt, v, m;
  Floats wide;  // an f16/bf16 image widened to f32, or an output image before its rounding
};
thread_local Scratch t_scratch;

/// x (count values) as f32: itself, or widened into the thread's scratch (exact).
template <class T>
const float* widened(const T* x, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    (void)count;
    return x;
  } else {
    float* wide = t_scratch.wide.get(count);
    convert_n(x, wide, count);
    return wide;
  }
}

/// y (N, ho, wo) of one image = the convolution of x (K, h, w) with the transformed filters U (36, K, n_p), plus
/// bias (n_p); overwrites. f16/bf16 images are widened to f32 first and the f32 outputs rounded once at the end.
template <class T>
MT_AVX512 void forward_image(const Plan& p, const T* x_in, const float* U, const float* bias, T* y) {
  const int64_t K = p.s.c_in, N = p.s.c_out;
  const float* x = widened(x_in, K * p.s.h * p.s.w);
  float* xt = t_scratch.xt.get(p.hp * p.wp * p.k_p);
  float* yt = t_scratch.yt.get(p.ht * p.wt * p.n_p);
  float* V = t_scratch.v.get(kXi * p.group * p.k_p);
  float* M = t_scratch.m.get(kXi * p.group * p.n_p);
  pack_channels_last(x, K, p.s.h, p.s.w, xt, p.hp, p.wp, p.k_p, p.s.pad_h, p.s.pad_w);
  for (int64_t t0 = 0; t0 < p.tiles; t0 += p.group) {
    const int64_t count = std::min<int64_t>(p.group, p.tiles - t0);
    transform_tiles<kAlpha, input_1d>(p, xt, p.wp, p.k_p, t0, count, V);
    for (int xi = 0; xi < kXi; ++xi)
      gemm(count, p.n_p, K, V + xi * p.group * p.k_p, p.k_p, 1, U + xi * K * p.n_p, p.n_p, M + xi * p.group * p.n_p,
           p.n_p, false);
    output_transform(p, M, bias, t0, count, yt);
  }
  if constexpr (std::is_same_v<T, float>) {
    unpack_channels_first(yt, p.wt, p.n_p, y, N, p.ho, p.wo);
  } else {
    float* wide = t_scratch.wide.get(N * p.ho * p.wo);
    unpack_channels_first(yt, p.wt, p.n_p, wide, N, p.ho, p.wo);
    convert_n(wide, y, N * p.ho * p.wo);  // core/convert.h: round to nearest even, once
  }
}

/// dU (36, K, n_p) += the transformed weight gradient of one image: V[ξ]ᵀ · (A dY Aᵀ)[ξ] over its tiles; and, unless
/// nullptr, dbias (n_p) += the image's dy summed over its pixels (rows summed in f32, then added in f64).
template <class T>
MT_AVX512 void backward_weight_image(const Plan& p, const T* x, const T* dy, float* dU, double* dbias) {
  const int64_t K = p.s.c_in, N = p.s.c_out;
  float* xt = t_scratch.xt.get(p.hp * p.wp * p.k_p);
  float* dyt = t_scratch.yt.get(p.ht * p.wt * p.n_p);
  float* V = t_scratch.v.get(kXi * p.group * p.k_p);
  float* M = t_scratch.m.get(kXi * p.group * p.n_p);
  pack_channels_last(widened(x, K * p.s.h * p.s.w), K, p.s.h, p.s.w, xt, p.hp, p.wp, p.k_p, p.s.pad_h, p.s.pad_w);
  pack_channels_last(widened(dy, N * p.ho * p.wo), N, p.ho, p.wo, dyt, p.ht, p.wt, p.n_p, 0, 0);
  if (dbias) {
    for (int64_t c = 0; c < p.n_p; c += 16) {
      __m512 image = _mm512_setzero_ps();
      for (int64_t row = 0; row < p.ho; ++row) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t col = 0; col < p.wo; ++col)
          sum = _mm512_add_ps(sum, _mm512_load_ps(dyt + (row * p.wt + col) * p.n_p + c));
        image = _mm512_add_ps(image, sum);
      }
      alignas(64) float sums[16];
      _mm512_store_ps(sums, image);
      for (int j = 0; j < 16; ++j) dbias[c + j] += sums[j];
    }
  }
  for (int64_t t0 = 0; t0 < p.tiles; t0 += p.group) {
    const int64_t count = std::min<int64_t>(p.group, p.tiles - t0);
    transform_tiles<kAlpha, input_1d>(p, xt, p.wp, p.k_p, t0, count, V);
    transform_tiles<kTile, output_adjoint_1d>(p, dyt, p.wt, p.n_p, t0, count, M);
    for (int xi = 0; xi < kXi; ++xi)
      gemm(K, p.n_p, count, V + xi * p.group * p.k_p, 1, p.k_p, M + xi * p.group * p.n_p, p.n_p, dU + xi * K * p.n_p,
           p.n_p, true);
  }
}

/// The convolution of every image of x (n, K, h, w) with transformed filters U, plus bias (n_p): images to threads.
template <class T>
void forward_batch(const Plan& p, const T* x, const float* U, const float* bias, T* y) {
  const int64_t x_image = p.s.c_in * p.s.h * p.s.w, y_image = p.s.c_out * p.ho * p.wo;
#pragma omp parallel for schedule(static) if (p.s.n > 1)
  for (int64_t i = 0; i < p.s.n; ++i) forward_image(p, x + i * x_image, U, bias, y + i * y_image);
}

#endif  // MT_WINOGRAD_X86

void check_supported(const char* what) {
  MT_CHECK(winograd_supported(), "conv2d: ", what, " needs AVX-512F, which this CPU lacks or MIXTAPE_CPU_CAPABILITY ",
           "withholds (use ConvPath::kGemm)");
}

/// The caller thread's buffers for the transformed filters and the per-thread weight gradients.
thread_local Floats t_filters, t_filter_grads;

}  // namespace

bool winograd_supported() {
#if defined(MT_WINOGRAD_X86)
  return has_avx512f();
#else
  return false;
#endif
}

template <class T>
void winograd_conv2d(const WinogradShape& s, const T* x, const T* weight, const T* bias, T* y) {
  check_supported("winograd_conv2d");
#if defined(MT_WINOGRAD_X86)
  const Plan p = plan_of(s, false);
  float* U = t_filters.get(kXi * s.c_in * p.n_p + p.n_p);
  float* bias_p = U + kXi * s.c_in * p.n_p;  // (n_p), zeros past C_out
  transform_filters(weight, s.c_in, s.c_out, p.n_p, false, U);
  std::fill(bias_p, bias_p + p.n_p, 0.0f);
  if (bias)
    for (int64_t c = 0; c < s.c_out; ++c) bias_p[c] = static_cast<float>(bias[c]);
  forward_batch(p, x, U, bias_p, y);
#else
  (void)x, (void)weight, (void)bias, (void)y;
#endif
}

template <class T>
void winograd_conv2d_backward_input(const WinogradShape& s, const T* dy, const T* weight, T* dx) {
  check_supported("winograd_conv2d_backward_input");
#if defined(MT_WINOGRAD_X86)
  // dx = dy, zero-padded by 2 − padding, convolved with the filters turned by 180° from C_out to C_in.
  const WinogradShape t{s.n, s.c_out, s.ho(), s.wo(), s.c_in, 2 - s.pad_h, 2 - s.pad_w};
  const Plan p = plan_of(t, false);
  float* U = t_filters.get(kXi * t.c_in * p.n_p + p.n_p);
  float* zeros = U + kXi * t.c_in * p.n_p;
  transform_filters(weight, t.c_in, t.c_out, p.n_p, true, U);
  std::fill(zeros, zeros + p.n_p, 0.0f);
  forward_batch(p, dy, U, zeros, dx);
#else
  (void)dy, (void)weight, (void)dx;
#endif
}

template <class T>
void winograd_conv2d_backward_weight(const WinogradShape& s, const T* dy, const T* x, T* dweight, T* dbias) {
  check_supported("winograd_conv2d_backward_weight");
#if defined(MT_WINOGRAD_X86)
  const Plan p = plan_of(s, true);
  // One dU per thread, summed in thread order at the end: the result depends on the thread count, not on timing.
  const int threads = s.n > 1 ? omp_get_max_threads() : 1;
  const int64_t per_thread = kXi * s.c_in * p.n_p;
  float* dU = t_filter_grads.get(per_thread * threads);
  std::fill(dU, dU + per_thread * threads, 0.0f);
  std::vector<double> db(dbias ? static_cast<size_t>(p.n_p * threads) : 0, 0.0);  // each thread's bias sums
  const int64_t x_image = s.c_in * s.h * s.w, y_image = s.c_out * p.ho * p.wo;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num();
    float* mine = dU + per_thread * t;
    double* my_db = dbias ? db.data() + p.n_p * t : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < s.n; ++i) backward_weight_image(p, x + i * x_image, dy + i * y_image, mine, my_db);
  }
  for (int t = 1; t < threads; ++t) {
    const float* other = dU + per_thread * t;
    for (int64_t e = 0; e < per_thread; ++e) dU[e] += other[e];
    if (dbias)
      for (int64_t c = 0; c < p.n_p; ++c) db[static_cast<size_t>(c)] += db[static_cast<size_t>(p.n_p * t + c)];
  }
  untransform_filter_gradients(dU, s.c_in, s.c_out, p.n_p, dweight);
  if (dbias)
    for (int64_t c = 0; c < s.c_out; ++c) dbias[c] = round_to<T>(db[static_cast<size_t>(c)]);
#else
  (void)dy, (void)x, (void)dweight, (void)dbias;
#endif
}

std::optional<WinogradShape> use_winograd(DType dtype, const Shape& x_shape, int64_t c_out, const Window2d& w) {
  const ConvPath path = g_path.load();
  const bool computed_in_f32 = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  if (path == ConvPath::kGemm || !computed_in_f32 || !winograd_supported()) return std::nullopt;
  const bool covered = w.kernel[0] == 3 && w.kernel[1] == 3 && w.stride[0] == 1 && w.stride[1] == 1 &&
                       w.dilation[0] == 1 && w.dilation[1] == 1 && w.padding[0] >= 0 && w.padding[0] <= 2 &&
                       w.padding[1] >= 0 && w.padding[1] <= 2;
  if (!covered || x_shape.size() != 4) return std::nullopt;
  const WinogradShape s{x_shape[0], x_shape[1], x_shape[2], x_shape[3], c_out, w.padding[0], w.padding[1]};
  if (s.ho() < 1 || s.wo() < 1 || s.c_in < 1 || s.c_out < 1) return std::nullopt;  // empty channels: nothing to do
  if (path == ConvPath::kWinograd) return s;
  if (!g_allow.load()) return std::nullopt;
  // Both directions' scratch (the input gradient's convolution swaps the channels and grows the image by 2).
  const WinogradShape back{s.n, s.c_out, s.ho(), s.wo(), s.c_in, 2 - s.pad_h, 2 - s.pad_w};
  if (std::max(image_scratch_bytes(plan_of(s, true)), image_scratch_bytes(plan_of(back, false))) >
      kMaxImageScratchBytes)
    return std::nullopt;
  return s;
}

#define MT_WINOGRAD_INSTANTIATE(T)                                                                            \
  template void winograd_conv2d<T>(const WinogradShape&, const T*, const T*, const T*, T*);                    \
  template void winograd_conv2d_backward_input<T>(const WinogradShape&, const T*, const T*, T*);               \
  template void winograd_conv2d_backward_weight<T>(const WinogradShape&, const T*, const T*, T*, T*);
MT_WINOGRAD_INSTANTIATE(float)
MT_WINOGRAD_INSTANTIATE(Half)
MT_WINOGRAD_INSTANTIATE(BFloat16)
#undef MT_WINOGRAD_INSTANTIATE

ForceConvPath::ForceConvPath(ConvPath path) : m_previous(g_path.exchange(path)) {}
ForceConvPath::~ForceConvPath() { g_path.store(m_previous); }

}  // namespace mixtape::kernels::cpu

namespace mixtape {
void set_allow_winograd(bool allow) noexcept { kernels::cpu::g_allow.store(allow); }
bool allow_winograd() noexcept { return kernels::cpu::g_allow.load(); }
}  // namespace mixtape

#if defined(MT_WINOGRAD_X86)
#pragma GCC diagnostic pop
#endif
