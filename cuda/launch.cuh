// cuda/launch.cuh — what every launcher shares (internal to the .cu files): the device guard and stream a launch
// goes to, the one grid-size policy of the grid-stride kernels, the thread's first index and the grid's stride,
// 16-byte packs, and the walk from a linear index to K operands' offsets over a coalesced layout
// (core/strided_loop.h's StridedLayout, as a kernel parameter).
//
// Two shapes of kernel launch in cuda/: grid-stride loops over a flat index space, sized by grid_blocks below,
// and row kernels (softmax, norm, loss), which give each row a warp or a block (cuda/rows.cuh's launch_rows).
// Every op's launcher lives in mixtape::kernels::cuda (its helpers in nested namespaces: rowwise, gemm);
// mixtape::cuda is the runtime users see (devices, streams, memory, cuda/runtime.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include <cuda_runtime.h>

#include <mixtape/core/shape.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda {

// Every launch goes to the calling thread's current stream, on the tensor's device (a DeviceGuard selects it).
using ::mixtape::cuda::DeviceGuard;
using ::mixtape::cuda::launch_stream;

/// The block size of the grid-stride kernels.
inline constexpr int kBlockThreads = 256;

/// The grid of a grid-stride loop over `work` items with `threads` a block, on the current device: enough blocks to
/// fill every SM (2048 resident threads an SM on sm_80/sm_90: 8 blocks of 256), never more than the work needs,
/// at least one. Each thread then loops over items first_index(), + grid_stride(), ...
inline int grid_blocks(int64_t work, int threads = kBlockThreads) {
  const int device = ::mixtape::cuda::current_device();  // the launcher's DeviceGuard's: CUDA is not asked
  const int64_t blocks = (work + threads - 1) / threads;
  const int64_t fill = static_cast<int64_t>(::mixtape::cuda::multiprocessor_count(device)) * (2048 / threads);
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, fill)));
}

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

/// N elements of T moved as one aligned access: 16 bytes when N = 16 / sizeof(T) (llm.c's Packed128).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

/// Sizes and strides of K operands after coalescing, passed to a kernel by value (K·64 + 72 bytes of parameters).
/// The strides are in the unit the host chose when it built the StridedLayout: elements (itemsize 1) or bytes.
template <int K>
struct OffsetLayout {
  int64_t numel;                        // > 0
  int ndim;                             // in [1, kMaxDims]
  int64_t sizes[Shape::kMaxDims];       // (ndim), innermost last
  int64_t strides[K][Shape::kMaxDims];  // (K, ndim); 0 along broadcast dims
};

template <int K>
OffsetLayout<K> offset_layout(const StridedLayout<K>& S) {
  OffsetLayout<K> L{};
  L.numel = S.numel;
  L.ndim = S.ndim;
  for (int d = 0; d < S.ndim; ++d) {
    L.sizes[d] = S.sizes[d];
    for (int k = 0; k < K; ++k) L.strides[k][d] = S.byte_strides[k][d];
  }
  return L;
}

/// Offset of linear index `i` (row-major over the coalesced shape) in each operand, in L's stride unit. Unrolled
/// over kMaxDims with a uniform guard, so sizes and strides are read with constant indices from the parameter bank
/// (no local memory); a 1-D layout costs one multiply per operand.
template <int K>
__device__ __forceinline__ void element_offsets(const OffsetLayout<K>& L, int64_t i, int64_t (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
#pragma unroll
  for (int d = Shape::kMaxDims - 1; d > 0; --d) {
    if (d < L.ndim) {
      const int64_t q = i / L.sizes[d];
      const int64_t r = i - q * L.sizes[d];
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += r * L.strides[k][d];
      i = q;
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] += i * L.strides[k][0];
}

}  // namespace mixtape::kernels::cuda
