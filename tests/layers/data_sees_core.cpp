// tests/layers/data_sees_core.cpp — data/ includes core: compiles.
#include <mixtape/core/tensor.h>
