// autograd/registry.h — the table of every op: name, precision category,
// whether it has a backward.
//
// Each op file registers its ops at load time (MT_REGISTER_OP), so the table
// lists every op of the library before any has run; tests walk it to find an
// op that lacks a category, a backward or a gradient check, and autocast
// reads categories (with overrides) from it by the op's id.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <mixtape/autograd/precision.h>

namespace mixtape::autograd {

struct OpInfo {
  std::string name;
  Precision precision;  // as declared by the op
  bool differentiable;  // has a backward
};

/// Adds an op (or finds it, when already there) and returns its id; a second
/// registration of the same name with different facts throws.
int register_op_info(const char* name, Precision precision, bool differentiable);

template <class Op>
concept HasBackward = requires { &Op::backward; };

template <class Op>
int register_op() {
  return register_op_info(Op::kName, Op::kPrecision, HasBackward<Op>);
}

/// Every registered op, in registration order.
std::vector<OpInfo> registered_ops();
/// The id of `name`, or -1.
int find_op(std::string_view name);

/// The category op `id` runs with now: a scoped override on this thread, else a global one, else `declared`.
Precision effective_precision(int id, Precision declared);

}  // namespace mixtape::autograd

/// Registers `Op` when the library loads: `MT_REGISTER_OP(Gelu);` in the op's .cpp.
#define MT_REGISTER_OP(Op) \
  [[maybe_unused]] static const int mt_registered_##Op = ::mixtape::autograd::register_op<Op>()
