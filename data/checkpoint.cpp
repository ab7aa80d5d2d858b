// data/checkpoint.cpp — a run's parts, step and generator as one safetensors file (see checkpoint.h).
#include <mixtape/data/checkpoint.h>

#include <charconv>
#include <sstream>

#include <mixtape/data/safetensors.h>

namespace mixtape::data {

namespace {

constexpr const char* kReserved = "mixtape.";
constexpr const char* kParts = "mixtape.parts";  // the part names, '\n'-separated (a part may hold no tensor)
constexpr const char* kStep = "mixtape.step";
constexpr const char* kRngSeed = "mixtape.rng.seed";
constexpr const char* kRngOffset = "mixtape.rng.offset";

std::string join_names(const std::map<std::string, StateDict>& parts) {
  std::string out;
  for (const auto& [name, sd] : parts) out += (out.empty() ? "" : "\n") + name;
  return out;
}

template <class Int>
Int parse_number(const std::string& path, const std::map<std::string, std::string>& meta, const char* key) {
  auto it = meta.find(key);
  MT_CHECK(it != meta.end(), "load_checkpoint: '", path, "' has no '", key,
           "' in its metadata (not a checkpoint written by save_checkpoint)");
  Int value{};
  const std::string& text = it->second;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  MT_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(), "load_checkpoint: '", path,
           "': metadata '", key, "' is '", text, "', not an integer");
  return value;
}

}  // namespace

const StateDict& Checkpoint::part(const std::string& name) const {
  auto it = parts.find(name);
  MT_CHECK(it != parts.end(), "Checkpoint::part: no part '", name, "' (parts: ",
           parts.empty() ? std::string("none") : join_names(parts), ")");
  return it->second;
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  MT_CHECK(checkpoint.step >= 0, "save_checkpoint: '", path, "': step is ", checkpoint.step,
           ", not a count of steps (>= 0)");
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : checkpoint.metadata) {
    MT_CHECK(key.rfind(kReserved, 0) != 0, "save_checkpoint: '", path, "': metadata key '", key,
             "' starts with \"mixtape.\", which checkpoints keep for themselves");
    meta[key] = value;
  }
  StateDict tensors;
  for (const auto& [name, sd] : checkpoint.parts) {
    MT_CHECK(!name.empty() && name.find('.') == std::string::npos && name.find('\n') == std::string::npos,
             "save_checkpoint: '", path, "': part name '", name, "' must be non-empty, without '.' or newlines");
    for (const auto& [key, t] : sd) tensors.insert(name + "." + key, t);
  }
  meta[kParts] = join_names(checkpoint.parts);
  meta[kStep] = std::to_string(checkpoint.step);
  meta[kRngSeed] = std::to_string(checkpoint.rng.seed);
  meta[kRngOffset] = std::to_string(checkpoint.rng.offset);
  save_safetensors(path, tensors, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  Checkpoint out;
  out.step = parse_number<int64_t>(path, file.metadata, kStep);
  MT_CHECK(out.step >= 0, "load_checkpoint: '", path, "': metadata '", kStep, "' is ", out.step,
           ", not a count of steps (>= 0)");
  out.rng.seed = parse_number<uint64_t>(path, file.metadata, kRngSeed);
  out.rng.offset = parse_number<uint64_t>(path, file.metadata, kRngOffset);
  auto parts = file.metadata.find(kParts);
  MT_CHECK(parts != file.metadata.end(), "load_checkpoint: '", path, "' has no '", kParts,
           "' in its metadata (not a checkpoint written by save_checkpoint)");
  std::istringstream names(parts->second);
  for (std::string name; std::getline(names, name);) {
    MT_CHECK(!name.empty() && name.find('.') == std::string::npos, "load_checkpoint: '", path,
             "': a part name in '", kParts, "' is '", name, "'");
    out.parts[name];
  }
  for (const auto& [key, t] : file.tensors) {
    const size_t dot = key.find('.');
    auto part = dot == std::string::npos ? out.parts.end() : out.parts.find(key.substr(0, dot));
    MT_CHECK(part != out.parts.end(), "load_checkpoint: '", path, "': tensor '", key,
             "' belongs to no part listed in '", kParts, "'");
    part->second.insert(key.substr(dot + 1), t);
  }
  for (auto& [key, value] : file.metadata)
    if (key.rfind(kReserved, 0) != 0) out.metadata[key] = value;
  return out;
}

}  // namespace mixtape::data
