// tests/gradcheck.h — gradients against float64 central differences, and
// low-precision results against a float64 reference of the same rounded inputs.
//
//   BOOST_TEST(gradcheck("gelu", [](auto& in) { return mt::gelu(in[0]); }, {mt::randn({3, 4})}));
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/mixtape.h>

#include "compare.h"
#include "tolerance.h"

namespace mixtape::test {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step (PyTorch's default)
  double atol = 1e-5;
  double rtol = 1e-3;
  /// Which inputs are differentiated (default: every floating input).
  std::vector<bool> wrt = {};
};

/// Converts floating `inputs` to f64 (keeping each one's strides: a transposed
/// input stays transposed), computes the analytic gradient of sum(f(x) · v)
/// for a fixed random v through the tape, and compares it with central
/// differences. Returns false (after BOOST_ERROR with op, shapes and the
/// first mismatches) when they differ.
bool gradcheck(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs,
               GradcheckOptions options = {});

/// Rounds floating `inputs` to `dtype`, runs `f` on them and on their exact
/// f64 copies, and checks the output (and, with `check_backward`, the
/// gradients of sum(f · v)) against the f64 result within `tol`.
bool check_against_f64(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs, DType dtype,
                       Tolerance tol, bool check_backward = true);

/// A copy of `t` with the same values laid out with `layout` applied to a
/// contiguous tensor (for testing non-contiguous inputs): "transposed" (last
/// two dims swapped in memory), "strided" (every other element of a twice-as-large buffer).
Tensor non_contiguous(const Tensor& t, const std::string& layout);

}  // namespace mixtape::test
