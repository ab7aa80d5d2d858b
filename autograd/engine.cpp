// autograd/engine.cpp — thread state, recording, and the backward walk.
//
// The tape is the order nodes were recorded in: each node's sequence_nr is
// its position. backward() collects the nodes that lead to the outputs and
// runs them newest first — a consumer is always recorded after what it
// consumes, so every node has all its output gradient when its turn comes.
#include <mixtape/autograd/function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <mixtape/autograd/hooks.h>

namespace mixtape {
namespace autograd {

namespace {

std::atomic<int64_t> g_live_nodes{0};
std::atomic<uint64_t> g_next_sequence_nr{0};
constinit OpHooks g_op_hooks{};

AutogradMeta* meta_of(const Tensor& t) { return t.defined() ? t.impl()->autograd.get() : nullptr; }

}  // namespace

namespace detail {

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_of(t);
  return m && m->requires_grad;
}

bool has_grad_fn(const Tensor& t) {
  const AutogradMeta* m = meta_of(t);
  return m && m->grad_fn;
}

Edge edge_to(const Tensor& t) {
  if (!t.defined()) return {};
  const std::shared_ptr<AutogradMeta>& m = t.impl()->autograd;
  if (!m || !m->requires_grad) return {};
  if (m->grad_fn) return {m->grad_fn, nullptr};
  return {nullptr, m, t.dtype()};
}

void record(const std::shared_ptr<Node>& node, Tensor& out) {
  node->dtype = out.dtype();
  node->shape = out.shape();
  node->device = out.device();
  node->sequence_nr = g_next_sequence_nr++;
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = node;
  out.impl()->autograd = std::move(meta);
}

std::shared_ptr<NodeObservation> observe_forward(const char* op, std::span<const Tensor> inputs, const Tensor& out,
                                                 const char* kernel, bool recorded) {
  TapeObserver* observer = state().observer;
  const ObserverScope unobserved(nullptr);  // what the observer computes is not the model's
  const NoGradGuard no_grad;
  return observer->on_forward(op, inputs, out, kernel, recorded);
}

void throw_out_of_host_memory(const char* op, const std::vector<Tensor>& inputs) {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) {
    os << (i ? ", " : "");
    if (inputs[i].defined()) os << inputs[i].shape() << ' ' << inputs[i].dtype();
    else os << "undefined";
  }
  MT_ERROR(op, ": out of host memory for its working space (inputs ", os.str(), ")");
}

void check_finite(const Tensor& t, const char* op, const char* direction, const std::string& what) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return;
  // The check's own kernels are not the model's ops: no recording, no checking of themselves.
  ThreadState& st = state();
  ThreadState saved = st;
  st.anomaly = false;
  st.grad_enabled = false;
  struct Restore {
    ThreadState& st;
    const ThreadState& saved;
    ~Restore() {
      st.anomaly = saved.anomaly;
      st.grad_enabled = saved.grad_enabled;
    }
  } restore{st, saved};
  // max(|x|) is finite exactly when every element is (NaN propagates through max).
  const double v = op_hooks().max_abs(t);
  MT_CHECK(std::isfinite(v), "anomaly: ", direction, " of ", op, " (", t.dtype(), ") produced a non-finite value in ",
           what, " (shape ", t.shape(), ", max |x| = ", v, ")");
}

}  // namespace detail

void install_op_hooks(const OpHooks& hooks) noexcept { g_op_hooks = hooks; }

const OpHooks& op_hooks() {
  MT_CHECK(g_op_hooks.accumulate && g_op_hooks.max_abs && g_op_hooks.take_noted_kernel,
           "autograd: the op layer has not installed its hooks (ops/tape_hooks.cpp is not linked in)");
  return g_op_hooks;
}

// ---- Ctx ---------------------------------------------------------------------------

void Ctx::save(const Tensor& t) {
  if (!recording) return;
  if (!t.defined()) {
    m_saved.push_back({Tensor(), 0, Tensor(), DType::kF32});
    return;
  }
  const AutogradMeta* meta = meta_of(t);
  if (meta && meta->autocast_source.defined()) {  // a parameter's autocast copy: keep the parameter instead
    const Tensor& source = meta->autocast_source;
    m_saved.push_back({Tensor(), source.version(), source, t.dtype()});
    return;
  }
  // A detached alias: same storage and view, no autograd link (no cycle through an output).
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd.reset();
  m_saved.push_back({Tensor(std::move(impl)), t.version(), Tensor(), DType::kF32});
}

Tensor Ctx::saved(size_t i) const {
  MT_CHECK(!m_released, op_name, ": its saved tensors were already freed by a backward; call backward with "
                                 "retain_graph=true to run it again");
  MT_CHECK(i < m_saved.size(), op_name, ": saved tensor ", i, " requested, ", m_saved.size(), " saved");
  const Saved& s = m_saved[i];
  if (s.source.defined()) {
    MT_CHECK(s.source.version() == s.version, op_name, ": saved tensor ", i, " (the ", s.dtype,
             " autocast copy of a parameter of shape ", s.source.shape(), ") cannot be made again: the parameter was "
             "modified in place after the forward (version ", s.source.version(), ", saved at version ", s.version,
             "); an optimizer step belongs after backward");
    return raw::to(s.source, s.dtype);  // the forward's bits: one rounding of each element, as then
  }
  MT_CHECK(!s.tensor.defined() || s.tensor.version() == s.version, op_name, ": saved tensor ", i, " (shape ",
           s.tensor.shape(), ", ", s.tensor.dtype(), ") was modified in place after it was saved for backward (version ",
           s.tensor.version(), ", saved at version ", s.version, ")");
  return s.tensor;
}

// ---- grad mode, anomaly, trace --------------------------------------------------------

bool grad_enabled() { return detail::state().grad_enabled; }
NoGradGuard::NoGradGuard() : m_prev(detail::state().grad_enabled) { detail::state().grad_enabled = false; }
NoGradGuard::~NoGradGuard() { detail::state().grad_enabled = m_prev; }

bool anomaly_enabled() { return detail::state().anomaly; }
DetectAnomaly::DetectAnomaly() : m_prev(detail::state().anomaly) { detail::state().anomaly = true; }
DetectAnomaly::~DetectAnomaly() { detail::state().anomaly = m_prev; }

ObserverScope::ObserverScope(TapeObserver* observer) : m_prev(detail::state().observer) {
  detail::state().observer = observer;
}
ObserverScope::~ObserverScope() { detail::state().observer = m_prev; }

PrecisionTrace::PrecisionTrace() : m_prev(detail::state().trace) { detail::state().trace = this; }
PrecisionTrace::~PrecisionTrace() { detail::state().trace = m_prev; }
void PrecisionTrace::record(const char* op, DType dtype, const char* kernel) {
  m_entries.push_back({op, dtype, kernel ? kernel : ""});
  if (m_prev) m_prev->record(op, dtype, kernel);
}
std::string PrecisionTrace::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < m_entries.size(); ++i) {
    os << (i ? " " : "") << m_entries[i].op << ':' << m_entries[i].dtype;
    if (!m_entries[i].kernel.empty()) os << '[' << m_entries[i].kernel << ']';
  }
  return os.str();
}

int64_t tape_size() { return g_live_nodes.load(); }

// ---- the backward walk --------------------------------------------------------------------

namespace {

/// A gradient being summed over the edges that reach one place. The first term is kept as it came (it may alias a
/// tensor another edge also received: add's backward passes dy to both inputs); adding the second makes a tensor the
/// tape owns, and every later term is added into it in place, without an allocation.
struct GradSum {
  Tensor t;
  bool owned = false;
};

/// Adds `g` into `sum`, in the sum's dtype.
void accumulate(GradSum& sum, Tensor g) {
  if (!sum.t.defined()) {
    sum.t = std::move(g);
    return;
  }
  if (g.dtype() != sum.t.dtype()) g = g.to(sum.t.dtype());
  sum.t = op_hooks().accumulate(sum.t, g, sum.owned);
  sum.owned = true;
}

/// Where the gradients of the requested inputs of grad() are collected.
struct Capture {
  std::unordered_map<const AutogradMeta*, size_t> leaves;  // leaf meta -> index into results
  std::unordered_map<const Node*, size_t> nodes;           // producer of a non-leaf input -> index
  std::vector<GradSum> results;
};

/// Whether nothing but `g` itself reaches its memory: one handle on its TensorImpl, one TensorImpl on its storage
/// (no view), no autograd history, contiguous. Such a gradient can become a leaf's .grad() without a copy.
bool sole_owner(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.impl()->autograd == nullptr &&
         g.is_contiguous();
}

/// A leaf's .grad() is its own: the first gradient becomes it, copied unless nothing else holds it (PyTorch's
/// AccumulateGrad steals such a gradient too; a backward's fresh result is the usual case), and later ones are added
/// in place (a handle taken on .grad() before a second backward sees the sum).
void accumulate_into_leaf(AutogradMeta& leaf, Tensor g) {
  std::lock_guard lock(leaf.grad_mutex);  // another thread's backward may reach this leaf too
  if (leaf.grad.defined()) {
    MT_CHECK(g.shape() == leaf.grad.shape(), "backward: gradient of shape ", g.shape(),
             " does not match the leaf's gradient of shape ", leaf.grad.shape());
    leaf.grad = op_hooks().accumulate(leaf.grad, g.dtype() == leaf.grad.dtype() ? g : g.to(leaf.grad.dtype()), true);
    return;
  }
  leaf.grad = sole_owner(g) ? std::move(g) : g.clone();
}

void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
                  Capture* capture) {
  MT_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "backward: got ", grad_outputs.size(),
           " gradients for ", outputs.size(), " outputs");
  NoGradGuard no_grad;
  amp::Autocast no_autocast(DType::kF16, false);  // each backward runs in the dtype its node recorded
  const ObserverScope unobserved(nullptr);  // the ops a backward runs are not the model's (nodes report their own)
  const bool anomaly = anomaly_enabled();
  // Ops a backward calls are not part of the forward pass a trace describes.
  struct SuspendTrace {
    PrecisionTrace* saved = detail::state().trace;
    SuspendTrace() { detail::state().trace = nullptr; }
    ~SuspendTrace() { detail::state().trace = saved; }
  } suspend_trace;

  std::unordered_map<Node*, GradSum> pending;  // node -> gradient of its output so far
  std::vector<std::shared_ptr<Node>> roots;

  auto deliver_to_leaf = [&](const std::shared_ptr<AutogradMeta>& leaf, Tensor g, DType leaf_dtype) {
    if (g.dtype() != leaf_dtype) g = g.to(leaf_dtype);
    if (capture) {
      auto it = capture->leaves.find(leaf.get());
      if (it != capture->leaves.end()) accumulate(capture->results[it->second], std::move(g));
      return;
    }
    accumulate_into_leaf(*leaf, std::move(g));
  };

  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    MT_CHECK(out.defined(), "backward: output ", i, " is undefined");
    MT_CHECK(detail::requires_grad(out), "backward: output ", i, " (shape ", out.shape(),
             ") does not require grad and has no grad_fn (was it computed under NoGradGuard, or from tensors "
             "that do not require grad?)");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      MT_CHECK(out.numel() == 1, "backward: grad can be implicitly created only for one-element outputs; output ",
               i, " has shape ", out.shape());
      g = ones(out.shape(), TensorOptions(out.dtype()).device(out.device()));
    } else {
      MT_CHECK(g.shape() == out.shape(), "backward: gradient of shape ", g.shape(), " for output ", i,
               " of shape ", out.shape());
    }
    AutogradMeta* m = out.impl()->autograd.get();
    if (m->grad_fn) {
      accumulate(pending[m->grad_fn.get()], g);
      roots.push_back(m->grad_fn);
    } else {
      deliver_to_leaf(out.impl()->autograd, g, out.dtype());
    }
  }

  // The nodes that lead to the outputs, newest first.
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& r : roots)
    if (seen.insert(r.get()).second) stack.push_back(r.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const Edge& e : n->next_edges)
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->sequence_nr > b->sequence_nr; });

  for (Node* n : order) {
    auto it = pending.find(n);
    if (it == pending.end()) {  // nothing flows through this node
      if (!retain_graph) n->release_saved();
      continue;
    }
    Tensor g = std::move(it->second.t);
    pending.erase(it);
    if (capture) {
      auto c = capture->nodes.find(n);
      if (c != capture->nodes.end()) accumulate(capture->results[c->second], g);
    }
    MT_CHECK(!n->released(), "backward: trying to backward through ", n->name(),
             " a second time, but its saved tensors were already freed; call backward with retain_graph=true the "
             "first time");
    if (g.dtype() != n->dtype) g = g.to(n->dtype);
    if (n->observation) [[unlikely]] n->observation->before_backward();
    Grads grads = n->backward(g);
    MT_CHECK(grads.size() == n->next_edges.size(), n->name(), ": backward returned ", grads.size(),
             " gradients for ", n->next_edges.size(), " inputs");
    if (n->observation) [[unlikely]] {
      NoGradGuard no_grad;  // what the observer computes is not the model's
      n->observation->on_backward(g, grads, n->next_edges);
    }
    if (!retain_graph) n->release_saved();
    for (size_t i = 0; i < grads.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid() || !grads[i].defined()) continue;
      if (anomaly) detail::check_finite(grads[i], n->name(), "backward", "the gradient of input " + std::to_string(i));
      if (e.node) {
        MT_CHECK(grads[i].shape() == e.node->shape, n->name(), ": backward gave input ", i, " a gradient of shape ",
                 grads[i].shape(), " but that input has shape ", e.node->shape);
        Tensor gi = grads[i].dtype() == e.node->dtype ? grads[i] : grads[i].to(e.node->dtype);
        accumulate(pending[e.node.get()], std::move(gi));
      } else {
        // Moved out, so that a fresh gradient held nowhere else becomes the leaf's .grad() without a copy.
        deliver_to_leaf(e.leaf, std::move(grads[i]), e.leaf_dtype);  // in the leaf's dtype
      }
    }
  }
}

}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  run_backward(outputs, grad_outputs, retain_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  Capture capture;
  capture.results.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    MT_CHECK(detail::requires_grad(in), "grad: input ", i, " (shape ", in.shape(), ") does not require grad");
    AutogradMeta* m = in.impl()->autograd.get();
    if (m->grad_fn)
      capture.nodes[m->grad_fn.get()] = i;
    else
      capture.leaves[m] = i;
  }
  run_backward(outputs, grad_outputs, retain_graph, &capture);
  std::vector<Tensor> results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& r = capture.results[i].t;
    MT_CHECK(r.defined() || allow_unused, "grad: input ", i, " (shape ", inputs[i].shape(),
             ") was not used to compute the outputs; pass allow_unused=true to get an undefined gradient for it");
    results.push_back(r.defined() && r.dtype() != inputs[i].dtype() ? r.to(inputs[i].dtype()) : r);
  }
  return results;
}

}  // namespace autograd

Node::Node() { ++autograd::g_live_nodes; }
Node::~Node() {
  --autograd::g_live_nodes;
  // A node owns the nodes before it through its edges, so dropping the last tensor of a chain of 10^6 ops would
  // destroy them recursively, one stack frame each. Instead the nodes only this one owns are moved onto a local
  // stack, and each is emptied of its own sole-owned predecessors before it dies: no destructor recurses.
  std::vector<std::shared_ptr<Node>> orphans;
  auto adopt = [&orphans](Node& n) {
    for (autograd::Edge& e : n.next_edges)
      if (e.node && e.node.use_count() == 1) orphans.push_back(std::move(e.node));
  };
  adopt(*this);
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    adopt(*n);
  }  // n dies here, its sole-owned edges already taken
}

}  // namespace mixtape
