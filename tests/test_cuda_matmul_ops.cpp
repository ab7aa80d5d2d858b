// tests/test_cuda_matmul_ops.cpp — the Tensor Core GEMM behind matmul, linear, bmm and conv2d on CUDA.
//
// tests/test_cuda_gemm.cpp checks the GEMM launcher itself; this suite checks that the ops reach it (the
// precision trace names the kernel that ran) and that what they compute through it matches a float64
// reference of the same rounded inputs: batches that coalesce and ones that do not, broadcast weights,
// transposed views, the fused bias of linear, backward products, the TF32 opt-in and the SIMT fallback.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <mixtape/cuda/runtime.h>
#include <mixtape/mixtape.h>
#include <mixtape/ops/backend/kernels.h>

#include "test_util.h"

namespace mt = mixtape;
using mt::Device;
using mt::DType;
using mt::Shape;
using mt::Tensor;

namespace {

/// ‖got − want‖ / ‖want‖ over all elements, in double, on the host.
double relative_error(const Tensor& got, const Tensor& want) {
  BOOST_REQUIRE_MESSAGE(got.shape() == want.shape(), "shapes " << got.shape() << " vs " << want.shape());
  const std::vector<double> g = got.cpu().to(mt::kF64).contiguous().to_vector<double>();
  const std::vector<double> w = want.cpu().to(mt::kF64).contiguous().to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;  // an unwritten (poisoned) or broken element
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Bounds on the relative Frobenius error against float64 of the same rounded inputs: the output's one
// rounding (f16: 2^-11, bf16: 2^-8 relative, about a third of that in the Frobenius mean) plus f32
// accumulation over K ≤ 4096; TF32 operands keep 10 fraction bits (2^-11 each, two per product).
double bound(DType out) {
  switch (out) {
    case DType::kF16: return 1e-3;
    case DType::kBF16: return 8e-3;
    default: return 1e-5;  // f32 out of f16/bf16 operands, or f32 SIMT
  }
}
constexpr double kTf32Bound = 2e-3;

Tensor cuda_randn(const Shape& shape, DType dtype) { return mt::randn(shape).to(dtype).to(Device::cuda()); }

/// mt::matmul on CUDA vs float64 on the CPU, with the trace entry it must leave.
void check_matmul(const Tensor& a, const Tensor& b, const std::string& kernel, double tol, const std::string& what) {
  Tensor c;
  std::string traced;
  {
    mt::autograd::PrecisionTrace trace;
    c = mt::matmul(a, b);
    traced = trace.str();
  }
  const Tensor ref = mt::matmul(a.cpu().to(mt::kF64), b.cpu().to(mt::kF64));
  const double err = relative_error(c, ref);
  BOOST_TEST_MESSAGE(what << ": " << traced << ", relative error " << err);
  BOOST_TEST(traced == std::string("matmul:") + mt::dtype_name(a.dtype()) + "[" + kernel + "]", what << ": " << traced);
  BOOST_TEST(err < tol, what << ": relative error " << err << " (bound " << tol << ")");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_matmul_ops)

BOOST_AUTO_TEST_CASE(matmul_layouts_and_batches_run_on_tensor_cores, MT_GPU_TEST) {
  mt::manual_seed(31);
  for (DType dt : {mt::kF16, mt::kBF16}) {
    const std::string wmma = std::string("wmma ") + mt::dtype_name(dt), name = mt::dtype_name(dt);
    check_matmul(cuda_randn({37, 61}, dt), cuda_randn({61, 45}, dt), wmma, bound(dt), name + " 2-D, odd sizes");
    check_matmul(cuda_randn({128, 784}, dt), cuda_randn({512, 784}, dt).t(), wmma, bound(dt), name + " x · wᵀ");
    check_matmul(cuda_randn({128, 784}, dt).t(), cuda_randn({128, 512}, dt), wmma, bound(dt), name + " xᵀ · dy");
    check_matmul(cuda_randn({3, 37, 61}, dt), cuda_randn({61, 45}, dt), wmma, bound(dt), name + " broadcast weight");
    check_matmul(cuda_randn({2, 3, 17, 33}, dt), cuda_randn({2, 3, 33, 9}, dt), wmma, bound(dt), name + " 4-D batch");
    // Batch dims that do not coalesce (a permuted batch): one GEMM launch per outer index.
    check_matmul(cuda_randn({3, 4, 16, 24}, dt).permute({1, 0, 2, 3}), cuda_randn({4, 3, 24, 8}, dt), wmma, bound(dt),
                 name + " permuted batch dims");
    check_matmul(cuda_randn({5}, dt), cuda_randn({5, 7}, dt), wmma, bound(dt), name + " 1-D left operand");
    check_matmul(cuda_randn({4, 6}, dt), cuda_randn({6}, dt), wmma, bound(dt), name + " 1-D right operand");
    check_matmul(cuda_randn({2, 0}, dt), cuda_randn({0, 3}, dt), wmma, bound(dt), name + " k = 0");
    // A column slice with a step has unit stride in neither dim: the SIMT kernel reads it in place.
    check_matmul(cuda_randn({20, 30}, dt).slice(1, 0, 30, 2), cuda_randn({15, 9}, dt), "simt f32", bound(dt),
                 name + " strided slice");
  }
  check_matmul(cuda_randn({33, 65}, mt::kF64), cuda_randn({65, 17}, mt::kF64), "simt f64", 1e-12, "f64");
}

BOOST_AUTO_TEST_CASE(f32_is_simt_unless_tf32_is_allowed, MT_GPU_TEST) {
  mt::manual_seed(32);
  const Tensor a = cuda_randn({300, 500}, mt::kF32), b = cuda_randn({500, 200}, mt::kF32);
  BOOST_REQUIRE(!mt::cuda::allow_tf32());
  check_matmul(a, b, "simt f32", bound(mt::kF32), "f32, TF32 off");
  mt::cuda::set_allow_tf32(true);
  check_matmul(a, b, "wmma tf32", kTf32Bound, "f32, TF32 on");
  mt::cuda::set_allow_tf32(false);
  check_matmul(a, b, "simt f32", bound(mt::kF32), "f32, TF32 off again");
}

BOOST_AUTO_TEST_CASE(linear_under_autocast_fuses_the_bias_and_its_backward_matches_the_cpu, MT_GPU_TEST) {
  mt::manual_seed(33);
  for (DType low : {mt::kF16, mt::kBF16}) {
    // f32 master parameters on both devices; autocast casts them to `low` for the GEMM.
    const Tensor x0 = mt::randn({128, 784}), w0 = mt::randn({512, 784}) * 0.05, b0 = mt::randn({512});
    Tensor xs[2], ws[2], bs[2], ys[2];
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? Device::cpu() : Device::cuda();
      xs[d] = x0.to(dev).detach().requires_grad_();
      ws[d] = w0.to(dev).detach().requires_grad_();
      bs[d] = b0.to(dev).detach().requires_grad_();
      mt::amp::Autocast ac(low);
      mt::autograd::PrecisionTrace trace;
      ys[d] = mt::linear(xs[d], ws[d], bs[d]);
      if (d == 1)
        BOOST_TEST(trace.str() == std::string("cast:") + mt::dtype_name(low) + " cast:" + mt::dtype_name(low) +
                                      " cast:" + mt::dtype_name(low) + " linear:" + mt::dtype_name(low) +
                                      "[wmma " + mt::dtype_name(low) + "]",
                   "trace on CUDA: " << trace.str());
    }
    // The same f16/bf16 inputs on both sides; the CPU rounds the f32 product once, as the GEMM's epilogue does.
    BOOST_TEST(relative_error(ys[1], ys[0]) < bound(low), mt::dtype_name(low) << " linear forward");
    const Tensor dy = mt::randn({128, 512});
    ys[0].backward(dy.to(low));
    ys[1].backward(dy.to(low).to(Device::cuda()));
    // Gradients pass through one more rounding (dy, and the f16/bf16 gradient before its cast to f32).
    BOOST_TEST(relative_error(xs[1].grad(), xs[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dx");
    BOOST_TEST(relative_error(ws[1].grad(), ws[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dweight");
    BOOST_TEST(relative_error(bs[1].grad(), bs[0].grad()) < 2 * bound(low), mt::dtype_name(low) << " dbias");
  }
}

BOOST_AUTO_TEST_CASE(addmm_on_cuda_matches_the_cpu, MT_GPU_TEST) {
  mt::manual_seed(34);
  for (DType dt : {mt::kF16, mt::kBF16, mt::kF32})
    for (const auto& [m, k, n] : {std::tuple{1, 1, 1}, {7, 13, 5}, {128, 784, 512}, {128, 256, 10}, {65, 0, 33}}) {
      const Tensor a = mt::randn({m, k}).to(dt), b = mt::randn({n, k}).to(dt).t(), bias = mt::randn({n}).to(dt);
      const Tensor want = mt::kernels::addmm(bias, a, b, a.dtype());
      const Tensor got = mt::kernels::addmm(bias.to(Device::cuda()), a.to(Device::cuda()), b.to(Device::cuda()), a.dtype());
      BOOST_TEST(relative_error(got, want) < bound(dt), mt::dtype_name(dt) << " addmm " << m << "x" << k << "x" << n);
    }
}

BOOST_AUTO_TEST_CASE(conv2d_runs_its_columns_through_the_tensor_cores, MT_GPU_TEST) {
  mt::manual_seed(35);
  const Tensor x = mt::randn({8, 1, 28, 28}).to(mt::kF16), w = mt::randn({16, 1, 5, 5}).to(mt::kF16);
  const Tensor xg = x.to(Device::cuda()), wg = w.to(Device::cuda());
  Tensor y;
  {
    mt::autograd::PrecisionTrace trace;
    y = mt::conv2d(xg, wg);
    BOOST_TEST(trace.str() == "conv2d:f16[wmma f16]", "trace: " << trace.str());
  }
  const Tensor ref = mt::conv2d(x.to(mt::kF64), w.to(mt::kF64));
  BOOST_TEST(relative_error(y, ref) < bound(mt::kF16));
}

BOOST_AUTO_TEST_SUITE_END()
