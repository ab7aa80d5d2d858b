// ops/index.cpp — index_select and cat: forward, backward and precision category; stack, cat of unsqueezed
// tensors; randperm, which has neither.
//
// Both move values without arithmetic, so their forwards are exact in any
// dtype. index_select's backward is a scatter-add (index_add: repeated
// indices sum, in f32 for f16/bf16, rounded once); cat's backward hands each
// input its slice of the gradient as a view (raw::slice, no copy). cat is a
// "promote" op: apply<Cat> casts every input to the widest dtype first, and
// the casts' own backward returns each gradient in its input's dtype.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/ops.h>

#include <vector>

namespace mixtape {

using autograd::Grads;

namespace {

struct IndexSelect {
  static constexpr const char* kName = "index_select";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // copies values: exact in any dtype
  struct Ctx : autograd::Ctx {
    Shape x_shape;
    int64_t dim = 0;  // wrapped
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim, const Tensor& index) {
    ops::check::defined(kName, x, "x");
    MT_CHECK(x.dim() >= 1, kName, ": expected a tensor of at least 1 dim, got shape ", x.shape());
    ctx.dim = wrap_dim(dim, x.dim(), kName, x.shape());
    ops::check::index(kName, index, x.device(), ctx.dim, x.shape());
    ctx.x_shape = x.shape();
    ctx.save_for_backward(index);
    return kernels::index_select(x, ctx.dim, index);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    // No gradient for the (integer) index.
    return {kernels::index_add(ctx.x_shape, ctx.dim, ctx.saved(0), dy), Tensor()};
  }
};
MT_REGISTER_OP(IndexSelect);

struct Cat {
  static constexpr const char* kName = "cat";
  static constexpr Precision kPrecision = Precision::kPromote;  // one output dtype: the widest input's
  struct Ctx : autograd::Ctx {
    int64_t dim = 0;             // wrapped
    std::vector<int64_t> sizes;  // each input's extent along dim
  };
  static Tensor forward(Ctx& ctx, const std::vector<Tensor>& tensors, int64_t dim_in) {
    MT_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
    const Tensor& first = tensors[0];
    for (size_t i = 0; i < tensors.size(); ++i)
      MT_CHECK(tensors[i].defined(), "cat: tensor ", i, " of the list is undefined");
    MT_CHECK(first.dim() >= 1, "cat: zero-dimensional tensor (at position 0) cannot be concatenated");
    const int64_t dim = wrap_dim(dim_in, first.dim(), kName, first.shape());
    Shape out_shape = first.shape();
    out_shape[dim] = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      MT_CHECK(t.dim() == first.dim(), "cat: tensors must have the same number of dims, got ", first.shape(),
               " (tensor 0) and ", t.shape(), " (tensor ", i, ")");
      MT_CHECK(t.device() == first.device(), "cat: tensors must be on one device, got ", first.device(),
               " (tensor 0) and ", t.device(), " (tensor ", i, ")");
      for (int64_t d = 0; d < t.dim(); ++d)
        MT_CHECK(d == dim || t.size(d) == first.size(d), "cat: sizes must match except in dim ", dim, ", got ",
                 first.shape(), " (tensor 0) and ", t.shape(), " (tensor ", i, ") differing in dim ", d);
      out_shape[dim] += t.size(dim);
      ctx.sizes.push_back(t.size(dim));
    }
    ctx.dim = dim;
    // apply<Cat> promoted the inputs already; the copy would also convert any stragglers.
    Tensor out = empty(out_shape, TensorOptions(first.dtype()).device(first.device()));
    int64_t at = 0;
    for (const Tensor& t : tensors) {
      raw::copy_(raw::slice(out, dim, at, at + t.size(dim)), t);
      at += t.size(dim);
    }
    return out;
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    Grads grads;
    int64_t at = 0;
    for (int64_t size : ctx.sizes) {
      grads.push_back(raw::slice(dy, ctx.dim, at, at + size));
      at += size;
    }
    return grads;
  }
};
MT_REGISTER_OP(Cat);

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return autograd::apply<IndexSelect>(x, dim, index);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) { return autograd::apply<Cat>(tensors, dim); }

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  MT_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(tensors[i].defined(), "stack: tensor ", i, " of the list is undefined");
    MT_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: expects each tensor to be of one shape, got ",
             tensors[0].shape(), " (tensor 0) and ", tensors[i].shape(), " (tensor ", i, ")");
  }
  // The new dim may also follow the last one: dims wrap against rank + 1, as PyTorch's.
  const int64_t rank = tensors[0].dim();
  MT_CHECK(dim >= -(rank + 1) && dim <= rank, "stack: dim ", dim, " is out of range for stacking tensors of shape ",
           tensors[0].shape(), "; expected a dim in [", -(rank + 1), ", ", rank, "]");
  const int64_t d = dim < 0 ? dim + rank + 1 : dim;
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));
  return cat(unsqueezed, d);
}

Tensor randperm(int64_t n, Device device, Generator* gen) {
  MT_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  Generator& g = gen != nullptr ? *gen : default_generator();
  const auto [seed, offset] = g.reserve(static_cast<uint64_t>(n));
  return kernels::randperm(n, seed, offset, device);  // (n) i64
}

}  // namespace mixtape
