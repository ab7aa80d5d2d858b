// tests/kernel_calls.h — the kernel entry points with the arguments the ops would resolve, for tests that call
// kernels directly.
//
// Kernels take resolved arguments (ops/backend/kernels.h): wrapped, sorted dims, every dim for a full reduction,
// an explicit result dtype. These helpers resolve them the way the ops do (ops/check.h), so a test reads
// `reduce(kSum, x, {}, false)` for a full sum.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/check.h>

namespace mixtape::test {

/// kernels::reduce over `dims` (any order, negative allowed; empty: every dim) with the ops' result dtype unless
/// `out_dtype` is given: i64 for argmax/argmin and for sums of integers and bool, x's dtype otherwise.
inline Tensor reduce(kernels::ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim,
                     std::optional<DType> out_dtype = std::nullopt) {
  const std::vector<int64_t> resolved = ops::check::reduce_dims(kernels::name(op), x, dims);
  DType out = x.dtype();
  if (op == kernels::ReduceOp::kArgmax || op == kernels::ReduceOp::kArgmin) out = DType::kI64;
  if (op == kernels::ReduceOp::kSum && !is_floating(x.dtype())) out = DType::kI64;
  return kernels::reduce(op, x, resolved, keepdim, out_dtype.value_or(out));
}
inline Tensor reduce(kernels::ReduceOp op, const Tensor& x, std::initializer_list<int64_t> dims, bool keepdim,
                     std::optional<DType> out_dtype = std::nullopt) {
  return reduce(op, x, std::span<const int64_t>(dims.begin(), dims.size()), keepdim, out_dtype);
}

/// kernels::matmul in the operands' dtype unless `out_dtype` is given.
inline Tensor matmul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt) {
  return kernels::matmul(a, b, out_dtype.value_or(a.dtype()));
}

/// kernels::addmm in the operands' dtype unless `out_dtype` is given.
inline Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt) {
  return kernels::addmm(bias, a, b, out_dtype.value_or(a.dtype()));
}

/// kernels::softmax in x's dtype unless `out_dtype` is given.
inline Tensor softmax(const Tensor& x, int64_t dim, bool log, std::optional<DType> out_dtype = std::nullopt) {
  return kernels::softmax(x, dim < 0 ? dim + x.dim() : dim, log, out_dtype.value_or(x.dtype()));
}

}  // namespace mixtape::test
