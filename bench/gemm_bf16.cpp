// bench/gemm_bf16.cpp — GFLOP/s of the AVX512-BF16 GEMM (ops/cpu/gemm_bf16.h) against cblas_sgemm alone, and of
// kernels::matmul's two bf16 paths (the kernel, widen + sgemm) against each other, all measured in this run.
//
// Shapes: the three products of each Linear of examples/mnist's MLP (784-512-512-10, batch 128) as the tape hands
// them over (forward x·wᵀ, dx = dy·w, dw = dyᵀ·x), squares from 8 (where packing might not pay) to 1024. Random
// inputs in [-1, 1). Columns: gemm_bf16 into a preallocated bf16 result; cblas_sgemm on preallocated f32 copies
// of the same operands (the f32 ceiling); kernels::matmul on bf16 tensors, through the kernel and forced through
// widen + sgemm, allocation included (what a caller pays). Each is the min and the median of several timed calls
// after one warm-up: on a shared machine the min is the cleaner number. Each variant starts after a pause that lets
// the other thread pool's idle workers fall asleep: OpenBLAS's spin for some 0.1 s after a call, and on 2 cores a
// spinning worker of one pool stalls every barrier of the other (seen here: 5 GFLOP/s instead of 900). Prints a
// Markdown table.
//
//   ./bench_gemm_bf16
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include <cblas.h>

#include <mixtape/core/random.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/cpu/gemm_bf16.h>

namespace mt = mixtape;
namespace cpu = mixtape::kernels::cpu;

namespace {

struct Timing {
  double min, median;  // seconds
};

/// Min and median wall time of `runs` calls of f, after a pause and one untimed warm-up call.
Timing time_calls(int runs, const std::function<void()>& f) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  f();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

struct Product {
  const char* what;
  int64_t m, n, k;
  bool trans_a, trans_b;  // a stored (k, m), b stored (n, k)
};

}  // namespace

int main() {
  if (!cpu::gemm_bf16_supported()) {
    std::printf("no AVX512-BF16 (this CPU, or MIXTAPE_CPU_CAPABILITY): nothing to measure\n");
    return 0;
  }
  const Product products[] = {
      {"fc1 x·wᵀ", 128, 512, 784, false, true},   {"fc1 dyᵀ·x", 512, 784, 128, true, false},
      {"fc2 x·wᵀ", 128, 512, 512, false, true},   {"fc2 dy·w", 128, 512, 512, false, false},
      {"fc2 dyᵀ·x", 512, 512, 128, true, false},  {"fc3 x·wᵀ", 128, 10, 512, false, true},
      {"fc3 dy·w", 128, 512, 10, false, false},   {"fc3 dyᵀ·x", 10, 512, 128, true, false},
      {"8³", 8, 8, 8, false, false},              {"16³", 16, 16, 16, false, false},
      {"32³", 32, 32, 32, false, false},          {"64³", 64, 64, 64, false, false},
      {"128³", 128, 128, 128, false, false},      {"512³", 512, 512, 512, false, false},
      {"1024³", 1024, 1024, 1024, false, false},
  };
  std::printf("GFLOP/s, min / median of the timed calls (a shared machine: the min is the cleaner number)\n\n");
  std::printf("| product | m x n x k | gemm_bf16 | sgemm alone | gemm_bf16 / sgemm | matmul bf16: kernel | "
              "matmul bf16: widen+sgemm | kernel / widen |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Product& p : products) {
    mt::Generator gen(1234);
    // Stored shapes: a (m, k) or (k, m), b (k, n) or (n, k); the views multiplied are (m, k) and (k, n).
    const mt::Tensor a_store = mt::uniform(p.trans_a ? mt::Shape{p.k, p.m} : mt::Shape{p.m, p.k}, -1, 1, mt::kBF16, &gen);
    const mt::Tensor b_store = mt::uniform(p.trans_b ? mt::Shape{p.n, p.k} : mt::Shape{p.k, p.n}, -1, 1, mt::kBF16, &gen);
    const mt::Tensor a = p.trans_a ? a_store.t() : a_store, b = p.trans_b ? b_store.t() : b_store;
    const mt::Tensor af = a_store.to(mt::kF32), bf = b_store.to(mt::kF32);
    mt::Tensor c = mt::empty({p.m, p.n}, mt::kBF16), cf = mt::empty({p.m, p.n});
    const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
    const int runs = flops < 1e7 ? 201 : 21;

    const Timing kernel = time_calls(runs, [&] {
      cpu::gemm_bf16(p.m, p.n, p.k, {a_store.data<mt::BFloat16>(), a_store.size(1), p.trans_a},
                     {b_store.data<mt::BFloat16>(), b_store.size(1), p.trans_b}, c.data<mt::BFloat16>(), p.n);
    });
    const Timing sgemm = time_calls(runs, [&] {
      cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, af.data<float>(),
                  static_cast<int>(af.size(1)), bf.data<float>(), static_cast<int>(bf.size(1)), 0.0f,
                  cf.data<float>(), static_cast<int>(p.n));
    });
    mt::Tensor sink;
    Timing via_kernel, via_widen;
    {
      const cpu::ForceBf16GemmPath force(cpu::Bf16GemmPath::kAvx512Bf16);
      via_kernel = time_calls(runs, [&] { sink = mt::kernels::matmul(a, b, mt::kBF16); });
    }
    {
      const cpu::ForceBf16GemmPath force(cpu::Bf16GemmPath::kWidenSgemm);
      via_widen = time_calls(runs, [&] { sink = mt::kernels::matmul(a, b, mt::kBF16); });
    }
    auto g = [&](const Timing& t) { return std::make_pair(flops / t.min * 1e-9, flops / t.median * 1e-9); };
    const auto [k_min, k_med] = g(kernel);
    const auto [s_min, s_med] = g(sgemm);
    const auto [mk_min, mk_med] = g(via_kernel);
    const auto [mw_min, mw_med] = g(via_widen);
    std::printf("| %s | %lldx%lldx%lld | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f | %.0f / %.0f | %.0f / %.0f | "
                "%.2f / %.2f |\n",
                p.what, static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), k_min,
                k_med, s_min, s_med, sgemm.min / kernel.min, sgemm.median / kernel.median, mk_min, mk_med, mw_min,
                mw_med, via_widen.min / via_kernel.min, via_widen.median / via_kernel.median);
    std::fflush(stdout);
  }
  return 0;
}
