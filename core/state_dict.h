// core/state_dict.h — named tensors in insertion order: what a module's, an optimizer's and a loss scaler's
// state_dict() return and their load_state_dict() take, and what a checkpoint file holds.
//
// Every piece of training state is a tensor under a dotted name ("fc1.weight", "state.0.exp_avg",
// "param_groups.0.lr"), scalars as 0-d tensors, so one file format (safetensors) stores all of it and one loader
// check names a missing, unexpected, misshapen or wrongly typed key.
//
//   mt::StateDict sd = net.state_dict();
//   for (const auto& [name, t] : sd) std::cout << name << " " << t.shape() << "\n";
//   net.load_state_dict(sd);
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <mixtape/core/tensor.h>

namespace mixtape {

class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  /// Appends `value` under `key`; a key already present is an error (names are unique).
  void insert(std::string key, Tensor value);

  bool contains(const std::string& key) const { return m_index.contains(key); }
  size_t size() const { return m_items.size(); }
  bool empty() const { return m_items.empty(); }
  /// The tensor under `key`; a missing key is an error naming it.
  const Tensor& at(const std::string& key) const;
  std::vector<std::string> keys() const;

  std::vector<Item>::const_iterator begin() const { return m_items.begin(); }
  std::vector<Item>::const_iterator end() const { return m_items.end(); }

  /// For load_state_dict: the tensor under `key`, which must exist, have `shape` and have `dtype`; otherwise an
  /// error "<who>.load_state_dict: <key> ..." saying which of the three is wrong.
  const Tensor& expect(const std::string& who, const std::string& key, const Shape& shape, DType dtype) const;

  /// For load_state_dict: the keys must be exactly `expected` (in any order); otherwise one error
  /// "<who>.load_state_dict: missing keys [...]; unexpected keys [...]" naming all of them.
  void expect_keys(const std::string& who, const std::vector<std::string>& expected) const;

 private:
  std::vector<Item> m_items;
  std::unordered_map<std::string, size_t> m_index;  // key -> position in m_items
};

}  // namespace mixtape
