// bench/null_devices.cpp — a check, not a benchmark: under bench/null_cudart.cpp with two devices, mixtape launches
// every kernel on its tensors' device with that device current, and leaves the caller's device current after.
//
// The GPU machines have one GPU, so no GPU run has seen two devices; the DeviceGuard that remembers its device
// (cuda/stream.cuh) must still never launch on the wrong one. The null runtime keeps a current device per thread,
// gives streams and events the device current at their creation, and counts, per current device, the kernels
// launched, the cudaMallocs and the work sent to another device's stream or event (CUDA refuses that: here it is
// a "mismatch"). Each scenario below runs from one current device on tensors of the other, and checks: launches on
// the tensors' device only, no mismatch, the caller's device current after (cudaGetDevice's answer).
//
//   cmake -S . -B build-null -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA_RUNTIME=Shared
//   cmake --build build-null --target bench_null_devices null_cudart
//   MIXTAPE_NULL_CUDART_DEVICES=2 LD_LIBRARY_PATH=build-null/bench/null_cudart build-null/bench/bench_null_devices
//
// Exit status 0 when every check held, 1 when one failed, 2 when not run under the null runtime with two devices.
// Values computed on the "devices" are garbage (nothing runs): only where things ran is checked.
#include <dlfcn.h>

#include <cstdio>
#include <functional>
#include <string>

#include <mixtape/cuda/stream.h>
#include <mixtape/mixtape.h>

namespace mt = mixtape;

namespace {

using StatsFn = bool (*)(int device, long* launches, long* mallocs, long* mismatches);

struct Counts {
  long launches = 0, mallocs = 0, mismatches = 0;
};

StatsFn g_stats = nullptr;
int g_failures = 0;

Counts counts(int device) {
  Counts c;
  g_stats(device, &c.launches, &c.mallocs, &c.mismatches);
  return c;
}

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

/// Runs `body` with cuda:`current` current; every launch it makes must be on cuda:`on`, with no mismatch, and
/// cuda:`current` must be current again after.
void scenario(const std::string& name, int current, int on, const std::function<void()>& body) {
  mt::cuda::set_device(current);
  const Counts before[2] = {counts(0), counts(1)};
  try {
    body();
  } catch (const std::exception& e) {
    expect(false, name + ": threw " + e.what());
    return;
  }
  const Counts after[2] = {counts(0), counts(1)};
  const int other = 1 - on;
  expect(after[on].launches > before[on].launches,
         name + ": " + std::to_string(after[on].launches - before[on].launches) + " launches on cuda:" +
             std::to_string(on));
  expect(after[other].launches == before[other].launches && after[other].mallocs == before[other].mallocs,
         name + ": nothing launched or allocated on cuda:" + std::to_string(other));
  expect(after[0].mismatches == before[0].mismatches && after[1].mismatches == before[1].mismatches,
         name + ": no work sent to another device's stream or event");
  expect(mt::cuda::current_device() == current, name + ": cuda:" + std::to_string(current) + " current after");
}

}  // namespace

int main() {
  g_stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "mixtape_null_cudart_device_stats"));
  long unused = 0;
  if (g_stats == nullptr || !g_stats(1, &unused, &unused, &unused)) {
    std::printf("bench_null_devices: needs bench/null_cudart.cpp as the CUDA runtime, with two devices "
                "(MIXTAPE_NULL_CUDART_DEVICES=2, a -DMIXTAPE_CUDA_RUNTIME=Shared build): not run\n");
    return 2;
  }
  const mt::Device d0 = mt::Device::cuda(0), d1 = mt::Device::cuda(1);

  for (int on : {1, 0}) {
    const int from = 1 - on;
    const mt::Device dev = on == 1 ? d1 : d0;
    const std::string tag = " (cuda:" + std::to_string(on) + " from cuda:" + std::to_string(from) + ")";
    mt::Tensor a, b, x, w, bias;
    scenario("tensors made and copied" + tag, from, on, [&] {
      a = mt::randn({64, 32}).to(dev);
      b = mt::ones({64, 32}, dev);
      x = mt::randn({16, 32}).to(dev);
      w = mt::randn({8, 32}).to(dev).requires_grad_(true);
      bias = mt::zeros({8}, dev).requires_grad_(true);
    });
    scenario("a + b, sum, softmax" + tag, from, on, [&] {
      const mt::Tensor c = mt::sum(mt::softmax(a + b, 1));
      (void)c;
    });
    scenario("linear under autocast f16, forward and backward" + tag, from, on, [&] {
      mt::Tensor loss;
      {
        mt::amp::Autocast ac(mt::kF16);
        loss = mt::sum(mt::linear(x, w, bias).to(mt::kF32));
      }
      loss.backward();
    });
    scenario("an AdamW step under a GradScaler" + tag, from, on, [&] {
      mt::nn::Linear fc(32, 10);
      fc.to(dev);
      mt::optim::AdamW opt(fc.parameters(), {.lr = 1e-3});
      mt::amp::GradScaler scaler;
      for (int step = 0; step < 3; ++step) {
        mt::Tensor loss;
        {
          mt::amp::Autocast ac(mt::kF16);
          loss = mt::cross_entropy(fc(x), mt::zeros({16}, mt::TensorOptions(mt::DType::kI64).device(dev)));
        }
        opt.zero_grad();
        scaler.scale(loss).backward();
        scaler.step(opt);
        scaler.update();
      }
    });
    scenario("work on a side stream of the tensors' device" + tag, from, on, [&] {
      const mt::cuda::Stream side = mt::cuda::Stream::create(on);
      mt::cuda::StreamGuard guard(side);
      const mt::Tensor c = mt::relu(a * b);  // the pool sees a second stream: its free events are recorded
      (void)c;
    });
    scenario("tensors freed" + tag, from, on, [&] {
      a = b = x = w = bias = mt::Tensor();
      mt::ones({4}, dev);  // a launch, so that "launched on" holds for this scenario too
    });
  }
  std::printf("bench_null_devices: %s\n", g_failures == 0 ? "every check held" : "checks FAILED");
  return g_failures == 0 ? 0 : 1;
}
