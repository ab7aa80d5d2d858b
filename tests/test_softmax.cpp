// tests/test_softmax.cpp — the softmax family (ops/softmax.cpp, ops/cpu/softmax.cpp, cuda/softmax.cu): softmax
// and log_softmax.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), f16 data whose statistics must be f32, the threaded CPU paths against f64, and the CUDA
// kernels against the CPU's (tests/gpu_rows.h: the order allowance) along every dim, at row lengths across every
// kernel tier, with special values, and the ops forward and backward on both devices.
#include "family_test.h"

namespace {

// Softmax-family backwards read the saved output y, which is rounded to the
// op's dtype (PyTorch saves it the same way): dx = y·(dy − Σ dy·y) and
// dy − exp(y)·Σ dy inherit y's absolute error of up to half an ulp at 1
// (2^-11 in f16, 2^-8 in bf16), and the cancellation in the bracket leaves
// small dx with that absolute error. The forwards meet the table; the
// gradients need atol = that half ulp (seen: 1.6e-4 in f16, 1.2e-3 in bf16).
constexpr Tolerance kSoftmaxF16{1e-3, 4.9e-4};
constexpr Tolerance kSoftmaxBF16{1.6e-2, 3.9e-3};

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

/// Forward and backward of softmax/log_softmax of x along dim: the CUDA kernels against the CPU's.
void check_softmax(const Tensor& x, int64_t dim, bool log, DType out_dtype, const std::string& what) {
  std::ostringstream os;
  os << (log ? "log_softmax" : "softmax") << " of " << describe(x) << " along dim " << dim << " -> " << out_dtype
     << " (" << what << ")";
  const std::string config = os.str();
  if (dim < 0) dim += x.dim();  // the kernels take a dim in [0, rank) (the op wraps -1)
  const int64_t C = x.dim() == 0 ? 1 : x.size(dim);
  const Tensor y_cpu = kn::softmax(x, dim, log, out_dtype);
  const Tensor y_gpu = kn::softmax(gpu(x), dim, log, out_dtype);
  BOOST_REQUIRE(y_gpu.is_cuda());
  expect_close(y_gpu, y_cpu, with_allowance(mt::test::tolerance(out_dtype), order_allowance(C), y_cpu), config);

  const Tensor dy = randn_as(x.shape(), out_dtype);
  const Tensor dx_cpu = kn::softmax_backward(dy, y_cpu, dim, log);
  const Tensor dx_gpu = kn::softmax_backward(gpu(dy), gpu(y_cpu), dim, log);
  expect_close(dx_gpu, dx_cpu, with_allowance(mt::test::tolerance(out_dtype), order_allowance(C), dx_cpu), config + ", backward");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(softmax)

BOOST_AUTO_TEST_CASE(precision_categories, MT_CPU_TEST) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  for (const char* op : {"softmax", "log_softmax"}) BOOST_TEST_CONTEXT(op) { BOOST_TEST(category(op) == "fp32"); }
}

BOOST_AUTO_TEST_CASE(error_messages, MT_CPU_TEST) {
  BOOST_CHECK_THROW(mt::softmax(mt::randn({2, 3}), 2), mt::Error);
  // The kernels take the op's wrapped dim: -1 (which crashed the CPU kernel) or 2 is refused.
  for (int64_t dim : {int64_t{-1}, int64_t{2}}) {
    mt::test::expect_error([&] { kn::softmax(mt::randn({2, 3}), dim, false, mt::kF32); },
                           {"kernels::softmax", "dim_of(dim, x.dim())", "dim = " + std::to_string(dim)});
    mt::test::expect_error([&] { kn::softmax_backward(mt::randn({2, 3}), mt::randn({2, 3}), dim, true); },
                           {"kernels::softmax_backward", "dim = " + std::to_string(dim)});
  }
}

// ---- f16 data: statistics in f32 -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(f16_softmax_keeps_f32_statistics, MT_CPU_TEST) {
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
      mt::test::expect_close(y, y_ref, mt::test::tolerance(mt::kF16), "f16 rows near +1000");
    }
  }
  // Along dim 0 (the strided, lane-blocked path) as well.
  Tensor xt = x.t();
  mt::test::expect_close(mt::softmax(xt, 0), mt::softmax(ref.t(), 0), mt::test::tolerance(mt::kF16),
                         "f16 columns near +1000");
}

BOOST_AUTO_TEST_CASE(rows_far_below_and_above_zero_are_shifted_rows_near_zero, MT_CPU_TEST) {
  // softmax(x + c) = softmax(x) and log_softmax(x + c) = log_softmax(x): the row's max is subtracted before exp, so
  // rows near −1000 (where every exp(x) underflows to 0) and near +1000 (where it overflows) give the outputs of
  // rows near 0. Values 0.5 apart, exact in f16 there; along the last dim (contiguous rows) and dim 0 (lanes).
  const Tensor base = mt::test::half_steps({6, 9});
  for (DType dt : {mt::kF64, mt::kF32, mt::kF16})
    for (double shift : {-1000.0, 1000.0})
      for (int64_t dim : {1, 0})
        for (bool log : {false, true}) {
          BOOST_TEST_CONTEXT(dt << ", shift " << shift << ", dim " << dim << (log ? ", log_softmax" : ", softmax")) {
            const Tensor x = mt::add(base, shift).to(dt);
            const Tensor y = log ? mt::log_softmax(x, dim) : mt::softmax(x, dim);
            const Tensor y_ref = log ? mt::log_softmax(base, dim) : mt::softmax(base, dim);
            mt::test::expect_close(y, y_ref, mt::test::tolerance(dt), "shifted rows");
          }
        }
}

BOOST_AUTO_TEST_CASE(large_inputs_take_the_threaded_paths, MT_CPU_TEST) {
  // Big enough for the OpenMP paths; compared with f64 (which takes the same paths).
  mt::manual_seed(9);
  Tensor x = mt::randn({64, 700});
  Tensor ref = x.to(mt::kF64);
  mt::test::Tolerance f32 = mt::test::tolerance(mt::kF32);
  mt::test::expect_close(mt::softmax(x, 0), mt::softmax(ref, 0), f32, "softmax dim 0");
  mt::test::expect_close(mt::log_softmax(x, 1), mt::log_softmax(ref, 1), f32, "log_softmax dim 1");
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

// Row lengths across the warp-per-row (<= 1024), 256-thread and 1024-thread block kernels, with and without
// 16-byte vectors.
BOOST_AUTO_TEST_CASE(softmax_rows_match_cpu, MT_GPU_TEST) {
  mt::manual_seed(1);
  for (DType dt : kGpuFloatTypes)
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
      const Tensor y = kn::softmax(gpu(x), 1, log, mt::kF32);
      const Tensor y_shift = kn::softmax(gpu(kn::scalar(kn::ScalarOp::kAdd, x.to(mt::kF32), -1000.0)),
                                              1, log, mt::kF32);
      expect_close(y, y_shift.cpu(), with_allowance(mt::test::tolerance(mt::kF32), order_allowance(C), y_shift.cpu()), "offset invariance");
    }
}

// Dims 0, 1 and -1 of 3-D inputs: the column kernel (many columns, or short dims) and the permuted-copy path.
BOOST_AUTO_TEST_CASE(softmax_any_dim, MT_GPU_TEST) {
  mt::manual_seed(4);
  const Shape shapes[] = {{5, 6, 7}, {300, 4, 5}, {33, 40, 600}, {4, 7, 64}, {2, 3000, 3}};
  for (DType dt : kGpuFloatTypes)
    for (const Shape& s : shapes)
      for (int64_t dim : {0, 1, -1})
        for (bool log : {false, true}) check_softmax(randn_as(s, dt), dim, log, dt, "3-D");
  check_softmax(mt::randn({}), 0, false, mt::kF32, "0-d");
  check_softmax(mt::randn({}), 0, true, mt::kF32, "0-d");
}

BOOST_AUTO_TEST_CASE(softmax_non_contiguous, MT_GPU_TEST) {
  mt::manual_seed(5);
  for (DType dt : kGpuFloatTypes) {
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
  for (DType dt : kGpuFloatTypes)
    for (bool log : {false, true}) check_softmax(special_rows(40).to(dt).t(), 0, log, dt, "special values, dim 0");
}

// f64 rows (the strided kernels, not unrolled) at lengths inside and across each block-size boundary.
BOOST_AUTO_TEST_CASE(softmax_f64_rows, MT_GPU_TEST) {
  mt::manual_seed(12);
  for (int64_t C : {7, 1024, 1025, 8193, 40000})
    for (bool log : {false, true}) check_softmax(randn_as({C > 8192 ? 3 : 33, C}, mt::kF64), -1, log, mt::kF64, "f64");
}

BOOST_AUTO_TEST_CASE(softmax_forward_backward, MT_GPU_TEST) {
  mt::manual_seed(12);
  for (DType dt : kGpuFloatTypes)
    for (int64_t dim : {0, -1}) {
      Leaf x(randn_as({8, 16, 300}, dt));
      const Tensor dy = randn_as({8, 16, 300}, dt);
      std::ostringstream os;
      os << "softmax/log_softmax " << dt << " dim " << dim;
      const Tensor y_cpu = mt::softmax(x.cpu, dim), y_gpu = mt::softmax(x.gpu, dim);
      expect_close(y_gpu, y_cpu, with_allowance(mt::test::tolerance(dt), order_allowance(300), y_cpu), os.str());
      y_cpu.backward(dy);
      y_gpu.backward(gpu(dy));
      expect_close(x.gpu.grad(), x.cpu.grad(), with_allowance(chained(dt), order_allowance(300), x.cpu.grad()), os.str() + ", dx");
      Leaf x2(randn_as({8, 16, 300}, dt));
      const Tensor l_cpu = mt::log_softmax(x2.cpu, dim), l_gpu = mt::log_softmax(x2.gpu, dim);
      expect_close(l_gpu, l_cpu, with_allowance(mt::test::tolerance(dt), order_allowance(300), l_cpu), os.str() + ", log");
      l_cpu.backward(dy);
      l_gpu.backward(gpu(dy));
      expect_close(x2.gpu.grad(), x2.cpu.grad(), with_allowance(chained(dt), order_allowance(300), x2.cpu.grad()), os.str() + ", log dx");
    }
}

BOOST_AUTO_TEST_SUITE_END()
