// cuda/cluster.cuh — thread-block clusters (sm_90): a block's rank, the cluster barrier, distributed shared memory.
//
// The kernels that split one piece of work over the blocks of a cluster (the GEMM's split K, layer_norm's
// backward for long rows) use these three; compiled for sm_80 they describe a cluster of one block, so the same
// kernel runs unsplit there. Which launches form clusters is the host's choice (cudaLaunchKernelEx with
// cudaLaunchAttributeClusterDimension), after asking whether they can run (cluster_launch_fits).
#pragma once

#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda {

/// Most blocks in a cluster (the portable cluster size).
constexpr int kMaxClusterBlocks = 8;

/// This block's rank in its cluster and the cluster's size. Rank 0 of 1 before sm_90 and whenever the kernel is
/// launched without a cluster.
struct ClusterSlot {
  int rank, size;
};
__device__ __forceinline__ ClusterSlot cluster_slot() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  return {static_cast<int>(cluster.block_rank()), static_cast<int>(cluster.num_blocks())};
#else
  return {0, 1};
#endif
}

/// Every thread of every block of the cluster arrives before any continues; shared-memory writes before it are
/// visible to every block of the cluster after it (release / acquire). A no-op before sm_90; every thread of the
/// cluster must call it equally often.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}

/// The address of `p`'s counterpart in the shared memory of the cluster's block `rank` (distributed shared
/// memory); `p` itself before sm_90, where every cluster is one block.
template <class T>
__device__ __forceinline__ const T* cluster_shared(const T* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, static_cast<unsigned>(rank));
#else
  (void)rank;
  return p;
#endif
}

/// A launch of `grid` blocks of `block` threads (and `smem` bytes of dynamic shared memory) as clusters of
/// `cluster` blocks along x; `attribute` holds what the configuration points to.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, size_t smem, int cluster, cudaStream_t stream,
                                                cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

/// How many clusters of `cluster` blocks of `kernel` (`block` threads, `smem` bytes of dynamic shared memory, its
/// limit already raised) can run at once on the current device: 0 where they cannot run at all — the kernel's code
/// on the device comes from PTX for an architecture before sm_90 (a build for sm_80 alone, JIT-compiled on an
/// H100: it would run the grid as lone blocks), or no such cluster fits (MPS or green-context limits). Asked once
/// per kernel, shape and device (launchers ask on every launch). Never throws a CUDA error.
template <class Kernel>
int cluster_launch_fits(Kernel kernel, int block, size_t smem, int cluster) {
  int device = ::mixtape::cuda::detail::guarded_device();  // the launcher's DeviceGuard's, if one is live
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  using Key = std::tuple<const void*, int, size_t, int, int>;  // kernel, block, smem, cluster, device
  static std::mutex mutex;
  static std::map<Key, int> known;
  const Key key{reinterpret_cast<const void*>(kernel), block, smem, cluster, device};
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int clusters = 0;
  cudaFuncAttributes attr{};
  cudaError_t status = cudaFuncGetAttributes(&attr, kernel);
  if (status == cudaSuccess && attr.ptxVersion >= 90) {
    cudaLaunchAttribute attribute{};
    const cudaLaunchConfig_t config =
        cluster_launch_config(dim3(static_cast<unsigned>(cluster)), dim3(static_cast<unsigned>(block)), smem, cluster,
                              nullptr, attribute);
    status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // a refusal is an answer (0), not an error for the next launch to report
    clusters = 0;
  }
  known.emplace(key, clusters);
  return clusters;
}

}  // namespace mixtape::kernels::cuda
