// tests/gradcheck.cpp — see gradcheck.h.
#include "gradcheck.h"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <sstream>

namespace mixtape::test {

namespace {

/// A fresh f64 copy of `t` with the same strides pattern (so views stay views), requiring grad if `grad`.
Tensor f64_leaf(const Tensor& t, bool grad) {
  Tensor c;
  {
    autograd::NoGradGuard ng;
    if (t.is_contiguous()) {
      c = t.to(DType::kF64).clone();
    } else {
      // Same strides: allocate the base the view came from and copy values into the matching view.
      Tensor base = zeros({static_cast<int64_t>(t.storage()->nbytes() / t.itemsize())}, DType::kF64);
      c = raw::as_strided(base, t.shape(), t.strides(), t.storage_offset());
      raw::copy_(c, t);
    }
  }
  if (grad) c.requires_grad_(true);
  return c;
}

/// The multi-index of linear element `i` of `shape`.
std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(static_cast<size_t>(shape.size()));
  for (int64_t d = shape.size() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

/// The 0-D view of element `idx` of `t` (writable: shares storage).
Tensor element(const Tensor& t, const std::vector<int64_t>& idx) {
  Tensor v = t;
  for (int64_t i : idx) v = raw::select(v, 0, i);
  return v;
}

std::string describe(const std::vector<Tensor>& inputs) {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i)
    os << (i ? ", " : "") << inputs[i].shape() << ' ' << inputs[i].dtype() << (inputs[i].is_contiguous() ? "" : " (strided)");
  return os.str();
}

}  // namespace

bool gradcheck(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs, GradcheckOptions options) {
  std::vector<Tensor> x;
  std::vector<size_t> diff;  // indices of differentiated inputs
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool wrt = inputs[i].defined() && is_floating(inputs[i].dtype()) &&
               (options.wrt.empty() || (i < options.wrt.size() && options.wrt[i]));
    if (!inputs[i].defined()) {
      x.push_back(Tensor());
    } else if (is_floating(inputs[i].dtype())) {
      x.push_back(f64_leaf(inputs[i], wrt));
    } else {
      x.push_back(inputs[i]);
    }
    if (wrt) diff.push_back(i);
  }

  Tensor out = f(x);
  Generator g(1234);
  Tensor v = randn(out.shape(), DType::kF64, &g);  // a random projection, so every output element matters
  std::vector<Tensor> wrt;
  for (size_t i : diff) wrt.push_back(x[i]);
  std::vector<Tensor> analytic = autograd::grad({out}, wrt, {v}, false, /*allow_unused=*/true);

  autograd::NoGradGuard ng;
  auto objective = [&] { return sum(mul(f(x), v)).item<double>(); };
  bool ok = true;
  for (size_t k = 0; k < diff.size(); ++k) {
    Tensor xi = x[diff[k]];
    Tensor numeric = zeros(xi.shape(), DType::kF64);
    for (int64_t e = 0; e < xi.numel(); ++e) {
      std::vector<int64_t> idx = unravel(e, xi.shape());
      Tensor cell = element(xi, idx);
      double orig = cell.item<double>();
      raw::fill_(cell, orig + options.eps);
      double plus = objective();
      raw::fill_(cell, orig - options.eps);
      double minus = objective();
      raw::fill_(cell, orig);
      raw::fill_(element(numeric, idx), (plus - minus) / (2 * options.eps));
    }
    Tensor a = analytic[k].defined() ? analytic[k] : zeros(xi.shape(), DType::kF64);
    std::ostringstream what;
    what << "gradcheck " << name << ": input " << diff[k] << " of (" << describe(inputs) << "), analytic vs numeric";
    ok = expect_close(a, numeric, {options.rtol, options.atol}, what.str()) && ok;
  }
  return ok;
}

bool check_against_f64(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs, DType dtype,
                       Tolerance tol, bool check_backward) {
  std::vector<Tensor> low, ref;
  std::vector<Tensor> low_wrt, ref_wrt;
  for (const Tensor& t : inputs) {
    if (!t.defined() || !is_floating(t.dtype())) {
      low.push_back(t);
      ref.push_back(t);
      continue;
    }
    Tensor l = t.to(dtype).clone();
    Tensor r = l.to(DType::kF64);  // exactly the rounded values
    if (check_backward) {
      l.requires_grad_(true);
      r.requires_grad_(true);
      low_wrt.push_back(l);
      ref_wrt.push_back(r);
    }
    low.push_back(l);
    ref.push_back(r);
  }
  Tensor out_low = f(low), out_ref = f(ref);
  std::ostringstream what;
  what << name << " in " << dtype << " vs f64 of the same inputs (" << describe(low) << ")";
  bool ok = expect_close(out_low, out_ref, tol, what.str() + ", forward");
  if (check_backward && !low_wrt.empty()) {
    Generator g(99);
    Tensor v = randn(out_low.shape(), DType::kF64, &g);
    std::vector<Tensor> gl = autograd::grad({out_low}, low_wrt, {v.to(out_low.dtype())}, false, true);
    std::vector<Tensor> gr = autograd::grad({out_ref}, ref_wrt, {v.to(out_low.dtype()).to(DType::kF64)}, false, true);
    for (size_t i = 0; i < gl.size(); ++i) {
      if (!gl[i].defined() && !gr[i].defined()) continue;
      ok = expect_close(gl[i], gr[i], tol, what.str() + ", gradient of input " + std::to_string(i)) && ok;
    }
  }
  return ok;
}

Tensor non_contiguous(const Tensor& t, const std::string& layout) {
  autograd::NoGradGuard ng;
  if (layout == "transposed") {
    MT_CHECK(t.dim() >= 2, "non_contiguous: 'transposed' needs >= 2 dims, got ", t.shape());
    return t.transpose(-1, -2).contiguous().transpose(-1, -2);
  }
  MT_CHECK(layout == "strided", "non_contiguous: unknown layout ", layout);
  Shape wide = t.shape();
  if (wide.empty()) return t.clone();
  wide[wide.size() - 1] *= 2;
  Tensor base = zeros(wide, TensorOptions(t.dtype()).device(t.device()));
  Tensor view = base.slice(-1, 0, wide.back(), 2);
  raw::copy_(view, t);
  return view;
}

}  // namespace mixtape::test
