// cuda/check.h — CUDA error codes become mixtape::Error (internal: included by .cu files only).
//
// Every runtime call and every kernel launch is checked (STYLE.md §3), and a
// failure reads like the rest of mixtape's errors: what was being done, the
// CUDA error's name and text, and file:line —
//   "cuda allocator: cudaMalloc of 64 bytes on cuda:0: cudaErrorInvalidValue: invalid argument (cuda/runtime.cu:90)".
// Kernels run asynchronously, so a fault inside one surfaces at a later check
// (typically a copy to the CPU or synchronize()), not at its own launch.
#pragma once

#include <cuda_runtime.h>

#include <mixtape/core/error.h>

/// Evaluates `expr` (a cudaError_t) and throws mixtape::Error with the streamed context when it is not cudaSuccess.
/// The runtime also records a failed call's code as the thread's "last error"; it is cleared here so that it does
/// not resurface as the failure of an unrelated launch checked later.
#define MT_CUDA_CHECK(expr, ...)                                                                                \
  do {                                                                                                          \
    const cudaError_t mt_cuda_status_ = (expr);                                                                 \
    if (mt_cuda_status_ != cudaSuccess) [[unlikely]] {                                                          \
      (void)cudaGetLastError();                                                                                 \
      MT_ERROR(__VA_ARGS__, ": ", cudaGetErrorName(mt_cuda_status_), ": ", cudaGetErrorString(mt_cuda_status_)); \
    }                                                                                                           \
  } while (0)

/// Checks the launch that just happened: `kernel<<<g, b>>>(...); MT_CUDA_CHECK_LAUNCH("copy_kernel");`
/// (bad configuration, too many resources, no kernel image for this GPU, or a sticky error from earlier work).
#define MT_CUDA_CHECK_LAUNCH(...) MT_CUDA_CHECK(cudaGetLastError(), "launching ", __VA_ARGS__)
