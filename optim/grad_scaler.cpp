// optim/grad_scaler.cpp — GradScaler (optim/grad_scaler.h): PyTorch's torch.amp.GradScaler on mixtape's kernels.
//
// The per-optimizer state machine is PyTorch's (READY → UNSCALED → STEPPED, reset by update()), with its error
// messages; the arithmetic runs as kernels on the scale's and the gradients' devices (ops/backend/kernels.h:
// non_finite_check_and_unscale_, amp_update_scale_). The one host read of a step is in step(), marked there.
#include <mixtape/optim/grad_scaler.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <mixtape/autograd/autograd.h>
#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>
#include <mixtape/optim/inspect.h>

namespace mixtape::amp {

namespace detail {

Tensor reciprocal_scale(const Tensor& scale) {
  // PyTorch computes 1/S in f64 and rounds it to f32 (scale.double().reciprocal().float(): three kernels), against
  // f32 division compiled imprecise. mixtape's f32 division is IEEE's on both backends (nvcc's default
  // -prec-div=true, no fast math on the host), and a quotient rounded to 53 bits then to 24 is the quotient rounded
  // to 24 (53 >= 2 x 24 + 2: double rounding is innocuous for division), so one f32 kernel gives PyTorch's bits:
  // checked for every positive finite f32 S (2^31 - 2^23 - 1 values, none differs; tests/test_grad_scaler.cpp
  // keeps a sample of them).
  MT_CHECK(scale.dtype() == DType::kF32, "GradScaler: the scale must be f32 (got ", scale.dtype(), ")");
  return kernels::scalar(kernels::ScalarOp::kRdiv, scale, 1.0);
}

}  // namespace detail

namespace {

constexpr const char* kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};

// The checks of the options, shared by the constructor, the setters and load_state_dict: `who` is the method,
// `name` the option (or state_dict key).
void check_init_scale(const std::string& who, const char* name, double v) {
  MT_CHECK(std::isfinite(v) && v > 0 && v <= std::numeric_limits<float>::max(), who, ": ", name,
           " must be finite, > 0 and at most f32's largest, ", std::numeric_limits<float>::max(), " (got ", v,
           "): the scale is an f32 tensor");
}
void check_growth_factor(const std::string& who, const char* name, double v) {
  MT_CHECK(std::isfinite(v) && v > 1, who, ": ", name, " must be finite and > 1 (got ", v, ")");
}
void check_backoff_factor(const std::string& who, const char* name, double v) {
  MT_CHECK(v > 0 && v < 1, who, ": ", name, " must be in (0, 1) (got ", v, ")");
}
void check_growth_interval(const std::string& who, const char* name, int64_t v) {
  MT_CHECK(v >= 1 && v <= INT32_MAX, who, ": ", name, " must be in [1, ", INT32_MAX, "] (got ", v, ")");
}

bool same_owner(const std::weak_ptr<const void>& a, const std::weak_ptr<const void>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : m_options(options) {
  if (!m_options.enabled) return;  // PyTorch checks nothing of a disabled scaler
  check_init_scale("GradScaler", "init_scale", options.init_scale);
  check_growth_factor("GradScaler", "growth_factor", options.growth_factor);
  check_backoff_factor("GradScaler", "backoff_factor", options.backoff_factor);
  check_growth_interval("GradScaler", "growth_interval", options.growth_interval);
}

// ---- scaling --------------------------------------------------------------------------------------------

Tensor GradScaler::scale_on(Device device) const {
  return m_scale.device() == device ? m_scale : raw::to(m_scale, device);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!m_options.enabled) return loss;
  MT_CHECK(loss.defined(), "GradScaler.scale: the loss is an undefined tensor");
  MT_CHECK(is_floating(loss.dtype()), "GradScaler.scale: the loss must be floating (got ", loss.dtype(), " ",
           loss.shape(), ")");
  if (!m_scale.defined()) {  // lazily, on the first loss's device (PyTorch's _lazy_init_scale_growth_tracker)
    m_scale = full({1}, m_options.init_scale, TensorOptions(DType::kF32).device(loss.device()));
    m_growth_tracker = full({1}, static_cast<double>(m_init_growth_tracker),
                            TensorOptions(DType::kI32).device(loss.device()));
  }
  // A 0-d view of the (1) scale, so the product keeps the loss's shape; the scale is a constant of the tape.
  const Tensor s = scale_on(loss.device());
  detail::inspect_note_loss_scale(s);  // an amp::Inspect of this thread measures gradients unscaled too
  return mul(loss, raw::reshape(s, Shape{}));
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& outputs) {
  std::vector<Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const Tensor& t : outputs) scaled.push_back(scale(t));
  return scaled;
}

// ---- unscaling and stepping --------------------------------------------------------------------------------

GradScaler::OptimizerState& GradScaler::state_of(const optim::Optimizer& optimizer) {
  const std::weak_ptr<const void> token = optimizer.lifetime();
  for (OptimizerState& s : m_states)
    if (same_owner(s.lifetime, token)) return s;
  m_states.push_back(OptimizerState{token, Stage::kReady, {}, {}});
  return m_states.back();
}

void GradScaler::check_initialized(const char* method) const {
  MT_CHECK(m_scale.defined(), "GradScaler.", method, ": the scale does not exist yet; this may indicate your ",
           "script did not use scaler.scale(loss or outputs) earlier in the iteration");
}

void GradScaler::unscale_impl(optim::Optimizer& optimizer, OptimizerState& state) {
  autograd::NoGradGuard no_grad;
  const Tensor inv_scale = detail::reciprocal_scale(m_scale);
  // The gradients by device, in order of first appearance: one multi-tensor pass per device, any dtypes mixed.
  struct DeviceList {
    Device device;
    std::vector<Tensor> grads, params;
    std::vector<size_t> indices;  // in optimizer.parameters()
  };
  std::vector<DeviceList> by_device;
  size_t index = 0;
  for (const optim::ParamGroup& group : optimizer.param_groups())
    for (const Tensor& p : group.params) {
      const Tensor& g = p.grad();
      if (g.defined()) {
        auto it = by_device.begin();
        while (it != by_device.end() && it->device != g.device()) ++it;
        if (it == by_device.end()) it = by_device.insert(it, DeviceList{g.device(), {}, {}, {}});
        it->grads.push_back(g);
        it->params.push_back(p);
        it->indices.push_back(index);
      }
      ++index;
    }
  state.found_inf_per_device.clear();
  state.tensor_flags.clear();
  for (const DeviceList& list : by_device) {
    // flags[0]: any gradient of the list held inf/NaN; flags[1 + i]: grads[i] did (the same pass sets both).
    const auto n = static_cast<int64_t>(list.grads.size());
    const Tensor flags = zeros({1 + n}, TensorOptions(DType::kF32).device(list.device));
    const Tensor inv_here = list.device == inv_scale.device() ? inv_scale : raw::to(inv_scale, list.device);
    kernels::non_finite_check_and_unscale_(list.grads, flags, inv_here);
    state.found_inf_per_device.push_back(raw::slice(flags, 0, 0, 1));
    const Tensor per_tensor = raw::slice(flags, 0, 1, 1 + n);
    state.tensor_flags.push_back({list.indices, per_tensor});
    detail::inspect_note_non_finite(list.params, list.indices, per_tensor);
  }
  state.stage = Stage::kUnscaled;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!m_options.enabled) return;
  check_initialized("unscale_");
  OptimizerState& state = state_of(optimizer);
  MT_CHECK(state.stage != Stage::kUnscaled, "GradScaler.unscale_: unscale_() has already been called on this ",
           "optimizer since the last update() (optimizer ", optimizer.name(), ")");
  MT_CHECK(state.stage != Stage::kStepped, "GradScaler.unscale_: unscale_() is being called after step() (optimizer ",
           optimizer.name(), "); call update() first");
  unscale_impl(optimizer, state);
}

std::vector<size_t> GradScaler::non_finite_gradients(const optim::Optimizer& optimizer) const {
  for (const OptimizerState& s : m_states) {
    if (!same_owner(s.lifetime, optimizer.lifetime()) || s.tensor_flags.empty()) continue;
    std::vector<size_t> found;
    for (const auto& [indices, flags] : s.tensor_flags) {
      const std::vector<float> f = flags.to_vector<float>();  // the host read, only when asked
      for (size_t i = 0; i < indices.size(); ++i)
        if (f[i] != 0) found.push_back(indices[i]);
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  MT_ERROR("GradScaler.non_finite_gradients: optimizer ", optimizer.name(), " was not unscaled since the last ",
           "update() (call it after step() or unscale_(), before update())");
}

Tensor GradScaler::any_found_inf(const std::vector<Tensor>& flags) const {
  // One optimizer on one device: its flag is the answer as it is (every caller only reads it), no copy launched.
  if (flags.size() == 1) return raw::to(flags.front(), m_scale.device());
  Tensor any;
  for (const Tensor& f : flags) {
    const Tensor here = raw::to(f, m_scale.device());
    if (!any.defined()) any = raw::clone(here);
    else kernels::binary_(kernels::BinaryOp::kMaximum, any, here);
  }
  return any;
}

GradScaler::OptimizerState& GradScaler::begin_step(optim::Optimizer& optimizer, const char* method) {
  check_initialized(method);
  OptimizerState& state = state_of(optimizer);
  MT_CHECK(state.stage != Stage::kStepped, "GradScaler.", method, ": step() has already been called since the last ",
           "update() (optimizer ", optimizer.name(), ")");
  if (state.stage == Stage::kReady) unscale_impl(optimizer, state);
  MT_CHECK(!state.found_inf_per_device.empty(), "GradScaler.", method, ": no inf checks were recorded for this ",
           "optimizer (", optimizer.name(), "): none of its parameters has a gradient (call backward() on ",
           "scale(loss) first)");
  return state;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!m_options.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerState& state = begin_step(optimizer, "step");
  // The step's one host synchronisation: whether to call the optimizer at all.
  float found = 0;
  for (const Tensor& f : state.found_inf_per_device) found += f.item<float>();
  const bool stepped = found == 0;
  if (stepped) optimizer.step();
  else ++m_skipped_read;
  state.stage = Stage::kStepped;
  return stepped;
}

void GradScaler::step_on_device(optim::Optimizer& optimizer) {
  if (!m_options.enabled) {
    optimizer.step();
    return;
  }
  OptimizerState& state = begin_step(optimizer, "step_on_device");
  autograd::NoGradGuard no_grad;
  const Tensor found = any_found_inf(state.found_inf_per_device);
  optimizer.step(found);
  if (!m_skipped.defined()) m_skipped = zeros({1}, TensorOptions(DType::kF32).device(m_scale.device()));
  kernels::binary_(kernels::BinaryOp::kAdd, m_skipped, found);
  state.stage = Stage::kStepped;
}

int64_t GradScaler::skipped_steps() const {
  return m_skipped_read + (m_skipped.defined() ? static_cast<int64_t>(m_skipped.item<float>()) : 0);
}

// ---- the scale's update ------------------------------------------------------------------------------------

void GradScaler::update() {
  if (!m_options.enabled) return;
  check_initialized("update");
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> flags;  // every optimizer's found_inf on every device
  for (const OptimizerState& s : m_states) flags.insert(flags.end(), s.found_inf_per_device.begin(),
                                                         s.found_inf_per_device.end());
  const Tensor combined = any_found_inf(flags);
  MT_CHECK(combined.defined(), "GradScaler.update: no inf checks were recorded prior to update(); call step(optimizer) ",
           "(or unscale_) for each optimizer of this iteration first");
  kernels::amp_update_scale_(m_scale, m_growth_tracker, combined, m_options.growth_factor, m_options.backoff_factor,
                             m_options.growth_interval);
  end_step();
}

void GradScaler::update(double new_scale) {
  if (!m_options.enabled) return;
  check_initialized("update");
  check_init_scale("GradScaler.update", "new_scale", new_scale);
  raw::fill_(m_scale, new_scale);
  end_step();
}

void GradScaler::update(const Tensor& new_scale) {
  if (!m_options.enabled) return;
  check_initialized("update");
  MT_CHECK(new_scale.defined(), "GradScaler.update: new_scale is an undefined tensor");
  MT_CHECK(is_floating(new_scale.dtype()) && new_scale.numel() == 1 && !new_scale.requires_grad(),
           "GradScaler.update: new_scale should be a float or a one-element floating tensor that does not require ",
           "grad (got ", new_scale.dtype(), " ", new_scale.shape(), new_scale.requires_grad() ? ", requiring grad" : "",
           ")");
  raw::copy_(m_scale, raw::reshape(new_scale, Shape{1}));
  end_step();
}

void GradScaler::end_step() {
  // The step's flags go with it: none is held through the next forward and backward, where the peak is.
  m_states.clear();
}

// ---- getters, setters, state ---------------------------------------------------------------------------------

double GradScaler::get_scale() const {
  if (!m_options.enabled) return 1.0;
  return m_scale.defined() ? static_cast<double>(m_scale.item<float>()) : m_options.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!m_options.enabled) return 0;
  return m_growth_tracker.defined() ? m_growth_tracker.item<int32_t>() : m_init_growth_tracker;
}

void GradScaler::set_growth_factor(double growth_factor) {
  check_growth_factor("GradScaler.set_growth_factor", "growth_factor", growth_factor);
  m_options.growth_factor = growth_factor;
}

void GradScaler::set_backoff_factor(double backoff_factor) {
  check_backoff_factor("GradScaler.set_backoff_factor", "backoff_factor", backoff_factor);
  m_options.backoff_factor = backoff_factor;
}

void GradScaler::set_growth_interval(int64_t growth_interval) {
  check_growth_interval("GradScaler.set_growth_interval", "growth_interval", growth_interval);
  m_options.growth_interval = growth_interval;
}

StateDict GradScaler::state_dict() const {
  StateDict sd;
  if (!m_options.enabled) return sd;
  sd.insert("scale", scalar_tensor(get_scale(), DType::kF64));
  sd.insert("growth_factor", scalar_tensor(m_options.growth_factor, DType::kF64));
  sd.insert("backoff_factor", scalar_tensor(m_options.backoff_factor, DType::kF64));
  sd.insert("growth_interval", scalar_tensor(static_cast<double>(m_options.growth_interval), DType::kI64));
  sd.insert("_growth_tracker", scalar_tensor(static_cast<double>(get_growth_tracker()), DType::kI64));
  return sd;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!m_options.enabled) return;
  const std::string who = "GradScaler.load_state_dict";
  MT_CHECK(!state.empty(), who, ": the state dict is empty, possibly because it was saved from a disabled GradScaler");
  state.expect_keys("GradScaler", std::vector<std::string>(std::begin(kKeys), std::end(kKeys)));
  const double scale = state.expect("GradScaler", "scale", Shape{}, DType::kF64).item<double>();
  const double growth = state.expect("GradScaler", "growth_factor", Shape{}, DType::kF64).item<double>();
  const double backoff = state.expect("GradScaler", "backoff_factor", Shape{}, DType::kF64).item<double>();
  const int64_t interval = state.expect("GradScaler", "growth_interval", Shape{}, DType::kI64).item<int64_t>();
  const int64_t tracker = state.expect("GradScaler", "_growth_tracker", Shape{}, DType::kI64).item<int64_t>();
  check_init_scale(who, "scale", scale);
  MT_CHECK(static_cast<float>(scale) == scale, who, ": scale must be an f32 value (got ", scale, ")");
  check_growth_factor(who, "growth_factor", growth);
  check_backoff_factor(who, "backoff_factor", backoff);
  check_growth_interval(who, "growth_interval", interval);
  MT_CHECK(tracker >= 0 && tracker < interval, who, ": _growth_tracker must be in [0, growth_interval = ", interval,
           ") (got ", tracker, ")");
  // Everything checked: now change.
  m_options.init_scale = scale;
  m_options.growth_factor = growth;
  m_options.backoff_factor = backoff;
  m_options.growth_interval = interval;
  m_init_growth_tracker = tracker;
  if (m_scale.defined()) raw::fill_(m_scale, scale);
  if (m_growth_tracker.defined()) raw::fill_(m_growth_tracker, static_cast<double>(tracker));
}

}  // namespace mixtape::amp
