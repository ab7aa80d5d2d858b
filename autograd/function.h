// autograd/function.h — `apply<Op>`: the one place an op meets the tape.
//
// An op is a struct holding its name, precision category, forward and
// backward (STYLE.md §1). `apply<Op>(args...)` does everything around them,
// in this order: apply the op's precision category to its tensor arguments
// (autocast, promotion, the cast cache), run the forward with recording off,
// record a node when grad mode is on and an input requires grad, then feed
// the precision trace and anomaly mode. Ops never touch the tape themselves.
#pragma once

#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/node.h>
#include <mixtape/autograd/observer.h>
#include <mixtape/autograd/precision.h>
#include <mixtape/autograd/registry.h>
#include <mixtape/core/raw.h>
#include <mixtape/autograd/hooks.h>

namespace mixtape::autograd {

namespace detail {

/// Per-thread state of the tape; everything apply<Op> needs to read cheaply.
struct ThreadState {
  bool grad_enabled = true;
  bool anomaly = false;
  bool autocast = false;
  DType autocast_dtype = DType::kF16;
  int autocast_depth = 0;
  PrecisionTrace* trace = nullptr;
  TapeObserver* observer = nullptr;  // amp::Inspect, when one is installed (autograd/observer.h)
  bool has_scoped_overrides = false;
  bool in_forward = false;  // inside an op's forward: nested ops are implementation, not model
};
ThreadState& state();

/// The dtype `t` must become for an op of category `p` whose tensor inputs promote to `promoted`.
DType target_dtype(Precision p, DType t, DType promoted);
/// A differentiable cast of `t` to `dtype`, through the autocast cache when `t` is an f32 leaf that requires grad.
Tensor autocast_cast(const Tensor& t, DType dtype);
/// Gives `out` its node and puts the node on the tape.
void record(const std::shared_ptr<Node>& node, Tensor& out);
/// Edge to where the gradient of `t` goes (empty when `t` needs none).
Edge edge_to(const Tensor& t);
bool requires_grad(const Tensor& t);
bool has_grad_fn(const Tensor& t);
/// Anomaly mode: throws when `t` holds a non-finite value (`what` says where: "output", "input 1", ...).
void check_finite(const Tensor& t, const char* op, const char* direction, const std::string& what);
/// Calls the installed observer's on_forward with recording and the observer itself off.
std::shared_ptr<NodeObservation> observe_forward(const char* op, std::span<const Tensor> inputs, const Tensor& out,
                                                 const char* kernel, bool recorded);
/// A std::bad_alloc in `op`'s forward (a kernel's host scratch, the one allocation not checked ahead) as an Error
/// naming the op and its inputs.
[[noreturn]] void throw_out_of_host_memory(const char* op, const std::vector<Tensor>& inputs);

// ---- walking the tensor arguments of an op ----
inline void visit_tensors(const Tensor& t, auto&& f) { f(t); }
inline void visit_tensors(const std::vector<Tensor>& ts, auto&& f) {
  for (const Tensor& t : ts) f(t);
}
template <class A>
  requires(!std::is_same_v<std::decay_t<A>, Tensor> && !std::is_same_v<std::decay_t<A>, std::vector<Tensor>>)
inline void visit_tensors(const A&, auto&&) {}

/// Whether Op's kernels read f16/bf16 inputs as f32 (the exact widening on load, f32 arithmetic, each output
/// rounded once), so that under autocast its fp32 category leaves such inputs as they are: the values a cast to f32
/// would give, without the cast's copy and its two launches (forward and backward). Op declares
/// `static constexpr bool kWidensOnLoad = true;` and returns f32 when its Ctx says `widened_on_load`.
template <class Op>
constexpr bool widens_on_load() {
  if constexpr (requires { Op::kWidensOnLoad; }) return Op::kWidensOnLoad;
  else return false;
}

inline Tensor cast_arg(const Tensor& t, Precision p, DType promoted) {
  if (!t.defined()) return t;
  DType want = target_dtype(p, t.dtype(), promoted);
  return want == t.dtype() ? t : autocast_cast(t, want);
}
inline std::vector<Tensor> cast_arg(const std::vector<Tensor>& ts, Precision p, DType promoted) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(cast_arg(t, p, promoted));
  return out;
}
template <class A>
  requires(!std::is_same_v<std::decay_t<A>, Tensor> && !std::is_same_v<std::decay_t<A>, std::vector<Tensor>>)
inline const A& cast_arg(const A& a, Precision, DType) {
  return a;
}

/// Around the forward of an op: ops it calls are its implementation, so they
/// record nothing, are not autocast (only promoted), traced or anomaly-checked.
class ForwardScope {
 public:
  ForwardScope() : m_saved(state()) {
    ThreadState& st = state();
    st.grad_enabled = false;
    st.autocast = false;
    st.in_forward = true;
  }
  ~ForwardScope() {
    ThreadState& st = state();
    st.grad_enabled = m_saved.grad_enabled;
    st.autocast = m_saved.autocast;
    st.in_forward = m_saved.in_forward;
  }

 private:
  ThreadState m_saved;
};

}  // namespace detail

/// A recorded Op: its Ctx and the static backward.
template <class Op>
class OpNode final : public Node {
 public:
  typename Op::Ctx ctx;
  const char* name() const override { return Op::kName; }
  Grads backward(const Tensor& grad_output) override { return Op::backward(ctx, grad_output); }
  void release_saved() override { ctx.release(); }
  bool released() const override { return ctx.released(); }
};

/// Runs `Op` on `args` with its precision rule, recording a node when needed.
template <class Op, class... Args>
Tensor apply(const Args&... args) {
  static_assert(Op::kPrecision != Precision::kUnset, "every op declares a precision category");
  static const int op_id = register_op<Op>();
  detail::ThreadState& st = detail::state();
  const OpNameScope name_scope(Op::kName);  // errors beneath (an allocation, a cast) name this op

  // 1. The precision rule, on the tensor arguments.
  const Precision p = effective_precision(op_id, Op::kPrecision);
  DType promoted = DType::kBool;
  bool any_tensor = false, any_reduced = false;
  (detail::visit_tensors(args,
                         [&](const Tensor& t) {
                           if (!t.defined()) return;
                           promoted = any_tensor ? promote_types(promoted, t.dtype()) : t.dtype();
                           any_tensor = true;
                           any_reduced = any_reduced || is_reduced_float(t.dtype());
                         }),
   ...);
  // An fp32 op whose kernels widen f16/bf16 on load reads them as they are (detail::widens_on_load).
  const bool widened_on_load =
      detail::widens_on_load<Op>() && p == Precision::kFp32 && st.autocast && any_reduced;
  const Precision cast_p = widened_on_load ? Precision::kPassthrough : p;
  auto cast_args = std::tuple<decltype(detail::cast_arg(args, cast_p, promoted))...>(
      detail::cast_arg(args, cast_p, promoted)...);

  // 2. Does the result need a node?
  bool needs_node = false;
  if (st.grad_enabled)
    std::apply([&](const auto&... a) { (detail::visit_tensors(a, [&](const Tensor& t) {
                                           needs_node = needs_node || detail::requires_grad(t);
                                         }), ...); },
               cast_args);

  std::shared_ptr<OpNode<Op>> node;
  typename Op::Ctx local_ctx;
  typename Op::Ctx* ctx = &local_ctx;
  if (needs_node) {
    node = std::make_shared<OpNode<Op>>();
    ctx = &node->ctx;
    std::apply([&](const auto&... a) { (detail::visit_tensors(a, [&](const Tensor& t) {
                                           node->next_edges.push_back(detail::edge_to(t));
                                           ctx->input_needs_grad.push_back(node->next_edges.back().valid());
                                         }), ...); },
               cast_args);
  }
  ctx->op_name = Op::kName;
  ctx->recording = needs_node;
  ctx->widened_on_load = widened_on_load;

  const bool nested = st.in_forward;
  if (st.anomaly && !nested) {
    int i = 0;
    std::apply([&](const auto&... a) { (detail::visit_tensors(a, [&](const Tensor& t) {
                                           if (t.defined() && !detail::has_grad_fn(t))
                                             detail::check_finite(t, Op::kName, "forward", "input " + std::to_string(i));
                                           ++i;
                                         }), ...); },
               cast_args);
  }

  // 3. The forward, recording nothing itself. A kernel it notes (kernels::note_kernel) goes into the trace.
  const bool watched = (st.trace || st.observer) && !nested;
  if (watched) [[unlikely]] {
    op_hooks().take_noted_kernel();
    if (st.observer) st.observer->before_forward();
  }
  Tensor out;
  try {
    detail::ForwardScope no_record;
    out = std::apply([&](const auto&... a) { return Op::forward(*ctx, a...); }, cast_args);
  } catch (const std::bad_alloc&) {
    // Host working memory (a kernel's scratch) is the one allocation not checked ahead; name the op anyway.
    std::vector<Tensor> inputs;
    (detail::visit_tensors(args, [&](const Tensor& t) { inputs.push_back(t); }), ...);
    detail::throw_out_of_host_memory(Op::kName, inputs);
  }

  // 4. Trace, anomaly, the observer, the node.
  const char* kernel = watched ? op_hooks().take_noted_kernel() : nullptr;
  if (st.trace && !nested) st.trace->record(Op::kName, out.dtype(), kernel);
  if (st.anomaly && !nested) detail::check_finite(out, Op::kName, "forward", "output");
  if (st.observer && !nested) [[unlikely]] {
    std::vector<Tensor> inputs;
    std::apply([&](const auto&... a) { (detail::visit_tensors(a, [&](const Tensor& t) { inputs.push_back(t); }), ...); },
               cast_args);
    std::shared_ptr<NodeObservation> seen = detail::observe_forward(Op::kName, inputs, out, kernel, node != nullptr);
    if (node) node->observation = std::move(seen);
  }
  if (node) detail::record(node, out);
  return out;
}

}  // namespace mixtape::autograd
