// optim/inspect.h — the numerics inspector: what the mixed precision paper's Figure 3 shows, measured on the user's
// own model. Which op's values or gradients fall below f16's range or above it, which gradient tripped the loss
// scaler, which weight updates f16 would have lost, which matmuls missed the Tensor Cores, and what to change.
//
//   mt::amp::Inspect inspect({.parameters = net.named_parameters()});   // one training step inside the scope
//   { mt::amp::Autocast ac(mt::kF16); loss = mt::cross_entropy(net.forward(x), y); }
//   scaler.scale(loss).backward();
//   scaler.step(opt);
//   scaler.update();
//   mt::amp::InspectReport r = inspect.report();                        // the host reads happen here
//   std::cout << r.table();  r.write_json("numerics.json");
//
// The one design idea: statistics are kernels on the tensors' device, launched as the tape runs and kept there as
// small (285) i64 tensors: inspecting adds no host synchronisation to a step; report() reads them all at once.
// The tape calls the inspector through autograd/observer.h; when no Inspect is alive nothing is measured and
// nothing is paid but a null test per op. Values are read as f32 (ops/backend/numerics_math.h has the exact
// definitions of every count).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <mixtape/core/device.h>
#include <mixtape/core/dtype.h>
#include <mixtape/core/shape.h>
#include <mixtape/core/tensor.h>

namespace mixtape::amp {

/// Statistics of one tensor's values, read as f32.
struct ValueStats {
  static constexpr int kHistogramMinExp = -149;  // histogram[k] counts floor(log2|v|) == k + kHistogramMinExp
  int64_t count = 0;
  int64_t zeros = 0;              // exactly 0 (either sign)
  int64_t non_finite = 0;         // inf or NaN
  int64_t f16_subnormal = 0;      // 2^-24 <= |v| < 2^-14: kept by f16 with less precision
  int64_t f16_underflow = 0;      // 0 < |v| < 2^-24: below f16's smallest subnormal (0 or 2^-24 in f16)
  int64_t f16_overflow = 0;       // finite |v| >= 65504: at or past f16's largest finite value
  int64_t bf16_below_normal = 0;  // 0 < |v| < 2^-126: below bf16's smallest normal
  float amax = 0;                 // max |v| over the finite values
  std::vector<int64_t> histogram; // finite nonzero values by binade, 2^-149 .. 2^127

  double fraction(int64_t n) const { return count > 0 ? static_cast<double>(n) / static_cast<double>(count) : 0.0; }
  /// The fraction of finite nonzero values below 2^e (e within the histogram's range).
  double fraction_below_pow2(int e) const;
};

/// One gradient an op's backward produced (its input `input`).
struct GradientStats {
  int input = 0;
  bool to_leaf = false;  // a leaf's gradient (a parameter's), else an activation's
  DType dtype = DType::kF32;
  ValueStats held;       // as the backward produced it: scaled by the loss scale, in the dtype it was stored in
  ValueStats unscaled;   // times 1/S (S: the GradScaler's scale at scale(loss); 1 without one)
};

/// Whether a matmul-like op ran on the Tensor Cores, and why not.
struct TensorCoreUse {
  bool used = false;
  std::string reason;  // why not (dtype, alignment or shape, device); empty when used
};

/// One op the tape ran inside the scope.
struct OpStats {
  int64_t index = 0;           // order in the forward
  std::string op;
  DType dtype = DType::kF32;   // the dtype it ran in (its output's)
  Device device;
  Shape shape;                 // its output's
  std::string kernel;          // the kernel its backend noted ("wmma f16"), or empty
  std::optional<TensorCoreUse> tensor_cores;  // matmul, linear, conv2d
  bool loss_scaling = false;   // the GradScaler's loss · S: its gradient is S itself, left out of the advice
  ValueStats output;
  int64_t backward_index = -1;              // order in the backward (0: first); -1: no gradient reached it
  std::optional<ValueStats> grad_output;    // what its backward received (held, scaled)
  std::vector<GradientStats> grads;         // what its backward produced
  double forward_seconds = 0;   // with InspectOptions::profile: its forward's time, and its backward's
  double backward_seconds = 0;
  /// A score to sort by: non-finite values first, then overflow, then f16 underflow of values held in f16.
  double risk() const;
};

/// The lost-update meter of one parameter: its last update against half an ulp of its value in `model_dtype`.
struct ParameterUpdate {
  std::string name;
  Shape shape;
  DType model_dtype = DType::kF16;  // the dtype the weight would be kept in without f32 master weights
  int64_t count = 0;
  int64_t unchanged = 0;  // update exactly 0
  int64_t lost = 0;       // 0 < |update| < ulp(weight in model_dtype) / 2: gone if the weight were stored there
  double lost_fraction() const { return count > 0 ? static_cast<double>(lost) / static_cast<double>(count) : 0; }
};

/// Everything report() read back, and what it suggests.
struct InspectReport {
  std::vector<OpStats> ops;               // in forward order
  std::vector<ParameterUpdate> updates;   // the parameters an optimizer updated inside the scope (none when the
                                          // GradScaler skipped the step: see non_finite_parameters)
  double loss_scale = 1.0;                // the GradScaler's scale seen by scale(loss), 1 without one
  bool profiled = false;                  // InspectOptions::profile: the ops' seconds are measured
  DType autocast_dtype = DType::kF32;     // the lowest precision an op ran in (f16, bf16), else f32
  /// Parameters whose gradient held inf or NaN at the GradScaler's last unscale inside the scope.
  std::vector<std::string> non_finite_parameters;
  /// The first op in backward order whose backward produced a non-finite gradient (an index into ops).
  std::optional<size_t> first_non_finite_backward;
  /// The fixes the statistics point to, one sentence each.
  std::vector<std::string> advice;

  /// Every activation gradient's histogram summed (held, or unscaled), the loss scaling's own left out: the
  /// paper's Figure 3.
  std::vector<int64_t> activation_gradient_histogram(bool unscaled) const;
  /// A text table, one line per op, riskiest first, then the lost-update meter, attribution and advice.
  std::string table() const;
  /// The same as JSON (every count and histogram).
  std::string json() const;
  /// Writes json() atomically (a temporary file, then rename); an Error names the path on failure.
  void write_json(const std::string& path) const;
  /// A gnuplot script (data inline) drawing the activation gradients' log2-magnitude histogram, unscaled and as
  /// held, with f16's normal and subnormal ranges and the loss scale's shift marked, into `png`.
  std::string gnuplot_script(const std::string& png) const;
};

struct InspectOptions {
  /// Names for the parameters (net.named_parameters()): the lost-update meter and the attribution use them;
  /// others are called "parameter <i>", i their index in the optimizer's parameters().
  std::vector<std::pair<std::string, Tensor>> parameters = {};
  /// The dtype an f32 weight is measured against by the lost-update meter; unset: the autocast dtype the scope ran
  /// ops in (f16 or bf16), f16 when it ran none.
  std::optional<DType> model_dtype = std::nullopt;
  /// Times each op's forward and backward (the device synchronised around each: slower, and off by default), so
  /// the report gives each op's share of the step next to its Tensor Core eligibility.
  bool profile = false;
};

/// Inspects every op run on this thread while alive (the innermost one, when nested). Backward passes of nodes
/// recorded inside the scope report their gradients even if they run after it ended.
class Inspect {
 public:
  explicit Inspect(InspectOptions options = {});
  ~Inspect();
  Inspect(const Inspect&) = delete;
  Inspect& operator=(const Inspect&) = delete;

  /// Reads every statistic back (the synchronisation) and derives the attribution and advice.
  InspectReport report() const;

  struct State;  // shared with the tape's observations and the optim hooks (optim/inspect.cpp)

 private:
  std::shared_ptr<State> m_state;
};

namespace detail {
/// GradScaler::scale tells the inspector of this thread the scale it multiplies the loss by.
void inspect_note_loss_scale(const Tensor& scale);
/// GradScaler's unscale pass tells it which gradients held inf/NaN: `flags` (n) f32 on the device, 1 where
/// params[i]'s gradient did; indices[i] is params[i]'s index in the optimizer's parameters().
void inspect_note_non_finite(const std::vector<Tensor>& params, const std::vector<size_t>& indices,
                             const Tensor& flags);
/// Optimizer::begin_update tells it the value (master or parameter) about to be updated, and the parameter's index.
void inspect_note_update(const Tensor& param, size_t index, const Tensor& value);
}  // namespace detail

}  // namespace mixtape::amp
