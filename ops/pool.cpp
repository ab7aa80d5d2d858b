// ops/pool.cpp — max_pool2d and avg_pool2d: forward, backward and precision category.
//
// Both are "passthrough" ops: a window's max is one of its inputs and a mean
// of f16 values computed in f32 is safe, so they run in whatever dtype the
// input has. Inputs are (N, C, H, W) or unbatched (C, H, W); the kernels see
// 4-D only. max_pool2d saves the argmax indices (not the input), so its
// backward is one scatter-add; int32 ones (PyTorch keeps int64, and the input):
// the MNIST CNN's pool keeps 4.5 MiB instead of 9 between forward and backward.
#include <cstdint>
#include <limits>

#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;

namespace {

/// The kernels' window for `o` (stride 0: kernel_size, like PyTorch), after checking the input and the options.
kernels::Window2d pool_window(const Pool2dOptions& o, const Tensor& x, const char* op) {
  MT_CHECK(x.defined(), op, ": the input is an undefined tensor");
  MT_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected input of 4 dims (N, C, H, W) or 3 dims (C, H, W), got ",
           x.shape());
  for (int a = 0; a < 2; ++a)
    MT_CHECK(o.kernel_size[a] > 0 && o.stride[a] >= 0 && o.padding[a] >= 0, op,
             ": kernel_size must be positive, stride non-negative (0: kernel_size) and padding non-negative, got "
             "kernel_size ", o.kernel_size[0], "x", o.kernel_size[1], ", stride ", o.stride[0], "x", o.stride[1],
             ", padding ", o.padding[0], "x", o.padding[1]);
  ops::check::floating(op, x, "input");
  const kernels::Window2d w{{o.kernel_size[0], o.kernel_size[1]},
                            {o.stride[0] ? o.stride[0] : o.kernel_size[0], o.stride[1] ? o.stride[1] : o.kernel_size[1]},
                            {o.padding[0], o.padding[1]},
                            {1, 1}};
  ops::check::pool_padding(op, w);
  Shape batched = x.shape();
  if (x.dim() == 3) batched.insert(0, 1);
  ops::check::window(op, batched, w);
  return w;
}

/// Pooling's shared state: the window, the 4-D input shape and whether a batch dim was added.
struct PoolCtx : autograd::Ctx {
  kernels::Window2d window{};
  Shape x_shape;  // (N, C, H, W)
  bool unbatched = false;

  /// Checks the input and the options (errors name `op`), keeps the window and the input's 4-D shape, and returns
  /// the input as (N, C, H, W).
  Tensor begin(const char* op, const Tensor& x, const Pool2dOptions& o) {
    window = pool_window(o, x, op);
    unbatched = x.dim() == 3;
    const Tensor x4 = batch(x);
    x_shape = x4.shape();
    return x4;
  }
  /// (C, H, W) inputs ran as a batch of one: their tensors gain and lose that dim.
  Tensor batch(const Tensor& t) const { return unbatched ? raw::unsqueeze(t, 0) : t; }
  Tensor unbatch(const Tensor& t) const { return unbatched ? raw::squeeze(t, 0) : t; }
};

struct MaxPool2d {
  static constexpr const char* kName = "max_pool2d";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // selects inputs: exact in any dtype
  using Ctx = PoolCtx;
  static Tensor forward(Ctx& ctx, const Tensor& x, const Pool2dOptions& o) {
    const Tensor x4 = ctx.begin(kName, x, o);
    const int64_t plane = x4.size(2) * x4.size(3);
    MT_CHECK(plane <= std::numeric_limits<int32_t>::max(), kName, ": input ", x.shape(), " has planes of ", plane,
             " pixels; its argmax indices (int32) address at most 2^31 - 1");
    kernels::MaxPoolResult r = kernels::max_pool2d(x4, ctx.window);
    ctx.save_for_backward(r.indices);  // (N, C, H_out, W_out) int32 flat positions in each H·W plane: half of int64's
    return ctx.unbatch(r.y);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {ctx.unbatch(kernels::max_pool2d_backward(ctx.batch(dy), ctx.saved(0), ctx.x_shape, ctx.window))};
  }
};
MT_REGISTER_OP(MaxPool2d);

struct AvgPool2d {
  static constexpr const char* kName = "avg_pool2d";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // window sums accumulate in f32
  using Ctx = PoolCtx;
  static Tensor forward(Ctx& ctx, const Tensor& x, const Pool2dOptions& o) {
    return ctx.unbatch(kernels::avg_pool2d(ctx.begin(kName, x, o), ctx.window));
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {ctx.unbatch(kernels::avg_pool2d_backward(ctx.batch(dy), ctx.x_shape, ctx.window))};
  }
};
MT_REGISTER_OP(AvgPool2d);

}  // namespace

Tensor max_pool2d(const Tensor& x, Pool2dOptions options) { return autograd::apply<MaxPool2d>(x, options); }
Tensor avg_pool2d(const Tensor& x, Pool2dOptions options) { return autograd::apply<AvgPool2d>(x, options); }

}  // namespace mixtape
