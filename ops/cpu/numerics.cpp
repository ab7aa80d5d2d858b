// ops/cpu/numerics.cpp — the numerics inspector's statistics on the CPU: numerics_stats and lost_updates.
//
// One pass over contiguous memory, each element classified by ops/backend/numerics_math.h's predicates (shared
// with cuda/numerics.cu). Every result is a count or a max of integers, so the OpenMP threads' partial results
// merge in any order to the same value: the result does not depend on the thread count, and is the CUDA kernels'
// bit for bit.
#include <mixtape/ops/backend/kernels.h>

#include <array>
#include <cstdint>

#include <mixtape/ops/backend/numerics_math.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

Tensor numerics_stats(const Tensor& x, const Tensor& multiplier) {
  Tensor out = zeros({math::kNumericsFields}, TensorOptions(DType::kI64));  // (kNumericsFields), overwritten
  const int64_t n = x.numel();
  if (n == 0) return out;
  // Multiplying by 1 changes no f32 value (subnormals and NaN included), so the unscaled and the plain
  // statistics are one loop.
  const float m = multiplier.defined() ? multiplier.item<float>() : 1.0f;
  int64_t* o = out.data<int64_t>();
  dispatch_floating(x.dtype(), "numerics_stats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();  // (n), contiguous
#pragma omp parallel if (n >= kParallelMin)
    {
      math::ValueCounts<int64_t> c;
      std::array<int64_t, math::kHistogramBins> histogram{};
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t a = math::magnitude_bits(static_cast<float>(p[i]) * m);  // an f64 is rounded to f32 first
        c.add(a);
        if (math::has_histogram_bin(a)) ++histogram[math::histogram_bin(a)];
      }
#pragma omp critical(mixtape_numerics_stats)
      {
        for (int f = 0; f < math::kAmaxBits; ++f) o[f] += c.n[f];
        if (c.amax_bits > o[math::kAmaxBits]) o[math::kAmaxBits] = c.amax_bits;
        for (int k = 0; k < math::kHistogramBins; ++k) o[math::kHistogram + k] += histogram[k];
      }
    }
  });
  return out;
}

Tensor lost_updates(const Tensor& before, const Tensor& after, DType model_dtype) {
  Tensor out = zeros({math::kLostUpdateFields}, TensorOptions(DType::kI64));  // (3), overwritten
  const int64_t n = before.numel();
  const math::FloatFormat format = math::float_format(model_dtype);
  int64_t unchanged = 0, lost = 0;
  dispatch_floating(before.dtype(), "lost_updates", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* b = before.data<T>();  // (n), contiguous
    const T* a = after.data<T>();   // (n), contiguous
#pragma omp parallel for schedule(static) reduction(+ : unchanged, lost) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const double w = static_cast<M>(b[i]), w_next = static_cast<M>(a[i]);  // exact: every dtype widens to double
      unchanged += math::update_unchanged(w, w_next);
      lost += math::update_lost(w, w_next, format);
    }
  });
  int64_t* o = out.data<int64_t>();
  o[math::kUpdateCount] = n;
  o[math::kUnchanged] = unchanged;
  o[math::kLost] = lost;
  return out;
}

}  // namespace mixtape::kernels::cpu
