// ops/check.h — the argument checks of the ops' forwards: one helper, one wording (internal to ops/).
//
// User-facing validation happens once, at the top of the op the user called
// (STYLE.md §4: forward() checks, then calls kernels), so every message names
// that op and the user's shapes: "linear: expected a floating dtype ...", not
// the matmul it runs on. The kernels behind it (ops/backend/kernels.h) keep
// only the invariants that guard memory. Each check throws mixtape::Error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::ops::check {

/// `t` is a defined tensor; `arg` names it in the message.
void defined(const char* op, const Tensor& t, const char* arg);
/// `t` has a floating dtype (f64, f32, f16, bf16).
void floating(const char* op, const Tensor& t, const char* arg);
/// `t` has a dtype arithmetic is defined on: floating, or also i64/i32/u8 when `integers` (never bool).
void arithmetic(const char* op, const Tensor& t, bool integers);
/// Two tensors on one device.
void same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name);
/// Two tensors of one dtype (for ops outside the promote category, which do not convert their inputs).
void same_dtype(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name);
/// A scalar usable with a tensor of `t`'s dtype: any double for floating t, an int64 value for integer t.
void scalar_fits(const char* op, const Tensor& t, double s);
/// A scalar stored as a value of `t`'s dtype (where's scalar operand, clamp's bound on an integer tensor):
/// scalar_fits, and a value the dtype holds (fits, core/dtype.h), as PyTorch's checked conversion ("value cannot
/// be converted to type ... without overflow"): finite values up to the dtype's largest, infinities and NaN in a
/// floating dtype; a u8 also takes -255..-1, which wrap (-1 is 255). `what` names the scalar, `t_name` the tensor.
void scalar_converts(const char* op, const char* what, const Tensor& t, const char* t_name, double s);

/// The dims of a reduction of `x`: wrapped, unique, ascending; every dim when `dims` is empty (what
/// kernels::reduce takes). A 0-d tensor accepts dim 0 and -1 and has nothing to reduce.
std::vector<int64_t> reduce_dims(const char* op, const Tensor& x, std::span<const int64_t> dims);
/// A reduction without an identity (max, argmax) needs at least one element per output.
void nonempty_reduction(const char* op, const Tensor& x, std::span<const int64_t> dims);

/// "kernel 3x3, stride 1x1, padding 0x0, dilation 1x1".
std::string describe(const kernels::Window2d& w);
/// Positive kernel, stride and dilation, non-negative padding; and the (dilated) window fits the padded
/// (N, C, H, W) input at least once along both axes.
void window(const char* op, const Shape& input_shape, const kernels::Window2d& w);
/// PyTorch's pooling rule: padding at most half the (dilated) kernel, so every window holds an input element.
void pool_padding(const char* op, const kernels::Window2d& w);

/// A 0-D or 1-D kI64/kI32 index on `device` whose values lie in [0, size) for dim `dim` of `shape`. The values are
/// read only for CPU indices: reading a CUDA index would copy it to the host and synchronise every step, so the
/// CUDA kernels skip (or NaN) out-of-range entries instead.
void index(const char* op, const Tensor& index, Device device, int64_t dim, const Shape& shape);

}  // namespace mixtape::ops::check
