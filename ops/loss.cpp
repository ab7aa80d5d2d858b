// ops/loss.cpp — cross_entropy, nll_loss and mse_loss: forward, backward and precision category.
//
// The one design idea: a loss is one node, whatever it is made of. The
// forward computes per-row losses in an accumulator dtype A — f32, or f64
// for f64 inputs — and rounds the loss once to the input's dtype; the
// backward is the closed form (softmax minus the smoothed one-hot, times the
// reduction's scale) rather than the tape of the pieces. So f16 logits
// passed outside autocast still get f32 statistics, and under autocast
// cross_entropy reads them as they are (kWidensOnLoad): the f32 loss of
// their cast, without the cast's f32 copy of the logits and its two launches.
//
// cross_entropy with the class dim last ((N, C) or (C) logits) runs the fused
// kernels (kernels::cross_entropy / cross_entropy_backward: one read of the
// logits forward, one read and one write backward, saving only the per-row
// log-sum-exp); (N, C, d1, ...) logits compose log_softmax, gather and
// reductions.
//
// Class targets follow PyTorch: i64 indices, ignore_index rows contribute 0
// and are left out of the mean's count (a mean over no counted row is NaN).
#include <mixtape/autograd/function.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

namespace mixtape {

using autograd::Grads;
using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::ScalarOp;
using ops::scalar_like;

namespace {

// ---- class-index targets (cross_entropy, nll_loss) ------------------------------------------

/// The shapes of a (N, C, d1, ...) input and its (N, d1, ...) target; an
/// unbatched (C) input with a 0-d target is handled as N = 1.
struct ClassShapes {
  Shape input_shape, target_shape;  // as given
  Shape batched_input;              // (N, C, d1, ...)
  Shape batched_target;             // (N, d1, ...)
  int64_t C = 0;
};

/// Checks input (floating), target (i64, the input's shape without dim 1) and
/// every class index (in [0, C) or ignore_index); errors name `op`.
ClassShapes check_class_target(const char* op, const Tensor& input, const Tensor& target, int64_t ignore_index) {
  MT_CHECK(input.defined() && target.defined(), op, ": input and target must be defined tensors");
  MT_CHECK(is_floating(input.dtype()), op, ": expected a floating input (f64, f32, f16, bf16), got ", input.dtype(),
           " (shape ", input.shape(), ")");
  MT_CHECK(target.dtype() == DType::kI64, op, ": target must hold class indices as i64, got ", target.dtype(),
           " (shape ", target.shape(), "); class-probability targets are not supported");
  MT_CHECK(input.device() == target.device(), op, ": input and target must be on the same device, got ",
           input.device(), " and ", target.device());
  MT_CHECK(input.dim() >= 1, op, ": expected an input of shape (N, C, d1, ...) or (C), got shape ", input.shape());
  ClassShapes s;
  s.input_shape = input.shape();
  s.target_shape = target.shape();
  s.batched_input = input.shape();
  if (input.dim() == 1) s.batched_input.insert(0, 1);
  s.C = s.batched_input[1];
  Shape expected = s.batched_input;
  expected.erase(1);
  s.batched_target = expected;
  if (input.dim() == 1) expected = Shape{};
  MT_CHECK(target.shape() == expected, op, ": target of shape ", target.shape(), " does not match input of shape ",
           input.shape(), " (expected target shape ", expected, ": the input's shape without the class dim)");

  // The CPU checks values here; a device backend checks them in its gather
  // kernel instead, so a training step never waits for the host.
  if (target.device().is_cpu()) {
    const Tensor t = raw::contiguous(target);
    const int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
      MT_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < s.C), op, ": target value ", p[i],
               " (at flat position ", i, ") is out of range for ", s.C, " classes; expected a class index in [0, ",
               s.C, ") or ignore_index ", ignore_index, " (input shape ", input.shape(), ")");
  }
  return s;
}

/// Which rows count, and where their class is: everything a class loss
/// needs from the target, on the input's device.
struct Targets {
  Tensor valid;  // (N, d1, ...) bool: target != ignore_index
  Tensor index;  // (N, 1, d1, ...) i64: the target with ignored rows sent to class 0
  Tensor count;  // 0-d, A: number of valid rows (the mean's divisor)
};

Targets make_targets(const Tensor& target, const ClassShapes& s, int64_t ignore_index, DType A) {
  const Device dev = target.device();
  const Tensor t = raw::reshape(target, s.batched_target);
  Targets r;
  r.valid = kernels::binary(BinaryOp::kNe, t, scalar_like(static_cast<double>(ignore_index), DType::kI64, dev));
  r.index = raw::unsqueeze(kernels::where(r.valid, t, scalar_like(0, DType::kI64, dev)), 1);
  r.count = ops::reduce_all(ReduceOp::kSum, r.valid, A);
  return r;
}

/// Per-row losses (A, ignored rows already 0) reduced as asked.
Tensor reduce_loss(const Tensor& per_row, Reduction reduction, const Tensor& count) {
  switch (reduction) {
    case Reduction::kNone: return per_row;
    case Reduction::kSum: return ops::reduce_all(ReduceOp::kSum, per_row, per_row.dtype());
    case Reduction::kMean:
      return kernels::binary(BinaryOp::kDiv, ops::reduce_all(ReduceOp::kSum, per_row, per_row.dtype()), count);
  }
  MT_ERROR("loss: unknown reduction ", static_cast<int>(reduction));
}

/// d loss / d per-row loss (A, (N, d1, ...)): dy, dy, or dy / count by
/// reduction, and 0 on ignored rows.
Tensor row_scale(const Tensor& dy, Reduction reduction, const Targets& t, const Shape& batched_target, DType A) {
  Tensor w = raw::to(dy, A);
  if (reduction == Reduction::kNone) w = raw::reshape(w, batched_target);
  if (reduction == Reduction::kMean) w = kernels::binary(BinaryOp::kDiv, w, t.count);
  return kernels::where(t.valid, w, scalar_like(0, A, dy.device()));
}

// ---- the ops ----------------------------------------------------------------------------

/// The rows of a class loss as a (rows, C) matrix when the class dim is the last one (no spatial dims, or
/// only dims of size 1): the fused cross-entropy kernels apply.
bool class_dim_last(const ClassShapes& s) {
  int64_t inner = 1;
  for (int64_t d = 2; d < s.batched_input.size(); ++d) inner *= s.batched_input[d];
  return inner == 1;
}

struct CrossEntropy {
  static constexpr const char* kName = "cross_entropy";
  static constexpr Precision kPrecision = Precision::kFp32;  // log-sum-exp of logits needs f32
  // Both paths read f16/bf16 logits as f32 and round dx once to their dtype: autocast need not cast the logits.
  static constexpr bool kWidensOnLoad = true;
  struct Ctx : autograd::Ctx {
    ClassShapes shapes;
    Reduction reduction = Reduction::kMean;
    double smoothing = 0;
    int64_t ignore_index = -100;
    DType input_dtype = DType::kF32;
    bool fused = false;
  };
  // loss_i = −(1 − ε) · log p[target_i] − ε · mean_c log p_c   (0 for ignored rows)
  static Tensor forward(Ctx& ctx, const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
    ctx.shapes = check_class_target(kName, logits, target, o.ignore_index);
    MT_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, kName, ": label_smoothing must be in [0, 1], got ",
             o.label_smoothing);
    ctx.reduction = o.reduction;
    ctx.smoothing = o.label_smoothing;
    ctx.ignore_index = o.ignore_index;
    ctx.input_dtype = logits.dtype();
    ctx.fused = class_dim_last(ctx.shapes);
    const Tensor loss = ctx.fused ? forward_fused(ctx, logits, target, o) : forward_composed(ctx, logits, target, o);
    // The one rounding to the input dtype; none under autocast, whose fp32 loss this is (as if the logits were cast).
    return raw::to(loss, ctx.widened_on_load ? DType::kF32 : logits.dtype());
  }
  // d loss_i / d logits = (softmax − (1 − ε) · one_hot(target) − ε / C) · scale_i
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor dx = ctx.fused ? backward_fused(ctx, dy) : backward_composed(ctx, dy);
    return {raw::reshape(dx, ctx.shapes.input_shape), Tensor()};
  }

 private:
  /// (rows, C) logits: the fused kernel gives per-row losses (0 on ignored rows), log-sum-exps and the reductions.
  static Tensor forward_fused(Ctx& ctx, const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
    const int64_t rows = ctx.shapes.batched_input[0], C = ctx.shapes.C;
    const Tensor x = raw::reshape(logits, {rows, C}), t = raw::reshape(target, {rows});
    const kernels::CrossEntropyResult r = kernels::cross_entropy(x, t, o.ignore_index, o.label_smoothing);
    // The backward needs the mean's divisor and nothing else of the target: the fused kernel zeroes ignored rows.
    ctx.save_for_backward(x, t, r.lse, r.count);
    switch (o.reduction) {
      case Reduction::kNone: return raw::reshape(r.loss, ctx.shapes.target_shape);
      case Reduction::kSum: return r.sum;
      case Reduction::kMean: return r.mean;
    }
    MT_ERROR(kName, ": unknown reduction ", static_cast<int>(o.reduction));
  }
  static Tensor backward_fused(Ctx& ctx, const Tensor& dy) {
    const Tensor &x = ctx.saved(0), &t = ctx.saved(1), &lse = ctx.saved(2), &count = ctx.saved(3);
    // d loss / d per-row loss: dy per row (none), or one value for every row (sum; mean: dy / count, the division
    // done by the kernel). The kernel reads dy in the logits' dtype or in lse's; any other is cast first.
    Tensor w = dy.dtype() == x.dtype() || dy.dtype() == lse.dtype() ? dy : raw::to(dy, lse.dtype());
    if (ctx.reduction == Reduction::kNone) w = raw::reshape(w, {x.size(0)});
    return kernels::cross_entropy_backward(x, t, lse, w, ctx.ignore_index, ctx.smoothing,
                                           ctx.reduction == Reduction::kMean ? count : Tensor());
  }

  /// (N, C, d1, ...) logits: log_softmax written in A, gather and reductions.
  static Tensor forward_composed(Ctx& ctx, const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
    const DType A = acc_dtype(logits.dtype());
    const double eps = o.label_smoothing, C = static_cast<double>(ctx.shapes.C);
    const Targets t = make_targets(target, ctx.shapes, o.ignore_index, A);
    // Fused log_softmax with statistics in f32 (f64), written in A: nothing rounds to f16.
    const Tensor lsm = kernels::softmax(raw::reshape(logits, ctx.shapes.batched_input), 1, /*log=*/true, A);
    Tensor term = raw::squeeze(kernels::gather(lsm, 1, t.index), 1);  // log p[target]
    if (eps != 1) term = kernels::scalar(ScalarOp::kMul, term, 1 - eps);
    else term = zeros_like(term);
    if (eps > 0) {
      const int64_t class_dim[] = {1};
      const Tensor sum_c = kernels::reduce(ReduceOp::kSum, lsm, class_dim, false, lsm.dtype());  // Σ_c log p_c
      term = kernels::binary(BinaryOp::kAdd, term, kernels::scalar(ScalarOp::kMul, sum_c, eps / C));
    }
    // where, not a multiply: an ignored row with −inf logits must give 0, not NaN.
    const Tensor per_row =
        kernels::where(t.valid, kernels::unary(kernels::UnaryOp::kNeg, term), scalar_like(0, A, logits.device()));
    ctx.save_for_backward(lsm, t.valid, t.index, t.count);

    Tensor loss = reduce_loss(per_row, o.reduction, t.count);
    if (o.reduction == Reduction::kNone) loss = raw::reshape(loss, ctx.shapes.target_shape);
    return loss;
  }
  static Tensor backward_composed(Ctx& ctx, const Tensor& dy) {
    const Tensor& lsm = ctx.saved(0);
    const Targets t{ctx.saved(1), ctx.saved(2), ctx.saved(3)};
    const DType A = lsm.dtype();
    const double eps = ctx.smoothing, C = static_cast<double>(ctx.shapes.C);
    Tensor g = kernels::unary(kernels::UnaryOp::kExp, lsm);
    if (eps > 0) g = kernels::scalar(ScalarOp::kAdd, g, -eps / C);
    if (eps != 1) {
      const Tensor hot = full(t.index.shape(), -(1 - eps), TensorOptions(A).device(lsm.device()));
      g = kernels::binary(BinaryOp::kAdd, g, kernels::scatter_add(lsm.shape(), 1, t.index, hot));
    }
    const Tensor w = row_scale(dy, ctx.reduction, t, ctx.shapes.batched_target, A);
    // where, not the multiply alone: an ignored position's −inf or NaN logits make g NaN there, and 0 · NaN is NaN.
    const Tensor scaled = kernels::binary(BinaryOp::kMul, g, raw::unsqueeze(w, 1));
    const Tensor dx = kernels::where(raw::unsqueeze(t.valid, 1), scaled, scalar_like(0, A, lsm.device()));
    return raw::to(dx, ctx.input_dtype);
  }
};
MT_REGISTER_OP(CrossEntropy);

struct NllLoss {
  static constexpr const char* kName = "nll_loss";
  static constexpr Precision kPrecision = Precision::kFp32;
  struct Ctx : autograd::Ctx {
    ClassShapes shapes;
    Reduction reduction = Reduction::kMean;
    DType input_dtype = DType::kF32;
  };
  // loss_i = −log_probs[i, target_i]   (0 for ignored rows)
  static Tensor forward(Ctx& ctx, const Tensor& log_probs, const Tensor& target, const NllLossOptions& o) {
    ctx.shapes = check_class_target(kName, log_probs, target, o.ignore_index);
    ctx.reduction = o.reduction;
    ctx.input_dtype = log_probs.dtype();
    const DType A = acc_dtype(log_probs.dtype());
    const Targets t = make_targets(target, ctx.shapes, o.ignore_index, A);
    const Tensor lp = raw::reshape(log_probs, ctx.shapes.batched_input);
    const Tensor picked = raw::to(raw::squeeze(kernels::gather(lp, 1, t.index), 1), A);  // exact: a copy
    const Tensor per_row =
        kernels::where(t.valid, kernels::unary(kernels::UnaryOp::kNeg, picked), scalar_like(0, A, lp.device()));
    ctx.save_for_backward(t.valid, t.index, t.count);

    Tensor loss = reduce_loss(per_row, o.reduction, t.count);
    if (o.reduction == Reduction::kNone) loss = raw::reshape(loss, ctx.shapes.target_shape);
    return raw::to(loss, log_probs.dtype());
  }
  // d loss_i / d log_probs = −one_hot(target) · scale_i
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Targets t{ctx.saved(0), ctx.saved(1), ctx.saved(2)};
    const DType A = acc_dtype(ctx.input_dtype);
    const Tensor w = row_scale(dy, ctx.reduction, t, ctx.shapes.batched_target, A);
    const Tensor dx = kernels::scatter_add(ctx.shapes.batched_input, 1, t.index,
                                           raw::unsqueeze(kernels::unary(kernels::UnaryOp::kNeg, w), 1));
    return {raw::to(raw::reshape(dx, ctx.shapes.input_shape), ctx.input_dtype), Tensor()};
  }
};
MT_REGISTER_OP(NllLoss);

struct MseLoss {
  static constexpr const char* kName = "mse_loss";
  static constexpr Precision kPrecision = Precision::kFp32;  // squares overflow f16 past 256
  struct Ctx : autograd::Ctx {
    Reduction reduction = Reduction::kMean;
    DType input_dtype = DType::kF32, target_dtype = DType::kF32;
  };
  // loss_i = (input_i − target_i)²
  static Tensor forward(Ctx& ctx, const Tensor& input, const Tensor& target, Reduction reduction) {
    MT_CHECK(input.defined() && target.defined(), kName, ": input and target must be defined tensors");
    MT_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), kName,
             ": expected floating input and target, got ", input.dtype(), " and ", target.dtype(), " (shapes ",
             input.shape(), " and ", target.shape(), ")");
    MT_CHECK(input.shape() == target.shape(), kName, ": input (shape ", input.shape(), ") and target (shape ",
             target.shape(), ") must have the same shape");
    ops::check::same_device(kName, input, "input", target, "target");
    ctx.reduction = reduction;
    ctx.input_dtype = input.dtype();
    ctx.target_dtype = target.dtype();
    const DType out = promote_types(input.dtype(), target.dtype());
    const DType A = acc_dtype(out);
    const Tensor diff = kernels::binary(BinaryOp::kSub, raw::to(input, A), raw::to(target, A));
    ctx.save_for_backward(diff);
    const Tensor sq = kernels::binary(BinaryOp::kMul, diff, diff);
    Tensor loss = reduction == Reduction::kNone ? sq
                  : reduction == Reduction::kSum ? ops::reduce_all(ReduceOp::kSum, sq, A)
                                                 : ops::reduce_all(ReduceOp::kMean, sq, A);
    return raw::to(loss, out);
  }
  // d loss / d input = 2 · (input − target) · scale = −d loss / d target
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& diff = ctx.saved(0);
    double factor = 2;
    if (ctx.reduction == Reduction::kMean) factor /= static_cast<double>(diff.numel());
    const Tensor w = kernels::scalar(ScalarOp::kMul, raw::to(dy, diff.dtype()), factor);
    const Tensor g = kernels::binary(BinaryOp::kMul, diff, w);
    Tensor dinput, dtarget;
    if (ctx.needs_input_grad(0)) dinput = raw::to(g, ctx.input_dtype);
    if (ctx.needs_input_grad(1)) dtarget = raw::to(kernels::unary(kernels::UnaryOp::kNeg, g), ctx.target_dtype);
    return {dinput, dtarget};
  }
};
MT_REGISTER_OP(MseLoss);

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, CrossEntropyOptions options) {
  return autograd::apply<CrossEntropy>(logits, target, options);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, NllLossOptions options) {
  return autograd::apply<NllLoss>(log_probs, target, options);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return autograd::apply<MseLoss>(input, target, reduction);
}

}  // namespace mixtape
