// ops/backend/conv_gemm.cpp — conv2d as im2col + GEMM, through the entry points (conv_gemm.h).
#include <mixtape/ops/backend/conv_gemm.h>

#include <algorithm>

namespace mixtape::kernels {

namespace {

/// [s, e) ranges of `chunk` samples covering [0, n); one range (possibly empty) when chunk >= n.
template <class F>
void for_each_chunk(int64_t n, int64_t chunk, F&& f) {
  const int64_t step = std::max<int64_t>(chunk, 1);
  if (step >= n) return f(int64_t{0}, n);
  for (int64_t s = 0; s < n; s += step) f(s, std::min(n, s + step));
}

}  // namespace

int64_t conv_chunk_samples(const Shape& input_shape, DType dtype, const Window2d& w, int64_t column_bytes) {
  const int64_t rows = input_shape[1] * w.kernel[0] * w.kernel[1];
  const int64_t L = window_output_size(input_shape[2], w, 0) * window_output_size(input_shape[3], w, 1);
  const int64_t per_sample = rows * L * static_cast<int64_t>(itemsize(acc_dtype(dtype)));
  return std::clamp<int64_t>(column_bytes / std::max<int64_t>(per_sample, 1), 1, std::max<int64_t>(input_shape[0], 1));
}

Tensor conv2d_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w, int64_t chunk) {
  const int64_t n = x.size(0), c_out = weight.size(0), k = weight.numel() / std::max<int64_t>(c_out, 1);
  const int64_t ho = window_output_size(x.size(2), w, 0), wo = window_output_size(x.size(3), w, 1);
  const DType dtype = x.dtype(), acc = acc_dtype(dtype);
  const Tensor w2 = raw::reshape(weight, {c_out, k});                                             // (C_out, C_in·kH·kW)
  const Tensor b2 = bias.defined() ? raw::to(raw::reshape(bias, {c_out, 1}), acc) : Tensor();  // (C_out, 1)
  // One chunk's (B, C_out, L) in acc: W · cols + bias, summed in f32 before the one rounding.
  auto part = [&](int64_t s, int64_t e) {
    Tensor y = kernels::matmul(w2, kernels::im2col(raw::slice(x, 0, s, e), w), acc);
    if (b2.defined()) kernels::binary_(BinaryOp::kAdd, y, b2);
    return y;
  };
  Tensor y;  // (N, C_out, L)
  if (chunk >= n) {
    y = raw::to(part(0, n), dtype);
  } else {
    y = empty({n, c_out, ho * wo}, TensorOptions(dtype).device(x.device()));
    for_each_chunk(n, chunk, [&](int64_t s, int64_t e) { raw::copy_(raw::slice(y, 0, s, e), part(s, e)); });
  }
  return raw::view(y, {n, c_out, ho, wo});
}

Tensor conv2d_gemm_backward_input(const Tensor& dy, const Tensor& weight, const Shape& input_shape,
                                  const Window2d& w, int64_t chunk) {
  const int64_t n = dy.size(0), c_out = dy.size(1), L = dy.size(2) * dy.size(3);
  const int64_t k = input_shape[1] * w.kernel[0] * w.kernel[1];
  const DType dtype = dy.dtype(), acc = acc_dtype(dtype);
  const Tensor g = raw::reshape(dy, {n, c_out, L});                                  // (N, C_out, L)
  const Tensor w2t = raw::transpose(raw::reshape(weight, {c_out, k}), 0, 1);        // (C_in·kH·kW, C_out)
  // One chunk's dX = col2im(Wᵀ · dY), the overlapping windows summed in f32.
  auto part = [&](int64_t s, int64_t e) {
    Shape shape = input_shape;
    shape[0] = e - s;
    return kernels::col2im(kernels::matmul(w2t, raw::slice(g, 0, s, e), acc), shape, w);
  };
  if (chunk >= n) return raw::to(part(0, n), dtype);
  Tensor dx = empty(input_shape, TensorOptions(dtype).device(dy.device()));
  for_each_chunk(n, chunk, [&](int64_t s, int64_t e) { raw::copy_(raw::slice(dx, 0, s, e), part(s, e)); });
  return dx;
}

Conv2dWeightGrads conv2d_gemm_backward_weight(const Tensor& dy, const Tensor& x, const Window2d& w, bool bias,
                                              int64_t chunk) {
  const int64_t n = dy.size(0), c_out = dy.size(1), L = dy.size(2) * dy.size(3);
  const DType dtype = dy.dtype(), acc = acc_dtype(dtype);
  const Tensor g = raw::reshape(dy, {n, c_out, L});  // (N, C_out, L)
  // Each chunk's share of dW, (C_out, C_in·kH·kW) in acc: Σ_n dY_n · cols_nᵀ, the columns recomputed (cheaper to keep
  // x than kH·kW copies of it); the chunks' shares added in acc.
  Tensor dweight;
  for_each_chunk(n, chunk, [&](int64_t s, int64_t e) {
    const Tensor cols = kernels::im2col(raw::slice(x, 0, s, e), w);
    const int64_t batch_dim = 0;
    const Tensor products = kernels::matmul(raw::slice(g, 0, s, e), raw::transpose(cols, 1, 2), acc);
    Tensor share = kernels::reduce(ReduceOp::kSum, products, std::span<const int64_t>(&batch_dim, 1), false, acc);
    if (dweight.defined())
      kernels::binary_(BinaryOp::kAdd, dweight, share);
    else
      dweight = std::move(share);
  });
  Conv2dWeightGrads grads{raw::reshape(raw::to(dweight, dtype), {c_out, x.size(1), w.kernel[0], w.kernel[1]}), {}};
  if (bias) grads.dbias = conv2d_bias_grad(dy);
  return grads;
}

Tensor conv2d_bias_grad(const Tensor& dy) {
  const Tensor g = raw::reshape(dy, {dy.size(0), dy.size(1), dy.size(2) * dy.size(3)});  // (N, C_out, L)
  // Each sample's planes first (contiguous rows), into acc, then the batch (a column per channel): two reductions
  // that read their input in place, where one over (N, L) at once, dims that do not form one run, copies dy to rows
  // first on CUDA (cuda/reduce.cu).
  const int64_t plane_dim = 2, batch_dim = 0;
  const Tensor planes = kernels::reduce(ReduceOp::kSum, g, std::span<const int64_t>(&plane_dim, 1), false,
                                        acc_dtype(dy.dtype()));  // (N, C_out)
  return kernels::reduce(ReduceOp::kSum, planes, std::span<const int64_t>(&batch_dim, 1), false, dy.dtype());
}

}  // namespace mixtape::kernels
