// tests/tolerance.h — the one table of per-dtype tolerances every suite uses.
//
// Start from PyTorch's assert_close defaults; a test that needs more says so
// next to its override, with the reason.
#pragma once

#include <mixtape/core/dtype.h>

namespace mixtape::test {

struct Tolerance {
  double rtol;
  double atol;
};

constexpr Tolerance tolerance(DType t) {
  switch (t) {
    case DType::kF64: return {1e-7, 1e-7};
    case DType::kF32: return {1.3e-6, 1e-5};
    case DType::kF16: return {1e-3, 1e-5};
    case DType::kBF16: return {1.6e-2, 1e-5};
    default: return {0.0, 0.0};  // integers and bool compare exactly
  }
}

}  // namespace mixtape::test
