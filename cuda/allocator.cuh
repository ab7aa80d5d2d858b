// cuda/allocator.cuh — the caching device allocator and the pinned staging buffers (internal: .cu files only).
//
// CudaBackend::allocate/deallocate go through here; cuda/runtime.h has the public statistics and controls.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace mixtape::cuda {

/// At least `nbytes` of memory on `device`, ordered on the calling thread's current stream of `device` (the
/// block's stream); never nullptr, unique even for 0 bytes. Throws mixtape::Error when out of memory.
void* cached_allocate(size_t nbytes, int device);

/// Returns a block of cached_allocate to the cache; work already issued to the block's stream may still use it.
void cached_deallocate(void* ptr) noexcept;

/// A pinned (page-locked, portable) host buffer of kStagingBytes for asynchronous copies.
struct StagingBuffer {
  void* ptr = nullptr;
  cudaEvent_t in_use = nullptr;  // recorded after the last copy touching the buffer; reusable once complete
  int event_device = -1;         // the device `in_use` was created on
};
inline constexpr size_t kStagingBytes = size_t{4} << 20;

/// Borrows a staging buffer for one chunk of a copy and gives it back at the end of the scope. Waits (counted as
/// a synchronization) only when every buffer of the pool is still in flight.
class StagingLease {
 public:
  StagingLease();
  ~StagingLease();
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;

  void* data() const noexcept { return m_buffer->ptr; }
  /// Marks the end of the copies issued so far to `stream` (of the current device `device`) as the buffer's last
  /// use: the next lease of this buffer waits for it.
  void record(cudaStream_t stream, int device);
  /// Blocks the host until the recorded copies finished (counted as a synchronization).
  void wait();

 private:
  StagingBuffer* m_buffer;
};

}  // namespace mixtape::cuda
