// ops/dispatch_nn.cpp — the public softmax, gather/scatter_add, cross-entropy and layer-norm
// kernels of ops/kernels.h: validate, then run on the tensor's device.
//
// The same split as ops/dispatch.cpp: every rule a backend must not decide
// for itself (dtypes, devices, shapes, dims, defaults) is checked here once;
// `kernel_for` then picks the device's kernel (core/kernel_table.h); kernels assume
// valid arguments.
#include <mixtape/ops/kernels.h>

#include <mixtape/ops/device_kernels.h>

namespace mixtape::kernels {

namespace {

void check_defined(const Tensor& t, const char* op, const char* arg) {
  MT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_floating(const Tensor& t, const char* op, const char* arg) {
  MT_CHECK(is_floating(t.dtype()), op, ": expected '", arg, "' of a floating dtype (f64, f32, f16, bf16), got ",
           t.dtype(), " (shape ", t.shape(), "); cast to a floating dtype first");
}

void check_same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MT_CHECK(a.device() == b.device(), op, ": expected '", a_name, "' and '", b_name, "' on the same device, got ",
           a.device(), " and ", b.device(), " (shapes ", a.shape(), " and ", b.shape(), ")");
}

void check_index(const char* op, const Tensor& index) {
  MT_CHECK(index.dtype() == DType::kI64, op, ": index must be i64, got ", index.dtype(), " (shape ", index.shape(),
           ")");
}

/// gather/scatter_add: index has the rank of the indexed shape and fits in it off `dim`.
void check_index_shape(const char* op, const Shape& shape, const char* shape_name, int64_t dim, const Tensor& index) {
  MT_CHECK(index.dim() == shape.size(), op, ": index (shape ", index.shape(), ") must have as many dims as ",
           shape_name, " (shape ", shape, ")");
  for (int64_t d = 0; d < shape.size(); ++d)
    MT_CHECK(d == dim || index.size(d) <= shape[d], op, ": index (shape ", index.shape(), ") is larger than ",
             shape_name, " (shape ", shape, ") at dim ", d, ", which is not the indexed dim ", dim);
}

}  // namespace

// ---- softmax ---------------------------------------------------------------------------

Tensor softmax(const Tensor& x, int64_t dim_in, bool log, std::optional<DType> out_dtype) {
  const char* op = log ? "log_softmax" : "softmax";
  check_defined(x, op, "x");
  check_floating(x, op, "x");
  const int64_t dim = wrap_dim(dim_in, x.dim(), op, x.shape());
  const DType out = out_dtype.value_or(x.dtype());
  MT_CHECK(is_floating(out), op, ": out_dtype must be floating, got ", out, " (shape ", x.shape(), ")");
  return kernel_for(x.device(), &DeviceKernels::softmax, op)(x, dim, log, out);
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim_in, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_defined(dy, op, "dy");
  check_defined(y, op, "y");
  check_floating(dy, op, "dy");
  check_same_device(op, dy, "dy", y, "y");
  MT_CHECK(dy.dtype() == y.dtype(), op, ": expected dy and y of the same dtype, got ", dy.dtype(), " and ", y.dtype(),
           " (shape ", y.shape(), ")");
  MT_CHECK(dy.shape() == y.shape(), op, ": dy (shape ", dy.shape(), ") and y (shape ", y.shape(),
           ") must have the same shape");
  const int64_t dim = wrap_dim(dim_in, y.dim(), op, y.shape());
  return kernel_for(y.device(), &DeviceKernels::softmax_backward, op)(dy, y, dim, log);
}

// ---- gather / scatter_add ----------------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim_in, const Tensor& index) {
  check_defined(x, "gather", "x");
  check_defined(index, "gather", "index");
  check_index("gather", index);
  check_same_device("gather", x, "x", index, "index");
  const int64_t dim = wrap_dim(dim_in, x.dim(), "gather", x.shape());
  check_index_shape("gather", x.shape(), "x", dim, index);
  return kernel_for(x.device(), &DeviceKernels::gather, "gather")(x, dim, index);
}

Tensor scatter_add(const Shape& shape, int64_t dim_in, const Tensor& index, const Tensor& src) {
  check_defined(index, "scatter_add", "index");
  check_defined(src, "scatter_add", "src");
  check_index("scatter_add", index);
  check_floating(src, "scatter_add", "src");
  check_same_device("scatter_add", src, "src", index, "index");
  MT_CHECK(index.shape() == src.shape(), "scatter_add: index (shape ", index.shape(), ") and src (shape ",
           src.shape(), ") must have the same shape");
  const int64_t dim = wrap_dim(dim_in, shape.size(), "scatter_add", shape);
  check_index_shape("scatter_add", shape, "the output", dim, index);
  return kernel_for(src.device(), &DeviceKernels::scatter_add, "scatter_add")(shape, dim, index, src);
}

// ---- fused cross-entropy ----------------------------------------------------------------

namespace {

/// logits (rows, C) floating, target (rows) kI64 on its device, label_smoothing in [0, 1].
void check_cross_entropy_args(const char* op, const Tensor& logits, const Tensor& target, double label_smoothing) {
  check_defined(logits, op, "logits");
  check_defined(target, op, "target");
  check_floating(logits, op, "logits");
  MT_CHECK(logits.dim() == 2, op, ": expected logits of shape (rows, C), got shape ", logits.shape());
  MT_CHECK(target.dtype() == DType::kI64, op, ": target must hold class indices as i64, got ", target.dtype(),
           " (shape ", target.shape(), ")");
  MT_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), op, ": target of shape ", target.shape(),
           " does not match logits of shape ", logits.shape(), " (expected (", logits.size(0), "))");
  check_same_device(op, logits, "logits", target, "target");
  MT_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
           label_smoothing);
}

/// A per-row statistic of logits: the accumulator dtype, `rows` elements (or one, when `broadcast`), same device.
void check_row_stat(const char* op, const Tensor& t, const char* name, const Tensor& logits, bool broadcast,
                    bool logits_dtype_too = false) {
  check_defined(t, op, name);
  check_same_device(op, logits, "logits", t, name);
  const DType A = logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const bool also_logits = logits_dtype_too && logits.dtype() != A;
  MT_CHECK(t.dtype() == A || (logits_dtype_too && t.dtype() == logits.dtype()), op, ": ", name, " of ",
           logits.dtype(), " logits must be ", A, also_logits ? " or the logits' dtype" : "", ", got ", t.dtype(),
           " (shape ", t.shape(), ")");
  const int64_t rows = logits.size(0);
  const bool ok = (t.dim() == 1 && t.size(0) == rows) || (broadcast && t.dim() <= 1 && t.numel() == 1);
  MT_CHECK(ok, op, ": ", name, " of shape ", t.shape(), " must hold one value per row of logits (shape ",
           logits.shape(), "): expected shape (", rows, ")", broadcast ? " or a single value" : "");
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double label_smoothing) {
  check_cross_entropy_args("cross_entropy", logits, target, label_smoothing);
  return kernel_for(logits.device(), &DeviceKernels::cross_entropy, "cross_entropy")(logits, target, ignore_index,
                                                                                     label_smoothing);
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_scale,
                              int64_t ignore_index, double label_smoothing, const Tensor& divisor) {
  const char* op = "cross_entropy_backward";
  check_cross_entropy_args(op, logits, target, label_smoothing);
  check_row_stat(op, lse, "lse", logits, /*broadcast=*/false);
  check_row_stat(op, row_scale, "row_scale", logits, /*broadcast=*/true, /*logits_dtype_too=*/true);
  if (divisor.defined()) {
    check_same_device(op, logits, "logits", divisor, "divisor");
    MT_CHECK(divisor.dtype() == lse.dtype() && divisor.numel() == 1, op, ": divisor must be a single ", lse.dtype(),
             " value, got ", divisor.dtype(), " of shape ", divisor.shape());
  }
  return kernel_for(logits.device(), &DeviceKernels::cross_entropy_backward, op)(
      logits, target, lse, row_scale, ignore_index, label_smoothing, divisor);
}

// ---- layer norm ------------------------------------------------------------------------

namespace {

/// Whether a suffix of `shape` holds exactly `numel` elements (the rows of a layer norm).
bool trailing_dims_hold(const Shape& shape, int64_t numel) {
  int64_t n = 1;
  for (int64_t d = shape.size() - 1; d >= 0; --d) {
    n *= shape[d];
    if (n == numel) return true;
  }
  return false;
}

void check_param(const char* op, const Tensor& p, const char* name, const Tensor& x, int64_t normalized_numel) {
  if (!p.defined()) return;
  check_floating(p, op, name);
  check_same_device(op, x, "x", p, name);
  MT_CHECK(p.numel() == normalized_numel, op, ": ", name, " (shape ", p.shape(), ") must have ", normalized_numel,
           " elements, one per normalized element of x (shape ", x.shape(), ")");
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps) {
  check_defined(x, "layer_norm", "x");
  check_floating(x, "layer_norm", "x");
  MT_CHECK(normalized_numel >= 1 && trailing_dims_hold(x.shape(), normalized_numel), "layer_norm: ",
           normalized_numel, " normalized elements do not match the trailing dims of x (shape ", x.shape(), ")");
  MT_CHECK(eps >= 0, "layer_norm: eps must be >= 0, got ", eps);
  check_param("layer_norm", weight, "weight", x, normalized_numel);
  check_param("layer_norm", bias, "bias", x, normalized_numel);
  return kernel_for(x.device(), &DeviceKernels::layer_norm, "layer_norm")(x, normalized_numel, weight, bias, eps);
}

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool bias_defined) {
  const char* op = "layer_norm_backward";
  check_defined(dy, op, "dy");
  check_defined(x, op, "x");
  check_defined(mean, op, "mean");
  check_defined(rstd, op, "rstd");
  check_floating(x, op, "x");
  check_same_device(op, x, "x", dy, "dy");
  check_same_device(op, x, "x", mean, "mean");
  check_same_device(op, x, "x", rstd, "rstd");
  MT_CHECK(dy.dtype() == x.dtype() && dy.shape() == x.shape(), op, ": dy (", dy.dtype(), ", shape ", dy.shape(),
           ") must match x (", x.dtype(), ", shape ", x.shape(), ")");
  const DType stats = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  MT_CHECK(mean.dtype() == stats && rstd.dtype() == stats, op, ": mean and rstd of ", x.dtype(), " data must be ",
           stats, ", got ", mean.dtype(), " and ", rstd.dtype());
  const int64_t rows = mean.numel();
  MT_CHECK(rstd.numel() == rows && rows > 0 && x.numel() % rows == 0, op, ": mean (shape ", mean.shape(),
           ") and rstd (shape ", rstd.shape(), ") must hold one value per row of x (shape ", x.shape(), ")");
  check_param(op, weight, "weight", x, x.numel() / rows);
  return kernel_for(x.device(), &DeviceKernels::layer_norm_backward, op)(dy, x, mean, rstd, weight, bias_defined);
}

}  // namespace mixtape::kernels
