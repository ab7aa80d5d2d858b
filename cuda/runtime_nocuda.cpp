// cuda/runtime_nocuda.cpp — the mixtape::cuda queries in a build without CUDA.
//
// Such a build has no CUDA backend at all (core's backend() refuses CUDA
// devices), so these are its real answers, not stand-ins: nothing is
// available, and asking for a device is an error that says how to get one.
#if !MIXTAPE_WITH_CUDA

#include <mixtape/cuda/runtime.h>

#include <mixtape/core/error.h>

namespace mixtape::cuda {

namespace {
constexpr const char* kNoCuda = "mixtape was built without CUDA";
constexpr const char* kHowTo = "reconfigure with -DMIXTAPE_CUDA=ON on a machine with nvcc";
}  // namespace

bool is_available() noexcept { return false; }

int device_count() noexcept { return 0; }

std::string unavailable_reason() { return kNoCuda; }

DeviceProperties device_properties(int device) {
  MT_ERROR("cuda::device_properties(", device, "): ", kNoCuda, " (", kHowTo, ")");
}

void synchronize() { MT_ERROR("cuda::synchronize: ", kNoCuda, " (", kHowTo, ")"); }

void set_device(int device) { MT_ERROR("cuda::set_device(", device, "): ", kNoCuda, " (", kHowTo, ")"); }

int current_device() { MT_ERROR("cuda::current_device: ", kNoCuda, " (", kHowTo, ")"); }

}  // namespace mixtape::cuda

#endif  // !MIXTAPE_WITH_CUDA
