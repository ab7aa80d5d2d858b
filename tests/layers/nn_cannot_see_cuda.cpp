// tests/layers/nn_cannot_see_cuda.cpp — nn/ includes the CUDA layer: must not compile (modules reach devices through the ops).
#include <mixtape/cuda/stream.h>
