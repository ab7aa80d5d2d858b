// cuda/stream.h — CUDA streams and events, and the calling thread's current stream.
//
// The one design idea: every kernel and copy of the CUDA backend is issued to
// `current_stream()`, a per-thread, per-device setting that `StreamGuard`
// changes for a scope (PyTorch's model). Until a thread sets one, its current
// stream is the device's *legacy default stream*: it is ordered with every
// blocking stream and with code that launches on stream 0, so a program that
// never touches streams is exactly as ordered as one without them. Streams
// from `Stream::create()` are non-blocking (not ordered with the legacy
// stream): work on them overlaps with the default stream, and ordering between
// streams is expressed with events. They come from a pool of 32 a device that
// lives as long as the process (PyTorch's getStreamFromPool): the allocator
// keeps a freed block's stream and a graph its last replay's, so a stream must
// outlive every Stream object that named it.
//
// Free of CUDA headers, like cuda/runtime.h: a stream is an opaque handle
// here; .cu files get the cudaStream_t through cuda/stream.cuh.
//
//   mixtape::cuda::Stream side = mixtape::cuda::Stream::create();
//   mixtape::cuda::Event ready;
//   {
//     mixtape::cuda::StreamGuard on(side);
//     y = f(x);                                   // kernels go to `side`
//     ready.record();                             // on `side`
//   }
//   ready.wait(mixtape::cuda::current_stream());  // the default stream waits for `side`, the host does not
#pragma once

#include <memory>

namespace mixtape::cuda {

class Stream;
namespace detail {
/// A non-blocking stream of `device` of its own, destroyed with the last copy of the result: a graph capture's
/// (cuda/graph.cu), which no other code may launch on while it records.
Stream owned_stream(int device);
}  // namespace detail

/// A CUDA stream of one device: the legacy default stream, a stream of the device's pool, or a borrowed
/// cudaStream_t. Copying is cheap.
class Stream {
 public:
  /// The legacy default stream of cuda:0 (a null handle: stream 0). Never throws.
  Stream() noexcept = default;

  /// A non-blocking stream of `device` (-1: the current device) from its pool: 32 streams made on the device's
  /// first request and handed out in turn (the 33rd request gets the first again), never destroyed, so that a
  /// tensor made on one may be freed, and a graph replayed on one may die, after the last Stream naming it went.
  static Stream create(int device = -1);
  /// The legacy default stream of `device` (-1: the current device).
  static Stream legacy_default(int device = -1);
  /// Borrows `handle` (a cudaStream_t living on `device`); the caller keeps it alive while this is in use.
  static Stream borrow(void* handle, int device);

  /// The cudaStream_t, as an opaque pointer (cuda/stream.cuh converts it); nullptr for the legacy default stream.
  void* handle() const noexcept { return m_handle; }
  int device() const noexcept { return m_device; }

  /// True when all work issued to the stream has finished; never waits. Refused during a graph capture.
  bool query() const;
  /// Blocks the host until all work issued to the stream has finished; counted in debug_counters().synchronizations.
  void synchronize() const;

  friend bool operator==(const Stream& a, const Stream& b) noexcept {
    return a.m_handle == b.m_handle && a.m_device == b.m_device;
  }

 private:
  friend Stream detail::owned_stream(int device);
  Stream(void* handle, int device, std::shared_ptr<void> owner) noexcept
      : m_handle(handle), m_device(device), m_owner(std::move(owner)) {}

  void* m_handle = nullptr;
  int m_device = 0;
  std::shared_ptr<void> m_owner;  // non-null for an owned_stream: destroys it
};

/// The calling thread's current stream on `device` (-1: the current device); the legacy default stream until
/// set. Throws mixtape::Error when CUDA is unavailable.
Stream current_stream(int device = -1);

/// Makes `stream` the calling thread's current stream on its device.
void set_current_stream(const Stream& stream);

/// Makes `stream` current on its device for a scope and restores the previous one after. The thread's current
/// device is left alone: work for another device still goes to that device's own current stream.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream m_previous;
};

/// A CUDA event: a marker in a stream that other streams or the host can wait for. Created on first record,
/// on the recorded stream's device. Move-only.
class Event {
 public:
  /// `timing`: whether elapsed_ms may be asked (events without timing are cheaper to record and wait on).
  explicit Event(bool timing = false) noexcept : m_timing(timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// Marks the current end of `stream`'s work (default: the current stream of the current device).
  void record();
  void record(const Stream& stream);
  /// Makes `stream` wait on the device (not the host) until the recorded work finished; a no-op if never recorded.
  void wait(const Stream& stream) const;
  /// True when the recorded work finished (or nothing was recorded); never waits. Refused during a graph capture.
  bool query() const;
  /// Blocks the host until the recorded work finished; counted in debug_counters().synchronizations.
  void synchronize() const;
  /// Milliseconds between this event and `end`, both recorded with timing and completed.
  float elapsed_ms(const Event& end) const;

  bool recorded() const noexcept { return m_event != nullptr; }
  void* handle() const noexcept { return m_event; }

 private:
  void* m_event = nullptr;  // cudaEvent_t, created by the first record
  int m_device = -1;
  bool m_timing = false;
};

}  // namespace mixtape::cuda
