// tests/layers/optim_cannot_see_nn.cpp — optim/ includes a module: must not compile (an optimizer takes tensors).
#include <mixtape/nn/module.h>
