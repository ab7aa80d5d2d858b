// ops/cpu/foreach.cpp — the multi-tensor kernels on the CPU: one pass over a list of tensors.
//
// For the optimizers, the loss scaler and gradient clipping (optim/): one call handles every tensor of a list, so
// a step over a model is one pass over its memory rather than a chain of elementwise kernels per parameter. Each
// tensor is walked with the strided loops of core/strided_loop.h, updated in place; the arithmetic is
// ops/backend/amp_math.h's, shared with cuda/foreach.cu.
//
// A norm is summed in a fixed order whatever the thread count: blocks of kNormBlock consecutive elements (along
// each innermost run), each in kAccs interleaved accumulators, the blocks added in order, so the rounding error
// grows like kNormBlock / kAccs + n / kNormBlock rather than n.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/backend/amp_math.h>
#include <mixtape/ops/backend/optim_math.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

namespace {

constexpr int64_t kNormBlock = 4096;

/// Calls f(T& element) for every element of t (any layout). A run of consecutive elements gets a loop of its own,
/// which the compiler turns into vector code when f is branch-free.
template <class T, class F>
void for_each_element(const Tensor& t, F&& f) {
  const auto L = make_strided_layout<1>(t.shape(), {&t.strides()}, {static_cast<int64_t>(sizeof(T))});
  auto run = [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
    if (s[0] == static_cast<int64_t>(sizeof(T))) {
      T* v = reinterpret_cast<T*>(p[0]);
      for (int64_t i = 0; i < n; ++i) f(v[i]);
      return;
    }
    for (int64_t i = 0; i < n; ++i) f(*reinterpret_cast<T*>(p[0] + i * s[0]));
  };
  for_each_run<1>(L, {static_cast<char*>(t.data_ptr())}, 0, L.numel, run);
}

/// v · factor, but v itself where it is NaN (math::rescales); m is v in opmath. f32 and f64 by optim_math::select,
/// so a contiguous run's loop vectorises (a branch there stays scalar under -ftrapping-math); f16 and bf16 keep the
/// branch, which leaves a NaN's bits as they were without a round trip through f32. (clang turns the select into
/// v · select(v == v, factor, 1), which quiets a signaling NaN: test_foreach's NaN case says so.)
template <class T, class M>
T rescaled(T v, M m, M factor) {
  if constexpr (std::is_same_v<T, M>) return optim_math::select(math::rescales(m), m * factor, m);
  else return math::rescales(m) ? convert<T>(m * factor) : v;
}

/// The K-norm of t's elements in M (see the file comment for the order).
template <math::NormKind K, class T, class M = opmath_t<T>>
M tensor_norm(const Tensor& t, M p) {
  M total = 0;
  if (t.numel() == 0) return total;
  const auto L = make_strided_layout<1>(t.shape(), {&t.strides()}, {static_cast<int64_t>(sizeof(T))});
  auto run = [&](const std::array<char*, 1>& ptr, const std::array<int64_t, 1>& s, int64_t n) {
    for (int64_t b = 0; b < n; b += kNormBlock) {
      const int64_t e = std::min(n, b + kNormBlock);
      M acc[kAccs] = {};
      auto term = [&](int64_t i) {
        return math::norm_term<K, M>(static_cast<M>(*reinterpret_cast<const T*>(ptr[0] + i * s[0])), p);
      };
      int64_t i = b;
      for (; i + kAccs <= e; i += kAccs)
        for (int j = 0; j < kAccs; ++j) acc[j] = math::norm_combine<K>(acc[j], term(i + j));
      for (; i < e; ++i) acc[0] = math::norm_combine<K>(acc[0], term(i));
      M block = acc[0];
      for (int j = 1; j < kAccs; ++j) block = math::norm_combine<K>(block, acc[j]);
      total = math::norm_combine<K>(total, block);
    }
  };
  for_each_run<1>(L, {static_cast<char*>(t.data_ptr())}, 0, L.numel, run);
  return math::norm_finish<K>(total, p);
}

}  // namespace

void non_finite_check_and_unscale_(std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale) {
  const float inv = inv_scale.item<float>();
  bool any_non_finite = false;
  float* tensor_flags = found_inf.numel() > 1 ? found_inf.data<float>() + 1 : nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      const M scale = static_cast<M>(inv);
      int non_finite = 0;  // an int, not a bool: an OR the compiler vectorises
      for_each_element<T>(t, [&](T& v) {
        const M m = static_cast<M>(v);
        non_finite |= !math::finite(m);
        v = rescaled(v, m, scale);
      });
      any_non_finite |= non_finite != 0;
      if (non_finite && tensor_flags) tensor_flags[i] = 1.0f;
    });
  }
  if (any_non_finite) *found_inf.data<float>() = 1.0f;
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  math::amp_update_scale(*scale.data<float>(), *growth_tracker.data<int32_t>(), *found_inf.data<float>(),
                         growth_factor, backoff_factor, static_cast<int32_t>(growth_interval));
}

Tensor foreach_norm(std::span<const Tensor> tensors, double ord) {
  const bool any_f64 = std::any_of(tensors.begin(), tensors.end(), [](const Tensor& t) {
    return t.dtype() == DType::kF64;
  });
  const Tensor out = empty({static_cast<int64_t>(tensors.size())}, any_f64 ? DType::kF64 : DType::kF32);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    double norm = 0;
    dispatch_floating(t.dtype(), "foreach_norm", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      const M p = static_cast<M>(ord);
      switch (math::norm_kind(ord)) {
        case math::NormKind::kOne: norm = tensor_norm<math::NormKind::kOne, T>(t, p); break;
        case math::NormKind::kTwo: norm = tensor_norm<math::NormKind::kTwo, T>(t, p); break;
        case math::NormKind::kInf: norm = tensor_norm<math::NormKind::kInf, T>(t, p); break;
        case math::NormKind::kP: norm = tensor_norm<math::NormKind::kP, T>(t, p); break;
      }
    });
    // An f32 norm is stored exactly in either dtype; an f64 norm only into an f64 output.
    if (any_f64) out.data<double>()[i] = norm;
    else out.data<float>()[i] = static_cast<float>(norm);
  }
  return out;
}

void foreach_mul_(std::span<const Tensor> tensors, const Tensor& factor) {
  const double f = factor.dtype() == DType::kF64 ? factor.item<double>() : factor.item<float>();
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "foreach_mul_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      const M m = static_cast<M>(f);
      for_each_element<T>(t, [&](T& v) {
        v = rescaled(v, static_cast<M>(v), m);
      });
    });
  }
}

void foreach_clamp_(std::span<const Tensor> tensors, double lo, double hi) {
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "foreach_clamp_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      const M l = static_cast<M>(lo), h = static_cast<M>(hi);
      for_each_element<T>(t, [&](T& v) { v = convert<T>(math::clamp(static_cast<M>(v), l, h)); });
    });
  }
}

}  // namespace mixtape::kernels::cpu
