// autograd/tensor_autograd.cpp — the autograd methods of Tensor, and the
// in-place writes (copy_, fill_, set) that must not silently corrupt a recorded graph.
#include <mixtape/autograd/function.h>

namespace mixtape {

namespace {

AutogradMeta& ensure_meta(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

void check_inplace_allowed(const Tensor& t, const char* op) {
  MT_CHECK(!(t.requires_grad() && autograd::grad_enabled()), op, ": a tensor that requires grad (shape ", t.shape(),
           ", ", t.dtype(), ") cannot be modified in place while grad mode is on; use NoGradGuard (as optimizers do) "
           "or detach()");
}

}  // namespace

bool Tensor::requires_grad() const {
  checked();
  return autograd::detail::requires_grad(*this);
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  checked();
  MT_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad; this one was produced by ",
           grad_fn_name(), " (use detach() for a leaf copy)");
  MT_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating tensors can require grad, got ",
           dtype(), " (shape ", shape(), ")");
  ensure_meta(*this).requires_grad = requires_grad;
  return *this;
}

const Tensor& Tensor::grad() const {
  checked();
  static const Tensor kUndefined;
  const AutogradMeta* m = impl()->autograd.get();
  return m ? m->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& grad) {
  checked();
  // A gradient has its tensor's shape, dtype and device (PyTorch: "assigned grad has data of a different type"):
  // optimizers and accumulation rely on it.
  if (grad.defined()) {
    MT_CHECK(grad.shape() == shape(), "set_grad: gradient of shape ", grad.shape(), " for a tensor of shape ",
             shape());
    MT_CHECK(grad.dtype() == dtype(), "set_grad: gradient of dtype ", grad.dtype(), " for a tensor of dtype ",
             dtype(), " (shape ", shape(), ")");
    MT_CHECK(grad.device() == device(), "set_grad: gradient on ", grad.device(), " for a tensor on ", device(),
             " (shape ", shape(), ")");
  }
  AutogradMeta& meta = ensure_meta(*this);
  std::lock_guard lock(meta.grad_mutex);
  meta.grad = grad;
}

bool Tensor::is_leaf() const {
  checked();
  return !autograd::detail::has_grad_fn(*this);
}

const char* Tensor::grad_fn_name() const {
  checked();
  const AutogradMeta* m = impl()->autograd.get();
  return m && m->grad_fn ? m->grad_fn->name() : "";
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  checked();
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const {
  checked();
  auto impl = std::make_shared<TensorImpl>(*this->impl());
  impl->autograd.reset();
  return Tensor(std::move(impl));
}

Tensor& Tensor::copy_(const Tensor& src) {
  checked();
  check_inplace_allowed(*this, "copy_");
  raw::copy_(*this, src);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  checked();
  check_inplace_allowed(*this, "fill_");
  check_fits("fill_", value, dtype(), shape());
  raw::fill_(*this, value);
  return *this;
}

void Tensor::set(std::initializer_list<int64_t> index, double value) {
  checked();
  check_inplace_allowed(*this, "set");
  MT_CHECK(static_cast<int64_t>(index.size()) == dim(), "set: got ", index.size(), " indices for a tensor of shape ",
           shape());
  check_fits("set", value, dtype(), shape());
  Tensor v = *this;
  for (int64_t i : index) v = raw::select(v, 0, i);
  raw::fill_(v, value);
}

}  // namespace mixtape
