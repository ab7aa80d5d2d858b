// tests/test_util.h — what every suite shares: the GPU precondition and the test-case labels, the switches GPU
// tests set for a scope, and the inputs more than one op family's tests draw (comparing them: tests/compare.h).
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <mixtape/core/half.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/testing.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::test {

/// Boost.Test precondition for `gpu` cases: skipped, with a message, when CUDA is unavailable (no device, or none
/// the kernels run on).
struct cuda_available {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(mixtape::cuda::is_available());
    if (!r) r.message() << "CUDA is unavailable (" << mixtape::cuda::unavailable_reason() << "): skipping GPU test";
    return r;
  }
};

/// Boost.Test precondition for cases about a machine without CUDA (what every call says there).
struct cuda_unavailable {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(!mixtape::cuda::is_available());
    if (!r) r.message() << "CUDA is available here: the no-CUDA behaviour is not observable";
    return r;
  }
};

/// A process-wide setting changed for a scope: the previous value comes back when the scope ends, also when a check
/// throws (a test that failed half-way must not leave it changed for the cases after it).
template <auto Get, auto Set>
class ScopedSwitch {
 public:
  using Value = decltype(Get());
  explicit ScopedSwitch(Value value) : m_before(Get()) { Set(value); }
  ~ScopedSwitch() { Set(m_before); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  Value m_before;
};
/// Thread-block clusters on or off for a scope (mixtape::cuda::set_allow_clusters).
using AllowClusters = ScopedSwitch<mixtape::cuda::allow_clusters, mixtape::cuda::set_allow_clusters>;
/// TF32 for f32 matrix products on or off for a scope (mixtape::cuda::set_allow_tf32).
using AllowTf32 = ScopedSwitch<mixtape::cuda::allow_tf32, mixtape::cuda::set_allow_tf32>;
/// A limit on the CUDA convolutions' im2col columns for a scope (mixtape::cuda::set_conv_column_limit).
using ConvColumnLimit = ScopedSwitch<mixtape::cuda::conv_column_limit, mixtape::cuda::set_conv_column_limit>;

/// Allocation poisoning for a scope (cuda/testing.h): every CUDA allocation starts as 0xFF bytes, a NaN in every
/// float dtype, so an output element a kernel forgot to write fails the comparison.
class PoisonAllocations {
 public:
  PoisonAllocations() { mixtape::cuda::set_poison_allocations(true); }
  ~PoisonAllocations() { mixtape::cuda::set_poison_allocations(false); }
  PoisonAllocations(const PoisonAllocations&) = delete;
  PoisonAllocations& operator=(const PoisonAllocations&) = delete;
};

// ---- inputs ------------------------------------------------------------------------------------

/// The floating dtypes the GPU-against-CPU comparisons cover (f64 where a test names it).
constexpr DType kGpuFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

/// Element counts for the GPU's elementwise and reduction kernels: the 16-byte vector path with its scalar tail
/// (1, 7, 1023, 65537), and 1<<22 > 2 · 65536 (a reduction's two passes).
constexpr int64_t kGpuSizes[] = {1, 7, 1023, 65537, int64_t{1} << 22};

/// Values of `dtype` uniform in [lo, hi) (integers: whole numbers in that range), drawn in f32 (i64) from `seed`
/// and converted, on the CPU.
inline Tensor random(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  if (!is_floating(dtype))
    return randint(static_cast<int64_t>(lo), static_cast<int64_t>(hi), shape, TensorOptions(DType::kI64), &gen)
        .to(dtype);
  return uniform(shape, lo, hi, TensorOptions(DType::kF32), &gen).to(dtype);
}

/// N(0, 1) values (plus `offset`) drawn in f32 from the default generator (mixtape::manual_seed), rounded once to
/// `dtype`, on the CPU.
inline Tensor randn_as(const Shape& shape, DType dtype, double offset = 0.0) {
  Tensor x = randn(shape);
  if (offset != 0.0) x = kernels::scalar(kernels::ScalarOp::kAdd, x, offset);
  return x.to(dtype);
}

/// N(0, 1) values of `shape` drawn in f32 from `seed`, rounded once to `dtype`, on the CPU.
inline Tensor randn_seeded(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return raw::to(randn(shape, {}, &gen), dtype);
}

/// f64 values of `shape` 0.5 apart in [−3, 3] (13 levels in a scrambled order): exact in every float dtype, also
/// when shifted by ±1000 (f16's spacing there is 0.5). Rows to shift far from zero, where a kernel must give what
/// the unshifted rows give.
inline Tensor half_steps(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5 * static_cast<double>(static_cast<int>(i * 7 % 13) - 6);
  return from_vector(v, shape, DType::kF64);
}

/// A copy of t's values on the CUDA device: a fresh, contiguous (16-byte aligned) allocation, not on the tape.
inline Tensor gpu(const Tensor& t) { return raw::to(t, Device::cuda()); }

/// The same view of t's values on the GPU: its storage copied whole, so shape, strides and offset carry over (a
/// kernel's strided, misaligned or broadcast path runs on both backends).
inline Tensor same_view_on_gpu(const Tensor& t) {
  int64_t extent = 0;
  if (t.numel() != 0) {
    extent = 1;
    for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  }
  const Tensor base = raw::as_strided(t, Shape{t.storage_offset() + extent}, Shape{1}, 0);
  return raw::as_strided(gpu(base), t.shape(), t.strides(), t.storage_offset());
}

/// A CPU leaf and its copy on the GPU as a separate leaf, both requiring grad: an op run forward and backward on
/// each device.
struct Leaf {
  Tensor cpu, gpu;
  explicit Leaf(const Tensor& values) : cpu(raw::clone(values)), gpu(test::gpu(values)) {
    cpu.requires_grad_();
    gpu.requires_grad_();
  }
};

/// The double `v` rounded once to `t` (the reference for "one rounding per output"); other dtypes: v.
inline double round_to(DType t, double v) {
  switch (t) {
    case DType::kF32: return static_cast<float>(v);
    case DType::kF16: return static_cast<float>(Half(v));
    case DType::kBF16: return static_cast<float>(BFloat16(v));
    default: return v;
  }
}

/// A fresh directory under the system's temporary directory ("<prefix>XXXXXX"), removed with its contents when the
/// scope ends.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    BOOST_REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  TempDir(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  /// The names of the directory's entries, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace mixtape::test

/// Decorator for a CPU test case: `BOOST_AUTO_TEST_CASE(name, MT_CPU_TEST)`. Every case carries exactly one of
/// the labels cpu and gpu (a mixed executable's two ctest entries run `@cpu` and `@gpu`).
#define MT_CPU_TEST *boost::unit_test::label("cpu")

/// Decorators for a GPU test case: `BOOST_AUTO_TEST_CASE(name, MT_GPU_TEST)`.
#define MT_GPU_TEST \
  *boost::unit_test::precondition(::mixtape::test::cuda_available()) * boost::unit_test::label("gpu")

/// Added to a GPU case that provokes out-of-memory on purpose: compute-sanitizer reports the failed
/// cudaMalloc as an API error, so bench/gpu_session.sh runs it without these (`--run_test=!@oom`).
#define MT_OOM_TEST *boost::unit_test::label("oom")

/// Added to a GPU case too large for compute-sanitizer's pace (a 4096³ GEMM under racecheck takes minutes):
/// ctest runs it, bench/gpu_session.sh's sanitizer runs skip it (`--run_test=!@large`).
#define MT_LARGE_TEST *boost::unit_test::label("large")
