// tests/layers/ops_sees_autograd.cpp — ops/ includes the tape: compiles.
#include <mixtape/autograd/function.h>
