// ops/cpu/dropout.cpp — the dropout keep-mask on the CPU.
//
// The mask is a pure function of (seed, offset + i): one Philox counter per
// element, so the CUDA kernel draws the very same mask.
#include <mixtape/ops/backend/kernels.h>

#include <mixtape/core/random.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device) {
  Tensor mask = empty(shape, DType::kBool);
  bool* m = mask.data<bool>();
  const int64_t n = mask.numel();
  // One Philox counter per element (its first word): the mask of element i
  // depends on (seed, offset + i) only, never on the thread count or device.
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t words[4];
    philox4x32_10(seed, 0, offset + static_cast<uint64_t>(i), words);
    m[i] = static_cast<double>(uniform_float(words[0])) >= p;
  }
  return raw::to(mask, device);
}

}  // namespace mixtape::kernels::cpu
