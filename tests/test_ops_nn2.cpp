// tests/test_ops_nn2.cpp — matmul, linear, conv2d, max_pool2d, avg_pool2d,
// dropout, index_select and cat: their registry cases (gradcheck in f64, f32/
// f16/bf16 against f64, run by tests/test_op_registry.cpp) and the checks a
// gradient cannot make: conv2d against a direct convolution, max-pool
// indices, dropout's mask, error messages, dtypes under autocast.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/precision.h>
#include <mixtape/mixtape.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include "op_cases.h"

namespace mt = mixtape;
namespace utf = boost::unit_test;
using mt::Tensor;
using In = std::vector<Tensor>;

namespace {

/// Values in [-2, 2) spaced 4/n apart in a scrambled order: no two within
/// central-difference reach of each other, so max-pool windows have no ties.
Tensor distinct(const mt::Shape& shape) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = -2.0 + 4.0 * static_cast<double>((i * 7919) % n) / n;
  return mt::from_vector(v, shape);
}

Tensor index_i64(std::vector<int64_t> v) { return mt::from_vector(v); }

mt::Conv2dOptions conv_options(int64_t stride, int64_t padding, int64_t dilation) {
  mt::Conv2dOptions o;
  o.stride[0] = o.stride[1] = stride;
  o.padding[0] = o.padding[1] = padding;
  o.dilation[0] = o.dilation[1] = dilation;
  return o;
}

mt::Pool2dOptions pool_options(int64_t kernel, int64_t stride, int64_t padding) {
  mt::Pool2dOptions o;
  o.kernel_size[0] = o.kernel_size[1] = kernel;
  o.stride[0] = o.stride[1] = stride;
  o.padding[0] = o.padding[1] = padding;
  return o;
}

bool message_has(const mt::Error& e, const std::vector<std::string>& parts) {
  const std::string m = e.what();
  for (const auto& p : parts)
    if (m.find(p) == std::string::npos) {
      BOOST_TEST_MESSAGE("missing '" << p << "' in: " << m);
      return false;
    }
  return true;
}

/// Runs `f`, expecting a mixtape::Error whose message holds every part.
template <class F>
bool throws_with(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const mt::Error& e) {
    return message_has(e, parts);
  }
  BOOST_TEST_MESSAGE("no error thrown; expected one with '" << parts.front() << "'");
  return false;
}

// No case overrides the tolerance table. Every f16/bf16 output is rounded once
// from f32 (the f64 reference sees the same rounded inputs), so it differs by
// at most half an ulp (2^-11 = 4.9e-4 relative in f16, half the table's rtol;
// 2^-8 in bf16) plus the f32 accumulation error of K-term sums, bounded by
// K · 2^-24 · Σ|a·b| — about 3e-5 at worst for the 27-term conv sums of N(0, 1)
// data, in practice (errors of random sign) ~100x less. Measured on these
// cases: every one also passes with half the table's rtol and atol.

// ---- matmul ----------------------------------------------------------------------------

MT_OP_CASE({.op = "matmul", .label = "2-D",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({4, 5})}; }});

MT_OP_CASE({.op = "matmul", .label = "batched, batch dims broadcast",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 1, 3, 4}), mt::randn({3, 4, 2})}; }});

MT_OP_CASE({.op = "matmul", .label = "batch @ matrix (folded into one GEMM)",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 3, 4}), mt::randn({4, 5})}; }});

MT_OP_CASE({.op = "matmul", .label = "matrix @ batch (dA summed over the batch)",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({2, 4, 5})}; }});

MT_OP_CASE({.op = "matmul", .label = "1-D @ 2-D",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({4}), mt::randn({4, 3})}; }});

MT_OP_CASE({.op = "matmul", .label = "2-D @ 1-D",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({4})}; }});

MT_OP_CASE({.op = "matmul", .label = "1-D @ 1-D (dot)",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({5}), mt::randn({5})}; }});

MT_OP_CASE({.op = "matmul", .label = "1-D @ batch",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({4}), mt::randn({2, 4, 3})}; }});

MT_OP_CASE({.op = "matmul", .label = "non-contiguous (transposed) inputs",
            .f = [](const In& in) { return mt::matmul(in[0], in[1]); },
            .inputs = [] {
              return In{mt::test::non_contiguous(mt::randn({3, 4}), "transposed"),
                        mt::test::non_contiguous(mt::randn({4, 5}), "transposed")};
            }});

MT_OP_CASE({.op = "matmul", .label = "x @ w.t() (a transposed view on the tape)",
            .f = [](const In& in) { return mt::matmul(in[0], in[1].t()); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({5, 4})}; }});

// ---- linear ----------------------------------------------------------------------------

MT_OP_CASE({.op = "linear", .label = "with bias",
            .f = [](const In& in) { return mt::linear(in[0], in[1], in[2]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({5, 4}), mt::randn({5})}; }});

MT_OP_CASE({.op = "linear", .label = "without bias",
            .f = [](const In& in) { return mt::linear(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 4}), mt::randn({5, 4})}; }});

MT_OP_CASE({.op = "linear", .label = "3-D x (leading dims flattened)",
            .f = [](const In& in) { return mt::linear(in[0], in[1], in[2]); },
            .inputs = [] { return In{mt::randn({2, 3, 4}), mt::randn({5, 4}), mt::randn({5})}; }});

MT_OP_CASE({.op = "linear", .label = "1-D x",
            .f = [](const In& in) { return mt::linear(in[0], in[1], in[2]); },
            .inputs = [] { return In{mt::randn({4}), mt::randn({3, 4}), mt::randn({3})}; }});

// ---- conv2d ----------------------------------------------------------------------------

MT_OP_CASE({.op = "conv2d", .label = "stride 2, padding 1, bias, C_in 3",
            .f = [](const In& in) { return mt::conv2d(in[0], in[1], in[2], conv_options(2, 1, 1)); },
            .inputs = [] { return In{mt::randn({2, 3, 5, 5}), mt::randn({4, 3, 3, 3}), mt::randn({4})}; }});

MT_OP_CASE({.op = "conv2d", .label = "dilation 2, no bias",
            .f = [](const In& in) { return mt::conv2d(in[0], in[1], {}, conv_options(1, 0, 2)); },
            .inputs = [] { return In{mt::randn({1, 3, 6, 6}), mt::randn({2, 3, 3, 3})}; }});

MT_OP_CASE({.op = "conv2d", .label = "unbatched (C, H, W), 2x1 kernel, stride (1, 2), padding (0, 1)",
            .f = [](const In& in) {
              mt::Conv2dOptions o;
              o.stride[1] = 2;
              o.padding[1] = 1;
              return mt::conv2d(in[0], in[1], in[2], o);
            },
            .inputs = [] { return In{mt::randn({2, 4, 5}), mt::randn({3, 2, 2, 1}), mt::randn({3})}; }});

// ---- pooling ---------------------------------------------------------------------------

MT_OP_CASE({.op = "max_pool2d", .label = "kernel 2, stride 2",
            .f = [](const In& in) { return mt::max_pool2d(in[0], pool_options(2, 2, 0)); },
            .inputs = [] { return In{distinct({2, 2, 4, 4})}; }});

MT_OP_CASE({.op = "max_pool2d", .label = "kernel 3, stride 1, padding 1 (overlapping windows)",
            .f = [](const In& in) { return mt::max_pool2d(in[0], pool_options(3, 1, 1)); },
            .inputs = [] { return In{distinct({1, 2, 5, 5})}; }});

MT_OP_CASE({.op = "max_pool2d", .label = "unbatched (C, H, W), default stride",
            .f = [](const In& in) { return mt::max_pool2d(in[0], pool_options(2, 0, 0)); },
            .inputs = [] { return In{distinct({2, 4, 6})}; }});

MT_OP_CASE({.op = "avg_pool2d", .label = "kernel 2, stride 2",
            .f = [](const In& in) { return mt::avg_pool2d(in[0], pool_options(2, 2, 0)); },
            .inputs = [] { return In{mt::randn({2, 2, 4, 4})}; }});

MT_OP_CASE({.op = "avg_pool2d", .label = "kernel 3, stride 1, padding 1 (padding counted)",
            .f = [](const In& in) { return mt::avg_pool2d(in[0], pool_options(3, 1, 1)); },
            .inputs = [] { return In{mt::randn({1, 2, 5, 5})}; }});

// ---- dropout ---------------------------------------------------------------------------

MT_OP_CASE({.op = "dropout", .label = "p 0.3, a fixed generator (the same mask every evaluation)",
            .f = [](const In& in) {
              mt::Generator g(42);
              return mt::dropout(in[0], 0.3, true, &g);
            },
            .inputs = [] { return In{mt::randn({4, 5})}; }});

// ---- indexing --------------------------------------------------------------------------

MT_OP_CASE({.op = "index_select", .label = "dim 0, repeated indices",
            .f = [](const In& in) { return mt::index_select(in[0], 0, in[1]); },
            .inputs = [] { return In{mt::randn({4, 3}), index_i64({2, 0, 2, 3, 2})}; }});

MT_OP_CASE({.op = "index_select", .label = "dim -1 of a 3-D tensor, i32 index",
            .f = [](const In& in) { return mt::index_select(in[0], -1, in[1]); },
            .inputs = [] {
              return In{mt::randn({2, 3, 5}), mt::from_vector(std::vector<int32_t>{4, 1, 1})};
            }});

MT_OP_CASE({.op = "cat", .label = "3 tensors along dim 1, the middle one f64 (promoted)",
            // The f64 cast makes the inputs' dtypes differ in the low-precision runs (f16, f64, f16 -> f64).
            .f = [](const In& in) { return mt::cat({in[0], in[1].to(mt::kF64), in[2]}, 1); },
            .inputs = [] { return In{mt::randn({2, 3}), mt::randn({2, 1}), mt::randn({2, 4})}; }});

MT_OP_CASE({.op = "cat", .label = "dim 0 of 3-D tensors",
            .f = [](const In& in) { return mt::cat({in[0], in[1]}, 0); },
            .inputs = [] { return In{mt::randn({1, 2, 3}), mt::randn({2, 2, 3})}; }});

/// The textbook convolution: seven nested loops in f64.
std::vector<double> direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const mt::Conv2dOptions& o) {
  const int64_t n = x.size(0), c_in = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t c_out = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t ho = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const int64_t wo = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(c_out, 0.0);
  std::vector<double> y(static_cast<size_t>(n * c_out * ho * wo));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t co = 0; co < c_out; ++co)
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow) {
          double acc = bv[static_cast<size_t>(co)];
          for (int64_t ci = 0; ci < c_in; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * o.stride[0] - o.padding[0] + i * o.dilation[0];
                const int64_t iw = ow * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                acc += xv[static_cast<size_t>(((in * c_in + ci) * h + ih) * wd + iw)] *
                       wv[static_cast<size_t>(((co * c_in + ci) * kh + i) * kw + j)];
              }
          y[static_cast<size_t>(((in * c_out + co) * ho + oh) * wo + ow)] = acc;
        }
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_nn2, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(conv2d_matches_a_direct_convolution) {
  struct Config {
    mt::Shape x, w;
    int64_t stride, padding, dilation;
    bool bias;
  };
  const std::vector<Config> configs = {
      {{2, 3, 9, 8}, {5, 3, 3, 3}, 1, 0, 1, true},  {{2, 3, 9, 8}, {5, 3, 3, 3}, 2, 1, 1, true},
      {{1, 4, 10, 7}, {2, 4, 3, 2}, 1, 2, 2, false}, {{3, 1, 6, 6}, {4, 1, 1, 1}, 3, 0, 1, true},
      {{1, 2, 5, 5}, {3, 2, 5, 5}, 1, 0, 1, true},  // the kernel covers the whole input: one output pixel
  };
  mt::Generator gen(2024);
  for (const Config& c : configs) {
    BOOST_TEST_CONTEXT("x " << c.x << ", w " << c.w << ", stride " << c.stride << ", padding " << c.padding
                            << ", dilation " << c.dilation << ", bias " << c.bias) {
      const Tensor x = mt::randn(c.x, mt::kF64, &gen), w = mt::randn(c.w, mt::kF64, &gen);
      const Tensor b = c.bias ? mt::randn({c.w[0]}, mt::kF64, &gen) : Tensor();
      const mt::Conv2dOptions o = conv_options(c.stride, c.padding, c.dilation);
      const std::vector<double> expected = direct_conv2d(x, w, b, o);
      const Tensor y = mt::conv2d(x, w, b, o);
      BOOST_TEST(y.numel() == static_cast<int64_t>(expected.size()));
      BOOST_TEST(mt::test::all_close(y.flatten(), mt::from_vector(expected), {1e-12, 1e-12}, "conv2d f64"));
      // f32: the same data rounded, sums of up to 27 terms in f32.
      const Tensor y32 = mt::conv2d(x.to(mt::kF32), w.to(mt::kF32), b.defined() ? b.to(mt::kF32) : Tensor(), o);
      BOOST_TEST(y32.dtype() == mt::kF32);
      BOOST_TEST(mt::test::all_close(y32.flatten(), mt::from_vector(expected), {1e-5, 1e-5}, "conv2d f32"));
    }
  }
}

BOOST_AUTO_TEST_CASE(col2im_is_the_adjoint_of_im2col) {
  // <im2col(x), c> = <x, col2im(c)> for every window shape: the identity conv2d's dX relies on.
  const std::vector<mt::kernels::Window2d> windows = {
      {{3, 3}, {1, 1}, {1, 1}, {1, 1}}, {{2, 4}, {3, 2}, {2, 1}, {2, 1}},
      {{1, 5}, {2, 3}, {0, 2}, {1, 2}}, {{4, 2}, {1, 4}, {3, 0}, {1, 3}}};
  mt::Generator gen(5);
  for (const auto& w : windows) {
    const Tensor x = mt::randn({2, 3, 7, 9}, mt::kF64, &gen);
    const Tensor cols = mt::kernels::im2col(x, w);
    const Tensor c = mt::randn(cols.shape(), mt::kF64, &gen);
    const double lhs = mt::sum(cols * c).item<double>();
    const double rhs = mt::sum(x * mt::kernels::col2im(c, x.shape(), w)).item<double>();
    BOOST_TEST(std::abs(lhs - rhs) <= 1e-10 * (1 + std::abs(lhs)), "window kernel " << w.kernel[0] << "x" << w.kernel[1]
                                                                     << ", stride " << w.stride[0] << "x"
                                                                     << w.stride[1] << ": " << lhs << " vs " << rhs);
  }
}

BOOST_AUTO_TEST_CASE(conv2d_unbatched_equals_a_batch_of_one) {
  const Tensor x = mt::randn({3, 6, 5}), w = mt::randn({2, 3, 3, 3}), b = mt::randn({2});
  const Tensor y = mt::conv2d(x, w, b, conv_options(1, 1, 1));
  BOOST_TEST(y.shape() == (mt::Shape{2, 6, 5}));
  const Tensor y4 = mt::conv2d(x.unsqueeze(0), w, b, conv_options(1, 1, 1));
  BOOST_TEST(mt::test::all_close(y, y4.squeeze(0), {0, 0}, "unbatched conv2d"));
}

BOOST_AUTO_TEST_CASE(max_pool_indices_and_padding) {
  // -1, -2, ..., -16: padding read as 0 would win every border window.
  std::vector<float> negatives(16);
  for (int i = 0; i < 16; ++i) negatives[static_cast<size_t>(i)] = -1.0f - static_cast<float>(i);
  const Tensor x = mt::from_vector(negatives, {1, 1, 4, 4});
  mt::kernels::Window2d w{{3, 3}, {1, 1}, {1, 1}, {1, 1}};
  const mt::kernels::MaxPoolResult r = mt::kernels::max_pool2d(x, w);
  BOOST_TEST(r.indices.dtype() == mt::kI64);
  // The max of each 3x3 window is its top-left element inside the plane.
  const std::vector<int64_t> expected_idx = {0, 0, 1, 2, 0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10};
  BOOST_TEST(r.indices.to_vector<int64_t>() == expected_idx, boost::test_tools::per_element());
  for (int64_t i = 0; i < 16; ++i) BOOST_TEST(r.y.to_vector<double>()[i] == -1.0 - expected_idx[i]);

  // Kernel 2, stride 2 on distinct values: the index of each window's largest element.
  const Tensor d =
      mt::from_vector(std::vector<float>{1, 5, 2, 0, 3, 4, 8, 9, 7, 6, -1, -2, 10, 11, -3, 12}, {1, 1, 4, 4});
  const mt::kernels::MaxPoolResult q = mt::kernels::max_pool2d(d, {{2, 2}, {2, 2}, {0, 0}, {1, 1}});
  BOOST_TEST(q.indices.to_vector<int64_t>() == (std::vector<int64_t>{1, 7, 13, 15}), boost::test_tools::per_element());
  BOOST_TEST(q.y.to_vector<double>() == (std::vector<double>{5, 9, 11, 12}), boost::test_tools::per_element());

  // NaN propagates, like PyTorch.
  Tensor n = d.clone();
  n.set({0, 0, 0, 0}, std::nan(""));
  BOOST_TEST(std::isnan(mt::max_pool2d(n).to_vector<double>()[0]));
}

BOOST_AUTO_TEST_CASE(max_pool_gradient_goes_to_the_argmax_of_every_window) {
  // Every 3x3 window (padding 1) of a 3x3 plane holds the centre, the largest value: it gets all 9 gradients.
  Tensor x = mt::from_vector(std::vector<float>{1, 2, 3, 4, 10, 5, 6, 7, 8}, {1, 1, 3, 3}).requires_grad_();
  Tensor y = mt::max_pool2d(x, pool_options(3, 1, 1));
  mt::sum(y).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 0, 0, 0, 9, 0, 0, 0, 0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(avg_pool_counts_padding) {
  const Tensor x = mt::ones({1, 1, 3, 3});
  const Tensor y = mt::avg_pool2d(x, pool_options(3, 1, 1));
  // Corner windows hold 4 ones of 9 taps, edges 6, the centre 9.
  const std::vector<double> expected = {4 / 9., 6 / 9., 4 / 9., 6 / 9., 1, 6 / 9., 4 / 9., 6 / 9., 4 / 9.};
  BOOST_TEST(mt::test::all_close(y.flatten(), mt::from_vector(expected), {1e-6, 1e-7}, "avg_pool2d"));
}

BOOST_AUTO_TEST_CASE(dropout_masks) {
  const double p = 0.4;
  const Tensor x = mt::ones({100000});
  mt::Generator g1(7), g2(7);
  const Tensor a = mt::dropout(x, p, true, &g1), b = mt::dropout(x, p, true, &g2);
  BOOST_TEST(g1.offset() == 100000u);  // one Philox counter per element reserved
  BOOST_TEST(mt::test::all_close(a, b, {0, 0}, "the same seed gives the same mask"));
  const Tensor c = mt::dropout(x, p, true, &g1);  // the generator moved on: a fresh mask
  const std::vector<double> av = a.to_vector<double>(), cv = c.to_vector<double>();
  int64_t kept = 0, same = 0;
  const double scale = static_cast<float>(1.0 / (1.0 - p));
  bool scaled = true;
  for (size_t i = 0; i < av.size(); ++i) {
    kept += av[i] != 0;
    same += (av[i] != 0) == (cv[i] != 0);
    scaled = scaled && (av[i] == 0 || av[i] == scale);
  }
  // Binomial(1e5, 0.6): standard deviation 0.0015 in the kept fraction; allow 5 of them.
  BOOST_TEST(std::abs(static_cast<double>(kept) / 1e5 - (1 - p)) < 0.0078);
  BOOST_TEST(scaled, "kept elements are scaled by 1/(1-p)");
  BOOST_TEST(same < 60000, "a second draw gives another mask (" << same << " of 100000 agree)");

  // Element i depends on counter offset + i only: a mask drawn from offset 3 is the tail of one drawn from 0.
  const Tensor m0 = mt::kernels::dropout_mask({10}, 0.5, 99, 0, mt::Device::cpu());
  const Tensor m3 = mt::kernels::dropout_mask({7}, 0.5, 99, 3, mt::Device::cpu());
  BOOST_TEST(m0.dtype() == mt::kBool);
  BOOST_TEST(mt::test::all_close(m0.slice(0, 3, 10), m3, {0, 0}, "counter offsets"));

  // The default generator when none is given: seeding it reproduces the mask.
  mt::manual_seed(5);
  const Tensor d1 = mt::dropout(x, p);
  mt::manual_seed(5);
  const Tensor d2 = mt::dropout(x, p);
  BOOST_TEST(mt::test::all_close(d1, d2, {0, 0}, "manual_seed"));
}

BOOST_AUTO_TEST_CASE(dropout_identity_extremes_and_gradient) {
  Tensor x = mt::randn({6, 7}, mt::kF16).requires_grad_();
  BOOST_TEST(mt::dropout(x, 0.5, /*training=*/false).is_same(x));
  BOOST_TEST(mt::dropout(x, 0.0).is_same(x));

  const Tensor zero = mt::dropout(x, 1.0);  // everything dropped: zeros, not NaN
  BOOST_TEST(zero.dtype() == mt::kF16);
  for (double v : zero.to_vector<double>()) BOOST_TEST(v == 0.0);

  mt::Generator g(3);
  Tensor y = mt::dropout(x, 0.25, true, &g);
  BOOST_TEST(y.dtype() == mt::kF16);
  BOOST_TEST(std::string(y.grad_fn_name()) == "dropout");
  y.backward(mt::ones_like(y));
  // d y / d x = mask / (1 - p): where y kept x, the gradient is 4/3 (in f16), else 0.
  const std::vector<double> yv = y.to_vector<double>(), gv = x.grad().to_vector<double>();
  const double kept_grad = static_cast<double>(mt::Half(4.0 / 3.0));
  for (size_t i = 0; i < yv.size(); ++i) BOOST_TEST(gv[i] == (yv[i] != 0 ? kept_grad : 0.0));

  BOOST_TEST(throws_with([&] { mt::dropout(x, 1.5); },
                         {"dropout: probability has to be between 0 and 1, but got 1.5"}));
  BOOST_TEST(throws_with([&] { mt::dropout(x, -0.1, false); }, {"dropout: probability"}));
}

BOOST_AUTO_TEST_CASE(index_select_gradient_sums_repeated_indices) {
  Tensor x = mt::randn({3, 2}).requires_grad_();
  const Tensor y = mt::index_select(x, 0, index_i64({0, 0, 2}));
  BOOST_TEST(y.shape() == (mt::Shape{3, 2}));
  BOOST_TEST(y.at<double>({1, 1}) == x.at<double>({0, 1}));
  mt::sum(y).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{2, 2, 0, 0, 1, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(cat_promotes_and_returns_each_gradient_in_its_dtype) {
  Tensor a = mt::randn({2, 2}, mt::kF16).requires_grad_();
  Tensor b = mt::randn({2, 3}, mt::kF32).requires_grad_();
  Tensor c = mt::randn({2, 1}, mt::kBF16).requires_grad_();
  Tensor y = mt::cat({a, b, c}, -1);
  BOOST_TEST(y.dtype() == mt::kF32);
  BOOST_TEST(y.shape() == (mt::Shape{2, 6}));
  BOOST_TEST(y.at<double>({1, 5}) == c.at<double>({1, 0}));
  mt::sum(y).backward();
  BOOST_TEST(a.grad().dtype() == mt::kF16);
  BOOST_TEST(b.grad().dtype() == mt::kF32);
  BOOST_TEST(c.grad().dtype() == mt::kBF16);
  BOOST_TEST(c.grad().shape() == (mt::Shape{2, 1}));
}

BOOST_AUTO_TEST_CASE(linear_under_autocast_runs_in_f16_with_f32_master_gradients) {
  mt::Generator gen(11);
  const Tensor x = mt::randn({4, 8}, mt::kF32, &gen);
  Tensor w = mt::randn({3, 8}, mt::kF32, &gen).requires_grad_();
  Tensor b = mt::randn({3}, mt::kF32, &gen).requires_grad_();
  Tensor y;
  {
    mt::amp::Autocast ac(mt::kF16);
    y = mt::linear(x, w, b);
  }
  BOOST_TEST(y.dtype() == mt::kF16);
  BOOST_TEST(std::string(y.grad_fn_name()) == "linear");
  y.backward(mt::ones_like(y));
  BOOST_TEST(w.grad().dtype() == mt::kF32);
  BOOST_TEST(b.grad().dtype() == mt::kF32);

  // Against f64 of the same f16-rounded operands: dW = Σ_rows x (dy = 1), db = rows.
  const Tensor x16 = x.to(mt::kF16).to(mt::kF64), w16 = w.detach().to(mt::kF16).to(mt::kF64);
  const Tensor b16 = b.detach().to(mt::kF16).to(mt::kF64);
  const Tensor ref = mt::linear(x16, w16, b16);
  BOOST_TEST(mt::test::all_close(y, ref, mt::test::tolerance(mt::kF16), "linear under autocast, forward"));
  const Tensor dw_ref = mt::sum(x16, {0}, true).expand({3, 8});
  BOOST_TEST(mt::test::all_close(w.grad(), dw_ref, mt::test::tolerance(mt::kF16), "linear under autocast, dW"));
  BOOST_TEST(mt::test::all_close(b.grad(), mt::full({3}, 4.0), {0, 0}, "linear under autocast, db"));

  // The other lower-precision ops follow the same rule; max_pool2d passes its dtype through.
  mt::amp::Autocast ac(mt::kBF16);
  BOOST_TEST(mt::matmul(x, w.t()).dtype() == mt::kBF16);
  const Tensor img = mt::randn({1, 2, 4, 4});
  BOOST_TEST(mt::conv2d(img, mt::randn({3, 2, 3, 3})).dtype() == mt::kBF16);
  BOOST_TEST(mt::max_pool2d(img).dtype() == mt::kF32);
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes) {
  const Tensor img = mt::randn({3, 28, 28});
  BOOST_TEST(throws_with([&] { mt::conv2d(mt::randn({28, 28}), mt::randn({8, 1, 3, 3})); },
                         {"conv2d: expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got [28, 28]"}));
  BOOST_TEST(throws_with([&] { mt::conv2d(mt::randn({2, 1, 5, 5}), mt::randn({8, 3, 3, 3})); },
                         {"conv2d: input [2, 1, 5, 5] has 1 channels but weight [8, 3, 3, 3] expects C_in = 3"}));
  BOOST_TEST(throws_with([&] {
                           mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({1, 1, 3, 3}), {}, conv_options(1, 0, 2));
                         },
                         {"conv2d: the kernel height (5 with dilation) is larger than the padded input's (4)"}));
  BOOST_TEST(throws_with([&] { mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({2, 1, 3, 3}), mt::randn({3})); },
                         {"conv2d: expected bias of shape [2]", "got [3]"}));
  BOOST_TEST(throws_with([&] { mt::conv2d(img, mt::randn({8, 3, 3, 3}, mt::kF64)); },
                         {"conv2d: input, weight and bias must share a dtype, got f32, f64"}));
  BOOST_TEST(throws_with([&] { mt::matmul(mt::randn({2, 3}), mt::randn({4, 5})); },
                         {"matmul: shapes cannot be multiplied ([2, 3] and [4, 5])"}));
  BOOST_TEST(throws_with([&] { mt::linear(mt::randn({2, 3}), mt::randn({4, 5})); },
                         {"linear: x and weight shapes cannot be multiplied ([2, 3] and [4, 5]"}));
  BOOST_TEST(throws_with([&] { mt::max_pool2d(mt::randn({4, 4})); },
                         {"max_pool2d: expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got [4, 4]"}));
  BOOST_TEST(throws_with([&] { mt::avg_pool2d(img, pool_options(2, 2, 2)); },
                         {"avg_pool2d: padding should be at most half of the kernel size"}));
  BOOST_TEST(throws_with([&] { mt::max_pool2d(mt::randn({1, 2, 2}), pool_options(3, 1, 0)); },
                         {"max_pool2d: the height of the (dilated) kernel, 3, exceeds the padded input's, 2"}));
  BOOST_TEST(throws_with([&] { mt::index_select(mt::randn({4, 3}), 0, index_i64({1, 7})); },
                         {"index_select: index 7 is out of range for dim 0 of size 4 (shape [4, 3])"}));
  BOOST_TEST(throws_with([&] { mt::index_select(mt::randn({4, 3}), 1, index_i64({-1})); },
                         {"index_select: index -1 is out of range for dim 1 of size 3"}));
  BOOST_TEST(throws_with([&] { mt::index_select(mt::randn({4, 3}), 0, mt::randn({2})); },
                         {"index_select: expected an index of dtype i64 or i32, got f32"}));
  BOOST_TEST(throws_with([&] { mt::cat({}, 0); }, {"cat: expected a non-empty list of tensors"}));
  BOOST_TEST(throws_with([&] { mt::cat({mt::randn({2, 3}), mt::randn({3, 3})}, 1); },
                         {"cat: sizes must match except in dim 1, got [2, 3] (tensor 0) and [3, 3] (tensor 1)"}));
  BOOST_TEST(throws_with([&] { mt::cat({mt::randn({2, 3}), mt::randn({2, 3, 1})}, 0); },
                         {"cat: tensors must have the same number of dims"}));
}

BOOST_AUTO_TEST_SUITE_END()
