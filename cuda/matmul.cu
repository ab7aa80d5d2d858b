// cuda/matmul.cu — torch.matmul and addmm on the GPU: the Tensor Core GEMM where it applies, a tiled SIMT
// GEMM everywhere else.
//
// f16 and bf16 operands (and f32 ones when TF32 is allowed, mixtape::cuda::set_allow_tf32) whose matrices
// are row-major or transposed views run on cuda/gemm.cu's WMMA kernels: the innermost coalesced batch dim is
// the GEMM's batch, a transposed weight is read as it lies (NT/TN layouts), and addmm's bias is the GEMM's
// epilogue. The precision trace names the kernel (kernels::note_kernel: "wmma f16", "simt f32").
//
// The SIMT kernel below takes everything else (f64, f32 without TF32, strided slices). Its one design idea:
// read the operands as they lie. Each operand is a
// (batch..., rows, cols) view with arbitrary element strides, so a transposed
// weight (`w.t()`), a sliced or a broadcast batch (stride 0) is read in place,
// never copied; the kernel widens each element to the accumulator type as it
// stages a tile in shared memory. A 256-thread block computes a 64x64 tile of
// C in 16-deep steps of K; each thread owns a 4x4 register block, its rows and
// columns 16 apart so neighbouring threads read neighbouring shared words and
// write neighbouring addresses of C. Edges are predicated (zeros staged
// outside the matrix), so any M, N, K works, K = 0 included (C = 0).
// Numerics as on the CPU: f16/bf16 and f32 accumulate in f32, f64 in f64, and
// each output rounds once to out_dtype. C is freshly allocated and overwritten.
// It is the f32 path outside autocast: about a third of cuBLAS's SGEMM on an H100 (bench/RESULTS.md).
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/gemm.cuh>
#include <mixtape/cuda/runtime.h>

namespace mixtape::kernels::cuda {

namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kThreadsX = 16, kThreadsY = 16, kThreads = kThreadsX * kThreadsY;
constexpr int kRegM = kTileM / kThreadsY, kRegN = kTileN / kThreadsX;  // 4x4 outputs per thread
static_assert(kTileM * kTileK % kThreads == 0 && kTileK * kTileN % kThreads == 0, "tiles load in whole rounds");

/// Shapes and element strides of one batched product C (batch..., m, n) = A (batch..., m, k) @ B (batch..., k, n).
struct GemmArgs {
  int64_t m, n, k;
  int64_t a_row, a_col;  // element strides of A's rows (m) and columns (k)
  int64_t b_row, b_col;  // element strides of B's rows (k) and columns (n)
  int64_t batches;       // product of the batch sizes; C's matrices are contiguous, one after another
  int batch_ndim;        // coalesced batch dims, in [1, kMaxDims]
  int64_t batch_sizes[Shape::kMaxDims];
  int64_t a_batch[Shape::kMaxDims], b_batch[Shape::kMaxDims];  // element strides; 0 along broadcast dims
  int64_t tiles_n, tiles;                                      // tiles along n, tiles per matrix
};

/// C = A @ B for every batch: blocks loop over (tile, batch) pairs. Overwrites C. Two resident blocks per SM
/// cap the registers at 128: without that bound ptxas picked 64 for the f16-in, f32-out instances and spilled.
template <class T, class Acc, class Out>
__global__ void __launch_bounds__(kThreads, 2) matmul_kernel(const T* __restrict__ a,  // (batch..., m, k), strided
                                                          const T* __restrict__ b,  // (batch..., k, n), strided
                                                          Out* __restrict__ c,      // (batches, m, n), contiguous
                                                          GemmArgs p) {
  // k-major tiles; the +1 keeps the transposing stores of A off a single bank.
  __shared__ Acc a_tile[kTileK][kTileM + 1];
  __shared__ Acc b_tile[kTileK][kTileN + 1];
  const int tx = static_cast<int>(threadIdx.x) % kThreadsX, ty = static_cast<int>(threadIdx.x) / kThreadsX;
  // Both loops are uniform over the block, so every __syncthreads below is reached by all threads.
  for (int64_t batch = blockIdx.y; batch < p.batches; batch += gridDim.y) {
    int64_t a_off = 0, b_off = 0, rest = batch;
#pragma unroll
    for (int d = Shape::kMaxDims - 1; d >= 0; --d) {
      if (d < p.batch_ndim) {
        const int64_t q = rest / p.batch_sizes[d], idx = rest - q * p.batch_sizes[d];
        a_off += idx * p.a_batch[d];
        b_off += idx * p.b_batch[d];
        rest = q;
      }
    }
    const T* a_mat = a + a_off;
    const T* b_mat = b + b_off;
    Out* c_mat = c + batch * p.m * p.n;
    for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
      const int64_t m0 = tile / p.tiles_n * kTileM, n0 = tile % p.tiles_n * kTileN;
      Acc acc[kRegM][kRegN];
#pragma unroll
      for (int i = 0; i < kRegM; ++i)
#pragma unroll
        for (int j = 0; j < kRegN; ++j) acc[i][j] = Acc(0);

      for (int64_t k0 = 0; k0 < p.k; k0 += kTileK) {
#pragma unroll
        for (int l = 0; l < kTileM * kTileK / kThreads; ++l) {
          const int e = static_cast<int>(threadIdx.x) + l * kThreads;
          const int row = e / kTileK, col = e % kTileK;  // consecutive threads walk k: coalesced for row-major A
          const int64_t gm = m0 + row, gk = k0 + col;
          a_tile[col][row] = gm < p.m && gk < p.k ? convert<Acc>(a_mat[gm * p.a_row + gk * p.a_col]) : Acc(0);
        }
#pragma unroll
        for (int l = 0; l < kTileK * kTileN / kThreads; ++l) {
          const int e = static_cast<int>(threadIdx.x) + l * kThreads;
          const int row = e / kTileN, col = e % kTileN;  // consecutive threads walk n: coalesced for row-major B
          const int64_t gk = k0 + row, gn = n0 + col;
          b_tile[row][col] = gk < p.k && gn < p.n ? convert<Acc>(b_mat[gk * p.b_row + gn * p.b_col]) : Acc(0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTileK; ++kk) {
          Acc a_reg[kRegM], b_reg[kRegN];
#pragma unroll
          for (int i = 0; i < kRegM; ++i) a_reg[i] = a_tile[kk][ty + i * kThreadsY];
#pragma unroll
          for (int j = 0; j < kRegN; ++j) b_reg[j] = b_tile[kk][tx + j * kThreadsX];
#pragma unroll
          for (int i = 0; i < kRegM; ++i)
#pragma unroll
            for (int j = 0; j < kRegN; ++j) acc[i][j] += a_reg[i] * b_reg[j];
        }
        __syncthreads();  // the tiles are overwritten by the next step
      }
#pragma unroll
      for (int i = 0; i < kRegM; ++i) {
        const int64_t gm = m0 + ty + i * kThreadsY;
#pragma unroll
        for (int j = 0; j < kRegN; ++j) {
          const int64_t gn = n0 + tx + j * kThreadsX;
          if (gm < p.m && gn < p.n) c_mat[gm * p.n + gn] = convert<Out>(acc[i][j]);  // the one rounding
        }
      }
    }
  }
}

/// Whether a product of `in` operands giving `out` runs on the Tensor Cores (cuda/gemm.cu): f16 and bf16
/// always, f32 when TF32 is allowed (mixtape::cuda::set_allow_tf32), on devices of compute capability 8.0+.
bool use_tensor_cores(DType in, DType out, Device device) {
  const bool dtype_ok = is_reduced_float(in) || (in == DType::kF32 && ::mixtape::cuda::allow_tf32());
  return dtype_ok && out != DType::kF64 && gemm_tensor_core_supports(in, out, device.index);
}

/// The kernel name the precision trace shows for a product of `in` operands.
const char* gemm_kernel_name(DType in, bool tensor_cores) {
  if (!tensor_cores) return in == DType::kF64 ? "simt f64" : "simt f32";
  return in == DType::kF16 ? "wmma f16" : in == DType::kBF16 ? "wmma bf16" : "wmma tf32";
}

/// A (rows, cols) matrix with element strides (row, col) as the Tensor Core GEMM reads it: row-major (unit
/// column stride) or transposed (unit row stride); a dim of size 1 may have any stride. Nothing when neither
/// (a strided slice, overlapping strides): the SIMT kernel reads those.
std::optional<GemmOperand> gemm_operand(const void* ptr, int64_t rows, int64_t cols, int64_t row_stride,
                                        int64_t col_stride) {
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols)) return GemmOperand{ptr, rows == 1 ? cols : row_stride, false, 0};
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows)) return GemmOperand{ptr, cols == 1 ? rows : col_stride, true, 0};
  return std::nullopt;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, DType out_dtype) {
  // torch.matmul's promotion, as ops/cpu/matmul.cpp: a 1-D left operand is a row, a 1-D right one a column;
  // the added dim is dropped from the result.
  const Tensor a = a_in.dim() == 1 ? raw::unsqueeze(a_in, 0) : a_in;
  const Tensor b = b_in.dim() == 1 ? raw::unsqueeze(b_in, 1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape batch_a, batch_b;
  for (int64_t d = 0; d + 2 < a.dim(); ++d) batch_a.push_back(a.size(d));
  for (int64_t d = 0; d + 2 < b.dim(); ++d) batch_b.push_back(b.size(d));
  const Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  Shape full = batch, result_shape = batch, a_full = batch, b_full = batch;
  full.push_back(m), full.push_back(n);
  a_full.push_back(m), a_full.push_back(k);
  b_full.push_back(k), b_full.push_back(n);
  if (a_in.dim() != 1) result_shape.push_back(m);
  if (b_in.dim() != 1) result_shape.push_back(n);

  const Device device = a.device();
  Tensor c = mixtape::empty(full, TensorOptions(out_dtype).device(device));
  if (c.numel() == 0) return raw::view(c, result_shape);

  // Broadcast batch dims read with stride 0: a shared weight is never copied per batch.
  const Tensor ae = raw::expand(a, a_full), be = raw::expand(b, b_full);
  GemmArgs p{};
  p.m = m, p.n = n, p.k = k;
  p.a_row = ae.stride(-2), p.a_col = ae.stride(-1);
  p.b_row = be.stride(-2), p.b_col = be.stride(-1);
  Shape a_batch_strides, b_batch_strides;
  for (int64_t d = 0; d < batch.size(); ++d) {
    a_batch_strides.push_back(ae.stride(d));
    b_batch_strides.push_back(be.stride(d));
  }
  // Coalescing keeps the row-major order of the batch index, which is C's matrix order.
  const StridedLayout<2> L = make_strided_layout<2>(batch, {&a_batch_strides, &b_batch_strides}, {1, 1});
  p.batches = L.numel;
  p.batch_ndim = L.ndim;
  for (int d = 0; d < L.ndim; ++d) {
    p.batch_sizes[d] = L.sizes[d];
    p.a_batch[d] = L.byte_strides[0][d];
    p.b_batch[d] = L.byte_strides[1][d];
  }
  p.tiles_n = (n + kTileN - 1) / kTileN;
  p.tiles = (m + kTileM - 1) / kTileM * p.tiles_n;

  DeviceGuard guard(device);
  const std::optional<GemmOperand> ga = gemm_operand(ae.data_ptr(), m, k, p.a_row, p.a_col);
  const std::optional<GemmOperand> gb = gemm_operand(be.data_ptr(), k, n, p.b_row, p.b_col);
  const bool tensor_cores = use_tensor_cores(a.dtype(), out_dtype, device) && ga && gb;
  kernels::note_kernel(gemm_kernel_name(a.dtype(), tensor_cores));
  if (tensor_cores) {
    // The innermost coalesced batch dim is the GEMM's batch (its strides are the operands' batch strides); the
    // outer ones, if any are left after coalescing, are walked here, one launch each.
    const int last = L.ndim - 1;
    const int64_t inner = L.sizes[last], outer = L.numel / std::max<int64_t>(inner, 1);
    const size_t in_size = a.itemsize(), out_size = c.itemsize();
    for (int64_t o = 0; o < outer; ++o) {
      int64_t rest = o, a_off = 0, b_off = 0;
      for (int d = last - 1; d >= 0; --d) {
        const int64_t i = rest % L.sizes[d];
        rest /= L.sizes[d];
        a_off += i * p.a_batch[d];
        b_off += i * p.b_batch[d];
      }
      GemmOperand oa = *ga, ob = *gb;
      oa.ptr = static_cast<const char*>(ga->ptr) + a_off * static_cast<int64_t>(in_size);
      ob.ptr = static_cast<const char*>(gb->ptr) + b_off * static_cast<int64_t>(in_size);
      oa.batch_stride = p.a_batch[last];
      ob.batch_stride = p.b_batch[last];
      void* c_ptr = static_cast<char*>(c.data_ptr()) + o * inner * m * n * static_cast<int64_t>(out_size);
      gemm_tensor_core(m, n, k, inner, a.dtype(), oa, ob, c_ptr, n, m * n, out_dtype, GemmEpilogue{}, launch_stream());
    }
    return raw::view(c, result_shape);
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(p.tiles, 1 << 20)),
                  static_cast<unsigned>(std::min<int64_t>(p.batches, 65535)));
  dispatch_floating(a.dtype(), "matmul", [&](auto in_tag) {
    using T = typename decltype(in_tag)::type;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    dispatch_floating(out_dtype, "matmul", [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      matmul_kernel<T, Acc, Out><<<grid, kThreads, 0, launch_stream()>>>(
          static_cast<const T*>(ae.data_ptr()), static_cast<const T*>(be.data_ptr()), static_cast<Out*>(c.data_ptr()),
          p);
      MT_CUDA_CHECK_LAUNCH("matmul_kernel (", a.dtype(), " -> ", out_dtype, ", shapes ", a_in.shape(), " and ",
                           b_in.shape(), " on ", device, ")");
    });
  });
  return raw::view(c, result_shape);
}

}  // namespace mixtape::kernels::cuda

namespace mixtape::kernels::cuda {

Tensor addmm(const Tensor& bias_in, const Tensor& a, const Tensor& b, DType out_dtype) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const Device device = a.device();
  DeviceGuard guard(device);
  const std::optional<GemmOperand> ga = gemm_operand(a.data_ptr(), m, k, a.stride(0), a.stride(1));
  const std::optional<GemmOperand> gb = gemm_operand(b.data_ptr(), k, n, b.stride(0), b.stride(1));
  if (use_tensor_cores(a.dtype(), out_dtype, device) && ga && gb) {
    // The bias is the GEMM's epilogue: added to the f32 accumulator before the one rounding.
    Tensor c = mixtape::empty({m, n}, TensorOptions(out_dtype).device(device));
    if (c.numel() == 0) return c;
    const Tensor bias = raw::contiguous(bias_in);
    kernels::note_kernel(gemm_kernel_name(a.dtype(), true));
    gemm_tensor_core(m, n, k, 1, a.dtype(), *ga, *gb, c.data_ptr(), n, 0, out_dtype,
                     GemmEpilogue{bias.data_ptr(), bias.dtype(), false}, launch_stream());
    return c;
  }
  // Elsewhere as on the CPU: the product in f32 (f64), the bias added there, one rounding.
  const DType acc = acc_dtype(a.dtype());
  const Tensor y = cuda::binary(BinaryOp::kAdd, cuda::matmul(a, b, acc), raw::to(bias_in, acc));
  return y.dtype() == out_dtype ? y : raw::to(y, out_dtype);
}

}  // namespace mixtape::kernels::cuda
