// tests/layers/cuda_cannot_see_checks.cpp — cuda/ includes the ops' argument checks: must not compile.
#include <mixtape/ops/check.h>
