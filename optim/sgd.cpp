// optim/sgd.cpp — SGD (optim/sgd.h): its options, their checks, and step() as one sgd_step_ kernel call per
// (device, dtype) of each group (ops/backend/kernels.h; the formula is ops/backend/optim_math.h's).
#include <mixtape/optim/sgd.h>

#include <cmath>

#include <mixtape/ops/backend/kernels.h>

namespace mixtape::optim {

GroupOptions SGD::group_options(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options, MasterWeights master)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options, master) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults, MasterWeights master)
    : Optimizer("SGD", std::move(groups), group_options(defaults), master) {
  check_groups();
}

std::vector<Optimizer::StateBuffer> SGD::state_buffers() const { return {{"momentum_buffer", false}}; }

void SGD::check_options(const GroupOptions& o, const std::string& where) const {
  const double lr = o.get("lr"), momentum = o.get("momentum"), dampening = o.get("dampening"),
               weight_decay = o.get("weight_decay"), nesterov = o.get("nesterov"), maximize = o.get("maximize");
  MT_CHECK(lr >= 0, name(), ": ", where, ": invalid learning rate: ", lr, " (lr must be >= 0)");
  MT_CHECK(momentum >= 0, name(), ": ", where, ": invalid momentum value: ", momentum, " (momentum must be >= 0)");
  MT_CHECK(weight_decay >= 0, name(), ": ", where, ": invalid weight_decay value: ", weight_decay,
           " (weight_decay must be >= 0)");
  MT_CHECK(std::isfinite(dampening), name(), ": ", where, ": invalid dampening value: ", dampening);
  MT_CHECK(nesterov == 0 || nesterov == 1, name(), ": ", where, ": nesterov is ", nesterov, ", expected 0 or 1");
  MT_CHECK(maximize == 0 || maximize == 1, name(), ": ", where, ": maximize is ", maximize, ", expected 0 or 1");
  MT_CHECK(nesterov == 0 || (momentum > 0 && dampening == 0), name(), ": ", where,
           ": Nesterov momentum requires a momentum and zero dampening (momentum ", momentum, ", dampening ",
           dampening, ")");
}

namespace {

/// A group's options as sgd_step_ takes them.
kernels::SgdHyper sgd_hyper(const GroupOptions& o, MasterWeights master, uint64_t rounding_seed) {
  return {.lr = o.get("lr"),
          .momentum = o.get("momentum"),
          .dampening = o.get("dampening"),
          .weight_decay = o.get("weight_decay"),
          .nesterov = o.get("nesterov") != 0,
          .maximize = o.get("maximize") != 0,
          .stochastic_rounding = master == MasterWeights::kStochasticRounding,
          .seed = rounding_seed};
}

}  // namespace

void SGD::update(const Tensor& found_inf) {
  const std::vector<std::vector<Bucket>> groups = gradient_buckets();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto options = [this, g] { return sgd_hyper(param_groups()[g].options, master_weights(), rounding_seed()); };
    const kernels::SgdHyper hyper = options();
    // A CUDA graph's replays read the group's options anew; a momentum of 0 captured no buffer.
    const auto at_replay = replay_options<kernels::SgdHyper>([this, g, options, captured = hyper.momentum] {
      const kernels::SgdHyper now = options();
      MT_CHECK((now.momentum != 0) == (captured != 0), name(), ": param group ", g, ": momentum ", captured,
               " when the step was captured into a CUDA graph, ", now.momentum,
               " at its replay; a step with momentum 0 has no momentum buffer and one with momentum has (capture "
               "the step again)");
      return now;
    });
    for (const Bucket& b : groups[g]) {
      const bool master = has_master(b.params.front());
      const Tensor skip = found_inf_on(found_inf, b.params.front().device());
      std::vector<Tensor> momentum_buffers, masters, counts;
      std::vector<kernels::OptimStep> steps;
      for (size_t i : b.indices) {
        const Tensor& count = begin_update(i);
        kernels::OptimStep s{.count = static_cast<const int32_t*>(count.data_ptr()), .index = static_cast<int64_t>(i)};
        // A buffer created by a step that found_inf then skips stays zero and is not "first" at the next step, as
        // with PyTorch's fused SGD: the same result unless dampening is nonzero.
        if (hyper.momentum != 0) momentum_buffers.push_back(state_buffer(i, "momentum_buffer", &s.first_momentum));
        if (master) masters.push_back(state()[i].buffer("master"));
        steps.push_back(s);
        counts.push_back(count);
      }
      kernels::optim_count_steps_(counts, skip);
      kernels::sgd_step_(b.params, b.grads, momentum_buffers, masters, steps, hyper, skip, at_replay);
    }
  }
}

}  // namespace mixtape::optim
