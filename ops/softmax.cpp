// ops/softmax.cpp — softmax and log_softmax: forward, backward and precision category.
//
// Both are one fused kernel each way (kernels::softmax / softmax_backward):
// the row max and the sum of exponentials are computed in f32 for f16/bf16
// data and every output is rounded once, so even called directly on f16 data
// nothing intermediate is rounded to f16. The backward needs only the
// output y, which the forward saves.
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;

namespace {

struct SoftmaxCtx : autograd::Ctx {
  int64_t dim = 0;  // wrapped
};

/// The forward of softmax (log_softmax when `log`) along `dim`: checks x, runs the fused kernel, saves its output
/// (all either backward needs).
Tensor softmax_forward(SoftmaxCtx& ctx, const char* op, const Tensor& x, int64_t dim, bool log) {
  ops::check::defined(op, x, "x");
  ops::check::floating(op, x, "x");
  ctx.dim = wrap_dim(dim, x.dim(), op, x.shape());
  Tensor y = kernels::softmax(x, ctx.dim, log, x.dtype());
  ctx.save_for_backward(y);
  return y;
}

struct Softmax {
  static constexpr const char* kName = "softmax";
  static constexpr Precision kPrecision = Precision::kFp32;  // exp overflows f16 past 11; long sums lose mass
  using Ctx = SoftmaxCtx;
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim) {
    return softmax_forward(ctx, kName, x, dim, false);
  }
  // dx = y · (dy − Σ dy · y)
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {kernels::softmax_backward(dy, ctx.saved(0), ctx.dim, /*log=*/false)};
  }
};
MT_REGISTER_OP(Softmax);

struct LogSoftmax {
  static constexpr const char* kName = "log_softmax";
  static constexpr Precision kPrecision = Precision::kFp32;
  using Ctx = SoftmaxCtx;
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim) {
    return softmax_forward(ctx, kName, x, dim, true);
  }
  // dx = dy − exp(y) · Σ dy
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {kernels::softmax_backward(dy, ctx.saved(0), ctx.dim, /*log=*/true)};
  }
};
MT_REGISTER_OP(LogSoftmax);

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return autograd::apply<Softmax>(x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return autograd::apply<LogSoftmax>(x, dim); }

}  // namespace mixtape
