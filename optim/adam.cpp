// optim/adam.cpp — Adam and AdamW (optim/adam.h): their options, the checks torch.optim makes of them, and step() as
// one adam_step_ kernel call per (device, dtype) of each group (ops/backend/kernels.h; the formula is
// ops/backend/optim_math.h's).
#include <mixtape/optim/adam.h>

#include <mixtape/ops/backend/kernels.h>

namespace mixtape::optim {

namespace {

template <class Options>
GroupOptions adam_group_options(const Options& o) {
  return {{"lr", o.lr},
          {"beta1", o.betas.first},
          {"beta2", o.betas.second},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

}  // namespace

AdamBase::AdamBase(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults, MasterWeights master,
                   bool decoupled)
    : Optimizer(std::move(name), std::move(groups), std::move(defaults), master), m_decoupled(decoupled) {}

std::vector<Optimizer::StateBuffer> AdamBase::state_buffers() const {
  return {{"exp_avg", true}, {"exp_avg_sq", true}, {"max_exp_avg_sq", false}};
}

void AdamBase::check_options(const GroupOptions& o, const std::string& where) const {
  const double lr = o.get("lr"), beta1 = o.get("beta1"), beta2 = o.get("beta2"), eps = o.get("eps"),
               weight_decay = o.get("weight_decay"), amsgrad = o.get("amsgrad"), maximize = o.get("maximize");
  MT_CHECK(lr >= 0, name(), ": ", where, ": invalid learning rate: ", lr, " (lr must be >= 0)");
  MT_CHECK(eps >= 0, name(), ": ", where, ": invalid epsilon value: ", eps, " (eps must be >= 0)");
  MT_CHECK(beta1 >= 0 && beta1 < 1, name(), ": ", where, ": invalid beta parameter at index 0: ", beta1,
           " (betas must be in [0, 1))");
  MT_CHECK(beta2 >= 0 && beta2 < 1, name(), ": ", where, ": invalid beta parameter at index 1: ", beta2,
           " (betas must be in [0, 1))");
  MT_CHECK(weight_decay >= 0, name(), ": ", where, ": invalid weight_decay value: ", weight_decay,
           " (weight_decay must be >= 0)");
  MT_CHECK(amsgrad == 0 || amsgrad == 1, name(), ": ", where, ": amsgrad is ", amsgrad, ", expected 0 or 1");
  MT_CHECK(maximize == 0 || maximize == 1, name(), ": ", where, ": maximize is ", maximize, ", expected 0 or 1");
}

namespace {

/// A group's options as adam_step_ takes them.
kernels::AdamHyper adam_hyper(const GroupOptions& o, bool decoupled, MasterWeights master, uint64_t rounding_seed) {
  return {.lr = o.get("lr"),
          .beta1 = o.get("beta1"),
          .beta2 = o.get("beta2"),
          .eps = o.get("eps"),
          .weight_decay = o.get("weight_decay"),
          .decoupled_weight_decay = decoupled,
          .amsgrad = o.get("amsgrad") != 0,
          .maximize = o.get("maximize") != 0,
          .stochastic_rounding = master == MasterWeights::kStochasticRounding,
          .seed = rounding_seed};
}

}  // namespace

void AdamBase::update(const Tensor& found_inf) {
  const std::vector<std::vector<Bucket>> groups = gradient_buckets();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto options = [this, g] {
      return adam_hyper(param_groups()[g].options, m_decoupled, master_weights(), rounding_seed());
    };
    const kernels::AdamHyper hyper = options();
    // A CUDA graph's replays read the group's options anew; amsgrad chose the captured kernels and buffers.
    const auto at_replay = replay_options<kernels::AdamHyper>([this, g, options, captured = hyper.amsgrad] {
      const kernels::AdamHyper now = options();
      MT_CHECK(now.amsgrad == captured, name(), ": param group ", g, ": amsgrad ", captured ? "on" : "off",
               " when the step was captured into a CUDA graph, ", now.amsgrad ? "on" : "off",
               " at its replay; it chose the captured kernels and buffers (capture the step again)");
      return now;
    });
    for (const Bucket& b : groups[g]) {
      const bool master = has_master(b.params.front());
      const Tensor skip = found_inf_on(found_inf, b.params.front().device());
      std::vector<Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, counts;
      std::vector<kernels::OptimStep> steps;
      for (size_t i : b.indices) {
        const Tensor& count = begin_update(i);
        steps.push_back({.count = static_cast<const int32_t*>(count.data_ptr()), .index = static_cast<int64_t>(i)});
        counts.push_back(count);
        exp_avgs.push_back(state_buffer(i, "exp_avg"));
        exp_avg_sqs.push_back(state_buffer(i, "exp_avg_sq"));
        // Created zero on the first step with amsgrad (a group may turn it on later): max(0, v) = v.
        if (hyper.amsgrad) max_exp_avg_sqs.push_back(state_buffer(i, "max_exp_avg_sq"));
        if (master) masters.push_back(state()[i].buffer("master"));
      }
      kernels::optim_count_steps_(counts, skip);
      kernels::adam_step_(b.params, b.grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, hyper, skip,
                          at_replay);
    }
  }
}

GroupOptions Adam::group_options(const AdamOptions& options) { return adam_group_options(options); }

Adam::Adam(std::vector<Tensor> params, AdamOptions options, MasterWeights master)
    : Adam(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options, master) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults, MasterWeights master)
    : AdamBase("Adam", std::move(groups), group_options(defaults), master, /*decoupled=*/false) {
  check_groups();
}

GroupOptions AdamW::group_options(const AdamWOptions& options) { return adam_group_options(options); }

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options, MasterWeights master)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options, master) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults, MasterWeights master)
    : AdamBase("AdamW", std::move(groups), group_options(defaults), master, /*decoupled=*/true) {
  check_groups();
}

}  // namespace mixtape::optim
