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

/// The memory of one CUDA graph (cuda/graph.cu). While its capture runs, every allocation the capturing thread
/// makes on the capturing stream comes from the graph's pool, and a block of the pool returns to it when freed:
/// its addresses are baked into the graph, so they stay reserved for the replays (PyTorch's private graph pools).
/// A block allocated before the capture and freed during it is kept out of the cache too (the replays may still
/// read it); so is another graph's block freed during it, until both graphs are gone. Released with the graph: its
/// blocks go back to the cache, those tensors still hold when freed.
struct GraphPool;
/// Starts routing the calling thread's allocations on `stream` of `device` into a new pool.
GraphPool* begin_graph_capture(int device, cudaStream_t stream);
/// Stops the routing; the pool keeps its blocks.
void end_graph_capture(GraphPool* pool) noexcept;
/// The graph is gone and the device has finished its replays: its blocks go back to the cache, ordered on `stream`
/// (the stream the graph last ran on).
void release_graph_pool(GraphPool* pool, cudaStream_t stream) noexcept;

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
