// core/device_memory.h — what core needs of a device to hold tensors on it: memory and copies (internal).
//
// Core knows that devices other than the CPU exist, not how they work. Each
// device's backend (ops/backend/kernels.h's Backend, which cuda/ fills) brings
// a DeviceMemory; registering the backend installs it here, so core never
// names the CUDA layer. The CPU's memory is core's own.
#pragma once

#include <cstddef>
#include <string>

#include <mixtape/core/device.h>

namespace mixtape {

class Tensor;

/// Allocation and copies on one device type.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// Returns `nbytes` of memory on `device` (never nullptr; throws mixtape::Error when out of memory).
  virtual void* allocate(size_t nbytes, int device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, int device) noexcept = 0;
  /// Copies raw bytes; one of the two devices is this memory's, the other is it or the CPU.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) = 0;
  /// dst = src elementwise, converting dtype, both on this memory's device, any strides, same shape.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  /// Sets every element of `dst` (any strides) to `value` converted to its dtype.
  virtual void fill(const Tensor& dst, double value) = 0;
  virtual int device_count() const noexcept = 0;
  /// Why tensors cannot live on `device`, an index below device_count(), or empty when they can (a GPU of a compute
  /// capability mixtape's kernels were not built for cannot hold them: every op on them would fail).
  virtual std::string unusable_reason(int device) const = 0;
  virtual void synchronize(int device) = 0;
};

/// The CPU's memory (core/storage.cpp).
DeviceMemory& cpu_memory();

/// Installs the memory of devices of `type` (ops' register_backend does it for a device's backend). The CPU's
/// cannot be replaced.
void install_device_memory(DeviceType type, DeviceMemory& memory) noexcept;

/// The memory of `device`; throws mixtape::Error when mixtape was built without its device type, or the index
/// names no device.
DeviceMemory& device_memory(Device device);

}  // namespace mixtape
