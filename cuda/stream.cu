// cuda/stream.cu — streams, events, the per-thread current stream and the runtime's debug counters.
//
// The current stream is a thread_local table indexed by device, holding the
// legacy default stream until a thread sets another: reading it on every
// launch costs a table lookup and no CUDA call.
#include <mixtape/cuda/stream.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <mixtape/core/error.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::cuda {
namespace {

std::atomic<int64_t> g_device_to_host_copies{0};
std::atomic<int64_t> g_synchronizations{0};
std::atomic<int64_t> g_cluster_launches{0};
std::atomic<bool> g_allow_clusters{true};
std::atomic<int64_t> g_conv_column_limit{kConvColumnLimitAuto};

/// `device`, or the current device for -1, checked against the visible devices and the ones the kernels run on.
int resolve_device(int device, const char* op) {
  MT_CHECK(is_available(), op, ": CUDA is unavailable (", unavailable_reason(), ")");
  if (device < 0) device = detail::guarded_device();
  if (device < 0) MT_CUDA_CHECK(cudaGetDevice(&device), op, ": querying the current device");
  detail::require_device(device, op);
  return device;
}

/// The calling thread's current stream per device, set on first use of a device (only then: the devices below it
/// may be ones the kernels do not run on, which have no stream to give).
std::vector<std::optional<Stream>>& current_streams() {
  thread_local std::vector<std::optional<Stream>> streams;
  return streams;
}

}  // namespace

namespace detail {
int& guarded_device() noexcept {
  thread_local int device = -1;
  return device;
}

void count_synchronization() noexcept { g_synchronizations.fetch_add(1, std::memory_order_relaxed); }
void count_device_to_host_copy() noexcept { g_device_to_host_copies.fetch_add(1, std::memory_order_relaxed); }
void count_cluster_launch() noexcept { g_cluster_launches.fetch_add(1, std::memory_order_relaxed); }

Capture& thread_capture() noexcept {
  thread_local Capture capture;
  return capture;
}

void refuse_in_capture(const char* what) {
  const Capture& c = thread_capture();
  MT_CHECK(c.stream == nullptr, "cuda::Graph::capture on cuda:", c.device, ": ", what,
           " inside a capture (a graph replays kernels and device copies only: this would happen once, now, and "
           "never at a replay; do it outside the captured code)");
}
}  // namespace detail

DebugCounters debug_counters() noexcept {
  return {g_device_to_host_copies.load(std::memory_order_relaxed), g_synchronizations.load(std::memory_order_relaxed),
          g_cluster_launches.load(std::memory_order_relaxed)};
}

void reset_debug_counters() noexcept {
  g_device_to_host_copies.store(0, std::memory_order_relaxed);
  g_synchronizations.store(0, std::memory_order_relaxed);
  g_cluster_launches.store(0, std::memory_order_relaxed);
}

void set_allow_clusters(bool allow) noexcept { g_allow_clusters.store(allow, std::memory_order_relaxed); }
bool allow_clusters() noexcept { return g_allow_clusters.load(std::memory_order_relaxed); }

void set_conv_column_limit(int64_t bytes) {
  MT_CHECK(bytes >= 0 || bytes == kConvColumnLimitAuto,
           "cuda::set_conv_column_limit: bytes must be >= 0 (0: no limit) or kConvColumnLimitAuto (-1), got ", bytes);
  g_conv_column_limit.store(bytes, std::memory_order_relaxed);
}
int64_t conv_column_limit() noexcept { return g_conv_column_limit.load(std::memory_order_relaxed); }

// ---- Stream ------------------------------------------------------------------------------------

namespace {

/// Stream::create's streams of one device: made together on its first request, handed out in turn, never destroyed
/// (they go with the CUDA context at exit). A handle outlives every Stream naming it, so the allocator may record a
/// freed block's event on the stream it was last used on, and a graph wait for its last replay's, whatever the
/// program kept. 32 as PyTorch's pool: more streams than that run no more kernels at once on one device.
constexpr int kPoolStreams = 32;
struct StreamPool {
  std::once_flag made;
  std::array<cudaStream_t, kPoolStreams> streams{};
  std::atomic<uint32_t> next{0};
};

StreamPool& stream_pool(int device) {
  static std::vector<std::unique_ptr<StreamPool>> pools = [] {
    std::vector<std::unique_ptr<StreamPool>> p(static_cast<size_t>(device_count()));
    for (auto& one : p) one = std::make_unique<StreamPool>();
    return p;
  }();
  return *pools[static_cast<size_t>(device)];
}

}  // namespace

Stream Stream::create(int device) {
  device = resolve_device(device, "cuda::Stream::create");
  StreamPool& pool = stream_pool(device);
  std::call_once(pool.made, [&] {  // a throw leaves the flag unset: the next request tries again
    DeviceGuard guard(device);
    for (int i = 0; i < kPoolStreams; ++i) {
      const cudaError_t status = cudaStreamCreateWithFlags(&pool.streams[static_cast<size_t>(i)], cudaStreamNonBlocking);
      if (status != cudaSuccess) {
        for (int j = 0; j < i; ++j) (void)cudaStreamDestroy(pool.streams[static_cast<size_t>(j)]);
        MT_CUDA_CHECK(status, "cuda::Stream::create on cuda:", device, ": making the device's ", kPoolStreams,
                      " streams");
      }
    }
  });
  const uint32_t i = pool.next.fetch_add(1, std::memory_order_relaxed) % kPoolStreams;
  return Stream(static_cast<void*>(pool.streams[i]), device, nullptr);
}

Stream detail::owned_stream(int device) {
  device = resolve_device(device, "cuda::Graph::capture: making the capture's stream");
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cuda::Graph::capture: making a stream on cuda:",
                device);
  // The deleter runs when the last copy goes; errors are dropped (it may run at exit, after the runtime unloaded).
  std::shared_ptr<void> owner(static_cast<void*>(s), [](void* p) {
    if (cudaStreamDestroy(static_cast<cudaStream_t>(p)) != cudaSuccess) (void)cudaGetLastError();
  });
  return Stream(static_cast<void*>(s), device, std::move(owner));
}

Stream Stream::legacy_default(int device) {
  return Stream(nullptr, resolve_device(device, "cuda::Stream::legacy_default"), nullptr);
}

Stream Stream::borrow(void* handle, int device) {
  return Stream(handle == static_cast<void*>(cudaStreamLegacy) ? nullptr : handle,
                resolve_device(device, "cuda::Stream::borrow"), nullptr);
}

bool Stream::query() const {
  detail::refuse_in_capture("cuda::Stream::query (the host reading the device's progress)");
  DeviceGuard guard(m_device);
  const cudaError_t status = cudaStreamQuery(cuda_stream(*this));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(status, "cuda::Stream::query on cuda:", m_device);
  return true;
}

void Stream::synchronize() const {
  detail::refuse_in_capture("cuda::Stream::synchronize (a host wait)");
  DeviceGuard guard(m_device);
  detail::count_synchronization();
  MT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(*this)), "cuda::Stream::synchronize on cuda:", m_device);
}

Stream current_stream(int device) {
  device = resolve_device(device, "cuda::current_stream");
  std::vector<std::optional<Stream>>& streams = current_streams();
  if (static_cast<size_t>(device) >= streams.size()) streams.resize(static_cast<size_t>(device) + 1);
  std::optional<Stream>& stream = streams[static_cast<size_t>(device)];
  if (!stream) stream = Stream::legacy_default(device);
  return *stream;
}

void set_current_stream(const Stream& stream) {
  (void)current_stream(stream.device());  // grows the table, checks the device
  const detail::Capture& c = detail::thread_capture();
  MT_CHECK(c.stream == nullptr || stream.device() != c.device || cuda_stream(stream) == c.stream,
           "cuda::Graph::capture on cuda:", c.device, ": a switch to another stream inside the capture (the graph "
           "records the capture's stream; work sent to another would run once, now, beside it)");
  current_streams()[static_cast<size_t>(stream.device())] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : m_previous(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() { current_streams()[static_cast<size_t>(m_previous.device())] = m_previous; }

// ---- Event -------------------------------------------------------------------------------------

namespace {
void destroy_event(void* event) noexcept {
  if (event && cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) (void)cudaGetLastError();
}
}  // namespace

Event::~Event() { destroy_event(m_event); }

Event::Event(Event&& other) noexcept
    : m_event(std::exchange(other.m_event, nullptr)), m_device(other.m_device), m_timing(other.m_timing) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    destroy_event(m_event);
    m_event = std::exchange(other.m_event, nullptr);
    m_device = other.m_device;
    m_timing = other.m_timing;
  }
  return *this;
}

void Event::record() { record(current_stream()); }

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (m_event && m_device != stream.device()) {  // an event records only streams of the device it was made on
    destroy_event(m_event);
    m_event = nullptr;
  }
  if (!m_event) {
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, m_timing ? cudaEventDefault : cudaEventDisableTiming),
                  "cuda::Event: creating an event on cuda:", stream.device());
    m_event = e;
    m_device = stream.device();
  }
  MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(m_event), cuda_stream(stream)),
                "cuda::Event::record on cuda:", stream.device());
}

void Event::wait(const Stream& stream) const {
  if (!m_event) return;
  DeviceGuard guard(stream.device());
  MT_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(stream), static_cast<cudaEvent_t>(m_event), 0),
                "cuda::Event::wait: a stream of cuda:", stream.device(), " waiting on an event of cuda:", m_device);
}

bool Event::query() const {
  detail::refuse_in_capture("cuda::Event::query (the host reading the device's progress)");
  if (!m_event) return true;
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(m_event));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(status, "cuda::Event::query on cuda:", m_device);
  return true;
}

void Event::synchronize() const {
  if (!m_event) return;
  detail::refuse_in_capture("cuda::Event::synchronize (a host wait)");
  detail::count_synchronization();
  MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(m_event)), "cuda::Event::synchronize on cuda:",
                m_device);
}

float Event::elapsed_ms(const Event& end) const {
  MT_CHECK(m_event && end.m_event, "cuda::Event::elapsed_ms: both events must have been recorded");
  MT_CHECK(m_timing && end.m_timing, "cuda::Event::elapsed_ms: both events must be created with timing = true");
  float ms = 0.0f;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(m_event), static_cast<cudaEvent_t>(end.m_event)),
                "cuda::Event::elapsed_ms");
  return ms;
}

}  // namespace mixtape::cuda
