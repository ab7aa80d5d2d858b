// core/macros.h — the few macros every layer shares.
//
// MT_HD marks a function callable from host and device code, so one scalar
// formula serves the CPU loop and the CUDA kernel alike (STYLE.md §2).
#pragma once

#if defined(__CUDACC__)
#define MT_HD __host__ __device__
#define MT_DEVICE_CODE 1
#else
#define MT_HD
#endif

#define MT_FORCE_INLINE inline __attribute__((always_inline))
