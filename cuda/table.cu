// cuda/table.cu — the CUDA kernel table (core/kernel_table.h) that ops/ dispatches through.
//
// Each family's launchers are declared in its header (cuda/elementwise.h,
// cuda/nn.h, cuda/nn2.h) and implemented in its .cu files; this file only
// lists them, so adding a kernel is one line here.
#include <mixtape/core/kernel_table.h>
#include <mixtape/cuda/elementwise.h>
#include <mixtape/cuda/nn.h>
#include <mixtape/cuda/nn2.h>

namespace mixtape::kernels {

const DeviceKernels& cuda_kernels() {
  static const DeviceKernels table{
      .unary = cuda::unary,
      .binary = cuda::binary,
      .scalar = cuda::scalar,
      .where = cuda::where,
      .reduce = cuda::reduce,
      .matmul = cuda::matmul,
      .addmm = cuda::addmm,
      .softmax = cuda::softmax,
      .softmax_backward = cuda::softmax_backward,
      .gather = cuda::gather,
      .scatter_add = cuda::scatter_add,
      .layer_norm = cuda::layer_norm,
      .layer_norm_backward = cuda::layer_norm_backward,
      .cross_entropy = cuda::cross_entropy,
      .cross_entropy_backward = cuda::cross_entropy_backward,
      .im2col = cuda::im2col,
      .col2im = cuda::col2im,
      .max_pool2d = cuda::max_pool2d,
      .max_pool2d_backward = cuda::max_pool2d_backward,
      .avg_pool2d = cuda::avg_pool2d,
      .avg_pool2d_backward = cuda::avg_pool2d_backward,
      .dropout_mask = cuda::dropout_mask,
      .index_select = cuda::index_select,
      .index_add = cuda::index_add,
  };
  return table;
}

}  // namespace mixtape::kernels
