// tests/layers/data_cannot_see_autograd.cpp — data/ includes the tape: must not compile.
#include <mixtape/autograd/autograd.h>
