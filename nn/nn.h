// nn/nn.h — everything of nn/ in one include: Module (nn/module.h), the layers (nn/layers.h) and the
// initializers (nn/init.h).
//
//   #include <mixtape/nn/nn.h>
//   mt::nn::Sequential net{mt::nn::Linear(784, 512), mt::nn::ReLU(), mt::nn::Linear(512, 10)};
#pragma once

#include <mixtape/nn/init.h>
#include <mixtape/nn/layers.h>
#include <mixtape/nn/module.h>
