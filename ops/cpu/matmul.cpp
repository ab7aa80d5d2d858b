// ops/cpu/matmul.cpp — torch.matmul on the CPU through OpenBLAS, and the naive reference.
//
// The one design idea: hand BLAS the operands' memory as it lies. A matrix
// whose columns are contiguous is row-major (NoTrans); one whose rows are
// contiguous is the transpose of a row-major matrix (Trans, e.g. `w.t()`);
// only other layouts (strided in both dims, broadcast rows) are copied.
// f16/bf16 are widened to f32 (exact), multiplied by sgemm with f32
// accumulation, and rounded once to the result dtype: the numerics a Tensor
// Core GEMM promises. On a CPU with AVX512-BF16, bf16 operands go as they lie
// to gemm_bf16 instead (ops/cpu/gemm_bf16.h: the same f32 accumulation of
// exact products, bf16 subnormal operands read as zero), which writes the
// rounded result itself. When a 2-D right operand meets a batch whose rows are
// evenly spaced (x @ W in a Linear layer), the batch folds into one gemm.
// Batches otherwise run one gemm after another with BLAS's own threads
// (measured: spreading small products over OpenMP threads, each calling a
// single-threaded sgemm, won 20% at 32^3, lost 40% at 8^3 and nothing at 64^3).
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <vector>

#include <cblas.h>

#include <mixtape/ops/cpu/gemm_bf16.h>

namespace mixtape::kernels::cpu {

namespace {

/// How BLAS reads one rows x cols matrix in place (row-major order).
struct BlasOperand {
  CBLAS_TRANSPOSE trans;
  int64_t ld;  // leading dimension, in elements
};

/// The in-place reading of a rows x cols matrix with element strides (row_stride, col_stride), if any.
std::optional<BlasOperand> blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // A size-1 dim's stride never addresses memory: pick whichever suits.
  if (cols <= 1) col_stride = 1;
  if (rows <= 1) row_stride = col_stride == 1 ? std::max<int64_t>(cols, 1) : 1;
  if (col_stride == 1 && row_stride >= std::max<int64_t>(cols, 1)) return BlasOperand{CblasNoTrans, row_stride};
  if (row_stride == 1 && col_stride >= std::max<int64_t>(rows, 1)) return BlasOperand{CblasTrans, col_stride};
  return std::nullopt;
}

/// `t` (the last two dims a matrix) and how BLAS reads its matrices: in place
/// when the layout allows, else a contiguous copy (made before any broadcast,
/// so a broadcast operand is copied once).
std::pair<Tensor, BlasOperand> blas_ready(Tensor t) {
  auto op = blas_operand(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1));
  if (!op) {
    t = raw::contiguous(t);
    op = blas_operand(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1));
  }
  return {t, *op};
}

/// `t` (f16/bf16, the last two dims a matrix) widened exactly to f32. A large transposed matrix (`w.t()`: rows
/// contiguous) stays transposed, so the conversion reads and writes runs of consecutive elements (vector code)
/// instead of one element a column apart at a time, and sgemm reads it as Trans: measured on the MNIST MLP's f16
/// products (bench_cpu_matmul), x·wᵀ for a 512 x 784 weight 1.3 → 0.65 ms, of which the strided conversion was
/// 0.43 ms. Smaller ones are converted into row-major order as before: there the conversion is cheap, and
/// OpenBLAS's small-matrix paths prefer it (fc3's 512 x 10 weight: 0.03 ms as NoTrans, 0.06 as Trans).
Tensor widen(const Tensor& t) {
  constexpr int64_t kKeepTransposedFrom = int64_t{1} << 16;  // elements of the matrix
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const auto op = blas_operand(rows, cols, t.stride(-2), t.stride(-1));
  if (op && op->trans == CblasTrans && rows > 1 && cols > 1 && rows * cols >= kKeepTransposedFrom)
    return raw::transpose(raw::to(raw::transpose(t, -2, -1), DType::kF32), -2, -1);
  return raw::to(t, DType::kF32);
}

int blas_int(int64_t v, const Tensor& a, const Tensor& b) {
  MT_CHECK(v <= INT_MAX, "matmul: a dimension or leading stride of ", v, " exceeds BLAS's 32-bit indices (shapes ",
           a.shape(), " and ", b.shape(), ")");
  return static_cast<int>(v);
}

/// C (m x n, row-major, ldc) = op(A) op(B), overwriting C.
void gemm(const BlasOperand& oa, const BlasOperand& ob, int m, int n, int k, const float* a, int lda, const float* b,
          int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, oa.trans, ob.trans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
void gemm(const BlasOperand& oa, const BlasOperand& ob, int m, int n, int k, const double* a, int lda, const double* b,
          int ldb, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, oa.trans, ob.trans, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}
/// C is f32, or bf16 rounded once from the f32 sums.
template <class C>
void gemm(const BlasOperand& oa, const BlasOperand& ob, int m, int n, int k, const BFloat16* a, int lda,
          const BFloat16* b, int ldb, C* c, int ldc) {
  gemm_bf16(m, n, k, {a, lda, oa.trans == CblasTrans}, {b, ldb, ob.trans == CblasTrans}, c, ldc);
}

/// Whether the batch dims and the row dim of `t` (batch..., m, k) step evenly,
/// so the batch is one (batch*m) x k matrix with row stride `ld`.
bool rows_fold(const Tensor& t, int64_t ld) {
  int64_t expected = ld * t.size(-2);
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

/// c (batch..., m, n), contiguous, = a (batch..., m, k) @ b (batch..., k, n); a and b already broadcast.
/// T: the operands' element type, C: the result's.
template <class T, class C>
void batched_gemm(const Tensor& a_in, const Tensor& b_in, const Shape& batch, const Tensor& c) {
  const int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  auto [a_ready, oa] = blas_ready(a_in);
  auto [b_ready, ob] = blas_ready(b_in);
  Shape a_full = batch, b_full = batch;
  a_full.push_back(m), a_full.push_back(k);
  b_full.push_back(k), b_full.push_back(n);
  const Tensor a = raw::expand(a_ready, a_full), b = raw::expand(b_ready, b_full);
  const int64_t batches = batch.numel();

  const T* a_ptr = static_cast<const T*>(a.data_ptr());
  const T* b_ptr = static_cast<const T*>(b.data_ptr());
  C* c_ptr = static_cast<C*>(c.data_ptr());
  const int lda = blas_int(oa.ld, a, b), ldb = blas_int(ob.ld, a, b);

  bool b_shared = true;  // the same right matrix for every batch
  for (int64_t d = 0; d < batch.size(); ++d) b_shared = b_shared && (batch[d] == 1 || b.stride(d) == 0);
  if (batches == 1 || (b_shared && oa.trans == CblasNoTrans && rows_fold(a, oa.ld))) {
    gemm(oa, ob, blas_int(batches * m, a, b), blas_int(n, a, b), blas_int(k, a, b), a_ptr, lda, b_ptr, ldb, c_ptr,
         blas_int(n, a, b));
    return;
  }
  for (int64_t i = 0; i < batches; ++i) {
    int64_t off_a = 0, off_b = 0;
    for (int64_t d = batch.size() - 1, rem = i; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      off_a += idx * a.stride(d);
      off_b += idx * b.stride(d);
    }
    gemm(oa, ob, blas_int(m, a, b), blas_int(n, a, b), blas_int(k, a, b), a_ptr + off_a, lda, b_ptr + off_b, ldb,
         c_ptr + i * m * n, blas_int(n, a, b));
  }
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, DType out_dtype) {
  // torch.matmul's promotion: a 1-D left operand is a row, a 1-D right one a column; the added dim goes afterwards.
  Tensor a = a_in.dim() == 1 ? raw::unsqueeze(a_in, 0) : a_in;
  Tensor b = b_in.dim() == 1 ? raw::unsqueeze(b_in, 1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape batch_a, batch_b;
  for (int64_t d = 0; d + 2 < a.dim(); ++d) batch_a.push_back(a.size(d));
  for (int64_t d = 0; d + 2 < b.dim(); ++d) batch_b.push_back(b.size(d));
  const Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  Shape full = batch, result_shape = batch;
  full.push_back(m), full.push_back(n);
  if (a_in.dim() != 1) result_shape.push_back(m);
  if (b_in.dim() != 1) result_shape.push_back(n);

  // bf16 on AVX512-BF16: a bf16 result rounded straight from the kernel's f32 sums; any other dtype from f32.
  if (a.dtype() == DType::kBF16 && use_gemm_bf16(m, n, k)) {
    const DType c_dtype = out_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
    Tensor c = empty(full, c_dtype);
    if (c.numel() > 0) {
      if (c_dtype == DType::kBF16)
        batched_gemm<BFloat16, BFloat16>(a, b, batch, c);
      else
        batched_gemm<BFloat16, float>(a, b, batch, c);
    }
    if (out_dtype != c_dtype) c = raw::to(c, out_dtype);
    return raw::view(c, result_shape);
  }

  // f16/bf16 widen exactly to f32.
  const bool f64 = a.dtype() == DType::kF64;
  if (is_reduced_float(a.dtype())) {
    a = widen(a);
    b = widen(b);
  }
  const DType gemm_dtype = f64 ? DType::kF64 : DType::kF32;
  Tensor c = empty(full, gemm_dtype);
  if (c.numel() > 0) {
    if (k == 0) {
      raw::fill_(c, 0.0);
    } else if (f64) {
      batched_gemm<double, double>(a, b, batch, c);
    } else {
      batched_gemm<float, float>(a, b, batch, c);
    }
  }
  if (out_dtype != gemm_dtype) c = raw::to(c, out_dtype);  // the one rounding of f16/bf16 results
  return raw::view(c, result_shape);
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, DType out_dtype) {
  const DType acc = acc_dtype(a.dtype());
  const Tensor y = cpu::binary(BinaryOp::kAdd, cpu::matmul(a, b, acc), raw::to(bias, acc));
  return y.dtype() == out_dtype ? y : raw::to(y, out_dtype);  // the one rounding
}

Tensor matmul_naive(const Tensor& a, const Tensor& b) {
  MT_CHECK(a.defined() && b.defined(), "matmul_naive: an argument is an undefined tensor");
  MT_CHECK(a.device().is_cpu() && b.device().is_cpu(), "matmul_naive: expects CPU tensors, got ", a.device(),
           " and ", b.device());
  MT_CHECK(a.dim() == 2 && b.dim() == 2, "matmul_naive: expects 2-D tensors, got shapes ", a.shape(), " and ",
           b.shape());
  MT_CHECK(a.dtype() == b.dtype() && a.dtype() != DType::kBool, "matmul_naive: expects two tensors of one non-bool "
           "dtype, got ", a.dtype(), " and ", b.dtype());
  MT_CHECK(a.size(1) == b.size(0), "matmul_naive: shapes cannot be multiplied (", a.shape(), " and ", b.shape(), ")");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor out = empty({m, n}, a.dtype());
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Widen both operands to double (exact for every dtype but huge i64), then
    // the textbook sum over p, in order, for each (i, j). Loop order i-p-j
    // keeps that order while streaming rows of b.
    auto widen = [](const Tensor& t) {
      std::vector<double> w(static_cast<size_t>(t.numel()));
      const T* p = static_cast<const T*>(t.data_ptr());
      const int64_t cols = t.size(1);
      for (int64_t i = 0; i < t.size(0); ++i)
        for (int64_t j = 0; j < cols; ++j)
          w[static_cast<size_t>(i * cols + j)] = convert<double>(p[i * t.stride(0) + j * t.stride(1)]);
      return w;
    };
    if constexpr (!std::is_same_v<T, bool>) {
      const std::vector<double> wa = widen(a), wb = widen(b);
      std::vector<double> acc(static_cast<size_t>(n));
      T* o = static_cast<T*>(out.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t p = 0; p < k; ++p) {
          const double aip = wa[static_cast<size_t>(i * k + p)];
          const double* brow = wb.data() + p * n;
          for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += aip * brow[j];
        }
        for (int64_t j = 0; j < n; ++j) o[i * n + j] = convert<T>(acc[static_cast<size_t>(j)]);
      }
    }
  });
  return out;
}

}  // namespace mixtape::kernels::cpu
