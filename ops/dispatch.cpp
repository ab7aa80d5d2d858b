// ops/dispatch.cpp — the public kernels of ops/kernels.h: validate, then run on the tensor's device.
//
// Every rule a backend must not decide for itself lives here, once: which
// dtypes an op accepts, that operands share a dtype and a device, broadcast
// and matmul shapes, reduction dims and result dtypes, empty reductions.
// After that, `kernel_for` picks the kernel from the device's table (core/kernel_table.h); the backends
// (ops/cpu/, later cuda/) assume valid arguments (STYLE.md §4: forward() ->
// forward_impl()).
#include <mixtape/ops/kernels.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/ops/device_kernels.h>
#include <mixtape/core/scalar_math.h>

namespace mixtape::kernels {

namespace {

std::string format_dims(std::span<const int64_t> dims) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ']';
  return os.str();
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  MT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

/// Both operands on one device and of one dtype: kernels never move or promote.
void check_same_device_and_dtype(const char* op, const Tensor& a, const Tensor& b) {
  MT_CHECK(a.device() == b.device(), op, ": expected tensors on the same device, got ", a.device(), " and ",
           b.device(), " (shapes ", a.shape(), " and ", b.shape(), ")");
  MT_CHECK(a.dtype() == b.dtype(), op, ": expected tensors of the same dtype, got ", a.dtype(), " and ", b.dtype(),
           " (shapes ", a.shape(), " and ", b.shape(), "); kernels do not promote, cast one first");
}

/// Floating dtypes always; i64/i32/u8 when `integers` (bool never: it has no arithmetic).
void check_arithmetic_dtype(const char* op, DType t, bool integers, const Shape& shape) {
  if (is_floating(t)) return;
  if (integers) {
    MT_CHECK(t != DType::kBool, op, ": expected a floating (f64, f32, f16, bf16) or integer (i64, i32, u8) dtype, got ",
             t, " (shape ", shape, ")");
    return;
  }
  MT_ERROR(op, ": expected a floating dtype (f64, f32, f16, bf16), got ", t, " (shape ", shape,
           "); cast to a floating dtype first");
}

}  // namespace

// ---- names ---------------------------------------------------------------------------

const char* name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "neg";
    case UnaryOp::kAbs: return "abs";
    case UnaryOp::kSign: return "sign";
    case UnaryOp::kSquare: return "square";
    case UnaryOp::kReciprocal: return "reciprocal";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kRsqrt: return "rsqrt";
    case UnaryOp::kRelu: return "relu";
    case UnaryOp::kGelu: return "gelu";
    case UnaryOp::kGeluTanh: return "gelu_tanh";
    case UnaryOp::kSigmoid: return "sigmoid";
    case UnaryOp::kTanh: return "tanh";
  }
  return "?";
}

const char* name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
    case BinaryOp::kMaximum: return "maximum";
    case BinaryOp::kMinimum: return "minimum";
    case BinaryOp::kPow: return "pow";
    case BinaryOp::kReluBackward: return "relu_backward";
    case BinaryOp::kGeluBackward: return "gelu_backward";
    case BinaryOp::kGeluTanhBackward: return "gelu_tanh_backward";
    case BinaryOp::kSigmoidBackward: return "sigmoid_backward";
    case BinaryOp::kTanhBackward: return "tanh_backward";
    case BinaryOp::kEq: return "eq";
    case BinaryOp::kNe: return "ne";
    case BinaryOp::kLt: return "lt";
    case BinaryOp::kLe: return "le";
    case BinaryOp::kGt: return "gt";
    case BinaryOp::kGe: return "ge";
  }
  return "?";
}

const char* name(ScalarOp op) {
  switch (op) {
    case ScalarOp::kAdd: return "add_scalar";
    case ScalarOp::kMul: return "mul_scalar";
    case ScalarOp::kPow: return "pow_scalar";
    case ScalarOp::kRsub: return "rsub_scalar";
    case ScalarOp::kRdiv: return "rdiv_scalar";
    case ScalarOp::kDiv: return "div_scalar";
    case ScalarOp::kMaximum: return "maximum_scalar";
    case ScalarOp::kMinimum: return "minimum_scalar";
  }
  return "?";
}

const char* name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kArgmax: return "argmax";
    case ReduceOp::kArgmin: return "argmin";
  }
  return "?";
}

// ---- elementwise ---------------------------------------------------------------------

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* op_name = name(op);
  check_defined(x, op_name, "x");
  check_arithmetic_dtype(op_name, x.dtype(), math::supports_integers(op), x.shape());
  return kernel_for(x.device(), &DeviceKernels::unary, op_name)(op, x);
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* op_name = name(op);
  check_defined(a, op_name, "a");
  check_defined(b, op_name, "b");
  check_same_device_and_dtype(op_name, a, b);
  if (!math::is_comparison(op)) check_arithmetic_dtype(op_name, a.dtype(), math::supports_integers(op), a.shape());
  broadcast_shapes(a.shape(), b.shape(), op_name);
  return kernel_for(a.device(), &DeviceKernels::binary, op_name)(op, a, b);
}

Tensor scalar(ScalarOp op, const Tensor& x, double s) {
  const char* op_name = name(op);
  check_defined(x, op_name, "x");
  check_arithmetic_dtype(op_name, x.dtype(), math::supports_integers(op), x.shape());
  if (!is_floating(x.dtype())) {
    // 2^63: the first double outside int64's range.
    MT_CHECK(std::isfinite(s) && s == std::trunc(s) && std::fabs(s) < 9223372036854775808.0, op_name,
             ": the scalar ", s, " is not an integer but x is ", x.dtype(), " (shape ", x.shape(),
             "); cast x to a floating dtype first");
  }
  return kernel_for(x.device(), &DeviceKernels::scalar, op_name)(op, x, s);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "cond");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  MT_CHECK(cond.dtype() == DType::kBool, "where: the condition must be bool, got ", cond.dtype(), " (shape ",
           cond.shape(), ")");
  MT_CHECK(cond.device() == a.device(), "where: expected tensors on the same device, got ", cond.device(),
           " (condition, shape ", cond.shape(), ") and ", a.device(), " (shape ", a.shape(), ")");
  check_same_device_and_dtype("where", a, b);
  broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  return kernel_for(a.device(), &DeviceKernels::where, "where")(cond, a, b);
}

// ---- reductions ----------------------------------------------------------------------

Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims_in, bool keepdim,
              std::optional<DType> out_dtype) {
  const char* op_name = name(op);
  check_defined(x, op_name, "x");
  const int64_t ndim = x.dim();

  // Wrapped, unique, ascending; a 0-d tensor accepts dim 0 / -1 and has nothing to reduce.
  std::vector<int64_t> dims;
  bool seen[Shape::kMaxDims] = {};
  for (int64_t d : dims_in) {
    const int64_t w = wrap_dim(d, ndim, op_name, x.shape());
    if (ndim == 0) continue;
    MT_CHECK(!seen[w], op_name, ": dim ", w, " appears more than once in dims ", format_dims(dims_in), " (shape ",
             x.shape(), ")");
    seen[w] = true;
    dims.push_back(w);
  }
  if (dims_in.empty())
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());

  const DType in = x.dtype();
  DType out = in;
  switch (op) {
    case ReduceOp::kSum:
      out = out_dtype.value_or(is_floating(in) ? in : DType::kI64);
      MT_CHECK(out != DType::kBool && (is_floating(out) || !is_floating(in)), op_name, ": cannot return a sum of ",
               in, " values as ", out, " (shape ", x.shape(), ")");
      break;
    case ReduceOp::kMean:
      MT_CHECK(is_floating(in), op_name, ": expected a floating dtype (f64, f32, f16, bf16), got ", in, " (shape ",
               x.shape(), "); cast to a floating dtype first");
      out = out_dtype.value_or(in);
      MT_CHECK(is_floating(out), op_name, ": out_dtype must be floating, got ", out);
      break;
    case ReduceOp::kMax:
    case ReduceOp::kMin:
      out = out_dtype.value_or(in);
      break;
    case ReduceOp::kArgmax:
    case ReduceOp::kArgmin:
      out = out_dtype.value_or(DType::kI64);
      MT_CHECK(out == DType::kI64, op_name, ": returns i64 indices, got out_dtype ", out);
      break;
  }

  // max/min/argmax/argmin have no identity: reducing zero elements into a non-empty result is an error.
  if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
    int64_t reduced = 1, kept = 1;
    for (int64_t d = 0; d < ndim; ++d) (std::find(dims.begin(), dims.end(), d) != dims.end() ? reduced : kept) *= x.size(d);
    MT_CHECK(reduced != 0 || kept == 0, op_name, ": cannot reduce over zero elements (shape ", x.shape(), ", dims ",
             format_dims(dims), "): ", op_name, " of nothing is undefined");
  }
  return kernel_for(x.device(), &DeviceKernels::reduce, op_name)(op, x, dims, keepdim, out);
}

// ---- matmul --------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype) {
  check_defined(a, "matmul", "a");
  check_defined(b, "matmul", "b");
  check_same_device_and_dtype("matmul", a, b);
  MT_CHECK(is_floating(a.dtype()), "matmul: expected floating tensors (f64, f32, f16, bf16), got ", a.dtype(), " and ",
           b.dtype(), " (shapes ", a.shape(), " and ", b.shape(), "); integer matmul is not supported");
  MT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dim, got shapes ", a.shape(),
           " and ", b.shape());
  const int64_t k_a = a.size(-1);
  const int64_t k_b = b.dim() == 1 ? b.size(0) : b.size(-2);
  MT_CHECK(k_a == k_b, "matmul: shapes cannot be multiplied (", a.shape(), " and ", b.shape(), ")");
  // Batch dims (all but the last two) broadcast, right-aligned.
  const int64_t batch_a = std::max<int64_t>(a.dim() - 2, 0), batch_b = std::max<int64_t>(b.dim() - 2, 0);
  for (int64_t i = 1; i <= std::min(batch_a, batch_b); ++i) {
    const int64_t da = a.size(batch_a - i), db = b.size(batch_b - i);
    MT_CHECK(da == db || da == 1 || db == 1, "matmul: the batch dims of shapes ", a.shape(), " and ", b.shape(),
             " cannot be broadcast together (", da, " vs ", db, ")");
  }
  MT_CHECK(std::max(batch_a, batch_b) + 2 <= Shape::kMaxDims, "matmul: the result of shapes ", a.shape(), " and ",
           b.shape(), " would exceed ", Shape::kMaxDims, " dims");
  const DType out = out_dtype.value_or(a.dtype());
  MT_CHECK(is_floating(out), "matmul: out_dtype must be floating, got ", out, " (shapes ", a.shape(), " and ",
           b.shape(), ")");
  return kernel_for(a.device(), &DeviceKernels::matmul, "matmul")(a, b, out);
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, std::optional<DType> out_dtype) {
  check_defined(bias, "addmm", "bias");
  check_defined(a, "addmm", "a");
  check_defined(b, "addmm", "b");
  check_same_device_and_dtype("addmm", a, b);
  check_same_device_and_dtype("addmm", a, bias);
  MT_CHECK(is_floating(a.dtype()), "addmm: expected floating tensors (f64, f32, f16, bf16), got ", a.dtype(),
           " (shapes ", a.shape(), " and ", b.shape(), ")");
  MT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "addmm: expected a (m, k) and b (k, n), got shapes ",
           a.shape(), " and ", b.shape());
  MT_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1), "addmm: expected bias of shape [", b.size(1),
           "] for a ", a.shape(), " · b ", b.shape(), ", got ", bias.shape());
  const DType out = out_dtype.value_or(a.dtype());
  MT_CHECK(is_floating(out), "addmm: out_dtype must be floating, got ", out);
  return kernel_for(a.device(), &DeviceKernels::addmm, "addmm")(bias, a, b, out);
}

}  // namespace mixtape::kernels
