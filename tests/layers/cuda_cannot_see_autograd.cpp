// tests/layers/cuda_cannot_see_autograd.cpp — cuda/ includes the tape: must not compile.
#include <mixtape/autograd/autograd.h>
