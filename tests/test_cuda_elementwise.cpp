// tests/test_cuda_elementwise.cpp — the CUDA elementwise, reduction and matmul kernels against the CPU reference.
//
// Every case runs one kernel through ops/kernels.h twice, on a CPU tensor and
// on the same values moved to the GPU, and compares the results with the
// dtype's tolerance from tests/tolerance.h (DESIGN.md, "Backends": the CPU is
// the reference). Shapes cover both kernel paths of cuda/elementwise.cu: dense
// and 16-byte aligned (the vector path, with its scalar tail: 1, 7, 1023,
// 65537 and 1<<22 elements) and everything else (transposed, sliced with a
// step, broadcast, and views offset by one element so no vector load is
// aligned). Reductions cover every layout of cuda/reduce.cu: short and long
// rows, rows split in pieces (the two-pass full reduction), column sums,
// dims that need a copy, keepdim, empty reductions.
//
// Allocations are poisoned (0xFF: NaN in every float dtype), so an output
// element a kernel forgot to write fails the comparison.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <mixtape/cuda/testing.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/ops/backend/kernels.h>

#include "kernel_calls.h"
#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace k = mixtape::kernels;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;

namespace {

constexpr DType kFloatDTypes[] = {mt::kF32, mt::kF16, mt::kBF16};
constexpr int64_t kSizes[] = {1, 7, 1023, 65537, int64_t{1} << 22};

/// Turns on allocation poisoning for the suite (see the file comment).
struct PoisonAllocations {
  PoisonAllocations() { mt::cuda::set_poison_allocations(true); }
  ~PoisonAllocations() { mt::cuda::set_poison_allocations(false); }
};

/// Values of `dtype` uniform in [lo, hi) (integers: whole numbers in that range), on the CPU.
Tensor random(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed) {
  mt::Generator gen(seed);
  if (!mt::is_floating(dtype))
    return mt::randint(static_cast<int64_t>(lo), static_cast<int64_t>(hi), shape, mt::TensorOptions(mt::kI64), &gen)
        .to(dtype);
  return mt::uniform(shape, lo, hi, mt::TensorOptions(mt::kF32), &gen).to(dtype);
}

/// Compares `got` (any device) with the CPU result `want` element by element: |g - w| <= atol + rtol |w| +
/// allowance[i] (allowance empty: none); NaN matches NaN, infinities match exactly. A failure prints `what`
/// and the first few mismatches.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what, mt::test::Tolerance tol,
                  const std::vector<double>& allowance = {}) {
  BOOST_TEST_REQUIRE(got.dtype() == want.dtype(), what << ": dtype " << got.dtype() << " vs " << want.dtype());
  BOOST_TEST_REQUIRE(got.shape() == want.shape(), what << ": shape " << got.shape() << " vs " << want.shape());
  const std::vector<double> g = got.cpu().to_vector<double>(), w = want.to_vector<double>();
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i], b = w[i];
    bool ok;
    if (std::isnan(b)) ok = std::isnan(a);
    else if (std::isinf(b)) ok = a == b;
    else ok = std::fabs(a - b) <= tol.atol + tol.rtol * std::fabs(b) + (allowance.empty() ? 0.0 : allowance[i]);
    if (!ok && bad++ < 5) first << "\n  [" << i << "] got " << a << ", want " << b;
  }
  BOOST_TEST(bad == 0, what << ": " << bad << " of " << g.size() << " elements differ (dtype " << want.dtype()
                            << ", shape " << want.shape() << ", rtol " << tol.rtol << ", atol " << tol.atol << ")"
                            << first.str());
}

/// The same view of `t`'s values on the GPU: storage copied whole, so strides and offset carry over.
Tensor same_view_on_gpu(const Tensor& t) {
  const int64_t extent = t.storage_offset() + [&] {
    int64_t e = 1;
    for (int64_t d = 0; d < t.dim(); ++d) e += (t.size(d) - 1) * t.stride(d);
    return t.numel() == 0 ? int64_t{0} : e;
  }();
  const Tensor base = mt::raw::as_strided(t, Shape{extent}, Shape{1}, 0);
  return mt::raw::as_strided(base.to(Device::cuda()), t.shape(), t.strides(), t.storage_offset());
}

std::string describe(const char* op, DType dtype, const Shape& shape, const char* layout) {
  std::ostringstream os;
  os << op << " (dtype " << dtype << ", shape " << shape << ", " << layout << ")";
  return os.str();
}

// Inputs away from each op's poles and kinks: positive for log/sqrt/rsqrt/reciprocal/pow.
bool needs_positive(k::UnaryOp op) {
  using enum k::UnaryOp;
  return op == kLog || op == kSqrt || op == kRsqrt || op == kReciprocal;
}

constexpr k::UnaryOp kUnaryOps[] = {
    k::UnaryOp::kNeg,   k::UnaryOp::kAbs,  k::UnaryOp::kSign,     k::UnaryOp::kSquare,  k::UnaryOp::kReciprocal,
    k::UnaryOp::kExp,   k::UnaryOp::kLog,  k::UnaryOp::kSqrt,     k::UnaryOp::kRsqrt,   k::UnaryOp::kRelu,
    k::UnaryOp::kGelu,  k::UnaryOp::kGeluTanh, k::UnaryOp::kSigmoid, k::UnaryOp::kTanh};
constexpr k::BinaryOp kBinaryOps[] = {
    k::BinaryOp::kAdd, k::BinaryOp::kSub, k::BinaryOp::kMul, k::BinaryOp::kDiv, k::BinaryOp::kMaximum,
    k::BinaryOp::kMinimum, k::BinaryOp::kPow, k::BinaryOp::kReluBackward, k::BinaryOp::kGeluBackward,
    k::BinaryOp::kGeluTanhBackward, k::BinaryOp::kSigmoidBackward, k::BinaryOp::kTanhBackward,
    k::BinaryOp::kEq, k::BinaryOp::kNe, k::BinaryOp::kLt, k::BinaryOp::kLe, k::BinaryOp::kGt, k::BinaryOp::kGe};
constexpr k::ScalarOp kScalarOps[] = {k::ScalarOp::kAdd,  k::ScalarOp::kMul,  k::ScalarOp::kPow,
                                      k::ScalarOp::kRsub, k::ScalarOp::kRdiv, k::ScalarOp::kDiv,
                                      k::ScalarOp::kMaximum, k::ScalarOp::kMinimum};
constexpr k::ReduceOp kReduceOps[] = {k::ReduceOp::kSum, k::ReduceOp::kMean,   k::ReduceOp::kMax,
                                      k::ReduceOp::kMin, k::ReduceOp::kArgmax, k::ReduceOp::kArgmin};

static_assert(std::size(kUnaryOps) == 14 && std::size(kBinaryOps) == 18 && std::size(kScalarOps) == 8 &&
              std::size(kReduceOps) == 6, "a kernel enum grew: add its ops to these lists");

/// Views of a dense (2n) tensor of n elements each: the first n (dense, aligned), elements 1..n (dense,
/// misaligned by one element), every second element (a step), and an (r, c) transpose.
Tensor view_aligned(const Tensor& t) { return t.slice(0, 0, t.size(0) / 2); }
Tensor view_misaligned(const Tensor& t) { return t.slice(0, 1, t.size(0) / 2 + 1); }
Tensor view_step(const Tensor& t) { return t.slice(0, 0, t.size(0), 2); }

void check_unary(k::UnaryOp op, DType dtype, const Tensor& x, const char* layout) {
  const Tensor want = k::unary(op, x);
  const Tensor got = k::unary(op, same_view_on_gpu(x));
  expect_close(got, want, describe(k::name(op), dtype, x.shape(), layout), mt::test::tolerance(dtype));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_elementwise)

BOOST_AUTO_TEST_CASE(unary_every_op_dtype_size_and_layout, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 1;
  for (k::UnaryOp op : kUnaryOps) {
    std::vector<DType> dtypes(std::begin(kFloatDTypes), std::end(kFloatDTypes));
    if (op == k::UnaryOp::kNeg || op == k::UnaryOp::kAbs || op == k::UnaryOp::kSign || op == k::UnaryOp::kSquare)
      dtypes.push_back(mt::kI64);
    for (DType dtype : dtypes) {
      const double lo = needs_positive(op) ? 0.1 : -4.0, hi = 4.0;
      for (int64_t n : kSizes) {
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
  for (k::BinaryOp op : kBinaryOps) {
    const bool integers = op == k::BinaryOp::kAdd || op == k::BinaryOp::kSub || op == k::BinaryOp::kMul ||
                          op == k::BinaryOp::kMaximum || op == k::BinaryOp::kMinimum || op >= k::BinaryOp::kEq;
    std::vector<DType> dtypes(std::begin(kFloatDTypes), std::end(kFloatDTypes));
    if (integers) dtypes.push_back(mt::kI64);
    // pow takes a positive base; comparisons draw from few values so that equality happens.
    const bool compare = op >= k::BinaryOp::kEq;
    const double lo = op == k::BinaryOp::kPow ? 0.1 : compare ? 0.0 : -3.0, hi = compare ? 4.0 : 3.0;
    auto draw = [&](const Shape& s, DType dt) {
      Tensor t = random(s, dt, lo, hi, ++seed);
      return compare && mt::is_floating(dt) ? t.to(mt::kI64).to(dt) : t;  // whole numbers: ties and equality
    };
    for (DType dtype : dtypes) {
      auto check = [&](const Tensor& a, const Tensor& b, const char* layout) {
        const Tensor want = k::binary(op, a, b);
        const Tensor got = k::binary(op, same_view_on_gpu(a), same_view_on_gpu(b));
        expect_close(got, want, describe(k::name(op), dtype, want.shape(), layout), mt::test::tolerance(dtype));
      };
      for (int64_t n : kSizes) {
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
  for (k::BinaryOp op : {k::BinaryOp::kEq, k::BinaryOp::kNe, k::BinaryOp::kLt, k::BinaryOp::kGe})
    expect_close(k::binary(op, a.cuda(), b.cuda()), k::binary(op, a, b), describe(k::name(op), mt::kBool, a.shape(), "bool"),
                 mt::test::tolerance(mt::kBool));
}

BOOST_AUTO_TEST_CASE(binary_special_values, MT_GPU_TEST) {
  // NaN propagation of maximum/minimum and comparisons with NaN and infinities, in every float dtype.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloatDTypes) {
    const Tensor a = mt::tensor({nan, 1.0, -inf, 2.0, nan, 0.0, -0.0}).to(dtype);
    const Tensor b = mt::tensor({1.0, nan, 3.0, inf, nan, -0.0, 0.0}).to(dtype);
    for (k::BinaryOp op : kBinaryOps) {
      if (op == k::BinaryOp::kPow) continue;
      expect_close(k::binary(op, a.cuda(), b.cuda()), k::binary(op, a, b), describe(k::name(op), dtype, a.shape(), "NaN/inf"),
                   mt::test::tolerance(dtype));
    }
  }
}

BOOST_AUTO_TEST_CASE(scalar_every_op_dtype_size_and_layout, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 200;
  for (k::ScalarOp op : kScalarOps) {
    const bool integers = op == k::ScalarOp::kAdd || op == k::ScalarOp::kMul || op == k::ScalarOp::kRsub ||
                          op == k::ScalarOp::kMaximum || op == k::ScalarOp::kMinimum;
    std::vector<DType> dtypes(std::begin(kFloatDTypes), std::end(kFloatDTypes));
    if (integers) dtypes.push_back(mt::kI64);
    const bool positive = op == k::ScalarOp::kPow || op == k::ScalarOp::kRdiv;
    for (DType dtype : dtypes) {
      const double s = mt::is_floating(dtype) ? (op == k::ScalarOp::kPow ? 1.7 : -0.3) : -3.0;
      for (int64_t n : kSizes) {
        const Tensor dense = random({2 * n}, dtype, positive ? 0.1 : -3.0, 3.0, ++seed);
        for (const auto& [x, layout] : {std::pair{view_aligned(dense), "dense"},
                                        std::pair{view_misaligned(dense), "offset by one element"},
                                        std::pair{view_step(dense), "step 2"}}) {
          expect_close(k::scalar(op, same_view_on_gpu(x), s), k::scalar(op, x, s),
                       describe(k::name(op), dtype, x.shape(), layout), mt::test::tolerance(dtype));
        }
      }
      const Tensor m = random({40, 70}, dtype, positive ? 0.1 : -3.0, 3.0, ++seed).t();
      expect_close(k::scalar(op, same_view_on_gpu(m), s), k::scalar(op, m, s),
                   describe(k::name(op), dtype, m.shape(), "transposed"), mt::test::tolerance(dtype));
    }
  }
}

BOOST_AUTO_TEST_CASE(where_every_dtype_size_and_broadcast, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 300;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64, mt::kF64, mt::kI32, mt::kU8, mt::kBool}) {
    auto check = [&](const Tensor& c, const Tensor& a, const Tensor& b, const char* layout) {
      const Tensor want = k::where(c, a, b);
      expect_close(k::where(same_view_on_gpu(c), same_view_on_gpu(a), same_view_on_gpu(b)), want,
                   describe("where", dtype, want.shape(), layout), mt::test::tolerance(dtype));
    };
    auto draw = [&](const Shape& s) { return random(s, dtype, 0, dtype == mt::kBool ? 2 : 100, ++seed); };
    auto cond = [&](const Shape& s) { return random(s, mt::kI64, 0, 2, ++seed).to(mt::kBool); };
    for (int64_t n : kSizes) {
      const Tensor c = cond({2 * n}), a = draw({2 * n}), b = draw({2 * n});
      check(view_aligned(c), view_aligned(a), view_aligned(b), "dense");
      check(view_misaligned(c), view_aligned(a), view_step(b), "offset and step");
    }
    check(cond({30, 1}), draw({1, 50}), draw({30, 50}).t().t(), "broadcast condition and a");
    check(cond({50, 30}).t(), draw({}), draw({30, 50}), "transposed condition, 0-d a");
  }
}

// ---- reductions -----------------------------------------------------------------------------

namespace {

/// Runs `op` over `dims` on the CPU and on the GPU and compares. Sums and means accumulate in f32 (f64 for f64)
/// in a different order on each backend (CPU: pairwise, GPU: per-thread leaves and a tree), so they get an
/// accumulation-order allowance on top of the dtype's tolerance: 2^-17 (8e-6, about 128 f32 ulps) of the sum of
/// the magnitudes being reduced, a bound on either order's rounding error for these lengths. max/min/arg* are
/// exact: no arithmetic happens.
void check_reduce(k::ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim, const std::string& layout,
                  std::optional<DType> out_dtype = std::nullopt) {
  const Tensor want = mt::test::reduce(op, x, dims, keepdim, out_dtype);
  const Tensor got = mt::test::reduce(op, same_view_on_gpu(x), dims, keepdim, out_dtype);
  std::vector<double> allowance;
  if (op == k::ReduceOp::kSum || op == k::ReduceOp::kMean) {
    if (mt::is_floating(x.dtype())) {
      allowance = mt::test::reduce(op, k::unary(k::UnaryOp::kAbs, x.to(mt::kF64)), dims, keepdim).to_vector<double>();
      for (double& a : allowance) a *= std::ldexp(1.0, -17);
    }
  }
  std::ostringstream what;
  what << k::name(op) << " over dims [";
  for (size_t i = 0; i < dims.size(); ++i) what << (i ? ", " : "") << dims[i];
  what << "]" << (keepdim ? " keepdim" : "") << " of " << x.dtype() << " " << x.shape() << " (" << layout << ")";
  expect_close(got, want, what.str(), mt::test::tolerance(want.dtype()), allowance);
}

std::vector<k::ReduceOp> reduce_ops_for(DType dtype) {
  std::vector<k::ReduceOp> ops(std::begin(kReduceOps), std::end(kReduceOps));
  if (!mt::is_floating(dtype)) ops.erase(std::find(ops.begin(), ops.end(), k::ReduceOp::kMean));
  return ops;
}

/// Whole numbers in [0, 8): argmax/argmin ties everywhere, so "the first index wins" is exercised.
Tensor with_ties(const Shape& shape, DType dtype, uint64_t seed) { return random(shape, mt::kI64, 0, 8, seed).to(dtype); }

}  // namespace

BOOST_AUTO_TEST_CASE(reduce_all_dims_every_size, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 400;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64}) {
    for (k::ReduceOp op : reduce_ops_for(dtype)) {
      for (int64_t n : kSizes) {
        // 1<<22 > 2 * 65536: the two-pass (pieces, then partials) path.
        check_reduce(op, random({n}, dtype, -1.0, 1.0, ++seed), {}, false, "1-D, all dims");
        check_reduce(op, with_ties({n}, dtype, ++seed), {0}, true, "1-D with ties, keepdim");
      }
      check_reduce(op, random({64, 33, 5}, dtype, -1.0, 1.0, ++seed).permute({2, 0, 1}), {}, false,
                   "permuted 3-D, all dims (copied)");
      check_reduce(op, random({3000, 1000}, dtype, -1.0, 1.0, ++seed).slice(1, 0, 1000, 3), {}, false,
                   "sliced with a step, all dims");
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_rows_columns_and_some_dims, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 500;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64}) {
    for (k::ReduceOp op : reduce_ops_for(dtype)) {
      // Rows: short (a warp per row), long (a block per row), split in pieces (two passes).
      check_reduce(op, with_ties({1000, 10}, dtype, ++seed), {1}, false, "short rows");
      check_reduce(op, random({37, 5000}, dtype, -1.0, 1.0, ++seed), {-1}, true, "long rows, keepdim");
      check_reduce(op, random({3, 200001}, dtype, -1.0, 1.0, ++seed), {1}, false, "rows in pieces");
      // Columns: a thread per output (>= 1024 outputs), and few outputs (copied to rows).
      check_reduce(op, with_ties({300, 2048}, dtype, ++seed), {0}, false, "columns");
      check_reduce(op, random({65537, 7}, dtype, -1.0, 1.0, ++seed), {0}, true, "few long columns, keepdim");
      check_reduce(op, random({40, 30, 1100}, dtype, -1.0, 1.0, ++seed), {0, 1}, false, "outer dims (columns)");
      // Non-adjacent dims (copied to rows), transposed input, a broadcast input, size-1 dims.
      check_reduce(op, random({6, 50, 7}, dtype, -1.0, 1.0, ++seed), {0, 2}, false, "dims 0 and 2");
      check_reduce(op, random({6, 50, 7}, dtype, -1.0, 1.0, ++seed), {0, 2}, true, "dims 0 and 2, keepdim");
      check_reduce(op, random({2000, 1100}, dtype, -1.0, 1.0, ++seed).t(), {1}, false, "transposed rows");
      check_reduce(op, random({1, 500}, dtype, -1.0, 1.0, ++seed).expand({300, 500}), {0}, false, "expanded");
      check_reduce(op, random({5, 1, 9}, dtype, -1.0, 1.0, ++seed), {1}, false, "a size-1 dim");
      check_reduce(op, random({}, dtype, -1.0, 1.0, ++seed), {}, false, "0-d");
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_nan_empty_and_out_dtype, MT_GPU_TEST) {
  PoisonAllocations poison;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kFloatDTypes) {
    // NaN propagates through max/min and is the extreme of argmax/argmin (first NaN wins).
    Tensor x = random({4, 3000}, mt::kF32, -1.0, 1.0, 600);
    x.set({1, 17}, nan), x.set({1, 2999}, nan), x.set({3, 2500}, nan);
    x = x.to(dtype);
    for (k::ReduceOp op : kReduceOps) {
      check_reduce(op, x, {1}, false, "rows with NaN");
      check_reduce(op, x.t().contiguous(), {0}, false, "columns with NaN");
    }
    // Sums of nothing are 0, means NaN; f32 statistics of f16/bf16 data; an f64 sum of f32 data.
    check_reduce(k::ReduceOp::kSum, mt::zeros({4, 0}, dtype), {1}, false, "empty rows");
    check_reduce(k::ReduceOp::kMean, mt::zeros({4, 0}, dtype), {1}, false, "empty rows");
    check_reduce(k::ReduceOp::kSum, mt::zeros({0, 4}, dtype), {1}, false, "no outputs");
    check_reduce(k::ReduceOp::kSum, random({100, 700}, dtype, -1.0, 1.0, 601), {1}, false, "f32 out", mt::kF32);
    check_reduce(k::ReduceOp::kMean, random({100, 700}, dtype, -1.0, 1.0, 602), {0}, false, "f32 out", mt::kF32);
    check_reduce(k::ReduceOp::kSum, random({100, 700}, dtype, -1.0, 1.0, 603), {}, false, "f64 out", mt::kF64);
  }
  // Integer and bool sums give i64; an i32 sum may ask for i32.
  check_reduce(k::ReduceOp::kSum, random({50, 300}, mt::kI32, -100, 100, 604), {1}, false, "i32");
  check_reduce(k::ReduceOp::kSum, random({50, 300}, mt::kI32, -100, 100, 605), {0}, false, "i32 out", mt::kI32);
  check_reduce(k::ReduceOp::kSum, random({50, 300}, mt::kI64, 0, 2, 606).to(mt::kBool), {}, false, "bool");
  check_reduce(k::ReduceOp::kMax, random({50, 300}, mt::kI64, 0, 2, 607).to(mt::kBool), {1}, false, "bool");
  check_reduce(k::ReduceOp::kArgmin, random({50, 300}, mt::kI64, 0, 200, 608).to(mt::kU8), {1}, false, "u8");
  check_reduce(k::ReduceOp::kSum, random({1000, 30}, mt::kF64, -1.0, 1.0, 609), {0}, false, "f64");
}

// ---- matmul ---------------------------------------------------------------------------------

namespace {

/// Runs matmul on both backends and compares. The two accumulate in different orders (BLAS blocks, the GPU
/// kernel 16-deep tiles with FMA), so each output gets an allowance of 2·k·u·(|a| @ |b|), u the unit roundoff
/// of the accumulator (f32, or f64 for f64): twice the classic worst-case bound of one dot product of length k.
void check_matmul(const Tensor& a, const Tensor& b, const std::string& layout,
                  std::optional<DType> out_dtype = std::nullopt) {
  const Tensor want = mt::test::matmul(a, b, out_dtype);
  const Tensor got = mt::test::matmul(same_view_on_gpu(a), same_view_on_gpu(b), out_dtype);
  const int64_t depth = a.size(-1);
  const double u = a.dtype() == mt::kF64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const Tensor bound = mt::test::matmul(k::unary(k::UnaryOp::kAbs, a.to(mt::kF64)), k::unary(k::UnaryOp::kAbs, b.to(mt::kF64)));
  std::vector<double> allowance = bound.to_vector<double>();
  for (double& v : allowance) v *= 2.0 * static_cast<double>(depth) * u;
  std::ostringstream what;
  what << "matmul of " << a.dtype() << " " << a.shape() << " and " << b.shape() << " (" << layout << ")";
  expect_close(got, want, what.str(), mt::test::tolerance(want.dtype()), allowance);
}

}  // namespace

BOOST_AUTO_TEST_CASE(matmul_shapes_layouts_and_dtypes, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 700;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kF64}) {
    auto draw = [&](const Shape& s) { return random(s, dtype, -1.0, 1.0, ++seed); };
    check_matmul(draw({64, 64}), draw({64, 64}), "one whole tile");
    check_matmul(draw({1, 1}), draw({1, 1}), "1x1x1");
    check_matmul(draw({67, 129}), draw({129, 33}), "ragged edges");
    check_matmul(draw({300, 257}), draw({257, 190}), "several tiles");
    check_matmul(draw({257, 300}).t(), draw({190, 257}).t(), "both transposed, read in place");
    check_matmul(draw({50, 80}).slice(1, 0, 80, 2), draw({40, 70}).slice(1, 5, 70), "sliced operands");
    check_matmul(draw({4, 3, 20, 30}), draw({30, 25}), "batch @ matrix (broadcast weight)");
    check_matmul(draw({3, 1, 20, 30}), draw({5, 30, 25}), "broadcast batch dims");
    check_matmul(draw({6, 30, 20}).transpose(1, 2), draw({6, 30, 25}), "batched transposed");
    check_matmul(draw({30}), draw({30, 25}), "1-D @ 2-D");
    check_matmul(draw({20, 30}), draw({30}), "2-D @ 1-D");
    check_matmul(draw({30}), draw({30}), "1-D @ 1-D");
    check_matmul(draw({2, 20, 30}), draw({30}), "batch @ 1-D");
    check_matmul(draw({20, 0}), draw({0, 25}), "k = 0");
    check_matmul(draw({0, 5}), draw({5, 25}), "m = 0");
  }
  for (DType dtype : {mt::kF16, mt::kBF16}) {
    auto draw = [&](const Shape& s) { return random(s, dtype, -1.0, 1.0, ++seed); };
    check_matmul(draw({100, 200}), draw({200, 70}), "f32 out", mt::kF32);
    check_matmul(draw({2, 100, 200}), draw({70, 200}).t(), "f32 out, transposed weight", mt::kF32);
  }
  check_matmul(random({40, 50}, mt::kF32, -1, 1, 801), random({50, 60}, mt::kF32, -1, 1, 802), "f16 out",
               mt::kF16);
}

BOOST_AUTO_TEST_SUITE_END()
