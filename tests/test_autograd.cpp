// tests/test_autograd.cpp — tape semantics: what is recorded, what backward
// walks, what it frees, and the errors of misuse.
#include <boost/test/unit_test.hpp>

#include <pthread.h>

#include <cmath>

#include <mixtape/mixtape.h>

#include "gradcheck.h"

namespace mt = mixtape;
namespace utf = boost::unit_test;
using boost::test_tools::per_element;

namespace {

std::vector<double> values(const mt::Tensor& t) { return t.to_vector<double>(); }

bool message_has(const mt::Error& e, const std::vector<std::string>& parts) {
  std::string m = e.what();
  for (const auto& p : parts)
    if (m.find(p) == std::string::npos) {
      BOOST_TEST_MESSAGE("missing '" << p << "' in: " << m);
      return false;
    }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(autograd, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(records_only_when_an_input_requires_grad) {
  mt::Tensor a = mt::randn({3});
  mt::Tensor b = mt::randn({3});
  mt::Tensor c = a * b;
  BOOST_TEST(!c.requires_grad());
  BOOST_TEST(c.is_leaf());
  a.requires_grad_();
  mt::Tensor d = a * b;
  BOOST_TEST(d.requires_grad());
  BOOST_TEST(!d.is_leaf());
  BOOST_TEST(std::string(d.grad_fn_name()) == "mul");
  mt::Tensor e = mt::sum(mt::relu(d));  // requires_grad propagates through every op
  BOOST_TEST(e.requires_grad());
  BOOST_TEST(std::string(e.grad_fn_name()) == "sum");
}

BOOST_AUTO_TEST_CASE(no_grad_guard_and_detach) {
  mt::Tensor a = mt::randn({3}).requires_grad_();
  int64_t before = mt::autograd::tape_size();
  {
    mt::autograd::NoGradGuard ng;
    BOOST_TEST(!mt::autograd::grad_enabled());
    mt::Tensor y = a * 2.0;
    BOOST_TEST(!y.requires_grad());
    BOOST_TEST(mt::autograd::tape_size() == before);
  }
  BOOST_TEST(mt::autograd::grad_enabled());
  {  // Nested guards: leaving the inner one restores the outer one's state, off; leaving that, on.
    mt::autograd::NoGradGuard outer;
    { mt::autograd::NoGradGuard inner; }
    BOOST_TEST(!mt::autograd::grad_enabled());
    BOOST_TEST(!(a * 2.0).requires_grad());
    BOOST_TEST(mt::autograd::tape_size() == before);
  }
  BOOST_TEST(mt::autograd::grad_enabled());
  mt::Tensor d = (a * 2.0).detach();
  BOOST_TEST(!d.requires_grad());
  BOOST_TEST(d.is_leaf());
  BOOST_TEST(d.storage() != nullptr);
  // The same data, not a copy (PyTorch's detach): the same storage, viewed the same way.
  const mt::Tensor t = mt::randn({2, 3}).t();
  BOOST_TEST(a.detach().storage() == a.storage());
  BOOST_TEST(t.detach().storage() == t.storage());
  BOOST_TEST(t.detach().strides() == t.strides());
}

BOOST_AUTO_TEST_CASE(backward_of_several_outputs_adds_their_gradients) {
  // autograd::backward({y1, y2}, {g1, g2}): d(g1·y1 + g2·y2)/dx, as torch.autograd.backward.
  mt::Tensor x = mt::tensor({1.0, 2.0}).requires_grad_();
  mt::Tensor h = x * x;                 // shared by both outputs
  mt::Tensor y1 = mt::sum(h), y2 = h * 3.0;
  mt::autograd::backward({y1, y2}, {mt::Tensor(), mt::tensor({1.0, 10.0})});  // y1 one element: its gradient 1
  BOOST_TEST(values(x.grad()) == std::vector<double>({2 * 1 + 3 * 1 * 2 * 1, 2 * 2 + 3 * 10 * 2 * 2}), per_element());
  mt::Tensor z = mt::sum(x * x);
  BOOST_CHECK_EXCEPTION(mt::autograd::backward({z, z}, {mt::Tensor()}), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"1 gradients for 2 outputs"}); });
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_into_leaves) {
  mt::Tensor x = mt::tensor({1.0, 2.0, 3.0}).requires_grad_();
  mt::Tensor y = mt::sum(x * x);  // dy/dx = 2x
  y.backward();
  BOOST_TEST(values(x.grad()) == std::vector<double>({2, 4, 6}), per_element());
  BOOST_TEST(x.grad().dtype() == mt::kF64);
  mt::sum(x * 3.0).backward();  // accumulates
  BOOST_TEST(values(x.grad()) == std::vector<double>({5, 7, 9}), per_element());
  x.set_grad({});
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_CASE(a_tensor_used_twice_gets_both_gradients) {
  mt::Tensor x = mt::tensor({2.0f}).requires_grad_();
  mt::Tensor y = x * x + x;  // dy/dx = 2x + 1 = 5
  mt::sum(y).backward();
  BOOST_TEST(x.grad().item<float>() == 5.0f);
}

BOOST_AUTO_TEST_CASE(backward_walks_only_what_leads_to_the_output) {
  mt::Tensor a = mt::randn({4}).requires_grad_();
  mt::Tensor b = mt::randn({4}).requires_grad_();
  mt::Tensor used = mt::sum(a * 2.0);
  mt::Tensor unused = mt::sum(b * 3.0);
  used.backward();
  BOOST_TEST(a.grad().defined());
  BOOST_TEST(!b.grad().defined());
  unused.backward();  // its graph was untouched by the first backward
  BOOST_TEST(values(b.grad()) == std::vector<double>(4, 3.0), per_element());
}

BOOST_AUTO_TEST_CASE(explicit_gradient_for_non_scalar_outputs) {
  mt::Tensor x = mt::tensor({1.0, 2.0}).requires_grad_();
  mt::Tensor y = x * 3.0;
  BOOST_CHECK_EXCEPTION(y.backward(), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"backward", "one-element", "[2]"}); });
  y.backward(mt::tensor({1.0, 10.0}));
  BOOST_TEST(values(x.grad()) == std::vector<double>({3, 30}), per_element());
}

BOOST_AUTO_TEST_CASE(second_backward_over_freed_nodes_throws) {
  mt::Tensor x = mt::randn({3}).requires_grad_();
  mt::Tensor y = mt::sum(mt::exp(x));
  y.backward();
  BOOST_CHECK_EXCEPTION(y.backward(), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"second time", "retain_graph"});
  });
}

BOOST_AUTO_TEST_CASE(retain_graph_keeps_nodes) {
  mt::Tensor x = mt::tensor({1.0, 2.0}).requires_grad_();
  mt::Tensor y = mt::sum(mt::exp(x));
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  std::vector<double> g = values(x.grad());
  BOOST_TEST(g[0] == 2 * std::exp(1.0), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(g[1] == 2 * std::exp(2.0), boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(saved_tensors_are_freed_after_backward) {
  mt::Tensor w = mt::randn({256, 256}).requires_grad_();
  mt::Tensor x = mt::randn({64, 256});
  int64_t leaves = mt::cpu_memory_stats().allocated_bytes;
  mt::Tensor loss;
  {
    mt::Tensor h = x;
    for (int i = 0; i < 4; ++i) h = mt::tanh(mt::matmul(h, w));  // each layer saves a (64, 256) activation
    loss = mt::sum(h);
  }
  int64_t with_graph = mt::cpu_memory_stats().allocated_bytes;
  BOOST_TEST(with_graph >= leaves + 4 * 64 * 256 * 4);
  loss.backward();
  int64_t after = mt::cpu_memory_stats().allocated_bytes;
  // What remains: the leaves, w's gradient and the 0-D loss.
  int64_t expected = leaves + 256 * 256 * 4 + 4;
  BOOST_TEST(after <= expected + 64);
  BOOST_TEST(mt::autograd::tape_size() >= 1);  // loss still holds its (now empty) node chain
  loss = mt::Tensor();
  BOOST_TEST(mt::cpu_memory_stats().allocated_bytes <= expected - 4 + 64);
}

// A linear layer then relu, as every MNIST model has: the matmul keeps its input, relu its output (as PyTorch's),
// so the pre-activation dies with its handle and only relu's output stays for the next layer. Keeping relu's input
// held one (64, 256) activation more a layer.
BOOST_AUTO_TEST_CASE(relu_keeps_its_output_and_lets_its_input_go) {
  const mt::Tensor x = mt::randn({64, 256});
  mt::Tensor w = mt::randn({256, 256}).requires_grad_();
  mt::Tensor h = mt::matmul(x, w);  // (64, 256) f32: 64 KiB
  mt::Tensor y = mt::relu(h);
  const int64_t both = mt::cpu_memory_stats().allocated_bytes;
  h = mt::Tensor();
  BOOST_TEST(mt::cpu_memory_stats().allocated_bytes == both - 64 * 256 * 4);
  mt::sum(y).backward();  // dL/dw = xᵀ · [h > 0], the mask read from the kept output
  const mt::Tensor mask = mt::gt(y.detach(), mt::zeros_like(y)).to(mt::kF32);
  BOOST_TEST(values(w.grad()) == values(mt::matmul(x.t(), mask)), boost::test_tools::tolerance(1e-5) << per_element());
}

BOOST_AUTO_TEST_CASE(tape_size_drops_when_outputs_die) {
  mt::Tensor x = mt::randn({3}).requires_grad_();
  int64_t before = mt::autograd::tape_size();
  {
    mt::Tensor y = mt::sigmoid(mt::exp(x));
    BOOST_TEST(mt::autograd::tape_size() == before + 2);
  }
  BOOST_TEST(mt::autograd::tape_size() == before);
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_saved_tensor_throws) {
  mt::Tensor w = mt::randn({3}).requires_grad_();
  mt::Tensor x = mt::randn({3});
  mt::Tensor y = mt::sum(w * x);  // mul saves x for w's gradient
  x.fill_(2.0);
  BOOST_CHECK_EXCEPTION(y.backward(), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"mul", "modified in place", "version 1", "saved at version 0"});
  });
}

BOOST_AUTO_TEST_CASE(in_place_on_a_tensor_that_requires_grad_throws) {
  mt::Tensor w = mt::randn({3}).requires_grad_();
  BOOST_CHECK_EXCEPTION(w.fill_(0.0), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"fill_", "requires grad", "NoGradGuard"});
  });
  BOOST_CHECK_EXCEPTION(w.copy_(mt::ones({3})), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"copy_", "requires grad", "[3]", "NoGradGuard"});
  });
  BOOST_CHECK_EXCEPTION(w.set({1}, 5.0), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"set", "requires grad", "[3]", "NoGradGuard"});
  });
  BOOST_TEST(w.version() == 0u, "a refused write leaves the tensor alone");
  mt::autograd::NoGradGuard ng;
  w.fill_(1.0);  // what an optimizer does
  BOOST_TEST(w.at<float>({0}) == 1.0f);
  w.copy_(mt::full({3}, 2.0));  // what loading a checkpoint does
  BOOST_TEST(w.at<float>({2}) == 2.0f);
  w.set({1}, 5.0);
  BOOST_TEST(w.at<float>({1}) == 5.0f);
  BOOST_TEST(w.version() == 3u, "each of the three writes counts once");
}

BOOST_AUTO_TEST_CASE(functional_grad) {
  mt::Tensor x = mt::tensor({1.0, 2.0}).requires_grad_();
  mt::Tensor z = mt::tensor({5.0}).requires_grad_();
  mt::Tensor h = x * x;
  mt::Tensor y = mt::sum(h * 3.0);
  auto g = mt::autograd::grad({y}, {x, h}, {}, /*retain_graph=*/true);
  BOOST_TEST(values(g[0]) == std::vector<double>({6, 12}), per_element());
  BOOST_TEST(values(g[1]) == std::vector<double>({3, 3}), per_element());
  BOOST_TEST(!x.grad().defined());  // grad() does not accumulate
  BOOST_CHECK_EXCEPTION(mt::autograd::grad({y}, {z}, {}, true), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"grad", "not used", "allow_unused"}); });
  auto u = mt::autograd::grad({y}, {z}, {}, false, /*allow_unused=*/true);
  BOOST_TEST(!u[0].defined());
}

BOOST_AUTO_TEST_CASE(requires_grad_rules) {
  BOOST_CHECK_EXCEPTION(mt::arange(3).requires_grad_(), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"requires_grad_", "floating", "i64"}); });
  mt::Tensor x = mt::randn({2}).requires_grad_();
  mt::Tensor y = x * 2.0;
  BOOST_CHECK_EXCEPTION(y.requires_grad_(false), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"leaf", "mul_scalar"}); });
  mt::Tensor z = mt::zeros({2});
  BOOST_CHECK_EXCEPTION(z.backward(), mt::Error,
                        [](const mt::Error& e) { return message_has(e, {"does not require grad"}); });
}

BOOST_AUTO_TEST_CASE(views_are_differentiable) {
  mt::Tensor x = mt::randn({2, 3}, mt::kF64).requires_grad_();
  mt::Tensor y = mt::sum(x.t().reshape({6}).slice(0, 1, 6, 2)) + mt::sum(x.select(1, 2)) +
                 mt::sum(x.unsqueeze(0).expand({4, 2, 3}));
  y.backward();
  // slice picks x^T flat [1], [3], [5] = x[1][0], x[1][1], x[1][2]; select adds column 2; expand adds 4.
  std::vector<double> expected = {4, 4, 5, 5, 5, 6};
  BOOST_TEST(values(x.grad()) == expected, per_element());
}

BOOST_AUTO_TEST_CASE(a_cast_gradient_arrives_in_the_source_dtype) {
  mt::Tensor w = mt::randn({4}).requires_grad_();  // f32 master weight
  mt::Tensor y = mt::sum(w.to(mt::kF16) * 2.0);
  y.backward();
  BOOST_TEST(w.grad().dtype() == mt::kF32);
  BOOST_TEST(values(w.grad()) == std::vector<double>(4, 2.0), per_element());
}

BOOST_AUTO_TEST_CASE(a_gradient_arrives_in_its_leafs_dtype) {
  // layer_norm with an f16 weight and an f32 bias computes its parameter gradients together; each must reach its
  // leaf in that leaf's dtype (the bias's once arrived in f16, the weight's dtype).
  mt::manual_seed(3);
  mt::Tensor x = mt::randn({2, 4}).requires_grad_();
  mt::Tensor w = mt::randn({4}).to(mt::kF16).requires_grad_();
  mt::Tensor b = mt::randn({4}).requires_grad_();
  mt::sum(mt::layer_norm(x, {4}, w, b)).backward();
  BOOST_TEST(x.grad().dtype() == mt::kF32);
  BOOST_TEST(w.grad().dtype() == mt::kF16);
  BOOST_TEST(b.grad().dtype() == mt::kF32);
  BOOST_TEST(b.grad().to_vector<float>() == std::vector<float>(4, 2.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_chain_of_a_million_ops_runs_and_dies_on_a_small_stack) {
  // Backward through, and destruction of, a graph of 10^6 nodes on a thread with a 1 MiB stack: neither may
  // recurse per node (a recursive destructor overflowed such a stack at ~10^4 nodes).
  constexpr int kOps = 1'000'000;
  struct Result {
    double grad = 0;
    int64_t live_after = -1;
    std::string error;
  } result;
  auto body = [](void* arg) -> void* {
    auto* r = static_cast<Result*>(arg);
    try {
      mt::Tensor x = mt::ones({1}).requires_grad_();
      {
        mt::Tensor y = x;
        for (int i = 0; i < kOps; ++i) y = y * 1.0;
        y.backward();
      }  // the graph dies here (backward freed the saved tensors, not the nodes)
      {
        mt::Tensor y = x;
        for (int i = 0; i < kOps; ++i) y = y + 0.0;
      }  // never backpropagated: the whole chain dies with y
      r->grad = x.grad().item<float>();
      r->live_after = mt::autograd::tape_size();
    } catch (const std::exception& e) {
      r->error = e.what();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_t thread;
  BOOST_TEST_REQUIRE(pthread_create(&thread, &attr, body, &result) == 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  BOOST_TEST(result.error.empty(), result.error);
  BOOST_TEST(result.grad == 1.0);
  BOOST_TEST(result.live_after == 0);
}

// ---- issue 16 item 12: a non-leaf used by several ops, seeds of another dtype, reused intermediates -----------

BOOST_AUTO_TEST_CASE(a_non_leaf_used_by_several_ops_gets_every_gradient) {
  // h = x·w feeds relu, mul(h, h), a sum and a product with that sum, at different depths of the graph: h's node
  // must run once, after all four contributions are added (a node run early, or an arrival that overwrites the
  // sum so far, loses some). In f64, |h| >= 0.2 (away from relu's kink).
  const std::vector<double> xv = {0.5, -1.0, 1.5, -0.7, 1.2, 0.8, -0.6, 1.1, -1.3, 0.9, 0.6, -1.4};
  const std::vector<double> wv = {0.4, -1.2, 0.7, 1.0};
  mt::Tensor x = mt::from_vector(xv, {3, 4}, mt::kF64).requires_grad_();
  mt::Tensor w = mt::from_vector(wv, {4}, mt::kF64).requires_grad_();
  mt::Tensor h = x * w;
  mt::Tensor s = mt::sum(h);
  mt::Tensor loss = mt::sum(mt::relu(h)) + mt::sum(h * h) + s * s + mt::sum(h * 3.0);
  loss.backward();
  // dloss/dh = [h > 0] + 2h + 2·sum(h) + 3; dx = dh·w, dw = Σ_rows dh·x.
  double sum_h = 0;
  for (size_t i = 0; i < xv.size(); ++i) sum_h += xv[i] * wv[i % 4];
  std::vector<double> dx(12), dw(4, 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const double hv = xv[i] * wv[i % 4], dh = (hv > 0 ? 1.0 : 0.0) + 2 * hv + 2 * sum_h + 3;
    dx[i] = dh * wv[i % 4];
    dw[i % 4] += dh * xv[i];
  }
  const std::vector<double> got_dx = values(x.grad()), got_dw = values(w.grad());
  for (size_t i = 0; i < dx.size(); ++i) BOOST_TEST(got_dx[i] == dx[i], boost::test_tools::tolerance(1e-12));
  for (size_t j = 0; j < dw.size(); ++j) BOOST_TEST(got_dw[j] == dw[j], boost::test_tools::tolerance(1e-12));
  // The same graph against float64 central differences (the sum enters as a broadcast product).
  BOOST_TEST(mt::test::gradcheck(
      "h = x*w used by relu, mul(h, h), sum(h)*h",
      [](const std::vector<mt::Tensor>& in) {
        mt::Tensor hh = in[0] * in[1];
        return mt::relu(hh) + hh * hh + mt::sum(hh) * hh + hh * 3.0;
      },
      {mt::from_vector(xv, {3, 4}, mt::kF64), mt::from_vector(wv, {4}, mt::kF64)}));
}

BOOST_AUTO_TEST_CASE(a_seed_of_another_dtype_is_cast_to_the_outputs_dtype_first) {
  // autograd/engine.cpp's rule, and PyTorch's: the gradient given for an output is cast to that output's dtype
  // before anything flows; each leaf's gradient arrives in the leaf's dtype.
  // f16 output, f32 seed: 1e5 is beyond f16, so the cast seed is inf and so is the gradient, although 0.5·1e5
  // would fit (PyTorch 1.13 gives the same [inf, 1.5]).
  mt::Tensor x = mt::tensor({1.0f, 2.0f}).requires_grad_();
  mt::Tensor y = x.to(mt::kF16) * 0.5;
  BOOST_TEST(y.dtype() == mt::kF16);
  y.backward(mt::tensor({1e5f, 3.0f}));
  BOOST_TEST(x.grad().dtype() == mt::kF32);
  BOOST_TEST(std::isinf(values(x.grad())[0]));
  BOOST_TEST(values(x.grad())[1] == 1.5);
  // f32 output, f16 seed: the backward computes in f32, 1·0.1 = 0.1f, not in f16 (0.0999755859375).
  mt::Tensor z = mt::tensor({1.0f}).requires_grad_();
  (z * 0.1).backward(mt::ones({1}, mt::kF16));
  BOOST_TEST(z.grad().dtype() == mt::kF32);
  BOOST_TEST(z.grad().item<float>() == 0.1f);
  // A leaf that is itself the output: its gradient is the seed in the leaf's dtype.
  mt::Tensor l = mt::ones({2}, mt::kF16).requires_grad_();
  l.backward(mt::tensor({1.0, 0.1}));
  BOOST_TEST(l.grad().dtype() == mt::kF16);
  BOOST_TEST(values(l.grad())[1] == static_cast<double>(static_cast<float>(mt::Half(0.1))));
  // The functional form: the same rule, results in the inputs' dtypes.
  mt::Tensor x2 = mt::tensor({1.0f, 2.0f}).requires_grad_();
  auto g = mt::autograd::grad({x2.to(mt::kF16) * 0.5}, {x2}, {mt::tensor({1e5f, 3.0f})});
  BOOST_TEST(g[0].dtype() == mt::kF32);
  BOOST_TEST(std::isinf(values(g[0])[0]));
}

BOOST_AUTO_TEST_CASE(backward_neither_changes_nor_aliases_its_seed) {
  // A leaf's .grad() is its own tensor: the first gradient is copied in, not aliased (add_scalar's backward passes
  // the seed through untouched), so accumulating a second backward into it leaves the first seed alone.
  mt::Tensor x = mt::tensor({1.0, 2.0}).requires_grad_();
  mt::Tensor seed1 = mt::tensor({1.0, 10.0}), seed2 = mt::tensor({100.0, 1000.0});
  (x + 0.0).backward(seed1);
  (x + 0.0).backward(seed2);
  BOOST_TEST(values(x.grad()) == std::vector<double>({101, 1010}), per_element());
  BOOST_TEST(values(seed1) == std::vector<double>({1, 10}), per_element());
  BOOST_TEST(values(seed2) == std::vector<double>({100, 1000}), per_element());
  // The same with the leaf as the output.
  mt::Tensor l = mt::tensor({1.0, 2.0}).requires_grad_();
  l.backward(seed1);
  l.backward(seed2);
  BOOST_TEST(values(l.grad()) == std::vector<double>({101, 1010}), per_element());
  BOOST_TEST(values(seed1) == std::vector<double>({1, 10}), per_element());
}

BOOST_AUTO_TEST_CASE(gradcheck_through_reused_intermediates) {
  using In = std::vector<mt::Tensor>;
  mt::manual_seed(41);
  // An op whose two inputs are one tensor: each backward term lands on the same place.
  BOOST_TEST(mt::test::gradcheck("mul(a, a)", [](const In& in) { return mt::mul(in[0], in[0]); }, {mt::randn({3, 4})}));
  BOOST_TEST(mt::test::gradcheck("matmul(a, a^T)", [](const In& in) { return mt::matmul(in[0], in[0].t()); },
                                 {mt::randn({3, 4})}));
  BOOST_TEST(mt::test::gradcheck("div(a, exp(a)) - a", [](const In& in) {
    return mt::sub(mt::div(in[0], mt::exp(in[0])), in[0]);
  }, {mt::randn({5})}));
  // One intermediate, several branches through the normalising ops.
  BOOST_TEST(mt::test::gradcheck(
      "h = tanh(a b) into softmax, log_softmax, layer_norm and h itself",
      [](const In& in) {
        mt::Tensor h = mt::tanh(mt::matmul(in[0], in[1]));
        return mt::softmax(h, 1) * h + mt::log_softmax(h, 0) * mt::sigmoid(h) + mt::layer_norm(h + h * h, {5});
      },
      {mt::randn({3, 4}), mt::randn({4, 5})}));
  // A conv's output pooled and reused: conv2d and max_pool2d backward through shared tensors.
  BOOST_TEST(mt::test::gradcheck(
      "c = conv2d(x, w) into max_pool2d(c) and c * c",
      [](const In& in) {
        mt::Tensor c = mt::conv2d(in[0], in[1]);
        return mt::sum(mt::max_pool2d(c)) + mt::sum(c * c);
      },
      {mt::randn({1, 2, 5, 5}), mt::randn({2, 2, 2, 2})}));
}

BOOST_AUTO_TEST_CASE(an_f16_broadcast_gradient_is_summed_in_f32_and_rounded_once) {
  // b (1) broadcast over a (1024), all f16: db = Σ dy·a. Each product 2^-13 · 2^-13 = 2^-26 is below half of f16's
  // least subnormal (2^-24) and rounds to 0 on its own; kept in f32 and summed, they make 2^-16, an f16 value.
  const double tiny = std::ldexp(1.0, -13);
  mt::Tensor a = mt::full({1024}, tiny, mt::kF16);
  mt::Tensor b = mt::ones({1}, mt::kF16).requires_grad_();
  (a * b).backward(mt::full({1024}, tiny, mt::kF16));
  BOOST_TEST(b.grad().dtype() == mt::kF16);
  BOOST_TEST(values(b.grad())[0] == std::ldexp(1.0, -16));
}

BOOST_AUTO_TEST_SUITE_END()
