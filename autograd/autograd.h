// autograd/autograd.h — grad mode, backward, the functional grad, anomaly
// detection and the precision trace.
//
//   mt::Tensor w = mt::randn({3, 3}).requires_grad_();
//   mt::Tensor loss = mt::sum(mt::matmul(x, w));
//   loss.backward();                 // w.grad() now holds d loss / d w
//   { mt::autograd::NoGradGuard ng; evaluate(); }   // records nothing
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mixtape/core/tensor.h>

namespace mixtape::autograd {

bool grad_enabled();

/// Records nothing on the tape while alive (like torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool m_prev;
};

/// Accumulates d(outputs)/d(leaf) into every leaf's `.grad()`. `grad_outputs`
/// may be empty for one-element outputs (taken as 1). Without `retain_graph`
/// every saved tensor used is freed and the nodes cannot run again.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false);

/// d(outputs)/d(inputs), returned instead of accumulated into `.grad()`.
/// An input the outputs do not depend on throws unless `allow_unused`, which
/// gives an undefined tensor for it.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

/// Live nodes, every thread's tape together (nodes whose outputs are still referenced): one process-wide count,
/// for tests and leak hunts, since a node may outlive the thread that recorded it and die on another.
int64_t tape_size();

/// While alive, the first non-finite value produced by a forward op (an
/// output, or an input that came from outside the tape) or by a backward
/// (the gradient of an input) throws mixtape::Error naming the op, its dtype,
/// the direction and which input or output.
class DetectAnomaly {
 public:
  DetectAnomaly();
  ~DetectAnomaly();
  DetectAnomaly(const DetectAnomaly&) = delete;
  DetectAnomaly& operator=(const DetectAnomaly&) = delete;

 private:
  bool m_prev;
};
bool anomaly_enabled();

/// One executed forward op: its name and the dtype it ran in.
struct TraceEntry {
  std::string op;
  DType dtype;
  std::string kernel;  // the kernel a backend noted for it ("wmma f16"), or empty
};

/// Records every forward op run on this thread while alive (nested traces
/// each see everything): which op ran in which dtype, casts included.
class PrecisionTrace {
 public:
  PrecisionTrace();
  ~PrecisionTrace();
  PrecisionTrace(const PrecisionTrace&) = delete;
  PrecisionTrace& operator=(const PrecisionTrace&) = delete;
  const std::vector<TraceEntry>& entries() const { return m_entries; }
  /// "linear:f16 relu:f16 softmax:f32"; a noted kernel follows in brackets:
  /// "linear:f16[wmma f16]" (CUDA matmuls say which GEMM ran).
  std::string str() const;
  /// Adds an entry here and to every enclosing trace.
  void record(const char* op, DType dtype, const char* kernel = nullptr);

 private:
  std::vector<TraceEntry> m_entries;
  PrecisionTrace* m_prev;
};

}  // namespace mixtape::autograd
