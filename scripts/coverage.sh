#!/usr/bin/env bash
# scripts/coverage.sh — which lines of the library and of examples/mnist no CPU test runs: a clang 16 build with
# source-based coverage (CUDA off), `ctest -L cpu` over it, then llvm-cov's report.
#
#   scripts/coverage.sh [BUILD_DIR]      default build-coverage/; JOBS (default: all cores)
#
# Writes BUILD_DIR/coverage/report.txt (per file: regions, functions and lines run, with the totals) and
# BUILD_DIR/coverage/missed.txt (every line no test ran, as FILE:LINE: text), and prints the totals. Set
# MIXTAPE_MNIST_DIR to count the MNIST end-to-end tests and the example's checks (they skip without it). A reading
# aid, not a gate (CI does not run it): a line no test runs is where to look for a missing test, or for dead code.
# The CUDA backend is not counted (no GPU here), nor tests/, bench/ and fuzz/ themselves. Headers appear under
# BUILD_DIR/layers/, the copies the build compiles against (the layers' include roots); an inline function compiled
# differently into a test and into the library is "mismatched data" to llvm-cov, and its lines read as unrun. Needs
# clang-16 and llvm-16 (`./setup.sh deps` installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-coverage}
JOBS=${JOBS:-$(nproc)}
OUT=$PWD/$BUILD_DIR/coverage

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang-16 \
      -DCMAKE_CXX_COMPILER=clang++-16 -DMIXTAPE_CUDA=OFF -DMIXTAPE_BUILD_BENCH=OFF \
      "-DCMAKE_CXX_FLAGS=-fprofile-instr-generate -fcoverage-mapping" \
      -DCMAKE_EXE_LINKER_FLAGS=-fprofile-instr-generate -DCMAKE_SHARED_LINKER_FLAGS=-fprofile-instr-generate >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

rm -rf "$OUT"
mkdir -p "$OUT/raw"
# %p: one file a process (the example's checks start many); %m: one a binary, merged by llvm-profdata below.
status=0
LLVM_PROFILE_FILE="$OUT/raw/%p-%m.profraw" ctest --test-dir "$BUILD_DIR" -L cpu -j "$JOBS" >"$OUT/ctest.log" 2>&1 ||
  status=$?
llvm-profdata-16 merge -sparse -o "$OUT/all.profdata" "$OUT/raw"/*.profraw

objects=("$BUILD_DIR/libmixtape.so" -object "$BUILD_DIR/examples/mnist")
ignore='/(tests|bench|fuzz)/|^/usr/'
llvm-cov-16 report "${objects[@]}" -instr-profile="$OUT/all.profdata" -ignore-filename-regex="$ignore" \
  >"$OUT/report.txt"
# `show` prints each file's name on a line of its own, then "  LINE|  COUNT|text"; keep the lines counted 0 times.
llvm-cov-16 show "${objects[@]}" -instr-profile="$OUT/all.profdata" -ignore-filename-regex="$ignore" |
  awk '/^\/.*:$/ { file = substr($0, 1, length($0) - 1); next }
       match($0, /^ *[0-9]+\| *0\|/) { split($0, f, "|"); gsub(/ /, "", f[1]);
                                       print file ":" f[1] ": " substr($0, RLENGTH + 1) }' >"$OUT/missed.txt"

grep '^TOTAL' "$OUT/report.txt" |
  awk '{ print "coverage.sh: regions " $4 ", functions " $7 ", lines " $10 " run by the CPU tests" }'
echo "coverage.sh: $(wc -l <"$OUT/missed.txt") lines no test ran: $OUT/missed.txt (per file: $OUT/report.txt)"
if [ "$status" -ne 0 ]; then
  echo "coverage.sh: ctest failed (exit $status, $OUT/ctest.log): what the failing tests did not reach is not counted"
fi
exit "$status"
