// tests/layers/ops_cannot_see_cuda.cpp — ops/ includes the CUDA layer: must not compile (the CUDA backend registers itself).
#include <mixtape/cuda/runtime.h>
