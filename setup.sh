#!/usr/bin/env bash
# setup.sh — installs mixtape's dependencies on Debian 12 and builds, tests or trains.
#
#   ./setup.sh train   install dependencies, build, fetch MNIST (scripts/get_mnist.sh) and train an MLP for one
#                      epoch with build/examples/mnist (the GPU when there is one); extra arguments go to it
#   ./setup.sh test    install dependencies (apt), build, run every test (GPU tests skip without a GPU), then
#                      the CPU suite again under AddressSanitizer + UBSan (scripts/sanitize.sh, in BUILD_DIR-sanitize)
#                      and each fuzz target for a minute (scripts/fuzz.sh, in BUILD_DIR-fuzz), and where nvcc is
#                      found the CUDA backend's host checks under a runtime that runs nothing
#                      (scripts/null_runtime.sh, in BUILD_DIR-null-cudart): what CI runs
#   ./setup.sh test-fast  the same build and tests, without the sanitizer build and the fuzzing
#   ./setup.sh build   install dependencies and build only
#   ./setup.sh deps    install dependencies only (those of `test` included)
#
# Runs as root (or through sudo). Packages come from Debian's apt alone; the
# CUDA toolkit is optional and used when nvcc is found (PATH or /usr/local/cuda).
# BUILD_DIR (default build/) and JOBS (default: all cores) may be set.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ git libboost-test-dev libopenblas-openmp-dev nlohmann-json3-dev zlib1g-dev libcli11-dev
          gnuplot-nox curl ca-certificates)
# `test` alone: clang 16 with libFuzzer's runtime and libomp (fuzz/), and llvm-symbolizer for its reports.
CHECK_PACKAGES=(clang-16 libclang-rt-16-dev libomp-16-dev llvm-16)
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

deps() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_WERROR=ON
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

run_tests() {
  # The MNIST end-to-end test (tests/test_mnist_e2e.cpp) runs when the data is there, and skips otherwise.
  if [ -z "${MIXTAPE_MNIST_DIR:-}" ] && ls data/mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
    export MIXTAPE_MNIST_DIR=$PWD/data/mnist
  fi
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
}

# The sanitizer build's CPU suite, a minute of each fuzz target and the CUDA host checks under a runtime that runs
# nothing: after the plain tests, so that a plain failure is reported first and fast.
run_checks() {
  JOBS=$JOBS ./scripts/sanitize.sh "$BUILD_DIR-sanitize"
  JOBS=$JOBS ./scripts/fuzz.sh 60 "$BUILD_DIR-fuzz"
  JOBS=$JOBS ./scripts/null_runtime.sh "$BUILD_DIR-null-cudart"
}

train() {
  ./scripts/get_mnist.sh
  "$BUILD_DIR"/examples/mnist --model mlp --epochs 1 "$@"
}

case "${1:-test}" in
  deps) deps "${CHECK_PACKAGES[@]}" ;;
  build) deps; build ;;
  test) deps "${CHECK_PACKAGES[@]}"; build; run_tests; run_checks ;;
  test-fast) deps; build; run_tests ;;
  train) shift; deps; build; train "$@" ;;
  *) echo "usage: $0 [deps|build|test|test-fast|train]" >&2; exit 2 ;;
esac
