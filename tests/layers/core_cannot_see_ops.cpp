// tests/layers/core_cannot_see_ops.cpp — core/ includes an op: must not compile.
#include <mixtape/ops/ops.h>
