// bench/null_capability.cpp — a check, not a benchmark: under bench/null_cudart.cpp with devices of other compute
// capabilities, mixtape uses only the GPUs its kernels run on and refuses the others by name.
//
// The kernels are built for sm_80 and sm_90 (each with its PTX), so a T4 (7.5) or a V100 (7.0) runs none of them:
// there every op would fail at its first launch with CUDA's "no kernel image". mixtape reads each device's compute
// capability once (cuda/capability.h) and says it before: `is_available()` is false when no device qualifies, and
// `unavailable_reason()` names the devices and what the kernels need (so `--device auto` trains on the CPU and the
// gpu tests report themselves skipped with that line); a device that does not qualify beside one that does is
// refused where it is asked for (a tensor on it, set_device, device_properties, a stream). On the devices that
// qualify, what runs must fit each one's limits, which the null runtime models (an RTX 3090's for 8.6, an A100's
// for 8.0 ...): a large matmul may not ask an RTX card for the 136 KB of shared memory a block the GEMM's large tile
// takes on an A100 or an H100. This program checks all of that for the capabilities the null runtime is given, one
// a device:
//
//   cmake -S . -B build-null -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA_RUNTIME=Shared
//   cmake --build build-null --target bench_null_capability null_cudart
//   export LD_LIBRARY_PATH=build-null/bench/null_cudart
//   MIXTAPE_NULL_CUDART_CAPABILITY=7.5 build-null/bench/bench_null_capability                 # a T4 alone
//   MIXTAPE_NULL_CUDART_DEVICES=3 MIXTAPE_NULL_CUDART_CAPABILITY=7.0,8.6,9.0 build-null/bench/bench_null_capability
//   MIXTAPE_NULL_CUDART_DEVICES=3 MIXTAPE_NULL_CUDART_CAPABILITY=8.0,8.9,12.0 build-null/bench/bench_null_capability
//
// Exit status 0 when every check held, 1 when one failed, 2 when not run under the null runtime.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <mixtape/cuda/stream.h>
#include <mixtape/mixtape.h>

namespace mt = mixtape;

namespace {

using StatsFn = bool (*)(int device, long* launches, long* mallocs, long* mismatches);

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Runs `body`: it must succeed where `usable`, and otherwise throw a mixtape::Error containing every one of `words`.
void refused_unless(bool usable, const std::string& what, const std::vector<std::string>& words,
                    const std::function<void()>& body) {
  try {
    body();
    expect(usable, what + (usable ? ": ran" : ": ran, where it should have been refused"));
  } catch (const mt::Error& e) {
    bool named = true;
    for (const std::string& w : words) named = named && contains(e.what(), w);
    expect(!usable && named, what + ": refused: " + e.what());
  } catch (const std::exception& e) {
    expect(false, what + ": threw something other than mixtape::Error: " + e.what());
  }
}

/// The capabilities the null runtime reads (bench/null_cudart.cpp): "7.5,9.0", the last standing for the rest.
std::vector<std::string> given_capabilities(int devices) {
  std::vector<std::string> out;
  const char* v = std::getenv("MIXTAPE_NULL_CUDART_CAPABILITY");
  std::string last = "9.0";
  std::string rest = v != nullptr ? v : "";
  for (int d = 0; d < devices; ++d) {
    if (!rest.empty()) {
      const size_t comma = rest.find(',');
      last = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    }
    out.push_back(last);
  }
  return out;
}

}  // namespace

int main() {
  const auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "mixtape_null_cudart_device_stats"));
  if (stats == nullptr) {
    std::printf("bench_null_capability: needs bench/null_cudart.cpp as the CUDA runtime (a "
                "-DMIXTAPE_CUDA_RUNTIME=Shared build, LD_LIBRARY_PATH): not run\n");
    return 2;
  }
  using RefusedFn = long (*)(int device);
  const auto refused_on = reinterpret_cast<RefusedFn>(dlsym(RTLD_DEFAULT, "mixtape_null_cudart_refused"));
  long devices_seen = 0, unused = 0;
  while (devices_seen < 8 && stats(static_cast<int>(devices_seen), &unused, &unused, &unused)) ++devices_seen;
  const int devices = static_cast<int>(devices_seen);
  const std::vector<std::string> capability = given_capabilities(devices);
  // The default build's kernels (sm_80, sm_90, each with its PTX) run on 8.0 and newer.
  std::vector<bool> runs;
  for (const std::string& c : capability) runs.push_back(std::atof(c.c_str()) >= MIXTAPE_LOWEST_CUDA_ARCH / 100.0);
  bool any = false;
  for (const bool r : runs) any = any || r;

  std::string given;
  for (int d = 0; d < devices; ++d) given += (d ? ", cuda:" : "cuda:") + std::to_string(d) + " " + capability[d];
  std::printf("bench_null_capability: %d device%s (%s); the kernels need %.1f or newer\n", devices,
              devices == 1 ? "" : "s", given.c_str(), MIXTAPE_LOWEST_CUDA_ARCH / 100.0);

  expect(mt::cuda::device_count() == devices, "device_count() is " + std::to_string(mt::cuda::device_count()) +
                                                   ", the visible devices, those the kernels do not run on included");
  expect(mt::cuda::is_available() == any, std::string("is_available() is ") +
                                              (mt::cuda::is_available() ? "true" : "false"));
  const std::string reason = mt::cuda::unavailable_reason();
  if (any) {
    expect(reason.empty(), "unavailable_reason() is empty: '" + reason + "'");
  } else {
    bool names_all = contains(reason, "or newer");
    for (int d = 0; d < devices; ++d) {
      names_all = names_all && contains(reason, "cuda:" + std::to_string(d) + " (") &&
                  contains(reason, "compute capability " + capability[d]);
    }
    expect(names_all, "unavailable_reason() names every device, its capability and what is needed: " + reason);
  }

  for (int d = 0; d < devices; ++d) {
    const mt::Device dev = mt::Device::cuda(d);
    const std::string tag = "cuda:" + std::to_string(d) + " (" + capability[d] + ")";
    // Refusals name the device and its capability (when no device qualifies, the reason names them all).
    const std::vector<std::string> words{"cuda:" + std::to_string(d), capability[d], "or newer"};
    refused_unless(runs[d], tag + ": a tensor made there", words, [&] { (void)mt::zeros({4}, dev); });
    refused_unless(runs[d], tag + ": a tensor copied there", words, [&] { (void)mt::ones({4}).to(dev); });
    refused_unless(runs[d], tag + ": set_device", words, [&] { mt::cuda::set_device(d); });
    refused_unless(runs[d], tag + ": device_properties", words, [&] { (void)mt::cuda::device_properties(d); });
    refused_unless(runs[d], tag + ": a stream", words, [&] { (void)mt::cuda::Stream::create(d); });
    if (runs[d]) {
      long before = 0, after = 0;
      stats(d, &before, &unused, &unused);
      refused_unless(true, tag + ": softmax(a + b) and its gradient", {}, [&] {
        const mt::Tensor a = mt::randn({8, 16}).to(dev).requires_grad_(true);
        mt::sum(mt::softmax(a + mt::ones({8, 16}, dev), 1)).backward();
      });
      // Enough 128 x 256 tiles to fill every SM, which asks for the GEMM's large tile: its 136 KB of shared memory
      // fit an A100's or an H100's block, not an RTX card's 99 KB (8.6, 8.9, 12.0), where the small tile must run.
      for (const mt::DType t : {mt::kF16, mt::kBF16}) {
        refused_unless(true, tag + ": a matmul of 256 tiles in " + mt::dtype_name(t), {}, [&] {
          const mt::Tensor x = mt::zeros({2048, 256}, mt::TensorOptions(t).device(dev));
          const mt::Tensor w = mt::zeros({256, 4096}, mt::TensorOptions(t).device(dev));
          (void)mt::matmul(x, w);
        });
      }
      stats(d, &after, &unused, &unused);
      expect(after > before, tag + ": " + std::to_string(after - before) + " kernels launched there");
      const long refused = refused_on != nullptr ? refused_on(d) : -1;
      expect(refused == 0, tag + ": " + std::to_string(refused) + " launches refused by the device's limits (block "
                                 "and grid shapes, shared memory, clusters)");
    }
  }
  if (!any) {
    const std::vector<std::string> words{"CUDA is unavailable", "or newer"};
    refused_unless(false, "current_device", words, [] { (void)mt::cuda::current_device(); });
    refused_unless(false, "synchronize", words, [] { mt::cuda::synchronize(); });
    refused_unless(false, "a graph capture", words, [] {
      mt::cuda::Graph graph;
      graph.capture([] {});
    });
  }
  // The CPU is untouched by any of it.
  expect(mt::sum(mt::ones({3})).item<float>() == 3.0f, "the CPU computes as before");

  std::printf("bench_null_capability: %s (%d failed)\n", g_failures == 0 ? "every check held" : "FAILED",
              g_failures);
  return g_failures == 0 ? 0 : 1;
}
