// tests/test_nn.cpp — nn/: Module (registration, names, walks, train/eval, to(), zero_grad, apply, moves,
// state_dict), the layers (PyTorch's initialisation, forwards against the ops, printouts against PyTorch's text,
// argument and input-shape errors), nn::init's statistics and seeding, and BatchNorm's running statistics.
//
// The expected printouts are PyTorch's own for the same models (torch 2.x's Module.__repr__ and extra_repr).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/mixtape.h>

#include "compare.h"
#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace nn = mixtape::nn;
namespace tt = boost::test_tools;
using mt::DType;
using mt::Tensor;
using mt::test::expect_close;
using mt::test::expect_error;
using mt::test::expect_values;
using mt::test::kExact;
using mt::test::tolerance;

namespace {

/// DESIGN.md's model: value members registered by reference, forward a user method.
struct Net : nn::Module {
  nn::Linear fc1{784, 512}, fc2{512, 10};
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) { return fc2(mt::relu(fc1(x))); }
};

/// Own parameters and buffers, a nested user module, a container, and a module shared under two names.
struct Outer : nn::Module {
  Tensor scale;
  struct Inner : nn::Module {
    nn::Linear a{4, 3};
    nn::BatchNorm1d bn{3};
    Inner() {
      register_module("a", a);
      register_module("bn", bn);
    }
  } inner;
  nn::Sequential seq{nn::Linear(3, 2), nn::ReLU(), nn::Dropout(0.5), nn::Linear(2, 2, false)};
  std::shared_ptr<nn::Linear> shared = std::make_shared<nn::Linear>(2, 2);
  Outer() {
    scale = register_parameter("scale", mt::ones({1}));
    register_buffer("steps", mt::zeros({}, mt::kI64));
    register_module("inner", inner);
    register_module("seq", seq);
    register_module("head", shared);
    register_module("tied", shared);
  }
};

std::vector<std::string> names(const nn::NamedTensors& list) {
  std::vector<std::string> out;
  for (const auto& [name, t] : list) out.push_back(name);
  return out;
}

/// A small CNN: conv, batch norm, relu, pool, flatten, linear.
struct Cnn : nn::Module {
  nn::Conv2d conv{1, 4, 3, 1, 1};
  nn::BatchNorm2d bn{4};
  nn::MaxPool2d pool{2};
  nn::Flatten flatten;
  nn::Linear fc{4 * 4 * 4, 10};
  Cnn() {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("pool", pool);
    register_module("flatten", flatten);
    register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) { return fc(flatten(pool(mt::relu(bn(conv(x)))))); }
};

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(nn_module)

BOOST_AUTO_TEST_CASE(registration_and_dotted_names, MT_CPU_TEST) {
  Net net;
  BOOST_TEST(names(net.named_parameters()) ==
                 (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}),
             tt::per_element());
  // The registered parameters are the members' handles, leaves that require grad.
  const auto params = net.parameters();
  BOOST_TEST(params.size() == 4u);
  BOOST_TEST(params[0].is_same(net.fc1.weight));
  BOOST_TEST(params[3].is_same(net.fc2.bias));
  for (const Tensor& p : params) {
    BOOST_TEST(p.is_leaf());
    BOOST_TEST(p.requires_grad());
  }
  BOOST_TEST(names(net.named_parameters(false)).empty());

  // Nested modules, a container's indices, buffers; the shared Linear ("head" and "tied") is listed once by the
  // walks, which visit each module and tensor once (PyTorch's remove_duplicate).
  Outer outer;
  BOOST_TEST(names(outer.named_parameters()) ==
                 (std::vector<std::string>{"scale", "inner.a.weight", "inner.a.bias", "inner.bn.weight",
                                           "inner.bn.bias", "seq.0.weight", "seq.0.bias", "seq.3.weight",
                                           "head.weight", "head.bias"}),
             tt::per_element());
  BOOST_TEST(names(outer.named_buffers()) ==
                 (std::vector<std::string>{"steps", "inner.bn.running_mean", "inner.bn.running_var",
                                           "inner.bn.num_batches_tracked"}),
             tt::per_element());
  BOOST_TEST(names(outer.named_parameters(false)) == (std::vector<std::string>{"scale"}), tt::per_element());
  std::vector<std::string> children;
  for (const auto& [name, m] : outer.named_children()) children.push_back(name);
  BOOST_TEST(children == (std::vector<std::string>{"inner", "seq", "head"}), tt::per_element());  // "tied" is "head"
  BOOST_TEST(outer.children().size() == 3u);
  BOOST_TEST(outer.children()[1] == &outer.seq);
  std::vector<std::string> modules;
  for (const auto& [name, m] : outer.named_modules()) modules.push_back(name);
  BOOST_TEST(modules == (std::vector<std::string>{"", "inner", "inner.a", "inner.bn", "seq", "seq.0", "seq.1",
                                                  "seq.2", "seq.3", "head"}),
             tt::per_element());
  BOOST_TEST(outer.modules().size() == 10u);
  BOOST_TEST(outer.modules()[0] == &outer);
  // The state dict keeps every name, the shared module under both (PyTorch's state_dict does too).
  const auto keys = outer.state_dict().keys();
  BOOST_TEST(std::set<std::string>(keys.begin(), keys.end()).count("tied.weight") == 1u);
  BOOST_TEST(keys.size() == 1u + 1u + 2u + 2u + 3u + 2u + 1u + 2u + 2u);
  // A Sequential's modules by index, typed or not.
  BOOST_TEST(&outer.seq[0] == &outer.seq.at<nn::Linear>(0));
  BOOST_TEST(outer.seq.size() == 4u);
  BOOST_TEST(outer.seq[1].type_name() == "ReLU");
}

// One tensor registered in two modules (tied weights, as an embedding and the output layer reading it): listed once,
// under its first name, as PyTorch's named_parameters() does, so an optimizer steps it once.
BOOST_AUTO_TEST_CASE(a_tensor_tied_between_two_modules_is_listed_once, MT_CPU_TEST) {
  struct Holder : nn::Module {
    using nn::Module::register_parameter;
  };
  struct Tied : nn::Module {
    Holder a, b;
    Tied() {
      register_module("a", a);
      register_module("b", b);
    }
  } tied;
  const Tensor w = tied.a.register_parameter("w", mt::ones({2}));
  tied.b.register_parameter("w", w);
  tied.b.register_parameter("v", mt::ones({3}));
  BOOST_TEST(names(tied.named_parameters()) == (std::vector<std::string>{"a.w", "b.v"}), tt::per_element());
  BOOST_TEST(tied.parameter_count() == 2 + 3);
  BOOST_TEST(names(tied.b.named_parameters()) == (std::vector<std::string>{"w", "v"}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(registration_errors, MT_CPU_TEST) {
  struct Probe : nn::Module {
    using nn::Module::register_buffer;
    using nn::Module::register_parameter;
  };
  Probe m;
  m.register_parameter("w", mt::ones({2}));
  expect_error([&] { m.register_parameter("w", mt::ones({2})); },
               {"register_parameter", "\"w\"", "already registered"});
  expect_error([&] { m.register_buffer("w", mt::ones({2})); }, {"register_buffer", "\"w\"", "already registered"});
  expect_error([&] { m.register_parameter("a.b", mt::ones({2})); }, {"register_parameter", "\"a.b\"", "\".\""});
  expect_error([&] { m.register_parameter("", mt::ones({2})); }, {"register_parameter", "empty"});
  expect_error([&] { m.register_parameter("u", Tensor()); }, {"register_parameter", "\"u\"", "undefined"});
  expect_error([&] { m.register_buffer("u", Tensor()); }, {"register_buffer", "\"u\"", "undefined"});
  expect_error([&] { m.register_parameter("i", mt::zeros({2}, mt::kI64)); }, {"register_parameter", "\"i\"", "i64"});
  nn::Linear lin(2, 2);
  m.register_module("lin", lin);
  expect_error([&] { m.register_module("lin", lin); }, {"register_module", "\"lin\"", "already registered"});
  expect_error([&] { m.register_module("w", lin); }, {"register_module", "\"w\"", "a parameter"});
  expect_error([&] { m.register_module("x.y", lin); }, {"register_module", "\"x.y\""});
  expect_error([&] { m.register_module("me", m); }, {"register_module", "the module itself"});
  // A non-leaf becomes a leaf: the registered handle is what to keep.
  Tensor base = mt::ones({2}).requires_grad_();
  const Tensor p = m.register_parameter("derived", mt::mul(base, 2.0));
  BOOST_TEST(p.is_leaf());
  BOOST_TEST(p.requires_grad());
  // A buffer is not trained: no requires_grad.
  BOOST_TEST(!m.register_buffer("b", mt::ones({2})).requires_grad());
}

BOOST_AUTO_TEST_CASE(train_and_eval_reach_every_module, MT_CPU_TEST) {
  Outer outer;
  BOOST_TEST(outer.is_training());
  outer.eval();
  for (nn::Module* m : outer.modules()) BOOST_TEST(!m->is_training(), m->type_name() << " still training");
  outer.train();
  for (nn::Module* m : outer.modules()) BOOST_TEST(m->is_training(), m->type_name() << " not training");
  outer.inner.train(false);  // a subtree only
  BOOST_TEST(!outer.inner.bn.is_training());
  BOOST_TEST(outer.seq.is_training());
  BOOST_TEST(&outer.train(false) == &outer);  // chains, like PyTorch's
}

BOOST_AUTO_TEST_CASE(to_dtype_keeps_the_handles, MT_CPU_TEST) {
  mt::manual_seed(1);
  Outer outer;
  const std::vector<Tensor> held = outer.parameters();  // what an optimizer built now would hold
  // A gradient on one parameter: converted with it.
  mt::sum(mt::mul(outer.inner.a.weight, 3.0)).backward();
  const std::vector<double> before = outer.inner.a.weight.to_vector<double>();
  for (DType dt : {mt::kF16, mt::kBF16}) {
    outer.to(dt);
    const auto params = outer.parameters();
    BOOST_TEST_REQUIRE(params.size() == held.size());
    for (size_t i = 0; i < params.size(); ++i) {
      BOOST_TEST(params[i].is_same(held[i]));
      BOOST_TEST(held[i].dtype() == dt);
      BOOST_TEST(held[i].requires_grad());
      BOOST_TEST(held[i].is_leaf());
    }
    BOOST_TEST(outer.inner.a.weight.is_same(held[1]));
    BOOST_TEST(outer.inner.a.weight.grad().dtype() == dt);
    expect_values(outer.inner.a.weight.grad(), std::vector<double>(12, 3.0), kExact, "the gradient, converted");
    expect_values(outer.inner.a.weight, before, tolerance(dt), "the weight, converted");
    // BatchNorm's statistics stay f32; the integer buffers stay integers.
    BOOST_TEST(outer.inner.bn.running_mean.dtype() == mt::kF32);
    BOOST_TEST(outer.inner.bn.running_var.dtype() == mt::kF32);
    BOOST_TEST(outer.inner.bn.num_batches_tracked.dtype() == mt::kI64);
    BOOST_TEST(outer.inner.bn.weight.dtype() == dt);
    // The converted model runs in dt.
    outer.inner.bn.eval();
    const Tensor y = outer.inner.bn(outer.inner.a(mt::randn({5, 4}).to(dt)));
    BOOST_TEST(y.dtype() == dt);
    outer.inner.bn.train();
  }
  outer.to(mt::kF64);
  BOOST_TEST(outer.inner.bn.running_mean.dtype() == mt::kF64);  // acc_dtype(f64)
  BOOST_TEST(held[0].dtype() == mt::kF64);
  outer.to(mt::kF32);
  BOOST_TEST(held[0].dtype() == mt::kF32);
  BOOST_TEST(outer.inner.bn.running_var.dtype() == mt::kF32);
  expect_error([&] { outer.to(mt::kI64); }, {"Outer.to", "floating", "i64"});
}

BOOST_AUTO_TEST_CASE(zero_grad_and_apply, MT_CPU_TEST) {
  mt::manual_seed(2);
  Net net;
  mt::sum(net.forward(mt::randn({3, 784}))).backward();
  for (const Tensor& p : net.parameters()) BOOST_TEST(p.grad().defined());
  const Tensor g = net.fc1.weight.grad();
  net.zero_grad(false);  // zeroed in place: the same gradient tensor
  BOOST_TEST(net.fc1.weight.grad().is_same(g));
  for (const Tensor& p : net.parameters())
    expect_values(p.grad(), std::vector<double>(static_cast<size_t>(p.numel()), 0.0), kExact, "zeroed");
  net.zero_grad();
  for (const Tensor& p : net.parameters()) BOOST_TEST(!p.grad().defined());

  // apply: children before their parent, in registration order, each once (the tied Linear too); here it
  // initialises every Linear.
  std::vector<std::string> order;
  Outer outer;
  outer.apply([&](nn::Module& m) {
    order.push_back(m.type_name());
    if (auto* lin = dynamic_cast<nn::Linear*>(&m)) nn::init::constant_(lin->weight, 0.5);
  });
  BOOST_TEST(order == (std::vector<std::string>{"Linear", "BatchNorm1d", "Inner", "Linear", "ReLU", "Dropout", "Linear",
                                                "Sequential", "Linear", "Outer"}),
             tt::per_element());
  expect_values(outer.seq.at<nn::Linear>(3).weight, std::vector<double>(4, 0.5), kExact, "applied");
}

BOOST_AUTO_TEST_CASE(parameter_count_counts_elements, MT_CPU_TEST) {
  Net net;
  BOOST_TEST(net.parameter_count() == 784 * 512 + 512 + 512 * 10 + 10);
  Outer outer;  // the tied Linear counted once
  BOOST_TEST(outer.parameter_count() == 1 + (12 + 3) + (3 + 3) + (6 + 2) + 4 + (4 + 2));
  BOOST_TEST(nn::ReLU().parameter_count() == 0);
}

BOOST_AUTO_TEST_CASE(printout_matches_pytorch, MT_CPU_TEST) {
  // print(Net()) of the same PyTorch model.
  Net net;
  BOOST_TEST(net.repr() ==
             "Net(\n"
             "  (fc1): Linear(in_features=784, out_features=512, bias=True)\n"
             "  (fc2): Linear(in_features=512, out_features=10, bias=True)\n"
             ")");
  std::ostringstream os;
  os << net;
  BOOST_TEST(os.str() == net.repr());

  // print(nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
  //       nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(6272, 10)))
  nn::Sequential seq{nn::Conv2d({.in_channels = 1, .out_channels = 32, .kernel_size = 3, .padding = 1, .bias = false}),
                     nn::BatchNorm2d(32),
                     nn::ReLU(),
                     nn::MaxPool2d(2),
                     nn::Dropout(0.25),
                     nn::Flatten(),
                     nn::Linear(6272, 10)};
  BOOST_TEST(seq.repr() ==
             "Sequential(\n"
             "  (0): Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
             "  (1): BatchNorm2d(32, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
             "  (2): ReLU()\n"
             "  (3): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)\n"
             "  (4): Dropout(p=0.25, inplace=False)\n"
             "  (5): Flatten(start_dim=1, end_dim=-1)\n"
             "  (6): Linear(in_features=6272, out_features=10, bias=True)\n"
             ")");

  // Nesting indents; ModuleList folds runs of identical modules; tuples, None and small floats as Python prints.
  struct Model : nn::Module {
    nn::Sequential features{nn::Linear(10, 10), nn::GELU("tanh")};
    nn::LayerNorm norm{10};
    nn::ModuleList blocks{nn::Linear(10, 10), nn::Linear(10, 10), nn::Linear(10, 10), nn::Tanh(), nn::Sigmoid()};
    nn::AvgPool2d pool{{2, 3}};
    nn::BatchNorm1d bn{10, 1e-3, std::nullopt, false, false};
    nn::Conv2d conv{3, 8, {3, 5}, 2, {1, 2}, 2};
    Model() {
      register_module("features", features);
      register_module("norm", norm);
      register_module("blocks", blocks);
      register_module("pool", pool);
      register_module("bn", bn);
      register_module("conv", conv);
    }
  } model;
  BOOST_TEST(model.repr() ==
             "Model(\n"
             "  (features): Sequential(\n"
             "    (0): Linear(in_features=10, out_features=10, bias=True)\n"
             "    (1): GELU(approximate='tanh')\n"
             "  )\n"
             "  (norm): LayerNorm((10,), eps=1e-05, elementwise_affine=True)\n"
             "  (blocks): ModuleList(\n"
             "    (0-2): 3 x Linear(in_features=10, out_features=10, bias=True)\n"
             "    (3): Tanh()\n"
             "    (4): Sigmoid()\n"
             "  )\n"
             "  (pool): AvgPool2d(kernel_size=(2, 3), stride=(2, 3), padding=0)\n"
             "  (bn): BatchNorm1d(10, eps=0.001, momentum=None, affine=False, track_running_stats=False)\n"
             "  (conv): Conv2d(3, 8, kernel_size=(3, 5), stride=(2, 2), padding=(1, 2), dilation=(2, 2))\n"
             ")");
  // Leaves and empty containers on their own.
  BOOST_TEST(nn::GELU().repr() == "GELU(approximate='none')");
  BOOST_TEST(nn::Dropout(1e-5).repr() == "Dropout(p=1e-05, inplace=False)");
  BOOST_TEST(nn::Dropout(1).repr() == "Dropout(p=1.0, inplace=False)");
  BOOST_TEST(nn::LayerNorm(mt::Shape{3, 4}, 1e-4, false).repr() ==
             "LayerNorm((3, 4), eps=0.0001, elementwise_affine=False)");
  BOOST_TEST(nn::ModuleList().repr() == "ModuleList()");
  BOOST_TEST(nn::Sequential().repr() == "Sequential()");
  BOOST_TEST(nn::BatchNorm2d(4, 1e-5, 0.01).repr() ==
             "BatchNorm2d(4, eps=1e-05, momentum=0.01, affine=True, track_running_stats=True)");
  // Negative numbers (PyTorch takes any finite momentum): the sign before the digits, in both notations.
  BOOST_TEST(nn::BatchNorm2d(4, 1e-5, -0.5).repr() ==
             "BatchNorm2d(4, eps=1e-05, momentum=-0.5, affine=True, track_running_stats=True)");
  BOOST_TEST(nn::BatchNorm2d(4, 1e-5, -1.5e-7).repr() ==
             "BatchNorm2d(4, eps=1e-05, momentum=-1.5e-07, affine=True, track_running_stats=True)");
  // Python's repr of other floats: fractions past the point, whole numbers, the edges of fixed notation.
  for (const auto& [eps, text] : std::vector<std::pair<double, std::string>>{
           {2.5, "2.5"}, {1234.5, "1234.5"}, {100.0, "100.0"}, {0.00012, "0.00012"}, {1.5e-7, "1.5e-07"},
           {123456789012345.6, "123456789012345.6"}, {1e16, "1e+16"}, {2.5e300, "2.5e+300"}})
    BOOST_TEST(nn::BatchNorm1d(3, eps).repr() ==
               "BatchNorm1d(3, eps=" + text + ", momentum=0.1, affine=True, track_running_stats=True)");
}

BOOST_AUTO_TEST_CASE(state_dict_round_trip, MT_CPU_TEST) {
  mt::manual_seed(3);
  nn::Sequential a{nn::Linear(4, 3), nn::BatchNorm1d(3)};
  a(mt::randn({8, 4}));  // running statistics and num_batches_tracked move off their initial values
  const mt::StateDict sd = a.state_dict();
  BOOST_TEST(sd.keys() == (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                                    "1.running_var", "1.num_batches_tracked"}),
             tt::per_element());
  BOOST_TEST(!sd.at("0.weight").requires_grad());  // detached handles
  BOOST_TEST(sd.at("1.num_batches_tracked").item<int64_t>() == 1);
  BOOST_TEST(sd.at("1.num_batches_tracked").dim() == 0);

  nn::Sequential b{nn::Linear(4, 3), nn::BatchNorm1d(3)};
  const Tensor held = b.at<nn::Linear>(0).weight;
  b.load_state_dict(sd);
  BOOST_TEST(b.at<nn::Linear>(0).weight.is_same(held));  // copied into, not replaced
  for (const auto& [key, t] : b.state_dict()) expect_close(t, sd.at(key), kExact, "loaded " + key);
  BOOST_TEST(b.at<nn::Linear>(0).weight.requires_grad());
  // The loaded copy is independent of the source.
  b.at<nn::Linear>(0).weight.set_grad(Tensor());
  {
    mt::autograd::NoGradGuard no_grad;
    b.at<nn::Linear>(0).weight.fill_(7.0);
  }
  BOOST_TEST(a.at<nn::Linear>(0).weight.at<float>({0, 0}) != 7.0f);
}

BOOST_AUTO_TEST_CASE(load_state_dict_errors_name_the_key, MT_CPU_TEST) {
  mt::manual_seed(4);
  Net net;
  const std::vector<double> before = net.fc2.bias.to_vector<double>();
  auto without = [&](const std::string& skip) {
    mt::StateDict sd;
    for (const auto& [key, t] : net.state_dict())
      if (key != skip) sd.insert(key, t.clone());
    return sd;
  };
  expect_error([&] { net.load_state_dict(without("fc1.bias")); }, {"Net.load_state_dict", "missing", "fc1.bias"});
  mt::StateDict extra = without("");
  extra.insert("fc3.weight", mt::ones({2}));
  expect_error([&] { net.load_state_dict(extra); }, {"Net.load_state_dict", "unexpected", "fc3.weight"});
  // Both at once: one error naming all of them (a user renaming a layer sees the old name and the new).
  mt::StateDict renamed = without("fc1.bias");
  renamed.insert("fc1.b", mt::ones({512}));
  expect_error([&] { net.load_state_dict(renamed); },
               {"Net.load_state_dict: missing keys [fc1.bias]; unexpected keys [fc1.b]"});
  // The dict itself: one tensor a key, and at() of an absent key names it.
  expect_error([&] { extra.insert("fc3.weight", mt::ones({2})); }, {"fc3.weight"});
  expect_error([&] { (void)extra.at("fc4.weight"); }, {"fc4.weight"});
  mt::StateDict misshapen = without("fc2.bias");
  misshapen.insert("fc2.bias", mt::ones({11}));
  expect_error([&] { net.load_state_dict(misshapen); }, {"Net.load_state_dict", "fc2.bias", "[11]", "[10]"});
  mt::StateDict wrong_dtype = without("fc2.bias");
  wrong_dtype.insert("fc2.bias", mt::ones({10}, mt::kF16));
  expect_error([&] { net.load_state_dict(wrong_dtype); }, {"Net.load_state_dict", "fc2.bias", "f16", "f32"});
  // A failed load changed nothing, even for the keys before the bad one.
  expect_values(net.fc2.bias, before, kExact, "after failed loads");
  // Not strict: missing keys stay, unexpected ones are ignored; a misshapen one is still an error.
  mt::StateDict partial;
  partial.insert("fc2.bias", mt::full({10}, 2.0));
  partial.insert("other", mt::ones({1}));
  net.load_state_dict(partial, false);
  expect_values(net.fc2.bias, std::vector<double>(10, 2.0), kExact, "non-strict load");
  expect_error([&] { net.load_state_dict(misshapen, false); }, {"fc2.bias", "[11]"});
}

BOOST_AUTO_TEST_CASE(moves, MT_CPU_TEST) {
  // A layer moves with its parameters (the same handles), leaving nothing registered behind.
  nn::Linear a(3, 4);
  const Tensor w = a.weight;
  nn::Linear b(std::move(a));
  BOOST_TEST(b.weight.is_same(w));
  BOOST_TEST(b.parameters().size() == 2u);
  BOOST_TEST(b.parameters()[0].is_same(w));
  BOOST_TEST(a.parameters().empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  // A module with submodules registered by reference refuses to move: the registrations would dangle.
  Net net;
  const std::string message = expect_error([&] { Net moved(std::move(net)); }, {"Net", "fc1, fc2", "by reference"});
  BOOST_TEST(!message.empty());
  expect_error([&] { nn::Sequential seq{Net()}; }, {"Net", "by reference"});
  // Moving into a registered member keeps the registration: the parent sees the new layer.
  net.fc2 = nn::Linear(512, 7);
  BOOST_TEST(net.named_parameters()[2].second.shape() == (mt::Shape{7, 512}));
  BOOST_TEST(net.named_parameters()[2].second.is_same(net.fc2.weight));
  BOOST_TEST(net.forward(mt::randn({2, 784})).shape() == (mt::Shape{2, 7}));
  // Containers own their modules: they move, and their forwards still run.
  nn::Sequential seq{nn::Linear(3, 2), nn::ReLU()};
  nn::Sequential moved(std::move(seq));
  BOOST_TEST(moved(mt::randn({5, 3})).shape() == (mt::Shape{5, 2}));
  BOOST_TEST(names(moved.named_parameters()) == (std::vector<std::string>{"0.weight", "0.bias"}), tt::per_element());
  // A move assignment from a module with submodules by reference is refused as the move constructor is.
  Net from, into;
  expect_error([&] { into = std::move(from); }, {"Net", "fc1, fc2", "by reference"});
}

BOOST_AUTO_TEST_CASE(containers, MT_CPU_TEST) {
  mt::manual_seed(5);
  auto lin = std::make_shared<nn::Linear>(3, 3);
  nn::Sequential seq;
  BOOST_TEST(seq.size() == 0u);
  const Tensor x = mt::randn({2, 3});
  expect_close(seq(x), x, kExact, "an empty Sequential is the identity");
  seq.push_back(lin);
  seq.push_back(nn::Tanh());
  seq.push_back(lin);  // shared: the same weights twice
  expect_close(seq(x), lin->forward(mt::tanh(lin->forward(x))), kExact, "Sequential chains its modules");
  BOOST_TEST(seq.parameters().size() == 2u);
  expect_error([&] { seq[3]; }, {"Sequential", "index 3", "3 modules"});
  expect_error([&] { seq.at<nn::ReLU>(1); }, {"Sequential.at", "Tanh"});

  nn::ModuleList list{nn::Linear(3, 3), nn::ReLU()};
  list.push_back(nn::Linear(3, 1));
  BOOST_TEST(list.size() == 3u);
  std::vector<std::string> types;
  for (nn::Module* m : list) types.push_back(m->type_name());
  BOOST_TEST(types == (std::vector<std::string>{"Linear", "ReLU", "Linear"}), tt::per_element());
  BOOST_TEST(names(list.named_parameters()) ==
                 (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}),
             tt::per_element());
  BOOST_TEST(list.at<nn::Linear>(2)(x).shape() == (mt::Shape{2, 1}));
  expect_error([&] { list[5]; }, {"ModuleList", "index 5"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_layers)

BOOST_AUTO_TEST_CASE(default_initialisation_bounds, MT_CPU_TEST) {
  mt::manual_seed(6);
  // Linear(100, 50): weight and bias U(±1/√100); the weight's std 0.1/√3 within sampling error (5000 values).
  nn::Linear lin(100, 50);
  const auto w = lin.weight.to_vector<double>(), b = lin.bias.to_vector<double>();
  BOOST_TEST(max_abs(w) <= 0.1);
  BOOST_TEST(max_abs(w) > 0.099);
  BOOST_TEST(max_abs(b) <= 0.1);
  BOOST_TEST(std_of(w) == 0.1 / std::sqrt(3.0), tt::tolerance(0.03));
  BOOST_TEST(lin.weight.dtype() == mt::kF32);
  // Conv2d(3, 8, 5): fan_in 3·5·5 = 75.
  nn::Conv2d conv(3, 8, 5);
  const double bound = 1 / std::sqrt(75.0);
  BOOST_TEST(max_abs(conv.weight.to_vector<double>()) <= bound);
  BOOST_TEST(max_abs(conv.weight.to_vector<double>()) > 0.97 * bound);
  BOOST_TEST(max_abs(conv.bias.to_vector<double>()) <= bound);
  BOOST_TEST(conv.weight.shape() == (mt::Shape{8, 3, 5, 5}));
  // The same seed, the same layer.
  mt::manual_seed(6);
  nn::Linear again(100, 50);
  expect_close(again.weight, lin.weight, kExact, "seeded Linear");
  expect_close(again.bias, lin.bias, kExact, "seeded Linear bias");
  // Norm layers start at weight 1, bias 0.
  nn::LayerNorm ln(mt::Shape{2, 3});
  expect_values(ln.weight, std::vector<double>(6, 1.0), kExact, "LayerNorm weight");
  expect_values(ln.bias, std::vector<double>(6, 0.0), kExact, "LayerNorm bias");
  BOOST_TEST(!nn::LayerNorm(4, 1e-5, true, false).bias.defined());
  BOOST_TEST(nn::LayerNorm(4, 1e-5, false).parameters().empty());
  nn::BatchNorm2d bn(3);
  expect_values(bn.weight, {1, 1, 1}, kExact, "BatchNorm weight");
  expect_values(bn.running_var, {1, 1, 1}, kExact, "BatchNorm running_var");
  BOOST_TEST(!nn::Linear(3, 2, false).bias.defined());
  BOOST_TEST(!nn::Conv2d({.in_channels = 1, .out_channels = 2, .kernel_size = 3, .bias = false}).bias.defined());
}

BOOST_AUTO_TEST_CASE(forwards_are_the_ops, MT_CPU_TEST) {
  mt::manual_seed(7);
  const Tensor x = mt::randn({2, 3, 8, 8});
  nn::Conv2d conv(3, 4, {3, 5}, 1, {1, 2});
  mt::Conv2dOptions copt;
  copt.padding[0] = 1;
  copt.padding[1] = 2;
  expect_close(conv(x), mt::conv2d(x, conv.weight, conv.bias, copt), kExact, "Conv2d");
  expect_close(conv(x.select(0, 1)), mt::conv2d(x, conv.weight, conv.bias, copt).select(0, 1), kExact,
               "Conv2d, unbatched (C, H, W)");
  // Every option reaches the op: stride, padding and dilation per axis, no bias.
  nn::Conv2d strided({.in_channels = 3, .out_channels = 2, .kernel_size = {3, 2}, .stride = {2, 1},
                      .padding = {0, 1}, .dilation = {1, 2}, .bias = false});
  mt::Conv2dOptions sopt;
  sopt.stride[0] = 2;
  sopt.padding[1] = 1;
  sopt.dilation[1] = 2;
  BOOST_TEST(!strided.bias.defined());
  expect_close(strided(x), mt::conv2d(x, strided.weight, {}, sopt), kExact, "Conv2d, stride, padding, dilation");
  mt::Pool2dOptions popt;
  popt.kernel_size[0] = popt.kernel_size[1] = 3;
  popt.stride[0] = popt.stride[1] = 2;
  popt.padding[0] = popt.padding[1] = 1;
  expect_close(nn::MaxPool2d(3, 2, 1)(x), mt::max_pool2d(x, popt), kExact, "MaxPool2d");
  expect_close(nn::AvgPool2d(3, 2, 1)(x), mt::avg_pool2d(x, popt), kExact, "AvgPool2d");
  BOOST_TEST(nn::MaxPool2d(2)(x).shape() == (mt::Shape{2, 3, 4, 4}));  // stride = kernel_size
  expect_close(nn::ReLU()(x), mt::relu(x), kExact, "ReLU");
  expect_close(nn::GELU()(x), mt::gelu(x), kExact, "GELU");
  expect_close(nn::GELU("tanh")(x), mt::gelu(x, "tanh"), kExact, "GELU tanh");
  expect_close(nn::Tanh()(x), mt::tanh(x), kExact, "Tanh");
  expect_close(nn::Sigmoid()(x), mt::sigmoid(x), kExact, "Sigmoid");
  nn::LayerNorm ln(8);
  expect_close(ln(x), mt::layer_norm(x, {8}), kExact, "LayerNorm");
  nn::Linear lin(8, 5);
  expect_close(lin(x), mt::linear(x, lin.weight, lin.bias), kExact, "Linear over the last dim");
  // Flatten.
  BOOST_TEST(nn::Flatten()(x).shape() == (mt::Shape{2, 192}));
  BOOST_TEST(nn::Flatten(0, -1)(x).shape() == (mt::Shape{384}));
  BOOST_TEST(nn::Flatten(1, 2)(x).shape() == (mt::Shape{2, 24, 8}));
  BOOST_TEST(nn::Flatten(-2)(x).shape() == (mt::Shape{2, 3, 64}));
  expect_close(nn::Flatten()(x), x.reshape({2, 192}), kExact, "Flatten values");
}

BOOST_AUTO_TEST_CASE(dropout_follows_the_mode, MT_CPU_TEST) {
  mt::manual_seed(8);
  nn::Dropout drop(0.5);
  const Tensor x = mt::ones({10000});
  const auto y = drop(x).to_vector<double>();
  int zeros = 0;
  for (double v : y) {
    BOOST_TEST((v == 0.0 || v == 2.0));  // dropped, or kept and scaled by 1/(1 − p)
    zeros += v == 0.0;
  }
  BOOST_TEST(zeros > 4700);
  BOOST_TEST(zeros < 5300);
  drop.eval();
  BOOST_TEST(drop(x).is_same(x));  // the identity in eval mode
  // In a model: eval() reaches it.
  nn::Sequential seq{nn::Dropout(0.9)};
  seq.eval();
  expect_close(seq(x), x, kExact, "Dropout in an eval model");
  seq.train();
  BOOST_TEST(mt::sum(seq(x)).item<double>() != 10000.0);
}

BOOST_AUTO_TEST_CASE(batch_norm_running_statistics, MT_CPU_TEST) {
  // Two batches of x (4, 2); hand-computed statistics: channel c's mean, its biased and unbiased variance.
  const Tensor x1 = mt::from_vector<float>({1, 10, 2, 10, 3, 10, 4, 14}, {4, 2});
  const Tensor x2 = mt::from_vector<float>({0, -1, 0, 1, 4, -1, 4, 1}, {4, 2});
  const double m1[] = {2.5, 11}, u1[] = {1.25 * 4 / 3, 3.0 * 4 / 3};
  const double m2[] = {2, 0}, u2[] = {4.0 * 4 / 3, 1.0 * 4 / 3};
  const mt::test::Tolerance f32 = tolerance(mt::kF32);

  nn::BatchNorm1d bn(2);  // momentum 0.1
  const Tensor y1 = bn(x1);
  expect_values(bn.running_mean, {0.1 * m1[0], 0.1 * m1[1]}, f32, "running_mean after 1 batch");
  expect_values(bn.running_var, {0.9 + 0.1 * u1[0], 0.9 + 0.1 * u1[1]}, f32, "running_var after 1 batch");
  // The output is normalised with the biased variance.
  BOOST_TEST(y1.at<float>({3, 1}) == 3 / std::sqrt(3 + 1e-5), tt::tolerance(1e-5));
  bn(x2);
  const double rm0 = 0.9 * 0.1 * m1[0] + 0.1 * m2[0], rv1 = 0.9 * (0.9 + 0.1 * u1[1]) + 0.1 * u2[1];
  BOOST_TEST(bn.running_mean.at<float>({0}) == rm0, tt::tolerance(1e-6));
  BOOST_TEST(bn.running_var.at<float>({1}) == rv1, tt::tolerance(1e-6));
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 2);

  // momentum None: the cumulative average of the batches' statistics.
  nn::BatchNorm1d avg(2, 1e-5, std::nullopt);
  avg(x1);
  expect_values(avg.running_mean, {m1[0], m1[1]}, f32, "cumulative running_mean after 1 batch");
  expect_values(avg.running_var, {u1[0], u1[1]}, f32, "cumulative running_var after 1 batch");
  avg(x2);
  expect_values(avg.running_mean, {(m1[0] + m2[0]) / 2, (m1[1] + m2[1]) / 2}, f32, "cumulative running_mean");
  expect_values(avg.running_var, {(u1[0] + u2[0]) / 2, (u1[1] + u2[1]) / 2}, f32, "cumulative running_var");

  // eval: the running statistics, nothing updated or counted.
  bn.eval();
  const std::vector<double> rm = bn.running_mean.to_vector<double>(), rv = bn.running_var.to_vector<double>();
  const Tensor ye = bn(x1);
  BOOST_TEST(ye.at<float>({3, 1}) == (14 - rm[1]) / std::sqrt(rv[1] + 1e-5), tt::tolerance(1e-5));
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 2);
  expect_values(bn.running_mean, rm, kExact, "eval leaves running_mean");

  // buffers() are named_buffers()' tensors, the layer's own handles; reset_running_stats() empties them in place.
  const std::vector<Tensor> buffers = bn.buffers();
  BOOST_TEST_REQUIRE(buffers.size() == 3u);
  BOOST_TEST(buffers[0].is_same(bn.running_mean));
  BOOST_TEST(buffers[1].is_same(bn.running_var));
  BOOST_TEST(buffers[2].is_same(bn.num_batches_tracked));
  const std::vector<double> weight = bn.weight.to_vector<double>();
  bn.reset_running_stats();
  expect_values(bn.running_mean, {0, 0}, kExact, "reset running_mean");
  expect_values(bn.running_var, {1, 1}, kExact, "reset running_var");
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 0);
  BOOST_TEST(bn.running_mean.is_same(buffers[0]), "reset in place: the handles stay");
  expect_values(bn.weight, weight, kExact, "reset leaves the affine parameters");

  // track_running_stats = false: no buffers, the batch's statistics in both modes.
  nn::BatchNorm1d plain(2, 1e-5, 0.1, true, false);
  BOOST_TEST(plain.named_buffers().empty());
  BOOST_TEST(plain.buffers().empty());
  plain.reset_running_stats();  // nothing to reset, as in PyTorch
  BOOST_TEST(plain.state_dict().keys() == (std::vector<std::string>{"weight", "bias"}), tt::per_element());
  plain.eval();
  expect_close(plain(x1), y1, f32, "track_running_stats=false uses the batch in eval");

  // BatchNorm2d over (N, C, H, W), and 3-D input for BatchNorm1d (N, C, L): statistics over N and the rest.
  mt::manual_seed(9);
  const Tensor x4 = mt::randn({4, 3, 5, 5});
  nn::BatchNorm2d bn2(3, 1e-5, 1.0, false);  // momentum 1: the running statistics become the batch's
  const Tensor y4 = bn2(x4);
  expect_close(bn2.running_mean, mt::mean(x4, {0, 2, 3}), {1e-5, 1e-6}, "BatchNorm2d running_mean");
  expect_close(mt::mean(y4, {0, 2, 3}), mt::zeros({3}), {0, 1e-5}, "BatchNorm2d output mean");
  BOOST_TEST(bn2.parameters().empty());
  nn::BatchNorm1d bn3(3, 1e-5, 1.0);
  bn3(x4.reshape({4, 3, 25}));
  expect_close(bn3.running_mean, bn2.running_mean, {1e-6, 1e-6}, "BatchNorm1d over (N, C, L)");
}

BOOST_AUTO_TEST_CASE(small_model_forward_backward, MT_CPU_TEST) {
  mt::manual_seed(10);
  Cnn net;
  const Tensor x = mt::randn({8, 1, 8, 8});
  const Tensor target = mt::randint(0, 10, {8});
  const Tensor loss = mt::cross_entropy(net.forward(x), target);
  loss.backward();
  for (const auto& [name, p] : net.named_parameters()) {
    BOOST_TEST_REQUIRE(p.grad().defined(), name << " has no gradient");
    BOOST_TEST(p.grad().shape() == p.shape(), name);
  }
  // The same computation written with the ops and the same parameters.
  mt::Conv2dOptions copt;
  copt.padding[0] = copt.padding[1] = 1;
  const Tensor h = mt::batch_norm(mt::conv2d(x, net.conv.weight, net.conv.bias, copt), Tensor(), Tensor(),
                                  net.bn.weight, net.bn.bias, true);
  const Tensor logits = mt::linear(mt::flatten(mt::max_pool2d(mt::relu(h)), 1), net.fc.weight, net.fc.bias);
  expect_close(loss, mt::cross_entropy(logits, target), kExact, "Cnn against the ops");
  // One SGD step down the gradient lowers the loss.
  {
    mt::autograd::NoGradGuard no_grad;
    for (const Tensor& p : net.parameters()) Tensor(p).copy_(mt::sub(p, mt::mul(p.grad(), 0.1)));
  }
  BOOST_TEST(mt::cross_entropy(net.forward(x), target).item<double>() < loss.item<double>());
}

BOOST_AUTO_TEST_CASE(constructor_errors, MT_CPU_TEST) {
  expect_error([] { nn::Linear(0, 5); }, {"Linear", "in_features", "0"});
  expect_error([] { nn::Linear(5, -1); }, {"Linear", "out_features", "-1"});
  expect_error([] { nn::Conv2d(3, 8, 0); }, {"Conv2d", "kernel_size"});
  expect_error([] { nn::Conv2d(0, 8, 3); }, {"Conv2d", "in_channels"});
  expect_error([] { nn::Conv2d(3, 8, 3, 0); }, {"Conv2d", "stride"});
  expect_error([] { nn::Conv2d(3, 8, 3, 1, -1); }, {"Conv2d", "padding"});
  expect_error([] { nn::MaxPool2d(2, 2, 2); }, {"MaxPool2d", "half", "padding=2", "kernel_size=2"});
  expect_error([] { nn::AvgPool2d(0); }, {"AvgPool2d", "kernel_size"});
  expect_error([] { nn::Dropout(1.5); }, {"Dropout", "between 0 and 1", "1.5"});
  expect_error([] { nn::GELU("fast"); }, {"GELU", "\"fast\""});
  expect_error([] { nn::LayerNorm(mt::Shape{4, 0}); }, {"LayerNorm", "normalized_shape"});
  expect_error([] { nn::BatchNorm2d(0); }, {"BatchNorm2d", "num_features"});
  expect_error([] { nn::BatchNorm1d(3, -1.0); }, {"BatchNorm1d", "eps"});
}

BOOST_AUTO_TEST_CASE(input_shape_errors_name_the_layer, MT_CPU_TEST) {
  expect_error([] { nn::Linear(784, 512)(mt::randn({2, 100})); }, {"Linear", "784", "[2, 100]"});
  expect_error([] { nn::Conv2d(3, 8, 3)(mt::randn({2, 1, 8, 8})); }, {"Conv2d", "(N, 3, H, W)", "[2, 1, 8, 8]"});
  expect_error([] { nn::Conv2d(3, 8, 3)(mt::randn({8, 8})); }, {"Conv2d", "[8, 8]"});
  expect_error([] { nn::MaxPool2d(2)(mt::randn({8, 8})); }, {"MaxPool2d", "[8, 8]"});
  expect_error([] { nn::AvgPool2d(2)(mt::randn({8})); }, {"AvgPool2d", "[8]"});
  expect_error([] { nn::LayerNorm(5)(mt::randn({2, 4})); }, {"LayerNorm", "[5]", "[2, 4]"});
  expect_error([] { nn::BatchNorm2d(3)(mt::randn({2, 3, 4})); }, {"BatchNorm2d", "4D", "[2, 3, 4]"});
  expect_error([] { nn::BatchNorm1d(3)(mt::randn({2, 3, 4, 5})); }, {"BatchNorm1d", "2D or 3D", "[2, 3, 4, 5]"});
  expect_error([] { nn::BatchNorm1d(3)(mt::randn({2, 4})); }, {"BatchNorm1d(3)", "3 channels", "[2, 4]"});
  expect_error([] { nn::BatchNorm1d(3)(mt::randn({1, 3})); }, {"batch_norm", "more than 1 value per channel"});
  expect_error([] { nn::Flatten(2)(mt::randn({4, 5})); }, {"Flatten", "[4, 5]"});
  expect_error([] { nn::Flatten(1, 0)(mt::randn({4, 5})); }, {"Flatten", "start_dim"});
  expect_error([] { nn::Linear(3, 2)(Tensor()); }, {"Linear", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_init)

BOOST_AUTO_TEST_CASE(gains, MT_CPU_TEST) {
  BOOST_TEST(nn::init::calculate_gain("linear") == 1.0);
  BOOST_TEST(nn::init::calculate_gain("conv2d") == 1.0);
  BOOST_TEST(nn::init::calculate_gain("sigmoid") == 1.0);
  BOOST_TEST(nn::init::calculate_gain("tanh") == 5.0 / 3.0);
  BOOST_TEST(nn::init::calculate_gain("relu") == std::sqrt(2.0));
  BOOST_TEST(nn::init::calculate_gain("leaky_relu") == std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  BOOST_TEST(nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)) == std::sqrt(2.0 / 6.0), tt::tolerance(1e-15));
  BOOST_TEST(nn::init::calculate_gain("selu") == 0.75);
  expect_error([] { nn::init::calculate_gain("swish"); }, {"calculate_gain", "\"swish\""});
  const auto [fan_in, fan_out] = nn::init::calculate_fan_in_and_fan_out(mt::empty({8, 3, 5, 5}));
  BOOST_TEST(fan_in == 75);
  BOOST_TEST(fan_out == 200);
  expect_error([] { nn::init::calculate_fan_in_and_fan_out(mt::empty({8})); }, {"fewer than 2", "[8]"});
}

BOOST_AUTO_TEST_CASE(initializer_statistics, MT_CPU_TEST) {
  // 256 × 512 = 131072 draws: the sample std is within ~0.4% (uniform) or ~0.2% (normal) of the true one at one
  // standard error; 2% is far outside sampling noise, yet catches a wrong gain or fan (√2, √3 or 2 apart).
  mt::manual_seed(11);
  const Tensor w = mt::empty({256, 512});
  {
    nn::init::kaiming_uniform_(w, 0.0, "fan_in", "relu");
    const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 512);
    const auto v = w.to_vector<double>();
    BOOST_TEST(max_abs(v) <= bound);
    BOOST_TEST(max_abs(v) > 0.999 * bound);
    BOOST_TEST(std_of(v) == bound / std::sqrt(3.0), tt::tolerance(0.02));
    BOOST_TEST(std::fabs(mean_of(v)) < 0.01 * bound);
  }
  {
    nn::init::kaiming_normal_(w, 0.0, "fan_out", "relu");
    const auto v = w.to_vector<double>();
    BOOST_TEST(std_of(v) == std::sqrt(2.0 / 256), tt::tolerance(0.02));
    BOOST_TEST(std::fabs(mean_of(v)) < 0.01 * std::sqrt(2.0 / 256));
  }
  {
    nn::init::kaiming_uniform_(w, std::sqrt(5.0));  // leaky_relu, fan_in: PyTorch's Linear default, U(±1/√fan_in)
    const auto v = w.to_vector<double>();
    BOOST_TEST(max_abs(v) <= 1 / std::sqrt(512.0));
    BOOST_TEST(max_abs(v) > 0.999 / std::sqrt(512.0));
  }
  {
    nn::init::xavier_uniform_(w, 2.0);
    const double bound = 2.0 * std::sqrt(6.0 / (256 + 512));
    const auto v = w.to_vector<double>();
    BOOST_TEST(max_abs(v) <= bound);
    BOOST_TEST(max_abs(v) > 0.999 * bound);
    BOOST_TEST(std_of(v) == bound / std::sqrt(3.0), tt::tolerance(0.02));
  }
  {
    nn::init::xavier_normal_(w, nn::init::calculate_gain("tanh"));
    const auto v = w.to_vector<double>();
    BOOST_TEST(std_of(v) == 5.0 / 3.0 * std::sqrt(2.0 / (256 + 512)), tt::tolerance(0.02));
  }
  {
    nn::init::normal_(w, 3.0, 0.5);
    const auto v = w.to_vector<double>();
    BOOST_TEST(mean_of(v) == 3.0, tt::tolerance(0.002));
    BOOST_TEST(std_of(v) == 0.5, tt::tolerance(0.02));
  }
  {
    nn::init::uniform_(w, -2.0, 1.0);
    const auto v = w.to_vector<double>();
    BOOST_TEST(*std::min_element(v.begin(), v.end()) >= -2.0);
    BOOST_TEST(*std::max_element(v.begin(), v.end()) < 1.0);
    BOOST_TEST(mean_of(v) == -0.5, tt::tolerance(0.02));
  }
  nn::init::constant_(w, 0.25);
  expect_values(w.slice(0, 0, 1), std::vector<double>(512, 0.25), kExact, "constant_");
  nn::init::ones_(w);
  BOOST_TEST(mt::sum(w).item<double>() == 131072.0);
  nn::init::zeros_(w);
  BOOST_TEST(mt::sum(w).item<double>() == 0.0);
  // f16 and bf16 tensors are filled in their dtype.
  const Tensor h = mt::empty({64, 64}, mt::kF16);
  nn::init::xavier_uniform_(h);
  BOOST_TEST(h.dtype() == mt::kF16);
  BOOST_TEST(max_abs(h.to_vector<double>()) <= std::sqrt(6.0 / 128) * (1 + 1e-3));
}

BOOST_AUTO_TEST_CASE(seeding_and_generators, MT_CPU_TEST) {
  const Tensor a = mt::empty({32, 16}), b = mt::empty({32, 16});
  mt::manual_seed(12);
  nn::init::kaiming_normal_(a);
  mt::manual_seed(12);
  nn::init::kaiming_normal_(b);
  expect_close(a, b, kExact, "the same seed, the same draw");
  nn::init::kaiming_normal_(b);
  BOOST_TEST(a.at<float>({0, 0}) != b.at<float>({0, 0}));  // the generator moved on
  // A given generator: reproducible on its own, and the default generator is left alone.
  mt::Generator g1(99), g2(99);
  const uint64_t offset = mt::default_generator().offset();
  nn::init::xavier_uniform_(a, 1.0, &g1);
  nn::init::xavier_uniform_(b, 1.0, &g2);
  expect_close(a, b, kExact, "the same generator seed, the same draw");
  BOOST_TEST(mt::default_generator().offset() == offset);
  BOOST_TEST(g1.offset() == 512u);
  // Parameters that require grad are filled in place (no tape entry).
  nn::Linear lin(4, 4);
  const Tensor w = lin.weight;
  nn::init::normal_(lin.weight, 0.0, 0.01, &g1);
  BOOST_TEST(lin.weight.is_same(w));
  BOOST_TEST(lin.weight.is_leaf());
  expect_error([] { nn::init::kaiming_uniform_(mt::empty({4, 4}), 0.0, "fan_avg"); }, {"kaiming_uniform_", "fan_avg"});
  expect_error([] { nn::init::kaiming_uniform_(mt::empty({4})); }, {"fewer than 2"});
  expect_error([] { nn::init::normal_(mt::empty({4}, mt::kI64)); }, {"normal_", "i64"});
  expect_error([] { nn::init::uniform_(mt::empty({4}), 1.0, 0.0); }, {"uniform_", "a <= b"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_gpu)

BOOST_AUTO_TEST_CASE(to_device_keeps_the_handles_and_matches_the_cpu, MT_GPU_TEST) {
  mt::manual_seed(13);
  Cnn cpu_net, gpu_net;
  gpu_net.load_state_dict(cpu_net.state_dict());
  const std::vector<Tensor> held = gpu_net.parameters();
  gpu_net.to(mt::Device::cuda());
  for (const auto& [name, t] : gpu_net.named_parameters()) BOOST_TEST(t.is_cuda(), name);
  for (const auto& [name, t] : gpu_net.named_buffers()) BOOST_TEST(t.is_cuda(), name);
  const auto params = gpu_net.parameters();
  for (size_t i = 0; i < params.size(); ++i) BOOST_TEST(params[i].is_same(held[i]));
  BOOST_TEST(gpu_net.conv.weight.is_same(held[0]));
  // Forward and backward on both devices agree (f32: within chained sums' tolerance).
  const Tensor x = mt::randn({8, 1, 8, 8});
  const Tensor target = mt::randint(0, 10, {8});
  const Tensor loss_cpu = mt::cross_entropy(cpu_net.forward(x), target);
  const Tensor loss_gpu = mt::cross_entropy(gpu_net.forward(x.cuda()), target.cuda());
  expect_close(loss_gpu, loss_cpu, {1e-4, 1e-5}, "Cnn loss, cuda vs cpu");
  loss_cpu.backward();
  loss_gpu.backward();
  const auto cpu_named = cpu_net.named_parameters(), gpu_named = gpu_net.named_parameters();
  for (size_t i = 0; i < cpu_named.size(); ++i)
    expect_close(gpu_named[i].second.grad(), cpu_named[i].second.grad(), {1e-3, 1e-5},
                 "gradient of " + cpu_named[i].first + ", cuda vs cpu");
  expect_close(gpu_net.bn.running_mean, cpu_net.bn.running_mean, {1e-5, 1e-6}, "running_mean, cuda vs cpu");
  expect_close(gpu_net.bn.running_var, cpu_net.bn.running_var, {1e-5, 1e-6}, "running_var, cuda vs cpu");
  // f16 on the device: statistics stay f32, the model runs in f16; and back to the CPU.
  gpu_net.to(mt::kF16);
  BOOST_TEST(gpu_net.bn.running_mean.dtype() == mt::kF32);
  BOOST_TEST(gpu_net.bn.running_mean.is_cuda());
  gpu_net.eval();
  BOOST_TEST(gpu_net.forward(x.cuda().to(mt::kF16)).dtype() == mt::kF16);
  gpu_net.to(mt::Device::cpu());
  BOOST_TEST(!held[0].is_cuda());
  BOOST_TEST(held[0].dtype() == mt::kF16);
}

BOOST_AUTO_TEST_CASE(state_dict_across_devices, MT_GPU_TEST) {
  mt::manual_seed(14);
  Net cpu_net, gpu_net;
  gpu_net.to(mt::Device::cuda());
  gpu_net.load_state_dict(cpu_net.state_dict());  // copied across devices
  BOOST_TEST(gpu_net.fc1.weight.is_cuda());
  expect_close(gpu_net.fc1.weight, cpu_net.fc1.weight, kExact, "loaded onto the GPU");
  const mt::StateDict back = gpu_net.state_dict();
  BOOST_TEST(back.at("fc2.bias").is_cuda());
  cpu_net.load_state_dict(back);
  expect_close(cpu_net.fc2.bias, gpu_net.fc2.bias, kExact, "loaded back onto the CPU");
}

BOOST_AUTO_TEST_SUITE_END()
