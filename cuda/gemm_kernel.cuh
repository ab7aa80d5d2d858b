// cuda/gemm_kernel.cuh — the WMMA Tensor Core GEMM kernel template (internal: the cuda/gemm_*.cu files).
//
// The one design idea: a block computes a BM×BN tile of C, each warp a WM×WN sub-tile held as
// (WM/16)×(WN/16) f32 wmma accumulator fragments (64×64: 16 fragments, 128 registers per thread),
// so every fragment of A loaded from shared memory feeds WN/16 MMAs and every fragment of B feeds
// WM/16: few shared-memory instructions per MMA, which is what limits a WMMA kernel on Hopper
// (shared/notes/gemm-h100.md). Operand tiles of BK columns of K stream into shared memory through a
// STAGES-deep cp.async pipeline of 16-byte copies (`cp.async.cg`, src-size < 16 zero-fills the rows
// and the K tail outside the matrix), so the loads of tile kt+STAGES-1 fly while tile kt is multiplied.
//
// Shared memory keeps each operand in its global layout (rows of the contiguous dimension), padded by
// 16 bytes per row: the row stride is then 80 B (BK=32 halves), 272 B or 528 B, which puts the eight
// 16-byte rows of every 8×8 fragment piece in distinct banks and keeps wmma's ldm a multiple of 16 B.
// A transposed operand is simply read with the other wmma layout (col_major), never transposed.
//
// The epilogue reuses the pipeline's shared memory (grown to 136 KB for the large tile): each warp stores
// all its accumulators there, then writes its block of C row by row (four consecutive columns per lane,
// one vector store when aligned), adding the bias, applying relu and rounding once to the output dtype.
//
// Operands whose rows are not 16-byte aligned (ld % 8 != 0 for halves, odd base pointers, N = 10
// layers) take the small tile, which checks per operand at run time and stages those with predicated
// element loads into the same shared-memory layout. TF32 runs the same code on f32 operands with
// 16×16×8 fragments and BK = 16 (64 bytes of K per row, as for halves).
//
// Split K (sm_90): a problem of few tiles and long K (an MNIST layer, 128 × 512 × 784: 16 small tiles on
// 132 SMs, each walking 25 tiles of K one after another) launches the small tile as thread-block clusters
// of S blocks along x; the S blocks of a cluster compute the same tile of C over S consecutive ranges of K,
// each stores its f32 partial sums into its own shared memory as the epilogue does anyway, and after one
// cluster barrier each block finishes 1/S of the tile's rows by reading the S partials through distributed
// shared memory, adding them in rank order (so the result does not depend on timing) before the bias, relu
// and the one rounding. No workspace, no second kernel; launched without a cluster the kernel is the
// unsplit one (a cluster of one block).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/cluster.cuh>
#include <mixtape/cuda/gemm.cuh>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda {

/// Everything one launch needs, by value (device pointers, element strides).
struct GemmParams {
  const void* a;     // see GemmOperand: (m, k) or, trans_a, (k, m); row stride lda
  const void* b;     // (k, n) or, trans_b, (n, k); row stride ldb
  void* c;           // (batches, m, n), row stride ldc
  const void* bias;  // (n) or nullptr
  int64_t lda, ldb, ldc;
  int64_t a_batch, b_batch, c_batch;  // element strides between batches (0: broadcast)
  int m, n, k;
  int batches;
  int tiles_m, tiles_n;
  DType out_dtype, bias_dtype;
  bool relu;
  bool trans_a, trans_b;
  bool vec_a, vec_b;  // operand allows 16-byte cp.async (aligned base, ld and batch stride)
};

namespace gemm {

namespace wmma = nvcuda::wmma;

/// The wmma fragment element type and K per MMA for each operand type.
template <class T> struct MmaTraits;
template <> struct MmaTraits<__half> {
  using Frag = __half;
  static constexpr int kK = 16;
  static constexpr const char* kName = "f16";
};
template <> struct MmaTraits<__nv_bfloat16> {
  using Frag = __nv_bfloat16;
  static constexpr int kK = 16;
  static constexpr const char* kName = "bf16";
};
template <> struct MmaTraits<float> {
  using Frag = wmma::precision::tf32;
  static constexpr int kK = 8;
  static constexpr const char* kName = "tf32";
};

/// wmma::load_matrix_sync(f, p, ld) for a fragment in shared memory. For f16 nvcc emits PTX's `.shared` form of
/// wmma.load (a 32-bit shared address); for bf16 and tf32 its load intrinsics take a generic address (PTX
/// `wmma.load.*.bf16 [%rd]`: a 64-bit address held for every fragment load and resolved at run time), which
/// left those kernels with 10-20 more registers than f16's and slower (H100: bf16 0.25-0.28x cuBLAS where f16
/// was 0.38x, same kernel otherwise). For those two types this issues the `.shared` form itself: four 32-bit
/// registers a fragment either way (bf16: 8 elements, tf32: 4), read as the intrinsic writes them. The asm is
/// volatile with a memory clobber, so it stays after the barrier that makes the tile visible.
template <class Use, int kK, class Elem, class Layout, class T>
__device__ __forceinline__ void load_fragment(wmma::fragment<Use, 16, 16, kK, Elem, Layout>& f, const T* p,
                                              unsigned ld) {
  constexpr bool kBf16 = std::is_same_v<Elem, __nv_bfloat16>, kTf32 = std::is_same_v<Elem, wmma::precision::tf32>;
  if constexpr (kBf16 || kTf32) {
    static_assert(sizeof(f) == 4 * sizeof(unsigned), "a bf16 or tf32 operand fragment is four 32-bit registers");
    constexpr bool kA = std::is_same_v<Use, wmma::matrix_a>, kRow = std::is_same_v<Layout, wmma::row_major>;
    unsigned* r = reinterpret_cast<unsigned*>(&f);
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
#define MT_WMMA_LOAD_SHARED(shape)                                                                    \
  asm volatile("wmma.load." shape " {%0, %1, %2, %3}, [%4], %5;"                                      \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                       \
               : "r"(addr), "r"(ld)                                                                   \
               : "memory")
    if constexpr (kBf16 && kA && kRow) MT_WMMA_LOAD_SHARED("a.sync.aligned.row.m16n16k16.shared.bf16");
    else if constexpr (kBf16 && kA) MT_WMMA_LOAD_SHARED("a.sync.aligned.col.m16n16k16.shared.bf16");
    else if constexpr (kBf16 && kRow) MT_WMMA_LOAD_SHARED("b.sync.aligned.row.m16n16k16.shared.bf16");
    else if constexpr (kBf16) MT_WMMA_LOAD_SHARED("b.sync.aligned.col.m16n16k16.shared.bf16");
    else if constexpr (kA && kRow) MT_WMMA_LOAD_SHARED("a.sync.aligned.row.m16n16k8.shared.tf32");
    else if constexpr (kA) MT_WMMA_LOAD_SHARED("a.sync.aligned.col.m16n16k8.shared.tf32");
    else if constexpr (kRow) MT_WMMA_LOAD_SHARED("b.sync.aligned.row.m16n16k8.shared.tf32");
    else MT_WMMA_LOAD_SHARED("b.sync.aligned.col.m16n16k8.shared.tf32");
#undef MT_WMMA_LOAD_SHARED
  } else {
    wmma::load_matrix_sync(f, p, ld);
  }
}

/// A block tile: BM×BN of C per block, WM×WN per warp, STAGES tiles of K in flight. BK is 64 bytes of K.
template <class T, int BM_, int BN_, int WM_, int WN_, int STAGES_, int MIN_BLOCKS_>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int kMinBlocks = MIN_BLOCKS_;  // resident blocks per SM that __launch_bounds__ asks for
  static constexpr int BK = 64 / static_cast<int>(sizeof(T));
  static constexpr int kPad = 16 / static_cast<int>(sizeof(T));  // 16 bytes per shared row
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per cp.async
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kWarps = kWarpsM * kWarpsN, kThreads = 32 * kWarps;
  static constexpr int kFragM = WM / 16, kFragN = WN / 16;
  static constexpr int kMmaK = MmaTraits<T>::kK;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % kMmaK == 0);
  static_assert(WN % 4 == 0 && 32 % (WN / 4) == 0, "the epilogue gives each lane 4 columns of a row");

  // Shared elements of one stage of A and B, in their stored layouts, each rounded to 128 bytes.
  static constexpr int round128(int elems) {
    constexpr int per = 128 / static_cast<int>(sizeof(T));
    return (elems + per - 1) / per * per;
  }
  template <bool kTransA> static constexpr int a_elems() {
    return round128(kTransA ? BK * (BM + kPad) : BM * (BK + kPad));
  }
  template <bool kTransB> static constexpr int b_elems() {
    return round128(kTransB ? BN * (BK + kPad) : BK * (BN + kPad));
  }
  static constexpr int kEpiLd = WN + 4;  // f32 epilogue row stride (a multiple of 4 floats, as wmma requires)
  static constexpr int kEpiBytes = kWarps * WM * kEpiLd * 4;
  template <bool kTransA, bool kTransB> static constexpr int smem_bytes() {
    const int pipe = STAGES * (a_elems<kTransA>() + b_elems<kTransB>()) * static_cast<int>(sizeof(T));
    return pipe > kEpiBytes ? pipe : kEpiBytes;
  }
};

// The two tiles. Large: 8 warps of 64×64, 4 stages (120 KB of shared memory for halves, 136 KB for the
// epilogue), one block per SM.
// Small: 4 warps of 32×32, for problems whose large tiles would leave SMs idle (MNIST-sized layers);
// 38 KB and at most 128 registers, so four blocks share an SM. Only the small tile splits K: the large one
// is chosen when its tiles already fill the SMs.
template <class T> using LargeTile = TileConfig<T, 128, 256, 64, 64, 4, 1>;
template <class T> using SmallTile = TileConfig<T, 64, 64, 32, 32, 4, 4>;

/// Most blocks of a split-K cluster (the portable cluster size).
constexpr int kMaxSplitK = kMaxClusterBlocks;

// ---- cp.async -----------------------------------------------------------------------------------

/// Copies 16 bytes global→shared asynchronously; only the first `src_bytes` (0..16) are read, the rest of
/// the 16 are zero-filled. `src` must be a valid address even when src_bytes is 0.
__device__ __forceinline__ void cp_async_16(void* smem, const void* src, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Stages a ROWS×COLS tile of a row-major matrix (rows_total × cols_total, row stride ld) starting at
/// (row0, col0) into shared memory with row stride COLS + pad; zeros outside the matrix.
/// kVector: 16-byte cp.async (rows 16-byte aligned); otherwise predicated element loads (synchronous).
template <class T, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile(bool vector, T* __restrict__ s, const T* __restrict__ g, int64_t ld,
                                          int row0, int col0, int rows_total, int cols_total, int tid) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kLds = COLS + kVec;
  if (vector) {
    // Each thread keeps one 16-byte column chunk and steps down the rows: one 64-bit offset per thread.
    constexpr int kChunksPerRow = COLS / kVec, kChunks = ROWS * kChunksPerRow;
    static_assert(COLS % kVec == 0 && kChunks % THREADS == 0 && THREADS % kChunksPerRow == 0,
                  "whole rounds of 16-byte chunks, a fixed column per thread");
    constexpr int kRowStep = THREADS / kChunksPerRow;
    const int r0 = tid / kChunksPerRow, cc = tid % kChunksPerRow * kVec;
    const int gc = col0 + cc;
    const int left = cols_total - gc;
    const int col_bytes = (left < 0 ? 0 : (left > kVec ? kVec : left)) * static_cast<int>(sizeof(T));
    const T* src = g + static_cast<int64_t>(row0 + r0) * ld + gc;
    T* dst = s + r0 * kLds + cc;
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
      const int bytes = row0 + r0 + i * kRowStep < rows_total ? col_bytes : 0;
      cp_async_16(dst + i * kRowStep * kLds, bytes > 0 ? src + i * kRowStep * ld : g, bytes);
    }
  } else {
    // Moved as raw bits: a zero bit pattern is +0 in every float type.
    using Bits = std::conditional_t<sizeof(T) == 2, unsigned short, unsigned>;
    const Bits* gb = reinterpret_cast<const Bits*>(g);
    Bits* sb = reinterpret_cast<Bits*>(s);
    static_assert(ROWS * COLS % THREADS == 0, "whole rounds of elements");
#pragma unroll 4
    for (int i = 0; i < ROWS * COLS / THREADS; ++i) {
      const int e = tid + i * THREADS;
      const int r = e / COLS, cc = e % COLS;
      const int gr = row0 + r, gc = col0 + cc;
      sb[r * kLds + cc] = gr < rows_total && gc < cols_total ? gb[static_cast<int64_t>(gr) * ld + gc] : Bits(0);
    }
  }
}

// ---- the epilogue ---------------------------------------------------------------------------------

__device__ __forceinline__ float load_float(const void* p, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

/// Writes 4 consecutive outputs (columns gn..gn+3 of row `row`, of which `count` are inside C), already
/// biased and activated, rounding once to the output dtype; one vector store when all 4 are in and aligned.
template <class Out>
__device__ __forceinline__ void store4(Out* __restrict__ row, int gn, int count, const float (&v)[4]) {
  Out o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (std::is_same_v<Out, float>) o[j] = v[j];
    else if constexpr (std::is_same_v<Out, __half>) o[j] = __float2half_rn(v[j]);
    else o[j] = __float2bfloat16_rn(v[j]);
  }
  Out* dst = row + gn;
  if (count == 4 && reinterpret_cast<uintptr_t>(dst) % (4 * sizeof(Out)) == 0) {
    if constexpr (sizeof(Out) == 4) {
      *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
    } else {
      uint2 packed;
      unsigned short u[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (std::is_same_v<Out, __half>) u[j] = __half_as_ushort(o[j]);
        else u[j] = __bfloat16_as_ushort(o[j]);
      }
      packed.x = static_cast<unsigned>(u[0]) | static_cast<unsigned>(u[1]) << 16;
      packed.y = static_cast<unsigned>(u[2]) | static_cast<unsigned>(u[3]) << 16;
      *reinterpret_cast<uint2*>(dst) = packed;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < count) dst[j] = o[j];
  }
}

// ---- the kernel -----------------------------------------------------------------------------------

/// C = op(A)·op(B) [+ bias] [relu] for one BM×BN tile per block, or per cluster of blocks splitting K
/// (kSplitK, launched with a cluster dimension along x); blockIdx.x walks the tiles (grouped 8 tile
/// rows at a time so concurrently running blocks share panels of A and B in L2), blockIdx.y the batches.
/// Overwrites C. kAlwaysVector: both operands known 16-byte aligned (the large tile); otherwise p.vec_a/b.
/// kSplitK is a separate instantiation so that the unsplit kernels keep the registers and schedule they had
/// (a cluster rank known only at run time cost the unsplit small tile ~20 registers of its 128).
template <class T, class Cfg, bool kTransA, bool kTransB, bool kAlwaysVector, bool kSplitK>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) gemm_kernel(const GemmParams p) {
  using Frag = typename MmaTraits<T>::Frag;
  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, kPad = Cfg::kPad;
  constexpr int kFragM = Cfg::kFragM, kFragN = Cfg::kFragN, kMmaK = Cfg::kMmaK, kThreads = Cfg::kThreads;
  constexpr int kAElems = Cfg::template a_elems<kTransA>(), kBElems = Cfg::template b_elems<kTransB>();
  constexpr int kLdA = kTransA ? BM + kPad : BK + kPad;  // shared row strides (elements)
  constexpr int kLdB = kTransB ? BK + kPad : BN + kPad;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const smem = reinterpret_cast<T*>(smem_raw);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int warp_m0 = warp / Cfg::kWarpsN * Cfg::WM, warp_n0 = warp % Cfg::kWarpsN * Cfg::WN;

  // The blocks of a cluster (consecutive blockIdx.x) share one tile and take consecutive ranges of K.
  const ClusterSlot slot = kSplitK ? cluster_slot() : ClusterSlot{0, 1};
  // Grouped tile order: 8 tile rows share each tile column before the next column starts.
  constexpr int kGroup = 8;
  const int pid = static_cast<int>(blockIdx.x) / slot.size;
  const int per_group = kGroup * p.tiles_n;
  const int first_m = pid / per_group * kGroup;
  const int group_m = p.tiles_m - first_m < kGroup ? p.tiles_m - first_m : kGroup;
  const int tile_m = first_m + pid % per_group % group_m, tile_n = pid % per_group / group_m;
  const int m0 = tile_m * BM, n0 = tile_n * BN;
  // Only if a split grid ran without clusters (the host checks split_k_runs first): whole blocks past the tiles.
  if (kSplitK && pid >= p.tiles_m * p.tiles_n) return;

  const bool vec_a = kAlwaysVector || p.vec_a, vec_b = kAlwaysVector || p.vec_b;
  // This block's tiles of K: [kt_begin, kt_begin + ktiles); a rank may have none when K is short.
  const int ktiles_all = (p.k + BK - 1) / BK;
  const int kt_begin = static_cast<int>(int64_t{ktiles_all} * slot.rank / slot.size);
  const int ktiles = static_cast<int>(int64_t{ktiles_all} * (slot.rank + 1) / slot.size) - kt_begin;
  // The operands are read from column k_first of K on, with k_left columns of K left (the bound of the edge
  // predicates); unsplit, k_first is 0 and this is the whole product.
  const int k_first = kt_begin * BK, k_left = p.k - k_first;

  for (int batch = static_cast<int>(blockIdx.y); batch < p.batches; batch += static_cast<int>(gridDim.y)) {
    const T* const a = static_cast<const T*>(p.a) + batch * p.a_batch + (kTransA ? k_first * p.lda : k_first);
    const T* const b = static_cast<const T*>(p.b) + batch * p.b_batch + (kTransB ? k_first : k_first * p.ldb);

    // Stage s holds A then B; this block's i-th tile of K goes to stage i % STAGES.
    auto load_stage = [&](int i, int s) {
      T* sa = smem + s * (kAElems + kBElems);
      T* sb = sa + kAElems;
      const int k0 = i * BK;
      if constexpr (kTransA) load_tile<T, BK, BM, kThreads>(vec_a, sa, a, p.lda, k0, m0, k_left, p.m, tid);
      else load_tile<T, BM, BK, kThreads>(vec_a, sa, a, p.lda, m0, k0, p.m, k_left, tid);
      if constexpr (kTransB) load_tile<T, BN, BK, kThreads>(vec_b, sb, b, p.ldb, n0, k0, p.n, k_left, tid);
      else load_tile<T, BK, BN, kThreads>(vec_b, sb, b, p.ldb, k0, n0, k_left, p.n, tid);
    };

    wmma::fragment<wmma::accumulator, 16, 16, kMmaK, float> acc[kFragM][kFragN];
#pragma unroll
    for (int i = 0; i < kFragM; ++i)
#pragma unroll
      for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    // Prologue: STAGES-1 tiles in flight. Every step commits a group (empty past the end) so that
    // "wait until at most STAGES-2 groups are pending" always means "tile kt has landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ktiles) load_stage(s, s);
      cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile kt visible to all warps; every warp is done with tile kt-1's stage
      {
        const int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(next, next % STAGES);
        cp_async_commit();
      }
      const T* sa = smem + kt % STAGES * (kAElems + kBElems);
      const T* sb = sa + kAElems;
      // The K steps of a tile are unrolled for halves; TF32's cvt.rna of every fragment element needs the
      // registers that unrolling would spend on loading the next step's fragments early (ptxas spilled).
      constexpr int kUnrollK = sizeof(T) == 2 ? BK / kMmaK : 1;
#pragma unroll(kUnrollK)
      for (int kk = 0; kk < BK; kk += kMmaK) {
        wmma::fragment<wmma::matrix_a, 16, 16, kMmaK, Frag, LayoutA> fa[kFragM];
#pragma unroll
        for (int i = 0; i < kFragM; ++i) {
          const int r = warp_m0 + i * 16;
          load_fragment(fa[i], kTransA ? sa + kk * kLdA + r : sa + r * kLdA + kk, kLdA);
          if constexpr (std::is_same_v<T, float>) {
#pragma unroll
            for (int e = 0; e < fa[i].num_elements; ++e) fa[i].x[e] = wmma::__float_to_tf32(fa[i].x[e]);
          }
        }
#pragma unroll
        for (int j = 0; j < kFragN; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, kMmaK, Frag, LayoutB> fb;
          const int c = warp_n0 + j * 16;
          load_fragment(fb, kTransB ? sb + c * kLdB + kk : sb + kk * kLdB + c, kLdB);
          if constexpr (std::is_same_v<T, float>) {
#pragma unroll
            for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
          }
#pragma unroll
          for (int i = 0; i < kFragM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
        }
      }
    }

    // Epilogue: the pipeline's shared memory becomes one f32 WM × WN block per warp. Every accumulator
    // goes there first, so none of the 128 accumulator registers is live while the outputs are written
    // (keeping them, ptxas spilled on sm_80). A split-K cluster then waits for all its blocks' partial sums.
    cp_async_wait<0>();
    __syncthreads();
    float* const block = reinterpret_cast<float*>(smem_raw) + warp * Cfg::WM * Cfg::kEpiLd;
#pragma unroll
    for (int i = 0; i < kFragM; ++i)
#pragma unroll
      for (int j = 0; j < kFragN; ++j)
        wmma::store_matrix_sync(block + i * 16 * Cfg::kEpiLd + j * 16, acc[i][j], Cfg::kEpiLd, wmma::mem_row_major);
    if (slot.size > 1) cluster_sync();
    else __syncwarp();
    constexpr int kLanesPerRow = Cfg::WN / 4, kRowsPerPass = 32 / kLanesPerRow;
    const int lane_row = lane / kLanesPerRow, lane_col = lane % kLanesPerRow * 4;
    const int gn = n0 + warp_n0 + lane_col;
    const int count = p.n - gn < 0 ? 0 : (p.n - gn > 4 ? 4 : p.n - gn);
    float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (p.bias != nullptr) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (j < count) bias[j] = load_float(p.bias, gn + j, p.bias_dtype);
    }
    const int rows_left = p.m - (m0 + warp_m0);  // rows of this warp's block inside C
    // Row r of this warp's block, summed: + bias, relu, one rounding, stored.
    auto finish_row = [&](int r, const float4 s) {
      float v[4] = {s.x + bias[0], s.y + bias[1], s.z + bias[2], s.w + bias[3]};
      if (p.relu) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = v[j] > 0.0f ? v[j] : 0.0f;
      }
      const int64_t row = batch * p.c_batch + static_cast<int64_t>(m0 + warp_m0 + r) * p.ldc;
      switch (p.out_dtype) {
        case DType::kF16: store4(static_cast<__half*>(p.c) + row, gn, count, v); break;
        case DType::kBF16: store4(static_cast<__nv_bfloat16*>(p.c) + row, gn, count, v); break;
        default: store4(static_cast<float*>(p.c) + row, gn, count, v); break;
      }
    };
    if (slot.size == 1) {
#pragma unroll 4
      for (int r = lane_row; r < Cfg::WM; r += kRowsPerPass)
        if (r < rows_left && count > 0)
          finish_row(r, *reinterpret_cast<const float4*>(block + r * Cfg::kEpiLd + lane_col));
    } else {
      // Each block of the cluster finishes every size-th pass of rows, adding the partial sums of all the
      // blocks' copies of this warp's block (the same warp of each block has the same sub-tile) in rank order.
      // All the partials are loaded before the first add, so that their latencies overlap.
#pragma unroll 1
      for (int r = lane_row + slot.rank * kRowsPerPass; r < Cfg::WM; r += kRowsPerPass * slot.size) {
        if (r < rows_left && count > 0) {
          const float* const at = block + r * Cfg::kEpiLd + lane_col;
          float4 part[kMaxSplitK];
#pragma unroll
          for (int q = 0; q < kMaxSplitK; ++q)
            if (q < slot.size) part[q] = *reinterpret_cast<const float4*>(cluster_shared(at, q));
          float4 s = part[0];
#pragma unroll
          for (int q = 1; q < kMaxSplitK; ++q)
            if (q < slot.size) s.x += part[q].x, s.y += part[q].y, s.z += part[q].z, s.w += part[q].w;
          finish_row(r, s);
        }
      }
    }
    // The epilogue blocks alias the next prologue; a cluster's blocks also read each other's until here.
    if (slot.size > 1) cluster_sync();
    else if (batch + static_cast<int>(gridDim.y) < p.batches) __syncthreads();
  }
}

// ---- host side ------------------------------------------------------------------------------------

template <class T, class Cfg, bool kTransA, bool kTransB, bool kAlwaysVector, bool kSplitK = false>
struct Kernel {
  static constexpr auto fn = gemm_kernel<T, Cfg, kTransA, kTransB, kAlwaysVector, kSplitK>;
  static constexpr int kSmem = Cfg::template smem_bytes<kTransA, kTransB>();

  static std::string name() {
    std::string s = MmaTraits<T>::kName;
    s += kAlwaysVector ? " large " : " small ";
    s += std::to_string(Cfg::BM) + "x" + std::to_string(Cfg::BN) + "x" + std::to_string(Cfg::BK) + " ";
    s += kTransA ? "T" : "N";
    s += kTransB ? "T" : "N";
    if (kSplitK) s += " split-K";
    return s;
  }

  /// Whether the kernel's kSmem bytes of dynamic shared memory fit a block of the current device, making them
  /// launchable where they do (the large tile's 136 KB need the opt-in: sm_80 allows 163 KB, sm_90 227, but sm_86,
  /// sm_89 and sm_120, the RTX cards, 99): dynamic_shared_memory_fits, which raises the limit once per kernel and
  /// device.
  static bool fits() {
    return ::mixtape::cuda::dynamic_shared_memory_fits(fn, kSmem, ::mixtape::cuda::current_device());
  }

  /// fits(), or an error naming the kernel and the device.
  static void prepare() {
    MT_CHECK(fits(), "gemm: ", name(), " needs ", kSmem, " bytes of shared memory a block, more than cuda:",
             ::mixtape::cuda::current_device(), " allows");
  }

  /// kSplitK: launched as clusters of `split` (2..8) blocks along x that share each tile (sm_90 and newer);
  /// otherwise split is 1.
  static void launch(const GemmParams& p, int split, cudaStream_t stream) {
    MT_CHECK(kSplitK ? split >= 2 && split <= kMaxSplitK : split == 1, "gemm: ", name(), " launched with K split ",
             split);
    prepare();
    const int64_t tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
    const dim3 grid(static_cast<unsigned>(tiles * split),
                    static_cast<unsigned>(p.batches < 65535 ? p.batches : 65535));
    if constexpr (!kSplitK) {
      fn<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
    } else {
      cudaLaunchAttribute cluster{};
      const cudaLaunchConfig_t config = cluster_launch_config(grid, dim3(Cfg::kThreads), kSmem, split, stream, cluster);
      MT_CUDA_CHECK(cudaLaunchKernelEx(&config, fn, p), "gemm_kernel ", name(), " as clusters of ", split,
                    " blocks splitting K (m ", p.m, ", n ", p.n, ", k ", p.k, ", batches ", p.batches, ")");
      ::mixtape::cuda::detail::count_cluster_launch();
    }
    MT_CUDA_CHECK_LAUNCH("gemm_kernel ", name(), " (m ", p.m, ", n ", p.n, ", k ", p.k, ", batches ", p.batches,
                         ", K split ", split, ")");
  }

  /// Whether clusters of `split` blocks of this split-K kernel run on the current device: its code there comes
  /// from PTX for sm_90 or newer (a build for sm_80 alone, JIT-compiled on an H100, has no clusters and would run
  /// the split grid as lone blocks), and at least one such cluster fits (MPS or green-context limits can forbid
  /// it): cluster_launch_fits, which keeps its answers. Never throws for a "no".
  static bool clusters_run(int split) {
    static_assert(kSplitK, "only the split-K kernels run as clusters");
    prepare();
    return cluster_launch_fits(fn, Cfg::kThreads, kSmem, split) > 0;
  }

  static GemmKernelInfo info() {
    cudaFuncAttributes attr{};
    MT_CUDA_CHECK(cudaFuncGetAttributes(&attr, fn), "gemm: attributes of ", name());
    return {name(), attr.numRegs, attr.sharedSizeBytes, static_cast<size_t>(kSmem), attr.localSizeBytes,
            Cfg::kThreads};
  }
};

/// Whether the split-K small tile of this layout runs as clusters of `split` blocks on the current device
/// (Kernel::clusters_run).
template <class T>
bool split_k_runs(bool trans_a, bool trans_b, int split) {
  if (trans_a) {
    return trans_b ? Kernel<T, SmallTile<T>, true, true, false, true>::clusters_run(split)
                   : Kernel<T, SmallTile<T>, true, false, false, true>::clusters_run(split);
  }
  return trans_b ? Kernel<T, SmallTile<T>, false, true, false, true>::clusters_run(split)
                 : Kernel<T, SmallTile<T>, false, false, false, true>::clusters_run(split);
}

/// Whether the large tile of this layout fits a block's shared memory on the current device (Kernel::fits).
template <class T>
bool large_tile_fits(bool trans_a, bool trans_b) {
  if (trans_a) {
    return trans_b ? Kernel<T, LargeTile<T>, true, true, true>::fits()
                   : Kernel<T, LargeTile<T>, true, false, true>::fits();
  }
  return trans_b ? Kernel<T, LargeTile<T>, false, true, true>::fits()
                 : Kernel<T, LargeTile<T>, false, false, true>::fits();
}

/// Runs one problem of operand type T with the large (16-byte aligned operands only) or the small tile, the
/// small one as clusters of `split` blocks splitting K when split > 1 (2, 4 or 8, where split_k_runs).
template <class T>
void launch(GemmParams p, bool large, int split, cudaStream_t stream) {
  auto go = [&](auto ta, auto tb) {
    constexpr bool kTA = decltype(ta)::value, kTB = decltype(tb)::value;
    if (large) {
      p.tiles_m = (p.m + LargeTile<T>::BM - 1) / LargeTile<T>::BM;
      p.tiles_n = (p.n + LargeTile<T>::BN - 1) / LargeTile<T>::BN;
      Kernel<T, LargeTile<T>, kTA, kTB, true>::launch(p, 1, stream);
    } else {
      p.tiles_m = (p.m + SmallTile<T>::BM - 1) / SmallTile<T>::BM;
      p.tiles_n = (p.n + SmallTile<T>::BN - 1) / SmallTile<T>::BN;
      if (split > 1) Kernel<T, SmallTile<T>, kTA, kTB, false, true>::launch(p, split, stream);
      else Kernel<T, SmallTile<T>, kTA, kTB, false>::launch(p, 1, stream);
    }
  };
  using F = std::false_type;
  using Tr = std::true_type;
  if (p.trans_a) p.trans_b ? go(Tr{}, Tr{}) : go(Tr{}, F{});
  else p.trans_b ? go(F{}, Tr{}) : go(F{}, F{});
}

template <class T>
std::vector<GemmKernelInfo> kernel_infos() {
  return {Kernel<T, LargeTile<T>, false, false, true>::info(), Kernel<T, LargeTile<T>, false, true, true>::info(),
          Kernel<T, LargeTile<T>, true, false, true>::info(),   Kernel<T, LargeTile<T>, true, true, true>::info(),
          Kernel<T, SmallTile<T>, false, false, false>::info(), Kernel<T, SmallTile<T>, false, true, false>::info(),
          Kernel<T, SmallTile<T>, true, false, false>::info(),  Kernel<T, SmallTile<T>, true, true, false>::info(),
          Kernel<T, SmallTile<T>, false, false, false, true>::info(),
          Kernel<T, SmallTile<T>, false, true, false, true>::info(),
          Kernel<T, SmallTile<T>, true, false, false, true>::info(),
          Kernel<T, SmallTile<T>, true, true, false, true>::info()};
}

// Instantiated once each, in cuda/gemm_f16.cu, cuda/gemm_bf16.cu and cuda/gemm_tf32.cu.
#define MT_GEMM_INSTANTIATE(T)                                                      \
  template void launch<T>(GemmParams p, bool large, int split, cudaStream_t stream); \
  template bool split_k_runs<T>(bool trans_a, bool trans_b, int split);             \
  template bool large_tile_fits<T>(bool trans_a, bool trans_b);                     \
  template std::vector<GemmKernelInfo> kernel_infos<T>();

extern template void launch<__half>(GemmParams, bool, int, cudaStream_t);
extern template void launch<__nv_bfloat16>(GemmParams, bool, int, cudaStream_t);
extern template void launch<float>(GemmParams, bool, int, cudaStream_t);
extern template bool split_k_runs<__half>(bool, bool, int);
extern template bool split_k_runs<__nv_bfloat16>(bool, bool, int);
extern template bool split_k_runs<float>(bool, bool, int);
extern template bool large_tile_fits<__half>(bool, bool);
extern template bool large_tile_fits<__nv_bfloat16>(bool, bool);
extern template bool large_tile_fits<float>(bool, bool);
extern template std::vector<GemmKernelInfo> kernel_infos<__half>();
extern template std::vector<GemmKernelInfo> kernel_infos<__nv_bfloat16>();
extern template std::vector<GemmKernelInfo> kernel_infos<float>();

}  // namespace gemm
}  // namespace mixtape::kernels::cuda
