// tests/test_views.cpp — the views family (ops/views.cpp): reshape/view, permute/transpose, slice, select,
// expand, clone/contiguous, and the casts' op cases (cast and to_device, autograd/cast.cpp).
//
// Only registry cases here: tests/test_op_registry.cpp runs each through gradcheck (f64 central differences) and
// against f64 in f32, f16 and bf16, tests/test_parity.cpp on CUDA against the CPU. Views have no kernels of their
// own (core's strided views and copies; their misuse errors are tests/test_errors.cpp's and
// tests/test_tensor.cpp's).
#include <vector>

#include <mixtape/mixtape.h>

#include "op_cases.h"

namespace mt = mixtape;
using In = std::vector<mt::Tensor>;

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
