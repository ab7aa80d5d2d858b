// optim/optimizer.h — what every optimizer shares: parameter groups with their own options, per-parameter
// state, zero_grad, state_dict.
//
// As in torch.optim, a group's options are named numbers ("lr", "momentum", "beta1", "weight_decay"; booleans
// as 0 and 1), so schedulers, the loss scaler and state_dict() treat every optimizer alike; each optimizer
// also takes a typed options struct (SGDOptions, AdamOptions) for the constructor and add_param_group().
//
// Parameters of f16/bf16 get f32 master weights and f32 state by default: step() updates the master and
// writes the rounded value back (see MasterWeights). The parameter stays what the user sees and may write: a value
// written into it between steps (load_state_dict, an init function, copy_ under NoGradGuard) is what the next step
// starts from, not the master's older one (an eager step's check: the replays of a CUDA graph that captured a step
// run its kernels alone, so write parameters between eager steps, not between replays). The update of a group runs
// as one multi-tensor kernel call per (device, dtype) over all its parameters (ops/backend/kernels.h), not one op
// chain per tensor.
//
//   mt::optim::AdamW opt(net.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/core/tensor.h>

namespace mixtape::optim {

/// How an optimizer updates parameters stored in f16 or bf16 (f32 and f64 parameters are updated in place).
enum class MasterWeights {
  kF32,                 // an f32 master copy and f32 state; the parameter receives the master rounded to nearest
  kStochasticRounding,  // bf16 only: no master copy; the f32 update is rounded stochastically into the bf16
                        // parameter (llm.c), seeded and reproducible; f32 state
  kNone,                // the parameter is updated in its own dtype (the lossy baseline the seeds warn about)
};

/// A group's options by name, in insertion order (PyTorch's param_group dict without "params").
class GroupOptions {
 public:
  GroupOptions() = default;
  GroupOptions(std::initializer_list<std::pair<std::string, double>> items);
  /// The value of `name`; an unknown name is an error listing the names there are.
  double get(const std::string& name) const;
  /// Sets an existing option; an unknown name is an error (options are fixed by the optimizer).
  void set(const std::string& name, double value);
  bool contains(const std::string& name) const;
  /// Sets `name`, adding it when absent: schedulers record "initial_lr", "max_lr", ... in the group, as PyTorch's
  /// do, and an optimizer's state_dict() carries them.
  void put(const std::string& name, double value) {
    for (auto& [n, v] : m_items)
      if (n == name) {
        v = value;
        return;
      }
    m_items.emplace_back(name, value);
  }
  const std::vector<std::pair<std::string, double>>& items() const { return m_items; }

 private:
  std::vector<std::pair<std::string, double>> m_items;
};

struct ParamGroup {
  std::vector<Tensor> params;
  GroupOptions options;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient (parameters without one are left alone, as in PyTorch).
  void step();
  /// The same update unless `found_inf` (a one-element f32 tensor, the GradScaler's) is nonzero, decided where the
  /// parameters live: the kernels read the flag there, and a skipped step leaves every parameter and all its state,
  /// its update count included, as they were. Nothing is read back to the host, so on a GPU the step never waits
  /// (PyTorch's fused optimizers take found_inf the same way). A flag on another device is copied to the
  /// parameters' (device to device).
  void step(const Tensor& found_inf);

  /// Clears every parameter's gradient: set_to_none drops it (PyTorch's default), otherwise it is zeroed in place.
  void zero_grad(bool set_to_none = true);

  /// The class name PyTorch gives it ("SGD", "Adam", "AdamW"), for messages.
  const std::string& name() const { return m_name; }

  std::vector<ParamGroup>& param_groups() { return m_groups; }
  const std::vector<ParamGroup>& param_groups() const { return m_groups; }
  /// Every parameter of every group, in group order.
  std::vector<Tensor> parameters() const;

  /// The learning rate of a group (its option "lr"), what schedulers read and write.
  double lr(size_t group) const;
  void set_lr(size_t group, double lr);

  /// The group's momentum as OneCycleLR cycles it: SGD's "momentum", Adam's "beta1".
  virtual std::string momentum_option() const = 0;

  /// Everything step() depends on, as named tensors: "param_groups.<g>.<option>" (f64, 0-d),
  /// "param_groups.<g>.params" (i64, the parameters' indices), and "state.<i>.<name>" for parameter i's state
  /// (its update count as i64 0-d, read back from the parameter's device, its moment buffers, its f32 master weight
  /// as "state.<i>.master") for each parameter updated at least once (one whose every update was skipped on the
  /// device has none); with
  /// MasterWeights::kStochasticRounding also "stochastic_rounding.seed" (i64, 0-d). A group's options include
  /// those a schedule recorded ("initial_lr", ...).
  StateDict state_dict() const;
  /// Restores state_dict()'s output for the same parameters (same groups, shapes, dtypes); anything missing,
  /// unexpected, misshapen or of another dtype is an error naming the key, and nothing is changed then.
  void load_state_dict(const StateDict& state);

  /// Expires when the optimizer is destroyed: schedulers and the loss scaler hold it to refuse a dead optimizer.
  std::weak_ptr<const void> lifetime() const { return m_lifetime; }

 protected:
  /// `defaults` lists every option name with its default; `groups` holds the user's groups, whose options may
  /// set any of them (the others take the default). Checks: at least one parameter, every parameter a
  /// floating leaf that requires grad, no parameter twice, one device per parameter.
  Optimizer(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults);

  /// Adds a group after construction (its unset options take the defaults), with the same checks.
  void add_param_group(ParamGroup group);

  /// Per-parameter state, by the parameter's index in parameters(): named tensors (buffers on the parameter's
  /// device, f32 for f16/bf16 parameters) and the update count. Derived optimizers create entries lazily, on a
  /// parameter's first update, as PyTorch does.
  struct ParamState {
    Tensor step;  // the update count: i32 0-d on the parameter's device (undefined before its first update); it
                  // stops at 2^31 − 1. 4 bytes, as PyTorch's f32 count, and exact where f32 stops at 2^24
    std::vector<std::pair<std::string, Tensor>> buffers;  // "momentum_buffer", "exp_avg", "master", ...
    // The parameter's storage and version as the last step left them: a parameter found otherwise was written from
    // outside since (begin_update), and its master takes what it holds.
    std::weak_ptr<const Storage> written_storage;
    uint64_t written_version = 0;
    bool updating = false;  // begin_update ran in this step: update_and_note records the storage and version after
    Tensor& buffer(const std::string& name);               // an error when absent
    bool has(const std::string& name) const;
  };
  std::vector<ParamState>& state() { return m_state; }
  const std::vector<ParamState>& state() const { return m_state; }

  // ---- for the derived optimizers (optim/sgd.cpp, optim/adam.cpp) ----

  /// One update, skipped where found_inf (undefined: never) is nonzero: what step() and step(found_inf) call. For
  /// each bucket: begin_update each parameter, advance their counts with kernels::optim_count_steps_ (the same
  /// found_inf), then the update kernel with found_inf and the counts (OptimStep::count).
  virtual void update(const Tensor& found_inf) = 0;

  /// found_inf on `device` (a device-to-device copy when it lives elsewhere); undefined stays undefined.
  static Tensor found_inf_on(const Tensor& found_inf, Device device);

  /// A step kernel's at_replay (ops/backend/kernels.h): what a CUDA graph that captured the step calls before each
  /// replay, `options()` then (the learning rate a schedule set since the capture). A replay is refused instead
  /// when this optimizer was destroyed, or its state replaced (load_state_dict) or a group added since the capture:
  /// the captured kernels would update freed state, or leave out the new group's parameters.
  template <class Hyper>
  std::function<Hyper()> replay_options(std::function<Hyper()> options) const {
    return [alive = lifetime(), self = this, name = m_name, generation = m_generation, options = std::move(options)] {
      MT_CHECK(!alive.expired(), "cuda::Graph::replay: the ", name,
               " optimizer whose step the graph captured was destroyed (its replays would update freed state)");
      MT_CHECK(self->m_generation == generation, "cuda::Graph::replay: the ", name, " optimizer whose step the "
               "graph captured has loaded a state_dict or gained a param group since; the captured kernels update "
               "its old state (capture the step again)");
      return options();
    };
  }

  /// As above, with the way f16/bf16 parameters are updated (the constructor above uses kF32). An f16 parameter
  /// under kStochasticRounding is an error (the rounding is into bf16). The stochastic rounding's seed is drawn
  /// from the default generator here, so mixtape::manual_seed(s) before constructing the optimizer makes a run
  /// reproducible; state_dict() carries it as "stochastic_rounding.seed" (i64 0-d, the seed's 64 bits), so a
  /// loaded optimizer continues with the same bits.
  Optimizer(std::string name, std::vector<ParamGroup> groups, GroupOptions defaults, MasterWeights master);

  /// A buffer of a parameter's state, and whether every parameter with state has it (false for one that comes
  /// with an option: SGD's momentum_buffer, Adam's max_exp_avg_sq, created on the first step that needs it).
  struct StateBuffer {
    std::string name;
    bool always;
  };
  /// The buffers this optimizer keeps per parameter, in creation order, the master excluded (the base adds
  /// "master" for the parameters that have one): what load_state_dict() expects. None by default.
  virtual std::vector<StateBuffer> state_buffers() const;

  /// Checks one group's option values (ranges, flags 0 or 1), throwing an error that names the optimizer, `where`
  /// ("param group 1") and the option. Accepts everything by default. Virtual calls do not reach a derived class
  /// from the base's constructor, so each derived constructor calls check_groups() at its end; add_param_group()
  /// and load_state_dict() call check_options() themselves.
  virtual void check_options(const GroupOptions& options, const std::string& where) const;
  void check_groups() const;

  MasterWeights master_weights() const { return m_master; }
  uint64_t rounding_seed() const { return m_rounding_seed; }
  /// Whether `param` is updated through an f32 master (an f16/bf16 parameter under kF32).
  bool has_master(const Tensor& param) const;
  /// The dtype of `param`'s state buffers: f32 for f16/bf16 parameters unless kNone, else the parameter's.
  DType state_dtype(const Tensor& param) const;

  /// The parameters of one group that have a gradient and share a device and dtype, in group order.
  struct Bucket {
    std::vector<size_t> indices;  // in parameters()
    std::vector<Tensor> params, grads;
  };
  /// For every group, its buckets in order of first appearance. Throws, before anything is updated, when a
  /// gradient's device, dtype or shape differs from its parameter's or the parameter's state lives on another
  /// device, dtype or shape (the parameter was moved or cast after its first step).
  std::vector<std::vector<Bucket>> gradient_buckets() const;
  /// Begins parameter i's update: on its first, its update count is created (0) and its master (when has_master) as
  /// the parameter's value in f32. Later, a parameter written since the last step from outside (load_state_dict, an
  /// init function, copy_, a cast back from f32) is taken into its master where it no longer holds the master's
  /// rounding, element by element on its device; a master whose parameter no longer needs one (cast to f32) is
  /// dropped. Returns the count, for kernels::optim_count_steps_ to advance.
  Tensor& begin_update(size_t i);
  /// Buffer `name` of parameter i's state, created as zeros (state_dtype, the parameter's shape and device) when
  /// absent; `*created` (when given) tells whether it was.
  Tensor& state_buffer(size_t i, const std::string& name, bool* created = nullptr);

 private:
  /// The checks of one new group (see the constructor); `first_index` is its first parameter's global index.
  void check_group(const ParamGroup& group, size_t group_index, size_t first_index) const;
  /// `group`'s options over the defaults; an option the defaults lack is an error naming the group.
  GroupOptions merged_options(const GroupOptions& options, size_t group_index) const;
  /// Parameter i of parameters(), without building the list.
  const Tensor& parameters_at(size_t i) const;
  /// update() and then, for each parameter begin_update started, the storage and version the step left it with.
  void update_and_note(const Tensor& found_inf);

  std::string m_name;
  GroupOptions m_defaults;
  std::vector<ParamGroup> m_groups;
  std::vector<ParamState> m_state;  // one per parameter, in parameters() order
  std::shared_ptr<const int> m_lifetime = std::make_shared<const int>(0);
  MasterWeights m_master = MasterWeights::kF32;
  uint64_t m_rounding_seed = 0;  // of kStochasticRounding
  uint64_t m_generation = 0;     // bumped when the state is replaced or a group added (replay_options)
};

}  // namespace mixtape::optim
