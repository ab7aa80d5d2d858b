// autograd/hooks.h — what the tape needs of the op layer, which it may not include (internal).
//
// autograd sits below ops/ (DESIGN.md: ops include autograd, never the
// reverse), yet the backward walk adds gradients, anomaly mode looks for
// non-finite values and the precision trace names the kernel that ran. The op
// layer installs these three functions when the library loads
// (ops/tape_hooks.cpp); the tape calls them and knows nothing else of kernels.
#pragma once

#include <mixtape/core/tensor.h>

namespace mixtape::autograd {

struct OpHooks {
  /// slot + g (one dtype, shape and device). `in_place`: slot belongs to the tape alone and may be overwritten
  /// (returned as it is); otherwise the sum is a new tensor.
  Tensor (*accumulate)(const Tensor& slot, const Tensor& g, bool in_place) = nullptr;
  /// max |t| of a non-empty floating tensor, as a double; NaN when an element is NaN.
  double (*max_abs)(const Tensor& t) = nullptr;
  /// The kernel name a backend noted for the op that just ran, or nullptr; clears it.
  const char* (*take_noted_kernel)() noexcept = nullptr;
};

/// Installs the op layer's hooks (once, when the library loads).
void install_op_hooks(const OpHooks& hooks) noexcept;
/// The installed hooks; throws mixtape::Error when the op layer never installed them.
const OpHooks& op_hooks();

}  // namespace mixtape::autograd
