// ops/device_kernels.cpp — the one place that maps a device to its kernel table.
#include <mixtape/ops/device_kernels.h>

#include <utility>

namespace mixtape::kernels {

const DeviceKernels& kernels_of(Device device, const char* op) {
  if (device.is_cpu()) return cpu_kernels();
#if MIXTAPE_WITH_CUDA
  (void)op;  // a missing CUDA kernel is reported by kernel_for, entry by entry
  return cuda_kernels();
#else
  MT_ERROR(op, ": got a tensor on ", device, " but mixtape was built without CUDA");
#endif
}

namespace {
thread_local const char* t_noted_kernel = nullptr;
}  // namespace

void note_kernel(const char* name) noexcept { t_noted_kernel = name; }

const char* take_noted_kernel() noexcept { return std::exchange(t_noted_kernel, nullptr); }

}  // namespace mixtape::kernels
