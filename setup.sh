#!/usr/bin/env bash
# setup.sh — installs mixtape's dependencies on Debian 12 and builds, tests or trains.
#
#   ./setup.sh train   install dependencies, build, fetch MNIST (scripts/get_mnist.sh) and train an MLP for one
#                      epoch with build/examples/mnist (the GPU when there is one); extra arguments go to it
#   ./setup.sh test    install dependencies (apt), build, run every test (GPU tests skip without a GPU)
#   ./setup.sh build   install dependencies and build only
#   ./setup.sh deps    install dependencies only
#
# Runs as root (or through sudo). Packages come from Debian's apt alone; the
# CUDA toolkit is optional and used when nvcc is found (PATH or /usr/local/cuda).
# BUILD_DIR (default build/) and JOBS (default: all cores) may be set.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ git libboost-test-dev libopenblas-openmp-dev nlohmann-json3-dev zlib1g-dev libcli11-dev
          gnuplot-nox curl ca-certificates)
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
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

train() {
  ./scripts/get_mnist.sh
  "$BUILD_DIR"/examples/mnist --model mlp --epochs 1 "$@"
}

case "${1:-test}" in
  deps) deps ;;
  build) deps; build ;;
  test) deps; build; run_tests ;;
  train) shift; deps; build; train "$@" ;;
  *) echo "usage: $0 [deps|build|test|train]" >&2; exit 2 ;;
esac
