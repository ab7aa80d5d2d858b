// tests/test_optim.cpp — the optimizer step kernels (ops/cpu/optim.cpp, cuda/optim.cu): sgd_step_ and adam_step_,
// one update of a list of parameters in place. They are kernels, not ops (nothing to differentiate), so there is no
// ops/optim.cpp and no registry case; the optimizers that call them are tested in tests/test_optimizers.cpp.
//
// On the CPU, every option set of SGD, Adam and AdamW against a float64 reference written out below (torch.optim's
// single-tensor formulas), three steps from zero state, each step checked from the kernel's own previous state, for
// every place a parameter's value lives: f64 and f32 in place, f16/bf16 with f32 masters (the parameter is then the
// master rounded to nearest, bit for bit), f16/bf16 in their own dtype, bf16 with stochastic rounding (one of the
// two bf16 neighbours of the reference; reproducible, keyed on the parameter's index, not its place in the list).
// Transposed parameters give the contiguous ones' bits, a tensor large enough for threads too; the entry point's
// invariants are checked. Options read from memory (hyper.on_device, what a CUDA graph's replay passes) give the
// bits of the same options passed. On CUDA, the same cases bit for bit the CPU's.
#include "family_test.h"

#include <cstring>
#include <functional>
#include <variant>

namespace {

using Hyper = std::variant<kn::SgdHyper, kn::AdamHyper>;

/// One option set of one optimizer.
struct Config {
  std::string name;
  Hyper hyper;
};

std::vector<Config> configs() {
  std::vector<Config> out;
  auto sgd = [&](std::string name, kn::SgdHyper h) { out.push_back({"SGD " + name, h}); };
  auto adam = [&](std::string name, kn::AdamHyper h) { out.push_back({name, h}); };
  sgd("plain", {.lr = 0.1});
  sgd("momentum", {.lr = 0.05, .momentum = 0.9});
  sgd("momentum with dampening", {.lr = 0.05, .momentum = 0.9, .dampening = 0.3});
  sgd("nesterov", {.lr = 0.05, .momentum = 0.8, .nesterov = true});
  sgd("weight_decay", {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.1});
  sgd("maximize", {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05, .maximize = true});
  const kn::AdamHyper base{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  auto with = [&](auto f) {
    kn::AdamHyper h = base;
    f(h);
    return h;
  };
  adam("Adam", base);
  adam("Adam weight_decay", with([](auto& h) { h.weight_decay = 0.1; }));
  adam("Adam amsgrad", with([](auto& h) { h.amsgrad = true; }));
  adam("Adam maximize, betas (0.8, 0.99)", with([](auto& h) {
         h.maximize = true;
         h.beta1 = 0.8;
         h.beta2 = 0.99;
       }));
  adam("AdamW", with([](auto& h) {
         h.decoupled_weight_decay = true;
         h.weight_decay = 0.05;
       }));
  adam("AdamW amsgrad", with([](auto& h) {
         h.decoupled_weight_decay = true;
         h.weight_decay = 0.05;
         h.amsgrad = true;
       }));
  // maximize with either weight decay: the gradient negated first, then the decay added (PyTorch's order).
  adam("Adam maximize, weight_decay", with([](auto& h) {
         h.maximize = true;
         h.weight_decay = 0.1;
       }));
  adam("AdamW maximize", with([](auto& h) {
         h.maximize = true;
         h.decoupled_weight_decay = true;
         h.weight_decay = 0.05;
       }));
  return out;
}

const Config& config_named(const std::string& name) {
  static const std::vector<Config> all = configs();
  for (const Config& c : all)
    if (c.name == name) return c;
  throw std::logic_error("no configuration " + name);
}

bool is_adam(const Hyper& h) { return std::holds_alternative<kn::AdamHyper>(h); }

/// Where the parameters' values live.
struct Storage {
  const char* name;
  DType param;
  bool master;      // f32 masters
  bool stochastic;  // bf16 parameters rounded stochastically
};

constexpr Storage kStorages[] = {
    {"f64 in place", DType::kF64, false, false},
    {"f32 in place", DType::kF32, false, false},
    {"f16 with f32 masters", DType::kF16, true, false},
    {"bf16 with f32 masters", DType::kBF16, true, false},
    {"f16 in f16", DType::kF16, false, false},
    {"bf16 in bf16", DType::kBF16, false, false},
    {"bf16 with stochastic rounding", DType::kBF16, false, true},
};

DType state_dtype(const Storage& s) { return s.master || s.stochastic ? DType::kF32 : s.param; }

/// One kernel call's lists. The state lists an option set does not use stay empty.
struct Lists {
  std::vector<Tensor> params, grads, s0, s1, s2, masters;  // s0: momentum_buffer or exp_avg; s1, s2: Adam's
  std::vector<kn::OptimStep> steps;
};

/// Parameters of shapes (37, 29) in `layout` (or (300, 251): more than a thread's share), (7), () and (3, 0), with
/// zero state, masters from the parameters.
Lists make_lists(const Config& c, const Storage& s, Layout layout, uint64_t seed, bool large = false) {
  Lists L;
  const Shape first = large ? Shape{300, 251} : Shape{37, 29};
  L.params = {input(first, s.param, -2, 2, seed, layout), input({7}, s.param, -2, 2, seed + 1),
              input({}, s.param, -2, 2, seed + 2), mt::zeros({3, 0}, s.param)};
  const bool sgd_momentum = !is_adam(c.hyper) && std::get<kn::SgdHyper>(c.hyper).momentum != 0;
  const bool amsgrad = is_adam(c.hyper) && std::get<kn::AdamHyper>(c.hyper).amsgrad;
  for (size_t i = 0; i < L.params.size(); ++i) {
    const Tensor& p = L.params[i];
    if (s.master) L.masters.push_back(p.to(DType::kF32));
    if (is_adam(c.hyper) || sgd_momentum) L.s0.push_back(mt::zeros(p.shape(), state_dtype(s)));
    if (is_adam(c.hyper)) L.s1.push_back(mt::zeros(p.shape(), state_dtype(s)));
    if (amsgrad) L.s2.push_back(mt::zeros(p.shape(), state_dtype(s)));
    L.steps.push_back({.step = 0, .index = static_cast<int64_t>(10 + i), .first_momentum = false});
  }
  return L;
}

/// Fresh gradients (uniform in [-4, 4), the parameters' dtype and shapes) and the steps advanced by one.
void next_step(Lists& L, uint64_t seed) {
  L.grads.clear();
  for (size_t i = 0; i < L.params.size(); ++i)
    L.grads.push_back(input(L.params[i].shape(), L.params[i].dtype(), -4, 4, seed + i));
  for (kn::OptimStep& st : L.steps) {
    ++st.step;
    st.first_momentum = st.step == 1;
  }
}

void run(const Config& c, const Storage& s, Lists& L, uint64_t rounding_seed = 1234) {
  if (is_adam(c.hyper)) {
    kn::AdamHyper h = std::get<kn::AdamHyper>(c.hyper);
    h.stochastic_rounding = s.stochastic;
    h.seed = rounding_seed;
    kn::adam_step_(L.params, L.grads, L.s0, L.s1, L.s2, L.masters, L.steps, h, Tensor(), {});
  } else {
    kn::SgdHyper h = std::get<kn::SgdHyper>(c.hyper);
    h.stochastic_rounding = s.stochastic;
    h.seed = rounding_seed;
    kn::sgd_step_(L.params, L.grads, L.s0, L.masters, L.steps, h, Tensor(), {});
  }
}

/// A struct's bytes in a tensor on `device` (i64 elements: 8-byte aligned), for hyper.on_device.
template <class H>
Tensor bytes_on(const H& h, Device device) {
  Tensor t = mt::zeros({static_cast<int64_t>((sizeof(H) + 7) / 8)}, DType::kI64);
  std::memcpy(t.data_ptr(), &h, sizeof(H));
  return device.is_cpu() ? t : t.to(device);
}

/// run() with the options on the lists' device (hyper.on_device), and wrong ones in the struct passed: every option
/// but those that choose the kernels (same_kernels) differs, the stochastic rounding's seed too.
void run_with_options_on_device(const Config& c, const Storage& s, Lists& L, uint64_t rounding_seed = 1234) {
  const Device device = L.params.front().device();
  if (is_adam(c.hyper)) {
    kn::AdamHyper h = std::get<kn::AdamHyper>(c.hyper);
    h.stochastic_rounding = s.stochastic;
    h.seed = rounding_seed;
    const Tensor live = bytes_on(h, device);
    kn::AdamHyper wrong = h;
    wrong.lr = 7;
    wrong.beta1 = 0.125;
    wrong.beta2 = 0.25;
    wrong.eps = 1;
    wrong.weight_decay = 3;
    wrong.maximize = !h.maximize;
    wrong.seed = rounding_seed + 1;
    wrong.on_device = static_cast<const kn::AdamHyper*>(live.data_ptr());
    BOOST_REQUIRE(kn::same_kernels(wrong, h));
    kn::adam_step_(L.params, L.grads, L.s0, L.s1, L.s2, L.masters, L.steps, wrong, Tensor(), {});
  } else {
    kn::SgdHyper h = std::get<kn::SgdHyper>(c.hyper);
    h.stochastic_rounding = s.stochastic;
    h.seed = rounding_seed;
    const Tensor live = bytes_on(h, device);
    kn::SgdHyper wrong = h;
    wrong.lr = 7;
    wrong.momentum = h.momentum != 0 ? 0.25 : 0.0;
    wrong.dampening = 0.5;
    wrong.weight_decay = h.weight_decay != 0 ? 0.0 : 3.0;
    wrong.nesterov = !h.nesterov;
    wrong.maximize = !h.maximize;
    wrong.seed = rounding_seed + 1;
    wrong.on_device = static_cast<const kn::SgdHyper*>(live.data_ptr());
    BOOST_REQUIRE(kn::same_kernels(wrong, h));
    kn::sgd_step_(L.params, L.grads, L.s0, L.masters, L.steps, wrong, Tensor(), {});
  }
}

// ---- the float64 reference: torch.optim's single-tensor formulas --------------------------------

/// One parameter in float64: its value, gradient and state.
struct Ref {
  std::vector<double> p, g, s0, s1, s2;
};

void sgd_reference(const kn::SgdHyper& h, bool first_momentum, Ref& r) {
  for (size_t i = 0; i < r.p.size(); ++i) {
    double d = h.maximize ? -r.g[i] : r.g[i];
    if (h.weight_decay != 0) d += h.weight_decay * r.p[i];
    if (h.momentum != 0) {
      r.s0[i] = first_momentum ? d : h.momentum * r.s0[i] + (1 - h.dampening) * d;
      d = h.nesterov ? d + h.momentum * r.s0[i] : r.s0[i];
    }
    r.p[i] -= h.lr * d;
  }
}

void adam_reference(const kn::AdamHyper& h, int64_t step, Ref& r) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  for (size_t i = 0; i < r.p.size(); ++i) {
    double g = h.maximize ? -r.g[i] : r.g[i];
    if (h.decoupled_weight_decay) r.p[i] *= 1 - h.lr * h.weight_decay;
    else if (h.weight_decay != 0) g += h.weight_decay * r.p[i];
    r.s0[i] = h.beta1 * r.s0[i] + (1 - h.beta1) * g;
    r.s1[i] = h.beta2 * r.s1[i] + (1 - h.beta2) * g * g;
    double second = r.s1[i];
    if (h.amsgrad) {
      r.s2[i] = std::max(r.s2[i], r.s1[i]);
      second = r.s2[i];
    }
    r.p[i] -= h.lr / bc1 * r.s0[i] / (std::sqrt(second) / std::sqrt(bc2) + h.eps);
  }
}

/// The one-step error allowed for values of `dtype`: an f32 or f64 step rounds each of a handful of operations (a
/// near-zero result keeps the absolute error of its larger terms: atol); f16/bf16 values are rounded once more to
/// their dtype (tolerance.h).
Tolerance step_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF64: return {1e-13, 1e-14};
    case DType::kF32: return {2e-6, 1e-6};
    default: return tolerance(dtype);
  }
}

/// The spacing of bf16 values around |v| (its ulp in the binade of v): stochastic rounding lands within it.
double bf16_spacing(double v) {
  int e = 0;
  std::frexp(v == 0 ? 1e-38 : v, &e);  // |v| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 1 - 7);
}

/// Runs three steps of `c` on lists stored as `s` and checks each against the reference started from the kernel's
/// previous values.
void check_against_reference(const Config& c, const Storage& s, Layout layout, bool large, uint64_t seed) {
  Lists L = make_lists(c, s, layout, seed, large);
  for (int step = 1; step <= 3; ++step) {
    next_step(L, seed + 100 * step);
    std::vector<Ref> refs;
    for (size_t i = 0; i < L.params.size(); ++i) {
      Ref r{values(s.master ? L.masters[i] : L.params[i]), values(L.grads[i]), {}, {}, {}};
      if (!L.s0.empty()) r.s0 = values(L.s0[i]);
      if (!L.s1.empty()) r.s1 = values(L.s1[i]);
      if (!L.s2.empty()) r.s2 = values(L.s2[i]);
      if (is_adam(c.hyper)) adam_reference(std::get<kn::AdamHyper>(c.hyper), L.steps[i].step, r);
      else sgd_reference(std::get<kn::SgdHyper>(c.hyper), L.steps[i].first_momentum, r);
      refs.push_back(std::move(r));
    }
    std::vector<uint64_t> versions;
    for (const Tensor& p : L.params) versions.push_back(p.version());
    run(c, s, L);
    const Tolerance state_tol = step_tolerance(state_dtype(s));
    for (size_t i = 0; i < L.params.size(); ++i) {
      const std::string what = describe(c.name, ", ", s.name, ", ", layout_name(layout), ", step ", step,
                                        ", parameter ", i, " ", L.params[i].shape());
      const Ref& r = refs[i];
      if (s.master) {
        expect_values(L.masters[i], r.p, step_tolerance(DType::kF32), what + ": master");
        expect_same_bits(L.params[i], L.masters[i].to(s.param), what + ": the parameter is its master rounded");
      } else if (s.stochastic) {
        std::vector<double> spacing;
        for (double v : r.p) spacing.push_back(bf16_spacing(v) * (1 + 1e-5));
        expect_values(L.params[i], r.p, kExact, what + ": one of the two bf16 neighbours", spacing);
      } else {
        expect_values(L.params[i], r.p, step_tolerance(s.param), what + ": parameter");
      }
      if (!L.s0.empty())
        expect_values(L.s0[i], r.s0, state_tol, what + (is_adam(c.hyper) ? ": exp_avg" : ": momentum_buffer"));
      if (!L.s1.empty()) expect_values(L.s1[i], r.s1, state_tol, what + ": exp_avg_sq");
      if (!L.s2.empty()) expect_values(L.s2[i], r.s2, state_tol, what + ": max_exp_avg_sq");
      BOOST_TEST(L.params[i].version() == versions[i] + 1, what << ": the parameter's version is bumped");
    }
  }
}

/// Every tensor of the lists, for bitwise comparisons.
std::vector<Tensor> all_tensors(const Lists& L) {
  std::vector<Tensor> out;
  for (const auto* list : {&L.params, &L.s0, &L.s1, &L.s2, &L.masters})
    out.insert(out.end(), list->begin(), list->end());
  return out;
}

void expect_same_lists(const Lists& a, const Lists& b, const std::string& what) {
  const std::vector<Tensor> ta = all_tensors(a), tb = all_tensors(b);
  BOOST_TEST_REQUIRE(ta.size() == tb.size());
  for (size_t i = 0; i < ta.size(); ++i)
    expect_same_bits(ta[i], tb[i], describe(what, ": tensor ", i, " of the lists"));
}

/// The lists with every tensor copied contiguous (same values).
Lists contiguous_copy(const Lists& L) {
  Lists out = L;
  for (auto* list : {&out.params, &out.grads, &out.s0, &out.s1, &out.s2, &out.masters})
    for (Tensor& t : *list) t = mt::raw::clone(mt::raw::contiguous(t));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(optim)

BOOST_AUTO_TEST_CASE(steps_match_the_f64_reference, MT_CPU_TEST) {
  uint64_t seed = 70000;
  for (const Config& c : configs())
    for (const Storage& s : kStorages)
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed})
        check_against_reference(c, s, layout, false, seed += 1000);
}

BOOST_AUTO_TEST_CASE(large_tensors_split_over_threads_match_the_reference, MT_CPU_TEST) {
  uint64_t seed = 90000;
  for (const Config& c : configs())
    for (const Storage& s : {kStorages[1], kStorages[3], kStorages[6]})
      check_against_reference(c, s, Layout::kTransposed, true, seed += 1000);
}

BOOST_AUTO_TEST_CASE(strided_parameters_give_the_contiguous_bits, MT_CPU_TEST) {
  uint64_t seed = 110000;
  for (const Config& c : configs()) {
    for (const Storage& s : kStorages) {
      Lists strided = make_lists(c, s, Layout::kTransposed, seed += 1000);
      Lists dense = contiguous_copy(strided);
      for (int step = 1; step <= 2; ++step) {
        next_step(strided, seed + step);
        dense.grads = strided.grads;
        dense.steps = strided.steps;
        run(c, s, strided);
        run(c, s, dense);
        expect_same_lists(strided, dense,
                          describe(c.name, ", ", s.name, ", step ", step, ": transposed vs contiguous"));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(stochastic_rounding_is_keyed_on_seed_step_and_index, MT_CPU_TEST) {
  const Storage& s = kStorages[6];
  for (const Config& c : {config_named("SGD momentum"), config_named("AdamW")}) {
    BOOST_TEST_CONTEXT(c.name) {
      auto fresh = [&] {
        Lists L = make_lists(c, s, Layout::kContiguous, 5);
        next_step(L, 77);
        return L;
      };
      // The same seed: the same bits. Another seed: other bits (1,073 elements, none of them exact in bf16).
      Lists a = fresh(), b = fresh(), other = fresh();
      run(c, s, a, 1);
      run(c, s, b, 1);
      run(c, s, other, 2);
      expect_same_lists(a, b, "the same seed twice");
      const std::vector<double> pa = values(a.params[0]), po = values(other.params[0]);
      size_t differ = 0;
      for (size_t i = 0; i < pa.size(); ++i) differ += pa[i] != po[i];
      BOOST_TEST(differ > pa.size() / 10, differ << " of " << pa.size() << " elements differ between seeds 1 and 2");

      // A parameter's bits depend on its index, not on its place in the list: the first parameter alone.
      Lists alone = fresh();
      for (auto* list : {&alone.params, &alone.grads, &alone.s0, &alone.s1, &alone.s2, &alone.masters})
        if (!list->empty()) list->resize(1);
      alone.steps.resize(1);
      run(c, s, alone, 1);
      expect_same_bits(alone.params[0], a.params[0], "the first parameter alone in its list");
      Lists renumbered = fresh();
      renumbered.steps[0].index += 1;
      run(c, s, renumbered, 1);
      const std::vector<double> pr = values(renumbered.params[0]);
      size_t moved = 0;
      for (size_t i = 0; i < pa.size(); ++i) moved += pa[i] != pr[i];
      BOOST_TEST(moved > pa.size() / 10, moved << " of " << pa.size() << " elements differ under another index");
    }
  }
}

BOOST_AUTO_TEST_CASE(options_read_on_the_device_are_the_options, MT_CPU_TEST) {
  // What a CUDA graph's replay does (kernels.h, hyper.on_device): the kernels take the options from memory, not from
  // the struct they were passed, but for the ones that chose the kernels.
  uint64_t seed = 150000;
  for (const Config& c : configs()) {
    for (const Storage& s : kStorages) {
      Lists passed = make_lists(c, s, Layout::kTransposed, seed += 1000);
      Lists read = passed;
      for (auto* list : {&read.params, &read.s0, &read.s1, &read.s2, &read.masters})
        for (Tensor& t : *list) t = mt::raw::clone(t);
      for (int step = 1; step <= 3; ++step) {
        next_step(passed, seed + step);
        read.grads = passed.grads;
        read.steps = passed.steps;
        run(c, s, passed);
        run_with_options_on_device(c, s, read);
        expect_same_lists(read, passed, describe(c.name, ", ", s.name, ", step ", step, ": options read in memory"));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(element_conversions_are_cores_bit_for_bit, MT_CPU_TEST) {
  // The CPU kernels convert f16/bf16 with their own code (ops/cpu/optim.cpp: branch-free, or F16C); it must give
  // core's bits (core/half.h). Widening: every 16-bit pattern as a gradient, read back from SGD's first momentum buffer (f32
  // state: the gradient itself). Narrowing: the master rounded into the parameter, for masters at and around every
  // value of the dtype (±1, ±2 float ulps, the midpoint to the next value and its neighbours: every rounding
  // boundary, ties, subnormals, overflow to inf, NaN payloads), in contiguous and transposed layouts.
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    BOOST_TEST_CONTEXT(dtype) {
      // Every 16-bit pattern, signalling NaNs included, written bit for bit.
      const Tensor grad = mt::empty({256, 256}, dtype);
      std::vector<float> widened(65536);  // core's widening of each
      for (int b = 0; b < 65536; ++b) {
        const auto bits = static_cast<uint16_t>(b);
        if (dtype == DType::kF16) {
          grad.data<mt::Half>()[b] = mt::Half::from_bits(bits);
          widened[b] = static_cast<float>(mt::Half::from_bits(bits));
        } else {
          grad.data<mt::BFloat16>()[b] = mt::BFloat16::from_bits(bits);
          widened[b] = static_cast<float>(mt::BFloat16::from_bits(bits));
        }
      }
      // Contiguous: the blocked loop (with F16C where the CPU has it); transposed: the strided loop.
      for (const Tensor& g : {grad, grad.t()}) {
        const Tensor param = mt::zeros({256, 256}, dtype), buf = mt::zeros({256, 256}), master = mt::zeros({256, 256});
        kn::sgd_step_(std::vector<Tensor>{param}, std::vector<Tensor>{g}, std::vector<Tensor>{buf},
                      std::vector<Tensor>{master}, std::vector<kn::OptimStep>{{.step = 1, .first_momentum = true}},
                      kn::SgdHyper{.lr = 0, .momentum = 0.5}, Tensor(), {});
        expect_same_bits(buf, g.to(DType::kF32), g.is_contiguous() ? "every pattern widened" : "transposed");
      }

      std::vector<float> around;
      for (int b = 0; b < 65536; ++b) {
        const float v = widened[b];
        // The next value of the dtype away from zero (bits + 1 in sign-magnitude), and the exact midpoint: a tie.
        const float w = (b & 0x7fff) == 0x7fff ? v : widened[b + 1];
        const float mid = std::isfinite(v) && std::isfinite(w) ? v + (w - v) / 2 : v;
        for (float x : {v, mid, std::nextafter(v, 1e30f), std::nextafter(v, -1e30f), std::nextafter(mid, 1e30f),
                        std::nextafter(mid, -1e30f)})
          around.push_back(x);
      }
      around.resize(around.size() / 64 * 64);
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed}) {
        const int64_t rows = static_cast<int64_t>(around.size()) / 64;
        Tensor m = mt::from_vector(around, Shape{rows, 64});
        Tensor p = mt::zeros({rows, 64}, dtype);
        if (layout == Layout::kTransposed) {
          m = mt::raw::clone(mt::raw::contiguous(m.t())).t();
          p = mt::zeros({64, rows}, dtype).t();
        }
        kn::sgd_step_(std::vector<Tensor>{p}, std::vector<Tensor>{mt::zeros({rows, 64}, dtype)}, std::vector<Tensor>{},
                      std::vector<Tensor>{m}, std::vector<kn::OptimStep>{{.step = 1}}, kn::SgdHyper{.lr = 0}, Tensor(),
                      {});
        expect_same_bits(p, m.to(dtype), describe("masters around every value rounded, ", layout_name(layout)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(step_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  const std::vector<Tensor> p = {mt::zeros({2, 3})}, g = {mt::zeros({2, 3})}, none;
  const std::vector<kn::OptimStep> steps = {{.step = 1}};
  const kn::SgdHyper plain{.lr = 0.1}, momentum{.lr = 0.1, .momentum = 0.9};
  const kn::AdamHyper adam{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  auto expect_invariant_error = [](const char* kernel, const std::function<void()>& f, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      const std::string msg = expect_error(f, {"its invariant"});
      BOOST_TEST(msg.starts_with(describe("kernels::", kernel)), "the message: " << msg);
    }
  };
  auto sgd = [&](const std::string& what, std::vector<Tensor> ps, std::vector<Tensor> gs, std::vector<Tensor> bufs,
                 std::vector<Tensor> masters, std::vector<kn::OptimStep> st, kn::SgdHyper h) {
    expect_invariant_error("sgd_step_", [&] { kn::sgd_step_(ps, gs, bufs, masters, st, h, Tensor(), {}); }, what);
  };
  sgd("a gradient of another dtype", p, {mt::zeros({2, 3}, DType::kF64)}, none, none, steps, plain);
  sgd("a gradient of another shape", p, {mt::zeros({3, 2})}, none, none, steps, plain);
  sgd("no gradient for a parameter", p, none, none, none, steps, plain);
  sgd("momentum without buffers", p, g, none, none, steps, momentum);
  sgd("a buffer of another dtype", p, g, {mt::zeros({2, 3}, DType::kF16)}, none, steps, momentum);
  sgd("step 0", p, g, none, none, {{.step = 0}}, plain);
  sgd("an integer parameter", {mt::zeros({2, 3}, DType::kI64)}, {mt::zeros({2, 3}, DType::kI64)}, none, none, steps,
      plain);
  sgd("an expanded parameter", {mt::zeros({3}).expand({2, 3})}, g, none, none, steps, plain);
  sgd("a master for an f32 parameter", p, g, none, {mt::zeros({2, 3})}, steps, plain);
  const std::vector<Tensor> h16 = {mt::zeros({2, 3}, DType::kF16)}, b16 = {mt::zeros({2, 3}, DType::kBF16)};
  sgd("an f16 master", h16, h16, none, h16, steps, plain);
  sgd("f16 state for a parameter with a master", h16, h16, h16, {mt::zeros({2, 3})}, steps, momentum);
  kn::SgdHyper sr = plain;
  sr.stochastic_rounding = true;
  sgd("stochastic rounding of an f16 parameter", h16, h16, none, none, steps, sr);
  sgd("stochastic rounding with masters", b16, b16, none, {mt::zeros({2, 3})}, steps, sr);
  sr.momentum = 0.9;
  sgd("bf16 state under stochastic rounding", b16, b16, b16, none, steps, sr);

  auto adam_call = [&](const std::string& what, std::vector<Tensor> m, std::vector<Tensor> v, std::vector<Tensor> vmax,
                       kn::AdamHyper h) {
    expect_invariant_error("adam_step_", [&] { kn::adam_step_(p, g, m, v, vmax, none, steps, h, Tensor(), {}); }, what);
  };
  adam_call("no exp_avg_sq", {mt::zeros({2, 3})}, none, none, adam);
  adam_call("an exp_avg of another shape", {mt::zeros({6})}, {mt::zeros({2, 3})}, none, adam);
  kn::AdamHyper ams = adam;
  ams.amsgrad = true;
  adam_call("amsgrad without max_exp_avg_sq", {mt::zeros({2, 3})}, {mt::zeros({2, 3})}, none, ams);
  adam_call("max_exp_avg_sq without amsgrad", {mt::zeros({2, 3})}, {mt::zeros({2, 3})}, {mt::zeros({2, 3})}, adam);
}

/// Every configuration, storage and layout, three steps on CUDA against the same steps on the CPU, bit for bit; the
/// CUDA side runs `run_on_cuda` (run, or run_with_options_on_device), the CPU side run. `large`: transposed
/// parameters large enough for several blocks.
void expect_cuda_matches_the_cpu(uint64_t seed, bool large,
                                 void (*run_on_cuda)(const Config&, const Storage&, Lists&, uint64_t),
                                 const char* what) {
  for (const Config& c : configs()) {
    for (const Storage& s : kStorages) {
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed}) {
        Lists cpu = make_lists(c, s, layout, seed += 1000, large && layout == Layout::kTransposed);
        Lists dev = cpu;
        for (auto* list : {&dev.params, &dev.s0, &dev.s1, &dev.s2, &dev.masters})
          for (Tensor& t : *list) t = same_view_on_gpu(t);
        for (int step = 1; step <= 3; ++step) {
          next_step(cpu, seed + step);
          dev.grads.clear();
          for (const Tensor& g : cpu.grads) dev.grads.push_back(same_view_on_gpu(g));
          dev.steps = cpu.steps;
          run(c, s, cpu);
          run_on_cuda(c, s, dev, 1234);
          expect_same_lists(dev, cpu, describe(c.name, ", ", s.name, ", ", layout_name(layout), ", step ", step,
                                               ": ", what));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(steps_on_cuda_match_the_cpu, MT_GPU_TEST) {
  expect_cuda_matches_the_cpu(130000, true, run, "cuda vs cpu");
}

BOOST_AUTO_TEST_CASE(options_read_on_cuda_match_the_cpu, MT_GPU_TEST) {
  // The kernels a CUDA graph's replay runs: options read from device memory (both launch paths: contiguous
  // parameters in multi-tensor launches, transposed ones strided).
  expect_cuda_matches_the_cpu(170000, false, run_with_options_on_device, "options read on cuda vs passed on the cpu");
}

BOOST_AUTO_TEST_SUITE_END()
