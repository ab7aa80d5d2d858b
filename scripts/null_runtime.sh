#!/usr/bin/env bash
# scripts/null_runtime.sh — the CUDA backend's host logic checked on a machine without a GPU; `./setup.sh test` runs
# it where nvcc is found.
#
#   scripts/null_runtime.sh [BUILD_DIR]     default build-null-cudart/; JOBS (default: all cores)
#
# The one idea: bench/null_cudart.cpp is a CUDA runtime that runs nothing and can pretend to be several devices of
# any compute capability. A build that links CUDA's runtime as a shared library (-DMIXTAPE_CUDA_RUNTIME=Shared; the
# default links it statically, where nothing can stand in for it) loads it instead through LD_LIBRARY_PATH, and two
# checks then ask what no lent GPU machine can show (each has one H100 or H200):
#   bench_null_devices     two devices: every kernel launched on its tensors' device, no work sent to another
#                          device's stream, the caller's device current again after (bench/null_devices.cpp);
#   bench_null_capability  GPUs the kernels were not built for (a T4's 7.5, a V100's 7.0), alone and beside ones
#                          they were: CUDA unavailable with the reason, or the device refused by name; on the others
#                          (an A100, RTX 3090, 4090 and 5090, an H100) nothing launched past the device's limits.
# Values "computed" there are garbage; only where things ran and what was refused is checked. Without nvcc it says
# so and checks nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-null-cudart}
JOBS=${JOBS:-$(nproc)}

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "null_runtime.sh: no nvcc (no CUDA toolkit), so no CUDA backend to check: skipped"
  exit 0
fi
# Kernels for sm_80 alone: none runs here, and one architecture halves their compile time (the host code is the
# same).
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA=ON -DMIXTAPE_CUDA_RUNTIME=Shared \
      -DCMAKE_CUDA_ARCHITECTURES=80 -DMIXTAPE_WERROR=ON -DMIXTAPE_BUILD_TESTS=OFF -DMIXTAPE_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target null_cudart bench_null_devices bench_null_capability

export LD_LIBRARY_PATH=$BUILD_DIR/bench/null_cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
check() {  # check VAR=VALUE... PROGRAM: runs it under the null runtime; any exit but 0 (2: not run) fails
  echo "== $*"
  env "$@"
}
check MIXTAPE_NULL_CUDART_DEVICES=2 "$BUILD_DIR/bench/bench_null_devices"
check MIXTAPE_NULL_CUDART_CAPABILITY=7.5 "$BUILD_DIR/bench/bench_null_capability"
check MIXTAPE_NULL_CUDART_DEVICES=3 MIXTAPE_NULL_CUDART_CAPABILITY=7.0,8.6,9.0 "$BUILD_DIR/bench/bench_null_capability"
check MIXTAPE_NULL_CUDART_DEVICES=3 MIXTAPE_NULL_CUDART_CAPABILITY=8.0,8.9,12.0 "$BUILD_DIR/bench/bench_null_capability"
echo "null_runtime.sh: the CUDA backend's device choice and capability checks held under the null runtime"
