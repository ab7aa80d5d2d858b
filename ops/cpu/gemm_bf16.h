// ops/cpu/gemm_bf16.h — bf16 matrix products on the CPU's AVX512-BF16 dot products (vdpbf16ps), f32 accumulation.
//
// The one design idea: both operands are packed into panels of k-pairs, the layout vdpbf16ps reads (each 32-bit
// lane holds (x[k], x[k+1]) of one row or column), so one register-blocked micro-kernel serves every transpose and
// every edge (odd k and ragged panels are zero-padded in the packing, never branched on in the inner loop).
// Compiled with function target attributes (the build has no -march) and used only when the CPU says it has
// AVX512-BF16; kernels::matmul otherwise widens to f32 and calls sgemm (ops/cpu/matmul.cpp).
//
// Numerics (Intel SDM, VDPBF16PS): each f32 lane adds two bf16 products to its accumulator per instruction, each
// addition rounded to nearest even (a bf16 x bf16 product is exact in f32), so an entry is an f32 sum of its k
// products in some order, like sgemm's on the widened operands: within k·2^-24·Σ|a·b| of the exact sum (about
// sqrt(k)·2^-24·Σ|a·b| for errors of random sign). Unlike sgemm, and whatever MXCSR says, a bf16 subnormal operand
// is read as zero and a subnormal partial sum is flushed to zero (at most 2^-126 absolute per step). A bf16 result
// is that f32 sum rounded once (nearest even, NaN and subnormal rules of core/half.h), as on the fallback path.
//
//   gemm_bf16(m, n, k, {a, lda, false}, {w, ldw, true}, y, n);   // y (m, n) f32 = a (m, k) · wᵀ, w (n, k)
#pragma once

#include <cstdint>

#include <mixtape/core/half.h>

namespace mixtape::kernels::cpu {

/// One operand of gemm_bf16 as it lies in memory: its element (i, j) is data[i * ld + j] (trans false), or
/// data[j * ld + i] (trans true: the transpose of a row-major matrix, such as w.t()).
struct Bf16Matrix {
  const BFloat16* data;
  int64_t ld;  // leading dimension, in elements
  bool trans;
};

/// Whether this CPU runs gemm_bf16 (AVX-512 F/BW/VL and AVX512-BF16).
bool gemm_bf16_supported();

/// c (m, n) = a (m, k) · b (k, n), row-major with leading dim ldc, overwriting c (zeros when k == 0); threads:
/// omp_get_max_threads() for products big enough to share. Throws mixtape::Error on a CPU without AVX512-BF16.
void gemm_bf16(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc);
void gemm_bf16(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, BFloat16* c, int64_t ldc);

/// The two ways kernels::matmul multiplies bf16 operands.
enum class Bf16GemmPath {
  kAuto,        // gemm_bf16 when the CPU has it and the product is big enough to repay packing, else widening
  kAvx512Bf16,  // gemm_bf16 at every size (an error on a CPU without it)
  kWidenSgemm,  // widen to f32 (exact), sgemm, round once: the path of every other CPU
};

/// Whether kernels::matmul takes gemm_bf16 for one (m, k) · (k, n) product of bf16 operands.
bool use_gemm_bf16(int64_t m, int64_t n, int64_t k);

/// Forces kernels::matmul's bf16 path while alive, so tests can run both on one machine. Process-wide: not for
/// use while other threads multiply.
class ForceBf16GemmPath {
 public:
  explicit ForceBf16GemmPath(Bf16GemmPath path);
  ~ForceBf16GemmPath();
  ForceBf16GemmPath(const ForceBf16GemmPath&) = delete;
  ForceBf16GemmPath& operator=(const ForceBf16GemmPath&) = delete;

 private:
  Bf16GemmPath m_previous;
};

}  // namespace mixtape::kernels::cpu
