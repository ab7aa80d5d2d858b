// tests/test_parity.cpp — the CUDA backend against the CPU reference, driven by the op registry.
//
// Every registered op case (tests/op_cases.h: each family's MT_OP_CASEs) runs
// forward and backward on the CPU and on CUDA, in f32, f16 and bf16, from the
// same rounded inputs laid out the same way (a transposed CPU input is a
// transposed CUDA input), and the outputs and every input's gradient must
// agree within the dtype's tolerance. Nothing is skipped for want of a
// kernel: the CUDA table is generated from the kernel list, and a kernel a
// case reaches that CUDA lacks fails the case. Without a device the GPU half
// reports itself skipped; its CPU half checks, in every build with CUDA, that
// the CUDA table holds every kernel of the list.
#include <boost/test/unit_test.hpp>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <mixtape/ops/backend/kernels.h>

#include "op_cases.h"
#include "test_util.h"

namespace mt = mixtape;
namespace kn = mixtape::kernels;
namespace utf = boost::unit_test;
using mt::DType;
using mt::Tensor;

namespace {

/// `t` on `device` with the same shape, strides and offset over a copy of its whole storage, so a view stays the
/// same view (a kernel's strided path runs on both backends).
Tensor same_layout_on(const Tensor& t, mt::Device device) {
  if (!t.defined()) return t;
  if (t.is_contiguous()) return mt::raw::clone(mt::raw::to(t, device));
  const int64_t extent = static_cast<int64_t>(t.storage()->nbytes() / t.itemsize());
  const Tensor base = mt::raw::as_strided(t, mt::Shape{extent}, mt::Shape{1}, 0);
  return mt::raw::as_strided(mt::raw::to(base, device), t.shape(), t.strides(), t.storage_offset());
}

struct Run {
  Tensor out;
  std::vector<Tensor> grads;  // one per input; undefined for inputs that get none
};

/// f(inputs) and the gradients of sum(f · v) with respect to every floating input.
Run run(const mt::test::OpCase& c, const std::vector<Tensor>& inputs, const Tensor& v) {
  std::vector<Tensor> wrt;
  std::vector<size_t> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !mt::is_floating(inputs[i].dtype())) continue;
    wrt.push_back(inputs[i]);
    where.push_back(i);
  }
  Run r;
  r.out = c.f(inputs);
  r.grads.resize(inputs.size());
  if (wrt.empty() || !r.out.requires_grad()) return r;
  const Tensor seed = mt::raw::to(v, r.out.device(), r.out.dtype());
  const std::vector<Tensor> g = mt::autograd::grad({r.out}, wrt, {seed}, false, /*allow_unused=*/true);
  for (size_t k = 0; k < g.size(); ++k) r.grads[where[k]] = g[k];
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(backend_parity)

BOOST_AUTO_TEST_CASE(every_kernel_has_a_cuda_entry, *utf::label("cpu")) {
  for (int i = 0; i < kn::kNumKernels; ++i)
    BOOST_TEST(kn::has_kernel(kn::cpu_backend(), i), "the CPU table lacks " << kn::kKernelNames[i]);
  const kn::Backend* cuda = kn::cuda_backend();
  if (!cuda) {
    BOOST_TEST_MESSAGE("mixtape was built without CUDA: no CUDA table to check");
    return;
  }
  BOOST_TEST((cuda->type == mt::DeviceType::kCUDA));
  BOOST_TEST(cuda->memory != nullptr);
  for (int i = 0; i < kn::kNumKernels; ++i)
    BOOST_TEST(kn::has_kernel(*cuda, i), "the CUDA table lacks " << kn::kKernelNames[i]);
}

BOOST_AUTO_TEST_CASE(every_op_case_agrees_on_cpu_and_cuda, MT_GPU_TEST) {
  const mt::Device gpu = mt::Device::cuda();
  int ran = 0;
  for (const mt::test::OpCase& c : mt::test::op_cases()) {
    if (!c.low_precision) continue;  // the op means nothing below f64 (the case says why)
    if (c.needs_cuda) continue;      // it moves data between devices itself (to_device): no backend to compare
    for (DType dt : {mt::kF32, mt::kF16, mt::kBF16}) {
      std::ostringstream what;
      what << c.op << " [" << c.label << "] in " << dt << ", cuda vs cpu";
      BOOST_TEST_CONTEXT(what.str()) {
        mt::manual_seed(31);
        std::vector<Tensor> cpu, cuda;
        for (const Tensor& t : c.inputs()) {
          // Floating inputs are rounded to the dtype once, on the CPU; both backends see those values.
          Tensor rounded = t.defined() && mt::is_floating(t.dtype()) ? same_layout_on(t.to(dt), mt::Device::cpu()) : t;
          Tensor on_gpu = same_layout_on(rounded, gpu);
          if (rounded.defined() && mt::is_floating(rounded.dtype())) {
            rounded.requires_grad_(true);
            on_gpu.requires_grad_(true);
          }
          cpu.push_back(rounded);
          cuda.push_back(on_gpu);
        }
        Run want, got;
        try {
          mt::Generator g(97);
          const Tensor v = mt::randn(c.f(cpu).shape(), DType::kF64, &g);  // the same seed gradient for both
          want = run(c, cpu, v);
          got = run(c, cuda, v);
        } catch (const mt::Error& e) {
          BOOST_ERROR(what.str() << ": " << e.what());
          continue;
        }
        // Both backends are within the case's tolerance of the f64 truth (tests/test_op_registry.cpp checks the
        // CPU), so they are within twice it of each other.
        const std::optional<mt::test::Tolerance>& over = dt == mt::kF32 ? c.f32 : dt == mt::kF16 ? c.f16 : c.bf16;
        mt::test::Tolerance tol = over ? *over : mt::test::tolerance(dt);
        tol.rtol *= 2;
        tol.atol *= 2;
        BOOST_TEST((got.out.device() == gpu), what.str() << ": the output is on " << got.out.device());
        mt::test::expect_close(got.out.cpu(), want.out, tol, what.str() + ", forward");
        for (size_t i = 0; i < want.grads.size(); ++i) {
          if (!want.grads[i].defined() && !got.grads[i].defined()) continue;
          BOOST_TEST(want.grads[i].defined() == got.grads[i].defined(),
                     what.str() << ": input " << i << " has a gradient on one backend only");
          if (want.grads[i].defined() && got.grads[i].defined())
            mt::test::expect_close(got.grads[i].cpu(), want.grads[i], tol,
                                what.str() + ", gradient of input " + std::to_string(i));
        }
        ++ran;
      }
    }
  }
  BOOST_TEST(ran > 0);
  BOOST_TEST_MESSAGE("backend parity: " << ran << " (case, dtype) runs compared");
}

BOOST_AUTO_TEST_SUITE_END()
