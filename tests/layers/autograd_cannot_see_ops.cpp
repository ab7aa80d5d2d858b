// tests/layers/autograd_cannot_see_ops.cpp — autograd/ includes an op: must not compile (the tape reaches ops through autograd/hooks.h).
#include <mixtape/ops/ops.h>
