// autograd/precision.h — per-op precision categories, autocast and its cast cache.
//
// Every op declares one category (DESIGN.md "Per-op precision rules"); the
// table of (op, category) is data that users can list and override, globally
// or in a scope. `amp::Autocast` turns the categories on for a region:
//
//   { mt::amp::Autocast ac(mt::kF16);           // matmul/linear/conv2d run in f16
//     mt::amp::PrecisionScope keep("softmax", mt::Precision::kFp32);
//     loss = mt::cross_entropy(net.forward(x), y); }
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <mixtape/core/dtype.h>

namespace mixtape {

enum class Precision : uint8_t {
  kUnset,           // an op that forgot to declare one (the registry test fails on it)
  kLowerPrecision,  // inputs become the autocast dtype; f32 accumulation inside (matmul, conv2d)
  kFp32,            // inputs become f32 (softmax, losses, norms, exp, log, pow, sum); an op whose kernels widen
                    // f16/bf16 on load (cross_entropy) reads them uncast and returns f32: the same values
  kPromote,         // inputs become the widest input dtype (add, mul, cat)
  kPassthrough,     // inputs unchanged (relu, reshape, max_pool2d, dropout)
};

const char* precision_name(Precision p);
inline std::ostream& operator<<(std::ostream& os, Precision p) { return os << precision_name(p); }

namespace amp {

/// Turns autocast on for the current thread while alive. `dtype` is kF16 or
/// kBF16; `enabled = false` turns it off inside an enclosing region. Regions
/// nest; the cast cache is cleared when the outermost one ends. An op that
/// saves such a cast of a parameter for backward keeps the f32 parameter and
/// casts it again there (autograd::Ctx), so between forward and backward a
/// model holds its f16/bf16 activations and no copy of its weights.
class Autocast {
 public:
  explicit Autocast(DType dtype = DType::kF16, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool m_prev_enabled;
  DType m_prev_dtype;
};

bool is_autocast_enabled();
DType autocast_dtype();

/// One row of the precision table.
struct OpPrecision {
  std::string op;
  Precision declared;   // what the op's definition says
  Precision effective;  // after global and scoped overrides
};

/// Every registered op with its declared and effective category.
std::vector<OpPrecision> precision_table();
/// The category `op` runs with now (overrides applied); throws for an unknown op name.
Precision precision_of(std::string_view op);
/// Overrides `op`'s category for the whole process; throws for an unknown op name.
void set_precision(std::string_view op, Precision p);
/// Removes every global override.
void reset_precision_overrides();

/// Overrides `op`'s category on this thread while alive ("keep this in f32").
class PrecisionScope {
 public:
  PrecisionScope(std::string_view op, Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  std::string m_op;
};

/// What the autocast cast cache holds now (f32 leaves cast once per region).
struct CastCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t hits = 0;    // casts answered from the cache since the outermost region began
  int64_t misses = 0;  // casts performed and cached
};
CastCacheStats cast_cache_stats();
void clear_cast_cache();

}  // namespace amp
}  // namespace mixtape
