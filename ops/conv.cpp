// ops/conv.cpp — conv2d: forward, backward and precision category.
//
// The one design idea: a convolution is a GEMM over im2col columns. With the
// weight viewed as (C_out, C_in·kH·kW) and the input unfolded into
// (N, C_in·kH·kW, H_out·W_out) columns, y = W · cols is one batched product,
// and so are both gradients: dW = Σ_n dY_n · cols_nᵀ, dX = col2im(Wᵀ · dY).
// On the CPU the batch goes through in chunks of samples whose columns fit in
// the cache (kCpuChunkBytes): the columns are kH·kW copies of the input, and
// unfolding the whole batch at once (85 MB per step for the MNIST net's
// second conv) costs more in fresh pages and DRAM traffic than its GEMMs.
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
  // Stride, dilation, padding, the kernel against the padded input, and sizes that would overflow: the window
  // checks every windowed op shares (on the batched shape).
  const Shape batched = x.dim() == 4 ? x.shape() : Shape{1, x.size(0), x.size(1), x.size(2)};
  ops::check::window("conv2d", batched,
                     {{weight.size(2), weight.size(3)}, {o.stride[0], o.stride[1]}, {o.padding[0], o.padding[1]},
                      {o.dilation[0], o.dilation[1]}});
}

/// The CPU's column budget per chunk of samples: six samples of the MNIST net's second conv (663 KB of f32 columns
/// each), inside the last-level cache. Measured on the 2-core AVX-512 VM, CNN training step time over the time of
/// its GEMMs alone: 1.4 to 4 MiB ~1.38 (within noise of each other), 8 MiB 1.42, the whole batch 1.54, one sample
/// per chunk (0.7 MB) 1.85.
constexpr int64_t kCpuChunkBytes = int64_t{4} << 20;

/// How many samples go through im2col and the GEMMs together. The CPU takes the batch in cache-sized chunks;
/// other devices take it whole (their caching allocator reuses the columns, and one launch beats many).
int64_t chunk_samples(const Tensor& x, int64_t column_rows, int64_t L) {
  const int64_t n = std::max<int64_t>(x.size(0), 1);
  if (!x.device().is_cpu()) return n;
  const int64_t per_sample = column_rows * L * static_cast<int64_t>(itemsize(acc_dtype(x.dtype())));
  return std::clamp<int64_t>(kCpuChunkBytes / std::max<int64_t>(per_sample, 1), 1, n);
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
    const int64_t n = x.size(0), c_out = weight.size(0), k = weight.numel() / std::max<int64_t>(c_out, 1);
    ctx.window = {{weight.size(2), weight.size(3)},
                  {o.stride[0], o.stride[1]},
                  {o.padding[0], o.padding[1]},
                  {o.dilation[0], o.dilation[1]}};
    ctx.x_shape = x.shape();
    ctx.save_for_backward(ctx.needs_input_grad(1) ? x : Tensor(), ctx.needs_input_grad(0) ? weight : Tensor());

    const int64_t ho = kernels::window_output_size(x.size(2), ctx.window, 0);
    const int64_t wo = kernels::window_output_size(x.size(3), ctx.window, 1);
    const DType dtype = x.dtype(), acc = acc_dtype(dtype);
    const Tensor w2 = raw::reshape(weight, {c_out, k});  // (C_out, C_in·kH·kW)
    const Tensor b2 = bias.defined() ? raw::to(raw::reshape(bias, {c_out, 1}), acc) : Tensor();  // (C_out, 1)
    // One chunk's (B, C_out, L) in acc: W · cols + bias, summed in f32 before the one rounding.
    auto chunk = [&](const Tensor& x_chunk) {
      Tensor y = kernels::matmul(w2, kernels::im2col(x_chunk, ctx.window), acc);
      if (b2.defined()) kernels::binary_(kernels::BinaryOp::kAdd, y, b2);
      return y;
    };
    const int64_t step = chunk_samples(x, k, ho * wo);
    Tensor y;  // (N, C_out, L)
    if (step >= n) {
      y = raw::to(chunk(x), dtype);
    } else {
      y = empty({n, c_out, ho * wo}, TensorOptions(dtype).device(x.device()));
      for (int64_t s = 0; s < n; s += step) {
        const int64_t e = std::min(n, s + step);
        raw::copy_(raw::slice(y, 0, s, e), chunk(raw::slice(x, 0, s, e)));
      }
    }
    y = raw::view(y, {n, c_out, ho, wo});
    return ctx.unbatched ? raw::squeeze(y, 0) : y;
  }

  static Grads backward(Ctx& ctx, const Tensor& dy_in) {
    const Tensor dy = ctx.unbatched ? raw::unsqueeze(dy_in, 0) : dy_in;  // (N, C_out, H_out, W_out)
    const int64_t n = dy.size(0), c_out = dy.size(1), L = dy.size(2) * dy.size(3);
    const Tensor g = raw::reshape(dy, {n, c_out, L});  // (N, C_out, L)
    const DType dtype = dy.dtype(), acc = acc_dtype(dtype);
    const Shape& xs = ctx.x_shape;
    const int64_t k = xs[1] * ctx.window.kernel[0] * ctx.window.kernel[1];
    const bool want_dx = ctx.needs_input_grad(0), want_dw = ctx.needs_input_grad(1);
    Tensor w2t;  // (C_in·kH·kW, C_out)
    if (want_dx) w2t = raw::transpose(raw::reshape(ctx.saved(1), {c_out, k}), 0, 1);

    // One chunk's dX = col2im(Wᵀ · dY), overlapping windows summed in f32, and its share of dW, (C_out, C_in·kH·kW)
    // in acc: Σ_n dY_n · cols_nᵀ, the columns recomputed (cheaper to keep x than kH·kW copies of it).
    auto chunk = [&](int64_t s, int64_t e, Tensor& dx_chunk, Tensor& dw_chunk) {
      const Tensor g_chunk = raw::slice(g, 0, s, e);
      if (want_dx) {
        Shape shape = xs;
        shape[0] = e - s;
        dx_chunk = kernels::col2im(kernels::matmul(w2t, g_chunk, acc), shape, ctx.window);
      }
      if (want_dw) {
        const Tensor cols = kernels::im2col(raw::slice(ctx.saved(0), 0, s, e), ctx.window);
        const int64_t batch_dim = 0;
        dw_chunk = kernels::reduce(kernels::ReduceOp::kSum, kernels::matmul(g_chunk, raw::transpose(cols, 1, 2), acc),
                                   std::span<const int64_t>(&batch_dim, 1), false, acc);
      }
    };
    Tensor dx, dweight, dbias;
    const int64_t step = want_dx || want_dw ? chunk_samples(g, k, L) : n;
    if (step >= n) {
      chunk(0, n, dx, dweight);
      if (want_dx) dx = raw::to(dx, dtype);
    } else {
      if (want_dx) dx = empty(xs, TensorOptions(dtype).device(dy.device()));
      for (int64_t s = 0; s < n; s += step) {
        const int64_t e = std::min(n, s + step);
        Tensor dx_chunk, dw_chunk;
        chunk(s, e, dx_chunk, dw_chunk);
        if (want_dx) raw::copy_(raw::slice(dx, 0, s, e), dx_chunk);
        if (want_dw) {
          if (dweight.defined())
            kernels::binary_(kernels::BinaryOp::kAdd, dweight, dw_chunk);
          else
            dweight = dw_chunk;
        }
      }
    }
    if (want_dx && ctx.unbatched) dx = raw::squeeze(dx, 0);
    if (want_dw)
      dweight = raw::reshape(raw::to(dweight, dtype), {c_out, xs[1], ctx.window.kernel[0], ctx.window.kernel[1]});
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
