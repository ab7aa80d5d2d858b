#!/usr/bin/env bash
# bench/gpu_session.sh — one call's worth of GPU work on a lent machine.
#
# The lent GPU machine has nvcc, CMake and ninja but no network, and none of the Debian packages the build needs
# (Boost.Test, OpenBLAS, zlib's headers, nlohmann-json, CLI11). Before the call, on the workstation:
#   mkdir -p .deb && (cd .deb && apt-get download libboost-test1.74-dev libboost-test1.74.0 libboost1.74-dev \
#     libopenblas-openmp-dev libopenblas0-openmp libgfortran5 zlib1g-dev zlib1g nlohmann-json3-dev libcli11-dev)
# (24 MiB) then run with `.deb` carried:   bash bench/gpu_session.sh [steps...]
#
# Steps (default: build test sanitize bench):
#   build     configure (sm_90 only) and build everything with all cores
#   test      the gpu ctest entries, one job per top-level Boost suite (TEST_TIMEOUT s each, default 300)
#   sass      the GEMM's SASS check (check_gemm_sass) with the cuobjdump the GPU machine has
#   sanitize  compute-sanitizer memcheck and racecheck on every gpu suite (SAN_TOOLS, SAN_SUITES narrow it)
#   bench     the GPU benchmarks that exist in the build
#   mnist     bench/mnist_gpu.py: the MNIST models, mixtape against PyTorch eager (needs data/mnist carried)
#   wide      bench/mnist_gpu.py on the seeds' wide MLP (4096 wide, batch 1024; WIDE_ARGS adds to it): is an fp16
#             step >= 2x faster than fp32, its peak memory about halved (issue 17)
#   profile   Nsight Compute (ncu) on one untimed pass of each benchmark (`--once`): the row kernels'
#             speed of light, occupancy, launch and warp-stall sections, and the GEMM kernels' (NCU_FILTER,
#             a regex on kernel names, narrows it); CSV in ncu_*.csv, a digest in the summary
# Logs go to $OUT (or ./gpu_out when OUT is unset); a summary is printed last.
#
# BUDGET_S=N bounds the whole call to N seconds: a step that would not fit in what is left is skipped with a
# line in the summary, and the long steps (test, sanitize, bench, mnist, profile) get timeouts cut to fit, so the
# logs always come back. A lease has 15 device minutes, start included. On 2026-11-27 (an H200, 4516f3c) three
# calls on one warm machine, each started within seconds of the last (the machine goes back 30 s after a call ends,
# and a new start needs 4 minutes of the lease left), took: start ~35 s, build 82 s from scratch, test 52 s, bench
# ~15 s, mnist 127 s (seeds 0,1,2 with two extra CNN rows), wide 15 s, memcheck of every gpu suite 94 s, profile
# 121 s, racecheck of every suite but test_training ~3 min (6 jobs at once; test_training's 300-step loop needed more
# than 280 s, the per-job cap: it is labelled large now, and an eight-step case stands in).
# The seventh run (2026-11-30, 1800c66, a 900 s lease) took: start ~35 s, build 86 s, test 54, bench ~20, mnist 124
# (seeds 0,1,2, --tf32), wide 17, memcheck of every gpu suite 98, racecheck of five suites 82, sass 5; three calls,
# 788 s held. What it left: racecheck of test_ops, test_training, test_cuda_runtime, test_nn, test_inspect,
# test_cuda_allocator and test_cuda_mlp, and a profile. Since then a3cb7d4 (host code) takes four of the five
# cudaGetDevice a launch asked: the bench step's bench_gpu_launch "add, no grad" row says what that saved (1.90 µs
# over the bare launch in the seventh run, ~1.5 predicted). e50dc2f and df7e893 (host code) changed what every
# gpu suite goes through: the runtime's probe now reads each device's compute capability (the gpu suites must run,
# not skip "CUDA is unavailable": the test step counts skipped units) and the GEMM asks whether its large tile fits
# a block before choosing it (test_cuda_gemm's forced-large cases must still run the large tile on an H100/H200).
# Calls for a 900 s lease (each within seconds of the last):
#   cp ../shared/data/mnist/*.gz data/mnist/    # once, ignored; carry .deb and data/mnist
#   BUDGET_S=330 TEST_TIMEOUT=120 MNIST_ARGS="--seeds 0,1,2 --conv-column-limit-mib 0 --tf32" \
#     bash bench/gpu_session.sh build test bench mnist                                      (timeout_s 350)
#   BUDGET_S=330 SAN_TOOLS=racecheck SAN_SUITES="test_ops test_training test_cuda_runtime test_nn test_inspect \
#     test_cuda_allocator test_cuda_mlp" bash bench/gpu_session.sh build sanitize          (timeout_s 345)
# and with what is left (a warm machine needs no start): memcheck, wide or profile, e.g.
#   BUDGET_S=150 SAN_TOOLS=memcheck bash bench/gpu_session.sh build wide sanitize          (timeout_s 165)
# then give the machine back and fix here what failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
RESULT=$OUT            # what comes back: summary.txt and logs.tgz
OUT=/tmp/mtlogs        # every log, packed into $RESULT/logs.tgz at the end
rm -rf "$OUT"; mkdir -p "$OUT" "$RESULT"
trap 'tar -C /tmp -czf "$RESULT/logs.tgz" mtlogs; cp "$OUT/summary.txt" "$RESULT/"' EXIT
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build test sanitize bench)
PREFIX=/tmp/mtdeps
BUILD=${BUILD:-/tmp/mtbuild}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has_step() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# The budget: DEADLINE is when the last step must have ended (20 s are kept for packing the logs).
export DEADLINE=$(( $(date +%s) + ${BUDGET_S:-86400} - 20 ))
left() { echo $(( DEADLINE - $(date +%s) )); }
# run_step NAME MIN_S: whether to run step NAME, asked for and with at least MIN_S seconds left.
run_step() {
  has_step "$1" || return 1
  [ "$(left)" -ge "$2" ] && return 0
  note "$1: skipped, $(left) s of BUDGET_S left (it needs at least $2)"
  return 1
}
# cap S: S seconds, or what is left of the budget when that is less.
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }

export PATH=/usr/local/cuda/bin:$PATH
if [ ! -d "$PREFIX" ]; then
  mkdir -p "$PREFIX"
  compgen -G ".deb/*.deb" >/dev/null || echo "gpu_session.sh: no .deb/*.deb carried (Boost.Test, OpenBLAS): the build needs them"
  for f in .deb/*.deb; do [ -f "$f" ] && dpkg -x "$f" "$PREFIX"; done
  # A package's absolute links point into /, where nothing was installed: zlib1g-dev's libz.so names
  # /lib/x86_64-linux-gnu/libz.so.1.2.13, so FindZLIB took the static libz.a (not -fPIC: libmixtape.so failed to
  # link on 2026-11-27). Each such link is pointed at its target inside the prefix, where that exists.
  find "$PREFIX" -type l | while read -r link; do
    target=$(readlink "$link")
    case $target in /*) [ -e "$PREFIX$target" ] && ln -sfn "$PREFIX$target" "$link" ;; esac
  done
fi
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIBDIR:$LIBDIR/openblas-openmp:${LD_LIBRARY_PATH:-}
# The MNIST files travel in the ignored data/mnist: ctest's example_mnist_* entries and the mnist step read them.
[ -z "${MIXTAPE_MNIST_DIR:-}" ] && [ -d data/mnist ] && export MIXTAPE_MNIST_DIR=$PWD/data/mnist

note "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
nvcc --version | tail -2 | head -1 | tee -a "$SUMMARY"

if run_step build 60; then
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
    -DMIXTAPE_OPENBLAS_OPENMP_LIBRARY="$LIBDIR/openblas-openmp/libopenblas.so" \
    -DMIXTAPE_OPENBLAS_OPENMP_INCLUDE_DIR="$PREFIX/usr/include/x86_64-linux-gnu/openblas-openmp" \
    >"$OUT/configure.log" 2>&1 || { note "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
  timeout "$(cap 1200)" cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { note "build FAILED"; grep -B2 -A12 -m5 "error" "$OUT/build.log" | head -80; exit 1; }
  note "build: $(( $(date +%s) - t0 )) s"
fi

GPU_SUITES=$(cd "$BUILD" && ctest -N -L gpu | awk '/Test +#/ {print $3}')
# boost_suites EXE: the top-level Boost suites of a test executable (test_ops holds every op family's).
boost_suites() { "$1" --list_content 2>&1 | grep -E '^[A-Za-z0-9_]+[*]?$' | tr -d '*'; }

if run_step test 60; then
  # One job per (gpu ctest entry, top-level Boost suite), four at a time, each with its own log and timeout, so that
  # a hang names its case and costs one job, not the step (2026-11-27: one `ctest -L gpu` spent its 540 s on a
  # test_ops case that never ended, and said neither which nor what the other suites did). Entries that are not
  # Boost executables (the examples' runs) are run through ctest. A job's OpenMP gets its share of the cores.
  t0=$(date +%s)
  for t in $GPU_SUITES; do
    exe=$BUILD/tests/$t
    if [ -x "$exe" ]; then
      for suite in $(boost_suites "$exe"); do echo "$t $suite"; done
    else
      echo "$t -"
    fi
  done | xargs -P 4 -L 1 bash -c '
    t=$0; suite=$1
    limit=$(( DEADLINE - $(date +%s) )); [ $limit -gt ${TEST_TIMEOUT:-300} ] && limit=${TEST_TIMEOUT:-300}
    if [ $limit -lt 10 ]; then echo "  $t/$suite not run: the budget is spent"; exit 0; fi
    log='"$OUT"'/test_${t}_${suite}.log
    s0=$(date +%s)
    if [ "$suite" = - ]; then
      (cd '"$BUILD"' && timeout $limit ctest -R "^$t\$" --output-on-failure --timeout $limit) >$log 2>&1
    else
      OMP_NUM_THREADS=$(( $(nproc) / 4 )) timeout $limit '"$BUILD"'/tests/$t --run_test=$suite --run_test=!@cpu \
        --log_level=unit_scope --report_level=short --color_output=no >$log 2>&1
    fi
    rc=$?
    grep -q "no test cases matching filter" $log && exit 0  # a suite of cpu cases only
    what=""
    [ $rc -eq 124 ] && what="stopped after ${limit} s in: $(grep -E "Entering test case" $log | tail -1 | sed "s/.*Entering test case //")"
    skipped=$(grep "is skipped because" $log | grep -vc "because disabled"); [ "$skipped" -gt 0 ] && skipped=" ($skipped units skipped)" || skipped=""
    echo "  $t/$suite rc=$rc $(( $(date +%s) - s0 )) s$skipped $what"
    if [ $rc -ne 0 ]; then grep -E "error: in|fatal error|memory access|exception|Test is aborted" $log | head -8 | sed "s/^/      /"; fi' \
    | sort | tee -a "$SUMMARY"
  note "tests: $(( $(date +%s) - t0 )) s"
fi

if run_step sass 30; then
  # The GEMM's SASS (HMMA present, no local memory) with the cuobjdump this machine has.
  (cd "$BUILD" && ctest -R check_gemm_sass -V --timeout "$(cap 600)") >"$OUT/check_gemm_sass.log" 2>&1
  note "check_gemm_sass: $(grep -E "tests passed|tests failed" "$OUT/check_gemm_sass.log")"
  grep -iE "HMMA|cuobjdump|LDSM|spill" "$OUT/check_gemm_sass.log" | head -12 | tee -a "$SUMMARY"
fi

if run_step sanitize 60; then
  t0=$(date +%s)
  # One sanitizer job per (tool, executable, top-level Boost suite): test_ops holds every op family's suite, and
  # one job each keeps a job inside its timeout and names the family that fails.
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    for s in ${SAN_SUITES:-$GPU_SUITES}; do
      exe=$BUILD/tests/$s
      [ -x "$exe" ] || continue
      for suite in $(boost_suites "$exe"); do echo "$tool $s $suite"; done
    done
  done | xargs -P 6 -L 1 bash -c '
    tool=$0; s=$1; suite=$2
    log='"$OUT"'/san_${tool}_${s}_${suite}.log
    limit=$(( DEADLINE - $(date +%s) )); [ $limit -gt 280 ] && limit=280
    if [ $limit -lt 15 ]; then echo "  $tool $s/$suite not run: the budget is spent"; exit 0; fi
    timeout $limit compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      '"$BUILD"'/tests/$s --run_test=$suite --run_test=!@cpu --run_test=!@oom --run_test=!@large \
      --log_level=test_suite --report_level=short >$log 2>&1
    rc=$?
    if grep -q "no test cases matching filter" $log; then exit 0; fi  # a suite of cpu cases only
    errs=$(grep -m1 -E "ERROR SUMMARY|RACECHECK SUMMARY" $log)
    [ $rc -eq 124 ] && errs="stopped after ${limit} s ${errs}"
    # 99: the tool found something; any other status comes from the test (a failed case, beside "0 errors").
    [ $rc -ne 0 ] && [ $rc -ne 99 ] && [ $rc -ne 124 ] && errs="a test case FAILED ${errs}"
    echo "  $tool $s/$suite rc=$rc ${errs}"' | sort | tee -a "$SUMMARY"
  note "sanitize: $(( $(date +%s) - t0 )) s"
fi

if run_step bench 30; then
  for b in "$BUILD"/bench/bench_gpu_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    [ "$(left)" -lt 20 ] && { note "== $name: not run, the budget is spent"; continue; }
    timeout "$(cap 240)" "$b" >"$OUT/$name.txt" 2>&1
    note "== $name (rc=$?)"
    tail -${BENCH_TAIL:-70} "$OUT/$name.txt" | tee -a "$SUMMARY"
  done
fi
# mnist_gpu NAME TITLE ARGS...: bench/mnist_gpu.py with ARGS, its output in $OUT/NAME.txt and rows in NAME.jsonl;
# its tables (or the output's tail, when it printed none) go to the summary.
mnist_gpu() {
  local name=$1 title=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$(cap "${MNIST_TIMEOUT:-400}")" python3 bench/mnist_gpu.py --build "$BUILD" \
    --data "${MIXTAPE_MNIST_DIR:-data/mnist}" --json "$OUT/$name.jsonl" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  note "== $title (rc=$rc, $(( $(date +%s) - t0 )) s)"
  if grep -q '^bench/mnist_gpu.py:' "$OUT/$name.txt"; then
    sed -n '/^bench\/mnist_gpu.py:/,$p' "$OUT/$name.txt" | grep . | tee -a "$SUMMARY"
  else
    tail -25 "$OUT/$name.txt" | tee -a "$SUMMARY"
  fi
}
# examples/mnist's models, mixtape against PyTorch eager on this GPU (bench/mnist_gpu.py). The data travels in the
# ignored data/mnist (cp ../shared/data/mnist/*.gz data/mnist/ and carry it); MNIST_ARGS narrows the run.
# shellcheck disable=SC2086  # the *_ARGS are lists of words
run_step mnist 60 && mnist_gpu mnist_gpu "mnist_gpu" --cuda-graph ${MNIST_ARGS:-}
# shellcheck disable=SC2086
run_step wide 60 && mnist_gpu mnist_wide "mnist_gpu, wide MLP" --models mlp --hidden 4096 --batch-size 1024 \
  ${WIDE_ARGS:-}
if run_step profile 60; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$NCU" ]; then
    note "profile: no ncu on this machine"
  else
    t0=$(date +%s)
    sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
    # The stall reasons themselves (the WarpStateStats section's rules name them only where pc sampling ran):
    # warps stalled for each reason per issued instruction, and the instructions a launch executed.
    stalls=""
    for r in long_scoreboard short_scoreboard wait barrier membar math_pipe_throttle mio_throttle lg_throttle \
             not_selected no_instruction branch_resolving dispatch_stall drain misc; do
      stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    metrics="--metrics $stalls,smsp__inst_executed.sum"
    for b in norms gemm; do
      exe=$BUILD/bench/bench_gpu_$b
      [ -x "$exe" ] || continue
      case $b in
        norms) filter=${NCU_FILTER:-softmax|layer_norm|cross_entropy}; count=400 ;;
        gemm) filter=${NCU_FILTER:-gemm}; count=60 ;;
      esac
      [ "$(left)" -lt 30 ] && { note "profile $b: not run, the budget is spent"; continue; }
      # --clock-control none: the clocks as the benchmarks see them (the device README: leave them alone)
      profile() {
        timeout "$(cap 500)" "$NCU" --clock-control none --kernel-name "regex:$filter" --launch-count $count $sections \
          "$@" --csv --page details "$exe" --once >"$OUT/ncu_$b.csv" 2>"$OUT/ncu_$b.err"
      }
      profile $metrics
      rc=$?
      # A metric this ncu does not know fails the whole run: then once more with the sections alone.
      if ! grep -q '^"ID"' "$OUT/ncu_$b.csv" && [ "$(left)" -ge 30 ]; then
        note "profile $b: rc=$rc without rows ($(grep -m1 -i error "$OUT/ncu_$b.err")); again without the stall metrics"
        profile
        rc=$?
      fi
      note "profile $b: rc=$rc $(grep -c '^"' "$OUT/ncu_$b.csv") rows"
      python3 bench/ncu_digest.py "$OUT/ncu_$b.csv" | head -300 | tee -a "$SUMMARY"
    done
    note "profile: $(( $(date +%s) - t0 )) s"
  fi
fi
note "done $(date -u +%T)"
