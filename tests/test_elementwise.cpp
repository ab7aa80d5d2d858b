// tests/test_elementwise.cpp — the elementwise family (ops/elementwise.cpp, ops/cpu/elementwise.cpp,
// cuda/elementwise.cu): unary, binary, scalar and where, and their in-place kernels.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64: tests/test_op_registry.cpp; CUDA against
// the CPU: tests/test_parity.cpp), the CPU kernels against float64 references (tests/reference.h), the in-place
// kernels against their out-of-place results, the errors of misuse, and the CUDA kernels against the CPU's on
// every op, dtype and layout. Op-case inputs stay away from kinks and poles: relu's 0, log/sqrt/div near 0.
#include "family_test.h"

#include <algorithm>
#include <iterator>
#include <numbers>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/ops/backend/scalar_math.h>

namespace {

/// Values in [lo, hi): away from the poles of log, sqrt, div.
mt::Tensor positive(const mt::Shape& shape, double lo = 0.5, double hi = 2.0) { return mt::uniform(shape, lo, hi); }

/// randn pushed away from 0 by at least 0.1 (relu's kink).
mt::Tensor away_from_zero(const mt::Shape& shape) {
  mt::Tensor x = mt::randn(shape, mt::kF64);
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v) e += e >= 0 ? 0.1 : -0.1;
  return mt::from_vector(v, shape, mt::kF32);
}

/// randn kept at least 0.1 away from each of `kinks` (clamp's bounds), so that neither the finite differences nor
/// an f16/bf16 rounding of the input crosses one.
mt::Tensor away_from(const mt::Shape& shape, std::vector<double> kinks) {
  std::vector<double> v = mt::randn(shape, mt::kF64).to_vector<double>();
  for (double& e : v)
    for (double k : kinks)
      if (std::abs(e - k) < 0.1) e = e >= k ? k + 0.1 + (e - k) : k - 0.1 + (e - k);
  return mt::from_vector(v, shape, mt::kF32);
}

/// A bool tensor of `shape`, true about half the time (where's condition).
mt::Tensor coin_flips(const mt::Shape& shape) { return mt::lt(mt::randn(shape), mt::zeros({})); }

}  // namespace

// ---- binary, with broadcasting and strided inputs -----------------------------------------
MT_OP_CASE({.op = "add", .label = "broadcast [3,1,5] + [4,5]",
            .f = [](const In& in) { return in[0] + in[1]; },
            .inputs = [] { return In{mt::randn({3, 1, 5}), mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "add", .label = "transposed + strided",
            .f = [](const In& in) { return mt::add(in[0], in[1]); },
            .inputs = [] {
              return In{mt::test::non_contiguous(mt::randn({4, 3}), "transposed"),
                        mt::test::non_contiguous(mt::randn({4, 3}), "strided")};
            }});
MT_OP_CASE({.op = "sub", .label = "broadcast scalar tensor",
            .f = [](const In& in) { return in[0] - in[1]; },
            .inputs = [] { return In{mt::randn({2, 3}), mt::randn({})}; }});
MT_OP_CASE({.op = "mul", .label = "broadcast [2,1] * [1,3]",
            .f = [](const In& in) { return in[0] * in[1]; },
            .inputs = [] { return In{mt::randn({2, 1}), mt::randn({1, 3})}; }});
MT_OP_CASE({.op = "mul", .label = "same tensor twice",
            .f = [](const In& in) { return in[0] * in[0]; },
            .inputs = [] { return In{mt::randn({5})}; }});
MT_OP_CASE({.op = "div", .label = "broadcast [3,4] / [4]",
            .f = [](const In& in) { return in[0] / in[1]; },
            .inputs = [] { return In{mt::randn({3, 4}), positive({4})}; }});
MT_OP_CASE({.op = "div", .label = "2 / x: the scalar a 0-d tensor of x's dtype",
            .f = [](const In& in) { return 2.0 / in[0]; },
            .inputs = [] { return In{mt::test::non_contiguous(positive({2, 3}), "strided")}; }});
MT_OP_CASE({.op = "div", .label = "strided denominator",
            .f = [](const In& in) { return mt::div(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 3}), mt::test::non_contiguous(positive({2, 3}), "strided")}; }});

// ---- with a scalar ------------------------------------------------------------------------
MT_OP_CASE({.op = "add_scalar", .label = "x + 0.5",
            .f = [](const In& in) { return in[0] + 0.5; },
            .inputs = [] { return In{mt::randn({3, 2})}; }});
MT_OP_CASE({.op = "add_scalar", .label = "1.5 - x",
            .f = [](const In& in) { return 1.5 - in[0]; },
            .inputs = [] { return In{mt::randn({3, 2})}; }});
MT_OP_CASE({.op = "mul_scalar", .label = "x * -2.5",
            .f = [](const In& in) { return in[0] * -2.5; },
            .inputs = [] { return In{mt::randn({7})}; }});
MT_OP_CASE({.op = "div_scalar", .label = "x / 3 (true division, not x * (1/3))",
            .f = [](const In& in) { return in[0] / 3.0; },
            .inputs = [] { return In{mt::randn({7})}; }});
MT_OP_CASE({.op = "pow", .label = "x^2.5 on positive x",
            .f = [](const In& in) { return mt::pow(in[0], 2.5); },
            .inputs = [] { return In{positive({3, 3})}; }});
MT_OP_CASE({.op = "pow", .label = "x^-1 and x^3",
            .f = [](const In& in) { return mt::pow(in[0], -1.0) + mt::pow(in[0], 3.0); },
            .inputs = [] { return In{positive({4})}; }});

// ---- unary --------------------------------------------------------------------------------
MT_OP_CASE({.op = "neg", .label = "strided",
            .f = [](const In& in) { return -in[0]; },
            .inputs = [] { return In{mt::test::non_contiguous(mt::randn({3, 4}), "strided")}; }});
MT_OP_CASE({.op = "exp", .label = "2-D",
            .f = [](const In& in) { return mt::exp(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; }});
MT_OP_CASE({.op = "log", .label = "positive inputs",
            .f = [](const In& in) { return mt::log(in[0]); },
            .inputs = [] { return In{positive({3, 4})}; }});
MT_OP_CASE({.op = "sqrt", .label = "positive inputs, transposed",
            .f = [](const In& in) { return mt::sqrt(in[0]); },
            .inputs = [] { return In{mt::test::non_contiguous(positive({3, 4}), "transposed")}; }});
MT_OP_CASE({.op = "relu", .label = "away from 0",
            .f = [](const In& in) { return mt::relu(in[0]); },
            .inputs = [] { return In{away_from_zero({4, 5})}; }});
MT_OP_CASE({.op = "gelu", .label = "exact (erf)",
            .f = [](const In& in) { return mt::gelu(in[0]); },
            .inputs = [] { return In{mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "gelu", .label = "tanh approximation",
            .f = [](const In& in) { return mt::gelu(in[0], "tanh"); },
            .inputs = [] { return In{mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "sigmoid", .label = "2-D",
            .f = [](const In& in) { return mt::sigmoid(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; }});
// The backward reads the saved output y, rounded to f16/bf16 like PyTorch's:
// dx = dy·(1 − y²) is off by up to |dy|·2|y|·ulp(y)/2, which is large relative
// to a small 1 − y² (|x| > 2) but bounded absolutely: |dy| < 4 here.
MT_OP_CASE({.op = "tanh", .label = "2-D",
            .f = [](const In& in) { return mt::tanh(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; },
            .f16 = mt::test::Tolerance{1e-3, 2e-3},
            .bf16 = mt::test::Tolerance{1.6e-2, 1.6e-2}});
MT_OP_CASE({.op = "abs", .label = "away from 0, strided",
            .f = [](const In& in) { return mt::abs(in[0]); },
            .inputs = [] { return In{mt::test::non_contiguous(away_from_zero({3, 4}), "strided")}; }});

// ---- clamp, maximum, minimum, where: selections, away from their kinks ------------------------
MT_OP_CASE({.op = "clamp", .label = "min and max",
            .f = [](const In& in) { return mt::clamp(in[0], -0.5, 0.75); },
            .inputs = [] { return In{away_from({4, 5}, {-0.5, 0.75})}; }});
MT_OP_CASE({.op = "clamp", .label = "min only, transposed",
            .f = [](const In& in) { return mt::clamp(in[0], 0.25); },
            .inputs = [] { return In{mt::test::non_contiguous(away_from({3, 4}, {0.25}), "transposed")}; }});
MT_OP_CASE({.op = "clamp", .label = "max only",
            .f = [](const In& in) { return mt::clamp(in[0], std::nullopt, -0.25); },
            .inputs = [] { return In{away_from({6}, {-0.25})}; }});
MT_OP_CASE({.op = "maximum", .label = "broadcast [3,1] and [1,4]",
            .f = [](const In& in) { return mt::maximum(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({3, 1}), mt::randn({1, 4})}; }});
MT_OP_CASE({.op = "minimum", .label = "strided and a 0-d tensor",
            .f = [](const In& in) { return mt::minimum(in[0], in[1]); },
            .inputs = [] { return In{mt::test::non_contiguous(mt::randn({2, 3}), "strided"), mt::randn({})}; }});
MT_OP_CASE({.op = "where", .label = "condition [3,1,4], a [2,1], b [4]",
            .f = [](const In& in) { return mt::where(in[2], in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 1}), mt::randn({4}), coin_flips({3, 1, 4})}; }});
MT_OP_CASE({.op = "where", .label = "a transposed, b a scalar",
            .f = [](const In& in) { return mt::where(in[1], in[0], -1.5); },
            .inputs = [] {
              return In{mt::test::non_contiguous(mt::randn({3, 4}), "transposed"), coin_flips({3, 4})};
            }});

// ---- the CPU kernels against float64 references -------------------------------------------

namespace {

// ---- references written out in double ------------------------------------------------

double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct UnaryCase {
  kn::UnaryOp op;
  double lo, hi;  // input range: inside the domain, away from poles
  double (*ref)(double);
};

const UnaryCase kUnaryCases[] = {
    {kn::UnaryOp::kNeg, -4, 4, [](double x) { return -x; }},
    {kn::UnaryOp::kAbs, -4, 4, [](double x) { return std::fabs(x); }},
    {kn::UnaryOp::kSign, -4, 4, [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }},
    {kn::UnaryOp::kSquare, -4, 4, [](double x) { return x * x; }},
    {kn::UnaryOp::kReciprocal, 0.25, 4, [](double x) { return 1.0 / x; }},
    {kn::UnaryOp::kExp, -8, 8, [](double x) { return std::exp(x); }},
    {kn::UnaryOp::kLog, 0.01, 100, [](double x) { return std::log(x); }},
    {kn::UnaryOp::kSqrt, 0, 100, [](double x) { return std::sqrt(x); }},
    {kn::UnaryOp::kRsqrt, 0.01, 100, [](double x) { return 1.0 / std::sqrt(x); }},
    {kn::UnaryOp::kRelu, -4, 4, [](double x) { return x < 0 ? 0.0 : x; }},
    {kn::UnaryOp::kGelu, -6, 6, ref_gelu},
    {kn::UnaryOp::kGeluTanh, -6, 6, ref_gelu_tanh},
    {kn::UnaryOp::kSigmoid, -20, 20, ref_sigmoid},
    {kn::UnaryOp::kTanh, -5, 5, [](double x) { return std::tanh(x); }},
};

struct BinaryCase {
  kn::BinaryOp op;
  double a_lo, a_hi, b_lo, b_hi;
  double (*ref)(double, double);
  bool exact;  // correctly rounded: must equal the double result rounded once
};

const BinaryCase kBinaryCases[] = {
    {kn::BinaryOp::kAdd, -4, 4, -4, 4, [](double a, double b) { return a + b; }, true},
    {kn::BinaryOp::kSub, -4, 4, -4, 4, [](double a, double b) { return a - b; }, true},
    {kn::BinaryOp::kMul, -4, 4, -4, 4, [](double a, double b) { return a * b; }, true},
    {kn::BinaryOp::kDiv, -4, 4, 0.25, 4, [](double a, double b) { return a / b; }, true},
    {kn::BinaryOp::kMaximum, -4, 4, -4, 4, [](double a, double b) { return std::max(a, b); }, true},
    {kn::BinaryOp::kMinimum, -4, 4, -4, 4, [](double a, double b) { return std::min(a, b); }, true},
    {kn::BinaryOp::kPow, 0.5, 2, -2, 2, [](double a, double b) { return std::pow(a, b); }, false},
    {kn::BinaryOp::kReluBackward, -4, 4, -4, 4, [](double dy, double x) { return x > 0 ? dy : 0.0; }, true},
    {kn::BinaryOp::kGeluBackward, -4, 4, -6, 6,
     [](double dy, double x) {
       return dy * (0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi));
     },
     false},
    {kn::BinaryOp::kGeluTanhBackward, -4, 4, -6, 6,
     [](double dy, double x) {
       const double c = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(c * (x + 0.044715 * x * x * x));
       return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x));
     },
     false},
    {kn::BinaryOp::kSigmoidBackward, -4, 4, 0, 1, [](double dy, double y) { return dy * y * (1.0 - y); }, false},
    {kn::BinaryOp::kTanhBackward, -4, 4, -1, 1, [](double dy, double y) { return dy * (1.0 - y * y); }, false},
};

struct BroadcastCase {
  Shape a, b;
};
const BroadcastCase kBroadcastCases[] = {
    {{3, 1, 5}, {4, 5}}, {{4, 5}, {3, 1, 5}}, {{}, {7}}, {{7}, {}}, {{}, {}},        {{0, 3}, {3}},
    {{1}, {1}},          {{7}, {7}},          {{1023}, {1}}, {{65537}, {65537}}, {{2, 1}, {1, 3}},
};

/// The elements of `t`, broadcast to `shape`, in row-major order, as doubles.
std::vector<double> broadcast_values(const Tensor& t, const Shape& shape) { return values(t.expand(shape)); }

// ---- the CUDA kernels against the CPU's --------------------------------------------------------
//
// Every case runs one kernel through ops/backend/kernels.h twice, on a CPU tensor and on the same values moved to
// the GPU, and compares the results with the dtype's tolerance (the CPU is the reference). Shapes cover both
// kernel paths of cuda/elementwise.cu: dense and 16-byte aligned (the vector path, with its scalar tail: 1, 7,
// 1023, 65537 and 1<<22 elements) and everything else (transposed, sliced with a step, broadcast, and views offset
// by one element so no vector load is aligned). Allocations are poisoned (tests/test_util.h), so an output element
// a kernel forgot to write fails the comparison.

// Inputs away from each op's poles and kinks: positive for log/sqrt/rsqrt/reciprocal/pow.
bool needs_positive(kn::UnaryOp op) {
  using enum kn::UnaryOp;
  return op == kLog || op == kSqrt || op == kRsqrt || op == kReciprocal;
}

constexpr kn::UnaryOp kUnaryOps[] = {
    kn::UnaryOp::kNeg,   kn::UnaryOp::kAbs,  kn::UnaryOp::kSign,     kn::UnaryOp::kSquare,  kn::UnaryOp::kReciprocal,
    kn::UnaryOp::kExp,   kn::UnaryOp::kLog,  kn::UnaryOp::kSqrt,     kn::UnaryOp::kRsqrt,   kn::UnaryOp::kRelu,
    kn::UnaryOp::kGelu,  kn::UnaryOp::kGeluTanh, kn::UnaryOp::kSigmoid, kn::UnaryOp::kTanh};
constexpr kn::BinaryOp kBinaryOps[] = {
    kn::BinaryOp::kAdd, kn::BinaryOp::kSub, kn::BinaryOp::kMul, kn::BinaryOp::kDiv, kn::BinaryOp::kMaximum,
    kn::BinaryOp::kMinimum, kn::BinaryOp::kPow, kn::BinaryOp::kReluBackward, kn::BinaryOp::kGeluBackward,
    kn::BinaryOp::kGeluTanhBackward, kn::BinaryOp::kSigmoidBackward, kn::BinaryOp::kTanhBackward,
    kn::BinaryOp::kEq, kn::BinaryOp::kNe, kn::BinaryOp::kLt, kn::BinaryOp::kLe, kn::BinaryOp::kGt, kn::BinaryOp::kGe};
constexpr kn::ScalarOp kScalarOps[] = {kn::ScalarOp::kAdd,  kn::ScalarOp::kMul,  kn::ScalarOp::kPow,
                                      kn::ScalarOp::kRsub, kn::ScalarOp::kRdiv, kn::ScalarOp::kDiv,
                                      kn::ScalarOp::kMaximum, kn::ScalarOp::kMinimum};

static_assert(std::size(kUnaryOps) == 14 && std::size(kBinaryOps) == 18 && std::size(kScalarOps) == 8,
              "a kernel enum grew: add its ops to these lists");

/// Views of a dense (2n) tensor of n elements each: the first n (dense, aligned), elements 1..n (dense,
/// misaligned by one element), every second element (a step), and an (r, c) transpose.
Tensor view_aligned(const Tensor& t) { return t.slice(0, 0, t.size(0) / 2); }
Tensor view_misaligned(const Tensor& t) { return t.slice(0, 1, t.size(0) / 2 + 1); }
Tensor view_step(const Tensor& t) { return t.slice(0, 0, t.size(0), 2); }

std::string describe_case(const char* op, DType dtype, const Shape& shape, const char* layout) {
  std::ostringstream os;
  os << op << " (dtype " << dtype << ", shape " << shape << ", " << layout << ")";
  return os.str();
}

void check_unary(kn::UnaryOp op, DType dtype, const Tensor& x, const char* layout) {
  const Tensor want = kn::unary(op, x);
  const Tensor got = kn::unary(op, same_view_on_gpu(x));
  expect_close(got, want, mt::test::tolerance(dtype), describe_case(kn::name(op), dtype, x.shape(), layout));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(elementwise)

// ---- unary -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(unary_ops_match_f64_references, MT_CPU_TEST) {
  const Shape shapes[] = {{0}, {1}, {7}, {1023}, {65537}, {}, {3, 4, 5}};
  uint64_t seed = 100;
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kFloatTypes) {
      const Tolerance tol = mt::test::tolerance(dtype);
      auto run = [&](const Tensor& x, const std::string& layout) {
        const std::string config = describe("op=", kn::name(c.op), " shape=", x.shape(), " layout=", layout,
                                            " dtype=", dtype, " seed=", seed);
        const Tensor y = kn::unary(c.op, x);
        expect_shape(y, x.shape(), dtype, config);
        std::vector<double> want = values(x);
        for (double& v : want) v = c.ref(v);
        expect_values(y, want, tol, config);
      };
      for (const Shape& s : shapes) run(input(s, dtype, c.lo, c.hi, ++seed), "contiguous");
      for (Layout l : {Layout::kTransposed, Layout::kStrided, Layout::kExpanded})
        run(input({37, 29}, dtype, c.lo, c.hi, ++seed, l), layout_name(l));
    }
  }
}

BOOST_AUTO_TEST_CASE(unary_edge_values, MT_CPU_TEST) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = mt::tensor({-inf, -1000.0, -0.0, 0.0, 1000.0, inf, nan});
  // sigmoid is finite and exact at the extremes (no exp overflow), NaN stays NaN.
  expect_values(kn::unary(kn::UnaryOp::kSigmoid, x), {0, 0, 0.5, 0.5, 1, 1, nan}, kExact, "sigmoid edges");
  expect_values(kn::unary(kn::UnaryOp::kRelu, x), {0, 0, 0, 0, 1000, inf, nan}, kExact, "relu edges");
  // relu's gradient is 0 where x <= 0 and dy elsewhere, a NaN x included (PyTorch's threshold_backward), in every
  // floating dtype (f16/bf16 choose bits; f32/f64 compare).
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor dy = mt::full(x.shape(), 2.0, dtype);
    expect_values(kn::binary(kn::BinaryOp::kReluBackward, dy, x.to(dtype)), {0, 0, 0, 0, 2, 2, 2}, kExact,
                  describe("relu backward edges ", dtype));
  }
  expect_values(kn::unary(kn::UnaryOp::kSign, x), {-1, -1, 0, 0, 1, 1, nan}, kExact, "sign edges");
  expect_values(kn::unary(kn::UnaryOp::kTanh, x), {-1, -1, 0, 0, 1, 1, nan}, kExact, "tanh edges");
  expect_values(kn::unary(kn::UnaryOp::kGelu, x), {nan, -0.0, 0, 0, 1000, inf, nan}, mt::test::tolerance(DType::kF64), "gelu edges");
  BOOST_TEST(!std::signbit(kn::unary(kn::UnaryOp::kAbs, x).at<double>({2})), "abs(-0) must be +0");
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    expect_values(kn::unary(kn::UnaryOp::kSigmoid, x.to(dtype)), {0, 0, 0.5, 0.5, 1, 1, nan}, kExact,
                  describe("sigmoid edges ", dtype));
}

// relu and its backward on f16/bf16 pick bits instead of widening (ops/cpu/elementwise.cpp): every pattern against
// the widened path, written out here element by element (widen, the f32 formula, round back: NaNs come back quiet).
template <class T>
void expect_relu_bits_as_widened(const char* name) {
  std::vector<T> every(65536);
  for (uint32_t i = 0; i < 65536; ++i) every[i] = T::from_bits(static_cast<uint16_t>(i));
  auto widened_relu = [](T v) { return T(mt::math::relu(static_cast<float>(v))); };
  auto widened_backward = [](T dy, T x) {
    return T(mt::math::relu_backward(static_cast<float>(dy), static_cast<float>(x)));
  };
  // The other operand of the backward: zeros, ones, infinities, subnormals, quiet and signalling NaNs, both signs.
  const float kInf = std::numeric_limits<float>::infinity();
  std::vector<T> few = {T(0.0f), T(-0.0f), T(1.0f), T(-1.0f), T(kInf), T(-kInf), T::from_bits(0x0001),
                        T::from_bits(0x8001)};
  for (uint16_t nan : {std::is_same_v<T, mt::Half> ? 0x7e00 : 0x7fc0, std::is_same_v<T, mt::Half> ? 0x7c01 : 0x7f81})
    few.push_back(T::from_bits(nan)), few.push_back(T::from_bits(static_cast<uint16_t>(nan | 0x8000)));
  int64_t differ = 0;
  auto check = [&](const char* what, const std::vector<T>& got, const std::vector<T>& want) {
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].bits != want[i].bits && ++differ <= 5)
        BOOST_TEST_MESSAGE(name << " " << what << " [" << i << "]: bits " << std::hex << got[i].bits << ", widened "
                                << want[i].bits);
  };
  const Tensor x = mt::from_vector<T>(every);
  std::vector<T> want(65536);
  for (size_t i = 0; i < every.size(); ++i) want[i] = widened_relu(every[i]);
  check("relu", kn::unary(kn::UnaryOp::kRelu, x).template to_vector<T>(), want);
  for (T other : few) {
    const Tensor same = mt::from_vector<T>(std::vector<T>(every.size(), other));
    for (size_t i = 0; i < every.size(); ++i) want[i] = widened_backward(every[i], other);
    check("relu_backward(every dy, x)", kn::binary(kn::BinaryOp::kReluBackward, x, same).template to_vector<T>(), want);
    for (size_t i = 0; i < every.size(); ++i) want[i] = widened_backward(other, every[i]);
    check("relu_backward(dy, every x)", kn::binary(kn::BinaryOp::kReluBackward, same, x).template to_vector<T>(), want);
  }
  BOOST_TEST(differ == 0);
}

BOOST_AUTO_TEST_CASE(relu_on_sixteen_bit_patterns_is_the_widened_relu, MT_CPU_TEST) {
  expect_relu_bits_as_widened<mt::Half>("f16");
  expect_relu_bits_as_widened<mt::BFloat16>("bf16");
}

BOOST_AUTO_TEST_CASE(unary_integer_ops, MT_CPU_TEST) {
  for (DType dtype : {DType::kI64, DType::kI32}) {
    const Tensor x = mt::randint(-1000, 1000, {5, 13}, dtype).transpose(0, 1);
    const std::vector<double> xv = values(x);
    auto ref = [&](double (*f)(double)) {
      std::vector<double> r = xv;
      for (double& v : r) v = f(v);
      return r;
    };
    const std::string config = describe("dtype=", dtype, " shape=", x.shape(), " transposed");
    expect_values(kn::unary(kn::UnaryOp::kNeg, x), ref([](double v) { return -v; }), kExact, "neg " + config);
    expect_values(kn::unary(kn::UnaryOp::kAbs, x), ref([](double v) { return std::fabs(v); }), kExact, "abs " + config);
    expect_values(kn::unary(kn::UnaryOp::kSign, x), ref([](double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }), kExact, "sign " + config);
    expect_values(kn::unary(kn::UnaryOp::kSquare, x), ref([](double v) { return v * v; }), kExact,
                  "square " + config);
    BOOST_TEST((kn::unary(kn::UnaryOp::kNeg, x).dtype() == dtype));
  }
  // u8 wraps modulo 256, like PyTorch.
  const Tensor u = mt::tensor<uint8_t>({0, 1, 200});
  expect_values(kn::unary(kn::UnaryOp::kNeg, u), {0, 255, 56}, kExact, "neg u8");
  expect_values(kn::unary(kn::UnaryOp::kSquare, u), {0, 1, 64}, kExact, "square u8");
}

// ---- binary ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(binary_ops_broadcast_and_match_f64_references, MT_CPU_TEST) {
  uint64_t seed = 1000;
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kFloatTypes) {
      const Tolerance tol = mt::test::tolerance(dtype);
      auto run = [&](const Tensor& a, const Tensor& b, const std::string& layout) {
        const Shape shape = mt::broadcast_shapes(a.shape(), b.shape(), "test");
        const std::string config = describe("op=", kn::name(c.op), " shapes=", a.shape(), " and ", b.shape(),
                                            " layout=", layout, " dtype=", dtype, " seed=", seed);
        const Tensor y = kn::binary(c.op, a, b);
        expect_shape(y, shape, dtype, config);
        const std::vector<double> av = broadcast_values(a, shape), bv = broadcast_values(b, shape);
        std::vector<double> want(av.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(dtype, c.ref(av[i], bv[i]));
        expect_values(y, want, c.exact ? kExact : tol, config);
      };
      for (const BroadcastCase& bc : kBroadcastCases) {
        const Tensor a = input(bc.a, dtype, c.a_lo, c.a_hi, ++seed);
        run(a, input(bc.b, dtype, c.b_lo, c.b_hi, ++seed), "contiguous");
      }
      for (Layout l : {Layout::kTransposed, Layout::kStrided, Layout::kExpanded}) {
        const Tensor a = input({29, 37}, dtype, c.a_lo, c.a_hi, ++seed, l);
        run(a, input({29, 37}, dtype, c.b_lo, c.b_hi, ++seed), describe(layout_name(l), " and contiguous"));
        const Tensor a2 = input({29, 37}, dtype, c.a_lo, c.a_hi, ++seed);
        run(a2, input({29, 37}, dtype, c.b_lo, c.b_hi, ++seed, l), describe("contiguous and ", layout_name(l)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(binary_integer_ops_and_comparisons, MT_CPU_TEST) {
  const kn::BinaryOp arithmetic[] = {kn::BinaryOp::kAdd, kn::BinaryOp::kSub, kn::BinaryOp::kMul,
                                     kn::BinaryOp::kMaximum, kn::BinaryOp::kMinimum};
  double (*const arithmetic_ref[])(double, double) = {
      [](double a, double b) { return a + b; }, [](double a, double b) { return a - b; },
      [](double a, double b) { return a * b; }, [](double a, double b) { return std::max(a, b); },
      [](double a, double b) { return std::min(a, b); }};
  for (DType dtype : {DType::kI64, DType::kI32}) {
    const Tensor a = mt::randint(-1000, 1000, {3, 1, 5}, dtype), b = mt::randint(-1000, 1000, {4, 5}, dtype);
    const Shape shape{3, 4, 5};
    const std::vector<double> av = broadcast_values(a, shape), bv = broadcast_values(b, shape);
    for (size_t o = 0; o < std::size(arithmetic); ++o) {
      std::vector<double> want(av.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = arithmetic_ref[o](av[i], bv[i]);
      expect_values(kn::binary(arithmetic[o], a, b), want, kExact, describe(kn::name(arithmetic[o]), " ", dtype));
    }
  }
  // u8 wraps.
  expect_values(kn::binary(kn::BinaryOp::kAdd, mt::tensor<uint8_t>({200, 3}), mt::tensor<uint8_t>({100, 4})), {44, 7},
                kExact, "add u8");

  // Comparisons: every dtype, many ties (small integer values), result bool.
  const kn::BinaryOp comparisons[] = {kn::BinaryOp::kEq, kn::BinaryOp::kNe, kn::BinaryOp::kLt,
                                      kn::BinaryOp::kLe, kn::BinaryOp::kGt, kn::BinaryOp::kGe};
  bool (*const comparison_ref[])(double, double) = {
      [](double a, double b) { return a == b; }, [](double a, double b) { return a != b; },
      [](double a, double b) { return a < b; },  [](double a, double b) { return a <= b; },
      [](double a, double b) { return a > b; },  [](double a, double b) { return a >= b; }};
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8,
                      DType::kBool}) {
    const int64_t hi = dtype == DType::kBool ? 2 : 4;
    const Tensor a = mt::randint(0, hi, {6, 1, 7}, dtype, nullptr), b = mt::randint(0, hi, {5, 7}, dtype, nullptr);
    const Shape shape{6, 5, 7};
    const std::vector<double> av = broadcast_values(a, shape), bv = broadcast_values(b, shape);
    for (size_t o = 0; o < std::size(comparisons); ++o) {
      std::vector<double> want(av.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = comparison_ref[o](av[i], bv[i]) ? 1.0 : 0.0;
      const Tensor got = kn::binary(comparisons[o], a, b);
      expect_shape(got, shape, DType::kBool, describe(kn::name(comparisons[o]), " ", dtype));
      expect_values(got, want, kExact, describe(kn::name(comparisons[o]), " ", dtype));
    }
  }
  // NaN compares unequal to everything, itself included.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor n = mt::tensor({nan, 1.0}, DType::kF16);
  expect_values(kn::binary(kn::BinaryOp::kEq, n, n), {0, 1}, kExact, "eq NaN");
  expect_values(kn::binary(kn::BinaryOp::kNe, n, n), {1, 0}, kExact, "ne NaN");
  expect_values(kn::binary(kn::BinaryOp::kMaximum, n, mt::tensor({0.0, nan}, DType::kF16)), {nan, nan}, kExact,
                "maximum propagates NaN");
}

BOOST_AUTO_TEST_CASE(large_elementwise_is_parallel_and_correct, MT_CPU_TEST) {
  // 2^21 + 3 elements: many OpenMP chunks, a ragged last one, a strided operand.
  const int64_t n = (1 << 21) + 3;
  const Tensor a = input({n}, DType::kF32, -4, 4, 7);
  const Tensor b = input({2 * n + 1}, DType::kF32, -4, 4, 8).slice(0, 1, 2 * n + 1, 2);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> want(av.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(DType::kF32, av[i] * bv[i]);
  expect_values(kn::binary(kn::BinaryOp::kMul, a, b), want, kExact, "mul f32 large, strided b, seed=7/8");
}

// ---- scalar and where --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(scalar_ops_match_f64_references, MT_CPU_TEST) {
  struct Case {
    kn::ScalarOp op;
    double s, lo, hi;
    double (*ref)(double, double);
    bool exact;  // s is exact in every dtype and the op is correctly rounded
  };
  const Case cases[] = {
      {kn::ScalarOp::kAdd, 0.5, -4, 4, [](double x, double s) { return x + s; }, true},
      {kn::ScalarOp::kMul, 3.0, -4, 4, [](double x, double s) { return x * s; }, true},
      {kn::ScalarOp::kPow, 2.0, -4, 4, [](double x, double s) { return std::pow(x, s); }, false},
      {kn::ScalarOp::kPow, 0.5, 0, 4, [](double x, double s) { return std::pow(x, s); }, false},
      {kn::ScalarOp::kRsub, 1.5, -4, 4, [](double x, double s) { return s - x; }, true},
      {kn::ScalarOp::kRdiv, 2.0, 0.25, 4, [](double x, double s) { return s / x; }, true},
      {kn::ScalarOp::kDiv, 4.0, -4, 4, [](double x, double s) { return x / s; }, true},
      {kn::ScalarOp::kMaximum, 0.25, -4, 4, [](double x, double s) { return std::max(x, s); }, true},
      {kn::ScalarOp::kMinimum, -0.25, -4, 4, [](double x, double s) { return std::min(x, s); }, true},
  };
  uint64_t seed = 5000;
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (Layout l : {Layout::kContiguous, Layout::kTransposed}) {
        const Tensor x = input({33, 65}, dtype, c.lo, c.hi, ++seed, l);
        const std::string config = describe("op=", kn::name(c.op), " s=", c.s, " shape=", x.shape(), " layout=",
                                            layout_name(l), " dtype=", dtype, " seed=", seed);
        const Tensor y = kn::scalar(c.op, x, c.s);
        expect_shape(y, x.shape(), dtype, config);
        std::vector<double> want = values(x);
        for (double& v : want) v = round_to(dtype, c.ref(v, c.s));
        expect_values(y, want, c.exact ? kExact : mt::test::tolerance(dtype), config);
      }
    }
  }
  // A scalar that is not exact in the dtype is converted to opmath first, like PyTorch: 0.1 in f32.
  const Tensor x = mt::tensor({1.0f, 3.0f});
  expect_values(kn::scalar(kn::ScalarOp::kMul, x, 0.1), {1.0f * 0.1f, 3.0f * 0.1f}, kExact, "mul 0.1 f32");
  // Integers: integral scalars only.
  const Tensor i = mt::tensor<int64_t>({-3, 0, 7});
  expect_values(kn::scalar(kn::ScalarOp::kAdd, i, 5), {2, 5, 12}, kExact, "add_scalar i64");
  expect_values(kn::scalar(kn::ScalarOp::kMul, i, -2), {6, 0, -14}, kExact, "mul_scalar i64");
  expect_values(kn::scalar(kn::ScalarOp::kRsub, i, 1), {4, 1, -6}, kExact, "rsub_scalar i64");
  expect_values(kn::scalar(kn::ScalarOp::kMaximum, i, 0), {0, 0, 7}, kExact, "maximum_scalar i64");
  BOOST_TEST((kn::scalar(kn::ScalarOp::kAdd, i, 5).dtype() == DType::kI64));
}

BOOST_AUTO_TEST_CASE(where_selects_with_broadcast, MT_CPU_TEST) {
  const Shape shape{3, 4, 5};
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8,
                      DType::kBool}) {
    const Tensor cond = mt::randint(0, 2, {3, 1, 5}).to(DType::kBool);
    const int64_t hi = dtype == DType::kBool ? 2 : 100;
    const Tensor a = mt::randint(0, hi, {4, 5}, dtype).transpose(0, 1).contiguous().transpose(0, 1);
    const Tensor b = mt::randint(0, hi, {}, dtype);
    const Tensor y = kn::where(cond, a, b);
    const std::string config = describe("where dtype=", dtype, " cond [3, 1, 5], a [4, 5] (transposed), b []");
    expect_shape(y, shape, dtype, config);
    const std::vector<double> cv = broadcast_values(cond, shape), av = broadcast_values(a, shape),
                              bv = broadcast_values(b, shape);
    std::vector<double> want(cv.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = cv[i] != 0 ? av[i] : bv[i];
    expect_values(y, want, kExact, config);
  }
  // NaN payloads pass through untouched.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_values(kn::where(mt::tensor({true, false}), mt::tensor({nan, 1.0}), mt::tensor({2.0, nan})), {nan, nan}, kExact, "where NaN");
}

// ---- in place --------------------------------------------------------------------------------------

// unary_, binary_ and scalar_ write their first argument: bit for bit what the out-of-place kernel returns for the
// same operands (one formula, one rounding), and the target's version moves on by one (so a tensor saved for
// backward that they overwrite is caught), the operand's does not.

BOOST_AUTO_TEST_CASE(in_place_unary_matches_unary, MT_CPU_TEST) {
  uint64_t seed = 40000;
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kFloatTypes) {
      auto check = [&](const Tensor& x, const std::string& layout) {
        const std::string config = describe("unary_ op=", kn::name(c.op), " shape=", x.shape(), " layout=", layout,
                                            " dtype=", dtype, " seed=", seed);
        const Tensor want = kn::unary(c.op, x);
        const uint64_t version = x.version();
        kn::unary_(c.op, x);
        expect_same_bits(x, want, config);
        BOOST_TEST(x.version() == version + 1, config << ": version " << x.version() << ", was " << version);
      };
      for (const Shape& s : {Shape{}, Shape{0}, Shape{1023}}) check(input(s, dtype, c.lo, c.hi, ++seed), "contiguous");
      for (Layout l : {Layout::kTransposed, Layout::kStrided})
        check(input({17, 23}, dtype, c.lo, c.hi, ++seed, l), layout_name(l));
    }
  }
  // The ops that take integers.
  for (kn::UnaryOp op : {kn::UnaryOp::kNeg, kn::UnaryOp::kAbs, kn::UnaryOp::kSign, kn::UnaryOp::kSquare}) {
    const Tensor x = mt::randint(-1000, 1000, {13, 5}, DType::kI64).transpose(0, 1);
    const Tensor want = kn::unary(op, x);
    kn::unary_(op, x);
    expect_same_bits(x, want, describe("unary_ op=", kn::name(op), " i64 transposed"));
  }
}

BOOST_AUTO_TEST_CASE(in_place_binary_matches_binary, MT_CPU_TEST) {
  uint64_t seed = 41000;
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kFloatTypes) {
      auto check = [&](const Tensor& a, const Tensor& b, const std::string& operands) {
        const std::string config =
            describe("binary_ op=", kn::name(c.op), " ", operands, " dtype=", dtype, " seed=", seed);
        const Tensor want = kn::binary(c.op, a, b);
        const uint64_t version = a.version(), b_version = b.version();
        kn::binary_(c.op, a, b);
        expect_same_bits(a, want, config);
        BOOST_TEST(a.version() == version + 1, config << ": version " << a.version() << ", was " << version);
        if (!b.is_same(a)) BOOST_TEST(b.version() == b_version, config << ": the operand's version moved");
      };
      // b broadcast over a's rows, over its columns, as a 0-d tensor; a transposed and a strided target.
      const auto operand = [&](const Shape& shape, double lo, double hi, Layout layout = Layout::kContiguous) {
        return input(shape, dtype, lo, hi, ++seed, layout);
      };
      Tensor a = operand({17, 23}, c.a_lo, c.a_hi);
      check(a, operand({23}, c.b_lo, c.b_hi), "a [17, 23], b [23]");
      a = operand({17, 23}, c.a_lo, c.a_hi, Layout::kTransposed);
      check(a, operand({17, 1}, c.b_lo, c.b_hi), "a [17, 23] transposed, b [17, 1]");
      a = operand({17, 23}, c.a_lo, c.a_hi, Layout::kStrided);
      check(a, operand({}, c.b_lo, c.b_hi), "a [17, 23] strided, b []");
      // b is a itself (gradient accumulation's grad += grad): values inside both operands' ranges.
      a = operand({17, 23}, std::max(c.a_lo, c.b_lo), std::min(c.a_hi, c.b_hi));
      check(a, a, "b = a [17, 23]");
    }
  }
  // Integers, with a broadcast operand.
  const Tensor a = mt::randint(-1000, 1000, {4, 5}, DType::kI32), b = mt::randint(-1000, 1000, {5}, DType::kI32);
  const Tensor want = kn::binary(kn::BinaryOp::kAdd, a, b);
  kn::binary_(kn::BinaryOp::kAdd, a, b);
  expect_same_bits(a, want, "binary_ add i32 [4, 5] and [5]");
}

BOOST_AUTO_TEST_CASE(in_place_scalar_matches_scalar, MT_CPU_TEST) {
  struct Case {
    kn::ScalarOp op;
    double s, lo, hi;
  };
  const Case cases[] = {
      {kn::ScalarOp::kAdd, 0.5, -4, 4},   {kn::ScalarOp::kMul, 0.1, -4, 4},      {kn::ScalarOp::kPow, 2.5, 0.25, 4},
      {kn::ScalarOp::kRsub, 1.5, -4, 4},  {kn::ScalarOp::kRdiv, 2.0, 0.25, 4},   {kn::ScalarOp::kDiv, 3.0, -4, 4},
      {kn::ScalarOp::kMaximum, 0.25, -4, 4}, {kn::ScalarOp::kMinimum, -0.25, -4, 4},
  };
  uint64_t seed = 42000;
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (Layout l : {Layout::kContiguous, Layout::kTransposed, Layout::kStrided}) {
        const Tensor x = input({33, 65}, dtype, c.lo, c.hi, ++seed, l);
        const std::string config = describe("scalar_ op=", kn::name(c.op), " s=", c.s, " layout=", layout_name(l),
                                            " dtype=", dtype, " seed=", seed);
        const Tensor want = kn::scalar(c.op, x, c.s);
        const uint64_t version = x.version();
        kn::scalar_(c.op, x, c.s);
        expect_same_bits(x, want, config);
        BOOST_TEST(x.version() == version + 1, config << ": version " << x.version() << ", was " << version);
      }
    }
  }
  // Integers: integral scalars.
  const Tensor i = mt::randint(-1000, 1000, {7, 9}, DType::kI64);
  const Tensor want = kn::scalar(kn::ScalarOp::kMul, i, -3);
  kn::scalar_(kn::ScalarOp::kMul, i, -3);
  expect_same_bits(i, want, "scalar_ mul_scalar i64");
}

// ---- misuse ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(kernel_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  // What a kernel cannot be handed without reading memory wrongly: these are bugs in an op, and the message lists
  // every argument the kernel got.
  const Tensor f32 = mt::zeros({2, 3}), f16 = mt::zeros({2, 3}, DType::kF16), i64 = mt::zeros({2, 3}, DType::kI64);
  expect_error([&] { kn::binary(kn::BinaryOp::kAdd, f32, f16); },
               {"kernels::binary: its invariant", "op = add", "a = f32 [2, 3] on cpu", "b = f16 [2, 3] on cpu"});
  expect_error([&] { kn::binary(kn::BinaryOp::kDiv, i64, i64); }, {"kernels::binary: its invariant", "op = div"});
  expect_error([&] { kn::unary(kn::UnaryOp::kExp, i64); }, {"kernels::unary: its invariant", "x = i64 [2, 3]"});
  expect_error([&] { kn::unary(kn::UnaryOp::kNeg, mt::zeros({2}, DType::kBool)); }, {"kernels::unary:", "bool"});
  expect_error([&] { kn::scalar(kn::ScalarOp::kAdd, i64, 0.5); }, {"kernels::scalar: its invariant", "s = 0.5"});
  expect_error([&] { kn::where(f32, f32, f32); }, {"kernels::where: its invariant", "cond = f32"});
  expect_error([&] { kn::where(mt::zeros({2, 3}, DType::kBool), f32, f16); }, {"kernels::where:", "f32", "f16"});
  expect_error([&] { kn::unary(kn::UnaryOp::kRelu, Tensor()); }, {"kernels::unary:", "x = undefined"});
  // In place: the target must own its elements, the operand must not overlap it (except as the very same view).
  const Tensor target = mt::zeros({2, 3});
  expect_error([&] { kn::binary_(kn::BinaryOp::kAdd, mt::zeros({3}).expand({2, 3}), f32); },
               {"kernels::binary_: its invariant"});
  expect_error([&] { kn::binary_(kn::BinaryOp::kAdd, f32, mt::zeros({4, 2, 3})); }, {"kernels::binary_:"});
  expect_error([&] { kn::binary_(kn::BinaryOp::kAdd, target, target.t().t().slice(1, 0, 3, 1).slice(0, 1, 2)); },
               {"kernels::binary_:"});
  expect_error([&] { kn::binary_(kn::BinaryOp::kEq, f32, f32); }, {"kernels::binary_:"});
  BOOST_CHECK_NO_THROW(kn::binary_(kn::BinaryOp::kAdd, target, target));
}

BOOST_AUTO_TEST_CASE(misuse_gets_errors_naming_op_shapes_and_dtypes, MT_CPU_TEST) {
  // The same mistakes made through what users call: each op checks its arguments once, in its forward.
  const Tensor f32 = mt::zeros({2, 3}), i64 = mt::zeros({2, 3}, DType::kI64);
  expect_error([&] { mt::mul(f32, mt::zeros({4})); }, {"mul: shapes [2, 3] and [4]", "cannot be broadcast"});
  expect_error([&] { mt::div(i64, i64); }, {"div: expected a floating dtype", "i64"});
  expect_error([&] { mt::exp(i64); }, {"exp: expected a floating dtype", "i64", "[2, 3]"});
  expect_error([&] { mt::neg(mt::zeros({2}, DType::kBool)); }, {"neg:", "bool"});
  expect_error([&] { mt::add(i64, 0.5); }, {"add_scalar: the scalar 0.5 is not an integer", "i64"});
  expect_error([&] { mt::relu(Tensor()); }, {"relu:", "undefined"});
  expect_error([&] { mt::gelu(f32, "fast"); }, {"gelu: approximate must be \"none\" or \"tanh\", got \"fast\""});
  expect_error([&] { mt::clamp(f32, std::nullopt); }, {"clamp: at least one of min and max must be given"});
  expect_error([&] { mt::clamp(i64, 0.5); }, {"clamp: the scalar 0.5 is not an integer", "i64"});
  // A bound the integer dtype cannot hold, as PyTorch's checked conversion ("value cannot be converted to type int
  // without overflow"): wrapped, 3e9 would clamp every i32 to -1294967296. u8 bounds may be negative down to -255,
  // which wrap (PyTorch's clamp(x_u8, min=-1) is 255).
  const Tensor i32 = mt::full({2}, 5, DType::kI32), u8 = mt::full({2}, 5, DType::kU8);
  expect_error([&] { mt::clamp(i32, std::nullopt, 3e9); }, {"clamp: the bound 3e+09", "i32", "overflow", "[2]"});
  expect_error([&] { mt::clamp(i32, -2147483649.0); }, {"clamp: the bound", "i32", "overflow"});
  expect_error([&] { mt::clamp(u8, std::nullopt, 256); }, {"clamp: the bound 256", "u8", "overflow"});
  expect_error([&] { mt::clamp(u8, -256); }, {"clamp: the bound -256", "u8", "overflow"});
  BOOST_TEST(mt::clamp(i32, -2147483648.0, 2147483647.0).to_vector<int64_t>() == std::vector<int64_t>({5, 5}));
  BOOST_TEST(mt::clamp(u8, -1).to_vector<int64_t>() == std::vector<int64_t>({255, 255}));
  BOOST_TEST(mt::clamp(u8, std::nullopt, 255).to_vector<int64_t>() == std::vector<int64_t>({5, 5}));
  expect_error([&] { mt::abs(mt::zeros({2}, DType::kBool)); }, {"abs:", "bool"});
  expect_error([&] { mt::maximum(f32, mt::zeros({4})); }, {"maximum: shapes [2, 3] and [4]", "cannot be broadcast"});
  expect_error([&] { mt::where(f32, f32, f32); },
               {"where: expected a condition of dtype bool, got f32 of shape [2, 3]"});
  expect_error([&] { mt::where(mt::zeros({4}, DType::kBool), f32, f32); }, {"where: shapes [4] and [2, 3]"});
  expect_error([&] { mt::where(Tensor(), f32, f32); }, {"where:", "condition", "undefined"});
  expect_error([&] { mt::where(mt::zeros({3}, DType::kBool), i64, 0.5); }, {"where: the scalar 0.5 is not an integer"});
  expect_error([&] { (void)(1.0 / Tensor()); }, {"div:", "b", "undefined"});
  expect_error([&] { (void)(1.0 / i64); }, {"div: expected a floating dtype", "i64"});
}

BOOST_AUTO_TEST_CASE(a_scalar_over_a_tensor_is_one_rounded_division, MT_CPU_TEST) {
  // LibTorch's a / b: a filled into b's dtype, then one division (not a · (1 / b)); the gradient reaches b alone.
  for (const DType dtype : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16}) {
    BOOST_TEST_CONTEXT(dtype) {
      const double inf = std::numeric_limits<double>::infinity();
      const Tensor b = mt::from_vector<double>({3.0, -7.0, 0.1, 1e-3, 0.0, inf}, {6}, dtype).requires_grad_();
      const Tensor y = 0.1 / b;
      BOOST_TEST(y.dtype() == dtype);
      const Tensor want = mt::div(mt::full({6}, 0.1, dtype), b.detach());
      BOOST_TEST(y.to(mt::kF64).to_vector<double>() == want.to(mt::kF64).to_vector<double>(),
                 boost::test_tools::per_element());
      mt::sum(y).backward();
      BOOST_TEST(b.grad().defined());
      // The other scalar-first operators: the scalar-last ones, and 2.5 − x the subtraction (one rounding).
      const Tensor x = b.detach();
      for (const auto& [got, same] : {std::pair{2.5 + x, x + 2.5}, std::pair{2.5 * x, x * 2.5},
                                      std::pair{2.5 - x, mt::full({6}, 2.5, dtype) - x}})
        BOOST_TEST(got.to(mt::kF64).to_vector<double>() == same.to(mt::kF64).to_vector<double>(),
                   boost::test_tools::per_element());
    }
  }
}

// ---- abs, clamp, maximum, minimum, where: PyTorch's values and gradients at the edges ------------------------------

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A leaf of `values` in `dtype` that requires grad.
Tensor leaf_of(const std::vector<double>& values, DType dtype = mt::kF32, mt::Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return mt::from_vector(values, shape, dtype).requires_grad_();
}

}  // namespace

BOOST_AUTO_TEST_CASE(abs_passes_dy_times_the_sign, MT_CPU_TEST) {
  for (DType dt : kFloatTypes)
    BOOST_TEST_CONTEXT(dt) {
      Tensor x = leaf_of({-2, -0.0, 0, 3, kNan, -kInf}, dt);
      const Tensor y = mt::abs(x);
      expect_values(y, {2, 0, 0, 3, kNan, kInf}, kExact, "abs");
      y.backward(mt::full({6}, 2, dt));
      expect_values(x.grad(), {-2, 0, 0, 2, kNan, -2}, kExact, "abs's gradient: dy·sign(x), 0 at ±0, NaN at NaN");
    }
  expect_values(mt::abs(mt::from_vector<int64_t>({-3, 0, 4})), {3, 0, 4}, kExact, "abs of i64");
}

BOOST_AUTO_TEST_CASE(clamp_passes_the_gradient_inside_the_bounds_and_at_them, MT_CPU_TEST) {
  for (DType dt : kFloatTypes)
    BOOST_TEST_CONTEXT(dt) {
      Tensor x = leaf_of({-3, -1, 0, 1, 2, kNan, kInf}, dt);
      const Tensor y = mt::clamp(x, -1.0, 1.0);
      expect_values(y, {-1, -1, 0, 1, 1, kNan, 1}, kExact, "clamp(x, -1, 1)");
      y.backward(mt::ones({7}, dt));
      // x == min and x == max pass dy (PyTorch's min <= x <= max); NaN gets 0.
      expect_values(x.grad(), {0, 1, 1, 1, 0, 0, 0}, kExact, "clamp's gradient");
    }
  // One bound: the other side is open.
  Tensor x = leaf_of({-3, 0.5, 4});
  mt::sum(mt::clamp(x, 0.0) + mt::clamp(x, std::nullopt, 1.0)).backward();
  expect_values(x.grad(), {1, 2, 1}, kExact, "clamp(x, 0) + clamp(x, None, 1)");
  // min > max: every value becomes max and no gradient passes (no x satisfies min <= x <= max).
  Tensor z = leaf_of({-2, 0.5, 3});
  const Tensor w = mt::clamp(z, 2.0, 1.0);
  expect_values(w, {1, 1, 1}, kExact, "clamp(x, 2, 1)");
  mt::sum(w).backward();
  expect_values(z.grad(), {0, 0, 0}, kExact, "clamp(x, 2, 1)'s gradient");
  // f16: the bound compares as its f16 value. 0.1 rounds to 0.0999755859375 in f16; that x passes the gradient.
  Tensor h = leaf_of({0.0999755859375, 0.0999}, mt::kF16);
  const Tensor hy = mt::clamp(h, 0.1);
  expect_values(hy, {0.0999755859375, 0.0999755859375}, kExact, "clamp of f16 at 0.1");
  mt::sum(hy).backward();
  expect_values(h.grad(), {1, 0}, kExact, "clamp of f16 at 0.1, gradient");
  expect_values(mt::clamp(mt::from_vector<int64_t>({-5, 2, 9}), 0.0, 4.0), {0, 2, 4}, kExact, "clamp of i64");
}

BOOST_AUTO_TEST_CASE(maximum_and_minimum_split_the_gradient_at_ties, MT_CPU_TEST) {
  for (DType dt : kFloatTypes)
    BOOST_TEST_CONTEXT(dt) {
      Tensor a = leaf_of({1, 2, 3, kNan, 5}, dt), b = leaf_of({2, 2, 1, 0, kNan}, dt);
      const Tensor hi = mt::maximum(a, b), lo = mt::minimum(a, b);
      expect_values(hi, {2, 2, 3, kNan, kNan}, kExact, "maximum");
      expect_values(lo, {1, 2, 1, kNan, kNan}, kExact, "minimum");
      // PyTorch's rule: dy to the larger, dy / 2 to each on a tie, dy to both where either is NaN.
      hi.backward(mt::full({5}, 4, dt));
      expect_values(a.grad(), {0, 2, 4, 4, 4}, kExact, "maximum, a's gradient");
      expect_values(b.grad(), {4, 2, 0, 4, 4}, kExact, "maximum, b's gradient");
      a.set_grad(Tensor()), b.set_grad(Tensor());
      lo.backward(mt::full({5}, 4, dt));
      expect_values(a.grad(), {4, 2, 0, 4, 4}, kExact, "minimum, a's gradient");
      expect_values(b.grad(), {0, 2, 4, 4, 4}, kExact, "minimum, b's gradient");
    }
  // Broadcast and promoted: b (f16, 1 element) against a (f32, 3) collects its parts, in its own dtype.
  Tensor a = leaf_of({1, 5, 3}), b = leaf_of({3}, mt::kF16);
  const Tensor y = mt::maximum(a, b);
  BOOST_TEST(y.dtype() == mt::kF32);
  mt::sum(y).backward();
  expect_values(a.grad(), {0, 1, 0.5}, kExact, "maximum broadcast, a");
  BOOST_TEST(b.grad().dtype() == mt::kF16);
  expect_values(b.grad(), {1.5}, kExact, "maximum broadcast, b: 1 + 0.5");
  // maximum(x, x): both halves land on x.
  Tensor x = leaf_of({-1, 2});
  mt::sum(mt::maximum(x, x)).backward();
  expect_values(x.grad(), {1, 1}, kExact, "maximum(x, x)");
}

BOOST_AUTO_TEST_CASE(where_selects_broadcasts_and_routes_the_gradient, MT_CPU_TEST) {
  const Tensor c = mt::from_vector<double>({1, 0, 0, 1, 1, 0}, {2, 3}, mt::kF32);
  const Tensor cond = mt::ne(c, mt::zeros({}));
  Tensor a = leaf_of({10, 20, 30}), b = leaf_of({-1, -2}, mt::kF64, {2, 1});
  const Tensor y = mt::where(cond, a, b);
  BOOST_TEST(y.dtype() == mt::kF64);  // a and b promote, the condition stays bool
  BOOST_TEST(y.shape() == (mt::Shape{2, 3}));
  expect_values(y, {10, -1, -1, 10, 20, -2}, kExact, "where");
  y.backward(mt::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, mt::kF64));
  BOOST_TEST(a.grad().dtype() == mt::kF32);
  expect_values(a.grad(), {5, 5, 0}, kExact, "where, a's gradient: dy where the condition holds, summed over rows");
  expect_values(b.grad(), {5, 6}, kExact, "where, b's gradient: dy elsewhere, summed over columns");
  // The unselected side's NaN and inf never reach the output or its gradient.
  Tensor p = leaf_of({1, kNan}), q = leaf_of({kInf, 2});
  const Tensor r = mt::where(mt::from_vector<double>({1, 0}, {2}).to(mt::kBool), p, q);
  expect_values(r, {1, 2}, kExact, "where over NaN and inf");
  mt::sum(r).backward();
  expect_values(p.grad(), {1, 0}, kExact, "where over NaN, a");
  expect_values(q.grad(), {0, 1}, kExact, "where over inf, b");
  // A scalar takes the tensor's dtype, if the dtype holds it (-1e9 does not fit f16: refused, as PyTorch 1.13's
  // "value cannot be converted to type at::Half without overflow"; -inf does).
  const Tensor h = mt::from_vector<double>({-1, 2, -3, 4}, {4}, mt::kF16);
  const Tensor masked = mt::where(mt::gt(h, mt::zeros({})), h, -kInf);
  BOOST_TEST(masked.dtype() == mt::kF16);
  expect_values(masked, {-kInf, 2, -kInf, 4}, kExact, "where of f16 and -inf");
  expect_error([&] { mt::where(mt::gt(h, mt::zeros({})), h, -1e9); },
               {"where: the scalar b -1e+09 cannot be converted to f16 without overflow (a of shape [4])"});
  expect_values(mt::where(mt::gt(h, mt::zeros({})), h.to(mt::kF32), -1e9), {-1e9, 2, -1e9, 4}, kExact,
                "where of f32 and -1e9");
  expect_values(mt::where(mt::from_vector<double>({0, 1}, {2}).to(mt::kBool), 7.0, mt::from_vector<int64_t>({1, 2})),
                {1, 7}, kExact, "where of a scalar and i64");
}

BOOST_AUTO_TEST_CASE(comparisons_promote_broadcast_and_return_bool, MT_CPU_TEST) {
  // f32 (2, 3) against i64 (3): promoted to f32, broadcast over rows; a NaN compares unequal to everything.
  const Tensor a = mt::from_vector<float>({1, 2, 3, 4, std::nanf(""), 6}, {2, 3});
  const Tensor b = mt::from_vector<int64_t>({1, 5, 3}, {3});
  struct Case {
    const char* name;
    Tensor (*f)(const Tensor&, const Tensor&);
    std::vector<double> want;
  };
  const Case cases[] = {
      {"eq", mt::eq, {1, 0, 1, 0, 0, 0}}, {"ne", mt::ne, {0, 1, 0, 1, 1, 1}}, {"lt", mt::lt, {0, 1, 0, 0, 0, 0}},
      {"le", mt::le, {1, 1, 1, 0, 0, 0}}, {"gt", mt::gt, {0, 0, 0, 1, 0, 1}}, {"ge", mt::ge, {1, 0, 1, 1, 0, 1}},
  };
  for (const Case& c : cases) {
    const Tensor r = c.f(a, b);
    BOOST_TEST(r.dtype() == DType::kBool, c.name);
    BOOST_TEST(!r.requires_grad(), c.name);
    expect_values(r, c.want, kExact, c.name);
  }
  // No gradient flows, and the inputs may require grad (accuracy of logits).
  const Tensor logits = mt::randn({4, 10}).requires_grad_();
  const Tensor hits = mt::eq(mt::argmax(logits, 1), mt::argmax(logits, 1));
  expect_values(hits, {1, 1, 1, 1}, kExact, "argmax == itself");
  expect_error([&] { mt::eq(a, mt::zeros({4})); }, {"eq: shapes [2, 3] and [4]", "cannot be broadcast"});
  expect_error([&] { mt::lt(a, Tensor()); }, {"lt:", "undefined"});
}

BOOST_AUTO_TEST_CASE(device_mismatch_names_both_devices, MT_GPU_TEST) {
  const Tensor cpu = mt::zeros({2, 3}), gpu = mt::zeros({2, 3}, mt::Device::cuda());
  expect_error([&] { mt::add(cpu, gpu); }, {"add: expected 'a' and 'b' on the same device", "cpu", "cuda:0", "[2, 3]"});
  expect_error([&] { kn::binary(kn::BinaryOp::kAdd, cpu, gpu); },
               {"kernels::binary: expected every tensor on one device", "cpu", "cuda:0"});
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(unary_every_op_dtype_size_and_layout, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 1;
  for (kn::UnaryOp op : kUnaryOps) {
    std::vector<DType> dtypes(std::begin(kGpuFloatTypes), std::end(kGpuFloatTypes));
    if (op == kn::UnaryOp::kNeg || op == kn::UnaryOp::kAbs || op == kn::UnaryOp::kSign || op == kn::UnaryOp::kSquare)
      dtypes.push_back(mt::kI64);
    for (DType dtype : dtypes) {
      const double lo = needs_positive(op) ? 0.1 : -4.0, hi = 4.0;
      for (int64_t n : kGpuSizes) {
        const Tensor dense = random({2 * n}, dtype, lo, hi, ++seed);
        check_unary(op, dtype, view_aligned(dense), "dense");
        check_unary(op, dtype, view_misaligned(dense), "offset by one element");
        check_unary(op, dtype, view_step(dense), "step 2");
      }
      const Tensor m = random({67, 45}, dtype, lo, hi, ++seed);
      check_unary(op, dtype, m.t(), "transposed");
      check_unary(op, dtype, m.slice(0, 3, 67, 3).slice(1, 1, 45, 2), "2-D steps");
      check_unary(op, dtype, random({1, 33}, dtype, lo, hi, ++seed).expand({9, 33}), "expanded");
    }
  }
}

BOOST_AUTO_TEST_CASE(binary_every_op_dtype_size_and_broadcast, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 100;
  for (kn::BinaryOp op : kBinaryOps) {
    const bool integers = op == kn::BinaryOp::kAdd || op == kn::BinaryOp::kSub || op == kn::BinaryOp::kMul ||
                          op == kn::BinaryOp::kMaximum || op == kn::BinaryOp::kMinimum || op >= kn::BinaryOp::kEq;
    std::vector<DType> dtypes(std::begin(kGpuFloatTypes), std::end(kGpuFloatTypes));
    if (integers) dtypes.push_back(mt::kI64);
    // pow takes a positive base; comparisons draw from few values so that equality happens.
    const bool compare = op >= kn::BinaryOp::kEq;
    const double lo = op == kn::BinaryOp::kPow ? 0.1 : compare ? 0.0 : -3.0, hi = compare ? 4.0 : 3.0;
    auto draw = [&](const Shape& s, DType dt) {
      Tensor t = random(s, dt, lo, hi, ++seed);
      return compare && mt::is_floating(dt) ? t.to(mt::kI64).to(dt) : t;  // whole numbers: ties and equality
    };
    for (DType dtype : dtypes) {
      auto check = [&](const Tensor& a, const Tensor& b, const char* layout) {
        const Tensor want = kn::binary(op, a, b);
        const Tensor got = kn::binary(op, same_view_on_gpu(a), same_view_on_gpu(b));
        expect_close(got, want, mt::test::tolerance(dtype), describe_case(kn::name(op), dtype, want.shape(), layout));
      };
      for (int64_t n : kGpuSizes) {
        const Tensor a = draw({2 * n}, dtype), b = draw({2 * n}, dtype);
        check(view_aligned(a), view_aligned(b), "dense");
        check(view_misaligned(a), view_aligned(b), "one operand offset by one element");
        check(view_step(a), view_misaligned(b), "step 2 and offset");
      }
      check(draw({37, 1}, dtype), draw({1, 129}, dtype), "broadcast (37, 1) with (1, 129)");
      check(draw({5, 64, 9}, dtype), draw({9}, dtype), "broadcast a row");
      check(draw({64, 48}, dtype).t(), draw({48, 64}, dtype), "transposed with dense");
      check(draw({}, dtype), draw({1000}, dtype), "0-d with 1-D");
    }
  }
  // bool comparisons (run as u8 on the GPU).
  const Tensor a = mt::randint(0, 2, {1000}, mt::TensorOptions(mt::kI64)).to(mt::kBool);
  const Tensor b = mt::randint(0, 2, {1000}, mt::TensorOptions(mt::kI64)).to(mt::kBool);
  for (kn::BinaryOp op : {kn::BinaryOp::kEq, kn::BinaryOp::kNe, kn::BinaryOp::kLt, kn::BinaryOp::kGe})
    expect_close(kn::binary(op, a.cuda(), b.cuda()), kn::binary(op, a, b), mt::test::tolerance(mt::kBool),
                 describe_case(kn::name(op), mt::kBool, a.shape(), "bool"));
}

BOOST_AUTO_TEST_CASE(binary_special_values, MT_GPU_TEST) {
  // NaN propagation of maximum/minimum and comparisons with NaN and infinities, in every float dtype.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kGpuFloatTypes) {
    const Tensor a = mt::tensor({nan, 1.0, -inf, 2.0, nan, 0.0, -0.0}).to(dtype);
    const Tensor b = mt::tensor({1.0, nan, 3.0, inf, nan, -0.0, 0.0}).to(dtype);
    for (kn::BinaryOp op : kBinaryOps) {
      if (op == kn::BinaryOp::kPow) continue;
      expect_close(kn::binary(op, a.cuda(), b.cuda()), kn::binary(op, a, b), mt::test::tolerance(dtype),
                   describe_case(kn::name(op), dtype, a.shape(), "NaN/inf"));
    }
  }
}

BOOST_AUTO_TEST_CASE(scalar_every_op_dtype_size_and_layout, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 200;
  for (kn::ScalarOp op : kScalarOps) {
    const bool integers = op == kn::ScalarOp::kAdd || op == kn::ScalarOp::kMul || op == kn::ScalarOp::kRsub ||
                          op == kn::ScalarOp::kMaximum || op == kn::ScalarOp::kMinimum;
    std::vector<DType> dtypes(std::begin(kGpuFloatTypes), std::end(kGpuFloatTypes));
    if (integers) dtypes.push_back(mt::kI64);
    const bool positive = op == kn::ScalarOp::kPow || op == kn::ScalarOp::kRdiv;
    for (DType dtype : dtypes) {
      const double s = mt::is_floating(dtype) ? (op == kn::ScalarOp::kPow ? 1.7 : -0.3) : -3.0;
      for (int64_t n : kGpuSizes) {
        const Tensor dense = random({2 * n}, dtype, positive ? 0.1 : -3.0, 3.0, ++seed);
        for (const auto& [x, layout] : {std::pair{view_aligned(dense), "dense"},
                                        std::pair{view_misaligned(dense), "offset by one element"},
                                        std::pair{view_step(dense), "step 2"}}) {
          expect_close(kn::scalar(op, same_view_on_gpu(x), s), kn::scalar(op, x, s),
                       mt::test::tolerance(dtype), describe_case(kn::name(op), dtype, x.shape(), layout));
        }
      }
      const Tensor m = random({40, 70}, dtype, positive ? 0.1 : -3.0, 3.0, ++seed).t();
      expect_close(kn::scalar(op, same_view_on_gpu(m), s), kn::scalar(op, m, s),
                   mt::test::tolerance(dtype), describe_case(kn::name(op), dtype, m.shape(), "transposed"));
    }
  }
}

// f16/bf16 elementwise kernels widen runs to f32 in blocks (core/convert.h), apply the f32 formula and round back
// in bulk: bit for bit the f32 kernel's result rounded once to the 16-bit type, at every block boundary, in place,
// on strided views (the element-wise path) and over specials (NaN, ±inf, ±0, subnormals, the overflow edge).
BOOST_AUTO_TEST_CASE(sixteen_bit_blocks_round_once_like_f32_then_cast, MT_CPU_TEST) {
  const std::vector<double> specials = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 65504, 65520, -70000, 6e-8, -3e-8,
                                        1e-40, 3.0e38, -1.5, 2.5};
  uint64_t seed = 900;
  for (DType dtype : {mt::kF16, mt::kBF16}) {
    for (int64_t n : {1, 13, 511, 512, 513, 1030, 70001}) {
      std::vector<double> v = random(Shape{n}, mt::kF64, -8, 8, ++seed).to_vector<double>();
      std::vector<double> w = random(Shape{n}, mt::kF64, -8, 8, ++seed).to_vector<double>();
      for (size_t i = 0; i < specials.size() && i < v.size(); ++i) v[(i * 37) % v.size()] = specials[i];
      for (size_t i = 0; i < specials.size() && i < w.size(); ++i) w[(i * 53 + 5) % w.size()] = specials[i];
      const Tensor x = mt::from_vector(v, {n}).to(dtype), y = mt::from_vector(w, {n}).to(dtype);
      const Tensor x32 = x.to(mt::kF32), y32 = y.to(mt::kF32);
      auto same = [&](const Tensor& got, const Tensor& f32_result, const std::string& what) {
        expect_same_bits(got, f32_result.to(dtype), describe_case(what.c_str(), dtype, Shape{n}, "contiguous"));
      };
      for (kn::UnaryOp op : {kn::UnaryOp::kRelu, kn::UnaryOp::kExp, kn::UnaryOp::kTanh, kn::UnaryOp::kNeg})
        same(kn::unary(op, x), kn::unary(op, x32), kn::name(op));
      for (kn::BinaryOp op :
           {kn::BinaryOp::kAdd, kn::BinaryOp::kMul, kn::BinaryOp::kDiv, kn::BinaryOp::kReluBackward})
        same(kn::binary(op, x, y), kn::binary(op, x32, y32), kn::name(op));
      same(kn::scalar(kn::ScalarOp::kMul, x, 0.1), kn::scalar(kn::ScalarOp::kMul, x32, 0.1), "mul by 0.1");
      // In place: the output is the first input.
      const Tensor in_place = mt::raw::clone(x);
      kn::binary_(kn::BinaryOp::kAdd, in_place, y);
      same(in_place, kn::binary(kn::BinaryOp::kAdd, x32, y32), "add_ in place");
      // Strided: every other element (the element-wise path).
      if (n > 2) {
        const Tensor xs = mt::raw::slice(x, 0, 0, n, 2), ys = mt::raw::slice(y, 0, 1, n, 2);
        const int64_t m = std::min(xs.numel(), ys.numel());
        const Tensor a = mt::raw::slice(xs, 0, 0, m), b = mt::raw::slice(ys, 0, 0, m);
        const Tensor want = kn::binary(kn::BinaryOp::kMul, a.to(mt::kF32), b.to(mt::kF32)).to(dtype);
        expect_same_bits(kn::binary(kn::BinaryOp::kMul, a, b), want, describe_case("mul", dtype, a.shape(), "stride 2"));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(where_every_dtype_size_and_broadcast, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 300;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64, mt::kF64, mt::kI32, mt::kU8, mt::kBool}) {
    auto check = [&](const Tensor& c, const Tensor& a, const Tensor& b, const char* layout) {
      const Tensor want = kn::where(c, a, b);
      expect_close(kn::where(same_view_on_gpu(c), same_view_on_gpu(a), same_view_on_gpu(b)), want,
                   mt::test::tolerance(dtype), describe_case("where", dtype, want.shape(), layout));
    };
    auto draw = [&](const Shape& s) { return random(s, dtype, 0, dtype == mt::kBool ? 2 : 100, ++seed); };
    auto cond = [&](const Shape& s) { return random(s, mt::kI64, 0, 2, ++seed).to(mt::kBool); };
    for (int64_t n : kGpuSizes) {
      const Tensor c = cond({2 * n}), a = draw({2 * n}), b = draw({2 * n});
      check(view_aligned(c), view_aligned(a), view_aligned(b), "dense");
      check(view_misaligned(c), view_aligned(a), view_step(b), "offset and step");
    }
    check(cond({30, 1}), draw({1, 50}), draw({30, 50}).t().t(), "broadcast condition and a");
    check(cond({50, 30}).t(), draw({}), draw({30, 50}), "transposed condition, 0-d a");
  }
}

BOOST_AUTO_TEST_SUITE_END()
