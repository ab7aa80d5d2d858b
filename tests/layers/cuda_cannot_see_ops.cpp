// tests/layers/cuda_cannot_see_ops.cpp — cuda/ includes an op: must not compile (it sees the backend interface of ops/ only).
#include <mixtape/ops/ops.h>
