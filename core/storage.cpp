// core/storage.cpp — Storage, the CPU's memory, and the memory of the other devices.
#include <mixtape/core/storage.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>

#include <sys/mman.h>

#include <mixtape/core/convert.h>
#include <mixtape/core/device_memory.h>
#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/tensor.h>

namespace mixtape {

namespace {

std::atomic<int64_t> g_cpu_allocated{0};
std::atomic<int64_t> g_cpu_peak{0};
std::atomic<int64_t> g_cpu_storages{0};

constexpr size_t kCpuAlignment = 64;  // a cache line; also what AVX-512 loads like
constexpr size_t kHugePage = size_t{2} << 20;

/// Copies `src` into `dst` element by element, converting types; same shape, any strides.
template <class To, class From>
void convert_copy(const Tensor& dst, const Tensor& src) {
  auto L = make_strided_layout<2>(dst.shape(), {&dst.strides(), &src.strides()},
                                  {static_cast<int64_t>(sizeof(To)), static_cast<int64_t>(sizeof(From))});
  std::array<char*, 2> base{static_cast<char*>(dst.data_ptr()), static_cast<char*>(src.data_ptr())};
  auto run = [](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
    char* d = p[0];
    const char* q = p[1];
    if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
      To* dt = reinterpret_cast<To*>(d);
      const From* st = reinterpret_cast<const From*>(q);
      if constexpr (std::is_same_v<From, bool> && (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>)) {
        // A mask (dropout's) to f16/bf16: 1's bits times the mask, branch-free and vector code; convert<Half>(true)
        // rounds from double in software, an element at a time (7 ms for the MNIST CNN's 1.2M-element mask).
        const uint16_t one = convert<To>(true).bits;
        for (int64_t i = 0; i < n; ++i)
          dt[i] = To::from_bits(static_cast<uint16_t>(one * static_cast<uint16_t>(st[i])));
        return;
      }
      convert_run(st, dt, n);  // f16/bf16 <-> float in the CPU's vector loops (core/convert.h)
    } else {
      for (int64_t i = 0; i < n; ++i, d += s[0], q += s[1])
        *reinterpret_cast<To*>(d) = convert<To>(*reinterpret_cast<const From*>(q));
    }
  };
  const int64_t numel = L.numel;
  constexpr int64_t kGrain = 1 << 16;
  if (numel < 2 * kGrain) {
    for_each_run<2>(L, base, 0, numel, run);
    return;
  }
  const int64_t chunks = (numel + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    for_each_run<2>(L, base, c * kGrain, std::min(numel, (c + 1) * kGrain), run);
}

/// Freed large blocks, kept for the next request of the same size. A training step asks for the same activation
/// and gradient sizes every step; handing back memory whose pages are already mapped saves the page faults and the
/// kernel's zeroing of fresh pages (measured on a 2-core VM: 3.4 ms per MiB, 16% of a CNN training step). Blocks
/// below kHugePage stay with malloc, which reuses them without faults; the cache holds at most kMaxCachedBytes.
class BlockCache {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  /// A cached block of exactly `rounded` bytes, or nullptr.
  void* take(size_t rounded) {
    std::lock_guard lock(m_mutex);
    auto it = m_free.find(rounded);
    if (it == m_free.end()) return nullptr;
    void* p = it->second;
    m_free.erase(it);
    m_bytes -= rounded;
    return p;
  }
  /// Keeps `p` for reuse, or returns false when the cache is full (the caller frees it).
  bool put(void* p, size_t rounded) {
    std::lock_guard lock(m_mutex);
    if (m_bytes + rounded > kMaxCachedBytes) return false;
    m_free.emplace(rounded, p);
    m_bytes += rounded;
    return true;
  }
  void release_all() {
    std::lock_guard lock(m_mutex);
    for (auto& [size, p] : m_free) std::free(p);
    m_free.clear();
    m_bytes = 0;
  }
  int64_t bytes() const {
    std::lock_guard lock(m_mutex);
    return static_cast<int64_t>(m_bytes);
  }

 private:
  mutable std::mutex m_mutex;
  std::multimap<size_t, void*> m_free;  // rounded size -> block
  size_t m_bytes = 0;
};

class CpuMemory final : public DeviceMemory {
 public:
  void* allocate(size_t nbytes, int) override {
    // Large blocks go on 2 MiB boundaries and ask for transparent huge pages:
    // first-touch page faults otherwise cost more than the kernels writing them.
    const size_t align = nbytes >= kHugePage ? kHugePage : kCpuAlignment;
    size_t rounded = (nbytes + align - 1) / align * align;
    void* p = align == kHugePage ? cache.take(rounded) : nullptr;
    for (int attempt = 0; p == nullptr && attempt < 2; ++attempt) {
      if (attempt == 1) cache.release_all();  // out of memory: give the cached blocks back and try once more
      p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
      if (p && align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
    }
    MT_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes (",
             g_cpu_allocated.load(), " bytes already allocated)");
    int64_t now = g_cpu_allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = g_cpu_peak.load();
    while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
    }
    ++g_cpu_storages;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, int) noexcept override {
    if (nbytes < kHugePage || !cache.put(ptr, (nbytes + kHugePage - 1) / kHugePage * kHugePage)) std::free(ptr);
    g_cpu_allocated.fetch_sub(static_cast<int64_t>(nbytes));
    --g_cpu_storages;
  }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    dispatch(dst.dtype(), [&](auto to) {
      dispatch(src.dtype(), [&](auto from) {
        convert_copy<typename decltype(to)::type, typename decltype(from)::type>(dst, src);
      });
    });
  }
  void fill(const Tensor& dst, double value) override {
    // A one-element f64 source broadcast over dst: the cast rules of copy apply.
    Tensor v = empty(Shape{}, TensorOptions(DType::kF64));
    *v.data<double>() = value;
    copy(dst, raw::expand(v, dst.shape()));
  }
  int device_count() const noexcept override { return 1; }
  std::string unusable_reason(int) const override { return {}; }
  void synchronize(int) override {}

  BlockCache cache;
};

/// The memory of each non-CPU device type, installed when its backend registers (before main: static
/// initialisation of the library). Constant-initialised, so no registration can come too early.
constinit std::atomic<DeviceMemory*> g_device_memory[2] = {};

CpuMemory& the_cpu_memory() {
  // Never destroyed: storages released during static destruction, in any order, still find it.
  static CpuMemory& cpu = *new CpuMemory;
  return cpu;
}

}  // namespace

DeviceMemory& cpu_memory() { return the_cpu_memory(); }

void install_device_memory(DeviceType type, DeviceMemory& memory) noexcept {
  if (type != DeviceType::kCPU) g_device_memory[static_cast<int>(type)].store(&memory);
}

DeviceMemory& device_memory(Device device) {
  if (device.is_cpu()) return cpu_memory();
  DeviceMemory* memory = g_device_memory[static_cast<int>(device.type)].load();
  MT_CHECK(memory != nullptr, "device ", device,
           ": mixtape was built without CUDA (configure with -DMIXTAPE_CUDA=ON on a machine with nvcc)");
  const int count = memory->device_count();
  MT_CHECK(count > 0, "device ", device, ": no CUDA device is available (no driver or no GPU)");
  MT_CHECK(device.index >= 0 && device.index < count, "device ", device, ": CUDA device index out of range (",
           count, " device", count == 1 ? "" : "s", " present)");
  const std::string why = memory->unusable_reason(device.index);  // names the device and its capability
  MT_CHECK(why.empty(), why);
  return *memory;
}

CpuMemoryStats cpu_memory_stats() {
  return {g_cpu_allocated.load(), g_cpu_peak.load(), g_cpu_storages.load(), the_cpu_memory().cache.bytes()};
}
void cpu_empty_cache() { the_cpu_memory().cache.release_all(); }
void reset_cpu_peak_memory() { g_cpu_peak.store(g_cpu_allocated.load()); }

Storage::Storage(size_t nbytes, Device device) : m_nbytes(nbytes), m_device(device) {
  m_memory = &device_memory(device);
  m_data = m_memory->allocate(nbytes, device.index);
}

Storage::~Storage() { m_memory->deallocate(m_data, m_nbytes, m_device.index); }

}  // namespace mixtape
