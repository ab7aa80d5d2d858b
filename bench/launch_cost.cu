// bench/launch_cost.cu — what an eager CUDA op costs the host: a bare kernel launch against the same one-element
// op through mixtape's API, so that an eager step's host time splits into CUDA's part and mixtape's.
//
// The sixth GPU run (bench/RESULTS.md) found the eager AMP MLP step host-bound: 5.7 µs of host time a launch where
// its CUDA graph replays the same kernels in 2.4 µs each; the GPU machine has neither nsys nor perf, so this
// times the parts in-process, on the thread's current stream (the one mixtape launches on):
//   bare launch          an empty kernel, <<<1, 32>>> (CUDA's launch path alone)
//   bare + error check   the same and cudaGetLastError, as every mixtape launch checks
//   bare + 5 cudaGetDevice  the same after five cudaGetDevice calls: what mixtape's launchers and guards asked a
//                        launch of the eager AMP MLP step until the guard remembered its device (270 calls for
//                        50 launches in fp16, counted under bench/null_cudart.cpp; one a launch since): the
//                        price of the calls taken out
//   empty (1) f32        mixtape::empty on the device: the caching allocator's round trip, no kernel
//   add, no grad         a + b of (1) f32 tensors under NoGradGuard: dispatch, output allocation, one kernel
//   add, recorded        the same with a requiring grad: the tape's node on top
//   add under autocast   the same recorded inside amp::Autocast(f16) (add keeps its inputs' dtype: the rule's
//                        lookup and no cast)
//   linear under autocast  a (1, 8) · (8, 8)ᵀ + b linear recorded in autocast f16: the casts of x, w and b and the
//                        GEMM, the MLP layer's launches
// Each row: host µs an op while the host submits kOps ops back to back (the median of kRounds rounds, the device
// drained between rounds, not timed), and µs an op until the device has run them all. When the two are close the
// host was the bottleneck, as in the eager step; when the second is larger the device was.
//
//   bench_gpu_launch    (no arguments; `--once` runs each row for one round, for a profiler)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <mixtape/cuda/check.h>
#include <mixtape/cuda/stream.cuh>
#include <mixtape/mixtape.h>

namespace mt = mixtape;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kOps = 2000;   // ops a round: well under what the device runs in a round, well over a timer's tick
constexpr int kRounds = 15;  // the median of these
bool g_once = false;

__global__ void empty_kernel() {}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Cost {
  double submit_us = 0;  // host time an op, until the last call returned
  double drain_us = 0;   // until the device had run them all
};

/// The median round of `op` run kOps times: host µs an op submitting, and µs an op until the stream is idle.
Cost time_op(const std::function<void()>& op) {
  const mt::cuda::Stream stream = mt::cuda::current_stream();
  for (int i = 0; i < 200; ++i) op();  // warm-up: the allocator's blocks, the kernels' first-launch costs
  stream.synchronize();
  std::vector<double> submit, drain;
  for (int r = 0; r < (g_once ? 1 : kRounds); ++r) {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < kOps; ++i) op();
    const Clock::time_point t1 = Clock::now();
    stream.synchronize();
    const Clock::time_point t2 = Clock::now();
    submit.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kOps);
    drain.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / kOps);
  }
  return {median(submit), median(drain)};
}

void row(const char* what, const std::function<void()>& op, double bare_us) {
  try {
    const Cost c = time_op(op);
    std::printf("  %-26s %8.2f %10.2f %12.2f\n", what, c.submit_us, c.drain_us, c.submit_us - bare_us);
  } catch (const std::exception& e) {
    std::printf("  %-26s failed: %s\n", what, e.what());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  g_once = argc > 1 && std::string(argv[1]) == "--once";
  if (!mt::cuda::is_available()) {
    std::printf("bench_gpu_launch: no CUDA device (%s); nothing measured.\n", mt::cuda::unavailable_reason().c_str());
    return 0;
  }
  const mt::cuda::DeviceProperties props = mt::cuda::device_properties(0);
  mt::cuda::set_device(0);
  std::printf("bench_gpu_launch: %s, sm_%d%d; host µs an op, %d ops a round back to back, median of %d rounds\n",
              props.name.c_str(), props.major, props.minor, kOps, kRounds);
  std::printf("  %-26s %8s %10s %12s\n", "op", "submit", "to idle", "over bare");

  const cudaStream_t stream = mt::cuda::launch_stream();
  Cost bare;
  try {
    bare = time_op([&] { empty_kernel<<<1, 32, 0, stream>>>(); });
  } catch (const std::exception& e) {
    std::printf("  bare launch failed: %s\n", e.what());  // every other row is measured against it
    return 1;
  }
  std::printf("  %-26s %8.2f %10.2f %12s\n", "bare launch", bare.submit_us, bare.drain_us, "");
  row("bare + error check", [&] {
    empty_kernel<<<1, 32, 0, stream>>>();
    MT_CUDA_CHECK_LAUNCH("empty_kernel");
  }, bare.submit_us);
  row("bare + 5 cudaGetDevice", [&] {
    int device = 0;
    for (int i = 0; i < 5; ++i) (void)cudaGetDevice(&device);
    empty_kernel<<<1, 32, 0, stream>>>();
  }, bare.submit_us);

  const mt::Device dev = mt::Device::cuda();
  const mt::TensorOptions f32 = mt::TensorOptions(mt::kF32).device(dev);
  row("empty (1) f32", [&] { (void)mt::empty({1}, f32); }, bare.submit_us);
  const mt::Tensor a = mt::ones({1}, f32), b = mt::ones({1}, f32);
  row("add, no grad", [&] {
    const mt::autograd::NoGradGuard no_grad;
    (void)(a + b);
  }, bare.submit_us);
  const mt::Tensor leaf = mt::ones({1}, f32).requires_grad_();
  row("add, recorded", [&] { (void)(leaf + b); }, bare.submit_us);
  row("add under autocast", [&] {
    const mt::amp::Autocast autocast(mt::kF16);
    (void)(leaf + b);
  }, bare.submit_us);
  const mt::Tensor x = mt::ones({1, 8}, f32), w = mt::ones({8, 8}, f32).requires_grad_();
  const mt::Tensor bias = mt::ones({8}, f32).requires_grad_();
  row("linear under autocast", [&] {
    const mt::amp::Autocast autocast(mt::kF16);
    (void)mt::linear(x, w, bias);
  }, bare.submit_us);
  std::printf("(\"over bare\": the row's host µs less the bare launch's; linear launches its casts and its GEMM)\n");
  return 0;
}
