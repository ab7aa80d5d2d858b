// tests/layers/optim_cannot_see_cuda.cpp — optim/ includes the CUDA layer: must not compile.
#include <mixtape/cuda/stream.h>
