// cuda/stream.cuh — the cudaStream_t behind a mixtape::cuda::Stream, and the runtime's debug counters
// (internal: included by .cu files only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include <mixtape/core/device.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/stream.h>

namespace mixtape::cuda {

/// The stream to pass to a launch or an async copy; the legacy default stream is spelled cudaStreamLegacy,
/// so that it means the same whether or not a translation unit was built with --default-stream per-thread.
inline cudaStream_t cuda_stream(const Stream& stream) noexcept {
  return stream.handle() ? static_cast<cudaStream_t>(stream.handle()) : cudaStreamLegacy;
}

/// The calling thread's current stream on `device` (>= 0), ready for a launch: `<<<g, b, 0, launch_stream(d)>>>`.
inline cudaStream_t launch_stream(int device) { return cuda_stream(current_stream(device)); }
/// The same for the calling thread's current device (after a DeviceGuard has selected the tensor's).
inline cudaStream_t launch_stream() { return cuda_stream(current_stream()); }

namespace detail {
/// The device the calling thread's innermost live DeviceGuard (or with_device_nothrow) made current; -1 while none
/// is live, or where a switch failed: then only CUDA knows. Inside a guard, current_device(), the current stream and
/// a nested guard for the same device ask CUDA nothing, where an eager op asked cudaGetDevice five times (~0.08 µs
/// each on the H200's host: bench/RESULTS.md). mixtape switches devices only through these two, which keep it true;
/// set_device, the one switch that outlives its call, forgets it.
int& guarded_device() noexcept;
}  // namespace detail

/// Makes `device` current for a scope and restores the caller's device after, so that a call on cuda:1 leaves
/// a thread that was working on cuda:0 where it was. Inside a guard for the same device it asks CUDA nothing.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) : DeviceGuard(device.index) {}
  explicit DeviceGuard(int device) : m_target(device), m_outer(detail::guarded_device()) {
    if (m_target >= 0 && m_target == m_outer) {
      m_previous = m_target;
    } else {
      MT_CUDA_CHECK(cudaGetDevice(&m_previous), "cuda: querying the current device");
      if (m_previous != m_target) MT_CUDA_CHECK(cudaSetDevice(m_target), "cuda: selecting cuda:", m_target);
    }
    detail::guarded_device() = m_target;
  }
  ~DeviceGuard() {
    if (m_previous != m_target && cudaSetDevice(m_previous) != cudaSuccess) {
      (void)cudaGetLastError();
      detail::guarded_device() = -1;  // m_target may still be current: let CUDA say
      return;
    }
    detail::guarded_device() = m_outer;
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int m_target;
  int m_outer;  // the enclosing guard's device, or -1
  int m_previous = -1;
};

/// Calls f() with `device` current and the caller's device current again after, as a DeviceGuard does, for code
/// that must not throw (destructors, frees). Where CUDA cannot switch, f runs on the current device (its CUDA calls
/// then fail, and it copes); CUDA's error state is cleared after.
template <class F>
void with_device_nothrow(int device, F&& f) noexcept {
  int& guarded = detail::guarded_device();
  const int outer = guarded;
  int previous = outer;
  const bool known = previous >= 0 || cudaGetDevice(&previous) == cudaSuccess;
  const bool switched = known && previous != device && cudaSetDevice(device) == cudaSuccess;
  guarded = known && (switched || previous == device) ? device : -1;
  f();
  const bool restored = !switched || cudaSetDevice(previous) == cudaSuccess;
  guarded = restored ? outer : -1;
  (void)cudaGetLastError();
}

/// Streaming multiprocessors of `device`, queried once per device (launch configurations ask on every launch).
int multiprocessor_count(int device);
/// The major compute capability of `device` (9 on an H100), queried once per device.
int compute_capability_major(int device);
namespace detail {
/// Throws mixtape::Error naming `op` unless `device` is a visible device mixtape's kernels run on (its compute
/// capability at least the lowest architecture built: cuda/capability.h; the runtime's probe reads every device's
/// once per process).
void require_device(int device, const char* op);
}  // namespace detail
/// Bytes of shared memory a block of `device` may use after opting in (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
/// sm_86/sm_89), queried once per device.
int shared_memory_per_block_optin(int device);

/// Whether `kernel` may be launched on `device` (the current device) with `smem` bytes of dynamic shared memory,
/// making it so where it can be. A kernel's static and dynamic shared memory together get 48 KiB unless it opts in,
/// and never more than shared_memory_per_block_optin; so 48 KiB of dynamic memory do not fit a kernel with any
/// static shared memory (a block reduction's buffer) until it opts in. Past its current limit the kernel's limit
/// is raised, once per kernel and device, to all the device allows next to its static shared memory (a later,
/// smaller request never lowers it under a launch of an earlier one). False, raising nothing, where `smem` cannot
/// fit at all (a row stash of 128 KiB on sm_86/sm_89, which allow 99). The kernel's attributes are asked once.
bool dynamic_shared_memory_fits(const void* kernel, size_t smem, int device);
template <class Kernel>
bool dynamic_shared_memory_fits(Kernel* kernel, size_t smem, int device) {
  return dynamic_shared_memory_fits(reinterpret_cast<const void*>(kernel), smem, device);
}

namespace detail {
/// Bumped by every host wait the runtime performs (stream, event or device synchronize): debug_counters().
void count_synchronization() noexcept;
/// Bumped by every device-to-host copy: debug_counters().
void count_device_to_host_copy() noexcept;
/// Bumped by every kernel launched as thread-block clusters: debug_counters().
void count_cluster_launch() noexcept;

struct ReplayArguments;
/// The CUDA graph capture the calling thread is running (cuda/graph.h), if any: its stream and device, and where a
/// random draw finds its offset at a replay (the default generator's seed and offset at the capture start, and the
/// device slot each replay sets to the generator's offset then: cuda/dropout.cu), what the captured draws took from
/// the generator, and its replay arguments.
struct Capture {
  cudaStream_t stream = nullptr;
  int device = -1;
  uint64_t philox_seed = 0;
  uint64_t philox_origin = 0;
  const uint64_t* philox_base = nullptr;  // (1), device memory
  ReplayArguments* arguments = nullptr;   // the graph's (replay_argument)
  uint64_t philox_drawn = 0;              // counters the captured draws reserved, in all
  uint64_t philox_end = 0;                // past the last of them, from philox_origin: what one replay reserves
};
Capture& thread_capture() noexcept;

/// Kernel arguments that a graph's replays read anew: a few bytes of the graph's device memory each, which every
/// replay fills before its kernels run with what their `current` functions write then (on the host, in replay();
/// one that throws refuses the replay before anything is launched). cuda/graph.cu.
inline constexpr size_t kReplayArgumentBytes = 2048;  // all of a graph's together: one kernel parameter writes them
struct ReplayArgument {
  size_t offset = 0, bytes = 0;  // in the arena
  std::function<void(void* host)> current;
};
struct ReplayArguments {
  unsigned char* arena = nullptr;  // device memory, kReplayArgumentBytes
  size_t used = 0;
  std::vector<ReplayArgument> list;
};
/// During a capture on the calling thread (thread_capture().stream set): a replay argument of `bytes` that each
/// replay of the graph sets to what `current` writes; returns its device address (16-byte aligned) for the
/// captured kernels to read. cuda/optim.cu: an optimizer's options, which a schedule changes between replays.
void* replay_argument(size_t bytes, std::function<void(void* host)> current);
/// Throws mixtape::Error when the calling thread is capturing a CUDA graph: `what` (a host wait, a copy to or from
/// the host, a random draw) would happen once, at the capture, instead of at every replay.
void refuse_in_capture(const char* what);
}  // namespace detail

}  // namespace mixtape::cuda
