// cuda/foreach.cu — the multi-tensor kernels on the GPU: one pass over a list of tensors.
//
// For the optimizers and the loss scaler (optim/). The loss scaler's unscale
// reads the scale and writes its found-inf flag on the device, so a training
// step never waits for the host. Today each tensor of the list is one
// grid-stride launch over its elements (any layout, cuda/launch.cuh's
// offsets); a launch that covers many tensors at once is the GPU issue's
// work, and will take this entry's place without changing its contract.
#include <mixtape/ops/backend/kernels.h>

#include <cstdint>

#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

namespace {

/// x = x · inv_scale over x's elements, and *found_inf = 1 when an element (before scaling) is inf or NaN.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) unscale_kernel(T* x,                      // (L's shape), strides L[0]
                                                                OffsetLayout<1> L,
                                                                float* found_inf,          // (1)
                                                                const float* inv_scale) {  // (1)
  using M = opmath_t<T>;
  const M inv = static_cast<M>(*inv_scale);
  bool non_finite = false;
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[1];
    element_offsets(L, i, off);
    const M v = static_cast<M>(x[off[0]]);
    non_finite |= !isfinite(v);
    x[off[0]] = convert<T>(v * inv);
  }
  if (non_finite) *found_inf = 1.0f;  // every writer writes the same value
}

}  // namespace

void non_finite_check_and_unscale_(std::span<const Tensor> tensors, const Tensor& found_inf, const Tensor& inv_scale) {
  if (tensors.empty()) return;
  DeviceGuard guard(found_inf.device());
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const auto L = offset_layout(make_strided_layout<1>(t.shape(), {&t.strides()}, {int64_t{1}}));
    dispatch_floating(t.dtype(), "non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      unscale_kernel<T><<<grid_blocks(t.numel()), kBlockThreads, 0, launch_stream()>>>(
          t.data<T>(), L, found_inf.data<float>(), inv_scale.data<float>());
      MT_CUDA_CHECK_LAUNCH("unscale_kernel (", t.dtype(), ", shape ", t.shape(), " on ", t.device(), ")");
    });
  }
}

}  // namespace mixtape::kernels::cuda
