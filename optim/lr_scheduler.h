// optim/lr_scheduler.h — learning-rate schedules: torch.optim.lr_scheduler's StepLR, MultiStepLR, LinearLR,
// CosineAnnealingLR, OneCycleLR and SequentialLR, number for number.
//
// A schedule owns no learning rate: it reads and writes its optimizer's group options, as PyTorch's do ("lr",
// plus "initial_lr" that the first schedule records and later ones start from; OneCycleLR also "max_lr",
// "min_lr", and the momentum it cycles). Most schedules are chainable (each step multiplies the current lr by a
// factor), so the lr may also be changed from outside between steps. Construction performs step 0, so the
// optimizer runs its first step at the schedule's first lr; call step() after optimizer.step(), once per epoch
// (OneCycleLR: once per batch).
//
//   mt::optim::AdamW opt(net.parameters(), {.lr = 1e-3});
//   auto warmup = std::make_shared<mt::optim::LinearLR>(opt, 0.1, 1.0, 5);
//   auto cosine = std::make_shared<mt::optim::CosineAnnealingLR>(opt, 45);
//   mt::optim::SequentialLR schedule(opt, {warmup, cosine}, {5});
//   for (int epoch = 0; epoch < 50; ++epoch) { train_one_epoch(); schedule.step(); }
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <mixtape/core/state_dict.h>
#include <mixtape/optim/optimizer.h>

namespace mixtape::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one epoch and writes the new learning rates into the optimizer's groups.
  virtual void step();

  /// The learning rates this schedule set last, one per group.
  const std::vector<double>& get_last_lr() const { return m_last_lr; }
  /// The number of step() calls since step 0 (PyTorch's last_epoch).
  int64_t last_epoch() const { return m_last_epoch; }
  /// Each group's "initial_lr": what the schedule scales.
  const std::vector<double>& base_lrs() const { return m_base_lrs; }
  /// The class name PyTorch gives it ("StepLR", ...), for messages.
  const std::string& name() const { return m_name; }

  /// "last_epoch" and "_step_count" (i64, 0-d), "base_lrs" and "_last_lr" (f64, one per group); SequentialLR adds
  /// its schedules' entries under "_schedulers.<i>.".
  virtual StateDict state_dict() const;
  /// Restores state_dict()'s output; a missing, unexpected, misshapen or wrongly typed entry, a count outside
  /// [-1, INT32_MAX] (last_epoch) or [0, INT32_MAX] (_step_count), or a learning rate that is negative or NaN is
  /// an error naming the key, and nothing changes then.
  virtual void load_state_dict(const StateDict& state);

 protected:
  /// `last_epoch` -1 starts a schedule (each group's "initial_lr" is set from its "lr" unless a schedule already
  /// set it); another value resumes one, and every group must have its "initial_lr".
  LRScheduler(Optimizer& optimizer, std::string name, int64_t last_epoch);

  /// Step 0; every derived constructor calls it last (it calls the virtual get_lr()).
  void initial_step();
  /// The learning rates of step last_epoch(), from the optimizer's current ones (PyTorch's chainable get_lr).
  virtual std::vector<double> get_lr() = 0;
  /// The learning rates of step last_epoch() from base_lrs() alone (PyTorch's _get_closed_form_lr); used when a
  /// SequentialLR jumps to a schedule's step 0. Schedules without a closed form use get_lr().
  virtual std::vector<double> closed_form_lr() { return get_lr(); }

  /// The optimizer, which must still exist (an error naming the schedule otherwise).
  Optimizer& optimizer() const;
  /// Each group's option `name` (the lrs, the momentum, "initial_lr" ...).
  std::vector<double> group_values(const std::string& name) const;
  /// How many times step() ran, counting step 0 (PyTorch's _step_count).
  int64_t step_count() const { return m_step_count; }

 private:
  friend class SequentialLR;
  struct Loaded {
    int64_t last_epoch = 0, step_count = 0;
    std::vector<double> base_lrs, last_lr;
  };
  /// load_state_dict's checks: the entries of `state`, read, or an error naming `who` and the key.
  Loaded read_state(const StateDict& state, const std::string& who) const;
  void commit(Loaded loaded);
  void apply(const std::vector<double>& lrs);
  /// PyTorch's step(epoch): jump to `epoch` through closed_form_lr().
  void step_to(int64_t epoch);

  Optimizer* m_optimizer;
  std::weak_ptr<const void> m_lifetime;
  std::string m_name;
  int64_t m_last_epoch;
  int64_t m_step_count = 0;
  std::vector<double> m_base_lrs;
  std::vector<double> m_last_lr;
};

/// lr × gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  int64_t m_step_size;
  double m_gamma;
};

/// lr × gamma at each milestone epoch (a milestone listed k times multiplies by gamma^k).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::vector<int64_t> m_milestones;  // sorted, repeats kept
  double m_gamma;
};

/// The factor moves linearly from start_factor (step 0) to end_factor (step total_iters), then stays.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5,
           int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  double m_start_factor, m_end_factor;
  int64_t m_total_iters;
};

/// Half a cosine from the initial lr down to eta_min over T_max epochs (and back up after, as PyTorch's does).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  int64_t m_T_max;
  double m_eta_min;
};

/// One value for every group, or one per group (PyTorch's "float or list").
struct PerGroup {
  std::vector<double> values;
  PerGroup(double v) : values{v} {}  // NOLINT(google-explicit-constructor): reads as PyTorch's float argument
  PerGroup(std::initializer_list<double> v) : values(v) {}
};

struct OneCycleLROptions {
  PerGroup max_lr = 0.0;           // required: the peak lr
  int64_t total_steps = 0;         // or epochs × steps_per_epoch
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;          // the share of the cycle spent increasing the lr
  std::string anneal_strategy = "cos";  // "cos" | "linear"
  bool cycle_momentum = true;      // cycles the optimizer's momentum (SGD's momentum, Adam's beta1) inversely
  PerGroup base_momentum = 0.85;
  PerGroup max_momentum = 0.95;
  double div_factor = 25.0;        // initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;   // min_lr = initial_lr / final_div_factor
  bool three_phase = false;
};

/// The 1cycle policy (Smith & Topin): lr up from max_lr/div_factor to max_lr, then down to min_lr, over
/// total_steps batches; step() once per batch. Stepping past total_steps is an error.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& options, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step;
    const char *start_lr, *end_lr, *start_momentum, *end_momentum;  // group option names
  };
  double anneal(double start, double end, double pct) const;

  int64_t m_total_steps;
  std::vector<Phase> m_phases;
  bool m_linear;
  bool m_cycle_momentum;
  std::string m_momentum_option;  // the optimizer's momentum_option()
};

/// Runs `schedulers` one after another: schedulers[i + 1] takes over at epoch milestones[i] (from its own step 0).
/// Every schedule must drive the same optimizer; the usual use is warmup then cosine.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones, int64_t last_epoch = -1);

  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> m_schedulers;
  std::vector<int64_t> m_milestones;
};

}  // namespace mixtape::optim
