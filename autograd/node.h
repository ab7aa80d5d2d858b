// autograd/node.h — what the tape records: nodes, their edges and saved tensors.
//
// A node is one executed op: its backward, the edges to where its inputs came
// from (another node, or a leaf's gradient), the tensors it saved and the
// dtype it ran in. Saved tensors are stored as detached aliases (same storage,
// no autograd link), so an output saved by its own node makes no cycle, and
// each remembers the storage version it was saved at.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <mixtape/core/tensor.h>

namespace mixtape {

class Node;

/// Autograd state of one tensor (core holds it opaquely in TensorImpl::autograd).
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                      // accumulated gradient of a leaf, in the leaf's dtype
  std::shared_ptr<Node> grad_fn;    // the node that produced this tensor; null for leaves
  // On autocast's cached cast of a parameter (an f32 leaf that requires grad): that parameter, as a detached alias.
  // An op that saves the cast for backward saves this instead (Ctx::save), and backward casts it again.
  Tensor autocast_source;
  // Backward passes on several threads may reach the same leaf: each one's addition into `grad` (and set_grad)
  // holds this lock, so none is lost. Reading grad() while another thread's backward writes it is a race, as in
  // PyTorch: join the threads first.
  std::mutex grad_mutex;
};

namespace autograd {

class NodeObservation;

/// Where the gradient of one input of a node goes: into another node's output
/// gradient, or into a leaf's `.grad()`. Both empty: the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<AutogradMeta> leaf;
  DType leaf_dtype = DType::kF32;  // a leaf's dtype when recorded: its gradient arrives in it
  bool valid() const { return node != nullptr || leaf != nullptr; }
};

/// Gradients of an op's inputs, in input order; undefined where an input needs none.
using Grads = std::vector<Tensor>;

/// Per-node storage of an op's forward, read by its backward. Ops that keep
/// more than tensors derive from it: `struct Ctx : autograd::Ctx { Shape input_shape; };`
///
/// Autocast's f16/bf16 copy of a parameter is not kept: the node keeps the f32 parameter (its module holds it
/// anyway) and casts it again each time backward asks for it, the same bits one kernel later. Between forward and
/// backward a model then holds its low-precision activations and no second copy of its weights (PyTorch keeps the
/// copies: a 4096-wide layer's is 32 MiB in f16).
class Ctx {
 public:
  /// Keeps `t` for backward (a detached alias plus its storage version), or for autocast's cast of a parameter the
  /// parameter (Ctx's comment). Undefined tensors are kept as such.
  void save(const Tensor& t);
  template <class... Ts> void save_for_backward(const Ts&... ts) { (save(ts), ...); }
  /// The i-th saved tensor (a new cast of the parameter for a copy autocast made of one); throws naming the op when
  /// it (or that parameter) was modified in place since it was saved.
  Tensor saved(size_t i) const;
  size_t num_saved() const { return m_saved.size(); }
  /// Whether input `i` of the op needs a gradient (backward may skip the others).
  bool needs_input_grad(size_t i) const { return i < input_needs_grad.size() && input_needs_grad[i]; }

  void release() { m_saved.clear(); m_released = true; }
  bool released() const { return m_released; }

  // Set by apply<Op> before the forward runs.
  const char* op_name = "?";
  bool recording = false;  // false: no node will be kept, so save() keeps nothing
  std::vector<bool> input_needs_grad;
  /// Autocast left this fp32 op's f16/bf16 inputs as they are, for its kernels to widen on load
  /// (Op::kWidensOnLoad): the op returns f32 where it would return their dtype, as if they had been cast.
  bool widened_on_load = false;

 private:
  struct Saved {
    Tensor tensor;         // undefined for a parameter's copy
    uint64_t version = 0;  // the storage version of what was saved: the tensor, or the parameter
    Tensor source;         // for a parameter's copy: the parameter, cast to `dtype` by saved()
    DType dtype = DType::kF32;
  };
  std::vector<Saved> m_saved;
  bool m_released = false;
};

}  // namespace autograd

/// One recorded op. Subclassed once, by the template in autograd/function.h.
class Node {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  virtual const char* name() const = 0;
  /// Gradients for each input given the gradient of the output (already in `dtype`).
  virtual autograd::Grads backward(const Tensor& grad_output) = 0;
  /// Frees what the node saved; a later backward through it throws.
  virtual void release_saved() = 0;
  virtual bool released() const = 0;

  std::vector<autograd::Edge> next_edges;  // one per tensor input, in order
  DType dtype = DType::kF32;               // the dtype the op ran in (its output's)
  Shape shape;                             // the output's shape
  Device device;                           // the output's device
  uint64_t sequence_nr = 0;                // position on the thread's tape
  // What a tape observer (autograd/observer.h) attached at the forward; null unless one was installed.
  std::shared_ptr<autograd::NodeObservation> observation;
};

}  // namespace mixtape
