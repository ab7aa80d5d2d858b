// tests/test_cuda_runtime.cpp — the CUDA runtime queries and the CUDA backend's memory, copies, casts and fills.
//
// The CPU backend is the reference (DESIGN.md, "Backends"): a cast or fill on
// the device must give the very bits the CPU gives, for every dtype pair and
// for sources and destinations with any strides. The `cpu` suite checks what
// a machine without a GPU (or a build without CUDA) must do: answer the
// queries without throwing and refuse CUDA tensors with a clear error.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/capability.h>
#include <mixtape/cuda/runtime.h>

#include "test_util.h"

namespace mt = mixtape;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;
using mt::TensorOptions;

namespace {

constexpr DType kAllDTypes[] = {mt::kF64, mt::kF32, mt::kF16, mt::kBF16, mt::kI64, mt::kI32, mt::kU8, mt::kBool};

bool mentions(const mt::Error& e, const std::string& word) {
  std::string msg = e.what(), w = word;
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  return lower(msg).find(lower(w)) != std::string::npos;
}

/// Checks that `got` and `want` (same dtype and shape, any device, any strides) hold the same bits element by
/// element; with `nan_any_payload`, two NaNs match whatever their payloads (see the cast test for why). A failure
/// names `what` and prints the first mismatching elements as bits and values.
void check_bit_exact(const Tensor& got, const Tensor& want, const std::string& what, bool nan_any_payload = false) {
  BOOST_TEST_REQUIRE(got.dtype() == want.dtype(), what << ": dtype " << got.dtype() << " vs " << want.dtype());
  BOOST_TEST_REQUIRE(got.shape() == want.shape(), what << ": shape " << got.shape() << " vs " << want.shape());
  const Tensor g = got.cpu().contiguous().reshape({-1});
  const Tensor w = want.cpu().contiguous().reshape({-1});
  const auto* gp = static_cast<const unsigned char*>(g.data_ptr());
  const auto* wp = static_cast<const unsigned char*>(w.data_ptr());
  const size_t size = g.itemsize();
  const int64_t n = g.numel();
  int64_t mismatches = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* a = gp + static_cast<size_t>(i) * size;
    const unsigned char* b = wp + static_cast<size_t>(i) * size;
    if (std::memcmp(a, b, size) == 0) continue;
    const double gv = g.at<double>({i}), wv = w.at<double>({i});
    if (nan_any_payload && std::isnan(gv) && std::isnan(wv)) continue;
    if (mismatches++ < 5) {
      uint64_t ga = 0, wb = 0;
      std::memcpy(&ga, a, size);
      std::memcpy(&wb, b, size);
      first << "\n  [" << i << "] got 0x" << std::hex << ga << " (" << std::dec << std::setprecision(17) << gv
            << "), want 0x" << std::hex << wb << " (" << std::dec << wv << ")";
    }
  }
  BOOST_TEST(mismatches == 0, what << ": " << mismatches << " of " << n << " elements differ (dtype " << g.dtype()
                                   << ", shape " << got.shape() << ")" << first.str());
}

/// Random values that fill the dtype's typical range (used where only the bytes matter).
Tensor random_of(const Shape& shape, DType dtype, mt::Generator& gen, Device device = Device::cpu()) {
  TensorOptions opts = TensorOptions(dtype).device(device);
  switch (dtype) {
    case DType::kF64: case DType::kF32: case DType::kF16: case DType::kBF16: return mt::randn(shape, opts, &gen);
    case DType::kI64: case DType::kI32: return mt::randint(-(int64_t{1} << 30), int64_t{1} << 30, shape, opts, &gen);
    case DType::kU8: return mt::randint(0, 256, shape, opts, &gen);
    case DType::kBool: return mt::randint(0, 2, shape, opts, &gen);
  }
  return {};
}

/// CPU source values of dtype `from` for a cast to `to`: as wild as the conversion is defined for. Floats headed
/// for a float or bool get magnitudes from 2^-160 to 2^140 (subnormals, rounding ties, overflow) and ±0, ±inf,
/// NaN; floats headed for an integer stay inside its range (out-of-range float-to-int is undefined behaviour,
/// and the CPU and GPU really do differ there). Integer sources use their full range: every integer conversion
/// is defined.
Tensor cast_source(const Shape& shape, DType from, DType to, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto n = static_cast<size_t>(shape.numel());
  if (mt::is_floating(from)) {
    std::vector<double> v(n);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    if (mt::is_floating(to) || to == DType::kBool) {
      std::uniform_int_distribution<int> exponent(-160, 140);
      const double specials[] = {0.0, -0.0, std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                                 65504.0, 65520.0, 1.0 + 0x1p-11, 1.0 + 0x1p-8 + 0x1p-30};
      for (size_t i = 0; i < n; ++i) {
        if (i % 64 < std::size(specials)) {
          v[i] = specials[i % 64];
        } else {
          const double sign = rng() & 1 ? -1.0 : 1.0;
          v[i] = sign * std::ldexp(1.0 + unit(rng), exponent(rng));
        }
      }
    } else {
      // f16 holds at most 65504; u8 stays below 250 so that no rounding of the source reaches 256.
      const double hi = to == DType::kU8 ? 250.0 : from == DType::kF16 ? 6.0e4 : 1.0e9;
      const double lo = to == DType::kU8 ? 0.0 : -hi;
      for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * unit(rng);
    }
    return mt::from_vector(v, shape, TensorOptions(from));
  }
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    const auto r = static_cast<int64_t>(rng());
    switch (from) {
      case DType::kI64: v[i] = i % 2 ? r : r % 70000; break;  // small ones land inside f16's range
      case DType::kI32: v[i] = i % 2 ? static_cast<int32_t>(r) : r % 70000; break;
      case DType::kU8: v[i] = static_cast<uint8_t>(r); break;
      default: v[i] = r & 1; break;
    }
  }
  return mt::from_vector(v, shape, TensorOptions(from));
}

/// A view of the same kind on either device, so the device sees the strides (Tensor::to(Device) would make
/// a CPU view contiguous before moving it).
struct View {
  const char* name;
  bool three_d;  // a view of the 3-D base instead of the 2-D one
  std::function<Tensor(const Tensor&)> make;
};

const std::vector<View>& views() {
  static const std::vector<View> v = {
      {"contiguous", false, [](const Tensor& t) { return t; }},
      {"transpose", false, [](const Tensor& t) { return t.t(); }},
      {"slice with step 3", false, [](const Tensor& t) { return t.slice(1, 1, t.size(1), 3); }},
      {"expand (0-stride rows)", false, [](const Tensor& t) { return t.slice(0, 5, 6).expand({9, t.size(1)}); }},
      {"1-D with step 5", false, [](const Tensor& t) { return t.reshape({-1}).slice(0, 2, t.numel(), 5); }},
      {"0-D element", false, [](const Tensor& t) { return t.select(0, 3).select(0, 4); }},
      {"3-D permute", true, [](const Tensor& t) { return t.permute({2, 0, 1}); }},
      {"3-D permute of a slice", true, [](const Tensor& t) { return t.slice(1, 1, 6, 2).permute({1, 2, 0}); }},
  };
  return v;
}

/// An uninitialised CUDA tensor of `shape` whose strides run backwards (a transposed destination).
Tensor reversed_strides(const Shape& shape, DType dtype) {
  Shape rev = shape, order = shape;
  for (int64_t i = 0; i < shape.size(); ++i) {
    rev[i] = shape[shape.size() - 1 - i];
    order[i] = shape.size() - 1 - i;
  }
  return mt::empty(rev, TensorOptions(dtype).device(Device::cuda())).permute(order);
}

}  // namespace

// ---- what every machine must do ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_runtime_cpu, *boost::unit_test::label("cpu"))

BOOST_AUTO_TEST_CASE(queries_never_throw) {
  BOOST_CHECK_NO_THROW(mt::cuda::is_available());
  BOOST_CHECK_NO_THROW(mt::cuda::device_count());
  BOOST_CHECK_NO_THROW(mt::cuda::unavailable_reason());
  const bool available = mt::cuda::is_available();
  const int count = mt::cuda::device_count();
  const std::string reason = mt::cuda::unavailable_reason();
  BOOST_TEST((!available || count > 0));
  BOOST_TEST(count >= 0);
  BOOST_TEST(reason.empty() == available, "reason: '" << reason << "'");
  // Devices but none available: a GPU the kernels were not built for, named with its capability.
  if (!available && count > 0)
    BOOST_TEST(reason.find("compute capability") != std::string::npos, "reason: '" << reason << "'");
  // Asking twice gives the same answers (the probe must not leave an error behind that changes them).
  BOOST_TEST(mt::cuda::is_available() == available);
  BOOST_TEST(mt::cuda::device_count() == count);
  BOOST_TEST(mt::cuda::unavailable_reason() == reason);
  BOOST_TEST_MESSAGE("CUDA: " << (available ? std::to_string(count) + " device(s)" : "unavailable: " + reason));
}

BOOST_AUTO_TEST_CASE(unavailable_cuda_is_a_clear_error,
                     *boost::unit_test::precondition(mt::test::cuda_unavailable())) {
  const Tensor t = mt::ones({3});
  auto mentions_cuda = [](const mt::Error& e) { return mentions(e, "cuda"); };
  BOOST_CHECK_EXCEPTION(t.to(Device::cuda()), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(t.cuda(), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(mt::zeros({2, 2}, Device::cuda()), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(mt::cuda::device_properties(), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(mt::cuda::synchronize(), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(mt::cuda::set_device(0), mt::Error, mentions_cuda);
  BOOST_CHECK_EXCEPTION(mt::cuda::current_device(), mt::Error, mentions_cuda);
  // The failed attempts leave the CPU side working.
  BOOST_TEST(t.to_vector<float>() == std::vector<float>(3, 1.0f), boost::test_tools::per_element());
}

// Which GPUs the kernels run on (cuda/capability.h, host code): built for sm_80 and sm_90, each with its PTX, they
// run on 8.0 and newer (SASS on 8.x and 9.0, the PTX compiled by the driver beyond), not on a T4 or a V100; built
// for sm_86 alone, not on an A100. bench/null_capability.cpp checks what the runtime does with the answer.
BOOST_AUTO_TEST_CASE(kernels_run_on_the_capabilities_built_for) {
  namespace d = mt::cuda::detail;
  const std::array<int, 2> built{800, 900};
  for (const auto& [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 7}, {8, 9}, {9, 0}, {10, 0}, {12, 0}})
    BOOST_TEST(d::kernels_run_on(major, minor, built), major << "." << minor);
  for (const auto& [major, minor] : {std::pair{7, 5}, {7, 0}, {6, 1}, {5, 2}})
    BOOST_TEST(!d::kernels_run_on(major, minor, built), major << "." << minor);
  const std::array<int, 2> ampere_consumer{860, 900};
  BOOST_TEST(!d::kernels_run_on(8, 0, ampere_consumer));
  BOOST_TEST(d::kernels_run_on(8, 6, ampere_consumer));
  BOOST_TEST(d::kernels_run_on(8, 9, ampere_consumer));
  BOOST_TEST(!d::kernels_run_on(9, 0, std::span<const int>{}));
  BOOST_TEST(d::arch_names(built) == "sm_80, sm_90");
  BOOST_TEST(d::capability_of(0, "Tesla T4", 7, 5) == "cuda:0 (Tesla T4) has compute capability 7.5");
  BOOST_TEST(d::capability_needed(built) ==
             "mixtape's CUDA kernels need compute capability 8.0 or newer (this build has sm_80, sm_90)");
  BOOST_TEST(d::capability_needed(ampere_consumer) ==
             "mixtape's CUDA kernels need compute capability 8.6 or newer (this build has sm_86, sm_90)");
}

// A setting every build keeps (the CUDA convolutions read it): automatic by default (each dtype's limit), what was
// set, automatic again, a negative other than kConvColumnLimitAuto refused.
BOOST_AUTO_TEST_CASE(conv_column_limit_is_a_setting_with_a_clear_error) {
  BOOST_TEST(mt::cuda::conv_column_limit() == mt::cuda::kConvColumnLimitAuto);
  BOOST_TEST(mt::cuda::kDefaultConvColumnLimitF16 == int64_t{10} << 20);
  BOOST_TEST(mt::cuda::kDefaultConvColumnLimitF32 == int64_t{20} << 20);
  mt::cuda::set_conv_column_limit(int64_t{16} << 20);
  BOOST_TEST(mt::cuda::conv_column_limit() == int64_t{16} << 20);
  for (const int64_t bad : {int64_t{-2}, int64_t{-(1 << 20)}}) {
    BOOST_CHECK_EXCEPTION(mt::cuda::set_conv_column_limit(bad), mt::Error, [&](const mt::Error& e) {
      return mentions(e, "set_conv_column_limit") && mentions(e, std::to_string(bad));
    });
  }
  BOOST_TEST(mt::cuda::conv_column_limit() == int64_t{16} << 20);  // unchanged by the refused calls
  mt::cuda::set_conv_column_limit(0);
  BOOST_TEST(mt::cuda::conv_column_limit() == 0);
  mt::cuda::set_conv_column_limit(mt::cuda::kConvColumnLimitAuto);
  BOOST_TEST(mt::cuda::conv_column_limit() == mt::cuda::kConvColumnLimitAuto);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the device ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_runtime_gpu)

BOOST_AUTO_TEST_CASE(device_properties_are_sane, MT_GPU_TEST) {
  for (int d = 0; d < mt::cuda::device_count(); ++d) {
    const mt::cuda::DeviceProperties p = mt::cuda::device_properties(d);
    BOOST_TEST_MESSAGE("cuda:" << d << ": " << p.name << ", sm_" << p.major << p.minor << ", "
                               << p.multiprocessor_count << " SMs, " << p.total_memory << " bytes, L2 "
                               << p.l2_cache_bytes << " bytes, smem opt-in " << p.shared_memory_per_block_optin);
    BOOST_TEST(!p.name.empty());
    BOOST_TEST(p.major >= 8, "mixtape targets sm_80 and sm_90; cuda:" << d << " is sm_" << p.major << p.minor);
    BOOST_TEST(p.multiprocessor_count > 0);
    BOOST_TEST(p.total_memory > (size_t{1} << 30));
    BOOST_TEST(p.shared_memory_per_block_optin >= size_t{48} << 10);
    BOOST_TEST(p.l2_cache_bytes > 0u);
  }
  BOOST_CHECK_THROW(mt::cuda::device_properties(mt::cuda::device_count()), mt::Error);
  BOOST_CHECK_THROW(mt::cuda::device_properties(-1), mt::Error);
}

BOOST_AUTO_TEST_CASE(current_device_and_synchronize, MT_GPU_TEST) {
  const int before = mt::cuda::current_device();
  mt::cuda::set_device(0);
  BOOST_TEST(mt::cuda::current_device() == 0);
  BOOST_CHECK_THROW(mt::cuda::set_device(mt::cuda::device_count()), mt::Error);
  BOOST_TEST(mt::cuda::current_device() == 0);
  BOOST_CHECK_NO_THROW(mt::cuda::synchronize());
  mt::cuda::set_device(before);
  BOOST_CHECK_EXCEPTION(mt::zeros({2}, Device::cuda(mt::cuda::device_count())), mt::Error,
                        [](const mt::Error& e) { return mentions(e, "out of range"); });
}

BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact, MT_GPU_TEST) {
  mt::Generator gen(20240601);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{65537}, int64_t{1} << 22}) {
    for (DType t : kAllDTypes) {
      const Tensor host = random_of({n}, t, gen);
      const Tensor dev = host.to(Device::cuda());
      BOOST_TEST_REQUIRE(dev.is_cuda());
      BOOST_TEST(dev.dtype() == t);
      check_bit_exact(dev.cpu(), host, "round trip of " + std::to_string(n) + " " + mt::dtype_name(t));
    }
  }
}

BOOST_AUTO_TEST_CASE(cast_matches_cpu_for_every_dtype_pair, MT_GPU_TEST) {
  // Float-to-float casts through f32 <-> f64 are the hardware's conversions on both sides and agree on every
  // number, but a NaN's payload is the implementation's choice there (the GPU returns its canonical NaN), so
  // NaNs match as NaNs for f32/f64 destinations. f16/bf16 results come from core/half.h on both sides (the
  // device's hardware conversion plus a select that keeps the CPU's NaN rule) and must match to the bit, NaNs
  // included.
  uint64_t seed = 1;
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      const Tensor base2 = cast_source({37, 61}, from, to, seed++);
      const Tensor base3 = cast_source({4, 6, 10}, from, to, seed++);
      const Tensor dev2 = base2.to(Device::cuda()), dev3 = base3.to(Device::cuda());
      const bool nan_any_payload = to == DType::kF32 || to == DType::kF64;
      for (const View& v : views()) {
        const Tensor src_cpu = v.make(v.three_d ? base3 : base2);
        const Tensor src_dev = v.make(v.three_d ? dev3 : dev2);
        BOOST_TEST_REQUIRE(src_dev.is_cuda());
        const Tensor want = src_cpu.to(to);
        std::ostringstream what;
        what << mt::dtype_name(from) << " -> " << mt::dtype_name(to) << ", source " << v.name << " (shape "
             << src_dev.shape() << ", strides " << src_dev.strides() << "), seed " << seed - 2;
        check_bit_exact(src_dev.to(to), want, what.str() + ", Tensor::to", nan_any_payload);
        if (src_dev.dim() >= 2) {
          Tensor dst = reversed_strides(src_dev.shape(), to);
          dst.copy_(src_dev);
          check_bit_exact(dst, want, what.str() + ", copy_ into strides " + [&] {
            std::ostringstream s;
            s << dst.strides();
            return s.str();
          }(), nan_any_payload);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(floating_to_integer_casts_past_the_range_agree_with_the_cpu, MT_GPU_TEST) {
  // C++ leaves these casts undefined; core/dtype.h's saturating_cast defines them on both sides (NaN gives 0, a
  // value past the range the nearest end). A plain cast on the device saturates to i32/i64 (cvt.rzi) but not to u8:
  // nvcc converts through a u32 and keeps its low byte (300 -> 44). test_tensor checks the CPU's values themselves.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {nan,  inf,    -inf,    1e30,   -1e30,  300.0, 256.0, -1.0,  -0.75,
                                      2.9,  -2.9,   255.5,   3e9,    -3e9,   0x1p63, -0x1p63, 0x1p31, -0x1p31};
  for (DType from : {mt::kF64, mt::kF32, mt::kF16, mt::kBF16}) {
    const Tensor cpu = mt::from_vector(values).to(from);
    const Tensor dev = cpu.to(Device::cuda());
    for (DType to : {mt::kI64, mt::kI32, mt::kU8}) {
      const std::vector<int64_t> want = cpu.to(to).to_vector<int64_t>(), got = dev.to(to).to_vector<int64_t>();
      for (size_t i = 0; i < values.size(); ++i)
        BOOST_TEST(got[i] == want[i], mt::dtype_name(from) << " " << values[i] << " -> " << mt::dtype_name(to));
    }
  }
}

// The device converts float <-> f16 and float -> bf16 with the hardware's cvt instructions (core/half.h) and
// the CPU with integer code: every 16-bit pattern, and every rounding tie of each with its two neighbours,
// must give the same bits, NaNs (which the device leaves to the integer code) included.
BOOST_AUTO_TEST_CASE(half_and_bfloat16_conversions_are_bit_exact_on_the_device, MT_GPU_TEST) {
  for (DType narrow : {mt::kF16, mt::kBF16}) {
    const char* name = mt::dtype_name(narrow);
    Tensor patterns = mt::empty({65536}, TensorOptions(narrow));
    auto* bits = static_cast<uint16_t*>(patterns.data_ptr());
    for (uint32_t b = 0; b < 65536; ++b) bits[b] = static_cast<uint16_t>(b);
    const Tensor wide = patterns.to(mt::kF32);  // the CPU's integer widening
    check_bit_exact(patterns.to(Device::cuda()).to(mt::kF32), wide, std::string(name) + " -> f32, all 65536 patterns");

    // Ties: the midpoint between each positive finite pattern and the next, and the floats either side of it
    // (the largest finite value's "next" is one more step of its binade: its tie is the overflow threshold).
    const auto* w = static_cast<const float*>(wide.data_ptr());
    std::vector<float> v;
    for (uint32_t b = 1; b < 0x8000; ++b) {
      if (!std::isfinite(w[b])) break;
      const double next = std::isfinite(w[b + 1]) ? w[b + 1] : 2.0 * w[b] - w[b - 1];
      const auto mid = static_cast<float>((static_cast<double>(w[b]) + next) / 2);  // exact in f32
      for (float x : {std::nextafter(mid, -INFINITY), mid, std::nextafter(mid, INFINITY)}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
    std::mt19937 rng(2026);
    for (int i = 0; i < (1 << 20); ++i) {  // random bit patterns: subnormals, infinities and NaN payloads too
      const uint32_t u = rng();
      float x;
      std::memcpy(&x, &u, sizeof x);
      v.push_back(x);
    }
    const Tensor f = mt::from_vector(v, Shape{static_cast<int64_t>(v.size())});
    check_bit_exact(f.to(Device::cuda()).to(narrow), f.to(narrow),
                    std::string("f32 -> ") + name + ", ties, their neighbours and 2^20 random patterns");
  }
}

BOOST_AUTO_TEST_CASE(cast_of_large_tensors_covers_the_grid_stride_loop, MT_GPU_TEST) {
  // Millions of elements: more than one grid's worth of threads, so every thread loops.
  mt::Generator gen(7);
  const Tensor host = mt::randn({2048, 2049}, TensorOptions(mt::kF32), &gen);
  const Tensor dev = host.to(Device::cuda());
  check_bit_exact(dev.to(mt::kF16), host.to(mt::kF16), "large contiguous f32 -> f16");
  check_bit_exact(dev.t().to(mt::kBF16), host.t().to(mt::kBF16), "large transposed f32 -> bf16");
  check_bit_exact(dev.slice(1, 0, 2049, 2).to(mt::kF64), host.slice(1, 0, 2049, 2).to(mt::kF64),
                  "large sliced f32 -> f64");
}

BOOST_AUTO_TEST_CASE(fill_matches_cpu_for_every_dtype, MT_GPU_TEST) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (DType t : kAllDTypes) {
    std::vector<double> values;
    // 65500 rounds to f16's largest, 65504; past it f16 refuses (65519, 65520, 3e38), as PyTorch does.
    if (mt::is_floating(t))
      values = {0.0, -0.0, 0.1, -2.5, 65500.0, 65504.0, 65519.0, 65520.0, 1e-8, 3e38, inf, -inf, nan};
    else if (t == DType::kU8) values = {0, 1, 200, 255, 256, -1};
    else if (t == DType::kBool) values = {0, 1, 0.5, -3};
    else values = {0, 7, -3, 2147483647.0, -2147483648.0, 2147483648.0};
    for (double value : values) {
      std::ostringstream what;
      what << "fill " << mt::dtype_name(t) << " with " << value;
      if (!mt::fits(value, t)) {  // Refused on either device, before any kernel.
        for (Device d : {Device::cpu(), Device::cuda()}) {
          BOOST_CHECK_THROW(mt::full({3}, value, TensorOptions(t).device(d)), mt::Error);
          BOOST_CHECK_THROW(mt::zeros({3}, TensorOptions(t).device(d)).fill_(value), mt::Error);
        }
        continue;
      }
      // Contiguous, big enough for the grid-stride loop.
      const Shape big{(int64_t{1} << 20) + 3};
      check_bit_exact(mt::full(big, value, TensorOptions(t).device(Device::cuda())),
                      mt::full(big, value, TensorOptions(t)), what.str() + " (contiguous)");
      // Every other column of a transposed tensor: the untouched elements keep their value.
      Tensor dev = mt::full({33, 65}, 1.0, TensorOptions(t).device(Device::cuda()));
      Tensor host = mt::full({33, 65}, 1.0, TensorOptions(t));
      dev.t().slice(1, 0, 33, 2).fill_(value);
      host.t().slice(1, 0, 33, 2).fill_(value);
      check_bit_exact(dev, host, what.str() + " (strided view)");
      // One element through a 0-D view.
      const double one_more = t == DType::kU8 ? 0.0 : -1.0;
      dev.select(0, 4).select(0, 7).fill_(one_more);
      host.select(0, 4).select(0, 7).fill_(one_more);
      check_bit_exact(dev, host, what.str() + " (then one element)");
    }
  }
}

BOOST_AUTO_TEST_CASE(copy_across_devices_with_broadcasting, MT_GPU_TEST) {
  mt::Generator gen(11);
  // CPU row -> CUDA matrix, converting f32 to f16.
  const Tensor row = mt::randn({1, 5}, TensorOptions(mt::kF32), &gen);
  Tensor dev = mt::zeros({4, 5}, TensorOptions(mt::kF16).device(Device::cuda()));
  dev.copy_(row);
  check_bit_exact(dev, mt::zeros({4, 5}, TensorOptions(mt::kF16)).copy_(row), "cpu (1, 5) f32 -> cuda (4, 5) f16");
  // CUDA column -> CPU matrix, converting bf16 to f64: broadcast on the device, then moved.
  const Tensor col = mt::randn({3, 1}, TensorOptions(mt::kBF16).device(Device::cuda()), &gen);
  Tensor host = mt::empty({3, 4}, TensorOptions(mt::kF64));
  host.copy_(col);
  check_bit_exact(host, col.cpu().expand({3, 4}).to(mt::kF64), "cuda (3, 1) bf16 -> cpu (3, 4) f64");
  // CUDA -> CUDA on one device, broadcast 1-D into a transposed destination, i64 -> f32.
  const Tensor ints = mt::randint(-1000, 1000, {6}, TensorOptions(mt::kI64).device(Device::cuda()), &gen);
  Tensor t = mt::empty({6, 8}, TensorOptions(mt::kF32).device(Device::cuda())).t();
  t.copy_(ints);
  check_bit_exact(t, ints.cpu().expand({8, 6}).to(mt::kF32), "cuda (6) i64 -> cuda (8, 6)^T f32");
  if (mt::cuda::device_count() < 2) {
    BOOST_TEST_MESSAGE("one CUDA device: the cuda:0 -> cuda:1 cases need two");
    return;
  }
  // cuda:0 -> cuda:1, with and without broadcasting, and back; the caller's device is left alone.
  mt::cuda::set_device(0);
  const Tensor on0 = mt::randn({2, 7}, TensorOptions(mt::kF32).device(Device::cuda(0)), &gen);
  const Tensor on1 = on0.to(Device::cuda(1));
  BOOST_TEST(on1.device() == Device::cuda(1));
  check_bit_exact(on1, on0, "cuda:0 -> cuda:1");
  Tensor wide = mt::zeros({3, 2, 7}, TensorOptions(mt::kBF16).device(Device::cuda(1)));
  wide.copy_(on0);
  check_bit_exact(wide, on0.cpu().expand({3, 2, 7}).to(mt::kBF16), "cuda:0 (2, 7) f32 -> cuda:1 (3, 2, 7) bf16");
  BOOST_TEST(mt::cuda::current_device() == 0);
}

BOOST_AUTO_TEST_CASE(out_of_memory_is_an_error_and_recoverable, MT_GPU_TEST MT_OOM_TEST) {
  const mt::cuda::DeviceProperties p = mt::cuda::device_properties(0);
  const auto too_many = static_cast<int64_t>(p.total_memory) * 2;
  BOOST_CHECK_EXCEPTION(mt::empty({too_many}, TensorOptions(mt::kU8).device(Device::cuda())), mt::Error,
                        [](const mt::Error& e) {
                          BOOST_TEST_MESSAGE("out-of-memory error: " << e.what());
                          return mentions(e, "out of memory") && mentions(e, "cuda:0");
                        });
  // The failure leaves no error behind: a small allocation, a kernel launch and a copy back all work.
  const Tensor small = mt::full({16}, 3.0, TensorOptions(mt::kF32).device(Device::cuda()));
  BOOST_TEST(small.to_vector<float>() == std::vector<float>(16, 3.0f), boost::test_tools::per_element());
  BOOST_CHECK_NO_THROW(mt::cuda::synchronize());
}

BOOST_AUTO_TEST_CASE(empty_tensors_move_and_cast, MT_GPU_TEST) {
  const Tensor dev = mt::empty({0, 3}, TensorOptions(mt::kF16).device(Device::cuda()));
  BOOST_TEST(dev.to(mt::kF32).numel() == 0);
  BOOST_TEST(dev.cpu().numel() == 0);
  Tensor z = mt::zeros({4, 0}, TensorOptions(mt::kI32).device(Device::cuda()));
  BOOST_CHECK_NO_THROW(z.fill_(5));
  BOOST_TEST(z.t().contiguous().numel() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
