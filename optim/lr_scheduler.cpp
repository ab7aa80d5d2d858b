// optim/lr_scheduler.cpp — the learning-rate schedules (optim/lr_scheduler.h), following
// torch/optim/lr_scheduler.py step for step, including its chainable (recursive) forms, so that a schedule's
// learning rates equal PyTorch's to the last bits (tests/golden/lr_scheduler.json).
#include <mixtape/optim/lr_scheduler.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>

#include <mixtape/core/error.h>

namespace mixtape::optim {

namespace {

Tensor scalar_i64(int64_t v) { return from_vector<int64_t>({v}, Shape{}); }
Tensor f64_vector(const std::vector<double>& v) { return from_vector<double>(v, Shape{static_cast<int64_t>(v.size())}); }

}  // namespace

// ---- the base -----------------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name, int64_t last_epoch)
    : m_optimizer(&optimizer), m_lifetime(optimizer.lifetime()), m_name(std::move(name)), m_last_epoch(last_epoch) {
  MT_CHECK(last_epoch >= -1, m_name, ": last_epoch must be -1 (a new schedule) or the epoch to resume from, got ",
           last_epoch);
  std::vector<ParamGroup>& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupOptions& o = groups[g].options;
    if (last_epoch == -1) {
      if (!o.contains("initial_lr")) o.put("initial_lr", o.get("lr"));
    } else {
      MT_CHECK(o.contains("initial_lr"), m_name, ": param_groups[", g,
               "] has no 'initial_lr' to resume from (last_epoch ", last_epoch, ")");
    }
    m_base_lrs.push_back(o.get("initial_lr"));
  }
}

Optimizer& LRScheduler::optimizer() const {
  MT_CHECK(!m_lifetime.expired(), m_name, ": its optimizer was destroyed; a schedule needs the optimizer it drives");
  return *m_optimizer;
}

std::vector<double> LRScheduler::group_values(const std::string& name) const {
  std::vector<double> out;
  for (const ParamGroup& g : optimizer().param_groups()) out.push_back(g.options.get(name));
  return out;
}

void LRScheduler::initial_step() {
  m_step_count = 0;
  step();
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  std::vector<ParamGroup>& groups = optimizer().param_groups();
  MT_CHECK(lrs.size() == groups.size(), m_name, ": the optimizer has ", groups.size(),
           " param groups, the schedule was made for ", lrs.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options.set("lr", lrs[g]);
  m_last_lr = lrs;
}

void LRScheduler::step() {
  optimizer();  // a destroyed optimizer is an error before anything changes
  ++m_step_count;
  ++m_last_epoch;
  apply(get_lr());
}

void LRScheduler::step_to(int64_t epoch) {
  optimizer();
  ++m_step_count;
  m_last_epoch = epoch;
  apply(closed_form_lr());
}

StateDict LRScheduler::state_dict() const {
  StateDict sd;
  sd.insert("last_epoch", scalar_i64(m_last_epoch));
  sd.insert("_step_count", scalar_i64(m_step_count));
  sd.insert("base_lrs", f64_vector(m_base_lrs));
  sd.insert("_last_lr", f64_vector(m_last_lr));
  return sd;
}

LRScheduler::Loaded LRScheduler::read_state(const StateDict& state, const std::string& who) const {
  state.expect_keys(who, {"last_epoch", "_step_count", "base_lrs", "_last_lr"});
  const auto groups = static_cast<int64_t>(m_base_lrs.size());
  // The values a schedule can reach: counts from -1 (a SequentialLR's later schedules before their turn) or 0
  // (a SequentialLR's own step count) on, bounded so that stepping on cannot overflow; learning rates an optimizer
  // takes (>= 0, not NaN).
  auto count = [&](const char* key, int64_t min) {
    const int64_t v = state.expect(who, key, Shape{}, DType::kI64).item<int64_t>();
    MT_CHECK(v >= min && v <= INT32_MAX, who, ".load_state_dict: '", key, "' is ", v, ", expected a count in [", min,
             ", ", INT32_MAX, "]");
    return v;
  };
  auto rates = [&](const char* key) {
    std::vector<double> v = state.expect(who, key, Shape{groups}, DType::kF64).to_vector<double>();
    for (size_t g = 0; g < v.size(); ++g)
      MT_CHECK(v[g] >= 0, who, ".load_state_dict: '", key, "'[", g, "] is ", v[g], ", not a learning rate (>= 0)");
    return v;
  };
  Loaded l;
  l.last_epoch = count("last_epoch", -1);
  l.step_count = count("_step_count", 0);
  l.base_lrs = rates("base_lrs");
  l.last_lr = rates("_last_lr");
  return l;
}

void LRScheduler::commit(Loaded l) {
  m_last_epoch = l.last_epoch;
  m_step_count = l.step_count;
  m_base_lrs = std::move(l.base_lrs);
  m_last_lr = std::move(l.last_lr);
}

void LRScheduler::load_state_dict(const StateDict& state) { commit(read_state(state, m_name)); }

// ---- StepLR, MultiStepLR, LinearLR, CosineAnnealingLR ---------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, "StepLR", last_epoch), m_step_size(step_size), m_gamma(gamma) {
  MT_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> lr = group_values("lr");
  if (last_epoch() == 0 || last_epoch() % m_step_size != 0) return lr;
  for (double& v : lr) v *= m_gamma;
  return lr;
}

std::vector<double> StepLR::closed_form_lr() {
  std::vector<double> lr = base_lrs();
  for (double& v : lr) v *= std::pow(m_gamma, static_cast<double>(last_epoch() / m_step_size));
  return lr;
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, "MultiStepLR", last_epoch), m_milestones(std::move(milestones)), m_gamma(gamma) {
  std::sort(m_milestones.begin(), m_milestones.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  std::vector<double> lr = group_values("lr");
  const auto hits = std::count(m_milestones.begin(), m_milestones.end(), last_epoch());
  if (hits == 0) return lr;
  for (double& v : lr) v *= std::pow(m_gamma, static_cast<double>(hits));
  return lr;
}

std::vector<double> MultiStepLR::closed_form_lr() {
  const auto passed = std::upper_bound(m_milestones.begin(), m_milestones.end(), last_epoch()) - m_milestones.begin();
  std::vector<double> lr = base_lrs();
  for (double& v : lr) v *= std::pow(m_gamma, static_cast<double>(passed));
  return lr;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters,
                   int64_t last_epoch)
    : LRScheduler(optimizer, "LinearLR", last_epoch),
      m_start_factor(start_factor),
      m_end_factor(end_factor),
      m_total_iters(total_iters) {
  MT_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  MT_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ", end_factor);
  MT_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lr = group_values("lr");
  const int64_t e = last_epoch();
  if (e > m_total_iters) return lr;
  // Chainable: the ratio of factor(e) to factor(e - 1).
  const double factor =
      e == 0 ? m_start_factor
             : 1.0 + (m_end_factor - m_start_factor) /
                         (static_cast<double>(m_total_iters) * m_start_factor +
                          static_cast<double>(e - 1) * (m_end_factor - m_start_factor));
  for (double& v : lr) v *= factor;
  return lr;
}

std::vector<double> LinearLR::closed_form_lr() {
  const double done = static_cast<double>(std::min(m_total_iters, last_epoch())) / static_cast<double>(m_total_iters);
  std::vector<double> lr = base_lrs();
  for (double& v : lr) v *= m_start_factor + (m_end_factor - m_start_factor) * done;
  return lr;
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min, int64_t last_epoch)
    : LRScheduler(optimizer, "CosineAnnealingLR", last_epoch), m_T_max(T_max), m_eta_min(eta_min) {
  MT_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", T_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  constexpr double pi = std::numbers::pi;
  const auto e = static_cast<double>(last_epoch()), T = static_cast<double>(m_T_max);
  std::vector<double> lr = group_values("lr");
  const std::vector<double>& base = base_lrs();
  if (last_epoch() == 0) return lr;
  if (step_count() == 1 && last_epoch() > 0) {  // resumed at last_epoch: the closed form
    for (size_t g = 0; g < lr.size(); ++g) lr[g] = m_eta_min + (base[g] - m_eta_min) * (1 + std::cos(e * pi / T)) / 2;
    return lr;
  }
  // Chainable, as PyTorch's: at the bottom of each period the lr climbs back by one step.
  if ((last_epoch() - 1 - m_T_max) % (2 * m_T_max) == 0) {
    for (size_t g = 0; g < lr.size(); ++g) lr[g] += (base[g] - m_eta_min) * (1 - std::cos(pi / T)) / 2;
    return lr;
  }
  for (double& v : lr)
    v = (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (v - m_eta_min) + m_eta_min;
  return lr;
}

std::vector<double> CosineAnnealingLR::closed_form_lr() {
  constexpr double pi = std::numbers::pi;
  const auto e = static_cast<double>(last_epoch()), T = static_cast<double>(m_T_max);
  std::vector<double> lr = base_lrs();
  for (double& v : lr) v = m_eta_min + (v - m_eta_min) * (1 + std::cos(pi * e / T)) / 2;
  return lr;
}

// ---- OneCycleLR ----------------------------------------------------------------------------------------------

namespace {

std::vector<double> per_group(const PerGroup& p, size_t groups, const char* what) {
  if (p.values.size() == 1) return std::vector<double>(groups, p.values[0]);
  MT_CHECK(p.values.size() == groups, "OneCycleLR: expected ", groups, " values for ", what, ", got ",
           p.values.size());
  return p.values;
}

/// The group options OneCycleLR sets before the base constructor reads "initial_lr" (PyTorch sets them in its
/// constructor before calling the base's).
Optimizer& prepare_one_cycle(Optimizer& optimizer, const OneCycleLROptions& o, int64_t last_epoch) {
  MT_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
           "OneCycleLR: anneal_strategy must be 'cos' or 'linear', got '", o.anneal_strategy, "'");
  MT_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start);
  std::vector<ParamGroup>& groups = optimizer.param_groups();
  const std::vector<double> max_lr = per_group(o.max_lr, groups.size(), "max_lr");
  if (last_epoch == -1)
    for (size_t g = 0; g < groups.size(); ++g) {
      GroupOptions& opt = groups[g].options;
      opt.put("initial_lr", max_lr[g] / o.div_factor);
      opt.put("max_lr", max_lr[g]);
      opt.put("min_lr", max_lr[g] / o.div_factor / o.final_div_factor);
    }
  if (o.cycle_momentum) {
    const std::string momentum = optimizer.momentum_option();
    const std::vector<double> max_m = per_group(o.max_momentum, groups.size(), "max_momentum");
    const std::vector<double> base_m = per_group(o.base_momentum, groups.size(), "base_momentum");
    if (last_epoch == -1)
      for (size_t g = 0; g < groups.size(); ++g) {
        GroupOptions& opt = groups[g].options;
        opt.set(momentum, max_m[g]);
        opt.put("max_momentum", max_m[g]);
        opt.put("base_momentum", base_m[g]);
      }
  }
  return optimizer;
}

int64_t one_cycle_total_steps(const OneCycleLROptions& o) {
  if (o.total_steps != 0) {
    MT_CHECK(o.total_steps > 0, "OneCycleLR: expected a positive total_steps, got ", o.total_steps);
    return o.total_steps;
  }
  MT_CHECK(o.epochs > 0 && o.steps_per_epoch > 0,
           "OneCycleLR: give total_steps, or epochs and steps_per_epoch (positive), got epochs ", o.epochs,
           " and steps_per_epoch ", o.steps_per_epoch);
  return o.epochs * o.steps_per_epoch;
}

}  // namespace

OneCycleLR::OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& options, int64_t last_epoch)
    : LRScheduler(prepare_one_cycle(optimizer, options, last_epoch), "OneCycleLR", last_epoch),
      m_total_steps(one_cycle_total_steps(options)),
      m_linear(options.anneal_strategy == "linear"),
      m_cycle_momentum(options.cycle_momentum),
      m_momentum_option(options.cycle_momentum ? optimizer.momentum_option() : "") {
  const auto total = static_cast<double>(m_total_steps);
  if (options.three_phase) {
    m_phases = {{options.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
                {2 * options.pct_start * total - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"},
                {total - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
  } else {
    m_phases = {{options.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
                {total - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"}};
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (m_linear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch();
  MT_CHECK(step_num <= m_total_steps, "OneCycleLR: tried to step ", step_num + 1,
           " times; the specified number of total steps is ", m_total_steps);
  std::vector<ParamGroup>& groups = optimizer().param_groups();
  std::vector<double> lrs;
  for (ParamGroup& group : groups) {
    GroupOptions& o = group.options;
    double start_step = 0, lr = 0, momentum = 0;
    for (size_t i = 0; i < m_phases.size(); ++i) {
      const Phase& phase = m_phases[i];
      if (static_cast<double>(step_num) <= phase.end_step || i + 1 == m_phases.size()) {
        const double pct = (static_cast<double>(step_num) - start_step) / (phase.end_step - start_step);
        lr = anneal(o.get(phase.start_lr), o.get(phase.end_lr), pct);
        if (m_cycle_momentum) momentum = anneal(o.get(phase.start_momentum), o.get(phase.end_momentum), pct);
        break;
      }
      start_step = phase.end_step;
    }
    lrs.push_back(lr);
    if (m_cycle_momentum) o.set(m_momentum_option, momentum);
  }
  return lrs;
}

// ---- SequentialLR --------------------------------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones, int64_t last_epoch)
    : LRScheduler(optimizer, "SequentialLR", last_epoch),
      m_schedulers(std::move(schedulers)),
      m_milestones(std::move(milestones)) {
  MT_CHECK(!m_schedulers.empty(), "SequentialLR: expects at least one schedule");
  for (size_t i = 0; i < m_schedulers.size(); ++i) {
    MT_CHECK(m_schedulers[i] != nullptr, "SequentialLR: schedule ", i, " is null");
    MT_CHECK(dynamic_cast<const SequentialLR*>(m_schedulers[i].get()) == nullptr, "SequentialLR: schedule ", i,
             " is itself a SequentialLR; list its schedules instead");
    MT_CHECK(m_schedulers[i]->m_optimizer == &optimizer && !m_schedulers[i]->m_lifetime.expired(),
             "SequentialLR: every schedule must drive the same optimizer, but schedule ", i, " (",
             m_schedulers[i]->name(), ") drives another");
  }
  MT_CHECK(m_milestones.size() + 1 == m_schedulers.size(), "SequentialLR: expects one milestone fewer than schedules, got ",
           m_schedulers.size(), " schedules and ", m_milestones.size(), " milestones");
  MT_CHECK(std::is_sorted(m_milestones.begin(), m_milestones.end()), "SequentialLR: milestones must be increasing");
  m_last_epoch = last_epoch + 1;
  // As PyTorch's: back to the initial lrs, undo the step 0 each schedule's constructor made, and redo the first's.
  for (ParamGroup& group : optimizer.param_groups()) group.options.set("lr", group.options.get("initial_lr"));
  for (const auto& s : m_schedulers) --s->m_last_epoch;
  m_schedulers.front()->initial_step();
  m_last_lr = m_schedulers.front()->get_last_lr();
}

std::vector<double> SequentialLR::get_lr() { return m_last_lr; }

void SequentialLR::step() {
  optimizer();
  ++m_last_epoch;
  const auto idx =
      static_cast<size_t>(std::upper_bound(m_milestones.begin(), m_milestones.end(), m_last_epoch) - m_milestones.begin());
  LRScheduler& s = *m_schedulers[idx];
  if (idx > 0 && m_milestones[idx - 1] == m_last_epoch)
    s.step_to(0);  // the next schedule starts from its own step 0, from its base lrs
  else
    s.step();
  m_last_lr = s.get_last_lr();
}

StateDict SequentialLR::state_dict() const {
  StateDict sd = LRScheduler::state_dict();
  for (size_t i = 0; i < m_schedulers.size(); ++i)
    for (const auto& [key, t] : m_schedulers[i]->state_dict())
      sd.insert("_schedulers." + std::to_string(i) + "." + key, t);
  return sd;
}

void SequentialLR::load_state_dict(const StateDict& state) {
  StateDict own;
  std::vector<StateDict> parts(m_schedulers.size());
  for (const auto& [key, t] : state) {
    const std::string prefix = "_schedulers.";
    if (key.starts_with(prefix)) {
      const size_t dot = key.find('.', prefix.size());
      const std::string index = key.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
      size_t i = m_schedulers.size();  // stays out of range unless the index is all digits and fits
      if (dot != std::string::npos && !index.empty() && index.find_first_not_of("0123456789") == std::string::npos)
        std::from_chars(index.data(), index.data() + index.size(), i);
      MT_CHECK(i < m_schedulers.size(), "SequentialLR.load_state_dict: unexpected key '", key, "' (",
               m_schedulers.size(), " schedules)");
      parts[i].insert(key.substr(dot + 1), t);
    } else {
      own.insert(key, t);
    }
  }
  // Every entry is read and checked before anything changes.
  Loaded mine = read_state(own, name());
  std::vector<Loaded> theirs;
  for (size_t i = 0; i < m_schedulers.size(); ++i)
    theirs.push_back(m_schedulers[i]->read_state(parts[i], name() + "._schedulers." + std::to_string(i)));
  commit(std::move(mine));
  for (size_t i = 0; i < m_schedulers.size(); ++i) m_schedulers[i]->commit(std::move(theirs[i]));
}

}  // namespace mixtape::optim
