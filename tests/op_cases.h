// tests/op_cases.h — every op's test cases in one registry.
//
// Each op test file registers cases with MT_OP_CASE; tests/test_op_registry.cpp
// runs every case through gradcheck (f64 central differences) and against a
// float64 reference in f32, f16 and bf16, and fails when an op of the
// library's registry has no case. A case states its low-precision tolerances
// next to itself when they differ from the table in tolerance.h, with the reason.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gradcheck.h"

namespace mixtape::test {

struct OpCase {
  std::string op;     // the registry name of the op under test
  std::string label;  // what this case covers ("broadcast", "strided input", ...)
  OpFn f;
  std::function<std::vector<Tensor>()> inputs;  // fresh inputs (any floating dtype; converted per check)
  GradcheckOptions gradcheck = {};
  /// Tolerances for the low-precision comparisons; unset: tolerance(dtype).
  std::optional<Tolerance> f32 = {}, f16 = {}, bf16 = {};
  bool low_precision = true;  // false: the op is not meaningful below f64 (say why at the case)
  bool needs_cuda = false;    // the op moves data to a CUDA device: skipped (with a message) without one
};

std::vector<OpCase>& op_cases();

struct RegisterOpCase {
  explicit RegisterOpCase(OpCase c) { op_cases().push_back(std::move(c)); }
};

}  // namespace mixtape::test

#define MT_OP_CASE_CAT2(a, b) a##b
#define MT_OP_CASE_CAT(a, b) MT_OP_CASE_CAT2(a, b)
/// Registers an OpCase: `MT_OP_CASE({.op = "relu", .label = "2-D", .f = ..., .inputs = ...});`
#define MT_OP_CASE(...) \
  static ::mixtape::test::RegisterOpCase MT_OP_CASE_CAT(mt_op_case_, __LINE__)(::mixtape::test::OpCase __VA_ARGS__)
