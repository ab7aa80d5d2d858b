// tests/layers/nn_cannot_see_optim.cpp — nn/ includes an optimizer: must not compile (modules know nothing of training).
#include <mixtape/optim/optimizer.h>
