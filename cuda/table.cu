// cuda/table.cu — the CUDA kernel table (core/kernel_table.h) that ops/ dispatches through.
//
// Each family's launchers are declared in its header (cuda/elementwise.h,
// cuda/nn.h, cuda/nn2.h) and implemented in its .cu files; this file only
// lists them, so adding a kernel is one line here.
#include <mixtape/core/kernel_table.h>

namespace mixtape::kernels {

const DeviceKernels& cuda_kernels() {
  static const DeviceKernels table{};
  return table;
}

}  // namespace mixtape::kernels
