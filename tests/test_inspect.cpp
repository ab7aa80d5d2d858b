// tests/test_inspect.cpp — the numerics inspector (optim/inspect.h) on models built to show each of its answers:
// exact statistics of known values, gradients held and unscaled around a loss scale, the overflow attribution
// (which parameter, which op), the lost-update meter at the ulp boundary, Tensor Core eligibility, each piece of
// advice on a model that needs it, and the JSON and gnuplot outputs. The GPU cases run the same on CUDA.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mixtape/mixtape.h>
#include <mixtape/cuda/runtime.h>

#include "compare.h"
#include "test_util.h"

namespace mt = mixtape;
using mt::Device;
using mt::DType;
using mt::Tensor;
using mt::amp::Inspect;
using mt::amp::InspectReport;
using mt::amp::OpStats;
using mt::amp::ValueStats;

namespace {

constexpr int kMinExp = ValueStats::kHistogramMinExp;

int64_t bin(const ValueStats& s, int exp) { return s.histogram.at(static_cast<size_t>(exp - kMinExp)); }

Tensor leaf(const std::vector<double>& values, const mt::Shape& shape, Device device = Device::cpu()) {
  Tensor t = mt::raw::to(mt::from_vector(values, shape, mt::TensorOptions(DType::kF64)), device, DType::kF32);
  t.requires_grad_();
  return t;
}

Tensor constant(const std::vector<double>& values, const mt::Shape& shape, Device device = Device::cpu(),
                DType dtype = DType::kF32) {
  return mt::raw::to(mt::from_vector(values, shape, mt::TensorOptions(DType::kF64)), device, dtype);
}

const OpStats& find_op(const InspectReport& r, const std::string& op, int nth = 0) {
  for (const OpStats& s : r.ops)
    if (s.op == op && nth-- == 0) return s;
  BOOST_FAIL("no op " << op << " in the report:\n" << r.table());
  throw;  // not reached
}

bool advises(const InspectReport& r, const std::string& part) {
  for (const std::string& a : r.advice)
    if (a.find(part) != std::string::npos) return true;
  return false;
}

/// A model whose activation gradient (of an f16 matmul's output, cast to f32 for the sum) is `coef`: loss =
/// Σ (x·w) ⊙ coef, the matmul under f16 autocast. Returns the report of one scaled backward.
InspectReport activation_gradient_model(const std::vector<double>& coef, double init_scale,
                                        Device device = Device::cpu()) {
  const int64_t n = static_cast<int64_t>(coef.size());
  Tensor x = constant(std::vector<double>(static_cast<size_t>(n), 0.5), {n, 1}, device);
  Tensor w = leaf({1.0}, {1, 1}, device);
  Inspect inspect({.parameters = {{"w", w}}});
  mt::amp::GradScaler scaler({.init_scale = init_scale});
  Tensor loss;
  {
    mt::amp::Autocast ac(DType::kF16);
    loss = mt::sum(mt::mul(mt::matmul(x, w), constant(coef, {n, 1}, device)));
  }
  scaler.scale(loss).backward();
  return inspect.report();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(inspect)

BOOST_AUTO_TEST_CASE(forward_statistics_of_known_values_are_exact, MT_CPU_TEST) {
  const double inf = INFINITY;
  // 0, below 2^-24, an f16 subnormal, an f16 normal, 1, past 65504, +inf, a bf16 subnormal, NaN.
  const std::vector<double> v = {0, std::ldexp(1, -25), std::ldexp(1, -20), std::ldexp(1, -10), 1, 70000, inf,
                                 std::ldexp(1, -130), NAN};
  Inspect inspect;
  (void)mt::mul(constant(v, {static_cast<int64_t>(v.size())}), 1.0);  // exact, NaN and inf kept
  const InspectReport r = inspect.report();
  BOOST_REQUIRE_EQUAL(r.ops.size(), 1u);
  const ValueStats& s = r.ops[0].output;
  BOOST_TEST(s.count == 9);
  BOOST_TEST(s.zeros == 1);
  BOOST_TEST(s.non_finite == 2);
  BOOST_TEST(s.f16_underflow == 2);      // 2^-25 and 2^-130
  BOOST_TEST(s.f16_subnormal == 1);      // 2^-20
  BOOST_TEST(s.f16_overflow == 1);       // 70000 (inf counts as non-finite)
  BOOST_TEST(s.bf16_below_normal == 1);  // 2^-130
  BOOST_TEST(s.amax == 70000.0f);
  BOOST_TEST(bin(s, -25) == 1);
  BOOST_TEST(bin(s, -20) == 1);
  BOOST_TEST(bin(s, -10) == 1);
  BOOST_TEST(bin(s, 0) == 1);
  BOOST_TEST(bin(s, 16) == 1);
  BOOST_TEST(bin(s, -130) == 1);
  int64_t total = 0;
  for (int64_t c : s.histogram) total += c;
  BOOST_TEST(total == 6);  // count − zeros − non-finite
  BOOST_TEST(s.fraction_below_pow2(-24) == 2.0 / 9);
}

BOOST_AUTO_TEST_CASE(nothing_is_recorded_outside_the_scope, MT_CPU_TEST) {
  Tensor x = constant({1, 2}, {2});
  InspectReport r;
  {
    Inspect inspect;
    (void)mt::relu(x);
    (void)mt::mul(x, 2.0);
    r = inspect.report();
  }
  (void)mt::relu(x);
  BOOST_TEST(r.ops.size() == 2u);
  // An inner scope sees its own ops; the outer one does not see them twice.
  Inspect outer;
  (void)mt::relu(x);
  {
    Inspect inner;
    (void)mt::relu(x);
    BOOST_TEST(inner.report().ops.size() == 1u);
  }
  BOOST_TEST(outer.report().ops.size() == 1u);
}

// The paper's argument: with init_scale 1 the activation gradients (2^-30) sit below 2^-24 and f16 flushes them;
// with the scale on they are held in range, and their unscaled statistics are the same as before.
BOOST_AUTO_TEST_CASE(underflow_vanishes_from_the_held_gradients_when_scaling_is_on, MT_CPU_TEST) {
  const std::vector<double> coef(64, std::ldexp(1, -30));
  const InspectReport unscaled_run = activation_gradient_model(coef, 1.0);
  const InspectReport scaled_run = activation_gradient_model(coef, 65536.0);
  BOOST_TEST(unscaled_run.loss_scale == 1.0);
  BOOST_TEST(scaled_run.loss_scale == 65536.0);
  BOOST_TEST(unscaled_run.autocast_dtype == DType::kF16);
  // The mul's gradient for the activation (input 0): 2^-30 held in f32 (underflow for f16) without a scale.
  const auto& g1 = find_op(unscaled_run, "mul").grads.at(0);
  BOOST_TEST(!g1.to_leaf);
  BOOST_TEST(g1.held.f16_underflow == 64);
  BOOST_TEST(bin(g1.held, -30) == 64);
  const auto& g2 = find_op(scaled_run, "mul").grads.at(0);
  BOOST_TEST(g2.held.f16_underflow == 0);
  BOOST_TEST(bin(g2.held, -14) == 64);
  BOOST_TEST(g2.unscaled.f16_underflow == 64);
  BOOST_TEST(bin(g2.unscaled, -30) == 64);
  // Figure 3's histogram: without the scale the cast back to f16 (the gradient of autocast's f16 -> f32 cast) holds
  // zeros, so 2^-30 shows once (the mul's f32 gradient); with it, the cast's f16 gradient holds 2^-14, which is
  // 2^-30 unscaled: twice.
  const auto hist1 = unscaled_run.activation_gradient_histogram(false);
  const auto hist2 = scaled_run.activation_gradient_histogram(true);
  BOOST_TEST(hist1.at(static_cast<size_t>(-30 - kMinExp)) == 64);
  for (const OpStats& op : unscaled_run.ops)
    if (op.op == "cast" && op.dtype == DType::kF32) {  // the f16 matmul output cast up for the f32 mul
      BOOST_REQUIRE_EQUAL(op.grads.size(), 1u);
      BOOST_TEST(op.grads[0].dtype == DType::kF16);
      BOOST_TEST(op.grads[0].held.zeros == 64);
    }
  BOOST_TEST(hist2.at(static_cast<size_t>(-30 - kMinExp)) == 128);
  // The matmul's own gradient for w arrives as 0 without scaling (the f16 grad_output flushed), non-zero with it.
  const OpStats& mm1 = find_op(unscaled_run, "matmul");
  const OpStats& mm2 = find_op(scaled_run, "matmul");
  BOOST_REQUIRE(mm1.grad_output.has_value());
  BOOST_TEST(mm1.grad_output->zeros == 64);
  BOOST_TEST(mm2.grad_output->zeros == 0);
  // The advice for the unscaled run: raise the scale by the 6 binades that lift 2^-30 to 2^-24.
  BOOST_TEST(advises(unscaled_run, "raise the loss scale by 2^6"), unscaled_run.table());
  BOOST_TEST(!advises(scaled_run, "loss scale"), scaled_run.table());
}

BOOST_AUTO_TEST_CASE(advice_to_lower_the_scale_or_switch_to_bf16, MT_CPU_TEST) {
  // Held gradients past 65504 (2^17 · 1): lower by 2^3 (amax 2^17 → below 2^14).
  const InspectReport over = activation_gradient_model(std::vector<double>(8, std::ldexp(1, 17)), 1.0);
  BOOST_TEST(advises(over, "lower the loss scale by 2^3"), over.table());
  // Most gradients at 2^-40, one at 2^10: no scale lifts the small ones without overflowing the large one.
  std::vector<double> wide(64, std::ldexp(1, -40));
  wide[0] = std::ldexp(1, 10);
  const InspectReport range = activation_gradient_model(wide, 1.0);
  BOOST_TEST(advises(range, "switch to bf16"), range.table());
  BOOST_TEST(!advises(range, "raise the loss scale"), range.table());
  // At the edge: gradients at 2^-30 need 2^6, which keeps a largest one of 2^8 below 2^15 (2^14) but not one of 2^9
  // (2^15: no room left to grow before 65504).
  for (const auto& [amax_exp, raise] : {std::pair{8, true}, std::pair{9, false}}) {
    std::vector<double> edge(64, std::ldexp(1, -30));
    edge[0] = std::ldexp(1, amax_exp);
    const InspectReport r = activation_gradient_model(edge, 1.0);
    BOOST_TEST_CONTEXT("the largest gradient 2^" << amax_exp) {
      BOOST_TEST(advises(r, "raise the loss scale by 2^6") == raise, r.table());
      BOOST_TEST(advises(r, "switch to bf16") == !raise, r.table());
    }
  }
}

BOOST_AUTO_TEST_CASE(advice_to_keep_an_overflowing_op_in_f32, MT_CPU_TEST) {
  // 300 · 300 · 8 = 720000: past f16's range in a matmul run in f16.
  Tensor x = constant(std::vector<double>(16, 300), {2, 8});
  Tensor w = leaf(std::vector<double>(24, 300), {8, 3});
  Inspect inspect;
  {
    mt::amp::Autocast ac(DType::kF16);
    (void)mt::matmul(x, w);
  }
  const InspectReport r = inspect.report();
  const OpStats& mm = find_op(r, "matmul");
  BOOST_TEST(mm.dtype == DType::kF16);
  BOOST_TEST(mm.output.non_finite == 6);
  BOOST_TEST(advises(r, "keep matmul in f32"), r.table());
  BOOST_TEST(r.table().find("matmul") != std::string::npos);
  // In f32 (the advice taken) nothing overflows and nothing is advised.
  Inspect again;
  {
    mt::amp::Autocast ac(DType::kF16);
    mt::amp::PrecisionScope keep("matmul", mt::Precision::kFp32);
    (void)mt::matmul(x, w);
  }
  const InspectReport fixed = again.report();
  BOOST_TEST(find_op(fixed, "matmul").output.non_finite == 0);
  BOOST_TEST(fixed.advice.empty(), fixed.table());
}

// An inf injected by a backward (sqrt at 0) is attributed to the parameter the GradScaler flagged and to the op
// that produced it first in backward order.
BOOST_AUTO_TEST_CASE(an_injected_inf_is_attributed_to_its_parameter_and_op, MT_CPU_TEST) {
  Tensor a = leaf({1, 0, 4}, {3}), b = leaf({1, 2, 3}, {3});
  mt::optim::SGD opt({a, b}, {.lr = 0.1});
  mt::amp::GradScaler scaler({.init_scale = 1024.0});
  Inspect inspect({.parameters = {{"a", a}, {"b", b}}});
  const Tensor loss = mt::sum(mt::sqrt(a)) + mt::sum(mt::mul(b, 2.0));
  scaler.scale(loss).backward();
  BOOST_TEST(!scaler.step(opt));
  scaler.update();
  const InspectReport r = inspect.report();
  BOOST_TEST(r.loss_scale == 1024.0, "the scale the loss was scaled by, not the one update() backed off to");
  BOOST_TEST(r.non_finite_parameters == std::vector<std::string>{"a"}, boost::test_tools::per_element());
  BOOST_REQUIRE(r.first_non_finite_backward.has_value());
  const OpStats& origin = r.ops.at(*r.first_non_finite_backward);
  BOOST_TEST(origin.op == "sqrt");
  BOOST_REQUIRE(origin.grad_output.has_value());
  BOOST_TEST(origin.grad_output->non_finite == 0);  // it received finite gradients and produced the inf
  BOOST_TEST(r.table().find("first non-finite gradient in backward: #") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(parameters_without_a_name_are_named_by_their_index_in_the_optimizer, MT_CPU_TEST) {
  // Unnamed parameters of one shape: told apart by their indices in opt.parameters() (as in
  // GradScaler::non_finite_gradients and the optimizer's state_dict), not by their shapes, nor by their places among
  // the parameters that have a gradient (`frozen` has none).
  Tensor a = leaf({1, 2}, {2}), b = leaf({1, 2}, {2}), frozen = leaf({1, 2}, {2}), c = leaf({0, 2}, {2});
  mt::optim::SGD opt({a, b, frozen, c}, {.lr = 0.1});
  {
    mt::amp::GradScaler scaler({.init_scale = 4.0});
    Inspect inspect({.parameters = {{"a", a}}});
    scaler.scale(mt::sum(a) + mt::sum(b) + mt::sum(mt::sqrt(c))).backward();  // c's gradient at 0: inf
    BOOST_TEST(!scaler.step(opt));
    scaler.update();
    BOOST_TEST(inspect.report().non_finite_parameters == std::vector<std::string>{"parameter 3"},
               boost::test_tools::per_element());
  }
  opt.zero_grad();
  Inspect inspect({.parameters = {{"a", a}}});
  (mt::sum(a) + mt::sum(b) + mt::sum(c)).backward();
  opt.step();
  std::vector<std::string> names;
  for (const auto& u : inspect.report().updates) names.push_back(u.name);
  BOOST_TEST(names == (std::vector<std::string>{"a", "parameter 1", "parameter 3"}), boost::test_tools::per_element());
}

// sqrt(sqrt(a)) at a = 0: the outer sqrt's backward makes an inf (1 / (2·sqrt(0))), and the inner one, handed that
// inf, makes another. The attribution names the first in backward order, the outer one, whose incoming gradient was
// finite.
BOOST_AUTO_TEST_CASE(the_first_non_finite_gradient_in_backward_order_is_named, MT_CPU_TEST) {
  Tensor a = leaf({0, 1}, {2});
  Inspect inspect;
  mt::sum(mt::sqrt(mt::sqrt(a))).backward();
  const InspectReport r = inspect.report();
  const OpStats &inner = find_op(r, "sqrt", 0), &outer = find_op(r, "sqrt", 1);
  BOOST_REQUIRE(!inner.grads.empty());
  BOOST_REQUIRE(!outer.grads.empty());
  BOOST_TEST(inner.grads[0].held.non_finite == 1);
  BOOST_TEST(outer.grads[0].held.non_finite == 1);
  BOOST_TEST(outer.backward_index < inner.backward_index);
  BOOST_REQUIRE(r.first_non_finite_backward.has_value());
  BOOST_TEST(r.ops.at(*r.first_non_finite_backward).index == outer.index, r.table());
  BOOST_REQUIRE(outer.grad_output.has_value());
  BOOST_TEST(outer.grad_output->non_finite == 0);
}

// Two scaled backwards under one Inspect with different loss scales (as across a GradScaler's update()): each
// backward's gradients are unscaled by the scale its own loss was scaled with; the report names the last scale.
BOOST_AUTO_TEST_CASE(each_backward_is_unscaled_by_its_own_loss_scale, MT_CPU_TEST) {
  Tensor w = leaf({1, 1}, {2});
  const Tensor coef = constant({std::ldexp(1, -10), std::ldexp(1, -10)}, {2});
  Inspect inspect;
  for (double scale : {1024.0, 4.0}) {
    mt::amp::GradScaler scaler({.init_scale = scale});
    scaler.scale(mt::sum(mt::mul(mt::mul(w, w), coef))).backward();
  }
  const InspectReport r = inspect.report();
  BOOST_TEST(r.loss_scale == 4.0);
  // The gradient of the outer mul for its activation input (not a leaf): 2^-10 · S held, 2^-10 unscaled.
  std::vector<int> held_exps;
  for (const OpStats& op : r.ops)
    for (const auto& g : op.grads)
      if (op.op == "mul" && !op.loss_scaling && !g.to_leaf) {
        held_exps.push_back(g.held.amax > 0 ? static_cast<int>(std::log2(g.held.amax)) : 0);
        BOOST_TEST(bin(g.unscaled, -10) == 2, r.table());
      }
  BOOST_TEST(held_exps == (std::vector<int>{0, -8}), boost::test_tools::per_element());
}

// The same step skipped on the device (step_on_device: the optimizer ran and changed nothing): the same attribution,
// and, as with step(), no update to meter.
BOOST_AUTO_TEST_CASE(a_step_skipped_on_the_device_reports_as_a_skipped_step, MT_CPU_TEST) {
  for (bool on_device : {false, true}) {
    BOOST_TEST_CONTEXT((on_device ? "step_on_device" : "step")) {
      Tensor a = leaf({1, 0, 4}, {3}), b = leaf({1, 2, 3}, {3});
      mt::optim::SGD opt({a, b}, {.lr = 0.1});
      mt::amp::GradScaler scaler({.init_scale = 1024.0});
      Inspect inspect({.parameters = {{"a", a}, {"b", b}}});
      scaler.scale(mt::sum(mt::sqrt(a)) + mt::sum(mt::mul(b, 2.0))).backward();
      if (on_device) scaler.step_on_device(opt);
      else BOOST_TEST(!scaler.step(opt));
      scaler.update();
      BOOST_TEST(scaler.skipped_steps() == 1);
      const InspectReport r = inspect.report();
      BOOST_TEST(r.non_finite_parameters == std::vector<std::string>{"a"}, boost::test_tools::per_element());
      BOOST_TEST(r.updates.empty(), r.table());
      BOOST_TEST(!advises(r, "keep f32 master weights"), r.table());
    }
  }
}

// The lost-update meter at f16's ulp boundary: weights at 1 (ulp 2^-10), updates of lr · 1.
BOOST_AUTO_TEST_CASE(lost_updates_against_half_an_ulp, MT_CPU_TEST) {
  for (const auto& [lr, model, lost] : std::vector<std::tuple<double, DType, bool>>{
           {std::ldexp(1, -12), DType::kF16, true},    // a quarter ulp: lost
           {std::ldexp(1, -10), DType::kF16, false},   // an ulp: kept
           {std::ldexp(1, -10), DType::kBF16, true},   // bf16's ulp at 1 is 2^-7
           {std::ldexp(1, -12), DType::kF32, false}}) {
    BOOST_TEST_CONTEXT("lr " << lr << ", model dtype " << model) {
      Tensor w = leaf(std::vector<double>(100, 1.0), {100});
      mt::optim::SGD opt({w}, {.lr = lr});
      Inspect inspect({.parameters = {{"w", w}}, .model_dtype = model});
      opt.zero_grad();
      mt::sum(w).backward();  // gradient 1 everywhere
      opt.step();
      const InspectReport r = inspect.report();
      BOOST_REQUIRE_EQUAL(r.updates.size(), 1u);
      BOOST_TEST(r.updates[0].name == "w");
      BOOST_TEST(r.updates[0].model_dtype == model);
      BOOST_TEST(r.updates[0].count == 100);
      BOOST_TEST(r.updates[0].unchanged == 0);
      BOOST_TEST(r.updates[0].lost == (lost ? 100 : 0));
      BOOST_TEST(advises(r, "keep f32 master weights") == lost, r.table());
      if (lost) BOOST_TEST(advises(r, "100% of w (" + std::string(mt::dtype_name(model)) + ")"), r.table());
    }
  }
}

BOOST_AUTO_TEST_CASE(tensor_core_eligibility_says_why_not, MT_CPU_TEST) {
  Tensor x = constant(std::vector<double>(32, 0.5), {4, 8}), w = leaf(std::vector<double>(24, 0.25), {3, 8});
  Inspect inspect;
  (void)mt::linear(x, w);  // f32, outside autocast
  {
    mt::amp::Autocast ac(DType::kBF16);
    (void)mt::linear(x, w);
  }
  (void)mt::relu(x);
  (void)mt::matmul(x, constant(std::vector<double>(16, 0.5), {8, 2}));
  (void)mt::conv2d(constant(std::vector<double>(18, 0.5), {1, 2, 3, 3}),
                   constant(std::vector<double>(16, 0.25), {2, 2, 2, 2}));
  const InspectReport r = inspect.report();
  const OpStats& plain = find_op(r, "linear", 0);
  const OpStats& bf16 = find_op(r, "linear", 1);
  BOOST_REQUIRE(plain.tensor_cores.has_value());
  BOOST_TEST(!plain.tensor_cores->used);
  BOOST_TEST(plain.tensor_cores->reason.find("device cpu") != std::string::npos, plain.tensor_cores->reason);
  BOOST_TEST(bf16.dtype == DType::kBF16);
  BOOST_TEST(!find_op(r, "relu").tensor_cores.has_value());
  for (const char* op : {"matmul", "conv2d"}) {  // the other matmul-like ops, judged the same way
    BOOST_TEST_CONTEXT(op) {
      const OpStats& s = find_op(r, op);
      BOOST_REQUIRE(s.tensor_cores.has_value());
      BOOST_TEST(!s.tensor_cores->used);
      BOOST_TEST(s.tensor_cores->reason.find("device cpu") != std::string::npos, s.tensor_cores->reason);
    }
  }
  BOOST_TEST(!r.profiled);
  BOOST_TEST(r.table().find("% of the step's op time") == std::string::npos);

  // Profiled: each op's forward and backward seconds, and the matmuls' share of the step beside their eligibility.
  Tensor big = constant(std::vector<double>(256 * 256, 0.01), {256, 256}), wb = leaf(std::vector<double>(256 * 256, 0.02), {256, 256});
  Inspect profiled({.profile = true});
  mt::sum(mt::relu(mt::linear(big, wb))).backward();
  const InspectReport p = profiled.report();
  BOOST_TEST(p.profiled);
  const OpStats& lin = find_op(p, "linear");
  BOOST_TEST(lin.forward_seconds > 0);
  BOOST_TEST(lin.backward_seconds > 0);
  BOOST_TEST(p.table().find("% of the step's op time") != std::string::npos, p.table());
  BOOST_TEST(nlohmann::json::parse(p.json()).at("ops").at(0).contains("seconds"));
}

BOOST_AUTO_TEST_CASE(json_and_plot, MT_CPU_TEST) {
  const InspectReport r = activation_gradient_model(std::vector<double>(16, std::ldexp(1, -30)), 1024.0);
  const nlohmann::json j = nlohmann::json::parse(r.json());
  BOOST_TEST(j.at("loss_scale").get<double>() == 1024.0);
  BOOST_TEST(j.at("ops").size() == r.ops.size());
  BOOST_TEST(j.at("ops").at(0).at("output").at("histogram").size() == r.ops[0].output.histogram.size());
  BOOST_TEST(j.at("ops").at(0).at("output").at("count").get<int64_t>() == r.ops[0].output.count);

  mt::test::TempDir dir("mixtape_inspect_");
  const std::string json_path = dir.file("numerics.json");
  r.write_json(json_path);
  std::ifstream in(json_path);
  BOOST_TEST(nlohmann::json::parse(in) == j);
  mt::test::expect_error([&] { r.write_json(dir.file("missing/dir/x.json")); },
                         {"write_json", "cannot create the temporary file", "No such file or directory"});
  r.write_json(json_path);  // over the old file, through a temporary one that does not stay
  BOOST_TEST(dir.entries() == std::vector<std::string>{"numerics.json"});

  const std::string png = dir.file("grads.png");
  const std::string script = r.gnuplot_script(png);
  BOOST_TEST(script.find("set output '" + png + "'") != std::string::npos);
  BOOST_TEST(script.find("x2^{10}") != std::string::npos);  // the loss scale's shift, log2 1024
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    BOOST_TEST_MESSAGE("gnuplot not installed: the script is not drawn");
    return;
  }
  const std::string gp = dir.file("plot.gp");
  std::ofstream(gp) << script;
  BOOST_TEST(std::system(("gnuplot " + gp + " 2>&1").c_str()) == 0);
  std::ifstream image(png, std::ios::binary);
  char magic[4] = {};
  image.read(magic, 4);
  BOOST_TEST(std::string(magic + 1, 3) == "PNG");
}

// The same model on CUDA gives the CPU's statistics, every field, held and unscaled (the f16 cast and the products
// are exact here, and a power-of-two scale keeps them so).
BOOST_AUTO_TEST_CASE(cuda_statistics_match_the_cpu, MT_GPU_TEST) {
  std::vector<double> coef(256);
  for (size_t i = 0; i < coef.size(); ++i) coef[i] = std::ldexp(1.0 + static_cast<double>(i % 7) / 8, -40 + static_cast<int>(i % 50));
  // The scalars (the loss, the scaled loss, w's gradient) are sums over the batch, in another order on each device:
  // their amax to f32 rounding.
  const auto expect_same = [](const mt::amp::ValueStats& gpu, const mt::amp::ValueStats& cpu, const char* what) {
    BOOST_TEST_CONTEXT(what) {
      BOOST_TEST(gpu.count == cpu.count);
      BOOST_TEST(gpu.zeros == cpu.zeros);
      BOOST_TEST(gpu.non_finite == cpu.non_finite);
      BOOST_TEST(gpu.f16_subnormal == cpu.f16_subnormal);
      BOOST_TEST(gpu.f16_underflow == cpu.f16_underflow);
      BOOST_TEST(gpu.f16_overflow == cpu.f16_overflow);
      BOOST_TEST(gpu.bf16_below_normal == cpu.bf16_below_normal);
      if (cpu.count == 1)
        BOOST_TEST(gpu.amax == cpu.amax, boost::test_tools::tolerance(1e-5f));
      else
        BOOST_TEST(gpu.amax == cpu.amax);
      BOOST_TEST(gpu.histogram == cpu.histogram, boost::test_tools::per_element());
    }
  };
  for (const double scale : {1.0, 1024.0}) {
    BOOST_TEST_CONTEXT("loss scale " << scale) {
      const InspectReport cpu = activation_gradient_model(coef, scale);
      const InspectReport gpu = activation_gradient_model(coef, scale, Device::cuda());
      BOOST_TEST(gpu.loss_scale == cpu.loss_scale);
      BOOST_REQUIRE_EQUAL(cpu.ops.size(), gpu.ops.size());
      for (size_t i = 0; i < cpu.ops.size(); ++i) {
        BOOST_TEST_CONTEXT("op " << i << " " << cpu.ops[i].op) {
          BOOST_TEST(gpu.ops[i].op == cpu.ops[i].op);
          expect_same(gpu.ops[i].output, cpu.ops[i].output, "output");
          BOOST_REQUIRE_EQUAL(gpu.ops[i].grads.size(), cpu.ops[i].grads.size());
          for (size_t k = 0; k < cpu.ops[i].grads.size(); ++k) {
            expect_same(gpu.ops[i].grads[k].held, cpu.ops[i].grads[k].held, "gradient as held");
            expect_same(gpu.ops[i].grads[k].unscaled, cpu.ops[i].grads[k].unscaled, "gradient unscaled");
          }
        }
      }
      BOOST_TEST(gpu.advice == cpu.advice, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
