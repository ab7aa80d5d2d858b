// ops/cpu/table.cpp — the CPU's kernel table: the reference every device is tested against.
#include <mixtape/ops/cpu/cpu_kernels.h>
#include <mixtape/ops/cpu/nn2_kernels.h>
#include <mixtape/ops/cpu/nn_kernels.h>

namespace mixtape::kernels {

const DeviceKernels& cpu_kernels() {
  static const DeviceKernels table{
      .unary = &cpu::unary,
      .binary = &cpu::binary,
      .scalar = &cpu::scalar,
      .where = &cpu::where,
      .reduce = &cpu::reduce,
      .matmul = &cpu::matmul,
      .addmm = &cpu::addmm,
      .softmax = &cpu::softmax,
      .softmax_backward = &cpu::softmax_backward,
      .gather = &cpu::gather,
      .scatter_add = &cpu::scatter_add,
      .layer_norm = &cpu::layer_norm,
      .layer_norm_backward = &cpu::layer_norm_backward,
      .cross_entropy = &cpu::cross_entropy,
      .cross_entropy_backward = &cpu::cross_entropy_backward,
      .im2col = &cpu::im2col,
      .col2im = &cpu::col2im,
      .max_pool2d = &cpu::max_pool2d,
      .max_pool2d_backward = &cpu::max_pool2d_backward,
      .avg_pool2d = &cpu::avg_pool2d,
      .avg_pool2d_backward = &cpu::avg_pool2d_backward,
      .dropout_mask = &cpu::dropout_mask,
      .index_select = &cpu::index_select,
      .index_add = &cpu::index_add,
  };
  return table;
}

}  // namespace mixtape::kernels
