// tests/layers/optim_sees_kernels.cpp — optim/ includes the backend interface (its fused update kernels): compiles.
#include <mixtape/ops/backend/kernels.h>
