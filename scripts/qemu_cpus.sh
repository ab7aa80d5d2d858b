#!/usr/bin/env bash
# scripts/qemu_cpus.sh — the CPU suites on CPUs this machine is not: each Boost.Test entry of `ctest -L cpu` run
# under qemu-user's emulation of an older x86-64 (apt-get install qemu-user: a check, not a project dependency).
#
#   scripts/qemu_cpus.sh [BUILD_DIR] [MODEL...]   default build/, then Haswell-v4 (AVX2, F16C, FMA, no AVX-512)
#                                                 and Nehalem (SSE4.2: no AVX, no F16C); `qemu-x86_64 -cpu help`
#
# The binaries are the build's own (it has no -march): a kernel that ran an instruction without asking the CPU
# first would die of SIGILL here, which MIXTAPE_CPU_CAPABILITY's runs on a newer CPU cannot show. The capped and
# e2e entries are left out (the first are what emulation checks better, the second take many minutes emulated).
# QEMU 7.2 (Debian 12) flushes F16C's subnormal results while MXCSR's FTZ/DAZ are set, which hardware does not
# (the SDM: VCVTPS2PH ignores FTZ), so test_half's two bulk cases, which run every conversion table under both MXCSR
# modes, are left out here; `ctest -R test_half` runs them on real hardware, every table this CPU has.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift $(( $# > 0 ? 1 : 0 ))
MODELS=("$@")
[ ${#MODELS[@]} -eq 0 ] && MODELS=(Haswell-v4 Nehalem)
command -v qemu-x86_64 >/dev/null || { echo "qemu_cpus.sh: no qemu-x86_64 (apt-get install qemu-user)"; exit 2; }
mapfile -t COMMANDS < <(ctest --test-dir "$BUILD_DIR" -N -V -L cpu -LE "capped|e2e" 2>/dev/null |
                        sed -n 's/^[0-9]*: Test command: \(.*\/tests\/test_[a-z_0-9]* .*\)$/\1/p')
[ ${#COMMANDS[@]} -gt 0 ] || { echo "qemu_cpus.sh: no test suites in $BUILD_DIR (build it first)"; exit 2; }
export OMP_WAIT_POLICY=passive
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
failed=0
for model in "${MODELS[@]}"; do
  for command in "${COMMANDS[@]}"; do
    eval "args=($command)"
    name=$(basename "${args[0]}")
    [ "$name" = test_half ] &&
      args+=("--run_test=!bulk_conversions/widening_every_pattern:!bulk_conversions/narrowing_edges_ties_and_random")
    if qemu-x86_64 -cpu "$model" "${args[@]}" >"$log" 2>&1; then
      echo "$model: $name${args[4]:+ ${args[*]:4}} ok"
    else
      grep -v "^qemu-x86_64: warning: TCG doesn't support" "$log" | tail -20
      echo "$model: $name${args[4]:+ ${args[*]:4}} FAILED"
      failed=1
    fi
  done
done
exit $failed
