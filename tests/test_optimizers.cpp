// tests/test_optimizers.cpp — the optimizers (optim/optimizer.h, optim/sgd.h, optim/adam.h): SGD, Adam and AdamW.
//
// PyTorch's numbers first: tests/golden/optim.json holds 20 steps of every option set of torch.optim.SGD, Adam and
// AdamW (two param groups with their own lr, a parameter that misses two gradients) in f32 and f64, replayed here
// (f32 within 1e-6 relative, f64 within 1e-12). Then the optimizer's contract: zero_grad both ways, gradients that
// accumulate until zeroed (4 micro-batches of loss/4 step like one batch of 4), parameters without a gradient left
// alone, state_dict round trips that continue bit for bit and load errors that name the key, every bad argument,
// and the reason for master weights: an f16 update below half an ulp of its weight is lost in f16 (kNone), kept by
// f32 masters, and kept on average by stochastic rounding in bf16. On CUDA, the same steps give the CPU's bits.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/mixtape.h>
#include <mixtape/optim/adam.h>
#include <mixtape/optim/sgd.h>

#include "compare.h"
#include "golden.h"
#include "reference.h"
#include "test_util.h"

namespace mt = mixtape;
namespace opt = mixtape::optim;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::StateDict;
using mt::Tensor;
using mt::test::expect_close;
using mt::test::expect_error;
using mt::test::expect_same_bits;
using mt::test::Tolerance;
using opt::MasterWeights;

namespace {

/// A leaf that requires grad holding a copy of `values`.
Tensor leaf(const Tensor& values) {
  Tensor t = mt::raw::clone(values);
  t.requires_grad_();
  return t;
}

/// Leaves with N(0, 1) values of `shapes` in `dtype` on `device`, drawn from `seed`.
std::vector<Tensor> leaves(const std::vector<Shape>& shapes, DType dtype, uint64_t seed,
                           Device device = Device::cpu()) {
  std::vector<Tensor> out;
  for (const Shape& s : shapes) out.push_back(leaf(mt::raw::to(mt::test::randn_seeded(s, dtype, seed++), device)));
  return out;
}

/// Sets each parameter's gradient to N(0, 1) values drawn from `seed` (its dtype and device).
void set_grads(const std::vector<Tensor>& params, uint64_t seed) {
  for (const Tensor& p : params)
    Tensor(p).set_grad(mt::raw::to(mt::test::randn_seeded(p.shape(), p.dtype(), seed++), p.device()));
}

std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(leaf(p.detach()));
  return out;
}

/// Every tensor of a state dict, bit for bit, and the same keys.
void expect_same_state(const StateDict& a, const StateDict& b, const std::string& what) {
  BOOST_TEST(a.keys() == b.keys(), what << ": the same keys");
  for (const auto& [key, t] : a)
    if (b.contains(key)) expect_same_bits(t, b.at(key), what + ": " + key);
}

/// The optimizers the behaviour tests run, by a name, over `params`.
using Factory = std::function<std::unique_ptr<opt::Optimizer>(std::vector<Tensor>, MasterWeights)>;
struct Named {
  std::string name;
  Factory make;
};
std::vector<Named> optimizer_kinds() {
  return {
      {"SGD momentum", [](std::vector<Tensor> p, MasterWeights m) {
         return std::make_unique<opt::SGD>(std::move(p), opt::SGDOptions{.lr = 0.05, .momentum = 0.9}, m);
       }},
      {"SGD nesterov, weight_decay", [](std::vector<Tensor> p, MasterWeights m) {
         return std::make_unique<opt::SGD>(
             std::move(p), opt::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, m);
       }},
      {"Adam amsgrad", [](std::vector<Tensor> p, MasterWeights m) {
         return std::make_unique<opt::Adam>(std::move(p), opt::AdamOptions{.lr = 0.01, .amsgrad = true}, m);
       }},
      {"AdamW", [](std::vector<Tensor> p, MasterWeights m) {
         return std::make_unique<opt::AdamW>(std::move(p), opt::AdamWOptions{.lr = 0.01}, m);
       }},
  };
}

// ---- the golden replay ----------------------------------------------------------------------------

/// The optimizer of a golden run: its options as defaults, param group 1 with its own lr.
std::unique_ptr<opt::Optimizer> golden_optimizer(const nlohmann::json& run, const std::vector<Tensor>& params) {
  const std::string kind = run.at("optimizer");
  const nlohmann::json& o = run.at("options");
  auto get = [&](const char* name, double fallback) { return o.contains(name) ? o.at(name).get<double>() : fallback; };
  std::vector<opt::ParamGroup> groups = {{{params[0]}, {}},
                                         {{params[1], params[2]}, {{"lr", run.at("group1_lr").get<double>()}}}};
  if (kind == "SGD")
    return std::make_unique<opt::SGD>(std::move(groups), opt::SGDOptions{.lr = get("lr", 1e-3),
                                                                           .momentum = get("momentum", 0),
                                                                           .dampening = get("dampening", 0),
                                                                           .weight_decay = get("weight_decay", 0),
                                                                           .nesterov = get("nesterov", 0) != 0,
                                                                           .maximize = get("maximize", 0) != 0});
  const std::pair<double, double> betas{get("beta1", 0.9), get("beta2", 0.999)};
  if (kind == "Adam")
    return std::make_unique<opt::Adam>(std::move(groups), opt::AdamOptions{.lr = get("lr", 1e-3),
                                                                             .betas = betas,
                                                                             .eps = get("eps", 1e-8),
                                                                             .weight_decay = get("weight_decay", 0),
                                                                             .amsgrad = get("amsgrad", 0) != 0,
                                                                             .maximize = get("maximize", 0) != 0});
  BOOST_TEST_REQUIRE(kind == "AdamW");
  return std::make_unique<opt::AdamW>(std::move(groups), opt::AdamWOptions{.lr = get("lr", 1e-3),
                                                                             .betas = betas,
                                                                             .eps = get("eps", 1e-8),
                                                                             .weight_decay = get("weight_decay", 1e-2),
                                                                             .amsgrad = get("amsgrad", 0) != 0,
                                                                             .maximize = get("maximize", 0) != 0});
}

/// The largest |got − want| / |want| over the elements with |want| >= 1e-3 (smaller ones fall under the atol).
double max_relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to(DType::kF64).to_vector<double>(), w = want.to(DType::kF64).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (std::fabs(w[i]) >= 1e-3) worst = std::max(worst, std::fabs(g[i] - w[i]) / std::fabs(w[i]));
  return worst;
}

/// Replays tests/golden/optim.json on `device`; returns the largest relative error seen in each dtype.
std::pair<double, double> replay_golden(Device device) {
  const auto golden = mt::test::load_golden("optim");
  BOOST_TEST_REQUIRE(golden.has_value());
  double worst_f32 = 0, worst_f64 = 0;
  for (const auto& c : golden->at("cases")) {
    const DType dtype = c.at("dtype") == "f32" ? DType::kF32 : DType::kF64;
    // f32: each step rounds a few operations in f32 (PyTorch's kernels in their order, ours in the same order
    // but possibly contracted differently), and 20 steps compound them; f64 likewise at f64's precision.
    const Tolerance tol = dtype == DType::kF32 ? Tolerance{1e-6, 1e-7} : Tolerance{1e-12, 1e-13};
    double& worst = dtype == DType::kF32 ? worst_f32 : worst_f64;
    for (const auto& run : c.at("runs")) {
      const std::string what = mt::test::describe(run.at("name").get<std::string>(), " ", dtype, " on ", device);
      std::vector<Tensor> params;
      for (const auto& t : c.at("initial")) params.push_back(leaf(mt::raw::to(mt::test::golden_tensor(t), device)));
      std::unique_ptr<opt::Optimizer> o = golden_optimizer(run, params);
      const auto& grads = c.at("grads");
      for (size_t step = 1; step <= grads.size(); ++step) {
        for (size_t i = 0; i < params.size(); ++i) {
          const auto& g = grads[step - 1][i];
          params[i].set_grad(g.is_null() ? Tensor() : mt::raw::to(mt::test::golden_tensor(g), device));
        }
        o->step();
        const std::string key = std::to_string(step);
        if (!run.at("after").contains(key)) continue;
        for (size_t i = 0; i < params.size(); ++i) {
          const Tensor want = mt::test::golden_tensor(run.at("after").at(key)[i]);
          expect_close(params[i], want, tol, mt::test::describe(what, ": parameter ", i, " after step ", step));
          worst = std::max(worst, max_relative_error(params[i], want));
        }
      }
      const StateDict sd = o->state_dict();
      const auto& state = run.at("state");
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string prefix = "state." + std::to_string(i) + ".";
        BOOST_TEST(sd.at(prefix + "step").item<int64_t>() == state[i].at("step").get<int64_t>(),
                   what << ": " << prefix << "step");
        for (const auto& [name, t] : state[i].items()) {
          if (name == "step") continue;
          BOOST_TEST_REQUIRE(sd.contains(prefix + name), what << ": state_dict has " << prefix << name);
          const Tensor want = mt::test::golden_tensor(t);
          expect_close(sd.at(prefix + name), want, tol, what + ": " + prefix + name);
          worst = std::max(worst, max_relative_error(sd.at(prefix + name), want));
        }
        for (const char* name : {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
          BOOST_TEST(sd.contains(prefix + name) == state[i].contains(name),
                     what << ": " << prefix << name << " present as in PyTorch");
      }
    }
  }
  return {worst_f32, worst_f64};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(optimizers)

BOOST_AUTO_TEST_CASE(golden_replay_of_torch_optim, MT_CPU_TEST* mt::test::golden_available("optim")) {
  const auto [f32, f64] = replay_golden(Device::cpu());
  BOOST_TEST_MESSAGE("optim.json on the CPU: largest relative error (|want| >= 1e-3) f32 " << f32 << ", f64 " << f64);
}

BOOST_AUTO_TEST_CASE(golden_replay_on_cuda, MT_GPU_TEST* mt::test::golden_available("optim")) {
  const auto [f32, f64] = replay_golden(Device::cuda());
  BOOST_TEST_MESSAGE("optim.json on CUDA: largest relative error (|want| >= 1e-3) f32 " << f32 << ", f64 " << f64);
}

// ---- gradients ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(zero_grad_sets_to_none_or_zeroes_in_place, MT_CPU_TEST) {
  std::vector<Tensor> params = leaves({{3, 4}, {5}}, DType::kF32, 1);
  opt::SGD sgd(params, {.lr = 0.1});
  set_grads(params, 10);
  const Tensor grad0 = params[0].grad();
  sgd.zero_grad(/*set_to_none=*/false);
  BOOST_TEST(params[0].grad().is_same(grad0), "zeroed in place: the same gradient tensor");
  expect_close(params[0].grad(), mt::zeros({3, 4}), mt::test::kExact, "zero_grad(false)");
  expect_close(params[1].grad(), mt::zeros({5}), mt::test::kExact, "zero_grad(false)");
  sgd.zero_grad();
  BOOST_TEST(!params[0].grad().defined());
  BOOST_TEST(!params[1].grad().defined());
  sgd.zero_grad();  // nothing to clear: no error
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_and_micro_batches_match_one_batch, MT_CPU_TEST) {
  // y = x · wᵀ + b, loss = mse(y, target) over a batch of 16 rows: one backward over the batch, or four of 4 rows
  // with loss / 4 each accumulating into .grad. The gradients agree (f64: to rounding), and so does the step.
  const Tensor x = mt::test::randn_seeded({16, 5}, DType::kF64, 3);
  const Tensor target = mt::test::randn_seeded({16, 2}, DType::kF64, 4);
  const std::vector<Tensor> init = leaves({{2, 5}, {2}}, DType::kF64, 5);
  auto loss_of = [](const std::vector<Tensor>& p, const Tensor& xb, const Tensor& tb) {
    return mt::mse_loss(mt::linear(xb, p[0], p[1]), tb);
  };
  for (const Named& n : optimizer_kinds()) {
    BOOST_TEST_CONTEXT(n.name) {
      std::vector<Tensor> whole = copies(init), micro = copies(init);
      auto o_whole = n.make(whole, MasterWeights::kF32), o_micro = n.make(micro, MasterWeights::kF32);
      for (int step = 0; step < 3; ++step) {
        o_whole->zero_grad();
        o_micro->zero_grad();
        loss_of(whole, x, target).backward();
        for (int k = 0; k < 4; ++k) {
          (loss_of(micro, x.slice(0, 4 * k, 4 * k + 4), target.slice(0, 4 * k, 4 * k + 4)) / 4.0).backward();
          if (k == 0) {  // after one micro-batch the gradient is a quarter-batch's, not the whole's
            BOOST_TEST(mt::test::relative_error(micro[0].grad(), whole[0].grad()) > 1e-3);
          }
        }
        for (size_t i = 0; i < whole.size(); ++i)
          expect_close(micro[i].grad(), whole[i].grad(), {1e-12, 1e-14}, mt::test::describe("gradient ", i));
        o_whole->step();
        o_micro->step();
        for (size_t i = 0; i < whole.size(); ++i)
          expect_close(micro[i], whole[i], {1e-12, 1e-14}, mt::test::describe("parameter ", i, " after step ", step));
      }
      // Without zero_grad a second backward adds to the first.
      o_whole->zero_grad();
      loss_of(whole, x, target).backward();
      const Tensor once = mt::raw::clone(whole[0].grad());
      loss_of(whole, x, target).backward();
      expect_close(whole[0].grad(), mt::raw::clone(once) * 2.0, {1e-15, 0}, "two backward passes accumulate");
    }
  }
}

BOOST_AUTO_TEST_CASE(parameters_without_a_gradient_are_skipped, MT_CPU_TEST) {
  for (const Named& n : optimizer_kinds()) {
    BOOST_TEST_CONTEXT(n.name) {
      std::vector<Tensor> params = leaves({{3, 4}, {5}, {2}}, DType::kF32, 20);
      const Tensor before = mt::raw::clone(params[1].detach());
      auto o = n.make(params, MasterWeights::kF32);
      for (int step = 0; step < 3; ++step) {
        set_grads(params, 30 + 10 * step);
        params[1].set_grad(Tensor());
        o->step();
      }
      expect_same_bits(params[1].detach(), before, "the parameter without a gradient");
      const StateDict sd = o->state_dict();
      BOOST_TEST(!sd.contains("state.1.step"), "no state for it");
      BOOST_TEST(sd.at("state.0.step").item<int64_t>() == 3);
      // Its first gradient starts its own count: Adam's bias correction of step 1, not 4.
      set_grads(params, 90);
      o->step();
      BOOST_TEST(o->state_dict().at("state.1.step").item<int64_t>() == 1);
      BOOST_TEST(o->state_dict().at("state.0.step").item<int64_t>() == 4);
    }
  }
}

// ---- state_dict ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(state_dict_round_trip_continues_bit_for_bit, MT_CPU_TEST) {
  struct Storage {
    const char* name;
    DType dtype;
    MasterWeights master;
  };
  for (const Storage& s : {Storage{"f32", DType::kF32, MasterWeights::kF32},
                           Storage{"f16 with f32 masters", DType::kF16, MasterWeights::kF32},
                           Storage{"bf16 with stochastic rounding", DType::kBF16, MasterWeights::kStochasticRounding},
                           Storage{"f16 in f16", DType::kF16, MasterWeights::kNone}}) {
    for (const Named& n : optimizer_kinds()) {
      BOOST_TEST_CONTEXT(n.name << ", " << s.name) {
        std::vector<Tensor> a = leaves({{3, 4}, {5}}, s.dtype, 40);
        auto oa = n.make(a, s.master);
        for (int step = 0; step < 3; ++step) {
          set_grads(a, 50 + 10 * step);
          oa->step();
        }
        const StateDict sd = oa->state_dict();
        BOOST_TEST(sd.contains("state.0.master") == (s.master == MasterWeights::kF32 && s.dtype != DType::kF32));
        BOOST_TEST(sd.contains("stochastic_rounding.seed") == (s.master == MasterWeights::kStochasticRounding));
        // A fresh optimizer over copies of the parameters (another seed drawn for its stochastic rounding).
        mt::manual_seed(999);
        std::vector<Tensor> b = copies(a);
        auto ob = n.make(b, s.master);
        ob->load_state_dict(sd);
        expect_same_state(ob->state_dict(), sd, "loaded");
        for (int step = 0; step < 3; ++step) {
          set_grads(a, 80 + 10 * step);
          set_grads(b, 80 + 10 * step);
          oa->step();
          ob->step();
        }
        for (size_t i = 0; i < a.size(); ++i)
          expect_same_bits(b[i].detach(), a[i].detach(), "parameter after 3 more steps");
        expect_same_state(ob->state_dict(), oa->state_dict(), "after 3 more steps");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(load_state_dict_errors_name_the_key_and_change_nothing, MT_CPU_TEST) {
  // Two param groups of one parameter each.
  auto two_groups = [](const std::vector<Tensor>& p) {
    return std::vector<opt::ParamGroup>{{{p[0]}, {}}, {{p[1]}, {{"lr", 0.005}}}};
  };
  std::vector<Tensor> params = leaves({{3, 4}, {5}}, DType::kF32, 60);
  opt::Adam adam(two_groups(params), {.lr = 0.01});
  set_grads(params, 61);
  adam.step();
  const StateDict good = adam.state_dict();
  // A copy of `good` with `key` replaced (or dropped when `value` is undefined), and one key added.
  auto edited = [&](const std::string& key, const Tensor& value, const std::string& extra = "") {
    BOOST_TEST_REQUIRE((key.empty() || good.contains(key)), "the key to edit exists: " << key);
    StateDict sd;
    for (const auto& [k, t] : good)
      if (k != key) sd.insert(k, mt::raw::clone(t));
      else if (value.defined()) sd.insert(k, value);
    if (!extra.empty()) sd.insert(extra, mt::zeros({1}));
    return sd;
  };
  // A fresh Adam over other parameters, with a state of its own to keep when a load fails.
  std::vector<Tensor> other = leaves({{3, 4}, {5}}, DType::kF32, 62);
  opt::Adam target(two_groups(other), {.lr = 0.02});
  set_grads(other, 63);
  target.step();
  const StateDict before = target.state_dict();
  StateDict before_copy;
  for (const auto& [k, t] : before) before_copy.insert(k, mt::raw::clone(t));
  auto expect_load_error = [&](const StateDict& sd, const std::vector<std::string>& parts, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      expect_error([&] { target.load_state_dict(sd); }, parts);
      expect_same_state(target.state_dict(), before_copy, "unchanged after the failed load");
      BOOST_TEST(target.lr(0) == 0.02);
    }
  };
  expect_load_error(edited("state.1.exp_avg", Tensor()), {"Adam.load_state_dict", "missing keys", "state.1.exp_avg"},
                    "a missing buffer");
  expect_load_error(edited("param_groups.0.beta2", Tensor()), {"missing keys", "param_groups.0.beta2"},
                    "a missing option");
  expect_load_error(edited("", Tensor(), "state.0.momentum_buffer"), {"unexpected keys", "state.0.momentum_buffer"},
                    "a buffer Adam does not keep");
  expect_load_error(edited("", Tensor(), "param_groups.2.lr"), {"unexpected keys", "param_groups.2.lr"},
                    "a third group");
  expect_load_error(edited("state.0.exp_avg_sq", mt::zeros({4, 3})), {"state.0.exp_avg_sq", "shape"},
                    "a misshapen buffer");
  expect_load_error(edited("state.1.exp_avg", mt::zeros({5}, DType::kF64)), {"state.1.exp_avg", "dtype"},
                    "a buffer of another dtype");
  expect_load_error(edited("param_groups.0.lr", mt::scalar_tensor(0.5, DType::kF32)), {"param_groups.0.lr", "dtype"},
                    "an option stored as f32");
  expect_load_error(edited("state.0.step", mt::scalar_tensor(1.0, DType::kF64)), {"state.0.step", "dtype"},
                    "a step count stored as f64");
  expect_load_error(edited("state.0.step", mt::from_vector<int64_t>({0}, Shape{})), {"state.0.step", "is 0"},
                    "a step count of 0");
  expect_load_error(edited("state.0.step", mt::from_vector<int64_t>({int64_t{INT32_MAX} + 1}, Shape{})),
                    {"state.0.step", "is 2147483648", "[1, 2147483647]"}, "a step count past the i32 counter");
  expect_load_error(edited("param_groups.1.params", mt::from_vector<int64_t>({0}, Shape{1})),
                    {"param_groups.1.params", "lists parameter 0", "expected 1"}, "another parameter in group 1");
  expect_load_error(edited("param_groups.0.params", mt::from_vector<int64_t>({0, 1}, Shape{2})),
                    {"param_groups.0.params", "shape"}, "two parameters in group 0");
  expect_load_error(edited("param_groups.1.lr", mt::scalar_tensor(-1.0, DType::kF64)),
                    {"Adam", "param group 1", "invalid learning rate: -1"}, "a negative lr");
  expect_load_error(edited("param_groups.1.beta1", mt::scalar_tensor(1.0, DType::kF64)),
                    {"Adam", "param group 1", "invalid beta parameter at index 0: 1"}, "beta1 = 1");

  // A state dict of f16 parameters with masters does not fit f32 parameters: their state has no master.
  std::vector<Tensor> halves = leaves({{3, 4}, {5}}, DType::kF16, 64);
  opt::Adam with_masters(two_groups(halves), {.lr = 0.01});
  set_grads(halves, 65);
  with_masters.step();
  expect_load_error(with_masters.state_dict(), {"unexpected keys", "state.0.master"}, "masters for f32 parameters");

  target.load_state_dict(good);  // and the good one loads
  BOOST_TEST(target.lr(0) == 0.01);
}

// ---- arguments --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_defaults_are_pytorchs, MT_CPU_TEST) {
  // torch.optim 2.x: SGD(lr=1e-3), Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0), AdamW the same
  // with weight_decay=1e-2; no amsgrad, nesterov or maximize. (The golden replay passes every option explicitly.)
  using Options = std::map<std::string, double>;
  auto options_of = [](const opt::Optimizer& o) {
    const auto& items = o.param_groups().at(0).options.items();
    return Options(items.begin(), items.end());
  };
  const Tensor w = leaf(mt::ones({2}));
  const Options adam = {{"lr", 1e-3},         {"beta1", 0.9},  {"beta2", 0.999}, {"eps", 1e-8},
                        {"weight_decay", 0.0}, {"amsgrad", 0.0}, {"maximize", 0.0}};
  Options adamw = adam;
  adamw["weight_decay"] = 1e-2;
  const Options sgd = {{"lr", 1e-3},         {"momentum", 0.0}, {"dampening", 0.0},
                       {"weight_decay", 0.0}, {"nesterov", 0.0}, {"maximize", 0.0}};
  BOOST_TEST((options_of(opt::Adam({w})) == adam));
  BOOST_TEST((options_of(opt::AdamW({w})) == adamw));
  BOOST_TEST((options_of(opt::SGD({w})) == sgd));
}

BOOST_AUTO_TEST_CASE(bad_parameters_and_options_are_errors, MT_CPU_TEST) {
  Tensor w = leaf(mt::ones({2, 3})), b = leaf(mt::zeros({3}));
  expect_error([] { opt::SGD(std::vector<Tensor>{}, {.lr = 0.1}); }, {"SGD", "empty parameter list"});
  expect_error([&] { opt::Adam(std::vector<opt::ParamGroup>{{{}, {}}}); }, {"Adam", "empty parameter list"});
  expect_error([&] { opt::SGD({w, Tensor()}); }, {"SGD", "parameter 1", "undefined"});
  const Tensor not_leaf = w * 2.0;
  expect_error([&] { opt::AdamW({w, not_leaf}); }, {"AdamW", "non-leaf", "parameter 1"});
  expect_error([&] { opt::SGD({mt::zeros({3}, DType::kI64)}); }, {"SGD", "floating", "parameter 0", "i64"});
  expect_error([&] { opt::SGD({mt::zeros({3})}); }, {"SGD", "parameter 0", "does not require grad"});
  expect_error([&] { opt::SGD({w, b, w}); }, {"SGD", "parameter 2", "twice"});
  expect_error([&] { opt::SGD(std::vector<opt::ParamGroup>{{{w}, {}}, {{b, w}, {}}}); }, {"parameter 2", "twice"});
  expect_error([&] { opt::SGD(std::vector<opt::ParamGroup>{{{w}, {{"betas", 0.9}}}}); },
               {"SGD", "param group 0", "'betas'", "lr, momentum"});
  expect_error([&] { opt::SGD({w}, {.lr = -0.1}); }, {"SGD", "param group 0", "invalid learning rate: -0.1"});
  expect_error([&] { opt::SGD({w}, {.momentum = -1}); }, {"invalid momentum value: -1"});
  expect_error([&] { opt::SGD({w}, {.weight_decay = -1}); }, {"invalid weight_decay value: -1"});
  expect_error([&] { opt::SGD({w}, {.nesterov = true}); },
               {"Nesterov momentum requires a momentum and zero dampening"});
  expect_error([&] { opt::SGD({w}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
               {"Nesterov", "dampening 0.1"});
  expect_error([&] { opt::SGD(std::vector<opt::ParamGroup>{{{w}, {}}, {{b}, {{"lr", -1.0}}}}); },
               {"param group 1", "invalid learning rate: -1"});
  expect_error([&] { opt::SGD(std::vector<opt::ParamGroup>{{{w}, {{"nesterov", 0.5}}}}); }, {"nesterov is 0.5"});
  expect_error([&] { opt::Adam({w}, {.betas = {1.0, 0.999}}); }, {"Adam", "invalid beta parameter at index 0: 1"});
  expect_error([&] { opt::Adam({w}, {.betas = {0.9, -0.1}}); }, {"invalid beta parameter at index 1: -0.1"});
  expect_error([&] { opt::Adam({w}, {.betas = {0.9, 1.0}}); }, {"invalid beta parameter at index 1: 1"});  // as torch
  expect_error([&] { opt::AdamW({w}, {.eps = -1e-8}); }, {"AdamW", "invalid epsilon value"});
  expect_error([&] { opt::AdamW({w}, {.weight_decay = -0.01}); }, {"invalid weight_decay value: -0.01"});
  expect_error([&] { opt::AdamW({w}, {.lr = std::nan("")}); }, {"invalid learning rate: nan"});
  expect_error([&] { opt::SGD({leaf(mt::zeros({3}, DType::kF16))}, {}, MasterWeights::kStochasticRounding); },
               {"SGD", "kStochasticRounding", "bf16", "parameter 0", "f16"});

  // After construction: add_param_group's checks, lr and set_lr, a gradient unlike its parameter.
  opt::SGD sgd({w}, {.lr = 0.1});
  expect_error([&] { sgd.add_param_group({{b}, {{"lr", -2.0}}}); }, {"SGD", "param group 1", "invalid learning rate"});
  expect_error([&] { sgd.add_param_group({{w}, {}}); }, {"SGD", "parameter 1", "twice"});
  expect_error([&] { sgd.add_param_group({{}, {}}); }, {"SGD.add_param_group", "no parameters"});
  BOOST_TEST(sgd.param_groups().size() == 1u, "failed add_param_group calls add nothing");
  sgd.add_param_group({{b}, {{"lr", 0.5}}});
  BOOST_TEST(sgd.lr(1) == 0.5);
  BOOST_TEST(sgd.param_groups()[1].options.get("momentum") == 0.0, "unset options take the defaults");
  sgd.set_lr(0, 0.25);
  BOOST_TEST(sgd.lr(0) == 0.25);
  expect_error([&] { sgd.lr(2); }, {"SGD.lr", "no param group 2"});
  expect_error([&] { sgd.set_lr(0, -1); }, {"SGD.set_lr", "invalid learning rate -1"});
  BOOST_TEST(sgd.momentum_option() == "momentum");
  BOOST_TEST(opt::Adam({leaf(mt::ones({1}))}).momentum_option() == "beta1");
  BOOST_TEST(sgd.parameters().size() == 2u);
  BOOST_TEST(sgd.name() == "SGD");
  expect_error([&] { sgd.param_groups()[0].options.get("beta1"); }, {"no option 'beta1'", "lr, momentum"});
  expect_error([&] { sgd.param_groups()[0].options.set("beta1", 0.9); },
               {"GroupOptions::set", "no option 'beta1'", "lr, momentum"});  // a typo is not a new option

  // A gradient of another dtype cannot be set (Tensor::set_grad refuses it); step() checks again for gradients
  // that reach a parameter some other way.
  expect_error([&] { w.set_grad(mt::zeros({2, 3}, DType::kF64)); }, {"set_grad", "dtype f64", "dtype f32"});
}

// ---- master weights: the updates f16 loses ---------------------------------------------------------

BOOST_AUTO_TEST_CASE(small_updates_are_lost_in_f16_kept_by_masters_and_by_stochastic_rounding, MT_CPU_TEST) {
  // SGD with lr 1 and a constant gradient of 2^-13: each update is 2^-13 = 1.2e-4, below half an ulp of weights
  // near 1 in f16 (2^-12 below 1: weight / update = 8192 >= 2048) and in bf16 (2^-9).
  const int64_t n = 4096;
  const int steps = 100;
  const double update = std::ldexp(1.0, -13);
  const double exact = 1.0 - steps * update;  // 0.98779296875: f16 holds it exactly, bf16 does not
  auto train = [&](DType dtype, MasterWeights master) {
    Tensor w = leaf(mt::ones({n}, dtype));
    opt::SGD sgd({w}, {.lr = 1.0}, master);
    for (int s = 0; s < steps; ++s) {
      w.set_grad(mt::full({n}, update, dtype));
      sgd.step();
    }
    return std::make_pair(w.detach(), sgd.state_dict());
  };
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    BOOST_TEST_CONTEXT(dtype) {
      // Updated in its own dtype: every update rounds back to 1.
      const auto [lost, lost_sd] = train(dtype, MasterWeights::kNone);
      expect_close(lost, mt::ones({n}, dtype), mt::test::kExact, "kNone: the weights never move");
      BOOST_TEST(!lost_sd.contains("state.0.master"));
      // f32 masters: the master accumulates every update exactly (2^-13 steps are exact in f32), the weight is it
      // rounded to nearest.
      const auto [kept, kept_sd] = train(dtype, MasterWeights::kF32);
      expect_close(kept_sd.at("state.0.master"), mt::full({n}, exact), mt::test::kExact, "kF32: the master");
      expect_close(kept, mt::full({n}, exact).to(dtype), mt::test::kExact, "kF32: the weight is the master rounded");
    }
  }
  // Stochastic rounding (bf16, no master): each element is exact - e_t in expectation, where the rounding errors e_t
  // have mean 0 and |e_t| <= one bf16 spacing below 1 (2^-8), so after `steps` steps an element's deviation has a
  // standard deviation <= 2^-8 · √steps / 2 and the mean of n independent elements <= that / √n = 3.1e-4. Six of
  // those (a false failure once in 10^9) still tells it from the lost update's 0.0122.
  mt::manual_seed(11);
  const auto [rounded, rounded_sd] = train(DType::kBF16, MasterWeights::kStochasticRounding);
  const std::vector<double> v = rounded.to(DType::kF64).to_vector<double>();
  double mean = 0;
  for (double e : v) mean += e / static_cast<double>(n);
  const double bound = 6 * std::ldexp(1.0, -8) * std::sqrt(static_cast<double>(steps)) / 2 / std::sqrt(double(n));
  BOOST_TEST(std::fabs(mean - exact) < bound, "stochastic rounding: mean " << mean << ", expected " << exact
                                                  << " within " << bound << " (the lost update stays at 1)");
  BOOST_TEST(!rounded_sd.contains("state.0.master"));
  // Reproducible: the same seed gives the same bits.
  mt::manual_seed(11);
  expect_same_bits(train(DType::kBF16, MasterWeights::kStochasticRounding).first, rounded, "manual_seed(11) again");
}

BOOST_AUTO_TEST_CASE(a_parameter_written_between_steps_is_what_its_master_continues_from, MT_CPU_TEST) {
  // An f16/bf16 parameter's f32 master holds bits the parameter lacks, but the parameter is what the user sees and
  // writes (Module::load_state_dict, an init function, copy_ under NoGradGuard, a cast): the next step starts from
  // what was written, and the master keeps its extra bits wherever the parameter still holds its rounding. SGD with
  // lr 1 and a gradient of 2^-13: each update is below half an ulp of 1 in f16 and bf16, seen by the master alone.
  const double u = std::ldexp(1.0, -13);
  auto step = [u](Tensor& w, opt::Optimizer& o) {
    w.set_grad(mt::full(w.shape(), u, w.dtype()));
    o.step();
  };
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    BOOST_TEST_CONTEXT(dtype) {
      Tensor w = leaf(mt::ones({4}, dtype));
      opt::SGD sgd({w}, {.lr = 1.0});
      for (int i = 0; i < 3; ++i) step(w, sgd);
      expect_close(sgd.state_dict().at("state.0.master"), mt::full({4}, 1 - 3 * u), mt::test::kExact, "3 steps");
      {
        mt::autograd::NoGradGuard no_grad;
        w.set({0}, 2.0);                 // a new value
        w.narrow(0, 1, 1).fill_(0.5);    // through a view
        w.set({2}, w.at<double>({2}));   // the value it holds (the master's rounding): nothing to take
      }
      step(w, sgd);
      const Tensor want = mt::from_vector<double>({2 - u, 0.5 - u, 1 - 4 * u, 1 - 4 * u}).to(DType::kF32);
      expect_close(sgd.state_dict().at("state.0.master"), want, mt::test::kExact, "written, then a step");
      expect_close(w.detach(), want.to(dtype), mt::test::kExact, "the parameter: the master rounded");
    }
  }

  // A module cast to f32 after steps in f16 is updated in place, and its master dropped (the optimizer's state_dict
  // then loads into it again); cast back to f16, its next step starts from the f32 training's value, not from the
  // master of before the cast. lr 1, gradient -1: each step adds 1.
  mt::nn::Linear layer(2, 1, /*bias=*/false);
  layer.to(DType::kF16);
  {
    mt::autograd::NoGradGuard no_grad;
    layer.weight.fill_(1.0);
  }
  opt::SGD sgd(layer.parameters(), {.lr = 1.0});
  auto add_one = [&] {
    layer.weight.set_grad(mt::full({1, 2}, -1.0, layer.weight.dtype()));
    sgd.step();
  };
  add_one();
  layer.to(DType::kF32);
  BOOST_TEST(sgd.state_dict().contains("state.0.master") == false, "no master for an f32 parameter");
  sgd.load_state_dict(sgd.state_dict());
  for (int i = 0; i < 3; ++i) add_one();
  expect_close(layer.weight.detach(), mt::full({1, 2}, 5.0), mt::test::kExact, "f32 steps, in place");
  layer.to(DType::kF16);
  expect_close(sgd.state_dict().at("state.0.master"), mt::full({1, 2}, 5.0), mt::test::kExact, "before a step");
  sgd.load_state_dict(sgd.state_dict());  // the master it lists is expected back
  add_one();
  expect_close(layer.weight.detach(), mt::full({1, 2}, 6.0, DType::kF16), mt::test::kExact, "f16 again");
  expect_close(sgd.state_dict().at("state.0.master"), mt::full({1, 2}, 6.0), mt::test::kExact, "its new master");
}

BOOST_AUTO_TEST_CASE(a_parameter_cast_after_its_first_step_is_refused_before_anything_changes, MT_CPU_TEST) {
  // Adam's moments are f32 for f32 parameters; a layer cast to f64 after a step no longer matches them. The step is
  // refused naming the parameter and the buffer, before the parameters ahead of it (another layer's) are updated.
  mt::manual_seed(3);
  mt::nn::Linear first(3, 2), second(2, 2);
  std::vector<Tensor> params = first.parameters();
  for (const Tensor& p : second.parameters()) params.push_back(p);
  opt::Adam adam(params, {.lr = 0.1});
  set_grads(params, 20);
  adam.step();
  second.to(DType::kF64);  // its gradients too: they still match their parameters
  const StateDict state = adam.state_dict();
  const Tensor weight = first.weight.detach().clone();
  expect_error([&] { adam.step(); },
               {"Adam.step: parameter 2", "f64 [2, 2]", "'exp_avg' is f32 [2, 2]", "moved or cast after its first step"});
  expect_same_bits(first.weight.detach(), weight, "the first layer, ahead of the refused parameter");
  expect_same_state(adam.state_dict(), state, "the state");
}

BOOST_AUTO_TEST_CASE(a_model_and_its_optimizer_load_in_either_order_and_resume_exactly, MT_CPU_TEST) {
  // Masters with bits the f16 parameters lack (small Adam steps), saved; a fresh model and optimizer load both, the
  // optimizer first or the model first: the same steps follow, bit for bit, as without the interruption.
  for (const bool optimizer_first : {true, false}) {
    BOOST_TEST_CONTEXT((optimizer_first ? "optimizer first" : "model first")) {
      std::vector<Tensor> a = leaves({{3, 4}, {5}}, DType::kF16, 60);
      opt::Adam oa(a, {.lr = 1e-4});
      for (int s = 0; s < 3; ++s) {
        set_grads(a, 70 + 10 * s);
        oa.step();
      }
      const StateDict sd = oa.state_dict();
      const std::vector<Tensor> saved = copies(a);
      std::vector<Tensor> b = leaves({{3, 4}, {5}}, DType::kF16, 90);  // other values, until loaded
      opt::Adam ob(b, {.lr = 1e-4});
      set_grads(b, 99);
      ob.step();  // a step of its own first: it has masters of its own values
      auto load_model = [&] {
        mt::autograd::NoGradGuard no_grad;
        for (size_t i = 0; i < b.size(); ++i) b[i].copy_(saved[i]);
      };
      if (!optimizer_first) load_model();
      ob.load_state_dict(sd);
      if (optimizer_first) load_model();
      for (int s = 0; s < 3; ++s) {
        set_grads(a, 100 + 10 * s);
        set_grads(b, 100 + 10 * s);
        oa.step();
        ob.step();
      }
      for (size_t i = 0; i < a.size(); ++i) expect_same_bits(b[i].detach(), a[i].detach(), "after 3 more steps");
      expect_same_state(ob.state_dict(), oa.state_dict(), "after 3 more steps");
    }
  }
}

BOOST_AUTO_TEST_CASE(reduced_parameters_with_masters_follow_f32_training, MT_CPU_TEST) {
  // The same f32 values trained in f32 and as f16/bf16 parameters with f32 masters and f32 gradients' roundings:
  // the masters follow the f32 run within the error of the rounded gradients, and each parameter is its master
  // rounded to nearest.
  for (const Named& n : optimizer_kinds()) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      BOOST_TEST_CONTEXT(n.name << ", " << dtype) {
        std::vector<Tensor> reduced = leaves({{8, 16}, {16}}, dtype, 70);
        std::vector<Tensor> full;
        for (const Tensor& p : reduced) full.push_back(leaf(p.detach().to(DType::kF32)));
        auto o_reduced = n.make(reduced, MasterWeights::kF32), o_full = n.make(full, MasterWeights::kF32);
        for (int step = 0; step < 5; ++step) {
          set_grads(reduced, 100 + 10 * step);
          for (size_t i = 0; i < full.size(); ++i) full[i].set_grad(reduced[i].grad().to(DType::kF32));
          o_reduced->step();
          o_full->step();
        }
        const StateDict sd = o_reduced->state_dict();
        for (size_t i = 0; i < reduced.size(); ++i) {
          const Tensor master = sd.at("state." + std::to_string(i) + ".master");
          BOOST_TEST(master.dtype() == DType::kF32);
          BOOST_TEST(sd.at("state." + std::to_string(i) + (n.name.starts_with("SGD") ? ".momentum_buffer" : ".exp_avg"))
                         .dtype() == DType::kF32);
          // Same gradients, same f32 arithmetic: the masters are the f32 run's parameters exactly.
          expect_same_bits(master, full[i].detach(), "the master is the f32 run's parameter");
          expect_same_bits(reduced[i].detach(), master.to(dtype), "the parameter is its master rounded");
        }
      }
    }
  }
}

// ---- CUDA -----------------------------------------------------------------------------------------

/// Trains two copies of the same parameters on `device` with optimizer `n` for 6 iterations whose found_inf is 1 at
/// iterations 0, 2 and 3 (the very first skipped, and two in a row): one optimizer is stepped with step(found_inf)
/// every time, the other with step() only when found_inf is 0. After each iteration both must agree bit for bit:
/// the parameters, and the state_dicts (update counts included). With `parameter_without_grad`, the second
/// parameter has no gradient at iterations 1 and 4 (left alone by both).
void expect_skips_on_the_device_are_no_steps(const Named& n, DType dtype, MasterWeights master, Device device,
                                            bool parameter_without_grad = false) {
  std::vector<Tensor> a = leaves({{6, 5}, {7}}, dtype, 90, device), b = copies(a);
  mt::manual_seed(7);
  auto decided_on_device = n.make(a, master);
  mt::manual_seed(7);  // the same stochastic-rounding seed
  auto decided_on_host = n.make(b, master);
  for (int it = 0; it < 6; ++it) {
    BOOST_TEST_CONTEXT("iteration " << it) {
      const bool inf = it == 0 || it == 2 || it == 3;
      set_grads(a, 300 + 10 * static_cast<uint64_t>(it));
      set_grads(b, 300 + 10 * static_cast<uint64_t>(it));
      if (parameter_without_grad && (it == 1 || it == 4)) {
        a[1].set_grad(Tensor());
        b[1].set_grad(Tensor());
      }
      decided_on_device->step(mt::raw::to(mt::full({1}, inf ? 1.0 : 0.0), device));
      if (!inf) decided_on_host->step();
      for (size_t i = 0; i < a.size(); ++i)
        expect_same_bits(a[i].detach(), b[i].detach(), mt::test::describe("parameter ", i));
      expect_same_state(decided_on_device->state_dict(), decided_on_host->state_dict(), "state");
    }
  }
  // Counts of the updates that ran (iterations 1, 4 and 5; only 5 for the parameter without gradients at 1 and 4),
  // not of the tries.
  const StateDict sd = decided_on_device->state_dict();
  BOOST_TEST(sd.at("state.0.step").item<int64_t>() == 3);
  BOOST_TEST(sd.at("state.1.step").item<int64_t>() == (parameter_without_grad ? 1 : 3));
}

BOOST_AUTO_TEST_CASE(a_step_skipped_on_the_device_is_no_step_at_all, MT_CPU_TEST) {
  struct Storage {
    const char* name;
    DType dtype;
    MasterWeights master;
  };
  for (const Named& n : optimizer_kinds())
    for (const Storage& s : {Storage{"f32", DType::kF32, MasterWeights::kF32},
                             Storage{"f16 with f32 masters", DType::kF16, MasterWeights::kF32},
                             Storage{"bf16 with stochastic rounding", DType::kBF16, MasterWeights::kStochasticRounding},
                             Storage{"f16 in f16", DType::kF16, MasterWeights::kNone}})
      BOOST_TEST_CONTEXT(n.name << ", " << s.name) {
        expect_skips_on_the_device_are_no_steps(n, s.dtype, s.master, Device::cpu());
        expect_skips_on_the_device_are_no_steps(n, s.dtype, s.master, Device::cpu(), /*parameter_without_grad=*/true);
      }
  // A parameter whose every update so far was skipped has no state to save, as one never stepped.
  std::vector<Tensor> p = leaves({{3}}, DType::kF32, 95);
  opt::AdamW adamw(p, {.lr = 0.01});
  set_grads(p, 96);
  adamw.step(mt::full({1}, 1.0));
  BOOST_TEST(!adamw.state_dict().contains("state.0.step"));
  expect_error([&] { adamw.step(mt::full({2}, 0.0)); }, {"AdamW.step(found_inf)", "one-element f32", "[2]"});
  expect_error([&] { adamw.step(mt::full({1}, 0.0, DType::kF64)); }, {"AdamW.step(found_inf)", "f64"});
}

// The update count is an i32 counter on the parameter's device: it stops at 2^31 − 1 (Adam's bias corrections are 1
// long before) instead of wrapping to a negative count.
BOOST_AUTO_TEST_CASE(the_update_count_stops_at_its_largest_value, MT_CPU_TEST) {
  std::vector<Tensor> p = leaves({{3}}, DType::kF32, 97);
  opt::AdamW adamw(p, {.lr = 0.01});
  set_grads(p, 98);
  adamw.step();
  StateDict sd = adamw.state_dict();
  for (int64_t count : {int64_t{INT32_MAX} - 1, int64_t{INT32_MAX}}) {
    StateDict edited;
    for (const auto& [k, t] : sd) edited.insert(k, k == "state.0.step" ? mt::from_vector<int64_t>({count}, Shape{})
                                                                         : mt::raw::clone(t));
    adamw.load_state_dict(edited);
    adamw.step();
    BOOST_TEST(adamw.state_dict().at("state.0.step").item<int64_t>() == INT32_MAX);
    adamw.step();
    BOOST_TEST(adamw.state_dict().at("state.0.step").item<int64_t>() == INT32_MAX);
    for (float v : p[0].to_vector<float>()) BOOST_TEST(std::isfinite(v));
  }
}

BOOST_AUTO_TEST_CASE(a_step_skipped_on_cuda_is_no_step_at_all, MT_GPU_TEST) {
  for (const Named& n : optimizer_kinds()) {
    BOOST_TEST_CONTEXT(n.name) {
      expect_skips_on_the_device_are_no_steps(n, DType::kF32, MasterWeights::kF32, Device::cuda());
      expect_skips_on_the_device_are_no_steps(n, DType::kF16, MasterWeights::kF32, Device::cuda(), true);
      expect_skips_on_the_device_are_no_steps(n, DType::kBF16, MasterWeights::kStochasticRounding, Device::cuda());
    }
  }
}

namespace {

/// Twins of `shapes` in `dtype`, one on the CPU and one on CUDA, each under optimizer n (the same stochastic-rounding
/// seed), take `steps` steps with the same gradients — on the GPU a 2-D gradient is a transposed view when
/// `transposed_2d_grads` (its parameter takes the strided kernel) — and must end with the same bits of parameters
/// and state.
void expect_cuda_steps_to_match_the_cpu(const Named& n, DType dtype, MasterWeights master,
                                        const std::vector<Shape>& shapes, uint64_t seed, int steps,
                                        bool transposed_2d_grads = false) {
  std::vector<Tensor> cpu = leaves(shapes, dtype, seed);
  std::vector<Tensor> gpu;
  for (const Tensor& p : cpu) gpu.push_back(leaf(mt::test::gpu(p.detach())));
  mt::manual_seed(seed);
  auto o_cpu = n.make(cpu, master);
  mt::manual_seed(seed);  // the same stochastic-rounding seed
  auto o_gpu = n.make(gpu, master);
  for (int step = 0; step < steps; ++step) {
    set_grads(cpu, seed + 100 + 10 * static_cast<uint64_t>(step));
    for (size_t i = 0; i < cpu.size(); ++i) {
      const Tensor g = cpu[i].grad();
      if (transposed_2d_grads && g.dim() == 2) {  // the same values, held transposed on the GPU
        gpu[i].set_grad(mt::test::gpu(mt::raw::clone(g.t())).t());
        BOOST_REQUIRE(!gpu[i].grad().is_contiguous());
      } else {
        gpu[i].set_grad(mt::test::gpu(g));
      }
    }
    o_cpu->step();
    o_gpu->step();
  }
  for (size_t i = 0; i < cpu.size(); ++i)
    expect_same_bits(gpu[i].detach(), cpu[i].detach(), mt::test::describe("parameter ", i, ": cuda vs cpu"));
  expect_same_state(o_gpu->state_dict(), o_cpu->state_dict(), "state: cuda vs cpu");
}

/// How the parameters of a CUDA-vs-CPU case are held.
struct ParamStorage {
  DType dtype;
  MasterWeights master;
};

}  // namespace

BOOST_AUTO_TEST_CASE(steps_on_cuda_match_the_cpu, MT_GPU_TEST) {
  for (const Named& n : optimizer_kinds())
    for (const ParamStorage& s :
         {ParamStorage{DType::kF32, MasterWeights::kF32}, ParamStorage{DType::kF64, MasterWeights::kF32},
          ParamStorage{DType::kF16, MasterWeights::kF32}, ParamStorage{DType::kBF16, MasterWeights::kF32},
          ParamStorage{DType::kBF16, MasterWeights::kStochasticRounding},
          ParamStorage{DType::kF16, MasterWeights::kNone}})
      BOOST_TEST_CONTEXT(n.name << ", " << s.dtype) {
        expect_cuda_steps_to_match_the_cpu(n, s.dtype, s.master, {{33, 65}, {7}}, 80, 4);
      }
}

BOOST_AUTO_TEST_CASE(many_parameters_on_cuda_match_the_cpu, MT_GPU_TEST) {
  // 70 parameters: more than one multi-tensor launch (32 runs each), parameters of several chunks (4096 elements),
  // and every seventh gradient a transposed view (its parameter takes the strided kernel).
  const std::vector<int64_t> sizes = {1, 4095, 4097, 3 * 4096 + 17, 7, 2 * 4096, 64};
  std::vector<Shape> shapes;
  for (size_t i = 0; i < 70; ++i) shapes.push_back(i % 7 == 5 ? Shape{2, sizes[i % 7] / 2} : Shape{sizes[i % 7]});
  for (const Named& n : optimizer_kinds())
    for (const ParamStorage& s : {ParamStorage{DType::kF32, MasterWeights::kF32},
                                  ParamStorage{DType::kF16, MasterWeights::kF32},
                                  ParamStorage{DType::kBF16, MasterWeights::kStochasticRounding}})
      BOOST_TEST_CONTEXT(n.name << ", " << s.dtype) {
        expect_cuda_steps_to_match_the_cpu(n, s.dtype, s.master, shapes, 90, 3, /*transposed_2d_grads=*/true);
      }
}

BOOST_AUTO_TEST_CASE(a_parameter_moved_after_its_first_step_takes_its_count_along, MT_GPU_TEST) {
  // Plain SGD keeps no buffers, so its parameters may change device between steps (as in PyTorch): the update count,
  // which lives beside the parameter, follows it (the kernels read it where the parameter is).
  mt::nn::Linear moved(4, 3), kept(4, 3);
  for (size_t i = 0; i < kept.parameters().size(); ++i) kept.parameters()[i].detach().copy_(moved.parameters()[i]);
  opt::SGD on_both(moved.parameters(), {.lr = 0.1}), on_cpu(kept.parameters(), {.lr = 0.1});
  const Tensor x = mt::test::randn_seeded({5, 4}, DType::kF32, 11);
  for (int step = 0; step < 3; ++step) {
    if (step == 1) moved.to(Device::cuda());
    if (step == 2) moved.to(Device::cpu());
    const Device here = step == 1 ? Device::cuda() : Device::cpu();
    on_both.zero_grad();
    on_cpu.zero_grad();
    mt::sum(moved.forward(x.to(here))).backward();
    mt::sum(kept.forward(x)).backward();
    on_both.step();
    on_cpu.step();
  }
  for (size_t i = 0; i < kept.parameters().size(); ++i)
    expect_same_bits(moved.parameters()[i].detach(), kept.parameters()[i].detach(), "parameter after the moves");
  BOOST_TEST(on_both.state_dict().at("state.0.step").item<int64_t>() == 3);
}

BOOST_AUTO_TEST_CASE(a_gradient_on_another_device_cannot_be_set, MT_GPU_TEST) {
  // "A parameter on two devices": Tensor::set_grad refuses it, and step() would name it too.
  Tensor w = leaf(mt::test::gpu(mt::ones({2, 3})));
  expect_error([&] { w.set_grad(mt::ones({2, 3})); }, {"set_grad: gradient on cpu", "for a tensor on cuda:0"});
}

BOOST_AUTO_TEST_SUITE_END()
