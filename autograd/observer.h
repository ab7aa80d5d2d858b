// autograd/observer.h — what an observer of the tape sees: each op's forward output, and what each recorded node's
// backward received and produced (internal: amp::Inspect in optim/ is the one observer).
//
// The one design idea: the tape does not know what is being measured. An installed observer is called after every
// model op's forward (not the ops nested inside one) and may hand back an observation, which the node carries; the
// backward walk gives the observation the node's gradients. When no observer is installed, the cost is one null
// test per op and one per node in backward.
#pragma once

#include <memory>
#include <span>

#include <mixtape/autograd/node.h>
#include <mixtape/core/tensor.h>

namespace mixtape::autograd {

/// Attached to a node at its forward; told what the node's backward saw and produced.
class NodeObservation {
 public:
  virtual ~NodeObservation() = default;
  /// Just before the node's backward runs (a profiler starts its clock).
  virtual void before_backward() {}
  /// `grad_output`: the gradient the node's backward received (in the dtype the op ran in); `grads`: what it
  /// produced, one per input (undefined where an input needs none); `edges[i]` says where grads[i] goes.
  virtual void on_backward(const Tensor& grad_output, const Grads& grads, std::span<const Edge> edges) = 0;
};

class TapeObserver {
 public:
  virtual ~TapeObserver() = default;
  /// Just before a model op's forward runs (a profiler starts its clock).
  virtual void before_forward() {}
  /// After a model op's forward. `inputs`: its tensor arguments as it ran them (after autocast); `kernel`: what the
  /// backend noted ("wmma f16"), or nullptr; `recorded`: a node follows, carrying what this returns (may be null).
  /// Runs with gradient recording off and without this observer installed: what it computes is not the model's.
  virtual std::shared_ptr<NodeObservation> on_forward(const char* op, std::span<const Tensor> inputs,
                                                      const Tensor& output, const char* kernel, bool recorded) = 0;
};

/// Installs `observer` on this thread while alive; an enclosing one comes back after (observers do not nest: the
/// innermost alone sees the ops).
class ObserverScope {
 public:
  explicit ObserverScope(TapeObserver* observer);
  ~ObserverScope();
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  TapeObserver* m_prev;
};

}  // namespace mixtape::autograd
