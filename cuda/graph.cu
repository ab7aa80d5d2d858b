// cuda/graph.cu — cuda::Graph (cuda/graph.h): stream capture into a CUDA graph, with a memory pool of its own.
//
// A capture runs on a stream made for it, in cudaStreamCaptureModeThreadLocal (the capturing thread may not call
// what would make the graph wrong; other threads, a data loader's, go on). While it runs, the calling thread's
// detail::thread_capture() names that stream: the allocator hands out the graph's pool (allocator.cuh) and the
// runtime refuses host copies and host waits with an error that says why (detail::refuse_in_capture). Dropout
// draws from the default generator: the capture gives back the counters its draws took (nothing ran) unless
// something else drew meanwhile (another thread, a draw on the CPU: their counters are never handed out twice),
// and each replay takes the counters its draws need from the generator and writes the first one to a device slot
// the captured kernels add to their offsets, so replays draw what eager steps would. That slot is the first of the
// graph's replay arguments (detail::replay_argument): a few bytes of device memory that each replay fills, in one
// kernel launch before the graph's, with values the host computes then; the optimizers' step kernels read their
// options from others (the learning rate a schedule set since the capture).
#include <mixtape/cuda/graph.h>

#include <cstring>
#include <exception>
#include <utility>

#include <cuda_runtime.h>

#include <mixtape/core/error.h>
#include <mixtape/core/random.h>
#include <mixtape/cuda/allocator.cuh>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>
#include <mixtape/cuda/stream.h>

namespace mixtape::cuda {

namespace {

/// A graph's replay arguments as the host wrote them for one replay.
struct ArgumentBytes {
  unsigned char b[detail::kReplayArgumentBytes];
};

/// The first n bytes of the arena = values': the replay arguments for the replay that follows on the stream.
__global__ void __launch_bounds__(256) set_arguments_kernel(unsigned char* arena, ArgumentBytes values, unsigned n) {
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) arena[i] = values.b[i];
}

}  // namespace

struct Graph::Impl {
  int device = -1;
  Stream stream;                       // the capture's own; destroyed after the pool went back on another
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphPool* pool = nullptr;           // its memory, reserved while it lives
  bool replayed = false;
  cudaStream_t last_stream = nullptr;  // the stream of the last replay; before the first, the caller's at the
                                       // capture (its queued work may still use the slots' blocks and the inputs)
  cudaEvent_t last_replay = nullptr;   // recorded after it when the next replay is on another stream
  uint64_t philox_counters = 0;        // the generator's counters one replay uses
  uint64_t philox_seed = 0;            // the default generator's seed at the capture: a kernel argument in the graph
  detail::ReplayArguments arguments;   // set before each replay (detail::replay_argument); at offset 0 the
                                       // default generator's offset for the replay (dropout), when it draws

  ~Impl() {
    with_device_nothrow(device, [this] { release_on_its_device(); });
  }

  /// What the destructor frees, with the graph's device current.
  void release_on_its_device() noexcept {
    if (replayed) {  // the last replay (which follows every earlier one) may still use the pool and the slot
      detail::count_synchronization();
      // A graph may die inside another graph's capture: a wait on a stream that is not capturing is allowed then
      // in relaxed mode (replay() is refused during a capture, so last_stream is never the capturing one).
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      (void)cudaStreamSynchronize(last_stream);
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
    }
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    // The pool's blocks join the cache on the last replay's stream, or never replayed, on the caller's stream at
    // the capture (not the capture's own, which dies with this; not the current one, which may be capturing another
    // graph now).
    if (pool) release_graph_pool(pool, last_stream);
    if (arguments.arena) cached_deallocate(arguments.arena);
    if (last_replay) (void)cudaEventDestroy(last_replay);
  }
};

Graph::Graph() noexcept = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

void Graph::capture(const std::function<void()>& body) {
  MT_CHECK(!m_impl, "cuda::Graph::capture: this graph holds a capture already (a graph is captured once; make "
                    "another Graph)");
  MT_CHECK(is_available(), "cuda::Graph::capture: CUDA is unavailable (", unavailable_reason(), ")");
  MT_CHECK(detail::thread_capture().stream == nullptr,
           "cuda::Graph::capture: this thread is capturing a graph already (captures do not nest)");
  auto impl = std::make_unique<Impl>();
  MT_CUDA_CHECK(cudaGetDevice(&impl->device), "cuda::Graph::capture: querying the current device");
  const int device = impl->device;
  impl->stream = detail::owned_stream(device);  // the capture's alone (a pool stream may be another code's)
  const cudaStream_t s = cuda_stream(impl->stream);
  // Before the capture, so not the pool's: replay arguments, the generator's offset first.
  impl->arguments.arena = static_cast<unsigned char*>(cached_allocate(detail::kReplayArgumentBytes, device));
  impl->arguments.used = sizeof(uint64_t);
  auto* const philox_slot = reinterpret_cast<uint64_t*>(impl->arguments.arena);
  impl->last_stream = launch_stream(device);  // where the slots were taken: a first replay elsewhere waits for it
  Generator& generator = default_generator();
  const GeneratorState origin = generator.state();
  impl->philox_seed = origin.seed;
  impl->pool = begin_graph_capture(device, s);
  {
    StreamGuard on(impl->stream);
    const cudaError_t began = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (began != cudaSuccess) end_graph_capture(impl->pool);  // impl's destructor releases the pool
    MT_CUDA_CHECK(began, "cuda::Graph::capture: beginning a capture on cuda:", device);

    detail::thread_capture() = {s, device, origin.seed, origin.offset, philox_slot, &impl->arguments};
    std::exception_ptr failure;
    try {
      body();
    } catch (...) {
      failure = std::current_exception();
    }
    const detail::Capture captured = std::exchange(detail::thread_capture(), {});
    impl->philox_counters = captured.philox_end;
    // Nothing ran: the draws are the replays', and the generator goes back to where the capture began, but only if
    // the captured draws are all it handed out meanwhile. Else (another thread's draws, a CPU draw in the body) it
    // stays: counters someone used are not handed out again, and the replays draw fresh ones instead of the eager
    // steps' (still never another draw's: each replay reserves its own).
    if (captured.philox_drawn == captured.philox_end)
      (void)generator.compare_and_set({origin.seed, origin.offset + captured.philox_end}, origin);
    if (impl->philox_counters > 0) {
      // The counters a replay draws, taken at once (another thread may draw from the generator too). Last in the
      // list, so computed after every argument that may refuse the replay: a refused one takes none.
      impl->arguments.list.push_back({0, sizeof(uint64_t), [g = impl.get()](void* out) {
        // The seed checked and the counters taken in one step (a manual_seed on another thread may come between a
        // check and a reservation); a refused replay takes none.
        Generator& generator = default_generator();
        for (;;) {
          const GeneratorState at = generator.state();
          MT_CHECK(at.seed == g->philox_seed, "cuda::Graph::replay on cuda:", g->device, ": the default generator was "
                   "seeded anew since the capture (seed ", g->philox_seed, ", now ", at.seed, "); the captured "
                   "dropout draws with the old seed: capture again");
          if (generator.compare_and_set(at, {at.seed, at.offset + g->philox_counters})) {
            std::memcpy(out, &at.offset, sizeof at.offset);
            return;
          }
        }
      }});
    }
    const cudaError_t ended = cudaStreamEndCapture(s, &impl->graph);
    end_graph_capture(impl->pool);
    if (failure) {
      (void)cudaGetLastError();       // an invalidated capture's error is the body's exception's cause
      std::rethrow_exception(failure);  // impl's destructor drops the partial graph and its pool
    }
    MT_CUDA_CHECK(ended, "cuda::Graph::capture on cuda:", device,
                  ": ending the capture (the captured code did something a capture cannot record)");
  }
  MT_CUDA_CHECK(cudaGraphInstantiate(&impl->exec, impl->graph, 0), "cuda::Graph::capture: instantiating the graph "
                "on cuda:", device);
  m_impl = std::move(impl);
}

void Graph::replay() {
  MT_CHECK(m_impl, "cuda::Graph::replay: nothing was captured");
  Impl& g = *m_impl;
  MT_CHECK(detail::thread_capture().stream == nullptr, "cuda::Graph::replay on cuda:", g.device,
           ": this thread is capturing a graph (a replay inside a capture is not supported)");
  // The replay arguments first (their functions may refuse the replay): nothing is launched before they are written.
  const detail::ReplayArguments& arguments = g.arguments;
  ArgumentBytes values{};
  for (const detail::ReplayArgument& a : arguments.list) a.current(values.b + a.offset);
  DeviceGuard guard(g.device);
  const cudaStream_t s = launch_stream(g.device);
  if (s != g.last_stream) {  // replays share the pool and the slots: one after the other (the first after the
                             // capture's stream, whose queued work may still read the slots' blocks or the inputs)
    if (!g.last_replay)
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&g.last_replay, cudaEventDisableTiming), "cuda::Graph::replay on cuda:",
                    g.device, ": creating an event");
    MT_CUDA_CHECK(cudaEventRecord(g.last_replay, g.last_stream), "cuda::Graph::replay on cuda:", g.device);
    MT_CUDA_CHECK(cudaStreamWaitEvent(s, g.last_replay, 0), "cuda::Graph::replay on cuda:", g.device);
  }
  if (!arguments.list.empty()) {
    set_arguments_kernel<<<1, 256, 0, s>>>(arguments.arena, values, static_cast<unsigned>(arguments.used));
    MT_CUDA_CHECK_LAUNCH("set_arguments_kernel (", arguments.list.size(), " replay arguments on cuda:", g.device, ")");
  }
  MT_CUDA_CHECK(cudaGraphLaunch(g.exec, s), "cuda::Graph::replay on cuda:", g.device);
  g.last_stream = s;
  g.replayed = true;
}

namespace detail {

void* replay_argument(size_t bytes, std::function<void(void* host)> current) {
  const Capture& c = thread_capture();
  MT_CHECK(c.stream != nullptr && c.arguments != nullptr, "cuda: a replay argument outside a graph capture");
  ReplayArguments& a = *c.arguments;
  const size_t offset = (a.used + 15) / 16 * 16;
  MT_CHECK(bytes <= kReplayArgumentBytes && offset <= kReplayArgumentBytes - bytes, "cuda::Graph::capture on cuda:",
           c.device, ": the captured code asks for more than ", kReplayArgumentBytes, " bytes of arguments that "
           "replays set (", a.list.size(), " so far, e.g. an optimizer's options per param group and dtype)");
  a.list.push_back({offset, bytes, std::move(current)});
  a.used = offset + bytes;
  return a.arena + offset;
}

}  // namespace detail

bool Graph::captured() const noexcept { return m_impl != nullptr; }

size_t Graph::node_count() const {
  if (!m_impl) return 0;
  size_t n = 0;
  MT_CUDA_CHECK(cudaGraphGetNodes(m_impl->graph, nullptr, &n), "cuda::Graph::node_count");
  return n;
}

}  // namespace mixtape::cuda
