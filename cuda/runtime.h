// cuda/runtime.h — is there a GPU, which one, and waiting for it.
//
// The one public door to the CUDA runtime, and deliberately free of CUDA
// headers: every build has these functions, so code (tests, examples, user
// programs) asks `is_available()` instead of #ifdef-ing on how mixtape was
// built. In a build without CUDA they report "unavailable" and the functions
// that need a device throw mixtape::Error saying why.
//
//   if (mixtape::cuda::is_available()) {
//     auto p = mixtape::cuda::device_properties();
//     std::cout << p.name << " sm_" << p.major << p.minor << "\n";
//   } else {
//     std::cout << "CPU only: " << mixtape::cuda::unavailable_reason() << "\n";
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mixtape::cuda {

/// True when mixtape was built with CUDA, a driver is loaded and at least one visible device runs mixtape's
/// kernels: a compute capability of at least the lowest architecture built, 8.0 for the default build (sm_80 and
/// sm_90, each with its PTX), so not a T4 (7.5) or a V100 (7.0). Never throws.
bool is_available() noexcept;

/// Number of visible CUDA devices, numbered as CUDA numbers them, those the kernels do not run on included; 0
/// without CUDA, without a driver or without a device. Never throws.
int device_count() noexcept;

/// Why `is_available()` is false, e.g. "mixtape was built without CUDA", "no usable CUDA driver: ...",
/// "no CUDA device", "cuda:0 (Tesla T4) has compute capability 7.5; mixtape's CUDA kernels need compute capability
/// 8.0 or newer (this build has sm_80, sm_90)"; empty when CUDA is available. A device the kernels do not run on
/// beside one they run on is refused by name where it is asked for (a tensor on it, set_device, a stream).
std::string unavailable_reason();

/// What kernels and their launchers tune for.
struct DeviceProperties {
  std::string name;                        // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;                // compute capability: 8.0 on A100, 9.0 on H100
  int multiprocessor_count = 0;
  size_t total_memory = 0;                 // bytes of global memory
  size_t shared_memory_per_block_optin = 0;  // bytes a block may use after opting in
  size_t l2_cache_bytes = 0;
};

/// Properties of CUDA device `device`; throws mixtape::Error when CUDA is unavailable or the index is out of range.
/// @code
///   auto p = mixtape::cuda::device_properties(0);
///   bool tensor_cores_bf16 = p.major >= 8;
/// @endcode
DeviceProperties device_properties(int device = 0);

/// Waits until every kernel and copy issued to the current device, on any stream, has finished (counted in
/// debug_counters().synchronizations);
/// throws mixtape::Error naming the CUDA error when one of them failed.
void synchronize();

/// Makes `device` the calling thread's current CUDA device; throws when out of range or unavailable.
void set_device(int device);

/// The calling thread's current CUDA device; throws when CUDA is unavailable.
int current_device();

// ---- TF32 ----------------------------------------------------------------------------------

/// Lets f32 matrix products outside autocast (matmul, linear, conv2d) run on the TF32 Tensor Cores:
/// inputs rounded to 10 mantissa bits, f32 accumulation, about 8x the f32 throughput. Off by default
/// (PyTorch's torch.backends.cuda.matmul.allow_tf32), process-wide. Never throws; a CPU-only build keeps
/// the flag too, so code that sets it builds and runs everywhere.
/// @code
///   mixtape::cuda::set_allow_tf32(true);   // f32 GEMMs trade precision for speed from here on
/// @endcode
void set_allow_tf32(bool allow) noexcept;
/// Whether f32 matrix products may run in TF32 (set_allow_tf32). Never throws.
bool allow_tf32() noexcept;

// ---- thread-block clusters -----------------------------------------------------------------

/// Lets kernels run as thread-block clusters where the device has them (sm_90): the GEMM's small tile splitting
/// K, layer_norm's backward for f32 rows of 8193-32768 elements. On by default; off, they run the paths other devices
/// run (results differ only in the order of sums). Process-wide; never throws. Counted in
/// debug_counters().cluster_launches.
void set_allow_clusters(bool allow) noexcept;
/// Whether kernels may run as thread-block clusters (set_allow_clusters). Never throws.
bool allow_clusters() noexcept;

// ---- convolution columns -----------------------------------------------------------------------

/// conv_column_limit()'s default: each convolution takes the limit of its dtype below.
inline constexpr int64_t kConvColumnLimitAuto = -1;
/// The default limit of f16 and bf16 convolutions: 10 MiB, the most at which the MNIST CNN's AMP step peaks where it
/// does with 4 (51.6 MiB of tensors, PyTorch's 54.9; 12 MiB: 51.7, 14: 54.6, 16: 56.8, the whole batch 125). On an
/// H200 the step took 1.93 ms with 4 MiB (conv2 in 22 chunks), 1.36 with 16 (6 chunks), 1.21 whole, PyTorch eager
/// AMP 2.6-2.9; 10 MiB makes 9 chunks (bench/RESULTS.md: the fifth run, and the peaks counted on the CPU since).
inline constexpr int64_t kDefaultConvColumnLimitF16 = int64_t{10} << 20;
/// The default limit of f32 (and f64) convolutions: 20 MiB, the most at which the fp32 CNN step peaks where it does
/// with 4 or 16 (83.6 MiB, PyTorch's 90.7; 24 MiB: 84.7, 28: 89.7, 32: 94.0, the whole batch 148). On an H200 it
/// took 2.98 ms with 16 MiB (6 chunks), 4.75 with 4, 2.74 whole; 20 MiB makes 5 chunks.
inline constexpr int64_t kDefaultConvColumnLimitF32 = int64_t{20} << 20;

/// The most bytes of im2col columns one CUDA conv2d call (forward, input or weight gradient) holds at once. The
/// convolutions run as im2col + GEMM (cuda/conv.cu); the columns are kH·kW copies of the input, those of the input
/// gradient in f32 whatever the dtype (its one rounding follows col2im's sums): 81 MiB for the MNIST CNN's second
/// convolution at batch 128. A batch whose f32 columns would take more than `bytes` goes through in chunks of
/// samples (at least one), a GEMM each: less memory, more launches. 0 runs the whole batch as one GEMM;
/// kConvColumnLimitAuto, the default, the limit of the convolution's dtype (kDefaultConvColumnLimitF16, F32).
/// Results differ only in the order of the sums (the weight gradient's over samples, the GEMM's tiles).
/// Process-wide; a CPU-only build keeps the setting too (the CPU's convolutions take cache-sized chunks of their
/// own). Throws mixtape::Error for a negative `bytes` other than kConvColumnLimitAuto.
/// @code
///   mixtape::cuda::set_conv_column_limit(0);  // the whole batch: fastest, most memory
/// @endcode
void set_conv_column_limit(int64_t bytes);
/// The limit set_conv_column_limit set: kConvColumnLimitAuto by default, 0 for none. Never throws.
int64_t conv_column_limit() noexcept;

// ---- the caching allocator -----------------------------------------------------------------
//
// CUDA tensors take their memory from a caching allocator (cuda/allocator.cu): a freed block stays reserved
// and serves the next request of its size class, so a training step after the first calls cudaMalloc no more.
// Requests are rounded to size classes: up to 1 MiB to a multiple of 512 bytes, above to a multiple of 2 MiB.
// A block freed while its stream may still use it is reused at once on that stream (stream order makes that
// safe) and by other streams only after an event recorded at the free has completed.
//
//   auto before = mixtape::cuda::memory_stats();
//   { auto t = mixtape::empty({1024}, mixtape::TensorOptions().device(mixtape::Device::cuda())); }
//   mixtape::cuda::empty_cache();  // reserved_bytes back to allocated_bytes

/// Byte counts are of whole blocks (rounded sizes) but for requested_bytes; counters run since the process
/// started. Three views of one device's memory, as PyTorch's memory_stats() has them:
///   requested  what the tensors asked for: the model's own footprint, whatever allocator serves it (PyTorch's
///              "requested_bytes"; its memory_allocated() is the same rounded to 512 bytes a request)
///   allocated  the blocks serving them: requested plus the size classes' rounding (up to 2 MiB a block above
///              1 MiB, where PyTorch splits large segments instead)
///   reserved   what cudaMalloc gave: allocated plus the cache, the process's real use of the device
struct MemoryStats {
  int64_t allocated_bytes = 0;       // blocks held by live tensors
  int64_t reserved_bytes = 0;        // obtained from cudaMalloc: allocated + cached
  int64_t requested_bytes = 0;       // bytes live tensors asked for (each ≤ its block)
  int64_t peak_allocated_bytes = 0;  // the most allocated_bytes since the last reset_peak_memory_stats
  int64_t peak_requested_bytes = 0;  // the most requested_bytes since then
  int64_t peak_reserved_bytes = 0;   // the most reserved_bytes since then
  int64_t num_cuda_malloc = 0;       // successful cudaMalloc calls
  int64_t num_cache_hits = 0;        // requests served from the cache
};

/// Statistics of `device` (-1: the current device). Never throws: all zero without CUDA or for an unused device.
MemoryStats memory_stats(int device = -1) noexcept;

/// Sets each peak to its present count on `device` (-1: the current device). Never throws.
void reset_peak_memory_stats(int device = -1) noexcept;

/// Returns every cached (unused) block of every device to CUDA with cudaFree, after waiting for the device's
/// work; tensors alive keep their memory. A no-op without CUDA or with nothing cached.
void empty_cache();

// ---- debug counters ----------------------------------------------------------------------------

/// What the runtime did that makes the host wait: a training step should show neither (DESIGN.md).
struct DebugCounters {
  int64_t device_to_host_copies = 0;  // copies from a CUDA device to the CPU (each copy_bytes call)
  int64_t synchronizations = 0;       // host waits: device, stream and event synchronize, by the runtime or users
  int64_t cluster_launches = 0;       // kernels launched as thread-block clusters (set_allow_clusters)
};

/// Counters since the start or the last reset_debug_counters(). Never throw; zero without CUDA.
DebugCounters debug_counters() noexcept;
void reset_debug_counters() noexcept;

}  // namespace mixtape::cuda
