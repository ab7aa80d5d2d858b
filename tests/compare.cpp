// tests/compare.cpp — see compare.h.
#include "compare.h"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>

namespace mixtape::test {

namespace {

/// The elements of `t` (any device, layout and dtype) in row-major order, as doubles.
std::vector<double> host_values(const Tensor& t) { return raw::to(t, Device::cpu()).to_vector<double>(); }

/// The rule of compare.h over two lists; reports under `what` + `context`.
bool compare_values(const std::vector<double>& a, const std::vector<double>& e, Tolerance tol,
                    std::span<const double> allowance, const std::string& what, const std::string& context) {
  if (!allowance.empty() && allowance.size() != e.size()) {
    BOOST_ERROR(what << ": " << allowance.size() << " allowances for " << e.size() << " elements");
    return false;
  }
  int64_t bad = 0;
  std::ostringstream first;
  first.precision(std::numeric_limits<double>::max_digits10);
  for (size_t i = 0; i < a.size(); ++i) {
    const double extra = allowance.empty() ? 0.0 : allowance[i];
    const bool ok = (std::isnan(a[i]) && std::isnan(e[i])) || a[i] == e[i] ||
                    std::fabs(a[i] - e[i]) <= tol.atol + tol.rtol * std::fabs(e[i]) + extra;
    if (!ok && bad++ < 5) first << "\n  [" << i << "] got " << a[i] << ", expected " << e[i];
  }
  // One assertion either way (Boost.Test counts a passing comparison; the message is built only on failure).
  BOOST_TEST(bad == 0, what << ": " << bad << " of " << a.size() << " elements differ (" << context << "; rtol "
                            << tol.rtol << ", atol " << tol.atol
                            << (allowance.empty() ? "" : ", plus a per-element allowance") << "); first:"
                            << first.str());
  return bad == 0;
}

}  // namespace

bool expect_close(const Tensor& actual, const Tensor& expected, Tolerance tol, const std::string& what,
                  std::span<const double> allowance) {
  std::ostringstream context;
  context << "got " << actual.dtype() << ' ' << actual.shape() << ", expected " << expected.dtype() << ' '
          << expected.shape();
  if (!(actual.shape() == expected.shape())) {
    BOOST_ERROR(what << ": the shapes differ (" << context.str() << ")");
    return false;
  }
  if (actual.dtype() != expected.dtype() && expected.dtype() != DType::kF64) {
    BOOST_ERROR(what << ": the dtypes differ (" << context.str() << ")");
    return false;
  }
  return compare_values(host_values(actual), host_values(expected), tol, allowance, what, context.str());
}

bool expect_values(const Tensor& actual, const std::vector<double>& expected, Tolerance tol, const std::string& what,
                   std::span<const double> allowance) {
  std::ostringstream context;
  context << "got " << actual.dtype() << ' ' << actual.shape() << ", expected " << expected.size() << " values";
  if (actual.numel() != static_cast<int64_t>(expected.size())) {
    BOOST_ERROR(what << ": the element counts differ (" << context.str() << ")");
    return false;
  }
  return compare_values(host_values(actual), expected, tol, allowance, what, context.str());
}

bool expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) {
    BOOST_ERROR(what << ": got " << a.dtype() << ' ' << a.shape() << ", expected " << b.dtype() << ' ' << b.shape());
    return false;
  }
  const Tensor x = raw::contiguous(raw::to(a, Device::cpu())), y = raw::contiguous(raw::to(b, Device::cpu()));
  const auto* xp = static_cast<const unsigned char*>(x.data_ptr());
  const auto* yp = static_cast<const unsigned char*>(y.data_ptr());
  const int64_t size = x.itemsize();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::memcmp(xp + i * size, yp + i * size, static_cast<size_t>(size)) != 0 && bad++ == 0) first = i;
  if (bad == 0) return true;
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  std::ostringstream os;
  os.precision(std::numeric_limits<double>::max_digits10);
  os << what << " (" << a.dtype() << ' ' << a.shape() << "): " << bad << " of " << x.numel()
     << " elements differ in their bits; the first at flat index " << first << ": " << xv[static_cast<size_t>(first)]
     << " vs " << yv[static_cast<size_t>(first)];
  BOOST_ERROR(os.str());
  return false;
}

double relative_error(const Tensor& got, const Tensor& want) {
  if (!(got.shape() == want.shape())) {
    BOOST_ERROR("relative_error: shapes " << got.shape() << " vs " << want.shape());
    return std::numeric_limits<double>::infinity();
  }
  const std::vector<double> g = host_values(got), w = host_values(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return std::numeric_limits<double>::infinity();  // an unwritten (poisoned) or broken element
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::string expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' not in: " << msg);
    return msg;
  } catch (const std::exception& e) {
    BOOST_ERROR("expected mixtape::Error, got another exception: " << e.what());
    return {};
  }
  BOOST_ERROR("expected mixtape::Error" << (parts.empty() ? std::string() : " with '" + parts.front() + "'")
                                        << ", nothing was thrown");
  return {};
}

}  // namespace mixtape::test
