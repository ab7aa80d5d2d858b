// optim/adam.h — Adam and AdamW: torch.optim.Adam (L2 weight decay on the gradient) and torch.optim.AdamW
// (decoupled weight decay, p *= 1 − lr·weight_decay), with amsgrad and maximize, over parameter groups; f16/bf16
// parameters through f32 master weights.
//
// Both are one formula (ops/backend/optim_math.h) differing in where the weight decay goes, so they share AdamBase;
// the update of a group is one adam_step_ kernel call per (device, dtype). Bias corrections use each parameter's
// own step count, as PyTorch's.
//
//   mt::optim::AdamW opt(net.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <mixtape/optim/optimizer.h>

namespace mixtape::optim {

/// torch.optim.Adam's options. A param group's options carry the names "lr", "beta1", "beta2", "eps",
/// "weight_decay", "amsgrad", "maximize" (the flags as 0 or 1).
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

/// torch.optim.AdamW's options: Adam's, with a decoupled weight decay of 1e-2 by default.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

/// What Adam and AdamW share: the options' names and checks, the state (exp_avg, exp_avg_sq, max_exp_avg_sq with
/// amsgrad), the update.
class AdamBase : public Optimizer {
 public:
  std::string momentum_option() const override { return "beta1"; }

  /// Adds a group after construction; the options it does not set take the constructor's defaults.
  void add_param_group(ParamGroup group) { Optimizer::add_param_group(std::move(group)); }

 protected:
  /// `decoupled`: AdamW's weight decay.
  AdamBase(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults, MasterWeights master,
           bool decoupled);

  void update(const Tensor& found_inf) override;
  std::vector<StateBuffer> state_buffers() const override;
  void check_options(const GroupOptions& options, const std::string& where) const override;

 private:
  bool m_decoupled;
};

class Adam : public AdamBase {
 public:
  /// One param group of `params` with `options`. Errors: no parameters; a parameter that is not a floating leaf
  /// requiring grad, or given twice; lr, eps or weight_decay < 0; a beta outside [0, 1).
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {}, MasterWeights master = MasterWeights::kF32);
  /// Param groups whose options override `defaults` by name: `Adam opt({{enc}, {dec, {{"lr", 1e-4}}}});`
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {}, MasterWeights master = MasterWeights::kF32);

  /// Every option of `options` by name: a ParamGroup's options when a group sets all of them.
  static GroupOptions group_options(const AdamOptions& options);
};

class AdamW : public AdamBase {
 public:
  /// As Adam's.
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {}, MasterWeights master = MasterWeights::kF32);
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {}, MasterWeights master = MasterWeights::kF32);

  static GroupOptions group_options(const AdamWOptions& options);
};

}  // namespace mixtape::optim
