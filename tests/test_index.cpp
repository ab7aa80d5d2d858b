// tests/test_index.cpp — the indexing family (ops/index.cpp, ops/cpu/index.cpp, cuda/index.cu): index_select
// and index_add, gather and scatter_add, cat, randperm.
//
// The ops' registry cases (gradcheck in f64, f32/f16/bf16 against f64; CUDA against the CPU in
// tests/test_parity.cpp), gradients of repeated indices, cat's promotion and per-input gradient dtypes, the
// errors of misuse, and on CUDA: the kernels against the CPU's (gather and scatter_add add in the CPU's order and
// compare exactly; index_add, whose sums a scatter would race on, gives the same bits run after run; out-of-range
// indices the host cannot check give NaN or are skipped) and index_select forward and backward on both devices.
#include "family_test.h"

#include <mixtape/autograd/autograd.h>

namespace {

Tensor index_i64(std::vector<int64_t> v) { return mt::from_vector(v); }

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

}  // namespace

BOOST_AUTO_TEST_SUITE(index_ops)

// The kernels view their tensors around `dim`: one outside [0, rank) is refused (the op wraps negative dims first);
// index_select's kernel given -1 wrote before its output's shape and read outside x.
BOOST_AUTO_TEST_CASE(index_kernels_refuse_a_dim_outside_the_rank, MT_CPU_TEST) {
  const Tensor x = mt::ones({5, 6});
  const Tensor i64 = mt::tensor<int64_t>({1, 0});
  for (int64_t dim : {int64_t{-1}, int64_t{2}}) {
    const std::string d = "dim = " + std::to_string(dim);
    expect_error([&] { kn::index_select(x, dim, i64); }, {"kernels::index_select", "dim_of(dim, x.dim())", d});
    expect_error([&] { kn::index_add({5, 6}, dim, i64, mt::ones({2, 6})); }, {"kernels::index_add", d});
    expect_error([&] { kn::gather(x, dim, mt::zeros({5, 6}, mt::kI64)); }, {"kernels::gather", d});
    expect_error([&] { kn::scatter_add({5, 6}, dim, mt::zeros({5, 6}, mt::kI64), x); }, {"kernels::scatter_add", d});
  }
  BOOST_TEST(kn::index_select(x, 1, i64).shape() == (Shape{5, 2}), "the last dim, given as 1");
}

BOOST_AUTO_TEST_CASE(index_select_gradient_sums_repeated_indices, MT_CPU_TEST) {
  Tensor x = mt::randn({3, 2}).requires_grad_();
  const Tensor y = mt::index_select(x, 0, index_i64({0, 0, 2}));
  BOOST_TEST(y.shape() == (mt::Shape{3, 2}));
  BOOST_TEST(y.at<double>({1, 1}) == x.at<double>({0, 1}));
  mt::sum(y).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{2, 2, 0, 0, 1, 1}), boost::test_tools::per_element());
  // An i32 index (ops.h: kI64 or kI32) selects the same rows and sums the same gradient.
  Tensor x32 = x.detach().requires_grad_();
  const Tensor y32 = mt::index_select(x32, 0, index_i64({0, 0, 2}).to(mt::kI32));
  BOOST_TEST(y32.to_vector<double>() == y.to_vector<double>(), boost::test_tools::per_element());
  mt::sum(y32).backward();
  BOOST_TEST(x32.grad().to_vector<double>() == x.grad().to_vector<double>(), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(cat_promotes_and_returns_each_gradient_in_its_dtype, MT_CPU_TEST) {
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

BOOST_AUTO_TEST_CASE(stack_joins_along_a_new_dim_and_splits_the_gradient, MT_CPU_TEST) {
  Tensor a = mt::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, mt::kF32).requires_grad_();
  Tensor b = mt::from_vector<double>({7, 8, 9, 10, 11, 12}, {2, 3}, mt::kF16).requires_grad_();
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    BOOST_TEST_CONTEXT("dim " << dim) {
      const Tensor y = mt::stack({a, b}, dim);
      const int64_t d = dim < 0 ? dim + 3 : dim;
      BOOST_TEST(y.shape() == (d == 2 ? mt::Shape{2, 3, 2} : mt::Shape{2, 2, 3}));
      BOOST_TEST(y.dtype() == mt::kF32);  // promoted, as cat
      expect_close(y.select(d, 1), b.to(mt::kF32), kExact, "stack's second slice is b");
    }
  }
  const Tensor y = mt::stack({a, b, a}, 1);  // (2, 3, 3): a used twice
  mt::sum(y * mt::arange(3.0, 0.0, -1.0).reshape({1, 3, 1})).backward();
  expect_values(a.grad(), {4, 4, 4, 4, 4, 4}, kExact, "a's gradient: 3 + 1 from its two places");
  BOOST_TEST(b.grad().dtype() == mt::kF16);
  expect_values(b.grad(), {2, 2, 2, 2, 2, 2}, kExact, "b's gradient");
  // 0-d tensors stack into a vector.
  expect_values(mt::stack({mt::scalar_tensor(1.5), mt::scalar_tensor(-2)}), {1.5, -2}, kExact, "stack of 0-d");
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes, MT_CPU_TEST) {
  expect_error([&] { mt::index_select(mt::randn({4, 3}), 0, index_i64({1, 7})); },
               {"index_select: index 7 is out of range for dim 0 of size 4 (shape [4, 3])"});
  expect_error([&] { mt::index_select(mt::randn({4, 3}), 1, index_i64({-1})); },
               {"index_select: index -1 is out of range for dim 1 of size 3"});
  // The first index past the end (the one an off-by-one check lets through to read past the storage).
  expect_error([&] { mt::index_select(mt::randn({4, 3}), 0, index_i64({0, 4})); },
               {"index_select: index 4 is out of range for dim 0 of size 4 (shape [4, 3])"});
  expect_error([&] { mt::index_select(mt::randn({4, 3}), 0, mt::randn({2})); },
               {"index_select: expected an index of dtype i64 or i32, got f32"});
  expect_error([&] { mt::cat({}, 0); }, {"cat: expected a non-empty list of tensors"});
  expect_error([&] { mt::cat({mt::randn({2, 3}), mt::randn({3, 3})}, 1); },
               {"cat: sizes must match except in dim 1, got [2, 3] (tensor 0) and [3, 3] (tensor 1)"});
  expect_error([&] { mt::cat({mt::randn({2, 3}), mt::randn({2, 3, 1})}, 0); },
               {"cat: tensors must have the same number of dims"});
  expect_error([&] { mt::stack({}, 0); }, {"stack: expected a non-empty list of tensors"});
  expect_error([&] { mt::stack({mt::randn({2, 3}), mt::randn({2, 4})}); },
               {"stack: expects each tensor to be of one shape, got [2, 3] (tensor 0) and [2, 4] (tensor 1)"});
  expect_error([&] { mt::stack({mt::randn({2, 3})}, 3); },
               {"stack: dim 3 is out of range for stacking tensors of shape [2, 3]; expected a dim in [-3, 2]"});
}

// ---- randperm ---------------------------------------------------------------------------------

/// Whether `p` holds each of 0..n-1 once.
bool is_permutation_of_range(const std::vector<int64_t>& p) {
  std::vector<bool> seen(p.size(), false);
  for (int64_t v : p) {
    if (v < 0 || v >= static_cast<int64_t>(p.size()) || seen[static_cast<size_t>(v)]) return false;
    seen[static_cast<size_t>(v)] = true;
  }
  return true;
}

BOOST_AUTO_TEST_CASE(randperm_draws_permutations_from_the_generator, MT_CPU_TEST) {
  for (int64_t n : {0, 1, 2, 1000, 60000}) {
    mt::Generator g(7);
    const Tensor p = mt::randperm(n, mt::Device::cpu(), &g);
    BOOST_TEST(p.dtype() == mt::kI64);
    BOOST_TEST(p.shape() == (Shape{n}));
    BOOST_TEST(is_permutation_of_range(p.to_vector<int64_t>()), "n = " << n);
    BOOST_TEST(g.offset() == static_cast<uint64_t>(n));  // n counters reserved
  }
  // The same generator state gives the same permutation; the next draw (further counters) another one.
  mt::Generator a(11), b(11);
  const std::vector<int64_t> first = mt::randperm(500, mt::Device::cpu(), &a).to_vector<int64_t>();
  BOOST_TEST(first == mt::randperm(500, mt::Device::cpu(), &b).to_vector<int64_t>());
  BOOST_TEST(first != mt::randperm(500, mt::Device::cpu(), &a).to_vector<int64_t>());
  // Position i's key is permutation_key(seed, offset, i): the element at the front has the smallest key.
  mt::Generator c(11);
  int64_t smallest = 0;
  for (int64_t i = 1; i < 500; ++i)
    if (mt::permutation_key(11, 0, i) < mt::permutation_key(11, 0, smallest)) smallest = i;
  BOOST_TEST(mt::randperm(500, mt::Device::cpu(), &c).to_vector<int64_t>().front() == smallest);
  // Without a generator: the default one, whose seed decides.
  mt::manual_seed(3);
  const std::vector<int64_t> seeded = mt::randperm(100).to_vector<int64_t>();
  mt::manual_seed(3);
  BOOST_TEST(seeded == mt::randperm(100).to_vector<int64_t>());
  expect_error([] { mt::randperm(-1); }, {"randperm: n must be non-negative, got -1"});
}

BOOST_AUTO_TEST_CASE(randperm_is_uniform, MT_CPU_TEST) {
  // 24,000 permutations of 4: each of the 24 orders is expected 1000 times (standard deviation 31), and a sort by
  // 64-bit Philox keys must favour none. The seed is fixed, so the test is deterministic; its bounds (about 5
  // sigma) hold for an unbiased method at almost any seed and fail a biased one (an order twice as likely as
  // another, a fixed point). Over 10,000 permutations of 10, every value lands at every position about 1000
  // times (sd 30).
  mt::Generator g(2024);
  std::vector<int> orders(256, 0);
  for (int r = 0; r < 24000; ++r) {
    const std::vector<int64_t> p = mt::randperm(4, mt::Device::cpu(), &g).to_vector<int64_t>();
    ++orders[static_cast<size_t>(p[0] * 64 + p[1] * 16 + p[2] * 4 + p[3])];
  }
  int distinct = 0;
  for (int count : orders)
    if (count > 0) {
      ++distinct;
      BOOST_TEST(std::abs(count - 1000) <= 160, "an order of 4 drawn " << count << " times in 24000");
    }
  BOOST_TEST(distinct == 24);
  std::vector<int> at(100, 0);
  for (int r = 0; r < 10000; ++r) {
    const std::vector<int64_t> p = mt::randperm(10, mt::Device::cpu(), &g).to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i) ++at[i * 10 + static_cast<size_t>(p[i])];
  }
  for (int count : at) BOOST_TEST(std::abs(count - 1000) <= 150, "a value at a position " << count << " times");
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(randperm_on_cuda_is_the_cpus, MT_GPU_TEST) {
  // The same (seed, offset) gives the CPU's permutation bit for bit, from 0 elements to more than a radix sort tile.
  for (int64_t n : {0, 1, 2, 255, 4097, 60000, 1 << 20}) {
    mt::Generator on_gpu(5), on_cpu(5);
    const Tensor p = mt::randperm(n, mt::Device::cuda(), &on_gpu);
    BOOST_TEST(p.device() == mt::Device::cuda());
    BOOST_TEST(p.cpu().to_vector<int64_t>() == mt::randperm(n, mt::Device::cpu(), &on_cpu).to_vector<int64_t>(),
               "n = " << n);
    BOOST_TEST(on_gpu.offset() == on_cpu.offset());
  }
}

// ---- gather / scatter_add -------------------------------------------------------------------

// The CPU's scatter_add, the reference of the CUDA kernels below: colliding indices add up, in f32 for f16/bf16 and
// rounded once (2048 + 1 + 1 is 2050 in f16 and 256 + 1 + 1 is 258 in bf16, where adding one value at a time in the
// dtype keeps 2048 and 256).
BOOST_AUTO_TEST_CASE(scatter_add_sums_colliding_indices, MT_CPU_TEST) {
  const Tensor index = index_i64({0, 2, 0, 0, 1, 1, 1, 1}).reshape({2, 4});
  const Tensor src = mt::from_vector<double>({1, 2, 3, 4, 0.5, 0.25, 0.125, 0.0625}, {2, 4}, mt::kF64);
  expect_values(kn::scatter_add({2, 3}, 1, index, src), {8, 0, 2, 0, 0.9375, 0}, kExact, "along dim 1");
  const Tensor rows = index_i64({1, 1, 1, 0, 1, 1}).reshape({3, 2});
  const Tensor src0 = mt::from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}, mt::kF64);
  expect_values(kn::scatter_add({2, 2}, 0, rows, src0), {0, 4, 9, 8}, kExact, "along dim 0");
  for (const auto& [dt, big] : {std::pair{mt::kF16, 2048.0}, std::pair{mt::kBF16, 256.0}}) {
    const Tensor three = mt::from_vector<double>({big, 1, 1}, {1, 3}, mt::kF64).to(dt);
    const Tensor sum = kn::scatter_add({1, 1}, 1, index_i64({0, 0, 0}).reshape({1, 3}), three);
    BOOST_TEST(sum.dtype() == dt);
    expect_values(sum, {big + 2}, kExact, std::string("rounded once, ") + mt::dtype_name(dt));
  }
}

// Cross-entropy's shapes: logits (N, C), one class per row (N, 1) along dim 1.
BOOST_AUTO_TEST_CASE(gather_scatter_add_cross_entropy_shapes, MT_GPU_TEST) {
  mt::manual_seed(9);
  for (DType dt : kGpuFloatTypes)
    for (int64_t C : {1, 10, 1000, 32768}) {
      const int64_t N = 257;
      const Tensor x = randn_as({N, C}, dt);
      const Tensor index = mt::randint(0, C, {N, 1});
      std::ostringstream os;
      os << "(N, C) = (" << N << ", " << C << "), " << dt;
      expect_close(kn::gather(gpu(x), 1, gpu(index)), kn::gather(x, 1, index), kExact, "gather " + os.str());
      const Tensor src = randn_as({N, 1}, dt);
      expect_close(kn::scatter_add(x.shape(), 1, gpu(index), gpu(src)), kn::scatter_add(x.shape(), 1, index, src), kExact,
                   "scatter_add " + os.str());
    }
}

// Colliding indices (summed in the CPU's order, in f32, rounded once), other dims, smaller index
// extents, non-contiguous operands and non-floating gathers.
BOOST_AUTO_TEST_CASE(gather_scatter_add_general, MT_GPU_TEST) {
  mt::manual_seed(10);
  for (DType dt : kGpuFloatTypes) {
    const Tensor index = mt::randint(0, 3, {6, 50});  // 50 values per row into 3 classes: many collisions
    const Tensor src = randn_as({6, 50}, dt);
    expect_close(kn::scatter_add({8, 3}, 1, gpu(index), gpu(src)), kn::scatter_add({8, 3}, 1, index, src), kExact,
                 "scatter_add with collisions, " + std::string(mt::dtype_name(dt)));
    const Tensor index0 = mt::randint(0, 4, {20, 5, 2});
    const Tensor src0 = randn_as({20, 5, 2}, dt);
    expect_close(kn::scatter_add({4, 6, 3}, 0, gpu(index0), gpu(src0)),
                 kn::scatter_add({4, 6, 3}, 0, index0, src0), kExact, "scatter_add along dim 0");
    const Tensor x = randn_as({7, 9, 11}, dt);
    const Tensor gi = mt::randint(0, 9, {5, 13, 4});
    expect_close(kn::gather(gpu(x), 1, gpu(gi)), kn::gather(x, 1, gi), kExact, "gather along dim 1");
    // Non-contiguous x, index and src.
    const Tensor xt = mt::raw::transpose(x, 0, 2);  // (11, 9, 7)
    const Tensor git = mt::raw::transpose(mt::randint(0, 9, {3, 4, 10}), 0, 2);  // (10, 4, 3)
    expect_close(kn::gather(gpu(xt), 1, gpu(git)), kn::gather(xt, 1, git), kExact, "gather, transposed operands");
    const Tensor srct = mt::raw::transpose(randn_as({3, 4, 10}, dt), 0, 2);
    expect_close(kn::scatter_add({10, 9, 3}, 1, gpu(git), gpu(srct)), kn::scatter_add({10, 9, 3}, 1, git, srct), kExact,
                 "scatter_add, transposed operands");
  }
  const Tensor xi = mt::randint(-100, 100, {4, 6});
  const Tensor ii = mt::randint(0, 6, {4, 6});
  expect_close(kn::gather(gpu(xi), 1, gpu(ii)), kn::gather(xi, 1, ii), kExact, "gather of i64");
  const Tensor xf64 = randn_as({4, 6}, mt::kF64);
  const Tensor i0 = mt::randint(0, 4, {3, 6});
  expect_close(kn::gather(gpu(xf64), 0, gpu(i0)), kn::gather(xf64, 0, i0), kExact, "gather of f64 along dim 0");
}

// Index values the host cannot check on the GPU: gather gives NaN, scatter_add skips them; nothing faults.
BOOST_AUTO_TEST_CASE(gather_scatter_add_out_of_range, MT_GPU_TEST) {
  const Tensor x = gpu(mt::ones({2, 3}));
  const Tensor index = gpu(mt::tensor<int64_t>({0, 7, -1, 2}).reshape({2, 2}));
  const std::vector<float> g = kn::gather(x, 1, index).cpu().to_vector<float>();
  BOOST_CHECK_EQUAL(g[0], 1.0f);
  BOOST_CHECK(std::isnan(g[1]) && std::isnan(g[2]));
  BOOST_CHECK_EQUAL(g[3], 1.0f);
  const std::vector<float> s =
      kn::scatter_add({2, 3}, 1, index, gpu(mt::ones({2, 2}))).cpu().to_vector<float>();
  BOOST_CHECK((s == std::vector<float>{1, 0, 0, 0, 0, 1}));
}

// ---- index_select / index_add ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(index_select_matches_cpu, MT_GPU_TEST) {
  const Shape shape{5, 6, 8};
  const std::vector<int64_t> picks{4, 0, 4, 2, 2, 1, 0};  // repeated, unsorted; valid for every dim of `shape`
  const DType dtypes[] = {mt::kF32, mt::kF16, mt::kBF16, mt::kF64, mt::kI64, mt::kI32, mt::kU8, mt::kBool};
  for (DType dt : dtypes)
    for (int64_t dim : {0, 1, 2})  // kernels take a dim in [0, rank) (the op wraps -1)
      for (DType it : {mt::kI64, mt::kI32}) {
        std::ostringstream what;
        what << "index_select [x " << shape << ", " << dt << ", dim " << dim << ", index " << it << "]";
        const Tensor x = randn_seeded(shape, dt, 61);
        const Tensor index = mt::from_vector(picks, {static_cast<int64_t>(picks.size())}, mt::TensorOptions(it));
        expect_close(kn::index_select(gpu(x), dim, gpu(index)), kn::index_select(x, dim, index), tolerance(dt), what.str());
        // A non-contiguous x (inner slices of 5 elements: odd widths take the narrow unit) and a strided index.
        const Tensor xt = mt::raw::transpose(x, 0, 2);  // (8, 6, 5)
        const Tensor every_other = mt::raw::slice(index, 0, 0, static_cast<int64_t>(picks.size()), 2);
        const Tensor every_other_gpu = mt::raw::slice(gpu(index), 0, 0, static_cast<int64_t>(picks.size()), 2);
        expect_close(kn::index_select(mt::raw::transpose(gpu(x), 0, 2), dim, every_other_gpu),
                    kn::index_select(xt, dim, every_other), tolerance(dt), what.str() + " transposed x, strided index");
        // A 0-D index keeps the dim with size 1.
        const Tensor one = mt::scalar_tensor(2.0, mt::TensorOptions(it));
        expect_close(kn::index_select(gpu(x), dim, gpu(one)), kn::index_select(x, dim, one), tolerance(dt),
                    what.str() + " 0-D index");
      }
}

BOOST_AUTO_TEST_CASE(index_add_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  const Shape shape{5, 6, 8};
  const std::vector<int64_t> picks{4, 0, 4, 2, 2, 1, 0, 4, 4};  // rows 3 (and 5 along dims 1, 2) get nothing
  for (DType dt : kGpuFloatTypes)
    for (int64_t dim : {0, 1, 2})
      for (DType it : {mt::kI64, mt::kI32}) {
        std::ostringstream what;
        what << "index_add [shape " << shape << ", " << dt << ", dim " << dim << ", index " << it << "]";
        const Tensor index = mt::from_vector(picks, {static_cast<int64_t>(picks.size())}, mt::TensorOptions(it));
        Shape src_shape = shape;
        src_shape[dim] = static_cast<int64_t>(picks.size());
        const Tensor src = randn_seeded(src_shape, dt, 71);
        const Tensor got = kn::index_add(shape, dim, gpu(index), gpu(src));
        expect_close(got, kn::index_add(shape, dim, index, src), tolerance(dt), what.str());
        expect_same_bits(kn::index_add(shape, dim, gpu(index), gpu(src)), got, what.str() + " run twice");
      }
  // An embedding-sized gradient: 4096 lookups into 1000 rows of 64, most rows hit several times.
  for (DType dt : kGpuFloatTypes) {
    mt::Generator gen(72);
    const Tensor index = mt::randint(0, 1000, {4096}, mt::TensorOptions(mt::kI64), &gen);
    const Tensor src = randn_seeded({4096, 64}, dt, 73);
    std::ostringstream what;
    what << "index_add [embedding (1000, 64), 4096 indices, " << dt << "]";
    const Tensor got = kn::index_add({1000, 64}, 0, gpu(index), gpu(src));
    expect_close(got, kn::index_add({1000, 64}, 0, index, src), tolerance(dt), what.str());
    expect_same_bits(kn::index_add({1000, 64}, 0, gpu(index), gpu(src)), got, what.str() + " run twice");
  }
  // No index at all: zeros.
  const Tensor none = mt::empty({0}, mt::TensorOptions(mt::kI64).device(Device::cuda()));
  const Tensor zero_src = mt::empty({3, 0}, mt::TensorOptions(mt::kF32).device(Device::cuda()));
  expect_close(kn::index_add({3, 4}, 1, none, zero_src), mt::zeros({3, 4}), tolerance(mt::kF32), "index_add with no index");
}

BOOST_AUTO_TEST_CASE(index_select_forward_backward, MT_GPU_TEST) {
  const std::vector<int64_t> picks{3, 0, 3, 1, 1, 2};
  const Tensor index = mt::from_vector(picks);
  for (DType dt : kGpuFloatTypes)
    for (int64_t dim : {0, 1}) {
      const Leaf x(randn_seeded({4, 5, 6}, dt, 111));
      const Tensor y_cpu = mt::index_select(x.cpu, dim, index), y_gpu = mt::index_select(x.gpu, dim, gpu(index));
      const Tensor dy = randn_seeded(y_cpu.shape(), dt, 112);
      y_cpu.backward(dy);
      y_gpu.backward(gpu(dy));
      const std::string what = "index_select op dim " + std::to_string(dim);
      expect_close(y_gpu, y_cpu, tolerance(dt), what + " y");
      expect_close(x.gpu.grad(), x.cpu.grad(), tolerance(dt), what + " dx");
    }
}

BOOST_AUTO_TEST_SUITE_END()
