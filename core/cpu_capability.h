// core/cpu_capability.h — which x86 instruction sets mixtape's CPU kernels use, and how to ask for fewer.
//
// The CPU kernels compile their F16C, AVX2 and AVX-512 paths with target attributes and pick one at run time (the
// build has no -march), so one binary runs on every x86-64 CPU and uses what it finds. The environment variable
// MIXTAPE_CPU_CAPABILITY (PyTorch's ATEN_CPU_CAPABILITY) lowers that choice, never raises it past the CPU:
//
//   default       the portable loops only
//   avx2          and the F16C conversions (f16 <-> f32 in hardware), the AVX2 conversion tables and the AVX2
//                 + FMA loops (Winograd convolutions, 2x2 max-pool, dropout masks)
//   avx512        and the AVX-512 F/BW/VL loops (max-pool, Winograd convolutions, Adam, dropout masks)
//   avx512_bf16   and the AVX512-BF16 dot products (the bf16 GEMM): all of them, as when the variable is unset
//
// so the paths a CPU without AVX-512 takes can be run and compared on one that has it. The variable is read once,
// at the first question; an unknown value is ignored with one line on stderr (as PyTorch does: the first question
// may come from inside a parallel loop, where an exception cannot leave).
//
//   $ MIXTAPE_CPU_CAPABILITY=avx2 ./build/examples/mnist ...
//   std::cout << mixtape::cpu_capability();   // "avx2" (on a CPU with AVX2, FMA and F16C)
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace mixtape {

/// Instruction-set levels of the CPU kernels, each including the ones before it.
enum class CpuCapability : uint8_t { kDefault, kAvx2, kAvx512, kAvx512Bf16 };

/// The level the CPU kernels run at in this process: the highest this CPU has (AVX2 with FMA and F16C; AVX-512 F,
/// BW and VL; AVX512-BF16 as well), capped by MIXTAPE_CPU_CAPABILITY. A CPU with F16C but no AVX2 (Ivy Bridge) is at
/// kDefault and still converts f16 with F16C unless the variable says "default".
CpuCapability cpu_capability();

/// Whether MIXTAPE_CPU_CAPABILITY lets the kernels use the instructions of `level` (every level when it is unset).
/// Kernels ask it beside the CPU's own answer for the feature they need.
bool cpu_capability_allows(CpuCapability level);

/// "default", "avx2", "avx512", "avx512_bf16": the variable's values.
std::string_view to_string(CpuCapability level);

inline std::ostream& operator<<(std::ostream& os, CpuCapability level) { return os << to_string(level); }

}  // namespace mixtape
