// core/tensor.h — Tensor: a reference-counted handle to a strided view of storage.
//
// Tensor has the value semantics of torch::Tensor: copying the handle shares
// the data; views (reshape, transpose, slice, expand, ...) share storage and
// differ only in shape, strides and offset. Everything else in mixtape takes
// and returns Tensors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <source_location>
#include <span>
#include <vector>

#include <mixtape/core/device.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/error.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/storage.h>

namespace mixtape {

/// Autograd state of a tensor; defined by the autograd layer, opaque to core.
struct AutogradMeta;

/// Options for the factories: dtype and device. Converts from a
/// DType or a Device, so `zeros({2, 3}, kF16)` and `zeros({2, 3}, Device::cuda())` read naturally.
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType dtype) : m_dtype(dtype) {}     // NOLINT: implicit on purpose
  TensorOptions(Device device) : m_device(device) {}  // NOLINT: implicit on purpose

  TensorOptions dtype(DType d) const { auto o = *this; o.m_dtype = d; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.m_device = d; return o; }

  DType dtype() const { return m_dtype; }
  Device device() const { return m_device; }

 private:
  DType m_dtype = DType::kF32;
  Device m_device = Device::cpu();
};

/// The state behind a Tensor handle. Shared by handle copies; views get their own.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;      // sizes, outermost first
  Shape strides;    // in elements; 0 along broadcast (expanded) dims
  int64_t offset = 0;  // in elements, from storage->data()
  DType dtype = DType::kF32;
  std::shared_ptr<AutogradMeta> autograd;  // null until autograd touches the tensor
};

class Tensor {
 public:
  /// An undefined tensor (like a default torch::Tensor): only `defined()` and assignment are valid.
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : m_impl(std::move(impl)) {}

  bool defined() const { return m_impl != nullptr; }
  TensorImpl* impl() const { return m_impl.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return m_impl; }
  /// True when both handles refer to the same TensorImpl.
  bool is_same(const Tensor& other) const { return m_impl == other.m_impl; }

  // ---- metadata -------------------------------------------------------------
  const Shape& shape() const { return checked().shape; }
  const Shape& sizes() const { return checked().shape; }
  const Shape& strides() const { return checked().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return checked().shape.size(); }
  int64_t numel() const { return checked().shape.numel(); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  int64_t storage_offset() const { return checked().offset; }
  size_t itemsize() const { return mixtape::itemsize(checked().dtype); }
  size_t nbytes() const { return static_cast<size_t>(checked().shape.numel()) * mixtape::itemsize(checked().dtype); }
  bool is_contiguous() const;
  bool is_cuda() const { return checked().storage->device().is_cuda(); }
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }

  /// Address of the first element (storage data + offset).
  void* data_ptr() const;
  /// Typed pointer to the first element; throws unless T is this tensor's dtype.
  template <class T> T* data() const {
    checked();
    MT_CHECK(dtype_v<T> == dtype(), "Tensor::data: requested ", dtype_v<T>, " from a tensor of dtype ", dtype());
    return static_cast<T*>(data_ptr());
  }

  // ---- views (share storage; differentiable, defined in ops/views.cpp) ---------------
  /// A view with `shape` (one dim may be -1); throws when the strides do not allow it.
  Tensor view(const Shape& shape) const;
  /// A view when the strides allow it, a contiguous copy otherwise.
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  /// Transpose of a 2-D tensor (0-D and 1-D tensors are returned as they are, like PyTorch).
  Tensor t() const;
  Tensor permute(const Shape& dims) const;
  /// Elements start, start+step, ... < end along `dim`; start/end are clamped like Python slices.
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  /// `length` elements from `start` along `dim`; throws when out of range.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// The sub-tensor at `index` along `dim`, with that dim removed.
  Tensor select(int64_t dim, int64_t index) const;
  /// Broadcasts size-1 dims to `shape` with stride 0 (-1 keeps a size); no copy.
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;

  // ---- copies (differentiable, defined in ops/views.cpp and autograd/cast.cpp) ----------
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;
  Tensor clone() const;
  /// A cast; its gradient is a cast back. Returns this tensor when the dtype is already `dtype`.
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const {
    checked();
    return to(Device::cpu());
  }
  Tensor cuda(int index = 0) const {
    checked();
    return to(Device::cuda(index));
  }

  // ---- in-place writes (not recorded; refused on tensors that require grad while grad mode is on) ----
  /// Copies `src` (broadcast to this shape, any dtype or device) into this tensor. Overwrites.
  Tensor& copy_(const Tensor& src);
  /// Every element = `value`; an error when it overflows the dtype (fits() in dtype.h: an i64 1e30, an f16 1e5).
  Tensor& fill_(double value);
  Tensor& zero_() {
    checked();
    return fill_(0.0);
  }

  // ---- autograd (defined in autograd/tensor_autograd.cpp) ---------------------------------
  bool requires_grad() const;
  /// Makes this leaf tensor record gradients (floating dtypes only).
  Tensor& requires_grad_(bool requires_grad = true);
  /// The accumulated gradient (undefined until a backward reaches this leaf).
  const Tensor& grad() const;
  /// Replaces the accumulated gradient (an undefined tensor clears it).
  void set_grad(const Tensor& grad);
  /// True for tensors no recorded op produced.
  bool is_leaf() const;
  /// Name of the op that produced this tensor ("" for leaves).
  const char* grad_fn_name() const;
  /// Accumulates d this / d leaf into every leaf's grad(); `gradient` defaults to 1 for one-element tensors.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  /// The same data with no autograd history.
  Tensor detach() const;

  // ---- element access (for tests and small tools: each call may copy to the CPU) ----
  /// The value of a one-element tensor, converted to T; an error when it overflows T (an f64 1e30 as int64_t).
  template <class T> T item() const;
  /// The element at `index` (one entry per dim, negative counts from the end), converted to T.
  template <class T> T at(std::initializer_list<int64_t> index) const;
  /// All elements in row-major order, converted to T.
  template <class T> std::vector<T> to_vector() const;
  /// Sets the element at `index` to `value` converted to this tensor's dtype (an error when it overflows it); an
  /// in-place write, refused as those above are on a tensor that requires grad (defined in autograd/).
  void set(std::initializer_list<int64_t> index, double value);

  // ---- in-place bookkeeping ---------------------------------------------------
  /// Version of the storage: bumped by every in-place write (copy_, fill_, set, ...).
  uint64_t version() const { return checked().storage->version(); }
  void bump_version() const { checked().storage->bump_version(); }

 private:
  /// The impl, or an error naming the method that asked (its name taken from the caller's source location).
  const TensorImpl& checked(std::source_location caller = std::source_location::current()) const {
    if (m_impl == nullptr) [[unlikely]]
      throw_undefined(caller.function_name());
    return *m_impl;
  }
  [[noreturn]] static void throw_undefined(const char* function);
  double element_as_double(std::initializer_list<int64_t> index, const char* op) const;

  std::shared_ptr<TensorImpl> m_impl;
};

/// Prints shape, dtype, device and the leading values: `tensor([0.5, 1, ...], shape=[2, 3], dtype=f32, device=cpu)`.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- factories ------------------------------------------------------------------

/// Uninitialised memory of `shape`.
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
/// Every element = `value`; an error when it overflows the dtype (fits() in dtype.h), as PyTorch's (which also
/// wraps -255..-1 into u8: refused here).
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
/// 0, 1, ..., end-1 (default dtype i64, like torch.arange with integer bounds).
Tensor arange(int64_t end, TensorOptions options = TensorOptions(DType::kI64));
/// start, start+step, ... < end; an error when the first or last value overflows the dtype.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
/// A tensor holding `values` (converted to the options' dtype) with `shape` (default: 1-D).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options = TensorOptions(dtype_v<T>));
template <class T>
Tensor from_vector(const std::vector<T>& values) { return from_vector(values, Shape{static_cast<int64_t>(values.size())}); }
/// A 1-D tensor from a list: `tensor({1.f, 2.f, 3.f})`; dtype follows T unless given.
template <class T>
Tensor tensor(std::initializer_list<T> values, TensorOptions options = TensorOptions(dtype_v<T>)) {
  return from_vector(std::vector<T>(values), Shape{static_cast<int64_t>(values.size())}, options);
}
/// A 0-D tensor; an error when `value` overflows the dtype.
Tensor scalar_tensor(double value, TensorOptions options = {});

}  // namespace mixtape
