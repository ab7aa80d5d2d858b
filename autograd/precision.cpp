// autograd/precision.cpp — the op registry, precision overrides, autocast
// state and the cast cache.
#include <mixtape/autograd/precision.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include <mixtape/autograd/cast.h>
#include <mixtape/autograd/function.h>
#include <mixtape/autograd/registry.h>

namespace mixtape {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kUnset: return "unset";
    case Precision::kLowerPrecision: return "lower_precision";
    case Precision::kFp32: return "fp32";
    case Precision::kPromote: return "promote";
    case Precision::kPassthrough: return "passthrough";
  }
  return "?";
}

namespace autograd {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<OpInfo> ops;
  std::vector<Precision> global_override;  // kUnset: none
  std::atomic<int> num_global_overrides{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

/// Scoped overrides of this thread, innermost last.
std::vector<std::pair<int, Precision>>& scoped_overrides() {
  thread_local std::vector<std::pair<int, Precision>> v;
  return v;
}

int checked_op_id(std::string_view op, const char* caller) {
  int id = find_op(op);
  if (id < 0) {
    std::string known;
    for (const OpInfo& info : registered_ops()) known += (known.empty() ? "" : ", ") + info.name;
    MT_ERROR(caller, ": unknown op '", op, "' (registered ops: ", known, ")");
  }
  return id;
}

}  // namespace

int register_op_info(const char* name, Precision precision, bool differentiable) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (size_t i = 0; i < r.ops.size(); ++i) {
    if (r.ops[i].name != name) continue;
    MT_CHECK(r.ops[i].precision == precision && r.ops[i].differentiable == differentiable,
             "register_op: op '", name, "' registered twice with different facts");
    return static_cast<int>(i);
  }
  r.ops.push_back({name, precision, differentiable});
  r.global_override.push_back(Precision::kUnset);
  return static_cast<int>(r.ops.size() - 1);
}

std::vector<OpInfo> registered_ops() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.ops;
}

int find_op(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (size_t i = 0; i < r.ops.size(); ++i)
    if (r.ops[i].name == name) return static_cast<int>(i);
  return -1;
}

Precision effective_precision(int id, Precision declared) {
  if (detail::state().has_scoped_overrides) {
    auto& scoped = scoped_overrides();
    for (auto it = scoped.rbegin(); it != scoped.rend(); ++it)
      if (it->first == id) return it->second;
  }
  Registry& r = registry();
  if (r.num_global_overrides.load(std::memory_order_relaxed) > 0) {
    std::lock_guard lock(r.mutex);
    if (r.global_override[static_cast<size_t>(id)] != Precision::kUnset) return r.global_override[static_cast<size_t>(id)];
  }
  return declared;
}

// ---- the cast cache -----------------------------------------------------------------

namespace {

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;  // to tell a live leaf from a new one at a reused address
  uint64_t version = 0;
  Tensor cast;
};

struct CastCache {
  std::map<std::pair<const TensorImpl*, DType>, CacheEntry> entries;
  int64_t hits = 0, misses = 0;
};
CastCache& cast_cache() {
  thread_local CastCache c;
  return c;
}

}  // namespace

namespace detail {

DType target_dtype(Precision p, DType t, DType promoted) {
  const ThreadState& st = state();
  switch (p) {
    case Precision::kLowerPrecision:
      return st.autocast && (t == DType::kF32 || is_reduced_float(t)) ? st.autocast_dtype : t;
    case Precision::kFp32:
      return st.autocast && is_reduced_float(t) ? DType::kF32 : t;
    case Precision::kPromote:
      return promoted;
    case Precision::kPassthrough:
    case Precision::kUnset:
      return t;
  }
  return t;
}

Tensor autocast_cast(const Tensor& t, DType dtype) {
  const ThreadState& st = state();
  // PyTorch's rule: cache only f32 leaves that require grad, cast to the low dtype, with grad mode on.
  bool cacheable = st.autocast && st.grad_enabled && t.dtype() == DType::kF32 && dtype == st.autocast_dtype &&
                   requires_grad(t) && !has_grad_fn(t);
  if (!cacheable) return cast(t, dtype);
  CastCache& cache = cast_cache();
  auto key = std::make_pair(static_cast<const TensorImpl*>(t.impl()), dtype);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end() && it->second.source.lock() == t.impl_ptr() && it->second.version == t.version()) {
    ++cache.hits;
    return it->second.cast;
  }
  Tensor c = cast(t, dtype);
  // Ops save the parameter instead of c (autograd::Ctx): a detached alias, so c's node makes no cycle through it.
  auto source = std::make_shared<TensorImpl>(*t.impl());
  source->autograd.reset();
  if (c.impl()->autograd) c.impl()->autograd->autocast_source = Tensor(std::move(source));
  cache.entries[key] = {t.impl_ptr(), t.version(), c};
  ++cache.misses;
  return c;
}

}  // namespace detail
}  // namespace autograd

namespace amp {

Autocast::Autocast(DType dtype, bool enabled) {
  auto& st = autograd::detail::state();
  MT_CHECK(!enabled || is_reduced_float(dtype), "Autocast: dtype must be f16 or bf16, got ", dtype);
  m_prev_enabled = st.autocast;
  m_prev_dtype = st.autocast_dtype;
  st.autocast = enabled;
  if (enabled) st.autocast_dtype = dtype;
  ++st.autocast_depth;
}

Autocast::~Autocast() {
  auto& st = autograd::detail::state();
  st.autocast = m_prev_enabled;
  st.autocast_dtype = m_prev_dtype;
  if (--st.autocast_depth == 0) clear_cast_cache();
}

bool is_autocast_enabled() { return autograd::detail::state().autocast; }
DType autocast_dtype() { return autograd::detail::state().autocast_dtype; }

std::vector<OpPrecision> precision_table() {
  std::vector<OpPrecision> table;
  auto ops = autograd::registered_ops();
  for (size_t i = 0; i < ops.size(); ++i)
    table.push_back({ops[i].name, ops[i].precision, autograd::effective_precision(static_cast<int>(i), ops[i].precision)});
  return table;
}

Precision precision_of(std::string_view op) {
  int id = autograd::checked_op_id(op, "precision_of");
  return autograd::effective_precision(id, autograd::registered_ops()[static_cast<size_t>(id)].precision);
}

void set_precision(std::string_view op, Precision p) {
  MT_CHECK(p != Precision::kUnset, "set_precision: '", op, "': cannot set a category of kUnset");
  int id = autograd::checked_op_id(op, "set_precision");
  auto& r = autograd::registry();
  std::lock_guard lock(r.mutex);
  if (r.global_override[static_cast<size_t>(id)] == Precision::kUnset) ++r.num_global_overrides;
  r.global_override[static_cast<size_t>(id)] = p;
}

void reset_precision_overrides() {
  auto& r = autograd::registry();
  std::lock_guard lock(r.mutex);
  std::fill(r.global_override.begin(), r.global_override.end(), Precision::kUnset);
  r.num_global_overrides = 0;
}

PrecisionScope::PrecisionScope(std::string_view op, Precision p) : m_op(op) {
  MT_CHECK(p != Precision::kUnset, "PrecisionScope: '", op, "': cannot set a category of kUnset");
  int id = autograd::checked_op_id(op, "PrecisionScope");
  autograd::scoped_overrides().emplace_back(id, p);
  autograd::detail::state().has_scoped_overrides = true;
}

PrecisionScope::~PrecisionScope() {
  auto& scoped = autograd::scoped_overrides();
  scoped.pop_back();
  autograd::detail::state().has_scoped_overrides = !scoped.empty();
}

CastCacheStats cast_cache_stats() {
  auto& c = autograd::cast_cache();
  CastCacheStats s;
  s.entries = static_cast<int64_t>(c.entries.size());
  for (auto& [key, e] : c.entries) s.bytes += static_cast<int64_t>(e.cast.nbytes());
  s.hits = c.hits;
  s.misses = c.misses;
  return s;
}

void clear_cast_cache() {
  auto& c = autograd::cast_cache();
  c.entries.clear();
  c.hits = c.misses = 0;
}

}  // namespace amp
}  // namespace mixtape
