// tests/test_util.h — what every suite shares: the GPU precondition and
// helpers to compare tensors with a message that says where they differ.
#pragma once

#include <boost/test/unit_test.hpp>

#include <mixtape/cuda/runtime.h>

namespace mixtape::test {

/// Boost.Test precondition for `gpu` cases: skipped, with a message, when no CUDA device is present.
struct cuda_available {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(mixtape::cuda::is_available());
    if (!r) r.message() << "no CUDA device available (" << mixtape::cuda::unavailable_reason() << "): skipping GPU test";
    return r;
  }
};

/// set_allow_clusters for a scope: the previous value comes back when the scope ends, also when a check throws
/// (a test that failed half-way must not leave the clusters off for the cases after it).
class AllowClusters {
 public:
  explicit AllowClusters(bool allow) : m_before(mixtape::cuda::allow_clusters()) {
    mixtape::cuda::set_allow_clusters(allow);
  }
  ~AllowClusters() { mixtape::cuda::set_allow_clusters(m_before); }
  AllowClusters(const AllowClusters&) = delete;
  AllowClusters& operator=(const AllowClusters&) = delete;

 private:
  bool m_before;
};

}  // namespace mixtape::test

/// Decorators for a GPU test case: `BOOST_AUTO_TEST_CASE(name, MT_GPU_TEST)`.
#define MT_GPU_TEST \
  *boost::unit_test::precondition(::mixtape::test::cuda_available()) * boost::unit_test::label("gpu")

/// Added to a GPU case that provokes out-of-memory on purpose: compute-sanitizer reports the failed
/// cudaMalloc as an API error, so bench/gpu_session.sh runs it without these (`--run_test=!@oom`).
#define MT_OOM_TEST *boost::unit_test::label("oom")

/// Added to a GPU case too large for compute-sanitizer's pace (a 4096³ GEMM under racecheck takes minutes):
/// ctest runs it, bench/gpu_session.sh's sanitizer runs skip it (`--run_test=!@large`).
#define MT_LARGE_TEST *boost::unit_test::label("large")
