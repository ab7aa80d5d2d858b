// mixtape.h — the one header users include: `#include <mixtape/mixtape.h>`.
//
//   namespace mt = mixtape;
//   mt::Tensor x = mt::randn({128, 784});
//   mt::Tensor w = mt::randn({784, 512}).requires_grad_();
//   mt::Tensor loss = mt::sum(mt::relu(mt::matmul(x, w)));
//   loss.backward();
#pragma once

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/cast.h>
#include <mixtape/autograd/precision.h>
#include <mixtape/autograd/registry.h>
#include <mixtape/core/cpu_capability.h>
#include <mixtape/core/device.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/error.h>
#include <mixtape/core/half.h>
#include <mixtape/core/random.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/graph.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/data/data.h>
#include <mixtape/nn/nn.h>
#include <mixtape/ops/ops.h>
#include <mixtape/optim/optim.h>
