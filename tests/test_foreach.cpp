// tests/test_foreach.cpp — the multi-tensor kernels (ops/cpu/foreach.cpp, cuda/foreach.cu): one pass over a list
// of tensors, for the optimizers, the loss scaler and gradient clipping. They are kernels, not ops (nothing to
// differentiate), so there is no ops/foreach.cpp and no registry case.
//
// non_finite_check_and_unscale_ on the CPU against a float64 reference of the kernel's arithmetic (exactly: one
// product in opmath, one rounding), with the found-inf flag set by any non-finite element of any tensor of the
// list and never reset, the targets' versions bumped, and the entry point's invariants; on CUDA, the same cases
// bit for bit the CPU's. amp_update_scale_ against a state machine written out here from PyTorch's rules (not
// from ops/backend/amp_math.h), bit for bit. foreach_norm against float64 norms of the same rounded inputs (the
// f32 sum's error bound stated below), foreach_mul_ and foreach_clamp_ exactly (one operation in opmath, one
// rounding); CUDA: the state machine and the in-place kernels bit for bit the CPU's, the norms within the bound.
// The plan of CUDA's multi-tensor launches (cuda/chunks.h, host code) on the CPU: every element in exactly one
// chunk, within the launch limits; on CUDA, lists long enough for several launches, with tensors of several chunks.
#include "family_test.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include <mixtape/cuda/chunks.h>

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

// A NaN keeps its bits, sign and payload, through the unscale and foreach_mul_: a GPU's f32 multiply returns its one
// canonical NaN and the CPU's a quieted copy of the input, so neither backend multiplies one (math::rescales). The
// NaNs here are signaling ones, which a multiply would quiet: the test fails if a backend multiplies them. They
// stand at the start, inside and at the end of a 41-element run, so the CPU's vector loop (a select of the product
// and the element's own bits) sees them as well as its scalar remainder. Built with clang, the f32/f64 loop does
// multiply a NaN: LLVM folds select(v == v, v * s, v) into v * select(v == v, s, 1), as IEEE arithmetic lets it, so
// a signaling NaN comes back quieted there (its quiet bit set, sign and payload kept); a quiet NaN keeps its bits.
BOOST_AUTO_TEST_CASE(a_nan_keeps_its_bits_through_unscale_and_mul, MT_CPU_TEST) {
  const std::vector<std::pair<DType, uint64_t>> signaling_nans = {
      {DType::kF32, 0xFF801234u}, {DType::kF16, 0xFC01u}, {DType::kBF16, 0xFF81u}, {DType::kF64, 0xFFF0000000001234u}};
  constexpr int64_t kN = 41;
  const std::vector<int64_t> nan_at = {1, 18, 40}, inf_at = {2, 23};
  for (const auto& [dtype, bits] : signaling_nans) {
    BOOST_TEST_CONTEXT(dtype) {
#if defined(__clang__)
      const uint64_t quiet_bit = dtype == DType::kF32 ? uint64_t{1} << 22
                                 : dtype == DType::kF64 ? uint64_t{1} << 51 : 0;  // f16/bf16 keep a branch
      const uint64_t expected_bits = bits | quiet_bit;
#else
      const uint64_t expected_bits = bits;
#endif
      for (const bool unscale : {true, false}) {
        std::vector<double> v(kN);
        for (int64_t i = 0; i < kN; ++i) v[i] = static_cast<double>(i + 1);
        for (int64_t i : inf_at) v[i] = -std::numeric_limits<double>::infinity();
        const Tensor t = mt::from_vector<double>(v, {kN}).to(dtype);
        for (int64_t i : nan_at)  // little-endian
          std::memcpy(static_cast<char*>(t.data_ptr()) + i * t.itemsize(), &bits, t.itemsize());
        if (unscale) {
          const Tensor found_inf = f32_scalar(0.0f);
          kn::non_finite_check_and_unscale_(std::span<const Tensor>(&t, 1), found_inf, f32_scalar(0.5f));
          BOOST_TEST(found_inf.item<float>() == 1.0f);
        } else {
          kn::foreach_mul_(std::span<const Tensor>(&t, 1), mt::full({1}, 0.5));
        }
        for (int64_t i = 0; i < kN; ++i) {
          if (std::find(nan_at.begin(), nan_at.end(), i) != nan_at.end()) {
            uint64_t got = 0;
            std::memcpy(&got, static_cast<const char*>(t.data_ptr()) + i * t.itemsize(), t.itemsize());
            BOOST_TEST(got == expected_bits, (unscale ? "unscale" : "foreach_mul_") << ": the NaN's bits at " << i
                                                                                    << " 0x" << std::hex << got);
          } else {
            BOOST_TEST(t.at<double>({i}) == v[i] * 0.5, "element " << i);  // exact: i + 1 ≤ 41 and inf
          }
        }
      }
    }
  }
}

// With 1 + n elements, found_inf also flags each tensor that held inf/NaN (the GradScaler's per-parameter answer);
// flags already set stay set, clean tensors leave theirs alone.
std::vector<Tensor> flagged_list(mt::Device device) {
  std::vector<Tensor> list = {mt::ones({2, 3}), mt::ones({4}, DType::kF16), mt::ones({3}, DType::kBF16),
                              mt::ones({2}, DType::kF64), mt::zeros({0})};
  list[1].set({2}, std::numeric_limits<double>::infinity());
  list[3].set({0}, std::numeric_limits<double>::quiet_NaN());
  for (Tensor& t : list) t = mt::raw::to(t, device);
  return list;
}

BOOST_AUTO_TEST_CASE(unscale_flags_each_tensor_with_a_non_finite_element, MT_CPU_TEST) {
  const std::vector<Tensor> list = flagged_list(mt::Device::cpu());
  const Tensor flags = mt::from_vector<float>({0, 0, 0, 0, 0, 1}, {6});  // the empty tensor's flag was set before
  kn::non_finite_check_and_unscale_(list, flags, f32_scalar(0.5f));
  BOOST_TEST(flags.to_vector<float>() == std::vector<float>({1, 0, 1, 0, 1, 1}), boost::test_tools::per_element());
  expect_values(list[0], std::vector<double>(6, 0.5), kExact, "the clean f32 tensor, unscaled");
  const Tensor clean = mt::from_vector<float>({0, 0, 0}, {3});
  kn::non_finite_check_and_unscale_(std::vector<Tensor>{list[0], list[2]}, clean, f32_scalar(0.5f));
  BOOST_TEST(clean.to_vector<float>() == std::vector<float>({0, 0, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(unscale_flags_each_tensor_on_cuda, MT_GPU_TEST) {
  const std::vector<Tensor> cpu = flagged_list(mt::Device::cpu()), gpu = flagged_list(mt::Device::cuda());
  const Tensor flags_cpu = mt::zeros({6}), flags_gpu = mt::zeros({6}, mt::TensorOptions().device(mt::Device::cuda()));
  kn::non_finite_check_and_unscale_(cpu, flags_cpu, f32_scalar(0.5f));
  kn::non_finite_check_and_unscale_(gpu, flags_gpu, f32_scalar(0.5f, mt::Device::cuda()));
  BOOST_TEST(flags_gpu.cpu().to_vector<float>() == flags_cpu.to_vector<float>(), boost::test_tools::per_element());
  for (size_t i = 0; i < cpu.size(); ++i) expect_same_bits(gpu[i], cpu[i], describe("tensor ", i));
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


// ---- amp_update_scale_ ------------------------------------------------------------------------------------

namespace {

/// PyTorch's _amp_update_scale_ written out from its documented rules (AmpKernels.cu), independently of
/// ops/backend/amp_math.h: found_inf (any non-zero, NaN included) backs off and resets the tracker; otherwise the
/// tracker counts successful steps and at growth_interval the scale grows (unless that overflows f32) and resets.
struct ScaleReference {
  float scale;
  int32_t tracker;
  void update(float found_inf, double growth, double backoff, int32_t interval) {
    if (std::isnan(found_inf) || found_inf != 0.0f) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
    } else if (tracker + 1 == interval) {
      const float grown = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    } else {
      ++tracker;
    }
  }
};

struct ScaleState {
  Tensor scale, tracker, found_inf;
  ScaleState(float s, int32_t t, mt::Device device = mt::Device::cpu())
      : scale(mt::full({1}, s, mt::TensorOptions(DType::kF32).device(device))),
        tracker(mt::full({1}, t, mt::TensorOptions(DType::kI32).device(device))),
        found_inf(mt::zeros({1}, mt::TensorOptions(DType::kF32).device(device))) {}
  float scale_value() const { return mt::raw::to(scale, mt::Device::cpu()).item<float>(); }
  int32_t tracker_value() const { return mt::raw::to(tracker, mt::Device::cpu()).item<int32_t>(); }
};

/// A found-inf sequence: clean steps, single overflows, a NaN flag and a combined flag of 2 (two optimizers).
std::vector<float> found_inf_sequence() {
  std::vector<float> seq;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 40; ++i) seq.push_back(i % 7 == 3 ? 1.0f : i % 11 == 5 ? 2.0f : i == 29 ? nan : 0.0f);
  return seq;
}

}  // namespace

BOOST_AUTO_TEST_CASE(amp_update_scale_follows_pytorchs_state_machine, MT_CPU_TEST) {
  // Hand-written: interval 3, an overflow at step 3 (0-based), init 1024.
  {
    ScaleState st(1024.0f, 0);
    const float found[] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    const float want_scale[] = {1024, 1024, 2048, 1024, 1024, 1024, 2048, 2048, 2048, 4096};
    const int32_t want_tracker[] = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0};
    for (int i = 0; i < 10; ++i) {
      mt::raw::fill_(st.found_inf, found[i]);
      const uint64_t version = st.scale.version();
      kn::amp_update_scale_(st.scale, st.tracker, st.found_inf, 2.0, 0.5, 3);
      BOOST_TEST(st.scale_value() == want_scale[i], "step " << i);
      BOOST_TEST(st.tracker_value() == want_tracker[i], "step " << i);
      BOOST_TEST(st.scale.version() == version + 1, "step " << i << ": the scale's version is bumped");
    }
  }
  // Against the reference over a long sequence, for several intervals and factors (non-powers of two: the
  // products are rounded from double to f32 once).
  struct Config {
    double growth, backoff;
    int32_t interval;
    float init;
  };
  for (const Config& c : {Config{2.0, 0.5, 1, 65536.0f}, Config{2.0, 0.5, 2, 3.0f}, Config{3.0, 0.3, 3, 1000.0f},
                          Config{1.1, 0.9, 5, 7.5f}}) {
    BOOST_TEST_CONTEXT("growth " << c.growth << ", backoff " << c.backoff << ", interval " << c.interval) {
      ScaleState st(c.init, 0);
      ScaleReference ref{c.init, 0};
      int i = 0;
      for (float found : found_inf_sequence()) {
        mt::raw::fill_(st.found_inf, found);
        kn::amp_update_scale_(st.scale, st.tracker, st.found_inf, c.growth, c.backoff, c.interval);
        ref.update(found, c.growth, c.backoff, c.interval);
        BOOST_TEST(st.scale_value() == ref.scale, "step " << i << " (found_inf " << found << ")");
        BOOST_TEST(st.tracker_value() == ref.tracker, "step " << i);
        ++i;
      }
    }
  }
  // The scale never grows to inf: at FLT_MAX / 1.5, x2 would overflow, so it stays (and the tracker resets).
  ScaleState big(FLT_MAX / 1.5f, 0);
  kn::amp_update_scale_(big.scale, big.tracker, big.found_inf, 2.0, 0.5, 1);
  BOOST_TEST(big.scale_value() == FLT_MAX / 1.5f);
  BOOST_TEST(big.tracker_value() == 0);
}

BOOST_AUTO_TEST_CASE(amp_update_scale_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  const Tensor scale = mt::full({1}, 2.0), tracker = mt::zeros({1}, DType::kI32), found = mt::zeros({1});
  auto expect_invariant_error = [](const std::function<void()>& f, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
      expect_error(f, {"kernels::amp_update_scale_", "its invariant"});
    }
  };
  expect_invariant_error([&] { kn::amp_update_scale_(mt::full({1}, 2.0, DType::kF64), tracker, found, 2, 0.5, 3); },
                         "an f64 scale");
  expect_invariant_error([&] { kn::amp_update_scale_(scale, mt::zeros({1}, DType::kI64), found, 2, 0.5, 3); },
                         "an i64 tracker");
  expect_invariant_error([&] { kn::amp_update_scale_(scale, tracker, mt::zeros({2}), 2, 0.5, 3); },
                         "found_inf of 2 elements");
  expect_invariant_error([&] { kn::amp_update_scale_(scale, tracker, found, 2, 0.5, 0); }, "growth_interval 0");
}

BOOST_AUTO_TEST_CASE(amp_update_scale_on_cuda_matches_the_cpu, MT_GPU_TEST) {
  for (int32_t interval : {1, 3}) {
    ScaleState cpu(1000.0f, 0), dev(1000.0f, 0, mt::Device::cuda());
    int i = 0;
    for (float found : found_inf_sequence()) {
      mt::raw::fill_(cpu.found_inf, found);
      mt::raw::fill_(dev.found_inf, found);
      kn::amp_update_scale_(cpu.scale, cpu.tracker, cpu.found_inf, 3.0, 0.3, interval);
      kn::amp_update_scale_(dev.scale, dev.tracker, dev.found_inf, 3.0, 0.3, interval);
      BOOST_TEST(dev.scale_value() == cpu.scale_value(), "interval " << interval << ", step " << i);
      BOOST_TEST(dev.tracker_value() == cpu.tracker_value(), "interval " << interval << ", step " << i);
      ++i;
    }
  }
}

// ---- foreach_norm, foreach_mul_, foreach_clamp_ ----------------------------------------------------------------

namespace {

const double kOrders[] = {2.0, std::numeric_limits<double>::infinity(), 1.0, 3.0, 0.5};

/// The ord-norm of the values in float64.
double reference_norm(const std::vector<double>& v, double ord) {
  double acc = 0;
  for (double e : v) {
    if (std::isinf(ord)) acc = std::isnan(e) || std::isnan(acc) ? std::numeric_limits<double>::quiet_NaN()
                                                                 : std::max(acc, std::fabs(e));
    else acc += std::pow(std::fabs(e), ord);
  }
  return std::isinf(ord) ? acc : std::pow(acc, 1.0 / ord);
}

/// The tolerance of a norm summed in opmath. f32: the kernels add at most 4096 terms in 8 interleaved
/// accumulators before adding blocks (ops/cpu/foreach.cpp; CUDA's per-thread and tree sums are shorter), so for
/// the <= 2145-element tensors here the relative error of the sum is below (2145/8 + 8)·2^-24 ≈ 1.7e-5, plus an
/// ulp or two for pow/sqrt; the final root of order p multiplies it by 1/p. f64: the same count at 2^-53.
Tolerance norm_tolerance(DType dt, double ord) {
  const double amplify = std::isinf(ord) ? 1.0 : std::max(1.0, 1.0 / ord);
  return dt == DType::kF64 ? Tolerance{1e-13 * amplify, 0.0} : Tolerance{2e-5 * amplify, 0.0};
}

/// Every tensor of `ts` holds its own values: the expected per-tensor norms, and the output's dtype.
void check_norms(const std::vector<Tensor>& ts, double ord, const Tensor& got, const std::string& what) {
  bool any_f64 = false;
  for (const Tensor& t : ts) any_f64 |= t.dtype() == DType::kF64;
  expect_shape(got, {static_cast<int64_t>(ts.size())}, any_f64 ? DType::kF64 : DType::kF32, what);
  const std::vector<double> g = values(got);
  for (size_t i = 0; i < ts.size(); ++i) {
    const double want = reference_norm(values(ts[i]), ord);
    const Tolerance tol = norm_tolerance(ts[i].dtype(), ord);
    const bool ok = (std::isnan(want) && std::isnan(g[i])) || g[i] == want ||
                    std::fabs(g[i] - want) <= tol.atol + tol.rtol * std::fabs(want);
    BOOST_TEST(ok, what << ": tensor " << i << " (" << ts[i].dtype() << " " << ts[i].shape() << "): norm " << g[i]
                        << ", float64 reference " << want);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(foreach_norm_matches_f64_reference, MT_CPU_TEST) {
  for (double ord : kOrders) {
    BOOST_TEST_CONTEXT("ord " << ord) {
      const std::vector<Tensor> mixed = mixed_list(60000);
      check_norms(mixed, ord, kn::foreach_norm(mixed, ord), "a list of every dtype (f64 output)");
      std::vector<Tensor> no_f64;
      for (const Tensor& t : mixed)
        if (t.dtype() != DType::kF64) no_f64.push_back(t);
      check_norms(no_f64, ord, kn::foreach_norm(no_f64, ord), "f32/f16/bf16 (f32 output)");
      // A long f32 tensor: the block sums' bound holds past one block.
      const std::vector<Tensor> long_one = {input({3, 5000}, DType::kF32, -2, 2, 60500)};
      check_norms(long_one, ord, kn::foreach_norm(long_one, ord), "15000 f32 elements");
    }
  }
}

BOOST_AUTO_TEST_CASE(foreach_norm_sums_f16_in_f32, MT_CPU_TEST) {
  // 1000 f16 values of 300: squares of 9e4 > 65504 would overflow an f16 sum; the f32 sum is exact.
  const Tensor g = mt::full({1000}, 300.0, DType::kF16);
  const Tensor norms = kn::foreach_norm(std::vector<Tensor>{g}, 2.0);
  BOOST_TEST(norms.dtype() == DType::kF32);
  BOOST_TEST(norms.item<float>() == static_cast<float>(std::sqrt(9e7)));
}

BOOST_AUTO_TEST_CASE(foreach_norm_propagates_inf_and_nan, MT_CPU_TEST) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double ord : kOrders)
    for (double bad : {inf, -inf, nan}) {
      std::vector<Tensor> ts = mixed_list(61000);
      poke(ts[5], bad);  // the 2-D tensor of the list's second dtype
      const std::vector<double> got = values(kn::foreach_norm(ts, ord));
      BOOST_TEST_CONTEXT("ord " << ord << ", " << bad << " in tensor 5") {
        BOOST_TEST((std::isnan(bad) ? std::isnan(got[5]) : got[5] == inf), "norm " << got[5]);
        BOOST_TEST(std::isfinite(got[0]), "the other tensors keep finite norms: " << got[0]);
      }
    }
}

BOOST_AUTO_TEST_CASE(foreach_mul_and_clamp_match_f64_reference, MT_CPU_TEST) {
  // mul_: one product in opmath_t<T> with the factor converted to it, one rounding.
  for (DType factor_dtype : {DType::kF32, DType::kF64}) {
    const double f = factor_dtype == DType::kF32 ? static_cast<double>(1.0f / 3.0f) : 0.1;
    const std::vector<Tensor> ts = mixed_list(62000);
    std::vector<std::vector<double>> want;
    for (const Tensor& t : ts) {
      std::vector<double> v = values(t);
      for (double& e : v)
        e = t.dtype() == DType::kF64 ? e * f : round_to(t.dtype(), static_cast<float>(e) * static_cast<float>(f));
      want.push_back(v);
    }
    kn::foreach_mul_(ts, mt::full({1}, f, factor_dtype));
    for (size_t i = 0; i < ts.size(); ++i)
      expect_values(ts[i], want[i], kExact, describe("foreach_mul_ by ", factor_dtype, " ", f, ": tensor ", i, " (",
                                                     ts[i].dtype(), " ", ts[i].shape(), ")"));
  }
  // clamp_: the bounds converted to opmath_t<T>, one rounding; NaN stays NaN.
  const double lo = -0.3, hi = 1.7;
  std::vector<Tensor> ts = mixed_list(63000);
  poke(ts[0], std::numeric_limits<double>::quiet_NaN());
  std::vector<std::vector<double>> want;
  for (const Tensor& t : ts) {
    std::vector<double> v = values(t);
    for (double& e : v) {
      if (std::isnan(e)) continue;
      e = t.dtype() == DType::kF64
              ? std::min(std::max(e, lo), hi)
              : round_to(t.dtype(), std::min(std::max(static_cast<float>(e), static_cast<float>(lo)),
                                             static_cast<float>(hi)));
    }
    want.push_back(v);
  }
  kn::foreach_clamp_(ts, lo, hi);
  for (size_t i = 0; i < ts.size(); ++i)
    expect_values(ts[i], want[i], kExact, describe("foreach_clamp_: tensor ", i, " (", ts[i].dtype(), " ",
                                                   ts[i].shape(), ")"));
}

BOOST_AUTO_TEST_CASE(foreach_norm_mul_clamp_invariants_are_checked_at_the_entry_point, MT_CPU_TEST) {
  const std::vector<Tensor> ok = {mt::zeros({2, 3}), mt::zeros({4}, DType::kF16)};
  const std::vector<Tensor> with_integers = {mt::zeros({2, 3}), mt::zeros({3}, DType::kI64)};
  const std::vector<Tensor> with_expanded = {mt::zeros({2, 3}), mt::zeros({3}).expand({2, 3})};
  expect_error([&] { kn::foreach_norm(std::vector<Tensor>{}, 2.0); }, {"kernels::foreach_norm", "no tensor"});
  expect_error([&] { kn::foreach_norm(ok, 0.0); }, {"kernels::foreach_norm", "its invariant"});
  expect_error([&] { kn::foreach_norm(ok, std::numeric_limits<double>::quiet_NaN()); },
               {"kernels::foreach_norm", "its invariant"});
  expect_error([&] { kn::foreach_norm(with_integers, 2.0); }, {"kernels::foreach_norm", "its invariant"});
  expect_error([&] { kn::foreach_mul_(ok, mt::full({1}, 2.0, DType::kF16)); }, {"kernels::foreach_mul_", "invariant"});
  expect_error([&] { kn::foreach_mul_(ok, mt::full({2}, 2.0)); }, {"kernels::foreach_mul_", "invariant"});
  expect_error([&] { kn::foreach_mul_(with_expanded, mt::full({1}, 2.0)); }, {"kernels::foreach_mul_", "invariant"});
  expect_error([&] { kn::foreach_clamp_(ok, 1.0, -1.0); }, {"kernels::foreach_clamp_", "invariant"});
  expect_error([&] { kn::foreach_clamp_(with_integers, -1.0, 1.0); }, {"kernels::foreach_clamp_", "invariant"});
}

BOOST_AUTO_TEST_CASE(foreach_norm_mul_clamp_on_cuda_match_the_cpu, MT_GPU_TEST) {
  for (double ord : kOrders) {
    const std::vector<Tensor> cpu = mixed_list(64000);
    std::vector<Tensor> dev;
    for (const Tensor& t : cpu) dev.push_back(same_view_on_gpu(t));
    const Tensor got = kn::foreach_norm(dev, ord);
    BOOST_TEST(got.is_cuda());
    check_norms(cpu, ord, mt::raw::to(got, mt::Device::cpu()), describe("cuda, ord ", ord));
  }
  {  // past one block of partial sums: 1<<22 elements
    const std::vector<Tensor> big = {input({1 << 22}, DType::kF32, -1, 1, 64500)};
    const Tensor got = kn::foreach_norm(std::vector<Tensor>{gpu(big[0])}, 2.0);
    expect_close(got, kn::foreach_norm(big, 2.0), {1e-5, 0.0}, "the 2-norm of 4M f32 elements, cuda vs cpu");
  }
  for (DType factor_dtype : {DType::kF32, DType::kF64}) {
    const std::vector<Tensor> cpu = mixed_list(65000);
    std::vector<Tensor> dev;
    for (const Tensor& t : cpu) dev.push_back(same_view_on_gpu(t));
    kn::foreach_mul_(cpu, mt::full({1}, 0.1, factor_dtype));
    kn::foreach_mul_(dev, gpu(mt::full({1}, 0.1, factor_dtype)));
    for (size_t i = 0; i < cpu.size(); ++i) expect_same_bits(dev[i], cpu[i], describe("foreach_mul_: tensor ", i));
  }
  std::vector<Tensor> cpu = mixed_list(66000);
  poke(cpu[1], std::numeric_limits<double>::quiet_NaN());
  std::vector<Tensor> dev;
  for (const Tensor& t : cpu) dev.push_back(same_view_on_gpu(t));
  kn::foreach_clamp_(cpu, -0.3, 1.7);
  kn::foreach_clamp_(dev, -0.3, 1.7);
  for (size_t i = 0; i < cpu.size(); ++i) expect_same_bits(dev[i], cpu[i], describe("foreach_clamp_: tensor ", i));
}

// ---- CUDA's multi-tensor launches ---------------------------------------------------------------------------

namespace {

namespace kc = mixtape::kernels::cuda;

/// Plans `numels` (tensor i at list index 10 + i) and checks every launch and the coverage.
void expect_a_sound_plan(const std::vector<int64_t>& numels, int max_runs, int64_t max_blocks) {
  std::vector<kc::ChunkTensor> tensors;
  for (size_t i = 0; i < numels.size(); ++i) tensors.push_back({static_cast<int>(10 + i), numels[i]});
  std::vector<int64_t> covered(numels.size(), 0);  // each tensor's elements so far, in order
  int launches = 0;
  int64_t total_blocks = 0;
  size_t last_tensor = 0;
  kc::plan_chunk_launches<64>(tensors, max_runs, max_blocks, [&](std::span<const kc::ChunkRun> runs, int blocks) {
    ++launches;
    total_blocks += blocks;
    BOOST_TEST_CONTEXT("launch " << launches) {
      BOOST_TEST(!runs.empty());
      BOOST_TEST(static_cast<int>(runs.size()) <= max_runs);
      BOOST_TEST(blocks >= 1);
      BOOST_TEST(blocks <= max_blocks);
      int next_block = 0;
      for (const kc::ChunkRun& r : runs) {
        BOOST_TEST(r.first_block == next_block);
        const size_t t = static_cast<size_t>(r.index - 10);
        BOOST_REQUIRE(t < numels.size());
        BOOST_TEST(t >= last_tensor, "tensors in the list's order");
        last_tensor = t;
        BOOST_TEST(r.begin == covered[t], "run of tensor " << t << " starts where the last one ended");
        BOOST_TEST(r.end > r.begin);
        BOOST_TEST(r.end <= numels[t]);
        BOOST_TEST(r.begin % kc::kChunkElements == 0, "chunks aligned in their tensor");
        covered[t] = r.end;
        next_block += static_cast<int>(kc::chunk_blocks(r.begin, r.end));
      }
      BOOST_TEST(next_block == blocks, "the grid is the runs' blocks");
    }
  });
  for (size_t t = 0; t < numels.size(); ++t) BOOST_TEST(covered[t] == numels[t], "tensor " << t << " covered");
  int64_t want_blocks = 0;
  for (int64_t n : numels) want_blocks += kc::chunk_blocks(0, n);
  BOOST_TEST(total_blocks == want_blocks, "no block twice");
  if (numels.empty()) BOOST_TEST(launches == 0);
}

/// Sizes around the chunk's: one element, a chunk less one, a chunk, a chunk and one, several chunks and a rest.
const std::vector<int64_t> kAwkwardSizes = {1,  kc::kChunkElements - 1, kc::kChunkElements, kc::kChunkElements + 1,
                                            3 * kc::kChunkElements + 17, 70000, 2};

/// A list of n tensors of kAwkwardSizes' sizes in turn, cycling over the floating dtypes, with every fifth one
/// transposed (a strided tensor: a launch of its own), values in [-4, 4).
std::vector<Tensor> long_list(size_t n, uint64_t seed) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = kAwkwardSizes[i % kAwkwardSizes.size()];
    const DType dt = kFloatTypes[i % std::size(kFloatTypes)];
    if (i % 5 == 4 && numel % 2 == 0) ts.push_back(input({2, numel / 2}, dt, -4, 4, ++seed, Layout::kTransposed));
    else ts.push_back(input({numel}, dt, -4, 4, ++seed));
  }
  return ts;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_multi_tensor_plan_covers_every_element_once, MT_CPU_TEST) {
  std::vector<int64_t> many;
  for (int i = 0; i < 300; ++i) many.push_back(kAwkwardSizes[static_cast<size_t>(i) % kAwkwardSizes.size()]);
  const std::vector<int64_t> huge = {5, int64_t{1} << 40, 3};  // 2^28 blocks: cut in 5 by a limit of 2^26
  for (int max_runs : {1, 2, 32, 64})
    for (int64_t max_blocks : {int64_t{1}, int64_t{3}, int64_t{100}, int64_t{1} << 30})
      BOOST_TEST_CONTEXT("max_runs " << max_runs << ", max_blocks " << max_blocks) {
        expect_a_sound_plan({}, max_runs, max_blocks);
        expect_a_sound_plan({kc::kChunkElements}, max_runs, max_blocks);
        expect_a_sound_plan(kAwkwardSizes, max_runs, max_blocks);
        expect_a_sound_plan(many, max_runs, max_blocks);
        if (max_blocks == int64_t{1} << 30) {
          expect_a_sound_plan(huge, max_runs, max_blocks);
          expect_a_sound_plan(huge, max_runs, int64_t{1} << 26);
        }
      }
  // As few launches as the limits allow: 300 tensors of at most 70000 elements, 64 runs a launch: 5 launches.
  int launches = 0;
  std::vector<kc::ChunkTensor> tensors;
  for (size_t i = 0; i < many.size(); ++i) tensors.push_back({static_cast<int>(i), many[i]});
  kc::plan_chunk_launches<64>(tensors, 64, int64_t{1} << 30, [&](std::span<const kc::ChunkRun>, int) { ++launches; });
  BOOST_TEST(launches == 5);
}

BOOST_AUTO_TEST_CASE(multi_tensor_launches_on_cuda_match_the_cpu, MT_GPU_TEST) {
  // 400 tensors: more than one launch's 64 runs for each dtype (about 90 contiguous ones each), tensors of several
  // chunks, strided ones among them.
  const size_t n = 400;
  auto on_gpu = [](const std::vector<Tensor>& cpu) {
    std::vector<Tensor> dev;
    for (const Tensor& t : cpu) dev.push_back(same_view_on_gpu(t));
    return dev;
  };
  {  // the unscale, with a non-finite element at the first element of a tensor's second chunk, and per-tensor flags
    std::vector<Tensor> cpu = long_list(n, 70000);
    for (size_t i : {size_t{4}, size_t{40}, size_t{103}}) {
      BOOST_REQUIRE(cpu[i].dim() == 1 && cpu[i].numel() > kc::kChunkElements);
      cpu[i].set({kc::kChunkElements}, std::numeric_limits<double>::infinity());
    }
    cpu[11].set({0}, std::numeric_limits<double>::quiet_NaN());
    const std::vector<Tensor> dev = on_gpu(cpu);
    const Tensor flags_cpu = mt::zeros({static_cast<int64_t>(n) + 1});
    const Tensor flags_gpu = gpu(flags_cpu);
    kn::non_finite_check_and_unscale_(cpu, flags_cpu, f32_scalar(kInvScale));
    kn::non_finite_check_and_unscale_(dev, flags_gpu, f32_scalar(kInvScale, mt::Device::cuda()));
    std::vector<float> want(n + 1, 0.0f);
    for (size_t i : {size_t{0}, size_t{1 + 4}, size_t{1 + 11}, size_t{1 + 40}, size_t{1 + 103}}) want[i] = 1.0f;
    BOOST_TEST(flags_cpu.to_vector<float>() == want, boost::test_tools::per_element());
    BOOST_TEST(mt::raw::to(flags_gpu, mt::Device::cpu()).to_vector<float>() == want,
               boost::test_tools::per_element());
    for (size_t i = 0; i < n; ++i) expect_same_bits(dev[i], cpu[i], describe("unscale: tensor ", i));
  }
  {
    const std::vector<Tensor> cpu = long_list(n, 71000), dev = on_gpu(cpu);
    kn::foreach_mul_(cpu, mt::full({1}, 0.1));
    kn::foreach_mul_(dev, gpu(mt::full({1}, 0.1)));
    for (size_t i = 0; i < n; ++i) expect_same_bits(dev[i], cpu[i], describe("foreach_mul_: tensor ", i));
  }
  {
    const std::vector<Tensor> cpu = long_list(n, 72000), dev = on_gpu(cpu);
    kn::foreach_clamp_(cpu, -0.3, 1.7);
    kn::foreach_clamp_(dev, -0.3, 1.7);
    for (size_t i = 0; i < n; ++i) expect_same_bits(dev[i], cpu[i], describe("foreach_clamp_: tensor ", i));
  }
}

BOOST_AUTO_TEST_SUITE_END()
