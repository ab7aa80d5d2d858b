// optim/clip.cpp — clip_grad_norm_ and clip_grad_value_ (optim/clip.h) on the multi-tensor kernels of
// ops/backend/kernels.h (foreach_norm, foreach_mul_, foreach_clamp_), one call per device.
//
// The total norm is PyTorch's: the norm of the vector of per-gradient norms (equal to the norm of all gradients
// concatenated, for every p). Its dtype is f32 unless a gradient is f64, so f16/bf16 gradients are never summed
// (nor their norms stored) in their own dtype: f16 gradients of 300 have squares of 9·10^4, beyond f16's 65504.
#include <mixtape/optim/clip.h>

#include <cmath>
#include <utility>

#include <mixtape/autograd/autograd.h>
#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

namespace mixtape::optim {

namespace {

/// The gradients of `parameters` (those that have one), by device in order of first appearance.
std::vector<std::pair<Device, std::vector<Tensor>>> grads_by_device(const char* who,
                                                                    const std::vector<Tensor>& parameters) {
  std::vector<std::pair<Device, std::vector<Tensor>>> out;
  for (size_t i = 0; i < parameters.size(); ++i) {
    MT_CHECK(parameters[i].defined(), who, ": parameter ", i, " is an undefined tensor");
    const Tensor& g = parameters[i].grad();
    if (!g.defined()) continue;
    auto it = out.begin();
    while (it != out.end() && it->first != g.device()) ++it;
    if (it == out.end()) it = out.insert(it, {g.device(), {}});
    it->second.push_back(g);
  }
  return out;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  MT_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0 (got ", max_norm, ")");
  MT_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 or inf (got ", norm_type, ")");
  const auto groups = grads_by_device("clip_grad_norm_", parameters);
  if (groups.empty()) return scalar_tensor(0.0);
  autograd::NoGradGuard no_grad;

  bool any_f64 = false;
  for (const auto& [device, grads] : groups)
    for (const Tensor& g : grads) any_f64 |= g.dtype() == DType::kF64;
  const DType dtype = any_f64 ? DType::kF64 : DType::kF32;
  const Device first = groups.front().first;

  // Per device: each gradient's norm, then the norm of those; the devices' norms meet on the first device.
  std::vector<Tensor> device_norms;
  for (const auto& [device, grads] : groups) {
    const Tensor norms = kernels::foreach_norm(grads, norm_type);
    device_norms.push_back(raw::to(kernels::foreach_norm({&norms, 1}, norm_type), first, dtype));
  }
  Tensor total = device_norms.size() == 1 ? device_norms.front() : cat(device_norms, 0);
  if (device_norms.size() > 1) total = kernels::foreach_norm({&total, 1}, norm_type);
  total = raw::reshape(total, Shape{});

  if (error_if_nonfinite) {
    const double value = total.item<double>();  // the one host read, only when asked for
    MT_CHECK(std::isfinite(value), "clip_grad_norm_: the total norm of order ", norm_type, " of the gradients is ",
             value, ", so they cannot be clipped; pass error_if_nonfinite = false to scale them by it anyway");
  }

  // min(max_norm / (total + 1e-6), 1), on the device; a NaN total gives a NaN coefficient (as PyTorch's clamp).
  const Tensor denom = kernels::scalar(kernels::ScalarOp::kAdd, total, 1e-6);
  const Tensor coef = kernels::scalar(kernels::ScalarOp::kMinimum,
                                      kernels::scalar(kernels::ScalarOp::kRdiv, denom, max_norm), 1.0);
  for (const auto& [device, grads] : groups)
    kernels::foreach_mul_(grads, device == first ? coef : raw::to(coef, device));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  MT_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be >= 0 (got ", clip_value, ")");
  autograd::NoGradGuard no_grad;
  for (const auto& [device, grads] : grads_by_device("clip_grad_value_", parameters))
    kernels::foreach_clamp_(grads, -clip_value, clip_value);
}

}  // namespace mixtape::optim
