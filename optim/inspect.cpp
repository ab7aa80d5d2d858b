// optim/inspect.cpp — the numerics inspector: statistics launched as the tape runs, read back by report().
//
// The tape hands every model op's output to State::on_forward (autograd/observer.h); a recorded node carries an
// Observation back to State::on_backward with the gradients its backward produced. Each statistic is one
// kernels::numerics_stats call (a small i64 tensor on the device, no synchronisation); the GradScaler and the
// optimizers tell the inspector of this thread the loss scale, the non-finite flags of their unscale pass and the
// values they are about to update (the detail:: hooks). report() reads everything back and derives the rest.
#include <mixtape/optim/inspect.h>
#include <mixtape/optim/grad_scaler.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/observer.h>
#include <mixtape/core/atomic_file.h>
#include <mixtape/core/device_memory.h>
#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/backend/numerics_math.h>

namespace mixtape::amp {

namespace {

constexpr int kF16MinSubnormalExp = -24, kF16MinNormalExp = -14, kF16MaxExp = 15;  // 2^15 <= 65504 < 2^16

/// The statistics of `x` (times `multiplier` when defined), launched on x's device; nothing is read back.
Tensor launch_stats(const Tensor& x, const Tensor& multiplier = Tensor()) {
  return kernels::numerics_stats(raw::contiguous(x), multiplier);
}

ValueStats read_stats(const Tensor& stats) {
  const std::vector<int64_t> v = stats.to_vector<int64_t>();  // the host read
  MT_CHECK(static_cast<int>(v.size()) == math::kNumericsFields, "Inspect: statistics of ", v.size(),
           " fields, expected ", math::kNumericsFields);
  ValueStats s;
  s.count = v[math::kCount];
  s.zeros = v[math::kZeros];
  s.non_finite = v[math::kNonFinite];
  s.f16_subnormal = v[math::kF16Subnormal];
  s.f16_underflow = v[math::kF16Underflow];
  s.f16_overflow = v[math::kF16Overflow];
  s.bf16_below_normal = v[math::kBf16BelowNormal];
  const auto bits = static_cast<uint32_t>(v[math::kAmaxBits]);
  std::memcpy(&s.amax, &bits, sizeof bits);
  s.histogram.assign(v.begin() + math::kHistogram, v.end());
  return s;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Waits for `device`'s queued work (profiling only: a CUDA op's time is its kernels', not their launch's).
void synchronize(Device device) {
  if (device.is_cuda()) device_memory(device).synchronize(device.index);
}

bool is_matmul_like(std::string_view op) { return op == "matmul" || op == "linear" || op == "conv2d"; }

/// Whether a matmul-like op ran on the Tensor Cores (the kernel its backend noted), and if not, why.
TensorCoreUse tensor_core_use(std::string_view kernel, DType input_dtype, Device device) {
  if (kernel.starts_with("wmma")) return {true, ""};
  std::ostringstream why;
  if (device.is_cpu()) {
    why << "device cpu: no Tensor Cores";
    if (!kernel.empty()) why << " (ran " << kernel << ")";
  } else if (!is_reduced_float(input_dtype)) {
    why << "dtype " << input_dtype << ": outside autocast or kept in f32 (Tensor Cores take f16/bf16, tf32 when "
        << "cuda::set_allow_tf32)";
  } else {
    why << "layout: an operand is neither row- nor column-contiguous, or the GPU lacks " << input_dtype
        << " Tensor Cores (ran " << (kernel.empty() ? "?" : kernel) << ")";
  }
  return {false, why.str()};
}

}  // namespace

double ValueStats::fraction_below_pow2(int e) const {
  const int k = std::clamp(e - kHistogramMinExp, 0, static_cast<int>(histogram.size()));
  int64_t n = 0;
  for (int i = 0; i < k; ++i) n += histogram[static_cast<size_t>(i)];
  return fraction(n);
}

double OpStats::risk() const {
  // Values stored in f16 lose what underflows; in bf16 what falls below its normals; any dtype loses non-finites.
  auto score = [](const ValueStats& s, DType dtype) {
    double r = 1000 * s.fraction(s.non_finite);
    if (dtype == DType::kF16) r += 100 * s.fraction(s.f16_overflow) + s.fraction(s.f16_underflow);
    if (dtype == DType::kBF16) r += s.fraction(s.bf16_below_normal);
    return r;
  };
  double r = score(output, dtype);
  for (const GradientStats& g : grads) r = std::max(r, score(g.held, g.dtype));
  return r;
}

// ---- the state the tape and the optim hooks feed ---------------------------------------------------------------

struct Inspect::State final : autograd::TapeObserver, std::enable_shared_from_this<Inspect::State> {
  struct Gradient {
    int input;
    bool to_leaf;
    DType dtype;
    Tensor held, unscaled;  // statistics tensors (unscaled undefined: the same as held)
  };
  struct Record {
    OpStats meta;      // everything but the statistics
    Tensor output;     // statistics tensors
    Tensor grad_output;
    std::vector<Gradient> grads;
  };
  struct Update {
    Tensor param, before, value;  // the value updated in place (master or parameter) and its copy from before
    size_t index;                 // the parameter's, in the optimizer's parameters()
  };
  struct NonFinite {
    std::vector<Tensor> params;
    std::vector<size_t> indices;  // theirs in the optimizer's parameters()
    Tensor flags;
  };

  /// Tells the node's backward gradients to the state it came from.
  struct Observation final : autograd::NodeObservation {
    std::shared_ptr<State> state;
    size_t record = 0;
    Clock::time_point started;
    void before_backward() override {
      if (!state->options.profile) return;
      std::lock_guard lock(state->mutex);
      synchronize(state->records.at(record).meta.device);
      started = Clock::now();
    }
    void on_backward(const Tensor& grad_output, const autograd::Grads& grads,
                     std::span<const autograd::Edge> edges) override {
      if (state->options.profile) {
        std::lock_guard lock(state->mutex);
        synchronize(state->records.at(record).meta.device);
        state->records.at(record).meta.backward_seconds = seconds_since(started);
      }
      state->on_backward(record, grad_output, grads, edges);
    }
  };

  void before_forward() override {
    if (!options.profile) return;
    synchronize(last_device);
    forward_started = Clock::now();
  }

  std::shared_ptr<autograd::NodeObservation> on_forward(const char* op, std::span<const Tensor> inputs,
                                                        const Tensor& output, const char* kernel,
                                                        bool recorded) override {
    if (!output.defined() || !is_floating(output.dtype())) return nullptr;  // indices and masks: nothing to judge
    std::lock_guard lock(mutex);
    Record r;
    if (options.profile) {
      synchronize(output.device());
      r.meta.forward_seconds = seconds_since(forward_started);
      last_device = output.device();
    }
    r.meta.index = static_cast<int64_t>(records.size());
    r.meta.op = op;
    r.meta.dtype = output.dtype();
    r.meta.device = output.device();
    r.meta.shape = output.shape();
    r.meta.kernel = kernel ? kernel : "";
    if (is_matmul_like(op) && !inputs.empty())
      r.meta.tensor_cores = tensor_core_use(r.meta.kernel, inputs[0].dtype(), output.device());
    r.output = launch_stats(output);
    r.meta.loss_scaling = std::exchange(next_is_loss_scaling, false);
    if (is_reduced_float(output.dtype()) && lowest == DType::kF32) lowest = output.dtype();
    records.push_back(std::move(r));
    if (!recorded) return nullptr;
    auto o = std::make_shared<Observation>();
    o->state = shared_from_this();
    o->record = records.size() - 1;
    return o;
  }

  void on_backward(size_t index, const Tensor& grad_output, const autograd::Grads& grads,
                   std::span<const autograd::Edge> edges) {
    std::lock_guard lock(mutex);
    Record& r = records.at(index);
    r.meta.backward_index = backward_count++;
    if (grad_output.defined() && is_floating(grad_output.dtype())) r.grad_output = launch_stats(grad_output);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined() || !is_floating(grads[i].dtype()) || i >= edges.size() || !edges[i].valid()) continue;
      const Tensor g = raw::contiguous(grads[i]);  // once for both (an expanded gradient is materialised here)
      Gradient s{static_cast<int>(i), edges[i].leaf != nullptr, g.dtype(), launch_stats(g), Tensor()};
      if (scale.defined()) s.unscaled = launch_stats(g, inv_scale_on(g.device()));
      r.grads.push_back(std::move(s));
    }
  }

  /// 1/S as one f32 element on `device` (computed once per device from the scale noted at scale(loss)).
  Tensor inv_scale_on(Device device) {
    for (const auto& [d, t] : inv_scales)
      if (d == device) return t;
    const Tensor inv = detail::reciprocal_scale(raw::to(scale, device));
    inv_scales.emplace_back(device, inv);
    return inv;
  }

  /// The name options.parameters gives `param`, else "parameter <index>" (its index in the optimizer).
  std::string name_of(const Tensor& param, size_t index) const {
    for (const auto& [name, p] : options.parameters)
      if (p.impl() == param.impl()) return name;
    return "parameter " + std::to_string(index);
  }

  InspectOptions options;
  std::mutex mutex;  // a backward may run on another thread than the forward
  std::vector<Record> records;
  int64_t backward_count = 0;
  DType lowest = DType::kF32;
  Tensor scale;  // (1) f32, the GradScaler's scale at the last scale(loss)
  bool next_is_loss_scaling = false;  // GradScaler::scale said so: the next op is loss · S
  std::vector<std::pair<Device, Tensor>> inv_scales;
  std::vector<NonFinite> non_finite;
  std::vector<Update> updates;  // one per parameter, the latest
  std::optional<autograd::ObserverScope> scope;
  Device last_device;                  // of the last op observed: what before_forward waits for when profiling
  Clock::time_point forward_started;
  State* prev = nullptr;  // the enclosing Inspect of this thread
};

namespace {
thread_local Inspect::State* t_current = nullptr;
}  // namespace

Inspect::Inspect(InspectOptions options) : m_state(std::make_shared<State>()) {
  m_state->options = std::move(options);
  m_state->scope.emplace(m_state.get());
  m_state->prev = t_current;
  t_current = m_state.get();
}

Inspect::~Inspect() {
  t_current = m_state->prev;
  m_state->scope.reset();
}

// ---- the optim hooks --------------------------------------------------------------------------------------------

namespace detail {

void inspect_note_loss_scale(const Tensor& scale) {
  if (!t_current) return;
  std::lock_guard lock(t_current->mutex);
  t_current->scale = raw::clone(scale);  // update() changes the scaler's in place: the report names this one
  t_current->inv_scales.clear();
  t_current->next_is_loss_scaling = true;
}

void inspect_note_non_finite(const std::vector<Tensor>& params, const std::vector<size_t>& indices,
                             const Tensor& flags) {
  if (!t_current) return;
  std::lock_guard lock(t_current->mutex);
  t_current->non_finite.push_back({params, indices, flags});
}

void inspect_note_update(const Tensor& param, size_t index, const Tensor& value) {
  if (!t_current || !is_floating(value.dtype())) return;
  std::lock_guard lock(t_current->mutex);
  auto& updates = t_current->updates;
  const auto it = std::find_if(updates.begin(), updates.end(),
                               [&](const Inspect::State::Update& u) { return u.param.impl() == param.impl(); });
  Inspect::State::Update u{param, raw::clone(value), value, index};
  if (it == updates.end()) updates.push_back(std::move(u));
  else *it = std::move(u);
}

}  // namespace detail

// ---- the report -------------------------------------------------------------------------------------------------

namespace {

/// The advice the statistics support, one sentence each (ops/backend/numerics_math.h has the thresholds' ranges).
std::vector<std::string> advise(const InspectReport& r) {
  constexpr double kUnderflowAlarm = 1e-3;  // a tenth of a percent of a gradient lost to zero
  std::vector<std::string> advice;
  std::ostringstream os;

  // 1. Ops that ran in f16 whose outputs overflowed or went non-finite from finite inputs: keep them in f32.
  for (const OpStats& op : r.ops) {
    if (op.dtype != DType::kF16) continue;
    const bool overflow = op.output.f16_overflow > 0 || op.output.non_finite > 0;
    if (overflow) {
      os.str("");
      os << "keep " << op.op << " in f32: its f16 output reached f16's limit (" << op.output.f16_overflow
         << " values >= 65504, " << op.output.non_finite << " non-finite); amp::set_precision(\"" << op.op
         << "\", Precision::kFp32), or switch to bf16 (same range as f32)";
      if (std::find(advice.begin(), advice.end(), os.str()) == advice.end()) advice.push_back(os.str());
    }
  }

  // 2. The loss scale, from the activation gradients as held: raise it to lift the mass below 2^-24 into f16's
  //    range, or lower it when those held in f16 overflow. The magnitudes come from every activation gradient (an
  //    f32 one is what the next f16 op will hold), the overflow from those held in f16 (and non-finite ones).
  if (r.autocast_dtype == DType::kF16) {
    ValueStats held;
    held.histogram = r.activation_gradient_histogram(false);
    int64_t finite_nonzero = 0;
    for (int64_t n : held.histogram) finite_nonzero += n;
    held.count = finite_nonzero;
    int64_t overflow = 0, non_finite = 0;
    float amax = 0;
    for (const OpStats& op : r.ops)
      for (const GradientStats& g : op.grads)
        if (!g.to_leaf && !op.loss_scaling) {
          if (g.dtype == DType::kF16) overflow += g.held.f16_overflow;
          non_finite += g.held.non_finite;
          amax = std::max(amax, g.held.amax);
        }
    const double under = held.fraction_below_pow2(kF16MinSubnormalExp);
    if (finite_nonzero > 0 && overflow == 0 && non_finite == 0 && under > kUnderflowAlarm) {
      // The smallest shift k that brings the underflowing fraction under the alarm and keeps amax below 2^15.
      const int headroom = amax > 0 ? kF16MaxExp - 1 - static_cast<int>(std::floor(std::log2(amax))) : 64;
      int k = 1;
      while (k <= headroom && held.fraction_below_pow2(kF16MinSubnormalExp - k) > kUnderflowAlarm) ++k;
      os.str("");
      os << std::setprecision(3);
      if (k <= headroom) {
        os << "raise the loss scale by 2^" << k << " (to " << r.loss_scale * std::ldexp(1.0, k) << "): "
           << 100 * under << "% of the activation gradients fall below 2^-24, under f16's smallest subnormal";
      } else {
        os << "switch to bf16 (Autocast(kBF16), no loss scaling): " << 100 * under
           << "% of the activation gradients fall below 2^-24, and no loss scale lifts them without overflowing "
           << "the largest (" << amax << ")";
      }
      advice.push_back(os.str());
    } else if (overflow > 0 || non_finite > 0) {
      const int k = amax > 0 ? std::max(1, static_cast<int>(std::floor(std::log2(amax))) - (kF16MaxExp - 1)) : 1;
      os.str("");
      os << "lower the loss scale by 2^" << k << " or more (from " << r.loss_scale << "): " << overflow
         << " activation gradient values reached 65504 and " << non_finite
         << " were non-finite (the GradScaler backs off by itself; many skipped steps mean init_scale is too high)";
      advice.push_back(os.str());
    }
  }

  // 3. Lost updates: the case for f32 master weights (one sentence for every parameter past 1%).
  os.str("");
  os << std::setprecision(3);
  for (const ParameterUpdate& u : r.updates) {
    if (u.lost_fraction() < 0.01) continue;
    os << (os.tellp() == 0 ? "keep f32 master weights: without them the last update would be lost (below half an "
                             "ulp of the weight) for "
                           : ", ")
       << 100 * u.lost_fraction() << "% of " << u.name << " (" << u.model_dtype << ")";
  }
  if (os.tellp() > 0) advice.push_back(os.str());
  return advice;
}

void json_stats(nlohmann::json& j, const ValueStats& s) {
  j = {{"count", s.count},
       {"zeros", s.zeros},
       {"non_finite", s.non_finite},
       {"f16_subnormal", s.f16_subnormal},
       {"f16_underflow", s.f16_underflow},
       {"f16_overflow", s.f16_overflow},
       {"bf16_below_normal", s.bf16_below_normal},
       {"amax", s.amax},
       {"histogram_min_exp", ValueStats::kHistogramMinExp},
       {"histogram", s.histogram}};
}

}  // namespace

InspectReport Inspect::report() const {
  State& s = *m_state;
  std::lock_guard lock(s.mutex);
  InspectReport r;
  r.autocast_dtype = s.lowest;
  r.profiled = s.options.profile;
  if (s.scale.defined()) r.loss_scale = s.scale.to_vector<double>().at(0);
  for (const State::Record& rec : s.records) {
    OpStats op = rec.meta;
    op.output = read_stats(rec.output);
    if (rec.grad_output.defined()) op.grad_output = read_stats(rec.grad_output);
    for (const State::Gradient& g : rec.grads) {
      GradientStats gs{g.input, g.to_leaf, g.dtype, read_stats(g.held), ValueStats()};
      gs.unscaled = g.unscaled.defined() ? read_stats(g.unscaled) : gs.held;
      op.grads.push_back(std::move(gs));
    }
    r.ops.push_back(std::move(op));
  }
  // Attribution: the first node in backward order whose backward produced a non-finite gradient.
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpStats& op = r.ops[i];
    const bool produced = std::any_of(op.grads.begin(), op.grads.end(),
                                      [](const GradientStats& g) { return g.held.non_finite > 0; });
    if (produced && (!r.first_non_finite_backward ||
                     op.backward_index < r.ops[*r.first_non_finite_backward].backward_index))
      r.first_non_finite_backward = i;
  }
  for (const State::NonFinite& nf : s.non_finite) {
    const std::vector<float> flags = nf.flags.to_vector<float>();
    for (size_t i = 0; i < nf.params.size() && i < flags.size(); ++i)
      if (flags[i] != 0) r.non_finite_parameters.push_back(s.name_of(nf.params[i], nf.indices[i]));
  }
  // A step whose gradients held inf or NaN was skipped by the GradScaler (step() never called the optimizer;
  // step_on_device() called it and its kernels changed nothing): no update to meter either way.
  const bool skipped = !r.non_finite_parameters.empty();
  for (const State::Update& u : s.updates) {
    if (skipped) break;
    const DType param_dtype = u.param.dtype();
    const DType model = is_reduced_float(param_dtype) ? param_dtype
                        : s.options.model_dtype       ? *s.options.model_dtype
                        : s.lowest != DType::kF32     ? s.lowest
                                                      : DType::kF16;
    const std::vector<int64_t> c = kernels::lost_updates(u.before, u.value, model).to_vector<int64_t>();
    r.updates.push_back({s.name_of(u.param, u.index), u.param.shape(), model, c.at(math::kUpdateCount),
                         c.at(math::kUnchanged), c.at(math::kLost)});
  }
  r.advice = advise(r);
  return r;
}

std::vector<int64_t> InspectReport::activation_gradient_histogram(bool unscaled) const {
  std::vector<int64_t> sum(static_cast<size_t>(math::kHistogramBins), 0);
  for (const OpStats& op : ops)
    for (const GradientStats& g : op.grads) {
      if (g.to_leaf || op.loss_scaling) continue;
      const ValueStats& s = unscaled ? g.unscaled : g.held;
      for (size_t k = 0; k < sum.size() && k < s.histogram.size(); ++k) sum[k] += s.histogram[k];
    }
  return sum;
}

std::string InspectReport::table() const {
  std::ostringstream os;
  os << "numerics inspector: " << ops.size() << " ops, loss scale " << loss_scale << ", autocast "
     << autocast_dtype << "\n";
  os << std::left << std::setw(4) << "#" << std::setw(16) << "op" << std::setw(6) << "dtype" << std::setw(22)
     << "tensor" << std::right << std::setw(10) << "count" << std::setw(11) << "amax" << std::setw(8) << "zero%"
     << std::setw(9) << "f16sub%" << std::setw(9) << "<2^-24%" << std::setw(9) << ">=65504" << std::setw(9)
     << "<bf16n%" << std::setw(8) << "nonfin" << "\n";
  auto line = [&](const std::string& index, const std::string& op, DType dtype, const std::string& what,
                  const ValueStats& s) {
    os << std::left << std::setw(4) << index << std::setw(16) << op << std::setw(6) << dtype << std::setw(22) << what
       << std::right << std::setw(10) << s.count << std::setw(11) << std::setprecision(4) << s.amax
       << std::fixed << std::setprecision(2) << std::setw(8) << 100 * s.fraction(s.zeros) << std::setw(9)
       << 100 * s.fraction(s.f16_subnormal) << std::setw(9) << 100 * s.fraction(s.f16_underflow) << std::setw(9)
       << s.f16_overflow << std::setw(9) << 100 * s.fraction(s.bf16_below_normal) << std::setw(8) << s.non_finite
       << std::defaultfloat << "\n";
  };
  double total_seconds = 0;
  for (const OpStats& op : ops) total_seconds += op.forward_seconds + op.backward_seconds;
  std::vector<size_t> order(ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ops[a].risk() > ops[b].risk(); });
  for (size_t i : order) {
    const OpStats& op = ops[i];
    std::string what = "output";
    if (!op.kernel.empty()) what += " [" + op.kernel + "]";
    line(std::to_string(op.index), op.loss_scaling ? op.op + " (scale)" : op.op, op.dtype, what, op.output);
    for (const GradientStats& g : op.grads) {
      const std::string who = (g.to_leaf ? "grad leaf " : "grad in ") + std::to_string(g.input);
      line("", "", g.dtype, who + " held", g.held);
      if (loss_scale != 1.0) line("", "", g.dtype, who + " unscaled", g.unscaled);
    }
    if (op.tensor_cores) {
      os << "      " << (op.tensor_cores->used ? "on the Tensor Cores" : "not on the Tensor Cores: " + op.tensor_cores->reason);
      if (profiled && total_seconds > 0)
        os << std::fixed << std::setprecision(1) << " (" << 100 * (op.forward_seconds + op.backward_seconds) / total_seconds
           << "% of the step's op time)" << std::defaultfloat;
      os << "\n";
    }
  }
  if (!updates.empty()) {
    os << "lost updates (below half an ulp of the weight in the model dtype):\n";
    for (const ParameterUpdate& u : updates)
      os << "  " << std::left << std::setw(24) << u.name << std::right << std::setw(6) << u.model_dtype << std::fixed
         << std::setprecision(2) << std::setw(8) << 100 * u.lost_fraction() << "% lost, " << std::setw(6)
         << 100 * (u.count ? static_cast<double>(u.unchanged) / static_cast<double>(u.count) : 0.0)
         << "% unchanged" << std::defaultfloat << "\n";
  }
  if (!non_finite_parameters.empty()) {
    os << "non-finite gradients at the last unscale:";
    for (const std::string& n : non_finite_parameters) os << " " << n;
    os << "\n";
  }
  if (first_non_finite_backward) {
    const OpStats& op = ops[*first_non_finite_backward];
    os << "first non-finite gradient in backward: #" << op.index << " " << op.op << " (" << op.dtype << ")";
    if (op.grad_output)
      os << ", its incoming gradient: amax " << op.grad_output->amax << ", " << op.grad_output->non_finite
         << " non-finite, " << op.grad_output->f16_overflow << " >= 65504";
    os << "\n";
  }
  for (const std::string& a : advice) os << "advice: " << a << "\n";
  return os.str();
}

std::string InspectReport::json() const {
  nlohmann::json j;
  j["loss_scale"] = loss_scale;
  j["autocast_dtype"] = dtype_name(autocast_dtype);
  j["ops"] = nlohmann::json::array();
  for (const OpStats& op : ops) {
    nlohmann::json o;
    o["index"] = op.index;
    o["op"] = op.op;
    o["dtype"] = dtype_name(op.dtype);
    std::ostringstream dev, shape;
    dev << op.device;
    shape << op.shape;
    o["device"] = dev.str();
    o["shape"] = shape.str();
    o["kernel"] = op.kernel;
    o["risk"] = op.risk();
    o["loss_scaling"] = op.loss_scaling;
    if (profiled) o["seconds"] = {{"forward", op.forward_seconds}, {"backward", op.backward_seconds}};
    if (op.tensor_cores) o["tensor_cores"] = {{"used", op.tensor_cores->used}, {"reason", op.tensor_cores->reason}};
    json_stats(o["output"], op.output);
    o["backward_index"] = op.backward_index;
    if (op.grad_output) json_stats(o["grad_output"], *op.grad_output);
    o["grads"] = nlohmann::json::array();
    for (const GradientStats& g : op.grads) {
      nlohmann::json gj{{"input", g.input}, {"to_leaf", g.to_leaf}, {"dtype", dtype_name(g.dtype)}};
      json_stats(gj["held"], g.held);
      json_stats(gj["unscaled"], g.unscaled);
      o["grads"].push_back(std::move(gj));
    }
    j["ops"].push_back(std::move(o));
  }
  j["updates"] = nlohmann::json::array();
  for (const ParameterUpdate& u : updates)
    j["updates"].push_back({{"name", u.name}, {"model_dtype", dtype_name(u.model_dtype)}, {"count", u.count},
                            {"unchanged", u.unchanged}, {"lost", u.lost}});
  j["non_finite_parameters"] = non_finite_parameters;
  j["first_non_finite_backward"] =
      first_non_finite_backward ? nlohmann::json(ops[*first_non_finite_backward].index) : nlohmann::json();
  j["advice"] = advice;
  return j.dump(1);
}

void InspectReport::write_json(const std::string& path) const {
  write_file_atomically("InspectReport::write_json: '" + path + "'", path, json() + "\n");
}

std::string InspectReport::gnuplot_script(const std::string& png) const {
  const std::vector<int64_t> unscaled = activation_gradient_histogram(true), held = activation_gradient_histogram(false);
  int64_t total = 0;
  for (int64_t n : unscaled) total += n;
  // The x range: the binades that hold values, widened to show f16's subnormal range.
  int lo = kF16MinSubnormalExp - 2, hi = kF16MaxExp + 2;
  for (size_t k = 0; k < unscaled.size(); ++k) {
    const int e = static_cast<int>(k) + ValueStats::kHistogramMinExp;
    if (unscaled[k] > 0 || held[k] > 0) lo = std::min(lo, e), hi = std::max(hi, e);
  }
  std::ostringstream os;
  auto quoted = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
    return q + "'";
  };
  os << "set terminal pngcairo size 1000,560 font ',10'\n"
     << "set output " << quoted(png) << "\n"
     << "set title 'activation gradients (all ops): log2 magnitude, loss scale " << loss_scale << "'\n"
     << "set xlabel 'log2(|gradient|)'\nset ylabel 'percent of values'\n"
     << "set xrange [" << lo - 1 << ":" << hi + 1 << "]\nset grid ytics\n"
     << "set style fill transparent solid 0.35 noborder\n"
     << "set object 1 rect from " << kF16MinSubnormalExp << ", graph 0 to " << kF16MinNormalExp
     << ", graph 1 fc rgb '#ffcc66' fs transparent solid 0.25 behind\n"
     << "set object 2 rect from " << kF16MinNormalExp << ", graph 0 to " << kF16MaxExp + 1
     << ", graph 1 fc rgb '#99cc99' fs transparent solid 0.2 behind\n"
     << "set label 1 'f16 subnormal' at " << kF16MinSubnormalExp + 0.5 << ", graph 0.95\n"
     << "set label 2 'f16 normal' at " << kF16MinNormalExp + 0.5 << ", graph 0.95\n"
     << "set arrow 1 from " << kF16MinSubnormalExp << ", graph 0 to " << kF16MinSubnormalExp
     << ", graph 1 nohead dt 2 lc rgb 'red'\n"
     << "set label 3 'below 2^{-24}: under f16 subnormals' at " << lo << ", graph 0.88 tc rgb 'red'\n";
  if (loss_scale != 1.0 && loss_scale > 0)
    os << "set label 4 'as held: shifted right by the loss scale, x2^{"
       << static_cast<int>(std::lround(std::log2(loss_scale))) << "}' at graph 0.55, graph 0.82\n";
  os << "$data << EOD\n";
  for (size_t k = 0; k < unscaled.size(); ++k) {
    const int e = static_cast<int>(k) + ValueStats::kHistogramMinExp;
    if (e < lo - 1 || e > hi + 1) continue;
    const double pu = total > 0 ? 100.0 * static_cast<double>(unscaled[k]) / static_cast<double>(total) : 0;
    const double ph = total > 0 ? 100.0 * static_cast<double>(held[k]) / static_cast<double>(total) : 0;
    os << e + 0.5 << " " << pu << " " << ph << "\n";
  }
  os << "EOD\n"
     << "plot $data using 1:2 with boxes lc rgb '#3366cc' title 'unscaled (the f32 gradients)', \\\n"
     << "     $data using 1:3 with boxes lc rgb '#cc3333' title 'as held (times the loss scale)'\n";
  return os.str();
}

}  // namespace mixtape::amp
