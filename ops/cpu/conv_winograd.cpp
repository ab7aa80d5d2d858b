// ops/cpu/conv_winograd.cpp — Winograd F(4x4, 3x3) on AVX-512 or AVX2 (ops/cpu/conv_winograd.h).
//
// Per image: the input is packed channels-last into a zero-bordered buffer covering every tile (xt, (hp, wp, K_p)),
// so that a tile's 36 pixels are 36 aligned vector loads of 16 channels (or 72 of 8); then groups of tiles go through
// the input transform (V, (36, group, K_p)), 36 register-blocked GEMMs against the transformed filters (U, (36, K,
// N_p)) into M (36, group, N_p), and the output transform into a channels-last output (yt), which is finally
// transposed into the (C, H, W) planes. K is the convolution's input channels, N its outputs; both padded to 16
// (K_p, N_p) with zeros. Tensors travel channels-last only inside an image's scratch, which stays in L2. The vector
// kernels are written once (ops/cpu/conv_winograd_kernels.inc) and compiled for AVX-512F and for AVX2 with FMA.
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

#if defined(MT_WINOGRAD_X86)

/// The kernels for AVX-512F: 16 lanes, 32 registers (24 accumulators in the GEMM's register tiles).
namespace avx512 {
#define MT_SIMD __attribute__((target("avx512f")))
struct Simd {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kMaxNv = 4;
  template <int NV>
  static constexpr int kRows = NV == 4 ? 6 : NV == 3 ? 8 : 12;

  MT_SIMD static V zero() { return _mm512_setzero_ps(); }
  MT_SIMD static V set1(float v) { return _mm512_set1_ps(v); }
  MT_SIMD static V load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  MT_SIMD static void store(float* p, V v) { _mm512_store_ps(p, v); }
  MT_SIMD static V add(V a, V b) { return _mm512_add_ps(a, b); }
  MT_SIMD static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  MT_SIMD static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a·b + c, rounded once
  MT_SIMD static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c − a·b, rounded once

  /// dst[j·ldd + i] = src[i·lds + j] for i < rows, j < cols (both <= 16). Each of the cols rows of dst gets
  /// `lanes` lanes: those past `rows` are zeros.
  MT_SIMD static void transpose_block(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                      int64_t ldd, int64_t lanes) {
    const __mmask16 load = mask(cols), store = mask(lanes);
    __m512 r[16];
    for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(load, src + i * lds) : zero();
    transpose16(r);
    for (int64_t j = 0; j < cols; ++j) _mm512_mask_storeu_ps(dst + j * ldd, store, r[j]);
  }

  /// The lanes below `valid`.
  MT_SIMD static __mmask16 mask(int64_t valid) {
    return valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(valid, 0)) - 1u);
  }
};
#include <mixtape/ops/cpu/conv_winograd_kernels.inc>
#undef MT_SIMD
}  // namespace avx512

/// The kernels for AVX2 with FMA: 8 lanes, 16 registers (12 accumulators in a register tile of 6 rows x 16).
namespace avx2 {
#define MT_SIMD __attribute__((target("avx2,fma")))
struct Simd {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kMaxNv = 2;
  template <int NV>
  static constexpr int kRows = NV == 2 ? 6 : 12;

  MT_SIMD static V zero() { return _mm256_setzero_ps(); }
  MT_SIMD static V set1(float v) { return _mm256_set1_ps(v); }
  MT_SIMD static V load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  MT_SIMD static void store(float* p, V v) { _mm256_store_ps(p, v); }
  MT_SIMD static V add(V a, V b) { return _mm256_add_ps(a, b); }
  MT_SIMD static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  MT_SIMD static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }    // a·b + c, rounded once
  MT_SIMD static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }  // c − a·b, rounded once

  /// dst[j·ldd + i] = src[i·lds + j] for i < rows, j < cols (both <= 8). Each of the cols rows of dst gets
  /// `lanes` lanes: those past `rows` are zeros. No memory past the block is touched.
  MT_SIMD static void transpose_block(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                      int64_t ldd, int64_t lanes) {
    __m256 r[8];
    for (int64_t i = 0; i < 8; ++i) r[i] = i < rows ? load_first(src + i * lds, cols) : zero();
    transpose8(r);
    for (int64_t j = 0; j < cols; ++j) store_first(dst + j * ldd, r[j], lanes);
  }

  /// p[0 .. n) in the first n lanes (n <= 8), zeros after: whole vectors load directly, partial ones through a
  /// buffer (AVX2's masked loads and stores, vmaskmovps, are slow on AMD's cores: microcoded stores).
  MT_SIMD static V load_first(const float* p, int64_t n) {
    if (n == 8) return _mm256_loadu_ps(p);
    alignas(32) float buffer[8] = {};
    std::memcpy(buffer, p, sizeof(float) * static_cast<size_t>(n));
    return _mm256_load_ps(buffer);
  }

  /// p[0 .. n) = the first n lanes of v (n <= 8).
  MT_SIMD static void store_first(float* p, V v, int64_t n) {
    if (n == 8) return _mm256_storeu_ps(p, v);
    alignas(32) float buffer[8];
    _mm256_store_ps(buffer, v);
    std::memcpy(p, buffer, sizeof(float) * static_cast<size_t>(n));
  }

  /// The 8 x 8 transpose of r: r[i] lane j becomes r[j] lane i.
  MT_SIMD static void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);  // per 128-bit half: r[2i][0] r[2i+1][0] r[2i][1] ..
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {  // u[4g + e], 128-bit half L: element 4L + e of rows 4g .. 4g + 3
      u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int e = 0; e < 4; ++e) {  // row e takes the low halves of u[e], u[4 + e]; row 4 + e their high halves
      r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
      r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
  }
};
#include <mixtape/ops/cpu/conv_winograd_kernels.inc>
#undef MT_SIMD
}  // namespace avx2

/// The forward convolution of every image (avx512:: or avx2::forward_batch, the widest this CPU has and allows).
template <class T>
void forward_batch(const Plan& p, const T* x, const float* U, const float* bias, T* y) {
  if (has_avx512f()) avx512::forward_batch(p, x, U, bias, y);
  else avx2::forward_batch(p, x, U, bias, y);
}

#endif  // MT_WINOGRAD_X86

void check_supported(const char* what) {
  MT_CHECK(winograd_supported(), "conv2d: ", what, " needs AVX2 with FMA or AVX-512F, which this CPU lacks or ",
           "MIXTAPE_CPU_CAPABILITY withholds (use ConvPath::kGemm)");
}

/// The caller thread's buffers for the transformed filters and the per-thread weight gradients.
thread_local Floats t_filters, t_filter_grads;

}  // namespace

bool winograd_supported() {
#if defined(MT_WINOGRAD_X86)
  return has_avx512f() || has_avx2();
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
  (void)s, (void)x, (void)weight, (void)bias, (void)y;
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
  (void)s, (void)dy, (void)weight, (void)dx;
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
  auto* const image = has_avx512f() ? &avx512::backward_weight_image<T> : &avx2::backward_weight_image<T>;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num();
    float* mine = dU + per_thread * t;
    double* my_db = dbias ? db.data() + p.n_p * t : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < s.n; ++i) image(p, x + i * x_image, dy + i * y_image, mine, my_db);
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
  (void)s, (void)dy, (void)x, (void)dweight, (void)dbias;
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
