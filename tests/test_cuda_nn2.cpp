// tests/test_cuda_nn2.cpp — the CUDA convolution-column, pooling, dropout and
// indexing kernels (cuda/{conv,pool,dropout,index}.cu) against the CPU
// reference (ops/cpu/nn2.cpp).
//
// Suite `cuda_nn2` calls the kernels through ops/kernels.h (so validation runs
// too) on the same inputs on both devices: windows with stride 2, padding 1,
// dilation 2 and non-square kernels, the MNIST shapes, non-contiguous
// inputs, NaNs and ties in max-pool windows, repeated indices. Values are
// compared with tests/tolerance.h's table (the CUDA kernels sum in the CPU's
// order and are expected to match it bit for bit, which the table admits);
// indices, masks and byte moves compare exactly. Sums that a scatter would
// race on (col2im, the pooling backwards, index_add) must also give the same
// bits run after run.
//
// Suite `cuda_nn2_ops` runs the differentiable ops (conv2d, max_pool2d,
// avg_pool2d, dropout, index_select) forward and backward on both devices; it
// needs the rest of the CUDA table (elementwise, reductions, matmul) and skips
// until that table has them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/core/raw.h>
#include <mixtape/core/random.h>
#include <mixtape/core/tensor.h>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/ops/ops.h>

#include "test_util.h"
#include "tolerance.h"

namespace mt = mixtape;
namespace kn = mixtape::kernels;
namespace utf = boost::unit_test;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;
using kn::Window2d;

namespace {

constexpr DType kFloatTypes[] = {mt::kF32, mt::kF16, mt::kBF16};

std::string describe(const Window2d& w) {
  std::ostringstream os;
  os << "kernel " << w.kernel[0] << "x" << w.kernel[1] << " stride " << w.stride[0] << "x" << w.stride[1]
     << " padding " << w.padding[0] << "x" << w.padding[1] << " dilation " << w.dilation[0] << "x" << w.dilation[1];
  return os.str();
}

Window2d window(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  return Window2d{{kh, kw}, {sh, sw}, {ph, pw}, {dh, dw}};
}
Window2d window(int64_t k, int64_t s, int64_t p, int64_t d) { return window(k, k, s, s, p, p, d, d); }

/// N(0, 1) values of `shape` in `dtype`, on the CPU, from `seed`.
Tensor randn_cpu(const Shape& shape, DType dtype, uint64_t seed) {
  mt::Generator gen(seed);
  return mt::raw::to(mt::randn(shape, {}, &gen), dtype);
}

Tensor on_cuda(const Tensor& t) { return mt::raw::to(t, Device::cuda()); }

/// A tensor of `shape` whose dims 2 and 3 are swapped in memory: the transpose of a contiguous (…, d3, d2) tensor.
Tensor transposed_23(const Tensor& contiguous_swapped) { return mt::raw::transpose(contiguous_swapped, 2, 3); }

/// Compares `got` (any device) with `want` (the CPU's) under the tolerance of want's dtype (exact for integers
/// and bool); NaN matches NaN. A failure names `what` and prints the first mismatching pairs.
void check_close(const Tensor& got, const Tensor& want, const std::string& what, mt::test::Tolerance tol) {
  BOOST_TEST_REQUIRE(got.dtype() == want.dtype(), what << ": dtype " << got.dtype() << " vs " << want.dtype());
  BOOST_TEST_REQUIRE(got.shape() == want.shape(), what << ": shape " << got.shape() << " vs " << want.shape());
  const std::vector<double> g = got.cpu().to_vector<double>(), w = want.cpu().to_vector<double>();
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool both_nan = std::isnan(g[i]) && std::isnan(w[i]);
    const bool ok = both_nan || g[i] == w[i] || std::fabs(g[i] - w[i]) <= tol.atol + tol.rtol * std::fabs(w[i]);
    if (!ok && bad++ < 5) first << "\n  [" << i << "] cuda " << g[i] << " vs cpu " << w[i];
  }
  BOOST_TEST(bad == 0, what << " (" << want.dtype() << ", shape " << want.shape() << "): " << bad << " of " << g.size()
                            << " elements differ beyond rtol " << tol.rtol << " atol " << tol.atol << first.str());
}

void check_close(const Tensor& got, const Tensor& want, const std::string& what) {
  check_close(got, want, what, mt::test::tolerance(want.dtype()));
}

/// The bytes of two tensors of the same dtype and shape (any devices, any layouts) are identical.
void check_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  BOOST_TEST_REQUIRE(a.dtype() == b.dtype(), what << ": dtype " << a.dtype() << " vs " << b.dtype());
  BOOST_TEST_REQUIRE(a.shape() == b.shape(), what << ": shape " << a.shape() << " vs " << b.shape());
  const Tensor x = mt::raw::contiguous(a.cpu()), y = mt::raw::contiguous(b.cpu());
  int64_t bad = 0, first = -1;
  const auto* xp = static_cast<const unsigned char*>(x.data_ptr());
  const auto* yp = static_cast<const unsigned char*>(y.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::memcmp(xp + i * x.itemsize(), yp + i * y.itemsize(), x.itemsize()) != 0 && bad++ == 0) first = i;
  BOOST_TEST(bad == 0, what << " (" << a.dtype() << ", shape " << a.shape() << "): " << bad
                            << " elements differ in their bits, the first at flat index " << first);
}

struct WindowCase {
  const char* name;
  Shape input;  // (N, C, H, W)
  Window2d w;
};

/// Windows any of the column transforms accepts.
std::vector<WindowCase> conv_cases() {
  return {
      {"k3 s1 p0 d1", {2, 3, 7, 9}, window(3, 1, 0, 1)},
      {"k3 s2 p1 d1", {2, 3, 8, 7}, window(3, 2, 1, 1)},
      {"k3 s1 p1 d2", {2, 3, 9, 8}, window(3, 1, 1, 2)},
      {"k3 s2 p1 d2", {1, 2, 10, 11}, window(3, 2, 1, 2)},
      {"k3 s1 p3 d1 (more padding than a pool allows)", {1, 2, 5, 6}, window(3, 1, 3, 1)},
      {"k2x3 s2x1 p1x0 d1x2", {2, 2, 7, 9}, window(2, 3, 2, 1, 1, 0, 1, 2)},
      {"k1 s1 p0 d1", {3, 4, 5, 5}, window(1, 1, 0, 1)},
  };
}

/// Windows the pools accept (padding at most half the dilated kernel).
std::vector<WindowCase> pool_cases() {
  return {
      {"k2 s2 p0 d1", {2, 3, 8, 9}, window(2, 2, 0, 1)},
      {"k3 s2 p1 d1", {2, 3, 9, 8}, window(3, 2, 1, 1)},
      {"k3 s1 p1 d2", {2, 3, 9, 10}, window(3, 1, 1, 2)},
      {"k3 s2 p1 d2", {1, 2, 11, 10}, window(3, 2, 1, 2)},
      {"k2x3 s1x2 p1x1 d1", {2, 2, 7, 9}, window(2, 3, 1, 2, 1, 1, 1, 1)},
      {"MNIST k2 s2, (128, 32, 28, 28)", {128, 32, 28, 28}, window(2, 2, 0, 1)},
  };
}

std::string label(const char* kernel, const WindowCase& c, DType dt, const char* layout = "contiguous") {
  std::ostringstream os;
  os << kernel << " [" << c.name << "; " << describe(c.w) << "; input " << c.input << "; " << dt << "; " << layout
     << "]";
  return os.str();
}

/// The window's output plane for `input`.
Shape pooled(const Shape& input, const Window2d& w) {
  return {input[0], input[1], kn::window_output_size(input[2], w, 0), kn::window_output_size(input[3], w, 1)};
}

/// Values of `shape` with many ties (five levels) and, when `nans`, a NaN every 37 elements.
Tensor tied(const Shape& shape, DType dtype, bool nans) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = static_cast<double>((i * 7919) % 5) - 2.0;
    if (nans && i % 37 == 11) v[static_cast<size_t>(i)] = std::numeric_limits<double>::quiet_NaN();
  }
  return mt::from_vector(v, shape, mt::TensorOptions(dtype));
}


}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_nn2)

// ---- im2col / col2im ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(im2col_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : conv_cases())
    for (DType dt : kFloatTypes) {
      const Tensor x = randn_cpu(c.input, dt, 11);
      check_close(kn::im2col(on_cuda(x), c.w), kn::im2col(x, c.w), label("im2col", c, dt));
      // The same values through a transposed (non-contiguous) view.
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_cpu(swapped, dt, 12);
      check_close(kn::im2col(transposed_23(on_cuda(base)), c.w), kn::im2col(transposed_23(base), c.w),
                  label("im2col", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(col2im_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : conv_cases())
    for (DType dt : kFloatTypes) {
      const Shape p = pooled(c.input, c.w);
      const int64_t rows = c.input[1] * c.w.kernel[0] * c.w.kernel[1], L = p[2] * p[3];
      const Tensor cols = randn_cpu({c.input[0], rows, L}, dt, 21);
      const Tensor got = kn::col2im(on_cuda(cols), c.input, c.w);
      check_close(got, kn::col2im(cols, c.input, c.w), label("col2im", c, dt));
      check_same_bits(kn::col2im(on_cuda(cols), c.input, c.w), got, label("col2im run twice", c, dt));
      // Columns as the transpose of an (N, L, C·kH·kW) tensor.
      const Tensor cols_base = randn_cpu({c.input[0], L, rows}, dt, 22);
      check_close(kn::col2im(mt::raw::transpose(on_cuda(cols_base), 1, 2), c.input, c.w),
                  kn::col2im(mt::raw::transpose(cols_base, 1, 2), c.input, c.w), label("col2im", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(im2col_col2im_mnist_shapes, MT_GPU_TEST) {
  // The two convolutions of the MNIST example: 1 -> 32 channels (5x5, padding 2), then 32 -> 64 (3x3, padding 1).
  const WindowCase cases[] = {{"MNIST conv1", {128, 1, 28, 28}, window(5, 1, 2, 1)},
                              {"MNIST conv2", {128, 32, 28, 28}, window(3, 1, 1, 1)}};
  for (const WindowCase& c : cases)
    for (DType dt : kFloatTypes) {
      const Tensor x = randn_cpu(c.input, dt, 31);
      const Tensor cols = kn::im2col(x, c.w);
      const Tensor cols_gpu = kn::im2col(on_cuda(x), c.w);
      check_close(cols_gpu, cols, label("im2col", c, dt));
      check_close(kn::col2im(cols_gpu, c.input, c.w), kn::col2im(cols, c.input, c.w), label("col2im", c, dt));
    }
}

// ---- max pooling -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(max_pool2d_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kFloatTypes) {
      const Tensor x = randn_cpu(c.input, dt, 41);
      const kn::MaxPoolResult want = kn::max_pool2d(x, c.w), got = kn::max_pool2d(on_cuda(x), c.w);
      check_close(got.y, want.y, label("max_pool2d y", c, dt));
      check_close(got.indices, want.indices, label("max_pool2d indices", c, dt));
      // Non-contiguous input.
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_cpu(swapped, dt, 42);
      const kn::MaxPoolResult want_t = kn::max_pool2d(transposed_23(base), c.w);
      const kn::MaxPoolResult got_t = kn::max_pool2d(transposed_23(on_cuda(base)), c.w);
      check_close(got_t.y, want_t.y, label("max_pool2d y", c, dt, "transposed"));
      check_close(got_t.indices, want_t.indices, label("max_pool2d indices", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(max_pool2d_ties_and_nans_pick_the_cpus_index, MT_GPU_TEST) {
  // Ties: the first tap in (kh, kw) order wins; a NaN wins and stays (its index is the first NaN's).
  for (const WindowCase& c : pool_cases())
    for (DType dt : kFloatTypes)
      for (bool nans : {false, true}) {
        const Tensor x = tied(c.input, dt, nans);
        const kn::MaxPoolResult want = kn::max_pool2d(x, c.w), got = kn::max_pool2d(on_cuda(x), c.w);
        const char* layout = nans ? "ties and NaNs" : "ties";
        check_close(got.y, want.y, label("max_pool2d y", c, dt, layout));
        check_close(got.indices, want.indices, label("max_pool2d indices", c, dt, layout));
      }
}

BOOST_AUTO_TEST_CASE(max_pool2d_backward_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kFloatTypes) {
      // Ties make several windows pick the same pixel, so dx sums overlapping contributions.
      const Tensor x = tied(c.input, dt, false);
      const kn::MaxPoolResult fwd = kn::max_pool2d(x, c.w);
      const Tensor dy = randn_cpu(fwd.y.shape(), dt, 43);
      const Tensor want = kn::max_pool2d_backward(dy, fwd.indices, c.input, c.w);
      const Tensor got = kn::max_pool2d_backward(on_cuda(dy), on_cuda(fwd.indices), c.input, c.w);
      check_close(got, want, label("max_pool2d_backward", c, dt));
      check_same_bits(kn::max_pool2d_backward(on_cuda(dy), on_cuda(fwd.indices), c.input, c.w), got,
                      label("max_pool2d_backward run twice", c, dt));
      // dy as a transposed view.
      const Shape p = fwd.y.shape(), swapped{p[0], p[1], p[3], p[2]};
      const Tensor dy_base = randn_cpu(swapped, dt, 44);
      check_close(kn::max_pool2d_backward(transposed_23(on_cuda(dy_base)), on_cuda(fwd.indices), c.input, c.w),
                  kn::max_pool2d_backward(transposed_23(dy_base), fwd.indices, c.input, c.w),
                  label("max_pool2d_backward", c, dt, "transposed dy"));
    }
}

// ---- average pooling -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(avg_pool2d_matches_cpu, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kFloatTypes) {
      const Tensor x = randn_cpu(c.input, dt, 51);
      check_close(kn::avg_pool2d(on_cuda(x), c.w), kn::avg_pool2d(x, c.w), label("avg_pool2d", c, dt));
      const Shape swapped{c.input[0], c.input[1], c.input[3], c.input[2]};
      const Tensor base = randn_cpu(swapped, dt, 52);
      check_close(kn::avg_pool2d(transposed_23(on_cuda(base)), c.w), kn::avg_pool2d(transposed_23(base), c.w),
                  label("avg_pool2d", c, dt, "transposed"));
    }
}

BOOST_AUTO_TEST_CASE(avg_pool2d_backward_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  for (const WindowCase& c : pool_cases())
    for (DType dt : kFloatTypes) {
      const Tensor dy = randn_cpu(pooled(c.input, c.w), dt, 53);
      const Tensor got = kn::avg_pool2d_backward(on_cuda(dy), c.input, c.w);
      check_close(got, kn::avg_pool2d_backward(dy, c.input, c.w), label("avg_pool2d_backward", c, dt));
      check_same_bits(kn::avg_pool2d_backward(on_cuda(dy), c.input, c.w), got,
                      label("avg_pool2d_backward run twice", c, dt));
      const Shape p = pooled(c.input, c.w), swapped{p[0], p[1], p[3], p[2]};
      const Tensor base = randn_cpu(swapped, dt, 54);
      check_close(kn::avg_pool2d_backward(transposed_23(on_cuda(base)), c.input, c.w),
                  kn::avg_pool2d_backward(transposed_23(base), c.input, c.w),
                  label("avg_pool2d_backward", c, dt, "transposed dy"));
    }
}

// ---- dropout ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dropout_mask_is_bit_identical_to_the_cpus, MT_GPU_TEST) {
  const uint64_t seeds[] = {0, 42, 0x6d69787461706521ull, 0xffffffffffffffffull};
  // Offsets that carry across the low 32-bit word of the counter, and one far out.
  const uint64_t offsets[] = {0, 5, 0xfffffff0ull, uint64_t{1} << 40};
  const int64_t sizes[] = {1, 7, 1023, 65537};
  const double ps[] = {0.0, 0.1, 0.5, 0.9, 1.0};
  for (uint64_t seed : seeds)
    for (uint64_t offset : offsets)
      for (int64_t n : sizes)
        for (double p : ps) {
          std::ostringstream what;
          what << "dropout_mask [seed " << seed << ", offset " << offset << ", n " << n << ", p " << p << "]";
          const Tensor got = kn::dropout_mask({n}, p, seed, offset, Device::cuda());
          BOOST_TEST_REQUIRE(got.is_cuda(), what.str() << ": mask not on the CUDA device");
          check_same_bits(got, kn::dropout_mask({n}, p, seed, offset, Device::cpu()), what.str());
        }
  // A multi-dimensional shape numbers its elements row-major, as the CPU does.
  check_same_bits(kn::dropout_mask({3, 5, 7}, 0.3, 9, 100, Device::cuda()),
                  kn::dropout_mask({3, 5, 7}, 0.3, 9, 100, Device::cpu()), "dropout_mask (3, 5, 7)");
  BOOST_TEST(kn::dropout_mask({0, 4}, 0.5, 1, 0, Device::cuda()).numel() == 0);
}

// ---- index_select / index_add ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(index_select_matches_cpu, MT_GPU_TEST) {
  const Shape shape{5, 6, 8};
  const std::vector<int64_t> picks{4, 0, 4, 2, 2, 1, 0};  // repeated, unsorted; valid for every dim of `shape`
  const DType dtypes[] = {mt::kF32, mt::kF16, mt::kBF16, mt::kF64, mt::kI64, mt::kI32, mt::kU8, mt::kBool};
  for (DType dt : dtypes)
    for (int64_t dim : {0, 1, 2, -1})
      for (DType it : {mt::kI64, mt::kI32}) {
        std::ostringstream what;
        what << "index_select [x " << shape << ", " << dt << ", dim " << dim << ", index " << it << "]";
        const Tensor x = randn_cpu(shape, dt, 61);
        const Tensor index = mt::from_vector(picks, {static_cast<int64_t>(picks.size())}, mt::TensorOptions(it));
        check_close(kn::index_select(on_cuda(x), dim, on_cuda(index)), kn::index_select(x, dim, index), what.str());
        // A non-contiguous x (inner slices of 5 elements: odd widths take the narrow unit) and a strided index.
        const Tensor xt = mt::raw::transpose(x, 0, 2);  // (8, 6, 5)
        const Tensor every_other = mt::raw::slice(index, 0, 0, static_cast<int64_t>(picks.size()), 2);
        const Tensor every_other_gpu = mt::raw::slice(on_cuda(index), 0, 0, static_cast<int64_t>(picks.size()), 2);
        check_close(kn::index_select(mt::raw::transpose(on_cuda(x), 0, 2), dim, every_other_gpu),
                    kn::index_select(xt, dim, every_other), what.str() + " transposed x, strided index");
        // A 0-D index keeps the dim with size 1.
        const Tensor one = mt::scalar_tensor(2.0, mt::TensorOptions(it));
        check_close(kn::index_select(on_cuda(x), dim, on_cuda(one)), kn::index_select(x, dim, one),
                    what.str() + " 0-D index");
      }
}

BOOST_AUTO_TEST_CASE(index_add_matches_cpu_and_is_deterministic, MT_GPU_TEST) {
  const Shape shape{5, 6, 8};
  const std::vector<int64_t> picks{4, 0, 4, 2, 2, 1, 0, 4, 4};  // rows 3 (and 5 along dims 1, 2) get nothing
  for (DType dt : kFloatTypes)
    for (int64_t dim : {0, 1, 2})
      for (DType it : {mt::kI64, mt::kI32}) {
        std::ostringstream what;
        what << "index_add [shape " << shape << ", " << dt << ", dim " << dim << ", index " << it << "]";
        const Tensor index = mt::from_vector(picks, {static_cast<int64_t>(picks.size())}, mt::TensorOptions(it));
        Shape src_shape = shape;
        src_shape[dim] = static_cast<int64_t>(picks.size());
        const Tensor src = randn_cpu(src_shape, dt, 71);
        const Tensor got = kn::index_add(shape, dim, on_cuda(index), on_cuda(src));
        check_close(got, kn::index_add(shape, dim, index, src), what.str());
        check_same_bits(kn::index_add(shape, dim, on_cuda(index), on_cuda(src)), got, what.str() + " run twice");
      }
  // An embedding-sized gradient: 4096 lookups into 1000 rows of 64, most rows hit several times.
  for (DType dt : kFloatTypes) {
    mt::Generator gen(72);
    const Tensor index = mt::randint(0, 1000, {4096}, mt::TensorOptions(mt::kI64), &gen);
    const Tensor src = randn_cpu({4096, 64}, dt, 73);
    std::ostringstream what;
    what << "index_add [embedding (1000, 64), 4096 indices, " << dt << "]";
    const Tensor got = kn::index_add({1000, 64}, 0, on_cuda(index), on_cuda(src));
    check_close(got, kn::index_add({1000, 64}, 0, index, src), what.str());
    check_same_bits(kn::index_add({1000, 64}, 0, on_cuda(index), on_cuda(src)), got, what.str() + " run twice");
  }
  // No index at all: zeros.
  const Tensor none = mt::empty({0}, mt::TensorOptions(mt::kI64).device(Device::cuda()));
  const Tensor zero_src = mt::empty({3, 0}, mt::TensorOptions(mt::kF32).device(Device::cuda()));
  check_close(kn::index_add({3, 4}, 1, none, zero_src), mt::zeros({3, 4}), "index_add with no index");
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the differentiable ops, end to end ------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_nn2_ops)

namespace {

/// A CPU leaf and its copy on the GPU as a separate leaf, both recording gradients.
struct LeafPair {
  Tensor cpu, gpu;
};
LeafPair leaves(const Tensor& values) {
  LeafPair l{mt::raw::clone(values), on_cuda(values)};
  l.cpu.requires_grad_();
  l.gpu.requires_grad_();
  return l;
}

#define MT_OPS_GPU_TEST *utf::precondition(mt::test::cuda_available()) * utf::label("gpu")

}  // namespace

BOOST_AUTO_TEST_CASE(conv2d_forward_backward, MT_OPS_GPU_TEST) {
  struct Case {
    const char* name;
    Shape x, weight;
    mt::Conv2dOptions o;
  };
  const Case cases[] = {
      {"stride 2, padding 1, dilation 2", {2, 3, 9, 10}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {2, 2}}},
      {"MNIST conv1", {128, 1, 28, 28}, {32, 1, 5, 5}, {{1, 1}, {2, 2}, {1, 1}}},
  };
  for (const Case& c : cases) {
    const LeafPair x = leaves(randn_cpu(c.x, mt::kF32, 81)), w = leaves(randn_cpu(c.weight, mt::kF32, 82));
    const LeafPair b = leaves(randn_cpu({c.weight[0]}, mt::kF32, 83));
    const Tensor y_cpu = mt::conv2d(x.cpu, w.cpu, b.cpu, c.o), y_gpu = mt::conv2d(x.gpu, w.gpu, b.gpu, c.o);
    const Tensor dy = randn_cpu(y_cpu.shape(), mt::kF32, 84);
    y_cpu.backward(dy);
    y_gpu.backward(on_cuda(dy));
    const std::string what = std::string("conv2d [") + c.name + "]";
    // Override: the GEMMs sum their K terms in tile order, not the CPU's. The f32 error of a K-term sum is about
    // sqrt(K)·2^-24·Σ|a·b|: ~1e-5 for y and dx (K = 27..75 products of N(0, 1) values), but dweight and dbias sum
    // N·H_out·W_out = 100 352 products for MNIST conv1 (|Σ| ~ 300, Σ|a·b| ~ 6e4), so they get atol 1e-2.
    check_close(y_gpu, y_cpu, what + " y", {1e-5, 1e-4});
    check_close(x.gpu.grad(), x.cpu.grad(), what + " dx", {1e-5, 1e-4});
    check_close(w.gpu.grad(), w.cpu.grad(), what + " dweight", {1e-4, 1e-2});
    check_close(b.gpu.grad(), b.cpu.grad(), what + " dbias", {1e-4, 1e-2});
  }
}

BOOST_AUTO_TEST_CASE(pools_forward_backward, MT_OPS_GPU_TEST) {
  mt::Pool2dOptions o;  // 2x2, stride 2: MNIST's pool
  for (DType dt : kFloatTypes) {
    const LeafPair x = leaves(randn_cpu({128, 32, 28, 28}, dt, 91));
    const Tensor y_cpu = mt::max_pool2d(x.cpu, o), y_gpu = mt::max_pool2d(x.gpu, o);
    const Tensor dy = randn_cpu(y_cpu.shape(), dt, 92);
    y_cpu.backward(dy);
    y_gpu.backward(on_cuda(dy));
    check_close(y_gpu, y_cpu, "max_pool2d op y");
    check_close(x.gpu.grad(), x.cpu.grad(), "max_pool2d op dx");

    mt::Pool2dOptions a;
    a.kernel_size[0] = a.kernel_size[1] = 3;
    a.stride[0] = a.stride[1] = 2;
    a.padding[0] = a.padding[1] = 1;
    const LeafPair z = leaves(randn_cpu({2, 3, 9, 8}, dt, 93));
    const Tensor v_cpu = mt::avg_pool2d(z.cpu, a), v_gpu = mt::avg_pool2d(z.gpu, a);
    const Tensor dv = randn_cpu(v_cpu.shape(), dt, 94);
    v_cpu.backward(dv);
    v_gpu.backward(on_cuda(dv));
    check_close(v_gpu, v_cpu, "avg_pool2d op y");
    check_close(z.gpu.grad(), z.cpu.grad(), "avg_pool2d op dx");
  }
}

BOOST_AUTO_TEST_CASE(dropout_forward_backward, MT_OPS_GPU_TEST) {
  for (DType dt : kFloatTypes) {
    const LeafPair x = leaves(randn_cpu({64, 513}, dt, 101));
    mt::Generator g_cpu(7), g_gpu(7);  // the same seed: the same mask on both devices
    const Tensor y_cpu = mt::dropout(x.cpu, 0.3, true, &g_cpu), y_gpu = mt::dropout(x.gpu, 0.3, true, &g_gpu);
    const Tensor dy = randn_cpu(y_cpu.shape(), dt, 102);
    y_cpu.backward(dy);
    y_gpu.backward(on_cuda(dy));
    check_close(y_gpu, y_cpu, "dropout op y");
    check_close(x.gpu.grad(), x.cpu.grad(), "dropout op dx");
  }
}

BOOST_AUTO_TEST_CASE(index_select_forward_backward, MT_OPS_GPU_TEST) {
  const std::vector<int64_t> picks{3, 0, 3, 1, 1, 2};
  const Tensor index = mt::from_vector(picks);
  for (DType dt : kFloatTypes)
    for (int64_t dim : {0, 1}) {
      const LeafPair x = leaves(randn_cpu({4, 5, 6}, dt, 111));
      const Tensor y_cpu = mt::index_select(x.cpu, dim, index), y_gpu = mt::index_select(x.gpu, dim, on_cuda(index));
      const Tensor dy = randn_cpu(y_cpu.shape(), dt, 112);
      y_cpu.backward(dy);
      y_gpu.backward(on_cuda(dy));
      const std::string what = "index_select op dim " + std::to_string(dim);
      check_close(y_gpu, y_cpu, what + " y");
      check_close(x.gpu.grad(), x.cpu.grad(), what + " dx");
    }
}

BOOST_AUTO_TEST_SUITE_END()
