// ops/conv.cpp — conv2d: forward, backward and precision category.
//
// The one design idea: a convolution is a GEMM over im2col columns. With the
// weight viewed as (C_out, C_in·kH·kW) and the input unfolded into
// (N, C_in·kH·kW, H_out·W_out) columns, y = W · cols is one batched product,
// and so are both gradients: dW = Σ_n dY_n · cols_nᵀ, dX = col2im(Wᵀ · dY).
// It is a "lower precision" op like matmul: f16/bf16 products accumulate in
// f32, and a result that is summed further (the bias add, the batch sum of dW,
// col2im's overlapping windows) stays in f32 until its one rounding.
#include <algorithm>

#include <mixtape/autograd/function.h>
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
  for (int a = 0; a < 2; ++a) {
    MT_CHECK(o.stride[a] > 0 && o.dilation[a] > 0 && o.padding[a] >= 0,
             "conv2d: stride and dilation must be positive and padding non-negative, got stride ", o.stride[0], "x",
             o.stride[1], ", padding ", o.padding[0], "x", o.padding[1], ", dilation ", o.dilation[0], "x",
             o.dilation[1]);
    const int64_t span = o.dilation[a] * (weight.size(2 + a) - 1) + 1;
    const int64_t padded = x.size(x.dim() - 2 + a) + 2 * o.padding[a];
    MT_CHECK(span <= padded, "conv2d: the kernel ", a == 0 ? "height" : "width", " (", span,
             " with dilation) is larger than the padded input's (", padded, "): input ", x.shape(), ", weight ",
             weight.shape(), ", padding ", o.padding[0], "x", o.padding[1], ", dilation ", o.dilation[0], "x",
             o.dilation[1]);
  }
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
    const int64_t c_out = weight.size(0), k = weight.numel() / std::max<int64_t>(c_out, 1);
    ctx.window = {{weight.size(2), weight.size(3)},
                  {o.stride[0], o.stride[1]},
                  {o.padding[0], o.padding[1]},
                  {o.dilation[0], o.dilation[1]}};
    ctx.x_shape = x.shape();
    ctx.save_for_backward(ctx.needs_input_grad(1) ? x : Tensor(), ctx.needs_input_grad(0) ? weight : Tensor());

    const Tensor cols = kernels::im2col(x, ctx.window);       // (N, C_in·kH·kW, L)
    const Tensor w2 = raw::reshape(weight, {c_out, k});       // (C_out, C_in·kH·kW)
    Tensor y;                                                 // (N, C_out, L)
    if (!bias.defined()) {
      y = kernels::matmul(w2, cols, x.dtype());
    } else {
      const DType acc = acc_dtype(x.dtype());
      y = kernels::binary(kernels::BinaryOp::kAdd, kernels::matmul(w2, cols, acc),
                          raw::to(raw::reshape(bias, {c_out, 1}), acc));
      y = raw::to(y, x.dtype());
    }
    y = raw::view(y, {x.size(0), c_out, kernels::window_output_size(x.size(2), ctx.window, 0),
                          kernels::window_output_size(x.size(3), ctx.window, 1)});
    return ctx.unbatched ? raw::squeeze(y, 0) : y;
  }

  static Grads backward(Ctx& ctx, const Tensor& dy_in) {
    const Tensor dy = ctx.unbatched ? raw::unsqueeze(dy_in, 0) : dy_in;  // (N, C_out, H_out, W_out)
    const int64_t n = dy.size(0), c_out = dy.size(1);
    const Tensor g = raw::reshape(dy, {n, c_out, dy.size(2) * dy.size(3)});  // (N, C_out, L)
    const DType dtype = dy.dtype(), acc = acc_dtype(dtype);
    Tensor dx, dweight, dbias;
    if (ctx.needs_input_grad(0)) {  // dX = col2im(Wᵀ · dY), overlapping windows summed in f32
      const Tensor& weight = ctx.saved(1);
      const Tensor w2t = raw::transpose(raw::reshape(weight, {c_out, weight.numel() / c_out}), 0, 1);
      dx = raw::to(kernels::col2im(kernels::matmul(w2t, g, acc), ctx.x_shape, ctx.window), dtype);
      if (ctx.unbatched) dx = raw::squeeze(dx, 0);
    }
    if (ctx.needs_input_grad(1)) {  // dW = Σ_n dY_n · cols_nᵀ, the batch summed in f32
      const Tensor& x = ctx.saved(0);
      const Tensor cols = kernels::im2col(x, ctx.window);  // recomputed: cheaper to keep x than kH·kW copies of it
      const int64_t batch_dim = 0;
      Tensor per_sample = kernels::matmul(g, raw::transpose(cols, 1, 2), acc);  // (N, C_out, C_in·kH·kW)
      dweight = kernels::reduce(kernels::ReduceOp::kSum, per_sample, std::span<const int64_t>(&batch_dim, 1), false,
                                dtype);
      dweight = raw::reshape(dweight, {c_out, x.size(1), ctx.window.kernel[0], ctx.window.kernel[1]});
    }
    if (ctx.needs_input_grad(2)) {
      const int64_t dims[2] = {0, 2};
      dbias = kernels::reduce(kernels::ReduceOp::kSum, g, dims, false, g.dtype());
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
