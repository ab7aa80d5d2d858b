#!/usr/bin/env bash
# scripts/aarch64.sh — the library, tests and examples cross-built for 64-bit ARM (AArch64: Graviton, Ampere, a
# Raspberry Pi 4/5, Linux on Apple silicon) and the CPU suites run under qemu-user: the x86 kernels must stay behind
# their #if, the portable loops must be the whole library there, and its numerics the same. A check, not a project
# dependency; once, as root:
#
#   dpkg --add-architecture arm64 && apt-get update && apt-get install g++-aarch64-linux-gnu qemu-user \
#     libboost-test-dev:arm64 libopenblas-openmp-dev:arm64 zlib1g-dev:arm64
#
#   scripts/aarch64.sh [BUILD_DIR]   default build-aarch64/; Release, -Werror, no CUDA (nvcc is an x86 program here)
#
# Each Boost.Test entry of `ctest -L cpu` runs emulated on one thread, but for what emulation cannot give: the cases
# that start a thread (QEMU 7.2's aarch64 user mode hung in pthread_create on the machine this was written on, and
# an x86 host's memory order would hide what ARM's weaker one could show), the one that runs a program of the build
# as a child (the guest's exec is not emulated without binfmt_misc), and the capped entries (MIXTAPE_CPU_CAPABILITY's
# levels are x86's). MIXTAPE_MNIST_DIR, when set, reaches the MNIST cases as in ctest.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-aarch64}
triple=aarch64-linux-gnu
missing=()
command -v $triple-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
[ -e /usr/include/boost/test/unit_test.hpp ] && [ -e /usr/lib/$triple/libboost_unit_test_framework.so ] ||
  missing+=(libboost-test-dev:arm64)
[ -e /usr/lib/$triple/openblas-openmp/libopenblas.so ] || missing+=(libopenblas-openmp-dev:arm64)
[ -e /usr/lib/$triple/libz.so ] || missing+=(zlib1g-dev:arm64)
if [ ${#missing[@]} -gt 0 ]; then
  echo "aarch64.sh: missing ${missing[*]} (dpkg --add-architecture arm64; apt-get update; apt-get install them)"
  exit 2
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_WERROR=ON -DMIXTAPE_CUDA=OFF \
  -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_LIBRARY_ARCHITECTURE=$triple \
  -DCMAKE_C_COMPILER=$triple-gcc -DCMAKE_CXX_COMPILER=$triple-g++ \
  -DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-L;/usr/$triple" >/dev/null || exit 1
cmake --build "$BUILD_DIR" || exit 1

# The cases left out, by suite (Boost.Test's --run_test filters); "skip" leaves the whole suite out.
declare -A LEAVE_OUT=(
  [test_threads]=skip
  [test_autograd]='!autograd/a_chain_of_a_million_ops_runs_and_dies_on_a_small_stack'  # a thread with a small stack
  [test_data]='!dataloader:!real_mnist'                                                 # the prefetch worker
  [test_checkpoint]='!checkpoint/a_writer_killed_at_random_moments_always_leaves_a_checkpoint_that_resumes'
  [test_mnist_e2e]=skip                                                                 # trains through DataLoader
)
# The test commands as ctest has them, the emulator first: qemu-aarch64 -L /usr/<triple> <test> <arguments>.
mapfile -t COMMANDS < <(ctest --test-dir "$BUILD_DIR" -N -V -L cpu -LE capped 2>/dev/null |
                        sed -n 's/^[0-9]*: Test command: \(.*\/tests\/test_[a-z_0-9]*" .*\)$/\1/p')
[ ${#COMMANDS[@]} -gt 0 ] || { echo "aarch64.sh: no test suites in $BUILD_DIR"; exit 2; }
export OMP_NUM_THREADS=1
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
failed=0
for command in "${COMMANDS[@]}"; do
  eval "args=($command)"
  name=$(basename "${args[3]}")
  leave=${LEAVE_OUT[$name]:-}
  if [ "$leave" = skip ]; then
    echo "aarch64: $name left out (threads)"
    continue
  fi
  [ -n "$leave" ] && args+=("--run_test=$leave")
  if timeout 1800 "${args[@]}" >"$log" 2>&1; then
    echo "aarch64: $name${leave:+ ($leave)} ok"
  else
    tail -20 "$log"
    echo "aarch64: $name FAILED"
    failed=1
  fi
done
exit $failed
