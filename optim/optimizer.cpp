// optim/optimizer.cpp — what every optimizer shares (optim/optimizer.h): parameter groups and their options, the
// checks of the parameters and their gradients, per-parameter state with masters, zero_grad, state_dict.
//
// The one design idea: the base owns everything that is not the update formula. A derived optimizer's update()
// asks gradient_buckets() for each group's parameters that have a gradient, grouped by (device, dtype) and already
// checked, starts each parameter's update (begin_update: its update count, its master), fetches its buffers
// (state_buffer, created lazily as in PyTorch) and hands the lists to one multi-tensor kernel call per bucket.
// Update counts live beside the parameters, as one-element tensors that kernels advance and read, so that a step
// whose found_inf says to skip it (step(found_inf)) is decided on the device and leaves them as they were.
#include <mixtape/optim/optimizer.h>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include <mixtape/core/random.h>
#include <mixtape/core/raw.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/optim/inspect.h>

namespace mixtape::optim {

namespace {

std::string option_names(const std::vector<std::pair<std::string, double>>& items) {
  std::ostringstream os;
  for (size_t i = 0; i < items.size(); ++i) os << (i ? ", " : "") << items[i].first;
  return os.str();
}

std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << " " << t.shape() << " on " << t.device();
  return os.str();
}

Tensor i64_scalar(int64_t v) { return from_vector<int64_t>({v}, Shape{}); }

}  // namespace

// ---- GroupOptions ----------------------------------------------------------------------------

GroupOptions::GroupOptions(std::initializer_list<std::pair<std::string, double>> items) {
  for (const auto& [name, value] : items) {
    MT_CHECK(!contains(name), "GroupOptions: the option '", name, "' is given twice");
    m_items.emplace_back(name, value);
  }
}

double GroupOptions::get(const std::string& name) const {
  for (const auto& [n, v] : m_items)
    if (n == name) return v;
  MT_ERROR("GroupOptions::get: no option '", name, "' (the options: ", option_names(m_items), ")");
}

void GroupOptions::set(const std::string& name, double value) {
  for (auto& [n, v] : m_items)
    if (n == name) {
      v = value;
      return;
    }
  MT_ERROR("GroupOptions::set: no option '", name, "' (the options: ", option_names(m_items), ")");
}

bool GroupOptions::contains(const std::string& name) const {
  return std::any_of(m_items.begin(), m_items.end(), [&](const auto& item) { return item.first == name; });
}

// ---- ParamState ------------------------------------------------------------------------------

Tensor& Optimizer::ParamState::buffer(const std::string& name) {
  for (auto& [n, t] : buffers)
    if (n == name) return t;
  MT_ERROR("Optimizer: a parameter's state has no buffer '", name, "'");
}

bool Optimizer::ParamState::has(const std::string& name) const {
  return std::any_of(buffers.begin(), buffers.end(), [&](const auto& b) { return b.first == name; });
}

// ---- construction and groups -----------------------------------------------------------------

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults)
    : Optimizer(std::move(name), std::move(groups), std::move(defaults), MasterWeights::kF32) {}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults, MasterWeights master)
    : m_name(std::move(name)), m_defaults(std::move(defaults)), m_master(master) {
  size_t total = 0;
  for (const ParamGroup& g : groups) total += g.params.size();
  MT_CHECK(total > 0, m_name, ": got an empty parameter list");
  if (m_master == MasterWeights::kStochasticRounding) {
    // One draw of the default generator: manual_seed before construction reproduces the run.
    Generator& gen = default_generator();
    const auto [seed, counter] = gen.reserve(1);
    m_rounding_seed = seed ^ (counter * 0x9E3779B97F4A7C15ull + 0x6F7074696D53524Eull);
  }
  for (ParamGroup& g : groups) {
    g.options = merged_options(g.options, m_groups.size());
    check_group(g, m_groups.size(), m_state.size());
    m_state.resize(m_state.size() + g.params.size());
    m_groups.push_back(std::move(g));
  }
}

GroupOptions Optimizer::merged_options(const GroupOptions& options, size_t group_index) const {
  GroupOptions merged = m_defaults;
  for (const auto& [n, v] : options.items()) {
    MT_CHECK(m_defaults.contains(n), m_name, ": param group ", group_index, " sets '", n,
             "', which is not an option of ", m_name, " (its options: ", option_names(m_defaults.items()), ")");
    merged.set(n, v);
  }
  return merged;
}

void Optimizer::check_group(const ParamGroup& group, size_t group_index, size_t first_index) const {
  std::unordered_set<const TensorImpl*> seen;
  for (const ParamGroup& g : m_groups)
    for (const Tensor& p : g.params) seen.insert(p.impl());
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    const size_t index = first_index + k;
    MT_CHECK(p.defined(), m_name, ": parameter ", index, " (param group ", group_index, ") is an undefined tensor");
    MT_CHECK(is_floating(p.dtype()), m_name, ": can only optimize floating tensors, but parameter ", index, " is ",
             describe(p));
    MT_CHECK(p.is_leaf(), m_name, ": can't optimize a non-leaf tensor: parameter ", index, " (", describe(p),
             ") is the output of '", p.grad_fn_name(), "'");
    MT_CHECK(p.requires_grad(), m_name, ": parameter ", index, " (", describe(p),
             ") does not require grad (call requires_grad_() on it, or leave it out)");
    MT_CHECK(seen.insert(p.impl()).second, m_name, ": parameter ", index,
             " appears twice (some parameters appear in more than one parameter group, or twice in one)");
    MT_CHECK(m_master != MasterWeights::kStochasticRounding || p.dtype() != DType::kF16, m_name,
             ": MasterWeights::kStochasticRounding rounds into bf16, but parameter ", index, " is ", describe(p),
             " (use MasterWeights::kF32 for f16 parameters)");
    const Tensor& g = p.grad();
    MT_CHECK(!g.defined() || g.device() == p.device(), m_name, ": parameter ", index, " is on ", p.device(),
             " but its gradient is on ", g.device(), " (a parameter on two devices)");
  }
}

void Optimizer::add_param_group(ParamGroup group) {
  MT_CHECK(!group.params.empty(), m_name, ".add_param_group: the group has no parameters");
  group.options = merged_options(group.options, m_groups.size());
  check_options(group.options, "param group " + std::to_string(m_groups.size()));
  check_group(group, m_groups.size(), m_state.size());
  m_state.resize(m_state.size() + group.params.size());
  m_groups.push_back(std::move(group));
  ++m_generation;
}

std::vector<Optimizer::StateBuffer> Optimizer::state_buffers() const { return {}; }

void Optimizer::check_options(const GroupOptions&, const std::string&) const {}

void Optimizer::check_groups() const {
  for (size_t g = 0; g < m_groups.size(); ++g) check_options(m_groups[g].options, "param group " + std::to_string(g));
}

// ---- parameters, gradients, learning rates -------------------------------------------------------

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const ParamGroup& g : m_groups) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

void Optimizer::step() { update_and_note(Tensor()); }

void Optimizer::step(const Tensor& found_inf) {
  MT_CHECK(found_inf.defined(), m_name, ".step(found_inf): found_inf is undefined");
  MT_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::kF32, m_name,
           ".step(found_inf): expected a one-element f32 tensor, got ", found_inf.dtype(), " of shape ",
           found_inf.shape());
  update_and_note(found_inf);
}

void Optimizer::update_and_note(const Tensor& found_inf) {
  for (ParamState& s : m_state) s.updating = false;
  update(found_inf);
  for (size_t i = 0; i < m_state.size(); ++i) {
    ParamState& s = m_state[i];
    if (!s.updating) continue;
    const Tensor& p = parameters_at(i);
    s.written_storage = p.storage();
    s.written_version = p.version();
    s.updating = false;
  }
}

Tensor Optimizer::found_inf_on(const Tensor& found_inf, Device device) {
  if (!found_inf.defined() || found_inf.device() == device) return found_inf;
  return raw::to(found_inf, device);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const ParamGroup& g : m_groups)
    for (const Tensor& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        // A const handle still shares the parameter's TensorImpl, where the gradient lives.
        Tensor(p).set_grad(Tensor());
      } else {
        raw::fill_(p.grad(), 0.0);
      }
    }
}

double Optimizer::lr(size_t group) const {
  MT_CHECK(group < m_groups.size(), m_name, ".lr: no param group ", group, " (", m_groups.size(), " groups)");
  return m_groups[group].options.get("lr");
}

void Optimizer::set_lr(size_t group, double lr) {
  MT_CHECK(group < m_groups.size(), m_name, ".set_lr: no param group ", group, " (", m_groups.size(), " groups)");
  MT_CHECK(lr >= 0, m_name, ".set_lr: invalid learning rate ", lr, " for param group ", group, " (lr must be >= 0)");
  m_groups[group].options.set("lr", lr);
}

// ---- state --------------------------------------------------------------------------------------

bool Optimizer::has_master(const Tensor& param) const {
  return m_master == MasterWeights::kF32 && is_reduced_float(param.dtype());
}

DType Optimizer::state_dtype(const Tensor& param) const {
  return is_reduced_float(param.dtype()) && m_master != MasterWeights::kNone ? DType::kF32 : param.dtype();
}

std::vector<std::vector<Optimizer::Bucket>> Optimizer::gradient_buckets() const {
  std::vector<std::vector<Bucket>> out(m_groups.size());
  size_t index = 0;
  for (size_t gi = 0; gi < m_groups.size(); ++gi) {
    for (const Tensor& p : m_groups[gi].params) {
      const size_t i = index++;
      const Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      MT_CHECK(grad.device() == p.device(), m_name, ".step: parameter ", i, " is on ", p.device(),
               " but its gradient is on ", grad.device(), " (a parameter on two devices)");
      MT_CHECK(grad.dtype() == p.dtype(), m_name, ".step: parameter ", i, " is ", p.dtype(),
               " but its gradient is ", grad.dtype());
      MT_CHECK(grad.shape() == p.shape(), m_name, ".step: parameter ", i, " has shape ", p.shape(),
               " but its gradient has shape ", grad.shape());
      for (const auto& [name, t] : m_state[i].buffers) {
        const DType want = name == "master" ? DType::kF32 : state_dtype(p);
        MT_CHECK(t.device() == p.device() && t.dtype() == want && t.shape() == p.shape(), m_name, ".step: parameter ",
                 i, " is ", describe(p), " but its state '", name, "' is ", describe(t),
                 " (a parameter on two devices, or moved or cast after its first step: create the optimizer, or load "
                 "its state_dict, after moving the parameters)");
      }
      std::vector<Bucket>& buckets = out[gi];
      auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
        return b.params.front().device() == p.device() && b.params.front().dtype() == p.dtype();
      });
      if (it == buckets.end()) it = buckets.insert(buckets.end(), Bucket{});
      it->indices.push_back(i);
      it->params.push_back(p);
      it->grads.push_back(grad);
    }
  }
  return out;
}

Tensor& Optimizer::begin_update(size_t i) {
  ParamState& s = m_state.at(i);
  const Tensor& p = parameters_at(i);
  const auto master =
      std::find_if(s.buffers.begin(), s.buffers.end(), [](const auto& b) { return b.first == "master"; });
  if (!has_master(p)) {
    if (master != s.buffers.end()) s.buffers.erase(master);  // cast to f32 (or f64) since: updated in place now
  } else if (master == s.buffers.end()) {
    s.buffers.emplace_back("master", raw::clone(raw::to(p, DType::kF32)));
  } else if (s.written_storage.lock() != p.storage() || s.written_version != p.version()) {
    // Written since the last step (or the state was loaded): where the parameter no longer holds the master's
    // rounding, it holds what someone wrote, and the update starts from that. Elsewhere the master keeps its extra
    // bits, so loading a model and its optimizer from one checkpoint, in either order, resumes exactly. Into the
    // master's own memory (a CUDA graph may hold its address); on the device, nothing read back.
    Tensor& m = master->second;
    const Tensor kept = kernels::binary(kernels::BinaryOp::kEq, raw::to(m, p.dtype()), p);
    raw::copy_(m, kernels::where(kept, m, raw::to(p, DType::kF32)));
  }
  s.updating = true;
  if (!s.step.defined()) s.step = zeros({}, TensorOptions(DType::kI32).device(p.device()));
  // A count is a count on any device: it follows a parameter moved after its first step (an optimizer without
  // buffers, plain SGD, may go on; one with buffers is stopped by gradient_buckets' check).
  if (s.step.device() != p.device()) s.step = raw::to(s.step, p.device());
  amp::detail::inspect_note_update(p, i, has_master(p) ? s.buffer("master") : p);  // the lost-update meter
  return s.step;
}

Tensor& Optimizer::state_buffer(size_t i, const std::string& name, bool* created) {
  ParamState& s = m_state.at(i);
  const bool absent = !s.has(name);
  if (absent) {
    const Tensor& p = parameters_at(i);
    s.buffers.emplace_back(name, zeros(p.shape(), TensorOptions(state_dtype(p)).device(p.device())));
  }
  if (created != nullptr) *created = absent;
  return s.buffer(name);
}

const Tensor& Optimizer::parameters_at(size_t i) const {
  for (const ParamGroup& g : m_groups) {
    if (i < g.params.size()) return g.params[i];
    i -= g.params.size();
  }
  MT_ERROR(m_name, ": no parameter ", i);
}

// ---- state_dict ---------------------------------------------------------------------------------

StateDict Optimizer::state_dict() const {
  StateDict sd;
  size_t index = 0;
  for (size_t g = 0; g < m_groups.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    for (const auto& [name, value] : m_groups[g].options.items())
      sd.insert(prefix + name, scalar_tensor(value, DType::kF64));
    std::vector<int64_t> indices;
    for (size_t k = 0; k < m_groups[g].params.size(); ++k) indices.push_back(static_cast<int64_t>(index++));
    sd.insert(prefix + "params", from_vector<int64_t>(indices, Shape{static_cast<int64_t>(indices.size())}));
  }
  for (size_t i = 0; i < m_state.size(); ++i) {
    const ParamState& s = m_state[i];
    // The count is read back (a synchronisation per parameter on a GPU, only here): a parameter whose every update
    // was skipped on the device has no state to save, as if never stepped.
    const int64_t step = s.step.defined() ? s.step.item<int32_t>() : 0;
    if (step == 0) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    sd.insert(prefix + "step", i64_scalar(step));
    // A master left from before a cast to f32 is no state; one a cast back has not made yet is the parameter's value
    // (what the next step starts from), so that load_state_dict, which expects it, takes this dict back.
    const Tensor& p = parameters_at(i);
    const bool master = has_master(p);
    if (master && !s.has("master")) sd.insert(prefix + "master", raw::to(p, DType::kF32));
    for (const auto& [name, t] : s.buffers)
      if (name != "master" || master) sd.insert(prefix + name, t);
  }
  if (m_master == MasterWeights::kStochasticRounding)
    sd.insert("stochastic_rounding.seed", i64_scalar(static_cast<int64_t>(m_rounding_seed)));
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const std::string who = m_name;
  // 1. The keys: every group's options and parameter list, the state of each parameter the dict has a step for.
  // Beyond the optimizer's own options a group may carry ones a schedule recorded ("initial_lr", "max_lr", ...):
  // those the dict has are taken (PyTorch loads a group's dict whole), those it lacks keep their current value.
  std::vector<std::string> expected;
  std::vector<std::vector<std::string>> extras(m_groups.size());
  for (size_t g = 0; g < m_groups.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    for (const auto& item : m_defaults.items()) expected.push_back(prefix + item.first);
    expected.push_back(prefix + "params");
    for (const auto& [key, t] : sd) {
      if (!key.starts_with(prefix)) continue;
      const std::string name = key.substr(prefix.size());
      if (name == "params" || m_defaults.contains(name) || name.find('.') != std::string::npos) continue;
      extras[g].push_back(name);
      expected.push_back(key);
    }
  }
  const std::vector<StateBuffer> buffers = state_buffers();
  for (size_t i = 0; i < m_state.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (!sd.contains(prefix + "step")) continue;
    expected.push_back(prefix + "step");
    for (const StateBuffer& b : buffers)
      if (b.always || sd.contains(prefix + b.name)) expected.push_back(prefix + b.name);
    if (has_master(parameters_at(i))) expected.push_back(prefix + "master");
  }
  if (m_master == MasterWeights::kStochasticRounding) expected.push_back("stochastic_rounding.seed");
  sd.expect_keys(who, expected);

  // 2. Their shapes, dtypes and values, into new groups' options and state: nothing changes until all are checked.
  std::vector<GroupOptions> options;
  size_t index = 0;
  for (size_t g = 0; g < m_groups.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    GroupOptions o = m_groups[g].options;
    for (const auto& item : m_defaults.items())
      o.set(item.first, sd.expect(who, prefix + item.first, Shape{}, DType::kF64).item<double>());
    for (const std::string& name : extras[g])
      o.put(name, sd.expect(who, prefix + name, Shape{}, DType::kF64).item<double>());
    check_options(o, "load_state_dict: param group " + std::to_string(g));
    const int64_t n = static_cast<int64_t>(m_groups[g].params.size());
    const std::vector<int64_t> ids = sd.expect(who, prefix + "params", Shape{n}, DType::kI64).to_vector<int64_t>();
    for (int64_t k = 0; k < n; ++k)
      MT_CHECK(ids[static_cast<size_t>(k)] == static_cast<int64_t>(index + static_cast<size_t>(k)), who,
               ".load_state_dict: '", prefix, "params' lists parameter ", ids[static_cast<size_t>(k)], " at position ",
               k, ", expected ", index + static_cast<size_t>(k), " (the same parameters in the same groups)");
    index += static_cast<size_t>(n);
    options.push_back(std::move(o));
  }
  std::vector<ParamState> state(m_state.size());
  for (size_t i = 0; i < m_state.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (!sd.contains(prefix + "step")) continue;
    const Tensor& p = parameters_at(i);
    const Tensor& count = sd.expect(who, prefix + "step", Shape{}, DType::kI64);
    const int64_t step = count.item<int64_t>();
    MT_CHECK(step >= 1 && step <= INT32_MAX, who, ".load_state_dict: '", prefix, "step' is ", step,
             ", expected a count in [1, ", INT32_MAX, "]");
    state[i].step = empty({}, TensorOptions(DType::kI32).device(p.device()));
    raw::copy_(state[i].step, count);  // the dict's i64 in the i32 counter (a copy: the dict may be live state)
    std::vector<std::pair<std::string, DType>> names;  // in the order a step creates them: the master first
    if (has_master(p)) names.emplace_back("master", DType::kF32);
    for (const StateBuffer& b : buffers)
      if (sd.contains(prefix + b.name)) names.emplace_back(b.name, state_dtype(p));
    for (const auto& [name, dtype] : names) {
      const Tensor& src = sd.expect(who, prefix + name, p.shape(), dtype);
      Tensor t = empty(p.shape(), TensorOptions(dtype).device(p.device()));
      raw::copy_(t, src);  // a copy on the parameter's device: the dict may be another optimizer's live state
      state[i].buffers.emplace_back(name, std::move(t));
    }
  }
  uint64_t seed = m_rounding_seed;
  if (m_master == MasterWeights::kStochasticRounding)
    seed = static_cast<uint64_t>(sd.expect(who, "stochastic_rounding.seed", Shape{}, DType::kI64).item<int64_t>());

  // 3. Commit.
  for (size_t g = 0; g < m_groups.size(); ++g) m_groups[g].options = std::move(options[g]);
  m_state = std::move(state);
  m_rounding_seed = seed;
  ++m_generation;
}

}  // namespace mixtape::optim
