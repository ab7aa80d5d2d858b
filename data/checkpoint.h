// data/checkpoint.h — a training run's state in one safetensors file: everything resuming needs to go on exactly
// as if the run had never stopped.
//
// A run is a few StateDicts (the model's, the optimizer's, the loss scaler's, a schedule's) plus what no StateDict
// holds: where the default random generator stands (dropout masks, initialisation, shuffles that draw from it) and
// the step count. The design idea: all of it goes into one file through save_safetensors, so a checkpoint is
// written atomically or not at all, and it reads back as the same parts, each handed to its owner's
// load_state_dict. Tensors are stored as "<part>.<key>"; the step, the generator and the part names go to the
// header's `__metadata__` under "mixtape.*", beside the caller's own strings.
//
//   mt::data::Checkpoint ck{.step = step, .rng = mt::default_generator().state()};
//   ck.parts["model"] = net.state_dict();
//   ck.parts["optimizer"] = opt.state_dict();
//   ck.parts["scaler"] = scaler.state_dict();
//   mt::data::save_checkpoint("run/last.safetensors", ck);
//
//   mt::data::Checkpoint back = mt::data::load_checkpoint("run/last.safetensors");
//   net.load_state_dict(back.part("model"));
//   opt.load_state_dict(back.part("optimizer"));
//   scaler.load_state_dict(back.part("scaler"));
//   mt::default_generator().set_state(back.rng);
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <mixtape/core/random.h>
#include <mixtape/core/state_dict.h>

namespace mixtape::data {

struct Checkpoint {
  int64_t step = 0;     // optimizer steps taken (the caller's count: skipped fp16 steps included or not)
  GeneratorState rng;   // the default generator's seed and offset when the checkpoint was taken
  std::map<std::string, StateDict> parts{};           // part name (no '.') -> its state_dict(); may be empty
  std::map<std::string, std::string> metadata{};      // the caller's own strings (keys not starting "mixtape.")

  /// The part called `name` (tensors on the CPU); an error naming the part and the parts there are if absent.
  const StateDict& part(const std::string& name) const;
};

/// Writes `checkpoint` to `path` with save_safetensors (atomic: temporary file, fsync, rename, directory fsync).
/// Errors (a negative step, a part name that is empty or holds '.', a metadata key starting "mixtape.", and
/// save_safetensors' own) are mixtape::Error naming the path; the file at `path` is then unchanged.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);

/// Reads a checkpoint written by save_checkpoint: load_safetensors' validation, then the "mixtape.*" metadata
/// (present, well-formed numbers, a step >= 0) and every tensor under a listed part. Errors name the file and
/// what is wrong.
Checkpoint load_checkpoint(const std::string& path);

}  // namespace mixtape::data
