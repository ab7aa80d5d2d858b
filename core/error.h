// core/error.h — mixtape::Error and the MT_CHECK macro.
//
// Every misuse a user can make reaches them as one exception type whose
// message names the operation, the shapes/dtypes/devices involved and the
// file:line that noticed (STYLE.md §4). A library never exit()s or abort()s.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mixtape {

/// The one exception mixtape throws for bad input, bad state or exhausted
/// resources. `what()` reads like "matmul: shapes cannot be multiplied
/// ([2, 3] and [4, 5]) (ops/matmul.cpp:42)".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Names the op running on this thread for the errors raised beneath it by steps that only know themselves: the
/// output allocation inside `add` reports "add: cannot allocate ...", not "empty: ...". The outermost scope wins,
/// as it is what the user called; ops nested inside it keep its name.
class OpNameScope {
 public:
  explicit OpNameScope(const char* op) : m_prev(t_current) {
    if (!t_current) t_current = op;
  }
  ~OpNameScope() { t_current = m_prev; }
  OpNameScope(const OpNameScope&) = delete;
  OpNameScope& operator=(const OpNameScope&) = delete;
  /// The outermost op running on this thread, or `fallback` outside every op.
  static const char* current_or(const char* fallback) { return t_current ? t_current : fallback; }

 private:
  static inline thread_local const char* t_current = nullptr;
  const char* m_prev;
};

namespace detail {

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void throw_error(const char* file, int line, const Args&... args) {
  throw Error(str_cat(args..., " (", file, ":", line, ")"));
}

}  // namespace detail
}  // namespace mixtape

/// Throws mixtape::Error with the streamed arguments and file:line when `cond` is false.
#define MT_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) [[unlikely]]                                     \
      ::mixtape::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/// Throws mixtape::Error unconditionally.
#define MT_ERROR(...) ::mixtape::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__)
