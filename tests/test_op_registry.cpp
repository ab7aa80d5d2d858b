// tests/test_op_registry.cpp — walks the op registry: every op has a precision
// category, a backward (or is known not to be differentiable) and test cases,
// and every case passes gradcheck and the low-precision comparisons.
#include <boost/test/unit_test.hpp>

#include <set>

#include "op_cases.h"

namespace mt = mixtape;
namespace utf = boost::unit_test;
using mt::test::op_cases;

namespace mixtape::test {
std::vector<OpCase>& op_cases() {
  static std::vector<OpCase> cases;
  return cases;
}
}  // namespace mixtape::test

namespace {

/// Ops that have no gradient by nature (integer outputs).
const std::set<std::string> kNotDifferentiable = {"argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge"};

}  // namespace

BOOST_AUTO_TEST_SUITE(op_registry, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(every_op_is_complete) {
  std::set<std::string> with_cases;
  for (const auto& c : op_cases()) with_cases.insert(c.op);
  auto ops = mt::autograd::registered_ops();
  BOOST_TEST(ops.size() >= 30u);
  for (const auto& info : ops) {
    BOOST_TEST_CONTEXT("op " << info.name) {
      BOOST_TEST(info.precision != mt::Precision::kUnset, "op " << info.name << ": no precision category");
      if (kNotDifferentiable.count(info.name)) {
        BOOST_TEST(!info.differentiable, "listed as not differentiable but has a backward");
      } else {
        BOOST_TEST(info.differentiable, "op " << info.name << ": no backward");
        BOOST_TEST(with_cases.count(info.name) == 1u, "op " << info.name << ": no gradcheck case in tests/");
      }
    }
  }
  // A case for an op the library does not have is a typo.
  for (const auto& name : with_cases) BOOST_TEST(mt::autograd::find_op(name) >= 0, "case for unknown op " << name);
}

BOOST_AUTO_TEST_CASE(gradcheck_every_case) {
  for (const auto& c : op_cases()) {
    if (c.needs_cuda && !mt::cuda::is_available()) {
      BOOST_TEST_MESSAGE("skipping " << c.op << " [" << c.label << "]: no CUDA device");
      continue;
    }
    BOOST_TEST_CONTEXT(c.op << " [" << c.label << "]") {
      mt::manual_seed(17);
      BOOST_TEST(mt::test::gradcheck(c.op + " [" + c.label + "]", c.f, c.inputs(), c.gradcheck));
    }
  }
}

BOOST_AUTO_TEST_CASE(low_precision_against_f64) {
  for (const auto& c : op_cases()) {
    if (!c.low_precision || (c.needs_cuda && !mt::cuda::is_available())) continue;
    for (mt::DType dt : {mt::kF32, mt::kF16, mt::kBF16}) {
      BOOST_TEST_CONTEXT(c.op << " [" << c.label << "] in " << dt) {
        mt::manual_seed(23);
        const std::optional<mt::test::Tolerance>& over = dt == mt::kF32 ? c.f32 : dt == mt::kF16 ? c.f16 : c.bf16;
        mt::test::Tolerance tol = over ? *over : mt::test::tolerance(dt);
        BOOST_TEST(mt::test::check_against_f64(c.op + " [" + c.label + "]", c.f, c.inputs(), dt, tol));
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
