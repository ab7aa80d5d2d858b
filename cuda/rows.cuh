// cuda/rows.cuh — what the row kernels share (internal: cuda/softmax.cu, cuda/norm.cu,
// cuda/loss.cu): the pack width (the packs are cuda/launch.cuh's), the register kernels'
// shapes, the row launchers, the row-wide reduction (two levels of cub::WarpReduce, the result in every
// thread) and its sum and NaN-keeping max operators, the loads of a row into registers or, by cp.async, into
// shared memory, and the element conversions for arithmetic.
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
#include <limits>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>

#include <cub/util_ptx.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::kernels::cuda::rowwise {

constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = 1 << 24;  // row loops are grid-strided past this many blocks

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

/// Blocks of kBlock threads an SM must hold at once for a thread to have at most 64 registers with one input row,
/// 80 with two: a __launch_bounds__ minimum. It is also a floor: with __launch_bounds__(kBlock) alone, ptxas gave
/// some strided instances 32-48 registers and spilled (check_cuda_resources).
template <int kBlock, int kInputs = 1>
constexpr int kRegisterBudgetBlocks = std::max(1, (kInputs == 1 ? 1024 : 768) / kBlock);

/// The second __launch_bounds__ argument of a register kernel over T rows in blocks of kBlock that holds kInputs
/// rows a thread: the blocks an SM must hold at once. A thread of a 16-bit kernel holds as many elements as an f32
/// one but half the bytes, so at equal occupancy an SM has half the bytes in flight (H100, first runs: 16-bit rows
/// 44-66% of a copy's bandwidth, f32 rows 99-104%, both at 16 warps an SM for rows of 1024). 16-bit kernels
/// therefore ask for 32 warps an SM with one input (64 registers a thread) and 24 with two (80 registers; at 64
/// ptxas spilled the 4-pack backward kernels), f32 ones for nothing (ptxas may use up to 255 registers).
template <class T, int kBlock, int kInputs = 1>
constexpr int kMinBlocks = sizeof(T) == 2 ? kRegisterBudgetBlocks<kBlock, kInputs> : 1;

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

/// The longest row the row kernels take: their int element indices step up to 1024 past a row's end.
constexpr int64_t kMaxRowLength = std::numeric_limits<int>::max() - 1024;

/// Whether `kernel` may have `smem` bytes of dynamic shared memory a block on the current device, its limit raised
/// where needed (dynamic_shared_memory_fits: the kernels' static reduction buffers count against the same 48 KiB).
/// The register kernels that keep part of a row there (up to 128 KiB) fall back to the strided ones where not
/// (sm_86/sm_89 allow 99 KiB).
template <class Kernel>
bool shared_memory_fits(Kernel kernel, size_t smem) {
  if (smem == 0) return true;
  return ::mixtape::cuda::dynamic_shared_memory_fits(kernel, smem, ::mixtape::cuda::current_device());
}

/// Launches `kernel` with kPerRow threads per row, blocks of kBlock threads and `smem` bytes of dynamic shared
/// memory (its limit raised where needed: shared_memory_fits) on the current stream.
template <int kPerRow, int kBlock, class Kernel, class... Args>
void launch_rows(Kernel kernel, const char* name, int64_t rows, int64_t C, size_t smem, Args... args) {
  constexpr int kRowsPerBlock = kBlock / kPerRow;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGrid);
  MT_CHECK(shared_memory_fits(kernel, smem), name, ": ", smem, " bytes of shared memory a block do not fit cuda:",
           ::mixtape::cuda::current_device(), " (rows of ", C, ")");
  kernel<<<static_cast<unsigned>(blocks), kBlock, smem, launch_stream()>>>(args...);
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

// ---- element conversions for arithmetic ------------------------------------------------------------

/// x as Acc, to compute with: one hardware cvt for f16 (a shift for bf16), exact for every value. A NaN gives a NaN
/// but not core/half.h's NaN rule bits (those need a test and a select per element): the row kernels' outputs
/// are arithmetic on their inputs, and arithmetic on a NaN makes a NaN whose bits no backend fixes. Casts, which
/// move NaN bits, keep the rule (convert).
template <class Acc, class T>
__device__ __forceinline__ Acc widen(T x) {
  if constexpr (std::is_same_v<T, Half>) return static_cast<Acc>(__half2float(__ushort_as_half(x.bits)));
  else if constexpr (std::is_same_v<T, BFloat16>)
    return static_cast<Acc>(__uint_as_float(static_cast<uint32_t>(x.bits) << 16));
  else return static_cast<Acc>(x);
}

/// v rounded once to O (round to nearest even, subnormals kept: one hardware cvt from f32), for a row kernel's
/// output; as widen, a NaN stays a NaN without the NaN rule's bits. From f64, convert (one rounding from double).
template <class O, class Acc>
__device__ __forceinline__ O narrow(Acc v) {
  if constexpr (std::is_same_v<O, Half> && std::is_same_v<Acc, float>)
    return Half::from_bits(__half_as_ushort(__float2half_rn(v)));
  else if constexpr (std::is_same_v<O, BFloat16> && std::is_same_v<Acc, float>)
    return BFloat16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  else
    return convert<O>(v);
}

// ---- a row held by its threads -------------------------------------------------------------------

/// Two sums reduced together in one row_all_reduce (layer_norm's Σ g and Σ g·x̂, cross_entropy's Σ exp and Σ x − m).
template <class Acc>
struct Sum2 {
  Acc a, b;
};

struct AddOp {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    return a + b;
  }
  template <class Acc>
  __device__ __forceinline__ Sum2<Acc> operator()(const Sum2<Acc>& a, const Sum2<Acc>& b) const {
    return {a.a + b.a, a.b + b.b};
  }
};

/// max with NaN kept: a NaN, once seen, stays (as ops/cpu/loops.h's max_with_nan; fmax would drop it).
struct MaxNanOp {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(const Acc& a, const Acc& b) const {
    return (b != b || b > a) ? b : a;
  }
};

/// Reduces v over the kPerRow threads that share a row (a warp, or the whole block when kPerRow == kBlock) and
/// returns the result to all of them. Block form: every thread of the block must call it. Two levels of
/// cub::WarpReduce: each warp's, then one warp over the kBlock / 32 partials (cub::BlockReduce's last level has
/// thread 0 read all 32 partials at once, registers a 1024-thread kernel holding its row cannot spare). Two
/// barriers, none trailing: a thread writes `part` or `result` again only past the next call's barrier, which
/// every reader of this call's values has passed.
template <int kPerRow, int kBlock, class V, class Op>
__device__ __forceinline__ V row_all_reduce(V v, Op op) {
  static_assert(kPerRow == kWarp || kPerRow == kBlock, "a row is owned by a warp or by a block");
  constexpr int kWarps = kBlock / kWarp;
  using WarpReduce = cub::WarpReduce<V>;
  __shared__ typename WarpReduce::TempStorage tmp[kWarps];
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const V r = WarpReduce(tmp[warp]).Reduce(v, op);  // valid in lane 0
  __syncwarp();  // tmp is reused by the warp's next reduction
  if constexpr (kPerRow == kWarp) {
    return cub::ShuffleIndex<kWarp>(r, 0, 0xffffffffu);
  } else {
    static_assert(kWarps > 1 && kWarps <= kWarp && (kWarps & (kWarps - 1)) == 0, "blocks of 64 to 1024 threads");
    using PartReduce = cub::WarpReduce<V, kWarps>;
    __shared__ typename PartReduce::TempStorage part_tmp;
    __shared__ V part[kWarps];
    __shared__ V result;
    if (lane == 0) part[warp] = r;
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < kWarps) {
      const V total = PartReduce(part_tmp).Reduce(part[threadIdx.x], op);
      if (threadIdx.x == 0) result = total;
    }
    __syncthreads();
    return result;
  }
}

/// Whether pack k of thread t lies in a row of n packs. The launchers pick kPacks, a power of two, as the smallest
/// that holds the row (with_packs), so n > kPerRow·kPacks / 2 and the first half of the packs needs no test: fewer
/// live predicates (an SM has 7 predicate registers a thread).
template <int kPerRow, int kPacks>
__device__ __forceinline__ bool has_pack(int k, int t, int n) {
  return k < kPacks / 2 || t + k * kPerRow < n;
}

/// Thread t's share of a row of n packs: p[k] = row[t + k·kPerRow], zero past the row's end. All kPacks loads are
/// issued before any is used, so a thread has its whole share of the row in flight at once.
template <int kPerRow, int kPacks, class P>
__device__ __forceinline__ void load_row(P (&p)[kPacks], const P* __restrict__ row, int t, int n) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) p[k] = has_pack<kPerRow, kPacks>(k, t, n) ? row[t + k * kPerRow] : P{};
}

/// Thread t's share of a row of n packs: p[k] = row[t + k·kPerRow], `pad` past the row's end. All kPacks loads are
/// issued before any is used, so a thread has its whole share of the row in flight at once. The pad is chosen to
/// change no statistic (−inf for a max and Σ exp, 0 for a sum of products), so that only the loads and the stores
/// test has_pack: branches around the arithmetic cost live predicates and registers (ptxas spilled a 1024-thread
/// kernel that had them).
template <int kPerRow, int kPacks, class T, int V>
__device__ __forceinline__ void load_row(Pack<T, V> (&p)[kPacks], const Pack<T, V>* __restrict__ row, int t, int n,
                                         T pad) {
  Pack<T, V> fill;
#pragma unroll
  for (int e = 0; e < V; ++e) fill.v[e] = pad;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) p[k] = has_pack<kPerRow, kPacks>(k, t, n) ? row[t + k * kPerRow] : fill;
}

/// load_row into shared memory instead of registers, for packs kFrom… of kPacks: stash[(k − kFrom)·kPerRow + t] =
/// row[t + k·kPerRow], by cp.async (no registers held while in flight). A thread reads back only its own packs,
/// so __pipeline_wait_prior(0) is all it needs before reading them.
template <int kPerRow, int kPacks, int kFrom = 0, class P>
__device__ __forceinline__ void stash_row(P* stash, const P* __restrict__ row, int t, int n) {
#pragma unroll
  for (int k = kFrom; k < kPacks; ++k)
    if (has_pack<kPerRow, kPacks>(k, t, n))
      __pipeline_memcpy_async(&stash[(k - kFrom) * kPerRow + t], &row[t + k * kPerRow], sizeof(P));
  __pipeline_commit();
}

}  // namespace mixtape::kernels::cuda::rowwise
