// core/storage.h — reference-counted memory of one device, shared by every tensor viewing it.
//
// A Storage allocates through its device's DeviceMemory (core/device_memory.h):
// core's own for the CPU, the one a device backend installed for the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <mixtape/core/device.h>

namespace mixtape {

class DeviceMemory;

/// Bytes of tensor storage currently allocated on the CPU, and its peak
/// since the last reset (a test's view of what the tape keeps alive).
struct CpuMemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t live_storages = 0;
  int64_t cached_bytes = 0;  // freed blocks of 2 MiB and more, kept for reuse (at most 1 GiB); not allocated_bytes
};
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();
/// Returns the cached blocks to the system (as torch.cuda.empty_cache does for a GPU).
void cpu_empty_cache();

/// A block of device memory shared by every tensor viewing it.
class Storage {
 public:
  /// Allocates `nbytes` on `device` through its DeviceMemory.
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
  DeviceMemory* m_memory = nullptr;
  uint64_t m_version = 0;
};

}  // namespace mixtape
