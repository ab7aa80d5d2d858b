// tests/layers/autograd_sees_core.cpp — autograd/ includes core/: compiles.
#include <mixtape/core/tensor.h>
