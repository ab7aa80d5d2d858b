// ops/tape_hooks.cpp — the op layer's side of autograd/hooks.h: the kernels the tape calls, installed at load.
#include <mixtape/autograd/hooks.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/common.h>

namespace mixtape::ops {

namespace {

/// slot + g: into slot in place when the tape owns it and its memory is dense (each element its own), else new.
Tensor accumulate(const Tensor& slot, const Tensor& g, bool in_place) {
  if (in_place && slot.is_contiguous() && g.storage() != slot.storage()) {
    kernels::binary_(kernels::BinaryOp::kAdd, slot, g);
    return slot;
  }
  return kernels::binary(kernels::BinaryOp::kAdd, slot, g);
}

double max_abs(const Tensor& t) {
  return reduce_all(kernels::ReduceOp::kMax, kernels::unary(kernels::UnaryOp::kAbs, t), t.dtype()).item<double>();
}

[[maybe_unused]] const bool installed =
    (autograd::install_op_hooks({.accumulate = &accumulate, .max_abs = &max_abs,
                                 .take_noted_kernel = &kernels::take_noted_kernel}),
     true);

}  // namespace

}  // namespace mixtape::ops
