// tests/test_pool.cpp — the pooling family (ops/pool.cpp, ops/cpu/pool.cpp, cuda/pool.cu): max_pool2d and
// avg_pool2d.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), max-pool indices, padding that never wins and NaN that does, the gradient to each
// window's argmax, padding counted in the average, the errors of misuse, and on CUDA: the kernels against the
// CPU's (windows with stride 2, padding 1, dilation 2 and non-square kernels, the MNIST shapes, non-contiguous
// inputs, ties and NaNs in max-pool windows; the backwards, whose sums a scatter would race on, giving the same
// bits run after run) and the ops forward and backward on both devices.
#include "family_test.h"

#include <mixtape/autograd/autograd.h>

namespace {

/// Values in [-2, 2) spaced 4/n apart in a scrambled order: no two within
/// central-difference reach of each other, so max-pool windows have no ties.
Tensor distinct(const mt::Shape& shape) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = -2.0 + 4.0 * static_cast<double>((i * 7919) % n) / n;
  return mt::from_vector(v, shape);
}

mt::Pool2dOptions pool_options(int64_t kernel, int64_t stride, int64_t padding) {
  mt::Pool2dOptions o;
  o.kernel_size[0] = o.kernel_size[1] = kernel;
  o.stride[0] = o.stride[1] = stride;
  o.padding[0] = o.padding[1] = padding;
  return o;
}

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

/// Windows the pools accept (padding at most half the dilated kernel).
std::vector<WindowCase> pool_cases() {
  return {
      {"k2 s2 p0 d1", {2, 3, 8, 9}, window(2, 2, 0, 1)},
      {"k3 s2 p1 d1", {2, 3, 9, 8}, window(3, 2, 1, 1)},
      {"k3 s1 p1 d2", {2, 3, 9, 10}, window(3, 1, 1, 2)},
      {"k3 s2 p1 d2", {1, 2, 11, 10}, window(3, 2, 1, 2)},
      {"k2x3 s1x2 p1x1 d1", {2, 2, 7, 9}, window(2, 3, 1, 2, 1, 1, 1, 1)},
      {"MNIST k2 s2, (128, 32, 28, 28)", {128, 32, 28, 28}, window(2, 2, 0, 1)},
      {"k2 s2 p0 d1, 35 windows a row (the CPU's 16- or 8-wide steps and their tail)", {1, 2, 6, 71}, window(2, 2, 0, 1)},
  };
}

/// Values of `shape` with many ties (five levels) and, when `nans`, two NaNs side by side every 37 elements: some
/// windows hold both, and the first must win.
Tensor tied(const Shape& shape, DType dtype, bool nans) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = static_cast<double>((i * 7919) % 5) - 2.0;
    if (nans && (i % 37 == 11 || i % 37 == 12)) v[static_cast<size_t>(i)] = std::numeric_limits<double>::quiet_NaN();
  }
  return mt::from_vector(v, shape, mt::TensorOptions(dtype));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pool)

BOOST_AUTO_TEST_CASE(max_pool_indices_and_padding, MT_CPU_TEST) {
  // -1, -2, ..., -16: padding read as 0 would win every border window.
  std::vector<float> negatives(16);
  for (int i = 0; i < 16; ++i) negatives[static_cast<size_t>(i)] = -1.0f - static_cast<float>(i);
  const Tensor x = mt::from_vector(negatives, {1, 1, 4, 4});
  mt::kernels::Window2d w{{3, 3}, {1, 1}, {1, 1}, {1, 1}};
  const mt::kernels::MaxPoolResult r = mt::kernels::max_pool2d(x, w);
  BOOST_TEST(r.indices.dtype() == mt::kI32);
  // The max of each 3x3 window is its top-left element inside the plane.
  const std::vector<int32_t> expected_idx = {0, 0, 1, 2, 0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10};
  BOOST_TEST(r.indices.to_vector<int32_t>() == expected_idx, boost::test_tools::per_element());
  for (int64_t i = 0; i < 16; ++i) BOOST_TEST(r.y.to_vector<double>()[i] == -1.0 - expected_idx[i]);

  // Kernel 2, stride 2 on distinct values: the index of each window's largest element.
  const Tensor d =
      mt::from_vector(std::vector<float>{1, 5, 2, 0, 3, 4, 8, 9, 7, 6, -1, -2, 10, 11, -3, 12}, {1, 1, 4, 4});
  const mt::kernels::MaxPoolResult q = mt::kernels::max_pool2d(d, {{2, 2}, {2, 2}, {0, 0}, {1, 1}});
  BOOST_TEST(q.indices.to_vector<int32_t>() == (std::vector<int32_t>{1, 7, 13, 15}), boost::test_tools::per_element());
  BOOST_TEST(q.y.to_vector<double>() == (std::vector<double>{5, 9, 11, 12}), boost::test_tools::per_element());

  // NaN propagates, like PyTorch.
  Tensor n = d.clone();
  n.set({0, 0, 0, 0}, std::nan(""));
  BOOST_TEST(std::isnan(mt::max_pool2d(n).to_vector<double>()[0]));
}

BOOST_AUTO_TEST_CASE(max_pool_ties_and_nans_follow_the_definition, MT_CPU_TEST) {
  // The kernel's value and index of every window against the rule written out: taps inside the plane in (kh, kw)
  // order, the first maximum wins, the first NaN wins and stays; -1 (value -inf) when every tap is padding.
  std::vector<WindowCase> cases = pool_cases();
  cases.push_back({"k2 s1 p1 d3 (windows of padding only)", {1, 2, 2, 2}, window(2, 1, 1, 3)});
  for (const WindowCase& c : cases)
    for (DType dt : {mt::kF32, mt::kF16, mt::kBF16})
      for (bool nans : {false, true}) {
        const Tensor x = tied(c.input, dt, nans);
        const mt::kernels::MaxPoolResult r = mt::kernels::max_pool2d(x, c.w);
        const Shape out = pooled(c.input, c.w);
        const std::vector<double> xv = x.to_vector<double>(), yv = r.y.to_vector<double>();
        const std::vector<int32_t> iv = r.indices.to_vector<int32_t>();
        const int64_t h = c.input[2], wd = c.input[3], planes = c.input[0] * c.input[1];
        int64_t wrong = 0;
        for (int64_t nc = 0; nc < planes; ++nc)
          for (int64_t oh = 0; oh < out[2]; ++oh)
            for (int64_t ow = 0; ow < out[3]; ++ow) {
              int64_t at = -1;
              for (int64_t kh = 0; kh < c.w.kernel[0]; ++kh)
                for (int64_t kw = 0; kw < c.w.kernel[1]; ++kw) {
                  const int64_t ih = oh * c.w.stride[0] - c.w.padding[0] + kh * c.w.dilation[0];
                  const int64_t iw = ow * c.w.stride[1] - c.w.padding[1] + kw * c.w.dilation[1];
                  if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                  const double v = xv[static_cast<size_t>(nc * h * wd + ih * wd + iw)];
                  const double best = at < 0 ? 0.0 : xv[static_cast<size_t>(nc * h * wd + at)];
                  if (at >= 0 && std::isnan(best)) continue;
                  if (at < 0 || v > best || std::isnan(v)) at = ih * wd + iw;
                }
              const size_t o = static_cast<size_t>((nc * out[2] + oh) * out[3] + ow);
              const double want = at < 0 ? -std::numeric_limits<double>::infinity()
                                         : xv[static_cast<size_t>(nc * h * wd + at)];
              const bool same_value = std::isnan(want) ? std::isnan(yv[o]) : yv[o] == want;
              if (iv[o] != at || !same_value) {
                if (++wrong <= 3)
                  BOOST_ERROR(label("max_pool2d", c, dt, nans ? "ties and NaNs" : "ties")
                              << ": output " << o << " got index " << iv[o] << " value " << yv[o] << ", want " << at
                              << " value " << want);
              }
            }
        BOOST_TEST(wrong == 0, label("max_pool2d", c, dt, nans ? "ties and NaNs" : "ties") << ": " << wrong
                                                                                          << " windows differ");
      }
}

BOOST_AUTO_TEST_CASE(max_pool_gradient_goes_to_the_argmax_of_every_window, MT_CPU_TEST) {
  // Every 3x3 window (padding 1) of a 3x3 plane holds the centre, the largest value: it gets all 9 gradients.
  Tensor x = mt::from_vector(std::vector<float>{1, 2, 3, 4, 10, 5, 6, 7, 8}, {1, 1, 3, 3}).requires_grad_();
  Tensor y = mt::max_pool2d(x, pool_options(3, 1, 1));
  mt::sum(y).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 0, 0, 0, 9, 0, 0, 0, 0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(avg_pool_counts_padding, MT_CPU_TEST) {
  const Tensor x = mt::ones({1, 1, 3, 3});
  const Tensor y = mt::avg_pool2d(x, pool_options(3, 1, 1));
  // Corner windows hold 4 ones of 9 taps, edges 6, the centre 9.
  const std::vector<double> expected = {4 / 9., 6 / 9., 4 / 9., 6 / 9., 1, 6 / 9., 4 / 9., 6 / 9., 4 / 9.};
  mt::test::expect_close(y.flatten(), mt::from_vector(expected), {1e-6, 1e-7}, "avg_pool2d");
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes, MT_CPU_TEST) {
  const Tensor img = mt::randn({3, 28, 28});
  expect_error([&] { mt::max_pool2d(mt::randn({4, 4})); },
               {"max_pool2d: expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got [4, 4]"});
  expect_error([&] { mt::avg_pool2d(img, pool_options(2, 2, 2)); },
               {"avg_pool2d: padding should be at most half of the kernel size"});
  expect_error([&] { mt::max_pool2d(mt::randn({1, 2, 2}), pool_options(3, 1, 0)); },
               {"max_pool2d: the height of the (dilated) kernel, 3, exceeds the padded input's, 2"});
  // Options out of range (stride 0 is kernel_size's default, as PyTorch's stride=None).
  for (const mt::Pool2dOptions& o : {pool_options(0, 1, 0), pool_options(2, -1, 0), pool_options(2, 2, -1)}) {
    expect_error([&] { mt::max_pool2d(img, o); }, {"max_pool2d: kernel_size must be positive, stride non-negative"});
    expect_error([&] { mt::avg_pool2d(img, o); }, {"avg_pool2d: kernel_size must be positive, stride non-negative"});
  }
  // Planes of 2^31 pixels (a broadcast view: one element of memory) are more than int32 indices address.
  const Tensor huge = mt::zeros({1, 1, 1, 1}).expand({1, 1, 65536, 32768});
  expect_error([&] { mt::max_pool2d(huge); },
               {"max_pool2d: input [1, 1, 65536, 32768] has planes of 2147483648 pixels", "int32"});
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

// ---- max pooling -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(max_pool2d_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kGpuFloatTypes) {
      const Tensor x = randn_seeded(c.input, dt, 41);
      const kn::MaxPoolResult want = kn::max_pool2d(x, c.w), got = kn::max_pool2d(gpu(x), c.w);
      expect_close(got.y, want.y, tolerance(dt), label("max_pool2d y", c, dt));
      expect_close(got.indices, want.indices, kExact, label("max_pool2d indices", c, dt));
      // Non-contiguous input.
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_seeded(swapped, dt, 42);
      const kn::MaxPoolResult want_t = kn::max_pool2d(transposed_23(base), c.w);
      const kn::MaxPoolResult got_t = kn::max_pool2d(transposed_23(gpu(base)), c.w);
      expect_close(got_t.y, want_t.y, tolerance(dt), label("max_pool2d y", c, dt, "transposed"));
      expect_close(got_t.indices, want_t.indices, kExact, label("max_pool2d indices", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(max_pool2d_ties_and_nans_pick_the_cpus_index, MT_GPU_TEST) {
  // Ties: the first tap in (kh, kw) order wins; a NaN wins and stays (its index is the first NaN's).
  for (const WindowCase& c : pool_cases())
    for (DType dt : kGpuFloatTypes)
      for (bool nans : {false, true}) {
        const Tensor x = tied(c.input, dt, nans);
        const kn::MaxPoolResult want = kn::max_pool2d(x, c.w), got = kn::max_pool2d(gpu(x), c.w);
        const char* layout = nans ? "ties and NaNs" : "ties";
        expect_close(got.y, want.y, tolerance(dt), label("max_pool2d y", c, dt, layout));
        expect_close(got.indices, want.indices, kExact, label("max_pool2d indices", c, dt, layout));
      }
}

BOOST_AUTO_TEST_CASE(max_pool2d_backward_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kGpuFloatTypes) {
      // Ties make several windows pick the same pixel, so dx sums overlapping contributions.
      const Tensor x = tied(c.input, dt, false);
      const kn::MaxPoolResult fwd = kn::max_pool2d(x, c.w);
      const Tensor dy = randn_seeded(fwd.y.shape(), dt, 43);
      const Tensor want = kn::max_pool2d_backward(dy, fwd.indices, c.input, c.w);
      const Tensor got = kn::max_pool2d_backward(gpu(dy), gpu(fwd.indices), c.input, c.w);
      expect_close(got, want, tolerance(dt), label("max_pool2d_backward", c, dt));
      expect_same_bits(kn::max_pool2d_backward(gpu(dy), gpu(fwd.indices), c.input, c.w), got,
                       label("max_pool2d_backward run twice", c, dt));
      // dy as a transposed view.
      const Shape p = fwd.y.shape(), swapped{p[0], p[1], p[3], p[2]};
      const Tensor dy_base = randn_seeded(swapped, dt, 44);
      expect_close(kn::max_pool2d_backward(transposed_23(gpu(dy_base)), gpu(fwd.indices), c.input, c.w),
                  kn::max_pool2d_backward(transposed_23(dy_base), fwd.indices, c.input, c.w), tolerance(dt),
                  label("max_pool2d_backward", c, dt, "transposed dy"));
    }
}

// ---- average pooling -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(avg_pool2d_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kGpuFloatTypes) {
      const Tensor x = randn_seeded(c.input, dt, 51);
      expect_close(kn::avg_pool2d(gpu(x), c.w), kn::avg_pool2d(x, c.w), tolerance(dt), label("avg_pool2d", c, dt));
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_seeded(swapped, dt, 52);
      expect_close(kn::avg_pool2d(transposed_23(gpu(base)), c.w), kn::avg_pool2d(transposed_23(base), c.w), tolerance(dt),
                  label("avg_pool2d", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(avg_pool2d_backward_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kGpuFloatTypes) {
      const Tensor dy = randn_seeded(pooled(c.input, c.w), dt, 53);
      const Tensor got = kn::avg_pool2d_backward(gpu(dy), c.input, c.w);
      expect_close(got, kn::avg_pool2d_backward(dy, c.input, c.w), tolerance(dt), label("avg_pool2d_backward", c, dt));
      expect_same_bits(kn::avg_pool2d_backward(gpu(dy), c.input, c.w), got,
                       label("avg_pool2d_backward run twice", c, dt));
      const Shape p = pooled(c.input, c.w), swapped{p[0], p[1], p[3], p[2]};
      const Tensor base = randn_seeded(swapped, dt, 54);
      expect_close(kn::avg_pool2d_backward(transposed_23(gpu(base)), c.input, c.w),
                  kn::avg_pool2d_backward(transposed_23(base), c.input, c.w), tolerance(dt),
                  label("avg_pool2d_backward", c, dt, "transposed dy"));
    }
}

BOOST_AUTO_TEST_CASE(pools_forward_backward, MT_GPU_TEST) {
  mt::Pool2dOptions o;  // 2x2, stride 2: MNIST's pool
  for (DType dt : kGpuFloatTypes) {
    const Leaf x(randn_seeded({128, 32, 28, 28}, dt, 91));
    const Tensor y_cpu = mt::max_pool2d(x.cpu, o), y_gpu = mt::max_pool2d(x.gpu, o);
    const Tensor dy = randn_seeded(y_cpu.shape(), dt, 92);
    y_cpu.backward(dy);
    y_gpu.backward(gpu(dy));
    expect_close(y_gpu, y_cpu, tolerance(dt), "max_pool2d op y");
    expect_close(x.gpu.grad(), x.cpu.grad(), tolerance(dt), "max_pool2d op dx");

    mt::Pool2dOptions a;
    a.kernel_size[0] = a.kernel_size[1] = 3;
    a.stride[0] = a.stride[1] = 2;
    a.padding[0] = a.padding[1] = 1;
    const Leaf z(randn_seeded({2, 3, 9, 8}, dt, 93));
    const Tensor v_cpu = mt::avg_pool2d(z.cpu, a), v_gpu = mt::avg_pool2d(z.gpu, a);
    const Tensor dv = randn_seeded(v_cpu.shape(), dt, 94);
    v_cpu.backward(dv);
    v_gpu.backward(gpu(dv));
    expect_close(v_gpu, v_cpu, tolerance(dt), "avg_pool2d op y");
    expect_close(z.gpu.grad(), z.cpu.grad(), tolerance(dt), "avg_pool2d op dx");
  }
}

// ---- ties, through the op (issue 16 item 12) -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(max_pool_ties_give_each_window_gradient_to_its_first_maximum, MT_CPU_TEST) {
  // The numbers are PyTorch 1.13's (torch.nn.functional.max_pool2d, f32 and bf16): of tied maxima, the first in
  // row-major window order is the window's argmax, and the backward gives the window's gradient to that one element
  // alone, however many ties it holds.
  for (DType dt : kFloatTypes) {
    BOOST_TEST_CONTEXT("dtype " << dt) {
      // k2 s2, windows in row-major tap order: {1, 3, 3, 2} (two 3s), {3, 0, 1, 1}, {2, 2, 2, 2}, {5, 5, 5, 5}
      Tensor x = mt::from_vector(std::vector<double>{1, 3, 3, 0, 3, 2, 1, 1, 2, 2, 5, 5, 2, 2, 5, 5}, {1, 1, 4, 4},
                                 mt::TensorOptions(dt))
                     .requires_grad_();
      Tensor y = mt::max_pool2d(x, pool_options(2, 2, 0));
      BOOST_TEST(y.to_vector<double>() == (std::vector<double>{3, 3, 2, 5}), tt::per_element());
      mt::sum(y * mt::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 1, 2, 2}, mt::TensorOptions(dt))).backward();
      BOOST_TEST(x.grad().dtype() == dt);
      BOOST_TEST(x.grad().to_vector<double>() ==
                     (std::vector<double>{0, 1, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0}),
                 tt::per_element());

      // Overlapping windows (k3 s1 p1) of a constant plane: all nine taps tie in the centre window; each window's
      // 1 goes to its first tap inside the plane (PyTorch's indices 0 0 1 0 0 1 3 3 4).
      Tensor c = mt::ones({1, 1, 3, 3}, dt).requires_grad_();
      mt::sum(mt::max_pool2d(c, pool_options(3, 1, 1))).backward();
      BOOST_TEST(c.grad().to_vector<double>() == (std::vector<double>{4, 2, 0, 2, 1, 0, 0, 0, 0}), tt::per_element());

      // k2 s1 over a plane of 0s and 1s: two or three ties per window (PyTorch's indices 1 1 3 4).
      Tensor b = mt::from_vector(std::vector<double>{0, 1, 1, 1, 1, 0, 1, 0, 1}, {1, 1, 3, 3}, mt::TensorOptions(dt))
                     .requires_grad_();
      mt::sum(mt::max_pool2d(b, pool_options(2, 1, 0))).backward();
      BOOST_TEST(b.grad().to_vector<double>() == (std::vector<double>{0, 2, 0, 1, 1, 0, 0, 0, 0}), tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
