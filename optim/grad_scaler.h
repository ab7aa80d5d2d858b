// optim/grad_scaler.h — dynamic loss scaling (PyTorch's torch.amp.GradScaler): gradients that would underflow f16
// are computed on a loss multiplied by a large scale S, divided by S before the optimizer sees them, and a step
// whose gradients overflowed is skipped while S shrinks.
//
// The one design idea: the scale, its growth tracker and every found-inf flag are one-element tensors on the
// device, and each of the scaler's passes is a kernel there (the unscale: one multi-tensor pass over an
// optimizer's gradients per device; the update: a one-thread state machine). The only host reads are step()'s
// look at found_inf, to decide whether to call the optimizer (one synchronisation a step), and get_scale() /
// state_dict(). step_on_device() is the step without that read: the optimizer's kernels take found_inf on the
// device and skip there (Optimizer::step(found_inf)), so a whole training step can run without the host waiting.
//
//   mt::amp::GradScaler scaler;                       // init_scale 65536, x2 every 2000 clean steps, x0.5 on inf
//   for (auto [x, y] : loader) {
//     opt.zero_grad();
//     mt::Tensor loss;
//     { mt::amp::Autocast ac(mt::kF16); loss = mt::cross_entropy(net.forward(x), y); }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                           // optional: clip the true gradients
//     mt::nn::utils::clip_grad_norm_(net.parameters(), 1.0);
//     scaler.step(opt);                               // skipped when a gradient is inf or NaN
//     scaler.update();
//   }
//
// Several optimizers per step: unscale_/step each, then one update() that backs off if any of them (on any device)
// saw an inf or NaN, as PyTorch's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <mixtape/core/state_dict.h>
#include <mixtape/core/tensor.h>
#include <mixtape/optim/optimizer.h>

namespace mixtape::amp {

/// PyTorch's GradScaler arguments and defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;    // 2^16; finite and > 0
  double growth_factor = 2.0;     // > 1: the scale's growth after growth_interval clean steps in a row
  double backoff_factor = 0.5;    // in (0, 1): the scale's factor after a step with an inf or NaN gradient
  int64_t growth_interval = 2000; // in [1, 2^31 − 1]
  bool enabled = true;            // false: every call passes through (scale returns the loss, step just steps)
};

class GradScaler {
 public:
  /// Checks the options (only when enabled, as PyTorch); an invalid one is an error naming it and its value.
  explicit GradScaler(GradScalerOptions options = {});

  /// loss · S, differentiable (S is a constant): backward() on it gives gradients scaled by S. The scale tensor is
  /// created on the first call, on loss's device; a later loss on another device gets a copy of it. Disabled:
  /// `loss` itself.
  Tensor scale(const Tensor& loss);
  /// Each output times S (several losses, e.g. for autograd::backward of a list).
  std::vector<Tensor> scale(const std::vector<Tensor>& outputs);

  /// Divides the optimizer's gradients by S in place (one multi-tensor pass per device over every gradient, any
  /// floating dtype) and records whether any was inf or NaN, on the device (no synchronisation). At most once per
  /// optimizer between two update()s, and not after step(); an error otherwise, naming the rule. Disabled: nothing.
  /// Unlike PyTorch, f16 gradients (of f16 parameters) are accepted and unscaled in f16, where values below 2^-25
  /// round to zero; f32 parameters under Autocast keep the full benefit of the scale.
  void unscale_(optim::Optimizer& optimizer);

  /// Unscales (unless unscale_ already did) and calls optimizer.step() unless a gradient of this optimizer was inf
  /// or NaN. Returns whether the optimizer stepped. This is the step's one host synchronisation: found_inf is read
  /// back. Once per optimizer between two update()s. Disabled: optimizer.step(), returns true.
  bool step(optim::Optimizer& optimizer);

  /// step() without its synchronisation: unscales (unless unscale_ already did) and hands found_inf to the
  /// optimizer (Optimizer::step(found_inf)), whose kernels skip the update on the device when a gradient was inf or
  /// NaN, leaving parameters, state and update counts as they were. The same results as step(), bit for bit; the
  /// skip is counted on the device (skipped_steps()). Same rules as step(): once per optimizer between two
  /// update()s. Disabled: optimizer.step().
  void step_on_device(optim::Optimizer& optimizer);

  /// The steps skipped so far by step() and step_on_device() (a host read of the device's count, when asked).
  int64_t skipped_steps() const;

  /// Which of the optimizer's parameters (indices in optimizer.parameters()) had an inf or NaN gradient at this
  /// step's unscale: the flags the unscale pass set per gradient, read back here (a synchronisation, only when
  /// asked). Ask before update(), which frees them with the step's found-inf flags, as PyTorch's update() drops its
  /// found_inf (an amp::Inspect's report keeps its own copy); an error when the optimizer was not unscaled since
  /// the last update().
  std::vector<size_t> non_finite_gradients(const optim::Optimizer& optimizer) const;

  /// The new scale from this step's found-inf flags (of every optimizer and device, combined): x backoff_factor
  /// after an inf/NaN, x growth_factor after growth_interval clean steps in a row (only if the result is finite).
  /// Runs on the scale's device; ends the step (unscale_/step may be called again). Disabled: nothing.
  void update();
  /// Sets the scale to `new_scale` (finite, > 0) instead; the growth tracker is kept. Ends the step too.
  void update(double new_scale);
  /// The same from a one-element floating tensor that does not require grad (copied: later writes to it do not
  /// reach the scaler). Read on the device, without a synchronisation.
  void update(const Tensor& new_scale);

  /// The current scale (a host read of the device scale); init_scale before the first scale(); 1.0 when disabled.
  double get_scale() const;
  /// The scale tensor itself (f32, one element, on its device): what a sync-free consumer reads. Undefined before
  /// the first scale() and when disabled.
  const Tensor& scale_tensor() const { return m_scale; }

  double get_growth_factor() const { return m_options.growth_factor; }
  void set_growth_factor(double growth_factor);
  double get_backoff_factor() const { return m_options.backoff_factor; }
  void set_backoff_factor(double backoff_factor);
  int64_t get_growth_interval() const { return m_options.growth_interval; }
  void set_growth_interval(int64_t growth_interval);
  /// Clean steps in a row since the last growth or backoff (a host read).
  int64_t get_growth_tracker() const;
  bool is_enabled() const { return m_options.enabled; }

  /// PyTorch's five entries as 0-d tensors: "scale", "growth_factor", "backoff_factor" (f64), "growth_interval",
  /// "_growth_tracker" (i64). Empty when disabled. Take it after update().
  StateDict state_dict() const;
  /// Restores state_dict()'s output. A missing, unexpected or wrongly typed key, or a value the constructor would
  /// refuse, is an error naming the key, and nothing is changed then; an empty dict is an error (it came from a
  /// disabled scaler). Disabled: nothing.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  /// One optimizer's progress through the current step, keyed by its lifetime token (not its address, which a
  /// later optimizer may reuse).
  struct OptimizerState {
    std::weak_ptr<const void> lifetime;
    Stage stage = Stage::kReady;
    std::vector<Tensor> found_inf_per_device;  // (1) f32 each, on each device its gradients live on
    // Per device: the indices (in optimizer.parameters()) of the gradients unscaled, and their flags ((n) f32,
    // 1 where that gradient held inf or NaN), set by the same pass as found_inf.
    std::vector<std::pair<std::vector<size_t>, Tensor>> tensor_flags;
  };

  OptimizerState& state_of(const optim::Optimizer& optimizer);
  /// The scale and tracker exist (scale() was called); an error naming `method` otherwise.
  void check_initialized(const char* method) const;
  /// The scale on `device` (the scale tensor itself on its own device).
  Tensor scale_on(Device device) const;
  void unscale_impl(optim::Optimizer& optimizer, OptimizerState& state);
  /// What step() and step_on_device() (`method`) do first: check the stage, unscale unless done, check that a
  /// gradient was seen. Returns the optimizer's state.
  OptimizerState& begin_step(optim::Optimizer& optimizer, const char* method);
  /// The found-inf flags (each (1) f32, 0 or 1, on any device) in one on the scale's device: 1 if any is 1 (one flag
  /// there: that flag itself, to be read only). Device to device copies, no host read; undefined for no flags.
  Tensor any_found_inf(const std::vector<Tensor>& flags) const;
  /// Every update() ends the step: the optimizers' states and their flags are freed.
  void end_step();

  GradScalerOptions m_options;
  int64_t m_init_growth_tracker = 0;
  Tensor m_scale;           // (1) f32, created by the first scale()
  Tensor m_growth_tracker;  // (1) i32, on the scale's device
  Tensor m_skipped;         // (1) f32 on the scale's device: step_on_device()'s skipped steps (exact to 2^24)
  int64_t m_skipped_read = 0;  // step()'s, which it read anyway
  std::vector<OptimizerState> m_states;  // the optimizers seen since the last update()
};

namespace detail {
/// 1/S as one f32 element on S's device, the way the unscale pass multiplies by it (Inspect's unscaled
/// statistics use the same).
Tensor reciprocal_scale(const Tensor& scale);
}  // namespace detail

}  // namespace mixtape::amp
