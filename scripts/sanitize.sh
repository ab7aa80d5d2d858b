#!/usr/bin/env bash
# scripts/sanitize.sh — builds the CPU library and its tests with AddressSanitizer (LeakSanitizer included) and
# UndefinedBehaviorSanitizer and runs the CPU suite (ctest -L cpu) under them; `./setup.sh test` runs it.
#
#   scripts/sanitize.sh [BUILD_DIR] [cmake args...]     default build-sanitize/; JOBS (default: all cores)
#
# The one idea: every target of this build is instrumented (CMakeLists.txt's MIXTAPE_SANITIZE), tests/install's
# consumer included, and the first report ends its process, so a finding is a failed test with its stack trace.
# CUDA is off (the sanitizers do not see device code); benchmarks and examples are not built (no test runs them).
# OpenBLAS and libgomp are not instrumented: ASan still sees every allocation (it replaces malloc), not their
# internal reads. MIXTAPE_SANITIZE_EXCLUDE (a ctest -LE regex, e.g. e2e) leaves labels out of the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-sanitize}
shift $(( $# > 0 ? 1 : 0 ))
JOBS=${JOBS:-$(nproc)}

# -O1 -g1: line tables for the stack traces at a fraction of full debug info's compile time; -O1 keeps ASan's
# slowdown of the number-crunching tests (test_ops's float64 references, the MNIST run) near 2x. Warnings are not
# errors here: GCC 12 warns falsely under the sanitizers (-Wmaybe-uninitialized inside libstdc++'s <regex>), and
# the Release build holds the code to -Werror.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DMIXTAPE_CUDA=OFF -DMIXTAPE_SANITIZE=address,undefined -DMIXTAPE_WERROR=OFF \
      -DMIXTAPE_BUILD_BENCH=OFF -DMIXTAPE_BUILD_EXAMPLES=OFF "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

if [ -z "${MIXTAPE_MNIST_DIR:-}" ] && ls data/mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
  export MIXTAPE_MNIST_DIR=$PWD/data/mnist
fi
# allocator_may_return_null: a request beyond ASan's limit returns null, as malloc does, instead of ending the
# process: the suites check that a tensor too large to allocate is a mixtape::Error (tests/test_errors.cpp).
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export ASAN_OPTIONS="$ASAN_OPTIONS:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exclude=()
[ -n "${MIXTAPE_SANITIZE_EXCLUDE:-}" ] && exclude=(-LE "$MIXTAPE_SANITIZE_EXCLUDE")
ctest --test-dir "$BUILD_DIR" -L cpu "${exclude[@]}" --output-on-failure -j "$JOBS"
echo "sanitize.sh: the CPU suite ran clean under AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer"
