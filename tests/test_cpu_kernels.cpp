// tests/test_cpu_kernels.cpp — the CPU kernels of ops/kernels.h against float64 references.
//
// Every reference is computed here, in double, from the same rounded inputs
// the kernel saw (`x.to(kF64)`), with formulas written out in this file:
// never through a kernel under test (only core's views and dtype copies are
// trusted). Tolerances come from the one per-dtype table, tests/tolerance.h
// (PyTorch's assert_close defaults); an override says why next to it. Where
// a stronger property holds it is checked exactly: +, -, *, / of f16/bf16/f32
// computed in f32/f64 and rounded once equal the exact result rounded once
// (an intermediate of >= 2p+2 bits makes double rounding harmless), and
// max/min/argmax/where/comparisons are exact.
//
// A failure prints the op, shapes, layout, dtype, seed and the first
// mismatching pairs.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/storage.h>
#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include "kernel_calls.h"
#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace kn = mixtape::kernels;
namespace utf = boost::unit_test;
using mt::DType;
using mt::Shape;
using mt::Tensor;
using mt::test::Tolerance;

namespace {

constexpr DType kFloatTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16};

// ---- comparing ---------------------------------------------------------------------

/// The double `v` rounded once to `t` (the reference for "one rounding per output").
double round_to(DType t, double v) {
  switch (t) {
    case DType::kF32: return static_cast<float>(v);
    case DType::kF16: return static_cast<float>(mt::Half(v));
    case DType::kBF16: return static_cast<float>(mt::BFloat16(v));
    default: return v;
  }
}

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want;
}

bool close(double got, double want, Tolerance tol) {
  if (std::isnan(want) || std::isinf(want)) return same_value(got, want);
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

/// got (row-major, any dtype) against want elementwise; `exact` compares values bit for bit (NaN == NaN).
/// `slack`, when given, adds a per-element absolute tolerance (an error bound that depends on the element).
void check_values(const Tensor& got, const std::vector<double>& want, Tolerance tol, bool exact,
                  const std::string& config, const std::vector<double>* slack = nullptr) {
  const std::vector<double> g = got.to_vector<double>();
  if (g.size() != want.size()) {
    BOOST_ERROR(config << ": got " << g.size() << " elements, want " << want.size());
    return;
  }
  int64_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (size_t i = 0; i < g.size(); ++i) {
    const Tolerance t{tol.rtol, tol.atol + (slack ? (*slack)[i] : 0.0)};
    if (exact ? same_value(g[i], want[i]) : close(g[i], want[i], t)) continue;
    if (bad < 5) first << "\n    [" << i << "] got " << g[i] << ", want " << want[i];
    ++bad;
  }
  BOOST_CHECK_MESSAGE(bad == 0, config << ": " << bad << " of " << g.size() << " elements differ ("
                                       << (exact ? std::string("exact") : "rtol " + std::to_string(tol.rtol) +
                                                                                ", atol " + std::to_string(tol.atol))
                                       << "); first:" << first.str());
}

void check_shape(const Tensor& got, const Shape& want, DType dtype, const std::string& config) {
  BOOST_CHECK_MESSAGE(got.shape() == want && got.dtype() == dtype,
                      config << ": got shape " << got.shape() << " dtype " << got.dtype() << ", want shape " << want
                             << " dtype " << dtype);
}

std::vector<double> values(const Tensor& t) { return t.to(DType::kF64).to_vector<double>(); }

template <class... Args>
std::string describe(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// Runs `f`, which must throw mixtape::Error containing every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  BOOST_CHECK_EXCEPTION(f(), mt::Error, [&](const mt::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) BOOST_CHECK_MESSAGE(msg.find(p) != std::string::npos, "'" << p << "' not in: " << msg);
    return true;
  });
}

// ---- inputs --------------------------------------------------------------------------

enum class Layout { kContiguous, kTransposed, kStrided, kExpanded };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kTransposed: return "transposed";
    case Layout::kStrided: return "strided";
    case Layout::kExpanded: return "expanded";
  }
  return "?";
}

/// Uniform values in [lo, hi) of `shape` and `dtype`, laid out as `layout`
/// (the non-contiguous layouts need >= 2 dims): a transposed view, every
/// other element of a wider tensor, or a size-1 dim 0 expanded.
Tensor input(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed,
             Layout layout = Layout::kContiguous) {
  mt::Generator gen(seed);
  Shape s = shape;
  const int64_t r = shape.size();
  switch (layout) {
    case Layout::kContiguous: return mt::uniform(shape, lo, hi, dtype, &gen);
    case Layout::kTransposed:
      std::swap(s[r - 1], s[r - 2]);
      return mt::uniform(s, lo, hi, dtype, &gen).transpose(-1, -2);
    case Layout::kStrided:
      s[r - 1] = 2 * shape[r - 1] + 1;
      return mt::uniform(s, lo, hi, dtype, &gen).slice(-1, 1, s[r - 1], 2);
    case Layout::kExpanded:
      s[0] = 1;
      return mt::uniform(s, lo, hi, dtype, &gen).expand(shape);
  }
  return {};
}

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

// ---- reference reductions -------------------------------------------------------------

/// For each output of reducing `shape` over `reduced` (a mask), the row-major
/// flat indices of its elements, in the reduced sub-tensor's row-major order.
std::vector<std::vector<int64_t>> reduction_groups(const Shape& shape, const std::vector<bool>& reduced) {
  Shape kept, red;
  for (int64_t d = 0; d < shape.size(); ++d) (reduced[d] ? red : kept).push_back(shape[d]);
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(kept.numel()));
  const Shape strides = mt::contiguous_strides(shape);
  for (int64_t m = 0; m < kept.numel(); ++m) {
    for (int64_t r = 0; r < red.numel(); ++r) {
      int64_t flat = 0, rm = m, rr = r;
      for (int64_t d = shape.size() - 1; d >= 0; --d) {
        int64_t& rem = reduced[d] ? rr : rm;
        flat += (rem % shape[d]) * strides[d];
        rem /= shape[d];
      }
      groups[static_cast<size_t>(m)].push_back(flat);
    }
  }
  return groups;
}

double ref_reduce(kn::ReduceOp op, const std::vector<double>& x, const std::vector<int64_t>& group) {
  switch (op) {
    case kn::ReduceOp::kSum:
    case kn::ReduceOp::kMean: {
      long double s = 0;  // the reference accumulates wider than the kernel
      for (int64_t i : group) s += x[static_cast<size_t>(i)];
      return op == kn::ReduceOp::kSum ? static_cast<double>(s) : static_cast<double>(s / group.size());
    }
    case kn::ReduceOp::kMax:
    case kn::ReduceOp::kMin:
    case kn::ReduceOp::kArgmax:
    case kn::ReduceOp::kArgmin: {
      const bool is_max = op == kn::ReduceOp::kMax || op == kn::ReduceOp::kArgmax;
      size_t best = 0;
      for (size_t j = 0; j < group.size(); ++j) {
        const double v = x[static_cast<size_t>(group[j])], b = x[static_cast<size_t>(group[best])];
        if (std::isnan(b)) break;  // the first NaN wins
        if (std::isnan(v) || (is_max ? v > b : v < b)) best = j;
      }
      if (op == kn::ReduceOp::kArgmax || op == kn::ReduceOp::kArgmin) return static_cast<double>(best);
      return x[static_cast<size_t>(group[best])];
    }
  }
  return 0;
}

/// Checks mt::test::reduce(op, x, dims, keepdim, out_dtype) against the reference.
void check_reduce(kn::ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim,
                  std::optional<DType> out_dtype, const std::string& config_in, Tolerance tol, bool exact) {
  const std::string config = describe(config_in, " op=", kn::name(op), " x=", x.shape(), " ", x.dtype(), " dims=[",
                                      [&] {
                                        std::string s;
                                        for (int64_t d : dims) s += std::to_string(d) + ",";
                                        return s;
                                      }(),
                                      "] keepdim=", keepdim);
  const Tensor got = mt::test::reduce(op, x, dims, keepdim, out_dtype);
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), dims.empty());
  if (x.dim() > 0)
    for (int64_t d : dims) reduced[static_cast<size_t>(d < 0 ? d + x.dim() : d)] = true;
  Shape want_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduced[static_cast<size_t>(d)]) want_shape.push_back(x.size(d));
    else if (keepdim) want_shape.push_back(1);
  }
  DType want_dtype = out_dtype.value_or(x.dtype());
  if (op == kn::ReduceOp::kArgmax || op == kn::ReduceOp::kArgmin) want_dtype = DType::kI64;
  else if (op == kn::ReduceOp::kSum && !out_dtype && !mt::is_floating(x.dtype())) want_dtype = DType::kI64;
  check_shape(got, want_shape, want_dtype, config);
  const std::vector<double> xv = values(x);
  std::vector<double> want;
  for (const auto& group : reduction_groups(x.shape(), reduced)) want.push_back(round_to(want_dtype, ref_reduce(op, xv, group)));
  check_values(got, want, tol, exact, config);
}

// ---- reference matmul -------------------------------------------------------------------

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
  check_shape(got, ref.shape, dtype, config);
  // Override: the table's pair covers the one rounding to `dtype`, but a
  // length-k dot product accumulated in f32 (f64) also carries a rounding
  // error that grows with k. Its probabilistic bound (Higham & Mary, 2019),
  // sqrt(k) u sum_p |a_ip b_pj| with u the accumulator's unit roundoff, is
  // added per element.
  Tolerance tol = mt::test::tolerance(dtype);
  if (a.dtype() != DType::kF64 && dtype == DType::kF64) tol = mt::test::tolerance(DType::kF32);
  const std::vector<double> slack = accumulation_slack(ref, a.size(-1), a.dtype());
  check_values(got, ref.c, tol, false, config, &slack);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_kernels)

// ---- unary -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(unary_ops_match_f64_references, *utf::label("cpu")) {
  const Shape shapes[] = {{0}, {1}, {7}, {1023}, {65537}, {}, {3, 4, 5}};
  uint64_t seed = 100;
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kFloatTypes) {
      const Tolerance tol = mt::test::tolerance(dtype);
      auto run = [&](const Tensor& x, const std::string& layout) {
        const std::string config = describe("op=", kn::name(c.op), " shape=", x.shape(), " layout=", layout,
                                            " dtype=", dtype, " seed=", seed);
        const Tensor y = kn::unary(c.op, x);
        check_shape(y, x.shape(), dtype, config);
        std::vector<double> want = values(x);
        for (double& v : want) v = c.ref(v);
        check_values(y, want, tol, false, config);
      };
      for (const Shape& s : shapes) run(input(s, dtype, c.lo, c.hi, ++seed), "contiguous");
      for (Layout l : {Layout::kTransposed, Layout::kStrided, Layout::kExpanded})
        run(input({37, 29}, dtype, c.lo, c.hi, ++seed, l), layout_name(l));
    }
  }
}

BOOST_AUTO_TEST_CASE(unary_edge_values, *utf::label("cpu")) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = mt::tensor({-inf, -1000.0, -0.0, 0.0, 1000.0, inf, nan});
  // sigmoid is finite and exact at the extremes (no exp overflow), NaN stays NaN.
  check_values(kn::unary(kn::UnaryOp::kSigmoid, x), {0, 0, 0.5, 0.5, 1, 1, nan}, {}, true, "sigmoid edges");
  check_values(kn::unary(kn::UnaryOp::kRelu, x), {0, 0, 0, 0, 1000, inf, nan}, {}, true, "relu edges");
  check_values(kn::unary(kn::UnaryOp::kSign, x), {-1, -1, 0, 0, 1, 1, nan}, {}, true, "sign edges");
  check_values(kn::unary(kn::UnaryOp::kTanh, x), {-1, -1, 0, 0, 1, 1, nan}, {}, true, "tanh edges");
  check_values(kn::unary(kn::UnaryOp::kGelu, x), {nan, -0.0, 0, 0, 1000, inf, nan}, mt::test::tolerance(DType::kF64),
               false, "gelu edges");
  BOOST_TEST(!std::signbit(kn::unary(kn::UnaryOp::kAbs, x).at<double>({2})), "abs(-0) must be +0");
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    check_values(kn::unary(kn::UnaryOp::kSigmoid, x.to(dtype)), {0, 0, 0.5, 0.5, 1, 1, nan}, {}, true,
                 describe("sigmoid edges ", dtype));
}

BOOST_AUTO_TEST_CASE(unary_integer_ops, *utf::label("cpu")) {
  for (DType dtype : {DType::kI64, DType::kI32}) {
    const Tensor x = mt::randint(-1000, 1000, {5, 13}, dtype).transpose(0, 1);
    const std::vector<double> xv = values(x);
    auto ref = [&](double (*f)(double)) {
      std::vector<double> r = xv;
      for (double& v : r) v = f(v);
      return r;
    };
    const std::string config = describe("dtype=", dtype, " shape=", x.shape(), " transposed");
    check_values(kn::unary(kn::UnaryOp::kNeg, x), ref([](double v) { return -v; }), {}, true, "neg " + config);
    check_values(kn::unary(kn::UnaryOp::kAbs, x), ref([](double v) { return std::fabs(v); }), {}, true, "abs " + config);
    check_values(kn::unary(kn::UnaryOp::kSign, x), ref([](double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }), {},
                 true, "sign " + config);
    check_values(kn::unary(kn::UnaryOp::kSquare, x), ref([](double v) { return v * v; }), {}, true,
                 "square " + config);
    BOOST_TEST((kn::unary(kn::UnaryOp::kNeg, x).dtype() == dtype));
  }
  // u8 wraps modulo 256, like PyTorch.
  const Tensor u = mt::tensor<uint8_t>({0, 1, 200});
  check_values(kn::unary(kn::UnaryOp::kNeg, u), {0, 255, 56}, {}, true, "neg u8");
  check_values(kn::unary(kn::UnaryOp::kSquare, u), {0, 1, 64}, {}, true, "square u8");
}

// ---- binary ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(binary_ops_broadcast_and_match_f64_references, *utf::label("cpu")) {
  uint64_t seed = 1000;
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kFloatTypes) {
      const Tolerance tol = mt::test::tolerance(dtype);
      auto run = [&](const Tensor& a, const Tensor& b, const std::string& layout) {
        const Shape shape = mt::broadcast_shapes(a.shape(), b.shape(), "test");
        const std::string config = describe("op=", kn::name(c.op), " shapes=", a.shape(), " and ", b.shape(),
                                            " layout=", layout, " dtype=", dtype, " seed=", seed);
        const Tensor y = kn::binary(c.op, a, b);
        check_shape(y, shape, dtype, config);
        const std::vector<double> av = broadcast_values(a, shape), bv = broadcast_values(b, shape);
        std::vector<double> want(av.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(dtype, c.ref(av[i], bv[i]));
        check_values(y, want, tol, c.exact, config);
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

BOOST_AUTO_TEST_CASE(binary_integer_ops_and_comparisons, *utf::label("cpu")) {
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
      check_values(kn::binary(arithmetic[o], a, b), want, {}, true, describe(kn::name(arithmetic[o]), " ", dtype));
    }
  }
  // u8 wraps.
  check_values(kn::binary(kn::BinaryOp::kAdd, mt::tensor<uint8_t>({200, 3}), mt::tensor<uint8_t>({100, 4})), {44, 7},
               {}, true, "add u8");

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
      check_shape(got, shape, DType::kBool, describe(kn::name(comparisons[o]), " ", dtype));
      check_values(got, want, {}, true, describe(kn::name(comparisons[o]), " ", dtype));
    }
  }
  // NaN compares unequal to everything, itself included.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor n = mt::tensor({nan, 1.0}, DType::kF16);
  check_values(kn::binary(kn::BinaryOp::kEq, n, n), {0, 1}, {}, true, "eq NaN");
  check_values(kn::binary(kn::BinaryOp::kNe, n, n), {1, 0}, {}, true, "ne NaN");
  check_values(kn::binary(kn::BinaryOp::kMaximum, n, mt::tensor({0.0, nan}, DType::kF16)), {nan, nan}, {}, true,
               "maximum propagates NaN");
}

BOOST_AUTO_TEST_CASE(large_elementwise_is_parallel_and_correct, *utf::label("cpu")) {
  // 2^21 + 3 elements: many OpenMP chunks, a ragged last one, a strided operand.
  const int64_t n = (1 << 21) + 3;
  const Tensor a = input({n}, DType::kF32, -4, 4, 7);
  const Tensor b = input({2 * n + 1}, DType::kF32, -4, 4, 8).slice(0, 1, 2 * n + 1, 2);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> want(av.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(DType::kF32, av[i] * bv[i]);
  check_values(kn::binary(kn::BinaryOp::kMul, a, b), want, {}, true, "mul f32 large, strided b, seed=7/8");
}

// ---- scalar and where --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(scalar_ops_match_f64_references, *utf::label("cpu")) {
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
        check_shape(y, x.shape(), dtype, config);
        std::vector<double> want = values(x);
        for (double& v : want) v = round_to(dtype, c.ref(v, c.s));
        check_values(y, want, mt::test::tolerance(dtype), c.exact, config);
      }
    }
  }
  // A scalar that is not exact in the dtype is converted to opmath first, like PyTorch: 0.1 in f32.
  const Tensor x = mt::tensor({1.0f, 3.0f});
  check_values(kn::scalar(kn::ScalarOp::kMul, x, 0.1), {1.0f * 0.1f, 3.0f * 0.1f}, {}, true, "mul 0.1 f32");
  // Integers: integral scalars only.
  const Tensor i = mt::tensor<int64_t>({-3, 0, 7});
  check_values(kn::scalar(kn::ScalarOp::kAdd, i, 5), {2, 5, 12}, {}, true, "add_scalar i64");
  check_values(kn::scalar(kn::ScalarOp::kMul, i, -2), {6, 0, -14}, {}, true, "mul_scalar i64");
  check_values(kn::scalar(kn::ScalarOp::kRsub, i, 1), {4, 1, -6}, {}, true, "rsub_scalar i64");
  check_values(kn::scalar(kn::ScalarOp::kMaximum, i, 0), {0, 0, 7}, {}, true, "maximum_scalar i64");
  BOOST_TEST((kn::scalar(kn::ScalarOp::kAdd, i, 5).dtype() == DType::kI64));
}

BOOST_AUTO_TEST_CASE(where_selects_with_broadcast, *utf::label("cpu")) {
  const Shape shape{3, 4, 5};
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8,
                      DType::kBool}) {
    const Tensor cond = mt::randint(0, 2, {3, 1, 5}).to(DType::kBool);
    const int64_t hi = dtype == DType::kBool ? 2 : 100;
    const Tensor a = mt::randint(0, hi, {4, 5}, dtype).transpose(0, 1).contiguous().transpose(0, 1);
    const Tensor b = mt::randint(0, hi, {}, dtype);
    const Tensor y = kn::where(cond, a, b);
    const std::string config = describe("where dtype=", dtype, " cond [3, 1, 5], a [4, 5] (transposed), b []");
    check_shape(y, shape, dtype, config);
    const std::vector<double> cv = broadcast_values(cond, shape), av = broadcast_values(a, shape),
                              bv = broadcast_values(b, shape);
    std::vector<double> want(cv.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = cv[i] != 0 ? av[i] : bv[i];
    check_values(y, want, {}, true, config);
  }
  // NaN payloads pass through untouched.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  check_values(kn::where(mt::tensor({true, false}), mt::tensor({nan, 1.0}), mt::tensor({2.0, nan})), {nan, nan}, {},
               true, "where NaN");
}

// ---- reductions ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(reductions_over_dims_match_f64_references, *utf::label("cpu")) {
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {2, 0}, {-3, -2}, {0, 1, 2}};
  const kn::ReduceOp ops[] = {kn::ReduceOp::kSum, kn::ReduceOp::kMean, kn::ReduceOp::kMax,
                              kn::ReduceOp::kMin, kn::ReduceOp::kArgmax, kn::ReduceOp::kArgmin};
  uint64_t seed = 9000;
  for (DType dtype : kFloatTypes) {
    for (bool transposed : {false, true}) {
      ++seed;
      // Sums on [-0.5, 1.5): a positive mean keeps |sum| well above the rounding noise of its terms.
      Tensor x = input({6, 7, 9}, dtype, -0.5, 1.5, seed);
      if (transposed) x = input({9, 7, 6}, dtype, -0.5, 1.5, seed).transpose(0, 2);
      for (kn::ReduceOp op : ops) {
        const bool exact = op != kn::ReduceOp::kSum && op != kn::ReduceOp::kMean;
        for (const auto& dims : dim_sets)
          for (bool keepdim : {false, true})
            check_reduce(op, x, dims, keepdim, std::nullopt,
                         describe("seed=", seed, transposed ? " transposed" : " contiguous"),
                         mt::test::tolerance(dtype), exact);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(reduction_shapes_and_layouts, *utf::label("cpu")) {
  uint64_t seed = 9500;
  const Tolerance f32 = mt::test::tolerance(DType::kF32);
  // Column sums (reduction dim outermost), row sums, a few long reductions
  // (the chunked path: 3 outputs of 100000), and a long strided one.
  check_reduce(kn::ReduceOp::kSum, input({1000, 300}, DType::kF32, -0.5, 1.5, ++seed), {0}, false, {}, "columns", f32,
               false);
  check_reduce(kn::ReduceOp::kSum, input({300, 1000}, DType::kF32, -0.5, 1.5, ++seed), {1}, true, {}, "rows", f32,
               false);
  check_reduce(kn::ReduceOp::kMean, input({3, 100000}, DType::kF32, -0.5, 1.5, ++seed), {1}, false, {}, "3 long rows",
               f32, false);
  check_reduce(kn::ReduceOp::kSum, input({100000, 3}, DType::kF32, -0.5, 1.5, ++seed), {0}, false, {},
               "3 long strided columns", f32, false);
  check_reduce(kn::ReduceOp::kArgmax, input({3, 100000}, DType::kBF16, -4, 4, ++seed), {1}, false, {},
               "argmax of long bf16 rows (ties likely)", {}, true);
  check_reduce(kn::ReduceOp::kMin, input({100000, 3}, DType::kF16, -4, 4, ++seed), {0}, true, {},
               "min of long f16 columns", {}, true);
  // Column reductions over tiles of adjacent outputs: ragged last tile, long columns, ties, NaN.
  check_reduce(kn::ReduceOp::kSum, input({50, 150}, DType::kF16, -0.5, 1.5, ++seed), {0}, true, {},
               "columns, ragged tile", mt::test::tolerance(DType::kF16), false);
  check_reduce(kn::ReduceOp::kSum, input({70000, 20}, DType::kF32, -0.5, 1.5, ++seed), {0}, false, {},
               "long columns", f32, false);
  check_reduce(kn::ReduceOp::kArgmax, input({70000, 20}, DType::kBF16, -4, 4, ++seed), {0}, false, {},
               "argmax of long bf16 columns (ties likely)", {}, true);
  check_reduce(kn::ReduceOp::kArgmin, input({5, 300, 12}, DType::kF16, -4, 4, ++seed), {0, 1}, false, {},
               "argmin over two outer dims", {}, true);
  Tensor with_nan = input({40, 30}, DType::kF32, -4, 4, ++seed);
  with_nan.set({7, 3}, std::numeric_limits<double>::quiet_NaN());
  with_nan.set({20, 3}, std::numeric_limits<double>::quiet_NaN());
  for (kn::ReduceOp op : {kn::ReduceOp::kMax, kn::ReduceOp::kMin, kn::ReduceOp::kArgmax, kn::ReduceOp::kArgmin})
    check_reduce(op, with_nan, {0}, false, {}, "columns with NaN", {}, true);
  // Strided and expanded inputs, and a 0-d one.
  check_reduce(kn::ReduceOp::kSum, input({40, 50}, DType::kF64, -0.5, 1.5, ++seed, Layout::kStrided), {1}, false, {},
               "strided", mt::test::tolerance(DType::kF64), false);
  check_reduce(kn::ReduceOp::kMax, input({40, 50}, DType::kF32, -4, 4, ++seed, Layout::kExpanded), {0}, false, {},
               "expanded", {}, true);
  check_reduce(kn::ReduceOp::kSum, mt::scalar_tensor(2.5), {}, false, {}, "0-d", f32, true);
  check_reduce(kn::ReduceOp::kArgmax, mt::scalar_tensor(2.5), {0}, true, {}, "0-d dim 0", {}, true);
}

BOOST_AUTO_TEST_CASE(sum_of_ten_million_f32_stays_within_1e_6_of_f64, *utf::label("cpu")) {
  const int64_t n = 10'000'000;
  const Tensor x = input({n}, DType::kF32, 0, 1, 42);
  const std::vector<double> xv = values(x);
  long double want = 0;
  for (double v : xv) want += v;
  const Tensor got = mt::test::reduce(kn::ReduceOp::kSum, x, {}, false);
  const double rel = std::fabs(got.item<double>() - static_cast<double>(want)) / static_cast<double>(want);
  BOOST_TEST(rel < 1e-6, "sum of 1e7 f32 (seed 42): got " << got.item<double>() << ", f64 sum "
                                                           << static_cast<double>(want) << ", relative error " << rel);
  // Fixed chunks and a fixed combination order: the same bits every time.
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, x, {}, false).item<float>() == got.item<float>());
  // Mean as well, and as f64 statistics of f32 data.
  const Tensor mean = mt::test::reduce(kn::ReduceOp::kMean, x, {}, false, DType::kF64);
  BOOST_TEST(mean.dtype() == DType::kF64);
  BOOST_TEST(std::fabs(mean.item<double>() - static_cast<double>(want / n)) < 1e-12);
}

BOOST_AUTO_TEST_CASE(f16_and_bf16_statistics_in_f32, *utf::label("cpu")) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    // 2^16 ones round to 65536, which f16 cannot hold: the f32 result can.
    const Tensor ones = mt::ones({1 << 16}, dtype);
    const Tensor s = mt::test::reduce(kn::ReduceOp::kSum, ones, {}, false, DType::kF32);
    BOOST_TEST(s.dtype() == DType::kF32);
    BOOST_TEST(s.item<double>() == 65536.0);
    const Tensor x = input({64, 300}, dtype, -0.5, 1.5, 77);
    check_reduce(kn::ReduceOp::kSum, x, {1}, false, DType::kF32, "f32 out, seed=77", mt::test::tolerance(DType::kF32),
                 false);
    check_reduce(kn::ReduceOp::kMean, x, {0}, true, DType::kF32, "f32 out, seed=77", mt::test::tolerance(DType::kF32),
                 false);
  }
}

BOOST_AUTO_TEST_CASE(argmax_ties_nan_and_integer_reductions, *utf::label("cpu")) {
  // Ties: the first index wins.
  const Tensor t = mt::tensor({3.0f, 1.0f, 3.0f, 2.0f, 1.0f});
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmax, t, {}, false).item<int64_t>() == 0);
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmin, t, {}, false).item<int64_t>() == 1);
  // Ties across the fixed chunks of a long reduction.
  Tensor z = mt::zeros({100000});
  z.set({40000}, 1.0);
  z.set({90000}, 1.0);
  z.set({70000}, -1.0);
  z.set({99999}, -1.0);
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmax, z, {}, false).item<int64_t>() == 40000);
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmin, z, {}, false).item<int64_t>() == 70000);
  // NaN is the max and the min; the first NaN wins; max/min propagate it.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kFloatTypes) {
    const Tensor n = mt::tensor({1.0, nan, 5.0, nan}, dtype);
    BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmax, n, {}, false).item<int64_t>() == 1);
    BOOST_TEST(mt::test::reduce(kn::ReduceOp::kArgmin, n, {}, false).item<int64_t>() == 1);
    BOOST_TEST(std::isnan(mt::test::reduce(kn::ReduceOp::kMax, n, {}, false).item<double>()));
    BOOST_TEST(std::isnan(mt::test::reduce(kn::ReduceOp::kMin, n, {}, false).item<double>()));
    BOOST_TEST(std::isnan(mt::test::reduce(kn::ReduceOp::kSum, n, {}, false).item<double>()));
  }
  // Per row, 2-D, with ties.
  const Tensor m = mt::tensor({1.0, 4.0, 4.0, 7.0, 7.0, 0.0}).view({2, 3});
  check_values(mt::test::reduce(kn::ReduceOp::kArgmax, m, std::vector<int64_t>{1}, false), {1, 0}, {}, true,
               "argmax rows");
  check_values(mt::test::reduce(kn::ReduceOp::kArgmax, m, std::vector<int64_t>{0}, true), {1, 1, 0}, {}, true,
               "argmax columns");
  // Integers sum in i64; bool counts.
  const Tensor i = mt::randint(-1000, 1000, {50, 40}, DType::kI32);
  check_reduce(kn::ReduceOp::kSum, i, {1}, false, std::nullopt, "i32 sum", {}, true);
  check_reduce(kn::ReduceOp::kMax, i, {0}, false, std::nullopt, "i32 max", {}, true);
  check_reduce(kn::ReduceOp::kArgmin, i, {}, false, std::nullopt, "i32 argmin", {}, true);
  const Tensor b = mt::tensor({true, false, true, true});
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, b, {}, false).item<int64_t>() == 3);
  BOOST_TEST((mt::test::reduce(kn::ReduceOp::kSum, b, {}, false).dtype() == DType::kI64));
}

BOOST_AUTO_TEST_CASE(empty_reductions, *utf::label("cpu")) {
  const Tensor e = mt::zeros({3, 0});
  const std::vector<int64_t> dim1{1}, dim0{0};
  check_values(mt::test::reduce(kn::ReduceOp::kSum, e, dim1, false), {0, 0, 0}, {}, true, "sum over an empty dim");
  const Tensor mean = mt::test::reduce(kn::ReduceOp::kMean, e, dim1, true);
  check_shape(mean, {3, 1}, DType::kF32, "mean over an empty dim");
  check_values(mean, std::vector<double>(3, std::numeric_limits<double>::quiet_NaN()), {}, true, "mean of nothing");
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, e, {}, false).item<double>() == 0.0);
  // Reducing a non-empty dim of an empty tensor gives an empty result, for max too.
  check_shape(mt::test::reduce(kn::ReduceOp::kMax, e, dim0, false), {0}, DType::kF32, "max over dim 0 of [3, 0]");
  check_shape(mt::test::reduce(kn::ReduceOp::kArgmax, e, dim0, true), {1, 0}, DType::kI64, "argmax over dim 0 of [3, 0]");
}

// ---- matmul ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(matmul_naive_is_the_textbook_product, *utf::label("cpu")) {
  const Tensor a = mt::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}).view({2, 3});
  const Tensor b = mt::tensor({7.0, 8.0, 9.0, 10.0, 11.0, 12.0}).view({3, 2});
  check_values(kn::cpu::matmul_naive(a, b), {58, 64, 139, 154}, {}, true, "matmul_naive 2x3 @ 3x2");
  check_values(kn::cpu::matmul_naive(a.t(), a), {17, 22, 27, 22, 29, 36, 27, 36, 45}, {}, true,
               "matmul_naive transposed");
  // f16 inputs: f64 accumulation, one rounding to f16.
  const Tensor h = mt::tensor({1.0, 1e-3, 1.0, 1.0}, DType::kF16).view({2, 2});
  const std::vector<double> hv = values(h);
  check_values(kn::cpu::matmul_naive(h, h),
               {round_to(DType::kF16, hv[0] * hv[0] + hv[1] * hv[2]), round_to(DType::kF16, hv[0] * hv[1] + hv[1] * hv[3]),
                round_to(DType::kF16, hv[2] * hv[0] + hv[3] * hv[2]), round_to(DType::kF16, hv[2] * hv[1] + hv[3] * hv[3])},
               {}, true, "matmul_naive f16");
}

BOOST_AUTO_TEST_CASE(matmul_2d_every_dtype_and_layout, *utf::label("cpu")) {
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
    check_values(naive, ref.c, mt::test::tolerance(DType::kF64), false, "matmul_naive vs the test's own loop " + config);
    // Same override as check_matmul: the f32 accumulation error grows with k.
    const std::vector<double> slack = accumulation_slack(ref, 300, dtype);
    check_values(mt::test::matmul(a, b), values(naive), mt::test::tolerance(dtype), false, "matmul vs matmul_naive " + config,
                 &slack);
  }
}

BOOST_AUTO_TEST_CASE(matmul_f16_bf16_with_f32_output, *utf::label("cpu")) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const Tensor a = input({64, 128}, dtype, -1, 1, 31), b = input({128, 48}, dtype, -1, 1, 32, Layout::kTransposed);
    check_matmul(a, b, DType::kF32, "f32 out, seeds 31/32");
    check_matmul(a, b, std::nullopt, "default out, seeds 31/32");
    // The f16/bf16 result is the f32 result rounded once.
    const Tensor wide = mt::test::matmul(a, b, DType::kF32), narrow = mt::test::matmul(a, b);
    std::vector<double> want = values(wide);
    for (double& v : want) v = round_to(dtype, v);
    check_values(narrow, want, {}, true, describe("matmul ", dtype, " == round(f32 matmul)"));
  }
}

BOOST_AUTO_TEST_CASE(matmul_shape_rules, *utf::label("cpu")) {
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

BOOST_AUTO_TEST_CASE(matmul_reads_transposed_views_in_place, *utf::label("cpu")) {
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
  check_matmul(a, b, std::nullopt, "transposed views, seeds 51/52");
}

// ---- misuse -----------------------------------------------------------------------------------

// ---- fused cross-entropy ------------------------------------------------------------

namespace {

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
  check_shape(r.loss, {rows}, A, config + ", loss");
  check_shape(r.lse, {rows}, A, config + ", lse");
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
  check_values(r.loss, loss, mt::test::tolerance(A), false, config + ", loss");
  check_values(r.lse, lse, mt::test::tolerance(A), false, config + ", lse");
  // The reductions: Σ loss, the counted rows (every third is ignored) and their quotient.
  double sum = 0;
  for (double l : loss) sum += l;
  const double counted = static_cast<double>(rows - (rows + 1) / 3);
  check_shape(r.sum, {}, A, config + ", sum");
  check_values(r.sum, {sum}, mt::test::tolerance(A), false, config + ", sum");
  check_values(r.count, {counted}, {0, 0}, false, config + ", count");
  check_values(r.mean, {sum / counted}, mt::test::tolerance(A), false, config + ", mean");

  const Tensor w = mt::randn({rows}).to(A);
  const Tensor dx = kn::cross_entropy_backward(x, target, r.lse, w, -100, eps, Tensor());
  check_shape(dx, x.shape(), dt, config + ", dx");
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
  check_values(dx, want, mt::test::tolerance(dt), false, config + ", dx");

  // The mean's backward: one scale in the logits' dtype divided by the count in the kernel equals the quotient
  // passed as the scale (0.75 is exact in every dtype, 0.75 / 3 = 0.25 too).
  const Tensor dx_div = kn::cross_entropy_backward(x, target, r.lse, mt::from_vector<double>({0.75}, {1}, dt), -100,
                                                   eps, mt::scalar_tensor(3.0, A));
  const Tensor dx_quot =
      kn::cross_entropy_backward(x, target, r.lse, mt::from_vector<double>({0.25}, {1}, A), -100, eps, Tensor());
  check_values(dx_div, values(dx_quot), {0, 0}, true, config + ", dx with a divisor");
}

}  // namespace

BOOST_AUTO_TEST_CASE(cross_entropy_matches_f64_reference, *utf::label("cpu")) {
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

BOOST_AUTO_TEST_CASE(cross_entropy_edge_rows, *utf::label("cpu")) {
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
  check_values(dx, values(dx_rows), {0, 0}, true, "cross_entropy_backward, one scale for every row");
  const std::vector<double> g = values(dx);
  BOOST_TEST(g[0] == 0.0);
  BOOST_TEST(g[1] == 0.0);
  BOOST_TEST(g[2] == 0.0);
  BOOST_TEST(g[4] == 0.0);  // exp(−inf − lse) = 0
  // With smoothing, a −inf logit in a counted row makes its loss +inf (as Σ_c log p_c is −inf).
  BOOST_TEST(values(kn::cross_entropy(x, target, -100, 0.1).loss)[1] == inf);
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

BOOST_AUTO_TEST_CASE(cross_entropy_misuse, *utf::label("cpu")) {
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

BOOST_AUTO_TEST_CASE(kernel_invariants_are_checked_at_the_entry_point, *utf::label("cpu")) {
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
  expect_error([&] { kn::matmul(f32, f16.t(), DType::kF32); }, {"kernels::matmul: its invariant", "f16 [3, 2]"});
  expect_error([&] { kn::reduce(kn::ReduceOp::kArgmax, f32, std::vector<int64_t>{0, 1}, false, DType::kF32); },
               {"kernels::reduce: its invariant", "out_dtype = f32"});
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

BOOST_AUTO_TEST_CASE(misuse_gets_errors_naming_op_shapes_and_dtypes, *utf::label("cpu")) {
  // The same mistakes made through what users call: each op checks its arguments once, in its forward.
  const Tensor f32 = mt::zeros({2, 3}), f16 = mt::zeros({2, 3}, DType::kF16), i64 = mt::zeros({2, 3}, DType::kI64);
  expect_error([&] { mt::mul(f32, mt::zeros({4})); }, {"mul: shapes [2, 3] and [4]", "cannot be broadcast"});
  expect_error([&] { mt::div(i64, i64); }, {"div: expected a floating dtype", "i64"});
  expect_error([&] { mt::exp(i64); }, {"exp: expected a floating dtype", "i64", "[2, 3]"});
  expect_error([&] { mt::neg(mt::zeros({2}, DType::kBool)); }, {"neg:", "bool"});
  expect_error([&] { mt::add(i64, 0.5); }, {"add_scalar: the scalar 0.5 is not an integer", "i64"});
  expect_error([&] { mt::matmul(mt::zeros({2, 3}), mt::zeros({4, 5})); },
               {"matmul: shapes cannot be multiplied ([2, 3] and [4, 5])"});
  expect_error([&] { mt::matmul(i64, i64.t()); }, {"matmul:", "i64"});
  expect_error([&] { mt::matmul(f32, f16.t()); }, {"matmul:", "f32", "f16", "one dtype"});
  expect_error([&] { mt::matmul(mt::zeros({2, 2, 3}), mt::zeros({3, 3, 4})); }, {"matmul:", "batch",
                                                                                "[2, 2, 3]", "[3, 3, 4]"});
  expect_error([&] { mt::matmul(mt::scalar_tensor(1.0), f32); }, {"matmul:", "at least 1 dim"});
  expect_error([&] { mt::linear(i64, i64); }, {"linear:", "floating", "i64"});
  expect_error([&] { mt::sum(f32, {3}); }, {"sum: dim 3 is out of range", "[2, 3]"});
  expect_error([&] { mt::sum(f32, {1, -1}); }, {"sum: dim 1 appears more than once", "[1, -1]", "[2, 3]"});
  expect_error([&] { mt::max(mt::zeros({3, 0}), 1); }, {"max: cannot reduce over zero elements", "[3, 0]"});
  expect_error([&] { mt::argmax(mt::zeros({0})); }, {"argmax:", "[0]"});
  expect_error([&] { mt::mean(i64); }, {"mean: expected a floating dtype", "i64"});
  expect_error([&] { mt::relu(Tensor()); }, {"relu:", "undefined"});
}

BOOST_AUTO_TEST_CASE(device_mismatch_names_both_devices, MT_GPU_TEST) {
  const Tensor cpu = mt::zeros({2, 3}), gpu = mt::zeros({2, 3}, mt::Device::cuda());
  expect_error([&] { mt::add(cpu, gpu); }, {"add: expected 'a' and 'b' on the same device", "cpu", "cuda:0", "[2, 3]"});
  expect_error([&] { mt::matmul(cpu, gpu.t()); }, {"matmul:", "cpu", "cuda:0"});
  expect_error([&] { kn::binary(kn::BinaryOp::kAdd, cpu, gpu); },
               {"kernels::binary: expected every tensor on one device", "cpu", "cuda:0"});
}

BOOST_AUTO_TEST_SUITE_END()
