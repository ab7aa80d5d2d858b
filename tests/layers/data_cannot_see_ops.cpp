// tests/layers/data_cannot_see_ops.cpp — data/ includes an op: must not compile (a batch is a tensor; files know nothing of ops).
#include <mixtape/ops/ops.h>
