// tests/layers/autograd_cannot_see_cuda.cpp — autograd/ includes the CUDA layer: must not compile (the tape knows nothing of CUDA).
#include <mixtape/cuda/runtime.h>
