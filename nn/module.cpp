// nn/module.cpp — nn::Module: registration, the walks over the tree, to()/train()/zero_grad(), state_dict and the
// PyTorch-style printout.
//
// Every walk goes through one pre-order listing of the tree (module_tree), so parameters(), state_dict(), to()
// and the names agree on order and on sharing: a module or a tensor reachable twice is visited once.
#include <mixtape/nn/module.h>

#include <cxxabi.h>

#include <cstdlib>
#include <sstream>
#include <typeinfo>
#include <unordered_set>

#include <mixtape/autograd/autograd.h>
#include <mixtape/core/raw.h>

namespace mixtape::nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

/// The module and its submodules under their dotted names, pre-order, each once (the root under "").
std::vector<std::pair<std::string, const Module*>> module_tree(const Module& root) {
  std::vector<std::pair<std::string, const Module*>> out;
  std::unordered_set<const Module*> seen;
  std::function<void(const Module&, const std::string&)> visit = [&](const Module& m, const std::string& prefix) {
    if (!seen.insert(&m).second) return;
    out.emplace_back(prefix, &m);
    for (const auto& [name, child] : m.named_children()) visit(*child, join(prefix, name));
  };
  visit(root, "");
  return out;
}

/// PyTorch's `param.data = data`, and the one place nn/ writes a TensorImpl: `t` takes `data`'s storage, shape,
/// strides, offset and dtype and keeps its autograd state (requires_grad, and the identity that every handle to it
/// holds: the layer's member, the registry's, an optimizer's). A gradient it has is converted the same way (to
/// data's device and dtype), so that it keeps matching the leaf. Only for leaves: a tensor an op produced has a
/// node on the tape that recorded its old dtype and device.
void set_data(const Tensor& t, const Tensor& data) {
  MT_CHECK(t.is_leaf(), "Module.to: a parameter or buffer must be a leaf tensor, but this one was produced by ",
           t.grad_fn_name(), " (shape ", t.shape(), ")");
  if (const Tensor& grad = t.grad(); grad.defined()) set_data(grad, raw::to(grad, data.device(), data.dtype()));
  TensorImpl* impl = t.impl();
  impl->storage = data.storage();
  impl->shape = data.shape();
  impl->strides = data.strides();
  impl->offset = data.storage_offset();
  impl->dtype = data.dtype();
}

/// `s` with every line after the first indented by `spaces` (PyTorch's _addindent).
std::string add_indent(const std::string& s, int spaces) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out.append(static_cast<size_t>(spaces), ' ');
  }
  return out;
}

}  // namespace

Module::~Module() = default;

Module::Module(Module&& other) { *this = std::move(other); }

Module& Module::operator=(Module&& other) {
  if (this == &other) return *this;
  std::string by_reference;
  for (const Child& c : other.m_children)
    if (!c.owner) by_reference += (by_reference.empty() ? "" : ", ") + c.name;
  MT_CHECK(by_reference.empty(), other.type_name(), ": cannot move a module whose submodules (", by_reference,
           ") are registered by reference: the registrations would point into the moved-from object. Construct it "
           "in place, hold it in a std::shared_ptr, or register its submodules as std::shared_ptr");
  m_parameters = std::move(other.m_parameters);
  m_buffers = std::move(other.m_buffers);
  m_children = std::move(other.m_children);
  m_training = other.m_training;
  other.m_parameters.clear();
  other.m_buffers.clear();
  other.m_children.clear();
  return *this;
}

// ---- registration ----------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  MT_CHECK(!name.empty(), type_name(), ".", what, ": the name must not be empty");
  MT_CHECK(name.find('.') == std::string::npos, type_name(), ".", what, ": the name \"", name,
           "\" must not contain \".\" (dots join the names of nested modules)");
  auto taken = [&](const NamedTensors& list) {
    for (const auto& [n, t] : list)
      if (n == name) return true;
    return false;
  };
  MT_CHECK(!taken(m_parameters), type_name(), ".", what, ": \"", name, "\" is already registered (a parameter)");
  MT_CHECK(!taken(m_buffers), type_name(), ".", what, ": \"", name, "\" is already registered (a buffer)");
  for (const Child& c : m_children)
    MT_CHECK(c.name != name, type_name(), ".", what, ": \"", name, "\" is already registered (a submodule)");
}

Tensor Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "register_parameter");
  MT_CHECK(tensor.defined(), type_name(), ".register_parameter: \"", name, "\" is an undefined tensor");
  MT_CHECK(!requires_grad || is_floating(tensor.dtype()), type_name(), ".register_parameter: \"", name,
           "\" has dtype ", tensor.dtype(), " (shape ", tensor.shape(),
           "); only floating tensors can require grad (pass requires_grad = false)");
  if (!tensor.is_leaf()) tensor = tensor.detach();  // a parameter is a leaf, like torch.nn.Parameter(t)
  tensor.requires_grad_(requires_grad);
  m_parameters.emplace_back(std::move(name), tensor);
  return tensor;
}

Tensor Module::register_buffer(std::string name, Tensor tensor) {
  check_new_name(name, "register_buffer");
  MT_CHECK(tensor.defined(), type_name(), ".register_buffer: \"", name, "\" is an undefined tensor");
  m_buffers.emplace_back(std::move(name), tensor);
  return tensor;
}

void Module::add_child(std::string name, Module* module, std::shared_ptr<Module> owner) {
  check_new_name(name, "register_module");
  MT_CHECK(module != nullptr, type_name(), ".register_module: \"", name, "\" is a null module");
  MT_CHECK(module != this, type_name(), ".register_module: \"", name, "\" is the module itself");
  m_children.push_back({std::move(name), module, std::move(owner)});
}

// ---- walking the tree ------------------------------------------------------------------------------

NamedTensors Module::collect(bool buffers, bool recurse) const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  auto own = [&](const Module& m, const std::string& prefix) {
    for (const auto& [name, t] : buffers ? m.m_buffers : m.m_parameters)
      if (seen.insert(t.impl()).second) out.emplace_back(join(prefix, name), t);
  };
  if (!recurse) {
    own(*this, "");
    return out;
  }
  for (const auto& [prefix, m] : module_tree(*this)) own(*m, prefix);
  return out;
}

NamedTensors Module::named_parameters(bool recurse) const { return collect(false, recurse); }
NamedTensors Module::named_buffers(bool recurse) const { return collect(true, recurse); }

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

NamedModules Module::named_children() const {
  NamedModules out;
  std::unordered_set<const Module*> seen;  // a module registered under two names is one child (PyTorch's memo)
  for (const Child& c : m_children)
    if (seen.insert(c.module).second) out.emplace_back(c.name, c.module);
  return out;
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const auto& [name, m] : named_children()) out.push_back(m);
  return out;
}

NamedModules Module::named_modules() {
  NamedModules out;
  // The tree is built from const views of modules this (non-const) module reaches; none of them is const.
  for (const auto& [name, m] : module_tree(*this)) out.emplace_back(name, const_cast<Module*>(m));
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (auto& [name, m] : named_modules()) out.push_back(m);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

// ---- mode, device, dtype, gradients ----------------------------------------------------------------

Module& Module::train(bool on) {
  for (Module* m : modules()) m->m_training = on;
  return *this;
}

void Module::convert_tensors(
    const std::function<Tensor(const Tensor&, const Module&, const std::string&)>& convert) {
  autograd::NoGradGuard no_grad;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [prefix, m] : module_tree(*this)) {
    for (const auto& [name, t] : m->m_parameters)
      if (seen.insert(t.impl()).second) {
        const Tensor data = convert(t, *m, "");
        if (!data.is_same(t)) set_data(t, data);
      }
    for (const auto& [name, t] : m->m_buffers)
      if (seen.insert(t.impl()).second) {
        const Tensor data = convert(t, *m, name);
        if (!data.is_same(t)) set_data(t, data);
      }
  }
}

Module& Module::to(Device device) {
  convert_tensors([&](const Tensor& t, const Module&, const std::string&) {
    return t.device() == device ? t : raw::to(t, device);
  });
  return *this;
}

Module& Module::to(DType dtype) {
  MT_CHECK(is_floating(dtype), type_name(), ".to: expected a floating dtype, got ", dtype,
           " (only floating parameters and buffers are converted)");
  convert_tensors([&](const Tensor& t, const Module& owner, const std::string& buffer) {
    if (!is_floating(t.dtype())) return t;
    const DType want = buffer.empty() ? dtype : owner.converted_buffer_dtype(buffer, dtype);
    return t.dtype() == want ? t : raw::to(t, want);
  });
  return *this;
}

DType Module::converted_buffer_dtype(const std::string&, DType dtype) const { return dtype; }

void Module::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      Tensor(p).set_grad(Tensor());
    } else {
      Tensor grad = p.grad();
      grad.zero_();
    }
  }
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (Module* child : children()) child->apply(fn);
  fn(*this);
  return *this;
}

// ---- state -----------------------------------------------------------------------------------------

void Module::save_into(StateDict& state, const std::string& prefix) const {
  for (const auto& [name, t] : m_parameters) state.insert(join(prefix, name), t.detach());
  for (const auto& [name, t] : m_buffers) state.insert(join(prefix, name), t.detach());
  for (const Child& c : m_children) c.module->save_into(state, join(prefix, c.name));
}

StateDict Module::state_dict() const {
  StateDict state;
  save_into(state, "");
  return state;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  const std::string who = type_name();
  if (strict) state.expect_keys(who, own.keys());
  // Every check before the first copy: a failed load leaves the module as it was.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  for (const auto& [key, dst] : own) {
    if (!state.contains(key)) continue;  // strict has already named it
    copies.emplace_back(dst, state.expect(who, key, dst.shape(), dst.dtype()));
  }
  autograd::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) Tensor(dst).copy_(src);
}

// ---- printing ----------------------------------------------------------------------------------------

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // The last component outside template arguments and parentheses: "mixtape::nn::Linear" -> "Linear",
  // "main()::Net" -> "Net", "(anonymous namespace)::Net" -> "Net".
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const char c = full[i];
    if (c == '<' || c == '(') ++depth;
    else if (c == '>' || c == ')') --depth;
    else if (depth == 0 && c == ':' && i + 1 < full.size() && full[i + 1] == ':') start = i + 2;
  }
  return full.substr(start);
}

std::string Module::repr() const {
  // PyTorch's Module.__repr__: the extra_repr lines, then "(name): child" lines, each child's own lines indented.
  std::vector<std::string> extra_lines;
  {
    std::istringstream in(extra_repr());
    for (std::string line; std::getline(in, line);) extra_lines.push_back(line);
  }
  std::vector<std::string> lines = extra_lines;
  for (const Child& c : m_children) lines.push_back("(" + c.name + "): " + add_indent(c.module->repr(), 2));
  std::string out = type_name() + "(";
  if (extra_lines.size() == 1 && m_children.empty()) {
    out += extra_lines[0];
  } else if (!lines.empty()) {
    out += "\n  ";
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n  " : "") + lines[i];
    out += "\n";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.repr(); }

}  // namespace mixtape::nn
