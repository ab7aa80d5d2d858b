// ops/norm.cpp — layer_norm: forward, backward and precision category.
//
// One fused kernel each way (kernels::layer_norm / layer_norm_backward):
// each row's mean and variance are computed in f32 (f64 for f64) and kept
// for the backward, so the backward never recomputes them and f16 data
// called outside autocast still gets f32 statistics. weight and bias are
// optional: an undefined one gets no edge on the tape and no gradient.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/ops.h>

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

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return autograd::apply<LayerNorm>(x, normalized_shape, weight, bias, eps);
}

}  // namespace mixtape
