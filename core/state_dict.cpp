// core/state_dict.cpp — StateDict: insertion-ordered named tensors and the checks load_state_dict() shares.
#include <mixtape/core/state_dict.h>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include <mixtape/core/error.h>

namespace mixtape {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  os << "]";
  return os.str();
}

}  // namespace

void StateDict::insert(std::string key, Tensor value) {
  MT_CHECK(!key.empty(), "StateDict::insert: an empty key");
  MT_CHECK(value.defined(), "StateDict::insert: '", key, "' is an undefined tensor");
  MT_CHECK(!m_index.contains(key), "StateDict::insert: the key '", key, "' is already present");
  m_index.emplace(key, m_items.size());
  m_items.emplace_back(std::move(key), std::move(value));
}

const Tensor& StateDict::at(const std::string& key) const {
  auto it = m_index.find(key);
  MT_CHECK(it != m_index.end(), "StateDict::at: no key '", key, "' (", m_items.size(), " keys)");
  return m_items[it->second].second;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(m_items.size());
  for (const Item& item : m_items) out.push_back(item.first);
  return out;
}

const Tensor& StateDict::expect(const std::string& who, const std::string& key, const Shape& shape,
                                DType dtype) const {
  auto it = m_index.find(key);
  MT_CHECK(it != m_index.end(), who, ".load_state_dict: missing key '", key, "'");
  const Tensor& t = m_items[it->second].second;
  MT_CHECK(t.shape() == shape, who, ".load_state_dict: '", key, "' has shape ", t.shape(), ", expected ", shape);
  MT_CHECK(t.dtype() == dtype, who, ".load_state_dict: '", key, "' has dtype ", t.dtype(), ", expected ", dtype);
  return t;
}

void StateDict::expect_keys(const std::string& who, const std::vector<std::string>& expected) const {
  const std::unordered_set<std::string> want(expected.begin(), expected.end());
  std::vector<std::string> missing, unexpected;
  for (const std::string& key : expected)
    if (!m_index.contains(key)) missing.push_back(key);
  for (const Item& item : m_items)
    if (!want.contains(item.first)) unexpected.push_back(item.first);
  if (missing.empty() && unexpected.empty()) return;
  std::ostringstream os;
  if (!missing.empty()) os << "missing keys " << join(missing);
  if (!unexpected.empty()) os << (missing.empty() ? "" : "; ") << "unexpected keys " << join(unexpected);
  MT_CHECK(false, who, ".load_state_dict: ", os.str());
}

}  // namespace mixtape
