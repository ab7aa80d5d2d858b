// tests/test_dropout.cpp — the dropout family (ops/dropout.cpp, ops/cpu/dropout.cpp, cuda/dropout.cu).
//
// The op's registry case (gradcheck in f64 with a fixed generator, f32/f16/bf16 against f64; CUDA against the
// CPU in tests/test_parity.cpp), the mask (seeded, fresh per draw, scaled, counter offsets), the identity and
// all-dropped extremes and the gradient, and on CUDA: the mask bit for bit the CPU's for any seed, offset and
// size, and the op forward and backward on both devices.
#include "family_test.h"

#include <mixtape/autograd/autograd.h>

namespace {

MT_OP_CASE({.op = "dropout", .label = "p 0.3, a fixed generator (the same mask every evaluation)",
            .f = [](const In& in) {
              mt::Generator g(42);
              return mt::dropout(in[0], 0.3, true, &g);
            },
            .inputs = [] { return In{mt::randn({4, 5})}; }});

/// The kernel's mask from counters [offset, offset + numel) of `seed`: drawn from a generator standing there, which
/// the kernel moves on by one counter per element.
Tensor mask_at(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device) {
  mt::Generator g;
  g.set_state({seed, offset});
  Tensor mask = mt::kernels::dropout_mask(shape, p, g, device);
  BOOST_TEST((g.state() == mt::GeneratorState{seed, offset + static_cast<uint64_t>(mask.numel())}),
             "dropout_mask reserves one counter per element (" << device << ")");
  return mask;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dropout)

BOOST_AUTO_TEST_CASE(dropout_masks, MT_CPU_TEST) {
  const double p = 0.4;
  const Tensor x = mt::ones({100000});
  mt::Generator g1(7), g2(7);
  const Tensor a = mt::dropout(x, p, true, &g1), b = mt::dropout(x, p, true, &g2);
  BOOST_TEST(g1.offset() == 100000u);  // one Philox counter per element reserved
  mt::test::expect_close(a, b, {0, 0}, "the same seed gives the same mask");
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
  const Tensor m0 = mask_at({10}, 0.5, 99, 0, mt::Device::cpu());
  const Tensor m3 = mask_at({7}, 0.5, 99, 3, mt::Device::cpu());
  BOOST_TEST(m0.dtype() == mt::kBool);
  mt::test::expect_close(m0.slice(0, 3, 10), m3, {0, 0}, "counter offsets");

  // The default generator when none is given: seeding it reproduces the mask.
  mt::manual_seed(5);
  const Tensor d1 = mt::dropout(x, p);
  mt::manual_seed(5);
  const Tensor d2 = mt::dropout(x, p);
  mt::test::expect_close(d1, d2, {0, 0}, "manual_seed");
}

BOOST_AUTO_TEST_CASE(dropout_mask_is_philox_element_by_element, MT_CPU_TEST) {
  // The CPU kernel's vector path (AVX-512 or AVX2 when the CPU has it) against the definition: element i is kept when
  // uniform_float(philox4x32_10(seed, 0, offset + i)[0]) >= p. Odd sizes leave a scalar tail; the last offset
  // carries the counter's low word into its high word mid-vector.
  const uint64_t seed = 0x1234567890abcdefull;
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 7})
    for (double p : {0.0, 0.37, 0.5, 1.0}) {
      const int64_t n = 10007;
      const Tensor m = mask_at({n}, p, seed, offset, mt::Device::cpu());
      const std::vector<double> mv = m.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t words[4];
        mt::philox4x32_10(seed, 0, offset + static_cast<uint64_t>(i), words);
        wrong += (mv[static_cast<size_t>(i)] != 0) != (static_cast<double>(mt::uniform_float(words[0])) >= p);
      }
      BOOST_TEST(wrong == 0, "offset " << offset << ", p " << p << ": " << wrong << " of " << n << " differ");
    }
}

BOOST_AUTO_TEST_CASE(dropout_identity_extremes_and_gradient, MT_CPU_TEST) {
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

  expect_error([&] { mt::dropout(x, 1.5); },
               {"dropout: probability has to be between 0 and 1, but got 1.5"});
  expect_error([&] { mt::dropout(x, -0.1, false); }, {"dropout: probability"});
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dropout_mask_is_bit_identical_to_the_cpus, MT_GPU_TEST) {
  const uint64_t seeds[] = {0, 42, 0x6d69787461706521ull, 0xffffffffffffffffull};
  // Offsets that carry across the low 32-bit word of the counter, and one far out.
  const uint64_t offsets[] = {0, 5, 0xfffffff0ull, uint64_t{1} << 40};
  const int64_t sizes[] = {1, 7, 1023, 65537};
  const double ps[] = {0.0, 0.1, 0.5, 0.9, 1.0};
  for (uint64_t seed : seeds)
    for (uint64_t offset : offsets)
      for (int64_t n : sizes)
        for (double p : ps) {
          std::ostringstream what;
          what << "dropout_mask [seed " << seed << ", offset " << offset << ", n " << n << ", p " << p << "]";
          const Tensor got = mask_at({n}, p, seed, offset, Device::cuda());
          BOOST_TEST_REQUIRE(got.is_cuda(), what.str() << ": mask not on the CUDA device");
          expect_same_bits(got, mask_at({n}, p, seed, offset, Device::cpu()), what.str());
        }
  // A multi-dimensional shape numbers its elements row-major, as the CPU does.
  expect_same_bits(mask_at({3, 5, 7}, 0.3, 9, 100, Device::cuda()),
                   mask_at({3, 5, 7}, 0.3, 9, 100, Device::cpu()), "dropout_mask (3, 5, 7)");
  BOOST_TEST(mask_at({0, 4}, 0.5, 1, 0, Device::cuda()).numel() == 0);
}

BOOST_AUTO_TEST_CASE(dropout_forward_backward, MT_GPU_TEST) {
  for (DType dt : kGpuFloatTypes) {
    const Leaf x(randn_seeded({64, 513}, dt, 101));
    mt::Generator g_cpu(7), g_gpu(7);  // the same seed: the same mask on both devices
    const Tensor y_cpu = mt::dropout(x.cpu, 0.3, true, &g_cpu), y_gpu = mt::dropout(x.gpu, 0.3, true, &g_gpu);
    const Tensor dy = randn_seeded(y_cpu.shape(), dt, 102);
    y_cpu.backward(dy);
    y_gpu.backward(gpu(dy));
    expect_close(y_gpu, y_cpu, tolerance(dt), "dropout op y");
    expect_close(x.gpu.grad(), x.cpu.grad(), tolerance(dt), "dropout op dx");
  }
}

BOOST_AUTO_TEST_SUITE_END()
