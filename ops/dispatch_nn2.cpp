// ops/dispatch_nn2.cpp — the public convolution, pooling, dropout and indexing
// kernels of ops/kernels.h: validate, then run on the tensor's device.
//
// Like ops/dispatch.cpp, every rule a backend must not decide for itself lives
// here once: ranks, window sanity, that the window fits the padded input,
// dtypes, devices and index ranges. Then `kernel_for` picks the device's
// kernel table; the backends (ops/cpu/nn2.cpp, later cuda/) assume valid
// arguments (STYLE.md §4). Messages name the kernel and the shapes involved.
#include <mixtape/ops/kernels.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/ops/device_kernels.h>

namespace mixtape::kernels {

namespace {

std::string describe(const Window2d& w) {
  std::ostringstream os;
  os << "kernel " << w.kernel[0] << "x" << w.kernel[1] << ", stride " << w.stride[0] << "x" << w.stride[1]
     << ", padding " << w.padding[0] << "x" << w.padding[1] << ", dilation " << w.dilation[0] << "x" << w.dilation[1];
  return os.str();
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  MT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_floating(const char* op, const Tensor& t, const char* arg) {
  MT_CHECK(is_floating(t.dtype()), op, ": expected a floating ", arg, " (f64, f32, f16, bf16), got ", t.dtype(),
           " (shape ", t.shape(), ")");
}

void check_4d(const char* op, const Shape& shape, const char* arg) {
  MT_CHECK(shape.size() == 4, op, ": expected ", arg, " of 4 dims (N, C, H, W), got ", shape);
  for (int64_t d = 0; d < 4; ++d) MT_CHECK(shape[d] >= 0, op, ": negative size in ", arg, " shape ", shape);
}

/// Positive kernel, stride and dilation; non-negative padding.
void check_window(const char* op, const Window2d& w) {
  for (int a = 0; a < 2; ++a) {
    MT_CHECK(w.kernel[a] > 0 && w.stride[a] > 0 && w.dilation[a] > 0 && w.padding[a] >= 0, op,
             ": kernel, stride and dilation must be positive and padding non-negative, got ", describe(w));
  }
}

/// The window fits the padded input at least once along both axes.
void check_fits(const char* op, const Shape& input_shape, const Window2d& w) {
  for (int a = 0; a < 2; ++a) {
    const int64_t span = w.dilation[a] * (w.kernel[a] - 1) + 1, padded = input_shape[2 + a] + 2 * w.padding[a];
    MT_CHECK(span <= padded, op, ": the ", a == 0 ? "height" : "width", " of the (dilated) kernel, ", span,
             ", exceeds the padded input's, ", padded, " (input shape ", input_shape, ", ", describe(w), ")");
  }
}

/// PyTorch's pooling rule: padding at most half the (dilated) kernel, so every window holds an input element.
void check_pool_padding(const char* op, const Window2d& w) {
  for (int a = 0; a < 2; ++a) {
    const int64_t span = w.dilation[a] * (w.kernel[a] - 1) + 1;
    MT_CHECK(2 * w.padding[a] <= span, op, ": padding should be at most half of the kernel size, got ", describe(w));
  }
}

/// (N, C, H_out, W_out) for `input_shape` under `w`.
Shape pooled_shape(const Shape& input_shape, const Window2d& w) {
  return {input_shape[0], input_shape[1], window_output_size(input_shape[2], w, 0),
          window_output_size(input_shape[3], w, 1)};
}

/// A 0-D or 1-D kI64/kI32 index on `device` whose values lie in [0, size). The values are read
/// only for CPU indices: reading a CUDA index would copy it to the host and synchronise every
/// step, so CUDA kernels skip out-of-range entries instead (cuda/index.cu).
void check_index(const char* op, const Tensor& index, Device device, int64_t dim, int64_t size, const Shape& shape) {
  check_defined(index, op, "index");
  MT_CHECK(index.dtype() == DType::kI64 || index.dtype() == DType::kI32, op,
           ": expected an index of dtype i64 or i32, got ", index.dtype(), " (index shape ", index.shape(), ")");
  MT_CHECK(index.dim() <= 1, op, ": expected a 1-D index, got shape ", index.shape());
  MT_CHECK(index.device() == device, op, ": expected the index on ", device, ", got it on ", index.device());
  if (!index.device().is_cpu()) return;
  const std::vector<int64_t> values = index.to_vector<int64_t>();
  for (int64_t v : values)
    MT_CHECK(v >= 0 && v < size, op, ": index ", v, " is out of range for dim ", dim, " of size ", size, " (shape ",
             shape, ")");
}

}  // namespace

// ---- convolution columns ---------------------------------------------------------------

Tensor im2col(const Tensor& x, const Window2d& w) {
  check_defined(x, "im2col", "x");
  check_floating("im2col", x, "input");
  check_4d("im2col", x.shape(), "input");
  check_window("im2col", w);
  check_fits("im2col", x.shape(), w);
  return kernel_for(x.device(), &DeviceKernels::im2col, "im2col")(x, w);
}

Tensor col2im(const Tensor& cols, const Shape& input_shape, const Window2d& w) {
  check_defined(cols, "col2im", "cols");
  check_floating("col2im", cols, "cols");
  check_4d("col2im", input_shape, "input_shape");
  check_window("col2im", w);
  check_fits("col2im", input_shape, w);
  const Shape p = pooled_shape(input_shape, w);
  const Shape expected{input_shape[0], input_shape[1] * w.kernel[0] * w.kernel[1], p[2] * p[3]};
  MT_CHECK(cols.shape() == expected, "col2im: expected columns of shape ", expected, " (N, C·kH·kW, H_out·W_out) for ",
           "input shape ", input_shape, " and ", describe(w), ", got ", cols.shape());
  return kernel_for(cols.device(), &DeviceKernels::col2im, "col2im")(cols, input_shape, w);
}

// ---- pooling ---------------------------------------------------------------------------

MaxPoolResult max_pool2d(const Tensor& x, const Window2d& w) {
  check_defined(x, "max_pool2d", "x");
  check_floating("max_pool2d", x, "input");
  check_4d("max_pool2d", x.shape(), "input");
  check_window("max_pool2d", w);
  check_pool_padding("max_pool2d", w);
  check_fits("max_pool2d", x.shape(), w);
  return kernel_for(x.device(), &DeviceKernels::max_pool2d, "max_pool2d")(x, w);
}

Tensor max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Shape& input_shape, const Window2d& w) {
  check_defined(dy, "max_pool2d_backward", "dy");
  check_defined(indices, "max_pool2d_backward", "indices");
  check_floating("max_pool2d_backward", dy, "dy");
  check_4d("max_pool2d_backward", dy.shape(), "dy");
  check_4d("max_pool2d_backward", input_shape, "input_shape");
  MT_CHECK(indices.dtype() == DType::kI64 && indices.shape() == dy.shape(),
           "max_pool2d_backward: expected i64 indices of dy's shape ", dy.shape(), ", got ", indices.dtype(), " ",
           indices.shape());
  MT_CHECK(indices.device() == dy.device(), "max_pool2d_backward: dy is on ", dy.device(), " but indices on ",
           indices.device());
  check_window("max_pool2d_backward", w);
  check_pool_padding("max_pool2d_backward", w);
  check_fits("max_pool2d_backward", input_shape, w);
  MT_CHECK(dy.shape() == pooled_shape(input_shape, w), "max_pool2d_backward: expected dy of shape ",
           pooled_shape(input_shape, w), " for input shape ", input_shape, " and ", describe(w), ", got ", dy.shape());
  return kernel_for(dy.device(), &DeviceKernels::max_pool2d_backward, "max_pool2d_backward")(dy, indices, input_shape, w);
}

Tensor avg_pool2d(const Tensor& x, const Window2d& w) {
  check_defined(x, "avg_pool2d", "x");
  check_floating("avg_pool2d", x, "input");
  check_4d("avg_pool2d", x.shape(), "input");
  check_window("avg_pool2d", w);
  check_pool_padding("avg_pool2d", w);
  check_fits("avg_pool2d", x.shape(), w);
  return kernel_for(x.device(), &DeviceKernels::avg_pool2d, "avg_pool2d")(x, w);
}

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const Window2d& w) {
  check_defined(dy, "avg_pool2d_backward", "dy");
  check_floating("avg_pool2d_backward", dy, "dy");
  check_4d("avg_pool2d_backward", input_shape, "input_shape");
  check_window("avg_pool2d_backward", w);
  check_pool_padding("avg_pool2d_backward", w);
  check_fits("avg_pool2d_backward", input_shape, w);
  MT_CHECK(dy.shape() == pooled_shape(input_shape, w), "avg_pool2d_backward: expected dy of shape ",
           pooled_shape(input_shape, w), " for input shape ", input_shape, " and ", describe(w), ", got ", dy.shape());
  return kernel_for(dy.device(), &DeviceKernels::avg_pool2d_backward, "avg_pool2d_backward")(dy, input_shape, w);
}

// ---- dropout -----------------------------------------------------------------------------

Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device) {
  MT_CHECK(p >= 0.0 && p <= 1.0, "dropout_mask: probability has to be between 0 and 1, but got ", p);
  for (int64_t d = 0; d < shape.size(); ++d)
    MT_CHECK(shape[d] >= 0, "dropout_mask: negative size ", shape[d], " at dim ", d, " (shape ", shape, ")");
  // Each backend draws on its own device; the Philox counters make it the same mask either way.
  return kernel_for(device, &DeviceKernels::dropout_mask, "dropout_mask")(shape, p, seed, offset, device);
}

// ---- indexing ----------------------------------------------------------------------------

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "index_select", "x");
  MT_CHECK(x.dim() >= 1, "index_select: expected a tensor of at least 1 dim, got shape ", x.shape());
  const int64_t d = wrap_dim(dim, x.dim(), "index_select", x.shape());
  check_index("index_select", index, x.device(), d, x.size(d), x.shape());
  return kernel_for(x.device(), &DeviceKernels::index_select, "index_select")(x, d, index);
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(src, "index_add", "src");
  check_floating("index_add", src, "src");
  MT_CHECK(shape.size() >= 1, "index_add: expected a shape of at least 1 dim, got ", shape);
  const int64_t d = wrap_dim(dim, shape.size(), "index_add", shape);
  check_index("index_add", index, src.device(), d, shape[d], shape);
  Shape expected = shape;
  expected[d] = index.numel();
  MT_CHECK(src.shape() == expected, "index_add: expected src of shape ", expected, " (", index.numel(),
           " indices along dim ", d, " of ", shape, "), got ", src.shape());
  return kernel_for(src.device(), &DeviceKernels::index_add, "index_add")(shape, d, index, src);
}

}  // namespace mixtape::kernels
