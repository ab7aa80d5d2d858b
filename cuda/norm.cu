// cuda/norm.cu — layer norm forward and backward over the trailing normalized_numel elements, and batch norm
// (at the end of the file: one block a channel, see the comment there).
//
// The one design idea: a row lives in registers. The threads that own a row —
// a warp for rows of up to 1024 elements, a block of 256 threads up to 8192, a
// block of 1024 up to 32768 — each load all their 16-byte packs of it at once
// (a compile-time number of packs per thread, every load issued before any is
// used), reduce its statistics from registers in Acc (f32 for f16/bf16/f32
// data) with cub::WarpReduce, and write the outputs from registers: each
// input is read from DRAM once and each output written once. Every output
// element is rounded once. The statistics are those of ops/cpu/norm.cpp: the
// mean summed relative to the row's first element, then the biased variance
// from the squared deviations (held in registers), so f16 rows far from 0 keep
// their precision. The backward holds dy and x; where they would not fit the
// 64 registers a thread of a 1024-thread block has, x waits in shared memory
// instead, copied there by cp.async.
//
// Other rows — longer than 32768 elements, not a whole number of 16-byte packs,
// buffers or parameters not aligned to 16 bytes, or f64 — take the strided
// kernels, which sweep the row two or three times (again from L1/L2).
//
// dweight/dbias are column sums over rows. For rows of up to 8192 elements the
// backward's dx kernel sums them too, per block in shared memory, while it
// has dy and x in registers (one read of each: 3 tensor passes in all); a
// final kernel adds the blocks' partials of each column in a fixed order
// (eight runs of consecutive blocks, a warp each, then the runs). f32
// rows of 8193-32768 elements on sm_90 do the same one pass with a thread-block
// cluster of 3-8 blocks sharing each row (its two sums meet in distributed
// shared memory). Other longer rows take a second kernel that re-reads dy
// and x: each block sums a fixed chunk of rows for 256 columns, then the chunks
// are added by the same final kernel. No float atomics, so the result is the same on every run
// (of one device and configuration).
// Outputs are freshly allocated and overwritten.
#include <mixtape/cuda/cluster.cuh>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/cuda/rows.cuh>
#include <mixtape/cuda/runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cuda_pipeline_primitives.h>

#include <cub/util_ptx.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::kernels::cuda {

namespace {

using namespace rowwise;  // cuda/rows.cuh: Pack, kVec, aligned, the register kernels' shapes, launch_rows

/// The type statistics of T data are computed in: f64 for f64, f32 otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// a·b rounded on its own, never fused into a following add. Otherwise nvcc turns `g·w − mean(g·w)`
/// into fma(g, w, −mean), and for a row of one element (where the CPU's g·w − mean(g·w) is exactly 0)
/// that leaves g·w's rounding error, times rstd = 1/√eps: 1.5e-5 instead of 0, seen on an H100.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/// Calls f(i, value) for the elements i ≡ t (mod kPerRow) of a row of C T's — 16-byte vectors when `vec`.
template <int kPerRow, class T, class F>
__device__ __forceinline__ void for_my_elements(const T* row, int C, int t, bool vec, F&& f) {
  constexpr int V = kVec<T>;
  if (vec) {
    const auto* rv = reinterpret_cast<const Pack<T, V>*>(row);
#pragma unroll 4
    for (int i = t; i < C / V; i += kPerRow) {
      const Pack<T, V> p = rv[i];
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k, p.v[k]);
    }
  } else {
    for (int i = t; i < C; i += kPerRow) f(i, row[i]);
  }
}

// ---- rows held in registers ------------------------------------------------------------------

/// Keeps the compiler from moving loads across it. Without it the parameter loads of all kPacks packs are hoisted
/// to the top of the loop that uses them — kPacks·V more live registers than a 1024-thread kernel (64 a thread)
/// has, with its row already in registers: ptxas spilled.
__device__ __forceinline__ void one_pack_at_a_time() { asm volatile("" ::: "memory"); }

/// The V per-column parameters of pack i (columns i·V …) as V / 4 16-byte loads (p is 16-byte aligned); all
/// `value` where p is null or `load` is false.
template <int V>
__device__ __forceinline__ void load_params(float (&out)[V], const float* __restrict__ p, int i, bool load,
                                            float value) {
  static_assert(V % 4 == 0, "16-byte vectors of f32");
#pragma unroll
  for (int h = 0; h < V / 4; ++h) {
    Pack<float, 4> q{{value, value, value, value}};
    if (p && load) q = reinterpret_cast<const Pack<float, 4>*>(p)[i * (V / 4) + h];
#pragma unroll
    for (int e = 0; e < 4; ++e) out[4 * h + e] = q.v[e];
  }
}

// ---- forward --------------------------------------------------------------------------------

/// y = (x − mean)·rstd·w + b per row of M = n·kVec<T> elements, kPerRow·kPacks / 2 < n <= kPerRow·kPacks; mean/rstd
/// (rows) written too. x, y, weight and bias 16-byte aligned. Overwrites y, mean, rstd.
///
/// The last kStashed of a thread's packs wait in dynamic shared memory (kStashed·kBlock packs) rather than in
/// registers, and are read from there in each of the three steps: a 1024-thread block holding 32 elements a thread
/// in registers has no room left for the weight and bias of the last step (ptxas spilled, whatever the order).
template <class T, int kPerRow, int kBlock, int kPacks, int kStashed>
__global__ void __launch_bounds__(kBlock, (kMinBlocks<T, kBlock>))
    layer_norm_fwd_kernel(const T* __restrict__ x,           // (rows, M)
                          const float* __restrict__ weight,  // (M) or null
                          const float* __restrict__ bias,    // (M) or null
                          T* __restrict__ y,                 // (rows, M)
                          float* __restrict__ mean,          // (rows)
                          float* __restrict__ rstd,          // (rows)
                          int64_t rows, int M, float eps) {
  using Acc = float;
  using P = Pack<T, kVec<T>>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>, kHeld = kPacks - kStashed;
  static_assert(kStashed == 0 || (kPerRow == kBlock && kStashed <= kPacks / 2), "stash the tested half of a block's");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* const stash = reinterpret_cast<P*>(smem_raw);  // (kStashed, kBlock)
  const int t = static_cast<int>(threadIdx.x) % kPerRow, n = M / V;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * M;
    const auto* xv = reinterpret_cast<const P*>(xr);
    if constexpr (kStashed > 0) stash_row<kPerRow, kPacks, kHeld>(stash, xv, t, n);
    P p[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) p[k] = has_pack<kPerRow, kPacks>(k, t, n) ? xv[t + k * kPerRow] : P{};
    const Acc x0 = widen<Acc>(xr[0]);
    if constexpr (kStashed > 0) __pipeline_wait_prior(0);
    auto stashed = [&](int k) { return stash[(k - kHeld) * kPerRow + t]; };
    // Past the row's end a pack adds 0: selects for the packs in registers (branches around unrolled arithmetic
    // cost live predicates and registers), a branch around a shared-memory read for the stashed ones.
    Acc s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const bool in = has_pack<kPerRow, kPacks>(k, t, n);
      if (k >= kHeld && !in) continue;
      const P q = k < kHeld ? p[k] : stashed(k);
#pragma unroll
      for (int e = 0; e < V; ++e) s += in ? widen<Acc>(q.v[e]) - x0 : Acc(0);
    }
    const Acc mu = x0 + row_all_reduce<kPerRow, kBlock>(s, AddOp{}) / static_cast<Acc>(M);
    Acc d[kHeld][V], q = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const bool in = has_pack<kPerRow, kPacks>(k, t, n);
      if (k < kHeld) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          d[k][e] = widen<Acc>(p[k].v[e]) - mu;
          q += in ? d[k][e] * d[k][e] : Acc(0);
        }
      } else if (in) {
        const P xs = stashed(k);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const Acc de = widen<Acc>(xs.v[e]) - mu;
          q += de * de;
        }
      }
    }
    const Acc var = row_all_reduce<kPerRow, kBlock>(q, AddOp{}) / static_cast<Acc>(M);  // biased, like PyTorch
    const Acc rs = Acc(1) / math::detail::sqrt(var + eps);
    if (t == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
    auto* yv = reinterpret_cast<P*>(y + row * M);
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (has_pack<kPerRow, kPacks>(k, t, n)) {
        one_pack_at_a_time();
        const int i = t + k * kPerRow;
        Acc w[V], b[V], dk[V];
        if (k < kHeld) {
#pragma unroll
          for (int e = 0; e < V; ++e) dk[e] = d[k < kHeld ? k : 0][e];
        } else {
          const P xs = stashed(k);
#pragma unroll
          for (int e = 0; e < V; ++e) dk[e] = widen<Acc>(xs.v[e]) - mu;
        }
        load_params(w, weight, i, true, Acc(1));
        load_params(b, bias, i, true, Acc(0));
        P o;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          Acc r = dk[e] * rs;
          if (weight) r *= w[e];
          if (bias) r += b[e];
          o.v[e] = narrow<T>(r);
        }
        yv[i] = o;
      }
  }
}

/// The strided form of layer_norm_fwd_kernel, for any row: two sweeps for the statistics and one to write.
/// `vec`: M is a multiple of kVec<T> and x, y are 16-byte aligned. Overwrites y, mean, rstd.

template <class T, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock, (kRegisterBudgetBlocks<kBlock>))
    layer_norm_fwd_strided_kernel(const T* __restrict__ x,              // (rows, M)
                                  const acc_t<T>* __restrict__ weight,  // (M) or null
                                  const acc_t<T>* __restrict__ bias,    // (M) or null
                                  T* __restrict__ y,                    // (rows, M)
                                  acc_t<T>* __restrict__ mean,          // (rows)
                                  acc_t<T>* __restrict__ rstd,          // (rows)
                                  int64_t rows, int M, acc_t<T> eps, bool vec) {
  using Acc = acc_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * M;
    const Acc x0 = widen<Acc>(xr[0]);
    Acc s = 0;
    for_my_elements<kPerRow>(xr, M, t, vec, [&](int, T v) { s += widen<Acc>(v) - x0; });
    const Acc mu = x0 + row_all_reduce<kPerRow, kBlock>(s, AddOp{}) / static_cast<Acc>(M);
    Acc q = 0;
    for_my_elements<kPerRow>(xr, M, t, vec, [&](int, T v) {
      const Acc d = widen<Acc>(v) - mu;
      q += d * d;
    });
    const Acc var = row_all_reduce<kPerRow, kBlock>(q, AddOp{}) / static_cast<Acc>(M);  // biased, like PyTorch
    const Acc rs = Acc(1) / math::detail::sqrt(var + eps);
    if (t == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
    auto out = [&](int j, T v) {
      Acc r = (widen<Acc>(v) - mu) * rs;
      if (weight) r *= weight[j];
      if (bias) r += bias[j];
      return narrow<T>(r);
    };
    T* yr = y + row * M;
    if (vec) {
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
      auto* yv = reinterpret_cast<Pack<T, V>*>(yr);
#pragma unroll 4
      for (int i = t; i < M / V; i += kPerRow) {
        const Pack<T, V> p = xv[i];
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = out(i * V + k, p.v[k]);
        yv[i] = o;
      }
    } else {
      for (int i = t; i < M; i += kPerRow) yr[i] = out(i, xr[i]);
    }
  }
}

// ---- backward -------------------------------------------------------------------------------

/// The fused backward's (kColumns) __launch_bounds__ minimum: 3 blocks of 256 an SM (80 registers) where a thread
/// holds up to 16 elements of each input (rows of 4096 in 16-bit, 4096 in f32 at 4 packs), none above: with 32,
/// ptxas spilled the bf16 and f32 kernels at 80. Shared memory (2·M f32 a row owner) allows 3 at rows of 4096.
template <class T, int kPacks>
constexpr int kColumnsMinBlocks = kPacks * kVec<T> <= 16 ? 3 : 1;

/// One pack i of a row's dx: rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w (dy where not `weighted`), rounded
/// once. With kColumns, the pack's dy·x̂ and dy are also added into the parameter columns: element e's slots are
/// cols[e·stride + i] (dweight) and cols[dbias_at + e·stride + i] (dbias). The slots of kSlotBatch elements are
/// read together before any is written: the compiler cannot prove them distinct (stride is a run-time value), so a
/// read-add-write per element would be a chain of dependent shared-memory round trips. Batches of 4, not the whole
/// pack: 16-bit packs' 16 slots at once cost registers (a block fewer an SM at rows of 4096).
template <bool kColumns, class T, int V>
__device__ __forceinline__ Pack<T, V> dx_pack(const Pack<T, V>& dy, const Pack<T, V>& x, const float (&w)[V],
                                              bool weighted, float mu, float rs, float mg, float mgx,
                                              float* __restrict__ cols, int stride, int dbias_at, int i) {
  constexpr int kSlotBatch = V < 4 ? V : 4;
  static_assert(V % kSlotBatch == 0, "a pack's elements split into whole batches of slots");
  Pack<T, V> o;
#pragma unroll
  for (int e0 = 0; e0 < V; e0 += kSlotBatch) {
    float cw[kSlotBatch], cb[kSlotBatch];
    if constexpr (kColumns) {
#pragma unroll
      for (int b = 0; b < kSlotBatch; ++b) {
        cw[b] = cols[(e0 + b) * stride + i];
        cb[b] = cols[dbias_at + (e0 + b) * stride + i];
      }
    }
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b) {
      const int e = e0 + b;
      const float gv = widen<float>(dy.v[e]), xhat = (widen<float>(x.v[e]) - mu) * rs;
      if constexpr (kColumns) {
        cw[b] += gv * xhat;
        cb[b] += gv;
      }
      o.v[e] = narrow<T>(rs * ((weighted ? mul_rn(gv, w[e]) : gv) - mg - xhat * mgx));
    }
    if constexpr (kColumns) {
#pragma unroll
      for (int b = 0; b < kSlotBatch; ++b) {
        cols[(e0 + b) * stride + i] = cw[b];
        cols[dbias_at + (e0 + b) * stride + i] = cb[b];
      }
    }
  }
  return o;
}

/// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) per row, g = dy·w, x̂ = (x − mean)·rstd, for rows of M = n·kVec<T>
/// elements, kPerRow·kPacks / 2 < n <= kPerRow·kPacks; dy, x, dx and weight 16-byte aligned. Overwrites dx.
/// With kStash, x waits in dynamic shared memory (kPacks·kBlock packs) rather than registers.
///
/// With kColumns (the fused path; never with kStash), each block also sums dweight (Σ dy·x̂) and dbias (Σ dy) of
/// its rows per column in shared memory — one (dweight, dbias) pair of M-rows per row owner (warp or block), so a
/// column's slot is only ever touched by the one thread whose elements it holds — and writes them, summed over its
/// row owners in order, as row blockIdx.x of part (gridDim.x, 2, M). A template parameter rather than a null test,
/// so the kernels without it carry none of its registers. Its blocks of 256 threads ask for kColumnsMinBlocks.
template <class T, int kPerRow, int kBlock, int kPacks, bool kStash, bool kColumns>
__global__ void __launch_bounds__(kBlock, (kColumns ? kColumnsMinBlocks<T, kPacks> : kMinBlocks<T, kBlock, 2>))
    layer_norm_bwd_dx_kernel(const T* __restrict__ dy,          // (rows, M)
                             const T* __restrict__ x,           // (rows, M)
                             const float* __restrict__ mean,    // (rows)
                             const float* __restrict__ rstd,    // (rows)
                             const float* __restrict__ weight,  // (M) or null
                             T* __restrict__ dx,                // (rows, M)
                             float* __restrict__ part,          // (grid, 2, M) if kColumns
                             int64_t rows, int M) {
  using Acc = float;
  using P = Pack<T, kVec<T>>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  static_assert(!kStash || kPerRow == kBlock, "a stash holds the packs of one row per block");
  static_assert(!(kStash && kColumns), "the stash and the columns share the dynamic shared memory");
  const int t = static_cast<int>(threadIdx.x) % kPerRow, n = M / V;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* const stash = reinterpret_cast<P*>(smem_raw);  // (kPacks, kBlock) when kStash
  // (kRowsPerBlock, 2, M) when part: this row owner's dweight and dbias columns. Column j's slot: a thread holds
  // V neighbouring columns, so lanes would hit the same banks V at a time; slot (j mod V, j / V) puts a warp's
  // lanes on consecutive words for each of its V columns.
  Acc* const cols = reinterpret_cast<Acc*>(smem_raw) + static_cast<int64_t>(threadIdx.x / kPerRow) * 2 * M;
  if constexpr (kColumns) {
    for (int j = t; j < 2 * M; j += kPerRow) cols[j] = Acc(0);
    __syncthreads();
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t off = row * M;
    P g[kPacks], p[kPacks];
    if constexpr (kStash) stash_row<kPerRow, kPacks>(stash, reinterpret_cast<const P*>(x + off), t, n);
    // Padded with 0 (and so is the weight): a pad adds g·w = 0 and 0·x̂ to the sums, whatever x̂ (x̂ is finite
    // unless mean or rstd is not, and then the row's sums are NaN already).
    load_row<kPerRow>(g, reinterpret_cast<const P*>(dy + off), t, n);
    if constexpr (kStash) {
      __pipeline_wait_prior(0);
    } else {
      load_row<kPerRow>(p, reinterpret_cast<const P*>(x + off), t, n);
    }
    auto x_pack = [&](int k) -> P {
      if constexpr (kStash) return stash[k * kPerRow + t];
      else return p[k];
    };
    const Acc mu = mean[row], rs = rstd[row];
    Sum2<Acc> s{0, 0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const bool in = has_pack<kPerRow, kPacks>(k, t, n);
      if constexpr (kStash) {
        if (!in) continue;
      }
      one_pack_at_a_time();
      const P xp = x_pack(k);
      Acc w[V];
      load_params(w, weight, t + k * kPerRow, in, Acc(0));
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Acc gj = weight ? mul_rn(widen<Acc>(g[k].v[e]), w[e]) : widen<Acc>(g[k].v[e]);
        s.a += gj;
        s.b += gj * ((widen<Acc>(xp.v[e]) - mu) * rs);
      }
    }
    s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
    const Acc mg = s.a / static_cast<Acc>(M), mgx = s.b / static_cast<Acc>(M);
    auto* dv = reinterpret_cast<P*>(dx + off);
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (has_pack<kPerRow, kPacks>(k, t, n)) {
        one_pack_at_a_time();
        const int i = t + k * kPerRow;
        const P xp = x_pack(k);
        Acc w[V];
        load_params(w, weight, i, true, Acc(1));
        dv[i] = dx_pack<kColumns>(g[k], xp, w, weight != nullptr, mu, rs, mg, mgx, cols, n, M, i);
      }
  }
  if constexpr (!kColumns) return;
  __syncthreads();
  const Acc* all = reinterpret_cast<const Acc*>(smem_raw);
  Acc* out = part + static_cast<int64_t>(blockIdx.x) * 2 * M;
  for (int j = static_cast<int>(threadIdx.x); j < 2 * M; j += kBlock) {
    const int c = j < M ? j : j - M, k = (j < M ? 0 : M) + (c % V) * n + c / V;
    Acc sum = 0;
#pragma unroll
    for (int owner = 0; owner < kRowsPerBlock; ++owner) sum += all[static_cast<int64_t>(owner) * 2 * M + k];
    out[j] = sum;
  }
}

/// The strided form of layer_norm_bwd_dx_kernel, for any row: one sweep for the sums and one to write.
/// `vec`: M is a multiple of kVec<T> and dy, x, dx are 16-byte aligned. Overwrites dx.
///
/// With `part` set (the fused path), each block also sums dweight (Σ dy·x̂) and dbias (Σ dy) of its rows per
/// column in shared memory — one (dweight, dbias) pair of M-rows per row owner (warp or block), so a column's
/// slot is only ever touched by the one thread whose elements it holds — and writes them, summed over its
/// warps in order, as row blockIdx.x of part (gridDim.x, 2, M). The columns never need a second read of dy and x.
template <class T, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock, (kRegisterBudgetBlocks<kBlock, 2>))
    layer_norm_bwd_dx_strided_kernel(const T* __restrict__ dy,             // (rows, M)
                                     const T* __restrict__ x,              // (rows, M)
                                     const acc_t<T>* __restrict__ mean,    // (rows)
                                     const acc_t<T>* __restrict__ rstd,    // (rows)
                                     const acc_t<T>* __restrict__ weight,  // (M) or null
                                     T* __restrict__ dx,                   // (rows, M)
                                     acc_t<T>* __restrict__ part,          // (grid, 2, M) or null
                                     int64_t rows, int M, bool vec) {
  using Acc = acc_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  extern __shared__ unsigned char smem_raw[];
  // (kRowsPerBlock, 2, M): this row owner's dweight and dbias columns.
  Acc* const cols = reinterpret_cast<Acc*>(smem_raw) + static_cast<int64_t>(threadIdx.x / kPerRow) * 2 * M;
  // Column j's slot: with 16-byte vectors a thread holds V neighbouring columns, so lanes would hit the same
  // banks V at a time; slot (j mod V, j / V) puts a warp's lanes on consecutive words for each of its V columns.
  const int per_vec = M / V;
  auto slot = [&](int j) { return vec ? (j % V) * per_vec + j / V : j; };
  if (part) {
    for (int j = t; j < 2 * M; j += kPerRow) cols[j] = Acc(0);
    __syncthreads();
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t off = row * M;
    const Acc mu = mean[row], rs = rstd[row];
    auto gw = [&](int j, Acc g) { return weight ? mul_rn(g, weight[j]) : g; };
    Sum2<Acc> s{0, 0};
    auto add = [&](int j, Acc g, Acc xv) {
      const Acc gj = gw(j, g);
      s.a += gj;
      s.b += gj * ((xv - mu) * rs);
    };
    auto grad = [&](int j, Acc g, Acc xv, Acc mg, Acc mgx) {
      const Acc xhat = (xv - mu) * rs;
      if (part) {
        const int k = slot(j);
        cols[k] += g * xhat;
        cols[M + k] += g;
      }
      return narrow<T>(rs * (gw(j, g) - mg - xhat * mgx));
    };
    if (vec) {
      const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy + off);
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(x + off);
#pragma unroll 4
      for (int i = t; i < M / V; i += kPerRow) {
        const Pack<T, V> g = gv[i], p = xv[i];
#pragma unroll
        for (int k = 0; k < V; ++k) add(i * V + k, widen<Acc>(g.v[k]), widen<Acc>(p.v[k]));
      }
    } else {
      for (int i = t; i < M; i += kPerRow) add(i, widen<Acc>(dy[off + i]), widen<Acc>(x[off + i]));
    }
    s = row_all_reduce<kPerRow, kBlock>(s, AddOp{});
    const Acc mg = s.a / static_cast<Acc>(M), mgx = s.b / static_cast<Acc>(M);
    if (vec) {
      const auto* gv = reinterpret_cast<const Pack<T, V>*>(dy + off);
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(x + off);
      auto* dv = reinterpret_cast<Pack<T, V>*>(dx + off);
#pragma unroll 4
      for (int i = t; i < M / V; i += kPerRow) {
        const Pack<T, V> g = gv[i], p = xv[i];
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = grad(i * V + k, widen<Acc>(g.v[k]), widen<Acc>(p.v[k]), mg, mgx);
        dv[i] = o;
      }
    } else {
      for (int i = t; i < M; i += kPerRow)
        dx[off + i] = grad(i, widen<Acc>(dy[off + i]), widen<Acc>(x[off + i]), mg, mgx);
    }
  }
  if (!part) return;
  __syncthreads();
  const Acc* all = reinterpret_cast<const Acc*>(smem_raw);
  Acc* out = part + static_cast<int64_t>(blockIdx.x) * 2 * M;
  for (int j = static_cast<int>(threadIdx.x); j < 2 * M; j += kBlock) {
    Acc sum = 0;
    const int k = j < M ? slot(j) : M + slot(j - M);
#pragma unroll
    for (int owner = 0; owner < kRowsPerBlock; ++owner) sum += all[static_cast<int64_t>(owner) * 2 * M + k];
    out[j] = sum;
  }
}

// ---- long rows on sm_90: one pass, a cluster of blocks a row ----------------------------------------

/// The cluster kernel's shape: blocks of 512 threads holding kClusterPacks packs of each input a thread (8192 B
/// of dy and x a warp), so a block's slab of a row is at most 4096 elements and a cluster of up to 8 takes rows of
/// up to 32768; two blocks an SM (64 registers, 32 KiB of columns each) so that one block's loads overlap the
/// other's reductions and cluster barriers. f32 rows only: on an H200 (bench/RESULTS.md, fourth run; rows of 32768)
/// it took 0.75x the two-pass path's time for f32, but 1.33x for bf16 and 1.37x for f16, which the two-pass path
/// reads in half the bytes while the cluster kernel's time per row hardly changes with the dtype.
constexpr int kClusterBlock = 512;
constexpr int kClusterPacks = 2;
constexpr int kClusterSlab = kClusterBlock * kClusterPacks * kVec<float>;  // elements
constexpr int64_t kClusterMaxM = int64_t{kMaxClusterBlocks} * kClusterSlab;
static_assert(kClusterSlab == 4096);

/// layer_norm_bwd_dx_kernel's arithmetic with the parameter columns (kColumns) for rows longer than one block's
/// shared memory holds the columns of (M > kFusedMaxM, n = M / kVec<T> packs): a cluster of S blocks shares each
/// row, block r holding packs [r·ns, r·ns + ns) of it (ns = ⌈n / S⌉, the last slab shorter) in registers and its
/// slab's dweight and dbias columns in shared memory, so that dy and x are read once, where the two-pass path reads
/// them twice (at most 60% of a copy's speed). A row's two sums (Σ g, Σ g·x̂) are reduced in each block, then added
/// over the cluster in rank order through distributed shared memory: one cluster barrier a row, the exchange slots
/// alternating between rows so that a block writes a slot again only after every block has passed the barrier
/// that follows its last read. The clusters stride over the rows (gridDim.x / S of them); each block finally
/// writes its slab of row `cluster` of part (clusters, 2, M). dy, x, dx and weight 16-byte aligned. Overwrites dx
/// and part.
__global__ void __launch_bounds__(kClusterBlock, 2)
    layer_norm_bwd_cluster_kernel(const float* __restrict__ dy,      // (rows, M)
                                  const float* __restrict__ x,       // (rows, M)
                                  const float* __restrict__ mean,    // (rows)
                                  const float* __restrict__ rstd,    // (rows)
                                  const float* __restrict__ weight,  // (M) or null
                                  float* __restrict__ dx,            // (rows, M)
                                  float* __restrict__ part,          // (gridDim.x / S, 2, M)
                                  int64_t rows, int M) {
  using T = float;
  using Acc = float;
  constexpr int V = kVec<T>, kPacks = kClusterPacks, kBlock = kClusterBlock;
  using P = Pack<T, V>;
  const ClusterSlot slot = cluster_slot();
  const int t = static_cast<int>(threadIdx.x), n = M / V;
  const int ns = (n + slot.size - 1) / slot.size, p0 = slot.rank * ns;
  const int np = n - p0 < ns ? (n - p0 > 0 ? n - p0 : 0) : ns;  // this block's packs of a row
  const int64_t cluster = blockIdx.x / slot.size, clusters = gridDim.x / slot.size;
  // Columns of the slab, dweight then dbias: local column i·V + e in slot e·ns + i, so that a warp's lanes
  // (consecutive i) touch consecutive words for each of their V columns.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* const cols = reinterpret_cast<Acc*>(smem_raw);  // (2, V·ns)
  __shared__ Sum2<Acc> exchange[2];                    // this block's sums of the last two rows
  for (int j = t; j < 2 * V * ns; j += kBlock) cols[j] = Acc(0);
  __syncthreads();
  const Acc* const w_slab = weight ? weight + static_cast<int64_t>(p0) * V : nullptr;
  int parity = 0;
  for (int64_t row = cluster; row < rows; row += clusters, parity ^= 1) {
    const int64_t off = row * M + static_cast<int64_t>(p0) * V;
    const P* const gv = reinterpret_cast<const P*>(dy + off);
    const P* const xv = reinterpret_cast<const P*>(x + off);
    P g[kPacks], p[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const bool in = t + k * kBlock < np;
      g[k] = in ? gv[t + k * kBlock] : P{};  // pads add g·w = 0 and 0·x̂
      p[k] = in ? xv[t + k * kBlock] : P{};
    }
    const Acc mu = mean[row], rs = rstd[row];
    Sum2<Acc> s{0, 0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      Acc w[V];
      load_params(w, w_slab, t + k * kBlock, t + k * kBlock < np, Acc(0));
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Acc gj = weight ? mul_rn(widen<Acc>(g[k].v[e]), w[e]) : widen<Acc>(g[k].v[e]);
        s.a += gj;
        s.b += gj * ((widen<Acc>(p[k].v[e]) - mu) * rs);
      }
    }
    s = row_all_reduce<kBlock, kBlock>(s, AddOp{});
    if (t == 0) exchange[parity] = s;
    cluster_sync();
    // Every block's sums of this row, added in rank order: lane r of each warp loads block r's, and every lane adds
    // them up through shuffles, in the same order everywhere (S loads in flight at once, two registers a lane).
    const int lane = t % kWarp;
    Sum2<Acc> mine{0, 0};
    if (lane < slot.size) mine = *cluster_shared(&exchange[parity], lane);
    Sum2<Acc> total{__shfl_sync(0xffffffffu, mine.a, 0), __shfl_sync(0xffffffffu, mine.b, 0)};
#pragma unroll
    for (int r = 1; r < kMaxClusterBlocks; ++r)
      if (r < slot.size) {
        total.a += __shfl_sync(0xffffffffu, mine.a, r);
        total.b += __shfl_sync(0xffffffffu, mine.b, r);
      }
    const Acc mg = total.a / static_cast<Acc>(M), mgx = total.b / static_cast<Acc>(M);
    auto* const dv = reinterpret_cast<P*>(dx + off);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = t + k * kBlock;
      if (i >= np) continue;
      Acc w[V];
      load_params(w, w_slab, i, true, Acc(1));
      dv[i] = dx_pack<true>(g[k], p[k], w, weight != nullptr, mu, rs, mg, mgx, cols, ns, V * ns, i);
    }
  }
  __syncthreads();
  // This block's slab of the cluster's partial sums: columns p0·V … of row `cluster` of part.
  float* const out = part + cluster * 2 * M + static_cast<int64_t>(p0) * V;
  for (int c = t; c < np * V; c += kBlock) {
    const int slot_of_c = (c % V) * ns + c / V;
    out[c] = cols[slot_of_c];
    out[M + c] = cols[V * ns + slot_of_c];
  }
  // The other blocks may still be reading this block's exchange slots of the last row.
  cluster_sync();
}

// ---- long rows elsewhere: the parameter columns in a second pass ----------------------------------------

constexpr int kColumnThreads = 256;
constexpr int64_t kRowsPerChunk = 64;
constexpr int64_t kMaxChunks = 65535;  // gridDim.y

/// Partial column sums over one chunk of rows (blockIdx.y) for kColumnThreads·V columns (blockIdx.x), V
/// neighbouring columns a thread moved as one Pack (16 bytes, or V = 1 where M or a buffer does not allow it):
/// dweight_part[chunk, j] = Σ dy·x̂, dbias_part[chunk, j] = Σ dy, each column summed in row order whatever V.
/// Overwrites the partials; either may be null.
template <class T, int V>
__global__ void __launch_bounds__(kColumnThreads) layer_norm_bwd_params_partial_kernel(
    const T* __restrict__ dy,                // (rows, M)
    const T* __restrict__ x,                 // (rows, M)
    const acc_t<T>* __restrict__ mean,       // (rows)
    const acc_t<T>* __restrict__ rstd,       // (rows)
    acc_t<T>* __restrict__ dweight_part,     // (chunks, M) or null
    acc_t<T>* __restrict__ dbias_part,       // (chunks, M) or null
    int64_t rows, int64_t M, int64_t rows_per_chunk) {
  using Acc = acc_t<T>;
  using P = Pack<T, V>;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x) * V;
  if (j >= M) return;
  const int64_t chunk = blockIdx.y, r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  Acc dw[V] = {}, db[V] = {};
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const P g = *reinterpret_cast<const P*>(dy + r * M + j);
    const Acc mu = mean[r], rs = rstd[r];
    P xp{};
    if (dweight_part) xp = *reinterpret_cast<const P*>(x + r * M + j);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const Acc ge = widen<Acc>(g.v[e]);
      if (dweight_part) dw[e] += ge * ((widen<Acc>(xp.v[e]) - mu) * rs);
      db[e] += ge;
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    if (dweight_part) dweight_part[chunk * M + j + e] = dw[e];
    if (dbias_part) dbias_part[chunk * M + j + e] = db[e];
  }
}

/// The last step of the backward's parameter columns: out_a[j] = Σ_r part[r·stride + j] and out_b[j] = Σ_r
/// part[r·stride + M + j] over `rows` partial rows (the dx kernel's per-block sums, or the second pass's chunks).
/// A block takes kSumColumns columns with kSumRuns warps: warp s adds the rows of run s (consecutive rows, in row
/// order, kSumLoadsAhead rows loaded before they are added), and the runs meet in run order: a fixed order, the
/// same bits at every launch. Overwrites out_a and out_b; either may be null (its loads are skipped).
/// Why runs: the fifth GPU run's ncu profile found the kernel before this one (a thread a column, rows one after
/// another: 4 blocks at 1024 columns, 16 at 4096) waiting on one L2 round trip after another, 33 µs of
/// layer_norm's 86 µs f32 backward at 1024 columns and 50 of 242 at 4096.
constexpr int kSumColumns = 32;
constexpr int kSumRuns = 8;
constexpr int kSumLoadsAhead = 8;

template <class Acc>
__global__ void __launch_bounds__(kSumColumns * kSumRuns) layer_norm_bwd_column_sums_kernel(
    const Acc* __restrict__ part, int64_t rows, int64_t stride, int64_t M, Acc* __restrict__ out_a,
    Acc* __restrict__ out_b) {
  __shared__ Acc run_sums[2][kSumRuns][kSumColumns];
  const int lane = threadIdx.x, run = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSumColumns + lane;
  const int64_t per_run = (rows + kSumRuns - 1) / kSumRuns;
  const int64_t r0 = min(rows, run * per_run), r1 = min(rows, r0 + per_run);
  const bool want_a = out_a != nullptr, want_b = out_b != nullptr;
  Acc a = 0, b = 0;
  if (j < M) {
    const Acc* const col = part + j;
    int64_t r = r0;
    for (; r + kSumLoadsAhead <= r1; r += kSumLoadsAhead) {
      Acc va[kSumLoadsAhead], vb[kSumLoadsAhead];
#pragma unroll
      for (int u = 0; u < kSumLoadsAhead; ++u) {
        va[u] = want_a ? col[(r + u) * stride] : Acc(0);
        vb[u] = want_b ? col[(r + u) * stride + M] : Acc(0);
      }
#pragma unroll
      for (int u = 0; u < kSumLoadsAhead; ++u) {
        a += va[u];
        b += vb[u];
      }
    }
    for (; r < r1; ++r) {
      if (want_a) a += col[r * stride];
      if (want_b) b += col[r * stride + M];
    }
  }
  run_sums[0][run][lane] = a;
  run_sums[1][run][lane] = b;
  __syncthreads();
  if (run != 0 || j >= M) return;
  Acc sa = 0, sb = 0;
#pragma unroll
  for (int s = 0; s < kSumRuns; ++s) {
    sa += run_sums[0][s][lane];
    sb += run_sums[1][s][lane];
  }
  if (want_a) out_a[j] = sa;
  if (want_b) out_b[j] = sb;
}

/// Launches layer_norm_bwd_column_sums_kernel over M columns (see there).
template <class Acc>
void column_sums(const Acc* part, int64_t rows, int64_t stride, int64_t M, Acc* out_a, Acc* out_b) {
  const dim3 block(kSumColumns, kSumRuns);
  layer_norm_bwd_column_sums_kernel<Acc>
      <<<static_cast<unsigned>((M + kSumColumns - 1) / kSumColumns), block, 0, launch_stream()>>>(part, rows, stride,
                                                                                                   M, out_a, out_b);
  MT_CUDA_CHECK_LAUNCH("layer_norm_bwd_column_sums_kernel (", rows, " partial rows of ", M, " columns)");
}

// ---- launchers ------------------------------------------------------------------------------

/// The longest rows whose backward sums the parameter columns in shared memory: 2·8192 f32 (64 KiB) a block,
/// 128 KiB in f64. Beyond it the columns take a second pass over dy and x.
constexpr int64_t kFusedMaxM = 8192;

/// How many blocks of `kernel` (cluster 1), or clusters of `cluster` blocks, fit on the device at once with `smem`
/// bytes of dynamic shared memory a block; clusters: 0 where they cannot run at all (cluster_launch_fits). The
/// caller has made sure `smem` fits the kernel (shared_memory_fits, which raises its limit where needed). The
/// answers are kept: the occupancy queries cost microseconds, and every backward of a layer asks.
template <class Kernel>
int64_t resident(Kernel kernel, int block, size_t smem, int cluster, int device) {
  if (cluster > 1) return cluster_launch_fits(kernel, block, smem, cluster);  // which keeps its own answers
  using Key = std::tuple<const void*, int, size_t, int>;  // kernel, block, smem, device
  static std::mutex mutex;
  static std::map<Key, int64_t> known;  // Key → blocks
  const Key key{reinterpret_cast<const void*>(kernel), block, smem, device};
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem),
                "layer_norm_backward: occupancy query");
  MT_CHECK(per_sm > 0, "layer_norm_backward: a block of ", block, " threads with ", smem,
           " bytes of shared memory does not fit a multiprocessor");
  const int64_t count = static_cast<int64_t>(per_sm) * ::mixtape::cuda::multiprocessor_count(device);
  known.emplace(key, count);
  return count;
}

/// How many of its packs a thread of a configuration's forward keeps in shared memory: the upper half where a
/// thread of a 1024-thread block holds 32 elements (32 f32 deviations), which leave no registers for the weight
/// and bias (ptxas spilled the f32 and the f16/bf16 kernels).
template <class T, class Cfg>
constexpr int kFwdStashed = Cfg::block == 1024 && Cfg::packs * kVec<T> >= 32 ? Cfg::packs / 2 : 0;

/// Whether the backward of a configuration keeps x in shared memory: dy and x of kPacks packs (4 registers each)
/// would take 32 or more of the 64 registers a 1024-thread block allows.
template <class Cfg>
constexpr bool kStashes = Cfg::block == 1024 && 2 * Cfg::packs * 4 >= 32;

/// `t` (undefined allowed) as a contiguous Acc tensor: the per-column parameters.
template <class Acc>
Tensor params_as(const Tensor& t) {
  return t.defined() ? raw::contiguous(raw::to(t, dtype_v<Acc>)) : Tensor();
}

template <class Acc>
const Acc* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<Acc>() : nullptr;
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x_in, int64_t normalized_numel, const Tensor& weight, const Tensor& bias,
                           double eps) {
  const char* op = "layer_norm_fwd_kernel";
  const Tensor x = raw::contiguous(x_in);
  const int64_t M = normalized_numel, rows = x.numel() / M;
  MT_CHECK(M <= kMaxRowLength, "layer_norm: rows of ", M, " elements are too long");
  LayerNormResult r;
  r.y = empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const auto stats = TensorOptions(dtype_v<Acc>).device(x.device());
    r.mean = empty({rows}, stats);
    r.rstd = empty({rows}, stats);
    if (rows == 0) return;
    const Tensor w = params_as<Acc>(weight), b = params_as<Acc>(bias);
    DeviceGuard guard(x.device());
    const T* xp = x.data<T>();
    T* yp = r.y.data<T>();
    const Acc *wp = data_or_null<Acc>(w), *bp = data_or_null<Acc>(b);
    Acc *mp = r.mean.data<Acc>(), *rp = r.rstd.data<Acc>();
    const bool vec = M % kVec<T> == 0 && aligned(xp, 16) && aligned(yp, 16);
    if constexpr (std::is_same_v<Acc, float>) {
      const bool params_vec = (!wp || aligned(wp, 16)) && (!bp || aligned(bp, 16));
      if (vec && params_vec && with_row_config<T>(M / kVec<T>, [&](auto cfg) {
            using Cfg = decltype(cfg);
            constexpr int kStashed = kFwdStashed<T, Cfg>;
            const size_t smem = sizeof(Pack<T, kVec<T>>) * kStashed * Cfg::block;
            const auto kernel = layer_norm_fwd_kernel<T, Cfg::per_row, Cfg::block, Cfg::packs, kStashed>;
            launch_rows<Cfg::per_row, Cfg::block>(kernel, op, rows, M, smem, xp, wp, bp, yp, mp, rp, rows,
                                                  static_cast<int>(M), static_cast<Acc>(eps));
          }))
        return;
    }
    auto strided = [&](auto cfg, auto kernel) {
      using Cfg = decltype(cfg);
      launch_rows<Cfg::per_row, Cfg::block>(kernel, op, rows, M, 0, xp, wp, bp, yp, mp, rp, rows, static_cast<int>(M),
                                            static_cast<Acc>(eps), vec);
    };
    if (M <= 1024)
      strided(RowThreads<kWarp, 256>{}, layer_norm_fwd_strided_kernel<T, kWarp, 256>);
    else if (M <= 8192)
      strided(RowThreads<256, 256>{}, layer_norm_fwd_strided_kernel<T, 256, 256>);
    else
      strided(RowThreads<512, 512>{}, layer_norm_fwd_strided_kernel<T, 512, 512>);
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& rstd_in, const Tensor& weight, bool bias_defined) {
  const char* op = "layer_norm_bwd_dx_kernel";
  const Tensor dy = raw::contiguous(dy_in), x = raw::contiguous(x_in);
  const Tensor mean_t = raw::contiguous(mean_in), rstd_t = raw::contiguous(rstd_in);
  const int64_t rows = mean_t.numel(), M = rows == 0 ? 1 : x.numel() / rows;
  MT_CHECK(M <= kMaxRowLength, "layer_norm_backward: rows of ", M, " elements are too long");
  LayerNormGrads g;
  const Device device = x.device();
  g.dx = empty(x.shape(), TensorOptions(x.dtype()).device(device));
  const bool want_w = weight.defined();
  const DType param_dtype = want_w ? weight.dtype() : x.dtype();
  const Shape param_shape = want_w ? weight.shape() : Shape{M};
  if (rows == 0 || x.numel() == 0) {
    if (want_w) g.dweight = zeros(param_shape, TensorOptions(param_dtype).device(device));
    if (bias_defined) g.dbias = zeros(param_shape, TensorOptions(param_dtype).device(device));
    return g;
  }
  DeviceGuard guard(device);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Tensor w = params_as<Acc>(weight);
    const T* gp = dy.data<T>();
    const T* xp = x.data<T>();
    const Acc* mp = mean_t.data<Acc>();
    const Acc* rp = rstd_t.data<Acc>();
    T* dxp = g.dx.data<T>();
    const Acc* wp = data_or_null<Acc>(w);
    const bool vec = M % kVec<T> == 0 && aligned(gp, 16) && aligned(xp, 16) && aligned(dxp, 16);
    // The register kernels: f32 statistics, 16-byte packs of the row and of the weight, rows of up to 32768.
    const bool regs = std::is_same_v<Acc, float> && vec && (!wp || aligned(wp, 16)) &&
                      M <= 1024 * static_cast<int64_t>(kMaxPacks<T>) * kVec<T>;
    const bool want_params = want_w || bias_defined;
    const auto acc = TensorOptions(dtype_v<Acc>).device(device);
    auto to_param = [&](const Tensor& sum) { return raw::to(sum, param_dtype); };  // one rounding to their dtype
    // dweight and dbias from part (blocks, 2, M): the per-block column sums, added in a fixed order.
    auto sum_parts = [&](const Tensor& part, int64_t blocks) {
      Tensor dw_sum = want_w ? empty(param_shape, acc) : Tensor();
      Tensor db_sum = bias_defined ? empty(param_shape, acc) : Tensor();
      column_sums<Acc>(part.data<Acc>(), blocks, 2 * M, M, want_w ? dw_sum.data<Acc>() : nullptr,
                       bias_defined ? db_sum.data<Acc>() : nullptr);
      if (want_w) g.dweight = to_param(dw_sum);
      if (bias_defined) g.dbias = to_param(db_sum);
    };

    // Rows of up to kFusedMaxM elements: the dx kernel sums the parameter columns in shared memory as well, where
    // the device gives a block that much (f64 rows ask up to 128 KiB; sm_86/sm_89 allow 99): else the two passes.
    if (want_params && M <= kFusedMaxM) {
      // fused(kernel, rows_per_block, block, trailing args of the kernel after (rows, M)): false, launching nothing,
      // where the columns do not fit the device's shared memory.
      auto fused = [&](auto kernel, int rows_per_block, int block, auto... more) {
        const size_t smem = static_cast<size_t>(rows_per_block) * 2 * static_cast<size_t>(M) * sizeof(Acc);
        if (!shared_memory_fits(kernel, smem)) return false;
        const int64_t blocks = std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block,
                                                 resident(kernel, block, smem, 1, device.index));
        const Tensor part = empty({blocks, 2, M}, acc);
        kernel<<<static_cast<unsigned>(blocks), block, smem, launch_stream()>>>(
            gp, xp, mp, rp, wp, dxp, part.data<Acc>(), rows, static_cast<int>(M), more...);
        MT_CUDA_CHECK_LAUNCH(op, " with parameter columns (", rows, " rows of ", M, ", ", smem, " bytes of shared memory)");
        sum_parts(part, blocks);
        return true;
      };
      bool ran = false;
      if constexpr (std::is_same_v<Acc, float>) {
        if (regs) {
          with_row_config<T>(M / kVec<T>, [&](auto cfg) {
            using Cfg = decltype(cfg);
            if constexpr (Cfg::block < 1024)  // rows of up to kFusedMaxM never take a 1024-thread block
              ran = fused(layer_norm_bwd_dx_kernel<T, Cfg::per_row, Cfg::block, Cfg::packs, false, true>,
                          Cfg::block / Cfg::per_row, Cfg::block);
          });
        }
      }
      if (!ran) {
        if (M <= 1024) ran = fused(layer_norm_bwd_dx_strided_kernel<T, kWarp, 256>, 256 / kWarp, 256, vec);
        else ran = fused(layer_norm_bwd_dx_strided_kernel<T, 256, 256>, 1, 256, vec);
      }
      if (ran) return;
    }

    // Longer f32 rows, where clusters run (sm_90): one pass, a cluster of blocks sharing each row.
    if constexpr (std::is_same_v<T, float>) {
      if (want_params && M > kFusedMaxM && M <= kClusterMaxM && regs && ::mixtape::cuda::allow_clusters()) {
        constexpr int kSlabPacks = kClusterSlab / kVec<T>;
        const int n = static_cast<int>(M / kVec<T>), S = (n + kSlabPacks - 1) / kSlabPacks, ns = (n + S - 1) / S;
        const size_t smem = 2 * static_cast<size_t>(kVec<T>) * static_cast<size_t>(ns) * sizeof(Acc);
        const auto kernel = layer_norm_bwd_cluster_kernel;
        const int64_t fit =
            shared_memory_fits(kernel, smem) ? resident(kernel, kClusterBlock, smem, S, device.index) : 0;
        if (fit > 0) {
          const int64_t clusters = std::min<int64_t>(rows, fit);
          const Tensor part = empty({clusters, 2, M}, acc);
          cudaLaunchAttribute attribute{};
          const cudaLaunchConfig_t config =
              cluster_launch_config(dim3(static_cast<unsigned>(clusters * S)), dim3(kClusterBlock), smem, S,
                                    launch_stream(), attribute);
          MT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, gp, xp, mp, rp, wp, dxp, part.data<Acc>(), rows,
                                           static_cast<int>(M)),
                        "layer_norm_bwd_cluster_kernel (", rows, " rows of ", M, ", clusters of ", S, " blocks)");
          ::mixtape::cuda::detail::count_cluster_launch();
          MT_CUDA_CHECK_LAUNCH("layer_norm_bwd_cluster_kernel (", rows, " rows of ", M, ")");
          sum_parts(part, clusters);
          return;
        }
      }
    }

    Acc* const no_part = nullptr;
    bool done = false;
    if constexpr (std::is_same_v<Acc, float>) {
      if (regs) with_row_config<T>(M / kVec<T>, [&](auto cfg) {
        using Cfg = decltype(cfg);
        constexpr bool kStash = kStashes<Cfg>;
        const size_t smem = kStash ? sizeof(Pack<T, kVec<T>>) * Cfg::packs * Cfg::block : 0;
        const auto kernel = layer_norm_bwd_dx_kernel<T, Cfg::per_row, Cfg::block, Cfg::packs, kStash, false>;
        if (!shared_memory_fits(kernel, smem)) return;  // x's stash of up to 128 KiB: the strided kernel below
        launch_rows<Cfg::per_row, Cfg::block>(kernel, op, rows, M, smem, gp, xp, mp, rp, wp, dxp, no_part, rows,
                                              static_cast<int>(M));
        done = true;
      });
    }
    if (!done) {
      auto strided = [&](auto cfg, auto kernel) {
        using Cfg = decltype(cfg);
        launch_rows<Cfg::per_row, Cfg::block>(kernel, op, rows, M, 0, gp, xp, mp, rp, wp, dxp, no_part, rows,
                                              static_cast<int>(M), vec);
      };
      if (M <= 1024)
        strided(RowThreads<kWarp, 256>{}, layer_norm_bwd_dx_strided_kernel<T, kWarp, 256>);
      else if (M <= 8192)
        strided(RowThreads<256, 256>{}, layer_norm_bwd_dx_strided_kernel<T, 256, 256>);
      else
        strided(RowThreads<512, 512>{}, layer_norm_bwd_dx_strided_kernel<T, 512, 512>);
    }

    if (!want_params) return;
    // Longer rows: a second pass over dy and x sums the parameter columns, chunks of rows at a time (enough
    // blocks to fill the GPU, at most kMaxChunks of them: gridDim.y).
    const int64_t rows_per_chunk = std::max(kRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    const Tensor dw_part = want_w ? empty({chunks, M}, acc) : Tensor();
    const Tensor db_part = bias_defined ? empty({chunks, M}, acc) : Tensor();
    auto partial = [&](auto kernel, int64_t columns_a_thread) {
      const int64_t threads = (M + columns_a_thread - 1) / columns_a_thread;
      const dim3 grid(static_cast<unsigned>((threads + kColumnThreads - 1) / kColumnThreads),
                      static_cast<unsigned>(chunks));
      kernel<<<grid, kColumnThreads, 0, launch_stream()>>>(
          gp, xp, mp, rp, want_w ? dw_part.data<Acc>() : nullptr, bias_defined ? db_part.data<Acc>() : nullptr,
          rows, M, rows_per_chunk);
      MT_CUDA_CHECK_LAUNCH("layer_norm_bwd_params_partial_kernel (", rows, " rows of ", M, ")");
    };
    if (vec) partial(layer_norm_bwd_params_partial_kernel<T, kVec<T>>, kVec<T>);  // 16-byte loads
    else partial(layer_norm_bwd_params_partial_kernel<T, 1>, 1);
    auto finish = [&](const Tensor& part) {
      Tensor sum = empty(param_shape, acc);
      column_sums<Acc>(part.data<Acc>(), chunks, M, M, sum.data<Acc>(), nullptr);
      return to_param(sum);
    };
    if (want_w) g.dweight = finish(dw_part);
    if (bias_defined) g.dbias = finish(db_part);
  });
  return g;
}

// ---- batch norm ----------------------------------------------------------------------------------
//
// Kept small: one block of kBnBlock threads a channel, whose N planes of `inner` elements it sweeps as one flat
// range (j = n·inner + i), reducing with row_all_reduce (cuda/rows.cuh). The statistics are those of
// ops/cpu/norm.cpp: the mean summed relative to the channel's first element, then the biased variance from the
// squared deviations (a second sweep, from L2), in Acc. Each output element is rounded once. The parameter
// gradients are one Acc value a channel, written by the block's thread 0, then rounded to the parameters' dtype.
// Outputs are freshly allocated and overwritten.

namespace {

constexpr int kBnBlock = 256;

/// Channel c's element j of x viewed as (N, C, inner): plane j / inner, element j % inner.
__device__ __forceinline__ int64_t channel_index(int64_t j, int64_t c, int64_t C, int64_t inner) {
  const int64_t n = j / inner;
  return (n * C + c) * inner + (j - n * inner);
}

/// y = (x − mean)·(invstd·weight) + bias for channel blockIdx.x, over N·inner = count elements. With running_mean
/// null the block computes the channel's mean and biased variance (written to var) first; otherwise it reads
/// running_mean/running_var. Overwrites y, mean, invstd (and var with batch statistics).
template <class T, class Acc>
__global__ void __launch_bounds__(kBnBlock)
    batch_norm_fwd_kernel(const T* __restrict__ x,               // (N, C, inner)
                          const Acc* __restrict__ running_mean,  // (C) or null
                          const Acc* __restrict__ running_var,   // (C) or null
                          const Acc* __restrict__ weight,        // (C) or null
                          const Acc* __restrict__ bias,          // (C) or null
                          T* __restrict__ y,                     // (N, C, inner)
                          Acc* __restrict__ mean,                // (C)
                          Acc* __restrict__ invstd,              // (C)
                          Acc* __restrict__ var,                 // (C) or null
                          int64_t C, int64_t inner, int64_t count, Acc eps) {
  const int64_t c = blockIdx.x;
  const int t = static_cast<int>(threadIdx.x);
  Acc mu, v;
  if (running_mean) {
    mu = running_mean[c];
    v = running_var[c];
  } else if (count == 0) {
    mu = v = std::numeric_limits<Acc>::quiet_NaN();  // no values: as the CPU's
  } else {
    const Acc x0 = widen<Acc>(x[c * inner]);  // channel c's first element (n = 0, i = 0)
    Acc s = 0;
    for (int64_t j = t; j < count; j += kBnBlock) s += widen<Acc>(x[channel_index(j, c, C, inner)]) - x0;
    mu = x0 + row_all_reduce<kBnBlock, kBnBlock>(s, AddOp{}) / static_cast<Acc>(count);
    Acc q = 0;
    for (int64_t j = t; j < count; j += kBnBlock) {
      const Acc d = widen<Acc>(x[channel_index(j, c, C, inner)]) - mu;
      q += d * d;
    }
    v = row_all_reduce<kBnBlock, kBnBlock>(q, AddOp{}) / static_cast<Acc>(count);
    if (t == 0) var[c] = v;
  }
  const Acc is = Acc(1) / math::detail::sqrt(v + eps);
  if (t == 0) {
    mean[c] = mu;
    invstd[c] = is;
  }
  const Acc scale = weight ? is * weight[c] : is, shift = bias ? bias[c] : Acc(0);
  for (int64_t j = t; j < count; j += kBnBlock) {
    const int64_t k = channel_index(j, c, C, inner);
    y[k] = narrow<T>((widen<Acc>(x[k]) - mu) * scale + shift);
  }
}

/// dx of channel blockIdx.x, and its Σ dy·x̂ and Σ dy (into dweight[c] and dbias[c], Acc). With batch
/// statistics dx = weight·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)), else weight·invstd·dy. Overwrites dx, dweight,
/// dbias.
template <class T, class Acc>
__global__ void __launch_bounds__(kBnBlock)
    batch_norm_bwd_kernel(const T* __restrict__ dy,        // (N, C, inner)
                          const T* __restrict__ x,         // (N, C, inner)
                          const Acc* __restrict__ mean,    // (C)
                          const Acc* __restrict__ invstd,  // (C)
                          const Acc* __restrict__ weight,  // (C) or null
                          T* __restrict__ dx,              // (N, C, inner)
                          Acc* __restrict__ dweight,       // (C)
                          Acc* __restrict__ dbias,         // (C)
                          int64_t C, int64_t inner, int64_t count, bool batch_stats) {
  const int64_t c = blockIdx.x;
  const int t = static_cast<int>(threadIdx.x);
  const Acc mu = mean[c], is = invstd[c];
  Sum2<Acc> part{0, 0};  // Σ dy, Σ dy·x̂
  for (int64_t j = t; j < count; j += kBnBlock) {
    const int64_t k = channel_index(j, c, C, inner);
    const Acc g = widen<Acc>(dy[k]);
    part.a += g;
    part.b += g * ((widen<Acc>(x[k]) - mu) * is);
  }
  const Sum2<Acc> sums = row_all_reduce<kBnBlock, kBnBlock>(part, AddOp{});
  if (t == 0) {
    dweight[c] = sums.b;
    dbias[c] = sums.a;
  }
  const Acc scale = weight ? is * weight[c] : is;
  const Acc mdy = batch_stats && count > 0 ? sums.a / static_cast<Acc>(count) : Acc(0);
  const Acc mdyx = batch_stats && count > 0 ? sums.b / static_cast<Acc>(count) : Acc(0);
  for (int64_t j = t; j < count; j += kBnBlock) {
    const int64_t k = channel_index(j, c, C, inner);
    const Acc g = widen<Acc>(dy[k]);
    const Acc xh = (widen<Acc>(x[k]) - mu) * is;
    dx[k] = narrow<T>(batch_stats ? scale * (g - mdy - xh * mdyx) : scale * g);
  }
}

}  // namespace

BatchNormResult batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor x = raw::contiguous(x_in);
  const RowLayout L = row_layout(x.shape(), 1);  // (N, C, inner)
  const int64_t count = L.outer * L.inner;
  const bool batch_stats = !running_mean.defined();
  BatchNormResult r;
  r.y = empty(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  dispatch_floating(x.dtype(), "batch_norm_fwd_kernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const auto stats = TensorOptions(dtype_v<Acc>).device(x.device());
    r.mean = empty({L.C}, stats);
    r.invstd = empty({L.C}, stats);
    if (batch_stats) r.var = empty({L.C}, stats);
    if (L.C == 0) return;
    const Tensor w = params_as<Acc>(weight), b = params_as<Acc>(bias);
    const Tensor rm = params_as<Acc>(running_mean), rv = params_as<Acc>(running_var);
    DeviceGuard guard(x.device());
    batch_norm_fwd_kernel<T, Acc><<<static_cast<unsigned>(L.C), kBnBlock, 0, launch_stream()>>>(
        x.data<T>(), data_or_null<Acc>(rm), data_or_null<Acc>(rv), data_or_null<Acc>(w), data_or_null<Acc>(b),
        r.y.data<T>(), r.mean.data<Acc>(), r.invstd.data<Acc>(), batch_stats ? r.var.data<Acc>() : nullptr, L.C,
        L.inner, count, static_cast<Acc>(eps));
    MT_CUDA_CHECK_LAUNCH("batch_norm_fwd_kernel (", L.C, " channels of ", count, ")");
  });
  return r;
}

BatchNormGrads batch_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& invstd_in, const Tensor& weight, bool batch_stats,
                                   bool bias_defined) {
  const Tensor dy = raw::contiguous(dy_in), x = raw::contiguous(x_in);
  const Tensor mean_t = raw::contiguous(mean_in), invstd_t = raw::contiguous(invstd_in);
  const RowLayout L = row_layout(x.shape(), 1);  // (N, C, inner)
  const int64_t count = L.outer * L.inner;
  const Device device = x.device();
  const bool want_w = weight.defined();
  const DType param_dtype = want_w ? weight.dtype() : x.dtype();
  BatchNormGrads g;
  g.dx = empty(x.shape(), TensorOptions(x.dtype()).device(device));
  dispatch_floating(x.dtype(), "batch_norm_bwd_kernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Tensor dw_sum = empty({L.C}, TensorOptions(dtype_v<Acc>).device(device));
    const Tensor db_sum = empty({L.C}, TensorOptions(dtype_v<Acc>).device(device));
    if (L.C > 0) {
      const Tensor w = params_as<Acc>(weight);
      DeviceGuard guard(device);
      batch_norm_bwd_kernel<T, Acc><<<static_cast<unsigned>(L.C), kBnBlock, 0, launch_stream()>>>(
          dy.data<T>(), x.data<T>(), mean_t.data<Acc>(), invstd_t.data<Acc>(), data_or_null<Acc>(w),
          g.dx.data<T>(), dw_sum.data<Acc>(), db_sum.data<Acc>(), L.C, L.inner, count, batch_stats);
      MT_CUDA_CHECK_LAUNCH("batch_norm_bwd_kernel (", L.C, " channels of ", count, ")");
    }
    if (want_w) g.dweight = raw::to(dw_sum, param_dtype);  // one rounding to the parameters' dtype
    if (bias_defined) g.dbias = raw::to(db_sum, param_dtype);
  });
  return g;
}

}  // namespace mixtape::kernels::cuda
