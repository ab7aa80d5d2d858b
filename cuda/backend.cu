// cuda/backend.cu — the CUDA backend: its memory and every kernel of ops/backend/kernels.h, registered at load.
//
// The table is generated from the kernel list, so a kernel missing from cuda/
// is a link error, not a null entry; registering it installs the CUDA memory
// in core as well (core/device_memory.h). This file is compiled only in
// builds with CUDA: elsewhere no CUDA backend exists, and a CUDA device is an
// error saying how mixtape was built.
#include <mixtape/ops/backend/kernels.h>

namespace mixtape {
namespace cuda {
/// The caching allocator and the copies (cuda/runtime.cu).
DeviceMemory& cuda_memory();
}  // namespace cuda

namespace kernels::cuda {
namespace {

#define MT_KERNEL_FROM_CUDA(ret, name, params, args, invariant) .name = &cuda::name,

const Backend& table() {
  // Never destroyed: tensors released during static destruction still find their memory.
  static const Backend& backend = *new Backend{.type = DeviceType::kCUDA, .memory = &::mixtape::cuda::cuda_memory(),
                                               MT_BACKEND_KERNELS(MT_KERNEL_FROM_CUDA)};
  return backend;
}

[[maybe_unused]] const bool registered = (register_backend(table()), true);

}  // namespace
}  // namespace kernels::cuda
}  // namespace mixtape
