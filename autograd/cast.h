// autograd/cast.h — the differentiable dtype cast, the op autocast inserts.
//
// Its gradient is a cast back to the source dtype (tinygrad's rule): that one
// line is the whole story of an f32 master weight used in f16 — the gradient
// arrives at the weight in f32.
#pragma once

#include <mixtape/core/tensor.h>

namespace mixtape {

/// `x` converted to `dtype` with one rounding; recorded as op "cast". Returns `x` itself when already `dtype`.
Tensor cast(const Tensor& x, DType dtype);

}  // namespace mixtape
