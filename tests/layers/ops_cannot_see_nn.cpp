// tests/layers/ops_cannot_see_nn.cpp — ops/ includes a module: must not compile.
#include <mixtape/nn/module.h>
