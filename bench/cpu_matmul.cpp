// bench/cpu_matmul.cpp — GFLOP/s of the CPU matmul fast path (OpenBLAS) against
// kernels::cpu::matmul_naive, the reference triple loop.
//
// For n in {512, 1024} and dtype in {f32, f16, bf16}: random inputs in
// [-1, 1) (never zeros: BLAS and the naive loop do the same work either
// way, but a zero matrix would hide a broken kernel), one warm-up call,
// then the median of several timed calls. 2 n^3 flops per product. The f16
// and bf16 fast path includes widening both operands to f32 and rounding the
// result back, and allocating the output: that is what a caller pays. A
// last column times cblas_sgemm alone on preallocated f32 buffers, the
// ceiling the fast path can reach. Prints a Markdown table for
// bench/RESULTS.md.
//
// A second table: the MNIST MLP's first layer as the tape hands its products
// over (batch 128, 784 -> 512: x·wᵀ, dyᵀ·x, dy·w, transposed views as they
// come), in f32, f16 and bf16, each against one cblas_sgemm of the same shape
// and transposes on f32 buffers that already exist: what widening, layouts
// and allocation cost beside the GEMM itself.
//
//   ./bench_cpu_matmul            # all sizes
//   ./bench_cpu_matmul 512        # one size
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <cblas.h>

#include <mixtape/core/random.h>
#include <mixtape/ops/backend/kernels.h>

namespace mt = mixtape;

namespace {

/// Median wall time in seconds of `runs` calls of f, after one untimed warm-up call.
double median_seconds(int runs, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {512, 1024};
  if (argc > 1) sizes = {std::atoll(argv[1])};
  std::printf("| n | dtype | kernels::matmul GFLOP/s | matmul_naive GFLOP/s | fast / naive | sgemm alone GFLOP/s |\n");
  std::printf("|---:|---|---:|---:|---:|---:|\n");
  for (int64_t n : sizes) {
    for (mt::DType dtype : {mt::kF32, mt::kF16, mt::kBF16}) {
      mt::Generator gen(1234);
      const mt::Tensor a = mt::uniform({n, n}, -1, 1, dtype, &gen);
      const mt::Tensor b = mt::uniform({n, n}, -1, 1, dtype, &gen);
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      mt::Tensor sink;
      const double fast = median_seconds(11, [&] { sink = mt::kernels::matmul(a, b, a.dtype()); });
      const double naive = median_seconds(n >= 1024 ? 3 : 5, [&] { sink = mt::kernels::cpu::matmul_naive(a, b); });
      // The same product as one sgemm on f32 buffers that already exist.
      const mt::Tensor af = a.to(mt::kF32), bf = b.to(mt::kF32);
      mt::Tensor cf = mt::empty({n, n});
      const int ni = static_cast<int>(n);
      const double blas = median_seconds(11, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, af.data<float>(), ni,
                    bf.data<float>(), ni, 0.0f, cf.data<float>(), ni);
      });
      std::printf("| %lld | %s | %.1f | %.2f | %.0fx | %.1f |\n", static_cast<long long>(n), mt::dtype_name(dtype),
                  flops / fast * 1e-9, flops / naive * 1e-9, naive / fast, flops / blas * 1e-9);
      std::fflush(stdout);
    }
  }

  std::printf("\n| MLP product (batch 128, 784 -> 512) | dtype | kernels::matmul ms | sgemm alone ms | "
              "matmul / sgemm |\n");
  std::printf("|---|---|---:|---:|---:|\n");
  struct Product {
    const char* what;
    int64_t a_rows, a_cols, b_rows, b_cols;  // as stored (row-major), before the transposes
    bool a_t, b_t;                           // the product takes the transposed view
  };
  const Product products[] = {{"x·wᵀ (forward)", 128, 784, 512, 784, false, true},
                              {"dyᵀ·x (weight gradient)", 128, 512, 128, 784, true, false},
                              {"dy·w (input gradient)", 128, 512, 512, 784, false, false}};
  for (const Product& p : products) {
    for (mt::DType dtype : {mt::kF32, mt::kF16, mt::kBF16}) {
      mt::Generator gen(4321);
      mt::Tensor a = mt::uniform({p.a_rows, p.a_cols}, -1, 1, dtype, &gen);
      mt::Tensor b = mt::uniform({p.b_rows, p.b_cols}, -1, 1, dtype, &gen);
      const mt::Tensor af = a.to(mt::kF32), bf = b.to(mt::kF32);
      if (p.a_t) a = a.t();
      if (p.b_t) b = b.t();
      const int m = static_cast<int>(a.size(0)), k = static_cast<int>(a.size(1)), n = static_cast<int>(b.size(1));
      mt::Tensor sink;
      const double ours = median_seconds(51, [&] { sink = mt::kernels::matmul(a, b, a.dtype()); });
      mt::Tensor cf = mt::empty({m, n});
      const double blas = median_seconds(51, [&] {
        cblas_sgemm(CblasRowMajor, p.a_t ? CblasTrans : CblasNoTrans, p.b_t ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                    af.data<float>(), static_cast<int>(p.a_cols), bf.data<float>(), static_cast<int>(p.b_cols), 0.0f,
                    cf.data<float>(), n);
      });
      std::printf("| %s | %s | %.3f | %.3f | %.2fx |\n", p.what, mt::dtype_name(dtype), ours * 1e3, blas * 1e3,
                  ours / blas);
      std::fflush(stdout);
    }
  }
  return 0;
}
