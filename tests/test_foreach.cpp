// tests/test_foreach.cpp — the multi-tensor kernels (ops/cpu/foreach.cpp, cuda/foreach.cu): one pass over a list
// of tensors, each updated in place, for the optimizers and the loss scaler. They are kernels, not ops (nothing
// to differentiate), so there is no ops/foreach.cpp and no registry case.
//
// non_finite_check_and_unscale_ on the CPU against a float64 reference of the kernel's arithmetic (exactly: one
// product in opmath, one rounding), with the found-inf flag set by any non-finite element of any tensor of the
// list and never reset, the targets' versions bumped, and the entry point's invariants; on CUDA, the same cases
// bit for bit the CPU's.
#include "family_test.h"

#include <functional>

namespace {

/// Not a power of two: every product is rounded.
constexpr float kInvScale = 1.0f / 3.0f;

/// One list: a tensor of each floating dtype in each of five shapes (2-D, transposed, 1-D, 0-d, empty), values
/// in [-4, 4).
std::vector<Tensor> mixed_list(uint64_t seed) {
  std::vector<Tensor> ts;
  for (DType dt : kFloatTypes) {
    ts.push_back(input({33, 65}, dt, -4, 4, ++seed));
    ts.push_back(input({17, 23}, dt, -4, 4, ++seed, Layout::kTransposed));
    ts.push_back(input({7}, dt, -4, 4, ++seed));
    ts.push_back(input({}, dt, -4, 4, ++seed));
    ts.push_back(mt::zeros({3, 0}, dt));
  }
  return ts;
}

/// x · inv as the kernel computes it: one product in opmath (f32 for f16/bf16/f32, f64 for f64), rounded once to
/// x's dtype.
std::vector<double> unscaled(const Tensor& x, float inv) {
  std::vector<double> v = values(x);
  for (double& e : v)
    e = x.dtype() == DType::kF64 ? e * static_cast<double>(inv) : round_to(x.dtype(), static_cast<float>(e) * inv);
  return v;
}

/// Writes `v` into the middle element of t (a view: through its strides).
void poke(const Tensor& t, double v) {
  Tensor cell = t;
  for (int64_t d = 0; d < t.dim(); ++d) cell = mt::raw::select(cell, 0, t.size(d) / 2);
  mt::raw::fill_(cell, v);
}

/// A call's inputs on the CPU and what it must do to found_inf.
struct Case {
  std::string name;
  std::vector<Tensor> tensors;
  float found_before;
  float found_after;
};

/// Every list finite (found_inf 0 stays 0, 1 stays 1: never reset), one +inf, −inf or NaN in each non-empty
/// tensor of the list in turn (found_inf becomes 1), and an empty list.
std::vector<Case> cases() {
  std::vector<Case> out;
  uint64_t seed = 50000;
  out.push_back({"all finite", mixed_list(seed += 100), 0.0f, 0.0f});
  out.push_back({"all finite, found_inf already 1", mixed_list(seed += 100), 1.0f, 1.0f});
  out.push_back({"an empty list", {}, 0.0f, 0.0f});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {inf, -inf, nan}) {
    const size_t n = mixed_list(0).size();
    for (size_t i = 0; i < n; ++i) {
      std::vector<Tensor> ts = mixed_list(seed += 100);
      if (ts[i].numel() == 0) continue;
      poke(ts[i], bad);
      out.push_back({describe(bad, " in tensor ", i, " (", ts[i].dtype(), " ", ts[i].shape(), ")"), ts, 0.0f, 1.0f});
    }
  }
  return out;
}

Tensor f32_scalar(float v, mt::Device device = mt::Device::cpu()) {
  return mt::raw::to(mt::from_vector<float>({v}, {1}), device);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(foreach)

BOOST_AUTO_TEST_CASE(unscale_matches_f64_reference_and_sets_found_inf, MT_CPU_TEST) {
  for (const Case& c : cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      std::vector<std::vector<double>> want;
      std::vector<uint64_t> versions;
      for (const Tensor& t : c.tensors) {
        want.push_back(unscaled(t, kInvScale));
        versions.push_back(t.version());
      }
      const Tensor found_inf = f32_scalar(c.found_before);
      kn::non_finite_check_and_unscale_(c.tensors, found_inf, f32_scalar(kInvScale));
      BOOST_TEST(found_inf.item<float>() == c.found_after);
      for (size_t i = 0; i < c.tensors.size(); ++i) {
        const Tensor& t = c.tensors[i];
        const std::string what = describe(c.name, ": tensor ", i, " (", t.dtype(), " ", t.shape(),
                                          t.is_contiguous() ? ")" : ", transposed)");
        expect_values(t, want[i], kExact, what);
        BOOST_TEST(t.version() == versions[i] + 1, what << ": version " << t.version() << ", was " << versions[i]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(unscale_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  // What the kernel cannot be handed without reading memory wrongly: found_inf and inv_scale one f32 element each,
  // every tensor floating and owning its elements.
  const std::vector<Tensor> ok = {mt::zeros({2, 3}), mt::zeros({4}, DType::kF16)};
  const Tensor found_inf = f32_scalar(0.0f), inv_scale = f32_scalar(0.5f);
  auto expect_invariant_error = [](const std::function<void()>& f, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      const std::string msg = expect_error(f, {"its invariant"});
      BOOST_TEST(msg.starts_with("kernels::non_finite_check_and_unscale_"), "the message: " << msg);
    }
  };
  expect_invariant_error([&] { kn::non_finite_check_and_unscale_(ok, mt::zeros({1}, DType::kF16), inv_scale); },
                         "found_inf of dtype f16");
  expect_invariant_error([&] { kn::non_finite_check_and_unscale_(ok, mt::zeros({2}), inv_scale); },
                         "found_inf of 2 elements");
  expect_invariant_error(
      [&] { kn::non_finite_check_and_unscale_(ok, found_inf, mt::from_vector<double>({0.5}, {1})); },
      "inv_scale of dtype f64");
  const std::vector<Tensor> with_integers = {mt::zeros({2, 3}), mt::zeros({3}, DType::kI64)};
  expect_invariant_error([&] { kn::non_finite_check_and_unscale_(with_integers, found_inf, inv_scale); },
                         "an i64 tensor in the list");
  const std::vector<Tensor> with_expanded = {mt::zeros({2, 3}), mt::zeros({3}).expand({2, 3})};
  expect_invariant_error([&] { kn::non_finite_check_and_unscale_(with_expanded, found_inf, inv_scale); },
                         "an expanded (stride 0) tensor in the list");
}

BOOST_AUTO_TEST_CASE(unscale_on_cuda_matches_the_cpu, MT_GPU_TEST) {
  for (const Case& c : cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      const std::vector<Tensor>& cpu = c.tensors;
      std::vector<Tensor> gpu;
      for (const Tensor& t : cpu) gpu.push_back(same_view_on_gpu(t));  // the same layout: a transposed view stays one
      const Tensor found_cpu = f32_scalar(c.found_before), found_gpu = f32_scalar(c.found_before, mt::Device::cuda());
      kn::non_finite_check_and_unscale_(cpu, found_cpu, f32_scalar(kInvScale));
      kn::non_finite_check_and_unscale_(gpu, found_gpu, f32_scalar(kInvScale, mt::Device::cuda()));
      BOOST_TEST(mt::raw::to(found_gpu, mt::Device::cpu()).item<float>() == found_cpu.item<float>());
      BOOST_TEST(found_cpu.item<float>() == c.found_after);
      for (size_t i = 0; i < cpu.size(); ++i)
        expect_same_bits(gpu[i], cpu[i], describe(c.name, ": tensor ", i, " (", cpu[i].dtype(), " ", cpu[i].shape(), ")"));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
