// ops/conv.cpp — conv2d: forward, backward and precision category.
//
// The one design idea: the op checks, saves and routes; the backend convolves. Each device picks its algorithm
// behind the kernel table (kernels::conv2d and its two gradients, ops/backend/kernels.h): im2col + GEMM
// (ops/backend/conv_gemm.h) everywhere, and on the CPU Winograd F(4x4, 3x3) for 3x3 windows of stride 1
// (ops/cpu/conv_winograd.h; f32, f16 and bf16 data, computed in f32). It is a "lower precision" op like matmul:
// f16/bf16 products accumulate in f32, and a result that is summed further (the bias add, the batch sum of dW,
// overlapping windows in dX) stays in f32 until its one rounding.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/backend/conv_gemm.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;

namespace {

/// Shapes, dtypes and options, with messages naming conv2d and the shapes.
void check_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  MT_CHECK(x.defined() && weight.defined(), "conv2d: input and weight must be defined tensors");
  ops::check::floating("conv2d", x, "input");
  ops::check::same_device("conv2d", x, "input", weight, "weight");
  if (bias.defined()) ops::check::same_device("conv2d", x, "input", bias, "bias");
  MT_CHECK(x.dim() == 3 || x.dim() == 4, "conv2d: expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got ",
           x.shape());
  MT_CHECK(weight.dim() == 4, "conv2d: expected weight of 4 dims (C_out, C_in, kH, kW), got ", weight.shape());
  const int64_t c_in = x.size(-3);
  MT_CHECK(c_in == weight.size(1), "conv2d: input ", x.shape(), " has ", c_in, " channels but weight ",
           weight.shape(), " expects C_in = ", weight.size(1));
  MT_CHECK(weight.size(0) > 0 && weight.size(2) > 0 && weight.size(3) > 0, "conv2d: weight ", weight.shape(),
           " has an empty dim");
  MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "conv2d: expected bias of shape [",
           weight.size(0), "] for weight ", weight.shape(), ", got ", bias.shape());
  MT_CHECK(x.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
           "conv2d: input, weight and bias must share a dtype, got ", x.dtype(), ", ", weight.dtype(), " and ",
           bias.defined() ? dtype_name(bias.dtype()) : "no bias", " (cast one, or run under autocast)");
  // Stride, dilation, padding, the kernel against the padded input, and sizes that would overflow: the window
  // checks every windowed op shares (on the batched shape).
  const Shape batched = x.dim() == 4 ? x.shape() : Shape{1, x.size(0), x.size(1), x.size(2)};
  ops::check::window("conv2d", batched,
                     {{weight.size(2), weight.size(3)}, {o.stride[0], o.stride[1]}, {o.padding[0], o.padding[1]},
                      {o.dilation[0], o.dilation[1]}});
}

struct Conv2d {
  static constexpr const char* kName = "conv2d";
  static constexpr Precision kPrecision = Precision::kLowerPrecision;  // a GEMM: Tensor Cores, f32 accumulation
  struct Ctx : autograd::Ctx {
    kernels::Window2d window{};
    Shape x_shape;           // (N, C_in, H, W), the batch dim added for unbatched input
    bool unbatched = false;  // the input was (C_in, H, W)
  };

  static Tensor forward(Ctx& ctx, const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                        const Conv2dOptions& o) {
    check_conv2d(x_in, weight, bias, o);
    ctx.unbatched = x_in.dim() == 3;
    const Tensor x = ctx.unbatched ? raw::unsqueeze(x_in, 0) : x_in;  // (N, C_in, H, W)
    ctx.window = {{weight.size(2), weight.size(3)},
                  {o.stride[0], o.stride[1]},
                  {o.padding[0], o.padding[1]},
                  {o.dilation[0], o.dilation[1]}};
    ctx.x_shape = x.shape();
    ctx.save_for_backward(ctx.needs_input_grad(1) ? x : Tensor(), ctx.needs_input_grad(0) ? weight : Tensor());
    const Tensor y = kernels::conv2d(x, weight, bias, ctx.window);  // (N, C_out, H_out, W_out)
    return ctx.unbatched ? raw::squeeze(y, 0) : y;
  }

  static Grads backward(Ctx& ctx, const Tensor& dy_in) {
    const Tensor dy = ctx.unbatched ? raw::unsqueeze(dy_in, 0) : dy_in;  // (N, C_out, H_out, W_out)
    Tensor dx, dweight, dbias;
    if (ctx.needs_input_grad(0)) {
      dx = kernels::conv2d_backward_input(dy, ctx.saved(1), ctx.x_shape, ctx.window);  // (N, C_in, H, W)
      if (ctx.unbatched) dx = raw::squeeze(dx, 0);
    }
    if (ctx.needs_input_grad(1)) {
      // dbias comes with dweight: a backend may sum it while it reads dy anyway.
      kernels::Conv2dWeightGrads grads =
          kernels::conv2d_backward_weight(dy, ctx.saved(0), ctx.window, ctx.needs_input_grad(2));
      dweight = std::move(grads.dweight);
      dbias = std::move(grads.dbias);
    } else if (ctx.needs_input_grad(2)) {
      dbias = kernels::conv2d_bias_grad(dy);  // (C_out), the weight frozen
    }
    return {dx, dweight, dbias};
  }
};
MT_REGISTER_OP(Conv2d);

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options) {
  return autograd::apply<Conv2d>(x, weight, bias, options);
}

}  // namespace mixtape
