// tests/layers/autograd_cannot_see_kernels.cpp — autograd/ includes the backend interface: must not compile.
#include <mixtape/ops/backend/kernels.h>
