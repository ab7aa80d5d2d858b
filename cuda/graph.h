// cuda/graph.h — CUDA graphs: the kernels a piece of code launches, captured once and replayed for the cost of one
// launch (PyTorch's torch.cuda.CUDAGraph).
//
// The one design idea: a capture runs the code on the host as usual — the tape records, the optimizer walks its
// parameters — but every kernel and device copy it issues is recorded into the graph instead of running, with its
// arguments as they are at the capture: pointers, shapes, scalars. So a replay repeats exactly that work on exactly
// that memory. What the captured code allocates comes from a memory pool of the graph and stays reserved for the
// replays (its tensors may die: their memory does not go to anyone else while the graph lives); inputs are tensors
// made before the capture that the program overwrites in place (copy_) before each replay, and outputs are tensors
// the capture made that the program keeps. Dropout draws from the default generator as eager code would: the
// capture takes no counters from it, each replay takes the ones its masks need, so replays draw the masks eager
// steps would have drawn. An optimizer's options (lr, momentum, betas, eps, weight_decay, ...) are likewise read at
// each replay as the program has set them by then, so a learning-rate schedule stepped between replays works as it
// does between eager steps (PyTorch needs capturable=True and a tensor lr for that); an option that chose the
// captured kernels (a momentum of 0, amsgrad) must keep its value, and the optimizer must outlive the replays.
// Work that the device cannot repeat on its own is refused with a mixtape::Error during the capture: a copy to or
// from the host (item(), .cpu()), a host wait, a draw from another generator, randperm; so is a switch to another
// stream (a graph records the capture's stream only).
//
//   mt::Tensor x = ..., y = ...;              // the static inputs, on the GPU
//   for (int i = 0; i < 3; ++i) step(x, y);   // warm up eagerly: optimizer state, scaler state, caches
//   mt::cuda::Graph graph;
//   graph.capture([&] { step(x, y); });       // records one step, runs nothing
//   for (auto& [bx, by] : batches) {
//     x.copy_(bx); y.copy_(by);                // the next batch into the static inputs
//     graph.replay();                          // one launch: forward, backward, unscale, optimizer step, scale update
//     schedule.step();                         // the learning rate of the next replay
//   }
#pragma once

#include <functional>
#include <memory>

namespace mixtape::cuda {

class Graph {
 public:
  /// An empty graph; capture() fills it.
  Graph() noexcept;
  /// Waits for the device to finish the graph's replays, then gives its memory back to the cache.
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Runs `body` on the host with the current device's kernels and device copies recorded into this graph instead
  /// of executed (on a stream of its own: the work queued before is not part of it). Throws mixtape::Error when the
  /// graph holds a capture already, when CUDA is unavailable, when `body` throws (the capture is dropped and the
  /// exception passes through), or when `body` does what a graph cannot replay (see the top of this file).
  void capture(const std::function<void()>& body);

  /// Launches the captured work on the current stream of the graph's device, ordered after the work queued there
  /// before and, when its last replay ran on another stream, after the work queued on that one (with dropout: after
  /// the default generator's
  /// offset is written for it); the host does not wait. Throws mixtape::Error when nothing was captured, when this
  /// thread is capturing a graph, or when the captured work draws dropout masks and the default generator was
  /// seeded anew since the capture (its seed is an argument of the captured kernels), when a captured optimizer was
  /// destroyed, or when one of its options that chose the captured kernels changed (the top of this file). When
  /// something else drew from the default generator while the capture ran (another thread), the replays' masks are
  /// fresh draws, not the ones eager steps would have drawn.
  void replay();

  /// Whether capture() succeeded.
  bool captured() const noexcept;

  /// Kernels and copies the capture recorded (the graph's nodes); 0 before a capture.
  size_t node_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace mixtape::cuda
