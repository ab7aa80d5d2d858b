#!/usr/bin/env bash
# scripts/tsan.sh — builds the CPU library, tests/test_threads.cpp and tests/test_data.cpp with ThreadSanitizer and
# runs test_threads (several threads drawing from the default generator, backward passes on two threads into one
# leaf, two threads training side by side, the DataLoader's worker handing over batches of abandoned epochs) and
# test_data's dataloader suite (its worker's exception, a loader destroyed mid-batch). CI does not run it (a full
# extra build); run it before changing threading code.
#
#   scripts/tsan.sh [BUILD_DIR]        default build-tsan/
#
# OpenMP and OpenBLAS run one thread each here: libgomp is not built with TSan, so its own synchronisation would be
# reported as races. The threads under test are the suite's std::threads.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-tsan}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIXTAPE_CUDA=OFF \
      -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
      -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build "$BUILD_DIR" --target test_threads test_data
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
"$BUILD_DIR"/tests/test_threads --log_level=test_suite
"$BUILD_DIR"/tests/test_data --run_test=dataloader --log_level=test_suite
echo "tsan.sh: ThreadSanitizer found no race in test_threads and test_data/dataloader"
