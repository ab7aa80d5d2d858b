// tests/test_conv.cpp — the convolution family (ops/conv.cpp, ops/cpu/conv.cpp, ops/cpu/conv_winograd.cpp,
// ops/backend/conv_gemm.cpp, cuda/conv.cu): conv2d, its two CPU paths, and its columns, im2col/col2im.
//
// The op's registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), conv2d against a direct convolution, col2im as im2col's adjoint, the CPU's Winograd path
// against float64 and against im2col + GEMM, the errors of misuse,
// and on CUDA: the column kernels against the CPU's (windows with stride 2, padding 1, dilation 2 and non-square
// kernels, the MNIST shapes, non-contiguous inputs; col2im, whose sums a scatter would race on, giving the same
// bits run after run), conv2d forward and backward on both devices, and conv2d's columns reaching the Tensor Core
// GEMM.
#include "family_test.h"

#include <algorithm>

#include <mixtape/autograd/autograd.h>
#include <mixtape/ops/cpu/conv_winograd.h>

namespace {

mt::Conv2dOptions conv_options(int64_t stride, int64_t padding, int64_t dilation) {
  mt::Conv2dOptions o;
  o.stride[0] = o.stride[1] = stride;
  o.padding[0] = o.padding[1] = padding;
  o.dilation[0] = o.dilation[1] = dilation;
  return o;
}

// No case overrides the tolerance table. Every f16/bf16 output is rounded once
// from f32 (the f64 reference sees the same rounded inputs), so it differs by
// at most half an ulp (2^-11 = 4.9e-4 relative in f16, half the table's rtol;
// 2^-8 in bf16) plus the f32 accumulation error of K-term sums, bounded by
// K · 2^-24 · Σ|a·b| — about 3e-5 at worst for the 27-term conv sums of N(0, 1)
// data, in practice (errors of random sign) ~100x less. Measured on these
// cases: every one also passes with half the table's rtol and atol.

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

/// Windows any of the column transforms accepts.
std::vector<WindowCase> conv_cases() {
  return {
      {"k3 s1 p0 d1", {2, 3, 7, 9}, window(3, 1, 0, 1)},
      {"k3 s2 p1 d1", {2, 3, 8, 7}, window(3, 2, 1, 1)},
      {"k3 s1 p1 d2", {2, 3, 9, 8}, window(3, 1, 1, 2)},
      {"k3 s2 p1 d2", {1, 2, 10, 11}, window(3, 2, 1, 2)},
      {"k3 s1 p3 d1 (more padding than a pool allows)", {1, 2, 5, 6}, window(3, 1, 3, 1)},
      {"k2x3 s2x1 p1x0 d1x2", {2, 2, 7, 9}, window(2, 3, 2, 1, 1, 0, 1, 2)},
      {"k1 s1 p0 d1", {3, 4, 5, 5}, window(1, 1, 0, 1)},
  };
}

// The relative Frobenius error of an f16 GEMM output against float64 of the same rounded inputs: its one rounding
// (2^-11 relative, about a third of that in the Frobenius mean) plus f32 accumulation (tests/test_matmul.cpp's
// bound(f16)).
constexpr double kF16GemmBound = 1e-3;

}  // namespace

BOOST_AUTO_TEST_SUITE(conv)

BOOST_AUTO_TEST_CASE(conv2d_matches_a_direct_convolution, MT_CPU_TEST) {
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
      mt::test::expect_close(y.flatten(), mt::from_vector(expected), {1e-12, 1e-12}, "conv2d f64");
      // f32: the same data rounded, sums of up to 27 terms in f32.
      const Tensor y32 = mt::conv2d(x.to(mt::kF32), w.to(mt::kF32), b.defined() ? b.to(mt::kF32) : Tensor(), o);
      BOOST_TEST(y32.dtype() == mt::kF32);
      mt::test::expect_close(y32.flatten(), mt::from_vector(expected), {1e-5, 1e-5}, "conv2d f32");
    }
  }
}

BOOST_AUTO_TEST_CASE(col2im_is_the_adjoint_of_im2col, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(conv2d_unbatched_equals_a_batch_of_one, MT_CPU_TEST) {
  const Tensor x = mt::randn({3, 6, 5}), w = mt::randn({2, 3, 3, 3}), b = mt::randn({2});
  const Tensor y = mt::conv2d(x, w, b, conv_options(1, 1, 1));
  BOOST_TEST(y.shape() == (mt::Shape{2, 6, 5}));
  const Tensor y4 = mt::conv2d(x.unsqueeze(0), w, b, conv_options(1, 1, 1));
  mt::test::expect_close(y, y4.squeeze(0), {0, 0}, "unbatched conv2d");
}

BOOST_AUTO_TEST_CASE(conv2d_in_chunks_equals_one_sample_at_a_time, MT_CPU_TEST) {
  // One sample's columns here are 16·3·3 rows x 51·51 positions: 1.5 MB in f32 (the accumulation dtype of bf16
  // too), 3 MB in f64. Against ops/cpu/conv.cpp's 4 MiB budget a batch of 5 runs as chunks of 2, 2 and 1 samples
  // (f32, bf16) or 5 chunks of 1 (f64); a batch of 1 is always one chunk, so sample by sample is the reference. y and
  // dX come from the same per-sample GEMMs and must match exactly. (f32 3x3 windows of stride 1 take the Winograd
  // path on an AVX2 or AVX-512 CPU: forced off here, tested below.)
  const mt::kernels::cpu::ForceConvPath gemm(mt::kernels::cpu::ConvPath::kGemm);
  for (DType dt : {mt::kF32, mt::kF64, mt::kBF16}) {
    BOOST_TEST_CONTEXT("dtype " << dt) {
      const Tensor x0 = randn_seeded({5, 16, 53, 53}, dt, 41), w0 = randn_seeded({4, 16, 3, 3}, dt, 42);
      const Tensor b0 = randn_seeded({4}, dt, 43), dy = randn_seeded({5, 4, 51, 51}, dt, 44);
      const Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      const Tensor y = mt::conv2d(x, w, b);
      y.backward(dy);
      BOOST_TEST(w.grad().dtype() == dt);
      // dW and db against the same values in f64, sample by sample, summed in f64: f32 reassociates 5·51·51 = 13 005
      // products per element (|Σ| ~ 100, error ~1e-5 relative); bf16 adds the one rounding of its f32 sum.
      const Tensor wr = w0.to(mt::kF64).detach().requires_grad_(), br = b0.to(mt::kF64).detach().requires_grad_();
      for (int64_t i = 0; i < 5; ++i) {
        const Tensor xi = x0.slice(0, i, i + 1).detach().requires_grad_();
        const Tensor yi = mt::conv2d(xi, w0, b0);
        yi.backward(dy.slice(0, i, i + 1));
        const std::string at = "sample " + std::to_string(i);
        expect_close(y.slice(0, i, i + 1), yi, mt::test::kExact, "conv2d y, " + at);
        expect_close(x.grad().slice(0, i, i + 1), xi.grad(), mt::test::kExact, "conv2d dx, " + at);
        mt::conv2d(x0.slice(0, i, i + 1).to(mt::kF64), wr, br).backward(dy.slice(0, i, i + 1).to(mt::kF64));
      }
      const mt::test::Tolerance tol = dt == mt::kBF16 ? mt::test::Tolerance{1.6e-2, 1e-2}
                                      : dt == mt::kF32 ? mt::test::Tolerance{1e-5, 1e-4}
                                                       : mt::test::Tolerance{1e-12, 1e-10};
      expect_close(w.grad(), wr.grad(), tol, "conv2d dweight");
      expect_close(b.grad(), br.grad(), tol, "conv2d dbias");
    }
  }
}

// ---- the CPU's Winograd path ---------------------------------------------------------------------------

namespace {

using mt::kernels::cpu::ConvPath;
using mt::kernels::cpu::ForceConvPath;

/// max |got − want| over max |want|: the error measure of a transform-based algorithm, whose rounding errors scale
/// with the magnitudes inside the transform, not with each output's own.
double max_error_over_max(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return scale > 0.0 ? err / scale : err;
}

struct ConvResult {
  Tensor y, dx, dweight, dbias;
};

/// y and the three gradients of conv2d for dy, in the dtype of the arguments.
ConvResult conv_and_grads(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& dy,
                          const mt::Conv2dOptions& o) {
  const Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  const Tensor b = b0.defined() ? b0.detach().requires_grad_() : Tensor();
  const Tensor y = mt::conv2d(x, w, b, o);
  y.backward(dy);
  return {y, x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(winograd_matches_float64_and_im2col, MT_CPU_TEST) {
  if (!mt::kernels::cpu::winograd_supported()) {
    BOOST_TEST_MESSAGE("winograd_matches_float64_and_im2col: skipped, no AVX2 with FMA or AVX-512F "
                       "(this CPU, or MIXTAPE_CPU_CAPABILITY)");
    return;
  }
  struct Config {
    Shape x;
    int64_t c_out, padding;
    bool bias;
    int64_t padding_w = -1;  // the horizontal padding where it differs from the vertical one
  };
  const Config configs[] = {
      {{4, 32, 26, 26}, 64, 0, true},  // the MNIST net's second convolution
      {{3, 5, 9, 11}, 7, 1, true},     // channels below a vector, outputs not a multiple of the 4x4 tile
      {{2, 17, 8, 7}, 33, 2, false},   // padding 2; 17 and 33 channels: full vectors and a partial one
      {{2, 64, 6, 6}, 16, 1, true},    // the input gradient's convolution has 16 outputs, the forward 64 inputs
      {{3, 3, 3, 3}, 2, 0, true},      // one output pixel
      {{2, 1, 12, 12}, 32, 1, true},   // a single input channel
      {{2, 6, 9, 10}, 5, 0, true, 2},  // paddings (0, 2) and (2, 1): the input gradient pads each axis by 2 − its own
      {{2, 6, 10, 9}, 5, 2, false, 1},
      {{1, 3, 50, 50}, 5, 1, true},    // 169 tiles: the weight gradient in groups of 60, 60 and 49 tiles
  };
  // The bounds, as max error over max |value|. f32: the transforms scale by up to 8 (output), 5 (input) and 1/24
  // (filter), so an f32 rounding inside them weighs more than in a direct sum. Measured on these cases: y up to
  // 5.0e-6 of the largest |y|, dx 5.6e-6, dweight 4.6e-6 (im2col + sgemm: 0.4e-7 to 7.8e-7); with one output pixel,
  // ~2e-7. f16 and bf16 are computed in f32 from the same rounded inputs and rounded once:
  // half an ulp of the largest value (2^-11, 2^-8 relative) on top of f32's bound.
  struct Precision {
    DType dtype;
    double bound;
  };
  const Precision precisions[] = {{mt::kF32, 1e-5}, {mt::kF16, 4.9e-4 + 1e-5}, {mt::kBF16, 3.9e-3 + 1e-5}};
  for (const Config& c : configs)
    for (const Precision& prec : precisions) {
      const int64_t pad_w = c.padding_w < 0 ? c.padding : c.padding_w;
      BOOST_TEST_CONTEXT("x " << c.x << ", C_out " << c.c_out << ", padding (" << c.padding << ", " << pad_w
                              << "), bias " << c.bias << ", " << prec.dtype) {
        const DType dt = prec.dtype;
        // The inputs rounded to dt first: the f64 reference sees exactly what the kernel sees.
        auto rounded = [&](const Shape& shape, uint64_t seed) { return randn_seeded(shape, dt, seed).to(mt::kF64); };
        const Tensor x = rounded(c.x, 61), w = rounded({c.c_out, c.x[1], 3, 3}, 62);
        const Tensor b = c.bias ? rounded({c.c_out}, 63) : Tensor();
        mt::Conv2dOptions o = conv_options(1, c.padding, 1);
        o.padding[1] = pad_w;
        const mt::kernels::Window2d window{{3, 3}, {1, 1}, {c.padding, pad_w}, {1, 1}};
        BOOST_TEST(mt::kernels::cpu::use_winograd(dt, c.x, c.c_out, window).has_value());
        const Shape y_shape{c.x[0], c.c_out, c.x[2] + 2 * c.padding - 2, c.x[3] + 2 * pad_w - 2};
        const Tensor dy = rounded(y_shape, 64);
        const ConvResult want = conv_and_grads(x, w, b, dy, o);  // f64: im2col + GEMM
        const Tensor b_dt = b.defined() ? b.to(dt) : Tensor();
        ConvResult wino, gemm;
        {
          const ForceConvPath force(ConvPath::kWinograd);
          wino = conv_and_grads(x.to(dt), w.to(dt), b_dt, dy.to(dt), o);
        }
        {
          const ForceConvPath force(ConvPath::kGemm);
          gemm = conv_and_grads(x.to(dt), w.to(dt), b_dt, dy.to(dt), o);
        }
        struct Part {
          const char* name;
          Tensor wino, gemm, want;
        };
        const Part parts[] = {{"y", wino.y, gemm.y, want.y},
                              {"dx", wino.dx, gemm.dx, want.dx},
                              {"dweight", wino.dweight, gemm.dweight, want.dweight}};
        for (const Part& part : parts) {
          BOOST_TEST(part.wino.dtype() == dt);
          BOOST_TEST(part.wino.shape() == part.want.shape(), part.name << ": shape " << part.wino.shape());
          const double e_wino = max_error_over_max(part.wino, part.want);
          const double e_gemm = max_error_over_max(part.gemm, part.want);
          BOOST_TEST_MESSAGE("winograd " << part.name << " " << c.x << " -> " << c.c_out << ", " << dt
                                         << ": max error / max " << e_wino << " (im2col + GEMM " << e_gemm << ")");
          BOOST_TEST(e_wino <= prec.bound, part.name << ": max error / max " << e_wino << " > " << prec.bound);
        }
        if (c.bias) BOOST_TEST(max_error_over_max(wino.dbias, want.dbias) <= prec.bound, "dbias");
      }
    }
}

BOOST_AUTO_TEST_CASE(winograd_batch_equals_its_images, MT_CPU_TEST) {
  if (!mt::kernels::cpu::winograd_supported()) {
    BOOST_TEST_MESSAGE("winograd_batch_equals_its_images: skipped, no AVX2 with FMA or AVX-512F "
                       "(this CPU, or MIXTAPE_CPU_CAPABILITY)");
    return;
  }
  // Images go to threads whole: y and dx of an image do not depend on the batch around it, bit for bit. The
  // weight gradient sums the transformed gradients dU per thread, then over threads, and transforms back once; the
  // images' own dweights each went through that last transform alone, so the two differ by the Winograd error of
  // a few images' dU (measured 1.9e-6 of the largest value), not by f32 reassociation alone.
  const ForceConvPath force(ConvPath::kWinograd);
  const Tensor x = randn_seeded({5, 20, 13, 10}, mt::kF32, 71), w = randn_seeded({24, 20, 3, 3}, mt::kF32, 72);
  const Tensor b = randn_seeded({24}, mt::kF32, 73), dy = randn_seeded({5, 24, 13, 10}, mt::kF32, 74);
  const mt::Conv2dOptions o = conv_options(1, 1, 1);
  const ConvResult all = conv_and_grads(x, w, b, dy, o);
  Tensor dweight_sum = mt::zeros(w.shape(), mt::kF64);
  for (int64_t i = 0; i < 5; ++i) {
    const ConvResult one = conv_and_grads(x.slice(0, i, i + 1), w, b, dy.slice(0, i, i + 1), o);
    const std::string at = "image " + std::to_string(i);
    expect_same_bits(all.y.slice(0, i, i + 1), one.y, "y, " + at);
    expect_same_bits(all.dx.slice(0, i, i + 1), one.dx, "dx, " + at);
    dweight_sum = dweight_sum + one.dweight.to(mt::kF64);
  }
  BOOST_TEST(max_error_over_max(all.dweight, dweight_sum) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(winograd_keeps_non_finite_values_non_finite, MT_CPU_TEST) {
  if (!mt::kernels::cpu::winograd_supported()) {
    BOOST_TEST_MESSAGE("winograd_keeps_non_finite_values_non_finite: skipped, no AVX2 with FMA or AVX-512F "
                       "(this CPU, or MIXTAPE_CPU_CAPABILITY)");
    return;
  }
  // An inf or NaN spreads through its tiles' transforms (inf − inf is NaN), so outputs a direct sum would leave
  // finite may be NaN; but every output whose window reads it stays non-finite, and so do both gradients: what
  // anomaly mode and the GradScaler's skip look for.
  const ForceConvPath force(ConvPath::kWinograd);
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    BOOST_TEST_CONTEXT("bad value " << bad) {
      Tensor x = randn_seeded({2, 8, 11, 11}, mt::kF32, 81);
      x.set({1, 3, 5, 6}, bad);
      const Tensor w = randn_seeded({4, 8, 3, 3}, mt::kF32, 82);
      Tensor dy = randn_seeded({2, 4, 11, 11}, mt::kF32, 83);
      const ConvResult r = conv_and_grads(x, w, Tensor(), dy, conv_options(1, 1, 1));
      const std::vector<double> y = r.y.to_vector<double>();
      for (int64_t co = 0; co < 4; ++co)
        for (int64_t oh = 4; oh <= 6; ++oh)
          for (int64_t ow = 5; ow <= 7; ++ow)
            BOOST_TEST(!std::isfinite(y[static_cast<size_t>(((4 + co) * 11 + oh) * 11 + ow)]),
                       "y[1][" << co << "][" << oh << "][" << ow << "] reads the bad input");
      BOOST_TEST(!std::isfinite(mt::sum(r.dweight).item<double>()));
      // A bad gradient reaches dx.
      dy.set({0, 2, 3, 3}, bad);
      const ConvResult g = conv_and_grads(randn_seeded({2, 8, 11, 11}, mt::kF32, 84), w, Tensor(), dy,
                                          conv_options(1, 1, 1));
      BOOST_TEST(!std::isfinite(mt::sum(g.dx).item<double>()));
      BOOST_TEST(!std::isfinite(mt::sum(g.dweight).item<double>()));
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_batches_and_channels_give_empty_or_zero_results, MT_CPU_TEST) {
  // The windows the Winograd path covers, with nothing in them: no batch (empty y and dx, zero dweight and dbias),
  // no input channel (y is the bias, dx empty, dbias the sum of dy).
  for (DType dt : {mt::kF32, mt::kBF16}) {
    BOOST_TEST_CONTEXT("dtype " << dt) {
      const Tensor w = randn_seeded({4, 3, 3, 3}, dt, 91).requires_grad_();
      const Tensor b = randn_seeded({4}, dt, 92).requires_grad_();
      const Tensor none = mt::zeros({0, 3, 8, 8}, dt).requires_grad_();
      Tensor y = mt::conv2d(none, w, b, conv_options(1, 1, 1));
      BOOST_TEST(y.shape() == (Shape{0, 4, 8, 8}));
      mt::sum(y).backward();
      BOOST_TEST(none.grad().shape() == (Shape{0, 3, 8, 8}));
      expect_close(w.grad(), mt::zeros(w.shape(), dt), kExact, "dweight of an empty batch");
      expect_close(b.grad(), mt::zeros(b.shape(), dt), kExact, "dbias of an empty batch");

      const Tensor x0 = mt::zeros({2, 0, 8, 8}, dt).requires_grad_(), w0 = mt::zeros({4, 0, 3, 3}, dt).requires_grad_();
      const Tensor b0 = randn_seeded({4}, dt, 93).requires_grad_();
      y = mt::conv2d(x0, w0, b0, conv_options(1, 1, 1));
      BOOST_TEST(y.shape() == (Shape{2, 4, 8, 8}));
      expect_close(y, b0.detach().reshape({1, 4, 1, 1}).expand({2, 4, 8, 8}), kExact, "y of no input channel");
      mt::sum(y).backward();
      BOOST_TEST(x0.grad().shape() == (Shape{2, 0, 8, 8}));
      BOOST_TEST(w0.grad().shape() == (Shape{4, 0, 3, 3}));
      expect_close(b0.grad(), mt::full({4}, 128.0, dt), kExact, "dbias of no input channel");
    }
  }
}

BOOST_AUTO_TEST_CASE(a_frozen_weight_still_gives_the_input_and_bias_gradients, MT_CPU_TEST) {
  // Only x and the bias require gradients: dx is the same kernel's as with the weight trained, and dbias is dy summed
  // over (N, H, W) by its own reductions (no weight gradient computed to carry it).
  const Tensor x0 = randn_seeded({3, 8, 10, 10}, mt::kF32, 101), w = randn_seeded({6, 8, 3, 3}, mt::kF32, 102);
  const Tensor b0 = randn_seeded({6}, mt::kF32, 103), r = randn_seeded({3, 6, 10, 10}, mt::kF32, 104);
  auto grads = [&](bool weight_trained) {
    const Tensor x = x0.detach().requires_grad_(), b = b0.detach().requires_grad_();
    const Tensor wt = weight_trained ? w.detach().requires_grad_() : w;
    mt::sum(mt::mul(mt::conv2d(x, wt, b, conv_options(1, 1, 1)), r)).backward();  // dy = r
    BOOST_TEST(wt.grad().defined() == weight_trained);
    return std::pair{x.grad(), b.grad()};
  };
  const auto [dx_frozen, db_frozen] = grads(false);
  const auto [dx_trained, db_trained] = grads(true);
  expect_close(dx_frozen, dx_trained, kExact, "dx with the weight frozen");
  // dbias[c] = Σ r[:, c, :, :], 300 terms of N(0, 1) summed in f32: far inside 1e-5.
  const Tensor want = mt::sum(r.to(mt::kF64), std::vector<int64_t>{0, 2, 3});
  expect_close(db_frozen.to(mt::kF64), want, {1e-5, 1e-5}, "dbias with the weight frozen");
  expect_close(db_trained.to(mt::kF64), want, {1e-5, 1e-5}, "dbias with the weight trained");
}

BOOST_AUTO_TEST_CASE(winograd_covers_only_its_windows, MT_CPU_TEST) {
  namespace cpu = mt::kernels::cpu;
  const Shape x{8, 32, 26, 26};
  const mt::kernels::Window2d k3{{3, 3}, {1, 1}, {0, 0}, {1, 1}};
  BOOST_TEST(cpu::use_winograd(mt::kF32, x, 64, k3).has_value() == cpu::winograd_supported());
  BOOST_TEST(cpu::use_winograd(mt::kF16, x, 64, k3).has_value() == cpu::winograd_supported());
  BOOST_TEST(cpu::use_winograd(mt::kBF16, x, 64, k3).has_value() == cpu::winograd_supported());
  BOOST_TEST(!cpu::use_winograd(mt::kF64, x, 64, k3).has_value());  // f64 stays a direct sum
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{3, 3}, {2, 2}, {0, 0}, {1, 1}}).has_value());  // stride 2
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{3, 3}, {1, 1}, {0, 0}, {2, 2}}).has_value());  // dilation 2
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{5, 5}, {1, 1}, {0, 0}, {1, 1}}).has_value());  // 5x5
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{3, 3}, {1, 1}, {3, 3}, {1, 1}}).has_value());  // padding 3
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{3, 3}, {1, 1}, {3, 1}, {1, 1}}).has_value());  // in height only
  BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, {{3, 3}, {1, 1}, {1, 3}, {1, 1}}).has_value());  // in width only
  BOOST_TEST(!cpu::use_winograd(mt::kF32, {8, 0, 26, 26}, 64, k3).has_value());                    // no input channel
  // One input channel (the MNIST net's first conv): measured on the 2-core VM, batch 128, its forward by Winograd
  // takes 1.6 ms against im2col + sgemm's 3.8-4.2 ms, its weight gradient 2.0 against 1.2-2.3 ms.
  BOOST_TEST(cpu::use_winograd(mt::kF32, {8, 1, 28, 28}, 32, k3).has_value() == cpu::winograd_supported());
  {
    const cpu::ForceConvPath gemm(cpu::ConvPath::kGemm);
    BOOST_TEST(!cpu::use_winograd(mt::kF32, x, 64, k3).has_value());
  }
  BOOST_TEST(cpu::use_winograd(mt::kF32, x, 64, k3).has_value() == cpu::winograd_supported());
  // The public switch: direct sums, bit for bit im2col + GEMM's.
  BOOST_TEST(mt::allow_winograd());
  mt::set_allow_winograd(false);
  const bool used = cpu::use_winograd(mt::kF32, x, 64, k3).has_value();
  const Tensor xs = randn_seeded({2, 8, 9, 9}, mt::kF32, 75), ws = randn_seeded({4, 8, 3, 3}, mt::kF32, 76);
  const Tensor direct = mt::conv2d(xs, ws);
  mt::set_allow_winograd(true);
  BOOST_TEST(!used);
  const cpu::ForceConvPath gemm(cpu::ConvPath::kGemm);
  expect_same_bits(direct, mt::conv2d(xs, ws), "conv2d with Winograd disallowed");
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes, MT_CPU_TEST) {
  const Tensor img = mt::randn({3, 28, 28});
  expect_error([&] { mt::conv2d(mt::randn({28, 28}), mt::randn({8, 1, 3, 3})); },
               {"conv2d: expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got [28, 28]"});
  expect_error([&] { mt::conv2d(mt::randn({2, 1, 5, 5}), mt::randn({8, 3, 3, 3})); },
               {"conv2d: input [2, 1, 5, 5] has 1 channels but weight [8, 3, 3, 3] expects C_in = 3"});
  expect_error([&] {
                 mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({1, 1, 3, 3}), {}, conv_options(1, 0, 2));
               },
               {"conv2d: the height of the (dilated) kernel, 5, exceeds the padded input's, 4",
                "input shape [1, 1, 4, 4]"});
  // Options out of range: a stride or dilation of 0 would divide by zero, a negative padding read outside the input.
  for (const auto& [o, what] : std::vector<std::pair<mt::Conv2dOptions, const char*>>{
           {conv_options(0, 0, 1), "stride 0x0"}, {conv_options(1, 0, 0), "dilation 0x0"},
           {conv_options(1, -1, 1), "padding -1x-1"}, {conv_options(-2, 0, 1), "stride -2x-2"}})
    expect_error([&] { mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({1, 1, 3, 3}), {}, o); },
                 {"conv2d: kernel, stride and dilation must be positive and padding non-negative", what});
  // Sizes that would overflow, or whose output could never be allocated, are refused before any allocation.
  mt::Conv2dOptions huge;
  huge.padding[0] = huge.padding[1] = int64_t{1} << 40;
  expect_error([&] { mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({1, 1, 3, 3}), {}, huge); },
               {"conv2d", "more elements than a 64-bit count holds"});
  huge.padding[0] = int64_t{1} << 62;
  expect_error([&] { mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({1, 1, 3, 3}), {}, huge); },
               {"conv2d", "overflow 64 bits"});
  expect_error([&] { mt::conv2d(mt::randn({1, 1, 4, 4}), mt::randn({2, 1, 3, 3}), mt::randn({3})); },
               {"conv2d: expected bias of shape [2]", "got [3]"});
  expect_error([&] { mt::conv2d(img, mt::randn({8, 3, 3, 3}, mt::kF64)); },
               {"conv2d: input, weight and bias must share a dtype, got f32, f64"});
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(im2col_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : conv_cases())
    for (DType dt : kGpuFloatTypes) {
      const Tensor x = randn_seeded(c.input, dt, 11);
      expect_close(kn::im2col(gpu(x), c.w), kn::im2col(x, c.w), tolerance(dt), label("im2col", c, dt));
      // The same values through a transposed (non-contiguous) view.
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_seeded(swapped, dt, 12);
      expect_close(kn::im2col(transposed_23(gpu(base)), c.w), kn::im2col(transposed_23(base), c.w), tolerance(dt),
                  label("im2col", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(col2im_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : conv_cases())
    for (DType dt : kGpuFloatTypes) {
      const Shape p = pooled(c.input, c.w);
      const int64_t rows = c.input[1] * c.w.kernel[0] * c.w.kernel[1], L = p[2] * p[3];
      const Tensor cols = randn_seeded({c.input[0], rows, L}, dt, 21);
      const Tensor got = kn::col2im(gpu(cols), c.input, c.w);
      expect_close(got, kn::col2im(cols, c.input, c.w), tolerance(dt), label("col2im", c, dt));
      expect_same_bits(kn::col2im(gpu(cols), c.input, c.w), got, label("col2im run twice", c, dt));
      // Columns as the transpose of an (N, L, C·kH·kW) tensor.
      const Tensor cols_base = randn_seeded({c.input[0], L, rows}, dt, 22);
      expect_close(kn::col2im(mt::raw::transpose(gpu(cols_base), 1, 2), c.input, c.w),
                   kn::col2im(mt::raw::transpose(cols_base, 1, 2), c.input, c.w), tolerance(dt),
                   label("col2im", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(im2col_col2im_mnist_shapes, MT_GPU_TEST) {
  // The two convolutions of the MNIST example: 1 -> 32 channels (5x5, padding 2), then 32 -> 64 (3x3, padding 1).
  const WindowCase cases[] = {{"MNIST conv1", {128, 1, 28, 28}, window(5, 1, 2, 1)},
                              {"MNIST conv2", {128, 32, 28, 28}, window(3, 1, 1, 1)}};
  for (const WindowCase& c : cases)
    for (DType dt : kGpuFloatTypes) {
      const Tensor x = randn_seeded(c.input, dt, 31);
      const Tensor cols = kn::im2col(x, c.w);
      const Tensor cols_gpu = kn::im2col(gpu(x), c.w);
      expect_close(cols_gpu, cols, tolerance(dt), label("im2col", c, dt));
      expect_close(kn::col2im(cols_gpu, c.input, c.w), kn::col2im(cols, c.input, c.w), tolerance(dt),
                   label("col2im", c, dt));
    }
}

BOOST_AUTO_TEST_CASE(conv2d_forward_backward, MT_GPU_TEST) {
  struct Case {
    const char* name;
    Shape x, weight;
    mt::Conv2dOptions o;
  };
  const Case cases[] = {
      {"stride 2, padding 1, dilation 2", {2, 3, 9, 10}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {2, 2}}},
      {"MNIST conv1", {128, 1, 28, 28}, {32, 1, 5, 5}, {{1, 1}, {2, 2}, {1, 1}}},
  };
  for (const Case& c : cases) {
    const Leaf x(randn_seeded(c.x, mt::kF32, 81)), w(randn_seeded(c.weight, mt::kF32, 82));
    const Leaf b(randn_seeded({c.weight[0]}, mt::kF32, 83));
    const Tensor y_cpu = mt::conv2d(x.cpu, w.cpu, b.cpu, c.o), y_gpu = mt::conv2d(x.gpu, w.gpu, b.gpu, c.o);
    const Tensor dy = randn_seeded(y_cpu.shape(), mt::kF32, 84);
    y_cpu.backward(dy);
    y_gpu.backward(gpu(dy));
    const std::string what = std::string("conv2d [") + c.name + "]";
    // Override: the GEMMs sum their K terms in tile order, not the CPU's. The f32 error of a K-term sum is about
    // sqrt(K)·2^-24·Σ|a·b|: ~1e-5 for y and dx (K = 27..75 products of N(0, 1) values), but dweight and dbias sum
    // N·H_out·W_out = 100 352 products for MNIST conv1 (|Σ| ~ 300, Σ|a·b| ~ 6e4), so they get atol 1e-2.
    expect_close(y_gpu, y_cpu, {1e-5, 1e-4}, what + " y");
    expect_close(x.gpu.grad(), x.cpu.grad(), {1e-5, 1e-4}, what + " dx");
    expect_close(w.gpu.grad(), w.cpu.grad(), {1e-4, 1e-2}, what + " dweight");
    expect_close(b.gpu.grad(), b.cpu.grad(), {1e-4, 1e-2}, what + " dbias");
  }
}

// Under set_conv_column_limit the batch goes through in chunks of samples: a small convolution, sized for
// compute-sanitizer, in chunks of 3 samples (the last one of 2) and of one against the whole batch, in f16 and f32:
// the same results up to the order of sums.
BOOST_AUTO_TEST_CASE(conv2d_in_small_chunks_matches_the_whole_batch, MT_GPU_TEST) {
  for (const mt::DType dtype : {mt::kF16, mt::kF32}) {
    const Tensor x = randn_seeded({8, 8, 10, 10}, dtype, 101), w = randn_seeded({16, 8, 3, 3}, dtype, 102);
    const Tensor b = randn_seeded({16}, dtype, 103), dy = randn_seeded({8, 16, 8, 8}, dtype, 104);
    auto run = [&](int64_t limit) {
      const mt::test::ConvColumnLimit scoped(limit);
      Tensor xg = gpu(x), wg = gpu(w), bg = gpu(b);  // fresh leaves
      xg.requires_grad_(), wg.requires_grad_(), bg.requires_grad_();
      const Tensor y = mt::conv2d(xg, wg, bg);
      y.backward(gpu(dy));
      return std::vector<Tensor>{y, xg.grad(), wg.grad(), bg.grad()};
    };
    const std::vector<Tensor> whole = run(0);
    const int64_t per_sample = 8 * 9 * 8 * 8 * 4;  // f32 columns of one sample
    for (const int64_t samples : {3, 1}) {
      const std::vector<Tensor> chunked = run(samples * per_sample);
      const std::string what = std::string(mt::dtype_name(dtype)) + " conv2d in chunks of " + std::to_string(samples);
      const char* names[] = {" y", " dx", " dweight", " dbias"};
      for (size_t i = 0; i < whole.size(); ++i) {
        expect_close(chunked[i], whole[i], {2e-3, dtype == mt::kF16 ? 2e-2 : 1e-4}, what + names[i]);
      }
    }
  }
}

// The same at MNIST size: the CNN's second convolution in f16 at batch 128 (81 MiB of f32 input-gradient columns
// whole) under the default limit, with chunks of 12 samples (8 MiB) and of one, against the whole batch (limit 0):
// the same results up to the order of sums, and a peak of device memory lower by most of the columns. Labelled
// large: racecheck had not finished it after 170 s (bench/RESULTS.md, sixth GPU run); the case above stands in.
BOOST_AUTO_TEST_CASE(conv2d_in_chunks_under_a_column_limit_matches_the_whole_batch, MT_GPU_TEST MT_LARGE_TEST) {
  const Tensor x = randn_seeded({128, 32, 26, 26}, mt::kF16, 91), w = randn_seeded({64, 32, 3, 3}, mt::kF16, 92);
  const Tensor b = randn_seeded({64}, mt::kF16, 93), dy = randn_seeded({128, 64, 24, 24}, mt::kF16, 94);
  struct Run {
    Tensor y, dx, dw, db;
    int64_t peak = 0;
  };
  auto run = [&](int64_t limit) {
    const mt::test::ConvColumnLimit scoped(limit);
    Tensor xg = gpu(x), wg = gpu(w), bg = gpu(b);  // fresh leaves
    xg.requires_grad_(), wg.requires_grad_(), bg.requires_grad_();
    mt::cuda::synchronize();
    mt::cuda::reset_peak_memory_stats();
    const int64_t start = mt::cuda::memory_stats().allocated_bytes;
    Run r;
    r.y = mt::conv2d(xg, wg, bg);
    r.y.backward(gpu(dy));
    r.peak = mt::cuda::memory_stats().peak_allocated_bytes - start;
    r.dx = xg.grad(), r.dw = wg.grad(), r.db = bg.grad();
    return r;
  };
  const Run whole = run(0);
  const int64_t per_sample = 32 * 9 * 24 * 24 * 4;  // f32 columns of one sample: 663 552 bytes
  // The default (kConvColumnLimitAuto: 10 MiB for f16, chunks of 15 samples), 12 samples, one.
  for (int64_t limit : {mt::cuda::kConvColumnLimitAuto, 12 * per_sample, int64_t{1}}) {
    const Run chunked = run(limit);
    const int64_t bytes = limit == mt::cuda::kConvColumnLimitAuto ? mt::cuda::kDefaultConvColumnLimitF16 : limit;
    const std::string what = "conv2d in chunks of " + std::to_string(std::max<int64_t>(bytes / per_sample, 1)) +
                             (limit == mt::cuda::kConvColumnLimitAuto ? " (the default limit)" : "");
    // Each output element is one rounding of an f32 sum whose order the chunking may change (the GEMM's tile choice
    // follows the batch count): within an f16 ulp or two of the whole batch's, dweight's batch sum more.
    expect_close(chunked.y, whole.y, {2e-3, 2e-3}, what + " y");
    expect_close(chunked.dx, whole.dx, {2e-3, 2e-3}, what + " dx");
    expect_close(chunked.dw, whole.dw, {4e-3, 1.0}, what + " dweight");
    expect_close(chunked.db, whole.db, {4e-3, 1.0}, what + " dbias");
    BOOST_TEST(chunked.peak < whole.peak - (60 << 20),
               what << ": peak " << chunked.peak << " bytes against the whole batch's " << whole.peak);
  }
}

BOOST_AUTO_TEST_CASE(the_bias_gradient_reads_dy_in_place, MT_GPU_TEST) {
  // dbias of the MNIST CNN's conv2 in AMP, the weight frozen: the planes' sums (N, C_out) in f32 and the result are
  // all the backward asks for. Summed over (N, H, W) at once it copied dy (9.4 MB) to rows first.
  const int64_t n = 128, c = 64;
  const Tensor x = randn_seeded({n, 32, 26, 26}, mt::kF16, 111), w = randn_seeded({c, 32, 3, 3}, mt::kF16, 112);
  const Tensor b = randn_seeded({c}, mt::kF16, 113), dy = randn_seeded({n, c, 24, 24}, mt::kF16, 114);
  const Tensor bg = gpu(b).requires_grad_(), dyg = gpu(dy);
  const Tensor y = mt::conv2d(gpu(x), gpu(w), bg);
  mt::cuda::synchronize();
  mt::cuda::reset_peak_memory_stats();
  const int64_t start = mt::cuda::memory_stats().requested_bytes;
  y.backward(dyg);
  const int64_t asked = mt::cuda::memory_stats().peak_requested_bytes - start;
  BOOST_TEST(asked <= n * c * 4 + c * 4 + c * 2, "dbias of dy " << dy.shape() << " asked for " << asked << " bytes");
  // 73,728 f16 terms a channel: f32 sums, one f16 rounding (half an ulp, 2^-11 of the result) and the order's error.
  const Tensor want = mt::sum(dy.to(mt::kF64), std::vector<int64_t>{0, 2, 3});
  expect_close(bg.grad().to(mt::kF64), want, {2e-3, 2e-2}, "dbias on the GPU");
}

BOOST_AUTO_TEST_CASE(conv2d_runs_its_columns_through_the_tensor_cores, MT_GPU_TEST) {
  mt::manual_seed(35);
  const Tensor x = mt::randn({8, 1, 28, 28}).to(mt::kF16), w = mt::randn({16, 1, 5, 5}).to(mt::kF16);
  const Tensor xg = x.to(Device::cuda()), wg = w.to(Device::cuda());
  Tensor y;
  {
    mt::autograd::PrecisionTrace trace;
    y = mt::conv2d(xg, wg);
    BOOST_TEST(trace.str() == "conv2d:f16[wmma f16]", "trace: " << trace.str());
  }
  const Tensor ref = mt::conv2d(x.to(mt::kF64), w.to(mt::kF64));
  BOOST_TEST(relative_error(y, ref) < kF16GemmBound);
}

BOOST_AUTO_TEST_CASE(conv2d_in_f32_runs_tf32_when_allowed, MT_GPU_TEST) {
  // bench/mnist_gpu.py --tf32 times the CNN so, against PyTorch's TF32 convolutions: the forward and both gradients
  // on the TF32 tiles, each against float64 of the same f32 inputs. TF32 keeps 10 mantissa bits (2^-11 relative a
  // rounded operand, two operands a product), accumulation in f32: tests/test_matmul.cpp's kTf32Bound, 2e-3.
  const Tensor x = randn_seeded({8, 4, 12, 12}, mt::kF32, 121), w = randn_seeded({6, 4, 3, 3}, mt::kF32, 122);
  const Tensor dy = randn_seeded({8, 6, 10, 10}, mt::kF32, 123);
  const mt::test::AllowTf32 on(true);
  Tensor xg = gpu(x), wg = gpu(w);
  xg.requires_grad_(), wg.requires_grad_();
  Tensor y;
  {
    mt::autograd::PrecisionTrace trace;
    y = mt::conv2d(xg, wg);
    BOOST_TEST(trace.str() == "conv2d:f32[wmma tf32]", "trace: " << trace.str());
  }
  y.backward(gpu(dy));
  Tensor x64 = x.to(mt::kF64), w64 = w.to(mt::kF64);
  x64.requires_grad_(), w64.requires_grad_();
  const Tensor y64 = mt::conv2d(x64, w64);
  y64.backward(dy.to(mt::kF64));
  BOOST_TEST(relative_error(y, y64) < 2e-3);
  BOOST_TEST(relative_error(xg.grad(), x64.grad()) < 2e-3);
  BOOST_TEST(relative_error(wg.grad(), w64.grad()) < 2e-3);
}

BOOST_AUTO_TEST_SUITE_END()
