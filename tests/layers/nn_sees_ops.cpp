// tests/layers/nn_sees_ops.cpp — nn/ includes the ops: compiles.
#include <mixtape/ops/ops.h>
