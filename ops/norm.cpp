// ops/norm.cpp — layer_norm and batch_norm: forward, backward and precision category.
//
// One fused kernel each way (kernels::layer_norm / layer_norm_backward,
// kernels::batch_norm / batch_norm_backward): each row's (channel's) mean and
// variance are computed in f32 (f64 for f64) and kept for the backward, so the
// backward never recomputes them and f16 data called outside autocast still
// gets f32 statistics. weight and bias are optional: an undefined one gets no
// edge on the tape and no gradient. batch_norm's running statistics are state,
// not inputs: updated in place by its training forward, never differentiated.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/ops.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace mixtape {

using autograd::Grads;

namespace {

struct LayerNorm {
  static constexpr const char* kName = "layer_norm";
  static constexpr Precision kPrecision = Precision::kFp32;  // variance of f16 activations overflows and cancels
  struct Ctx : autograd::Ctx {
    Shape weight_shape, bias_shape;  // normalized_shape, for the parameter gradients
    bool has_weight = false, has_bias = false;
  };
  /// x (..., *normalized_shape); weight and bias (*normalized_shape) or undefined.
  static Tensor forward(Ctx& ctx, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                        const Tensor& bias, double eps) {
    MT_CHECK(x.defined(), kName, ": x is an undefined tensor");
    ops::check::floating(kName, x, "x");
    MT_CHECK(eps >= 0, kName, ": eps must be >= 0, got ", eps);
    MT_CHECK(!normalized_shape.empty(), kName, ": normalized_shape must have at least one dim (x shape ", x.shape(),
             ")");
    bool match = normalized_shape.size() <= x.dim();
    for (int64_t i = 0; match && i < normalized_shape.size(); ++i)
      match = x.size(x.dim() - normalized_shape.size() + i) == normalized_shape[i];
    MT_CHECK(match, kName, ": normalized_shape ", normalized_shape, " does not match the trailing dims of x (shape ",
             x.shape(), ")");
    for (const auto& [p, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
      if (!p->defined()) continue;
      MT_CHECK(p->shape() == normalized_shape, kName, ": ", name, " of shape ", p->shape(),
               " does not match normalized_shape ", normalized_shape);
      ops::check::floating(kName, *p, name);
      ops::check::same_device(kName, x, "x", *p, name);
    }
    ctx.has_weight = weight.defined();
    ctx.has_bias = bias.defined();
    ctx.weight_shape = ctx.bias_shape = normalized_shape;
    if (normalized_shape.numel() == 0) {  // rows of nothing (the kernels divide by the row length): an empty
      ctx.save_for_backward(x, Tensor(), Tensor(), weight);  // result, as PyTorch's; backward: no rows
      return empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
    }

    kernels::LayerNormResult r = kernels::layer_norm(x, normalized_shape.numel(), weight, bias, eps);
    ctx.save_for_backward(x, r.mean, r.rstd, weight);
    return r.y;
  }
  // dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)) with g = dy · weight; dweight = Σ dy · x̂; dbias = Σ dy
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& x = ctx.saved(0);
    const Tensor& weight = ctx.saved(3);
    if (x.numel() == 0) {  // no rows: nothing flows
      auto zeros_of = [&](bool has, const Shape& shape, DType dtype) {
        return has ? zeros(shape, TensorOptions(dtype).device(x.device())) : Tensor();
      };
      return {zeros_like(x), zeros_of(ctx.has_weight, ctx.weight_shape, ctx.has_weight ? weight.dtype() : x.dtype()),
              zeros_of(ctx.has_bias, ctx.bias_shape, x.dtype())};
    }
    const bool want_dbias = ctx.has_bias && ctx.needs_input_grad(2);
    kernels::LayerNormGrads g = kernels::layer_norm_backward(dy, x, ctx.saved(1), ctx.saved(2), weight, want_dbias);
    Tensor dweight = ctx.needs_input_grad(1) ? raw::reshape(g.dweight, ctx.weight_shape) : Tensor();
    Tensor dbias = g.dbias.defined() ? raw::reshape(g.dbias, ctx.bias_shape) : Tensor();
    return {ctx.needs_input_grad(0) ? g.dx : Tensor(), dweight, dbias};
  }
};
MT_REGISTER_OP(LayerNorm);

/// `running` (C) += momentum · (scale · stat − running), as PyTorch's (1 − momentum) · running + momentum · scale ·
/// stat, computed in stat's dtype (acc_dtype(x)) and written back into `running`, whatever its floating dtype.
void update_running(const Tensor& running, const Tensor& stat, double momentum, double scale) {
  const Tensor r = running.dtype() == stat.dtype() ? running : raw::to(running, stat.dtype());
  kernels::scalar_(kernels::ScalarOp::kMul, r, 1.0 - momentum);
  kernels::binary_(kernels::BinaryOp::kAdd, r, kernels::scalar(kernels::ScalarOp::kMul, stat, momentum * scale));
  if (!r.is_same(running)) raw::copy_(running, r);
}

struct BatchNorm {
  static constexpr const char* kName = "batch_norm";
  // Passthrough, not fp32: the kernels keep the statistics (and the running ones) in f32 whatever x's dtype, so
  // f16 x loses nothing by staying f16 and is not copied to f32 and back. PyTorch's CUDA autocast leaves
  // batch_norm off its fp32 list for the same reason (cuDNN keeps the statistics in f32 internally).
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    bool batch_stats = false;  // normalised with the batch's statistics: dx flows through them too
    bool has_weight = false, has_bias = false;
    DType bias_dtype = DType::kF32;
    Shape param_shape;  // (C)
  };
  /// x (N, C, *); running_mean/running_var (C) or undefined; weight and bias (C) or undefined.
  static Tensor forward(Ctx& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
    MT_CHECK(x.defined(), kName, ": x is an undefined tensor");
    ops::check::floating(kName, x, "x");
    MT_CHECK(x.dim() >= 2, kName, ": expected x of shape (N, C), (N, C, L) or (N, C, H, W), got shape ", x.shape());
    MT_CHECK(eps >= 0, kName, ": eps must be >= 0, got ", eps);
    MT_CHECK(std::isfinite(momentum), kName, ": momentum must be a finite number, got ", momentum,
             " (a cumulative average, PyTorch's momentum=None, is the module's: a factor of 1 / batches seen)");
    const int64_t C = x.size(1);
    MT_CHECK(running_mean.defined() == running_var.defined(), kName,
             ": running_mean and running_var must both be given or both be undefined (running_mean ",
             running_mean.defined() ? "given" : "undefined", ", running_var ",
             running_var.defined() ? "given" : "undefined", ")");
    for (const auto& [p, name] : {std::pair{&running_mean, "running_mean"}, std::pair{&running_var, "running_var"},
                                  std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
      if (!p->defined()) continue;
      MT_CHECK(p->shape() == Shape{C}, kName, ": ", name, " of shape ", p->shape(), " does not match the ", C,
               " channels of x (shape ", x.shape(), ")");
      ops::check::floating(kName, *p, name);
      ops::check::same_device(kName, x, "x", *p, name);
    }
    const int64_t count = x.numel() / std::max<int64_t>(C, 1);  // values a channel
    MT_CHECK(!training || count > 1, kName, ": expected more than 1 value per channel when training, got x of shape ",
             x.shape());

    const bool batch_stats = training || !running_mean.defined();
    const DType acc = acc_dtype(x.dtype());
    auto as_acc = [&](const Tensor& t) { return t.dtype() == acc ? t : raw::to(t, acc); };
    kernels::BatchNormResult r = batch_stats
                                     ? kernels::batch_norm(x, Tensor(), Tensor(), weight, bias, eps)
                                     : kernels::batch_norm(x, as_acc(running_mean), as_acc(running_var), weight,
                                                           bias, eps);
    if (training && running_mean.defined()) {
      update_running(running_mean, r.mean, momentum, 1.0);
      // The running variance is the unbiased one: count / (count − 1) times the biased variance normalised with.
      update_running(running_var, r.var, momentum, static_cast<double>(count) / static_cast<double>(count - 1));
    }
    ctx.batch_stats = batch_stats;
    ctx.has_weight = weight.defined();
    ctx.has_bias = bias.defined();
    ctx.bias_dtype = bias.defined() ? bias.dtype() : x.dtype();
    ctx.param_shape = Shape{C};
    ctx.save_for_backward(x, r.mean, r.invstd, weight);
    return r.y;
  }
  // x̂ = (x − mean)·invstd, g = dy · weight. Batch statistics: dx = invstd · (g − mean(g) − x̂ · mean(g · x̂)) over
  // the channel; running statistics are constants: dx = invstd · g. dweight = Σ dy · x̂; dbias = Σ dy. The running
  // statistics get no gradient (they are state, as in PyTorch).
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& x = ctx.saved(0);
    const Tensor& weight = ctx.saved(3);
    const bool want_dbias = ctx.has_bias && ctx.needs_input_grad(4);
    kernels::BatchNormGrads g =
        kernels::batch_norm_backward(dy, x, ctx.saved(1), ctx.saved(2), weight, ctx.batch_stats, want_dbias);
    Tensor dweight = ctx.has_weight && ctx.needs_input_grad(3) ? g.dweight : Tensor();
    Tensor dbias = g.dbias.defined() && g.dbias.dtype() != ctx.bias_dtype ? raw::to(g.dbias, ctx.bias_dtype) : g.dbias;
    return {ctx.needs_input_grad(0) ? g.dx : Tensor(), Tensor(), Tensor(), dweight, dbias};
  }
};
MT_REGISTER_OP(BatchNorm);

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return autograd::apply<LayerNorm>(x, normalized_shape, weight, bias, eps);
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return autograd::apply<BatchNorm>(x, running_mean, running_var, weight, bias, training, momentum, eps);
}

}  // namespace mixtape
