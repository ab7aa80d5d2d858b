// tests/layers/core_cannot_see_autograd.cpp — core/ includes the tape: must not compile (DESIGN.md: core knows nothing of the tape).
#include <mixtape/autograd/autograd.h>
