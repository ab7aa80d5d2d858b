// cuda/allocator.cu — the caching device allocator, and the pool of pinned staging buffers for host copies.
//
// The one design idea (PyTorch's CUDACachingAllocator, without block
// splitting): cudaMalloc and cudaFree synchronise and cost tens of
// microseconds, so a freed block is kept and handed to the next request of
// its size class. Requests round up to 512 bytes up to 1 MiB and to 2 MiB
// above, so the few shapes of a training loop map onto a few classes and the
// steps after the first allocate nothing from CUDA.
//
// Reuse follows stream order. A block belongs to the stream that was current
// when it was allocated; kernels that use it after its tensor died are still
// queued on that stream, so a request on the same stream may take it at once.
// A request on another stream may take it only after an event recorded at the
// free has completed. Events are recorded only once a device has seen a
// second stream: a program on one stream pays nothing for them.
//
// Out of memory: wait for the device, cudaFree the whole cache, try once more,
// then throw with the request and the statistics (during a graph capture,
// which cannot wait, it throws at once). One mutex guards it all.
//
// CUDA graphs (cuda/graph.h) get pools of their own: a block handed out
// during a capture is baked into the graph, so it never returns to the cache
// while the graph lives (allocator.cuh's GraphPool).
#include <mixtape/cuda/allocator.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>
#include <mixtape/cuda/testing.h>

namespace mixtape::cuda {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // requests up to this round to kSmallRound
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

/// The size class of a request: what is reserved for it and what allocated_bytes counts.
size_t size_class(size_t nbytes) {
  nbytes = std::max<size_t>(nbytes, 1);
  const size_t round = nbytes <= kSmallLimit ? kSmallRound : kLargeRound;
  if (nbytes > std::numeric_limits<size_t>::max() - round) return 0;  // unrepresentable: reported as out of memory
  return (nbytes + round - 1) / round * round;
}

/// Whether the work before `e` finished; a failed query reads as "not yet" (a sticky error surfaces elsewhere).
bool completed(cudaEvent_t e) noexcept {
  const cudaError_t status = cudaEventQuery(e);
  if (status != cudaSuccess) (void)cudaGetLastError();  // cudaErrorNotReady is not an error here
  return status == cudaSuccess;
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;  // its size class
  int device = 0;
  cudaStream_t stream = nullptr;  // the stream current at allocation: the one its last users were queued on
  cudaEvent_t freed = nullptr;    // recorded on `stream` at the free, once the device uses several streams
  GraphPool* graph = nullptr;     // the graph whose capture allocated it, while that graph lives
  size_t requested = 0;           // what the tensor holding it asked for (≤ size)
};

}  // namespace

struct GraphPool {
  int device = 0;
  cudaStream_t stream = nullptr;          // the capturing stream
  bool released = false;                  // the graph is gone
  std::multimap<size_t, Block*> free;     // its blocks no tensor holds, reserved for the replays
  std::vector<Block*> kept;               // blocks from the cache freed during the capture: the replays may read them
  int64_t held = 0;                       // its blocks tensors hold
};

namespace {

struct DevicePool {
  std::multimap<size_t, Block*> cached;  // free blocks by size
  std::vector<cudaEvent_t> spare_events;
  MemoryStats stats;
  cudaStream_t first_stream = nullptr;
  bool seen_a_stream = false;
  bool several_streams = false;  // some allocation happened on a stream other than first_stream
};

class Allocator {
 public:
  void* allocate(size_t nbytes, int device) {
    const size_t size = size_class(nbytes);
    const cudaStream_t stream = launch_stream(device);
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      DevicePool& pool = pool_of(device);
      GraphPool* graph = capture_of(device, stream);
      if (!graph) note_stream(pool, stream, device);
      Block* b = !size ? nullptr : graph ? take_fitting(graph->free, size) : take_cached(pool, size, stream);
      if (b) {
        ++pool.stats.num_cache_hits;  // CUDA asked nothing (an event query at most), so no device was selected
      } else {
        DeviceGuard guard(device);  // cudaMalloc allocates on the current device
        b = new Block{malloc_or_throw(pool, nbytes, size, device, graph != nullptr), size, device, stream, nullptr};
        ++pool.stats.num_cuda_malloc;
        pool.stats.reserved_bytes += static_cast<int64_t>(size);
        pool.stats.peak_reserved_bytes = std::max(pool.stats.peak_reserved_bytes, pool.stats.reserved_bytes);
      }
      b->stream = stream;
      b->graph = graph;
      if (graph) ++graph->held;
      b->requested = nbytes;
      pool.stats.allocated_bytes += static_cast<int64_t>(b->size);
      pool.stats.peak_allocated_bytes = std::max(pool.stats.peak_allocated_bytes, pool.stats.allocated_bytes);
      pool.stats.requested_bytes += static_cast<int64_t>(nbytes);
      pool.stats.peak_requested_bytes = std::max(pool.stats.peak_requested_bytes, pool.stats.requested_bytes);
      m_live.emplace(b->ptr, b);
      ptr = b->ptr;
    }
    if (m_poison.load(std::memory_order_relaxed)) {
      DeviceGuard guard(device);  // `stream` may be cudaStreamLegacy: the current device's
      const cudaError_t status = cudaMemsetAsync(ptr, 0xFF, size, stream);
      if (status != cudaSuccess) deallocate(ptr);
      MT_CUDA_CHECK(status, "cuda allocator: poisoning ", size, " bytes on cuda:", device);
    }
    return ptr;
  }

  void deallocate(void* ptr) noexcept {
    std::lock_guard<std::mutex> lock(m_mutex);
    const auto it = m_live.find(ptr);
    if (it == m_live.end()) return;  // not ours: nothing sane to do in a noexcept path
    Block* b = it->second;
    m_live.erase(it);
    DevicePool& pool = m_pools[static_cast<size_t>(b->device)];
    pool.stats.allocated_bytes -= static_cast<int64_t>(b->size);
    pool.stats.requested_bytes -= static_cast<int64_t>(b->requested);
    b->requested = 0;
    GraphPool* capture = capture_for_free(b->device);
    if (GraphPool* g = b->graph) {
      if (capture && capture != g) {  // another graph's block, used by this capture too: kept for both
        capture->kept.push_back(b);   // (its owner's count stays: the capture's release settles it)
        return;
      }
      --g->held;
      if (!g->released) {  // baked into a live graph: reserved for its replays
        g->free.emplace(b->size, b);
        return;
      }
      b->graph = nullptr;  // the graph is gone: an ordinary block of the stream the graph last ran on
      if (g->held == 0) delete g;
    }
    if (capture) {  // the capture's kernels may use it at every replay
      capture->kept.push_back(b);
      return;
    }
    cache_freed(pool, b);
  }

  GraphPool* begin_capture(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    pool_of(device);
    auto* g = new GraphPool;
    g->device = device;
    g->stream = stream;
    m_captures.push_back(g);
    return g;
  }

  void end_capture(GraphPool* g) noexcept {
    std::lock_guard<std::mutex> lock(m_mutex);
    std::erase(m_captures, g);
  }

  void release(GraphPool* g, cudaStream_t stream) noexcept {
    std::lock_guard<std::mutex> lock(m_mutex);
    g->released = true;
    std::erase(m_captures, g);
    DevicePool& pool = m_pools[static_cast<size_t>(g->device)];
    with_device_nothrow(g->device, [&] { release_on_its_device(pool, g, stream); });
    if (g->held == 0) delete g;
  }

  /// release() with g's device current.
  void release_on_its_device(DevicePool& pool, GraphPool* g, cudaStream_t stream) noexcept {
    note_stream(pool, stream, g->device);
    for (auto& [size, b] : g->free) {  // its own blocks: the replays were their last users
      b->graph = nullptr;
      b->stream = stream;
      cache_freed_here(pool, b);
    }
    for (Block* b : g->kept) {  // blocks its replays read: their owner, a live graph, takes them back, or the cache
      if (GraphPool* owner = b->graph) {
        --owner->held;
        if (!owner->released) {
          owner->free.emplace(b->size, b);
          continue;
        }
        // Its owner's release did not see it (it was this graph's then): its stream may be the owner's capture
        // stream, which died with the owner. This graph's replays, on `stream`, were its last users.
        b->graph = nullptr;
        b->stream = stream;
        if (owner->held == 0) delete owner;
      }
      cache_freed_here(pool, b);  // on its own stream: the replays are done, eager users may not be
    }
    g->free.clear();
    g->kept.clear();
    for (auto& [ptr, b] : m_live)  // held blocks: ordinary blocks of `stream` when freed
      if (b->graph == g) b->stream = stream;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(m_mutex);
    for (size_t d = 0; d < m_pools.size(); ++d) {
      if (m_pools[d].cached.empty() && m_pools[d].spare_events.empty()) continue;
      DeviceGuard guard(static_cast<int>(d));
      release_cache(m_pools[d], static_cast<int>(d));
    }
  }

  MemoryStats stats(int device) {
    std::lock_guard<std::mutex> lock(m_mutex);
    return device >= 0 && static_cast<size_t>(device) < m_pools.size() ? m_pools[static_cast<size_t>(device)].stats
                                                                        : MemoryStats{};
  }

  void reset_peak(int device) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (device < 0 || static_cast<size_t>(device) >= m_pools.size()) return;
    MemoryStats& s = m_pools[static_cast<size_t>(device)].stats;
    s.peak_allocated_bytes = s.allocated_bytes;
    s.peak_requested_bytes = s.requested_bytes;
    s.peak_reserved_bytes = s.reserved_bytes;
  }

  void set_poison(bool on) { m_poison.store(on, std::memory_order_relaxed); }

 private:
  /// Puts a freed block into the cache (or frees it where no event can order its reuse), on its device.
  void cache_freed(DevicePool& pool, Block* b) noexcept {
    if (pool.several_streams) with_device_nothrow(b->device, [&] { cache_freed_here(pool, b); });
    else cache_freed_here(pool, b);  // no event to record: CUDA is asked nothing, so no device is selected
  }

  /// cache_freed with b's device current.
  void cache_freed_here(DevicePool& pool, Block* b) noexcept {
    if (pool.several_streams && !record_free(pool, b)) {
      // No event, so no safe cross-stream reuse: give it back (cudaFree waits for the work that may use it).
      (void)cudaFree(b->ptr);
      pool.stats.reserved_bytes -= static_cast<int64_t>(b->size);
      delete b;
    } else {
      pool.cached.emplace(b->size, b);
    }
  }

  /// The graph capture that takes allocations on `stream` of `device`: the calling thread's, when it runs there.
  GraphPool* capture_of(int device, cudaStream_t stream) const noexcept {
    const detail::Capture& c = detail::thread_capture();
    if (c.stream != stream || c.device != device) return nullptr;
    for (GraphPool* g : m_captures)
      if (g->device == device && g->stream == stream) return g;
    return nullptr;
  }

  /// The graph capture that keeps a block of `device` freed now: the calling thread's, when it captures on that
  /// device, else any running there (another thread's kernels may be baked into it).
  GraphPool* capture_for_free(int device) const noexcept {
    const detail::Capture& c = detail::thread_capture();
    GraphPool* any = nullptr;
    for (GraphPool* g : m_captures) {
      if (g->device != device) continue;
      if (g->stream == c.stream) return g;
      if (!any) any = g;
    }
    return any;
  }

  /// A block of `blocks` for a request of `size` (a graph's free blocks: one stream, no events): the size class's
  /// smallest, or for large requests one up to a quarter larger.
  static Block* take_fitting(std::multimap<size_t, Block*>& blocks, size_t size) {
    const size_t limit = size <= kSmallLimit ? size : size + size / 4;
    const auto it = blocks.lower_bound(size);
    if (it == blocks.end() || it->first > limit) return nullptr;
    Block* b = it->second;
    blocks.erase(it);
    return b;
  }

  DevicePool& pool_of(int device) {
    if (static_cast<size_t>(device) >= m_pools.size()) m_pools.resize(static_cast<size_t>(device) + 1);
    return m_pools[static_cast<size_t>(device)];
  }

  /// The first time a device sees a second stream, the blocks already cached get their free events (recorded
  /// now, after the work that freed them: later than needed, never too early).
  void note_stream(DevicePool& pool, cudaStream_t stream, int device) {
    if (!pool.seen_a_stream) {
      pool.seen_a_stream = true;
      pool.first_stream = stream;
      return;
    }
    if (pool.several_streams || stream == pool.first_stream) return;
    pool.several_streams = true;
    // The events go on the blocks' streams, which may be the device's cudaStreamLegacy: the device made current.
    with_device_nothrow(device, [&] {
      for (auto it = pool.cached.begin(); it != pool.cached.end();) {
        if (record_free(pool, it->second)) {
          ++it;
        } else {
          (void)cudaFree(it->second->ptr);
          pool.stats.reserved_bytes -= static_cast<int64_t>(it->second->size);
          delete it->second;
          it = pool.cached.erase(it);
        }
      }
    });
  }

  /// Records `b`'s free event on its stream (current device: b's). False when CUDA refused.
  bool record_free(DevicePool& pool, Block* b) noexcept {
    if (!b->freed) {
      if (!pool.spare_events.empty()) {
        b->freed = pool.spare_events.back();
        pool.spare_events.pop_back();
      } else if (cudaEventCreateWithFlags(&b->freed, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        b->freed = nullptr;
        return false;
      }
    }
    if (cudaEventRecord(b->freed, b->stream) != cudaSuccess) {
      (void)cudaGetLastError();
      pool.spare_events.push_back(b->freed);
      b->freed = nullptr;
      return false;
    }
    return true;
  }

  /// A cached block for a request of `size` on `stream`: the smallest one of the size class, or for large
  /// requests up to a quarter larger (no splitting, so a bigger block is wasted space). Same-stream blocks
  /// first; another stream's only when its free event completed.
  Block* take_cached(DevicePool& pool, size_t size, cudaStream_t stream) {
    const size_t limit = size <= kSmallLimit ? size : size + size / 4;
    auto chosen = pool.cached.end();
    for (auto it = pool.cached.lower_bound(size); it != pool.cached.end() && it->first <= limit; ++it) {
      Block* b = it->second;
      if (b->stream == stream) {
        chosen = it;
        break;
      }
      if (chosen == pool.cached.end() && b->freed && completed(b->freed)) chosen = it;
    }
    if (chosen == pool.cached.end()) return nullptr;
    Block* b = chosen->second;
    pool.cached.erase(chosen);
    if (b->freed) {
      pool.spare_events.push_back(b->freed);
      b->freed = nullptr;
    }
    return b;
  }

  /// Waits for the device (current: `device`) and cudaFrees every cached block and spare event.
  void release_cache(DevicePool& pool, int device) {
    detail::count_synchronization();
    MT_CUDA_CHECK(cudaDeviceSynchronize(), "cuda allocator: waiting for cuda:", device, " before freeing its cache");
    for (auto& [size, b] : pool.cached) {
      if (b->freed) pool.spare_events.push_back(b->freed);
      (void)cudaFree(b->ptr);  // errors dropped: the block is gone from the cache either way
      pool.stats.reserved_bytes -= static_cast<int64_t>(size);
      delete b;
    }
    pool.cached.clear();
    for (cudaEvent_t e : pool.spare_events) (void)cudaEventDestroy(e);
    pool.spare_events.clear();
    (void)cudaGetLastError();
  }

  /// cudaMalloc of `size` bytes; on failure frees the cache and tries once more (not during a graph capture: that
  /// waits for the device), then throws.
  void* malloc_or_throw(DevicePool& pool, size_t nbytes, size_t size, int device, bool capturing) {
    void* p = nullptr;
    cudaError_t status = cudaErrorMemoryAllocation;
    if (size && capturing) {
      // cudaMalloc is not a stream operation, so a capture's strict modes reject it; the graph's pool keeps the
      // block for the replays, which is what makes it safe here.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      status = cudaMalloc(&p, size);
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
    } else if (size) {
      status = cudaMalloc(&p, size);
    }
    if (status == cudaErrorMemoryAllocation && size && !capturing) {
      (void)cudaGetLastError();
      release_cache(pool, device);
      status = cudaMalloc(&p, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      const MemoryStats& s = pool.stats;
      MT_ERROR("cuda allocator: out of memory allocating ", nbytes, " bytes (size class ", size, ") on cuda:", device,
               " (", s.allocated_bytes, " bytes allocated, ", s.reserved_bytes, " reserved after freeing the cache, ",
               "peak ", s.peak_allocated_bytes, "; the device has ", free_bytes, " free of ", total_bytes, " bytes)");
    }
    MT_CUDA_CHECK(status, "cuda allocator: cudaMalloc of ", size, " bytes on cuda:", device);
    return p;
  }

  std::mutex m_mutex;
  std::vector<DevicePool> m_pools;            // by device index
  std::unordered_map<void*, Block*> m_live;   // allocated blocks by address
  std::vector<GraphPool*> m_captures;         // the graph captures running, any thread
  std::atomic<bool> m_poison{false};
};

/// Never destroyed: tensors released during static destruction still find it.
Allocator& allocator() {
  static Allocator& instance = *new Allocator;
  return instance;
}

// ---- pinned staging buffers -------------------------------------------------------------------

/// A few buffers (kStagingSoftCap of kStagingBytes) serve all host copies; more are made only while every
/// existing one is leased by a concurrent copy.
constexpr size_t kStagingSoftCap = 4;

class StagingPool {
 public:
  StagingBuffer* acquire() {
    StagingBuffer* wait_for = nullptr;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      for (size_t i = 0; i < m_free.size(); ++i) {
        StagingBuffer* b = m_free[i];
        if (!b->in_use || completed(b->in_use)) return take(i);
      }
      if (m_free.empty() || m_count < kStagingSoftCap) {
        ++m_count;
        return fresh();
      }
      wait_for = take(0);  // the oldest free one
    }
    detail::count_synchronization();
    MT_CUDA_CHECK(cudaEventSynchronize(wait_for->in_use), "cuda copy: waiting for a pinned staging buffer");
    return wait_for;
  }

  void release(StagingBuffer* b) noexcept {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_free.push_back(b);
  }

 private:
  StagingBuffer* take(size_t i) {
    StagingBuffer* b = m_free[i];
    m_free.erase(m_free.begin() + static_cast<std::ptrdiff_t>(i));
    return b;
  }

  StagingBuffer* fresh() {
    auto* b = new StagingBuffer;
    const cudaError_t status = cudaHostAlloc(&b->ptr, kStagingBytes, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      delete b;
      --m_count;
      MT_CUDA_CHECK(status, "cuda copy: cudaHostAlloc of a ", kStagingBytes, "-byte pinned staging buffer");
    }
    return b;
  }

  std::mutex m_mutex;
  std::vector<StagingBuffer*> m_free;  // oldest first
  size_t m_count = 0;                  // buffers made (free or leased)
};

StagingPool& staging_pool() {
  static StagingPool& instance = *new StagingPool;
  return instance;
}

}  // namespace

void* cached_allocate(size_t nbytes, int device) { return allocator().allocate(nbytes, device); }

void cached_deallocate(void* ptr) noexcept { allocator().deallocate(ptr); }

GraphPool* begin_graph_capture(int device, cudaStream_t stream) { return allocator().begin_capture(device, stream); }

void end_graph_capture(GraphPool* pool) noexcept { allocator().end_capture(pool); }

void release_graph_pool(GraphPool* pool, cudaStream_t stream) noexcept { allocator().release(pool, stream); }

StagingLease::StagingLease() : m_buffer(staging_pool().acquire()) {}

StagingLease::~StagingLease() { staging_pool().release(m_buffer); }

void StagingLease::record(cudaStream_t stream, int device) {
  if (m_buffer->in_use && m_buffer->event_device != device) {  // events record streams of their own device only
    (void)cudaEventDestroy(m_buffer->in_use);
    m_buffer->in_use = nullptr;
  }
  if (!m_buffer->in_use) {
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&m_buffer->in_use, cudaEventDisableTiming),
                  "cuda copy: creating a staging event on cuda:", device);
    m_buffer->event_device = device;
  }
  MT_CUDA_CHECK(cudaEventRecord(m_buffer->in_use, stream), "cuda copy: recording a staging event on cuda:", device);
}

void StagingLease::wait() {
  if (!m_buffer->in_use) return;
  detail::count_synchronization();
  MT_CUDA_CHECK(cudaEventSynchronize(m_buffer->in_use), "cuda copy: waiting for a device-to-host copy");
}

// ---- the public statistics and controls ---------------------------------------------------------

namespace {
/// `device`, or the current one for -1; -1 when there is none to ask about.
int stats_device(int device) noexcept {
  if (device >= 0) return device;
  if (!is_available()) return -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}
}  // namespace

MemoryStats memory_stats(int device) noexcept {
  device = stats_device(device);
  return device < 0 ? MemoryStats{} : allocator().stats(device);
}

void reset_peak_memory_stats(int device) noexcept {
  device = stats_device(device);
  if (device >= 0) allocator().reset_peak(device);
}

void empty_cache() {
  detail::refuse_in_capture("cuda::empty_cache (it waits for the device)");
  allocator().empty_cache();
}

void set_poison_allocations(bool on) noexcept { allocator().set_poison(on); }

}  // namespace mixtape::cuda
