// bench/null_cudart.cpp — a CUDA runtime that runs nothing: every call returns at once and succeeds, device memory
// is host memory, kernels are launched nowhere. Loaded in place of libcudart.so, it leaves a CUDA program's host side
// running as it would beside a GPU, minus CUDA's own cost: what is left is the program's host code alone (mixtape's
// dispatch, tape, allocator and launch preparation), which a machine without a GPU can then time and profile.
//
// The sixth GPU run (bench/RESULTS.md) found the eager AMP MLP step host-bound at ~5.7 µs a launch; bench_gpu_launch
// and bench_mnist_gpu run under this runtime say how much of that is mixtape's own. Values computed "on the device"
// are garbage (nothing runs), so only timings and call counts mean anything; a host read gets whatever the memory
// holds. With MIXTAPE_NULL_CUDART_REPORT set, the process prints at exit how often each runtime function was called
// and each kernel launched, by name (two runs of different step counts give the calls and launches of a step).
//
//   cmake -S . -B build-null -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA_RUNTIME=Shared
//   cmake --build build-null --target bench_gpu_launch bench_mnist_gpu null_cudart
//   LD_LIBRARY_PATH=build-null/bench/null_cudart build-null/bench/bench_gpu_launch
//
// (A default build links CUDA's runtime statically into libmixtape.so, where no other library can stand in for it:
// hence the Shared build.) It implements the runtime functions mixtape, Thrust/CUB's calls in it and nvcc's launch
// stubs use, and reports itself as one H100 (sm_90, 132 SMs) unless told otherwise; a program calling another
// function fails to load with an undefined symbol, which says what to add here.
//
// MIXTAPE_NULL_CUDART_DEVICES=N makes it N such devices (at most 8), with a current device per thread as CUDA's:
// streams and events belong to the device current at their creation, and a launch, memset or event record on
// another device's stream is counted as a mismatch (CUDA refuses those), which is how bench/null_devices.cpp checks
// on a machine without GPUs that mixtape launches on a tensor's device and gives the caller back its own.
// `mixtape_null_cudart_device_stats` (extern "C", found with dlsym) reads what happened on each device.
// MIXTAPE_NULL_CUDART_CAPABILITY="7.5" (or "7.5,9.0", one a device) gives the devices another compute capability
// than the H100's 9.0, with the limits of one product of it (kModels: an A100 for 8.0, an RTX 3090 for 8.6, an
// RTX 4090 for 8.9, a B200 for 10.0, an RTX 5090 for 12.0; SMs, shared memory a block may opt in to, threads and
// blocks a multiprocessor, clusters only from 9.0). Every launch is then checked as CUDA checks it before it runs:
// the block's and the grid's shape, the dynamic shared memory against the kernel's limit (48 KiB until
// cudaFuncSetAttribute raises it, never past the device's opt-in), clusters where the device has them. A refusal
// is said on stderr, counted (`mixtape_null_cudart_refused`), returned and left for cudaGetLastError as CUDA's
// launch errors are. That is how a machine without a GPU checks that mixtape launches nothing a GPU it was never
// run on (an RTX 4090's 99 KiB of shared memory a block, an A100 without clusters) would refuse, and how
// bench/null_capability.cpp checks what it does on GPUs its kernels were not built for (a T4, a V100).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

/// How often one runtime function was called.
struct Calls {
  explicit Calls(const char* name);
  const char* name;
  std::atomic<long> count{0};
};

// The registry and every Calls are never destroyed: the report runs at exit, after function-local statics made
// later than it are gone.
std::mutex g_registry_mutex;
std::vector<const Calls*>& registry() {
  static auto* calls = new std::vector<const Calls*>;
  return *calls;
}

Calls::Calls(const char* n) : name(n) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  registry().push_back(this);
}

const bool g_reporting = std::getenv("MIXTAPE_NULL_CUDART_REPORT") != nullptr;

// ---- devices: how many, the calling thread's current one, what ran on each -------------------------------------

constexpr int kMaxNullDevices = 8;
const int g_devices = [] {
  const char* v = std::getenv("MIXTAPE_NULL_CUDART_DEVICES");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return n < 1 ? 1 : n > kMaxNullDevices ? kMaxNullDevices : n;
}();
thread_local int t_device = 0;

/// Each device's compute capability (major * 10 + minor): MIXTAPE_NULL_CUDART_CAPABILITY="7.5,9.0" gives device 0
/// 7.5 and device 1 9.0, the last one given standing for the devices after it; 9.0 (an H100) when unset.
struct Capabilities {
  int of[kMaxNullDevices];
  Capabilities() {
    const char* v = std::getenv("MIXTAPE_NULL_CUDART_CAPABILITY");
    int last = 90;
    for (int d = 0; d < kMaxNullDevices; ++d) {
      int major = 0, minor = 0, used = 0;
      if (v != nullptr && *v != '\0' && std::sscanf(v, "%d.%d%n", &major, &minor, &used) == 2) {
        last = major * 10 + minor;
        v += used;
        if (*v == ',') ++v;
      }
      of[d] = last;
    }
  }
};
const Capabilities g_capabilities;

/// What one product of each compute capability reports and allows (CUDA's published limits): a device is modelled on
/// the entry of the highest capability not above its own.
struct DeviceModel {
  int capability;  // major * 10 + minor
  const char* product;
  int multiprocessors;
  int smem_optin;   // bytes of shared memory a block may opt in to
  int smem_per_sm;  // bytes of shared memory a multiprocessor has
  int threads_per_sm;
  int blocks_per_sm;
  int l2_bytes;
  int memory_gib;
  bool clusters;  // thread-block clusters: sm_90 and newer
};
constexpr DeviceModel kModels[] = {
    {70, "V100", 80, 96 << 10, 96 << 10, 2048, 32, 6 << 20, 16, false},
    {75, "T4", 40, 64 << 10, 64 << 10, 1024, 16, 4 << 20, 16, false},
    {80, "A100", 108, 163 << 10, 164 << 10, 2048, 32, 40 << 20, 80, false},
    {86, "RTX 3090", 82, 99 << 10, 100 << 10, 1536, 16, 6 << 20, 24, false},
    {89, "RTX 4090", 128, 99 << 10, 100 << 10, 1536, 24, 72 << 20, 24, false},
    {90, "H100", 132, 227 << 10, 228 << 10, 2048, 32, 50 << 20, 80, true},
    {100, "B200", 148, 227 << 10, 228 << 10, 2048, 32, 126 << 20, 180, true},
    {120, "RTX 5090", 170, 99 << 10, 100 << 10, 1536, 32, 96 << 20, 32, true},
};
const DeviceModel& model_of(int device) {
  const DeviceModel* m = &kModels[0];
  for (const DeviceModel& candidate : kModels)
    if (candidate.capability <= g_capabilities.of[device]) m = &candidate;
  return *m;
}

struct DeviceStats {
  std::atomic<long> launches{0};    // kernels launched while the device was current
  std::atomic<long> mallocs{0};     // cudaMalloc calls while it was current
  std::atomic<long> mismatches{0};  // work sent, while it was current, to a stream or event of another device
  std::atomic<long> refused{0};     // launches and kernel attributes the device's limits refuse (check_launch)
};
DeviceStats g_device_stats[kMaxNullDevices];

/// Streams, events and graphs are heap ints holding the device current at their creation.
int handle_device(const void* h) { return *static_cast<const int*>(h); }
/// The device a stream's work runs on: the current device's for the default streams.
int stream_device(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread ? t_device : handle_device(s);
}
/// Counts work on stream s while t_device is current; a stream of another device is a mismatch.
void note_work(cudaStream_t s, bool launch) {
  DeviceStats& d = g_device_stats[t_device];
  if (launch) d.launches.fetch_add(1, std::memory_order_relaxed);
  if (stream_device(s) != t_device) d.mismatches.fetch_add(1, std::memory_order_relaxed);
}

/// Kernels by their host stub (what a launch names): the device name nvcc registered, and launches when reporting.
struct Kernel {
  std::string name;
  long launches = 0;
};
std::mutex g_kernels_mutex;
std::map<const void*, Kernel>& kernels() {
  static auto* k = new std::map<const void*, Kernel>;
  return *k;
}
void count_launch(const void* stub) {
  if (!g_reporting) return;
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  ++kernels()[stub].launches;
}

std::string demangled(const std::string& name);

/// The error a refused launch leaves for the next cudaGetLastError, as CUDA's launches do.
thread_local cudaError_t t_last_error = cudaSuccess;

/// Each kernel's limit of dynamic shared memory per device, as cudaFuncSetAttribute left it (48 KiB until raised:
/// a null kernel has no static shared memory).
std::mutex g_limits_mutex;
std::map<std::pair<const void*, int>, int>& smem_limits() {
  static auto* m = new std::map<std::pair<const void*, int>, int>;
  return *m;
}
int smem_limit(const void* stub, int device) {
  std::lock_guard<std::mutex> lock(g_limits_mutex);
  const auto it = smem_limits().find({stub, device});
  return it == smem_limits().end() ? 48 << 10 : it->second;
}

/// Records what the current device refuses: counted, said on stderr (the first 20), left for cudaGetLastError.
cudaError_t refuse(const void* stub, cudaError_t error, const std::string& why) {
  static std::atomic<int> said{0};
  g_device_stats[t_device].refused.fetch_add(1, std::memory_order_relaxed);
  if (said.fetch_add(1) < 20) {
    std::string name;
    {
      std::lock_guard<std::mutex> lock(g_kernels_mutex);
      name = demangled(kernels()[stub].name);
    }
    std::fprintf(stderr, "null_cudart: refused on cuda:%d (sm_%d, %s limits): %s: %s\n", t_device,
                 g_capabilities.of[t_device], model_of(t_device).product, name.c_str(), why.c_str());
  }
  t_last_error = error;
  return error;
}

/// What CUDA checks of a launch before it runs: the block's shape, the grid's, the dynamic shared memory against
/// the kernel's limit, and clusters only where the device has them.
cudaError_t check_launch(const void* stub, dim3 grid, dim3 block, size_t smem, unsigned cluster) {
  const unsigned long threads = static_cast<unsigned long>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64)
    return refuse(stub, cudaErrorInvalidConfiguration, "a block of " + std::to_string(threads) + " threads");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
    return refuse(stub, cudaErrorInvalidConfiguration, "a grid of " + std::to_string(grid.x) + " x " +
                                                           std::to_string(grid.y) + " x " + std::to_string(grid.z));
  const int limit = smem_limit(stub, t_device);
  if (smem > static_cast<size_t>(limit))
    return refuse(stub, cudaErrorInvalidValue, std::to_string(smem) + " bytes of dynamic shared memory, over the "
                                                   "kernel's limit of " + std::to_string(limit));
  if (cluster > 1 && !model_of(t_device).clusters)
    return refuse(stub, cudaErrorInvalidValue, "clusters of " + std::to_string(cluster) + " blocks");
  return cudaSuccess;
}

std::string demangled(const std::string& name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return out.size() > 160 ? out.substr(0, 157) + "..." : out;
}

struct Report {
  ~Report() {
    if (!g_reporting) return;
    {
      std::lock_guard<std::mutex> lock(g_registry_mutex);
      std::vector<const Calls*> calls = registry();
      std::sort(calls.begin(), calls.end(), [](const Calls* a, const Calls* b) { return a->count > b->count; });
      std::fprintf(stderr, "null_cudart: runtime calls of this process\n");
      for (const Calls* c : calls) std::fprintf(stderr, "%12ld %s\n", c->count.load(), c->name);
    }
    std::lock_guard<std::mutex> lock(g_kernels_mutex);
    std::vector<const Kernel*> launched;
    for (const auto& [stub, k] : kernels())
      if (k.launches > 0) launched.push_back(&k);
    std::sort(launched.begin(), launched.end(),
              [](const Kernel* a, const Kernel* b) { return a->launches > b->launches; });
    std::fprintf(stderr, "null_cudart: kernel launches of this process\n");
    for (const Kernel* k : launched) std::fprintf(stderr, "%12ld %s\n", k->launches, demangled(k->name).c_str());
  }
} g_report;

/// Said at exit whether or not reporting: launches or kernel attributes a device's limits refused (check_launch).
struct RefusedReport {
  ~RefusedReport() {
    long refused = 0;
    for (const DeviceStats& d : g_device_stats) refused += d.refused.load();
    if (refused > 0) std::fprintf(stderr, "null_cudart: %ld launches or kernel attributes refused\n", refused);
  }
} g_refused_report;

/// Counts a call of the function it stands in (one Calls a function, registered on its first call).
#define MT_NULL_COUNT(name) \
  do { static Calls& calls_ = *new Calls{name}; calls_.count.fetch_add(1, std::memory_order_relaxed); } while (0)
/// The body of a function that only counts its call and succeeds.
#define MT_NULL_OK(name) \
  {                      \
    MT_NULL_COUNT(name); \
    return cudaSuccess;  \
  }

/// A `<<<grid, block, shmem, stream>>>` launch: nvcc's stub pushes it, then pops it before launching.
struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes;
  void* stream;
};
thread_local std::vector<LaunchConfig> t_configs;

int g_fatbin_handle = 0;

/// Host memory standing in for device memory: 256-byte aligned, as cudaMalloc's.
void* aligned(size_t bytes) { return std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256); }

/// A handle (stream, event, graph) that is only ever compared and destroyed.
template <class Handle>
Handle new_handle() {
  return reinterpret_cast<Handle>(new int(t_device));
}
template <class Handle>
void delete_handle(Handle h) {
  delete reinterpret_cast<int*>(h);
}

}  // namespace

extern "C" {

// ---- what nvcc's generated code calls: fat binary registration and the <<<...>>> launch stubs ----

void** __cudaRegisterFatBinary(void*) { return reinterpret_cast<void**>(&g_fatbin_handle); }
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* stub, char*, const char* device_name, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  kernels()[stub].name = device_name;
}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
void __cudaRegisterManagedVar(void**, void**, char*, const char*, int, size_t, int, int) {}
char __cudaInitModule(void**) { return 0; }
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes, struct CUstream_st* stream) {
  t_configs.push_back({grid, block, shared_bytes, stream});
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes, void* stream) {
  const LaunchConfig c = t_configs.back();
  t_configs.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared_bytes = c.shared_bytes;
  *static_cast<void**>(stream) = c.stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fn) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fn));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void**, size_t smem, cudaStream_t stream) {
  MT_NULL_COUNT("kernel launch (<<<...>>>)");
  if (const cudaError_t e = check_launch(kernel, grid, block, smem, 1); e != cudaSuccess) return e;
  note_work(stream, true);
  count_launch(kernel);
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void**, size_t smem,
                                    cudaStream_t stream) {
  MT_NULL_COUNT("kernel launch (<<<...>>>, per-thread stream)");
  if (const cudaError_t e = check_launch(kernel, grid, block, smem, 1); e != cudaSuccess) return e;
  note_work(stream, true);
  count_launch(kernel);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernel(const void* stub, dim3 grid, dim3 block, void**, size_t smem, cudaStream_t stream) {
  MT_NULL_COUNT("cudaLaunchKernel");
  if (const cudaError_t e = check_launch(stub, grid, block, smem, 1); e != cudaSuccess) return e;
  note_work(stream, true);
  count_launch(stub);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* stub, void**) {
  MT_NULL_COUNT("cudaLaunchKernelExC");
  unsigned cluster = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const cudaLaunchAttribute& a = config->attrs[i];
    if (a.id == cudaLaunchAttributeClusterDimension)
      cluster = a.val.clusterDim.x * a.val.clusterDim.y * a.val.clusterDim.z;
  }
  if (const cudaError_t e = check_launch(stub, config->gridDim, config->blockDim, config->dynamicSmemBytes, cluster);
      e != cudaSuccess)
    return e;
  note_work(config->stream, true);
  count_launch(stub);
  return cudaSuccess;
}

// ---- errors and the device ----

cudaError_t cudaGetLastError(void) {
  MT_NULL_COUNT("cudaGetLastError");
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  MT_NULL_COUNT("cudaPeekAtLastError");
  return t_last_error;
}
const char* cudaGetErrorString(cudaError_t) { return "an error of the null CUDA runtime (bench/null_cudart.cpp)"; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorNullRuntime"; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = g_devices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  MT_NULL_COUNT("cudaGetDevice");
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  MT_NULL_COUNT("cudaSetDevice");
  if (device < 0 || device >= g_devices) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) MT_NULL_OK("cudaDeviceSynchronize")
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  MT_NULL_COUNT("cudaGetDeviceProperties");
  if (device < 0 || device >= g_devices) return cudaErrorInvalidDevice;
  const DeviceModel& m = model_of(device);
  std::memset(p, 0, sizeof *p);
  p->major = g_capabilities.of[device] / 10;
  p->minor = g_capabilities.of[device] % 10;
  std::snprintf(p->name, sizeof p->name, "null CUDA runtime sm_%d%d (%s limits; no kernel runs)", p->major, p->minor,
                m.product);
  p->multiProcessorCount = m.multiprocessors;
  p->warpSize = 32;
  p->totalGlobalMem = size_t{static_cast<size_t>(m.memory_gib)} << 30;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = static_cast<size_t>(m.smem_optin);
  p->sharedMemPerMultiprocessor = static_cast<size_t>(m.smem_per_sm);
  p->regsPerBlock = p->regsPerMultiprocessor = 65536;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsPerMultiProcessor = m.threads_per_sm;
  p->maxBlocksPerMultiProcessor = m.blocks_per_sm;
  p->l2CacheSize = m.l2_bytes;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->memoryBusWidth = 5120;
  p->clusterLaunch = m.clusters ? 1 : 0;
  p->concurrentKernels = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  MT_NULL_COUNT("cudaDeviceGetAttribute");
  if (device < 0 || device >= g_devices) return cudaErrorInvalidDevice;
  const DeviceModel& m = model_of(device);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = g_capabilities.of[device] / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = g_capabilities.of[device] % 10; break;
    case cudaDevAttrMultiProcessorCount: *value = m.multiprocessors; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = m.smem_optin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = m.smem_per_sm; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = m.threads_per_sm; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = m.blocks_per_sm; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock:
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = 65536; break;
    case cudaDevAttrL2CacheSize: *value = m.l2_bytes; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrClusterLaunch: *value = m.clusters ? 1 : 0; break;
    default: *value = 1; break;  // the other yes/no capabilities: yes
  }
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = size_t{70} << 30;
  *total_bytes = size_t{80} << 30;
  return cudaSuccess;
}

// ---- memory: host memory, copies are memmove ----

cudaError_t cudaMalloc(void** p, size_t bytes) {
  MT_NULL_COUNT("cudaMalloc");
  g_device_stats[t_device].mallocs.fetch_add(1, std::memory_order_relaxed);
  *p = aligned(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  MT_NULL_COUNT("cudaFree");
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = aligned(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  MT_NULL_COUNT("cudaMemcpy");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  MT_NULL_COUNT("cudaMemcpyAsync");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t bytes, cudaStream_t) {
  MT_NULL_COUNT("cudaMemcpyPeerAsync");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  MT_NULL_COUNT("cudaMemset");
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  MT_NULL_COUNT("cudaMemsetAsync");
  note_work(stream, false);
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

// ---- streams and events: handles, and everything has finished ----

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete_handle(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) MT_NULL_OK("cudaStreamSynchronize")
cudaError_t cudaStreamQuery(cudaStream_t) MT_NULL_OK("cudaStreamQuery")
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) MT_NULL_OK("cudaStreamWaitEvent")
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  MT_NULL_COUNT("cudaEventCreate");
  *e = new_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete_handle(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  MT_NULL_COUNT("cudaEventRecord");
  if (handle_device(e) != stream_device(s)) g_device_stats[t_device].mismatches.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned) { return cudaEventRecord(e, s); }
cudaError_t cudaEventSynchronize(cudaEvent_t) MT_NULL_OK("cudaEventSynchronize")
cudaError_t cudaEventQuery(cudaEvent_t) MT_NULL_OK("cudaEventQuery")
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.001f;  // a nonzero time: callers divide by it
  return cudaSuccess;
}

// ---- kernels' attributes and occupancy: a kernel built for sm_80 and sm_90, each with its PTX ----

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* stub) {
  MT_NULL_COUNT("cudaFuncGetAttributes");
  std::memset(a, 0, sizeof *a);
  const int capability = g_capabilities.of[t_device];
  a->numRegs = 64;
  a->ptxVersion = capability >= 90 ? 90 : 80;  // the image the device runs: sm_80's on 8.x, sm_90's PTX beyond 9.0
  a->binaryVersion = capability >= 90 && capability < 100 ? 90 : capability >= 100 ? capability : 80;
  a->maxThreadsPerBlock = 1024;
  a->maxDynamicSharedSizeBytes = smem_limit(stub, t_device);
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* stub, cudaFuncAttribute attr, int value) {
  MT_NULL_COUNT("cudaFuncSetAttribute");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > model_of(t_device).smem_optin)
    return refuse(stub, cudaErrorInvalidValue, "a limit of " + std::to_string(value) + " bytes of dynamic shared "
                                               "memory, over the " + std::to_string(model_of(t_device).smem_optin) +
                                               " a block may opt in to");
  std::lock_guard<std::mutex> lock(g_limits_mutex);
  smem_limits()[{stub, t_device}] = value;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int, size_t) {
  MT_NULL_COUNT("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  *blocks = 2;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int, size_t, unsigned) {
  MT_NULL_COUNT("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
  *blocks = 2;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, const void*, const cudaLaunchConfig_t*) {
  MT_NULL_COUNT("cudaOccupancyMaxActiveClusters");
  *clusters = model_of(t_device).clusters ? 8 : 0;
  return model_of(t_device).clusters ? cudaSuccess : cudaErrorNotSupported;
}

// ---- graphs: a capture records nothing, a replay runs nothing ----

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaSuccess; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  *graph = new_handle<cudaGraph_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t, unsigned long long) {
  *exec = new_handle<cudaGraphExec_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) MT_NULL_OK("cudaGraphLaunch")
cudaError_t cudaGraphGetNodes(cudaGraph_t, cudaGraphNode_t*, size_t* count) {
  *count = 0;
  return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t, cudaGraphNodeType* type) {
  *type = cudaGraphNodeTypeKernel;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete_handle(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete_handle(exec);
  return cudaSuccess;
}

// ---- not CUDA's: what bench/null_devices.cpp reads (by dlsym: on the real runtime it says it did not run) ----

/// Kernels launched, cudaMalloc calls and mismatched work (see the top) while `device` was current, on any thread.
/// False for a device this runtime does not have.
/// Launches and kernel attributes refused on `device` by its limits (check_launch); -1 for no such device.
long mixtape_null_cudart_refused(int device) {
  if (device < 0 || device >= g_devices) return -1;
  return g_device_stats[device].refused.load();
}

bool mixtape_null_cudart_device_stats(int device, long* launches, long* mallocs, long* mismatches) {
  if (device < 0 || device >= g_devices) return false;
  const DeviceStats& d = g_device_stats[device];
  *launches = d.launches.load();
  *mallocs = d.mallocs.load();
  *mismatches = d.mismatches.load();
  return true;
}

}  // extern "C"
