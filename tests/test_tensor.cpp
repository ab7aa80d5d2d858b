// tests/test_tensor.cpp — core: factories, views, copies, element access,
// printing and the random generator.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>

#include "compare.h"

namespace mt = mixtape;
using mt::test::expect_error;
namespace utf = boost::unit_test;

namespace {

std::vector<double> values(const mt::Tensor& t) { return t.to_vector<double>(); }

/// 0, 1, ..., n-1 as f32 with `shape`.
mt::Tensor iota(const mt::Shape& shape, mt::DType dtype = mt::kF32) {
  return mt::arange(shape.numel(), dtype).reshape(shape);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tensor, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(factories) {
  mt::Tensor z = mt::zeros({2, 3});
  BOOST_TEST(z.dtype() == mt::kF32);
  BOOST_TEST(z.device() == mt::Device::cpu());
  BOOST_TEST((z.shape() == mt::Shape{2, 3}));
  BOOST_TEST(z.numel() == 6);
  BOOST_TEST(z.is_contiguous());
  BOOST_TEST(values(z) == std::vector<double>(6, 0.0), boost::test_tools::per_element());
  BOOST_TEST(values(mt::ones({4}, mt::kBF16)) == std::vector<double>(4, 1.0), boost::test_tools::per_element());
  BOOST_TEST(values(mt::full({2}, 2.5, mt::kF16)) == std::vector<double>({2.5, 2.5}), boost::test_tools::per_element());

  mt::Tensor a = mt::arange(5);
  BOOST_TEST(a.dtype() == mt::kI64);
  BOOST_TEST(a.to_vector<int64_t>() == std::vector<int64_t>({0, 1, 2, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(values(mt::arange(1.0, 2.0, 0.25)) == std::vector<double>({1.0, 1.25, 1.5, 1.75}),
             boost::test_tools::per_element());
  BOOST_TEST(mt::arange(0.0, 1.0, 0.3).numel() == 4);  // ceil(1 / 0.3), like torch.arange

  mt::Tensor v = mt::tensor({1.5f, -2.0f, 3.0f});
  BOOST_TEST(v.dtype() == mt::kF32);
  BOOST_TEST(v.at<float>({1}) == -2.0f);
  mt::Tensor m = mt::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, mt::kF16);
  BOOST_TEST(m.dtype() == mt::kF16);
  BOOST_TEST(m.at<double>({1, 2}) == 6.0);
  BOOST_TEST(mt::scalar_tensor(7.0).dim() == 0);
  BOOST_TEST(mt::scalar_tensor(7.0).item<int>() == 7);
  BOOST_TEST(mt::empty({0, 3}).numel() == 0);
  BOOST_TEST((mt::zeros_like(m).shape() == m.shape()));
  BOOST_TEST(mt::ones_like(m).dtype() == mt::kF16);
}

BOOST_AUTO_TEST_CASE(value_semantics_share_data) {
  mt::Tensor a = mt::zeros({3});
  mt::Tensor b = a;  // a handle copy, like torch::Tensor
  b.set({1}, 5.0);
  BOOST_TEST(a.at<float>({1}) == 5.0f);
  BOOST_TEST(a.is_same(b));
  mt::Tensor c = a.clone();
  c.set({1}, 7.0);
  BOOST_TEST(a.at<float>({1}) == 5.0f);
  BOOST_TEST(c.storage() != a.storage());
  // contiguous() is the tensor itself when it already is (no copy, as PyTorch's), a copy when it is not.
  BOOST_TEST(a.contiguous().is_same(a));
  const mt::Tensor t = mt::zeros({2, 3}).t();
  BOOST_TEST(t.contiguous().storage() != t.storage());
  BOOST_TEST(t.contiguous().is_contiguous());
}

BOOST_AUTO_TEST_CASE(dtype_conversion) {
  mt::Tensor x = mt::tensor({0.1, 1.0 / 3.0, 65519.0, 65520.0, -1e-8});
  mt::Tensor h = x.to(mt::kF16);
  BOOST_TEST(h.dtype() == mt::kF16);
  std::vector<mt::Half> hv = h.to_vector<mt::Half>();
  BOOST_TEST(hv[0].bits == mt::Half(0.1).bits);
  BOOST_TEST(float(hv[2]) == 65504.0f);
  BOOST_TEST(std::isinf(float(hv[3])));
  BOOST_TEST(std::signbit(float(hv[4])));  // -1e-8 underflows to -0
  // bf16 and integers
  BOOST_TEST(mt::tensor({1.0f, 257.0f}).to(mt::kBF16).to_vector<float>()[1] == 256.0f);  // tie to even
  BOOST_TEST(mt::tensor({2.7f, -2.7f}).to(mt::kI32).to_vector<int32_t>() == std::vector<int32_t>({2, -2}),
             boost::test_tools::per_element());
  BOOST_TEST(mt::tensor({0.0f, 0.5f}).to(mt::kBool).to_vector<bool>() == std::vector<bool>({false, true}),
             boost::test_tools::per_element());
  // A mask (dropout's) back to numbers: 1 or 0 exactly, in every floating dtype (f16 and bf16 by their own loop),
  // over a run long enough for vector code and its remainder.
  std::vector<float> pattern(70);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = (i * 7919) % 5 < 2 ? 1.0f : 0.0f;  // an irregular 40%
  const mt::Tensor mask = mt::from_vector(pattern, {70}).to(mt::kBool);
  for (mt::DType dt : {mt::kF16, mt::kBF16, mt::kF32, mt::kF64}) {
    const std::vector<float> got = mask.to(dt).to_vector<float>();
    BOOST_TEST(got == pattern, boost::test_tools::per_element());
  }
  // to() the same dtype returns the same tensor, like PyTorch.
  BOOST_TEST(x.to(mt::kF64).is_same(x));
}

// torch.promote_types over every pair, as PyTorch 1.13 answers it (any float beats any integer; f16 with bf16 is
// f32); checked at compile time, since promote_types is constexpr.
namespace promotion {
using enum mt::DType;
constexpr mt::DType kOrder[] = {kBool, kU8, kI32, kI64, kF16, kBF16, kF32, kF64};
constexpr mt::DType kTorch[8][8] = {
    {kBool, kU8, kI32, kI64, kF16, kBF16, kF32, kF64},  {kU8, kU8, kI32, kI64, kF16, kBF16, kF32, kF64},
    {kI32, kI32, kI32, kI64, kF16, kBF16, kF32, kF64},  {kI64, kI64, kI64, kI64, kF16, kBF16, kF32, kF64},
    {kF16, kF16, kF16, kF16, kF16, kF32, kF32, kF64},   {kBF16, kBF16, kBF16, kBF16, kF32, kBF16, kF32, kF64},
    {kF32, kF32, kF32, kF32, kF32, kF32, kF32, kF64},   {kF64, kF64, kF64, kF64, kF64, kF64, kF64, kF64}};
constexpr bool matches_torch() {
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (mt::promote_types(kOrder[a], kOrder[b]) != kTorch[a][b]) return false;
  return true;
}
static_assert(matches_torch(), "promote_types differs from torch.promote_types");
}  // namespace promotion

BOOST_AUTO_TEST_CASE(floating_to_integer_casts_saturate) {
  // C++ leaves a cast of NaN, or of a value past the integer type's range, undefined (GCC on x86 gives INT_MIN
  // for all of them in i32/i64 and wraps u8; ARM saturates; nvcc saturates i32/i64 and wraps u8, core/dtype.h).
  // mixtape defines it on every device: NaN gives 0, a value past the range the nearest end, the rest is cut
  // toward zero. Every floating dtype to every integer one, from a contiguous tensor and from a transposed view.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {nan,   inf,  -inf, 1e30, -1e30,  300.0, -1.0,    -0.75,  2.9,
                                      -2.9, 255.5, 3e9,  -3e9, 0x1p63, -0x1p63, 0x1p31, -0x1p31, 0x1p62};
  const auto n = static_cast<int64_t>(values.size());
  std::vector<double> twice = values;
  twice.insert(twice.end(), values.begin(), values.end());
  // The rule, written out on long double (which holds every int64 exactly on x86-64 and AArch64).
  auto expected = [](double held, mt::DType to) -> int64_t {
    if (std::isnan(held)) return 0;
    const long double t = std::trunc(static_cast<long double>(held));
    const auto [lo, hi] = to == mt::kI64 ? std::pair<long double, long double>(INT64_MIN, INT64_MAX)
                          : to == mt::kI32 ? std::pair<long double, long double>(INT32_MIN, INT32_MAX)
                                           : std::pair<long double, long double>(0, 255);
    return static_cast<int64_t>(std::clamp(t, lo, hi));
  };
  for (mt::DType from : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16}) {
    const mt::Tensor x = mt::from_vector(values).to(from);
    const std::vector<double> held = x.to(mt::kF64).to_vector<double>();  // 1e30 is inf in f16, 300 is 300 in bf16
    const mt::Tensor strided = mt::from_vector(twice, {2, n}).to(from).t();  // (n, 2), both columns `values`
    for (mt::DType to : {mt::kI64, mt::kI32, mt::kU8}) {
      const std::vector<int64_t> got = x.to(to).to_vector<int64_t>(), got2 = strided.to(to).to_vector<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(i);
        BOOST_TEST(got[k] == expected(held[k], to), mt::dtype_name(from) << " " << held[k] << " -> " << to);
        for (size_t column : {size_t{0}, size_t{1}})
          BOOST_TEST(got2[2 * k + column] == expected(held[k], to),
                     "strided " << mt::dtype_name(from) << " " << held[k] << " column " << column);
      }
    }
  }
  // A single value read back converts by the same rule where it fits (item() refuses the rest: test_errors).
  BOOST_TEST(mt::full({}, -2.9).to(mt::kU8).item<int64_t>() == 0);
  BOOST_TEST(mt::full({}, 1e30).to(mt::kI32).item<int64_t>() == INT32_MAX);
}

BOOST_AUTO_TEST_CASE(reshape_and_view) {
  mt::Tensor x = iota({2, 3, 4});
  mt::Tensor v = x.view({6, -1});
  BOOST_TEST((v.shape() == mt::Shape{6, 4}));
  BOOST_TEST(v.storage() == x.storage());
  // A transposed tensor cannot be viewed flat; reshape copies.
  mt::Tensor t = x.transpose(0, 2);
  BOOST_TEST(!t.is_contiguous());
  mt::Tensor r = t.reshape({-1});
  BOOST_TEST(r.storage() != x.storage());
  BOOST_TEST(r.at<float>({1}) == 12.0f);  // t[0][0][1] = x[1][0][0]
  // But a reshape that only splits a dim of a transposed tensor is a view.
  mt::Tensor split = t.reshape({2, 2, 3, 2});
  BOOST_TEST(split.storage() == x.storage());
  BOOST_TEST(split.at<float>({1, 0, 2, 1}) == x.at<float>({1, 2, 2}));
  BOOST_TEST((x.flatten(1).shape() == mt::Shape{2, 12}));
  BOOST_TEST((x.flatten().shape() == mt::Shape{24}));
  BOOST_TEST((mt::scalar_tensor(1.0).reshape({1, 1}).shape() == mt::Shape{1, 1}));
  // An empty tensor's strides are PyTorch's: sizes 0 and 1 count as 1 in the products.
  BOOST_TEST((mt::empty({2, 0, 3}).strides() == mt::Shape{3, 3, 1}));
  BOOST_TEST((mt::empty({0, 4, 1, 5}).strides() == mt::Shape{20, 5, 5, 1}));
}

BOOST_AUTO_TEST_CASE(transpose_permute_slice_select) {
  mt::Tensor x = iota({2, 3, 4});
  mt::Tensor p = x.permute({2, 0, 1});
  BOOST_TEST((p.shape() == mt::Shape{4, 2, 3}));
  BOOST_TEST((p.strides() == mt::Shape{1, 12, 4}));
  BOOST_TEST(p.at<float>({3, 1, 2}) == x.at<float>({1, 2, 3}));
  mt::Tensor m = iota({3, 5});
  BOOST_TEST(m.t().at<float>({4, 2}) == m.at<float>({2, 4}));

  mt::Tensor s = m.slice(1, 1, 5, 2);  // columns 1 and 3
  BOOST_TEST((s.shape() == mt::Shape{3, 2}));
  BOOST_TEST(values(s) == std::vector<double>({1, 3, 6, 8, 11, 13}), boost::test_tools::per_element());
  BOOST_TEST(m.slice(0, -2, 100).size(0) == 2);  // Python-style clamping
  BOOST_TEST(m.slice(0, 2, 1).size(0) == 0);
  BOOST_TEST(values(m.narrow(1, 2, 2).select(0, -1)) == std::vector<double>({12, 13}),
             boost::test_tools::per_element());
  BOOST_TEST(m.select(1, 0).dim() == 1);
}

BOOST_AUTO_TEST_CASE(expand_squeeze_unsqueeze) {
  mt::Tensor col = mt::tensor({1.0f, 2.0f, 3.0f}).unsqueeze(1);
  BOOST_TEST((col.shape() == mt::Shape{3, 1}));
  mt::Tensor e = col.expand({2, 3, 4});
  BOOST_TEST((e.strides() == mt::Shape{0, 1, 0}));
  BOOST_TEST(e.storage() == col.storage());
  BOOST_TEST(e.at<float>({1, 2, 3}) == 3.0f);
  BOOST_TEST((col.expand({-1, 5}).shape() == mt::Shape{3, 5}));
  BOOST_TEST((e.contiguous().strides() == mt::Shape{12, 4, 1}));
  BOOST_TEST(values(e.contiguous().select(0, 1).select(1, 2)) == std::vector<double>({1, 2, 3}),
             boost::test_tools::per_element());
  BOOST_TEST((mt::zeros({1, 3, 1}).squeeze().shape() == mt::Shape{3}));
  BOOST_TEST((mt::zeros({1, 3, 1}).squeeze(0).shape() == mt::Shape{3, 1}));
  BOOST_TEST((mt::zeros({1, 3, 1}).squeeze(1).shape() == mt::Shape{1, 3, 1}));
  BOOST_TEST((mt::zeros({2, 3}).unsqueeze(-1).shape() == mt::Shape{2, 3, 1}));
}

BOOST_AUTO_TEST_CASE(copy_fill_and_versions) {
  mt::Tensor x = mt::zeros({2, 3}, mt::kF16);
  uint64_t v0 = x.version();
  x.copy_(mt::tensor({1.0, 2.0, 3.0}));  // broadcast and convert
  BOOST_TEST(x.version() == v0 + 1);
  BOOST_TEST(values(x) == std::vector<double>({1, 2, 3, 1, 2, 3}), boost::test_tools::per_element());
  mt::Tensor view = x.select(0, 1);
  view.fill_(9.0);
  BOOST_TEST(x.version() == v0 + 2);  // views share the version counter
  BOOST_TEST(values(x) == std::vector<double>({1, 2, 3, 9, 9, 9}), boost::test_tools::per_element());
  // Copy from an overlapping view of itself.
  mt::Tensor m = iota({3, 3});
  m.copy_(m.t());
  BOOST_TEST(values(m) == std::vector<double>({0, 3, 6, 1, 4, 7, 2, 5, 8}), boost::test_tools::per_element());
  // Non-contiguous destination, large enough for the threaded path.
  mt::Tensor big = mt::zeros({512, 512});
  big.t().copy_(iota({512, 512}));
  BOOST_TEST(big.at<float>({7, 3}) == 3.0f * 512 + 7);
}

BOOST_AUTO_TEST_CASE(element_access) {
  mt::Tensor x = iota({2, 3}, mt::kI64);
  BOOST_TEST(x.at<int64_t>({-1, -1}) == 5);
  BOOST_TEST(x.select(0, 1).select(0, 2).item<double>() == 5.0);
  BOOST_TEST(mt::scalar_tensor(3.0, mt::kBF16).item<float>() == 3.0f);
  std::vector<int32_t> iv = x.to_vector<int32_t>();
  BOOST_TEST(iv.size() == 6u);
  mt::Tensor b = mt::from_vector(std::vector<int64_t>{int64_t{1} << 60}, {1});
  BOOST_TEST(b.item<int64_t>() == int64_t{1} << 60);  // no trip through double
}

BOOST_AUTO_TEST_CASE(printing) {
  std::ostringstream os;
  os << mt::from_vector(std::vector<float>{0.5f, 1.0f, 2.0f, 3.0f}, {2, 2});
  BOOST_TEST(os.str() == "tensor([0.5, 1, 2, 3], shape=[2, 2], dtype=f32, device=cpu)");
  std::ostringstream big;
  big << mt::zeros({3, 4}, mt::kBF16);
  BOOST_TEST(big.str() == "tensor([0, 0, 0, 0, 0, 0, 0, 0, ...], shape=[3, 4], dtype=bf16, device=cpu)");
  std::ostringstream undef;
  undef << mt::Tensor();
  BOOST_TEST(undef.str() == "tensor(undefined)");
}

BOOST_AUTO_TEST_CASE(philox_known_answers) {
  // Known-answer vectors of Random123's kat_vectors for philox4x32_10.
  uint32_t out[4];
  mt::philox4x32_10(0, 0, 0, out);
  BOOST_TEST(out[0] == 0x6627e8d5u);
  BOOST_TEST(out[1] == 0xe169c58du);
  BOOST_TEST(out[2] == 0xbc57ac4cu);
  BOOST_TEST(out[3] == 0x9b00dbd8u);
  mt::philox4x32_10(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, out);
  BOOST_TEST(out[0] == 0x408f276du);
  BOOST_TEST(out[1] == 0x41c83b0eu);
  BOOST_TEST(out[2] == 0xa20bc7c6u);
  BOOST_TEST(out[3] == 0x6d5451fdu);
  // counter {243f6a88 85a308d3 13198a2e 03707344}, key {a4093822 299f31d0}
  mt::philox4x32_10(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, out);
  BOOST_TEST(out[0] == 0xd16cfe09u);
  BOOST_TEST(out[1] == 0x94fdccebu);
  BOOST_TEST(out[2] == 0x5001e420u);
  BOOST_TEST(out[3] == 0x24126ea1u);
}

BOOST_AUTO_TEST_CASE(seeded_generator_is_reproducible) {
  mt::manual_seed(42);
  mt::Tensor a = mt::randn({1000});
  mt::Tensor b = mt::rand({1000}, mt::kF16);
  mt::manual_seed(42);
  BOOST_TEST(values(mt::randn({1000})) == values(a), boost::test_tools::per_element());
  BOOST_TEST(values(mt::rand({1000}, mt::kF16)) == values(b), boost::test_tools::per_element());
  // A draw is a function of (seed, offset) alone: splitting it gives the same numbers.
  mt::Generator g1(7), g2(7);
  std::vector<double> whole = values(mt::rand({10}, mt::kF64, &g1));
  std::vector<double> first = values(mt::rand({4}, mt::kF64, &g2));
  std::vector<double> rest = values(mt::rand({6}, mt::kF64, &g2));
  first.insert(first.end(), rest.begin(), rest.end());
  BOOST_TEST(first == whole, boost::test_tools::per_element());
  // The same numbers on every machine: golden values for seed 1234.
  mt::Generator golden(1234);
  std::vector<double> u = values(mt::rand({3}, mt::kF64, &golden));
  std::ostringstream os;
  os.precision(17);
  for (double x : u) os << x << ' ';
  BOOST_TEST_MESSAGE("rand(seed 1234): " << os.str());
  BOOST_TEST(u[0] == 0x1.04859a46d3e78p-3);
  BOOST_TEST(u[1] == 0x1.3dddbc6a397c2p-1);
  BOOST_TEST(u[2] == 0x1.fe4e46c7e037cp-3);
}

BOOST_AUTO_TEST_CASE(a_generator_reserves_counters_and_goes_back_only_when_unmoved) {
  mt::Generator g(9);
  BOOST_TEST((g.reserve(5) == mt::GeneratorState{9, 0}));
  BOOST_TEST((g.reserve(2) == mt::GeneratorState{9, 5}));
  BOOST_TEST(g.advance(1) == 7u);
  BOOST_TEST(!g.compare_and_set({9, 7}, {9, 0}), "it moved on since the caller looked: unchanged");
  BOOST_TEST((g.state() == mt::GeneratorState{9, 8}));
  BOOST_TEST(g.compare_and_set({9, 8}, {9, 0}));
  BOOST_TEST((g.state() == mt::GeneratorState{9, 0}));
  BOOST_TEST(!g.compare_and_set({10, 0}, {9, 3}), "another seed: unchanged");
  BOOST_TEST(g.offset() == 0u);
}

BOOST_AUTO_TEST_CASE(distributions) {
  mt::Generator g(3);
  std::vector<double> n = values(mt::randn({200000}, mt::kF64, &g));
  double mean = 0, var = 0;
  for (double x : n) mean += x;
  mean /= static_cast<double>(n.size());
  for (double x : n) var += (x - mean) * (x - mean);
  var /= static_cast<double>(n.size());
  BOOST_TEST(std::abs(mean) < 0.01);
  BOOST_TEST(std::abs(var - 1.0) < 0.01);
  for (double x : values(mt::rand({100000}, mt::kF16, &g))) BOOST_TEST_REQUIRE((x >= 0.0 && x < 1.0));
  for (double x : values(mt::rand({100000}, mt::kBF16, &g))) BOOST_TEST_REQUIRE((x >= 0.0 && x < 1.0));
  std::vector<int64_t> r = mt::randint(-3, 4, {10000}, mt::kI64, &g).to_vector<int64_t>();
  int64_t lo = *std::min_element(r.begin(), r.end()), hi = *std::max_element(r.begin(), r.end());
  BOOST_TEST(lo == -3);
  BOOST_TEST(hi == 3);
}

// The peak of allocated bytes since the last reset: raised by an allocation, kept after its free, lowered by a reset.
BOOST_AUTO_TEST_CASE(the_cpu_peak_follows_allocations) {
  mt::reset_cpu_peak_memory();
  const mt::CpuMemoryStats start = mt::cpu_memory_stats();
  BOOST_TEST(start.peak_allocated_bytes == start.allocated_bytes);
  {
    const mt::Tensor t = mt::empty({1 << 18});  // 1 MiB
    BOOST_TEST(mt::cpu_memory_stats().peak_allocated_bytes == start.allocated_bytes + (int64_t{1} << 20));
  }
  BOOST_TEST(mt::cpu_memory_stats().allocated_bytes == start.allocated_bytes);
  BOOST_TEST(mt::cpu_memory_stats().peak_allocated_bytes == start.allocated_bytes + (int64_t{1} << 20));
  mt::reset_cpu_peak_memory();
  BOOST_TEST(mt::cpu_memory_stats().peak_allocated_bytes == start.allocated_bytes);
}

BOOST_AUTO_TEST_CASE(the_cpu_allocator_reuses_freed_large_blocks) {
  mt::cpu_empty_cache();
  BOOST_TEST(mt::cpu_memory_stats().cached_bytes == 0);
  const int64_t before = mt::cpu_memory_stats().allocated_bytes;
  void* first = nullptr;
  {
    mt::Tensor big = mt::empty({3 << 20});  // 12 MiB: cached when freed
    first = big.data_ptr();
  }
  BOOST_TEST(mt::cpu_memory_stats().allocated_bytes == before);  // freed, whatever the cache holds
  BOOST_TEST(mt::cpu_memory_stats().cached_bytes == int64_t{12} << 20);
  {
    mt::Tensor again = mt::zeros({3 << 20});  // the same size: the same block, and zeros() still zeroes it
    BOOST_TEST(again.data_ptr() == first);
    BOOST_TEST(mt::cpu_memory_stats().cached_bytes == 0);
    const std::vector<float> v = again.to_vector<float>();
    BOOST_TEST(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  }
  mt::Tensor small = mt::empty({1000});  // 4 KB: malloc's, never cached
  small = mt::Tensor();
  BOOST_TEST(mt::cpu_memory_stats().cached_bytes == int64_t{12} << 20);
  mt::cpu_empty_cache();
  BOOST_TEST(mt::cpu_memory_stats().cached_bytes == 0);
}

BOOST_AUTO_TEST_CASE(randint_is_exact_over_the_whole_int64_range) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  mt::Generator g(11);
  // Near the top: through a double, INT64_MAX - 1 became 2^63 and wrapped.
  for (int64_t v : mt::randint(kMax - 1, kMax, {100}, mt::kI64, &g).to_vector<int64_t>())
    BOOST_TEST_REQUIRE(v == kMax - 1);
  // 2^60 + {0, 1, 2} are not doubles: each must come out, exactly.
  std::vector<int64_t> r = mt::randint(int64_t{1} << 60, (int64_t{1} << 60) + 3, {3000}, mt::kI64, &g)
                               .to_vector<int64_t>();
  std::sort(r.begin(), r.end());
  BOOST_TEST(r.front() == int64_t{1} << 60);
  BOOST_TEST(r.back() == (int64_t{1} << 60) + 2);
  BOOST_TEST((std::unique(r.begin(), r.end()) - r.begin() == 3));
  // The widest range (its width 2^64 - 1 overflows int64): both signs, odd and even values, nothing out of range.
  r = mt::randint(kMin, kMax, {4000}, mt::kI64, &g).to_vector<int64_t>();
  BOOST_TEST(std::count_if(r.begin(), r.end(), [](int64_t v) { return v < 0; }) > 1800);
  BOOST_TEST(std::count_if(r.begin(), r.end(), [](int64_t v) { return v % 2 != 0; }) > 1800);
  BOOST_TEST(*std::max_element(r.begin(), r.end()) < kMax);
}

BOOST_AUTO_TEST_CASE(randint_refuses_ranges_its_dtype_cannot_hold) {
  expect_error([] { mt::randint(0, (int64_t{1} << 31) + 1, {2}, mt::TensorOptions(mt::DType::kI32)); },
               {"randint", "[0, 2147483649)", "does not fit i32"});
  expect_error([] { mt::randint(-1, 10, {2}, mt::TensorOptions(mt::DType::kU8)); }, {"randint", "does not fit u8"});
  expect_error([] { mt::randint(0, 3, {2}, mt::TensorOptions(mt::DType::kBool)); }, {"randint", "does not fit bool"});
  expect_error([] { mt::randint(0, (int64_t{1} << 24) + 2, {2}, mt::TensorOptions(mt::kF32)); },
               {"randint", "f32", "exactly"});
  expect_error([] { mt::randint(-2049, 0, {2}, mt::TensorOptions(mt::kF16)); }, {"randint", "f16", "exactly"});
  // The edges that do fit.
  BOOST_TEST(mt::randint(0, 256, {4}, mt::TensorOptions(mt::DType::kU8)).dtype() == mt::DType::kU8);
  BOOST_TEST(mt::randint(int64_t{1} << 24, (int64_t{1} << 24) + 1, {1}, mt::TensorOptions(mt::kF32)).item<float>() ==
             16777216.0f);
  BOOST_TEST(mt::randint(INT32_MIN, int64_t{INT32_MAX} + 1, {4}, mt::TensorOptions(mt::DType::kI32)).dtype() ==
             mt::DType::kI32);
}

BOOST_AUTO_TEST_SUITE_END()
