// mixtape.h — the one header users include: `#include <mixtape/mixtape.h>`.
//
//   namespace mt = mixtape;
//   mt::Tensor x = mt::randn({128, 784});
//   mt::Tensor w = mt::randn({784, 512}, mt::kF16);
#pragma once

#include <mixtape/core/device.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/error.h>
#include <mixtape/core/half.h>
#include <mixtape/core/random.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/runtime.h>
