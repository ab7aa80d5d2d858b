// tests/test_autocast.cpp — per-op precision rules under f16 and bf16, the
// category table and its overrides, the cast cache and the precision trace.
#include <boost/test/unit_test.hpp>

#include <thread>

#include <mixtape/autograd/function.h>
#include <mixtape/mixtape.h>

#include "gradcheck.h"
#include "test_util.h"

namespace mt = mixtape;
namespace utf = boost::unit_test;
using mt::Precision;

namespace {

bool message_has(const mt::Error& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

int count(const mt::autograd::PrecisionTrace& trace, const std::string& op) {
  int n = 0;
  for (const auto& e : trace.entries()) n += e.op == op;
  return n;
}

/// An op whose forward calls other ops, as a contributor may write one: y = exp(−exp(a·b)), fp32. Those ops are its
/// implementation (autograd/function.h): not autocast, not recorded, not traced, not checked by anomaly mode. What
/// the matmul inside returns goes where `seen` points, for the test to look at (a pointer, not a static tensor,
/// which would outlive the allocator at exit).
struct ExpNegExpOfProduct {
  static constexpr const char* kName = "test_exp_neg_exp_of_product";
  static constexpr Precision kPrecision = Precision::kFp32;
  using Ctx = mt::autograd::Ctx;
  static inline mt::Tensor* seen = nullptr;
  static mt::Tensor forward(Ctx& ctx, const mt::Tensor& a, const mt::Tensor& b) {
    const mt::Tensor ab = mt::matmul(a, b);
    if (seen) *seen = ab;
    const mt::Tensor e = mt::exp(ab), y = mt::exp(-e);
    ctx.save_for_backward(a, b, y, e);
    return y;
  }
  static mt::autograd::Grads backward(Ctx& ctx, const mt::Tensor& dy) {  // dy·y·(−exp(a·b)) through the product
    const mt::Tensor a = ctx.saved(0), b = ctx.saved(1);
    const mt::Tensor g = -(dy * ctx.saved(2) * ctx.saved(3));
    return {mt::matmul(g, b.t()), mt::matmul(a.t(), g)};
  }
};

/// linear(relu(x_leaf), w) under autocast to `low`: a layer whose input needs a gradient, so it saves w's copy.
mt::Tensor linear_of_an_activation(mt::DType low, const mt::Tensor& x_leaf, const mt::Tensor& w) {
  mt::amp::Autocast ac(low);
  return mt::linear(mt::relu(x_leaf), w);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(autocast, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(output_dtype_per_category) {
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    BOOST_TEST_CONTEXT("autocast " << low) {
      mt::Tensor a = mt::randn({4, 8}), b = mt::randn({8, 3}), h = mt::randn({4, 3}, low);
      mt::amp::Autocast ac(low);
      BOOST_TEST(mt::amp::is_autocast_enabled());
      // lower precision: f32 inputs run in the autocast dtype
      BOOST_TEST(mt::matmul(a, b).dtype() == low);
      BOOST_TEST(mt::linear(a, b.t()).dtype() == low);
      // fp32: low-precision inputs run in f32
      BOOST_TEST(mt::softmax(h, 1).dtype() == mt::kF32);
      BOOST_TEST(mt::log_softmax(h, 1).dtype() == mt::kF32);
      BOOST_TEST(mt::exp(h).dtype() == mt::kF32);
      BOOST_TEST(mt::sum(h).dtype() == mt::kF32);
      BOOST_TEST(mt::cross_entropy(h, mt::tensor<int64_t>({0, 1, 2, 0})).dtype() == mt::kF32);
      // promote: the widest input wins
      BOOST_TEST(mt::add(h, mt::randn({4, 3})).dtype() == mt::kF32);
      BOOST_TEST(mt::mul(h, h).dtype() == low);
      // passthrough: unchanged
      BOOST_TEST(mt::relu(h).dtype() == low);
      BOOST_TEST(mt::relu(a).dtype() == mt::kF32);
      BOOST_TEST(h.reshape({12}).dtype() == low);
      // f64 is never autocast (PyTorch's rule)
      BOOST_TEST(mt::matmul(a.to(mt::kF64), b.to(mt::kF64)).dtype() == mt::kF64);
    }
  }
  // Outside a region nothing changes dtype.
  BOOST_TEST(!mt::amp::is_autocast_enabled());
  BOOST_TEST(mt::matmul(mt::randn({2, 2}), mt::randn({2, 2})).dtype() == mt::kF32);
  BOOST_TEST(mt::exp(mt::randn({2}, mt::kF16)).dtype() == mt::kF16);
}

BOOST_AUTO_TEST_CASE(regions_nest_and_can_be_disabled) {
  mt::Tensor a = mt::randn({2, 2});
  mt::amp::Autocast outer(mt::kF16);
  {
    mt::amp::Autocast inner(mt::kBF16);
    BOOST_TEST(mt::matmul(a, a).dtype() == mt::kBF16);
    {
      mt::amp::Autocast off(mt::kF16, /*enabled=*/false);
      BOOST_TEST(!mt::amp::is_autocast_enabled());
      BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF32);
    }
    BOOST_TEST(mt::amp::autocast_dtype() == mt::kBF16);
  }
  BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF16);
  BOOST_CHECK_EXCEPTION(mt::amp::Autocast bad(mt::kF64), mt::Error,
                        [](const mt::Error& e) { return message_has(e, "f16 or bf16"); });
}

BOOST_AUTO_TEST_CASE(the_table_is_data) {
  auto table = mt::amp::precision_table();
  auto category = [&](const std::string& op) {
    for (const auto& row : table)
      if (row.op == op) return row.effective;
    BOOST_ERROR("op " << op << " missing from the precision table");
    return Precision::kUnset;
  };
  // DESIGN.md's table.
  for (const char* op : {"matmul", "linear", "conv2d"}) BOOST_TEST(category(op) == Precision::kLowerPrecision, op);
  for (const char* op : {"softmax", "log_softmax", "cross_entropy", "layer_norm", "sum", "mean", "exp", "log", "pow",
                         "nll_loss", "mse_loss"})
    BOOST_TEST(category(op) == Precision::kFp32, op);
  for (const char* op : {"add", "sub", "mul", "div", "cat"}) BOOST_TEST(category(op) == Precision::kPromote, op);
  for (const char* op : {"relu", "reshape", "permute", "max_pool2d", "dropout"})
    BOOST_TEST(category(op) == Precision::kPassthrough, op);
  for (const auto& row : table) BOOST_TEST(row.declared == row.effective, row.op << " has a stray override");
}

BOOST_AUTO_TEST_CASE(overrides_global_and_scoped) {
  mt::Tensor h = mt::randn({2, 3}, mt::kF16);
  mt::Tensor a = mt::randn({3, 3});
  mt::amp::Autocast ac(mt::kF16);
  mt::amp::set_precision("softmax", Precision::kPassthrough);
  BOOST_TEST(mt::amp::precision_of("softmax") == Precision::kPassthrough);
  BOOST_TEST(mt::softmax(h, 1).dtype() == mt::kF16);
  mt::amp::reset_precision_overrides();
  BOOST_TEST(mt::softmax(h, 1).dtype() == mt::kF32);
  {
    mt::amp::PrecisionScope keep("matmul", Precision::kFp32);  // "keep this layer in f32"
    BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF32);
    BOOST_TEST(mt::matmul(a.to(mt::kF16), a).dtype() == mt::kF32);
  }
  BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF16);
  {  // Nested scopes: the innermost wins, leaving it restores the outer one; a scope beats a global override.
    mt::amp::set_precision("matmul", Precision::kPassthrough);
    mt::amp::PrecisionScope outer("matmul", Precision::kFp32);
    {
      mt::amp::PrecisionScope inner("matmul", Precision::kLowerPrecision);
      BOOST_TEST(mt::amp::precision_of("matmul") == Precision::kLowerPrecision);
      BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF16);
    }
    BOOST_TEST(mt::amp::precision_of("matmul") == Precision::kFp32);
    BOOST_TEST(mt::matmul(a.to(mt::kF16), a).dtype() == mt::kF32);
  }
  BOOST_TEST(mt::amp::precision_of("matmul") == Precision::kPassthrough);
  mt::amp::reset_precision_overrides();
  // A typo is an error, never a silent change of precision.
  BOOST_CHECK_EXCEPTION(mt::amp::set_precision("sofmax", Precision::kFp32), mt::Error,
                        [](const mt::Error& e) { return message_has(e, "unknown op 'sofmax'"); });
  BOOST_CHECK_EXCEPTION(mt::amp::PrecisionScope("matmull", Precision::kFp32), mt::Error,
                        [](const mt::Error& e) { return message_has(e, "unknown op 'matmull'"); });
  BOOST_CHECK_EXCEPTION(mt::amp::precision_of("matmull"), mt::Error,
                        [](const mt::Error& e) { return message_has(e, "unknown op 'matmull'"); });
  // A scope is this thread's: another thread, under its own autocast, runs matmul as declared meanwhile.
  {
    mt::amp::PrecisionScope keep("matmul", Precision::kFp32);
    mt::DType there = mt::kF64;
    Precision category = Precision::kPassthrough;
    std::thread([&] {
      mt::amp::Autocast ac_there(mt::kF16);
      there = mt::matmul(a, a).dtype();
      category = mt::amp::precision_of("matmul");
    }).join();
    BOOST_TEST(there == mt::kF16);
    BOOST_TEST(category == Precision::kLowerPrecision);
    BOOST_TEST(mt::matmul(a, a).dtype() == mt::kF32);
  }
  // An op's facts are registered once: the same name with other facts is refused (two ops cannot share a name).
  BOOST_CHECK_EXCEPTION(mt::autograd::register_op_info("relu", Precision::kFp32, true), mt::Error,
                        [](const mt::Error& e) { return message_has(e, "relu"); });
  BOOST_TEST(mt::amp::precision_of("relu") == Precision::kPassthrough);
}

BOOST_AUTO_TEST_CASE(a_parameter_used_twice_is_cast_once) {
  mt::Tensor w = mt::randn({8, 8}).requires_grad_();
  mt::Tensor x = mt::randn({4, 8});
  {
    mt::amp::Autocast ac(mt::kF16);
    mt::autograd::PrecisionTrace trace;
    mt::Tensor h = mt::matmul(mt::matmul(x, w), w);  // w used twice
    // x is cast for the first matmul (not cached: not a leaf that requires grad), w once.
    BOOST_TEST(count(trace, "cast") == 2);
    auto stats = mt::amp::cast_cache_stats();
    BOOST_TEST(stats.entries == 1);
    BOOST_TEST(stats.bytes == 8 * 8 * 2);
    BOOST_TEST(stats.misses == 1);
    BOOST_TEST(stats.hits == 1);
    {
      mt::amp::Autocast nested(mt::kF16);
      mt::matmul(x.to(mt::kF16), w);
      BOOST_TEST(mt::amp::cast_cache_stats().hits == 2);  // the outermost region's cache serves nested ones
    }
    BOOST_TEST(mt::amp::cast_cache_stats().entries == 1);
    mt::sum(h).backward();
    BOOST_TEST(w.grad().dtype() == mt::kF32);
  }
  BOOST_TEST(mt::amp::cast_cache_stats().entries == 0);  // cleared when the outermost region ends
  BOOST_TEST(mt::amp::cast_cache_stats().bytes == 0);
}

// PyTorch caches a cast only with grad mode on: one made under NoGradGuard has no node back to the parameter, and
// served later with grad on it would cut the parameter off from its gradient.
BOOST_AUTO_TEST_CASE(a_cast_made_without_grad_is_not_cached) {
  mt::Tensor w = mt::randn({8, 8}).requires_grad_();
  mt::Tensor x = mt::randn({4, 8});
  mt::Tensor w2 = w.detach().clone().requires_grad_();
  {
    mt::amp::Autocast ac(mt::kF16);
    {
      mt::autograd::NoGradGuard no_grad;
      mt::matmul(x, w);  // say, a look at the model inside the training region
      BOOST_TEST(mt::amp::cast_cache_stats().entries == 0);
    }
    mt::Tensor h = mt::matmul(x, w);
    BOOST_TEST(mt::amp::cast_cache_stats().entries == 1);
    BOOST_REQUIRE(h.requires_grad());
    mt::sum(h).backward();
  }
  {
    mt::amp::Autocast ac(mt::kF16);
    mt::sum(mt::matmul(x, w2)).backward();
  }
  BOOST_REQUIRE(w.grad().defined());
  BOOST_TEST(w.grad().to_vector<float>() == w2.grad().to_vector<float>(), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(in_place_update_invalidates_the_cached_cast) {
  mt::Tensor w = mt::ones({2, 2}).requires_grad_();
  mt::amp::Autocast ac(mt::kF16);
  mt::Tensor a = mt::matmul(mt::ones({1, 2}), w);
  {
    mt::autograd::NoGradGuard ng;
    w.fill_(2.0);
  }
  mt::Tensor b = mt::matmul(mt::ones({1, 2}), w);
  BOOST_TEST(b.at<float>({0, 0}) == 4.0f);
}

// A layer whose input needs a gradient saves its weight for dX; under autocast that weight is the f16/bf16 copy
// of an f32 parameter. The tape keeps the parameter instead and makes the copy again in backward (autograd::Ctx):
// nothing of the copy stays between forward and backward, and the gradients are the ones a kept copy gives, bit
// for bit.
BOOST_AUTO_TEST_CASE(a_parameters_saved_copy_is_made_again_in_backward_not_kept) {
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    BOOST_TEST_CONTEXT("autocast " << low) {
      mt::manual_seed(11);
      mt::Tensor w = mt::randn({256, 512}).requires_grad_();  // f32, 512 KiB; its copy 256 KiB
      mt::Tensor x_leaf = mt::randn({32, 512}).requires_grad_();
      const mt::Tensor v = mt::randn({32, 256});
      const mt::Tensor x = mt::relu(x_leaf);  // an activation: its cast is saved as it is (no parameter behind it)
      const int64_t before = mt::cpu_memory_stats().allocated_bytes;
      mt::Tensor y;
      {
        mt::amp::Autocast ac(low);
        y = mt::linear(x, w);  // (32, 256) in `low`; saves x's copy for dW and w's for dX
      }
      const int64_t kept = mt::cpu_memory_stats().allocated_bytes - before;
      BOOST_TEST(kept == 32 * 256 * 2 + 32 * 512 * 2);  // y and x's copy; w's copy (+ 256 × 512 × 2) is gone
      mt::sum(y * v).backward();

      // The same products with copies made by hand outside autocast: the tape keeps those as they are.
      mt::Tensor w2 = w.detach().clone().requires_grad_(), x2_leaf = x_leaf.detach().clone().requires_grad_();
      mt::sum(mt::linear(mt::relu(x2_leaf).to(low), w2.to(low)) * v).backward();
      BOOST_TEST(mt::test::expect_same_bits(x_leaf.grad(), x2_leaf.grad(), "dx through the remade copy"));
      BOOST_TEST(mt::test::expect_same_bits(w.grad(), w2.grad(), "dW"));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_remade_copy_serves_a_retained_graph_twice) {
  mt::Tensor w = mt::randn({8, 16}).requires_grad_();
  mt::Tensor x_leaf = mt::randn({4, 16}).requires_grad_();
  const mt::Tensor y = linear_of_an_activation(mt::kBF16, x_leaf, w);
  mt::sum(y).backward({}, /*retain_graph=*/true);
  const mt::Tensor once = x_leaf.grad().clone();
  mt::sum(y).backward();
  BOOST_TEST(mt::test::expect_same_bits(x_leaf.grad(), once * 2.0, "dx after two backwards"));
}

// The copy is made from the parameter as it is at backward: a parameter changed in between (an optimizer step
// before backward) would give other bits than the forward used, so it is an error, as for any saved tensor (and
// as for the f32 weight an fp32 layer saves).
BOOST_AUTO_TEST_CASE(a_parameter_changed_before_backward_cannot_be_cast_again) {
  mt::Tensor w = mt::randn({8, 16}).requires_grad_();
  mt::Tensor x_leaf = mt::randn({4, 16}).requires_grad_();
  const mt::Tensor y = linear_of_an_activation(mt::kF16, x_leaf, w);
  {
    mt::autograd::NoGradGuard ng;
    w.fill_(0.5);
  }
  mt::test::expect_error([&] { mt::sum(y).backward(); },
                         {"linear", "autocast copy of a parameter of shape [8, 16]", "modified in place",
                          "saved at version 0"});
}

BOOST_AUTO_TEST_CASE(f32_leaf_used_in_f16_gets_an_f32_gradient_matching_f64) {
  mt::manual_seed(5);
  mt::Tensor w = mt::randn({16, 32}).requires_grad_();
  mt::Tensor x = mt::randn({8, 16});
  mt::Tensor v = mt::randn({8, 32});
  {
    mt::amp::Autocast ac(mt::kF16);
    mt::Tensor y = mt::matmul(x, w);
    BOOST_TEST(y.dtype() == mt::kF16);
    mt::sum(mt::mul(y, v)).backward();
  }
  BOOST_TEST(w.grad().dtype() == mt::kF32);
  // The same computation in f64 on the f16-rounded inputs: dW = x16^T (v rounded like the f16 path's dy).
  mt::Tensor x16 = x.to(mt::kF16).to(mt::kF64);
  mt::Tensor dy = v.to(mt::kF16).to(mt::kF64);  // mul(y16, v) promotes to f32; its gradient reaches y as f16(v)
  mt::Tensor expected = mt::matmul(x16.t(), dy);
  BOOST_TEST(mt::test::expect_close(w.grad(), expected, mt::test::tolerance(mt::kF16), "dW (f16 path vs f64)"));
}

BOOST_AUTO_TEST_CASE(backward_runs_in_the_forward_dtype) {
  mt::Tensor w = mt::randn({4, 4}).requires_grad_();
  mt::Tensor x = mt::randn({2, 4});
  mt::amp::Autocast ac(mt::kBF16);
  mt::Tensor h = mt::relu(mt::matmul(x, w));  // bf16
  mt::Tensor loss = mt::sum(mt::softmax(h, 1) * mt::randn({2, 4}));
  auto g = mt::autograd::grad({loss}, {h, w});
  BOOST_TEST(g[0].dtype() == mt::kBF16);  // the gradient of a bf16 activation is bf16
  BOOST_TEST(g[1].dtype() == mt::kF32);   // and the master weight's is f32
}

BOOST_AUTO_TEST_CASE(precision_trace_of_a_forward_pass) {
  mt::Tensor w1 = mt::randn({16, 8}).requires_grad_(), b1 = mt::zeros({16}).requires_grad_();
  mt::Tensor w2 = mt::randn({3, 16}).requires_grad_();
  mt::Tensor x = mt::randn({4, 8});
  mt::Tensor y = mt::tensor<int64_t>({0, 1, 2, 1});
  mt::amp::Autocast ac(mt::kF16);
  mt::autograd::PrecisionTrace trace;
  mt::Tensor loss = mt::cross_entropy(mt::linear(mt::relu(mt::linear(x, w1, b1)), w2), y);
  BOOST_TEST_MESSAGE("trace: " << trace.str());
  BOOST_TEST(trace.str() == "cast:f16 cast:f16 cast:f16 linear:f16 relu:f16 cast:f16 linear:f16 cross_entropy:f32");
  BOOST_TEST(loss.dtype() == mt::kF32);
}

BOOST_AUTO_TEST_CASE(nested_traces_each_see_everything_and_backward_adds_nothing) {
  mt::Tensor x = mt::randn({3}).requires_grad_();
  mt::autograd::PrecisionTrace outer;
  mt::Tensor y = mt::exp(x);
  {
    mt::autograd::PrecisionTrace inner;
    y = mt::relu(y);
    BOOST_TEST(inner.str() == "relu:f32");
  }
  y = mt::sum(y);
  BOOST_TEST(outer.str() == "exp:f32 relu:f32 sum:f32");
  y.backward();  // the ops backward runs (and any it calls) are not forward ops of the program
  BOOST_TEST(outer.str() == "exp:f32 relu:f32 sum:f32");
}

BOOST_AUTO_TEST_CASE(the_ops_an_op_calls_are_its_implementation) {
  const mt::Tensor a = (mt::randn({4, 8}) * 0.3).requires_grad_(), b = (mt::randn({8, 3}) * 0.3).requires_grad_();
  const int64_t tape_before = mt::autograd::tape_size();
  mt::Tensor y, inner;
  ExpNegExpOfProduct::seen = &inner;
  {
    mt::amp::Autocast ac(mt::kF16);
    mt::autograd::PrecisionTrace trace;
    y = mt::autograd::apply<ExpNegExpOfProduct>(a, b);
    // The matmul inside ran in the op's f32, not autocast's f16, and recorded nothing; the trace lists the op alone.
    BOOST_TEST(inner.dtype() == mt::kF32);
    BOOST_TEST(!inner.requires_grad());
    BOOST_TEST(trace.str() == "test_exp_neg_exp_of_product:f32");
  }
  BOOST_TEST(y.dtype() == mt::kF32);
  BOOST_TEST(std::string(y.grad_fn_name()) == "test_exp_neg_exp_of_product");
  BOOST_TEST(mt::autograd::tape_size() == tape_before + 1);
  // The same ops on copies of the leaves, outside autocast: the same bits forward, the gradients to f32 rounding.
  const mt::Tensor a2 = a.detach().requires_grad_(), b2 = b.detach().requires_grad_();
  const mt::Tensor want = mt::exp(-mt::exp(mt::matmul(a2, b2)));
  BOOST_TEST(y.to_vector<float>() == want.to_vector<float>(), boost::test_tools::per_element());
  y.backward(mt::ones_like(y));
  want.backward(mt::ones_like(want));
  mt::test::expect_close(a.grad(), a2.grad(), {1e-6, 1e-6}, "da");
  mt::test::expect_close(b.grad(), b2.grad(), {1e-6, 1e-6}, "db");
  // Anomaly mode checks the op's inputs and output, not what it computes on the way: exp(a·b) = exp(10^4)
  // overflows to inf inside, and the output, exp(−inf) = 0, is finite.
  mt::autograd::DetectAnomaly anomaly;
  const mt::Tensor big = mt::full({1, 1}, 100.0);
  BOOST_TEST(mt::autograd::apply<ExpNegExpOfProduct>(big, big).item<double>() == 0.0);
  BOOST_TEST(inner.item<double>() == 1e4);
  ExpNegExpOfProduct::seen = nullptr;
}

// cross_entropy (fp32) reads f16/bf16 logits without a cast under autocast (its kernels widen them on load): the
// loss and the logits' gradient are the bits of the cast path, a cast of the logits to f32 written out, on every
// path of the op (fused (N, C) rows, the composed (N, C, d) one) and reduction.
BOOST_AUTO_TEST_CASE(cross_entropy_reads_sixteen_bit_logits_uncast_with_the_casts_bits) {
  struct Config {
    std::string what;
    mt::Shape logits, target;
    mt::CrossEntropyOptions options;
  };
  const std::vector<Config> configs = {
      {"(N, C), mean", {32, 10}, {32}, {}},
      {"(N, C), sum, smoothing 0.1, ignore_index 3", {32, 10}, {32},
       {.reduction = mt::Reduction::kSum, .ignore_index = 3, .label_smoothing = 0.1}},
      {"(N, C), none", {32, 10}, {32}, {.reduction = mt::Reduction::kNone}},
      {"(N, C, d) composed, mean, smoothing 0.2", {8, 5, 3}, {8, 3}, {.label_smoothing = 0.2}},
  };
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    for (const Config& c : configs) {
      BOOST_TEST_CONTEXT("autocast " << low << ", " << c.what) {
        mt::manual_seed(7);
        const mt::Tensor values = (mt::randn(c.logits) * 4.0).to(low);
        const mt::Tensor target = mt::randint(0, c.logits[1], c.target);
        mt::Tensor uncast = values.clone().requires_grad_(), cast = values.clone().requires_grad_();
        mt::Tensor loss, loss_of_cast;
        mt::autograd::PrecisionTrace trace;
        {
          mt::amp::Autocast ac(low);
          loss = mt::cross_entropy(uncast, target, c.options);
          BOOST_TEST(trace.str() == "cross_entropy:f32");
          loss_of_cast = mt::cross_entropy(cast.to(mt::kF32), target, c.options);
        }
        BOOST_TEST(loss.dtype() == mt::kF32);
        BOOST_TEST(mt::test::expect_same_bits(loss, loss_of_cast, "the loss"));
        const mt::Tensor upstream = mt::randn(loss.shape());
        mt::sum(loss * upstream).backward();
        mt::sum(loss_of_cast * upstream).backward();
        BOOST_TEST(uncast.grad().dtype() == low);
        BOOST_TEST(mt::test::expect_same_bits(uncast.grad(), cast.grad(), "the logits' gradient"));
      }
    }
  }
  // Outside autocast, 16-bit logits give a loss of their dtype (PyTorch's F.cross_entropy), rounded once.
  const mt::Tensor h = mt::randn({4, 3}, mt::kF16);
  BOOST_TEST(mt::cross_entropy(h, mt::tensor<int64_t>({0, 1, 2, 0})).dtype() == mt::kF16);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the device -------------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(autocast_gpu)

// The CPU case above on a GPU: what the forward leaves is counted in the bytes tensors ask for
// (cuda::MemoryStats::requested_bytes), and the copy cast again in backward gives the kept copy's bits.
BOOST_AUTO_TEST_CASE(a_parameters_copy_is_made_again_in_backward_on_cuda, MT_GPU_TEST) {
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    BOOST_TEST_CONTEXT("autocast " << low) {
      mt::manual_seed(12);
      const mt::Device cuda = mt::Device::cuda();
      mt::Tensor w = mt::randn({256, 512}).to(cuda).requires_grad_();
      mt::Tensor x_leaf = mt::randn({32, 512}).to(cuda).requires_grad_();
      const mt::Tensor v = mt::randn({32, 256}).to(cuda);
      const mt::Tensor x = mt::relu(x_leaf);
      const int64_t before = mt::cuda::memory_stats().requested_bytes;
      mt::Tensor y;
      {
        mt::amp::Autocast ac(low);
        y = mt::linear(x, w);
      }
      BOOST_TEST(mt::cuda::memory_stats().requested_bytes - before == 32 * 256 * 2 + 32 * 512 * 2);
      mt::sum(y * v).backward();
      mt::Tensor w2 = w.detach().clone().requires_grad_(), x2_leaf = x_leaf.detach().clone().requires_grad_();
      mt::sum(mt::linear(mt::relu(x2_leaf).to(low), w2.to(low)) * v).backward();
      BOOST_TEST(mt::test::expect_same_bits(x_leaf.grad(), x2_leaf.grad(), "dx through the remade copy"));
      BOOST_TEST(mt::test::expect_same_bits(w.grad(), w2.grad(), "dW"));
    }
  }
}

// The CPU case above on a GPU, where the f16/bf16 rows kernel and the f32 one may sum a row in other orders: the
// loss within f32's tolerance of the cast path's, the logits' gradient within the 16-bit dtype's.
BOOST_AUTO_TEST_CASE(cross_entropy_reads_sixteen_bit_logits_uncast_on_cuda, MT_GPU_TEST) {
  const mt::Device cuda = mt::Device::cuda();
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    for (mt::Reduction reduction : {mt::Reduction::kMean, mt::Reduction::kNone}) {
      BOOST_TEST_CONTEXT("autocast " << low << ", reduction " << static_cast<int>(reduction)) {
        mt::manual_seed(8);
        const mt::Tensor values = (mt::randn({128, 10}) * 4.0).to(low).to(cuda);
        const mt::Tensor target = mt::randint(0, 10, {128}).to(cuda);
        mt::Tensor uncast = values.clone().requires_grad_(), cast = values.clone().requires_grad_();
        mt::Tensor loss, loss_of_cast;
        mt::autograd::PrecisionTrace trace;
        {
          mt::amp::Autocast ac(low);
          loss = mt::cross_entropy(uncast, target, {.reduction = reduction});
          BOOST_TEST(trace.str() == "cross_entropy:f32");
          loss_of_cast = mt::cross_entropy(cast.to(mt::kF32), target, {.reduction = reduction});
        }
        BOOST_TEST(loss.dtype() == mt::kF32);
        BOOST_TEST(mt::test::expect_close(loss, loss_of_cast, mt::test::tolerance(mt::kF32), "the loss"));
        const mt::Tensor upstream = mt::randn(loss.shape()).to(cuda);
        mt::sum(loss * upstream).backward();
        mt::sum(loss_of_cast * upstream).backward();
        BOOST_TEST(uncast.grad().dtype() == low);
        BOOST_TEST(mt::test::expect_close(uncast.grad(), cast.grad(), mt::test::tolerance(low), "the logits' gradient"));
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
