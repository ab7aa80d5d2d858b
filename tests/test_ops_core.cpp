// tests/test_ops_core.cpp — cases for the elementwise ops (ops/elementwise.cpp),
// the views (ops/views.cpp) and the casts (autograd/cast.cpp).
//
// Inputs stay away from kinks and poles: relu's 0, log/sqrt/div near 0.
#include <boost/test/unit_test.hpp>

#include "op_cases.h"

namespace mt = mixtape;
using In = std::vector<mt::Tensor>;

namespace {

/// Values in [lo, hi): away from the poles of log, sqrt, div.
mt::Tensor positive(const mt::Shape& shape, double lo = 0.5, double hi = 2.0) { return mt::uniform(shape, lo, hi); }

/// randn pushed away from 0 by at least 0.1 (relu's kink).
mt::Tensor away_from_zero(const mt::Shape& shape) {
  mt::Tensor x = mt::randn(shape, mt::kF64);
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v) e += e >= 0 ? 0.1 : -0.1;
  return mt::from_vector(v, shape, mt::kF32);
}

}  // namespace

// ---- binary, with broadcasting and strided inputs -----------------------------------------
MT_OP_CASE({.op = "add", .label = "broadcast [3,1,5] + [4,5]",
            .f = [](const In& in) { return in[0] + in[1]; },
            .inputs = [] { return In{mt::randn({3, 1, 5}), mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "add", .label = "transposed + strided",
            .f = [](const In& in) { return mt::add(in[0], in[1]); },
            .inputs = [] {
              return In{mt::test::non_contiguous(mt::randn({4, 3}), "transposed"),
                        mt::test::non_contiguous(mt::randn({4, 3}), "strided")};
            }});
MT_OP_CASE({.op = "sub", .label = "broadcast scalar tensor",
            .f = [](const In& in) { return in[0] - in[1]; },
            .inputs = [] { return In{mt::randn({2, 3}), mt::randn({})}; }});
MT_OP_CASE({.op = "mul", .label = "broadcast [2,1] * [1,3]",
            .f = [](const In& in) { return in[0] * in[1]; },
            .inputs = [] { return In{mt::randn({2, 1}), mt::randn({1, 3})}; }});
MT_OP_CASE({.op = "mul", .label = "same tensor twice",
            .f = [](const In& in) { return in[0] * in[0]; },
            .inputs = [] { return In{mt::randn({5})}; }});
MT_OP_CASE({.op = "div", .label = "broadcast [3,4] / [4]",
            .f = [](const In& in) { return in[0] / in[1]; },
            .inputs = [] { return In{mt::randn({3, 4}), positive({4})}; }});
MT_OP_CASE({.op = "div", .label = "strided denominator",
            .f = [](const In& in) { return mt::div(in[0], in[1]); },
            .inputs = [] { return In{mt::randn({2, 3}), mt::test::non_contiguous(positive({2, 3}), "strided")}; }});

// ---- with a scalar ------------------------------------------------------------------------
MT_OP_CASE({.op = "add_scalar", .label = "x + 0.5",
            .f = [](const In& in) { return in[0] + 0.5; },
            .inputs = [] { return In{mt::randn({3, 2})}; }});
MT_OP_CASE({.op = "add_scalar", .label = "1.5 - x",
            .f = [](const In& in) { return 1.5 - in[0]; },
            .inputs = [] { return In{mt::randn({3, 2})}; }});
MT_OP_CASE({.op = "mul_scalar", .label = "x * -2.5",
            .f = [](const In& in) { return in[0] * -2.5; },
            .inputs = [] { return In{mt::randn({7})}; }});
MT_OP_CASE({.op = "div_scalar", .label = "x / 3 (true division, not x * (1/3))",
            .f = [](const In& in) { return in[0] / 3.0; },
            .inputs = [] { return In{mt::randn({7})}; }});
MT_OP_CASE({.op = "pow", .label = "x^2.5 on positive x",
            .f = [](const In& in) { return mt::pow(in[0], 2.5); },
            .inputs = [] { return In{positive({3, 3})}; }});
MT_OP_CASE({.op = "pow", .label = "x^-1 and x^3",
            .f = [](const In& in) { return mt::pow(in[0], -1.0) + mt::pow(in[0], 3.0); },
            .inputs = [] { return In{positive({4})}; }});

// ---- unary --------------------------------------------------------------------------------
MT_OP_CASE({.op = "neg", .label = "strided",
            .f = [](const In& in) { return -in[0]; },
            .inputs = [] { return In{mt::test::non_contiguous(mt::randn({3, 4}), "strided")}; }});
MT_OP_CASE({.op = "exp", .label = "2-D",
            .f = [](const In& in) { return mt::exp(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; }});
MT_OP_CASE({.op = "log", .label = "positive inputs",
            .f = [](const In& in) { return mt::log(in[0]); },
            .inputs = [] { return In{positive({3, 4})}; }});
MT_OP_CASE({.op = "sqrt", .label = "positive inputs, transposed",
            .f = [](const In& in) { return mt::sqrt(in[0]); },
            .inputs = [] { return In{mt::test::non_contiguous(positive({3, 4}), "transposed")}; }});
MT_OP_CASE({.op = "relu", .label = "away from 0",
            .f = [](const In& in) { return mt::relu(in[0]); },
            .inputs = [] { return In{away_from_zero({4, 5})}; }});
MT_OP_CASE({.op = "gelu", .label = "exact (erf)",
            .f = [](const In& in) { return mt::gelu(in[0]); },
            .inputs = [] { return In{mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "gelu", .label = "tanh approximation",
            .f = [](const In& in) { return mt::gelu(in[0], "tanh"); },
            .inputs = [] { return In{mt::randn({4, 5})}; }});
MT_OP_CASE({.op = "sigmoid", .label = "2-D",
            .f = [](const In& in) { return mt::sigmoid(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; }});
// The backward reads the saved output y, rounded to f16/bf16 like PyTorch's:
// dx = dy·(1 − y²) is off by up to |dy|·2|y|·ulp(y)/2, which is large relative
// to a small 1 − y² (|x| > 2) but bounded absolutely: |dy| < 4 here.
MT_OP_CASE({.op = "tanh", .label = "2-D",
            .f = [](const In& in) { return mt::tanh(in[0]); },
            .inputs = [] { return In{mt::randn({3, 4})}; },
            .f16 = mt::test::Tolerance{1e-3, 2e-3},
            .bf16 = mt::test::Tolerance{1.6e-2, 1.6e-2}});

// ---- views ----------------------------------------------------------------------------------
MT_OP_CASE({.op = "reshape", .label = "view, reshape of a transposed input, flatten",
            .f = [](const In& in) { return in[0].view({6, 2}).t().reshape({3, 4}).flatten(); },
            .inputs = [] { return In{mt::randn({2, 3, 2})}; }});
MT_OP_CASE({.op = "reshape", .label = "squeeze/unsqueeze",
            .f = [](const In& in) { return in[0].unsqueeze(0).squeeze(2) * 2.0; },
            .inputs = [] { return In{mt::randn({3, 1, 2})}; }});
MT_OP_CASE({.op = "permute", .label = "3-D permute and transpose",
            .f = [](const In& in) { return mt::permute(in[0], {2, 0, 1}).transpose(0, 2); },
            .inputs = [] { return In{mt::randn({2, 3, 4})}; }});
MT_OP_CASE({.op = "slice", .label = "stepped slice, narrow",
            .f = [](const In& in) { return in[0].slice(1, 1, 6, 2) + in[0].narrow(1, 0, 3); },
            .inputs = [] { return In{mt::randn({2, 6})}; }});
MT_OP_CASE({.op = "select", .label = "negative index",
            .f = [](const In& in) { return in[0].select(0, -1) * in[0].select(1, 0); },
            .inputs = [] { return In{mt::randn({3, 3})}; }});
MT_OP_CASE({.op = "expand", .label = "[3,1] to [2,3,4]",
            .f = [](const In& in) { return in[0].expand({2, 3, 4}); },
            .inputs = [] { return In{mt::randn({3, 1})}; }});
MT_OP_CASE({.op = "clone", .label = "clone and contiguous of a transposed input",
            .f = [](const In& in) { return in[0].clone() * in[0].t().contiguous().t(); },
            .inputs = [] { return In{mt::randn({3, 2})}; }});

// ---- casts -------------------------------------------------------------------------------------
// The gradient of a cast is a cast back; central differences through an f32
// rounding need a step far above f32's resolution (eps 1e-2 on a linear map).
MT_OP_CASE({.op = "cast", .label = "to f32 and back",
            .f = [](const In& in) { return in[0].to(mt::kF32).to(mt::kF64) * 2.0; },
            .inputs = [] { return In{mt::randn({5})}; },
            .gradcheck = {.eps = 1e-2}});
MT_OP_CASE({.op = "to_device", .label = "to cuda:0 and back",
            .f = [](const In& in) { return in[0].to(mt::Device::cuda()).to(mt::Device::cpu()) * 2.0; },
            .inputs = [] { return In{mt::randn({5})}; },
            .needs_cuda = true});
