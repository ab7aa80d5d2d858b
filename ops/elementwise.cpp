// ops/elementwise.cpp — arithmetic and activations: forward, backward and
// precision category of each, side by side.
//
// Binary ops promote their inputs to the wider dtype and broadcast; their
// backward sums the gradient back down to each input's shape (ops::sum_to).
// Every backward computes in the dtype its forward ran in. Each forward checks
// its arguments first (ops/check.h), in the words of the op the user called.
#include <mixtape/autograd/function.h>
#include <mixtape/core/raw.h>
#include <mixtape/ops/check.h>
#include <mixtape/ops/common.h>
#include <mixtape/ops/ops.h>

#include <cstring>

namespace mixtape {

using autograd::Grads;
using kernels::BinaryOp;
using kernels::ScalarOp;
using kernels::UnaryOp;
using ops::scalar_like;

namespace {

/// A unary op's input: defined, of a dtype the op is defined on (floating; also integers where `integers`).
void check_unary(const char* op, const Tensor& x, bool integers) {
  ops::check::defined(op, x, "x");
  ops::check::arithmetic(op, x, integers);
}

/// A binary op's inputs (already promoted to one dtype by apply<Op>): defined, on one device, of a dtype the op is
/// defined on, and broadcastable.
void check_binary(const char* op, const Tensor& a, const Tensor& b, bool integers) {
  ops::check::defined(op, a, "a");
  ops::check::defined(op, b, "b");
  ops::check::same_device(op, a, "a", b, "b");
  ops::check::arithmetic(op, a, integers);
  broadcast_shapes(a.shape(), b.shape(), op);
}

/// An op of a tensor and a scalar: x defined, of a dtype the op is defined on, and an integral scalar for integers.
void check_scalar(const char* op, const Tensor& x, double s, bool integers) {
  check_unary(op, x, integers);
  ops::check::scalar_fits(op, x, s);
}

/// What an elementwise op's backward reads: its input x, or its output y.
enum class Keep { kInput, kOutput };

/// The forward of y = op(x) on a floating x whose backward needs x or y: checks x, runs the kernel, saves one.
Tensor unary_forward(autograd::Ctx& ctx, const char* name, UnaryOp op, const Tensor& x, Keep keep) {
  check_unary(name, x, /*integers=*/false);
  Tensor y = kernels::unary(op, x);
  ctx.save_for_backward(keep == Keep::kInput ? x : y);
  return y;
}

// ---- binary ---------------------------------------------------------------------------

struct Add {
  static constexpr const char* kName = "add";
  static constexpr Precision kPrecision = Precision::kPromote;
  struct Ctx : autograd::Ctx {
    Shape a_shape, b_shape;
  };
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_binary(kName, a, b, /*integers=*/true);
    ctx.a_shape = a.shape(), ctx.b_shape = b.shape();
    return kernels::binary(BinaryOp::kAdd, a, b);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {ops::sum_to(dy, ctx.a_shape), ops::sum_to(dy, ctx.b_shape)};
  }
};
MT_REGISTER_OP(Add);

struct Sub {
  static constexpr const char* kName = "sub";
  static constexpr Precision kPrecision = Precision::kPromote;
  struct Ctx : autograd::Ctx {
    Shape a_shape, b_shape;
  };
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_binary(kName, a, b, /*integers=*/true);
    ctx.a_shape = a.shape(), ctx.b_shape = b.shape();
    return kernels::binary(BinaryOp::kSub, a, b);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    Tensor db = ctx.needs_input_grad(1) ? kernels::unary(UnaryOp::kNeg, ops::sum_to(dy, ctx.b_shape)) : Tensor();
    return {ops::sum_to(dy, ctx.a_shape), db};
  }
};
MT_REGISTER_OP(Sub);

struct Mul {
  static constexpr const char* kName = "mul";
  static constexpr Precision kPrecision = Precision::kPromote;
  struct Ctx : autograd::Ctx {
    Shape a_shape, b_shape;
  };
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_binary(kName, a, b, /*integers=*/true);
    ctx.a_shape = a.shape(), ctx.b_shape = b.shape();
    // Each gradient needs the other input only.
    ctx.save_for_backward(ctx.needs_input_grad(1) ? a : Tensor(), ctx.needs_input_grad(0) ? b : Tensor());
    return kernels::binary(BinaryOp::kMul, a, b);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    // Product and broadcast-sum in opmath, so an f16 gradient is rounded once.
    const DType t = acc_dtype(dy.dtype());
    Tensor dy_t = raw::to(dy, t);
    auto grad = [&](const Tensor& other, const Shape& shape) {
      return raw::to(ops::sum_to(kernels::binary(BinaryOp::kMul, dy_t, raw::to(other, t)), shape), dy.dtype());
    };
    Tensor da, db;
    if (ctx.needs_input_grad(0)) da = grad(ctx.saved(1), ctx.a_shape);
    if (ctx.needs_input_grad(1)) db = grad(ctx.saved(0), ctx.b_shape);
    return {da, db};
  }
};
MT_REGISTER_OP(Mul);

struct Div {
  static constexpr const char* kName = "div";
  static constexpr Precision kPrecision = Precision::kPromote;
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_binary(kName, a, b, /*integers=*/false);
    ctx.save_for_backward(a, b);
    return kernels::binary(BinaryOp::kDiv, a, b);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& a = ctx.saved(0);
    const Tensor& b = ctx.saved(1);
    Tensor da, db;
    // In opmath, so an f16 gradient is rounded once (after the broadcast sum too).
    const DType t = acc_dtype(dy.dtype());
    Tensor b32 = raw::to(b, t);
    if (ctx.needs_input_grad(0))
      da = raw::to(ops::sum_to(kernels::binary(BinaryOp::kDiv, raw::to(dy, t), b32), a.shape()), dy.dtype());
    if (ctx.needs_input_grad(1)) {  // d(a/b)/db = -dy·a / b²
      Tensor q = kernels::binary(BinaryOp::kDiv, kernels::binary(BinaryOp::kMul, raw::to(dy, t), raw::to(a, t)),
                                 kernels::binary(BinaryOp::kMul, b32, b32));
      db = raw::to(ops::sum_to(kernels::unary(UnaryOp::kNeg, q), b.shape()), dy.dtype());
    }
    return {da, db};
  }
};
MT_REGISTER_OP(Div);

// ---- with a scalar ------------------------------------------------------------------------
// The scalar is a double applied in opmath (f32 for f16/bf16), never rounded to x's dtype first.

struct AddScalar {
  static constexpr const char* kName = "add_scalar";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx&, const Tensor& x, double s) {
    check_scalar(kName, x, s, /*integers=*/true);
    return kernels::scalar(ScalarOp::kAdd, x, s);
  }
  static Grads backward(Ctx&, const Tensor& dy) { return {dy}; }
};
MT_REGISTER_OP(AddScalar);

struct MulScalar {
  static constexpr const char* kName = "mul_scalar";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    double s = 1;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, double s) {
    check_scalar(kName, x, s, /*integers=*/true);
    ctx.s = s;
    return kernels::scalar(ScalarOp::kMul, x, s);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {kernels::scalar(ScalarOp::kMul, dy, ctx.s)}; }
};
MT_REGISTER_OP(MulScalar);

struct DivScalar {
  static constexpr const char* kName = "div_scalar";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    double s = 1;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, double s) {
    check_scalar(kName, x, s, /*integers=*/false);
    ctx.s = s;
    return kernels::scalar(ScalarOp::kDiv, x, s);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {kernels::scalar(ScalarOp::kDiv, dy, ctx.s)}; }
};
MT_REGISTER_OP(DivScalar);

struct Pow {
  static constexpr const char* kName = "pow";
  static constexpr Precision kPrecision = Precision::kFp32;  // x^p overflows f16 quickly
  struct Ctx : autograd::Ctx {
    double exponent = 1;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, double exponent) {
    check_unary(kName, x, /*integers=*/false);
    ctx.exponent = exponent;
    ctx.save_for_backward(x);
    return kernels::scalar(ScalarOp::kPow, x, exponent);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    if (ctx.exponent == 0) return {zeros_like(dy)};
    // d x^p / dx = p x^(p-1), in opmath and rounded once
    const DType t = acc_dtype(dy.dtype());
    Tensor d = kernels::scalar(ScalarOp::kMul, kernels::scalar(ScalarOp::kPow, raw::to(ctx.saved(0), t),
                                                               ctx.exponent - 1), ctx.exponent);
    return {raw::to(kernels::binary(BinaryOp::kMul, raw::to(dy, t), d), dy.dtype())};
  }
};
MT_REGISTER_OP(Pow);

// ---- unary --------------------------------------------------------------------------------

struct Neg {
  static constexpr const char* kName = "neg";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx&, const Tensor& x) {
    check_unary(kName, x, /*integers=*/true);
    return kernels::unary(UnaryOp::kNeg, x);
  }
  static Grads backward(Ctx&, const Tensor& dy) { return {kernels::unary(UnaryOp::kNeg, dy)}; }
};
MT_REGISTER_OP(Neg);

struct Exp {
  static constexpr const char* kName = "exp";
  static constexpr Precision kPrecision = Precision::kFp32;  // exp(12) already overflows f16
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kExp, x, Keep::kOutput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {kernels::binary(BinaryOp::kMul, dy, ctx.saved(0))}; }
};
MT_REGISTER_OP(Exp);

struct Log {
  static constexpr const char* kName = "log";
  static constexpr Precision kPrecision = Precision::kFp32;  // f16 loses log's small differences near 1
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kLog, x, Keep::kInput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) { return {kernels::binary(BinaryOp::kDiv, dy, ctx.saved(0))}; }
};
MT_REGISTER_OP(Log);

struct Sqrt {
  static constexpr const char* kName = "sqrt";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // no overflow: safe in f16 (PyTorch lists it nowhere)
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kSqrt, x, Keep::kOutput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {  // d sqrt(x) = 1 / (2 sqrt(x))
    return {kernels::binary(BinaryOp::kDiv, kernels::scalar(ScalarOp::kMul, dy, 0.5), ctx.saved(0))};
  }
};
MT_REGISTER_OP(Sqrt);

struct Relu {
  static constexpr const char* kName = "relu";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  using Ctx = autograd::Ctx;
  // Keeps its output, as PyTorch's relu does: y <= 0 exactly where x <= 0 (NaN and −0 included, y being x or 0), and
  // the next op usually keeps y anyway (a conv or linear its input), where keeping x held one activation more (the
  // MNIST CNN's first conv output: 10.6 of the 54 MiB its f32 forward kept at batch 128).
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kRelu, x, Keep::kOutput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {kernels::binary(BinaryOp::kReluBackward, dy, ctx.saved(0))};
  }
};
MT_REGISTER_OP(Relu);

struct Gelu {
  static constexpr const char* kName = "gelu";
  static constexpr Precision kPrecision = Precision::kFp32;  // tanh/erf overflow in f16
  struct Ctx : autograd::Ctx {
    bool tanh_approximation = false;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, bool tanh_approximation) {
    ctx.tanh_approximation = tanh_approximation;
    return unary_forward(ctx, kName, tanh_approximation ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x, Keep::kInput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    BinaryOp op = ctx.tanh_approximation ? BinaryOp::kGeluTanhBackward : BinaryOp::kGeluBackward;
    return {kernels::binary(op, dy, ctx.saved(0))};
  }
};
MT_REGISTER_OP(Gelu);

struct Sigmoid {
  static constexpr const char* kName = "sigmoid";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // bounded output, stable formula
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kSigmoid, x, Keep::kOutput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {kernels::binary(BinaryOp::kSigmoidBackward, dy, ctx.saved(0))};
  }
};
MT_REGISTER_OP(Sigmoid);

struct Tanh {
  static constexpr const char* kName = "tanh";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // bounded output
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    return unary_forward(ctx, kName, UnaryOp::kTanh, x, Keep::kOutput);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    return {kernels::binary(BinaryOp::kTanhBackward, dy, ctx.saved(0))};
  }
};
MT_REGISTER_OP(Tanh);

struct Abs {
  static constexpr const char* kName = "abs";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // exact in any dtype
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& x) {
    check_unary(kName, x, /*integers=*/true);
    if (ctx.recording) ctx.save_for_backward(x);
    return kernels::unary(UnaryOp::kAbs, x);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {  // dy·sign(x): exact; 0 at ±0, NaN at NaN
    return {kernels::binary(BinaryOp::kMul, dy, kernels::unary(UnaryOp::kSign, ctx.saved(0)))};
  }
};
MT_REGISTER_OP(Abs);

struct Clamp {
  static constexpr const char* kName = "clamp";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // selects values: exact in any dtype
  struct Ctx : autograd::Ctx {
    std::optional<double> min, max;
  };
  /// An integral bound an integer x's dtype holds, as PyTorch's checked conversion of clamp's scalars (a u8 bound may
  /// be -255..-1: min=-1 is 255). A bound that wrapped otherwise would clamp to the wrong side. A floating x takes
  /// any bound: it is compared in f64, and one past f16's range is no bound.
  static void check_bound(const Tensor& x, double bound) {
    if (!is_floating(x.dtype())) ops::check::scalar_converts(kName, "bound", x, "x", bound);
  }
  static Tensor forward(Ctx& ctx, const Tensor& x, std::optional<double> min, std::optional<double> max) {
    check_unary(kName, x, /*integers=*/true);
    MT_CHECK(min || max, "clamp: at least one of min and max must be given");
    for (const std::optional<double>& bound : {min, max})
      if (bound) check_bound(x, *bound);
    ctx.min = min, ctx.max = max;
    if (ctx.recording) ctx.save_for_backward(x);
    Tensor y = min ? kernels::scalar(ScalarOp::kMaximum, x, *min) : x;
    return max ? kernels::scalar(ScalarOp::kMinimum, y, *max) : y;
  }
  /// PyTorch's clamp_backward: dy where min <= x <= max, the bounds rounded to x's dtype; 0 elsewhere (NaN x too).
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& x = ctx.saved(0);
    const Tensor zero = scalar_like(0, dy);
    Tensor g = dy;
    if (ctx.max) g = kernels::where(kernels::binary(BinaryOp::kLe, x, scalar_like(*ctx.max, x)), g, zero);
    if (ctx.min) g = kernels::where(kernels::binary(BinaryOp::kGe, x, scalar_like(*ctx.min, x)), g, zero);
    return {g};
  }
};
MT_REGISTER_OP(Clamp);

/// maximum (kIsMax) or minimum of a and b.
template <bool kIsMax>
struct Extremum {
  static constexpr const char* kName = kIsMax ? "maximum" : "minimum";
  static constexpr Precision kPrecision = Precision::kPromote;
  using Ctx = autograd::Ctx;
  static Tensor forward(Ctx& ctx, const Tensor& a, const Tensor& b) {
    check_binary(kName, a, b, /*integers=*/true);
    if (ctx.recording) ctx.save_for_backward(a, b);
    return kernels::binary(kIsMax ? BinaryOp::kMaximum : BinaryOp::kMinimum, a, b);
  }
  /// PyTorch's: dy to the side that won, dy / 2 to each where a == b, dy to both where either is NaN.
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor &a = ctx.saved(0), &b = ctx.saved(1);
    const Tensor zero = scalar_like(0, dy);
    const Tensor half = kernels::scalar(ScalarOp::kMul, dy, 0.5);
    const Tensor shared = kernels::where(kernels::binary(BinaryOp::kEq, a, b), half, dy);
    // a loses where a < b for maximum, a > b for minimum; b where the other holds.
    const BinaryOp a_loses = kIsMax ? BinaryOp::kLt : BinaryOp::kGt, b_loses = kIsMax ? BinaryOp::kGt : BinaryOp::kLt;
    auto grad = [&](BinaryOp loses, const Shape& shape) {
      return ops::sum_to(kernels::where(kernels::binary(loses, a, b), zero, shared), shape);
    };
    return {ctx.needs_input_grad(0) ? grad(a_loses, a.shape()) : Tensor(),
            ctx.needs_input_grad(1) ? grad(b_loses, b.shape()) : Tensor()};
  }
};
using Maximum = Extremum<true>;
using Minimum = Extremum<false>;
MT_REGISTER_OP(Maximum);
MT_REGISTER_OP(Minimum);

/// where's condition, passed to apply<Where> wrapped so that the precision rule leaves it alone (it is bool, never
/// promoted with a and b) and the tape gives it no edge (it has no gradient).
struct Condition {
  Tensor mask;
};

struct Where {
  static constexpr const char* kName = "where";
  static constexpr Precision kPrecision = Precision::kPromote;  // a and b become one dtype, the wider
  struct Ctx : autograd::Ctx {
    Shape a_shape, b_shape;
  };
  static Tensor forward(Ctx& ctx, const Condition& condition, const Tensor& a, const Tensor& b) {
    const Tensor& c = condition.mask;
    ops::check::defined(kName, c, "condition");
    ops::check::defined(kName, a, "a");
    ops::check::defined(kName, b, "b");
    MT_CHECK(c.dtype() == DType::kBool, "where: expected a condition of dtype bool, got ", c.dtype(), " of shape ",
             c.shape());
    ops::check::same_device(kName, c, "condition", a, "a");
    ops::check::same_device(kName, a, "a", b, "b");
    broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), kName), b.shape(), kName);
    ctx.a_shape = a.shape(), ctx.b_shape = b.shape();
    if (ctx.recording) ctx.save_for_backward(c);
    return kernels::where(c, a, b);
  }
  static Grads backward(Ctx& ctx, const Tensor& dy) {
    const Tensor& c = ctx.saved(0);
    const Tensor zero = scalar_like(0, dy);
    Tensor da, db;
    if (ctx.needs_input_grad(0)) da = ops::sum_to(kernels::where(c, dy, zero), ctx.a_shape);
    if (ctx.needs_input_grad(1)) db = ops::sum_to(kernels::where(c, zero, dy), ctx.b_shape);
    return {da, db};
  }
};
MT_REGISTER_OP(Where);

// ---- comparisons ------------------------------------------------------------------------
// No gradient (the output is bool); listed so the precision table and the registry know them. Their functions
// promote and broadcast like the arithmetic ops and call the kernel directly.

#define MT_COMPARISON_OP(Type, name)                                  \
  struct Type {                                                       \
    static constexpr const char* kName = name;                        \
    static constexpr Precision kPrecision = Precision::kPromote;      \
  };                                                                  \
  MT_REGISTER_OP(Type)
MT_COMPARISON_OP(Eq, "eq");
MT_COMPARISON_OP(Ne, "ne");
MT_COMPARISON_OP(Lt, "lt");
MT_COMPARISON_OP(Le, "le");
MT_COMPARISON_OP(Gt, "gt");
MT_COMPARISON_OP(Ge, "ge");
#undef MT_COMPARISON_OP

/// a <op> b elementwise as kBool, after promoting both to their common dtype and broadcasting.
Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  ops::check::defined(name, a, "a");
  ops::check::defined(name, b, "b");
  ops::check::same_device(name, a, "a", b, "b");
  const DType common = promote_types(a.dtype(), b.dtype());
  const Tensor a2 = a.dtype() == common ? a : raw::to(a, common), b2 = b.dtype() == common ? b : raw::to(b, common);
  check_binary(name, a2, b2, /*integers=*/true);
  return kernels::binary(op, a2, b2);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return autograd::apply<Add>(a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return autograd::apply<Sub>(a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return autograd::apply<Mul>(a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return autograd::apply<Div>(a, b); }
Tensor add(const Tensor& a, double b) { return autograd::apply<AddScalar>(a, b); }
Tensor mul(const Tensor& a, double b) { return autograd::apply<MulScalar>(a, b); }
Tensor neg(const Tensor& x) { return autograd::apply<Neg>(x); }
Tensor pow(const Tensor& x, double exponent) { return autograd::apply<Pow>(x, exponent); }
Tensor exp(const Tensor& x) { return autograd::apply<Exp>(x); }
Tensor log(const Tensor& x) { return autograd::apply<Log>(x); }
Tensor sqrt(const Tensor& x) { return autograd::apply<Sqrt>(x); }
Tensor relu(const Tensor& x) { return autograd::apply<Relu>(x); }
Tensor sigmoid(const Tensor& x) { return autograd::apply<Sigmoid>(x); }
Tensor tanh(const Tensor& x) { return autograd::apply<Tanh>(x); }
Tensor abs(const Tensor& x) { return autograd::apply<Abs>(x); }
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  return autograd::apply<Clamp>(x, min, max);
}
Tensor maximum(const Tensor& a, const Tensor& b) { return autograd::apply<Maximum>(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return autograd::apply<Minimum>(a, b); }

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return autograd::apply<Where>(Condition{condition}, a, b);
}
Tensor where(const Tensor& condition, const Tensor& a, double b) {
  ops::check::defined("where", a, "a");
  ops::check::scalar_converts("where", "scalar b", a, "a", b);
  return where(condition, a, scalar_like(b, a));
}
Tensor where(const Tensor& condition, double a, const Tensor& b) {
  ops::check::defined("where", b, "b");
  ops::check::scalar_converts("where", "scalar a", b, "b", a);
  return where(condition, scalar_like(a, b), b);
}

Tensor gelu(const Tensor& x, const char* approximate) {
  bool is_tanh = std::strcmp(approximate, "tanh") == 0;
  MT_CHECK(is_tanh || std::strcmp(approximate, "none") == 0, "gelu: approximate must be \"none\" or \"tanh\", got \"",
           approximate, "\"");
  return autograd::apply<Gelu>(x, is_tanh);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Tensor& a, double b) { return autograd::apply<DivScalar>(a, b); }
Tensor operator/(double a, const Tensor& b) {
  ops::check::defined("div", b, "b");
  return div(scalar_like(a, b), b);  // LibTorch's fill + div_: a rounded to b's dtype, one division
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", BinaryOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", BinaryOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", BinaryOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", BinaryOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", BinaryOp::kGe, a, b); }

}  // namespace mixtape
