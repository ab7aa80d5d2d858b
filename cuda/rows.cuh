// cuda/rows.cuh — what the row kernels share (internal: cuda/softmax.cu, cuda/layer_norm.cu,
// cuda/cross_entropy.cu): 16-byte packs, the shapes of the register kernels and the row launcher.
//
// A row is owned by kPerRow threads — a warp, or a whole block — and a block of kBlock threads holds
// kBlock / kPerRow rows. The register kernels hold a row in kPacks 16-byte packs a thread:
// with_row_config picks the owner and the smallest power-of-two kPacks that holds a row of n packs
// (a warp a row up to 1024 elements, 8 rows a block; a block of 256 up to 8192; of 1024 up to 32768,
// where a thread has 64 registers), and false for longer rows, which the strided kernels take.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <mixtape/cuda/check.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda::rowwise {

constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = 1 << 24;  // row loops are grid-strided past this many blocks

/// 16 bytes of T (N = 16 / sizeof(T) elements), or the same N elements of another type, as one vector access
/// (llm.c's Packed128).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// The most 16-byte packs of T a thread holds of one row: 32 elements (32 registers of f32 data).
template <class T>
constexpr int kMaxPacks = sizeof(T) == 4 ? 8 : 4;

/// kPerRow threads a row, blocks of kBlock: a strided kernel's shape.
template <int kPerRow, int kBlock>
struct RowThreads {
  static constexpr int per_row = kPerRow, block = kBlock;
};

/// The register kernels' shape for one row length: RowThreads, and kPacks packs a thread.
template <int kPerRow, int kBlock, int kPacks>
struct RowConfig : RowThreads<kPerRow, kBlock> {
  static constexpr int packs = kPacks;
};

/// f(RowConfig<kPerRow, kBlock, kP>{}) for the smallest power of two kP in [kPacks, kMax] with kPerRow·kP >= n.
template <int kPerRow, int kBlock, int kPacks, int kMax, class F>
void with_packs(int64_t n, F& f) {
  if constexpr (kPacks < kMax) {
    if (n > static_cast<int64_t>(kPerRow) * kPacks) return with_packs<kPerRow, kBlock, 2 * kPacks, kMax>(n, f);
  }
  f(RowConfig<kPerRow, kBlock, kPacks>{});
}

/// Calls f(RowConfig<…>{}) for rows of n 16-byte packs of T held in registers — a warp a row (8 rows a block) up to
/// 1024 elements, a block of 256 up to 8192, of 1024 up to 32768 (64 registers a thread), kMaxPacks<T> packs a
/// thread at most — and returns true; false, without a call, for longer rows.
template <class T, class F>
bool with_row_config(int64_t n, F&& f) {
  constexpr int kMax = kMaxPacks<T>;
  if (n <= kWarp * kMax) with_packs<kWarp, 256, 1, kMax>(n, f);
  else if (n <= 256 * kMax) with_packs<256, 256, std::max(1, kMax / 4), kMax>(n, f);
  else if (n <= 1024 * kMax) with_packs<1024, 1024, kMax / 2, kMax>(n, f);
  else return false;
  return true;
}

/// Launches `kernel` with kPerRow threads per row, blocks of kBlock threads and `smem` bytes of dynamic shared
/// memory (above 48 KiB a kernel must ask for it first) on the current stream.
template <int kPerRow, int kBlock, class Kernel, class... Args>
void launch_rows(Kernel kernel, const char* name, int64_t rows, int64_t C, size_t smem, Args... args) {
  constexpr int kRowsPerBlock = kBlock / kPerRow;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGrid);
  if (smem > 48 * 1024)
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                  name, ": asking for ", smem, " bytes of shared memory (rows of ", C, ")");
  kernel<<<static_cast<unsigned>(blocks), kBlock, smem, ::mixtape::cuda::launch_stream()>>>(args...);
  MT_CUDA_CHECK_LAUNCH(name, " (", rows, " rows of ", C, ")");
}

/// Launches the strided kernel K<kPerRow, kBlock>::kernel chosen by row length: up to 1024 elements a warp a
/// row, 8 rows a block; up to 8192 a block of 256; longer a block of 512 (two such blocks fit an SM at <= 64
/// registers a thread, so one block's reduction overlaps the other's loads).
template <template <int, int> class K, class... Args>
void launch_rows_by_length(const char* name, int64_t rows, int64_t C, Args... args) {
  if (C <= 1024) launch_rows<kWarp, 256>(K<kWarp, 256>::kernel, name, rows, C, 0, args...);
  else if (C <= 8192) launch_rows<256, 256>(K<256, 256>::kernel, name, rows, C, 0, args...);
  else launch_rows<512, 512>(K<512, 512>::kernel, name, rows, C, 0, args...);
}

}  // namespace mixtape::kernels::cuda::rowwise
