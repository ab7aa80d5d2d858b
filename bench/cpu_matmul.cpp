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
  return 0;
}
