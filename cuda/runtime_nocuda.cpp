// cuda/runtime_nocuda.cpp — the mixtape::cuda queries in a build without CUDA.
//
// Such a build registers no CUDA backend at all (core's device_memory()
// refuses CUDA devices), so these are its real answers, not stand-ins: nothing is
// available, and asking for a device is an error that says how to get one.
#if !MIXTAPE_WITH_CUDA

#include <mixtape/cuda/graph.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.h>
#include <mixtape/cuda/testing.h>

#include <atomic>
#include <utility>

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

// ---- TF32, clusters, conv columns: settings with nothing to apply to, kept so that code setting them runs everywhere

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_allow_clusters{true};
std::atomic<int64_t> g_conv_column_limit{kConvColumnLimitAuto};
}  // namespace

void set_allow_tf32(bool allow) noexcept { g_allow_tf32.store(allow, std::memory_order_relaxed); }

bool allow_tf32() noexcept { return g_allow_tf32.load(std::memory_order_relaxed); }

void set_allow_clusters(bool allow) noexcept { g_allow_clusters.store(allow, std::memory_order_relaxed); }

bool allow_clusters() noexcept { return g_allow_clusters.load(std::memory_order_relaxed); }

void set_conv_column_limit(int64_t bytes) {
  MT_CHECK(bytes >= 0 || bytes == kConvColumnLimitAuto,
           "cuda::set_conv_column_limit: bytes must be >= 0 (0: no limit) or kConvColumnLimitAuto (-1), got ", bytes);
  g_conv_column_limit.store(bytes, std::memory_order_relaxed);
}

int64_t conv_column_limit() noexcept { return g_conv_column_limit.load(std::memory_order_relaxed); }

// ---- the allocator and the debug counters: nothing was ever allocated or copied ----------------

MemoryStats memory_stats(int) noexcept { return {}; }

void reset_peak_memory_stats(int) noexcept {}

void empty_cache() {}

void set_poison_allocations(bool) noexcept {}

DebugCounters debug_counters() noexcept { return {}; }

void reset_debug_counters() noexcept {}

// ---- streams and events: none can exist --------------------------------------------------------

Stream Stream::create(int device) { MT_ERROR("cuda::Stream::create(", device, "): ", kNoCuda, " (", kHowTo, ")"); }

Stream Stream::legacy_default(int device) {
  MT_ERROR("cuda::Stream::legacy_default(", device, "): ", kNoCuda, " (", kHowTo, ")");
}

Stream Stream::borrow(void*, int device) {
  MT_ERROR("cuda::Stream::borrow(", device, "): ", kNoCuda, " (", kHowTo, ")");
}

bool Stream::query() const { MT_ERROR("cuda::Stream::query: ", kNoCuda, " (", kHowTo, ")"); }

void Stream::synchronize() const { MT_ERROR("cuda::Stream::synchronize: ", kNoCuda, " (", kHowTo, ")"); }

Stream current_stream(int device) { MT_ERROR("cuda::current_stream(", device, "): ", kNoCuda, " (", kHowTo, ")"); }

void set_current_stream(const Stream&) { MT_ERROR("cuda::set_current_stream: ", kNoCuda, " (", kHowTo, ")"); }

StreamGuard::StreamGuard(const Stream&) { MT_ERROR("cuda::StreamGuard: ", kNoCuda, " (", kHowTo, ")"); }

StreamGuard::~StreamGuard() = default;

// An Event can never be recorded here: the waits have nothing to wait for.
Event::~Event() = default;
Event::Event(Event&& other) noexcept
    : m_event(std::exchange(other.m_event, nullptr)), m_device(other.m_device), m_timing(other.m_timing) {}
Event& Event::operator=(Event&& other) noexcept {
  m_event = std::exchange(other.m_event, nullptr);
  m_device = other.m_device;
  m_timing = other.m_timing;
  return *this;
}
void Event::record() { MT_ERROR("cuda::Event::record: ", kNoCuda, " (", kHowTo, ")"); }
void Event::record(const Stream&) { MT_ERROR("cuda::Event::record: ", kNoCuda, " (", kHowTo, ")"); }
void Event::wait(const Stream&) const {}
bool Event::query() const { return true; }
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&) const { MT_ERROR("cuda::Event::elapsed_ms: ", kNoCuda, " (", kHowTo, ")"); }

// ---- graphs: none can be captured ----------------------------------------------------------------

struct Graph::Impl {};
Graph::Graph() noexcept = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::capture(const std::function<void()>&) { MT_ERROR("cuda::Graph::capture: ", kNoCuda, " (", kHowTo, ")"); }
void Graph::replay() { MT_ERROR("cuda::Graph::replay: nothing was captured (", kNoCuda, ")"); }
bool Graph::captured() const noexcept { return false; }
size_t Graph::node_count() const { return 0; }

}  // namespace mixtape::cuda

#endif  // !MIXTAPE_WITH_CUDA
