// tests/test_matmul.cpp — the matrix-product family (ops/matmul.cpp, ops/cpu/matmul.cpp, cuda/matmul.cu):
// matmul, linear and addmm.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), linear under autocast, the errors of misuse, the CPU kernels against a float64 product
// of the same rounded inputs over every dtype, layout and shape rule (tests/reference.h), and on CUDA: the kernels
// against the CPU's, and the ops reaching the Tensor Core GEMM (the precision trace names the kernel that ran;
// tests/test_cuda_gemm.cpp checks the GEMM launcher itself) with results within a stated bound of float64: batches
// that coalesce and ones that do not, broadcast weights, transposed views, the fused bias of linear, backward
// products, the TF32 opt-in and the SIMT fallback.
#include "family_test.h"

#include <optional>
#include <tuple>

#include <mixtape/core/storage.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/ops/cpu/gemm_bf16.h>

namespace {

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

// ---- the CPU kernels against float64 references -------------------------------------------

struct MatmulRef {
  std::vector<double> c;        // the product
  std::vector<double> abs_sum;  // sum over p of |a_ip b_pj|: the scale of each entry's rounding error
  Shape shape;
};

/// torch.matmul in double of the (already rounded) inputs, with its shape rules.
MatmulRef ref_matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const Tensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape ba, bb;
  for (int64_t d = 0; d + 2 < a.dim(); ++d) ba.push_back(a.size(d));
  for (int64_t d = 0; d + 2 < b.dim(); ++d) bb.push_back(b.size(d));
  const Shape batch = mt::broadcast_shapes(ba, bb, "ref_matmul");
  Shape fa = batch, fb = batch, result = batch;
  fa.push_back(m), fa.push_back(k), fb.push_back(k), fb.push_back(n);
  if (a_in.dim() != 1) result.push_back(m);
  if (b_in.dim() != 1) result.push_back(n);
  const std::vector<double> av = values(a.expand(fa)), bv = values(b.expand(fb));
  MatmulRef ref{std::vector<double>(static_cast<size_t>(batch.numel() * m * n)),
                std::vector<double>(static_cast<size_t>(batch.numel() * m * n)), result};
  for (int64_t i = 0; i < batch.numel(); ++i)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        long double s = 0, abs_sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          const long double term = static_cast<long double>(av[static_cast<size_t>((i * m + r) * k + p)]) *
                                   bv[static_cast<size_t>((i * k + p) * n + col)];
          s += term;
          abs_sum += term < 0 ? -term : term;
        }
        ref.c[static_cast<size_t>((i * m + r) * n + col)] = static_cast<double>(s);
        ref.abs_sum[static_cast<size_t>((i * m + r) * n + col)] = static_cast<double>(abs_sum);
      }
  return ref;
}

/// sqrt(k) u sum_p |a_ip b_pj| per element, u the unit roundoff of the accumulator of `dtype` inputs.
std::vector<double> accumulation_slack(const MatmulRef& ref, int64_t k, DType dtype) {
  const double u = dtype == DType::kF64 ? 0x1p-53 : 0x1p-24;
  std::vector<double> slack = ref.abs_sum;
  for (double& v : slack) v *= std::sqrt(static_cast<double>(k)) * u;
  return slack;
}

void check_matmul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype, const std::string& config_in) {
  const std::string config =
      describe(config_in, " op=matmul a=", a.shape(), " b=", b.shape(), " ", a.dtype(), " out_dtype=",
               out_dtype ? mt::dtype_name(*out_dtype) : "default");
  const Tensor got = mt::test::matmul(a, b, out_dtype);
  const MatmulRef ref = ref_matmul(a, b);
  const DType dtype = out_dtype.value_or(a.dtype());
  expect_shape(got, ref.shape, dtype, config);
  // Override: the table's pair covers the one rounding to `dtype`, but a
  // length-k dot product accumulated in f32 (f64) also carries a rounding
  // error that grows with k. Its probabilistic bound (Higham & Mary, 2019),
  // sqrt(k) u sum_p |a_ip b_pj| with u the accumulator's unit roundoff, is
  // added per element.
  Tolerance tol = mt::test::tolerance(dtype);
  if (a.dtype() != DType::kF64 && dtype == DType::kF64) tol = mt::test::tolerance(DType::kF32);
  const std::vector<double> slack = accumulation_slack(ref, a.size(-1), a.dtype());
  expect_values(got, ref.c, tol, config, slack);
}

/// Boost.Test precondition for the cases of the AVX512-BF16 kernel: skipped, with a message, on other CPUs (where
/// every other bf16 case runs the widening path).
struct gemm_bf16_available {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(kn::cpu::gemm_bf16_supported());
    if (!r) r.message() << "no AVX512-BF16 (this CPU, or MIXTAPE_CPU_CAPABILITY): skipping the bf16 GEMM's cases";
    return r;
  }
};

using kn::cpu::Bf16GemmPath;
using kn::cpu::ForceBf16GemmPath;

/// kernels::matmul of bf16 a and b through the AVX512-BF16 kernel: in f32 against float64 of the same inputs, and
/// in bf16 bit for bit the f32 result rounded once (so within half a bf16 ulp of a result within the f32 bound).
/// The kernel's sums are f32 sums of exact products like sgemm's (ops/cpu/gemm_bf16.h), so check_matmul's bound
/// holds unchanged: f32's pair from the table plus sqrt(k)·2^-24·Σ|a·b| per element. One product dropped or
/// counted twice (|a·b| ~ 1/3 here) is far outside it at every k below: at k = 32767 the slack is ~0.12.
void check_gemm_bf16(const Tensor& a, const Tensor& b, const std::string& config) {
  const ForceBf16GemmPath force(Bf16GemmPath::kAvx512Bf16);
  check_matmul(a, b, DType::kF32, config + " [AVX512-BF16 kernel]");
  std::vector<double> want = values(mt::test::matmul(a, b, DType::kF32));
  for (double& v : want) v = round_to(DType::kBF16, v);
  expect_values(mt::test::matmul(a, b), want, kExact, config + " [AVX512-BF16 kernel]: bf16 == round(f32)");
}

// ---- CUDA -------------------------------------------------------------------------------------

/// Runs matmul on both backends and compares. The two accumulate in different orders (BLAS blocks, the GPU
/// kernel 16-deep tiles with FMA), so each output gets an allowance of 2·k·u·(|a| @ |b|), u the unit roundoff
/// of the accumulator (f32, or f64 for f64): twice the classic worst-case bound of one dot product of length k.
void check_matmul_on_gpu(const Tensor& a, const Tensor& b, const std::string& layout,
                         std::optional<DType> out_dtype = std::nullopt) {
  const Tensor want = mt::test::matmul(a, b, out_dtype);
  const Tensor got = mt::test::matmul(same_view_on_gpu(a), same_view_on_gpu(b), out_dtype);
  const int64_t depth = a.size(-1);
  const double u = a.dtype() == mt::kF64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const Tensor bound = mt::test::matmul(kn::unary(kn::UnaryOp::kAbs, a.to(mt::kF64)), kn::unary(kn::UnaryOp::kAbs, b.to(mt::kF64)));
  std::vector<double> allowance = bound.to_vector<double>();
  for (double& v : allowance) v *= 2.0 * static_cast<double>(depth) * u;
  std::ostringstream what;
  what << "matmul of " << a.dtype() << " " << a.shape() << " and " << b.shape() << " (" << layout << ")";
  expect_close(got, want, mt::test::tolerance(want.dtype()), what.str(), allowance);
}

// Bounds on the relative Frobenius error against float64 of the same rounded inputs: the output's one
// rounding (f16: 2^-11, bf16: 2^-8 relative, about a third of that in the Frobenius mean) plus f32
// accumulation over K ≤ 4096; TF32 operands keep 10 fraction bits (2^-11 each, two per product).
double bound(DType out) {
  switch (out) {
    case DType::kF16: return 1e-3;
    case DType::kBF16: return 8e-3;
    default: return 1e-5;  // f32 out of f16/bf16 operands, or f32 SIMT
  }
}
constexpr double kTf32Bound = 2e-3;

Tensor cuda_randn(const Shape& shape, DType dtype) { return mt::randn(shape).to(dtype).to(Device::cuda()); }

/// mt::matmul on CUDA vs float64 on the CPU, with the trace entry it must leave.
void check_gemm(const Tensor& a, const Tensor& b, const std::string& kernel, double tol, const std::string& what) {
  Tensor c;
  std::string traced;
  {
    mt::autograd::PrecisionTrace trace;
    c = mt::matmul(a, b);
    traced = trace.str();
  }
  const Tensor ref = mt::matmul(a.cpu().to(mt::kF64), b.cpu().to(mt::kF64));
  const double err = relative_error(c, ref);
  BOOST_TEST_MESSAGE(what << ": " << traced << ", relative error " << err);
  BOOST_TEST(traced == std::string("matmul:") + mt::dtype_name(a.dtype()) + "[" + kernel + "]", what << ": " << traced);
  BOOST_TEST(err < tol, what << ": relative error " << err << " (bound " << tol << ")");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(matmul)

// ---- the ops ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(linear_under_autocast_runs_in_f16_with_f32_master_gradients, MT_CPU_TEST) {
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
  mt::test::expect_close(y, ref, mt::test::tolerance(mt::kF16), "linear under autocast, forward");
  const Tensor dw_ref = mt::sum(x16, {0}, true).expand({3, 8});
  mt::test::expect_close(w.grad(), dw_ref, mt::test::tolerance(mt::kF16), "linear under autocast, dW");
  mt::test::expect_close(b.grad(), mt::full({3}, 4.0), {0, 0}, "linear under autocast, db");

  // The other lower-precision ops follow the same rule; max_pool2d passes its dtype through.
  mt::amp::Autocast ac(mt::kBF16);
  BOOST_TEST(mt::matmul(x, w.t()).dtype() == mt::kBF16);
  const Tensor img = mt::randn({1, 2, 4, 4});
  BOOST_TEST(mt::conv2d(img, mt::randn({3, 2, 3, 3})).dtype() == mt::kBF16);
  BOOST_TEST(mt::max_pool2d(img).dtype() == mt::kF32);
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes, MT_CPU_TEST) {
  expect_error([&] { mt::matmul(mt::randn({2, 3}), mt::randn({4, 5})); },
               {"matmul: shapes cannot be multiplied ([2, 3] and [4, 5])"});
  expect_error([&] { mt::linear(mt::randn({2, 3}), mt::randn({4, 5})); },
               {"linear: x and weight shapes cannot be multiplied ([2, 3] and [4, 5]"});
}

// ---- the CPU kernels -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(matmul_naive_is_the_textbook_product, MT_CPU_TEST) {
  const Tensor a = mt::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}).view({2, 3});
  const Tensor b = mt::tensor({7.0, 8.0, 9.0, 10.0, 11.0, 12.0}).view({3, 2});
  expect_values(kn::cpu::matmul_naive(a, b), {58, 64, 139, 154}, kExact, "matmul_naive 2x3 @ 3x2");
  expect_values(kn::cpu::matmul_naive(a.t(), a), {17, 22, 27, 22, 29, 36, 27, 36, 45}, kExact,
                "matmul_naive transposed");
  // f16 inputs: f64 accumulation, one rounding to f16.
  const Tensor h = mt::tensor({1.0, 1e-3, 1.0, 1.0}, DType::kF16).view({2, 2});
  const std::vector<double> hv = values(h);
  expect_values(kn::cpu::matmul_naive(h, h),
                {round_to(DType::kF16, hv[0] * hv[0] + hv[1] * hv[2]), round_to(DType::kF16, hv[0] * hv[1] + hv[1] * hv[3]),
                 round_to(DType::kF16, hv[2] * hv[0] + hv[3] * hv[2]), round_to(DType::kF16, hv[2] * hv[1] + hv[3] * hv[3])},
                kExact, "matmul_naive f16");
}

BOOST_AUTO_TEST_CASE(matmul_2d_every_dtype_and_layout, MT_CPU_TEST) {
  uint64_t seed = 20000;
  for (DType dtype : kFloatTypes) {
    for (Layout la : {Layout::kContiguous, Layout::kTransposed, Layout::kStrided})
      for (Layout lb : {Layout::kContiguous, Layout::kTransposed, Layout::kStrided}) {
        seed += 2;
        const Tensor a = input({37, 29}, dtype, -1, 1, seed, la);
        const Tensor b = input({29, 23}, dtype, -1, 1, seed + 1, lb);
        check_matmul(a, b, std::nullopt,
                     describe("seed=", seed, " layouts=", layout_name(la), "/", layout_name(lb)));
      }
    // The naive reference agrees with BLAS on a bigger product.
    const Tensor a = input({130, 300}, dtype, -1, 1, ++seed), b = input({300, 70}, dtype, -1, 1, ++seed);
    const std::string config = describe(dtype, " [130, 300] @ [300, 70] seed=", seed);
    const Tensor naive = kn::cpu::matmul_naive(a.to(DType::kF64), b.to(DType::kF64));
    const MatmulRef ref = ref_matmul(a, b);
    expect_values(naive, ref.c, mt::test::tolerance(DType::kF64), "matmul_naive vs the test's own loop " + config);
    // Same override as check_matmul: the f32 accumulation error grows with k.
    const std::vector<double> slack = accumulation_slack(ref, 300, dtype);
    expect_values(mt::test::matmul(a, b), values(naive), mt::test::tolerance(dtype), "matmul vs matmul_naive " + config,
                  slack);
  }
}

BOOST_AUTO_TEST_CASE(matmul_f16_bf16_with_f32_output, MT_CPU_TEST) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const Tensor a = input({64, 128}, dtype, -1, 1, 31), b = input({128, 48}, dtype, -1, 1, 32, Layout::kTransposed);
    check_matmul(a, b, DType::kF32, "f32 out, seeds 31/32");
    check_matmul(a, b, std::nullopt, "default out, seeds 31/32");
    // The f16/bf16 result is the f32 result rounded once.
    const Tensor wide = mt::test::matmul(a, b, DType::kF32), narrow = mt::test::matmul(a, b);
    std::vector<double> want = values(wide);
    for (double& v : want) v = round_to(dtype, v);
    expect_values(narrow, want, kExact, describe("matmul ", dtype, " == round(f32 matmul)"));
  }
}

BOOST_AUTO_TEST_CASE(matmul_f16_bf16_widen_large_transposed_operands_in_place, MT_CPU_TEST) {
  // ops/cpu/matmul.cpp widens a transposed f16/bf16 matrix of 2^16 elements or more in its own layout (sgemm then
  // reads it as Trans) and a smaller one into row-major order: both sides of that line, as either operand, with
  // the other operand contiguous or transposed too, and batched. bf16 goes the widening way here too (forced; on
  // CPUs with AVX512-BF16 it would take the bf16 kernel).
  const ForceBf16GemmPath widening(Bf16GemmPath::kWidenSgemm);
  uint64_t seed = 40000;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    seed += 10;
    check_matmul(input({96, 700}, dtype, -1, 1, seed, Layout::kTransposed),  // 67,200 elements: kept transposed
                 input({700, 100}, dtype, -1, 1, seed + 1, Layout::kTransposed), std::nullopt, "both large, seed 1");
    check_matmul(input({40, 700}, dtype, -1, 1, seed + 2, Layout::kTransposed),  // 28,000: converted row-major
                 input({700, 100}, dtype, -1, 1, seed + 3, Layout::kTransposed), std::nullopt, "small a, seed 2");
    check_matmul(input({128, 784}, dtype, -1, 1, seed + 4),  // x·wᵀ of a 784 -> 512 Linear: the MLP's fc1
                 input({784, 512}, dtype, -1, 1, seed + 5, Layout::kTransposed), DType::kF32, "x wT, seed 4");
    check_matmul(input({3, 300, 256}, dtype, -1, 1, seed + 6, Layout::kTransposed),  // 76,800 a matrix
                 input({3, 256, 20}, dtype, -1, 1, seed + 7), std::nullopt, "batched, seed 6");
  }
}

// ---- the AVX512-BF16 kernel ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(gemm_bf16_every_layout_and_edge_against_float64,
                     MT_CPU_TEST * boost::unit_test::precondition(gemm_bf16_available())) {
  struct Size {
    int64_t m, n, k;
  };
  // Tiles are 12 x 32 with k in pairs: one element; k odd (the last pair half padding) and even; whole tiles and
  // one past in every dim; k = 1 and k = 0 (zeros); big enough to run on every thread; and (below) k long enough
  // that a and b are packed in several blocks each (at k = 32767: 12 rows of a, 64 columns of b).
  const Size sizes[] = {{1, 1, 1},   {1, 1, 2},     {3, 5, 7},     {12, 32, 16},  {13, 33, 17},
                        {11, 31, 1}, {37, 29, 31},  {4, 6, 0},     {130, 70, 301}};
  uint64_t seed = 60000;
  for (const Size& s : sizes)
    for (Layout la : {Layout::kContiguous, Layout::kTransposed, Layout::kStrided})
      for (Layout lb : {Layout::kContiguous, Layout::kTransposed, Layout::kStrided}) {
        seed += 2;
        const Tensor a = input({s.m, s.k}, DType::kBF16, -1, 1, seed, la);
        const Tensor b = input({s.k, s.n}, DType::kBF16, -1, 1, seed + 1, lb);
        check_gemm_bf16(a, b, describe("seed=", seed, " layouts=", layout_name(la), "/", layout_name(lb)));
      }
  // The several-block case in Linear's forward (x·wᵀ) and weight-gradient (dyᵀ·x) layouts, which between them
  // pack a and b both ways: its float64 reference is the slow part of this test.
  for (auto [la, lb] : {std::pair{Layout::kContiguous, Layout::kTransposed},
                        std::pair{Layout::kTransposed, Layout::kContiguous}}) {
    seed += 2;
    const Tensor a = input({13, 32767}, DType::kBF16, -1, 1, seed, la);
    const Tensor b = input({32767, 65}, DType::kBF16, -1, 1, seed + 1, lb);
    check_gemm_bf16(a, b, describe("seed=", seed, " layouts=", layout_name(la), "/", layout_name(lb)));
  }
}

BOOST_AUTO_TEST_CASE(gemm_bf16_batches, MT_CPU_TEST * boost::unit_test::precondition(gemm_bf16_available())) {
  // A product per batch (broadcast batch dims, a 2-D left operand), one folded GEMM (batch @ 2-D), 1-D operands,
  // batched transposed views.
  check_gemm_bf16(input({2, 1, 13, 31}, DType::kBF16, -1, 1, 61), input({3, 31, 9}, DType::kBF16, -1, 1, 62),
                  "broadcast batch, seeds 61/62");
  check_gemm_bf16(input({13, 31}, DType::kBF16, -1, 1, 63), input({3, 31, 40}, DType::kBF16, -1, 1, 64),
                  "matrix @ batch, seeds 63/64");
  check_gemm_bf16(input({7, 13, 31}, DType::kBF16, -1, 1, 65), input({31, 40}, DType::kBF16, -1, 1, 66),
                  "batch @ matrix (folded), seeds 65/66");
  check_gemm_bf16(input({31}, DType::kBF16, -1, 1, 67), input({2, 31, 5}, DType::kBF16, -1, 1, 68),
                  "1-D @ batch, seeds 67/68");
  check_gemm_bf16(input({6, 9, 5}, DType::kBF16, -1, 1, 69).transpose(-1, -2),
                  input({6, 7, 9}, DType::kBF16, -1, 1, 70).transpose(-1, -2), "batched transposed, seeds 69/70");
}

BOOST_AUTO_TEST_CASE(gemm_bf16_agrees_with_the_widening_path_on_the_mlp_products,
                     MT_CPU_TEST * boost::unit_test::precondition(gemm_bf16_available())) {
  // The products of a Linear 784 -> 512 on a batch of 128 (forward x·wᵀ, dx = dy·w, dw = dyᵀ·x) and of 512 ->
  // 512, as the tape hands them over. Both paths sum the same exact products in f32, in different orders, so each
  // is within k·2^-24·(|a|·|b|) of the exact sum (the worst case, not the probable one) and they are within twice
  // that of each other.
  struct Product {
    Tensor a, b;
    const char* what;
  };
  const Tensor x = input({128, 784}, DType::kBF16, -1, 1, 71), w = input({512, 784}, DType::kBF16, -1, 1, 72);
  const Tensor dy = input({128, 512}, DType::kBF16, -1, 1, 73), w2 = input({512, 512}, DType::kBF16, -1, 1, 74);
  const Product products[] = {{x, w.t(), "x wT"},   {dy, w, "dy w"},   {dy.t(), x, "dyT x"},
                              {dy, w2.t(), "h w2T"}, {dy, w2, "dy w2"}, {dy.t(), dy, "dyT h"}};
  for (const Product& p : products) {
    Tensor kernel, widened;
    {
      const ForceBf16GemmPath force(Bf16GemmPath::kAvx512Bf16);
      kernel = mt::test::matmul(p.a, p.b, DType::kF32);
    }
    {
      const ForceBf16GemmPath force(Bf16GemmPath::kWidenSgemm);
      widened = mt::test::matmul(p.a, p.b, DType::kF32);
    }
    const Tensor abs_product = mt::test::matmul(kn::unary(kn::UnaryOp::kAbs, p.a.to(mt::kF64)),
                                                kn::unary(kn::UnaryOp::kAbs, p.b.to(mt::kF64)));
    std::vector<double> allowance = abs_product.to_vector<double>();
    for (double& v : allowance) v *= 2.0 * static_cast<double>(p.a.size(1)) * 0x1p-24;
    expect_close(kernel, widened, {0, 0}, describe("bf16 kernel vs widen + sgemm: ", p.what, " ", p.a.shape(), " @ ",
                                                   p.b.shape()), allowance);
  }
}

BOOST_AUTO_TEST_CASE(gemm_bf16_reads_subnormals_as_zero_unlike_the_widening_path,
                     MT_CPU_TEST * boost::unit_test::precondition(gemm_bf16_available())) {
  // vdpbf16ps reads a subnormal bf16 operand as zero and flushes a subnormal sum to zero, whatever MXCSR says
  // (ops/cpu/gemm_bf16.h); widening to f32 keeps both. 2^-130 is a bf16 subnormal; 2^-70 · 2^-70 = 2^-140 is a
  // subnormal float.
  const Tensor tiny = mt::tensor({0x1p-130, 0x1p-70}, DType::kBF16).view({1, 2});
  const Tensor big = mt::tensor({0x1p100, 0.0, 0.0, 0x1p-70}, DType::kBF16).view({2, 2});
  const ForceBf16GemmPath kernel(Bf16GemmPath::kAvx512Bf16);
  expect_values(mt::test::matmul(tiny, big, DType::kF32), {0.0, 0.0}, kExact, "AVX512-BF16 kernel: DAZ and FTZ");
  const ForceBf16GemmPath widen(Bf16GemmPath::kWidenSgemm);
  expect_values(mt::test::matmul(tiny, big, DType::kF32), {0x1p-30, 0x1p-140}, kExact, "widen + sgemm: exact");
}

BOOST_AUTO_TEST_CASE(matmul_shape_rules, MT_CPU_TEST) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{5}, {5}},             // dot -> []
      {{5}, {5, 3}},          // vector @ matrix -> [3]
      {{4, 5}, {5}},          // matrix @ vector -> [4]
      {{5}, {2, 5, 3}},       // vector @ batch -> [2, 3]
      {{2, 4, 5}, {5}},       // batch @ vector -> [2, 4]
      {{2, 1, 4, 5}, {3, 5, 6}},  // batch broadcast -> [2, 3, 4, 6]
      {{7, 4, 5}, {5, 6}},    // a 2-D right operand: folds into one gemm
      {{4, 5}, {7, 5, 6}},    // a 2-D left operand broadcast over the batch
      {{1, 4, 5}, {3, 5, 6}}, // size-1 batch dim
      {{3, 0}, {0, 4}},       // k = 0: zeros
      {{0, 3}, {3, 4}},       // m = 0
      {{3, 4}, {4, 0}},       // n = 0
      {{0, 2, 3}, {3, 4}},    // no batches
      {{1, 1}, {1, 1}},
  };
  uint64_t seed = 30000;
  for (const Case& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF16}) {
      seed += 2;
      check_matmul(input(c.a, dtype, -1, 1, seed), input(c.b, dtype, -1, 1, seed + 1), std::nullopt,
                   describe("seed=", seed));
    }
  }
  // Batched transposed views, an expanded batch, a batch with rows that do not fold.
  const Tensor at = input({6, 9, 5}, DType::kF32, -1, 1, 41).transpose(-1, -2);  // [6, 5, 9]
  const Tensor bt = input({6, 7, 9}, DType::kF32, -1, 1, 42).transpose(-1, -2);  // [6, 9, 7]
  check_matmul(at, bt, std::nullopt, "batched transposed, seeds 41/42");
  check_matmul(input({1, 5, 9}, DType::kF64, -1, 1, 43).expand({6, 5, 9}), bt.to(DType::kF64), std::nullopt,
               "expanded batch, seed 43");
  check_matmul(input({6, 5, 20}, DType::kF32, -1, 1, 44).slice(-1, 0, 20, 2).slice(0, 0, 6, 2),
               input({10, 4}, DType::kF32, -1, 1, 45), std::nullopt, "strided batch and rows, seeds 44/45");
  // Evenly spaced rows fold into one gemm; a gap between batches must not.
  check_matmul(input({4, 6, 10}, DType::kF32, -1, 1, 46).slice(1, 0, 6, 2), input({10, 3}, DType::kF32, -1, 1, 47),
               std::nullopt, "every other row, 2-D right operand, seeds 46/47");
  check_matmul(input({4, 6, 10}, DType::kF32, -1, 1, 48).narrow(1, 0, 3), input({10, 3}, DType::kF32, -1, 1, 49),
               std::nullopt, "rows with a gap between batches, 2-D right operand, seeds 48/49");
}

BOOST_AUTO_TEST_CASE(matmul_reads_transposed_views_in_place, MT_CPU_TEST) {
  // w.t() of a contiguous w must go to BLAS as Trans, not through a copy:
  // the peak of CPU tensor memory grows by the output only.
  const Tensor a = input({512, 384}, DType::kF32, -1, 1, 51).t();  // [384, 512]
  const Tensor b = input({256, 512}, DType::kF32, -1, 1, 52).t();  // [512, 256]
  const int64_t before = mt::cpu_memory_stats().allocated_bytes;
  mt::reset_cpu_peak_memory();
  const Tensor c = mt::test::matmul(a, b);
  const int64_t growth = mt::cpu_memory_stats().peak_allocated_bytes - before;
  BOOST_TEST(growth <= 384 * 256 * 4, "matmul of transposed views allocated " << growth << " bytes; the output is "
                                                                              << 384 * 256 * 4);
  BOOST_TEST(growth >= 384 * 256 * 4, "the peak of CPU memory did not count the output itself: " << growth);
  check_matmul(a, b, std::nullopt, "transposed views, seeds 51/52");
}

BOOST_AUTO_TEST_CASE(kernel_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  // What a kernel cannot be handed without reading memory wrongly: these are bugs in an op, and the message lists
  // every argument the kernel got.
  const Tensor f32 = mt::zeros({2, 3}), f16 = mt::zeros({2, 3}, DType::kF16);
  expect_error([&] { kn::matmul(f32, f16.t(), DType::kF32); }, {"kernels::matmul: its invariant", "f16 [3, 2]"});
}

BOOST_AUTO_TEST_CASE(misuse_gets_errors_naming_op_shapes_and_dtypes, MT_CPU_TEST) {
  // The same mistakes made through what users call: each op checks its arguments once, in its forward.
  const Tensor f32 = mt::zeros({2, 3}), f16 = mt::zeros({2, 3}, DType::kF16), i64 = mt::zeros({2, 3}, DType::kI64);
  expect_error([&] { mt::matmul(mt::zeros({2, 3}), mt::zeros({4, 5})); },
               {"matmul: shapes cannot be multiplied ([2, 3] and [4, 5])"});
  expect_error([&] { mt::matmul(i64, i64.t()); }, {"matmul:", "i64"});
  expect_error([&] { mt::matmul(f32, f16.t()); }, {"matmul:", "f32", "f16", "one dtype"});
  expect_error([&] { mt::matmul(mt::zeros({2, 2, 3}), mt::zeros({3, 3, 4})); }, {"matmul:", "batch",
                                                                                "[2, 2, 3]", "[3, 3, 4]"});
  expect_error([&] { mt::matmul(mt::scalar_tensor(1.0), f32); }, {"matmul:", "at least 1 dim"});
  expect_error([&] { mt::linear(i64, i64); }, {"linear:", "floating", "i64"});
}

BOOST_AUTO_TEST_CASE(device_mismatch_names_both_devices, MT_GPU_TEST) {
  const Tensor cpu = mt::zeros({2, 3}), gpu = mt::zeros({2, 3}, mt::Device::cuda());
  expect_error([&] { mt::matmul(cpu, gpu.t()); }, {"matmul:", "cpu", "cuda:0"});
}

// ---- CUDA: the kernels against the CPU's (allocations poisoned: tests/test_util.h), the ops on the GEMM ----

BOOST_AUTO_TEST_CASE(matmul_shapes_layouts_and_dtypes, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 700;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kF64}) {
    auto draw = [&](const Shape& s) { return random(s, dtype, -1.0, 1.0, ++seed); };
    check_matmul_on_gpu(draw({64, 64}), draw({64, 64}), "one whole tile");
    check_matmul_on_gpu(draw({1, 1}), draw({1, 1}), "1x1x1");
    check_matmul_on_gpu(draw({67, 129}), draw({129, 33}), "ragged edges");
    check_matmul_on_gpu(draw({300, 257}), draw({257, 190}), "several tiles");
    check_matmul_on_gpu(draw({257, 300}).t(), draw({190, 257}).t(), "both transposed, read in place");
    check_matmul_on_gpu(draw({50, 80}).slice(1, 0, 80, 2), draw({40, 70}).slice(1, 5, 70), "sliced operands");
    check_matmul_on_gpu(draw({4, 3, 20, 30}), draw({30, 25}), "batch @ matrix (broadcast weight)");
    check_matmul_on_gpu(draw({3, 1, 20, 30}), draw({5, 30, 25}), "broadcast batch dims");
    check_matmul_on_gpu(draw({6, 30, 20}).transpose(1, 2), draw({6, 30, 25}), "batched transposed");
    check_matmul_on_gpu(draw({30}), draw({30, 25}), "1-D @ 2-D");
    check_matmul_on_gpu(draw({20, 30}), draw({30}), "2-D @ 1-D");
    check_matmul_on_gpu(draw({30}), draw({30}), "1-D @ 1-D");
    check_matmul_on_gpu(draw({2, 20, 30}), draw({30}), "batch @ 1-D");
    check_matmul_on_gpu(draw({20, 0}), draw({0, 25}), "k = 0");
    check_matmul_on_gpu(draw({0, 5}), draw({5, 25}), "m = 0");
  }
  for (DType dtype : {mt::kF16, mt::kBF16}) {
    auto draw = [&](const Shape& s) { return random(s, dtype, -1.0, 1.0, ++seed); };
    check_matmul_on_gpu(draw({100, 200}), draw({200, 70}), "f32 out", mt::kF32);
    check_matmul_on_gpu(draw({2, 100, 200}), draw({70, 200}).t(), "f32 out, transposed weight", mt::kF32);
  }
  check_matmul_on_gpu(random({40, 50}, mt::kF32, -1, 1, 801), random({50, 60}, mt::kF32, -1, 1, 802), "f16 out",
               mt::kF16);
}

BOOST_AUTO_TEST_CASE(matmul_layouts_and_batches_run_on_tensor_cores, MT_GPU_TEST) {
  mt::manual_seed(31);
  for (DType dt : {mt::kF16, mt::kBF16}) {
    const std::string wmma = std::string("wmma ") + mt::dtype_name(dt), name = mt::dtype_name(dt);
    check_gemm(cuda_randn({37, 61}, dt), cuda_randn({61, 45}, dt), wmma, bound(dt), name + " 2-D, odd sizes");
    check_gemm(cuda_randn({128, 784}, dt), cuda_randn({512, 784}, dt).t(), wmma, bound(dt), name + " x · wᵀ");
    check_gemm(cuda_randn({128, 784}, dt).t(), cuda_randn({128, 512}, dt), wmma, bound(dt), name + " xᵀ · dy");
    check_gemm(cuda_randn({3, 37, 61}, dt), cuda_randn({61, 45}, dt), wmma, bound(dt), name + " broadcast weight");
    check_gemm(cuda_randn({2, 3, 17, 33}, dt), cuda_randn({2, 3, 33, 9}, dt), wmma, bound(dt), name + " 4-D batch");
    // Batch dims that do not coalesce (a permuted batch): one GEMM launch per outer index.
    check_gemm(cuda_randn({3, 4, 16, 24}, dt).permute({1, 0, 2, 3}), cuda_randn({4, 3, 24, 8}, dt), wmma, bound(dt),
                 name + " permuted batch dims");
    check_gemm(cuda_randn({5}, dt), cuda_randn({5, 7}, dt), wmma, bound(dt), name + " 1-D left operand");
    check_gemm(cuda_randn({4, 6}, dt), cuda_randn({6}, dt), wmma, bound(dt), name + " 1-D right operand");
    check_gemm(cuda_randn({2, 0}, dt), cuda_randn({0, 3}, dt), wmma, bound(dt), name + " k = 0");
    // A column slice with a step has unit stride in neither dim: the SIMT kernel reads it in place.
    check_gemm(cuda_randn({20, 30}, dt).slice(1, 0, 30, 2), cuda_randn({15, 9}, dt), "simt f32", bound(dt),
                 name + " strided slice");
  }
  check_gemm(cuda_randn({33, 65}, mt::kF64), cuda_randn({65, 17}, mt::kF64), "simt f64", 1e-12, "f64");
}

BOOST_AUTO_TEST_CASE(f32_is_simt_unless_tf32_is_allowed, MT_GPU_TEST) {
  mt::manual_seed(32);
  const Tensor a = cuda_randn({300, 500}, mt::kF32), b = cuda_randn({500, 200}, mt::kF32);
  BOOST_REQUIRE(!mt::cuda::allow_tf32());
  check_gemm(a, b, "simt f32", bound(mt::kF32), "f32, TF32 off");
  {
    const mt::test::AllowTf32 on(true);
    check_gemm(a, b, "wmma tf32", kTf32Bound, "f32, TF32 on");
  }
  check_gemm(a, b, "simt f32", bound(mt::kF32), "f32, TF32 off again");
}

BOOST_AUTO_TEST_CASE(linear_under_autocast_fuses_the_bias_and_its_backward_matches_the_cpu, MT_GPU_TEST) {
  mt::manual_seed(33);
  for (DType low : {mt::kF16, mt::kBF16}) {
    // f32 master parameters on both devices; autocast casts them to `low` for the GEMM.
    const Tensor x0 = mt::randn({128, 784}), w0 = mt::randn({512, 784}) * 0.05, b0 = mt::randn({512});
    Tensor xs[2], ws[2], bs[2], ys[2];
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? Device::cpu() : Device::cuda();
      xs[d] = x0.to(dev).detach().requires_grad_();
      ws[d] = w0.to(dev).detach().requires_grad_();
      bs[d] = b0.to(dev).detach().requires_grad_();
      mt::amp::Autocast ac(low);
      mt::autograd::PrecisionTrace trace;
      ys[d] = mt::linear(xs[d], ws[d], bs[d]);
      if (d == 1)
        BOOST_TEST(trace.str() == std::string("cast:") + mt::dtype_name(low) + " cast:" + mt::dtype_name(low) +
                                      " cast:" + mt::dtype_name(low) + " linear:" + mt::dtype_name(low) +
                                      "[wmma " + mt::dtype_name(low) + "]",
                   "trace on CUDA: " << trace.str());
    }
    // The same f16/bf16 inputs on both sides; the CPU rounds the f32 product once, as the GEMM's epilogue does.
    BOOST_TEST(relative_error(ys[1], ys[0]) < bound(low), mt::dtype_name(low) << " linear forward");
    const Tensor dy = mt::randn({128, 512});
    ys[0].backward(dy.to(low));
    ys[1].backward(dy.to(low).to(Device::cuda()));
    // Gradients pass through one more rounding (dy, and the f16/bf16 gradient before its cast to f32).
    BOOST_TEST(relative_error(xs[1].grad(), xs[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dx");
    BOOST_TEST(relative_error(ws[1].grad(), ws[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dweight");
    BOOST_TEST(relative_error(bs[1].grad(), bs[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dbias");
  }
}

BOOST_AUTO_TEST_CASE(addmm_on_cuda_matches_the_cpu, MT_GPU_TEST) {
  mt::manual_seed(34);
  for (DType dt : {mt::kF16, mt::kBF16, mt::kF32})
    for (const auto& [m, k, n] : {std::tuple{1, 1, 1}, {7, 13, 5}, {128, 784, 512}, {128, 256, 10}, {65, 0, 33}}) {
      const Tensor a = mt::randn({m, k}).to(dt), b = mt::randn({n, k}).to(dt).t(), bias = mt::randn({n}).to(dt);
      const Tensor want = mt::kernels::addmm(bias, a, b, a.dtype());
      const Tensor got = mt::kernels::addmm(bias.to(Device::cuda()), a.to(Device::cuda()), b.to(Device::cuda()), a.dtype());
      BOOST_TEST(relative_error(got, want) < bound(dt), mt::dtype_name(dt) << " addmm " << m << "x" << k << "x" << n);
    }
}

BOOST_AUTO_TEST_SUITE_END()
