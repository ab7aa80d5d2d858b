// cuda/elementwise.h — the CUDA launchers behind the kernel table's elementwise, reduction and matmul
// entries (internal: included by cuda/*.cu only).
//
// The declarations have exactly the signatures of core/kernel_table.h's
// DeviceKernels, so cuda/table.cu lists them as they are. Arguments arrive
// validated by ops/dispatch.cpp (same dtype and device, broadcastable shapes,
// wrapped sorted unique dims, out_dtype resolved); outputs are freshly
// allocated on the inputs' device and overwritten.
//
// No CUDA header here: the part below `__CUDACC__` is what the .cu files of
// this family share (the launch stream, the device guard, the grid size) and
// only nvcc sees it.
#pragma once

#include <cstdint>
#include <span>

#include <mixtape/core/kernel_table.h>
#include <mixtape/core/tensor.h>

namespace mixtape::kernels::cuda {

/// y = op(x); elementwise (cuda/elementwise.cu).
Tensor unary(UnaryOp op, const Tensor& x);
/// op(a, b) broadcast; kBool for comparisons (cuda/elementwise.cu).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
/// op(x, s) (cuda/elementwise.cu).
Tensor scalar(ScalarOp op, const Tensor& x, double s);
/// cond ? a : b broadcast (cuda/elementwise.cu).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// sum/mean/max/min/argmax/argmin over `dims` (cuda/reduce.cu).
Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype);
/// torch.matmul; f16/bf16 accumulate in f32, f64 in f64 (cuda/matmul.cu).
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype);
/// a (m, k) · b (k, n) + bias (n); the bias is the Tensor Core GEMM's epilogue (cuda/matmul.cu).
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, DType out_dtype);

}  // namespace mixtape::kernels::cuda

#if defined(__CUDACC__)
#include <algorithm>
#include <array>
#include <atomic>

#include <cuda_runtime.h>

#include <mixtape/cuda/check.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda {

// Launches go on the calling thread's current stream, on the tensor's device.
using ::mixtape::cuda::DeviceGuard;
using ::mixtape::cuda::launch_stream;

/// Streaming multiprocessors of the current device, queried once per device.
inline int current_multiprocessor_count() {
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device), "cuda: querying the current device");
  return ::mixtape::cuda::multiprocessor_count(device);
}

/// Blocks for a grid-stride loop over `work` items of `threads` each: enough to fill every SM
/// (8 blocks of 256 threads each hold 2048 resident threads on sm_80/sm_90), never more than the work.
inline int grid_stride_blocks(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  const int64_t fill = static_cast<int64_t>(current_multiprocessor_count()) * (2048 / threads);
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, fill)));
}

}  // namespace mixtape::kernels::cuda
#endif
