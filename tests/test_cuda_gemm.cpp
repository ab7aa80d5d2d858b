// tests/test_cuda_gemm.cpp — the WMMA Tensor Core GEMM (cuda/gemm.cuh) against a float64 reference.
//
// Every case draws random operands, rounds them to the input dtype, and computes the reference in
// double from exactly those rounded values (TF32: rounded as cvt.rna.tf32 does), so the only errors
// left are the f32 accumulation and the one rounding of the output. The result must match within a
// relative Frobenius bound per output dtype (below), every element of C must have been written (C is
// poisoned with NaN first and must come back finite) and the ldc padding between rows must still be
// NaN (nothing outside C is touched). Shapes cover 1×1×1, primes, 4095³, tall-skinny, K = 0, the
// MNIST layers (batch 128: 784→512→256→10, forward and both backward products), 4096³, every layout,
// every epilogue, both tiles, K split over clusters of 2, 4 and 8 blocks, batches with broadcast operands,
// and operands that cannot take 16-byte copies (odd leading dims, odd K, a base pointer one element off).
// Large problems compare a sample of rows (the edges of the tiles included) and check the rest finite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/core/dtype.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/gemm.cuh>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.h>

#include "test_util.h"

namespace mt = mixtape;
namespace kc = mixtape::kernels::cuda;
using mt::DType;
using mt::Tensor;
using kc::GemmTile;

namespace {

// Bounds on ||C - C_ref||_F / ||C_ref||_F. The output rounding dominates 16-bit outputs: its unit roundoff is
// 2^-11 (f16) and 2^-8 (bf16), and a uniformly distributed rounding error averages u/sqrt(3) in relative terms,
// so those bounds sit ~3x above that. f32 outputs see only the accumulation, and Tensor Cores add each MMA's
// products into the f32 accumulator with truncation, not rounding (Fasi et al., "Numerical behavior of NVIDIA
// tensor cores", 2021): a bias of up to 2^-24 relative per MMA step along K (16 deep for halves, 8 for TF32),
// hence 2e-5 plus 2^-24 per 8 of K (1.4e-4 at K = 16384). One wrong element of a 64×64 tile still moves the
// ratio by ~1e-2.
double frobenius_bound(DType out, int64_t k) {
  const double accumulation = 2e-5 + std::ldexp(1.0, -24) * static_cast<double>(k) / 8.0;
  switch (out) {
    case DType::kF16: return 1e-3 + accumulation;
    case DType::kBF16: return 8e-3 + accumulation;
    default: return accumulation;
  }
}

struct Case {
  int64_t m, n, k;
  DType in = mt::kF16, out = mt::kF32;
  bool ta = false, tb = false;
  int64_t batches = 1;
  bool bias = false;
  DType bias_dtype = mt::kF32;
  bool relu = false;
  GemmTile tile = GemmTile::kAuto;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // extra elements per stored row (ld = cols + pad)
  int64_t off_a = 0, off_b = 0;             // base pointer offset in elements (1: not 16-byte aligned)
  bool broadcast_a = false, broadcast_b = false;  // batch stride 0

  std::string str() const {
    std::ostringstream os;
    os << "m " << m << " n " << n << " k " << k << " batches " << batches << " in " << in << " out " << out << " "
       << (ta ? "T" : "N") << (tb ? "T" : "N") << " tile " << kc::gemm_tile_name(tile);
    if (bias) os << " bias " << bias_dtype;
    if (relu) os << " relu";
    if (pad_a || pad_b || pad_c) os << " pad " << pad_a << "/" << pad_b << "/" << pad_c;
    if (off_a || off_b) os << " offset " << off_a << "/" << off_b;
    if (broadcast_a || broadcast_b) os << " broadcast " << broadcast_a << "/" << broadcast_b;
    return os.str();
  }
};

/// cvt.rna.tf32.f32: keep 10 mantissa bits, round to nearest with ties away from zero.
float round_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

/// A stored operand: `count` matrices of rows × ld (plus `off` leading elements), on the device, and the
/// same rounded values as doubles on the host.
struct Operand {
  Tensor device;             // 1-D, dtype `in`
  std::vector<double> host;  // the rounded values, same indexing
  int64_t ld = 0, batch_stride = 0, off = 0;
  const void* ptr() const {
    return static_cast<const char*>(device.data_ptr()) + off * static_cast<int64_t>(mt::itemsize(device.dtype()));
  }
  double at(int64_t batch, int64_t r, int64_t c) const {
    return host[static_cast<size_t>(off + batch * batch_stride + r * ld + c)];
  }
};

Operand make_operand(int64_t rows, int64_t cols, int64_t pad, int64_t off, int64_t batches, bool broadcast, DType in,
                     std::mt19937& rng) {
  Operand op;
  op.ld = cols + pad;
  op.off = off;
  op.batch_stride = broadcast ? 0 : rows * op.ld;
  const int64_t count = broadcast ? 1 : batches;
  const int64_t numel = std::max<int64_t>(1, off + count * rows * op.ld);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(numel));
  for (float& v : values) v = dist(rng);
  const Tensor cpu = mt::from_vector<float>(values, mt::Shape{numel}).to(in);
  op.device = cpu.cuda();
  op.host = cpu.to(mt::kF64).to_vector<double>();
  if (in == mt::kF32)
    for (double& v : op.host) v = round_tf32(static_cast<float>(v));
  return op;
}

/// The stream mixtape's own ops would use on the current device (what c.cpu() waits for).
cudaStream_t current_stream() {
  void* handle = mt::cuda::current_stream().handle();
  return handle ? static_cast<cudaStream_t>(handle) : cudaStreamLegacy;
}

/// Rows the reference checks: all of them for small problems, else the tile edges and a random sample.
std::vector<int64_t> rows_to_check(int64_t m, int64_t n, int64_t k, int64_t batches, std::mt19937& rng) {
  std::vector<int64_t> rows;
  if (m * n * std::max<int64_t>(k, 1) * batches <= (int64_t{1} << 27)) {
    for (int64_t i = 0; i < m; ++i) rows.push_back(i);
    return rows;
  }
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{63}, int64_t{64}, int64_t{127},
                    int64_t{128}, int64_t{129}, m / 2, m - 2, m - 1})
    if (r >= 0 && r < m) rows.push_back(r);
  std::uniform_int_distribution<int64_t> pick(0, m - 1);
  while (rows.size() < 28) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

void run_case(const Case& cs, uint32_t seed = 1234) {
  BOOST_TEST_CONTEXT(cs.str() << " seed " << seed) {
    std::mt19937 rng(seed);
    const int64_t m = cs.m, n = cs.n, k = cs.k, batches = cs.batches;
    // Stored shapes: A (m, k) or (k, m); B (k, n) or (n, k).
    const Operand a = make_operand(cs.ta ? k : m, cs.ta ? m : k, cs.pad_a, cs.off_a, batches, cs.broadcast_a, cs.in, rng);
    const Operand b = make_operand(cs.tb ? n : k, cs.tb ? k : n, cs.pad_b, cs.off_b, batches, cs.broadcast_b, cs.in, rng);
    Tensor bias_dev;
    std::vector<double> bias_host(static_cast<size_t>(n), 0.0);
    if (cs.bias) {
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> values(static_cast<size_t>(n));
      for (float& v : values) v = dist(rng);
      const Tensor cpu = mt::from_vector<float>(values, mt::Shape{n}).to(cs.bias_dtype);
      bias_dev = cpu.cuda();
      bias_host = cpu.to(mt::kF64).to_vector<double>();
    }
    const int64_t ldc = n + cs.pad_c;
    const int64_t c_numel = batches * m * ldc;
    Tensor c = mt::full({c_numel}, std::numeric_limits<double>::quiet_NaN(),
                        mt::TensorOptions(cs.out).device(mt::Device::cuda()));

    kc::GemmEpilogue epi;
    epi.bias = cs.bias ? bias_dev.data_ptr() : nullptr;
    epi.bias_dtype = cs.bias_dtype;
    epi.relu = cs.relu;
    kc::gemm_tensor_core(m, n, k, batches, cs.in, {a.ptr(), a.ld, cs.ta, a.batch_stride},
                         {b.ptr(), b.ld, cs.tb, b.batch_stride}, c.data_ptr(), ldc, m * ldc, cs.out, epi, current_stream(),
                         cs.tile);
    const std::vector<double> got = c.cpu().to(mt::kF64).to_vector<double>();

    // Every element of C written, nothing between the rows touched.
    int64_t unwritten = 0, touched = 0;
    for (int64_t i = 0; i < batches * m; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        const double v = got[static_cast<size_t>(i * ldc + j)];
        if (j < n && !std::isfinite(v)) ++unwritten;
        if (j >= n && !std::isnan(v)) ++touched;
      }
    BOOST_TEST(unwritten == 0, unwritten << " elements of C not written (still NaN) or not finite");
    BOOST_TEST(touched == 0, touched << " elements of the ldc padding overwritten");

    // The float64 reference of the sampled rows of every batch.
    const std::vector<int64_t> rows = rows_to_check(m, n, k, batches, rng);
    double err2 = 0.0, ref2 = 0.0;
    int shown = 0;
    std::ostringstream first;
    std::vector<double> ref(static_cast<size_t>(n));
    std::vector<double> bdense(static_cast<size_t>(k * n));  // B of one batch, dense (k, n)
    for (int64_t batch = 0; batch < batches; ++batch) {
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < n; ++j)
          bdense[static_cast<size_t>(kk * n + j)] = cs.tb ? b.at(batch, j, kk) : b.at(batch, kk, j);
      for (int64_t i : rows) {
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int64_t kk = 0; kk < k; ++kk) {
          const double av = cs.ta ? a.at(batch, kk, i) : a.at(batch, i, kk);
          const double* brow = bdense.data() + kk * n;
          for (int64_t j = 0; j < n; ++j) ref[static_cast<size_t>(j)] += av * brow[j];
        }
        for (int64_t j = 0; j < n; ++j) {
          double r = ref[static_cast<size_t>(j)] + bias_host[static_cast<size_t>(j)];
          if (cs.relu) r = std::max(r, 0.0);
          const double g = got[static_cast<size_t>((batch * m + i) * ldc + j)];
          const double d = g - r;
          err2 += std::isfinite(d) ? d * d : 1e300;
          ref2 += r * r;
          if (!(std::abs(d) <= 0.05 * std::abs(r) + 0.05) && shown < 5) {
            ++shown;
            first << "\n  [batch " << batch << ", " << i << ", " << j << "] got " << g << ", want " << r;
          }
        }
      }
    }
    const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-30);
    const double bound = ref2 == 0.0 ? 0.0 : frobenius_bound(cs.out, k);
    BOOST_TEST(rel <= bound, "relative Frobenius error " << rel << " > bound " << bound << " over " << rows.size()
                                                         << " rows per batch" << first.str());
    if (ref2 == 0.0) BOOST_TEST(err2 == 0.0, "C should be exactly zero" << first.str());
  }
}

constexpr DType kHalves[] = {mt::kF16, mt::kBF16};
constexpr DType kInputs[] = {mt::kF16, mt::kBF16, mt::kF32};
constexpr DType kOutputs[] = {mt::kF32, mt::kF16, mt::kBF16};

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_gemm_cpu, *boost::unit_test::label("cpu"))

// Argument checks happen before any CUDA call, so they run without a device.
BOOST_AUTO_TEST_CASE(bad_arguments_are_errors_naming_the_shapes) {
  const kc::GemmOperand a{nullptr, 8, false, 0}, b{nullptr, 8, false, 0};
  auto call = [&](DType in, DType out, int64_t m, int64_t ldc) {
    kc::gemm_tensor_core(m, 8, 8, 1, in, a, b, reinterpret_cast<void*>(256), ldc, 0, out, {}, nullptr);
  };
  BOOST_CHECK_THROW(call(mt::kI32, mt::kF32, 8, 8), mt::Error);
  BOOST_CHECK_THROW(call(mt::kF16, mt::kF64, 8, 8), mt::Error);
  BOOST_CHECK_THROW(call(mt::kF16, mt::kF32, -1, 8), mt::Error);
  BOOST_CHECK_THROW(call(mt::kF16, mt::kF32, 8, 4), mt::Error);  // ldc < n
  try {
    call(mt::kF16, mt::kF32, 8, 8);  // null operands with k > 0
    BOOST_ERROR("null operands accepted");
  } catch (const mt::Error& e) {
    BOOST_TEST(std::string(e.what()).find("m 8, n 8, k 8") != std::string::npos, e.what());
  }
  // Empty problems need nothing: not even a device.
  BOOST_CHECK_NO_THROW(kc::gemm_tensor_core(0, 8, 8, 1, mt::kF16, a, b, nullptr, 8, 0, mt::kF32, {}, nullptr));
}

BOOST_AUTO_TEST_CASE(cluster_switch_round_trips) {
  BOOST_TEST(mt::cuda::allow_clusters());  // on by default
  {
    const mt::test::AllowClusters off(false);
    BOOST_TEST(!mt::cuda::allow_clusters());
  }
  BOOST_TEST(mt::cuda::allow_clusters());  // back when the scope ends
  // Names for every tile (messages and the benchmark).
  for (GemmTile tile : {GemmTile::kAuto, GemmTile::kLarge, GemmTile::kSmall, GemmTile::kSplitK2, GemmTile::kSplitK4,
                        GemmTile::kSplitK8})
    BOOST_TEST(std::string(kc::gemm_tile_name(tile)) != "?");
}

BOOST_AUTO_TEST_CASE(tf32_switch_round_trips) {
  const bool before = mt::cuda::allow_tf32();
  mt::cuda::set_allow_tf32(true);
  BOOST_TEST(mt::cuda::allow_tf32());
  mt::cuda::set_allow_tf32(false);
  BOOST_TEST(!mt::cuda::allow_tf32());
  mt::cuda::set_allow_tf32(before);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cuda_gemm_gpu)

BOOST_AUTO_TEST_CASE(tiny_and_prime_shapes_every_layout, MT_GPU_TEST) {
  const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 1}, {7, 1, 3}, {2, 3, 5}, {7, 13, 17}, {31, 37, 41}, {127, 131, 137},
                               {61, 67, 257}, {16, 16, 16}, {17, 16, 15}};
  for (const auto& s : shapes)
    for (DType in : kInputs)
      for (int l = 0; l < 4; ++l) run_case({.m = s[0], .n = s[1], .k = s[2], .in = in, .ta = (l & 1) != 0, .tb = (l & 2) != 0});
}

BOOST_AUTO_TEST_CASE(ragged_edges_every_layout_tile_and_dtype, MT_GPU_TEST) {
  // 200×300×100: partial tiles in m, n and k for both tiles; ld multiples of 8, so both tiles run.
  for (DType in : kInputs)
    for (GemmTile tile : {GemmTile::kLarge, GemmTile::kSmall})
      for (int l = 0; l < 4; ++l)
        run_case({.m = 200, .n = 304, .k = 104, .in = in, .ta = (l & 1) != 0, .tb = (l & 2) != 0, .tile = tile});
  // K tail inside a 16-byte chunk (k = 36: ld 40 keeps rows aligned), every layout, both tiles.
  for (DType in : kHalves)
    for (GemmTile tile : {GemmTile::kLarge, GemmTile::kSmall})
      for (int l = 0; l < 4; ++l)
        run_case({.m = 136, .n = 264, .k = 36, .in = in, .ta = (l & 1) != 0, .tb = (l & 2) != 0, .tile = tile,
                  .pad_a = (l & 1) ? 8 : 4, .pad_b = (l & 2) ? 4 : 8});
}

BOOST_AUTO_TEST_CASE(every_epilogue, MT_GPU_TEST) {
  for (DType in : kInputs)
    for (DType out : kOutputs)
      for (DType bias : kOutputs)
        for (bool relu : {false, true})
          for (GemmTile tile : {GemmTile::kLarge, GemmTile::kSmall})
            run_case({.m = 130, .n = 260, .k = 96, .in = in, .out = out, .tb = true, .bias = true, .bias_dtype = bias,
                      .relu = relu, .tile = tile});
  for (DType out : kOutputs)
    for (bool relu : {false, true}) run_case({.m = 70, .n = 90, .k = 64, .in = mt::kBF16, .out = out, .relu = relu});
}

BOOST_AUTO_TEST_CASE(k_zero_gives_the_bias, MT_GPU_TEST) {
  for (DType out : kOutputs) {
    run_case({.m = 33, .n = 65, .k = 0, .out = out});
    run_case({.m = 33, .n = 65, .k = 0, .out = out, .bias = true, .relu = true});
  }
}

BOOST_AUTO_TEST_CASE(mnist_layers_forward_and_backward, MT_GPU_TEST) {
  // Linear(in, out): y = x·Wᵀ + b with W (out, in): forward NT, dX = dY·W NN, dW = dYᵀ·X TN.
  const int64_t layers[][2] = {{784, 512}, {512, 256}, {256, 10}};
  for (DType in : kHalves)
    for (const auto& l : layers) {
      const int64_t fin = l[0], fout = l[1];
      run_case({.m = 128, .n = fout, .k = fin, .in = in, .out = in, .tb = true, .bias = true, .relu = fout != 10});
      run_case({.m = 128, .n = fin, .k = fout, .in = in, .out = in});
      run_case({.m = fout, .n = fin, .k = 128, .in = in, .out = mt::kF32, .ta = true});
    }
}

BOOST_AUTO_TEST_CASE(tall_skinny_and_long_k, MT_GPU_TEST) {
  run_case({.m = 8192, .n = 16, .k = 64});
  run_case({.m = 16, .n = 8192, .k = 64, .in = mt::kBF16, .tb = true});
  run_case({.m = 64, .n = 64, .k = 16384, .ta = true});
  run_case({.m = 4096, .n = 8, .k = 1024, .in = mt::kBF16, .out = mt::kBF16});
  run_case({.m = 3, .n = 5000, .k = 2048, .in = mt::kF32});
}

BOOST_AUTO_TEST_CASE(batched_and_broadcast, MT_GPU_TEST) {
  for (DType in : kInputs)
    for (GemmTile tile : {GemmTile::kLarge, GemmTile::kSmall}) {
      run_case({.m = 96, .n = 136, .k = 72, .in = in, .batches = 3, .tile = tile});
      run_case({.m = 96, .n = 136, .k = 72, .in = in, .ta = true, .batches = 4, .tile = tile, .broadcast_b = true});
      run_case({.m = 64, .n = 40, .k = 24, .in = in, .tb = true, .batches = 5, .bias = true, .tile = tile,
                .broadcast_a = true});
    }
  run_case({.m = 9, .n = 11, .k = 13, .batches = 7, .pad_a = 1});  // batch strides not multiples of 8
}

BOOST_AUTO_TEST_CASE(operands_without_16_byte_rows, MT_GPU_TEST) {
  for (DType in : kInputs)
    for (int l = 0; l < 4; ++l) {
      const bool ta = (l & 1) != 0, tb = (l & 2) != 0;
      run_case({.m = 100, .n = 90, .k = 77, .in = in, .ta = ta, .tb = tb});                          // odd K and n
      run_case({.m = 128, .n = 256, .k = 64, .in = in, .ta = ta, .tb = tb, .tile = GemmTile::kLarge,
                .pad_a = 1, .pad_c = 3});                                                            // odd lda
      run_case({.m = 128, .n = 256, .k = 64, .in = in, .ta = ta, .tb = tb, .pad_b = 3, .off_b = 1}); // B off by one
      run_case({.m = 64, .n = 64, .k = 64, .in = in, .ta = ta, .tb = tb, .off_a = 1, .off_b = 2});
    }
}

// K split over thread-block clusters (sm_90 and newer; earlier devices run the forced splits as the small tile
// unsplit, and these cases then check that). Ranges of K are uneven (k = 264 is 9 steps of 32 for halves, 17 of
// 16 for TF32; small enough for the sanitizer runs) or shorter than the cluster (k = 20: one step, the other ranks
// add zeros; k = 0: the bias).
// On sm_90 every case must have launched as clusters: a split that quietly ran unsplit (split_k_runs saying no
// for one dtype or layout) would pass the comparisons.
BOOST_AUTO_TEST_CASE(split_k_over_clusters, MT_GPU_TEST) {
  const bool sm90 = mt::cuda::device_properties(mt::cuda::current_device()).major >= 9;
  if (!sm90) BOOST_TEST_MESSAGE("cuda_gemm_gpu/split_k_over_clusters: device before sm_90, the split cases run unsplit");
  const auto run_split = [sm90](const Case& cs) {
    mt::cuda::reset_debug_counters();
    run_case(cs);
    if (sm90)
      BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 1,
                 cs.str() << ": " << mt::cuda::debug_counters().cluster_launches << " cluster launches, expected 1");
  };
  for (GemmTile tile : {GemmTile::kSplitK2, GemmTile::kSplitK4, GemmTile::kSplitK8}) {
    for (DType in : kInputs)
      for (int l = 0; l < 4; ++l)
        run_split({.m = 200, .n = 304, .k = 264, .in = in, .ta = (l & 1) != 0, .tb = (l & 2) != 0, .tile = tile});
    for (DType out : kOutputs)
      for (bool relu : {false, true}) {
        run_split({.m = 130, .n = 100, .k = 520, .in = mt::kBF16, .out = out, .tb = true, .bias = true,
                   .bias_dtype = out, .relu = relu, .tile = tile});
        run_split({.m = 70, .n = 90, .k = 20, .out = out, .bias = true, .relu = relu, .tile = tile});
        run_split({.m = 33, .n = 65, .k = 0, .out = out, .bias = relu, .relu = relu, .tile = tile});
      }
    run_split({.m = 96, .n = 136, .k = 300, .ta = true, .batches = 3, .tile = tile, .broadcast_b = true});
    for (DType in : kInputs)  // no 16-byte rows: element loads from a K offset in every layout
      for (int l = 0; l < 4; ++l)
        run_split({.m = 100, .n = 90, .k = 777, .in = in, .ta = (l & 1) != 0, .tb = (l & 2) != 0, .tile = tile,
                   .off_b = 1});
    run_split({.m = 128, .n = 512, .k = 784, .in = mt::kF16, .out = mt::kF16, .tb = true, .bias = true,
               .relu = true, .tile = tile});  // the MNIST forward
  }
}

// The partial sums of a cluster are added in rank order: two runs give the same bits. On sm_90 the MNIST forward
// runs split (kAuto), and its sums differ in the last bits from the unsplit kernel's: the split did run.
BOOST_AUTO_TEST_CASE(split_k_is_deterministic_and_runs, MT_GPU_TEST) {
  std::mt19937 rng(99);
  const int64_t m = 128, n = 512, k = 784;
  const Operand a = make_operand(m, k, 0, 0, 1, false, mt::kF16, rng);
  const Operand b = make_operand(n, k, 0, 0, 1, false, mt::kF16, rng);
  for (GemmTile tile : {GemmTile::kAuto, GemmTile::kSplitK8, GemmTile::kSplitK4}) {
    std::vector<float> runs[2];
    for (auto& run : runs) {
      Tensor c = mt::full({m, n}, std::numeric_limits<double>::quiet_NaN(),
                          mt::TensorOptions(mt::kF32).device(mt::Device::cuda()));
      kc::gemm_tensor_core(m, n, k, 1, mt::kF16, {a.ptr(), a.ld, false, 0}, {b.ptr(), b.ld, true, 0}, c.data_ptr(), n,
                           0, mt::kF32, {}, current_stream(), tile);
      run = c.cpu().to_vector<float>();
    }
    BOOST_TEST(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0,
               "two runs of tile " << kc::gemm_tile_name(tile) << " differ");
  }
  const GemmTile chosen = kc::gemm_tensor_core_tile(m, n, k, 1, mt::kF16, {a.ptr(), a.ld, false, 0},
                                                    {b.ptr(), b.ld, true, 0});
  BOOST_TEST_MESSAGE("cuda_gemm_gpu: 128 x 512 x 784 runs the " << kc::gemm_tile_name(chosen) << " tile");
  if (mt::cuda::device_properties(mt::cuda::current_device()).major >= 9) {
    BOOST_TEST((chosen == GemmTile::kSplitK2 || chosen == GemmTile::kSplitK4 || chosen == GemmTile::kSplitK8),
               "sm_90 should split K at the MNIST forward, ran " << kc::gemm_tile_name(chosen));
    std::vector<float> outs[2];
    const GemmTile tiles[2] = {GemmTile::kSplitK8, GemmTile::kSmall};
    for (int i = 0; i < 2; ++i) {
      Tensor c = mt::empty({m, n}, mt::TensorOptions(mt::kF32).device(mt::Device::cuda()));
      kc::gemm_tensor_core(m, n, k, 1, mt::kF16, {a.ptr(), a.ld, false, 0}, {b.ptr(), b.ld, true, 0}, c.data_ptr(), n,
                           0, mt::kF32, {}, current_stream(), tiles[i]);
      outs[i] = c.cpu().to_vector<float>();
    }
    BOOST_TEST(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)) != 0,
               "split 8 and unsplit gave the same bits: the split did not run");
    // Clusters off: kAuto and a forced split run the small tile unsplit.
    const mt::test::AllowClusters off(false);
    BOOST_TEST((kc::gemm_tensor_core_tile(m, n, k, 1, mt::kF16, {a.ptr(), a.ld, false, 0}, {b.ptr(), b.ld, true, 0}) ==
                GemmTile::kSmall));
    mt::cuda::reset_debug_counters();
    run_case({.m = 128, .n = 512, .k = 784, .tb = true, .tile = GemmTile::kSplitK8});
    BOOST_TEST(mt::cuda::debug_counters().cluster_launches == 0);
  }
}

// More batches than a grid's y dimension (65535): blocks loop over batches, the pipeline's shared memory is reused
// (after a cluster barrier when split). B differs per batch, so a peer that read a block's partial sums after that
// block had stored its next batch's would add wrong numbers.
BOOST_AUTO_TEST_CASE(more_batches_than_grid_rows, MT_GPU_TEST MT_LARGE_TEST) {
  for (GemmTile tile : {GemmTile::kSmall, GemmTile::kSplitK2})
    run_case({.m = 16, .n = 16, .k = 64, .out = mt::kF16, .batches = 65537, .tile = tile, .broadcast_a = true});
}

// Large squares (sampled references): ctest runs them; the sanitizer runs skip them (MT_LARGE_TEST).
BOOST_AUTO_TEST_CASE(square_4096, MT_GPU_TEST MT_LARGE_TEST) {
  run_case({.m = 4095, .n = 4095, .k = 4095});  // no 16-byte rows: the small tile, 28 sampled rows
  for (DType in : kHalves) run_case({.m = 4096, .n = 4096, .k = 4096, .in = in, .out = in, .tb = in == mt::kBF16});
  run_case({.m = 4096, .n = 4096, .k = 4096, .in = mt::kF32, .out = mt::kF32});
}

BOOST_AUTO_TEST_SUITE_END()
