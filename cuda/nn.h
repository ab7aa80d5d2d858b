// cuda/nn.h — the CUDA kernels behind the "softmax, losses and normalisation"
// entries of the kernel table (core/kernel_table.h); internal to cuda/.
//
// Same contract as ops/cpu/nn_kernels.h: ops/dispatch_nn.cpp has validated
// every argument (dtypes, devices, shapes, dims, defaults), the tensors are
// on one CUDA device, and outputs are freshly allocated and overwritten.
// Statistics run in f32 for f16/bf16/f32 (f64 when f64 is involved) and each
// output element is rounded once, so the results agree with the CPU's within
// the dtype's tolerance. Index values are not checked on the host (that would
// need a synchronisation): gather reads nothing out of bounds and returns NaN
// (0 for integer dtypes) for an out-of-range index, scatter_add skips it.
//
// Host code includes this header without CUDA; the launch helpers at the end
// exist only for the .cu files.
#pragma once

#include <cstdint>

#include <mixtape/core/kernel_table.h>
#include <mixtape/core/tensor.h>

namespace mixtape::kernels::cuda {

// cuda/softmax.cu
Tensor softmax(const Tensor& x, int64_t dim, bool log, DType out_dtype);
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim, bool log);

// cuda/loss.cu
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

// cuda/cross_entropy.cu (a target out of [0, C) that is not ignore_index: NaN loss and NaN dlogits for its row)
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double label_smoothing);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_scale,
                              int64_t ignore_index, double label_smoothing, const Tensor& divisor);

// cuda/layer_norm.cu
LayerNormResult layer_norm(const Tensor& x, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps);
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool bias_defined);

}  // namespace mixtape::kernels::cuda

#if defined(__CUDACC__)
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda {

using ::mixtape::cuda::DeviceGuard;

}  // namespace mixtape::kernels::cuda
#endif
