// tests/test_loss.cpp — the loss family (ops/loss.cpp, ops/cpu/loss.cpp, cuda/loss.cu): cross_entropy (fused for
// (N, C) and (C) logits, composed for spatial dims), nll_loss and mse_loss.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), PyTorch reference values, ignore_index and label smoothing, f16 logits whose
// statistics must be f32, the errors of misuse, the fused CPU kernels against formulas in double
// (tests/reference.h), and the CUDA kernels against the CPU's (tests/gpu_rows.h: the order allowance), with the
// ops forward and backward on both devices.
#include "family_test.h"

#include <algorithm>
#include <utility>

namespace {

Tensor labels(std::vector<int64_t> v, const mt::Shape& shape) { return mt::from_vector(v, shape, mt::kI64); }
Tensor labels(std::vector<int64_t> v) { return labels(v, mt::Shape{static_cast<int64_t>(v.size())}); }

/// −log softmax(row)[c], in double: the reference for one cross-entropy row.
double ce_row(const std::vector<double>& row, int64_t c) {
  double s = 0;
  for (double v : row) s += std::exp(v);
  return std::log(s) - row[static_cast<size_t>(c)];
}

using CE = mt::CrossEntropyOptions;

MT_OP_CASE({.op = "cross_entropy", .label = "(N, C), mean",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({4, 5}), labels({1, 0, 4, 2})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "ignore_index present, mean",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({4, 5}), labels({1, -100, 4, 2})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "label smoothing 0.1, mean",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.label_smoothing = 0.1}); },
            .inputs = [] { return In{mt::randn({4, 5}), labels({3, 0, 4, 2})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "label smoothing 0.1 with ignore_index 1, sum",
            .f = [](const In& in) {
              return mt::cross_entropy(in[0], in[1],
                                       CE{.reduction = mt::Reduction::kSum, .ignore_index = 1, .label_smoothing = 0.1});
            },
            .inputs = [] { return In{mt::randn({4, 5}), labels({1, 0, 4, 1})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "reduction none",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.reduction = mt::Reduction::kNone}); },
            .inputs = [] { return In{mt::randn({3, 4}), labels({3, -100, 0})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "3-D (N, C, d) logits, mean",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 4, 3}), labels({0, 3, 1, 2, -100, 3}, {2, 3})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "transposed logits, sum",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.reduction = mt::Reduction::kSum}); },
            .inputs = [] { return In{non_contiguous(mt::randn({3, 4}), "transposed"), labels({2, 0, 3})}; }});

// (N, C) and (C) logits run the fused kernels; (N, C, d1, ...) with a spatial dim > 1 the composed path.
MT_OP_CASE({.op = "cross_entropy", .label = "unbatched (C) logits, smoothing 0.2, mean (fused)",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.label_smoothing = 0.2}); },
            .inputs = [] { return In{mt::randn({6}), labels({4}, mt::Shape{})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "(N, C, 1, 1) logits, none (fused: spatial dims of size 1)",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.reduction = mt::Reduction::kNone}); },
            .inputs = [] { return In{mt::randn({3, 5, 1, 1}), labels({4, -100, 0}, {3, 1, 1})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "(N, 37) logits offset +20, smoothing 0.1, ignore_index 3, sum (fused)",
            .f = [](const In& in) {
              return mt::cross_entropy(in[0], in[1],
                                       CE{.reduction = mt::Reduction::kSum, .ignore_index = 3, .label_smoothing = 0.1});
            },
            .inputs = [] { return In{mt::add(mt::randn({5, 37}), 20.0), labels({36, 3, 0, 17, 3})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "label smoothing 1, mean (fused)",
            .f = [](const In& in) { return mt::cross_entropy(in[0], in[1], CE{.label_smoothing = 1.0}); },
            .inputs = [] { return In{mt::randn({3, 4}), labels({1, 3, -100})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "smoothing 0.1, none, ignore_index present (fused)",
            .f = [](const In& in) {
              return mt::cross_entropy(in[0], in[1], CE{.reduction = mt::Reduction::kNone, .label_smoothing = 0.1});
            },
            .inputs = [] { return In{mt::randn({4, 6}), labels({5, -100, 0, 2})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "3-D (N, C, d) logits, smoothing 0.1, none (composed)",
            .f = [](const In& in) {
              return mt::cross_entropy(in[0], in[1], CE{.reduction = mt::Reduction::kNone, .label_smoothing = 0.1});
            },
            .inputs = [] { return In{mt::randn({2, 4, 3}), labels({0, 3, -100, 2, 1, 3}, {2, 3})}; }});
MT_OP_CASE({.op = "cross_entropy", .label = "4-D (N, C, h, w) logits, smoothing 0.1, ignore_index 2, sum (composed)",
            .f = [](const In& in) {
              return mt::cross_entropy(in[0], in[1],
                                       CE{.reduction = mt::Reduction::kSum, .ignore_index = 2, .label_smoothing = 0.1});
            },
            .inputs = [] { return In{mt::randn({2, 3, 2, 2}), labels({0, 2, 1, 1, 2, 0, 1, 0}, {2, 2, 2})}; }});

using NLL = mt::NllLossOptions;

MT_OP_CASE({.op = "nll_loss", .label = "(N, C), mean", .f = [](const In& in) { return mt::nll_loss(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({4, 5}), labels({1, 0, 4, 2})}; }});
MT_OP_CASE({.op = "nll_loss", .label = "ignore_index present, sum",
            .f = [](const In& in) { return mt::nll_loss(in[0], in[1], NLL{.reduction = mt::Reduction::kSum}); },
            .inputs = [] { return In{mt::randn({4, 5}), labels({1, -100, 4, 2})}; }});
MT_OP_CASE({.op = "nll_loss", .label = "3-D (N, C, d), none",
            .f = [](const In& in) { return mt::nll_loss(in[0], in[1], NLL{.reduction = mt::Reduction::kNone}); },
            .inputs = [] { return In{mt::randn({2, 3, 2}), labels({0, 2, 1, -100}, {2, 2})}; }});

MT_OP_CASE({.op = "mse_loss", .label = "mean", .f = [](const In& in) { return mt::mse_loss(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({3, 4})}; }});
MT_OP_CASE({.op = "mse_loss", .label = "sum, strided target",
            .f = [](const In& in) { return mt::mse_loss(in[0], in[1], mt::Reduction::kSum); },
            .inputs = [] { return In{mt::randn({3, 4}), non_contiguous(mt::randn({3, 4}), "strided")}; }});
MT_OP_CASE({.op = "mse_loss", .label = "none, 3-D",
            .f = [](const In& in) { return mt::mse_loss(in[0], in[1], mt::Reduction::kNone); },
            .inputs = [] { return In{mt::randn({2, 3, 2}), mt::randn({2, 3, 2})}; }});

// ---- the fused CPU kernels against float64 references ----------------------------------------

/// loss, lse and dx of kn::cross_entropy[_backward] against the formulas in double, from the same rounded inputs
/// (dx from the kernel's own lse: the backward's contract). Targets cycle through the classes; every third row
/// is ignored (-100).
void check_cross_entropy(const Tensor& x, double eps, const std::string& what) {
  const int64_t rows = x.size(0), C = x.size(1);
  const DType dt = x.dtype(), A = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  std::vector<int64_t> tv(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) tv[static_cast<size_t>(i)] = i % 3 == 1 ? -100 : (i * 7 + 3) % C;
  const Tensor target = mt::from_vector(tv, {rows}, DType::kI64);
  const std::string config = describe("cross_entropy of ", dt, " ", x.shape(), " (", what, "), smoothing ", eps);

  const kn::CrossEntropyResult r = kn::cross_entropy(x, target, -100, eps);
  expect_shape(r.loss, {rows}, A, config + ", loss");
  expect_shape(r.lse, {rows}, A, config + ", lse");
  const std::vector<double> xv = values(x);
  std::vector<double> loss(static_cast<size_t>(rows)), lse(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = xv.data() + i * C;
    double m = -INFINITY, s = 0, sum_lp = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xr[c] - m);
    const double l = m + std::log(s);
    for (int64_t c = 0; c < C; ++c) sum_lp += xr[c] - l;
    const int64_t t = tv[static_cast<size_t>(i)];
    lse[static_cast<size_t>(i)] = l;
    loss[static_cast<size_t>(i)] = t < 0 ? 0.0 : -((1 - eps) * (xr[t] - l) + eps / C * sum_lp);
  }
  expect_values(r.loss, loss, mt::test::tolerance(A), config + ", loss");
  expect_values(r.lse, lse, mt::test::tolerance(A), config + ", lse");
  // The reductions: Σ loss, the counted rows (every third is ignored) and their quotient.
  double sum = 0;
  for (double l : loss) sum += l;
  const double counted = static_cast<double>(rows - (rows + 1) / 3);
  expect_shape(r.sum, {}, A, config + ", sum");
  expect_values(r.sum, {sum}, mt::test::tolerance(A), config + ", sum");
  expect_values(r.count, {counted}, {0, 0}, config + ", count");
  expect_values(r.mean, {sum / counted}, mt::test::tolerance(A), config + ", mean");

  const Tensor w = mt::randn({rows}).to(A);
  const Tensor dx = kn::cross_entropy_backward(x, target, r.lse, w, -100, eps, Tensor());
  expect_shape(dx, x.shape(), dt, config + ", dx");
  const std::vector<double> lk = values(r.lse), wv = values(w);
  std::vector<double> want(xv.size());
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = tv[static_cast<size_t>(i)];
    for (int64_t c = 0; c < C; ++c) {
      const size_t j = static_cast<size_t>(i * C + c);
      want[j] = t < 0 ? 0.0 : (std::exp(xv[j] - lk[static_cast<size_t>(i)]) - (c == t ? 1 - eps : 0.0) - eps / C) *
                                  wv[static_cast<size_t>(i)];
    }
  }
  expect_values(dx, want, mt::test::tolerance(dt), config + ", dx");

  // The mean's backward: one scale in the logits' dtype divided by the count in the kernel equals the quotient
  // passed as the scale (0.75 is exact in every dtype, 0.75 / 3 = 0.25 too).
  const Tensor dx_div = kn::cross_entropy_backward(x, target, r.lse, mt::from_vector<double>({0.75}, {1}, dt), -100,
                                                   eps, mt::scalar_tensor(3.0, A));
  const Tensor dx_quot =
      kn::cross_entropy_backward(x, target, r.lse, mt::from_vector<double>({0.25}, {1}, A), -100, eps, Tensor());
  expect_values(dx_div, values(dx_quot), kExact, config + ", dx with a divisor");
}

// ---- the CUDA kernels against the CPU's --------------------------------------------------------

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
void check_cross_entropy_on_gpu(const Tensor& x, double eps, const std::string& what, const Tensor& x_gpu = Tensor()) {
  const int64_t rows = x.size(0), C = x.size(1);
  const DType dt = x.dtype(), A = acc_of(dt);
  Tensor target = mt::randint(0, C, {rows});
  for (int64_t i = 3; i < rows; i += 7) target.set({i}, -100);
  std::ostringstream os;
  os << "cross_entropy of " << describe(x) << " (" << what << "), smoothing " << eps;
  const std::string config = os.str();

  const kn::CrossEntropyResult cpu = kn::cross_entropy(x, target, -100, eps);
  const Tensor xg = x_gpu.defined() ? x_gpu : gpu(x);
  const kn::CrossEntropyResult g = kn::cross_entropy(xg, gpu(target), -100, eps);
  BOOST_REQUIRE(g.loss.is_cuda() && g.lse.is_cuda());
  // Losses and lse are in A, made of sums over C terms in different orders.
  expect_close(g.loss, cpu.loss, with_allowance(mt::test::tolerance(A), order_allowance(C), cpu.loss), config + ", loss");
  expect_close(g.lse, cpu.lse, with_allowance(mt::test::tolerance(A), order_allowance(C), cpu.lse), config + ", lse");
  expect_finite(g.loss, config + ", loss");
  expect_finite(g.lse, config + ", lse");
  // The reductions: a sum of the (non-negative) row losses in another order, the count exact.
  expect_close(g.sum, cpu.sum, with_allowance(mt::test::tolerance(A), order_allowance(C) + order_allowance(rows), cpu.sum), config + ", sum");
  expect_close(g.mean, cpu.mean, with_allowance(mt::test::tolerance(A), order_allowance(C) + order_allowance(rows), cpu.mean), config + ", mean");
  expect_close(g.count, cpu.count, {0, 0}, config + ", count");

  const Tensor w = randn_as({rows}, A);
  const Tensor dx_cpu = kn::cross_entropy_backward(x, target, cpu.lse, w, -100, eps, Tensor());
  const Tensor dx_gpu = kn::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(w), -100, eps, Tensor());
  // Elementwise from the same lse: the two backends differ by their exp's last-ulp error before the one rounding.
  expect_close(dx_gpu, dx_cpu, mt::test::tolerance(dt), config + ", dx");
  expect_finite(dx_gpu, config + ", dx");
  const Tensor one = randn_as({1}, A);
  expect_close(kn::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(one), -100, eps, Tensor()),
               kn::cross_entropy_backward(x, target, cpu.lse, one, -100, eps, Tensor()), mt::test::tolerance(dt),
               config + ", dx with one scale for every row");
  // The mean's backward: a scale in the logits' dtype, divided by the count in the kernel.
  const Tensor scale = randn_as({1}, dt), count = mt::scalar_tensor(7.0, A);
  expect_close(kn::cross_entropy_backward(xg, gpu(target), gpu(cpu.lse), gpu(scale), -100, eps, gpu(count)),
               kn::cross_entropy_backward(x, target, cpu.lse, scale, -100, eps, count),
               mt::test::tolerance(dt), config + ", dx with a divisor");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss)

// ---- PyTorch reference values ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cross_entropy_reference_values, MT_CPU_TEST) {
  // torch.nn.functional.cross_entropy(torch.tensor([[1., 2., 3.]]), torch.tensor([2])) = 0.40760596
  Tensor logits = mt::from_vector<double>({1, 2, 3}, {1, 3}, mt::kF32);
  BOOST_TEST(mt::cross_entropy(logits, labels({2})).item<double>() == 0.40760596, tt::tolerance(1e-6));
  // Two rows, mean: (2.40760596 + log 3) / 2.
  Tensor two = mt::from_vector<double>({1, 2, 3, 1, 1, 1}, {2, 3}, mt::kF32);
  BOOST_TEST(mt::cross_entropy(two, labels({0, 1})).item<double>() == (2.40760596 + std::log(3.0)) / 2,
             tt::tolerance(1e-6));
  BOOST_TEST(mt::cross_entropy(two, labels({0, 1}), CE{.reduction = mt::Reduction::kSum}).item<double>() ==
                 2.40760596 + std::log(3.0),
             tt::tolerance(1e-6));
  // Unbatched: (C) logits and a 0-d target.
  Tensor one = mt::from_vector<double>({1, 2, 3}, {3}, mt::kF32);
  Tensor loss = mt::cross_entropy(one, labels({2}, mt::Shape{}));
  BOOST_TEST(loss.dim() == 0);
  BOOST_TEST(loss.item<double>() == 0.40760596, tt::tolerance(1e-6));
  // nll_loss of log_softmax is cross_entropy.
  BOOST_TEST(mt::nll_loss(mt::log_softmax(two, 1), labels({0, 1})).item<double>() ==
                 mt::cross_entropy(two, labels({0, 1})).item<double>(),
             tt::tolerance(1e-6));
  // mse_loss: mean of squares.
  Tensor a = mt::from_vector<double>({1, 2, 3}, {3}, mt::kF32), b = mt::from_vector<double>({1, 0, 6}, {3}, mt::kF32);
  BOOST_TEST(mt::mse_loss(a, b).item<double>() == 13.0 / 3, tt::tolerance(1e-6));
  BOOST_TEST(mt::mse_loss(a, b, mt::Reduction::kSum).item<double>() == 13.0, tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(cross_entropy_gradient_reference, MT_CPU_TEST) {
  // d/dlogits of the mean loss = (softmax − one_hot) / N.
  Tensor logits = mt::from_vector<double>({1, 2, 3, 1, 1, 1}, {2, 3}, mt::kF64).requires_grad_();
  mt::cross_entropy(logits, labels({2, 0})).backward();
  std::vector<double> g = logits.grad().to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  std::vector<double> expected = {std::exp(1.0) / z / 2, std::exp(2.0) / z / 2, (std::exp(3.0) / z - 1) / 2,
                                  (1.0 / 3 - 1) / 2, 1.0 / 6, 1.0 / 6};
  for (size_t i = 0; i < g.size(); ++i) BOOST_TEST(g[i] == expected[i], tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(cross_entropy_ignore_index, MT_CPU_TEST) {
  std::vector<double> r0 = {1, 2, 3}, r1 = {1, 1, 1}, r2 = {0, 0, 5};
  Tensor logits = mt::from_vector<double>({1, 2, 3, 1, 1, 1, 0, 0, 5}, {3, 3}, mt::kF64).requires_grad_();
  Tensor target = labels({2, -100, 0});
  // Ignored rows are left out of the mean's count.
  Tensor loss = mt::cross_entropy(logits, target);
  BOOST_TEST(loss.item<double>() == (ce_row(r0, 2) + ce_row(r2, 0)) / 2, tt::tolerance(1e-12));
  loss.backward();
  for (int64_t c = 0; c < 3; ++c) BOOST_TEST(logits.grad().at<double>({1, c}) == 0.0);
  // none: 0 at the ignored row.
  std::vector<double> none =
      mt::cross_entropy(logits, target, CE{.reduction = mt::Reduction::kNone}).to_vector<double>();
  BOOST_TEST(none[1] == 0.0);
  BOOST_TEST(none[2] == ce_row(r2, 0), tt::tolerance(1e-12));
  // A custom ignore_index may be a real class.
  BOOST_TEST(mt::cross_entropy(logits, labels({2, 1, 0}), CE{.ignore_index = 1}).item<double>() ==
                 (ce_row(r0, 2) + ce_row(r2, 0)) / 2,
             tt::tolerance(1e-12));
  // Every row ignored: the mean is NaN (0 / 0, like PyTorch), the sum 0.
  Tensor all_ignored = labels({-100, -100, -100});
  BOOST_TEST(std::isnan(mt::cross_entropy(logits, all_ignored).item<double>()));
  BOOST_TEST(mt::cross_entropy(logits, all_ignored, CE{.reduction = mt::Reduction::kSum}).item<double>() == 0.0);
  BOOST_TEST(std::isnan(mt::nll_loss(logits, all_ignored).item<double>()));
  // An ignored row with -inf logits contributes 0, not NaN.
  Tensor inf_row = mt::from_vector<double>({1, 2, 3, -INFINITY, -INFINITY, -INFINITY}, {2, 3}, mt::kF64);
  BOOST_TEST(mt::cross_entropy(inf_row, labels({2, -100})).item<double>() == ce_row(r0, 2), tt::tolerance(1e-12));
}

// The composed path ((N, C, d1) logits: log_softmax, gather, where) gives the fused path's values and gradients,
// also where an ignored position holds -inf or NaN logits: its loss and gradient are 0, not NaN (0 * NaN).
BOOST_AUTO_TEST_CASE(cross_entropy_composed_ignored_nonfinite, MT_CPU_TEST) {
  const double inf = INFINITY, nan = NAN;
  // Four positions of three classes; position 1 all -inf, position 2 NaN, both ignored; position 3 one -inf.
  const std::vector<std::vector<double>> rows = {{1, 2, 3}, {-inf, -inf, -inf}, {nan, 0, nan}, {0.5, -inf, -1}};
  const std::vector<int64_t> target = {2, -100, -100, 0};
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  for (double eps : {0.0, 0.1}) {
    for (mt::Reduction red : {mt::Reduction::kMean, mt::Reduction::kSum, mt::Reduction::kNone}) {
      const CE o{.reduction = red, .label_smoothing = eps};
      // Fused: (4, 3) rows. Composed: the same positions as (1, 3, 4), class dim 1.
      Tensor fused_x = mt::from_vector<double>(flat, {4, 3}, mt::kF64).requires_grad_();
      Tensor composed_x = mt::from_vector<double>(flat, {4, 3}, mt::kF64).t().unsqueeze(0).contiguous();
      composed_x.requires_grad_();
      Tensor fused = mt::cross_entropy(fused_x, labels(target), o);
      Tensor composed = mt::cross_entropy(composed_x, labels(target, {1, 4}), o);
      const std::vector<double> fv = fused.to_vector<double>(), cv = composed.to_vector<double>();
      BOOST_REQUIRE_EQUAL(fv.size(), cv.size());
      // With smoothing, position 3's -inf logit makes its loss +inf on both paths (as in PyTorch).
      auto same = [](double a, double b) { return a == b || std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); };
      for (size_t i = 0; i < fv.size(); ++i) {
        BOOST_TEST(same(cv[i], fv[i]), "loss " << i << ": " << cv[i] << " vs " << fv[i]);
      }
      mt::sum(fused).backward();
      mt::sum(composed).backward();
      const std::vector<double> fg = fused_x.grad().to_vector<double>();
      const std::vector<double> cg = composed_x.grad().squeeze(0).t().contiguous().to_vector<double>();
      for (size_t i = 0; i < fg.size(); ++i) {
        BOOST_TEST_CONTEXT("eps " << eps << ", reduction " << static_cast<int>(red) << ", element " << i) {
          BOOST_TEST(std::isfinite(cg[i]));
          BOOST_TEST(same(cg[i], fg[i]), cg[i] << " vs " << fg[i]);
          if (i / 3 == 1 || i / 3 == 2) BOOST_TEST(cg[i] == 0.0);  // the ignored positions
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(cross_entropy_label_smoothing_value, MT_CPU_TEST) {
  // PyTorch: loss = (1 − ε)·nll + ε·mean_c(−log p_c); for [[1, 2, 3]], target 2, ε = 0.1: 0.50760596.
  Tensor logits = mt::from_vector<double>({1, 2, 3}, {1, 3}, mt::kF64);
  BOOST_TEST(mt::cross_entropy(logits, labels({2}), CE{.label_smoothing = 0.1}).item<double>() == 0.5076059644,
             tt::tolerance(1e-9));
  // With an ignored row the mean still divides by the counted rows only.
  std::vector<double> r0 = {1, 2, 3}, r1 = {0, 0, 5};
  Tensor two = mt::from_vector<double>({1, 2, 3, 4, 4, 4, 0, 0, 5}, {3, 3}, mt::kF64);
  auto smoothed = [](const std::vector<double>& r, int64_t c) {
    return 0.9 * ce_row(r, c) + 0.1 * (ce_row(r, 0) + ce_row(r, 1) + ce_row(r, 2)) / 3;
  };
  BOOST_TEST(mt::cross_entropy(two, labels({2, -100, 1}), CE{.label_smoothing = 0.1}).item<double>() ==
                 (smoothed(r0, 2) + smoothed(r1, 1)) / 2,
             tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(precision_categories, MT_CPU_TEST) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  for (const char* op : {"cross_entropy", "nll_loss", "mse_loss"})
    BOOST_TEST_CONTEXT(op) { BOOST_TEST(category(op) == "fp32"); }
}

// ---- errors ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(error_messages, MT_CPU_TEST) {
  Tensor logits = mt::randn({2, 3});
  // A float target.
  expect_error([&] { mt::cross_entropy(logits, mt::from_vector<double>({0, 1}, {2}, mt::kF32)); },
               {"cross_entropy", "i64", "f32"});
  // Class index 5 of 3.
  expect_error([&] { mt::cross_entropy(logits, labels({0, 5})); }, {"cross_entropy", "target value 5", "3 classes"});
  // Class index -1.
  expect_error([&] { mt::nll_loss(logits, labels({-1, 0})); }, {"nll_loss", "target value -1"});
  // Class index C, one past the last, where no fused kernel checks again: nll_loss, and (N, C, d1) logits.
  expect_error([&] { mt::nll_loss(logits, labels({0, 3})); }, {"nll_loss: target value 3", "3 classes"});
  expect_error([&] { mt::cross_entropy(mt::randn({2, 3, 2}), labels({0, 1, 3, 2}, {2, 2})); },
               {"cross_entropy: target value 3 (at flat position 2)", "3 classes"});
  // A target of the wrong shape.
  expect_error([&] { mt::cross_entropy(logits, labels({0, 1, 2})); }, {"[3]", "[2, 3]"});
  // Different shapes.
  expect_error([] { mt::mse_loss(mt::randn({2, 3}), mt::randn({3, 2})); }, {"mse_loss"});
  BOOST_CHECK_THROW(mt::cross_entropy(logits, labels({0, 1}), CE{.label_smoothing = 1.5}), mt::Error);
  expect_error([&] { mt::cross_entropy(logits, labels({0, 1}), CE{.label_smoothing = -0.1}); },
               {"cross_entropy: label_smoothing must be in [0, 1], got -0.1"});
}

// ---- f16 data: statistics in f32 -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(f16_cross_entropy_keeps_f32_statistics, MT_CPU_TEST) {
  // Rows of 4096 logits near +1000 (f16 spacing 0.5 there): an f16 running sum of 4096 exponentials keeps 11
  // bits of the growing total and drops the small terms (tests/test_softmax.cpp's
  // f16_softmax_keeps_f32_statistics). The fused kernels keep their statistics in f32.
  mt::manual_seed(5);
  Tensor x = mt::add(mt::mul(mt::randn({2, 4096}), 4.0), 1000.0).to(mt::kF16);
  Tensor ref = x.to(mt::kF64);
  Tensor target = mt::randint(0, 4096, {2});
  BOOST_TEST(mt::cross_entropy(x, target).dtype() == mt::kF16);
  mt::test::expect_close(mt::cross_entropy(x, target), mt::cross_entropy(ref, target),
                         mt::test::tolerance(mt::kF16), "f16 cross_entropy near +1000");
}

BOOST_AUTO_TEST_CASE(logits_far_below_and_above_zero_are_shifted_logits_near_zero, MT_CPU_TEST) {
  // Moving every logit of a row by one amount changes neither the loss nor its gradient: the row's max is
  // subtracted before exp, so rows near −1000 (where every exp underflows to 0) and near +1000 (where it overflows)
  // give what rows near 0 give. Logits 0.5 apart, exact in f16 there; with and without label smoothing.
  const Tensor base = mt::test::half_steps({4, 10});
  const Tensor target = mt::from_vector<int64_t>({3, 0, 9, 5}, {4}, DType::kI64);
  for (DType dt : {mt::kF64, mt::kF32, mt::kF16})
    for (double shift : {-1000.0, 1000.0})
      for (double eps : {0.0, 0.1}) {
        BOOST_TEST_CONTEXT(dt << ", shift " << shift << ", label_smoothing " << eps) {
          Tensor x = mt::add(base, shift).to(dt).requires_grad_();
          Tensor ref = base.clone().requires_grad_();
          const Tensor loss = mt::cross_entropy(x, target, {.label_smoothing = eps});
          const Tensor loss_ref = mt::cross_entropy(ref, target, {.label_smoothing = eps});
          mt::test::expect_close(loss, loss_ref, mt::test::tolerance(dt), "loss");
          loss.backward();
          loss_ref.backward();
          mt::test::expect_close(x.grad(), ref.grad(), mt::test::tolerance(dt), "gradient");
        }
      }
}

// ---- the fused CPU kernels -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cross_entropy_matches_f64_reference, MT_CPU_TEST) {
  mt::manual_seed(31);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {7, 13}, {5, 300}, {40, 1000}};
  for (DType dt : kFloatTypes)
    for (double eps : {0.0, 0.1, 1.0})
      for (auto [rows, C] : shapes) check_cross_entropy(mt::randn({rows, C}).to(dt), eps, "randn");
  for (DType dt : kFloatTypes) {
    // Logits near +50: every statistic is a difference from the row's max, so nothing cancels.
    check_cross_entropy(kn::scalar(kn::ScalarOp::kAdd, mt::randn({6, 37}), 50.0).to(dt), 0.1, "offset +50");
    check_cross_entropy(mt::randn({9, 5}).to(dt).t(), 0.1, "transposed");
  }
}

BOOST_AUTO_TEST_CASE(cross_entropy_edge_rows, MT_CPU_TEST) {
  const double inf = INFINITY;
  // Row 0: ignored, all −inf: loss 0 and dx 0, not NaN. Row 1: one −inf logit, the others finite.
  const Tensor x = mt::from_vector<double>({-inf, -inf, -inf, 0.5, -inf, 1.5}, {2, 3}, DType::kF32);
  const Tensor target = mt::from_vector<int64_t>({-100, 2}, {2}, DType::kI64);
  const kn::CrossEntropyResult r = kn::cross_entropy(x, target, -100, 0.0);
  const std::vector<double> loss = values(r.loss);
  BOOST_TEST(loss[0] == 0.0);
  BOOST_TEST(loss[1] == std::log(1 + std::exp(-1.0)), boost::test_tools::tolerance(1e-6));
  // One scale for every row (the sum and mean reductions) equals the scale repeated per row.
  const Tensor one = mt::from_vector<double>({0.5}, {1}, DType::kF32);
  const Tensor dx = kn::cross_entropy_backward(x, target, r.lse, one, -100, 0.0, Tensor());
  const Tensor dx_rows =
      kn::cross_entropy_backward(x, target, r.lse, mt::from_vector<double>({0.5, 0.5}, {2}, DType::kF32), -100, 0.0, Tensor());
  expect_values(dx, values(dx_rows), kExact, "cross_entropy_backward, one scale for every row");
  const std::vector<double> g = values(dx);
  BOOST_TEST(g[0] == 0.0);
  BOOST_TEST(g[1] == 0.0);
  BOOST_TEST(g[2] == 0.0);
  BOOST_TEST(g[4] == 0.0);  // exp(−inf − lse) = 0
  // With smoothing, a −inf logit in a counted row makes its loss +inf (as Σ_c log p_c is −inf).
  BOOST_TEST(values(kn::cross_entropy(x, target, -100, 0.1).loss)[1] == inf);
  // ε = 1 (the uniform target) with the target's logit −inf: +inf as well, from the smoothing term; the target
  // term's weight 1 − ε = 0 is skipped, not multiplied (0 · −inf would make it NaN, as PyTorch 1.13 returns).
  const Tensor at_inf = mt::from_vector<int64_t>({-100, 1}, {2}, DType::kI64);
  BOOST_TEST(values(kn::cross_entropy(x, at_inf, -100, 1.0).loss)[1] == inf);
  // Empty batch: no rows, sum 0, count 0, mean NaN (PyTorch's mean over nothing).
  const kn::CrossEntropyResult e = kn::cross_entropy(mt::zeros({0, 4}), mt::zeros({0}, DType::kI64), -100, 0.0);
  BOOST_TEST(e.loss.numel() == 0);
  BOOST_TEST(values(e.sum)[0] == 0.0);
  BOOST_TEST(values(e.count)[0] == 0.0);
  BOOST_TEST(std::isnan(values(e.mean)[0]));
  // Every row ignored: the mean is NaN too.
  BOOST_TEST(std::isnan(values(kn::cross_entropy(x, mt::from_vector<int64_t>({-100, -100}, {2}, DType::kI64), -100,
                                                 0.0).mean)[0]));
}

BOOST_AUTO_TEST_CASE(cross_entropy_misuse, MT_CPU_TEST) {
  const Tensor x = mt::zeros({2, 5}), lse = mt::zeros({2});
  const Tensor target = mt::from_vector<int64_t>({1, 5}, {2}, DType::kI64);
  const Tensor ok = mt::from_vector<int64_t>({1, 4}, {2}, DType::kI64);
  // Target values: a pass over the data on the CPU, in the kernels themselves (internal callers too).
  expect_error([&] { kn::cross_entropy(x, target, -100, 0.0); },
               {"cross_entropy: target value 5", "out of range for 5 classes"});
  expect_error([&] { kn::cross_entropy_backward(x, target, lse, lse, -100, 0.0, Tensor()); },
               {"cross_entropy_backward: target value 5"});
  // The entry point's dtype invariants.
  expect_error([&] { kn::cross_entropy(x, mt::zeros({2}), -100, 0.0); },
               {"kernels::cross_entropy: its invariant", "target = f32 [2] on cpu"});
  expect_error([&] { kn::cross_entropy(mt::zeros({2, 5}, DType::kI64), ok, -100, 0.0); },
               {"kernels::cross_entropy: its invariant", "logits = i64 [2, 5]"});
  expect_error([&] { kn::cross_entropy_backward(x, ok, lse.to(DType::kF16), lse, -100, 0.0, Tensor()); },
               {"kernels::cross_entropy_backward: its invariant", "lse = f16 [2]"});
  expect_error([&] { kn::cross_entropy_backward(x, ok, lse, lse.to(DType::kBF16), -100, 0.0, Tensor()); },
               {"kernels::cross_entropy_backward: its invariant", "row_scale = bf16 [2]"});
  // What users call says it in their words.
  expect_error([&] { mt::cross_entropy(mt::zeros({2, 5}), mt::zeros({2})); }, {"cross_entropy:", "i64", "f32"});
  expect_error([&] { mt::cross_entropy(x, mt::zeros({3}, DType::kI64)); },
               {"cross_entropy: target of shape [3]", "[2, 5]"});
  expect_error([&] { mt::cross_entropy(mt::zeros({2, 5}, DType::kI64), ok); }, {"cross_entropy:", "floating", "i64"});
  expect_error([&] { mt::cross_entropy(x, ok, {.label_smoothing = 1.5}); },
               {"cross_entropy: label_smoothing must be in [0, 1]"});
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

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
      for (auto [rows, C] : shapes) check_cross_entropy_on_gpu(randn_as({rows, C}, dt), eps, "randn");
  for (DType dt : kGpuFloatTypes) {
    check_cross_entropy_on_gpu(randn_as({16384, 1024}, dt), 0.1, "the benchmark's shape");
    check_cross_entropy_on_gpu(randn_as({33, 300}, dt, 1000.0), 0.1, "offset +1000");
    check_cross_entropy_on_gpu(randn_as({9, 40}, dt).t(), 0.0, "transposed");
    // Rows that start one element past 16 bytes (a narrowed view): the one-sweep kernel's element loads.
    const Tensor flat = randn_as({4 * 1024 + 1}, dt);
    check_cross_entropy_on_gpu(flat.narrow(0, 1, 4 * 1024).reshape({4, 1024}), 0.1, "base pointer off 16 bytes",
                        gpu(flat).narrow(0, 1, 4 * 1024).reshape({4, 1024}));
  }
}

// Every target ignored: losses 0, sum 0, count 0, the mean 0/0 = NaN, as on the CPU (and PyTorch); dx is 0,
// also through the mean's divisor (the count, 0).
BOOST_AUTO_TEST_CASE(cross_entropy_all_targets_ignored, MT_GPU_TEST) {
  mt::manual_seed(23);
  for (DType dt : kGpuFloatTypes)
    for (int64_t C : {8, 1024, 40000}) {
      std::ostringstream os;
      os << "cross_entropy with every target ignored, " << dt << " C " << C;
      const Tensor x = randn_as({4, C}, dt);
      const Tensor target = mt::tensor<int64_t>({-100, -100, -100, -100});
      const kn::CrossEntropyResult cpu = kn::cross_entropy(x, target, -100, 0.1);
      const kn::CrossEntropyResult g = kn::cross_entropy(gpu(x), gpu(target), -100, 0.1);
      expect_close(g.loss, cpu.loss, {0, 0}, os.str() + ", loss");
      expect_close(g.sum, cpu.sum, {0, 0}, os.str() + ", sum");
      expect_close(g.count, cpu.count, {0, 0}, os.str() + ", count");
      expect_close(g.mean, cpu.mean, {0, 0}, os.str() + ", mean");
      BOOST_CHECK_MESSAGE(std::isnan(g.mean.cpu().item<double>()), os.str() << ": mean should be NaN");
      const Tensor scale = randn_as({1}, dt);
      const Tensor dx = kn::cross_entropy_backward(gpu(x), gpu(target), g.lse, gpu(scale), -100, 0.1, g.count);
      expect_close(dx.cpu(), mt::zeros({4, C}, dt), kExact, os.str() + ", dx");
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
        const kn::CrossEntropyResult cpu = kn::cross_entropy(x.to(dt), target, -100, eps);
        const kn::CrossEntropyResult g = kn::cross_entropy(gpu(x.to(dt)), gpu(target), -100, eps);
        const DType A = acc_of(dt);
        // NaN where the CPU has NaN, the same infinities, else within the sums' order allowance.
        expect_close(g.loss, cpu.loss, with_allowance(mt::test::tolerance(A), order_allowance(C), cpu.loss), os.str() + ", loss");
        expect_close(g.lse, cpu.lse, with_allowance(mt::test::tolerance(A), order_allowance(C), cpu.lse), os.str() + ", lse");
      }
  }
}

// Ignored rows give loss 0 and dx 0 whatever their logits; a target out of [0, C) that is not ignore_index
// (which only the CPU can check without a synchronisation) gives a NaN loss and a NaN dx row, and nothing else.
BOOST_AUTO_TEST_CASE(cross_entropy_kernels_bad_and_ignored_targets, MT_GPU_TEST) {
  mt::manual_seed(22);
  for (DType dt : kGpuFloatTypes)
    for (int64_t C : {5, 8, 2000, 32768})  // warp rows without and with vectors; 256- and 512-thread block rows
      for (double eps : {0.0, 0.1}) {
        Tensor x = randn_as({5, C}, dt);
        x.set({2, 0}, -INFINITY);  // row 2 is ignored: −inf there must not make it NaN
        const Tensor target = gpu(mt::tensor<int64_t>({0, C, -100, -1, C - 1}));
        std::ostringstream os;
        os << "cross_entropy with bad targets, " << dt << " C " << C << " smoothing " << eps;
        const kn::CrossEntropyResult r = kn::cross_entropy(gpu(x), target, -100, eps);
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
        const Tensor dx = kn::cross_entropy_backward(gpu(x), target, r.lse, w, -100, eps, Tensor());
        const Tensor dx_rows = dx.cpu().narrow(0, 2, 1).contiguous();
        expect_close(dx_rows, mt::zeros({1, C}, dt), kExact, os.str() + ", ignored row's dx");
        expect_finite(dx.cpu().narrow(0, 0, 2).contiguous(), os.str() + ", dx rows 0-1", {1});
        expect_finite(dx.cpu().narrow(0, 3, 2).contiguous(), os.str() + ", dx rows 3-4", {0});
      }
}

// (N, C) logits run the fused kernels, (N, C, d) logits the composed path; every reduction.
BOOST_AUTO_TEST_CASE(cross_entropy_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(11);
  for (DType dt : kGpuFloatTypes)
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
          expect_close(loss_gpu, loss_cpu, with_allowance(mt::test::tolerance(dt), order_allowance(N * C), loss_cpu), os.str());
          const Tensor dy = reduction == mt::Reduction::kNone ? randn_as(loss_cpu.shape(), dt) : Tensor();
          loss_cpu.backward(dy);
          loss_gpu.backward(dy.defined() ? gpu(dy) : Tensor());
          expect_close(logits.gpu.grad(), logits.cpu.grad(), with_allowance(chained(dt), order_allowance(C), logits.cpu.grad()), os.str() + ", d logits");
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
    expect_close(logits.gpu.grad(), logits.cpu.grad(), with_allowance(mt::test::tolerance(mt::kF32), order_allowance(10), logits.cpu.grad()),
                 "cross_entropy's gradient after a write into its loss");
  }
}

BOOST_AUTO_TEST_SUITE_END()
