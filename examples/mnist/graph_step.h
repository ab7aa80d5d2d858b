// examples/mnist/graph_step.h — a training step that, with --cuda-graph, runs as replays of one CUDA graph (what the
// example and bench/mnist_gpu.cpp both do).
//
// The first kWarmupSteps calls run the step eagerly: the optimizer's and the scaler's state exist after them, and
// every kernel has made its one-time queries, so a capture finds nothing left to create on the host's side. The
// next call captures one step on copies of its batch (the graph's inputs) and replays it; every later call copies
// its batch into those inputs and replays. A replay repeats the capture's kernels with the capture's arguments, but
// for the optimizer's options, which it reads anew (the schedule steps between calls); dropout must draw from the
// default generator.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include <mixtape/mixtape.h>

namespace mnist {

namespace mt = mixtape;

class GraphedStep {
 public:
  /// One training step on a batch (x, y), returning its loss on the device.
  using Step = std::function<mt::Tensor(const mt::Tensor& x, const mt::Tensor& y)>;
  static constexpr int64_t kWarmupSteps = 3;

  /// `graphed`: replay a captured step after kWarmupSteps eager ones; otherwise every call runs `step` eagerly.
  GraphedStep(Step step, bool graphed) : m_step(std::move(step)), m_graphed(graphed) {}

  /// The captured step's kernels and copies (0 before the capture, or when not graphed).
  size_t node_count() const { return m_graph.captured() ? m_graph.node_count() : 0; }

  /// Runs one step on (x, y) and returns its loss (with a graph: the graph's loss tensor, overwritten by the next
  /// replay).
  mt::Tensor operator()(const mt::Tensor& x, const mt::Tensor& y) {
    if (!m_graphed || m_calls++ < kWarmupSteps) return m_step(x, y);
    if (!m_graph.captured()) {
      m_x = x.clone();
      m_y = y.clone();
      m_graph.capture([&] { m_loss = m_step(m_x, m_y); });
    } else {
      m_x.copy_(x);
      m_y.copy_(y);
    }
    m_graph.replay();
    return m_loss;
  }

 private:
  Step m_step;
  bool m_graphed;
  int64_t m_calls = 0;
  mt::cuda::Graph m_graph;
  mt::Tensor m_x, m_y, m_loss;  // the graph's input batch and its loss
};

}  // namespace mnist
