// tests/layers/core_cannot_see_cuda.cpp — core/ includes the CUDA layer: must not compile (core finds device memory through a registry).
#include <mixtape/cuda/runtime.h>
