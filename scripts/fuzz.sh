#!/usr/bin/env bash
# scripts/fuzz.sh — builds the libFuzzer targets of fuzz/ with clang 16, AddressSanitizer and UBSan, and runs each
# for a while from its seed corpus (fuzz/corpus/<target>/); `./setup.sh test` runs it for a minute a target.
#
#   scripts/fuzz.sh [SECONDS] [BUILD_DIR]      default 60 seconds a target, build-fuzz/
#   FUZZ_RUNS=10000000 scripts/fuzz.sh         a number of executions a target instead of a time
#   FUZZ_TARGETS="idx"                         some targets only (default: safetensors idx)
#
# Prints each target's executions and executions per second (libFuzzer's final stats) and exits non-zero on a
# finding of any target: a crash, an exception other than mixtape::Error, a sanitizer report, a leak, an input
# that runs over 10 s, or a malloc over 256 MB (no input of 4 KiB needs that: the readers check sizes against the
# bytes there). The finding is saved as BUILD_DIR/findings/<target>-<kind>-<hash>; replay it with
# `BUILD_DIR/fuzz/fuzz_<target> <file>`, then add it to the seed corpus and a regression test. New inputs that
# reach new code go to BUILD_DIR/corpus/<target>/, not into the tree: copy the few worth keeping by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
BUILD_DIR=${2:-build-fuzz}
TARGETS=${FUZZ_TARGETS:-safetensors idx}
JOBS=${JOBS:-$(nproc)}  # for the build; the targets run side by side, one process each

# Only what the targets link is built (core/ and data/); the rest of the tree is configured but not compiled.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DCMAKE_CXX_COMPILER=clang++-16 -DMIXTAPE_CUDA=OFF -DMIXTAPE_FUZZ=ON -DMIXTAPE_SANITIZE=address,undefined \
      -DMIXTAPE_BUILD_TESTS=OFF -DMIXTAPE_BUILD_BENCH=OFF -DMIXTAPE_BUILD_EXAMPLES=OFF ${FUZZ_CMAKE_ARGS:-} >/dev/null
targets=()
for t in $TARGETS; do targets+=("fuzz_$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"

mkdir -p "$BUILD_DIR/findings"
# No use-after-return detection (clang 16's default): its fake stacks, collected at every throw, cost a third of the
# time of a reader that rejects most inputs by throwing; the readers hand out no pointers into their frames.
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=0"
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-16/bin/llvm-symbolizer}
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); else limit=(-max_total_time="$SECONDS_PER_TARGET"); fi

# fuzz <target>: one libFuzzer run, its output in BUILD_DIR/fuzz_<target>.log. The first corpus folder receives
# the new inputs; the seeds are only read.
fuzz() {
  local t=$1 dict=()
  mkdir -p "$BUILD_DIR/corpus/$t"
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  "$BUILD_DIR/fuzz/fuzz_$t" "${limit[@]}" "${dict[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$BUILD_DIR/findings/$t-" \
    "$BUILD_DIR/corpus/$t" "fuzz/corpus/$t" >"$BUILD_DIR/fuzz_$t.log" 2>&1
}

# The targets side by side (one core each), so that a minute each is a minute in all on two cores.
pids=()
for t in $TARGETS; do
  fuzz "$t" &
  pids+=($!)
done
failed=0
i=0
for t in $TARGETS; do
  log=$BUILD_DIR/fuzz_$t.log
  if wait "${pids[$i]}"; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    echo "fuzz.sh: fuzz_$t: $runs executions ($rate/s), $cov, no finding"
  else
    tail -n 60 "$log"
    echo "fuzz.sh: fuzz_$t found a problem; the input is in $BUILD_DIR/findings/, the log in $log" >&2
    failed=1
  fi
  i=$((i + 1))
done
exit $failed
