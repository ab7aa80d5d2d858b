// tests/test_errors.cpp — misuse gets a mixtape::Error that names the
// operation and the shapes/dtypes/devices involved, with file:line.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <optional>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/ops/ops.h>

namespace mt = mixtape;
namespace utf = boost::unit_test;

namespace {

/// Runs `f`, requires a mixtape::Error whose message contains every one of
/// `parts` and ends with a "(file.ext:line)" location.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const mt::Error& e) {
    std::string msg = e.what();
    BOOST_TEST_MESSAGE("error: " << msg);
    for (const auto& p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' not in: " << msg);
    BOOST_TEST(std::regex_search(msg, std::regex(R"(\([A-Za-z0-9_./-]+\.(cpp|h|cu):[0-9]+\)$)")),
               "no (file:line) at the end of: " << msg);
    return;
  } catch (const std::exception& e) {
    BOOST_ERROR("expected mixtape::Error, got another exception: " << e.what());
    return;
  }
  BOOST_ERROR("expected mixtape::Error, nothing was thrown");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(errors, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(error_is_a_runtime_error) {
  static_assert(std::is_base_of_v<std::runtime_error, mt::Error>);
  BOOST_CHECK_THROW(mt::zeros({2, 3}).view({4}), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(view_of_incompatible_size) {
  expect_error([] { mt::zeros({2, 3}).view({4, 2}); }, {"view", "[4, 2]", "size 6"});
  expect_error([] { mt::zeros({2, 3}).reshape({-1, -1}); }, {"reshape", "only one dimension can be inferred"});
  expect_error([] { mt::zeros({2, 3}).reshape({5, -1}); }, {"reshape", "[5, -1]", "size 6"});
}

BOOST_AUTO_TEST_CASE(view_of_incompatible_strides) {
  expect_error([] { mt::zeros({2, 3}).t().view({6}); }, {"view", "[3, 2]", "strides [1, 3]", "use reshape"});
}

BOOST_AUTO_TEST_CASE(dim_out_of_range) {
  expect_error([] { mt::zeros({2, 3}).transpose(0, 2); }, {"transpose", "dim 2", "shape [2, 3]", "[-2, 1]"});
  expect_error([] { mt::zeros({2, 3}).size(-3); }, {"size", "dim -3", "shape [2, 3]"});
  expect_error([] { mt::zeros({2}).unsqueeze(3); }, {"unsqueeze", "dim 3"});
  expect_error([] { mt::zeros({2, 3}).flatten(1, 0); }, {"flatten", "start_dim 1", "end_dim 0"});
  // A 0-d tensor has dims -1 and 0 (PyTorch's rule), for the ops that return it as it is too.
  expect_error([] { mt::zeros({}).squeeze(1); }, {"squeeze", "dim 1", "[-1, 0]"});
  expect_error([] { mt::raw::squeeze(mt::zeros({}), -2); }, {"squeeze", "dim -2", "[-1, 0]"});
  expect_error([] { mt::zeros({}).flatten(1); }, {"flatten", "dim 1", "[-1, 0]"});
  expect_error([] { mt::zeros({}).flatten(0, 2); }, {"flatten", "dim 2", "[-1, 0]"});
  expect_error([] { mt::zeros({}).transpose(0, 1); }, {"transpose", "dim 1", "[-1, 0]"});
  expect_error([] { mt::raw::transpose(mt::zeros({}), -2, 0); }, {"transpose", "dim -2", "[-1, 0]"});
  BOOST_TEST(mt::zeros({}).transpose(-1, 0).dim() == 0);
  BOOST_TEST(mt::zeros({}).squeeze(-1).dim() == 0);
  BOOST_TEST((mt::zeros({}).flatten(0, -1).shape() == mt::Shape{1}));
}

BOOST_AUTO_TEST_CASE(index_out_of_range) {
  expect_error([] { mt::zeros({2, 3}).select(1, 3); }, {"select", "index 3", "size 3", "[2, 3]"});
  expect_error([] { mt::zeros({2, 3}).at<float>({2, 0}); }, {"at", "index 2", "dim 0", "shape [2, 3]"});
  expect_error([] { mt::zeros({2, 3}).at<float>({1, -4}); }, {"at", "index -4", "dim 1", "shape [2, 3]"});
  expect_error([] { mt::zeros({2, 3}).narrow(1, 2, 2); }, {"narrow", "start 2", "length 2", "size 3"});
  expect_error([] { mt::zeros({2, 3}).at<float>({1}); }, {"at", "1 indices", "[2, 3]"});
}

BOOST_AUTO_TEST_CASE(item_of_many_elements) {
  expect_error([] { mt::zeros({2, 3}).item<float>(); }, {"item", "6 elements", "[2, 3]"});
}

BOOST_AUTO_TEST_CASE(dtype_mismatch) {
  expect_error([] { mt::zeros({2}, mt::kF16).data<float>(); }, {"data", "f32", "f16"});
  expect_error([] { mt::rand({2}, mt::kI64); }, {"rand", "floating", "i64"});
  expect_error([] { mt::randn({2}, mt::kBool); }, {"randn", "bool"});
}

BOOST_AUTO_TEST_CASE(expand_and_permute) {
  expect_error([] { mt::zeros({2, 3}).expand({4, 3, 2}); }, {"expand", "(2)", "target size 3", "[2, 3]"});
  expect_error([] { mt::zeros({2, 3}).expand({3}); }, {"expand", "fewer dims"});
  expect_error([] { mt::zeros({2, 3}).permute({0, 0}); }, {"permute", "repeats", "[2, 3]"});
  expect_error([] { mt::zeros({2, 3}).permute({0}); }, {"permute", "1 dims", "[2, 3]"});
}

BOOST_AUTO_TEST_CASE(bad_factories) {
  expect_error([] { mt::empty({2, -1}); }, {"empty", "negative size -1", "[2, -1]"});
  expect_error([] { mt::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }, {"from_vector", "3 values", "[2, 2]"});
  expect_error([] { mt::arange(0.0, 1.0, 0.0); }, {"arange", "step=0"});
  expect_error([] { mt::arange(0.0, 1.0, -1.0); }, {"arange", "step -1"});
  expect_error([] { mt::randint(3, 3, {2}); }, {"randint", "empty range"});
  expect_error([] { mt::Shape s{1, 2, 3, 4, 5, 6, 7, 8}; s.push_back(9); }, {"Shape", "maximum of 8"});
}

BOOST_AUTO_TEST_CASE(scalars_that_overflow_their_dtype_are_refused) {
  // PyTorch's rule ("value cannot be converted to type ... without overflow"): an integer dtype takes finite values
  // in its range, a floating one infinities, NaN and finite values up to its largest. Before, an i64 1e30 was
  // whatever the CPU's cast made of it (undefined in C++; INT64_MIN on x86) and an f16 1e5 a silent inf. One
  // difference: PyTorch 1.13 also takes -255..-1 into u8 here when they are ints (torch.full((2,), -1,
  // dtype=torch.uint8) is 255, -1.0 is refused; checked), which full, fill_ and set refuse (where's scalar and
  // clamp's bound take them, as PyTorch's int scalars).
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  expect_error([] { mt::full({2}, 1e30, mt::kI64); }, {"full", "the value 1e+30 overflows i64", "[2]"});
  expect_error([] { mt::full({2}, 0x1p63, mt::kI64); }, {"full", "overflows i64"});
  expect_error([&] { mt::full({3}, nan, mt::kI32); }, {"full", "the value nan overflows i32", "[3]"});
  expect_error([&] { mt::full({1}, -inf, mt::kI32); }, {"full", "the value -inf overflows i32"});
  expect_error([] { mt::full({2}, -1, mt::kU8); }, {"full", "the value -1 overflows u8"});
  expect_error([] { mt::full({2}, 256, mt::kU8); }, {"full", "the value 256 overflows u8"});
  expect_error([] { mt::full({2}, 1e5, mt::kF16); }, {"full", "the value 100000 overflows f16"});
  expect_error([] { mt::full({2}, -1e39, mt::kBF16); }, {"full", "overflows bf16"});
  expect_error([] { mt::full({2}, 1e39); }, {"full", "the value 1e+39 overflows f32"});
  expect_error([] { mt::scalar_tensor(3e9, mt::kI32); }, {"scalar_tensor", "the value 3e+09 overflows i32", "[]"});
  expect_error([] { mt::zeros({2}, mt::kI64).fill_(1e19); }, {"fill_", "the value 1e+19 overflows i64", "[2]"});
  expect_error([] { mt::zeros({2, 2}, mt::kF16).set({0, 1}, 70000); }, {"set", "overflows f16", "[2, 2]"});
  expect_error([] { mt::arange(0.0, 300.0, 1.0, mt::kU8); }, {"arange", "the value 299 overflows u8", "[300]"});
  expect_error([] { mt::arange(-2.0, 2.0, 1.0, mt::kU8); }, {"arange", "the value -2 overflows u8"});
  // Reading back: an element that does not fit the type asked for.
  expect_error([] { (void)mt::full({}, 1e30, mt::kF64).item<int64_t>(); }, {"item", "the f64 value 1e+30", "i64"});
  expect_error([&] { (void)mt::full({}, nan, mt::kF32).item<int64_t>(); }, {"item", "the f32 value nan", "i64"});
  expect_error([] { (void)mt::full({}, 7e4).item<mt::Half>(); }, {"item", "the f32 value 70000 overflows f16"});
  expect_error([] { (void)mt::full({2}, 1e300, mt::kF64).at<float>({1}); }, {"at", "the f64 value 1e+300", "f32"});

  // What fits is taken: the extremes, infinities and NaN in floating dtypes, fractions cut toward zero, any bool.
  BOOST_TEST(mt::full({1}, -0x1p63, mt::kI64).item<int64_t>() == std::numeric_limits<int64_t>::min());
  BOOST_TEST(mt::full({1}, 255, mt::kU8).to_vector<int64_t>()[0] == 255);
  BOOST_TEST(mt::full({1}, -2.9, mt::kI32).item<int64_t>() == -2);
  BOOST_TEST(mt::full({1}, 65504, mt::kF16).item<double>() == 65504.0);
  BOOST_TEST(mt::full({1}, -inf, mt::kF16).item<double>() == -inf);
  BOOST_TEST(std::isnan(mt::full({1}, nan, mt::kBF16).item<double>()));
  BOOST_TEST(mt::full({1}, 7, mt::kBool).item<int64_t>() == 1);
  BOOST_TEST(mt::arange(0.0, 256.0, 1.0, mt::kU8).numel() == 256);
  BOOST_TEST(mt::full({}, inf, mt::kF64).item<float>() == static_cast<float>(inf));
  BOOST_TEST(mt::full({}, 2.5, mt::kF64).item<int64_t>() == 2);
  // A bound past f16's range is no bound (clamp compares in f64 and leaves x as it is), as PyTorch's.
  const mt::Tensor x = mt::full({3}, 60000, mt::kF16);
  BOOST_TEST(mt::clamp(x, std::nullopt, 1e5).to_vector<float>() == x.to_vector<float>());
  // where's scalar operand becomes a value of the tensor's dtype: refused where that dtype cannot hold it, as by
  // PyTorch 1.13's where (checked: torch.where(c, x_f16, 1e5) and torch.where(c, x_i32, 3000000000) raise "value
  // cannot be converted to type ... without overflow", either operand order); it was a silent inf and a wrapped
  // -1294967296. A u8 takes -255..-1, which wrap (PyTorch's where(c, x_u8, -1) is 255), not -256 or 256.
  const mt::Tensor no = mt::zeros({2}, mt::kBool);
  const mt::Tensor f16 = mt::full({2}, 5, mt::kF16), i32 = mt::full({2}, 5, mt::kI32), u8 = mt::full({2}, 5, mt::kU8);
  expect_error([&] { mt::where(no, f16, 1e5); }, {"where: the scalar b 100000 cannot be converted to f16", "[2]"});
  expect_error([&] { mt::where(no, 65519.0, f16); }, {"where: the scalar a 65519", "f16", "overflow"});
  expect_error([&] { mt::where(no, i32, 3e9); }, {"where: the scalar b 3e+09 cannot be converted to i32"});
  expect_error([&] { mt::where(no, -2147483649.0, i32); }, {"where: the scalar a", "i32", "overflow"});
  expect_error([&] { mt::where(no, u8, 256); }, {"where: the scalar b 256", "u8", "overflow"});
  expect_error([&] { mt::where(no, u8, -256); }, {"where: the scalar b -256", "u8", "overflow"});
  expect_error([&] { mt::where(no, mt::full({2}, 5, mt::kBF16), 1e39); }, {"where", "bf16", "overflow"});
  expect_error([&] { mt::where(no, mt::full({2}, 5, mt::kF32), 1e39); }, {"where", "f32", "overflow"});
  BOOST_TEST(mt::where(no, f16, 65504).to_vector<float>() == std::vector<float>(2, 65504));
  BOOST_TEST(mt::where(no, f16, -inf).to_vector<float>() == std::vector<float>(2, -inf));
  BOOST_TEST(std::isnan(mt::where(no, f16, nan).to_vector<float>()[0]));
  BOOST_TEST(mt::where(no, i32, -2147483648.0).to_vector<int64_t>() == std::vector<int64_t>(2, -2147483648LL));
  BOOST_TEST(mt::where(no, u8, -1).to_vector<int64_t>() == std::vector<int64_t>(2, 255));
  BOOST_TEST(mt::where(no, u8, -255).to_vector<int64_t>() == std::vector<int64_t>(2, 1));
  // Arithmetic with a scalar is another thing: an integral scalar on an integer tensor wraps as integer arithmetic.
  BOOST_TEST((mt::full({2}, 5, mt::kU8) - 6.0).to_vector<int64_t>() == std::vector<int64_t>(2, 255));
}

BOOST_AUTO_TEST_CASE(sizes_that_overflow_are_refused_before_allocating) {
  expect_error([] { mt::zeros({int64_t{1} << 62}); }, {"zeros", "[4611686018427387904]", "more bytes"});
  expect_error([] { mt::ones({int64_t{1} << 31, int64_t{1} << 31, 8}); }, {"ones", "more elements"});
  expect_error([] { mt::empty({int64_t{1} << 40, int64_t{1} << 40}); }, {"empty", "more elements"});
  expect_error([] { mt::full({int64_t{1} << 61, 2}, 1.0); }, {"full", "more bytes"});
  expect_error([] { mt::randn({int64_t{1} << 61}); }, {"randn", "too large"});
  expect_error([] { mt::randint(0, 5, {int64_t{1} << 62, 4}); }, {"randint", "more elements"});
  expect_error([] { mt::arange(0.0, 1e19); }, {"arange", "more than a tensor can hold"});
  // Empty, but with strides past 64 bits.
  expect_error([] { mt::empty({0, int64_t{1} << 62, 4}); }, {"empty", "[0, 4611686018427387904, 4]", "strides"});
  expect_error([] { mt::zeros({0}).reshape({0, int64_t{1} << 62, 4}); }, {"reshape", "strides"});
  // Out of memory names the op and the bytes it wanted (2^59 f32 elements: 2 EiB).
  expect_error([] { mt::zeros({int64_t{1} << 59}); }, {"zeros", "2305843009213693952 bytes", "out of memory"});
  // An expand of 2^62 elements is a view (no memory); what makes it real names the op the user called, not the
  // allocation beneath it.
  const mt::Tensor huge = mt::zeros({1}).expand({int64_t{1} << 62});
  expect_error([&] { (void)huge.contiguous(); }, {"contiguous", "[4611686018427387904]", "more bytes"});
  expect_error([&] { (void)huge.clone(); }, {"clone", "[4611686018427387904]", "more bytes"});
  expect_error([&] { (void)mt::exp(huge); }, {"exp", "[4611686018427387904]", "more bytes"});
  expect_error([&] { (void)(huge * huge); }, {"mul", "[4611686018427387904]", "more bytes"});
  // A reduction of it needs host scratch beyond any machine's: named too (not a bare std::bad_alloc). Not under
  // AddressSanitizer (scripts/sanitize.sh), whose operator new ends the process where it would throw bad_alloc.
#ifndef __SANITIZE_ADDRESS__
  expect_error([&] { (void)mt::sum(huge); }, {"sum", "out of host memory", "[4611686018427387904] f32"});
#endif
}

BOOST_AUTO_TEST_CASE(views_with_sizes_that_overflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // A product that wraps to the input's element count (2^64 -> 0) is not a valid shape.
  expect_error([] { mt::zeros({0}).reshape({int64_t{1} << 32, int64_t{1} << 32}); }, {"reshape", "more elements"});
  expect_error([] { mt::zeros({0}).view({int64_t{1} << 32, int64_t{1} << 32}); }, {"view", "more elements"});
  expect_error([] { mt::from_vector(std::vector<float>{}, {int64_t{1} << 32, int64_t{1} << 32}); },
               {"from_vector", "more elements"});
  expect_error([=] { mt::zeros({2, 3}).narrow(1, 1, kMax); }, {"narrow", "length 9223372036854775807", "size 3"});
  expect_error([] { mt::zeros({1}).expand({-5}); }, {"expand", "size -5"});
  // An expand holds no memory, but its element count is an int64 every loop over it uses (2^64 would read as 0).
  expect_error([] { mt::zeros({1, 1}).expand({int64_t{1} << 32, int64_t{1} << 32}); }, {"expand", "more elements"});
  expect_error([] { mt::zeros({1}).expand({int64_t{1} << 31, int64_t{1} << 31, 3}); }, {"expand", "more elements"});
  // Steps and ends near INT64_MAX are fine: one element, or none.
  BOOST_TEST(mt::zeros({2, 3}).slice(1, 0, 3, kMax).size(1) == 1);
  BOOST_TEST(mt::zeros({2, 3}).slice(1, 1, kMax, kMax - 1).size(1) == 1);
  BOOST_TEST(mt::zeros({2, 3}).slice(1, kMax - 1, kMax).size(1) == 0);
}

BOOST_AUTO_TEST_CASE(copy_names_itself) {
  expect_error([] { mt::zeros({2, 3}).copy_(mt::zeros({4})); }, {"copy_", "[4]", "[2, 3]", "broadcast"});
  expect_error([] { mt::zeros({3}).copy_(mt::zeros({2, 3})); }, {"copy_", "[2, 3]", "[3]"});
  expect_error([] { mt::zeros({1, 3}).expand({4, 3}).copy_(mt::ones({4, 3})); },
               {"copy_", "expanded view", "[4, 3]", "clone()"});
  expect_error([] { mt::zeros({2}).copy_(mt::Tensor()); }, {"copy_", "source", "undefined"});
  mt::Tensor t = mt::zeros({2, 3});
  t.copy_(mt::from_vector<float>({1, 2, 3}));  // a broadcast source is fine
  BOOST_TEST(t.at<float>({1, 2}) == 3.0f);
}

BOOST_AUTO_TEST_CASE(undefined_tensor) {
  expect_error([] { mt::Tensor().numel(); }, {"undefined tensor"});
  // The autograd methods name themselves (they once dereferenced null).
  expect_error([] { mt::Tensor().grad(); }, {"Tensor::grad: called on an undefined tensor"});
  expect_error([] { mt::Tensor().detach(); }, {"Tensor::detach: called on an undefined tensor"});
  expect_error([] { mt::Tensor().grad_fn_name(); }, {"Tensor::grad_fn_name: called on an undefined tensor"});
  expect_error([] { mt::Tensor().set_grad(mt::zeros({2})); }, {"Tensor::set_grad: called on an undefined tensor"});
  expect_error([] { mt::Tensor().backward(); }, {"Tensor::backward: called on an undefined tensor"});
}

BOOST_AUTO_TEST_CASE(every_tensor_method_names_itself_on_an_undefined_tensor) {
  // Each method of Tensor but defined(), impl(), impl_ptr() and is_same() (which answer for an undefined tensor too),
  // and the name its error must carry.
  const mt::Tensor u;
  const std::vector<std::pair<std::string, std::function<void()>>> methods = {
      {"shape", [&] { (void)u.shape(); }},
      {"sizes", [&] { (void)u.sizes(); }},
      {"strides", [&] { (void)u.strides(); }},
      {"size", [&] { (void)u.size(0); }},
      {"stride", [&] { (void)u.stride(0); }},
      {"dim", [&] { (void)u.dim(); }},
      {"numel", [&] { (void)u.numel(); }},
      {"dtype", [&] { (void)u.dtype(); }},
      {"device", [&] { (void)u.device(); }},
      {"storage_offset", [&] { (void)u.storage_offset(); }},
      {"itemsize", [&] { (void)u.itemsize(); }},
      {"nbytes", [&] { (void)u.nbytes(); }},
      {"is_contiguous", [&] { (void)u.is_contiguous(); }},
      {"is_cuda", [&] { (void)u.is_cuda(); }},
      {"storage", [&] { (void)u.storage(); }},
      {"data_ptr", [&] { (void)u.data_ptr(); }},
      {"data", [&] { (void)u.data<float>(); }},
      {"to_vector", [&] { (void)u.to_vector<float>(); }},
      {"item", [&] { (void)u.item<float>(); }},
      {"at", [&] { (void)u.at<float>({0}); }},
      {"set", [&] { mt::Tensor(u).set({0}, 1.0); }},
      {"version", [&] { (void)u.version(); }},
      {"bump_version", [&] { u.bump_version(); }},
      {"view", [&] { (void)u.view({1}); }},
      {"reshape", [&] { (void)u.reshape({1}); }},
      {"flatten", [&] { (void)u.flatten(); }},
      {"transpose", [&] { (void)u.transpose(0, 1); }},
      {"t", [&] { (void)u.t(); }},
      {"permute", [&] { (void)u.permute({0}); }},
      {"slice", [&] { (void)u.slice(0, 0, 1); }},
      {"narrow", [&] { (void)u.narrow(0, 0, 1); }},
      {"select", [&] { (void)u.select(0, 0); }},
      {"expand", [&] { (void)u.expand({2}); }},
      {"squeeze", [&] { (void)u.squeeze(); }},
      {"squeeze", [&] { (void)u.squeeze(0); }},
      {"unsqueeze", [&] { (void)u.unsqueeze(0); }},
      {"contiguous", [&] { (void)u.contiguous(); }},
      {"clone", [&] { (void)u.clone(); }},
      {"to", [&] { (void)u.to(mt::kF16); }},
      {"to", [&] { (void)u.to(mt::Device::cpu()); }},
      {"to", [&] { (void)u.to(mt::Device::cpu(), mt::kF16); }},
      {"cpu", [&] { (void)u.cpu(); }},
      {"copy_", [&] { mt::Tensor(u).copy_(mt::zeros({1})); }},
      {"fill_", [&] { mt::Tensor(u).fill_(1.0); }},
      {"zero_", [&] { mt::Tensor(u).zero_(); }},
      {"requires_grad", [&] { (void)u.requires_grad(); }},
      {"requires_grad_", [&] { mt::Tensor(u).requires_grad_(); }},
      {"is_leaf", [&] { (void)u.is_leaf(); }},
  };
  for (const auto& [name, call] : methods) {
    BOOST_TEST_CONTEXT("Tensor::" << name) {
      bool threw = false;
      try {
        call();
      } catch (const mt::Error& e) {
        threw = true;
        const std::string msg = e.what();
        BOOST_TEST((msg.find(name) != std::string::npos && msg.find("undefined") != std::string::npos), msg);
      } catch (const std::exception& e) {
        BOOST_ERROR("another exception: " << e.what());
      }
      BOOST_TEST(threw);
    }
  }
}

BOOST_AUTO_TEST_CASE(set_grad_takes_the_tensors_shape_dtype_and_device) {
  mt::Tensor w = mt::zeros({2, 3}).requires_grad_();
  expect_error([&] { w.set_grad(mt::zeros({3, 2})); }, {"set_grad: gradient of shape [3, 2]", "shape [2, 3]"});
  expect_error([&] { w.set_grad(mt::zeros({2, 3}, mt::kF16)); }, {"set_grad: gradient of dtype f16", "dtype f32"});
  w.set_grad(mt::ones({2, 3}));
  BOOST_TEST(w.grad().to_vector<float>() == std::vector<float>(6, 1.0f), boost::test_tools::per_element());
  w.set_grad(mt::Tensor());  // an undefined gradient clears it
  BOOST_TEST(!w.grad().defined());
}

BOOST_AUTO_TEST_CASE(as_strided_out_of_bounds) {
  expect_error([] { mt::raw::as_strided(mt::zeros({4}), {3}, {2}, 0); }, {"as_strided", "element 4", "4 elements"});
}

BOOST_AUTO_TEST_CASE(cuda_device_when_unavailable) {
  if (mt::cuda::is_available()) {
    expect_error([] { mt::zeros({2}, mt::Device::cuda(mt::cuda::device_count())); }, {"cuda:", "out of range"});
  } else {
    expect_error([] { mt::zeros({2}).to(mt::Device::cuda()); }, {"cuda:0"});
  }
}

BOOST_AUTO_TEST_SUITE_END()
