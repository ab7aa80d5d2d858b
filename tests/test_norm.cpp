// tests/test_norm.cpp — the normalisation family (ops/norm.cpp, ops/cpu/norm.cpp, cuda/norm.cu): layer_norm.
//
// The op's registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), reference values, f16 data whose statistics must be f32, the threaded CPU path against
// f64, and the CUDA kernels against the CPU's (tests/gpu_rows.h: the order allowance) at row lengths across every
// kernel tier and path of cuda/norm.cu (register and strided kernels, fused parameter columns, the parameter pass,
// clusters on sm_90, misaligned buffers), and the op forward and backward on both devices.
#include "family_test.h"

#include <utility>

#include <mixtape/cuda/runtime.h>

namespace {

MT_OP_CASE({.op = "layer_norm", .label = "no weight or bias, normalized_shape {5}",
            .f = [](const In& in) { return mt::layer_norm(in[0], {5}); },
            .inputs = [] { return In{mt::randn({3, 5})}; }});
MT_OP_CASE({.op = "layer_norm", .label = "weight and bias, 3-D, normalized_shape {4}",
            .f = [](const In& in) { return mt::layer_norm(in[0], {4}, in[1], in[2]); },
            .inputs = [] { return In{mt::randn({2, 3, 4}), mt::randn({4}), mt::randn({4})}; }});
MT_OP_CASE({.op = "layer_norm", .label = "weight and bias, normalized_shape {3, 4}",
            .f = [](const In& in) { return mt::layer_norm(in[0], {3, 4}, in[1], in[2]); },
            .inputs = [] { return In{mt::randn({2, 3, 4}), mt::randn({3, 4}), mt::randn({3, 4})}; }});
MT_OP_CASE({.op = "layer_norm", .label = "weight only, transposed input",
            .f = [](const In& in) { return mt::layer_norm(in[0], {3}, in[1]); },
            .inputs = [] { return In{non_contiguous(mt::randn({4, 3}), "transposed"), mt::randn({3})}; }});
MT_OP_CASE({.op = "layer_norm", .label = "bias only, offset +20",
            .f = [](const In& in) { return mt::layer_norm(in[0], {6}, Tensor(), in[1]); },
            .inputs = [] { return In{mt::add(mt::randn({2, 6}), 20.0), mt::randn({6})}; }});

// ---- CUDA against the CPU ---------------------------------------------------------------------

/// t on the device as a contiguous view one element into its storage, so that its data pointer is not 16-byte
/// aligned (gpu() gives a fresh, aligned allocation): the kernels' element-load paths.
Tensor gpu_misaligned(const Tensor& t) {
  const Tensor flat = mt::zeros({t.numel() + 1}, mt::TensorOptions(t.dtype()).device(Device::cuda()));
  Tensor view = flat.narrow(0, 1, t.numel()).reshape(t.shape());
  view.copy_(gpu(t));
  return view;
}

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
  const auto r_cpu = kn::layer_norm(x, M, w, b, 1e-5);
  const auto r_gpu = kn::layer_norm(data(x), M, wg, bg, 1e-5);
  expect_close(r_gpu.y, r_cpu.y, with_allowance(mt::test::tolerance(x.dtype()), order_allowance(M), r_cpu.y), config + ": y");
  expect_close(r_gpu.mean, r_cpu.mean, with_allowance(mt::test::tolerance(stats), order_allowance(M), r_cpu.mean), config + ": mean");
  expect_close(r_gpu.rstd, r_cpu.rstd, with_allowance(mt::test::tolerance(stats), order_allowance(M), r_cpu.rstd), config + ": rstd");

  // Backward from the CPU's statistics on both sides: only the order of the sums differs.
  const Tensor dy = randn_as(x.shape(), x.dtype());
  const int64_t rows = r_cpu.mean.numel();
  const auto g_cpu = kn::layer_norm_backward(dy, x, r_cpu.mean, r_cpu.rstd, w, b.defined());
  const auto g_gpu =
      kn::layer_norm_backward(data(dy), data(x), gpu(r_cpu.mean), gpu(r_cpu.rstd), wg, b.defined());
  expect_close(g_gpu.dx, g_cpu.dx, with_allowance(mt::test::tolerance(x.dtype()), order_allowance(M), g_cpu.dx), config + ": dx");
  BOOST_CHECK_EQUAL(g_gpu.dweight.defined(), w.defined());
  BOOST_CHECK_EQUAL(g_gpu.dbias.defined(), b.defined());
  if (w.defined())
    expect_close(g_gpu.dweight, g_cpu.dweight, with_allowance(mt::test::tolerance(g_cpu.dweight.dtype()), order_allowance(rows), g_cpu.dweight),
                 config + ": dweight");
  if (b.defined())
    expect_close(g_gpu.dbias, g_cpu.dbias, with_allowance(mt::test::tolerance(g_cpu.dbias.dtype()), order_allowance(rows), g_cpu.dbias),
                 config + ": dbias");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(norm)

BOOST_AUTO_TEST_CASE(layer_norm_reference_values, MT_CPU_TEST) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  Tensor x = mt::from_vector<double>({1, 2, 3, 4}, {1, 4}, mt::kF64);
  const double rstd = 1 / std::sqrt(1.25 + 1e-5);
  std::vector<double> y = mt::layer_norm(x, {4}).to_vector<double>();
  for (int i = 0; i < 4; ++i) BOOST_TEST(y[static_cast<size_t>(i)] == (i + 1 - 2.5) * rstd, tt::tolerance(1e-12));
  Tensor w = mt::from_vector<double>({1, 2, 3, 4}, {4}, mt::kF64);
  Tensor b = mt::from_vector<double>({0, 0, 0, 1}, {4}, mt::kF64);
  std::vector<double> ya = mt::layer_norm(x, {4}, w, b).to_vector<double>();
  BOOST_TEST(ya[3] == 1.5 * rstd * 4 + 1, tt::tolerance(1e-12));
  // f16 data keeps its dtype; under autocast layer_norm runs in f32.
  Tensor h = mt::randn({2, 8}, mt::kF16);
  BOOST_TEST(mt::layer_norm(h, {8}).dtype() == mt::kF16);
  {
    mt::amp::Autocast ac(mt::kF16);
    BOOST_TEST(mt::layer_norm(h, {8}).dtype() == mt::kF32);
    BOOST_TEST(mt::softmax(h, -1).dtype() == mt::kF32);
    BOOST_TEST(mt::max(h).dtype() == mt::kF16);  // passthrough
    BOOST_TEST(mt::mean(h).dtype() == mt::kF32);
  }
}

BOOST_AUTO_TEST_CASE(precision_categories, MT_CPU_TEST) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  BOOST_TEST(category("layer_norm") == "fp32");
}

BOOST_AUTO_TEST_CASE(error_messages, MT_CPU_TEST) {
  // normalized_shape [4] for shape [2, 3].
  expect_error([] { mt::layer_norm(mt::randn({2, 3}), {4}); }, {"layer_norm", "normalized_shape [4]", "[2, 3]"});
  // A weight of the wrong shape.
  expect_error([] { mt::layer_norm(mt::randn({2, 3}), {3}, mt::randn({4})); }, {"weight"});
}

// ---- f16 data: statistics in f32 -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(f16_layer_norm_keeps_f32_statistics, MT_CPU_TEST) {
  // Rows of 4096 values near +1000 (f16 spacing 0.5 there): an f16 running sum keeps 11 bits of the growing
  // total and drops the small terms (tests/test_softmax.cpp's f16_softmax_keeps_f32_statistics). With f32
  // statistics the f16 output is the f64 result of the same f16 inputs, rounded once.
  mt::manual_seed(5);
  Tensor x = mt::add(mt::mul(mt::randn({2, 4096}), 4.0), 1000.0).to(mt::kF16);
  Tensor ref = x.to(mt::kF64);
  Tensor ln = mt::layer_norm(x, {4096});
  BOOST_TEST(ln.dtype() == mt::kF16);
  mt::test::expect_close(ln, mt::layer_norm(ref, {4096}), mt::test::tolerance(mt::kF16),
                         "f16 layer_norm near +1000");
}

BOOST_AUTO_TEST_CASE(large_inputs_take_the_threaded_paths, MT_CPU_TEST) {
  // Big enough for the OpenMP paths; compared with f64 (which takes the same paths).
  mt::manual_seed(9);
  Tensor x = mt::randn({64, 700});
  Tensor ref = x.to(mt::kF64);
  Tensor w = mt::randn({700}), b = mt::randn({700});
  Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_(), bg = b.clone().requires_grad_();
  Tensor xr = ref.clone().requires_grad_(), wr = w.to(mt::kF64).requires_grad_(), br = b.to(mt::kF64).requires_grad_();
  Tensor v = mt::randn({64, 700});
  mt::sum(mt::mul(mt::layer_norm(xg, {700}, wg, bg), v)).backward();
  mt::sum(mt::mul(mt::layer_norm(xr, {700}, wr, br), v.to(mt::kF64))).backward();
  // Sums over 64 rows and 700 columns in f32: a few ulps of the largest term.
  mt::test::Tolerance sums{1e-5, 1e-4};
  mt::test::expect_close(xg.grad(), xr.grad(), sums, "layer_norm dx");
  mt::test::expect_close(wg.grad(), wr.grad(), sums, "layer_norm dweight");
  mt::test::expect_close(bg.grad(), br.grad(), sums, "layer_norm dbias");
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(layer_norm_matches_cpu, MT_GPU_TEST) {
  mt::manual_seed(6);
  for (DType dt : kGpuFloatTypes)
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
  for (DType dt : kGpuFloatTypes)
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
  for (DType dt : kGpuFloatTypes)
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
  for (DType dt : kGpuFloatTypes)
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
  for (DType dt : kGpuFloatTypes) {
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
  for (DType dt : kGpuFloatTypes)
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

BOOST_AUTO_TEST_CASE(layer_norm_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(13);
  for (DType dt : kGpuFloatTypes) {
    Leaf x(randn_as({32, 4, 256}, dt)), w(randn_as({4, 256}, dt)), b(randn_as({4, 256}, dt));
    const Tensor dy = randn_as({32, 4, 256}, dt);
    std::ostringstream os;
    os << "layer_norm " << dt;
    const Tensor y_cpu = mt::layer_norm(x.cpu, {4, 256}, w.cpu, b.cpu);
    const Tensor y_gpu = mt::layer_norm(x.gpu, {4, 256}, w.gpu, b.gpu);
    expect_close(y_gpu, y_cpu, with_allowance(mt::test::tolerance(dt), order_allowance(1024), y_cpu), os.str());
    y_cpu.backward(dy);
    y_gpu.backward(gpu(dy));
    expect_close(x.gpu.grad(), x.cpu.grad(), with_allowance(chained(dt), order_allowance(1024), x.cpu.grad()), os.str() + ", dx");
    expect_close(w.gpu.grad(), w.cpu.grad(), with_allowance(chained(dt), order_allowance(32), w.cpu.grad()), os.str() + ", dweight");
    expect_close(b.gpu.grad(), b.cpu.grad(), with_allowance(chained(dt), order_allowance(32), b.cpu.grad()), os.str() + ", dbias");
  }
}

BOOST_AUTO_TEST_SUITE_END()
