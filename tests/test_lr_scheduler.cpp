// tests/test_lr_scheduler.cpp — the learning-rate schedules (optim/lr_scheduler.h) against PyTorch's, step by
// step (tests/golden/lr_scheduler.json, written by tests/golden/lr_scheduler.py), and their behaviour: chaining
// with outside changes, state_dict round trips, resuming, and the errors.
//
// Tolerance: the schedules compute in double with PyTorch's formulas in PyTorch's order, so they agree to the
// last bits but for std::cos against Python's math.cos (both libm here): 1e-12 relative.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mixtape/mixtape.h>
#include <mixtape/optim/adam.h>
#include <mixtape/optim/lr_scheduler.h>
#include <mixtape/optim/sgd.h>

#include "compare.h"
#include "golden.h"
#include "test_util.h"

namespace mt = mixtape;
namespace optim = mixtape::optim;
namespace tt = boost::test_tools;
using mt::Tensor;
using mt::test::expect_error;

namespace {

constexpr double kRelTol = 1e-12;

/// The golden files' optimizer: two groups (lr 0.1 and 0.05) of one small parameter each.
struct Setup {
  Tensor a = mt::zeros({3}).requires_grad_(), b = mt::zeros({2}).requires_grad_();
  std::unique_ptr<optim::Optimizer> opt;

  explicit Setup(const std::string& kind) {
    std::vector<optim::ParamGroup> groups = {{{a}, {{"lr", 0.1}}}, {{b}, {{"lr", 0.05}}}};
    if (kind == "SGD")
      opt = std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    else
      opt = std::make_unique<optim::Adam>(groups, optim::AdamOptions{.lr = 0.1, .betas = {0.9, 0.999}});
  }
  std::vector<double> lrs() const { return {opt->lr(0), opt->lr(1)}; }
  std::vector<double> momenta() const {
    const std::string m = opt->momentum_option();
    return {opt->param_groups()[0].options.get(m), opt->param_groups()[1].options.get(m)};
  }
};

using Make = std::function<std::shared_ptr<optim::LRScheduler>(optim::Optimizer&)>;

/// The C++ spelling of each golden case, by the name the script gives it.
const std::map<std::string, Make>& schedules() {
  static const std::map<std::string, Make> m = {
      {"StepLR(3, 0.5)", [](optim::Optimizer& o) { return std::make_shared<optim::StepLR>(o, 3, 0.5); }},
      {"MultiStepLR([2, 5, 5, 9], 0.1)",
       [](optim::Optimizer& o) { return std::make_shared<optim::MultiStepLR>(o, std::vector<int64_t>{2, 5, 5, 9}, 0.1); }},
      {"LinearLR(0.25, 1.0, 4)", [](optim::Optimizer& o) { return std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 4); }},
      {"LinearLR(1.0, 0.1, 6)", [](optim::Optimizer& o) { return std::make_shared<optim::LinearLR>(o, 1.0, 0.1, 6); }},
      {"CosineAnnealingLR(6, 0.001)",
       [](optim::Optimizer& o) { return std::make_shared<optim::CosineAnnealingLR>(o, 6, 0.001); }},
      {"OneCycleLR(max_lr [1.0, 0.5], total_steps 20)",
       [](optim::Optimizer& o) {
         return std::make_shared<optim::OneCycleLR>(o, optim::OneCycleLROptions{.max_lr = {1.0, 0.5}, .total_steps = 20});
       }},
      {"OneCycleLR(max_lr 0.3, total_steps 15, linear, three_phase)",
       [](optim::Optimizer& o) {
         return std::make_shared<optim::OneCycleLR>(
             o, optim::OneCycleLROptions{.max_lr = 0.3, .total_steps = 15, .anneal_strategy = "linear", .three_phase = true});
       }},
      {"OneCycleLR(max_lr 0.01, epochs 3, steps_per_epoch 4) on Adam",
       [](optim::Optimizer& o) {
         return std::make_shared<optim::OneCycleLR>(o,
                                                    optim::OneCycleLROptions{.max_lr = 0.01, .epochs = 3, .steps_per_epoch = 4});
       }},
      {"SequentialLR(LinearLR(0.1, 1.0, 5), CosineAnnealingLR(15), [5])",
       [](optim::Optimizer& o) {
         auto warmup = std::make_shared<optim::LinearLR>(o, 0.1, 1.0, 5);
         auto cosine = std::make_shared<optim::CosineAnnealingLR>(o, 15);
         return std::make_shared<optim::SequentialLR>(
             o, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine}, std::vector<int64_t>{5});
       }},
      {"SequentialLR(StepLR(2, 0.5), MultiStepLR([1, 3], 0.1), [4])",
       [](optim::Optimizer& o) {
         auto a = std::make_shared<optim::StepLR>(o, 2, 0.5);
         auto b = std::make_shared<optim::MultiStepLR>(o, std::vector<int64_t>{1, 3}, 0.1);
         return std::make_shared<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{a, b},
                                                      std::vector<int64_t>{4});
       }},
      {"SequentialLR(LinearLR(0.5, 1.0, 2), StepLR(2, 0.5), LinearLR(0.25, 1.0, 3), [3, 8])",
       [](optim::Optimizer& o) {  // StepLR and LinearLR restart at a milestone through their closed forms
         auto a = std::make_shared<optim::LinearLR>(o, 0.5, 1.0, 2);
         auto b = std::make_shared<optim::StepLR>(o, 2, 0.5);
         auto c = std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 3);
         return std::make_shared<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{a, b, c},
                                                      std::vector<int64_t>{3, 8});
       }},
  };
  return m;
}

bool close(double got, double want) { return std::abs(got - want) <= kRelTol * std::abs(want); }

void expect_row(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == want.size(), what << ": " << got.size() << " groups, expected " << want.size());
  for (size_t g = 0; g < got.size(); ++g)
    BOOST_TEST(close(got[g], want[g]), what << ", group " << g << ": " << got[g] << ", PyTorch " << want[g]);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lr_scheduler)

BOOST_AUTO_TEST_CASE(every_schedule_matches_pytorch_step_by_step,
                     MT_CPU_TEST* mt::test::golden_available("lr_scheduler")) {
  const auto golden = mt::test::load_golden("lr_scheduler");
  BOOST_TEST_REQUIRE(golden.has_value());
  size_t replayed = 0;
  for (const auto& c : golden->at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const auto make = schedules().find(name);
    BOOST_TEST_REQUIRE((make != schedules().end()), "no C++ spelling of the golden case " << name);
    Setup s(c.at("optimizer").get<std::string>());
    const std::shared_ptr<optim::LRScheduler> sched = make->second(*s.opt);
    const auto lr = c.at("lr").get<std::vector<std::vector<double>>>();
    const auto momentum = c.at("momentum").get<std::vector<std::vector<double>>>();
    for (size_t step = 0; step < lr.size(); ++step) {
      if (step > 0) sched->step();
      const std::string what = name + ", step " + std::to_string(step);
      expect_row(s.lrs(), lr[step], what + ", lr");
      expect_row(sched->get_last_lr(), lr[step], what + ", get_last_lr()");
      expect_row(s.momenta(), momentum[step], what + ", momentum");
    }
    ++replayed;
  }
  BOOST_TEST(replayed == schedules().size(), "every C++ case has a golden case");
}

BOOST_AUTO_TEST_CASE(chainable_schedules_compose_with_outside_changes, MT_CPU_TEST) {
  // StepLR multiplies whatever lr the group holds, as PyTorch's chainable form does: halving the lr by hand after
  // step 1 halves everything after it.
  Setup s("SGD");
  optim::StepLR sched(*s.opt, 2, 0.1);
  sched.step();  // epoch 1: unchanged
  s.opt->set_lr(0, 0.05);
  sched.step();  // epoch 2: × 0.1
  BOOST_TEST(close(s.opt->lr(0), 0.005));
  BOOST_TEST(close(s.opt->lr(1), 0.005));
  // Two schedules on one optimizer multiply: the second starts from the groups' initial_lr the first recorded.
  Setup t("SGD");
  optim::StepLR a(*t.opt, 1, 0.5);
  optim::MultiStepLR b(*t.opt, {1}, 0.1);
  BOOST_TEST(close(b.base_lrs()[0], 0.1));
  a.step();
  b.step();
  BOOST_TEST(close(t.opt->lr(0), 0.1 * 0.5 * 0.1));
  BOOST_TEST(t.opt->param_groups()[0].options.get("initial_lr") == 0.1);
}

BOOST_AUTO_TEST_CASE(state_dict_round_trip_continues_identically, MT_CPU_TEST) {
  Setup s("SGD"), t("SGD");
  auto make = schedules().at("SequentialLR(LinearLR(0.1, 1.0, 5), CosineAnnealingLR(15), [5])");
  auto a = make(*s.opt);
  for (int i = 0; i < 7; ++i) a->step();
  const mt::StateDict sd = a->state_dict();
  BOOST_TEST(sd.contains("_schedulers.1.last_epoch"));
  // PyTorch's resume order: the optimizer and its schedule built afresh, then both states loaded (the lr lives in
  // the optimizer's, with the options the schedules recorded in its groups).
  auto b = make(*t.opt);
  t.opt->load_state_dict(s.opt->state_dict());
  b->load_state_dict(sd);
  BOOST_TEST(t.opt->lr(0) == s.opt->lr(0));
  // An optimizer without a schedule takes the recorded options too (a schedule resumed later needs initial_lr).
  Setup u("SGD");
  u.opt->load_state_dict(s.opt->state_dict());
  BOOST_TEST(u.opt->param_groups()[1].options.get("initial_lr") == 0.05);
  optim::CosineAnnealingLR resumed(*u.opt, 15, 0.0, /*last_epoch=*/7);
  for (int i = 0; i < 8; ++i) {
    a->step();
    b->step();
    BOOST_TEST(s.opt->lr(0) == t.opt->lr(0), "step " << 8 + i);
    BOOST_TEST(a->get_last_lr() == b->get_last_lr());
  }
  BOOST_TEST(a->last_epoch() == 15);
}

BOOST_AUTO_TEST_CASE(resuming_at_an_epoch_uses_the_closed_form, MT_CPU_TEST) {
  // A cosine schedule resumed at epoch 3 (initial_lr kept in the groups) lands where an uninterrupted one is.
  Setup s("SGD"), t("SGD");
  optim::CosineAnnealingLR a(*s.opt, 10, 0.0);
  for (int i = 0; i < 4; ++i) a.step();
  optim::CosineAnnealingLR b(*t.opt, 10, 0.0);  // records initial_lr
  optim::CosineAnnealingLR resumed(*t.opt, 10, 0.0, /*last_epoch=*/3);
  BOOST_TEST(close(t.opt->lr(0), s.opt->lr(0)), t.opt->lr(0) << " vs " << s.opt->lr(0));
  Setup fresh("SGD");
  expect_error([&] { optim::StepLR bad(*fresh.opt, 2, 0.1, /*last_epoch=*/5); },
               {"StepLR", "param_groups[0]", "initial_lr"});
}

BOOST_AUTO_TEST_CASE(one_cycle_records_its_bounds_and_cycles_momentum_only_when_asked, MT_CPU_TEST) {
  // PyTorch's OneCycleLR writes initial_lr = max_lr / div_factor, max_lr and min_lr = initial_lr / final_div_factor
  // into each group; cycle_momentum=False leaves the optimizer's momentum alone.
  Setup s("SGD");
  optim::OneCycleLR one(*s.opt, {.max_lr = {1.0, 0.5}, .total_steps = 10, .cycle_momentum = false});
  for (size_t g = 0; g < 2; ++g) {
    const optim::GroupOptions& o = s.opt->param_groups()[g].options;
    const double max_lr = g == 0 ? 1.0 : 0.5;
    BOOST_TEST(o.get("max_lr") == max_lr);
    BOOST_TEST(o.get("initial_lr") == max_lr / 25, tt::tolerance(1e-15));
    BOOST_TEST(o.get("min_lr") == max_lr / 25 / 1e4, tt::tolerance(1e-15));
  }
  for (int i = 0; i < 5; ++i) {
    one.step();
    BOOST_TEST(s.momenta() == (std::vector<double>{0.9, 0.9}), tt::per_element());
  }
  Setup cycled("SGD");
  optim::OneCycleLR two(*cycled.opt, {.max_lr = 1.0, .total_steps = 10});
  BOOST_TEST(cycled.momenta() == (std::vector<double>{0.95, 0.95}), tt::per_element());  // max_momentum at the start
}

BOOST_AUTO_TEST_CASE(errors_name_the_schedule, MT_CPU_TEST) {
  Setup s("SGD");
  expect_error([&] { optim::StepLR bad(*s.opt, 0); }, {"StepLR", "step_size", "0"});
  expect_error([&] { optim::LinearLR bad(*s.opt, 1.5); }, {"LinearLR", "start_factor", "1.5"});
  expect_error([&] { optim::CosineAnnealingLR bad(*s.opt, 0); }, {"CosineAnnealingLR", "T_max"});
  expect_error([&] { optim::OneCycleLR bad(*s.opt, {.max_lr = 0.1}); }, {"OneCycleLR", "total_steps"});
  expect_error([&] { optim::OneCycleLR bad(*s.opt, {.max_lr = {0.1, 0.2, 0.3}, .total_steps = 5}); },
               {"OneCycleLR", "expected 2 values for max_lr, got 3"});
  expect_error([&] { optim::OneCycleLR bad(*s.opt, {.max_lr = 0.1, .total_steps = 5, .anneal_strategy = "exp"}); },
               {"OneCycleLR", "anneal_strategy", "exp"});
  optim::OneCycleLR one(*s.opt, {.max_lr = 0.1, .total_steps = 3});
  for (int i = 0; i < 3; ++i) one.step();
  expect_error([&] { one.step(); }, {"OneCycleLR", "tried to step 5 times", "total steps is 3"});

  Setup t("SGD");
  auto first = std::make_shared<optim::StepLR>(*t.opt, 2);
  auto other = std::make_shared<optim::StepLR>(*s.opt, 2);
  expect_error([&] { optim::SequentialLR bad(*t.opt, {first, other}, {3}); },
               {"SequentialLR", "schedule 1", "drives another"});
  expect_error([&] { optim::SequentialLR bad(*t.opt, {first}, {3}); }, {"SequentialLR", "one milestone fewer"});

  // load_state_dict names the key, and changes nothing when it fails.
  optim::StepLR sched(*t.opt, 2);
  mt::StateDict sd = sched.state_dict();
  mt::StateDict bad;
  for (const auto& [k, v] : sd) bad.insert(k, k == "base_lrs" ? mt::zeros({3}, mt::kF64) : v);
  expect_error([&] { sched.load_state_dict(bad); }, {"StepLR.load_state_dict", "base_lrs", "shape [3]"});
  mt::StateDict missing;
  missing.insert("last_epoch", sd.at("last_epoch"));
  expect_error([&] { sched.load_state_dict(missing); }, {"StepLR.load_state_dict", "missing keys", "_step_count"});
  // Values no schedule reaches (a damaged checkpoint): counts below -1 or past INT32_MAX (stepping on from
  // INT64_MAX would overflow), learning rates that are negative or NaN.
  auto with = [&](const mt::StateDict& from, const std::string& key, const Tensor& value) {
    mt::StateDict out;
    for (const auto& [k, v] : from) out.insert(k, k == key ? value : v);
    return out;
  };
  auto i64 = [](int64_t v) { return mt::from_vector(std::vector<int64_t>{v}, mt::Shape{}); };
  auto f64s = [](double v) { return mt::from_vector(std::vector<double>{v, v}); };
  expect_error([&] { sched.load_state_dict(with(sd, "last_epoch", i64(-2))); },
               {"StepLR.load_state_dict", "'last_epoch' is -2", "expected a count in [-1, 2147483647]"});
  expect_error([&] { sched.load_state_dict(with(sd, "last_epoch", i64(INT64_MAX))); },
               {"StepLR.load_state_dict", "'last_epoch' is 9223372036854775807"});
  expect_error([&] { sched.load_state_dict(with(sd, "_step_count", i64(-1))); },
               {"StepLR.load_state_dict", "'_step_count' is -1", "expected a count in [0, 2147483647]"});
  expect_error([&] { sched.load_state_dict(with(sd, "base_lrs", f64s(-0.5))); },
               {"StepLR.load_state_dict", "'base_lrs'[0] is -0.5", "not a learning rate"});
  expect_error([&] { sched.load_state_dict(with(sd, "_last_lr", f64s(std::nan("")))); },
               {"StepLR.load_state_dict", "'_last_lr'[0] is nan", "not a learning rate"});
  BOOST_TEST(sched.last_epoch() == 0);
  BOOST_TEST(sched.base_lrs() == std::vector<double>({0.1, 0.05}));
  sched.load_state_dict(with(sd, "last_epoch", i64(INT32_MAX)));  // the largest count is a count
  BOOST_TEST(sched.last_epoch() == INT32_MAX);

  // A SequentialLR's nested keys: an index past its schedules, however many digits, is an unexpected key.
  auto nested = std::make_shared<optim::StepLR>(*t.opt, 2);
  optim::SequentialLR sequence(*t.opt, {nested}, {});
  const mt::StateDict seq = sequence.state_dict();
  for (const std::string index : {"1", "18446744073709551616", "99999999999999999999999"}) {
    mt::StateDict extra = seq;
    extra.insert("_schedulers." + index + ".last_epoch", i64(0));
    expect_error([&] { sequence.load_state_dict(extra); },
                 {"SequentialLR.load_state_dict", "unexpected key '_schedulers." + index + ".last_epoch'"});
  }
  expect_error([&] { sequence.load_state_dict(with(seq, "_schedulers.0.last_epoch", i64(-3))); },
               {"SequentialLR._schedulers.0.load_state_dict", "'last_epoch' is -3"});
  BOOST_TEST(nested->last_epoch() == 0);
}

BOOST_AUTO_TEST_CASE(a_schedule_refuses_a_destroyed_optimizer, MT_CPU_TEST) {
  std::unique_ptr<optim::StepLR> sched;
  {
    Setup s("SGD");
    sched = std::make_unique<optim::StepLR>(*s.opt, 2);
  }
  expect_error([&] { sched->step(); }, {"StepLR", "optimizer was destroyed"});
}

BOOST_AUTO_TEST_SUITE_END()
