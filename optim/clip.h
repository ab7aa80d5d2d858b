// optim/clip.h — gradient clipping: PyTorch's torch.nn.utils.clip_grad_norm_ and clip_grad_value_, under the same
// names in mixtape::optim and, through the using-declarations at the bottom, in mixtape::nn::utils (PyTorch's
// namespace for them).
//
// The one design idea: nothing is read back to the host. The total norm is a 0-d tensor on the gradients' device,
// computed by multi-tensor kernels (each gradient's norm summed in f32 whatever its dtype, f64 for f64, then the
// norm of those norms), and the clip coefficient min(max_norm / (total + 1e-6), 1) is applied to every gradient
// in one multi-tensor pass that reads it on the device (PyTorch's foreach path: multiplying by a coefficient of 1
// costs less than the synchronisation an `if` would need). Only error_if_nonfinite reads the norm on the host.
//
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);                                               // clip the true gradients
//   mt::Tensor norm = mt::nn::utils::clip_grad_norm_(net.parameters(), 1.0);
//   scaler.step(opt);
#pragma once

#include <vector>

#include <mixtape/core/tensor.h>

namespace mixtape::optim {

/// Scales the gradients of `parameters` in place so that their total norm of order `norm_type` (over all of them,
/// as one vector) is at most `max_norm`: each is multiplied by min(max_norm / (total + 1e-6), 1). norm_type is any
/// p > 0 or +inf (max |g|); max_norm >= 0. Parameters without a gradient are skipped. Returns the total norm before
/// clipping: a 0-d tensor on the first gradient's device, f32 (f64 when a gradient is f64); an f32 0 on the CPU
/// when no parameter has a gradient. `error_if_nonfinite`: a non-finite total norm is an error (one host read)
/// instead of gradients multiplied by NaN. Gradients on several devices are allowed (their norms meet on the first
/// device).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

/// Clamps every gradient of `parameters` to [-clip_value, clip_value] in place (NaN stays NaN); clip_value >= 0.
/// Parameters without a gradient are skipped.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace mixtape::optim

namespace mixtape::nn::utils {
using optim::clip_grad_norm_;
using optim::clip_grad_value_;
}  // namespace mixtape::nn::utils
