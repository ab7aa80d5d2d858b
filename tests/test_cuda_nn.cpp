// tests/test_cuda_nn.cpp — the CUDA softmax, gather/scatter_add, cross-entropy and layer-norm kernels against the CPU's.
//
// The CPU kernels (ops/cpu/nn.cpp) are the reference: every case runs the same
// public kernel (ops/kernels.h) on a CPU tensor and on its copy on the GPU and
// compares within tests/tolerance.h's tolerance of the result's dtype. Both
// backends reduce in f32 (f64), but in different orders, so a reduction over
// n terms gets one stated allowance on top: |gpu − cpu| may exceed the table by
// kOrderUlps · √n · 2⁻²⁴ · max|cpu| (the rounding-error growth of a sum in f32;
// negligible next to an f16/bf16 output's own rounding). gather and
// scatter_add add in the CPU's order and are compared exactly.
//
// `cuda_nn_ops` runs the ops end to end (forward and backward through the tape);
// it needs the CUDA elementwise and reduction kernels as well.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace kernels = mixtape::kernels;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;
using mt::TensorOptions;

namespace {

constexpr DType kFloatDTypes[] = {mt::kF32, mt::kF16, mt::kBF16};
constexpr double kOrderUlps = 4.0;
constexpr double kF32Eps = 5.9604644775390625e-08;  // 2^-24

/// The allowance for reduction order over n terms, relative to the magnitude of the result.
double order_allowance(int64_t n) { return kOrderUlps * std::sqrt(static_cast<double>(n)) * kF32Eps; }

std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << " shape " << t.shape() << (t.is_contiguous() ? "" : " (non-contiguous)");
  return os.str();
}

/// |actual − expected| <= atol + rtol·|expected| + extra·max|expected| elementwise (NaN matches NaN);
/// `actual` may live on any device. A failure names the configuration and the first mismatching pairs.
void expect_close(const Tensor& actual, const Tensor& expected, mt::test::Tolerance tol, double extra,
                  const std::string& config) {
  BOOST_REQUIRE_MESSAGE(actual.shape() == expected.shape() && actual.dtype() == expected.dtype(),
                        config << ": got " << describe(actual) << ", expected " << describe(expected));
  const std::vector<double> a = actual.cpu().to_vector<double>(), e = expected.cpu().to_vector<double>();
  double scale = 0;
  for (double v : e)
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    const bool same_inf = std::isinf(e[i]) && a[i] == e[i];
    const bool ok = both_nan || same_inf || std::fabs(a[i] - e[i]) <= tol.atol + tol.rtol * std::fabs(e[i]) + extra * scale;
    if (!ok && bad++ < 5) first << " [" << i << "] gpu " << a[i] << " vs cpu " << e[i] << ";";
  }
  BOOST_CHECK_MESSAGE(bad == 0, config << ": " << bad << " of " << a.size() << " elements differ (rtol " << tol.rtol
                                       << ", atol " << tol.atol << ", order allowance " << extra << " x " << scale
                                       << "):" << first.str());
}

void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& config) {
  expect_close(actual, expected, {0.0, 0.0}, 0.0, config);
}

Tensor randn_as(const Shape& shape, DType dtype, double offset = 0.0) {
  Tensor x = mt::randn(shape);
  if (offset != 0.0) x = kernels::scalar(kernels::ScalarOp::kAdd, x, offset);
  return x.to(dtype);
}

Tensor gpu(const Tensor& t) { return t.to(Device::cuda()); }

/// t on the device as a contiguous view one element into its storage, so that its data pointer is not 16-byte
/// aligned (gpu() gives a fresh, aligned allocation): the kernels' element-load paths.
Tensor gpu_misaligned(const Tensor& t) {
  const Tensor flat = mt::zeros({t.numel() + 1}, mt::TensorOptions(t.dtype()).device(Device::cuda()));
  Tensor view = flat.narrow(0, 1, t.numel()).reshape(t.shape());
  view.copy_(gpu(t));
  return view;
}

/// Forward and backward of softmax/log_softmax of x along dim: the CUDA kernels against the CPU's.
void check_softmax(const Tensor& x, int64_t dim, bool log, DType out_dtype, const std::string& what) {
  std::ostringstream os;
  os << (log ? "log_softmax" : "softmax") << " of " << describe(x) << " along dim " << dim << " -> " << out_dtype
     << " (" << what << ")";
  const std::string config = os.str();
  const int64_t C = x.dim() == 0 ? 1 : x.size(dim < 0 ? dim + x.dim() : dim);
  const Tensor y_cpu = kernels::softmax(x, dim, log, out_dtype);
  const Tensor y_gpu = kernels::softmax(gpu(x), dim, log, out_dtype);
  BOOST_REQUIRE(y_gpu.is_cuda());
  expect_close(y_gpu, y_cpu, mt::test::tolerance(out_dtype), order_allowance(C), config);

  const Tensor dy = randn_as(x.shape(), out_dtype);
  const Tensor dx_cpu = kernels::softmax_backward(dy, y_cpu, dim, log);
  const Tensor dx_gpu = kernels::softmax_backward(gpu(dy), gpu(y_cpu), dim, log);
  expect_close(dx_gpu, dx_cpu, mt::test::tolerance(out_dtype), order_allowance(C), config + ", backward");
}

/// Six f32 rows of C with special values: NaNs (row 0: at column 3 and at column 0, the first element of a thread's
/// first pack), −inf at every even column (row 1), all −inf (row 2), a plain row with one 5 (row 3), a +inf (row 4),
/// and −inf everywhere but a 5 at the end (row 5: one thread holds the max, the others only −inf).
Tensor special_rows(int64_t C) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = mt::zeros({6, C});
  x.set({0, 3 % C}, nan);
  x.set({0, 0}, nan);
  for (int64_t c = 0; c < C; c += 2) x.set({1, c}, -inf);
  for (int64_t c = 0; c < C; ++c) x.set({2, c}, -inf);
  x.set({3, C - 1}, 5.0);
  x.set({4, C / 2}, inf);
  for (int64_t c = 0; c + 1 < C; ++c) x.set({5, c}, -inf);
  x.set({5, C - 1}, 5.0);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_nn)

// ---- softmax ---------------------------------------------------------------------------

/// Row lengths for the row kernels. Multiples of 8 elements take the register kernels up to 32768: a warp a row
/// up to 1024 (8, 40: one 16-byte pack a lane; 200, 400, 1000: 1, 2 or 4 packs for f32/f16/bf16, 1000 with lanes
/// past the row's end), a 256-thread block up to 8192 (1032, 4096, 6000, 8192), a 1024-thread block up to 32768
/// (8200, 20000 and 32768; the backward keeps y or x in shared memory from 8196 in f32, 16392 in 16-bit); 32776 is
/// vectorised but too long, and the odd lengths (7, 1023, 1025, 8193, 32769, 65537) take the strided kernels on
/// either side of each boundary.
constexpr int64_t kRowLengths[] = {1,    7,    8,    32,   40,   200,   400,   1000,  1023,  1024,  1025,
                                   1032, 4096, 6000, 8192, 8193, 8200, 20000, 32768, 32769, 32776, 65537};

// Row lengths across the warp-per-row (<= 1024), 256-thread and 1024-thread block kernels, with and without
// 16-byte vectors.
BOOST_AUTO_TEST_CASE(softmax_rows_match_cpu, MT_GPU_TEST) {
  mt::manual_seed(1);
  for (DType dt : kFloatDTypes)
    for (int64_t C : kRowLengths)
      for (bool log : {false, true}) {
        const int64_t rows = C >= 4096 ? 5 : 37;
        check_softmax(randn_as({rows, C}, dt), -1, log, dt, "rows");
      }
}

// The cross-entropy path: f16/bf16 logits, log_softmax written in f32.
BOOST_AUTO_TEST_CASE(softmax_reduced_inputs_to_f32, MT_GPU_TEST) {
  mt::manual_seed(2);
  for (DType dt : {mt::kF16, mt::kBF16})
    for (int64_t C : {10, 1000, 4096})
      for (bool log : {false, true}) check_softmax(randn_as({16, C}, dt), 1, log, mt::kF32, "f32 output");
  check_softmax(randn_as({4, 100}, mt::kF32), 1, true, mt::kF64, "f64 output");
  check_softmax(randn_as({4, 64}, mt::kF64), 1, false, mt::kF64, "f64");
}

// Rows near +1000 in f16: statistics in f16 would lose everything (f16 spacing there is 0.5, exp overflows).
BOOST_AUTO_TEST_CASE(softmax_f16_large_offset, MT_GPU_TEST) {
  mt::manual_seed(3);
  for (int64_t C : {7, 1023, 4096, 32768})
    for (bool log : {false, true}) {
      const Tensor x = randn_as({3, C}, mt::kF16, 1000.0);
      check_softmax(x, -1, log, mt::kF16, "offset +1000");
      // And the answer does not depend on the offset (beyond the f16 quantisation of the inputs).
      const Tensor y = kernels::softmax(gpu(x), -1, log, mt::kF32);
      const Tensor y_shift = kernels::softmax(gpu(kernels::scalar(kernels::ScalarOp::kAdd, x.to(mt::kF32), -1000.0)),
                                              -1, log, mt::kF32);
      expect_close(y, y_shift.cpu(), mt::test::tolerance(mt::kF32), order_allowance(C), "offset invariance");
    }
}

// Dims 0, 1 and -1 of 3-D inputs: the column kernel (many columns, or short dims) and the permuted-copy path.
BOOST_AUTO_TEST_CASE(softmax_any_dim, MT_GPU_TEST) {
  mt::manual_seed(4);
  const Shape shapes[] = {{5, 6, 7}, {300, 4, 5}, {33, 40, 600}, {4, 7, 64}, {2, 3000, 3}};
  for (DType dt : kFloatDTypes)
    for (const Shape& s : shapes)
      for (int64_t dim : {0, 1, -1})
        for (bool log : {false, true}) check_softmax(randn_as(s, dt), dim, log, dt, "3-D");
  check_softmax(mt::randn({}), 0, false, mt::kF32, "0-d");
  check_softmax(mt::randn({}), 0, true, mt::kF32, "0-d");
}

BOOST_AUTO_TEST_CASE(softmax_non_contiguous, MT_GPU_TEST) {
  mt::manual_seed(5);
  for (DType dt : kFloatDTypes) {
    const Tensor base = randn_as({64, 130}, dt);
    const Tensor transposed = mt::raw::transpose(base, 0, 1);         // (130, 64), strides (1, 130)
    const Tensor strided = mt::raw::slice(base, 1, 1, 129, 2);        // (64, 64), step 2, offset 1
    for (bool log : {false, true}) {
      check_softmax(transposed, -1, log, dt, "transposed");
      check_softmax(transposed, 0, log, dt, "transposed");
      check_softmax(strided, -1, log, dt, "strided");
      check_softmax(strided, 0, log, dt, "strided");
    }
  }
}

// NaN rows stay NaN, −inf entries get probability 0, an all −inf row is NaN, a +inf makes its row NaN — like the
// CPU — in the warp, 256-thread and 1024-thread register kernels (40, 1000, 8200, 20000), the strided kernels
// with 16-byte packs (40000) and element loads (1023, 40001), f64 (always strided), f16 into f32, and the column
// kernel (dim 0).
BOOST_AUTO_TEST_CASE(softmax_special_values, MT_GPU_TEST) {
  for (int64_t C : {40, 1000, 1023, 8200, 20000, 40000, 40001}) {
    const Tensor x = special_rows(C);
    for (DType dt : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16})
      for (bool log : {false, true}) check_softmax(x.to(dt), -1, log, dt, "special values");
    for (bool log : {false, true}) check_softmax(x.to(mt::kF16), -1, log, mt::kF32, "special values, f32 output");
  }
  for (DType dt : kFloatDTypes)
    for (bool log : {false, true}) check_softmax(special_rows(40).to(dt).t(), 0, log, dt, "special values, dim 0");
}

// f64 rows (the strided kernels, not unrolled) at lengths inside and across each block-size boundary.
BOOST_AUTO_TEST_CASE(softmax_f64_rows, MT_GPU_TEST) {
  mt::manual_seed(12);
  for (int64_t C : {7, 1024, 1025, 8193, 40000})
    for (bool log : {false, true}) check_softmax(randn_as({C > 8192 ? 3 : 33, C}, mt::kF64), -1, log, mt::kF64, "f64");
}

// ---- layer norm -------------------------------------------------------------------------

namespace {

/// Which device buffers of a layer_norm check start one element past 16 bytes (gpu_misaligned).
enum class Misalign { kNone, kData, kWeight };

void check_layer_norm(const Tensor& x, int64_t M, const Tensor& w, const Tensor& b, const std::string& what,
                      Misalign misalign = Misalign::kNone) {
  std::ostringstream os;
  os << "layer_norm of " << describe(x) << " over " << M << " elements, weight "
     << (w.defined() ? describe(w) : "none") << ", bias " << (b.defined() ? describe(b) : "none") << " (" << what
     << ")";
  const std::string config = os.str();
  const DType stats = x.dtype() == mt::kF64 ? mt::kF64 : mt::kF32;
  auto data = [&](const Tensor& t) { return misalign == Misalign::kData ? gpu_misaligned(t) : gpu(t); };
  auto param = [&](const Tensor& t) {
    return !t.defined() ? Tensor() : misalign == Misalign::kWeight ? gpu_misaligned(t) : gpu(t);
  };
  const Tensor wg = param(w), bg = param(b);
  const auto r_cpu = kernels::layer_norm(x, M, w, b, 1e-5);
  const auto r_gpu = kernels::layer_norm(data(x), M, wg, bg, 1e-5);
  expect_close(r_gpu.y, r_cpu.y, mt::test::tolerance(x.dtype()), order_allowance(M), config + ": y");
  expect_close(r_gpu.mean, r_cpu.mean, mt::test::tolerance(stats), order_allowance(M), config + ": mean");
  expect_close(r_gpu.rstd, r_cpu.rstd, mt::test::tolerance(stats), order_allowance(M), config + ": rstd");

  // Backward from the CPU's statistics on both sides: only the order of the sums differs.
  const Tensor dy = randn_as(x.shape(), x.dtype());
  const int64_t rows = r_cpu.mean.numel();
  const auto g_cpu = kernels::layer_norm_backward(dy, x, r_cpu.mean, r_cpu.rstd, w, b.defined());
  const auto g_gpu =
      kernels::layer_norm_backward(data(dy), data(x), gpu(r_cpu.mean), gpu(r_cpu.rstd), wg, b.defined());
  expect_close(g_gpu.dx, g_cpu.dx, mt::test::tolerance(x.dtype()), order_allowance(M), config + ": dx");
  BOOST_CHECK_EQUAL(g_gpu.dweight.defined(), w.defined());
  BOOST_CHECK_EQUAL(g_gpu.dbias.defined(), b.defined());
  if (w.defined())
    expect_close(g_gpu.dweight, g_cpu.dweight, mt::test::tolerance(g_cpu.dweight.dtype()), order_allowance(rows),
                 config + ": dweight");
  if (b.defined())
    expect_close(g_gpu.dbias, g_cpu.dbias, mt::test::tolerance(g_cpu.dbias.dtype()), order_allowance(rows),
                 config + ": dbias");
}

}  // namespace

BOOST_AUTO_TEST_CASE(layer_norm_matches_cpu, MT_GPU_TEST) {
  mt::manual_seed(6);
  for (DType dt : kFloatDTypes)
    // Rows of up to 8192 sum dweight/dbias in the dx kernel's shared memory, longer ones in a second pass; the
    // lengths cross every register kernel's boundaries and the strided kernels' (kRowLengths).
    for (int64_t M : kRowLengths) {
      const int64_t rows = M >= 4096 ? 9 : 300;  // 300 rows: several chunks of the dweight/dbias partial sums
      const Tensor x = randn_as({rows, M}, dt);
      const Tensor w = randn_as({M}, dt), b = randn_as({M}, dt);
      check_layer_norm(x, M, w, b, "weight and bias");
      check_layer_norm(x, M, Tensor(), Tensor(), "no parameters");
      check_layer_norm(x, M, w, Tensor(), "weight only");
      check_layer_norm(x, M, Tensor(), b, "bias only");
    }
}

BOOST_AUTO_TEST_CASE(layer_norm_shapes_and_params, MT_GPU_TEST) {
  mt::manual_seed(7);
  // Trailing dims (4, 8) normalised together; f32 parameters with f16 data; a non-contiguous input.
  const Tensor x = randn_as({5, 3, 4, 8}, mt::kF16);
  check_layer_norm(x, 32, randn_as({4, 8}, mt::kF32), randn_as({4, 8}, mt::kF32), "f32 params, 2 trailing dims");
  const Tensor xt = mt::raw::transpose(randn_as({64, 40}, mt::kF32), 0, 1);
  check_layer_norm(xt, 64, randn_as({64}, mt::kF32), randn_as({64}, mt::kF32), "transposed");
  check_layer_norm(randn_as({2, 3, 100}, mt::kF64), 100, randn_as({100}, mt::kF64), Tensor(), "f64");
  check_layer_norm(randn_as({6000, 64}, mt::kF32), 64, randn_as({64}, mt::kF32), randn_as({64}, mt::kF32),
                   "many rows");
  // More rows than the resident blocks hold at once: each block's rows are strided over the whole tensor.
  check_layer_norm(randn_as({20000, 1024}, mt::kBF16), 1024, randn_as({1024}, mt::kBF16), randn_as({1024}, mt::kBF16),
                   "rows beyond one sweep of the grid");
  check_layer_norm(randn_as({3000, 2048}, mt::kF32), 2048, randn_as({2048}, mt::kF32), Tensor(),
                   "rows beyond one sweep of the grid, a block a row");
  // Rows longer than 8192 sum dweight/dbias in a second pass, 64 rows a chunk: several chunks, 16-byte packs.
  // (On sm_90 aligned rows of up to 32768 run as clusters instead: off here, so that the pass runs on every device.)
  const mt::test::AllowClusters off(false);
  check_layer_norm(randn_as({200, 8200}, mt::kF16), 8200, randn_as({8200}, mt::kF16), randn_as({8200}, mt::kF16),
                   "several chunks of the parameter pass");
  for (DType dt : {mt::kF32, mt::kBF16})  // element loads (8193) and 16-byte packs (20000), the last chunk partial
    for (int64_t M : {8193, 20000})
      check_layer_norm(randn_as({200, M}, dt), M, randn_as({M}, dt), randn_as({M}, dt), "chunks of the parameter pass");
}

// Row owners (a warp or a block of the fused backward) that add several rows into their dweight/dbias slots:
// more rows than the resident row owners, in every dtype and register tier of the fused kernel.
BOOST_AUTO_TEST_CASE(layer_norm_fused_columns_over_many_rows, MT_GPU_TEST MT_LARGE_TEST) {
  mt::manual_seed(9);
  const std::pair<int64_t, int64_t> shapes[] = {{3000, 200}, {3000, 1000}, {4000, 1032}, {4000, 4096}, {2000, 8192}};
  for (DType dt : kFloatDTypes)
    for (auto [rows, M] : shapes)
      check_layer_norm(randn_as({rows, M}, dt), M, randn_as({M}, dt), randn_as({M}, dt), "many rows an owner");
}

// Rows longer than 8192 with dweight/dbias: on sm_90 a cluster of S blocks shares each row (S = 3, 4, 5, 5, 6, 7,
// 8, 8 for these lengths, the last slab shorter but at 20480 and 32768), the clusters striding over 300 rows, so
// that each block runs several rows (both exchange slots) and the cluster sums meet in rank order; elsewhere the
// two-pass path.
// (A sweep: ctest runs it, the sanitizers run layer_norm_cluster_kernel_under_sanitizers instead.)
BOOST_AUTO_TEST_CASE(layer_norm_long_rows_with_parameters, MT_GPU_TEST MT_LARGE_TEST) {
  mt::manual_seed(13);
  const bool sm90 = mt::cuda::device_properties(mt::cuda::current_device()).major >= 9;
  for (DType dt : kFloatDTypes)
    for (int64_t M : {8200, 12296, 16400, 20480, 22536, 24600, 28680, 32768}) {
      mt::cuda::reset_debug_counters();
      const Tensor x = randn_as({300, M}, dt), w = randn_as({M}, dt), b = randn_as({M}, dt);
      check_layer_norm(x, M, w, b, "long rows, weight and bias");
      check_layer_norm(x, M, Tensor(), b, "long rows, bias only");
      check_layer_norm(randn_as({2, M}, dt), M, w, Tensor(), "long rows, fewer rows than clusters, weight only");
      // On sm_90 each of the three backwards ran as clusters.
      if (sm90)
        BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 3,
                   "layer_norm backward of " << dt << " rows of " << M << ": "
                                             << mt::cuda::debug_counters().cluster_launches << " cluster launches");
    }
  // The two-pass path the other devices run, on this one too.
  const mt::test::AllowClusters off(false);
  mt::cuda::reset_debug_counters();
  for (DType dt : kFloatDTypes)
    check_layer_norm(randn_as({300, 20480}, dt), 20480, randn_as({20480}, dt), randn_as({20480}, dt),
                     "long rows, clusters off");
  BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 0);
}

// A few rows of the cluster kernel's shortest and longest lengths, small enough for compute-sanitizer (which must
// see the cluster kernel itself on sm_90, not the two-pass path).
BOOST_AUTO_TEST_CASE(layer_norm_cluster_kernel_under_sanitizers, MT_GPU_TEST) {
  mt::manual_seed(14);
  mt::cuda::reset_debug_counters();
  for (DType dt : {mt::kF32, mt::kBF16})
    for (int64_t M : {8200, 32768})
      check_layer_norm(randn_as({12, M}, dt), M, randn_as({M}, dt), randn_as({M}, dt), "long rows, a few");
  if (mt::cuda::device_properties(mt::cuda::current_device()).major >= 9)
    BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 4);
}

// Dynamic shared memory of exactly 48 KiB in kernels that also have static shared memory (their reductions'): past
// the 48 KiB a kernel gets without opting in, so its limit must be raised first. The fused backward's columns of
// rows of 6144 (2 · 6144 f32, in the register kernel, and in the strided one for misaligned data) and of f64 rows
// of 3072 (2 · 3072 f64).
BOOST_AUTO_TEST_CASE(layer_norm_shared_memory_at_48_kib, MT_GPU_TEST) {
  mt::manual_seed(15);
  for (DType dt : kFloatDTypes) {
    check_layer_norm(randn_as({50, 6144}, dt), 6144, randn_as({6144}, dt), randn_as({6144}, dt), "48 KiB of columns");
    check_layer_norm(randn_as({50, 6144}, dt), 6144, randn_as({6144}, dt), Tensor(), "48 KiB of columns, misaligned",
                     Misalign::kData);
  }
  check_layer_norm(randn_as({50, 3072}, mt::kF64), 3072, randn_as({3072}, mt::kF64), randn_as({3072}, mt::kF64),
                   "f64, 48 KiB of columns");
}

// f64 through every path: warp and block rows, fused columns (<= 8192) and the parameter pass, odd lengths.
BOOST_AUTO_TEST_CASE(layer_norm_f64, MT_GPU_TEST) {
  mt::manual_seed(10);
  for (int64_t M : {7, 1000, 1500, 8193, 20000}) {
    const int64_t rows = M > 8192 ? 70 : 300;
    const Tensor x = randn_as({rows, M}, mt::kF64), w = randn_as({M}, mt::kF64), b = randn_as({M}, mt::kF64);
    check_layer_norm(x, M, w, b, "f64, weight and bias");
    check_layer_norm(x, M, Tensor(), b, "f64, bias only");
  }
}

// Data or parameters one element past 16 bytes: the element-load kernels, which a fresh allocation never takes.
BOOST_AUTO_TEST_CASE(layer_norm_misaligned_buffers, MT_GPU_TEST) {
  mt::manual_seed(11);
  for (DType dt : kFloatDTypes)
    for (int64_t M : {1024, 4096, 8200})
      check_layer_norm(randn_as({40, M}, dt), M, randn_as({M}, dt), randn_as({M}, dt), "misaligned data",
                       Misalign::kData);
  for (int64_t M : {1024, 8200})  // an f32 weight is used in place: the fused path falls back to the strided kernel
    check_layer_norm(randn_as({300, M}, mt::kF32), M, randn_as({M}, mt::kF32), randn_as({M}, mt::kF32),
                     "misaligned f32 weight and bias", Misalign::kWeight);
}

// f16 rows near +1000: the mean is summed relative to the first element, so nothing cancels.
BOOST_AUTO_TEST_CASE(layer_norm_f16_large_offset, MT_GPU_TEST) {
  mt::manual_seed(8);
  for (int64_t M : {7, 1000, 1023, 4096, 20000, 32768})
    check_layer_norm(randn_as({4, M}, mt::kF16, 1000.0), M, Tensor(), Tensor(), "offset +1000");
  for (int64_t M : {4096, 32768})  // with parameters: the fused columns, and the cluster kernel on sm_90
    check_layer_norm(randn_as({40, M}, mt::kF16, 1000.0), M, randn_as({M}, mt::kF16), randn_as({M}, mt::kF16),
                     "offset +1000, weight and bias");
}

// ---- gather / scatter_add -------------------------------------------------------------------

// Cross-entropy's shapes: logits (N, C), one class per row (N, 1) along dim 1.
BOOST_AUTO_TEST_CASE(gather_scatter_add_cross_entropy_shapes, MT_GPU_TEST) {
  mt::manual_seed(9);
  for (DType dt : kFloatDTypes)
    for (int64_t C : {1, 10, 1000, 32768}) {
      const int64_t N = 257;
      const Tensor x = randn_as({N, C}, dt);
      const Tensor index = mt::randint(0, C, {N, 1});
      std::ostringstream os;
      os << "(N, C) = (" << N << ", " << C << "), " << dt;
      expect_equal(kernels::gather(gpu(x), 1, gpu(index)), kernels::gather(x, 1, index), "gather " + os.str());
      const Tensor src = randn_as({N, 1}, dt);
      expect_equal(kernels::scatter_add(x.shape(), 1, gpu(index), gpu(src)), kernels::scatter_add(x.shape(), 1, index, src),
                   "scatter_add " + os.str());
    }
}

// Colliding indices (summed in the CPU's order, in f32, rounded once), other dims, smaller index
// extents, non-contiguous operands and non-floating gathers.
BOOST_AUTO_TEST_CASE(gather_scatter_add_general, MT_GPU_TEST) {
  mt::manual_seed(10);
  for (DType dt : kFloatDTypes) {
    const Tensor index = mt::randint(0, 3, {6, 50});  // 50 values per row into 3 classes: many collisions
    const Tensor src = randn_as({6, 50}, dt);
    expect_equal(kernels::scatter_add({8, 3}, 1, gpu(index), gpu(src)), kernels::scatter_add({8, 3}, 1, index, src),
                 "scatter_add with collisions, " + std::string(mt::dtype_name(dt)));
    const Tensor index0 = mt::randint(0, 4, {20, 5, 2});
    const Tensor src0 = randn_as({20, 5, 2}, dt);
    expect_equal(kernels::scatter_add({4, 6, 3}, 0, gpu(index0), gpu(src0)),
                 kernels::scatter_add({4, 6, 3}, 0, index0, src0), "scatter_add along dim 0");
    const Tensor x = randn_as({7, 9, 11}, dt);
    const Tensor gi = mt::randint(0, 9, {5, 13, 4});
    expect_equal(kernels::gather(gpu(x), 1, gpu(gi)), kernels::gather(x, 1, gi), "gather along dim 1");
    // Non-contiguous x, index and src.
    const Tensor xt = mt::raw::transpose(x, 0, 2);  // (11, 9, 7)
    const Tensor git = mt::raw::transpose(mt::randint(0, 9, {3, 4, 10}), 0, 2);  // (10, 4, 3)
    expect_equal(kernels::gather(gpu(xt), 1, gpu(git)), kernels::gather(xt, 1, git), "gather, transposed operands");
    const Tensor srct = mt::raw::transpose(randn_as({3, 4, 10}, dt), 0, 2);
    expect_equal(kernels::scatter_add({10, 9, 3}, 1, gpu(git), gpu(srct)), kernels::scatter_add({10, 9, 3}, 1, git, srct),
                 "scatter_add, transposed operands");
  }
  const Tensor xi = mt::randint(-100, 100, {4, 6});
  const Tensor ii = mt::randint(0, 6, {4, 6});
  expect_equal(kernels::gather(gpu(xi), 1, gpu(ii)), kernels::gather(xi, 1, ii), "gather of i64");
  const Tensor xf64 = randn_as({4, 6}, mt::kF64);
  const Tensor i0 = mt::randint(0, 4, {3, 6});
  expect_equal(kernels::gather(gpu(xf64), 0, gpu(i0)), kernels::gather(xf64, 0, i0), "gather of f64 along dim 0");
}

// Index values the host cannot check on the GPU: gather gives NaN, scatter_add skips them; nothing faults.
BOOST_AUTO_TEST_CASE(gather_scatter_add_out_of_range, MT_GPU_TEST) {
  const Tensor x = gpu(mt::ones({2, 3}));
  const Tensor index = gpu(mt::tensor<int64_t>({0, 7, -1, 2}).reshape({2, 2}));
  const std::vector<float> g = kernels::gather(x, 1, index).cpu().to_vector<float>();
  BOOST_CHECK_EQUAL(g[0], 1.0f);
  BOOST_CHECK(std::isnan(g[1]) && std::isnan(g[2]));
  BOOST_CHECK_EQUAL(g[3], 1.0f);
  const std::vector<float> s =
      kernels::scatter_add({2, 3}, 1, index, gpu(mt::ones({2, 2}))).cpu().to_vector<float>();
  BOOST_CHECK((s == std::vector<float>{1, 0, 0, 0, 0, 1}));
}

// ---- fused cross-entropy ------------------------------------------------------------------

namespace {

DType acc_of(DType dt) { return dt == mt::kF64 ? mt::kF64 : mt::kF32; }

/// Every element of `t` (on any device) is finite, except in `nan_rows` of a (rows, ...) tensor, where every
/// element must be NaN.
void expect_finite(const Tensor& t, const std::string& config, const std::vector<int64_t>& nan_rows = {}) {
  const std::vector<double> v = t.cpu().to_vector<double>();
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0), per_row = rows == 0 ? 0 : t.numel() / rows;
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    const bool nan_row = std::find(nan_rows.begin(), nan_rows.end(), i / per_row) != nan_rows.end();
    const bool ok = nan_row ? std::isnan(v[static_cast<size_t>(i)]) : std::isfinite(v[static_cast<size_t>(i)]);
    if (!ok && bad++ < 5) first << " [" << i << "] " << v[static_cast<size_t>(i)] << ";";
  }
  BOOST_CHECK_MESSAGE(bad == 0, config << ": " << bad << " of " << v.size()
                                       << " elements are not finite (or not NaN in a bad-target row):" << first.str());
}

/// The CUDA fused cross-entropy kernels against the CPU's on x (rows, C): targets random, every 7th row
/// ignored; the backward gets the CPU's lse (its contract) and a random per-row scale, then one scale for all rows.
/// x_gpu: the logits on the device when they must be a particular view of x's values (default: a copy of x).
void check_cross_entropy(const Tensor& x, double eps, const std::string& what, const Tensor& x_gpu = Tensor()) {
  const int64_t rows = x.size(0), C = x.size(1);
  const DType dt = x.dtype(), A = acc_of(dt);
  Tensor target = mt::randint(0, C, {rows});
  for (int64_t i = 3; i < rows; i += 7) target.set({i}, -100);
  std::ostringstream os;
  os << "cross_entropy of " << describe(x) << " (" << what << "), smoothing " << eps;
  const std::string config = os.str();

  const kernels::CrossEntropyResult cpu = kernels::cross_entropy(x, target, -100, eps);
  const Tensor xg = x_gpu.defined() ? x_gpu : gpu(x);
  const kernels::CrossEntropyResult g = kernels::cross_entropy(xg, gpu(target), -100, eps);
  BOOST_REQUIRE(g.loss.is_cuda() && g.lse.is_cuda());
  // Losses and lse are in A, made of sums over C terms in different orders.
  expect_close(g.loss, cpu.loss, mt::test::tolerance(A), order_allowance(C), config + ", loss");
  expect_close(g.lse, cpu.lse, mt::test::tolerance(A), order_allowance(C), config + ", lse");
  expect_finite(g.loss, config + ", loss");
  expect_finite(g.lse, config + ", lse");
  // The reductions: a sum of the (non-negative) row losses in another order, the count exact.
  expect_close(g.sum, cpu.sum, mt::test::tolerance(A), order_allowance(C) + order_allowance(rows), config + ", sum");
  expect_close(g.mean, cpu.mean, mt::test::tolerance(A), order_allowance(C) + order_allowance(rows), config + ", mean");
  expect_close(g.count, cpu.count, {0, 0}, 0.0, config + ", count");

  const Tensor w = randn_as({rows}, A);
  const Tensor dx_cpu = kernels::cross_entropy_backward(x, target, cpu.lse, w, -100, eps, Tensor());
  const Tensor dx_gpu = kernels::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(w), -100, eps, Tensor());
  // Elementwise from the same lse: the two backends differ by their exp's last-ulp error before the one rounding.
  expect_close(dx_gpu, dx_cpu, mt::test::tolerance(dt), 0.0, config + ", dx");
  expect_finite(dx_gpu, config + ", dx");
  const Tensor one = randn_as({1}, A);
  expect_close(kernels::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(one), -100, eps, Tensor()),
               kernels::cross_entropy_backward(x, target, cpu.lse, one, -100, eps, Tensor()), mt::test::tolerance(dt), 0.0,
               config + ", dx with one scale for every row");
  // The mean's backward: a scale in the logits' dtype, divided by the count in the kernel.
  const Tensor scale = randn_as({1}, dt), count = mt::scalar_tensor(7.0, A);
  expect_close(kernels::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(scale), -100, eps, gpu(count)),
               kernels::cross_entropy_backward(x, target, cpu.lse, scale, -100, eps, count),
               mt::test::tolerance(dt), 0.0, config + ", dx with a divisor");
}

}  // namespace

// Row lengths across the warp-per-row (<= 1024), 256-thread and 512-thread block kernels, with and without
// 16-byte vectors (13, 1023 and 65537 elements are not a multiple of 16 bytes; 1024, 4096, 32768 are), and rows
// that leave the register kernels' last packs empty in each tier (1032, 2000, 6000, 8200, 20000).
BOOST_AUTO_TEST_CASE(cross_entropy_kernels_match_cpu, MT_GPU_TEST) {
  mt::manual_seed(21);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},   {7, 13},  {64, 1023}, {37, 1024}, {6, 1032}, {5, 2000},  {9, 4096},
      {4, 6000}, {3, 8200}, {2, 20000}, {5, 32768}, {3, 65537}};
  for (DType dt : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16})
    for (double eps : {0.0, 0.1})
      for (auto [rows, C] : shapes) check_cross_entropy(randn_as({rows, C}, dt), eps, "randn");
  for (DType dt : kFloatDTypes) {
    check_cross_entropy(randn_as({16384, 1024}, dt), 0.1, "the benchmark's shape");
    check_cross_entropy(randn_as({33, 300}, dt, 1000.0), 0.1, "offset +1000");
    check_cross_entropy(randn_as({9, 40}, dt).t(), 0.0, "transposed");
    // Rows that start one element past 16 bytes (a narrowed view): the one-sweep kernel's element loads.
    const Tensor flat = randn_as({4 * 1024 + 1}, dt);
    check_cross_entropy(flat.narrow(0, 1, 4 * 1024).reshape({4, 1024}), 0.1, "base pointer off 16 bytes",
                        gpu(flat).narrow(0, 1, 4 * 1024).reshape({4, 1024}));
  }
}

// Every target ignored: losses 0, sum 0, count 0, the mean 0/0 = NaN, as on the CPU (and PyTorch); dx is 0,
// also through the mean's divisor (the count, 0).
BOOST_AUTO_TEST_CASE(cross_entropy_all_targets_ignored, MT_GPU_TEST) {
  mt::manual_seed(23);
  for (DType dt : kFloatDTypes)
    for (int64_t C : {8, 1024, 40000}) {
      std::ostringstream os;
      os << "cross_entropy with every target ignored, " << dt << " C " << C;
      const Tensor x = randn_as({4, C}, dt);
      const Tensor target = mt::tensor<int64_t>({-100, -100, -100, -100});
      const kernels::CrossEntropyResult cpu = kernels::cross_entropy(x, target, -100, 0.1);
      const kernels::CrossEntropyResult g = kernels::cross_entropy(gpu(x), gpu(target), -100, 0.1);
      expect_close(g.loss, cpu.loss, {0, 0}, 0.0, os.str() + ", loss");
      expect_close(g.sum, cpu.sum, {0, 0}, 0.0, os.str() + ", sum");
      expect_close(g.count, cpu.count, {0, 0}, 0.0, os.str() + ", count");
      expect_close(g.mean, cpu.mean, {0, 0}, 0.0, os.str() + ", mean");
      BOOST_CHECK_MESSAGE(std::isnan(g.mean.cpu().item<double>()), os.str() << ": mean should be NaN");
      const Tensor scale = randn_as({1}, dt);
      const Tensor dx = kernels::cross_entropy_backward(gpu(x), gpu(target), g.lse, gpu(scale), -100, 0.1, g.count);
      expect_equal(dx.cpu(), mt::zeros({4, C}, dt), os.str() + ", dx");
    }
}

// Loss and lse of special rows against the CPU's two passes: NaN logits, −inf logits (one of them the target),
// an all −inf row, a +inf logit, a plain row, a row of −inf but its target — in the warp, 256- and 1024-thread
// register kernels and the one-sweep kernels (40, 1000, 8200, 20000 in registers for f32/f16/bf16; 40000, an odd
// 1001 and f64 one sweep).
BOOST_AUTO_TEST_CASE(cross_entropy_special_values, MT_GPU_TEST) {
  for (int64_t C : {40, 1000, 1001, 8200, 20000, 40000}) {
    const Tensor x = special_rows(C);
    const Tensor target = mt::tensor<int64_t>({1, 0, 1, C - 1, 0, C - 1});  // row 1's target is a −inf logit
    for (DType dt : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16})  // f64: always the one-sweep kernel
      for (double eps : {0.0, 0.1}) {
        std::ostringstream os;
        os << "cross_entropy of special rows, " << dt << " C " << C << " smoothing " << eps;
        const kernels::CrossEntropyResult cpu = kernels::cross_entropy(x.to(dt), target, -100, eps);
        const kernels::CrossEntropyResult g = kernels::cross_entropy(gpu(x.to(dt)), gpu(target), -100, eps);
        const DType A = acc_of(dt);
        // NaN where the CPU has NaN, the same infinities, else within the sums' order allowance.
        expect_close(g.loss, cpu.loss, mt::test::tolerance(A), order_allowance(C), os.str() + ", loss");
        expect_close(g.lse, cpu.lse, mt::test::tolerance(A), order_allowance(C), os.str() + ", lse");
      }
  }
}

// Ignored rows give loss 0 and dx 0 whatever their logits; a target out of [0, C) that is not ignore_index
// (which only the CPU can check without a synchronisation) gives a NaN loss and a NaN dx row, and nothing else.
BOOST_AUTO_TEST_CASE(cross_entropy_kernels_bad_and_ignored_targets, MT_GPU_TEST) {
  mt::manual_seed(22);
  for (DType dt : kFloatDTypes)
    for (int64_t C : {5, 8, 2000, 32768})  // warp rows without and with vectors; 256- and 512-thread block rows
      for (double eps : {0.0, 0.1}) {
        Tensor x = randn_as({5, C}, dt);
        x.set({2, 0}, -INFINITY);  // row 2 is ignored: −inf there must not make it NaN
        const Tensor target = gpu(mt::tensor<int64_t>({0, C, -100, -1, C - 1}));
        std::ostringstream os;
        os << "cross_entropy with bad targets, " << dt << " C " << C << " smoothing " << eps;
        const kernels::CrossEntropyResult r = kernels::cross_entropy(gpu(x), target, -100, eps);
        const std::vector<double> loss = r.loss.cpu().to_vector<double>();
        BOOST_CHECK_MESSAGE(std::isfinite(loss[0]) && std::isnan(loss[1]) && loss[2] == 0.0 && std::isnan(loss[3]) &&
                                std::isfinite(loss[4]),
                            os.str() << ": loss " << loss[0] << " " << loss[1] << " " << loss[2] << " " << loss[3]
                                     << " " << loss[4]);
        // Σ loss and the mean are NaN (rows 1 and 3); rows 0, 1, 3 and 4 count (a bad target is not ignore_index).
        BOOST_CHECK_MESSAGE(std::isnan(r.sum.cpu().item<double>()) && std::isnan(r.mean.cpu().item<double>()) &&
                                r.count.cpu().item<double>() == 4.0,
                            os.str() << ": sum " << r.sum.cpu().item<double>() << ", count "
                                     << r.count.cpu().item<double>());
        const Tensor w = gpu(mt::ones({5}, acc_of(dt)));
        const Tensor dx = kernels::cross_entropy_backward(gpu(x), target, r.lse, w, -100, eps, Tensor());
        const Tensor dx_rows = dx.cpu().narrow(0, 2, 1).contiguous();
        expect_equal(dx_rows, mt::zeros({1, C}, dt), os.str() + ", ignored row's dx");
        expect_finite(dx.cpu().narrow(0, 0, 2).contiguous(), os.str() + ", dx rows 0-1", {1});
        expect_finite(dx.cpu().narrow(0, 3, 2).contiguous(), os.str() + ", dx rows 3-4", {0});
      }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- end to end through the ops ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_nn_ops)

namespace {

/// A CPU leaf and its GPU copy, both requiring grad.
struct Leaf {
  Tensor cpu, gpu;
  explicit Leaf(const Tensor& t) : cpu(t.detach()), gpu(t.to(Device::cuda()).detach()) {
    cpu.requires_grad_();
    gpu.requires_grad_();
  }
};

/// A gradient through autograd is computed from each device's own forward output, and those may round to
/// neighbouring values (1 ulp apart in f16 is within tolerance(dt)); the backward then rounds once more.
/// Two roundings apart, so twice the relative tolerance (seen on an H100: softmax f16 dx off by 2 ulp).
mt::test::Tolerance chained(DType dt) {
  const mt::test::Tolerance t = mt::test::tolerance(dt);
  return {2 * t.rtol, t.atol};
}

}  // namespace

// (N, C) logits run the fused kernels, (N, C, d) logits the composed path; every reduction.
BOOST_AUTO_TEST_CASE(cross_entropy_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(11);
  for (DType dt : kFloatDTypes)
    for (double smoothing : {0.0, 0.1})
      for (mt::Reduction reduction : {mt::Reduction::kMean, mt::Reduction::kSum, mt::Reduction::kNone})
        for (bool spatial : {false, true}) {
          const int64_t N = 64, C = 1000;
          const Shape shape = spatial ? Shape{N / 8, C, 8} : Shape{N, C};
          Leaf logits(randn_as(shape, dt));
          Tensor target = mt::randint(0, C, {N});
          target.set({5}, -100);  // ignored
          if (spatial) target = target.reshape({N / 8, 8});
          const mt::CrossEntropyOptions o{.reduction = reduction, .label_smoothing = smoothing};
          const Tensor loss_cpu = mt::cross_entropy(logits.cpu, target, o);
          const Tensor loss_gpu = mt::cross_entropy(logits.gpu, target.to(Device::cuda()), o);
          std::ostringstream os;
          os << "cross_entropy " << dt << " shape " << shape << " smoothing " << smoothing << " reduction "
             << static_cast<int>(reduction);
          expect_close(loss_gpu, loss_cpu, mt::test::tolerance(dt), order_allowance(N * C), os.str());
          const Tensor dy = reduction == mt::Reduction::kNone ? randn_as(loss_cpu.shape(), dt) : Tensor();
          loss_cpu.backward(dy);
          loss_gpu.backward(dy.defined() ? gpu(dy) : Tensor());
          expect_close(logits.gpu.grad(), logits.cpu.grad(), chained(dt), order_allowance(C), os.str() + ", d logits");
        }
}

// The loss returned shares no storage with what the node saved (the count of counted rows): a write into the loss
// after the forward leaves the backward as on the CPU (the CUDA forward once returned views of one 3-element
// buffer, and the write bumped the saved count's version).
BOOST_AUTO_TEST_CASE(cross_entropy_loss_written_in_place, MT_GPU_TEST) {
  mt::manual_seed(12);
  for (mt::Reduction reduction : {mt::Reduction::kMean, mt::Reduction::kSum}) {
    Leaf logits(randn_as({16, 10}, mt::kF32));
    const Tensor target = mt::randint(0, 10, {16});
    const mt::CrossEntropyOptions o{.reduction = reduction};
    const Tensor loss_cpu = mt::cross_entropy(logits.cpu, target, o);
    const Tensor loss_gpu = mt::cross_entropy(logits.gpu, target.to(Device::cuda()), o);
    loss_cpu.detach().fill_(5.0);
    loss_gpu.detach().fill_(5.0);
    loss_cpu.backward();
    BOOST_REQUIRE_NO_THROW(loss_gpu.backward());
    expect_close(logits.gpu.grad(), logits.cpu.grad(), mt::test::tolerance(mt::kF32), order_allowance(10),
                 "cross_entropy's gradient after a write into its loss");
  }
}

BOOST_AUTO_TEST_CASE(softmax_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(12);
  for (DType dt : kFloatDTypes)
    for (int64_t dim : {0, -1}) {
      Leaf x(randn_as({8, 16, 300}, dt));
      const Tensor dy = randn_as({8, 16, 300}, dt);
      std::ostringstream os;
      os << "softmax/log_softmax " << dt << " dim " << dim;
      const Tensor y_cpu = mt::softmax(x.cpu, dim), y_gpu = mt::softmax(x.gpu, dim);
      expect_close(y_gpu, y_cpu, mt::test::tolerance(dt), order_allowance(300), os.str());
      y_cpu.backward(dy);
      y_gpu.backward(gpu(dy));
      expect_close(x.gpu.grad(), x.cpu.grad(), chained(dt), order_allowance(300), os.str() + ", dx");
      Leaf x2(randn_as({8, 16, 300}, dt));
      const Tensor l_cpu = mt::log_softmax(x2.cpu, dim), l_gpu = mt::log_softmax(x2.gpu, dim);
      expect_close(l_gpu, l_cpu, mt::test::tolerance(dt), order_allowance(300), os.str() + ", log");
      l_cpu.backward(dy);
      l_gpu.backward(gpu(dy));
      expect_close(x2.gpu.grad(), x2.cpu.grad(), chained(dt), order_allowance(300), os.str() + ", log dx");
    }
}

BOOST_AUTO_TEST_CASE(layer_norm_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(13);
  for (DType dt : kFloatDTypes) {
    Leaf x(randn_as({32, 4, 256}, dt)), w(randn_as({4, 256}, dt)), b(randn_as({4, 256}, dt));
    const Tensor dy = randn_as({32, 4, 256}, dt);
    std::ostringstream os;
    os << "layer_norm " << dt;
    const Tensor y_cpu = mt::layer_norm(x.cpu, {4, 256}, w.cpu, b.cpu);
    const Tensor y_gpu = mt::layer_norm(x.gpu, {4, 256}, w.gpu, b.gpu);
    expect_close(y_gpu, y_cpu, mt::test::tolerance(dt), order_allowance(1024), os.str());
    y_cpu.backward(dy);
    y_gpu.backward(gpu(dy));
    expect_close(x.gpu.grad(), x.cpu.grad(), chained(dt), order_allowance(1024), os.str() + ", dx");
    expect_close(w.gpu.grad(), w.cpu.grad(), chained(dt), order_allowance(32), os.str() + ", dweight");
    expect_close(b.gpu.grad(), b.cpu.grad(), chained(dt), order_allowance(32), os.str() + ", dbias");
  }
}

BOOST_AUTO_TEST_SUITE_END()
