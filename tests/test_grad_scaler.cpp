// tests/test_grad_scaler.cpp — the loss scaler (optim/grad_scaler.h) and gradient clipping (optim/clip.h).
//
// The scaler's contract case by case (defaults, a skipped step that leaves parameters and Adam's state alone,
// growth and backoff, update(new_scale), unscale_ before clipping, its once-per-step rules, several optimizers and
// their lifetimes, the disabled pass-through, state_dict), a model whose f16 gradients underflow to zero without
// it and learn like f32 with it, clipping against float64 references, and both replaying PyTorch's numbers
// (tests/golden/grad_scaler.json, tests/golden/clip.json). The GPU cases run the same on CUDA.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <mixtape/autograd/autograd.h>
#include <mixtape/autograd/precision.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/mixtape.h>
#include <mixtape/optim/adam.h>
#include <mixtape/optim/clip.h>
#include <mixtape/optim/grad_scaler.h>
#include <mixtape/optim/sgd.h>

#include "compare.h"
#include "golden.h"
#include "test_util.h"

namespace mt = mixtape;
using mt::Device;
using mt::DType;
using mt::Tensor;
using mt::amp::GradScaler;
using mt::test::expect_close;
using mt::test::expect_error;
using mt::test::expect_same_bits;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The smallest optimizer: p -= lr · grad, counting its steps. The scaler's own tests need nothing more, and it
/// keeps them independent of SGD and Adam (which the training and golden tests use).
class Descent : public mt::optim::Optimizer {
 public:
  explicit Descent(std::vector<Tensor> params, double lr = 0.5)
      : Optimizer("Descent", {mt::optim::ParamGroup{std::move(params), {}}}, {{"lr", lr}, {"momentum", 0.0}}) {}
  std::string momentum_option() const override { return "momentum"; }
  int steps = 0;

 protected:
  void update(const Tensor& found_inf) override {
    if (found_inf.defined() && found_inf.item<float>() != 0) return;  // a test's optimizer may read it back
    mt::autograd::NoGradGuard no_grad;
    ++steps;
    for (mt::optim::ParamGroup& g : param_groups())
      for (Tensor& p : g.params)
        if (p.grad().defined()) p.copy_(p.detach() - p.grad() * g.options.get("lr"));
  }
};

/// A leaf that requires grad, holding `values` as `dtype` on `device`.
Tensor leaf(const std::vector<double>& values, const mt::Shape& shape, DType dtype = DType::kF32,
            Device device = Device::cpu()) {
  Tensor t = mt::raw::to(mt::from_vector(values, shape, mt::TensorOptions(DType::kF64)), device, dtype);
  t.requires_grad_();
  return t;
}

/// Σ p · c over the pairs: its gradient with respect to p is c.
Tensor linear_loss(const std::vector<Tensor>& params, const std::vector<Tensor>& coefs) {
  Tensor loss;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor term = mt::sum(mt::mul(params[i], coefs[i]));
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

Tensor constant(const std::vector<double>& values, const mt::Shape& shape, DType dtype = DType::kF32,
                Device device = Device::cpu()) {
  return mt::raw::to(mt::from_vector(values, shape, mt::TensorOptions(DType::kF64)), device, dtype);
}

/// p's gradient as a handle that may be written (grad() is const; the handle shares its storage).
Tensor writable_grad(const Tensor& p) { return p.grad(); }

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(mt::raw::clone(t.detach()));
  return out;
}

/// max |got − want| / |want| over the elements (0/0 counts 0), on the CPU in double.
double max_relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to(DType::kF64).cpu().to_vector<double>();
  const std::vector<double> w = want.to(DType::kF64).cpu().to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i)
    if (g[i] != w[i]) worst = std::max(worst, std::fabs(g[i] - w[i]) / std::fabs(w[i]));
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grad_scaler)

BOOST_AUTO_TEST_CASE(defaults_are_pytorchs, MT_CPU_TEST) {
  const mt::amp::GradScalerOptions o;
  BOOST_TEST(o.init_scale == 65536.0);
  BOOST_TEST(o.growth_factor == 2.0);
  BOOST_TEST(o.backoff_factor == 0.5);
  BOOST_TEST(o.growth_interval == 2000);
  BOOST_TEST(o.enabled);
  GradScaler scaler;
  BOOST_TEST(scaler.is_enabled());
  BOOST_TEST(scaler.get_scale() == 65536.0);  // before the first scale(): init_scale, no tensor yet
  BOOST_TEST(!scaler.scale_tensor().defined());
  BOOST_TEST(scaler.get_growth_factor() == 2.0);
  BOOST_TEST(scaler.get_backoff_factor() == 0.5);
  BOOST_TEST(scaler.get_growth_interval() == 2000);
  BOOST_TEST(scaler.get_growth_tracker() == 0);

  const Tensor loss = mt::scalar_tensor(0.75);
  const Tensor scaled = scaler.scale(loss);
  BOOST_TEST(scaled.dim() == 0);
  BOOST_TEST(scaled.item<float>() == 0.75f * 65536.0f);
  const Tensor& s = scaler.scale_tensor();
  BOOST_TEST(s.dtype() == DType::kF32);
  BOOST_TEST(s.numel() == 1);
  BOOST_TEST(s.device() == Device::cpu());
  // Several outputs at once.
  const std::vector<Tensor> many = scaler.scale(std::vector<Tensor>{mt::scalar_tensor(1.0), mt::full({2}, 0.5)});
  BOOST_TEST(many.size() == 2u);
  BOOST_TEST(many[1].to_vector<float>() == std::vector<float>({32768.0f, 32768.0f}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(invalid_options_are_errors_naming_them, MT_CPU_TEST) {
  expect_error([] { GradScaler s({.growth_factor = 1.0}); }, {"GradScaler", "growth_factor", "> 1", "1"});
  expect_error([] { GradScaler s({.backoff_factor = 1.0}); }, {"GradScaler", "backoff_factor", "(0, 1)"});
  expect_error([] { GradScaler s({.backoff_factor = 0.0}); }, {"GradScaler", "backoff_factor"});
  expect_error([] { GradScaler s({.growth_interval = 0}); }, {"GradScaler", "growth_interval", "got 0"});
  expect_error([] { GradScaler s({.init_scale = kInf}); }, {"GradScaler", "init_scale", "inf"});
  expect_error([] { GradScaler s({.init_scale = -2.0}); }, {"GradScaler", "init_scale", "-2"});
  expect_error([] { GradScaler s({.init_scale = 1e39}); }, {"GradScaler", "init_scale", "f32's largest", "1e+39"});
  GradScaler ok;
  expect_error([&] { ok.set_growth_factor(0.5); }, {"GradScaler.set_growth_factor", "0.5"});
  expect_error([&] { ok.set_backoff_factor(2.0); }, {"GradScaler.set_backoff_factor", "2"});
  expect_error([&] { ok.set_growth_interval(-3); }, {"GradScaler.set_growth_interval", "-3"});
  expect_error([&] { ok.scale(mt::zeros({1}, DType::kI64)); }, {"GradScaler.scale", "floating", "i64"});
  Tensor w = leaf({1.0}, {1});
  Descent opt({w});
  expect_error([&] { ok.unscale_(opt); }, {"GradScaler.unscale_", "scale(loss"});
  expect_error([&] { ok.step(opt); }, {"GradScaler.step", "scale(loss"});
  expect_error([&] { ok.update(); }, {"GradScaler.update", "scale(loss"});
  // A disabled scaler checks nothing (as PyTorch's).
  GradScaler disabled({.growth_factor = 0.1, .enabled = false});
  BOOST_TEST(!disabled.is_enabled());
}

BOOST_AUTO_TEST_CASE(an_inf_gradient_skips_the_step_and_halves_the_scale, MT_CPU_TEST) {
  for (double bad : {kInf, -kInf, kNaN}) {
    BOOST_TEST_CONTEXT("an injected " << bad) {
      Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}), b = leaf({0.1, 0.2}, {2});
      mt::optim::Adam opt({w, b}, mt::optim::AdamOptions{.lr = 0.01});
      GradScaler scaler({.init_scale = 1024.0});
      const std::vector<Tensor> coefs = {constant({1, 2, 3, 4}, {2, 2}), constant({-1, 1}, {2})};
      // One clean step: Adam now has state (step 1, moments).
      opt.zero_grad();
      scaler.scale(linear_loss({w, b}, coefs)).backward();
      BOOST_TEST(scaler.step(opt));
      scaler.update();
      BOOST_TEST(scaler.get_growth_tracker() == 1);

      const std::vector<Tensor> params_before = clones({w, b});
      const mt::StateDict state_before = opt.state_dict();
      opt.zero_grad();
      scaler.scale(linear_loss({w, b}, coefs)).backward();
      writable_grad(w).set({1, 0}, bad);  // as an overflow in the backward would leave it
      BOOST_TEST(!scaler.step(opt));
      scaler.update();
      BOOST_TEST(scaler.get_scale() == 512.0);
      BOOST_TEST(scaler.get_growth_tracker() == 0);
      expect_same_bits(w, params_before[0], "w after the skipped step");
      expect_same_bits(b, params_before[1], "b after the skipped step");
      const mt::StateDict state_after = opt.state_dict();
      BOOST_TEST(state_after.keys() == state_before.keys(), boost::test_tools::per_element());
      for (const auto& [key, t] : state_before) expect_same_bits(state_after.at(key), t, "Adam's " + key);
      BOOST_TEST(state_after.at("state.0.step").item<int64_t>() == 1);
    }
  }
}

/// Trains (w, b) on `device` for 8 steps of AdamW with f16-like trouble: an inf gradient at steps 0 (the first),
/// 3 and 4 (two in a row), each step with step() or, `on_device`, step_on_device(). Returns the parameters, the
/// optimizer's state_dict, the scale and the skipped count.
struct ScaledRun {
  std::vector<Tensor> params;
  mt::StateDict state;
  double scale = 0;
  int64_t skipped = 0, skipped_by_bool = 0;
};
ScaledRun scaled_run(bool on_device, Device device) {
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::kF32, device), b = leaf({0.1, 0.2}, {2}, DType::kF32, device);
  mt::optim::AdamW opt({w, b}, mt::optim::AdamWOptions{.lr = 0.01});
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
  ScaledRun run;
  for (int step = 0; step < 8; ++step) {
    const double k = 1.0 + step;
    const std::vector<Tensor> coefs = {constant({k, 2, -3, 4}, {2, 2}, DType::kF32, device),
                                       constant({-1, k}, {2}, DType::kF32, device)};
    opt.zero_grad();
    scaler.scale(linear_loss({w, b}, coefs)).backward();
    if (step == 0 || step == 3 || step == 4) {
      Tensor g = writable_grad(step == 3 ? b : w);
      Tensor bad = mt::raw::slice(mt::raw::reshape(g, {g.numel()}), 0, 0, 1);
      mt::raw::fill_(bad, kInf);  // as an overflow in the backward would leave it
    }
    if (on_device) scaler.step_on_device(opt);
    else if (!scaler.step(opt)) ++run.skipped_by_bool;
    scaler.update();
  }
  run.params = clones({w, b});
  run.state = opt.state_dict();
  run.scale = scaler.get_scale();
  run.skipped = scaler.skipped_steps();
  return run;
}

void expect_same_runs(const ScaledRun& a, const ScaledRun& b, const std::string& what) {
  for (size_t i = 0; i < a.params.size(); ++i)
    expect_same_bits(a.params[i], b.params[i], what + ": parameter " + std::to_string(i));
  BOOST_TEST(a.state.keys() == b.state.keys(), boost::test_tools::per_element());
  for (const auto& [key, t] : a.state)
    if (b.state.contains(key)) expect_same_bits(t, b.state.at(key), what + ": " + key);
  BOOST_TEST(a.scale == b.scale);
  BOOST_TEST(a.skipped == b.skipped);
}

// step_on_device hands found_inf to the optimizer instead of reading it: the same training, bit for bit, with the
// skipped steps counted on the device.
BOOST_AUTO_TEST_CASE(step_on_device_trains_as_step_does, MT_CPU_TEST) {
  const ScaledRun read = scaled_run(false, Device::cpu()), decided = scaled_run(true, Device::cpu());
  expect_same_runs(decided, read, "step_on_device vs step");
  BOOST_TEST(read.skipped == 3);
  BOOST_TEST(read.skipped_by_bool == 3);
  BOOST_TEST(read.state.at("state.0.step").item<int64_t>() == 5);  // 8 steps, 3 skipped
  // A disabled scaler just steps; once per update, as step().
  Tensor w = leaf({1.0}, {1});
  mt::optim::SGD sgd({w}, {.lr = 0.5});
  GradScaler off({.enabled = false});
  mt::sum(mt::mul(w, constant({2.0}, {1}))).backward();
  off.step_on_device(sgd);
  BOOST_TEST(w.detach().item<float>() == 0.0f);
  GradScaler on;
  on.scale(mt::sum(mt::mul(w, constant({2.0}, {1})))).backward();
  on.step_on_device(sgd);
  expect_error([&] { on.step_on_device(sgd); }, {"GradScaler.step_on_device", "step() has already been called", "SGD"});
}

// The unscale pass flags each gradient that held inf/NaN, in the same pass as found_inf: non_finite_gradients()
// names the parameters (indices in optimizer.parameters(); one without a gradient keeps its index) until update()
// frees the step's flags.
BOOST_AUTO_TEST_CASE(the_unscale_pass_says_which_gradients_were_not_finite, MT_CPU_TEST) {
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}), unused = leaf({1.0}, {1}), b = leaf({0.1, 0.2}, {2});
  Descent opt({w, unused, b});
  GradScaler scaler({.init_scale = 1024.0});
  const std::vector<Tensor> coefs = {constant({1, 2, 3, 4}, {2, 2}), constant({-1, 1}, {2})};
  expect_error([&] { scaler.non_finite_gradients(opt); }, {"non_finite_gradients", "was not unscaled"});
  scaler.scale(linear_loss({w, b}, coefs)).backward();
  writable_grad(b).set({1}, kNaN);
  BOOST_TEST(!scaler.step(opt));
  BOOST_TEST(scaler.non_finite_gradients(opt) == std::vector<size_t>{2}, boost::test_tools::per_element());
  BOOST_TEST(scaler.non_finite_gradients(opt) == std::vector<size_t>{2}, boost::test_tools::per_element());  // again
  scaler.update();  // ends the step: its flags are gone
  expect_error([&] { scaler.non_finite_gradients(opt); }, {"non_finite_gradients", "was not unscaled", "update()"});
  opt.zero_grad();
  scaler.scale(linear_loss({w, b}, coefs)).backward();
  writable_grad(w).set({0, 0}, kInf);
  writable_grad(b).set({0}, -kInf);
  scaler.unscale_(opt);
  BOOST_TEST(scaler.non_finite_gradients(opt) == std::vector<size_t>({0, 2}), boost::test_tools::per_element());
  BOOST_TEST(!scaler.step(opt));
  scaler.update();
  opt.zero_grad();
  scaler.scale(linear_loss({w, b}, coefs)).backward();
  BOOST_TEST(scaler.step(opt));
  BOOST_TEST(scaler.non_finite_gradients(opt).empty());
}

// Between two steps (after update() and zero_grad()) an AdamW with a scaler keeps, beyond the parameters, exactly
// what PyTorch's fused AdamW and GradScaler keep, plus the skipped-step count: the moments, one 4-byte update count
// per parameter (PyTorch's f32; mixtape's i32), the scale, the growth tracker; no found-inf or per-gradient flag of
// the step before (that would sit in the next backward, at the training step's peak).
namespace {
void expect_only_state_kept_between_steps(Device device) {
  // Bytes of tensor storage on the device (the CUDA allocator's bytes asked for, not its blocks).
  auto held = [device] {
    return device.is_cuda() ? mt::cuda::memory_stats().requested_bytes : mt::cpu_memory_stats().allocated_bytes;
  };
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::kF32, device), b = leaf({0.1, 0.2}, {2}, DType::kF32, device);
  const std::vector<Tensor> coefs = {constant({1, 2, 3, 4}, {2, 2}, DType::kF32, device),
                                     constant({-1, 1}, {2}, DType::kF32, device)};
  const int64_t base = held();
  {
    mt::optim::AdamW opt({w, b});
    GradScaler scaler({.init_scale = 1024.0});
    for (int step = 0; step < 3; ++step) {
      scaler.scale(linear_loss({w, b}, coefs)).backward();
      if (step == 1) writable_grad(b).set({0}, kInf);  // a skipped step in between
      scaler.step_on_device(opt);
      scaler.update();
      opt.zero_grad();
    }
    BOOST_TEST(opt.state_dict().at("state.0.step").item<int64_t>() == 2);  // the dict's count: i64, as before
    BOOST_TEST(scaler.skipped_steps() == 1);
    const int64_t moments = 2 * (4 + 2) * 4, counts = 2 * 4, scaler_state = 3 * 4;  // scale, tracker, skipped
    BOOST_TEST(held() - base == moments + counts + scaler_state);
  }
  BOOST_TEST(held() == base);
}
}  // namespace

BOOST_AUTO_TEST_CASE(between_steps_the_scaler_and_adamw_keep_their_state_only, MT_CPU_TEST) {
  expect_only_state_kept_between_steps(Device::cpu());
}

// 1/S for the unscale pass is one f32 division, which must give PyTorch's scale.double().reciprocal().float() bit
// for bit (optim/grad_scaler.cpp says why it does; every positive finite f32 was checked once, offline). A sample:
// each binade's first, last and pseudo-random mantissas, the largest scales (subnormal reciprocals) and the smallest.
namespace {
void expect_reciprocals_as_pytorch(Device device) {
  std::vector<uint32_t> bits = {0x00000001u, 0x00000002u, 0x007fffffu, 0x7f7fffffu, 0x7f000000u, 0x7e800001u};
  uint32_t state = 12345;
  for (uint32_t e = 0; e < 255; ++e)
    for (int k = 0; k < 40; ++k) {
      state = state * 1664525u + 1013904223u;
      const uint32_t mantissa = k == 0 ? 0u : k == 1 ? 0x7fffffu : state >> 9;
      bits.push_back(e << 23 | mantissa);
    }
  std::vector<float> scales(bits.size());
  std::memcpy(scales.data(), bits.data(), bits.size() * sizeof(float));
  const Tensor s = mt::raw::to(mt::from_vector<float>(scales, mt::Shape{static_cast<int64_t>(scales.size())}), device);
  const std::vector<float> got = mt::raw::to(mt::amp::detail::reciprocal_scale(s), Device::cpu()).to_vector<float>();
  int64_t differ = 0;
  for (size_t i = 0; i < scales.size(); ++i) {
    const float want = static_cast<float>(1.0 / static_cast<double>(scales[i]));
    if (std::memcmp(&want, &got[i], sizeof(float)) != 0 && ++differ <= 5)
      BOOST_TEST_MESSAGE("1/S for S bits " << std::hex << bits[i] << ": " << got[i] << ", PyTorch's " << want);
  }
  BOOST_TEST(differ == 0);
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_reciprocal_scale_is_pytorchs_bit_for_bit, MT_CPU_TEST) {
  expect_reciprocals_as_pytorch(Device::cpu());
}

BOOST_AUTO_TEST_CASE(the_scale_grows_after_growth_interval_clean_steps, MT_CPU_TEST) {
  Tensor w = leaf({1.0, 2.0}, {2});
  Descent opt({w}, 0.01);
  GradScaler scaler({.init_scale = 8.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  const Tensor c = constant({0.5, -0.5}, {2});
  // clean ×5, inf, clean ×3: tracker 1 2 0 1 2 0 1 2 0, scale 8 8 32 32 32 8 8 8 32.
  const double want_scale[] = {8, 8, 32, 32, 32, 8, 8, 8, 32};
  const int64_t want_tracker[] = {1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (int i = 0; i < 9; ++i) {
    opt.zero_grad();
    const double used = scaler.get_scale();
    scaler.scale(linear_loss({w}, {c})).backward();
    BOOST_TEST(w.grad().to_vector<float>()[0] == 0.5 * used, "step " << i << ": the gradient is scaled by " << used);
    if (i == 5) writable_grad(w).set({0}, kInf);
    BOOST_TEST(scaler.step(opt) == (i != 5), "step " << i);
    if (i != 5) BOOST_TEST(w.grad().to_vector<float>()[0] == 0.5f, "step " << i << ": unscaled exactly");
    scaler.update();
    BOOST_TEST(scaler.get_scale() == want_scale[i], "step " << i);
    BOOST_TEST(scaler.get_growth_tracker() == want_tracker[i], "step " << i);
  }
  BOOST_TEST(opt.steps == 8);
}

BOOST_AUTO_TEST_CASE(update_with_a_new_scale, MT_CPU_TEST) {
  Tensor w = leaf({1.0}, {1});
  Descent opt({w});
  GradScaler scaler({.init_scale = 16.0, .growth_interval = 5});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    scaler.scale(linear_loss({w}, {constant({1}, {1})})).backward();
    scaler.step(opt);
    scaler.update();
  }
  BOOST_TEST(scaler.get_growth_tracker() == 2);
  scaler.update(3.0);
  BOOST_TEST(scaler.get_scale() == 3.0);
  BOOST_TEST(scaler.get_growth_tracker() == 2, "update(new_scale) keeps the tracker (as PyTorch's)");
  Tensor t = mt::full({1}, 5.0);
  scaler.update(t);
  t.fill_(7.0);  // a copy was taken
  BOOST_TEST(scaler.get_scale() == 5.0);
  scaler.update(mt::scalar_tensor(6.0, DType::kF64));
  BOOST_TEST(scaler.get_scale() == 6.0);
  expect_error([&] { scaler.update(-1.0); }, {"GradScaler.update", "new_scale", "-1"});
  expect_error([&] { scaler.update(mt::full({2}, 1.0)); }, {"GradScaler.update", "new_scale", "[2]"});
  Tensor needs_grad = mt::full({1}, 1.0);
  needs_grad.requires_grad_();
  expect_error([&] { scaler.update(needs_grad); }, {"GradScaler.update", "requiring grad"});
  // The step ended: unscale_ is allowed again.
  opt.zero_grad();
  scaler.scale(linear_loss({w}, {constant({1}, {1})})).backward();
  scaler.unscale_(opt);
  BOOST_TEST(w.grad().item<float>() == 1.0f);
}

BOOST_AUTO_TEST_CASE(unscale_then_clip_sees_the_true_gradients, MT_CPU_TEST) {
  Tensor w = leaf({0.0, 0.0, 0.0}, {3}), b = leaf({0.0}, {1});
  Descent opt({w, b}, 1.0);
  GradScaler scaler;  // 65536
  opt.zero_grad();
  scaler.scale(linear_loss({w, b}, {constant({3, 0, -4}, {3}), constant({12}, {1})})).backward();
  BOOST_TEST(w.grad().to_vector<float>()[0] == 3.0f * 65536.0f);
  scaler.unscale_(opt);
  BOOST_TEST(w.grad().to_vector<float>() == std::vector<float>({3, 0, -4}), boost::test_tools::per_element());
  const Tensor norm = mt::nn::utils::clip_grad_norm_({w, b}, 6.5);
  BOOST_TEST(norm.item<float>() == 13.0f, "the norm of the true gradients (3, 0, -4, 12)");
  // Clipped to half: coefficient 6.5 / (13 + 1e-6).
  BOOST_TEST(b.grad().item<float>() == static_cast<float>(12.0 * static_cast<float>(6.5f / (13.0f + 1e-6f))));
  BOOST_TEST(scaler.step(opt));  // does not unscale a second time
  BOOST_TEST(std::fabs(b.item<float>() + 6.0f) < 1e-5f, "b moved by the clipped gradient: " << b.item<float>());
}

BOOST_AUTO_TEST_CASE(unscale_and_step_once_per_update, MT_CPU_TEST) {
  Tensor w = leaf({1.0}, {1});
  Descent opt({w});
  GradScaler scaler;
  opt.zero_grad();
  scaler.scale(linear_loss({w}, {constant({1}, {1})})).backward();
  scaler.unscale_(opt);
  expect_error([&] { scaler.unscale_(opt); },
               {"GradScaler.unscale_", "unscale_() has already been called on this optimizer since the last update()",
                "Descent"});
  BOOST_TEST(w.grad().item<float>() == 1.0f, "the failed call unscaled nothing");
  scaler.step(opt);
  expect_error([&] { scaler.unscale_(opt); }, {"GradScaler.unscale_", "after step()"});
  expect_error([&] { scaler.step(opt); }, {"GradScaler.step", "step() has already been called since the last update()", "Descent"});
  scaler.update();
  // A new iteration: both allowed again.
  opt.zero_grad();
  scaler.scale(linear_loss({w}, {constant({1}, {1})})).backward();
  scaler.unscale_(opt);
  BOOST_TEST(scaler.step(opt));
  scaler.update();
  // No gradient at all: PyTorch's "No inf checks were recorded".
  opt.zero_grad();
  scaler.scale(mt::scalar_tensor(1.0));
  expect_error([&] { scaler.step(opt); }, {"GradScaler.step", "no inf checks were recorded", "Descent"});
  expect_error([&] { scaler.update(); }, {"GradScaler.update", "no inf checks were recorded"});
}

BOOST_AUTO_TEST_CASE(several_optimizers_share_one_update, MT_CPU_TEST) {
  Tensor w = leaf({1.0, 1.0}, {2}), b = leaf({1.0}, {1});
  Descent opt_w({w}), opt_b({b});
  GradScaler scaler({.init_scale = 256.0, .growth_interval = 2});
  const std::vector<Tensor> coefs = {constant({1, 2}, {2}), constant({4}, {1})};
  // Step 0: b's gradient overflows. opt_w steps, opt_b does not; the combined flag backs the scale off.
  opt_w.zero_grad();
  opt_b.zero_grad();
  scaler.scale(linear_loss({w, b}, coefs)).backward();
  writable_grad(b).set({0}, kInf);
  scaler.unscale_(opt_w);
  BOOST_TEST(scaler.step(opt_w));
  BOOST_TEST(!scaler.step(opt_b));
  scaler.update();
  BOOST_TEST(opt_w.steps == 1);
  BOOST_TEST(opt_b.steps == 0);
  BOOST_TEST(scaler.get_scale() == 128.0);
  // Steps 1, 2: both clean: the scale grows after two.
  for (int i = 0; i < 2; ++i) {
    opt_w.zero_grad();
    opt_b.zero_grad();
    scaler.scale(linear_loss({w, b}, coefs)).backward();
    BOOST_TEST(scaler.step(opt_w));
    BOOST_TEST(scaler.step(opt_b));
    scaler.update();
  }
  BOOST_TEST(scaler.get_scale() == 256.0);
  BOOST_TEST(opt_b.steps == 2);
}

BOOST_AUTO_TEST_CASE(a_destroyed_optimizer_is_not_confused_with_a_new_one_at_its_address, MT_CPU_TEST) {
  Tensor w = leaf({1.0}, {1});
  GradScaler scaler;
  std::optional<Descent> opt;
  opt.emplace(std::vector<Tensor>{w});
  const Descent* first = &*opt;
  scaler.scale(linear_loss({w}, {constant({1}, {1})})).backward();
  scaler.unscale_(*opt);
  opt.reset();
  opt.emplace(std::vector<Tensor>{w});
  BOOST_TEST((&*opt == first), "the new optimizer lives at the old one's address");
  writable_grad(w).fill_(65536.0);
  scaler.unscale_(*opt);  // a new optimizer: READY, not "already called"
  BOOST_TEST(w.grad().item<float>() == 1.0f);
  expect_error([&] { scaler.unscale_(*opt); }, {"unscale_() has already been called"});
}

BOOST_AUTO_TEST_CASE(a_disabled_scaler_passes_everything_through, MT_CPU_TEST) {
  Tensor w = leaf({1.0, 2.0}, {2});
  Descent opt({w}, 0.5);
  GradScaler scaler({.enabled = false});
  BOOST_TEST(!scaler.is_enabled());
  const Tensor loss = linear_loss({w}, {constant({2, kInf}, {2})});
  BOOST_TEST(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(opt);
  BOOST_TEST(w.grad().to_vector<float>()[0] == 2.0f, "unscale_ did nothing");
  BOOST_TEST(scaler.step(opt), "step steps, even with an inf gradient");
  BOOST_TEST(opt.steps == 1);
  scaler.update();
  scaler.update(5.0);
  BOOST_TEST(scaler.get_scale() == 1.0);
  BOOST_TEST(scaler.get_growth_tracker() == 0);
  BOOST_TEST(!scaler.scale_tensor().defined());
  BOOST_TEST(scaler.state_dict().empty());
  scaler.load_state_dict(GradScaler().state_dict());
  BOOST_TEST(scaler.get_scale() == 1.0);
}

BOOST_AUTO_TEST_CASE(state_dict_round_trip_and_load_errors, MT_CPU_TEST) {
  const mt::amp::GradScalerOptions options{.init_scale = 256.0, .growth_factor = 3.0, .backoff_factor = 0.25,
                                           .growth_interval = 4};
  Tensor w = leaf({1.0}, {1});
  Descent opt({w}, 0.01);
  GradScaler scaler(options);
  auto iteration = [&](GradScaler& s, bool overflow) {
    opt.zero_grad();
    s.scale(linear_loss({w}, {constant({1}, {1})})).backward();
    if (overflow) writable_grad(w).fill_(kNaN);
    s.step(opt);
    s.update();
  };
  for (bool overflow : {false, true, false, false}) iteration(scaler, overflow);  // scale 64, tracker 2
  const mt::StateDict sd = scaler.state_dict();
  BOOST_TEST(sd.keys() == std::vector<std::string>({"scale", "growth_factor", "backoff_factor", "growth_interval",
                                                     "_growth_tracker"}),
             boost::test_tools::per_element());
  BOOST_TEST(sd.at("scale").dtype() == DType::kF64);
  BOOST_TEST(sd.at("scale").item<double>() == 64.0);
  BOOST_TEST(sd.at("growth_factor").item<double>() == 3.0);
  BOOST_TEST(sd.at("backoff_factor").item<double>() == 0.25);
  BOOST_TEST(sd.at("growth_interval").dtype() == DType::kI64);
  BOOST_TEST(sd.at("growth_interval").item<int64_t>() == 4);
  BOOST_TEST(sd.at("_growth_tracker").item<int64_t>() == 2);

  GradScaler restored;  // defaults, no scale tensor yet: the loaded values seed it
  restored.load_state_dict(sd);
  BOOST_TEST(restored.get_scale() == 64.0);
  BOOST_TEST(restored.get_growth_factor() == 3.0);
  BOOST_TEST(restored.get_backoff_factor() == 0.25);
  BOOST_TEST(restored.get_growth_interval() == 4);
  BOOST_TEST(restored.get_growth_tracker() == 2);
  for (bool overflow : {false, false, true, false}) {  // both go on alike
    iteration(scaler, overflow);
    iteration(restored, overflow);
    BOOST_TEST(restored.get_scale() == scaler.get_scale());
    BOOST_TEST(restored.get_growth_tracker() == scaler.get_growth_tracker());
  }
  GradScaler live(options);  // with its tensors: they are overwritten
  iteration(live, false);
  live.load_state_dict(sd);
  BOOST_TEST(live.get_scale() == 64.0);
  BOOST_TEST(live.get_growth_tracker() == 2);

  // Errors name the key; nothing changes.
  auto edited = [&](const std::string& drop, const std::string& key, const Tensor& value) {
    mt::StateDict out;
    for (const auto& [k, t] : sd)
      if (k != drop) out.insert(k, k == key ? value : t);
    return out;
  };
  GradScaler target(options);
  expect_error([&] { target.load_state_dict(edited("_growth_tracker", "", {})); },
               {"GradScaler.load_state_dict", "missing keys", "_growth_tracker"});
  mt::StateDict extra = sd;
  extra.insert("found_inf", mt::scalar_tensor(0.0));
  expect_error([&] { target.load_state_dict(extra); }, {"GradScaler.load_state_dict", "unexpected keys", "found_inf"});
  expect_error([&] { target.load_state_dict(edited("", "scale", mt::scalar_tensor(64.0))); },
               {"GradScaler.load_state_dict", "scale"});
  expect_error([&] { target.load_state_dict(edited("", "growth_factor", mt::scalar_tensor(0.5, DType::kF64))); },
               {"GradScaler.load_state_dict", "growth_factor", "0.5"});
  expect_error([&] { target.load_state_dict(edited("", "_growth_tracker", mt::scalar_tensor(4, DType::kI64))); },
               {"GradScaler.load_state_dict", "_growth_tracker", "4"});
  expect_error([&] { target.load_state_dict(mt::StateDict{}); }, {"GradScaler.load_state_dict", "empty", "disabled"});
  BOOST_TEST(target.get_scale() == 256.0);
  BOOST_TEST(target.get_growth_factor() == 3.0);
}

// ---- a model whose f16 gradients underflow ----------------------------------------------------------------

namespace {

/// Least squares y = x·Wᵀ + b on 64 samples of 8 features in [-1, 1), with the loss weighted by kLossWeight =
/// 1e-7 (a small auxiliary loss, say): d loss / d y ≈ 3e-9·(y − t), below half of f16's smallest subnormal
/// (2^-25 ≈ 3e-8), so under autocast (the linear in f16) the gradient reaching W is exactly 0 unless the loss is
/// scaled. The f32 gradients are ~1e-8; SGD's lr of 5e6 makes the step lr·kLossWeight = 0.5.
constexpr double kLossWeight = 1e-7;

struct TrainRun {
  std::vector<double> losses;  // the unweighted mse before each step
  bool first_grad_all_zero = false;
};

TrainRun train(bool autocast, bool scaled, int steps) {
  mt::Generator gen(2024);
  const Tensor x = mt::uniform({64, 8}, -1.0, 1.0, {}, &gen);
  const Tensor w_true = mt::uniform({1, 8}, -2.0, 2.0, {}, &gen);
  const Tensor t = mt::raw::to(mt::matmul(x, w_true.t()) + 0.5, DType::kF32);
  Tensor W = mt::zeros({1, 8}), b = mt::zeros({1});
  W.requires_grad_();
  b.requires_grad_();
  mt::optim::SGD opt({W, b}, mt::optim::SGDOptions{.lr = 0.5 / kLossWeight});
  GradScaler scaler({.enabled = scaled});
  TrainRun run;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss;
    {
      mt::amp::Autocast ac(DType::kF16, autocast);
      loss = mt::mse_loss(mt::linear(x, W, b), t) * kLossWeight;
    }
    run.losses.push_back(loss.item<double>() / kLossWeight);
    scaler.scale(loss).backward();
    if (i == 0) {
      scaler.unscale_(opt);  // (a no-op when disabled)
      const std::vector<float> g = W.grad().to_vector<float>();
      run.first_grad_all_zero = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }) &&
                                b.grad().item<float>() == 0.0f;
    }
    scaler.step(opt);
    scaler.update();
  }
  return run;
}

}  // namespace

BOOST_AUTO_TEST_CASE(f16_gradients_that_underflow_learn_with_the_scaler, MT_CPU_TEST) {
  constexpr int kSteps = 25;
  const TrainRun f32 = train(false, false, kSteps);
  const TrainRun f16 = train(true, false, kSteps);
  const TrainRun f16_scaled = train(true, true, kSteps);
  BOOST_TEST(!f32.first_grad_all_zero);
  BOOST_TEST(f16.first_grad_all_zero, "unscaled f16: the gradient underflows to exactly 0");
  BOOST_TEST(f16.losses.back() == f16.losses.front(), "so the f16 run never moves");
  BOOST_TEST(!f16_scaled.first_grad_all_zero);
  BOOST_TEST(f32.losses.back() < 1e-3 * f32.losses.front(), "the f32 run learns: " << f32.losses.back());
  // With the scaler, f16 follows f32: every step's loss within 1e-4 of the initial loss of f32's (measured 3.3e-5).
  // The f16 run levels off near 1e-7 of the initial loss (x and W rounded to f16: relative errors of 2^-11 in y),
  // where f32 goes on down; that floor, not the gradients, is what separates them at the end.
  for (int i = 0; i < kSteps; ++i)
    BOOST_TEST(std::fabs(f16_scaled.losses[i] - f32.losses[i]) <= 1e-4 * f32.losses[0],
               "step " << i << ": f16 with the scaler " << f16_scaled.losses[i] << ", f32 " << f32.losses[i]);
  BOOST_TEST(f16_scaled.losses.back() < 1e-6 * f16_scaled.losses.front());
  double worst = 0, worst_rel = 0;
  for (int i = 0; i < kSteps; ++i) {
    worst = std::max(worst, std::fabs(f16_scaled.losses[i] - f32.losses[i]) / f32.losses[0]);
    worst_rel = std::max(worst_rel, std::fabs(f16_scaled.losses[i] - f32.losses[i]) / f32.losses[i]);
  }
  BOOST_TEST_MESSAGE("mse after " << kSteps << " steps: f32 " << f32.losses.back() << ", f16 with the scaler "
                                  << f16_scaled.losses.back() << ", f16 without " << f16.losses.back()
                                  << " (initial " << f32.losses.front() << "); largest |f16 − f32| / initial "
                                  << worst << ", / f32's loss at that step " << worst_rel);
}

// ---- clipping ----------------------------------------------------------------------------------------------

namespace {

/// Parameters of the given dtype whose gradients are N(0, 1.5²) values, on `device`.
std::vector<Tensor> with_grads(DType dtype, uint64_t seed, Device device = Device::cpu()) {
  std::vector<Tensor> ps;
  for (const mt::Shape& shape : {mt::Shape{7, 9}, mt::Shape{13}, mt::Shape{2, 3, 5}}) {
    Tensor p = mt::raw::to(mt::zeros(shape), device, dtype);
    p.requires_grad_();
    p.set_grad(mt::raw::to(mt::test::randn_seeded(shape, DType::kF32, ++seed) * 1.5, device, dtype));
    ps.push_back(p);
  }
  return ps;
}

double reference_total_norm(const std::vector<Tensor>& ps, double ord) {
  double acc = 0;
  for (const Tensor& p : ps)
    for (double v : p.grad().to(DType::kF64).cpu().to_vector<double>())
      acc = std::isinf(ord) ? std::max(acc, std::fabs(v)) : acc + std::pow(std::fabs(v), ord);
  return std::isinf(ord) ? acc : std::pow(acc, 1.0 / ord);
}

}  // namespace

BOOST_AUTO_TEST_CASE(clip_grad_norm_matches_float64_references, MT_CPU_TEST) {
  for (DType dt : {DType::kF32, DType::kF64})
    for (double ord : {2.0, kInf, 1.0, 3.0})
      for (double fraction : {0.5, 2.0}) {
        BOOST_TEST_CONTEXT(dt << ", norm_type " << ord << ", max_norm " << fraction << " x the norm") {
          std::vector<Tensor> ps = with_grads(dt, 70000);
          const double want = reference_total_norm(ps, ord);
          const std::vector<Tensor> before = clones({ps[0].grad(), ps[1].grad(), ps[2].grad()});
          const double max_norm = fraction * want;
          const Tensor total = mt::optim::clip_grad_norm_(ps, max_norm, ord);
          BOOST_TEST(total.dim() == 0);
          BOOST_TEST(total.dtype() == dt);
          const mt::test::Tolerance tol = dt == DType::kF64 ? mt::test::Tolerance{1e-13, 0} : mt::test::Tolerance{
                                                                                                 2e-6, 0};
          expect_close(total, mt::scalar_tensor(want, DType::kF64), tol, "the total norm");
          const double coef = std::min(max_norm / (want + 1e-6), 1.0);
          for (size_t i = 0; i < ps.size(); ++i)
            expect_close(ps[i].grad(), mt::raw::to(before[i], DType::kF64) * coef, {2 * tol.rtol, 0.0},
                         "gradient " + std::to_string(i));
        }
      }
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_sums_f16_gradients_in_f32, MT_CPU_TEST) {
  Tensor p = mt::zeros({1000}, DType::kF16);
  p.requires_grad_();
  p.set_grad(mt::full({1000}, 300.0, DType::kF16));  // squares of 9e4 > 65504: an f16 sum would overflow
  const Tensor total = mt::optim::clip_grad_norm_({p}, 1e9);
  BOOST_TEST(total.dtype() == DType::kF32);
  BOOST_TEST(total.item<float>() == static_cast<float>(std::sqrt(9e7)));
  BOOST_TEST(p.grad().to(DType::kF32).to_vector<float>()[0] == 300.0f, "coefficient 1: unchanged");
  mt::optim::clip_grad_norm_({p}, 1.0);
  const float coef = 1.0f / (static_cast<float>(std::sqrt(9e7)) + 1e-6f);
  BOOST_TEST(p.grad().to(DType::kF32).to_vector<float>()[999] ==
             static_cast<float>(mt::Half(300.0f * coef)));
  // f64 with f32: the total is f64.
  Tensor q = mt::zeros({2}, DType::kF64), r = mt::zeros({1});
  q.requires_grad_();
  r.requires_grad_();
  q.set_grad(mt::full({2}, 3.0, DType::kF64));
  r.set_grad(mt::full({1}, 1.0));
  const Tensor mixed = mt::optim::clip_grad_norm_({q, r}, 100.0);
  BOOST_TEST(mixed.dtype() == DType::kF64);
  // The norm of the norms (sqrt(18), 1): sqrt(18)² is 18 within an ulp, so the total is sqrt(19) within two.
  BOOST_TEST(mixed.item<double>() == std::sqrt(19.0), boost::test_tools::tolerance(1e-15));
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_edge_cases_and_errors, MT_CPU_TEST) {
  // No gradients: 0, an f32 on the CPU; a parameter without one is skipped.
  Tensor a = mt::zeros({3}), b = mt::zeros({2});
  a.requires_grad_();
  b.requires_grad_();
  const Tensor none = mt::optim::clip_grad_norm_({a, b}, 1.0);
  BOOST_TEST(none.dim() == 0);
  BOOST_TEST(none.item<float>() == 0.0f);
  BOOST_TEST(mt::optim::clip_grad_norm_({}, 1.0).item<float>() == 0.0f);
  b.set_grad(mt::from_vector<float>({3, 4}, {2}));
  BOOST_TEST(mt::optim::clip_grad_norm_({a, b}, 100.0).item<float>() == 5.0f);
  BOOST_TEST(!a.grad().defined());
  // Non-finite norms: an error when asked, otherwise the norm is returned and the gradients scaled by it.
  b.set_grad(mt::from_vector<float>({3, std::numeric_limits<float>::infinity()}, {2}));
  expect_error([&] { mt::optim::clip_grad_norm_({a, b}, 1.0, 2.0, true); },
               {"clip_grad_norm_", "total norm of order 2", "inf", "error_if_nonfinite"});
  BOOST_TEST(b.grad().to_vector<float>()[0] == 3.0f, "the error left the gradients alone");
  b.set_grad(mt::from_vector<float>({3, std::numeric_limits<float>::quiet_NaN()}, {2}));
  expect_error([&] { mt::nn::utils::clip_grad_norm_({a, b}, 1.0, kInf, true); },
               {"clip_grad_norm_", "order inf", "nan"});
  b.set_grad(mt::from_vector<float>({3, std::numeric_limits<float>::infinity()}, {2}));
  const Tensor inf_norm = mt::optim::clip_grad_norm_({a, b}, 1.0);
  BOOST_TEST(std::isinf(inf_norm.item<float>()));
  BOOST_TEST(b.grad().to_vector<float>()[0] == 0.0f, "scaled by 1 / inf");
  // Bad arguments.
  expect_error([&] { mt::optim::clip_grad_norm_({a, b}, -1.0); }, {"clip_grad_norm_", "max_norm", "-1"});
  expect_error([&] { mt::optim::clip_grad_norm_({a, b}, 1.0, 0.0); }, {"clip_grad_norm_", "norm_type", "0"});
  expect_error([&] { mt::optim::clip_grad_norm_({a, b}, 1.0, kNaN); }, {"clip_grad_norm_", "norm_type", "nan"});
  expect_error([&] { mt::optim::clip_grad_norm_({a, Tensor()}, 1.0); },
               {"clip_grad_norm_", "parameter 1", "undefined"});
}

BOOST_AUTO_TEST_CASE(clip_grad_value_clamps, MT_CPU_TEST) {
  Tensor a = mt::zeros({4}), b = mt::zeros({2}, DType::kF16), c = mt::zeros({1});
  for (Tensor* t : {&a, &b, &c}) t->requires_grad_();
  a.set_grad(mt::from_vector<float>({-3, -0.5, 0.25, 7}, {4}));
  b.set_grad(mt::from_vector<float>({2, std::numeric_limits<float>::quiet_NaN()}, {2}).to(DType::kF16));
  mt::nn::utils::clip_grad_value_({a, b, c}, 1.0);
  BOOST_TEST(a.grad().to_vector<float>() == std::vector<float>({-1, -0.5, 0.25, 1}), boost::test_tools::per_element());
  BOOST_TEST(b.grad().to(DType::kF32).to_vector<float>()[0] == 1.0f);
  BOOST_TEST(std::isnan(b.grad().to(DType::kF32).to_vector<float>()[1]), "NaN stays NaN");
  BOOST_TEST(!c.grad().defined());
  expect_error([&] { mt::optim::clip_grad_value_({a}, -0.5); }, {"clip_grad_value_", "clip_value", "-0.5"});
}

// ---- PyTorch's numbers ----------------------------------------------------------------------------------------

namespace {

/// Replays tests/golden/clip.json on `device`; returns the largest relative error of each dtype.
void replay_clip(Device device) {
  const auto golden = mt::test::load_golden("clip");
  BOOST_TEST_REQUIRE(golden.has_value());
  double worst_f32 = 0, worst_f64 = 0;
  for (const auto& c : golden->at("cases")) {
    const std::string name = c.at("name");
    BOOST_TEST_CONTEXT(name) {
      const bool f64 = c.at("dtype") == "f64";
      const mt::test::Tolerance tol = f64 ? mt::test::Tolerance{1e-12, 0} : mt::test::Tolerance{1e-6, 0};
      std::vector<Tensor> ps;
      for (const auto& g : c.at("grads")) {
        const Tensor grad = mt::raw::to(mt::test::golden_tensor(g), device);
        Tensor p = mt::zeros_like(grad);
        p.requires_grad_();
        p.set_grad(grad);
        ps.push_back(p);
      }
      if (c.at("kind") == "norm") {
        const double ord = c.at("norm_type").is_string() ? kInf : c.at("norm_type").get<double>();
        const Tensor total = mt::optim::clip_grad_norm_(ps, c.at("max_norm").get<double>(), ord);
        const Tensor want = mt::test::golden_tensor(c.at("total_norm"));
        expect_close(total, want, tol, "the total norm");
        (f64 ? worst_f64 : worst_f32) = std::max(f64 ? worst_f64 : worst_f32, max_relative_error(total, want));
      } else {
        mt::optim::clip_grad_value_(ps, c.at("clip_value").get<double>());
      }
      for (size_t i = 0; i < ps.size(); ++i) {
        const Tensor want = mt::test::golden_tensor(c.at("clipped")[i]);
        expect_close(ps[i].grad(), want, tol, "gradient " + std::to_string(i));
        (f64 ? worst_f64 : worst_f32) = std::max(f64 ? worst_f64 : worst_f32, max_relative_error(ps[i].grad(), want));
      }
    }
  }
  BOOST_TEST_MESSAGE("clip.json on " << device << ": largest relative error f32 " << worst_f32 << ", f64 "
                                     << worst_f64);
}

/// Replays tests/golden/grad_scaler.json with mixtape's GradScaler and SGD on `device`.
void replay_grad_scaler(Device device) {
  const auto golden = mt::test::load_golden("grad_scaler");
  BOOST_TEST_REQUIRE(golden.has_value());
  for (const auto& c : golden->at("cases")) {
    const std::string name = c.at("name");
    BOOST_TEST_CONTEXT(name) {
      const bool f64 = c.at("dtype") == "f64";
      const mt::test::Tolerance tol = f64 ? mt::test::Tolerance{1e-12, 0} : mt::test::Tolerance{1e-6, 0};
      Tensor w = mt::raw::to(mt::test::golden_tensor(c.at("w0")), device);
      Tensor b = mt::raw::to(mt::test::golden_tensor(c.at("b0")), device);
      w.requires_grad_();
      b.requires_grad_();
      mt::optim::SGD opt({w, b}, mt::optim::SGDOptions{.lr = c.at("lr").get<double>(),
                                                       .momentum = c.at("momentum").get<double>()});
      GradScaler scaler({.init_scale = c.at("init_scale").get<double>(),
                         .growth_factor = c.at("growth_factor").get<double>(),
                         .backoff_factor = c.at("backoff_factor").get<double>(),
                         .growth_interval = c.at("growth_interval").get<int64_t>()});
      double worst = 0;
      int t = 0;
      for (const auto& s : c.at("steps")) {
        BOOST_TEST_CONTEXT("step " << t) {
          const Tensor A = mt::raw::to(mt::test::golden_tensor(s.at("A")), device);
          const Tensor cc = mt::raw::to(mt::test::golden_tensor(s.at("c")), device);
          opt.zero_grad();
          BOOST_TEST(scaler.get_scale() == s.at("scale_used").get<double>());
          scaler.scale(linear_loss({w, b}, {A, cc})).backward();
          if (!s.at("inject").is_null()) {
            const auto& inj = s.at("inject");
            const std::string v = inj.at("value");
            const double bad = v == "nan" ? kNaN : v == "-inf" ? -kInf : kInf;
            writable_grad(w).set({inj.at("index")[0].get<int64_t>(), inj.at("index")[1].get<int64_t>()}, bad);
          }
          BOOST_TEST(scaler.step(opt) == !s.at("skipped").get<bool>());
          scaler.update();
          BOOST_TEST(scaler.get_scale() == s.at("scale").get<double>());
          BOOST_TEST(scaler.get_growth_tracker() == s.at("growth_tracker").get<int64_t>());
          const Tensor want_w = mt::test::golden_tensor(s.at("w")), want_b = mt::test::golden_tensor(s.at("b"));
          expect_close(w, want_w, tol, "w");
          expect_close(b, want_b, tol, "b");
          worst = std::max({worst, max_relative_error(w, want_w), max_relative_error(b, want_b)});
        }
        ++t;
      }
      const auto& sd = c.at("state_dict");
      const mt::StateDict mine = scaler.state_dict();
      BOOST_TEST(mine.at("scale").item<double>() == sd.at("scale").get<double>());
      BOOST_TEST(mine.at("growth_factor").item<double>() == sd.at("growth_factor").get<double>());
      BOOST_TEST(mine.at("backoff_factor").item<double>() == sd.at("backoff_factor").get<double>());
      BOOST_TEST(mine.at("growth_interval").item<int64_t>() == sd.at("growth_interval").get<int64_t>());
      BOOST_TEST(mine.at("_growth_tracker").item<int64_t>() == sd.at("_growth_tracker").get<int64_t>());
      BOOST_TEST_MESSAGE("grad_scaler.json, " << name << " on " << device << ": largest relative error of the "
                                              << "weights " << worst);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(clip_replays_pytorch, MT_CPU_TEST * mt::test::golden_available("clip")) {
  replay_clip(Device::cpu());
}

BOOST_AUTO_TEST_CASE(grad_scaler_replays_pytorch, MT_CPU_TEST * mt::test::golden_available("grad_scaler")) {
  replay_grad_scaler(Device::cpu());
}

// ---- on the GPU --------------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(clip_replays_pytorch_on_cuda, MT_GPU_TEST * mt::test::golden_available("clip")) {
  replay_clip(Device::cuda());
}

BOOST_AUTO_TEST_CASE(grad_scaler_replays_pytorch_on_cuda, MT_GPU_TEST * mt::test::golden_available("grad_scaler")) {
  replay_grad_scaler(Device::cuda());
}

BOOST_AUTO_TEST_CASE(scaler_on_cuda_keeps_its_state_on_the_device, MT_GPU_TEST) {
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::kF32, Device::cuda());
  Descent opt({w});
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
  const Tensor c = constant({1, 2, 3, 4}, {2, 2}, DType::kF32, Device::cuda());
  scaler.scale(linear_loss({w}, {c})).backward();
  BOOST_TEST(scaler.scale_tensor().is_cuda());
  const Tensor before = mt::raw::clone(w.detach());
  writable_grad(w).set({0, 1}, kInf);
  BOOST_TEST(!scaler.step(opt));
  scaler.update();
  expect_same_bits(w, before, "w after the skipped step");
  BOOST_TEST(scaler.get_scale() == 512.0);
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    scaler.scale(linear_loss({w}, {c})).backward();
    BOOST_TEST(scaler.step(opt));
    scaler.update();
  }
  BOOST_TEST(scaler.get_scale() == 1024.0);
  expect_close(w, mt::raw::to(before, DType::kF64) - 2 * 0.5 * mt::raw::to(c, DType::kF64), {1e-6, 0.0},
               "two clean steps of 0.5 · c");
}

BOOST_AUTO_TEST_CASE(step_on_device_on_cuda_matches_the_cpu_and_never_waits, MT_GPU_TEST) {
  // The same training on the GPU, the same bits as on the CPU (step() and step_on_device() alike).
  const ScaledRun cpu = scaled_run(false, Device::cpu());
  expect_same_runs(scaled_run(true, Device::cuda()), cpu, "step_on_device on cuda vs step on the cpu");
  expect_same_runs(scaled_run(false, Device::cuda()), cpu, "step on cuda vs step on the cpu");
  // A steady-state AMP step (after the first, which creates the state): scale, backward, unscale, step, update.
  // step_on_device neither copies anything to the host nor waits for the device.
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::kF32, Device::cuda());
  mt::optim::AdamW opt({w}, mt::optim::AdamWOptions{.lr = 0.01});
  GradScaler scaler;
  const Tensor coef = constant({1, 2, 3, 4}, {2, 2}, DType::kF32, Device::cuda());
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {
      mt::cuda::synchronize();
      mt::cuda::reset_debug_counters();
    }
    opt.zero_grad();
    scaler.scale(mt::sum(mt::mul(w, coef))).backward();
    scaler.step_on_device(opt);
    scaler.update();
  }
  const mt::cuda::DebugCounters c = mt::cuda::debug_counters();
  BOOST_TEST(c.device_to_host_copies == 0);
  BOOST_TEST(c.synchronizations == 0);
  BOOST_TEST(scaler.skipped_steps() == 0);
}

BOOST_AUTO_TEST_CASE(between_steps_on_cuda_the_scaler_and_adamw_keep_their_state_only, MT_GPU_TEST) {
  expect_only_state_kept_between_steps(Device::cuda());
}

BOOST_AUTO_TEST_CASE(the_reciprocal_scale_on_cuda_is_pytorchs_bit_for_bit, MT_GPU_TEST) {
  expect_reciprocals_as_pytorch(Device::cuda());
}

BOOST_AUTO_TEST_CASE(non_finite_gradients_on_cuda, MT_GPU_TEST) {
  Tensor w = leaf({0.5, -1.0, 2.0, 0.25}, {2, 2}, DType::kF32, Device::cuda());
  Tensor b = leaf({0.1, 0.2}, {2}, DType::kF16, Device::cuda());
  Descent opt({w, b});
  GradScaler scaler({.init_scale = 1024.0});
  const std::vector<Tensor> coefs = {constant({1, 2, 3, 4}, {2, 2}, DType::kF32, Device::cuda()),
                                     constant({-1, 1}, {2}, DType::kF16, Device::cuda())};
  scaler.scale(linear_loss({w, b}, coefs)).backward();
  writable_grad(b).set({1}, kNaN);
  BOOST_TEST(!scaler.step(opt));
  BOOST_TEST(scaler.non_finite_gradients(opt) == std::vector<size_t>{1}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_on_cuda_matches_the_cpu, MT_GPU_TEST) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64})
    for (double ord : {2.0, kInf, 1.0}) {
      BOOST_TEST_CONTEXT(dt << ", norm_type " << ord) {
        std::vector<Tensor> cpu = with_grads(dt, 71000), dev = with_grads(dt, 71000, Device::cuda());
        const Tensor total_cpu = mt::optim::clip_grad_norm_(cpu, 1.0, ord);
        const Tensor total_dev = mt::optim::clip_grad_norm_(dev, 1.0, ord);
        BOOST_TEST(total_dev.is_cuda());
        const mt::test::Tolerance tol = dt == DType::kF64 ? mt::test::Tolerance{1e-13, 0} : mt::test::Tolerance{
                                                                                              4e-6, 0};
        expect_close(total_dev, total_cpu, tol, "the total norm");
        for (size_t i = 0; i < cpu.size(); ++i)
          expect_close(dev[i].grad(), cpu[i].grad(), mt::test::tolerance(dt), "gradient " + std::to_string(i));
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()
