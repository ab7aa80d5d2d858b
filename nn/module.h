// nn/module.h — nn::Module: the base of every layer and model, holding its parameters, buffers and submodules.
//
// The one design idea: a module is an ordinary C++ object whose layers are value members, registered by name
// (PyTorch's attribute registration, made explicit), and a parameter is a Tensor handle shared by the member and
// the registry. Everything that walks a model (parameters(), state_dict(), to(), train()) walks the registry, in
// PyTorch's order, under PyTorch's dotted names ("fc1.weight", "0.bias"):
//
//   struct Net : mt::nn::Module {
//     mt::nn::Linear fc1{784, 512}, fc2{512, 10};
//     Net() { register_module("fc1", fc1); register_module("fc2", fc2); }
//     mt::Tensor forward(const mt::Tensor& x) { return fc2(mt::relu(fc1(x))); }
//   };
//   Net net;
//   net.to(mt::Device::cuda());                     // the same parameter handles, now on the GPU
//   mt::optim::AdamW opt(net.parameters(), {.lr = 1e-3});
//   std::cout << net;                               // Net(\n  (fc1): Linear(in_features=784, ...)\n  ...)
//
// Moving and copying. A Module is not copyable (a copy would share or duplicate parameters silently). It is
// movable when every submodule it has is owned (registered through a std::shared_ptr, as Sequential and
// ModuleList do), so layers are values: `nn::Sequential seq{nn::Linear(784, 512), nn::ReLU()}` moves them in.
// A submodule registered by reference points into the object that registered it; moving that object would
// leave the registration pointing at the moved-from member, so such a move throws mixtape::Error naming the
// module and its by-reference submodules instead (construct such a model in place, or hold it in a
// std::shared_ptr / std::unique_ptr). Move-assigning *into* a registered member (`fc1 = nn::Linear(3, 4);`) is
// fine: the member stays where it was registered, and the registry sees its new parameters. A submodule
// registered by reference must outlive the module it is registered in.
//
// to(Device) and to(DType) convert parameters and buffers in place (PyTorch's `param.data = fn(param)`): every
// handle to a parameter, the layer's member, the registry's, an optimizer's built before the call, sees the
// converted tensor, and an existing gradient is converted with it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/core/device.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/core/tensor.h>

namespace mixtape::nn {

/// (name, tensor) pairs in registration order: what named_parameters() and named_buffers() return.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module;
/// (name, module) pairs in registration order: what named_children() and named_modules() return.
using NamedModules = std::vector<std::pair<std::string, Module*>>;

class Module {
 public:
  Module() = default;
  virtual ~Module();

  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  /// Moves the registrations (see the header comment); throws mixtape::Error when `other` has a submodule
  /// registered by reference, which would dangle.
  Module(Module&& other);
  Module& operator=(Module&& other);

  // ---- registration (names: non-empty, no '.', unique among this module's parameters, buffers and children) --
  /// Registers `tensor` as a parameter: a leaf (a non-leaf is detached first) that requires grad when
  /// `requires_grad` (floating dtypes only). Returns the registered handle: `weight = register_parameter("weight",
  /// mt::empty({out, in}));`. An undefined tensor is an error.
  Tensor register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  /// Registers `tensor` as a buffer: state saved in state_dict() and moved by to(), never trained
  /// (BatchNorm's running statistics). Returns the registered handle.
  Tensor register_buffer(std::string name, Tensor tensor);
  /// Registers `module` by reference (a member of this module, usually): it must outlive this module, and this
  /// module can no longer be moved (see the header comment).
  template <class M>
    requires std::is_base_of_v<Module, M>
  M& register_module(std::string name, M& module) {
    add_child(std::move(name), &module, nullptr);
    return module;
  }
  /// Registers `module` owned (shared) by this module: what containers use; a module holding only owned
  /// submodules stays movable.
  template <class M>
    requires std::is_base_of_v<Module, M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    Module* raw = module.get();
    add_child(std::move(name), raw, std::shared_ptr<Module>(module));
    return module;
  }

  // ---- walking the tree (PyTorch's order: a module's own entries, then each child's, recursively; a tensor or
  // module reachable twice is listed once) ----
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  /// The direct submodules (one registered under two names once, under its first).
  std::vector<Module*> children() const;
  NamedModules named_children() const;
  /// This module and every submodule, pre-order (this one first, under the name "").
  std::vector<Module*> modules();
  NamedModules named_modules();
  /// Σ numel over parameters(): the number of trainable values (each shared parameter once).
  int64_t parameter_count() const;

  // ---- mode, device, dtype, gradients ----
  /// Sets training mode here and in every submodule (Dropout drops, BatchNorm uses the batch's statistics).
  Module& train(bool on = true);
  /// train(false).
  Module& eval() { return train(false); }
  bool is_training() const { return m_training; }
  /// Moves every parameter and buffer to `device`, in place (the handles stay the same).
  Module& to(Device device);
  /// Converts every floating parameter and buffer to the floating `dtype`, in place; integer buffers stay
  /// (BatchNorm's num_batches_tracked), and a module may keep a buffer in another dtype (BatchNorm keeps its
  /// running statistics in acc_dtype(dtype): f32 in an f16 or bf16 model).
  Module& to(DType dtype);
  /// Clears every parameter's gradient: undefined (set_to_none, PyTorch's default), or zeroed in place.
  void zero_grad(bool set_to_none = true);
  /// fn(m) for every submodule, children before parents, then for this module (PyTorch's order):
  /// `net.apply([](nn::Module& m) { if (auto* l = dynamic_cast<nn::Linear*>(&m)) nn::init::zeros_(l->bias); });`
  Module& apply(const std::function<void(Module&)>& fn);

  // ---- state ----
  /// Every parameter and buffer under its dotted name, as detached handles sharing the data: per module its
  /// parameters, then its buffers, then each child's entries (PyTorch's order).
  StateDict state_dict() const;
  /// Copies the entries of `state` into the parameters and buffers of the same names. Each must have the
  /// parameter's shape and dtype (an error names the key); with `strict`, the keys must be exactly state_dict()'s
  /// (one error naming every missing and unexpected key), otherwise absent keys are left as they are and extra
  /// ones ignored.
  void load_state_dict(const StateDict& state, bool strict = true);

  // ---- printing ----
  /// The class name PyTorch prints: the type's name without namespaces ("Linear", "Net").
  virtual std::string type_name() const;
  /// What follows the name inside the parentheses, as PyTorch's extra_repr: "in_features=784, out_features=512,
  /// bias=True". Empty by default.
  virtual std::string extra_repr() const { return ""; }
  /// The tree PyTorch prints for the same model: "Net(\n  (fc1): Linear(in_features=784, ...)\n)".
  virtual std::string repr() const;

 protected:
  /// The dtype to(dtype) gives the floating buffer registered here as `name`: `dtype` unless a module says
  /// otherwise (BatchNorm: acc_dtype(dtype) for its running statistics).
  virtual DType converted_buffer_dtype(const std::string& name, DType dtype) const;

  /// A child of this module, for containers and printing.
  struct Child {
    std::string name;
    Module* module = nullptr;
    std::shared_ptr<Module> owner;  // null when registered by reference
  };
  const std::vector<Child>& child_entries() const { return m_children; }

 private:
  void add_child(std::string name, Module* module, std::shared_ptr<Module> owner);
  /// Throws unless `name` is a valid new name in this module; `what` is the registering method.
  void check_new_name(const std::string& name, const char* what) const;
  /// Converts every parameter and buffer in the tree (each once) to what `convert(tensor, owner, buffer name)`
  /// gives (the buffer name is empty for parameters); `convert` returns the tensor itself to leave it.
  void convert_tensors(const std::function<Tensor(const Tensor&, const Module&, const std::string&)>& convert);
  void save_into(StateDict& state, const std::string& prefix) const;
  NamedTensors collect(bool buffers, bool recurse) const;

  NamedTensors m_parameters;
  NamedTensors m_buffers;
  std::vector<Child> m_children;
  bool m_training = true;
};

/// Prints module.repr().
std::ostream& operator<<(std::ostream& os, const Module& module);

}  // namespace mixtape::nn
