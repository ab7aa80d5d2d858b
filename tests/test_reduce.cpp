// tests/test_reduce.cpp — the reduction family (ops/reduce.cpp, ops/cpu/reduce.cpp, cuda/reduce.cu): sum, mean,
// max, argmax, min and argmin.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), argmax's ties and its place in the registry, the errors of misuse, the CPU kernels
// against float64 references over every dim set, layout and dtype (tests/reference.h), and the CUDA kernels
// against the CPU's on every layout of cuda/reduce.cu: short and long rows, rows split in pieces (the two-pass
// full reduction), column sums, dims that need a copy, keepdim, empty reductions.
#include "family_test.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>

#include <mixtape/autograd/registry.h>

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
MT_OP_CASE({.op = "min", .label = "all", .f = [](const In& in) { return mt::min(in[0]); },
            .inputs = [] { return In{distinct({4, 3})}; }});
MT_OP_CASE({.op = "min", .label = "dim -2 keepdim of a strided input",
            .f = [](const In& in) { return mt::min(in[0], -2, true); },
            .inputs = [] { return In{non_contiguous(distinct({3, 5}), "strided")}; }});

// ---- the CPU kernels against float64 references -------------------------------------------

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
  expect_shape(got, want_shape, want_dtype, config);
  const std::vector<double> xv = values(x);
  std::vector<double> want;
  for (const auto& group : reduction_groups(x.shape(), reduced)) want.push_back(round_to(want_dtype, ref_reduce(op, xv, group)));
  expect_values(got, want, exact ? kExact : tol, config);
}

// ---- the CUDA kernels against the CPU's --------------------------------------------------------

constexpr kn::ReduceOp kReduceOps[] = {kn::ReduceOp::kSum, kn::ReduceOp::kMean,   kn::ReduceOp::kMax,
                                       kn::ReduceOp::kMin, kn::ReduceOp::kArgmax, kn::ReduceOp::kArgmin};
static_assert(std::size(kReduceOps) == 6, "a kernel enum grew: add its ops to this list");

/// Runs `op` over `dims` on the CPU and on the GPU and compares. Sums and means accumulate in f32 (f64 for f64)
/// in a different order on each backend (CPU: pairwise, GPU: per-thread leaves and a tree), so they get an
/// accumulation-order allowance on top of the dtype's tolerance: 2^-17 (8e-6, about 128 f32 ulps) of the sum of
/// the magnitudes being reduced, a bound on either order's rounding error for these lengths. max/min/arg* are
/// exact: no arithmetic happens.
void check_reduce_on_gpu(kn::ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim,
                         const std::string& layout, std::optional<DType> out_dtype = std::nullopt) {
  const Tensor want = mt::test::reduce(op, x, dims, keepdim, out_dtype);
  const Tensor got = mt::test::reduce(op, same_view_on_gpu(x), dims, keepdim, out_dtype);
  std::vector<double> allowance;
  if (op == kn::ReduceOp::kSum || op == kn::ReduceOp::kMean) {
    if (mt::is_floating(x.dtype())) {
      allowance = mt::test::reduce(op, kn::unary(kn::UnaryOp::kAbs, x.to(mt::kF64)), dims, keepdim).to_vector<double>();
      for (double& a : allowance) a *= std::ldexp(1.0, -17);
    }
  }
  std::ostringstream what;
  what << kn::name(op) << " over dims [";
  for (size_t i = 0; i < dims.size(); ++i) what << (i ? ", " : "") << dims[i];
  what << "]" << (keepdim ? " keepdim" : "") << " of " << x.dtype() << " " << x.shape() << " (" << layout << ")";
  expect_close(got, want, mt::test::tolerance(want.dtype()), what.str(), allowance);
}

std::vector<kn::ReduceOp> reduce_ops_for(DType dtype) {
  std::vector<kn::ReduceOp> ops(std::begin(kReduceOps), std::end(kReduceOps));
  if (!mt::is_floating(dtype)) ops.erase(std::find(ops.begin(), ops.end(), kn::ReduceOp::kMean));
  return ops;
}

/// Whole numbers in [0, 8): argmax/argmin ties everywhere, so "the first index wins" is exercised.
Tensor with_ties(const Shape& shape, DType dtype, uint64_t seed) { return random(shape, mt::kI64, 0, 8, seed).to(dtype); }

}  // namespace

BOOST_AUTO_TEST_SUITE(reduce)

// ---- the ops ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(argmax_ties_pick_the_first_index, MT_CPU_TEST) {
  Tensor x = mt::from_vector<double>({1, 3, 3, 2, 2, 1}, {2, 3}, mt::kF32);
  BOOST_TEST(mt::argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>({1, 0}), tt::per_element());
  BOOST_TEST(mt::argmax(x, 1).dtype() == mt::kI64);
  BOOST_TEST(mt::argmax(x, 0, true).shape() == mt::Shape({1, 3}));
  BOOST_TEST(mt::argmax(mt::from_vector<double>({5, 1, 5}, {3}, mt::kF32)).item<int64_t>() == 0);
  BOOST_TEST(mt::argmax(x).item<int64_t>() == 1);
  // The gradient of max along a dim goes to the first maximal element only.
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

// PyTorch's max() of every element shares dy equally among the elements equal to the result (its
// evenly_distribute_backward), and among the NaNs when the result is NaN; LibTorch 1.13 gives these numbers.
BOOST_AUTO_TEST_CASE(max_of_every_element_shares_the_gradient_among_ties, MT_CPU_TEST) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto grad_of_max = [](const std::vector<double>& v, mt::Shape shape, DType dtype, double dy) {
    Tensor t = mt::from_vector<double>(v, shape, dtype).requires_grad_();
    mt::max(t).backward(mt::full({}, dy, dtype));
    BOOST_TEST((t.grad().dtype() == dtype));
    BOOST_TEST((t.grad().shape() == shape));
    return t.grad().to_vector<double>();
  };
  using V = std::vector<double>;
  BOOST_TEST(grad_of_max({1, 3, 3}, {3}, mt::kF64, 1) == V({0, 0.5, 0.5}), tt::per_element());
  BOOST_TEST(grad_of_max({3, 1, 3, 3, 2, 3}, {2, 3}, mt::kF32, 1) == V({0.25, 0, 0.25, 0.25, 0, 0.25}),
             tt::per_element());
  BOOST_TEST(grad_of_max({1, 7, 3}, {3}, mt::kF32, 2) == V({0, 2, 0}), tt::per_element());
  BOOST_TEST(grad_of_max({inf, 1, inf}, {3}, mt::kF32, 1) == V({0.5, 0, 0.5}), tt::per_element());
  // A NaN result: the NaNs share dy, whatever else is largest.
  BOOST_TEST(grad_of_max({nan, inf, 2, nan}, {4}, mt::kF32, 1) == V({0.5, 0, 0, 0.5}), tt::per_element());
  // A ReLU's zeros: all tied.
  BOOST_TEST(grad_of_max({0, 0, 0, 0}, {2, 2}, mt::kF32, 1) == V({0.25, 0.25, 0.25, 0.25}), tt::per_element());
  // f16 and bf16: dy / k formed in f32 and rounded once (1/3 in f16 is 0x3555, 0.333251953125).
  BOOST_TEST(grad_of_max({2, 2, 2, 1}, {4}, mt::kF16, 1) == V({0.333251953125, 0.333251953125, 0.333251953125, 0}),
             tt::per_element());
  BOOST_TEST(grad_of_max({5, 5}, {1, 2}, mt::kBF16, 3) == V({1.5, 1.5}), tt::per_element());
  for (DType dt : kFloatTypes)  // three ties of five in every floating dtype: 2/3 each, rounded once
    BOOST_TEST_CONTEXT(dt) {
      const double third = mt::from_vector<double>({2.0 / 3}, {1}, dt).item<double>();
      BOOST_TEST(grad_of_max({1, 3, 3, -2, 3}, {5}, dt, 2) == V({0, third, third, 0, third}), tt::per_element());
    }
  // A transposed input: the parts land on the maxima of the view.
  Tensor t = mt::from_vector<double>({4, 1, 4, 0}, {2, 2}, mt::kF32).requires_grad_();
  mt::max(t.t()).backward();
  BOOST_TEST(t.grad().to_vector<double>() == V({0.5, 0, 0.5, 0}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(min_is_max_mirrored, MT_CPU_TEST) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  using V = std::vector<double>;
  // Of every element: ties share dy, a NaN result gives it to the NaNs.
  Tensor t = mt::from_vector<double>({3, -1, 2, -1}, {2, 2}, mt::kF32).requires_grad_();
  const Tensor m = mt::min(t);
  BOOST_TEST(m.item<double>() == -1);
  m.backward();
  BOOST_TEST(t.grad().to_vector<double>() == V({0, 0.5, 0, 0.5}), tt::per_element());
  Tensor n = mt::from_vector<double>({1, nan, -4}, {3}, mt::kF32).requires_grad_();
  mt::min(n).backward();
  BOOST_TEST(n.grad().to_vector<double>() == V({0, 1, 0}), tt::per_element());
  // Along a dim: the first minimum gets dy; argmin names it.
  Tensor x = mt::from_vector<double>({4, 1, 1, 0, 5, 0}, {2, 3}, mt::kF32).requires_grad_();
  const Tensor row_min = mt::min(x, 1, true);
  BOOST_TEST(row_min.shape() == (mt::Shape{2, 1}));
  BOOST_TEST(row_min.to_vector<double>() == V({1, 0}), tt::per_element());
  mt::sum(row_min).backward();
  BOOST_TEST(x.grad().to_vector<double>() == V({0, 1, 0, 1, 0, 0}), tt::per_element());
  BOOST_TEST(mt::argmin(x, 1).to_vector<int64_t>() == (std::vector<int64_t>{1, 0}), tt::per_element());
  BOOST_TEST(mt::argmin(x, 0, true).shape() == (mt::Shape{1, 3}));
  BOOST_TEST(mt::argmin(x).item<int64_t>() == 3);
}

BOOST_AUTO_TEST_CASE(precision_categories, MT_CPU_TEST) {
  auto category = [](const char* op) { return std::string(mt::precision_name(mt::amp::precision_of(op))); };
  for (const char* op : {"sum", "mean"}) BOOST_TEST_CONTEXT(op) { BOOST_TEST(category(op) == "fp32"); }
  BOOST_TEST(category("max") == "passthrough");
  BOOST_TEST(category("argmax") == "passthrough");
}

BOOST_AUTO_TEST_CASE(error_messages, MT_CPU_TEST) {
  BOOST_CHECK_THROW(mt::sum(mt::randn({2, 3}), {0, 0}), mt::Error);
  BOOST_CHECK_THROW(mt::max(mt::randn({0, 3})), mt::Error);
  expect_error([] { mt::min(mt::randn({0, 3})); }, {"min:"});
  expect_error([] { mt::argmin(mt::randn({2, 0}), 1); }, {"argmin:"});
  expect_error([] { mt::min(mt::randn({2, 3}), 2); }, {"min: dim 2 is out of range"});
}

// ---- the CPU kernels -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(reductions_over_dims_match_f64_references, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(reduction_shapes_and_layouts, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(sum_of_ten_million_f32_stays_within_1e_6_of_f64, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(f16_and_bf16_statistics_in_f32, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(argmax_ties_nan_and_integer_reductions, MT_CPU_TEST) {
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
  expect_values(mt::test::reduce(kn::ReduceOp::kArgmax, m, std::vector<int64_t>{1}, false), {1, 0}, kExact,
                "argmax rows");
  expect_values(mt::test::reduce(kn::ReduceOp::kArgmax, m, std::vector<int64_t>{0}, true), {1, 1, 0}, kExact,
                "argmax columns");
  // Integers sum in i64; bool counts.
  const Tensor i = mt::randint(-1000, 1000, {50, 40}, DType::kI32);
  check_reduce(kn::ReduceOp::kSum, i, {1}, false, std::nullopt, "i32 sum", {}, true);
  check_reduce(kn::ReduceOp::kMax, i, {0}, false, std::nullopt, "i32 max", {}, true);
  check_reduce(kn::ReduceOp::kArgmin, i, {}, false, std::nullopt, "i32 argmin", {}, true);
  const Tensor b = mt::tensor({true, false, true, true});
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, b, {}, false).item<int64_t>() == 3);
  BOOST_TEST((mt::test::reduce(kn::ReduceOp::kSum, b, {}, false).dtype() == DType::kI64));
  // Exact past 2^24 and 2^53, where an f32 (f64) accumulator would round: 2^24 + 1 + 1 + (2^53 + 1) − 2^53.
  const Tensor big = mt::from_vector<int64_t>({(int64_t{1} << 24) + 1, 1, (int64_t{1} << 53) + 1, -(int64_t{1} << 53)},
                                              mt::Shape{4});
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, big, {}, false).item<int64_t>() == (int64_t{1} << 24) + 3);
}

BOOST_AUTO_TEST_CASE(a_nan_in_any_partial_reaches_max_and_min, MT_CPU_TEST) {
  // The NaN rule holds where partial results combine, not only inside one: a NaN in a later chunk of a long
  // reduction (chunks of 2^15 elements), in a later run of a strided one (a transposed matrix: a run a column), and
  // in a later leaf of a column reduction (leaves of 32 rows) makes max and min NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kFloatTypes) {
    BOOST_TEST_CONTEXT("dtype " << dtype) {
      Tensor chunks = mt::zeros({100000}, dtype);
      chunks.set({90000}, nan);
      Tensor runs = mt::zeros({8, 50}, dtype);
      runs.set({5, 30}, nan);
      Tensor leaves = mt::zeros({100, 8}, dtype);
      leaves.set({70, 3}, nan);
      for (kn::ReduceOp op : {kn::ReduceOp::kMax, kn::ReduceOp::kMin}) {
        BOOST_TEST(std::isnan(mt::test::reduce(op, chunks, {}, false).item<double>()));
        BOOST_TEST(std::isnan(mt::test::reduce(op, runs.t(), {}, false).item<double>()));
        const std::vector<double> columns =
            mt::test::reduce(op, leaves, std::vector<int64_t>{0}, false).to_vector<double>();
        for (size_t j = 0; j < columns.size(); ++j) BOOST_TEST((j == 3 ? std::isnan(columns[j]) : columns[j] == 0.0));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_reductions, MT_CPU_TEST) {
  const Tensor e = mt::zeros({3, 0});
  const std::vector<int64_t> dim1{1}, dim0{0};
  expect_values(mt::test::reduce(kn::ReduceOp::kSum, e, dim1, false), {0, 0, 0}, kExact, "sum over an empty dim");
  const Tensor mean = mt::test::reduce(kn::ReduceOp::kMean, e, dim1, true);
  expect_shape(mean, {3, 1}, DType::kF32, "mean over an empty dim");
  expect_values(mean, std::vector<double>(3, std::numeric_limits<double>::quiet_NaN()), kExact, "mean of nothing");
  BOOST_TEST(mt::test::reduce(kn::ReduceOp::kSum, e, {}, false).item<double>() == 0.0);
  // Reducing a non-empty dim of an empty tensor gives an empty result, for max too.
  expect_shape(mt::test::reduce(kn::ReduceOp::kMax, e, dim0, false), {0}, DType::kF32, "max over dim 0 of [3, 0]");
  expect_shape(mt::test::reduce(kn::ReduceOp::kArgmax, e, dim0, true), {1, 0}, DType::kI64, "argmax over dim 0 of [3, 0]");
}
BOOST_AUTO_TEST_CASE(kernel_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  // What a kernel cannot be handed without reading memory wrongly: these are bugs in an op, and the message lists
  // every argument the kernel got.
  const Tensor f32 = mt::zeros({2, 3});
  expect_error([&] { kn::reduce(kn::ReduceOp::kArgmax, f32, std::vector<int64_t>{0, 1}, false, DType::kF32); },
               {"kernels::reduce: its invariant", "out_dtype = f32"});
}

BOOST_AUTO_TEST_CASE(misuse_gets_errors_naming_op_shapes_and_dtypes, MT_CPU_TEST) {
  // The same mistakes made through what users call: each op checks its arguments once, in its forward.
  const Tensor f32 = mt::zeros({2, 3}), i64 = mt::zeros({2, 3}, DType::kI64);
  expect_error([&] { mt::sum(f32, {3}); }, {"sum: dim 3 is out of range", "[2, 3]"});
  expect_error([&] { mt::sum(f32, {1, -1}); }, {"sum: dim 1 appears more than once", "[1, -1]", "[2, 3]"});
  expect_error([&] { mt::max(mt::zeros({3, 0}), 1); }, {"max: cannot reduce over zero elements", "[3, 0]"});
  expect_error([&] { mt::argmax(mt::zeros({0})); }, {"argmax:", "[0]"});
  expect_error([&] { mt::mean(i64); }, {"mean: expected a floating dtype", "i64"});
}

// ---- CUDA against the CPU (allocations poisoned: tests/test_util.h) ----------------------------

BOOST_AUTO_TEST_CASE(reduce_all_dims_every_size, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 400;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64}) {
    for (kn::ReduceOp op : reduce_ops_for(dtype)) {
      for (int64_t n : kGpuSizes) {
        // 1<<22 > 2 * 65536: the two-pass (pieces, then partials) path.
        check_reduce_on_gpu(op, random({n}, dtype, -1.0, 1.0, ++seed), {}, false, "1-D, all dims");
        check_reduce_on_gpu(op, with_ties({n}, dtype, ++seed), {0}, true, "1-D with ties, keepdim");
      }
      check_reduce_on_gpu(op, random({64, 33, 5}, dtype, -1.0, 1.0, ++seed).permute({2, 0, 1}), {}, false,
                   "permuted 3-D, all dims (copied)");
      check_reduce_on_gpu(op, random({3000, 1000}, dtype, -1.0, 1.0, ++seed).slice(1, 0, 1000, 3), {}, false,
                   "sliced with a step, all dims");
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_rows_columns_and_some_dims, MT_GPU_TEST) {
  PoisonAllocations poison;
  uint64_t seed = 500;
  for (DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kI64}) {
    for (kn::ReduceOp op : reduce_ops_for(dtype)) {
      // Rows: short (a warp per row), long (a block per row), split in pieces (two passes).
      check_reduce_on_gpu(op, with_ties({1000, 10}, dtype, ++seed), {1}, false, "short rows");
      check_reduce_on_gpu(op, random({37, 5000}, dtype, -1.0, 1.0, ++seed), {-1}, true, "long rows, keepdim");
      check_reduce_on_gpu(op, random({3, 200001}, dtype, -1.0, 1.0, ++seed), {1}, false, "rows in pieces");
      // Columns: a thread per output (>= 1024 outputs); fewer of up to 4096 elements (bias gradients) split among
      // 8 threads each, at and below that length, with unit and strided outputs; few longer ones copied to rows.
      check_reduce_on_gpu(op, with_ties({300, 2048}, dtype, ++seed), {0}, false, "columns");
      check_reduce_on_gpu(op, with_ties({128, 512}, dtype, ++seed), {0}, false, "a batch's columns");
      check_reduce_on_gpu(op, random({128, 10}, dtype, -1.0, 1.0, ++seed), {0}, true, "ten columns, keepdim");
      check_reduce_on_gpu(op, random({4096, 300}, dtype, -1.0, 1.0, ++seed), {0}, false, "split columns' longest");
      check_reduce_on_gpu(op, random({7, 600}, dtype, -1.0, 1.0, ++seed).slice(1, 0, 600, 2), {0}, false,
                          "short strided columns");
      check_reduce_on_gpu(op, random({65537, 7}, dtype, -1.0, 1.0, ++seed), {0}, true, "few long columns, keepdim");
      check_reduce_on_gpu(op, random({40, 30, 1100}, dtype, -1.0, 1.0, ++seed), {0, 1}, false, "outer dims (columns)");
      // Non-adjacent dims (copied to rows), transposed input, a broadcast input, size-1 dims.
      check_reduce_on_gpu(op, random({6, 50, 7}, dtype, -1.0, 1.0, ++seed), {0, 2}, false, "dims 0 and 2");
      check_reduce_on_gpu(op, random({6, 50, 7}, dtype, -1.0, 1.0, ++seed), {0, 2}, true, "dims 0 and 2, keepdim");
      check_reduce_on_gpu(op, random({2000, 1100}, dtype, -1.0, 1.0, ++seed).t(), {1}, false, "transposed rows");
      check_reduce_on_gpu(op, random({1, 500}, dtype, -1.0, 1.0, ++seed).expand({300, 500}), {0}, false, "expanded");
      check_reduce_on_gpu(op, random({5, 1, 9}, dtype, -1.0, 1.0, ++seed), {1}, false, "a size-1 dim");
      check_reduce_on_gpu(op, random({}, dtype, -1.0, 1.0, ++seed), {}, false, "0-d");
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_nan_empty_and_out_dtype, MT_GPU_TEST) {
  PoisonAllocations poison;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kGpuFloatTypes) {
    // NaN propagates through max/min and is the extreme of argmax/argmin (first NaN wins).
    Tensor x = random({4, 3000}, mt::kF32, -1.0, 1.0, 600);
    x.set({1, 17}, nan), x.set({1, 2999}, nan), x.set({3, 2500}, nan);
    x = x.to(dtype);
    for (kn::ReduceOp op : kReduceOps) {
      check_reduce_on_gpu(op, x, {1}, false, "rows with NaN");
      check_reduce_on_gpu(op, x.t().contiguous(), {0}, false, "columns with NaN");
    }
    // Sums of nothing are 0, means NaN; f32 statistics of f16/bf16 data; an f64 sum of f32 data.
    check_reduce_on_gpu(kn::ReduceOp::kSum, mt::zeros({4, 0}, dtype), {1}, false, "empty rows");
    check_reduce_on_gpu(kn::ReduceOp::kMean, mt::zeros({4, 0}, dtype), {1}, false, "empty rows");
    check_reduce_on_gpu(kn::ReduceOp::kSum, mt::zeros({0, 4}, dtype), {1}, false, "no outputs");
    check_reduce_on_gpu(kn::ReduceOp::kSum, random({100, 700}, dtype, -1.0, 1.0, 601), {1}, false, "f32 out", mt::kF32);
    check_reduce_on_gpu(kn::ReduceOp::kMean, random({100, 700}, dtype, -1.0, 1.0, 602), {0}, false, "f32 out", mt::kF32);
    check_reduce_on_gpu(kn::ReduceOp::kSum, random({100, 700}, dtype, -1.0, 1.0, 603), {}, false, "f64 out", mt::kF64);
  }
  // Integer and bool sums give i64; an i32 sum may ask for i32.
  check_reduce_on_gpu(kn::ReduceOp::kSum, random({50, 300}, mt::kI32, -100, 100, 604), {1}, false, "i32");
  check_reduce_on_gpu(kn::ReduceOp::kSum, random({50, 300}, mt::kI32, -100, 100, 605), {0}, false, "i32 out", mt::kI32);
  check_reduce_on_gpu(kn::ReduceOp::kSum, random({50, 300}, mt::kI64, 0, 2, 606).to(mt::kBool), {}, false, "bool");
  check_reduce_on_gpu(kn::ReduceOp::kMax, random({50, 300}, mt::kI64, 0, 2, 607).to(mt::kBool), {1}, false, "bool");
  check_reduce_on_gpu(kn::ReduceOp::kArgmin, random({50, 300}, mt::kI64, 0, 200, 608).to(mt::kU8), {1}, false, "u8");
  check_reduce_on_gpu(kn::ReduceOp::kSum, random({1000, 30}, mt::kF64, -1.0, 1.0, 609), {0}, false, "f64");
}

BOOST_AUTO_TEST_CASE(a_bias_gradient_asks_for_its_output_only, MT_GPU_TEST) {
  // A Linear's bias gradient (a (batch, out) sum over the batch) once copied its input to rows first: 0.25 MiB above
  // the CPU's peak in the MNIST MLP's f32 step (bench_mnist_gpu, 2026-11-27). Its columns are read in place now.
  for (const Shape& shape : {Shape{128, 512}, Shape{128, 10}, Shape{4096, 1000}}) {
    const Tensor x = same_view_on_gpu(random(shape, mt::kF32, -1.0, 1.0, 611));
    mt::cuda::synchronize();
    mt::cuda::reset_peak_memory_stats();
    const int64_t start = mt::cuda::memory_stats().requested_bytes;
    const Tensor sum = mt::test::reduce(kn::ReduceOp::kSum, x, {0}, false);
    const int64_t asked = mt::cuda::memory_stats().peak_requested_bytes - start;
    BOOST_TEST(asked == shape[1] * 4, "sum over dim 0 of f32 " << shape << " on the GPU asked for " << asked
                                          << " bytes at its peak; its output is " << shape[1] * 4);
  }
}

// ---- ties, through the ops (issue 16 item 12) ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(max_and_argmax_ties_along_a_middle_dim, MT_CPU_TEST) {
  // PyTorch 1.13's numbers for torch.max(u, 1, keepdim=True) and torch.argmax: the first maximal index along the
  // dim, and the gradient to that element only. (2, 3, 2): column (0, ·, 1) is {4, 2, 4}, column (1, ·, 0) all 0s.
  const std::vector<double> u = {1, 4, 4, 2, 4, 4, 0, 0, 0, -1, 0, 0};
  for (DType dt : kFloatTypes) {
    BOOST_TEST_CONTEXT("dtype " << dt) {
      Tensor x = mt::from_vector(u, {2, 3, 2}, mt::TensorOptions(dt)).requires_grad_();
      Tensor m = mt::max(x, 1, /*keepdim=*/true);
      BOOST_TEST(m.shape() == Shape({2, 1, 2}));
      BOOST_TEST(m.to_vector<double>() == (std::vector<double>{4, 4, 0, 0}), tt::per_element());
      mt::sum(m * mt::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 1, 2}, mt::TensorOptions(dt))).backward();
      BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 2, 1, 0, 0, 0, 3, 4, 0, 0, 0, 0}),
                 tt::per_element());
      const Tensor v = x.detach();
      BOOST_TEST(mt::argmax(v, 1).to_vector<int64_t>() == (std::vector<int64_t>{1, 0, 0, 0}), tt::per_element());
      BOOST_TEST(mt::argmax(v, 2).to_vector<int64_t>() == (std::vector<int64_t>{1, 0, 0, 0, 0, 0}), tt::per_element());
      BOOST_TEST(mt::argmax(v).item<int64_t>() == 1);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
