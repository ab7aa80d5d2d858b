// cuda/gemm_bf16.cu — the bf16 instantiations of the WMMA GEMM (cuda/gemm_kernel.cuh): one file per operand
// dtype, so that a build compiles the three sets of kernels in parallel.
#include <mixtape/cuda/gemm_kernel.cuh>

namespace mixtape::kernels::cuda::gemm {
MT_GEMM_INSTANTIATE(__nv_bfloat16)
}  // namespace mixtape::kernels::cuda::gemm
