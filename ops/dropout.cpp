// ops/dropout.cpp — dropout: forward, backward and precision category.
//
// The one design idea: the mask is a pure function of (seed, offset) — Philox
// counters reserved from the Generator — so the same seed gives the same mask
// on every device and thread count, and the op saves one byte per element (the
// kBool mask) for its backward. Both directions compute x · mask / (1 − p)
// with one rounding (x · mask is exact), in the input's dtype: "passthrough".
#include <mixtape/autograd/function.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include <cmath>

namespace mixtape {

using autograd::Grads;

namespace {

/// t · mask · scale: the multiplication by the 0/1 mask is exact, the scale rounds once.
Tensor apply_mask(const Tensor& t, const Tensor& mask, double scale) {
  Tensor kept = kernels::binary(kernels::BinaryOp::kMul, t, raw::to(mask, t.dtype()));
  return kernels::scalar(kernels::ScalarOp::kMul, kept, scale);
}

struct Dropout {
  static constexpr const char* kName = "dropout";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // a mask and one scale: safe in f16
  struct Ctx : autograd::Ctx {
    double scale = 1.0;  // 1 / (1 - p); 0 when p = 1
  };
  /// The next numel counters of `generator` decide the mask.
  static Tensor forward(Ctx& ctx, const Tensor& x, double p, Generator* generator) {
    MT_CHECK(is_floating(x.dtype()), "dropout: expected a floating input, got ", x.dtype(), " (shape ", x.shape(), ")");
    const Tensor mask = kernels::dropout_mask(x.shape(), p, *generator, x.device());  // kBool, true: kept
    ctx.scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;  // p = 1 drops everything (PyTorch gives zeros, not NaN)
    ctx.save_for_backward(mask);
    return apply_mask(x, mask, ctx.scale);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {apply_mask(dy, ctx.saved(0), ctx.scale)}; }
};
MT_REGISTER_OP(Dropout);

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  MT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability has to be between 0 and 1, but got ", p);
  if (!training || p == 0.0) return x;
  MT_CHECK(x.defined(), "dropout: the input is an undefined tensor");
  // The kernel reserves one counter per element, so the next draw from the generator gives a fresh mask.
  return autograd::apply<Dropout>(x, p, generator ? generator : &default_generator());
}

}  // namespace mixtape
