// cuda/dropout.cu — dropout's keep-mask drawn on the GPU.
//
// The one design idea: the mask is a pure function of (seed, offset + i), so
// the device calls the very MT_HD Philox function and uniform_float the CPU
// reference calls (core/random.h) and compares in double as it does: the
// same seed and offset give the same bits on both devices, whatever the grid.
// Drawing here saves the CPU draw and the host-to-device copy of N bytes.
// Inside a CUDA graph capture (cuda/graph.h) the offset is read at run time: the capture's offset relative to the
// default generator's at the capture start, plus a base the graph writes before each replay (the generator's
// offset then), so every replay draws the masks the eager steps would have drawn. The draw is the default
// generator's or refused: a replay advances that one only.
#include <algorithm>

#include <cuda_runtime.h>

#include <mixtape/core/random.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cuda {

namespace {

/// mask[i] = uniform_float(philox4x32_10(seed, 0, base + offset + i)[0]) >= p, base = *offset_base (0 when
/// null). Overwrites mask.
__global__ void __launch_bounds__(kBlockThreads) dropout_mask_kernel(bool* __restrict__ mask,  // (numel), contiguous
                                                                   int64_t numel, double p, uint64_t seed,
                                                                   uint64_t offset,
                                                                   const uint64_t* offset_base) {  // (1) or null
  if (offset_base != nullptr) offset += *offset_base;
  for (int64_t i = first_index(); i < numel; i += grid_stride()) {
    uint32_t words[4];
    philox4x32_10(seed, 0, offset + static_cast<uint64_t>(i), words);
    mask[i] = static_cast<double>(uniform_float(words[0])) >= p;
  }
}

}  // namespace

Tensor dropout_mask(const Shape& shape, double p, Generator& generator, Device device) {
  ::mixtape::cuda::detail::Capture& c = ::mixtape::cuda::detail::thread_capture();
  if (c.stream != nullptr)
    MT_CHECK(device.index == c.device, "cuda::Graph::capture on cuda:", c.device, ": dropout on ", device,
             " inside the capture (a graph records the work of its own device only)");
  // Launched on another stream than the capture's, the kernel runs now, not in the graph: an eager draw.
  const bool captured = c.stream != nullptr && launch_stream(device.index) == c.stream;
  if (captured) {
    MT_CHECK(&generator == &default_generator(), "cuda::Graph::capture on cuda:", c.device,
             ": dropout drawing from a generator other than the default one inside a capture (a replay can draw "
             "the default generator's next masks only)");
  }
  ::mixtape::cuda::DeviceGuard guard(device);  // launch on the tensor's device
  Tensor mask = empty(shape, TensorOptions(DType::kBool).device(device));
  const int64_t n = mask.numel();
  auto [seed, offset] = generator.reserve(static_cast<uint64_t>(n));
  const uint64_t* offset_base = nullptr;
  if (captured) {
    MT_CHECK(seed == c.philox_seed && offset >= c.philox_origin, "cuda::Graph::capture on cuda:", c.device,
             ": the default generator was seeded or set back while the capture ran (seed ", c.philox_seed,
             " offset ", c.philox_origin, " at its start, now seed ", seed, " offset ", offset, ")");
    offset -= c.philox_origin;  // each replay adds the generator's offset at that replay
    offset_base = c.philox_base;
    c.philox_drawn += static_cast<uint64_t>(n);
    c.philox_end = std::max(c.philox_end, offset + static_cast<uint64_t>(n));
  }
  if (n == 0) return mask;
  dropout_mask_kernel<<<grid_blocks(n), kBlockThreads, 0, launch_stream()>>>(mask.data<bool>(), n, p, seed, offset,
                                                                             offset_base);
  MT_CUDA_CHECK_LAUNCH("dropout_mask_kernel (shape ", shape, ", p ", p, " on ", device, ")");
  return mask;
}

}  // namespace mixtape::kernels::cuda
