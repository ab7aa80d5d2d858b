// ops/reduce.cpp — sum, mean, max, min, argmax and argmin: forward, backward and precision category of each.
//
// The forwards are kernels::reduce, which accumulates f16/bf16 in f32 and
// rounds each result once. The backwards put the gradient back into the
// input's shape without copying: sum and mean re-insert the reduced dims as
// size 1 and expand (a stride-0 view); max (min) along a dim sends it to the
// first maximal (minimal) element through scatter_add at the argmax (argmin),
// over every element it is shared equally among the extremal ones (as
// PyTorch's both do).
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

#include <algorithm>

namespace mixtape {

using autograd::Grads;
using kernels::ReduceOp;

namespace {

/// The checked, wrapped and sorted reduced dims of `x` (every dim when `dims` is empty) and the shape that keeps
/// them as size 1.
struct Reduced {
  std::vector<int64_t> dims;
  Shape keep_shape;
  int64_t count = 1;  // elements per output
};
Reduced reduced_dims(const char* op, const Tensor& x, std::span<const int64_t> dims_in) {
  ops::check::defined(op, x, "x");
  Reduced r;
  r.dims = ops::check::reduce_dims(op, x, dims_in);
  r.keep_shape = x.shape();
  for (int64_t d : r.dims) {
    r.count *= x.size(d);
    r.keep_shape[d] = 1;
  }
  return r;
}

struct Sum {
  static constexpr const char* kName = "sum";
  static constexpr Precision kPrecision = Precision::kFp32;  // long f16 sums overflow and lose small terms
  struct Ctx : autograd::Ctx {
    Shape input_shape, keep_shape;  // keep_shape: the output with reduced dims kept as size 1
  };
  /// `dims` empty: every dim.
  static Tensor forward(Ctx& ctx, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
    const Reduced r = reduced_dims(kName, x, dims);
    ctx.input_shape = x.shape();
    ctx.keep_shape = r.keep_shape;
    // Floating sums keep their dtype (accumulated in f32 for f16/bf16); bool and integer sums are i64.
    return kernels::reduce(ReduceOp::kSum, x, r.dims, keepdim, is_floating(x.dtype()) ? x.dtype() : DType::kI64);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {raw::expand(raw::reshape(dy, ctx.keep_shape), ctx.input_shape)};
  }
};
MT_REGISTER_OP(Sum);

struct Mean {
  static constexpr const char* kName = "mean";
  static constexpr Precision kPrecision = Precision::kFp32;
  struct Ctx : autograd::Ctx {
    Shape input_shape, keep_shape;
    int64_t count = 1;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
    const Reduced r = reduced_dims(kName, x, dims);
    ops::check::arithmetic(kName, x, /*integers=*/false);
    ctx.input_shape = x.shape();
    ctx.keep_shape = r.keep_shape;
    ctx.count = r.count;
    return kernels::reduce(ReduceOp::kMean, x, r.dims, keepdim, x.dtype());
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    // Scale the (small) output gradient, then expand it: one rounding per element.
    Tensor scaled = kernels::scalar(kernels::ScalarOp::kMul, dy, 1.0 / static_cast<double>(ctx.count));
    return {raw::expand(raw::reshape(scaled, ctx.keep_shape), ctx.input_shape)};
  }
};
MT_REGISTER_OP(Mean);

/// max (kIsMax) or min of every element (dim unset: a 0-d result) or along one dim.
template <bool kIsMax>
struct Extremum {
  static constexpr const char* kName = kIsMax ? "max" : "min";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // exact in any dtype
  static constexpr ReduceOp kValue = kIsMax ? ReduceOp::kMax : ReduceOp::kMin;
  static constexpr ReduceOp kIndex = kIsMax ? ReduceOp::kArgmax : ReduceOp::kArgmin;
  struct Ctx : autograd::Ctx {
    Shape input_shape;
    int64_t dim = -1;  // -1: every element
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
    ctx.input_shape = x.shape();
    const int64_t one_dim[] = {dim.value_or(0)};
    const Reduced r = reduced_dims(kName, x, dim ? std::span<const int64_t>(one_dim) : std::span<const int64_t>());
    ops::check::nonempty_reduction(kName, x, r.dims);
    if (!dim) {
      Tensor y = kernels::reduce(kValue, x, r.dims, false, x.dtype());
      if (ctx.recording) ctx.save_for_backward(x, y);
      return y;
    }
    ctx.dim = x.dim() == 0 ? -1 : r.dims[0];
    if (ctx.recording) ctx.save_for_backward(kernels::reduce(kIndex, x, r.dims, /*keepdim=*/true, DType::kI64));
    return kernels::reduce(kValue, x, r.dims, keepdim, x.dtype());
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    if (ctx.input_shape.empty()) return {dy};  // the max or min of a 0-d tensor is the tensor
    if (ctx.dim < 0) return {shared_among_extrema(dy, ctx.saved(0), ctx.saved(1))};
    // index was kept with the reduced dim as size 1; dy may not have been.
    const Tensor index = ctx.saved(0);
    return {kernels::scatter_add(ctx.input_shape, ctx.dim, index, raw::reshape(dy, index.shape()))};
  }
  /// The gradient of y = max(x) (or min) over every element, as PyTorch's (evenly_distribute_backward): dy / k at
  /// each of the k elements equal to y (each NaN when y is NaN), 0 elsewhere, so that tied extrema, a ReLU's zeros or
  /// f16's repeated values, get equal parts. dy / k is formed in acc_dtype and rounded once; k never leaves the
  /// device.
  static Tensor shared_among_extrema(const Tensor& dy, const Tensor& x, const Tensor& y) {
    using kernels::BinaryOp;
    const Tensor y_is_nan = kernels::binary(BinaryOp::kNe, y, y);
    const Tensor is_extremum =
        kernels::where(y_is_nan, kernels::binary(BinaryOp::kNe, x, x), kernels::binary(BinaryOp::kEq, x, y));
    const DType acc = acc_dtype(dy.dtype());
    const Tensor k = ops::reduce_all(ReduceOp::kSum, is_extremum, acc);
    const Tensor part = raw::to(kernels::binary(BinaryOp::kDiv, raw::to(dy, acc), k), dy.dtype());
    return kernels::where(is_extremum, part, ops::scalar_like(0, dy));
  }
};
using Max = Extremum<true>;
using Min = Extremum<false>;
MT_REGISTER_OP(Max);
MT_REGISTER_OP(Min);

/// argmax and argmin have no gradient (their output is an integer index); they are listed so the precision table
/// and the registry know them. argmax() and argmin() call the kernel directly.
struct Argmax {
  static constexpr const char* kName = "argmax";
  static constexpr Precision kPrecision = Precision::kPassthrough;
};
MT_REGISTER_OP(Argmax);
struct Argmin {
  static constexpr const char* kName = "argmin";
  static constexpr Precision kPrecision = Precision::kPassthrough;
};
MT_REGISTER_OP(Argmin);

/// argmax or argmin (`op`) along `dims` (one dim, or none: the flattened tensor).
Tensor arg_extremum(const char* name, ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim) {
  const Reduced r = reduced_dims(name, x, dims);
  ops::check::nonempty_reduction(name, x, r.dims);
  return kernels::reduce(op, x, r.dims, keepdim, DType::kI64);
}

}  // namespace

Tensor sum(const Tensor& x) { return autograd::apply<Sum>(x, std::vector<int64_t>{}, false); }
/// Empty `dims` reduce every dim (ops::check::reduce_dims' rule), keeping them as size 1 with `keepdim`.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return autograd::apply<Sum>(x, dims, keepdim);
}

Tensor mean(const Tensor& x) { return autograd::apply<Mean>(x, std::vector<int64_t>{}, false); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return autograd::apply<Mean>(x, dims, keepdim);
}

Tensor max(const Tensor& x) { return autograd::apply<Max>(x, std::optional<int64_t>{}, false); }
Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return autograd::apply<Max>(x, std::optional<int64_t>{dim}, keepdim);
}

Tensor min(const Tensor& x) { return autograd::apply<Min>(x, std::optional<int64_t>{}, false); }
Tensor min(const Tensor& x, int64_t dim, bool keepdim) {
  return autograd::apply<Min>(x, std::optional<int64_t>{dim}, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t dims[] = {dim};
  return arg_extremum("argmax", ReduceOp::kArgmax, x, dims, keepdim);
}
Tensor argmax(const Tensor& x) { return arg_extremum("argmax", ReduceOp::kArgmax, x, {}, false); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t dims[] = {dim};
  return arg_extremum("argmin", ReduceOp::kArgmin, x, dims, keepdim);
}
Tensor argmin(const Tensor& x) { return arg_extremum("argmin", ReduceOp::kArgmin, x, {}, false); }

}  // namespace mixtape
