// cuda/gemm.cuh — the Tensor Core GEMM launcher (internal: cuda/*.cu, the GEMM tests and bench/gemm.cu).
//
// C (m, n) = op(A) (m, k) · op(B) (k, n) [+ bias (n)] [relu], row-major C, for f16 and bf16 operands
// (f32 operands run as TF32) with f32 accumulation on the Tensor Cores through nvcuda::wmma.
// Each operand is read as it lies in memory: `trans` says which of the two row-major storages it has,
// so the backward products (dX = dY·Wᵀ, dW = Xᵀ·dY) never materialise a transpose:
//
//   A: trans=false → A is stored (m, k), row stride `ld`;  trans=true → stored (k, m) and read as Aᵀ.
//   B: trans=false → B is stored (k, n), row stride `ld`;  trans=true → stored (n, k) and read as Bᵀ.
//
// Batches (bmm, a weight broadcast over a batch) step each operand by its `batch_stride` elements
// (0: the same matrix for every batch). Any m, n, k works (k = 0 gives C = bias, or 0), edges and the
// K tail are predicated, and the user's tensors are never padded or copied. Every element of C
// (m rows of n, row stride ldc) is overwritten; nothing outside it is touched.
//
//   using namespace mixtape::kernels::cuda;
//   // y (128, 512) f16 = x (128, 784) f16 · w (512, 784)ᵀ + b (512) f32, relu
//   gemm_tensor_core(128, 512, 784, 1, kF16, {x, 784, false, 0}, {w, 784, true, 0}, y, 512, 0, kF16,
//                    {.bias = b, .bias_dtype = kF32, .relu = true}, stream);
//
// The kernels live in cuda/gemm_kernel.cuh (one instantiation file per operand dtype: gemm_f16.cu,
// gemm_bf16.cu, gemm_tf32.cu, so that the two cores of a build machine share the work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <mixtape/core/dtype.h>

namespace mixtape::kernels::cuda {

/// One GEMM operand in device memory (elements, not bytes, for ld and batch_stride).
struct GemmOperand {
  const void* ptr = nullptr;  // element (0, 0) of batch 0
  int64_t ld = 0;             // row stride of the stored (row-major) matrix
  bool trans = false;         // read the stored matrix transposed (see the table above)
  int64_t batch_stride = 0;   // elements between consecutive batches; 0 broadcasts one matrix
};

/// What the epilogue does to each f32 accumulator before the one rounding to out_dtype.
struct GemmEpilogue {
  const void* bias = nullptr;     // (n), broadcast over rows and batches; nullptr: no bias
  DType bias_dtype = DType::kF32; // f32, f16 or bf16
  bool relu = false;              // max(x + bias, 0)
};

/// Which block tile runs. kAuto picks by shape: the large tile when its tiles fill every SM at least once, every
/// operand allows 16-byte copies and its 136 KB of shared memory fit a block (sm_80, sm_90 and sm_100, not the RTX
/// cards' 99 KB: sm_86, sm_89, sm_120); else the small one, and on sm_90 and newer, when the small tiles leave
/// most SMs idle and K is long (the MNIST layers: 128 × 512 × 784 is 16 tiles), the small tile with K split
/// over a thread-block cluster of 2, 4 or 8 blocks, whose partial sums meet in distributed shared memory and
/// are added in rank order (deterministic; no workspace, one launch). The others force a choice, for tests
/// and the benchmark: a forced kLarge on operands that are not 16-byte aligned, or on a device whose blocks it does
/// not fit, runs the small tile, a forced split where clusters cannot run (before sm_90, a build without sm_90 code,
/// no room) the small tile unsplit.
enum class GemmTile : uint8_t { kAuto, kLarge, kSmall, kSplitK2, kSplitK4, kSplitK8 };

/// "auto", "large", "small", "small, K split 2" …: for messages and the benchmark's report.
const char* gemm_tile_name(GemmTile tile) noexcept;

/// True when gemm_tensor_core takes these dtypes on `device` (compute capability 8.0 or newer):
/// in_dtype f16, bf16, or f32 (TF32 Tensor Cores), out_dtype f32, f16 or bf16. Layouts, alignments and
/// shapes are all supported. Never throws (false when the device cannot be queried).
bool gemm_tensor_core_supports(DType in_dtype, DType out_dtype, int device) noexcept;

/// C = op(A)·op(B) [+ bias] [relu] for `batches` matrices, issued to `stream` on the current device.
/// Overwrites C. in_dtype is the dtype of both A and B (kF32 runs TF32: the caller decides, see
/// mixtape::cuda::allow_tf32()). Throws mixtape::Error naming the shapes on invalid arguments.
void gemm_tensor_core(int64_t m, int64_t n, int64_t k, int64_t batches, DType in_dtype, const GemmOperand& a,
                      const GemmOperand& b,
                      void* c,  // (batches, m, n) with row stride ldc, batch stride c_batch_stride
                      int64_t ldc, int64_t c_batch_stride, DType out_dtype, const GemmEpilogue& epi,
                      cudaStream_t stream, GemmTile tile = GemmTile::kAuto);

/// The tile kAuto would run for this problem on the current device (for the benchmark's report): kLarge,
/// kSmall or one of the kSplitK.
GemmTile gemm_tensor_core_tile(int64_t m, int64_t n, int64_t k, int64_t batches, DType in_dtype,
                               const GemmOperand& a, const GemmOperand& b);

/// Resources of one kernel instantiation (cudaFuncGetAttributes), for the benchmark's report.
struct GemmKernelInfo {
  std::string name;          // e.g. "f16 large 128x256x32 NT" (the small tile's also run as split-K clusters)
  int registers = 0;         // per thread
  size_t static_smem = 0;    // bytes
  size_t dynamic_smem = 0;   // bytes requested at launch
  size_t local_bytes = 0;    // per thread: non-zero means spills or a stack frame
  int threads = 0;           // per block
};

/// Every GEMM instantiation of in_dtype (f16, bf16 or f32) on the current device.
std::vector<GemmKernelInfo> gemm_tensor_core_kernels(DType in_dtype);

}  // namespace mixtape::kernels::cuda
