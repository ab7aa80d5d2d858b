// cuda/runtime.cu — the CUDA device memory (allocation, copies, casts, fills) and the mixtape::cuda queries.
//
// The one design idea: every device-side copy, cast and fill is one small
// strided kernel over int64 indices (a dense fill is Thrust's fill_n). The host coalesces the operands' dims
// once (core/strided_loop.h, the same rule the CPU loops use) and passes
// sizes and byte strides by value; the kernel maps a linear index to byte
// offsets, so transposes, slices with steps and 0-stride broadcasts need no
// special cases, and dense operands take a typed fast path. Values go
// through `mixtape::convert`, the very function the CPU backend uses, so a
// cast gives the same bits on both backends.
//
// Everything is issued to the calling thread's current stream of the device
// (cuda/stream.h); memory comes from the caching allocator (cuda/allocator.cu).
// Copies from the host are staged through pinned buffers and return before the
// device has them; copies to the host wait for their own stream only (the
// caller reads the bytes when copy_bytes returns).
#include <mixtape/cuda/runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>

#include <mixtape/core/dtype.h>
#include <mixtape/core/error.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/device_memory.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/allocator.cuh>
#include <mixtape/cuda/capability.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/stream.cuh>

namespace mixtape {

namespace cuda {
namespace {

// ---- probing: is there a driver and a device? ------------------------------------------

constexpr int kBuiltArchs[] = {__CUDA_ARCH_LIST__};  // nvcc's list of what these kernels were compiled for

struct Probe {
  int count = 0;                    // visible devices; 0 when the runtime could not start
  cudaError_t error = cudaSuccess;  // why, when it could not
  int usable = 0;                   // visible devices mixtape's kernels run on (cuda/capability.h)
  std::vector<std::string> unusable;  // per visible device: "cuda:0 (Tesla T4) has compute capability 7.5", or empty
};

/// Asks the runtime once per process: the set of visible devices is fixed when the runtime starts, and every
/// Storage allocation asks (core's device_memory() checks the device index). The capabilities are device
/// attributes: reading them makes no context on any device.
const Probe& probe() noexcept {
  static const Probe p = [] {
    Probe r;
    r.error = cudaGetDeviceCount(&r.count);
    if (r.error != cudaSuccess) {
      r.count = 0;
      (void)cudaGetLastError();  // no driver / no device must not read as the failure of a later launch
    }
    r.unusable.resize(static_cast<size_t>(r.count));
    for (int d = 0; d < r.count; ++d) {
      int major = 0, minor = 0;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
        (void)cudaGetLastError();
        r.unusable[d] = "cuda:" + std::to_string(d) + " did not say its compute capability";
        continue;
      }
      if (detail::kernels_run_on(major, minor, kBuiltArchs)) {
        ++r.usable;
        continue;
      }
      cudaDeviceProp props{};
      const bool named = cudaGetDeviceProperties(&props, d) == cudaSuccess;
      if (!named) (void)cudaGetLastError();
      r.unusable[d] = detail::capability_of(d, named ? props.name : "a GPU", major, minor);
    }
    return r;
  }();
  return p;
}

void require_available(const char* op) {
  MT_CHECK(probe().usable > 0, op, ": CUDA is unavailable (", unavailable_reason(), ")");
}

/// Why mixtape's kernels cannot run on visible device `device`, or empty when they can.
std::string unusable_reason(int device) {
  const Probe& p = probe();
  if (device < 0 || device >= p.count || p.unusable[device].empty()) return {};
  return p.unusable[device] + "; " + detail::capability_needed(kBuiltArchs);
}

}  // namespace

void detail::require_device(int device, const char* op) {
  require_available(op);
  MT_CHECK(device >= 0 && device < probe().count, op, ": CUDA device index ", device, " is out of range (",
           probe().count, " device", probe().count == 1 ? "" : "s", " present)");
  MT_CHECK(probe().unusable[device].empty(), op, ": ", unusable_reason(device));
}

bool is_available() noexcept { return probe().usable > 0; }

int device_count() noexcept { return probe().count; }

std::string unavailable_reason() {
  const Probe& p = probe();
  if (p.usable > 0) return {};
  if (p.count > 0) {  // devices, none of which runs the kernels
    std::string devices;
    for (const std::string& u : p.unusable) devices += (devices.empty() ? "" : ", ") + u;
    return devices + "; " + detail::capability_needed(kBuiltArchs);
  }
  switch (p.error) {
    case cudaSuccess:
    case cudaErrorNoDevice:
      return "no CUDA device";
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return std::string("no usable CUDA driver: ") + cudaGetErrorString(p.error);
    default:
      return std::string("the CUDA runtime failed to start: ") + cudaGetErrorName(p.error) + ": " +
             cudaGetErrorString(p.error);
  }
}

DeviceProperties device_properties(int device) {
  detail::require_device(device, "cuda::device_properties");
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, device), "cuda::device_properties(", device, ")");
  DeviceProperties out;
  out.name = p.name;
  out.major = p.major;
  out.minor = p.minor;
  out.multiprocessor_count = p.multiProcessorCount;
  out.total_memory = p.totalGlobalMem;
  out.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
  out.l2_cache_bytes = static_cast<size_t>(p.l2CacheSize);
  return out;
}

void synchronize() {
  require_available("cuda::synchronize");
  int device = -1;
  MT_CUDA_CHECK(cudaGetDevice(&device), "cuda::synchronize: querying the current device");
  detail::refuse_in_capture("cuda::synchronize (a host wait)");
  detail::count_synchronization();
  MT_CUDA_CHECK(cudaDeviceSynchronize(), "cuda::synchronize on cuda:", device);
}

void set_device(int device) {
  detail::require_device(device, "cuda::set_device");
  MT_CUDA_CHECK(cudaSetDevice(device), "cuda::set_device(", device, ")");
  detail::guarded_device() = -1;  // a live guard's device is no longer current: let CUDA say
}

int current_device() {
  if (const int guarded = detail::guarded_device(); guarded >= 0) return guarded;
  require_available("cuda::current_device");
  int device = -1;
  MT_CUDA_CHECK(cudaGetDevice(&device), "cuda::current_device");
  return device;
}

namespace {

// ---- the strided elementwise kernels ------------------------------------------------------

using kernels::cuda::element_offsets;  // cuda/launch.cuh
using kernels::cuda::first_index;
using kernels::cuda::grid_blocks;
using kernels::cuda::grid_stride;
using kernels::cuda::offset_layout;
using kernels::cuda::OffsetLayout;
using kernels::cuda::Pack;

constexpr int kThreads = kernels::cuda::kBlockThreads;

/// A copy's or fill's layout: byte strides (cuda/launch.cuh), and whether every operand is dense and 1-D, for the
/// typed fast path.
template <int K>
struct KernelLayout : OffsetLayout<K> {
  bool contiguous;
};

template <int K>
KernelLayout<K> kernel_layout(const Shape& shape, const std::array<const Shape*, K>& strides,
                              const std::array<int64_t, K>& itemsizes) {
  const StridedLayout<K> S = make_strided_layout<K>(shape, strides, itemsizes);
  KernelLayout<K> L{offset_layout(S), S.ndim == 1};
  for (int k = 0; k < K; ++k) L.contiguous = L.contiguous && S.byte_strides[k][0] == itemsizes[k];
  return L;
}

/// Elements per 16-byte access of the wider of two types (llm.c's Packed128): 16 for u8 -> u8, 2 for f64.
template <class To, class From>
inline constexpr int kVecWidth = 16 / static_cast<int>(sizeof(To) > sizeof(From) ? sizeof(To) : sizeof(From));

/// dst = convert<To>(src) elementwise; overwrites dst. `vectorized` (host-checked: contiguous, both pointers
/// aligned to their packs) moves kVecWidth elements per thread and access, the tail one by one.
template <class To, class From>
__global__ void __launch_bounds__(kThreads) copy_kernel(char* dst,        // (shape) of To, byte strides L[0]
                                                        const char* src,  // (shape) of From, byte strides L[1]
                                                        KernelLayout<2> L, bool vectorized) {
  if (L.contiguous) {
    To* d = reinterpret_cast<To*>(dst);
    const From* s = reinterpret_cast<const From*>(src);
    int64_t done = 0;
    if (vectorized) {
      constexpr int V = kVecWidth<To, From>;
      using In = Pack<From, V>;
      using Out = Pack<To, V>;
      const int64_t packs = L.numel / V;
      for (int64_t i = first_index(); i < packs; i += grid_stride()) {
        const In in = reinterpret_cast<const In*>(src)[i];
        Out out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = convert<To>(in.v[k]);
        reinterpret_cast<Out*>(dst)[i] = out;
      }
      done = packs * V;
    }
    for (int64_t i = done + first_index(); i < L.numel; i += grid_stride()) d[i] = convert<To>(s[i]);
    return;
  }
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[2];
    element_offsets(L, i, off);
    *reinterpret_cast<To*>(dst + off[0]) = convert<To>(*reinterpret_cast<const From*>(src + off[1]));
  }
}

/// dst = value for every element; overwrites dst.
template <class T>
__global__ void __launch_bounds__(kThreads) fill_kernel(char* dst,  // (shape) of T, byte strides L[0]
                                                        T value, KernelLayout<1> L) {
  if (L.contiguous) {
    T* d = reinterpret_cast<T*>(dst);
    for (int64_t i = first_index(); i < L.numel; i += grid_stride()) d[i] = value;
    return;
  }
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    *reinterpret_cast<T*>(dst + off[0]) = value;
  }
}

/// dst = src converted to dst's dtype; both on the same CUDA device, same shape, any strides. Overwrites dst.
/// Runs on the current stream of the device.
void copy_cuda(const Tensor& dst, const Tensor& src) {
  MT_CHECK(dst.shape() == src.shape(), "cuda copy: shapes differ (dst ", dst.shape(), ", src ", src.shape(), ")");
  MT_CHECK(dst.is_cuda() && dst.device() == src.device(),
           "cuda copy: both tensors must be on the same CUDA device (dst on ", dst.device(), ", src on ",
           src.device(), ")");
  if (dst.numel() == 0) return;
  const KernelLayout<2> L =
      kernel_layout<2>(dst.shape(), {&dst.strides(), &src.strides()},
                       {static_cast<int64_t>(dst.itemsize()), static_cast<int64_t>(src.itemsize())});
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = launch_stream(device);
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  dispatch(dst.dtype(), [&](auto to) {
    dispatch(src.dtype(), [&](auto from) {
      using To = typename decltype(to)::type;
      using From = typename decltype(from)::type;
      constexpr int V = kVecWidth<To, From>;
      const bool vectorized = L.contiguous && reinterpret_cast<uintptr_t>(d) % (sizeof(To) * V) == 0 &&
                              reinterpret_cast<uintptr_t>(s) % (sizeof(From) * V) == 0;
      const int64_t work = vectorized ? (L.numel + V - 1) / V : L.numel;
      copy_kernel<To, From><<<grid_blocks(work), kThreads, 0, stream>>>(d, s, L, vectorized);
      MT_CUDA_CHECK_LAUNCH("copy_kernel (", src.dtype(), " -> ", dst.dtype(), ", shape ", dst.shape(), " on ",
                           dst.device(), ")");
    });
  });
}

/// Every element of dst = value converted (once, on the host, exactly as the CPU backend does) to dst's dtype.
void fill_cuda(const Tensor& dst, double value) {
  MT_CHECK(dst.is_cuda(), "cuda fill: the tensor is on ", dst.device(), ", not a CUDA device");
  if (dst.numel() == 0) return;
  const KernelLayout<1> L =
      kernel_layout<1>(dst.shape(), {&dst.strides()}, {static_cast<int64_t>(dst.itemsize())});
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = launch_stream(device);
  const int grid = grid_blocks(L.numel);
  char* d = static_cast<char*>(dst.data_ptr());
  dispatch(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (L.contiguous) {
      // A dense fill is Thrust's fill_n on our stream: its vectorised stores, no launch arithmetic of ours.
      // par_nosync: the stream is not synchronised afterwards (it orders the later work itself).
      thrust::fill_n(thrust::cuda::par_nosync.on(stream), reinterpret_cast<T*>(d), L.numel, convert<T>(value));
      MT_CUDA_CHECK_LAUNCH("thrust::fill_n (", dst.dtype(), ", ", L.numel, " elements on ", dst.device(), ")");
      return;
    }
    fill_kernel<T><<<grid, kThreads, 0, stream>>>(d, convert<T>(value), L);
    MT_CUDA_CHECK_LAUNCH("fill_kernel (", dst.dtype(), ", shape ", dst.shape(), " on ", dst.device(), ")");
  });
}

// ---- the backend ---------------------------------------------------------------------------

/// Host -> device through pinned staging buffers: each chunk is copied into a buffer on the host, then sent
/// asynchronously on `stream`; the caller's memory is free to change as soon as this returns.
void copy_host_to_device(char* dst, const char* src, size_t nbytes, cudaStream_t stream, int device) {
  for (size_t off = 0; off < nbytes; off += kStagingBytes) {
    const size_t len = std::min(kStagingBytes, nbytes - off);
    StagingLease buffer;
    std::memcpy(buffer.data(), src + off, len);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst + off, buffer.data(), len, cudaMemcpyHostToDevice, stream),
                  "cuda copy_bytes cpu -> cuda:", device, " (", len, " of ", nbytes, " bytes)");
    buffer.record(stream, device);
  }
}

/// Device -> host through pinned staging buffers, a few chunks in flight at a time; waits for `stream` up to the
/// copies (the one synchronisation a copy to the host cannot avoid), not for the rest of the device.
void copy_device_to_host(char* dst, const char* src, size_t nbytes, cudaStream_t stream, int device) {
  constexpr size_t kInFlight = 2;  // chunks queued before the first is read back
  for (size_t group = 0; group < nbytes; group += kInFlight * kStagingBytes) {
    const size_t end = std::min(nbytes, group + kInFlight * kStagingBytes);
    std::array<std::unique_ptr<StagingLease>, kInFlight> buffers;
    size_t k = 0;
    for (size_t off = group; off < end; off += kStagingBytes, ++k) {
      buffers[k] = std::make_unique<StagingLease>();
      MT_CUDA_CHECK(cudaMemcpyAsync(buffers[k]->data(), src + off, std::min(kStagingBytes, end - off),
                                    cudaMemcpyDeviceToHost, stream),
                    "cuda copy_bytes cuda:", device, " -> cpu (", nbytes, " bytes)");
      buffers[k]->record(stream, device);
    }
    k = 0;
    for (size_t off = group; off < end; off += kStagingBytes, ++k) {
      buffers[k]->wait();
      std::memcpy(dst + off, buffers[k]->data(), std::min(kStagingBytes, end - off));
    }
  }
}

/// cuda:a -> cuda:b on the source's current stream, ordered after the work queued on both current streams before
/// it and before the work queued on either after it; the host does not wait.
void copy_peer(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) {
  const Stream src_stream = current_stream(src_device), dst_stream = current_stream(dst_device);
  Event dst_ready;  // earlier kernels of the destination's stream may still read the memory being overwritten
  dst_ready.record(dst_stream);
  dst_ready.wait(src_stream);
  {
    DeviceGuard guard(src_device);
    MT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, cuda_stream(src_stream)),
                  "cuda copy_bytes cuda:", src_device, " -> cuda:", dst_device, " (", nbytes, " bytes)");
  }
  Event copied;
  copied.record(src_stream);
  copied.wait(dst_stream);
}

class CudaMemory final : public DeviceMemory {
 public:
  void* allocate(size_t nbytes, int device) override { return cached_allocate(nbytes, device); }

  void deallocate(void* ptr, size_t, int) noexcept override { cached_deallocate(ptr); }

  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) override {
    MT_CHECK(dst_device.is_cuda() || src_device.is_cuda(), "cuda copy_bytes: neither side (", src_device, " -> ",
             dst_device, ") is a CUDA device");
    if (!dst_device.is_cuda() || !src_device.is_cuda())
      detail::refuse_in_capture(!dst_device.is_cuda() ? "a copy from a CUDA device to the host (an item(), a .cpu())"
                                                      : "a copy from the host to a CUDA device");
    if (!dst_device.is_cuda()) detail::count_device_to_host_copy();
    if (nbytes == 0) return;
    if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
      copy_peer(dst, dst_device.index, src, src_device.index, nbytes);
      return;
    }
    const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
    DeviceGuard guard(device);
    const cudaStream_t stream = launch_stream(device);
    if (!src_device.is_cuda()) {
      copy_host_to_device(static_cast<char*>(dst), static_cast<const char*>(src), nbytes, stream, device);
    } else if (!dst_device.is_cuda()) {
      copy_device_to_host(static_cast<char*>(dst), static_cast<const char*>(src), nbytes, stream, device);
    } else {
      MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream), "cuda copy_bytes on cuda:",
                    device, " (", nbytes, " bytes)");
    }
  }

  void copy(const Tensor& dst, const Tensor& src) override { copy_cuda(dst, src); }

  void fill(const Tensor& dst, double value) override { fill_cuda(dst, value); }

  int device_count() const noexcept override { return probe().count; }
  std::string unusable_reason(int device) const override { return cuda::unusable_reason(device); }

  void synchronize(int device) override {
    detail::require_device(device, "cuda synchronize");
    DeviceGuard guard(device);
    detail::refuse_in_capture("a device synchronize (a host wait)");
    detail::count_synchronization();
    MT_CUDA_CHECK(cudaDeviceSynchronize(), "cuda synchronize on cuda:", device);
  }
};

}  // namespace

constexpr int kMaxDevices = 64;

namespace {
/// cudaDeviceGetAttribute(kAttr, device), queried once per device (0 is never a valid answer for the attributes
/// asked here, so it marks "not queried yet").
template <cudaDeviceAttr kAttr>
int cached_attribute(int device, const char* what) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    if (int v = cache[device].load(std::memory_order_relaxed)) return v;
  }
  int v = 0;
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&v, kAttr, device), "cuda: querying ", what, " of cuda:", device);
  if (cacheable) cache[device].store(v, std::memory_order_relaxed);
  return v;
}
}  // namespace

int multiprocessor_count(int device) {
  return cached_attribute<cudaDevAttrMultiProcessorCount>(device, "the multiprocessor count");
}

int compute_capability_major(int device) {
  return cached_attribute<cudaDevAttrComputeCapabilityMajor>(device, "the compute capability");
}

int shared_memory_per_block_optin(int device) {
  return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, "the shared memory a block may opt in to");
}

bool dynamic_shared_memory_fits(const void* kernel, size_t smem, int device) {
  struct Limits {
    size_t now;   // the kernel's dynamic shared-memory limit as it stands
    size_t most;  // what the device allows next to the kernel's static shared memory
  };
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, Limits> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({kernel, device});
  if (it == known.end()) {
    cudaFuncAttributes attr{};
    MT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel), "cuda: the attributes of a kernel on cuda:", device);
    const int most = shared_memory_per_block_optin(device) - static_cast<int>(attr.sharedSizeBytes);
    // Without an opt-in a block has 48 KiB of shared memory, static included, whatever the attribute reports.
    const int now = std::min(attr.maxDynamicSharedSizeBytes, 49152 - static_cast<int>(attr.sharedSizeBytes));
    const Limits limits{static_cast<size_t>(std::max(now, 0)), static_cast<size_t>(std::max(most, 0))};
    it = known.emplace(std::pair{kernel, device}, limits).first;
  }
  Limits& limits = it->second;
  if (smem <= limits.now) return true;
  if (smem > limits.most) return false;
  const int most = static_cast<int>(limits.most);
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most),
                "cuda: allowing a kernel ", most, " bytes of dynamic shared memory on cuda:", device);
  limits.now = limits.most;
  return true;
}

}  // namespace cuda

namespace cuda {
DeviceMemory& cuda_memory() {
  // Never destroyed: tensors released during static destruction, in any order, still find their memory.
  static CudaMemory& instance = *new CudaMemory;
  return instance;
}
}  // namespace cuda

}  // namespace mixtape
