// tests/layers/cuda_sees_kernels.cpp — cuda/ includes the backend interface: compiles.
#include <mixtape/ops/backend/kernels.h>
