// tests/test_ops_nn.cpp — reductions, softmax, losses and layer norm: the op
// registry's cases (gradcheck in f64, f32/f16/bf16 against f64) and
// PyTorch reference values, ignore_index and label smoothing, argmax ties,
// error messages, and f16 softmax whose statistics must be f32.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/precision.h>
#include <mixtape/autograd/registry.h>
#include <mixtape/mixtape.h>
#include <mixtape/ops/ops.h>

#include "op_cases.h"

namespace mt = mixtape;
namespace utf = boost::unit_test;
namespace tt = boost::test_tools;
using mt::Tensor;
using mt::test::non_contiguous;
using mt::test::Tolerance;
using In = std::vector<Tensor>;

namespace {

/// Distinct values 0.25 apart (exact in bf16 for up to 512 elements), in a
/// scrambled order: max/argmax have no ties in any dtype and gradcheck's
/// ±1e-6 steps never reorder them.
Tensor distinct(const mt::Shape& shape) {
  const int64_t n = shape.numel();
  int64_t k = 7;
  for (int64_t p : {7, 11, 13, 17, 19})
    if (std::gcd(p, n) == 1) { k = p; break; }
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (static_cast<double>((i * k) % n) - n / 2.0) * 0.25;
  return mt::from_vector(v, shape, mt::kF64);
}

Tensor labels(std::vector<int64_t> v, const mt::Shape& shape) { return mt::from_vector(v, shape, mt::kI64); }
Tensor labels(std::vector<int64_t> v) { return labels(v, mt::Shape{static_cast<int64_t>(v.size())}); }

bool message_has(const mt::Error& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

/// −log softmax(row)[c], in double: the reference for one cross-entropy row.
double ce_row(const std::vector<double>& row, int64_t c) {
  double s = 0;
  for (double v : row) s += std::exp(v);
  return std::log(s) - row[static_cast<size_t>(c)];
}

// Softmax-family backwards read the saved output y, which is rounded to the
// op's dtype (PyTorch saves it the same way): dx = y·(dy − Σ dy·y) and
// dy − exp(y)·Σ dy inherit y's absolute error of up to half an ulp at 1
// (2^-11 in f16, 2^-8 in bf16), and the cancellation in the bracket leaves
// small dx with that absolute error. The forwards meet the table; the
// gradients need atol = that half ulp (seen: 1.6e-4 in f16, 1.2e-3 in bf16).
constexpr Tolerance kSoftmaxF16{1e-3, 4.9e-4};
constexpr Tolerance kSoftmaxBF16{1.6e-2, 3.9e-3};

// ---- reductions ----------------------------------------------------------------------

MT_OP_CASE({.op = "sum", .label = "all, 3-D", .f = [](const In& in) { return mt::sum(in[0]); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "sum", .label = "dims {0, 2} keepdim", .f = [](const In& in) { return mt::sum(in[0], {0, 2}, true); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "sum", .label = "dim -1", .f = [](const In& in) { return mt::sum(in[0], {-1}); },
            .inputs = [] { return In{mt::randn({3, 5})}; }});
MT_OP_CASE({.op = "sum", .label = "dim 0 of a transposed input",
            .f = [](const In& in) { return mt::sum(in[0], {0}); },
            .inputs = [] { return In{non_contiguous(mt::randn({4, 5}), "transposed")}; }});
MT_OP_CASE({.op = "sum", .label = "dims {-1, 0} of a strided input",
            .f = [](const In& in) { return mt::sum(in[0], {-1, 0}); },
            .inputs = [] { return In{non_contiguous(mt::randn({2, 3, 4}), "strided")}; }});

MT_OP_CASE({.op = "mean", .label = "all, 3-D", .f = [](const In& in) { return mt::mean(in[0]); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "mean", .label = "dim 1 keepdim", .f = [](const In& in) { return mt::mean(in[0], {1}, true); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "mean", .label = "dims {-1, -3}", .f = [](const In& in) { return mt::mean(in[0], {-1, -3}); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "mean", .label = "dim -1 of a transposed input",
            .f = [](const In& in) { return mt::mean(in[0], {-1}); },
            .inputs = [] { return In{non_contiguous(mt::randn({3, 5}), "transposed")}; }});

MT_OP_CASE({.op = "max", .label = "all", .f = [](const In& in) { return mt::max(in[0]); },
            .inputs = [] { return In{distinct({3, 4})}; }});
MT_OP_CASE({.op = "max", .label = "dim 1", .f = [](const In& in) { return mt::max(in[0], 1); },
            .inputs = [] { return In{distinct({3, 5})}; }});
MT_OP_CASE({.op = "max", .label = "dim -1 keepdim, 3-D", .f = [](const In& in) { return mt::max(in[0], -1, true); },
            .inputs = [] { return In{distinct({2, 3, 4})}; }});
MT_OP_CASE({.op = "max", .label = "dim 0 of a transposed input", .f = [](const In& in) { return mt::max(in[0], 0); },
            .inputs = [] { return In{non_contiguous(distinct({4, 3}), "transposed")}; }});

// ---- softmax -------------------------------------------------------------------------

MT_OP_CASE({.op = "softmax", .label = "dim -1, 3-D", .f = [](const In& in) { return mt::softmax(in[0], -1); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }, .f16 = kSoftmaxF16, .bf16 = kSoftmaxBF16});
MT_OP_CASE({.op = "softmax", .label = "dim 0, 3-D", .f = [](const In& in) { return mt::softmax(in[0], 0); },
            .inputs = [] { return In{mt::randn({3, 2, 4})}; }, .f16 = kSoftmaxF16, .bf16 = kSoftmaxBF16});
MT_OP_CASE({.op = "softmax", .label = "dim 1 of a transposed input",
            .f = [](const In& in) { return mt::softmax(in[0], 1); },
            .inputs = [] { return In{non_contiguous(mt::randn({3, 5}), "transposed")}; }, .f16 = kSoftmaxF16,
            .bf16 = kSoftmaxBF16});
MT_OP_CASE({.op = "softmax", .label = "dim -1 of a strided input, offset +50",
            .f = [](const In& in) { return mt::softmax(in[0], -1); },
            .inputs = [] { return In{non_contiguous(mt::add(mt::randn({2, 6}), 50.0), "strided")}; },
            .f16 = kSoftmaxF16, .bf16 = kSoftmaxBF16});

MT_OP_CASE({.op = "log_softmax", .label = "dim -1, 3-D", .f = [](const In& in) { return mt::log_softmax(in[0], -1); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }, .f16 = kSoftmaxF16, .bf16 = kSoftmaxBF16});
MT_OP_CASE({.op = "log_softmax", .label = "dim 0, 3-D", .f = [](const In& in) { return mt::log_softmax(in[0], 0); },
            .inputs = [] { return In{mt::randn({3, 2, 4})}; }, .f16 = kSoftmaxF16, .bf16 = kSoftmaxBF16});
MT_OP_CASE({.op = "log_softmax", .label = "dim 0 of a transposed input",
            .f = [](const In& in) { return mt::log_softmax(in[0], 0); },
            .inputs = [] { return In{non_contiguous(mt::randn({4, 3}), "transposed")}; }, .f16 = kSoftmaxF16,
            .bf16 = kSoftmaxBF16});

// ---- losses --------------------------------------------------------------------------

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

// ---- layer norm ----------------------------------------------------------------------

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

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_nn, *utf::label("cpu"))

// ---- PyTorch reference values ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cross_entropy_reference_values) {
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

BOOST_AUTO_TEST_CASE(cross_entropy_gradient_reference) {
  // d/dlogits of the mean loss = (softmax − one_hot) / N.
  Tensor logits = mt::from_vector<double>({1, 2, 3, 1, 1, 1}, {2, 3}, mt::kF64).requires_grad_();
  mt::cross_entropy(logits, labels({2, 0})).backward();
  std::vector<double> g = logits.grad().to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  std::vector<double> expected = {std::exp(1.0) / z / 2, std::exp(2.0) / z / 2, (std::exp(3.0) / z - 1) / 2,
                                  (1.0 / 3 - 1) / 2, 1.0 / 6, 1.0 / 6};
  for (size_t i = 0; i < g.size(); ++i) BOOST_TEST(g[i] == expected[i], tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(cross_entropy_ignore_index) {
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

BOOST_AUTO_TEST_CASE(cross_entropy_label_smoothing_value) {
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

BOOST_AUTO_TEST_CASE(layer_norm_reference_values) {
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

// ---- max and argmax ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(argmax_ties_pick_the_first_index) {
  Tensor x = mt::from_vector<double>({1, 3, 3, 2, 2, 1}, {2, 3}, mt::kF32);
  BOOST_TEST(mt::argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>({1, 0}), tt::per_element());
  BOOST_TEST(mt::argmax(x, 1).dtype() == mt::kI64);
  BOOST_TEST(mt::argmax(x, 0, true).shape() == mt::Shape({1, 3}));
  BOOST_TEST(mt::argmax(mt::from_vector<double>({5, 1, 5}, {3}, mt::kF32)).item<int64_t>() == 0);
  BOOST_TEST(mt::argmax(x).item<int64_t>() == 1);
  // The gradient of max goes to the first maximal element only.
  Tensor t = mt::from_vector<double>({1, 3, 3}, {3}, mt::kF64).requires_grad_();
  mt::max(t).backward();
  BOOST_TEST(t.grad().to_vector<double>() == std::vector<double>({0, 1, 0}), tt::per_element());
  Tensor u = mt::from_vector<double>({1, 3, 3, 2, 2, 1}, {2, 3}, mt::kF64).requires_grad_();
  mt::sum(mt::max(u, 1)).backward();
  BOOST_TEST(u.grad().to_vector<double>() == std::vector<double>({0, 1, 0, 1, 0, 0}), tt::per_element());
  // argmax is registered, passthrough and not differentiable.
  bool found = false;
  for (const auto& info : mt::autograd::registered_ops()) {
    if (info.name != "argmax") continue;
    found = true;
    BOOST_TEST(!info.differentiable);
    BOOST_TEST((info.precision == mt::Precision::kPassthrough));
  }
  BOOST_TEST(found);
}

BOOST_AUTO_TEST_CASE(precision_categories) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  for (const char* op :
       {"sum", "mean", "softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "layer_norm"})
    BOOST_TEST_CONTEXT(op) { BOOST_TEST(category(op) == "fp32"); }
  BOOST_TEST(category("max") == "passthrough");
  BOOST_TEST(category("argmax") == "passthrough");
}

// ---- errors ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(error_messages) {
  Tensor logits = mt::randn({2, 3});
  try {
    mt::cross_entropy(logits, mt::from_vector<double>({0, 1}, {2}, mt::kF32));
    BOOST_ERROR("a float target was accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "cross_entropy"), e.what());
    BOOST_TEST(message_has(e, "i64"), e.what());
    BOOST_TEST(message_has(e, "f32"), e.what());
  }
  try {
    mt::cross_entropy(logits, labels({0, 5}));
    BOOST_ERROR("class index 5 of 3 was accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "cross_entropy"), e.what());
    BOOST_TEST(message_has(e, "target value 5"), e.what());
    BOOST_TEST(message_has(e, "3 classes"), e.what());
  }
  try {
    mt::nll_loss(logits, labels({-1, 0}));
    BOOST_ERROR("class index -1 was accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "nll_loss"), e.what());
    BOOST_TEST(message_has(e, "target value -1"), e.what());
  }
  try {
    mt::cross_entropy(logits, labels({0, 1, 2}));
    BOOST_ERROR("a target of the wrong shape was accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "[3]"), e.what());
    BOOST_TEST(message_has(e, "[2, 3]"), e.what());
  }
  try {
    mt::layer_norm(mt::randn({2, 3}), {4});
    BOOST_ERROR("normalized_shape [4] was accepted for shape [2, 3]");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "layer_norm"), e.what());
    BOOST_TEST(message_has(e, "normalized_shape [4]"), e.what());
    BOOST_TEST(message_has(e, "[2, 3]"), e.what());
  }
  try {
    mt::layer_norm(mt::randn({2, 3}), {3}, mt::randn({4}));
    BOOST_ERROR("a weight of the wrong shape was accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "weight"), e.what());
  }
  try {
    mt::mse_loss(mt::randn({2, 3}), mt::randn({3, 2}));
    BOOST_ERROR("mse_loss accepted different shapes");
  } catch (const mt::Error& e) {
    BOOST_TEST(message_has(e, "mse_loss"), e.what());
  }
  BOOST_CHECK_THROW(mt::softmax(mt::randn({2, 3}), 2), mt::Error);
  BOOST_CHECK_THROW(mt::sum(mt::randn({2, 3}), {0, 0}), mt::Error);
  BOOST_CHECK_THROW(mt::max(mt::randn({0, 3})), mt::Error);
  BOOST_CHECK_THROW(mt::cross_entropy(logits, labels({0, 1}), CE{.label_smoothing = 1.5}), mt::Error);
}

// ---- f16 data: statistics in f32 -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(f16_softmax_keeps_f32_statistics) {
  // Rows of 4096 values near +1000 (f16 spacing 0.5 there): a running f16 sum
  // of 4096 exponentials keeps 11 bits of the growing total and drops the
  // small terms, shifting every output (an f16-accumulating kernel fails
  // here on thousands of elements). With f32 statistics the f16 output is
  // the f64 result of the same f16 inputs, rounded once.
  mt::manual_seed(5);
  Tensor x = mt::add(mt::mul(mt::randn({2, 4096}), 4.0), 1000.0).to(mt::kF16);
  Tensor ref = x.to(mt::kF64);
  for (bool log : {false, true}) {
    BOOST_TEST_CONTEXT((log ? "log_softmax" : "softmax")) {
      Tensor y = log ? mt::log_softmax(x, -1) : mt::softmax(x, -1);
      Tensor y_ref = log ? mt::log_softmax(ref, -1) : mt::softmax(ref, -1);
      BOOST_TEST(y.dtype() == mt::kF16);
      BOOST_TEST(mt::test::all_close(y, y_ref, mt::test::tolerance(mt::kF16), "f16 rows near +1000"));
    }
  }
  // Along dim 0 (the strided, lane-blocked path) as well.
  Tensor xt = x.t();
  BOOST_TEST(mt::test::all_close(mt::softmax(xt, 0), mt::softmax(ref.t(), 0), mt::test::tolerance(mt::kF16),
                                 "f16 columns near +1000"));
  // The same holds for the losses built on the fused kernels.
  Tensor target = mt::randint(0, 4096, {2});
  BOOST_TEST(mt::cross_entropy(x, target).dtype() == mt::kF16);
  BOOST_TEST(mt::test::all_close(mt::cross_entropy(x, target), mt::cross_entropy(ref, target),
                                 mt::test::tolerance(mt::kF16), "f16 cross_entropy near +1000"));
  Tensor ln = mt::layer_norm(x, {4096});
  BOOST_TEST(ln.dtype() == mt::kF16);
  BOOST_TEST(mt::test::all_close(ln, mt::layer_norm(ref, {4096}), mt::test::tolerance(mt::kF16),
                                 "f16 layer_norm near +1000"));
}

BOOST_AUTO_TEST_CASE(large_inputs_take_the_threaded_paths) {
  // Big enough for the OpenMP paths; compared with f64 (which takes the same paths).
  mt::manual_seed(9);
  Tensor x = mt::randn({64, 700});
  Tensor ref = x.to(mt::kF64);
  mt::test::Tolerance f32 = mt::test::tolerance(mt::kF32);
  BOOST_TEST(mt::test::all_close(mt::softmax(x, 0), mt::softmax(ref, 0), f32, "softmax dim 0"));
  BOOST_TEST(mt::test::all_close(mt::log_softmax(x, 1), mt::log_softmax(ref, 1), f32, "log_softmax dim 1"));
  Tensor w = mt::randn({700}), b = mt::randn({700});
  Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_(), bg = b.clone().requires_grad_();
  Tensor xr = ref.clone().requires_grad_(), wr = w.to(mt::kF64).requires_grad_(), br = b.to(mt::kF64).requires_grad_();
  Tensor v = mt::randn({64, 700});
  mt::sum(mt::mul(mt::layer_norm(xg, {700}, wg, bg), v)).backward();
  mt::sum(mt::mul(mt::layer_norm(xr, {700}, wr, br), v.to(mt::kF64))).backward();
  // Sums over 64 rows and 700 columns in f32: a few ulps of the largest term.
  mt::test::Tolerance sums{1e-5, 1e-4};
  BOOST_TEST(mt::test::all_close(xg.grad(), xr.grad(), sums, "layer_norm dx"));
  BOOST_TEST(mt::test::all_close(wg.grad(), wr.grad(), sums, "layer_norm dweight"));
  BOOST_TEST(mt::test::all_close(bg.grad(), br.grad(), sums, "layer_norm dbias"));
}

BOOST_AUTO_TEST_SUITE_END()
