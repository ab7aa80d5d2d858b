// ops/check.cpp — the argument checks of the ops' forwards (ops/check.h).
#include <mixtape/ops/check.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

namespace mixtape::ops::check {

namespace {

std::string format_dims(std::span<const int64_t> dims) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ']';
  return os.str();
}

}  // namespace

void defined(const char* op, const Tensor& t, const char* arg) {
  MT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void floating(const char* op, const Tensor& t, const char* arg) {
  MT_CHECK(is_floating(t.dtype()), op, ": expected '", arg, "' of a floating dtype (f64, f32, f16, bf16), got ",
           t.dtype(), " (shape ", t.shape(), "); cast to a floating dtype first");
}

void arithmetic(const char* op, const Tensor& t, bool integers) {
  const DType d = t.dtype();
  if (is_floating(d)) return;
  if (integers) {
    MT_CHECK(d != DType::kBool, op, ": expected a floating (f64, f32, f16, bf16) or integer (i64, i32, u8) dtype, got ",
             d, " (shape ", t.shape(), ")");
    return;
  }
  MT_ERROR(op, ": expected a floating dtype (f64, f32, f16, bf16), got ", d, " (shape ", t.shape(),
           "); cast to a floating dtype first");
}

void same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MT_CHECK(a.device() == b.device(), op, ": expected '", a_name, "' and '", b_name, "' on the same device, got ",
           a.device(), " and ", b.device(), " (shapes ", a.shape(), " and ", b.shape(), ")");
}

void same_dtype(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  MT_CHECK(a.dtype() == b.dtype(), op, ": expected '", a_name, "' and '", b_name, "' of one dtype, got ", a.dtype(),
           " and ", b.dtype(), " (shapes ", a.shape(), " and ", b.shape(), "); cast one, or run under autocast");
}

void scalar_fits(const char* op, const Tensor& t, double s) {
  if (is_floating(t.dtype())) return;
  // 2^63: the first double outside int64's range.
  MT_CHECK(std::isfinite(s) && s == std::trunc(s) && std::fabs(s) < 9223372036854775808.0, op, ": the scalar ", s,
           " is not an integer but x is ", t.dtype(), " (shape ", t.shape(), "); cast x to a floating dtype first");
}

void scalar_converts(const char* op, const char* what, const Tensor& t, const char* t_name, double s) {
  scalar_fits(op, t, s);
  const DType d = t.dtype();
  MT_CHECK(fits(s, d) || (d == DType::kU8 && fits(-s, d)), op, ": the ", what, " ", s, " cannot be converted to ", d,
           " without overflow (", t_name, " of shape ", t.shape(), ")");
}

std::vector<int64_t> reduce_dims(const char* op, const Tensor& x, std::span<const int64_t> dims_in) {
  const int64_t ndim = x.dim();
  std::vector<int64_t> dims;
  bool seen[Shape::kMaxDims] = {};
  for (int64_t d : dims_in) {
    const int64_t w = wrap_dim(d, ndim, op, x.shape());
    if (ndim == 0) continue;
    MT_CHECK(!seen[w], op, ": dim ", w, " appears more than once in dims ", format_dims(dims_in), " (shape ",
             x.shape(), ")");
    seen[w] = true;
    dims.push_back(w);
  }
  if (dims_in.empty())
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  return dims;
}

void nonempty_reduction(const char* op, const Tensor& x, std::span<const int64_t> dims) {
  int64_t reduced = 1, kept = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    (std::find(dims.begin(), dims.end(), d) != dims.end() ? reduced : kept) *= x.size(d);
  MT_CHECK(reduced != 0 || kept == 0, op, ": cannot reduce over zero elements (shape ", x.shape(), ", dims ",
           format_dims(dims), "): ", op, " of nothing is undefined");
}

std::string describe(const kernels::Window2d& w) {
  std::ostringstream os;
  os << "kernel " << w.kernel[0] << "x" << w.kernel[1] << ", stride " << w.stride[0] << "x" << w.stride[1]
     << ", padding " << w.padding[0] << "x" << w.padding[1] << ", dilation " << w.dilation[0] << "x" << w.dilation[1];
  return os.str();
}

void window(const char* op, const Shape& input_shape, const kernels::Window2d& w) {
  for (int a = 0; a < 2; ++a)
    MT_CHECK(w.kernel[a] > 0 && w.stride[a] > 0 && w.dilation[a] > 0 && w.padding[a] >= 0, op,
             ": kernel, stride and dilation must be positive and padding non-negative, got ", describe(w));
  int64_t out[2];
  for (int a = 0; a < 2; ++a) {
    int64_t span = 0, padded = 0;
    MT_CHECK(!__builtin_mul_overflow(w.dilation[a], w.kernel[a] - 1, &span) && span < INT64_MAX &&
                 !__builtin_mul_overflow(w.padding[a], 2, &padded) &&
                 !__builtin_add_overflow(padded, input_shape[2 + a], &padded),
             op, ": the window's sizes overflow 64 bits (input shape ", input_shape, ", ", describe(w), ")");
    ++span;
    MT_CHECK(span <= padded, op, ": the ", a == 0 ? "height" : "width", " of the (dilated) kernel, ", span,
             ", exceeds the padded input's, ", padded, " (input shape ", input_shape, ", ", describe(w), ")");
    out[a] = kernels::window_output_size(input_shape[2 + a], w, a);
  }
  // The output, and the columns a convolution unfolds it into, must be countable before anything is allocated.
  (void)checked_numel(Shape{input_shape[0], input_shape[1], w.kernel[0], w.kernel[1], out[0], out[1]}, op);
}

void pool_padding(const char* op, const kernels::Window2d& w) {
  for (int a = 0; a < 2; ++a) {
    const int64_t span = w.dilation[a] * (w.kernel[a] - 1) + 1;
    MT_CHECK(2 * w.padding[a] <= span, op, ": padding should be at most half of the kernel size, got ", describe(w));
  }
}

void index(const char* op, const Tensor& index, Device device, int64_t dim, const Shape& shape) {
  defined(op, index, "index");
  MT_CHECK(index.dtype() == DType::kI64 || index.dtype() == DType::kI32, op,
           ": expected an index of dtype i64 or i32, got ", index.dtype(), " (index shape ", index.shape(), ")");
  MT_CHECK(index.dim() <= 1, op, ": expected a 1-D index, got shape ", index.shape());
  MT_CHECK(index.device() == device, op, ": expected the index on ", device, ", got it on ", index.device());
  if (!index.device().is_cpu()) return;
  const int64_t size = shape[dim];
  for (int64_t v : index.to_vector<int64_t>())
    MT_CHECK(v >= 0 && v < size, op, ": index ", v, " is out of range for dim ", dim, " of size ", size, " (shape ",
             shape, ")");
}

}  // namespace mixtape::ops::check
