// cuda/loss.cu — fused cross-entropy over (rows, C) logits: forward and backward, one row kernel each.
//
// The one design idea: each pass touches a logit once. The forward holds a
// row of f32/f16/bf16 in registers (as cuda/softmax.cu's register kernels:
// with_row_config's shapes, up to 32768 elements in 16-byte packs) and takes
// the CPU's two passes over them: m = max, then s = Σ exp(x − m) and, with
// label smoothing, d = Σ (x − m), each reduced over the row's threads with
// cub::WarpReduce. Other rows (f64, not a whole number of aligned packs,
// longer) are read in a single sweep keeping an online (m, s) per thread —
// the running sum is rescaled when the max grows, as cuda/softmax.cu's
// strided kernels do — plus d, shifted by −k·Δm when the max grows by Δm
// after k elements. Either way the row's first thread reads the target logit
// x_t (loaded before the row's statistics) and writes the loss and the
// log-sum-exp. The backward reads x once and writes dx once: dx = (exp(x −
// lse) − (1 − ε)·[c == t] − ε/C) · scale, rounded once. Both call the
// formulas of ops/backend/loss_math.h, as the CPU reference (ops/cpu/loss.cpp) does.
// After the forward, one block sums the rows' losses and counts the counted
// rows (the sum and mean reductions: one small kernel, no scalar from the
// host).
//
// A row belongs to a warp for C <= 1024, else to a block of 256 (C <= 8192)
// or, in the register kernels, 1024 threads (512 in the one-sweep ones);
// rows whose length is a multiple of 16 bytes move as 16-byte vectors. No
// atomics: each row, and the sum over rows, is reduced in a fixed order, so
// results are deterministic.
//
// Targets: a row whose target is ignore_index has loss 0 and dx 0 (whatever
// its logits and scale). A target outside [0, C) that is not ignore_index
// cannot be reported without a host synchronisation: that row's loss and its
// whole dx row are NaN, so the bad label shows up in the loss.
// Outputs are freshly allocated and overwritten.
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/cuda/rows.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <mixtape/core/dtype.h>
#include <mixtape/ops/backend/loss_math.h>

namespace mixtape::kernels::cuda {

namespace {

using namespace rowwise;  // cuda/rows.cuh: Pack, kVec, aligned, the register kernels' shapes, launch_rows



template <class Acc>
using Consts = math::CrossEntropyConsts<Acc>;

// ---- one row's statistics ---------------------------------------------------------------------

/// m = max so far, s = Σ exp(x − m), d = Σ (x − m) (kept only with smoothing), k = elements folded in.
template <class Acc>
struct RowStats {
  Acc m, s, d;
  int k;
};

/// a.d re-expressed against a max m >= a.m: every one of a's k terms drops by m − a.m.
template <class Acc>
__device__ __forceinline__ Acc shifted_d(const RowStats<Acc>& a, Acc m) {
  return (a.k == 0 || a.m == m) ? a.d : a.d - static_cast<Acc>(a.k) * (m - a.m);
}

/// Folds x into a. NaN and infinities end where the CPU's two-pass row ends: a NaN, or a +inf (x − x is NaN
/// exactly then), makes s NaN and so the row; a −inf adds nothing to s and makes d −inf.
template <bool kSmooth, class Acc>
__device__ __forceinline__ void stats_add(RowStats<Acc>& a, Acc x) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  if (x > a.m) {
    a.s = a.s * math::detail::exp(a.m - x) + (x - x + Acc(1));
    if constexpr (kSmooth) a.d = shifted_d(a, x);  // x itself adds x − x = 0
    a.m = x;
  } else if (x != kNegInf) {
    a.s += math::detail::exp(x - a.m);
    if constexpr (kSmooth) a.d += x - a.m;
  } else if constexpr (kSmooth) {
    a.d = kNegInf;  // not x − m: that is NaN while m is still −inf
  }
  if constexpr (kSmooth) ++a.k;
}

/// Merges two threads' statistics; an empty share (m = −inf, s = 0, k = 0) contributes nothing.
template <bool kSmooth>
struct MergeRowStats {
  template <class Acc>
  __device__ __forceinline__ RowStats<Acc> operator()(const RowStats<Acc>& a, const RowStats<Acc>& b) const {
    const Acc m = a.m > b.m ? a.m : b.m;
    const Acc sa = a.s == Acc(0) ? Acc(0) : a.s * math::detail::exp(a.m - m);
    const Acc sb = b.s == Acc(0) ? Acc(0) : b.s * math::detail::exp(b.m - m);
    RowStats<Acc> r{m, sa + sb, Acc(0), 0};
    if constexpr (kSmooth) {
      r.d = shifted_d(a, m) + shifted_d(b, m);
      r.k = a.k + b.k;
    }
    return r;
  }
};

/// Reduces v over the kPerRow threads that share a row (a warp, or the whole block when kPerRow == kBlock);
/// the result is valid in the row's first thread. Block form: every thread of the block must call it.
template <int kPerRow, int kBlock, class V, class Op>
__device__ __forceinline__ V row_reduce(V v, Op op) {
  static_assert(kPerRow == kWarp || kPerRow == kBlock, "a row is owned by a warp or by a block");
  if constexpr (kPerRow == kWarp) {
    using WarpReduce = cub::WarpReduce<V>;
    __shared__ typename WarpReduce::TempStorage tmp[kBlock / kWarp];
    const V r = WarpReduce(tmp[threadIdx.x / kWarp]).Reduce(v, op);
    __syncwarp();  // tmp is reused by the warp's next row
    return r;
  } else {
    using BlockReduce = cub::BlockReduce<V, kBlock>;
    __shared__ typename BlockReduce::TempStorage tmp;
    const V r = BlockReduce(tmp).Reduce(v, op);
    __syncthreads();  // tmp is reused by the block's next row
    return r;
  }
}

/// A row's target: whether it counts (not ignore_index), whether it lies in [0, C), and its logit x_t, which only
/// the row's first thread (t = 0) reads, before the row's statistics.
template <class Acc>
struct RowTarget {
  bool counted, in_range;
  Acc xt;
};

template <class Acc, class T>
__device__ __forceinline__ RowTarget<Acc> row_target(const T* __restrict__ xr, int64_t ti, int C, int64_t ignore_index,
                                                     int t) {
  RowTarget<Acc> r{ti != ignore_index, ti >= 0 && ti < C, Acc(0)};
  if (t == 0 && r.counted && r.in_range) r.xt = widen<Acc>(xr[ti]);
  return r;
}

/// The row's outputs from its statistics (m, s, d as ops/backend/loss_math.h), written by its first thread: lse = m + log s
/// and the loss; a select, not a product: an ignored row of −inf logits gives 0, not NaN.
template <class Acc>
__device__ __forceinline__ void write_row_loss(const RowTarget<Acc>& tg, Acc m, Acc s, Acc d, const Consts<Acc>& k,
                                               Acc* __restrict__ loss, Acc* __restrict__ lse, int64_t row) {
  const Acc ls = math::detail::log(s);
  lse[row] = m + ls;
  loss[row] = !tg.counted   ? Acc(0)
              : tg.in_range ? math::cross_entropy_row_loss(tg.xt - m, ls, d, k)
                            : std::numeric_limits<Acc>::quiet_NaN();
}

// ---- kernels ------------------------------------------------------------------------------------

/// loss[r], lse[r] of rows r in [0, rows); kPerRow threads own a row. `vec`: C is a multiple of kVec<T> and x is
/// aligned for Pack loads. kSmooth: ε > 0 (d is accumulated). Overwrites loss and lse.
template <class T, bool kSmooth, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock) cross_entropy_fwd_kernel(const T* __restrict__ x,             // (rows, C)
                                                                   const int64_t* __restrict__ target,  // (rows)
                                                                   opmath_t<T>* __restrict__ loss,      // (rows)
                                                                   opmath_t<T>* __restrict__ lse,       // (rows)
                                                                   int64_t rows, int C, int64_t ignore_index,
                                                                   Consts<opmath_t<T>> k, bool vec) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * C;
    const RowTarget<Acc> tg = row_target<Acc>(xr, target[row], C, ignore_index, t);
    RowStats<Acc> st{-std::numeric_limits<Acc>::infinity(), Acc(0), Acc(0), 0};
    if (vec) {
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
#pragma unroll 4
      for (int i = t; i < C / V; i += kPerRow) {
        const Pack<T, V> p = xv[i];
#pragma unroll
        for (int j = 0; j < V; ++j) stats_add<kSmooth>(st, widen<Acc>(p.v[j]));
      }
    } else {
      for (int i = t; i < C; i += kPerRow) stats_add<kSmooth>(st, widen<Acc>(xr[i]));
    }
    st = row_reduce<kPerRow, kBlock>(st, MergeRowStats<kSmooth>{});
    // A row of −inf only: the CPU's Σ exp(x − m) and Σ (x − m) are over −inf − (−inf) = NaN; the sweep added
    // nothing to s (so lse would come out −inf) and −inf to d. Per row, not per thread: a thread holding only
    // −inf values of a row with a finite max must still add 0.
    if (st.m == -std::numeric_limits<Acc>::infinity() && C > 0) {
      st.s = std::numeric_limits<Acc>::quiet_NaN();
      if constexpr (kSmooth) st.d = std::numeric_limits<Acc>::quiet_NaN();
    }
    if (t == 0) write_row_loss(tg, st.m, st.s, st.d, k, loss, lse, row);
  }
}

/// cross_entropy_fwd_kernel for rows held in registers: C = n·kVec<T> elements, kPerRow·kPacks / 2 < n <=
/// kPerRow·kPacks, x aligned for Pack loads (with_row_config's shapes). Exactly the CPU's two passes over
/// registers: m = max (NaN kept), then s = Σ exp(x − m) and, with smoothing, d = Σ (x − m), reduced together. No
/// per-element branch and no rescaling, where the one-sweep kernel has both. NaN and infinities end as on the
/// CPU: a NaN or +inf max, or an all −inf row, makes s NaN; a −inf logit makes d −inf.
template <class T, bool kSmooth, int kPerRow, int kBlock, int kPacks>
__global__ void __launch_bounds__(kBlock, (kMinBlocks<T, kBlock>))
    cross_entropy_fwd_rows_kernel(const T* __restrict__ x,             // (rows, C)
                                  const int64_t* __restrict__ target,  // (rows)
                                  opmath_t<T>* __restrict__ loss,      // (rows)
                                  opmath_t<T>* __restrict__ lse,       // (rows)
                                  int64_t rows, int C, int64_t ignore_index, Consts<opmath_t<T>> k) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  const int t = static_cast<int>(threadIdx.x) % kPerRow, n = C / V;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * C;
    const RowTarget<Acc> tg = row_target<Acc>(xr, target[row], C, ignore_index, t);
    Pack<T, V> p[kPacks];
    // Padded with −inf: no effect on the max, exp(−inf − m) = 0 adds nothing to s (where m is NaN or ±inf the
    // row is NaN already); d skips the pads by has_pack.
    load_row<kPerRow>(p, reinterpret_cast<const Pack<T, V>*>(xr), t, n, T(-std::numeric_limits<float>::infinity()));
    Acc m = -std::numeric_limits<Acc>::infinity();
#pragma unroll
    for (int j = 0; j < kPacks; ++j)
#pragma unroll
      for (int e = 0; e < V; ++e) m = MaxNanOp{}(m, widen<Acc>(p[j].v[e]));
    m = row_all_reduce<kPerRow, kBlock>(m, MaxNanOp{});
    Sum2<Acc> sd{0, 0};  // s, d
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const bool in = has_pack<kPerRow, kPacks>(j, t, n);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Acc dm = widen<Acc>(p[j].v[e]) - m;
        sd.a += math::detail::exp(dm);
        if constexpr (kSmooth) sd.b += in ? dm : Acc(0);
      }
    }
    sd = row_all_reduce<kPerRow, kBlock>(sd, AddOp{});
    if (t == 0) write_row_loss(tg, m, sd.a, sd.b, k, loss, lse, row);
  }
}

/// dx[r, c] = (exp(x[r, c] − lse[r]) − (1 − ε)·[c == t_r] − ε/C) · w_r, rounded once, with w_r = scale[r ·
/// scale_step] (S: the acc dtype or T, widened) divided by *divisor when there is one; 0 for an ignored row, NaN for a row whose target is out of range. Rows as cross_entropy_fwd_kernel; `vec`: C is a multiple
/// of kVec<T> and x, dx are aligned for Pack accesses. Overwrites dx.
template <class T, class S, int kPerRow, int kBlock>
__global__ void __launch_bounds__(kBlock)
    cross_entropy_bwd_kernel(const T* __restrict__ x,                  // (rows, C)
                             const int64_t* __restrict__ target,       // (rows)
                             const opmath_t<T>* __restrict__ lse,      // (rows)
                             const S* __restrict__ scale,              // (rows) or (1)
                             int64_t scale_step,                       // 1, or 0 for one scale
                             const opmath_t<T>* __restrict__ divisor,  // (1) or null
                             T* __restrict__ dx,                       // (rows, C)
                             int64_t rows, int C, int64_t ignore_index, Consts<opmath_t<T>> k, bool vec) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kPerRow, V = kVec<T>;
  // f64's exp keeps a call to its slow path: ptxas spills around it unrolled 4 times (check_cuda_resources).
  constexpr int kBwdUnroll = std::is_same_v<T, double> ? 2 : 4;
  const int t = static_cast<int>(threadIdx.x) % kPerRow;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * C;
    T* dr = dx + row * C;
    const int64_t ti = target[row];
    if (ti == ignore_index || ti < 0 || ti >= C) {  // a constant row: x is not read
      const T fill = narrow<T>(ti == ignore_index ? Acc(0) : std::numeric_limits<Acc>::quiet_NaN());
      if (vec) {
        Pack<T, V> q;
#pragma unroll
        for (int j = 0; j < V; ++j) q.v[j] = fill;
        auto* dv = reinterpret_cast<Pack<T, V>*>(dr);
        for (int i = t; i < C / V; i += kPerRow) dv[i] = q;
      } else {
        for (int i = t; i < C; i += kPerRow) dr[i] = fill;
      }
      continue;
    }
    const Acc l = lse[row], s = widen<Acc>(scale[row * scale_step]), w = divisor ? s / *divisor : s;
    const int target_c = static_cast<int>(ti);
    if (vec) {
      const auto* xv = reinterpret_cast<const Pack<T, V>*>(xr);
      auto* dv = reinterpret_cast<Pack<T, V>*>(dr);
#pragma unroll kBwdUnroll
      for (int i = t; i < C / V; i += kPerRow) {
        const Pack<T, V> p = xv[i];
        Pack<T, V> q;
#pragma unroll
        for (int j = 0; j < V; ++j)
          q.v[j] = narrow<T>(math::cross_entropy_grad(widen<Acc>(p.v[j]), l, i * V + j == target_c, w, k));
        dv[i] = q;
      }
    } else {
      for (int i = t; i < C; i += kPerRow)
        dr[i] = narrow<T>(math::cross_entropy_grad(widen<Acc>(xr[i]), l, i == target_c, w, k));
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------



template <class T, bool kSmooth>
struct FwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = cross_entropy_fwd_kernel<T, kSmooth, kPerRow, kBlock>;
  };
};
template <class T, class S>
struct BwdRows {
  template <int kPerRow, int kBlock>
  struct K {
    static constexpr auto kernel = cross_entropy_bwd_kernel<T, S, kPerRow, kBlock>;
  };
};

constexpr int kSumThreads = 1024;

/// The loss's reductions (Σ loss, rows whose target is not ignore_index, their quotient), by one block:
/// thread t sums rows t, t + kSumThreads, … in order, then cub::BlockReduce — a fixed order, so every run gives
/// the same bits. One small kernel after the rows' one, instead of the five a sum, a count and a division took.
template <class Acc>
__global__ void __launch_bounds__(kSumThreads) cross_entropy_sum_kernel(const Acc* __restrict__ loss,        // (rows)
                                                                        const int64_t* __restrict__ target,  // (rows)
                                                                        int64_t rows, int64_t ignore_index,
                                                                        Acc* __restrict__ sum_out,    // 0-d
                                                                        Acc* __restrict__ count_out,  // 0-d
                                                                        Acc* __restrict__ mean_out) {  // 0-d
  using SumReduce = cub::BlockReduce<Acc, kSumThreads>;
  using CountReduce = cub::BlockReduce<int64_t, kSumThreads>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename CountReduce::TempStorage count;
  } tmp;
  Acc s = 0;
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kSumThreads) {
    s += loss[i];
    c += target[i] != ignore_index ? 1 : 0;
  }
  const Acc sum = SumReduce(tmp.sum).Sum(s);
  __syncthreads();  // tmp is reused
  const int64_t counted = CountReduce(tmp.count).Sum(c);
  if (threadIdx.x == 0) {
    *sum_out = sum;
    *count_out = static_cast<Acc>(counted);
    *mean_out = sum / static_cast<Acc>(counted);
  }
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target_in, int64_t ignore_index,
                                 double label_smoothing) {
  const char* op = "cross_entropy_fwd_kernel";
  const int64_t rows = logits.size(0), C = logits.size(1);
  const TensorOptions stats = TensorOptions(acc_dtype(logits.dtype())).device(logits.device());
  // sum, count and mean in storages of their own, as the CPU's: the autograd node saves count, and an in-place
  // write to the returned loss must not bump the version of what it saved.
  CrossEntropyResult r{empty({rows}, stats), empty({rows}, stats), empty({}, stats), empty({}, stats),
                       empty({}, stats)};
  MT_CHECK(C <= kMaxRowLength, op, ": rows of ", C, " classes are too long");
  const Tensor x = raw::contiguous(logits), target = raw::contiguous(target_in);
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = opmath_t<T>;
    const Consts<Acc> k = math::cross_entropy_consts<Acc>(label_smoothing, C);
    const T* xp = x.data<T>();
    const bool vec = C % kVec<T> == 0 && aligned(xp, 16);
    auto launch = [&](auto smooth) {
      constexpr bool kSmooth = decltype(smooth)::value;
      const int64_t* tp = target.data<int64_t>();
      bool done = false;
      if constexpr (std::is_same_v<Acc, float>) {  // rows of f32, f16 and bf16 held in registers
        done = vec && C > 0 && with_row_config<T>(C / kVec<T>, [&](auto cfg) {
          using Cfg = decltype(cfg);
          launch_rows<Cfg::per_row, Cfg::block>(
              cross_entropy_fwd_rows_kernel<T, kSmooth, Cfg::per_row, Cfg::block, Cfg::packs>, op, rows, C, 0, xp,
              tp, r.loss.data<Acc>(), r.lse.data<Acc>(), rows, static_cast<int>(C), ignore_index, k);
        });
      }
      if (!done)  // f64, rows not a whole number of aligned packs, rows longer than 32768, C = 0: one sweep a row
        launch_rows_by_length<FwdRows<T, kSmooth>::template K>(op, rows, C, xp, tp, r.loss.data<Acc>(),
                                                               r.lse.data<Acc>(), rows, static_cast<int>(C),
                                                               ignore_index, k, vec);
    };
    if (rows > 0) {
      if (label_smoothing > 0) launch(std::true_type{});
      else launch(std::false_type{});
    }
    // With no rows: sum 0, count 0, mean NaN, as the CPU's.
    cross_entropy_sum_kernel<Acc><<<1, kSumThreads, 0, launch_stream()>>>(
        r.loss.data<Acc>(), target.data<int64_t>(), rows, ignore_index, r.sum.data<Acc>(), r.count.data<Acc>(),
        r.mean.data<Acc>());
    MT_CUDA_CHECK_LAUNCH("cross_entropy_sum_kernel (", rows, " rows)");
  });
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target_in, const Tensor& lse_in,
                              const Tensor& row_scale_in, int64_t ignore_index, double label_smoothing,
                              const Tensor& divisor) {
  const char* op = "cross_entropy_bwd_kernel";
  Tensor dx = empty(logits.shape(), TensorOptions(logits.dtype()).device(logits.device()));
  if (dx.numel() == 0) return dx;
  const int64_t rows = logits.size(0), C = logits.size(1);
  MT_CHECK(C <= kMaxRowLength, op, ": rows of ", C, " classes are too long");
  const Tensor x = raw::contiguous(logits), target = raw::contiguous(target_in);
  const Tensor lse = raw::contiguous(lse_in), row_scale = raw::contiguous(row_scale_in);
  const int64_t scale_step = row_scale.numel() == 1 ? 0 : 1;
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = opmath_t<T>;
    const Consts<Acc> k = math::cross_entropy_consts<Acc>(label_smoothing, C);
    const T* xp = x.data<T>();
    T* dxp = dx.data<T>();
    const bool vec = C % kVec<T> == 0 && aligned(xp, 16) && aligned(dxp, 16);
    const Acc* div = divisor.defined() ? divisor.data<Acc>() : nullptr;
    // The scale in the acc dtype or in the logits' (the entry point checks it is one of the two).
    auto launch = [&](auto scale_tag) {
      using S = typename decltype(scale_tag)::type;
      launch_rows_by_length<BwdRows<T, S>::template K>(op, rows, C, xp, target.data<int64_t>(), lse.data<Acc>(),
                                                       row_scale.data<S>(), scale_step, div, dxp, rows,
                                                       static_cast<int>(C), ignore_index, k, vec);
    };
    if (row_scale.dtype() == dtype_v<Acc>) launch(TypeTag<Acc>{});
    else launch(TypeTag<T>{});
  });
  return dx;
}

}  // namespace mixtape::kernels::cuda
