// cuda/runtime.h — is there a GPU, which one, and waiting for it.
//
// The one public door to the CUDA runtime, and deliberately free of CUDA
// headers: every build has these functions, so code (tests, examples, user
// programs) asks `is_available()` instead of #ifdef-ing on how mixtape was
// built. In a build without CUDA they report "unavailable" and the functions
// that need a device throw mixtape::Error saying why.
//
//   if (mixtape::cuda::is_available()) {
//     auto p = mixtape::cuda::device_properties();
//     std::cout << p.name << " sm_" << p.major << p.minor << "\n";
//   } else {
//     std::cout << "CPU only: " << mixtape::cuda::unavailable_reason() << "\n";
//   }
#pragma once

#include <cstddef>
#include <string>

namespace mixtape::cuda {

/// True when mixtape was built with CUDA, a driver is loaded and at least one device is visible. Never throws.
bool is_available() noexcept;

/// Number of visible CUDA devices; 0 without CUDA, without a driver or without a device. Never throws.
int device_count() noexcept;

/// Why `is_available()` is false, e.g. "mixtape was built without CUDA", "no usable CUDA driver: ...",
/// "no CUDA device"; empty when CUDA is available. Never throws.
std::string unavailable_reason();

/// What kernels and their launchers tune for.
struct DeviceProperties {
  std::string name;                        // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;                // compute capability: 8.0 on A100, 9.0 on H100
  int multiprocessor_count = 0;
  size_t total_memory = 0;                 // bytes of global memory
  size_t shared_memory_per_block_optin = 0;  // bytes a block may use after opting in
  size_t l2_cache_bytes = 0;
};

/// Properties of CUDA device `device`; throws mixtape::Error when CUDA is unavailable or the index is out of range.
/// @code
///   auto p = mixtape::cuda::device_properties(0);
///   bool tensor_cores_bf16 = p.major >= 8;
/// @endcode
DeviceProperties device_properties(int device = 0);

/// Waits until every kernel and copy issued to the current device has finished;
/// throws mixtape::Error naming the CUDA error when one of them failed.
void synchronize();

/// Makes `device` the calling thread's current CUDA device; throws when out of range or unavailable.
void set_device(int device);

/// The calling thread's current CUDA device; throws when CUDA is unavailable.
int current_device();

}  // namespace mixtape::cuda
