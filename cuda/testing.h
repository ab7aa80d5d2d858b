// cuda/testing.h — switches for the CUDA backend's own tests (internal: not installed).
//
// Free of CUDA headers, like cuda/runtime.h: every build has these functions (a build without CUDA ignores them),
// so the GPU test suites compile everywhere.
#pragma once

namespace mixtape::cuda {

/// Test mode: when on, every allocation is filled with 0xFF bytes (a NaN in every float dtype) on the current
/// stream before it is handed out, so an output a kernel forgot to write reads back as NaN. Never throws.
void set_poison_allocations(bool on) noexcept;

}  // namespace mixtape::cuda
