// ops/cpu/cpu_kernels.h — the CPU implementations behind ops/kernels.h (internal).
//
// ops/dispatch.cpp validates every argument (dtypes, devices, shapes, dims)
// and resolves defaults, then calls these; they assume valid CPU inputs and
// allocate their outputs (they overwrite, never accumulate). f16/bf16 are
// loaded, widened to f32, computed on and rounded once on the store. Kernels
// are below the tape: they view and copy through core's raw:: functions,
// never the recording Tensor methods.
#pragma once

#include <cstdint>
#include <span>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/kernels.h>

namespace mixtape::kernels::cpu {

/// y = op(x): same shape and dtype as x.
Tensor unary(UnaryOp op, const Tensor& x);
/// op(a, b) at the broadcast shape; a and b share a dtype. Comparisons give kBool.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
/// op(x, s): same shape and dtype as x; s is integral when x is an integer tensor.
Tensor scalar(ScalarOp op, const Tensor& x, double s);
/// cond ? a : b at the broadcast shape of the three; cond is kBool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Reduces x over `dims` (wrapped, sorted ascending, unique; every dim for a
/// full reduction), result in `out_dtype`. Empty max/min/arg* were rejected.
Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int64_t> dims, bool keepdim, DType out_dtype);
/// torch.matmul of floating a and b (same dtype, shapes already checked), result in `out_dtype`.
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype);
/// a (m, k) · b (k, n) + bias (n) in f32 (f64), rounded once to out_dtype.
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, DType out_dtype);

}  // namespace mixtape::kernels::cpu
