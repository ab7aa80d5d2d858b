// ops/matmul.cpp — matmul and linear: forward, backward and precision category.
//
// Both are "lower precision" ops: under autocast their f32/f16/bf16 inputs
// become the autocast dtype, and kernels::matmul multiplies with f32
// accumulation and rounds once. The one design idea: every gradient is a
// product of transposed views (raw::transpose, no copies) that keeps that one
// rounding. Where a gradient also sums over broadcast batch dims it is either
// folded into one GEMM (the batch becomes rows: x @ W, linear) or computed in
// f32, summed and rounded once.
#include <algorithm>

#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;

namespace {

/// x @ y (both >= 2-D) as an operand's gradient of `shape`: when x @ y has
/// more or wider batch dims than `shape`, they are summed in f32 and rounded
/// once to x's dtype.
Tensor matmul_to(const Tensor& x, const Tensor& y, const Shape& shape) {
  Shape batch_x, batch_y;
  for (int64_t d = 0; d + 2 < x.dim(); ++d) batch_x.push_back(x.size(d));
  for (int64_t d = 0; d + 2 < y.dim(); ++d) batch_y.push_back(y.size(d));
  Shape full = broadcast_shapes(batch_x, batch_y, "matmul");
  full.push_back(x.size(-2)), full.push_back(y.size(-1));
  const DType dtype = x.dtype();
  if (full == shape) return kernels::matmul(x, y, dtype);
  return raw::to(ops::sum_to(kernels::matmul(x, y, acc_dtype(dtype)), shape), dtype);
}

/// t (..., k) as a matrix (rows, k), every leading dim folded into the rows; copies only when strides refuse a view.
Tensor fold_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return raw::reshape(t, {rows, t.size(-1)});
}

/// torch.matmul's operands: defined, floating, one device, >= 1 dim each, matching inner dims, broadcastable batch
/// dims (apply<Matmul> has already given them one dtype).
void check_matmul(const Tensor& a, const Tensor& b) {
  const char* op = "matmul";
  ops::check::defined(op, a, "a");
  ops::check::defined(op, b, "b");
  ops::check::same_device(op, a, "a", b, "b");
  ops::check::same_dtype(op, a, "a", b, "b");
  MT_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), op, ": expected floating tensors (f64, f32, f16, bf16), got ",
           a.dtype(), " and ", b.dtype(), " (shapes ", a.shape(), " and ", b.shape(),
           "); integer matmul is not supported");
  MT_CHECK(a.dim() >= 1 && b.dim() >= 1, op, ": both arguments need at least 1 dim, got shapes ", a.shape(), " and ",
           b.shape());
  const int64_t k_a = a.size(-1);
  const int64_t k_b = b.dim() == 1 ? b.size(0) : b.size(-2);
  MT_CHECK(k_a == k_b, op, ": shapes cannot be multiplied (", a.shape(), " and ", b.shape(), ")");
  // Batch dims (all but the last two) broadcast, right-aligned.
  const int64_t batch_a = std::max<int64_t>(a.dim() - 2, 0), batch_b = std::max<int64_t>(b.dim() - 2, 0);
  for (int64_t i = 1; i <= std::min(batch_a, batch_b); ++i) {
    const int64_t da = a.size(batch_a - i), db = b.size(batch_b - i);
    MT_CHECK(da == db || da == 1 || db == 1, op, ": the batch dims of shapes ", a.shape(), " and ", b.shape(),
             " cannot be broadcast together (", da, " vs ", db, ")");
  }
  MT_CHECK(std::max(batch_a, batch_b) + 2 <= Shape::kMaxDims, op, ": the result of shapes ", a.shape(), " and ",
           b.shape(), " would exceed ", Shape::kMaxDims, " dims");
}

struct Matmul {
  static constexpr const char* kName = "matmul";
  static constexpr Precision kPrecision = Precision::kLowerPrecision;  // Tensor Core GEMM, f32 accumulation
  struct Ctx : autograd::Ctx {
    Shape a_shape, b_shape;
  };
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_matmul(a, b);
    Tensor y = kernels::matmul(a, b, a.dtype());
    ctx.a_shape = a.shape(), ctx.b_shape = b.shape();
    // Each gradient needs the other operand only.
    ctx.save_for_backward(ctx.needs_input_grad(1) ? a : Tensor(), ctx.needs_input_grad(0) ? b : Tensor());
    return y;
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const bool a_vec = ctx.a_shape.size() == 1, b_vec = ctx.b_shape.size() == 1;
    // Undo torch.matmul's promotion in dy: a 1-D a was a row (1, k), a 1-D b a column (k, 1).
    Tensor g = dy;
    if (b_vec) g = raw::unsqueeze(g, g.dim());
    if (a_vec) g = raw::unsqueeze(g, g.dim() - 1);  // g: (batch..., m, n)
    Tensor da, db;
    if (ctx.needs_input_grad(0)) {  // dA = dY · Bᵀ
      const Tensor& b = ctx.saved(1);
      const Tensor bt = raw::transpose(b_vec ? raw::unsqueeze(b, 1) : b, -1, -2);
      const Shape a2 = a_vec ? Shape{1, ctx.a_shape[0]} : ctx.a_shape;
      da = raw::reshape(matmul_to(g, bt, a2), ctx.a_shape);
    }
    if (ctx.needs_input_grad(1)) {  // dB = Aᵀ · dY
      const Tensor& a = ctx.saved(0);
      const Tensor a2 = a_vec ? raw::unsqueeze(a, 0) : a;
      const Shape b2 = b_vec ? Shape{ctx.b_shape[0], 1} : ctx.b_shape;
      if (b2.size() == 2 && a2.dim() > 2) {
        // A batch against one matrix (x @ W): the batch folds into rows and one GEMM sums it.
        db = kernels::matmul(raw::transpose(fold_rows(a2), 0, 1), fold_rows(g), g.dtype());
      } else {
        db = matmul_to(raw::transpose(a2, -1, -2), g, b2);
      }
      db = raw::reshape(db, ctx.b_shape);
    }
    return {da, db};
  }
};
MT_REGISTER_OP(Matmul);

struct Linear {
  static constexpr const char* kName = "linear";
  static constexpr Precision kPrecision = Precision::kLowerPrecision;  // Tensor Core GEMM, f32 accumulation
  struct Ctx : autograd::Ctx {
    Shape x_shape;  // (..., in_features)
  };
  /// x (..., in), weight (out, in), bias (out) or undefined -> (..., out).
  static Tensor forward(Ctx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    MT_CHECK(x.defined() && weight.defined(), "linear: x and weight must be defined tensors");
    ops::check::floating(kName, x, "x");
    ops::check::same_device(kName, x, "x", weight, "weight");
    if (bias.defined()) ops::check::same_device(kName, x, "x", bias, "bias");
    MT_CHECK(weight.dim() == 2, "linear: expected weight of 2 dims (out_features, in_features), got ", weight.shape());
    MT_CHECK(x.dim() >= 1, "linear: expected x of at least 1 dim (..., in_features), got ", x.shape());
    MT_CHECK(x.size(-1) == weight.size(1), "linear: x and weight shapes cannot be multiplied (", x.shape(), " and ",
             weight.shape(), "ᵀ): x's last dim must equal in_features = ", weight.size(1));
    MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "linear: expected bias of shape [",
             weight.size(0), "] for weight ", weight.shape(), ", got ", bias.shape());
    MT_CHECK(x.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
             "linear: x, weight and bias must share a dtype, got ", x.dtype(), ", ", weight.dtype(), " and ",
             bias.defined() ? dtype_name(bias.dtype()) : "no bias", " (cast one, or run under autocast)");
    ctx.x_shape = x.shape();
    ctx.save_for_backward(ctx.needs_input_grad(1) ? x : Tensor(), ctx.needs_input_grad(0) ? weight : Tensor());

    const Tensor wt = raw::transpose(weight, 0, 1);  // (in, out), read in place
    Tensor y;
    if (!bias.defined()) {
      y = kernels::matmul(fold_rows(x), wt, x.dtype());
    } else {
      y = kernels::addmm(bias, fold_rows(x), wt, x.dtype());  // the bias is added in f32 before the one rounding
    }
    Shape out_shape = x.shape();
    out_shape[out_shape.size() - 1] = weight.size(0);
    return raw::view(y, out_shape);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor g = fold_rows(dy);  // (rows, out)
    Tensor dx, dweight, dbias;
    if (ctx.needs_input_grad(0))  // dY · W
      dx = raw::reshape(kernels::matmul(g, ctx.saved(1), g.dtype()), ctx.x_shape);
    if (ctx.needs_input_grad(1))  // dYᵀ · X over the flattened leading dims
      dweight = kernels::matmul(raw::transpose(g, 0, 1), fold_rows(ctx.saved(0)), g.dtype());
    if (ctx.needs_input_grad(2)) {  // Σ dY over the rows, accumulated in f32 for f16/bf16
      const int64_t rows_dim = 0;
      dbias = kernels::reduce(kernels::ReduceOp::kSum, g, std::span<const int64_t>(&rows_dim, 1), false, g.dtype());
    }
    return {dx, dweight, dbias};
  }
};
MT_REGISTER_OP(Linear);

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return autograd::apply<Matmul>(a, b); }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return autograd::apply<Linear>(x, weight, bias);
}

}  // namespace mixtape
