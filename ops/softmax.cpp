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

/// x defined and floating; `dim` wrapped.
int64_t check_softmax(const char* op, const Tensor& x, int64_t dim) {
  ops::check::defined(op, x, "x");
  ops::check::floating(op, x, "x");
  return wrap_dim(dim, x.dim(), op, x.shape());
}

struct Softmax {
  static constexpr const char* kName = "softmax";
  static constexpr Precision kPrecision = Precision::kFp32;  // exp overflows f16 past 11; long sums lose mass
  struct Ctx : autograd::Ctx {
    int64_t dim = 0;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim) {
    ctx.dim = check_softmax(kName, x, dim);
    Tensor y = kernels::softmax(x, ctx.dim, /*log=*/false, x.dtype());
    ctx.save_for_backward(y);
    return y;
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
  struct Ctx : autograd::Ctx {
    int64_t dim = 0;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, int64_t dim) {
    ctx.dim = check_softmax(kName, x, dim);
    Tensor y = kernels::softmax(x, ctx.dim, /*log=*/true, x.dtype());
    ctx.save_for_backward(y);
    return y;
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
