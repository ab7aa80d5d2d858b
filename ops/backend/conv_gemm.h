// ops/backend/conv_gemm.h — conv2d as im2col + GEMM on any device, through the kernel entry points.
//
// The one design idea: a convolution is a GEMM over im2col columns. With the weight viewed as (C_out, C_in·kH·kW)
// and the input unfolded into (N, C_in·kH·kW, H_out·W_out) columns, y = W · cols is one batched product, and so are
// both gradients: dW = Σ_n dY_n · cols_nᵀ, dX = col2im(Wᵀ · dY). Every backend can compose it from its im2col,
// col2im, matmul, reduce and binary_ kernels; the CUDA backend's conv2d kernels are exactly this, the CPU's take it
// for the windows its Winograd path does not cover (ops/cpu/conv.cpp).
//
// `chunk` samples go through the columns and the GEMMs together (chunk >= N: the whole batch in one product). The
// columns are kH·kW copies of the input: a CPU wants chunks whose columns fit its cache, a GPU the whole batch.
// Like matmul, f16/bf16 products accumulate in f32, and a result that is summed further (the bias add, the batch sum
// of dW, col2im's overlapping windows) stays in f32 until its one rounding.
//
// Internal: the CPU and CUDA backends call these; the op (ops/conv.cpp) calls the table's conv2d kernels, and
// conv2d_bias_grad when only the bias needs a gradient.
#pragma once

#include <cstdint>

#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels {

/// How many samples of an input (N, C_in, H, W) of `dtype` go through the columns together so that their columns
/// in acc_dtype (the input gradient's, the largest) take at most `column_bytes`: at least one, at most N.
int64_t conv_chunk_samples(const Shape& input_shape, DType dtype, const Window2d& w, int64_t column_bytes);

/// y (N, C_out, H_out, W_out) in x's dtype = conv(x (N, C_in, H, W), weight (C_out, C_in, kH, kW)) + bias (C_out, or
/// undefined).
Tensor conv2d_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w, int64_t chunk);

/// dx (input_shape) in dy's dtype = col2im(Wᵀ · dY) for dy (N, C_out, H_out, W_out).
Tensor conv2d_gemm_backward_input(const Tensor& dy, const Tensor& weight, const Shape& input_shape,
                                  const Window2d& w, int64_t chunk);

/// dweight (C_out, C_in, kH, kW) in dy's dtype = Σ_n dY_n · cols_nᵀ, summed over the batch in acc_dtype; with
/// `bias`, dbias (C_out) = dy summed over (N, H_out, W_out).
Conv2dWeightGrads conv2d_gemm_backward_weight(const Tensor& dy, const Tensor& x, const Window2d& w, bool bias,
                                              int64_t chunk);

/// dbias (C_out) in dy's dtype = dy (N, C_out, H_out, W_out) summed over (N, H_out, W_out) in acc_dtype: each
/// sample's planes, then the batch (the bias gradient of any convolution, whatever computed its weight gradient).
Tensor conv2d_bias_grad(const Tensor& dy);

}  // namespace mixtape::kernels
