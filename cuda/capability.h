// cuda/capability.h — which GPUs mixtape's kernels run on (host code only, no CUDA: the CPU tests check the rule).
//
// nvcc compiles every kernel for the architectures CMake lists (CMAKE_CUDA_ARCHITECTURES, "80 90" unless the user
// sets it), and a plain number there embeds, for each, the machine code (SASS) and the PTX it was made from. Machine
// code for sm_XY runs on devices of major capability X and minor at least Y; the driver compiles PTX for any device
// of a capability at least the PTX's. So a device runs the kernels when its capability is at least the lowest
// architecture built: 8.0 and newer for the default build (A100, the RTX 30 and 40 series, L4, H100, and later GPUs
// through the PTX), not a T4 or a V100 (7.5, 7.0), where every launch would fail with "no kernel image". Knowing
// it before the first launch lets `cuda::is_available()` say no on such a machine and say why, so that
// `--device auto` trains on the CPU and the gpu tests report themselves skipped. (A build of "-real" architectures
// alone, without PTX, runs on fewer GPUs than this rule admits; there the first launch's error names the op.)
#pragma once

#include <algorithm>
#include <span>
#include <string>

namespace mixtape::cuda::detail {

/// Whether kernels built for `archs` (nvcc's __CUDA_ARCH_LIST__ values: 800 for sm_80), each with its machine code
/// and its PTX, run on a device of compute capability major.minor.
constexpr bool kernels_run_on(int major, int minor, std::span<const int> archs) {
  return !archs.empty() && major * 100 + minor * 10 >= *std::min_element(archs.begin(), archs.end());
}

/// "sm_80, sm_90".
inline std::string arch_names(std::span<const int> archs) {
  std::string out;
  for (const int a : archs) out += (out.empty() ? "sm_" : ", sm_") + std::to_string(a / 10);
  return out;
}

/// What a device of too low a capability is told, e.g. "cuda:0 (Tesla T4) has compute capability 7.5".
inline std::string capability_of(int device, const std::string& name, int major, int minor) {
  return "cuda:" + std::to_string(device) + " (" + name + ") has compute capability " + std::to_string(major) + "." +
         std::to_string(minor);
}

/// "mixtape's CUDA kernels need compute capability 8.0 or newer (this build has sm_80, sm_90)".
inline std::string capability_needed(std::span<const int> archs) {
  if (archs.empty()) return "this build of mixtape has no CUDA kernels";
  const int lowest = *std::min_element(archs.begin(), archs.end());
  return "mixtape's CUDA kernels need compute capability " + std::to_string(lowest / 100) + "." +
         std::to_string(lowest / 10 % 10) + " or newer (this build has " + arch_names(archs) + ")";
}

}  // namespace mixtape::cuda::detail
