// ops/backend/kernels.cpp — the kernel entry points, the backend registry and the CPU's table.
//
// Every entry point is generated from MT_BACKEND_KERNELS (kernels.h): it finds
// the device of its tensor arguments (all must share it), checks the kernel's
// dtype invariant and calls that device's kernel. A failed check is a bug in
// the op that called the kernel (ops/<family>.cpp validates user arguments
// first), so its message lists every argument the kernel got.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/ops/backend/scalar_math.h>

namespace mixtape::kernels {

// ---- names -------------------------------------------------------------------------------

const char* name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "neg";
    case UnaryOp::kAbs: return "abs";
    case UnaryOp::kSign: return "sign";
    case UnaryOp::kSquare: return "square";
    case UnaryOp::kReciprocal: return "reciprocal";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kRsqrt: return "rsqrt";
    case UnaryOp::kRelu: return "relu";
    case UnaryOp::kGelu: return "gelu";
    case UnaryOp::kGeluTanh: return "gelu_tanh";
    case UnaryOp::kSigmoid: return "sigmoid";
    case UnaryOp::kTanh: return "tanh";
  }
  return "?";
}

const char* name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
    case BinaryOp::kMaximum: return "maximum";
    case BinaryOp::kMinimum: return "minimum";
    case BinaryOp::kPow: return "pow";
    case BinaryOp::kReluBackward: return "relu_backward";
    case BinaryOp::kGeluBackward: return "gelu_backward";
    case BinaryOp::kGeluTanhBackward: return "gelu_tanh_backward";
    case BinaryOp::kSigmoidBackward: return "sigmoid_backward";
    case BinaryOp::kTanhBackward: return "tanh_backward";
    case BinaryOp::kEq: return "eq";
    case BinaryOp::kNe: return "ne";
    case BinaryOp::kLt: return "lt";
    case BinaryOp::kLe: return "le";
    case BinaryOp::kGt: return "gt";
    case BinaryOp::kGe: return "ge";
  }
  return "?";
}

const char* name(ScalarOp op) {
  switch (op) {
    case ScalarOp::kAdd: return "add_scalar";
    case ScalarOp::kMul: return "mul_scalar";
    case ScalarOp::kPow: return "pow_scalar";
    case ScalarOp::kRsub: return "rsub_scalar";
    case ScalarOp::kRdiv: return "rdiv_scalar";
    case ScalarOp::kDiv: return "div_scalar";
    case ScalarOp::kMaximum: return "maximum_scalar";
    case ScalarOp::kMinimum: return "minimum_scalar";
  }
  return "?";
}

const char* name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kArgmax: return "argmax";
    case ReduceOp::kArgmin: return "argmin";
  }
  return "?";
}

namespace {

// ---- the dtype invariants the list names -----------------------------------------------------------

bool arithmetic_integer(DType t) { return !is_floating(t) && t != DType::kBool; }

bool unary_dtype_ok(UnaryOp op, const Tensor& x) {
  return is_floating(x.dtype()) || (math::supports_integers(op) && arithmetic_integer(x.dtype()));
}

bool binary_dtype_ok(BinaryOp op, const Tensor& a) {
  return math::is_comparison(op) || is_floating(a.dtype()) ||
         (math::supports_integers(op) && arithmetic_integer(a.dtype()));
}

bool scalar_dtype_ok(ScalarOp op, const Tensor& x, double s) {
  if (is_floating(x.dtype())) return true;
  // 2^63: the first double outside int64's range.
  return math::supports_integers(op) && arithmetic_integer(x.dtype()) && std::isfinite(s) && s == std::trunc(s) &&
         std::fabs(s) < 9223372036854775808.0;
}

/// Every element of `t` has its own memory: no expanded (stride 0) dim of size > 1.
bool writable(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) return false;
  return true;
}

bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

/// a = op(a, b): an arithmetic op, a writable, b broadcasting to a's shape and either a itself or apart from it.
bool in_place_operands(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (math::is_comparison(op) || !writable(a) || b.dim() > a.dim()) return false;
  for (int64_t i = 1; i <= b.dim(); ++i)
    if (b.size(-i) != 1 && b.size(-i) != a.size(-i)) return false;
  return b.storage() != a.storage() || same_view(a, b);
}

bool reduce_dtypes_ok(ReduceOp op, const Tensor& x, DType out) {
  const DType in = x.dtype();
  switch (op) {
    case ReduceOp::kSum: return out != DType::kBool && (is_floating(out) || !is_floating(in));
    case ReduceOp::kMean: return is_floating(in) && is_floating(out);
    case ReduceOp::kMax:
    case ReduceOp::kMin: return out == in;
    case ReduceOp::kArgmax:
    case ReduceOp::kArgmin: return out == DType::kI64;
  }
  return false;
}

bool floating_or_undefined(const Tensor& t) { return !t.defined() || is_floating(t.dtype()); }

/// `dim` names an axis of a tensor of `rank` dims (axis 0 of a 0-d one): softmax and the index kernels view their
/// tensors around it, and a negative or too large one read and wrote outside them (a test passing -1 to index_select
/// corrupted the heap and hung).
bool dim_of(int64_t dim, int64_t rank) { return dim >= 0 && dim < std::max<int64_t>(rank, 1); }

bool cross_entropy_backward_dtypes_ok(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                      const Tensor& row_scale, const Tensor& divisor) {
  const DType acc = acc_dtype(logits.dtype());
  return is_floating(logits.dtype()) && target.dtype() == DType::kI64 && lse.dtype() == acc &&
         (row_scale.dtype() == acc || row_scale.dtype() == logits.dtype()) &&
         (!divisor.defined() || divisor.dtype() == acc);
}

bool foreach_unscale_ok(std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale) {
  const auto per_tensor = static_cast<int64_t>(tensors.size()) + 1;
  if (found_inf.dtype() != DType::kF32 || (found_inf.numel() != 1 && found_inf.numel() != per_tensor) ||
      !found_inf.is_contiguous() || inv_scale.dtype() != DType::kF32 || inv_scale.numel() != 1)
    return false;
  for (const Tensor& t : tensors)
    if (!t.defined() || !is_floating(t.dtype()) || !writable(t)) return false;
  return true;
}

/// Every tensor of the list defined, floating and owning its elements (a multi-tensor kernel writes each).
bool foreach_writable(std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors)
    if (!t.defined() || !is_floating(t.dtype()) || !writable(t)) return false;
  return true;
}

bool is_f32_scalar(const Tensor& t) { return t.dtype() == DType::kF32 && t.numel() == 1; }

/// The loss scaler's state: one f32 scale, one i32 tracker, one f32 flag; an interval an i32 tracker can reach.
bool amp_update_scale_ok(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                         int64_t growth_interval) {
  return is_f32_scalar(scale) && growth_tracker.dtype() == DType::kI32 && growth_tracker.numel() == 1 &&
         is_f32_scalar(found_inf) && growth_interval >= 1 && growth_interval <= INT32_MAX;
}

/// A non-empty list of defined floating tensors (read only), and an order the kernel has a formula for.
bool foreach_norm_ok(std::span<const Tensor> tensors, double ord) {
  if (tensors.empty() || !(ord > 0)) return false;
  for (const Tensor& t : tensors)
    if (!t.defined() || !is_floating(t.dtype())) return false;
  return true;
}

bool foreach_mul_ok(std::span<const Tensor> tensors, const Tensor& factor) {
  return (factor.dtype() == DType::kF32 || factor.dtype() == DType::kF64) && factor.numel() == 1 &&
         foreach_writable(tensors);
}

/// The lists of an optimizer step (sgd_step_, adam_step_): params and grads one per parameter, each state list one
/// per parameter when `present`, else none, masters none or one per parameter, steps one per parameter; every
/// entry defined and of its parameter's shape; params, state and masters writable; grads of the parameter's dtype;
/// masters f32 for f16/bf16 parameters; state f32 when the parameter has a master or is bf16 under stochastic
/// rounding (no masters then, no f16 parameter), else of the parameter's dtype.
struct OptimState {
  std::span<const Tensor> tensors;
  bool present;  // one per parameter when true, none when false
};

bool optim_step_ok(std::span<const Tensor> params, std::span<const Tensor> grads,
                   std::initializer_list<OptimState> state, std::span<const Tensor> masters,
                   std::span<const OptimStep> steps, bool stochastic_rounding) {
  const size_t n = params.size();
  if (grads.size() != n || steps.size() != n || (!masters.empty() && masters.size() != n)) return false;
  if (stochastic_rounding && !masters.empty()) return false;
  for (const OptimState& s : state)
    if (s.tensors.size() != (s.present ? n : 0)) return false;
  auto shaped = [](const Tensor& t, const Tensor& p) { return t.defined() && t.shape() == p.shape(); };
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params[i];
    if (!p.defined() || !is_floating(p.dtype()) || !writable(p) || (steps[i].count == nullptr && steps[i].step < 1))
      return false;
    if (!shaped(grads[i], p) || grads[i].dtype() != p.dtype()) return false;
    const bool master = !masters.empty();
    if (master && (!is_reduced_float(p.dtype()) || !shaped(masters[i], p) || masters[i].dtype() != DType::kF32 ||
                   !writable(masters[i])))
      return false;
    if (stochastic_rounding && p.dtype() == DType::kF16) return false;
    const bool f32_state = master || (stochastic_rounding && p.dtype() == DType::kBF16);
    const DType state_dtype = f32_state ? DType::kF32 : p.dtype();
    for (const OptimState& s : state)
      if (s.present && (!shaped(s.tensors[i], p) || s.tensors[i].dtype() != state_dtype || !writable(s.tensors[i])))
        return false;
  }
  return true;
}

bool sgd_step_ok(std::span<const Tensor> params, std::span<const Tensor> grads,
                 std::span<const Tensor> momentum_buffers, std::span<const Tensor> masters,
                 std::span<const OptimStep> steps, const SgdHyper& hyper) {
  return optim_step_ok(params, grads, {{momentum_buffers, hyper.momentum != 0}}, masters, steps,
                       hyper.stochastic_rounding);
}

bool adam_step_ok(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avgs,
                  std::span<const Tensor> exp_avg_sqs, std::span<const Tensor> max_exp_avg_sqs,
                  std::span<const Tensor> masters, std::span<const OptimStep> steps, const AdamHyper& hyper) {
  return optim_step_ok(params, grads, {{exp_avgs, true}, {exp_avg_sqs, true}, {max_exp_avg_sqs, hyper.amsgrad}},
                       masters, steps, hyper.stochastic_rounding);
}

/// A step's skip flag: absent, or one f32 element.
bool found_inf_ok(const Tensor& found_inf) { return !found_inf.defined() || is_f32_scalar(found_inf); }

/// Update counters: one writable i32 element each.
bool count_steps_ok(std::span<const Tensor> counts) {
  return std::all_of(counts.begin(), counts.end(), [](const Tensor& c) {
    return c.defined() && c.dtype() == DType::kI32 && c.numel() == 1 && writable(c);
  });
}

/// The statistics kernels walk flat memory: x contiguous and floating, a multiplier (when given) one f32 element.
bool numerics_stats_ok(const Tensor& x, const Tensor& multiplier) {
  return is_floating(x.dtype()) && x.is_contiguous() && (!multiplier.defined() || is_f32_scalar(multiplier));
}

/// Two contiguous tensors of one shape and floating dtype, and a model dtype lost_updates has a spacing for.
bool lost_updates_ok(const Tensor& before, const Tensor& after, DType model_dtype) {
  return is_floating(before.dtype()) && after.dtype() == before.dtype() && after.shape() == before.shape() &&
         before.is_contiguous() && after.is_contiguous() &&
         (model_dtype == DType::kF16 || model_dtype == DType::kBF16 || model_dtype == DType::kF32);
}

// ---- finding the device, describing the arguments -----------------------------------------------

/// Folds the device of each tensor (and each Device argument) into `device`; `mixed` when two differ.
struct DeviceOf {
  std::optional<Device> device;
  bool mixed = false;
  void add(Device d) {
    if (!device) device = d;
    else if (*device != d) mixed = true;
  }
  void operator()(const Tensor& t) {
    if (t.defined()) add(t.device());
  }
  void operator()(std::span<const Tensor> ts) {
    for (const Tensor& t : ts) (*this)(t);
  }
  void operator()(Device d) { add(d); }
  template <class A>
  void operator()(const A&) {}
};

void describe(std::ostream& os, const Tensor& t) {
  if (!t.defined()) {
    os << "undefined";
    return;
  }
  os << t.dtype() << ' ' << t.shape() << " on " << t.device();
}
void describe(std::ostream& os, std::span<const Tensor> ts) {
  os << ts.size() << " tensors";
  for (size_t i = 0; i < ts.size() && i < 4; ++i) {
    os << (i ? ", " : " (");
    describe(os, ts[i]);
  }
  if (!ts.empty()) os << (ts.size() > 4 ? ", ...)" : ")");
}
void describe(std::ostream& os, Device d) { os << d; }
void describe(std::ostream& os, const Shape& s) { os << s; }
template <class A>
void describe(std::ostream& os, const A& a) {
  if constexpr (std::is_arithmetic_v<A>) os << a;
  else if constexpr (std::is_same_v<A, DType>) os << a;
  else if constexpr (std::is_enum_v<A>) os << name(a);
  else os << "...";
}

/// "(op, a, b)" -> {"op", "a", "b"}.
std::vector<std::string> split_names(std::string_view names) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : names) {
    if (c == '(' || c == ')' || c == ' ') continue;
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

template <class... A>
[[noreturn]] void fail(const char* kernel, const std::string& what, const char* arg_names, const A&... a) {
  std::ostringstream os;
  os << "kernels::" << kernel << ": " << what << " (";
  const std::vector<std::string> names = split_names(arg_names);
  size_t i = 0;
  ((os << (i ? ", " : "") << (i < names.size() ? names[i] : "?") << " = ", describe(os, a), ++i), ...);
  os << "); the op calling it must check its arguments first";
  MT_ERROR(os.str());
}

template <class Invariant, class... A>
const Backend& checked_backend(const char* kernel, const char* arg_names, const char* invariant_text,
                               const Invariant& invariant, const A&... a) {
  DeviceOf of;
  (of(a), ...);
  if (of.mixed) fail(kernel, "expected every tensor on one device", arg_names, a...);
  if (!of.device) fail(kernel, "no tensor or device argument says where to run", arg_names, a...);
  bool holds = false;
  try {
    holds = invariant();
  } catch (const Error& e) {  // an undefined tensor where the kernel needs one
    fail(kernel, std::string("its invariant `") + invariant_text + "` cannot be evaluated (" + e.what() + ")",
         arg_names, a...);
  }
  if (!holds) fail(kernel, std::string("its invariant `") + invariant_text + "` does not hold", arg_names, a...);
  return backend_of(*of.device, kernel);
}

/// An in-place kernel writes its first tensor argument (every tensor of it, for a list): its storage version is
/// bumped, so a tensor saved for backward that it overwrote is caught (autograd::Ctx::saved).
struct BumpTarget {
  bool done = false;
  void operator()(const Tensor& t) {
    if (done) return;
    done = true;
    if (t.defined()) t.bump_version();
  }
  void operator()(std::span<const Tensor> ts) {
    if (done) return;
    done = true;
    for (const Tensor& t : ts)
      if (t.defined()) t.bump_version();
  }
  template <class A>
  void operator()(const A&) {}
};

template <class... A>
void bump_target(const A&... a) {
  BumpTarget bump;
  (bump(a), ...);
}

constinit std::atomic<const Backend*> g_cuda_backend{nullptr};

thread_local const char* t_noted_kernel = nullptr;

}  // namespace

// ---- the entry points ------------------------------------------------------------------------

#define MT_UNPAREN(...) __VA_ARGS__
#define MT_KERNEL_ENTRY(ret, name, params, args, invariant)                                                   \
  ret name params {                                                                                          \
    const Backend& mt_backend = checked_backend(#name, #args, #invariant,                                    \
                                                [&] { return static_cast<bool>(invariant); }, MT_UNPAREN args); \
    if constexpr (std::string_view(#name).ends_with('_')) bump_target(MT_UNPAREN args);                      \
    return mt_backend.name args;                                                                             \
  }
MT_BACKEND_KERNELS(MT_KERNEL_ENTRY)
#undef MT_KERNEL_ENTRY

// ---- the registry ------------------------------------------------------------------------------

#define MT_KERNEL_FROM_CPU(ret, name, params, args, invariant) .name = &cpu::name,

const Backend& cpu_backend() {
  static const Backend table{.type = DeviceType::kCPU, .memory = &cpu_memory(), MT_BACKEND_KERNELS(MT_KERNEL_FROM_CPU)};
  return table;
}

void register_backend(const Backend& backend) noexcept {
  if (backend.type != DeviceType::kCUDA) return;
  g_cuda_backend.store(&backend);
  install_device_memory(backend.type, *backend.memory);
}

const Backend* cuda_backend() noexcept { return g_cuda_backend.load(); }

const Backend& backend_of(Device device, const char* op) {
  if (device.is_cpu()) return cpu_backend();
  const Backend* b = g_cuda_backend.load();
  MT_CHECK(b != nullptr, op, ": got a tensor on ", device, " but mixtape was built without CUDA");
  return *b;
}

bool has_kernel(const Backend& backend, int index) {
#define MT_KERNEL_IS_SET(ret, name, params, args, invariant) backend.name != nullptr,
  const bool set[] = {MT_BACKEND_KERNELS(MT_KERNEL_IS_SET)};
#undef MT_KERNEL_IS_SET
  MT_CHECK(index >= 0 && index < kNumKernels, "has_kernel: index ", index, " is not in [0, ", kNumKernels, ")");
  return set[index];
}

// ---- the kernel note of the precision trace ------------------------------------------------------------

void note_kernel(const char* name) noexcept { t_noted_kernel = name; }

const char* take_noted_kernel() noexcept { return std::exchange(t_noted_kernel, nullptr); }

}  // namespace mixtape::kernels
