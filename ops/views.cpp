// ops/views.cpp — the differentiable views: reshape, permute, slice, select,
// expand, and clone. Forwards are core's raw views (no copy); backwards put
// the gradient back into the input's shape.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;

namespace {

struct Reshape {
  static constexpr const char* kName = "reshape";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Shape input_shape;
  };
  /// `view_only`: throw instead of copying when the strides do not allow a view (Tensor::view).
  static Tensor forward(Ctx& ctx, const Tensor& x, const Shape& shape, bool view_only) {
    ctx.input_shape = x.shape();
    return view_only ? raw::view(x, shape) : raw::reshape(x, shape);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {raw::reshape(dy, ctx.input_shape)}; }
};
MT_REGISTER_OP(Reshape);

struct Permute {
  static constexpr const char* kName = "permute";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Shape inverse;  // dims that undo the permutation
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, const Shape& dims) {
    Tensor y = raw::permute(x, dims);
    ctx.inverse = Shape::filled(dims.size(), 0);
    for (int64_t i = 0; i < dims.size(); ++i) ctx.inverse[wrap_dim(dims[i], x.dim(), "permute", x.shape())] = i;
    return y;
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {raw::permute(dy, ctx.inverse)}; }
};
MT_REGISTER_OP(Permute);

struct Slice {
  static constexpr const char* kName = "slice";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Shape input_shape;
    int64_t dim = 0, start = 0, end = 0, step = 1;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
    ctx.input_shape = x.shape();
    ctx.dim = dim, ctx.start = start, ctx.end = end, ctx.step = step;
    return raw::slice(x, dim, start, end, step);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    Tensor dx = zeros(ctx.input_shape, TensorOptions(dy.dtype()).device(dy.device()));
    raw::copy_(raw::slice(dx, ctx.dim, ctx.start, ctx.end, ctx.step), dy);
    return {dx};
  }
};
MT_REGISTER_OP(Slice);

struct Select {
  static constexpr const char* kName = "select";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Shape input_shape;
    int64_t dim = 0, index = 0;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim, int64_t index) {
    ctx.input_shape = x.shape();
    ctx.dim = dim, ctx.index = index;
    return raw::select(x, dim, index);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    Tensor dx = zeros(ctx.input_shape, TensorOptions(dy.dtype()).device(dy.device()));
    raw::copy_(raw::select(dx, ctx.dim, ctx.index), dy);
    return {dx};
  }
};
MT_REGISTER_OP(Select);

struct Expand {
  static constexpr const char* kName = "expand";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Shape input_shape;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, const Shape& shape) {
    ctx.input_shape = x.shape();
    return raw::expand(x, shape);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {ops::sum_to(dy, ctx.input_shape)}; }
};
MT_REGISTER_OP(Expand);

/// A copy with its own storage (clone, and contiguous() of a non-contiguous tensor).
struct Clone {
  static constexpr const char* kName = "clone";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx&, const Tensor& x) { return raw::clone(x); }
  static Grads backward(Ctx&, const Tensor& dy) { return {dy}; }
};
MT_REGISTER_OP(Clone);

}  // namespace

// ---- the functional forms --------------------------------------------------------------

Tensor reshape(const Tensor& x, const Shape& shape) { return autograd::apply<Reshape>(x, shape, false); }
Tensor view(const Tensor& x, const Shape& shape) { return autograd::apply<Reshape>(x, shape, true); }
Tensor permute(const Tensor& x, const Shape& dims) { return autograd::apply<Permute>(x, dims); }

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  const int64_t a = wrap_dim(dim0, x.dim(), "transpose", x.shape());
  const int64_t b = wrap_dim(dim1, x.dim(), "transpose", x.shape());
  if (x.dim() == 0) return x;
  Shape dims;
  for (int64_t i = 0; i < x.dim(); ++i) dims.push_back(i);
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return autograd::apply<Slice>(x, dim, start, end, step);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  int64_t s = wrap_dim(start_dim, x.dim(), "flatten", x.shape());
  int64_t e = wrap_dim(end_dim, x.dim(), "flatten", x.shape());
  if (x.dim() == 0) return reshape(x, {1});
  MT_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " (shape ", x.shape(), ")");
  Shape out;
  for (int64_t i = 0; i < s; ++i) out.push_back(x.shape()[i]);
  int64_t merged = 1;
  for (int64_t i = s; i <= e; ++i) merged *= x.shape()[i];
  out.push_back(merged);
  for (int64_t i = e + 1; i < x.dim(); ++i) out.push_back(x.shape()[i]);
  return reshape(x, out);
}

// ---- the Tensor methods -------------------------------------------------------------------

Tensor Tensor::view(const Shape& shape) const {
  checked();
  return mixtape::view(*this, shape);
}
Tensor Tensor::reshape(const Shape& shape) const {
  checked();
  return mixtape::reshape(*this, shape);
}
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  checked();
  return mixtape::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  checked();
  return mixtape::transpose(*this, dim0, dim1);
}
Tensor Tensor::permute(const Shape& dims) const {
  checked();
  return mixtape::permute(*this, dims);
}

Tensor Tensor::t() const {
  checked();
  MT_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dims, got shape ", shape(), "; use transpose(dim0, dim1)");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  checked();
  return mixtape::slice(*this, dim, start, end, step);
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  checked();
  int64_t d = wrap_dim(dim_in, dim(), "narrow", shape());
  int64_t n = shape()[d];
  if (start < 0) start += n;
  MT_CHECK(start >= 0 && length >= 0 && start <= n && length <= n - start, "narrow: start ", start, " and length ",
           length, " exceed dim ", d, " of size ", n, " (shape ", shape(), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  checked();
  return autograd::apply<Select>(*this, dim, index);
}
Tensor Tensor::expand(const Shape& shape) const {
  checked();
  return autograd::apply<Expand>(*this, shape);
}

Tensor Tensor::squeeze() const {
  checked();
  Shape out;
  for (int64_t s : shape())
    if (s != 1) out.push_back(s);
  return view(out);
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  checked();
  int64_t d = wrap_dim(dim_in, dim(), "squeeze", shape());
  if (dim() == 0 || shape()[d] != 1) return *this;
  Shape out = shape();
  out.erase(d);
  return view(out);
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  checked();
  int64_t d = wrap_dim(dim_in, dim() + 1, "unsqueeze", shape());
  Shape out = shape();
  out.insert(d, 1);
  return view(out);
}

Tensor Tensor::contiguous() const {
  checked();
  if (is_contiguous()) return *this;
  const OpNameScope name_scope("contiguous");  // the clone's errors name what the user called
  return clone();
}
Tensor Tensor::clone() const {
  checked();
  return autograd::apply<Clone>(*this);
}

}  // namespace mixtape
