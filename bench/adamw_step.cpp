// bench/adamw_step.cpp — what an AdamW step costs on the CPU against the memory it must move.
//
// An optimizer step is memory-bound: each parameter's gradient, state and value are read once and written once
// (f32: read p, g, exp_avg, exp_avg_sq, write p, exp_avg, exp_avg_sq = 28 bytes a parameter; f16 with an f32
// master: read g (2), exp_avg, exp_avg_sq, master, write p (2), exp_avg, exp_avg_sq, master = 28 bytes too). So
// the yardstick is a copy of the same number of bytes (half read, half written), timed in the same run: one
// memcpy, and the same copy cut into chunks over the OpenMP threads (the step's threads); the faster of the two
// is the machine's copy bandwidth. Parameters: 10 tensors of 1M elements (10M), optim::AdamW with its defaults,
// the step that creates the state excluded, the median of 11 timed steps.
#include <mixtape/mixtape.h>
#include <mixtape/optim/adam.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace mt = mixtape;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kTensors = 10;
constexpr int64_t kPerTensor = 1 << 20;
constexpr int64_t kParams = kTensors * kPerTensor;
constexpr int64_t kBytesPerParam = 28;
constexpr int kRepeats = 11;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double median_seconds(F&& f) {
  std::vector<double> t;
  for (int r = 0; r < kRepeats; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

/// Seconds of one AdamW step over kParams parameters of `dtype` (f16: with f32 masters).
double adamw_step_seconds(mt::DType dtype) {
  std::vector<mt::Tensor> params;
  mt::Generator gen(1);
  for (int64_t i = 0; i < kTensors; ++i) {
    mt::Tensor p = mt::randn({kPerTensor}, {}, &gen).to(dtype);
    p.requires_grad_();
    p.set_grad(mt::randn({kPerTensor}, {}, &gen).to(dtype));
    params.push_back(p);
  }
  mt::optim::AdamW opt(params, {.lr = 1e-3});
  opt.step();  // creates exp_avg, exp_avg_sq (and the masters): allocation and first-touch page faults
  opt.step();
  return median_seconds([&] { opt.step(); });
}

}  // namespace

int main() {
  const size_t copy_bytes = static_cast<size_t>(kParams * kBytesPerParam / 2);
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  const double memcpy_s = median_seconds([&] { std::memcpy(dst.data(), src.data(), copy_bytes); });
  const int threads = omp_get_max_threads();
  const double parallel_s = median_seconds([&] {
    const int64_t chunks = 256;
    const int64_t chunk = static_cast<int64_t>(copy_bytes) / chunks;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) std::memcpy(dst.data() + c * chunk, src.data() + c * chunk, chunk);
  });
  const double copy_s = std::min(memcpy_s, parallel_s);
  const double moved = static_cast<double>(kParams * kBytesPerParam);  // what the step reads and writes
  const double copy_gbs = moved / copy_s / 1e9;

  std::printf("AdamW step on the CPU: %lld parameters (%lld tensors of %lld), %d OpenMP threads, median of %d\n",
              static_cast<long long>(kParams), static_cast<long long>(kTensors), static_cast<long long>(kPerTensor),
              threads, kRepeats);
  std::printf("  copy of %.0f MB (read %.0f MB + write %.0f MB): memcpy %.2f ms (%.1f GB/s), %d-thread copy %.2f ms "
              "(%.1f GB/s)\n",
              moved / 1e6, moved / 2e6, moved / 2e6, memcpy_s * 1e3, moved / memcpy_s / 1e9, threads,
              parallel_s * 1e3, moved / parallel_s / 1e9);
  for (mt::DType dtype : {mt::DType::kF32, mt::DType::kF16}) {
    const double s = adamw_step_seconds(dtype);
    const double gbs = moved / s / 1e9;
    std::printf("  %-22s %8.2f ms  %6.1f GB/s  %.2f of the copy's bandwidth\n",
                dtype == mt::DType::kF32 ? "f32" : "f16, f32 masters", s * 1e3, gbs, gbs / copy_gbs);
  }
  return 0;
}
