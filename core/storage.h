// core/storage.h — reference-counted memory of one device, and the backend
// interface that allocates, copies and fills it.
//
// Core knows that devices other than the CPU exist, not how they work: the
// CUDA layer implements DeviceBackend and core finds it through
// `cuda_backend()`, a symbol the CUDA layer defines when it is built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <mixtape/core/device.h>

namespace mixtape {

class Tensor;

/// What a device must provide for core to hold tensors on it.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// Returns `nbytes` of memory on `device` (never nullptr; throws mixtape::Error when out of memory).
  virtual void* allocate(size_t nbytes, int device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, int device) noexcept = 0;
  /// Copies raw bytes; one of the two devices is this backend's, the other is it or the CPU.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) = 0;
  /// dst = src elementwise, converting dtype, both on this backend's device, any strides, same shape.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  /// Sets every element of `dst` (any strides) to `value` converted to its dtype.
  virtual void fill(const Tensor& dst, double value) = 0;
  virtual int device_count() const noexcept = 0;
  virtual void synchronize(int device) = 0;
};

/// The backend holding tensors of `device`; throws when mixtape was built
/// without that device type or the device index does not exist.
DeviceBackend& backend(Device device);

/// Bytes of tensor storage currently allocated on the CPU, and its peak
/// since the last reset (a test's view of what the tape keeps alive).
struct CpuMemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t live_storages = 0;
};
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();

/// A block of device memory shared by every tensor viewing it.
class Storage {
 public:
  /// Allocates `nbytes` on `device` through its backend.
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return m_data; }
  size_t nbytes() const { return m_nbytes; }
  Device device() const { return m_device; }

  /// Bumped by every in-place write; saved-for-backward tensors compare it.
  uint64_t version() const { return m_version; }
  void bump_version() { ++m_version; }

 private:
  void* m_data = nullptr;
  size_t m_nbytes = 0;
  Device m_device;
  DeviceBackend* m_backend = nullptr;
  uint64_t m_version = 0;
};

}  // namespace mixtape
