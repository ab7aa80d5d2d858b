// ops/cpu/foreach.cpp — the multi-tensor kernels on the CPU: one pass over a list of tensors.
//
// For the optimizers and the loss scaler (optim/): one call handles every
// tensor of a list, so a step over a model is one pass over its memory
// rather than a chain of elementwise kernels per parameter. Each tensor is
// walked with the strided loops of core/strided_loop.h, updated in place.
#include <mixtape/ops/backend/kernels.h>

#include <array>
#include <cmath>

#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

void non_finite_check_and_unscale_(std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale) {
  const float inv = raw::to(inv_scale, Device::cpu()).item<float>();
  bool any_non_finite = false;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    dispatch_floating(t.dtype(), "non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      const M scale = static_cast<M>(inv);
      const auto L = make_strided_layout<1>(t.shape(), {&t.strides()}, {static_cast<int64_t>(sizeof(T))});
      bool non_finite = false;
      auto run = [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          T& v = *reinterpret_cast<T*>(p[0] + i * s[0]);
          const M m = static_cast<M>(v);
          non_finite |= !std::isfinite(m);
          v = convert<T>(m * scale);
        }
      };
      for_each_run<1>(L, {static_cast<char*>(t.data_ptr())}, 0, L.numel, run);
      any_non_finite |= non_finite;
    });
  }
  if (any_non_finite) raw::fill_(found_inf, 1.0);
}

}  // namespace mixtape::kernels::cpu
