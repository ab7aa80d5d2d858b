// tests/test_norm.cpp — the normalisation family (ops/norm.cpp, ops/cpu/norm.cpp, cuda/norm.cu): layer_norm and
// batch_norm.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), reference values, f16 data whose statistics must be f32, the threaded CPU path against
// f64, and the CUDA kernels against the CPU's (tests/gpu_rows.h: the order allowance) at row lengths across every
// kernel tier and path of cuda/norm.cu (register and strided kernels, fused parameter columns, the parameter pass,
// clusters on sm_90, misaligned buffers), and the op forward and backward on both devices. batch_norm: its CPU
// kernels against a float64 reference written out here, the running statistics' update, eval mode, the errors,
// and its CUDA kernels and op against the CPU's.
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

/// Running statistics for a batch_norm case, made inside the case's function (state, not inputs: gradcheck must
/// not differentiate them), in the dtype the op keeps them in, on x's device: mean ((c − 1) / 4), variance
/// (0.5 + c / 2).
std::pair<Tensor, Tensor> running_stats(const Tensor& x) {
  const int64_t C = x.size(1);
  std::vector<double> mean, var;
  for (int64_t c = 0; c < C; ++c) {
    mean.push_back(static_cast<double>(c - 1) / 4);
    var.push_back(0.5 + static_cast<double>(c) / 2);
  }
  const auto opts = mt::TensorOptions(mt::acc_dtype(x.dtype())).device(x.device());
  return {mt::from_vector(mean, {C}, opts), mt::from_vector(var, {C}, opts)};
}

MT_OP_CASE({.op = "batch_norm", .label = "training, affine, (N, C), no running statistics",
            .f = [](const In& in) { return mt::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); },
            .inputs = [] { return In{mt::randn({6, 3}), mt::randn({3}), mt::randn({3})}; }});
MT_OP_CASE({.op = "batch_norm", .label = "training, affine, (N, C, H, W), running statistics updated",
            .f =
                [](const In& in) {
                  auto [mean, var] = running_stats(in[0]);
                  return mt::batch_norm(in[0], mean, var, in[1], in[2], true, 0.1, 1e-5);
                },
            .inputs = [] { return In{mt::randn({2, 3, 3, 4}), mt::randn({3}), mt::randn({3})}; }});
MT_OP_CASE({.op = "batch_norm", .label = "training, no affine, (N, C, L), offset +20",
            .f = [](const In& in) { return mt::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
            .inputs = [] { return In{mt::add(mt::randn({3, 2, 5}), 20.0)}; }});
MT_OP_CASE({.op = "batch_norm", .label = "training, weight only, transposed (N, C)",
            .f = [](const In& in) { return mt::batch_norm(in[0], Tensor(), Tensor(), in[1], Tensor(), true); },
            .inputs = [] { return In{non_contiguous(mt::randn({5, 4}), "transposed"), mt::randn({4})}; }});
MT_OP_CASE({.op = "batch_norm", .label = "eval, running statistics, affine, (N, C, H, W)",
            .f =
                [](const In& in) {
                  auto [mean, var] = running_stats(in[0]);
                  return mt::batch_norm(in[0], mean, var, in[1], in[2], false);
                },
            .inputs = [] { return In{mt::randn({2, 3, 2, 3}), mt::randn({3}), mt::randn({3})}; }});
MT_OP_CASE({.op = "batch_norm", .label = "eval, running statistics, no affine, (N, C)",
            .f =
                [](const In& in) {
                  auto [mean, var] = running_stats(in[0]);
                  return mt::batch_norm(in[0], mean, var);
                },
            .inputs = [] { return In{mt::randn({4, 3})}; }});
MT_OP_CASE({.op = "batch_norm", .label = "eval, no running statistics: the batch's, bias only, (N, C, L)",
            .f = [](const In& in) { return mt::batch_norm(in[0], Tensor(), Tensor(), Tensor(), in[1], false); },
            .inputs = [] { return In{mt::randn({2, 3, 4}), mt::randn({3})}; }});

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

// ---- batch_norm: a float64 reference -------------------------------------------------------------------

/// batch_norm of x (N, C, *) computed in f64 from x's (rounded) values, the definition written out: per channel
/// mean and biased variance (batch statistics, when `mean_in` is empty) or the given ones, y = (x − mean)/√(var +
/// eps)·w + b; and for dy the gradients: dx (through the statistics when they are the batch's), dweight, dbias.
struct BatchNormReference {
  std::vector<double> y, mean, var, invstd, dx, dweight, dbias;
};
BatchNormReference batch_norm_reference(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& b,
                                        const std::vector<double>& mean_in, const std::vector<double>& var_in,
                                        double eps) {
  const int64_t N = x.size(0), C = x.size(1), inner = x.numel() / std::max<int64_t>(N * C, 1), count = N * inner;
  const std::vector<double> xv = x.to_vector<double>(), gv = dy.to_vector<double>();
  const std::vector<double> wv = w.defined() ? w.to_vector<double>() : std::vector<double>(C, 1.0);
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(C, 0.0);
  BatchNormReference r;
  r.y.resize(xv.size());
  r.dx.resize(xv.size());
  auto at = [&](int64_t n, int64_t c, int64_t i) { return static_cast<size_t>((n * C + c) * inner + i); };
  for (int64_t c = 0; c < C; ++c) {
    double mu = 0, var = 0;
    if (mean_in.empty()) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) mu += xv[at(n, c, i)];
      mu /= static_cast<double>(count);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) var += (xv[at(n, c, i)] - mu) * (xv[at(n, c, i)] - mu);
      var /= static_cast<double>(count);
    } else {
      mu = mean_in[static_cast<size_t>(c)];
      var = var_in[static_cast<size_t>(c)];
    }
    const double is = 1 / std::sqrt(var + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < inner; ++i) {
        const size_t k = at(n, c, i);
        const double xhat = (xv[k] - mu) * is;
        r.y[k] = xhat * wv[static_cast<size_t>(c)] + bv[static_cast<size_t>(c)];
        sum_dy += gv[k];
        sum_dy_xhat += gv[k] * xhat;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < inner; ++i) {
        const size_t k = at(n, c, i);
        const double xhat = (xv[k] - mu) * is, scale = wv[static_cast<size_t>(c)] * is;
        r.dx[k] = mean_in.empty() ? scale * (gv[k] - sum_dy / static_cast<double>(count) -
                                             xhat * sum_dy_xhat / static_cast<double>(count))
                                  : scale * gv[k];
      }
    r.mean.push_back(mu);
    r.var.push_back(var);
    r.invstd.push_back(is);
    r.dweight.push_back(sum_dy_xhat);
    r.dbias.push_back(sum_dy);
  }
  return r;
}

/// The CPU kernels on x (any floating dtype) against batch_norm_reference, statistics in acc_dtype(x): y and dx
/// rounded once to x's dtype; the statistics and parameter gradients, sums over the channel's count values in
/// f32 for f32/f16/bf16, within a few f32 ulps of the reference times √count (the order of the sums).
void check_batch_norm_cpu(const Tensor& x, bool running, bool affine, const std::string& what) {
  const int64_t C = x.size(1), count = x.numel() / C;
  const DType dt = x.dtype(), acc = mt::acc_dtype(dt);
  const Tensor w = affine ? randn_as({C}, dt) : Tensor(), b = affine ? randn_as({C}, dt) : Tensor();
  const Tensor dy = randn_as(x.shape(), dt);
  std::vector<double> mean_in, var_in;
  Tensor rm, rv;
  if (running) {
    for (int64_t c = 0; c < C; ++c) {
      mean_in.push_back(0.25 * static_cast<double>(c) - 0.5);
      var_in.push_back(0.5 + 0.125 * static_cast<double>(c));
    }
    rm = mt::from_vector(mean_in, {C}, acc);
    rv = mt::from_vector(var_in, {C}, acc);
  }
  std::ostringstream os;
  os << "batch_norm of " << describe(x) << (running ? ", running statistics" : ", batch statistics")
     << (affine ? ", affine" : "") << " (" << what << ")";
  const std::string config = os.str();
  const BatchNormReference ref = batch_norm_reference(x, dy, w, b, mean_in, var_in, 1e-5);
  const auto r = kn::batch_norm(x, rm, rv, w, b, 1e-5);
  // Sums over `count` values in f32: an allowance of a few ulps times √count, relative to the largest value.
  const Tolerance stats =
      dt == mt::kF64 ? tolerance(mt::kF64) : Tolerance{tolerance(mt::kF32).rtol + order_allowance(count), 1e-5};
  BOOST_TEST(r.mean.dtype() == acc);
  BOOST_TEST(r.invstd.dtype() == acc);
  expect_values(r.y, ref.y, tolerance(dt), config + ": y");
  expect_values(r.mean, ref.mean, stats, config + ": mean");
  expect_values(r.invstd, ref.invstd, stats, config + ": invstd");
  BOOST_TEST(r.var.defined() == !running);
  if (!running) expect_values(r.var, ref.var, stats, config + ": var");
  const auto g = kn::batch_norm_backward(dy, x, r.mean, r.invstd, w, !running, b.defined());
  // dx: one rounding to dt of an f32 (f64) expression whose inputs carry the statistics' error.
  expect_values(g.dx, ref.dx, dt == mt::kF32 ? Tolerance{1e-5, 1e-5} : tolerance(dt), config + ": dx");
  BOOST_TEST(g.dweight.defined() == affine);
  BOOST_TEST(g.dbias.defined() == affine);
  if (affine) {
    // Σ over `count` products, then one rounding to the parameters' dtype.
    const Tolerance sums = dt == mt::kF32 || dt == mt::kF64
                               ? Tolerance{tolerance(mt::kF32).rtol + order_allowance(count), 1e-4}
                               : Tolerance{tolerance(dt).rtol, 1e-4};
    expect_values(g.dweight, ref.dweight, dt == mt::kF64 ? tolerance(mt::kF64) : sums, config + ": dweight");
    expect_values(g.dbias, ref.dbias, dt == mt::kF64 ? tolerance(mt::kF64) : sums, config + ": dbias");
  }
}

/// batch_norm's kernels on the GPU against the CPU's, forward from the same inputs and backward from the CPU's
/// statistics, within the dtype's tolerance plus the order allowance of a channel's count values.
void check_batch_norm_gpu(const Tensor& x, bool running, bool affine, const std::string& what) {
  const int64_t C = x.size(1), count = x.numel() / std::max<int64_t>(C, 1);
  const DType dt = x.dtype(), acc = mt::acc_dtype(dt);
  const Tensor w = affine ? randn_as({C}, dt) : Tensor(), b = affine ? randn_as({C}, dt) : Tensor();
  const Tensor rm = running ? mt::mul(mt::randn({C}), 0.5).to(acc) : Tensor();
  const Tensor rv = running ? mt::add(mt::rand({C}), 0.5).to(acc) : Tensor();
  auto on_gpu = [](const Tensor& t) { return t.defined() ? gpu(t) : t; };
  std::ostringstream os;
  os << "batch_norm of " << describe(x) << (running ? ", running statistics" : ", batch statistics")
     << (affine ? ", affine" : "") << " (" << what << "), cuda vs cpu";
  const std::string config = os.str();
  const auto r_cpu = kn::batch_norm(x, rm, rv, w, b, 1e-5);
  const auto r_gpu = kn::batch_norm(gpu(x), on_gpu(rm), on_gpu(rv), on_gpu(w), on_gpu(b), 1e-5);
  const double allow = order_allowance(count);
  expect_close(r_gpu.y, r_cpu.y, with_allowance(tolerance(dt), allow, r_cpu.y), config + ": y");
  expect_close(r_gpu.mean, r_cpu.mean, with_allowance(tolerance(acc), allow, r_cpu.mean), config + ": mean");
  expect_close(r_gpu.invstd, r_cpu.invstd, with_allowance(tolerance(acc), allow, r_cpu.invstd), config + ": invstd");
  BOOST_TEST(r_gpu.var.defined() == !running);
  if (!running) expect_close(r_gpu.var, r_cpu.var, with_allowance(tolerance(acc), allow, r_cpu.var), config + ": var");
  const Tensor dy = randn_as(x.shape(), dt);
  const auto g_cpu = kn::batch_norm_backward(dy, x, r_cpu.mean, r_cpu.invstd, w, !running, affine);
  const auto g_gpu =
      kn::batch_norm_backward(gpu(dy), gpu(x), gpu(r_cpu.mean), gpu(r_cpu.invstd), on_gpu(w), !running, affine);
  expect_close(g_gpu.dx, g_cpu.dx, with_allowance(tolerance(dt), allow, g_cpu.dx), config + ": dx");
  BOOST_TEST(g_gpu.dweight.defined() == affine);
  BOOST_TEST(g_gpu.dbias.defined() == affine);
  if (affine) {
    expect_close(g_gpu.dweight, g_cpu.dweight, with_allowance(tolerance(dt), allow, g_cpu.dweight), config + ": dweight");
    expect_close(g_gpu.dbias, g_cpu.dbias, with_allowance(tolerance(dt), allow, g_cpu.dbias), config + ": dbias");
  }
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
  // eps is added to the variance: with eps 1, (x - 2.5) / √2.25 = (x - 2.5) / 1.5, in every dtype (f32 statistics).
  for (mt::DType dtype : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16})
    expect_values(mt::layer_norm(x.to(dtype), {4}, {}, {}, 1.0), {-1, -1.0 / 3, 1.0 / 3, 1}, tolerance(dtype),
                  "layer_norm, eps 1");
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

BOOST_AUTO_TEST_CASE(layer_norm_over_rows_of_nothing, MT_CPU_TEST) {
  // normalized_shape [0]: the kernels' row count would divide by zero (SIGFPE before). An empty result, as PyTorch's,
  // and empty gradients.
  Tensor x = mt::zeros({2, 0}).requires_grad_();
  Tensor w = mt::ones({0}).requires_grad_(), b = mt::zeros({0}).requires_grad_();
  const Tensor y = mt::layer_norm(x, {0}, w, b);
  BOOST_TEST((y.shape() == mt::Shape{2, 0}));
  mt::sum(y).backward();
  BOOST_TEST((x.grad().shape() == mt::Shape{2, 0}));
  BOOST_TEST((w.grad().shape() == mt::Shape{0}));
  BOOST_TEST((b.grad().shape() == mt::Shape{0}));
  BOOST_TEST((mt::layer_norm(mt::zeros({3, 0, 4}), {0, 4}).shape() == mt::Shape{3, 0, 4}));
}

BOOST_AUTO_TEST_CASE(precision_categories, MT_CPU_TEST) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  BOOST_TEST(category("layer_norm") == "fp32");
  // The kernels keep batch_norm's statistics in f32 whatever x's dtype, so x stays as it comes (ops/norm.cpp).
  BOOST_TEST(category("batch_norm") == "passthrough");
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
  // The f64 run shares the kernel's chunks of rows (46 rows a chunk here: two chunks), so the parameter gradients
  // are also checked against sums written out here: dweight = Σ_rows v·x̂, dbias = Σ_rows v.
  const std::vector<double> xs = ref.to_vector<double>(), vs = v.to_vector<double>();
  std::vector<double> dw(700, 0.0), db(700, 0.0);
  for (size_t i = 0; i < 64; ++i) {
    double mean = 0, var = 0;
    for (size_t j = 0; j < 700; ++j) mean += xs[i * 700 + j] / 700;
    for (size_t j = 0; j < 700; ++j) var += (xs[i * 700 + j] - mean) * (xs[i * 700 + j] - mean) / 700;
    for (size_t j = 0; j < 700; ++j) {
      dw[j] += vs[i * 700 + j] * (xs[i * 700 + j] - mean) / std::sqrt(var + 1e-5);
      db[j] += vs[i * 700 + j];
    }
  }
  mt::test::expect_close(wg.grad(), mt::from_vector(dw, {700}, mt::kF64), sums, "layer_norm dweight, written out");
  mt::test::expect_close(bg.grad(), mt::from_vector(db, {700}, mt::kF64), sums, "layer_norm dbias, written out");
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

// Rows longer than 8192 with dweight/dbias: on sm_90 a cluster of S blocks shares each f32 row (S = 3, 4, 5, 5, 6,
// 7, 8, 8 for these lengths, the last slab shorter but at 20480 and 32768), the clusters striding over 300 rows, so
// that each block runs several rows (both exchange slots) and the cluster sums meet in rank order; f16/bf16 rows,
// and all rows elsewhere, the two-pass path.
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
      // On sm_90 each of the three f32 backwards ran as clusters, and no 16-bit one.
      if (sm90)
        BOOST_TEST(mt::cuda::debug_counters().cluster_launches == (dt == mt::kF32 ? 3 : 0),
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
// see the cluster kernel itself on sm_90, not the two-pass path), and bf16 rows of the same lengths, which take the
// two-pass path there too.
BOOST_AUTO_TEST_CASE(layer_norm_cluster_kernel_under_sanitizers, MT_GPU_TEST) {
  mt::manual_seed(14);
  mt::cuda::reset_debug_counters();
  for (DType dt : {mt::kF32, mt::kBF16})
    for (int64_t M : {8200, 32768})
      check_layer_norm(randn_as({12, M}, dt), M, randn_as({M}, dt), randn_as({M}, dt), "long rows, a few");
  if (mt::cuda::device_properties(mt::cuda::current_device()).major >= 9)
    BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 2);
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
  for (int64_t M : {4096, 32768})  // with parameters: the fused columns, and the two-pass path
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

// ---- batch_norm --------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(batch_norm_reference_values, MT_CPU_TEST) {
  // Channel 0 holds 1, 2, 3, 4 (mean 2.5, biased variance 1.25), channel 1 holds 10, 10, 10, 14 (mean 11, biased
  // variance 3); x (4, 2).
  const Tensor x = mt::from_vector<double>({1, 10, 2, 10, 3, 10, 4, 14}, {4, 2}, mt::kF64);
  const Tensor w = mt::from_vector<double>({2, 1}, {2}, mt::kF64), b = mt::from_vector<double>({0, 1}, {2}, mt::kF64);
  const double is0 = 1 / std::sqrt(1.25 + 1e-5), is1 = 1 / std::sqrt(3 + 1e-5);
  expect_values(mt::batch_norm(x, Tensor(), Tensor(), w, b, true),
                {-1.5 * is0 * 2, -is1 + 1, -0.5 * is0 * 2, -is1 + 1, 0.5 * is0 * 2, -is1 + 1, 1.5 * is0 * 2,
                 3 * is1 + 1},
                tolerance(mt::kF64), "batch_norm training");
  // Running statistics: updated with momentum 0.1 and the unbiased variance (count 4: 4/3 of the biased one).
  Tensor rm = mt::from_vector<double>({0, 1}, {2}, mt::kF64), rv = mt::from_vector<double>({1, 2}, {2}, mt::kF64);
  const uint64_t version = rm.version();
  mt::batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  expect_values(rm, {0.9 * 0 + 0.1 * 2.5, 0.9 * 1 + 0.1 * 11}, tolerance(mt::kF64), "running_mean");
  expect_values(rv, {0.9 * 1 + 0.1 * 1.25 * 4 / 3, 0.9 * 2 + 0.1 * 3 * 4 / 3}, tolerance(mt::kF64), "running_var");
  BOOST_TEST(rm.version() > version);  // written in place: a tensor saved before sees the change
  // Eval: the running statistics, not the batch's; nothing updated.
  const std::vector<double> rm_now = rm.to_vector<double>(), rv_now = rv.to_vector<double>();
  const Tensor y = mt::batch_norm(x, rm, rv, w, b, false);
  BOOST_TEST(y.at<double>({3, 1}) == (14 - rm_now[1]) / std::sqrt(rv_now[1] + 1e-5) + 1, tt::tolerance(1e-12));
  BOOST_TEST(rm.to_vector<double>() == rm_now);
  BOOST_TEST(rv.to_vector<double>() == rv_now);
  // momentum 1: the running statistics become the batch's (unbiased variance).
  mt::batch_norm(x, rm, rv, Tensor(), Tensor(), true, 1.0);
  expect_values(rm, {2.5, 11}, tolerance(mt::kF64), "running_mean, momentum 1");
  expect_values(rv, {1.25 * 4 / 3, 4}, tolerance(mt::kF64), "running_var, momentum 1");
  // eps is added to the variance, the batch's or the running one: with eps 1.75, channel 1's batch variance 3 gives
  // √4.75 and its running variance 4 (from above) √5.75.
  BOOST_TEST(mt::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1.75).at<double>({3, 1}) ==
                 3 / std::sqrt(4.75),
             tt::tolerance(1e-12));
  BOOST_TEST(mt::batch_norm(x, rm, rv, Tensor(), Tensor(), false, 0.1, 1.75).at<double>({3, 1}) ==
                 3 / std::sqrt(5.75),
             tt::tolerance(1e-12));
  // Eval without running statistics normalises by the batch's, as training does (F.batch_norm's rule).
  expect_values(mt::batch_norm(x, Tensor(), Tensor(), w, b, false),
                mt::batch_norm(x, Tensor(), Tensor(), w, b, true).to_vector<double>(), tolerance(mt::kF64),
                "batch_norm eval without running statistics");
}

BOOST_AUTO_TEST_CASE(batch_norm_f16_keeps_f32_statistics, MT_CPU_TEST) {
  // f16 x near +1000 (f16 spacing 0.5 there): the statistics and the running ones in f32, the output in f16, one
  // rounding from the f64 result of the same f16 inputs.
  mt::manual_seed(21);
  const Tensor x = mt::add(mt::mul(mt::randn({64, 3, 8, 8}), 4.0), 1000.0).to(mt::kF16);
  Tensor rm = mt::zeros({3}), rv = mt::ones({3});
  const Tensor y = mt::batch_norm(x, rm, rv, Tensor(), Tensor(), true);
  BOOST_TEST(y.dtype() == mt::kF16);
  BOOST_TEST(rm.dtype() == mt::kF32);
  expect_close(y, mt::batch_norm(x.to(mt::kF64), Tensor(), Tensor(), Tensor(), Tensor(), true), tolerance(mt::kF16),
               "f16 batch_norm near +1000");
  // 0.1 of each channel's mean (near 1000): f32 keeps it to ~1e-4.
  const std::vector<double> mean = mt::mean(x.to(mt::kF64), {0, 2, 3}).to_vector<double>();
  for (int c = 0; c < 3; ++c) BOOST_TEST(rm.at<double>({c}) == 0.1 * mean[static_cast<size_t>(c)], tt::tolerance(1e-6));
  // f32 weight and bias with f16 x (autocast leaves both as they are): the output in f16, the parameters'
  // gradients in f32.
  Tensor w = mt::randn({3}).requires_grad_(), b = mt::randn({3}).requires_grad_();
  Tensor xg = x.clone().requires_grad_();
  Tensor out;
  {
    mt::amp::Autocast ac(mt::kF16);
    out = mt::batch_norm(xg, rm, rv, w, b, true);
  }
  BOOST_TEST(out.dtype() == mt::kF16);
  mt::sum(out.to(mt::kF32)).backward();
  BOOST_TEST(xg.grad().dtype() == mt::kF16);
  BOOST_TEST(w.grad().dtype() == mt::kF32);
  BOOST_TEST(b.grad().dtype() == mt::kF32);
  // Running statistics in another dtype than the kernels' (f64 with f32 x): computed in f32, written back.
  Tensor rm64 = mt::zeros({3}, mt::kF64), rv64 = mt::ones({3}, mt::kF64);
  mt::batch_norm(x.to(mt::kF32), rm64, rv64, Tensor(), Tensor(), true);
  BOOST_TEST(rm64.dtype() == mt::kF64);
  for (int c = 0; c < 3; ++c)
    BOOST_TEST(rm64.at<double>({c}) == 0.1 * mean[static_cast<size_t>(c)], tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(batch_norm_running_statistics_get_no_gradient, MT_CPU_TEST) {
  mt::manual_seed(22);
  Tensor x = mt::randn({4, 3}).requires_grad_();
  Tensor rm = mt::zeros({3}).requires_grad_(), rv = mt::ones({3}).requires_grad_();
  const Tensor y = mt::batch_norm(x, rm, rv);  // eval: reads them only
  mt::sum(mt::mul(y, y)).backward();
  BOOST_TEST(x.grad().defined());
  BOOST_TEST(!rm.grad().defined());
  BOOST_TEST(!rv.grad().defined());
}

BOOST_AUTO_TEST_CASE(batch_norm_cpu_kernels_against_f64, MT_CPU_TEST) {
  mt::manual_seed(23);
  for (DType dt : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16})
    for (bool running : {false, true})
      for (bool affine : {false, true}) {
        check_batch_norm_cpu(randn_as({7, 3}, dt), running, affine, "(N, C)");
        check_batch_norm_cpu(randn_as({5, 4, 9}, dt, 3.0), running, affine, "(N, C, L), offset +3");
        check_batch_norm_cpu(randn_as({3, 2, 5, 6}, dt), running, affine, "(N, C, H, W)");
      }
  // Enough elements for the threads (OpenMP over channels), and a channel of 1 value (eval: no batch required).
  for (DType dt : {mt::kF32, mt::kBF16}) check_batch_norm_cpu(randn_as({32, 16, 9, 9}, dt), false, true, "threaded");
  check_batch_norm_cpu(randn_as({1, 3}, mt::kF32), true, true, "one value a channel, running statistics");
  check_batch_norm_cpu(non_contiguous(randn_as({6, 5}, mt::kF32), "transposed"), false, true, "transposed");
}

BOOST_AUTO_TEST_CASE(batch_norm_empty_batch, MT_CPU_TEST) {
  // No values a channel, eval without running statistics: an empty output, NaN statistics (as a mean of nothing),
  // zero parameter gradients.
  const Tensor x = mt::zeros({0, 3, 2});
  const auto r = kn::batch_norm(x, Tensor(), Tensor(), mt::ones({3}), mt::zeros({3}), 1e-5);
  expect_shape(r.y, {0, 3, 2}, mt::kF32, "empty batch_norm");
  BOOST_TEST(std::isnan(r.mean.at<float>({0})));
  const auto g = kn::batch_norm_backward(x, x, r.mean, r.invstd, mt::ones({3}), true, true);
  expect_values(g.dweight, {0, 0, 0}, kExact, "dweight of an empty batch");
  expect_values(g.dbias, {0, 0, 0}, kExact, "dbias of an empty batch");
}

BOOST_AUTO_TEST_CASE(batch_norm_errors, MT_CPU_TEST) {
  const Tensor x = mt::randn({4, 3, 2});
  expect_error([&] { mt::batch_norm(mt::randn({5}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "(N, C)", "[5]"});
  expect_error([&] { mt::batch_norm(x, mt::zeros({4}), mt::ones({4})); },
               {"batch_norm", "running_mean", "[4]", "3 channels", "[4, 3, 2]"});
  expect_error([&] { mt::batch_norm(x, mt::zeros({3}), Tensor()); },
               {"batch_norm", "running_mean and running_var", "running_var undefined"});
  expect_error([&] { mt::batch_norm(x, Tensor(), Tensor(), mt::ones({2})); }, {"batch_norm", "weight", "[2]"});
  expect_error([&] { mt::batch_norm(x, Tensor(), Tensor(), Tensor(), mt::zeros({3}, mt::kI64)); },
               {"batch_norm", "bias"});
  expect_error([&] { mt::batch_norm(mt::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "more than 1 value per channel", "[1, 3]"});
  expect_error([&] { mt::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, -1.0); },
               {"batch_norm", "eps"});
  expect_error(
      [&] {
        mt::batch_norm(x, mt::zeros({3}), mt::ones({3}), Tensor(), Tensor(), true,
                       std::numeric_limits<double>::quiet_NaN());
      },
      {"batch_norm", "momentum"});
  expect_error([&] { mt::batch_norm(mt::zeros({4, 3}, mt::kI64), Tensor(), Tensor()); }, {"batch_norm", "x"});
}

BOOST_AUTO_TEST_CASE(batch_norm_matches_cpu, MT_GPU_TEST) {
  mt::manual_seed(24);
  for (DType dt : {mt::kF32, mt::kF16, mt::kBF16, mt::kF64})
    for (bool running : {false, true})
      for (bool affine : {false, true}) {
        check_batch_norm_gpu(randn_as({7, 3}, dt), running, affine, "(N, C)");
        check_batch_norm_gpu(randn_as({5, 4, 300}, dt), running, affine, "(N, C, L)");
        check_batch_norm_gpu(randn_as({8, 6, 13, 13}, dt, 5.0), running, affine, "(N, C, H, W), offset +5");
      }
  // Many channels, long channels (each thread sweeps many elements), a transposed input, and no values.
  check_batch_norm_gpu(randn_as({4096, 300}, mt::kF16), false, true, "300 channels of 4096");
  check_batch_norm_gpu(randn_as({64, 3, 64, 64}, mt::kBF16), false, true, "3 channels of 262144");
  check_batch_norm_gpu(non_contiguous(randn_as({40, 7}, mt::kF32), "transposed"), false, true, "transposed");
  check_batch_norm_gpu(randn_as({0, 3, 4}, mt::kF32), true, true, "empty batch, running statistics");
}

BOOST_AUTO_TEST_CASE(batch_norm_forward_backward_on_gpu, MT_GPU_TEST) {
  mt::manual_seed(25);
  for (DType dt : kGpuFloatTypes)
    for (bool training : {true, false}) {
      Leaf x(randn_as({16, 8, 6, 6}, dt)), w(randn_as({8}, mt::kF32)), b(randn_as({8}, mt::kF32));
      Tensor rm_cpu = mt::mul(mt::randn({8}), 0.1), rv_cpu = mt::add(mt::rand({8}), 1.0);
      Tensor rm_gpu = gpu(rm_cpu), rv_gpu = gpu(rv_cpu);
      const Tensor dy = randn_as({16, 8, 6, 6}, dt);
      std::ostringstream os;
      os << "batch_norm " << dt << (training ? " training" : " eval") << ", f32 weight and bias, cuda vs cpu";
      const Tensor y_cpu = mt::batch_norm(x.cpu, rm_cpu, rv_cpu, w.cpu, b.cpu, training);
      const Tensor y_gpu = mt::batch_norm(x.gpu, rm_gpu, rv_gpu, w.gpu, b.gpu, training);
      const double allow = order_allowance(16 * 36);
      expect_close(y_gpu, y_cpu, with_allowance(tolerance(dt), allow, y_cpu), os.str());
      // The running statistics, updated on both devices (or left, in eval).
      expect_close(rm_gpu, rm_cpu, with_allowance(tolerance(mt::kF32), allow, rm_cpu), os.str() + ", running_mean");
      expect_close(rv_gpu, rv_cpu, with_allowance(tolerance(mt::kF32), allow, rv_cpu), os.str() + ", running_var");
      y_cpu.backward(dy);
      y_gpu.backward(gpu(dy));
      expect_close(x.gpu.grad(), x.cpu.grad(), with_allowance(chained(dt), allow, x.cpu.grad()), os.str() + ", dx");
      expect_close(w.gpu.grad(), w.cpu.grad(), with_allowance(chained(mt::kF32), allow, w.cpu.grad()),
                   os.str() + ", dweight");
      expect_close(b.gpu.grad(), b.cpu.grad(), with_allowance(chained(mt::kF32), allow, b.cpu.grad()),
                   os.str() + ", dbias");
    }
}

BOOST_AUTO_TEST_SUITE_END()
