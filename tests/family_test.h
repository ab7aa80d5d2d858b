// tests/family_test.h — what every op family's test file (tests/test_<family>.cpp) starts from: the helpers
// (compare.h, reference.h, kernel_calls.h, op_cases.h, gpu_rows.h, gpu_windows.h, test_util.h, tolerance.h) and
// the short names the files use for them, so that a family file holds its cases and nothing else. Only the
// test_ops executable's family files include it (each is its own translation unit).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/autograd/precision.h>
#include <mixtape/core/random.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/tensor.h>
#include <mixtape/mixtape.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include "compare.h"
#include "gpu_rows.h"
#include "gpu_windows.h"
#include "kernel_calls.h"
#include "op_cases.h"
#include "reference.h"
#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace kn = mixtape::kernels;
namespace tt = boost::test_tools;

using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;
using In = std::vector<Tensor>;

using mt::test::chained;
using mt::test::describe;
using mt::test::expect_close;
using mt::test::expect_error;
using mt::test::expect_same_bits;
using mt::test::expect_shape;
using mt::test::expect_values;
using mt::test::gpu;
using mt::test::input;
using mt::test::kExact;
using mt::test::kFloatTypes;
using mt::test::kGpuFloatTypes;
using mt::test::kGpuSizes;
using mt::test::kRowLengths;
using mt::test::label;
using mt::test::Layout;
using mt::test::layout_name;
using mt::test::Leaf;
using mt::test::non_contiguous;
using mt::test::order_allowance;
using mt::test::PoisonAllocations;
using mt::test::pooled;
using mt::test::random;
using mt::test::randn_as;
using mt::test::randn_seeded;
using mt::test::relative_error;
using mt::test::round_to;
using mt::test::same_view_on_gpu;
using mt::test::special_rows;
using mt::test::Tolerance;
using mt::test::tolerance;
using mt::test::transposed_23;
using mt::test::values;
using mt::test::window;
using mt::test::WindowCase;
using mt::test::with_allowance;
