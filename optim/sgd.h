// optim/sgd.h — stochastic gradient descent: torch.optim.SGD (momentum, dampening, Nesterov, weight decay,
// maximize) over parameter groups, f16/bf16 parameters through f32 master weights.
//
// The update of a group is one multi-tensor kernel call per (device, dtype) (optim/optimizer.h). As in PyTorch, the
// momentum buffer is created on a parameter's first step with momentum, holding that step's direction itself.
//
//   mt::optim::SGD opt(net.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <mixtape/optim/optimizer.h>

namespace mixtape::optim {

/// torch.optim.SGD's options (PyTorch requires lr; here it defaults to 1e-3). A param group's options carry the
/// same names ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"; the flags as 0 or 1).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

class SGD : public Optimizer {
 public:
  /// One param group of `params` with `options`. Errors: no parameters; a parameter that is not a floating leaf
  /// requiring grad, or given twice; lr, momentum or weight_decay < 0; nesterov without momentum > 0 and dampening 0.
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {}, MasterWeights master = MasterWeights::kF32);
  /// Param groups whose options override `defaults` by name:
  /// `SGD opt({{fc1.parameters()}, {fc2.parameters(), {{"lr", 0.01}}}}, {.lr = 0.1, .momentum = 0.9});`
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults = {}, MasterWeights master = MasterWeights::kF32);

  std::string momentum_option() const override { return "momentum"; }

  /// Adds a group after construction; the options it does not set take the constructor's defaults.
  void add_param_group(ParamGroup group) { Optimizer::add_param_group(std::move(group)); }

  /// Every option of `options` by name: a ParamGroup's options when a group sets all of them.
  static GroupOptions group_options(const SGDOptions& options);

 protected:
  void update(const Tensor& found_inf) override;
  std::vector<StateBuffer> state_buffers() const override;
  void check_options(const GroupOptions& options, const std::string& where) const override;
};

}  // namespace mixtape::optim
