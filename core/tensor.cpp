// core/tensor.cpp — Tensor metadata, views, copies and element access.
//
// Views only compute shape/strides/offset over the same storage; every copy
// goes through the device's memory (`DeviceMemory::copy`), which also converts dtypes.
#include <mixtape/core/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <optional>
#include <string_view>

#include <mixtape/core/device_memory.h>
#include <mixtape/core/raw.h>

namespace mixtape {

namespace {

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

/// Resolves one -1 in `shape` against `numel`; throws naming `op` when impossible.
Shape infer_size(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (int64_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK(infer < 0, op, ": only one dimension can be inferred (shape ", shape, ")");
      infer = i;
    } else {
      MT_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " at dim ", i, " (shape ", shape, ")");
      MT_CHECK(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", shape,
               " has more elements than a 64-bit count holds");
    }
  }
  if (infer >= 0) {
    MT_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for input of size ", numel);
    out[infer] = numel / known;
  } else {
    MT_CHECK(known == numel, op, ": shape ", shape, " is invalid for input of size ", numel);
  }
  (void)checked_numel(out, op);  // an empty shape's strides must fit too ({0, 2^62, 4})
  return out;
}

/// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), if any.
std::optional<Shape> view_strides(const Shape& old_shape_in, const Shape& old_strides_in, const Shape& new_shape) {
  Shape old_shape = old_shape_in, old_strides = old_strides_in;
  if (old_shape.empty()) old_shape = {1}, old_strides = {1};
  Shape new_strides = Shape::filled(new_shape.size(), 1);
  if (old_shape.numel() == 0) return contiguous_strides(new_shape);
  int64_t view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = old_shape.size() - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk of dims ends where memory stops being contiguous.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

template <class T>
T read_element(const Tensor& cpu_tensor, int64_t element_offset) {
  return dispatch(cpu_tensor.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    S v;
    std::memcpy(&v, static_cast<const char*>(cpu_tensor.storage()->data()) + element_offset * sizeof(S), sizeof(S));
    return convert<T>(v);
  });
}

/// read_element for item() and at(): an error when the element does not fit T (an f64 1e30 asked for as an i64).
template <class T>
T read_fitting_element(const Tensor& cpu_tensor, int64_t element_offset, const char* op) {
  if (cpu_tensor.dtype() != dtype_v<T>) {
    const double v = read_element<double>(cpu_tensor, element_offset);
    MT_CHECK(fits(v, dtype_v<T>), op, ": the ", cpu_tensor.dtype(), " value ", v, " overflows ", dtype_v<T>);
  }
  return read_element<T>(cpu_tensor, element_offset);
}

}  // namespace

// check_fits (core/raw.h): instead of an integer cast's undefined result or an inf from a finite value.
void check_fits(const char* op, double value, DType dtype, const Shape& shape) {
  MT_CHECK(fits(value, dtype), op, ": the value ", value, " overflows ", dtype, " (shape ", shape, ")");
}

// ---- metadata ---------------------------------------------------------------------

void Tensor::throw_undefined(const char* function) {
  // `function` is the compiler's signature of the method that asked, e.g. "int64_t mixtape::Tensor::numel() const".
  std::string_view name(function);
  if (const size_t at = name.rfind("Tensor::", name.find('(')); at != std::string_view::npos) {
    name.remove_prefix(at + 8);
    name = name.substr(0, name.find_first_of("(<"));
  }
  MT_ERROR("Tensor::", name, ": called on an undefined tensor");
}

int64_t Tensor::size(int64_t dim) const {
  const Shape& sh = checked().shape;
  return sh[wrap_dim(dim, sh.size(), "size", sh)];
}
int64_t Tensor::stride(int64_t dim) const {
  const TensorImpl& t = checked();
  return t.strides[wrap_dim(dim, t.shape.size(), "stride", t.shape)];
}

bool Tensor::is_contiguous() const {
  const Shape& sh = checked().shape;
  const Shape& st = strides();
  if (sh.numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = sh.size() - 1; i >= 0; --i) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked();
  return static_cast<char*>(t.storage->data()) + t.offset * static_cast<int64_t>(mixtape::itemsize(t.dtype));
}

// ---- raw views and copies (no autograd) ---------------------------------------------

namespace raw {

Tensor view(const Tensor& x, const Shape& shape_in) {
  Shape shape = infer_size(shape_in, x.numel(), "view");
  auto strides = view_strides(x.shape(), x.strides(), shape);
  MT_CHECK(strides.has_value(), "view: size ", shape, " is not compatible with input of shape ", x.shape(),
           " and strides ", x.strides(), " (at least one dim spans two contiguous subspaces); use reshape");
  return make_view(x, shape, *strides, x.storage_offset());
}

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  Shape shape = infer_size(shape_in, x.numel(), "reshape");
  if (auto strides = view_strides(x.shape(), x.strides(), shape)) return make_view(x, shape, *strides, x.storage_offset());
  return view(contiguous(x), shape);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  int64_t a = wrap_dim(dim0, x.dim(), "transpose", x.shape());
  int64_t b = wrap_dim(dim1, x.dim(), "transpose", x.shape());
  if (x.dim() == 0) return x;
  Shape sh = x.shape(), st = x.strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return make_view(x, sh, st, x.storage_offset());
}

Tensor permute(const Tensor& x, const Shape& dims) {
  MT_CHECK(dims.size() == x.dim(), "permute: got ", dims.size(), " dims ", dims, " for a tensor of shape ", x.shape());
  Shape sh, st;
  bool seen[Shape::kMaxDims] = {};
  for (int64_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim(), "permute", x.shape());
    MT_CHECK(!seen[d], "permute: dim ", d, " repeats in ", dims, " (shape ", x.shape(), ")");
    seen[d] = true;
    sh.push_back(x.shape()[d]);
    st.push_back(x.strides()[d]);
  }
  return make_view(x, sh, st, x.storage_offset());
}

Tensor slice(const Tensor& x, int64_t dim_in, int64_t start, int64_t end, int64_t step) {
  int64_t d = wrap_dim(dim_in, x.dim(), "slice", x.shape());
  MT_CHECK(step > 0, "slice: step must be positive, got ", step, " (shape ", x.shape(), ")");
  int64_t n = x.shape()[d];
  auto clamp = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t{0}, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape sh = x.shape(), st = x.strides();
  sh[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for steps near INT64_MAX
  if (sh[d] <= 1) step = 1;                                 // a stride never used: keep it from overflowing
  MT_CHECK(!__builtin_mul_overflow(st[d], step, &st[d]), "slice: step ", step, " times stride ", st[d],
           " overflows (shape ", x.shape(), ")");
  return make_view(x, sh, st, x.storage_offset() + start * x.strides()[d]);
}

Tensor select(const Tensor& x, int64_t dim_in, int64_t index) {
  int64_t d = wrap_dim(dim_in, x.dim(), "select", x.shape());
  int64_t n = x.shape()[d];
  MT_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n,
           " (shape ", x.shape(), ")");
  if (index < 0) index += n;
  Shape sh = x.shape(), st = x.strides();
  int64_t offset = x.storage_offset() + index * st[d];
  sh.erase(d);
  st.erase(d);
  return make_view(x, sh, st, offset);
}

Tensor expand(const Tensor& x, const Shape& target) {
  MT_CHECK(target.size() >= x.dim(), "expand: the target shape ", target, " has fewer dims than the tensor's shape ",
           x.shape());
  Shape sh = Shape::filled(target.size(), 0), st = Shape::filled(target.size(), 0);
  int64_t lead = target.size() - x.dim();
  for (int64_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      MT_CHECK(target[i] >= 0, "expand: size -1 is not allowed in a new leading dim (target ", target, ")");
      sh[i] = target[i];
      st[i] = 0;
      continue;
    }
    int64_t have = x.shape()[i - lead];
    int64_t want = target[i] == -1 ? have : target[i];
    MT_CHECK(want >= 0, "expand: size ", target[i], " at dim ", i, " (only -1, keep the size, may be negative; ",
             "target ", target, ")");
    MT_CHECK(have == want || have == 1, "expand: the size of dim ", i - lead, " (", have,
             ") must match the target size ", want, " or be 1 (shape ", x.shape(), " to ", target, ")");
    sh[i] = want;
    st[i] = have == want ? x.strides()[i - lead] : 0;
  }
  (void)checked_numel(sh, "expand");  // no memory behind it, but numel() and every loop over it count in int64
  return make_view(x, sh, st, x.storage_offset());
}

Tensor squeeze(const Tensor& x, int64_t dim_in) {
  int64_t d = wrap_dim(dim_in, x.dim(), "squeeze", x.shape());
  if (x.dim() == 0 || x.shape()[d] != 1) return x;
  Shape sh = x.shape(), st = x.strides();
  sh.erase(d);
  st.erase(d);
  return make_view(x, sh, st, x.storage_offset());
}

Tensor unsqueeze(const Tensor& x, int64_t dim_in) {
  int64_t d = wrap_dim(dim_in, x.dim() + 1, "unsqueeze", x.shape());
  Shape sh = x.shape(), st = x.strides();
  int64_t stride_here = d < x.dim() ? st[d] * sh[d] : 1;
  sh.insert(d, 1);
  st.insert(d, stride_here);
  return make_view(x, sh, st, x.storage_offset());
}

Tensor as_strided(const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset) {
  MT_CHECK(shape.size() == strides.size(), "as_strided: shape ", shape, " and strides ", strides, " differ in rank");
  int64_t max_index = offset;
  for (int64_t i = 0; i < shape.size(); ++i) {
    MT_CHECK(shape[i] >= 0 && strides[i] >= 0, "as_strided: negative size or stride (shape ", shape, ", strides ",
             strides, ")");
    if (shape[i] == 0) max_index = -1;
    if (max_index >= 0) max_index += (shape[i] - 1) * strides[i];
  }
  int64_t capacity = static_cast<int64_t>(x.storage()->nbytes() / x.itemsize());
  MT_CHECK(offset >= 0 && max_index < capacity, "as_strided: shape ", shape, " strides ", strides, " offset ", offset,
           " reach element ", max_index, " of a storage of ", capacity, " elements");
  return make_view(x, shape, strides, offset);
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  Tensor out = empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  if (x.numel()) device_memory(x.device()).copy(out, x);
  return out;
}

Tensor to(const Tensor& x, DType dtype) {
  if (dtype == x.dtype()) return x;
  Tensor out = empty(x.shape(), TensorOptions(dtype).device(x.device()));
  if (x.numel()) device_memory(x.device()).copy(out, x);
  return out;
}

Tensor to(const Tensor& x, Device device) {
  if (device == x.device()) return x;
  Tensor src = contiguous(x);
  Tensor out = empty(x.shape(), TensorOptions(x.dtype()).device(device));
  // The non-CPU side's memory knows how to move bytes across.
  DeviceMemory& m = device_memory(device.is_cpu() ? x.device() : device);
  m.copy_bytes(out.data_ptr(), device, src.data_ptr(), x.device(), x.nbytes());
  return out;
}

Tensor to(const Tensor& x, Device device, DType dtype) {
  // Convert where the data is smaller: narrow before moving, widen after.
  if (mixtape::itemsize(dtype) <= x.itemsize()) return to(to(x, dtype), device);
  return to(to(x, device), dtype);
}

void copy_(const Tensor& dst, const Tensor& src_in) {
  MT_CHECK(dst.defined(), "copy_: the destination tensor is undefined");
  MT_CHECK(src_in.defined(), "copy_: the source tensor is undefined");
  // The source broadcasts to the destination (PyTorch's rule); named here, not as the expand that does it.
  const Shape& from = src_in.shape();
  const Shape& to_shape = dst.shape();
  bool broadcasts = from.size() <= to_shape.size();
  for (int64_t i = 1; broadcasts && i <= from.size(); ++i)
    broadcasts = from[from.size() - i] == 1 || from[from.size() - i] == to_shape[to_shape.size() - i];
  MT_CHECK(broadcasts, "copy_: a source of shape ", from, " does not broadcast to the destination's shape ", to_shape);
  // An expanded destination has elements sharing memory: which write would win is undefined (PyTorch refuses too).
  for (int64_t i = 0; i < dst.dim(); ++i)
    MT_CHECK(dst.stride(i) != 0 || dst.size(i) <= 1, "copy_: the destination (shape ", to_shape, ", strides ",
             dst.strides(), ") is an expanded view whose elements share memory; clone() it first");
  Tensor src = expand(src_in, dst.shape());
  if (src.device() != dst.device()) src = to(contiguous(src), dst.device());
  // Same storage: the source might be overwritten while it is read.
  if (src.storage() == dst.storage()) src = clone(src);
  if (dst.numel()) device_memory(dst.device()).copy(dst, src);
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  if (dst.numel()) device_memory(dst.device()).fill(dst, value);
  dst.bump_version();
}

}  // namespace raw

// ---- element access -----------------------------------------------------------------

template <class T>
T Tensor::item() const {
  checked();
  MT_CHECK(numel() == 1, "item: a tensor with ", numel(), " elements cannot be converted to a scalar (shape ",
           shape(), ")");
  Tensor c = raw::to(*this, Device::cpu());
  return read_fitting_element<T>(c, c.storage_offset(), "item");
}

template <class T>
T Tensor::at(std::initializer_list<int64_t> index) const {
  checked();
  MT_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: got ", index.size(), " indices for a tensor of shape ",
           shape());
  Tensor v = *this;
  int64_t d = 0;
  for (int64_t i : index) {
    MT_CHECK(i >= -size(d) && i < size(d), "at: index ", i, " is out of range for dim ", d, " of size ", size(d),
             " (shape ", shape(), ")");
    v = raw::select(v, 0, i);
    ++d;
  }
  v = raw::to(v, Device::cpu());
  return read_fitting_element<T>(v, v.storage_offset(), "at");
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  checked();
  Tensor c = raw::contiguous(raw::to(*this, Device::cpu(), dtype_v<T>));
  std::vector<T> out(static_cast<size_t>(c.numel()));
  if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> packs bits: copy one by one
    const bool* p = static_cast<const bool*>(c.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else if (!out.empty()) {
    std::memcpy(out.data(), c.data_ptr(), c.nbytes());
  }
  return out;
}

#define MT_INSTANTIATE_ACCESS(T)                                      \
  template T Tensor::item<T>() const;                                 \
  template T Tensor::at<T>(std::initializer_list<int64_t>) const;     \
  template std::vector<T> Tensor::to_vector<T>() const;
MT_INSTANTIATE_ACCESS(double)
MT_INSTANTIATE_ACCESS(float)
MT_INSTANTIATE_ACCESS(Half)
MT_INSTANTIATE_ACCESS(BFloat16)
MT_INSTANTIATE_ACCESS(int64_t)
MT_INSTANTIATE_ACCESS(int32_t)
MT_INSTANTIATE_ACCESS(uint8_t)
MT_INSTANTIATE_ACCESS(bool)
#undef MT_INSTANTIATE_ACCESS

// ---- printing -----------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  constexpr int64_t kShown = 8;
  Tensor flat = raw::reshape(t, {-1});
  int64_t n = std::min(flat.numel(), kShown);
  std::vector<double> values = raw::slice(flat, 0, 0, n).to_vector<double>();
  std::ostringstream vs;
  vs << std::setprecision(6);
  vs << '[';
  for (int64_t i = 0; i < n; ++i) vs << (i ? ", " : "") << values[static_cast<size_t>(i)];
  if (flat.numel() > kShown) vs << ", ...";
  vs << ']';
  return os << "tensor(" << vs.str() << ", shape=" << t.shape() << ", dtype=" << t.dtype()
            << ", device=" << t.device() << ")";
}

// ---- factories ----------------------------------------------------------------------

namespace {

/// A new contiguous tensor made by `factory`: its element and byte counts checked before anything is allocated, and
/// an allocation that fails named after the op the user called (or the factory) with the bytes it wanted.
Tensor allocate(const char* factory, const Shape& shape, TensorOptions options) {
  const char* op = OpNameScope::current_or(factory);  // `add` when add allocates its output, else the factory
  const int64_t numel = checked_numel(shape, op);
  size_t nbytes = 0;
  MT_CHECK(!__builtin_mul_overflow(static_cast<size_t>(numel), itemsize(options.dtype()), &nbytes) &&
               nbytes <= static_cast<size_t>(std::numeric_limits<int64_t>::max()),
           op, ": shape ", shape, " of ", options.dtype(), " needs more bytes than a 64-bit count holds");
  auto impl = std::make_shared<TensorImpl>();
  try {
    impl->storage = std::make_shared<Storage>(nbytes, options.device());
  } catch (const Error& e) {
    MT_ERROR(op, ": cannot allocate ", nbytes, " bytes for shape ", shape, " of ", options.dtype(), " on ",
             options.device(), ": ", e.what());
  }
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype();
  return Tensor(std::move(impl));
}

/// A new tensor of `value`s from the factory `op` (the name its errors give); the value must fit the dtype.
Tensor filled(const char* op, const Shape& shape, double value, TensorOptions options) {
  check_fits(op, value, options.dtype(), shape);
  Tensor t = allocate(op, shape, options);
  raw::fill_(t, value);
  return t;
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions options) { return allocate("empty", shape, options); }

Tensor full(const Shape& shape, double value, TensorOptions options) { return filled("full", shape, value, options); }
Tensor zeros(const Shape& shape, TensorOptions options) { return filled("zeros", shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return filled("ones", shape, 1.0, options); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype()).device(t.device())); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions(t.dtype()).device(t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions(t.dtype()).device(t.device())); }
Tensor scalar_tensor(double value, TensorOptions options) { return filled("scalar_tensor", Shape{}, value, options); }

Tensor arange(int64_t end, TensorOptions options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  MT_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
           "arange: invalid range start=", start, " end=", end, " step=", step);
  MT_CHECK((end - start) / step >= 0, "arange: step ", step, " does not lead from ", start, " to ", end);
  const double count = std::ceil((end - start) / step);
  MT_CHECK(count < 0x1p62, "arange: ", count, " elements (start=", start, " end=", end, " step=", step,
           ") are more than a tensor can hold");
  const auto n = static_cast<int64_t>(count);
  if (n > 0) {  // the values run from start to the last one: both must fit the dtype
    check_fits("arange", start, options.dtype(), Shape{n});
    check_fits("arange", start + static_cast<double>(n - 1) * step, options.dtype(), Shape{n});
  }
  Tensor host = allocate("arange", Shape{n}, TensorOptions(DType::kF64));  // on the host, then to the options'
  double* values = host.data<double>();
  for (int64_t i = 0; i < n; ++i) values[i] = start + static_cast<double>(i) * step;
  return raw::to(host, options.device(), options.dtype());
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  const int64_t numel = checked_numel(shape, "from_vector");
  MT_CHECK(static_cast<int64_t>(values.size()) == numel, "from_vector: ", values.size(),
           " values do not fill shape ", shape, " (", numel, " elements)");
  Tensor host = empty(shape, TensorOptions(dtype_v<T>));
  if constexpr (std::is_same_v<T, bool>) {
    auto* p = static_cast<bool*>(host.data_ptr());
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else if (!values.empty()) {
    std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(T));
  }
  return raw::to(host, options.device(), options.dtype());
}

template Tensor from_vector(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<bool>&, const Shape&, TensorOptions);

}  // namespace mixtape
