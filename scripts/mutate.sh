#!/usr/bin/env bash
# scripts/mutate.sh — seeded mutations of the core, one at a time: does the CPU suite notice each bug?
#
#   scripts/mutate.sh [-l LIST] [-f FILTER] [-d SCRATCH] [-j JOBS] [-c COMMAND] [--no-baseline]
#     -l LIST       the mutations (default scripts/mutations.txt; its header describes the format)
#     -f FILTER     only the mutations whose id or file matches this extended regex
#     -d SCRATCH    scratch directory (default build-mutate/): SCRATCH/src is a copy of the working tree,
#                   SCRATCH/build its build, SCRATCH/logs one log per mutant
#     -j JOBS       build and test parallelism (default 2)
#     -c COMMAND    run COMMAND (bash, in SCRATCH/build) instead of the CPU suite: does this one test kill the
#                   mutant? e.g. -c 'tests/test_autograd --run_test=autograd/gradients_accumulate_into_leaves'
#     --no-baseline skip the run of the unmutated suite (only when the scratch copy is known green)
#     --check-list  only check that every mutation of the list applies to the working tree (its search text occurs
#                   exactly once), and stop: ctest's `mutations_apply` runs this, so that the list cannot go stale
#
# The one idea: mutate a copy, never the checkout. The working tree (uncommitted edits included, not git's
# state) is copied into SCRATCH/src file by file, only files that differ, so a second run rebuilds only what
# changed since the first. One build (CUDA off, Release, ccache where installed); then per mutation: apply it (it
# must match exactly once, else the script stops: a list that silently stopped matching would report nothing),
# rebuild incrementally, run `ctest -L cpu` with --stop-on-failure (one failing test kills the mutant), restore the
# file.
#
# Outcomes: KILLED (a test failed or timed out, or a static_assert failed at compile time: a test of the
# constants); SURVIVED (everything passed); BUILD-FAILED (the mutant does not compile for another reason: a
# broken mutation, never counted as killed); NOT-BUILT (the mutant changed nothing the build compiles, so no test
# could see it: counted as BUILD-FAILED); EQUIVALENT (survived, and the list argues it changes no behaviour).
# Exit status 1 when any mutant SURVIVED, BUILD-FAILED or was NOT-BUILT.
#
# Left out of the suite: the MNIST end-to-end run (minutes per mutant), the checkpoint suite (its writer is
# killed 100 times; it tests files, not the maths), test_install and check_layers (CMake packaging and include
# rules, which no mutation of the maths changes), and mutations_apply (which a mutated copy fails by design). The
# example is built only when a mutation of examples/ is selected; its checks then run too, and read MNIST from
# MIXTAPE_MNIST_DIR, which such a run requires (without it they skip, and every such mutant would survive).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIST=$ROOT/scripts/mutations.txt
FILTER=
SCRATCH=$ROOT/build-mutate
JOBS=2
BASELINE=1
CHECK_LIST=0
CHECK_CMD=
EXCLUDE='^(test_mnist_e2e|test_checkpoint|test_install|check_layers|mutations_apply)$'
TEST_TIMEOUT=300  # a mutant that loops forever is killed by the timeout (every test's TIMEOUT capped to it)

while (($#)); do
  case $1 in
    -l) LIST=$(realpath "$2"); shift 2 ;;
    -f) FILTER=$2; shift 2 ;;
    -d) SCRATCH=$(realpath -m "$2"); shift 2 ;;
    -j) JOBS=$2; shift 2 ;;
    -c) CHECK_CMD=$2; shift 2 ;;
    --no-baseline) BASELINE=0; shift ;;
    --check-list) CHECK_LIST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "mutate.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

SRC=$SCRATCH/src BUILD=$SCRATCH/build LOGS=$SCRATCH/logs

# ---- the list ----------------------------------------------------------------------------------------------
# id @@ file @@ search @@ replacement @@ description   (an id starting with '=' marks an argued-equivalent mutant)
declare -a IDS FILES SEARCHES REPLACES DESCS
while IFS= read -r line || [[ -n $line ]]; do
  [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
  # Five fields, four separators; all but the replacement non-blank.
  rest=$line separators=0
  while [[ $rest == *" @@ "* ]]; do rest=${rest#* @@ }; separators=$((separators + 1)); done
  id=${line%% @@ *}; rest=${line#* @@ }
  file=${rest%% @@ *}; rest=${rest#* @@ }
  search=${rest%% @@ *}; rest=${rest#* @@ }
  replace=${rest%% @@ *}; desc=${rest#* @@ }
  if ((separators != 4)) || [[ -z ${id//[[:space:]]/} || -z ${file//[[:space:]]/} || -z ${search//[[:space:]]/} ||
                                -z ${desc//[[:space:]]/} ]]; then
    echo "mutate.sh: malformed line in $LIST: $line" >&2
    exit 2
  fi
  if [[ -n $FILTER ]] && ! [[ $id =~ $FILTER || $file =~ $FILTER ]]; then continue; fi
  IDS+=("$id"); FILES+=("$file"); SEARCHES+=("$search"); REPLACES+=("$replace"); DESCS+=("$desc")
done <"$LIST"
((${#IDS[@]})) || { echo "mutate.sh: no mutation in $LIST matches '$FILTER'" >&2; exit 2; }

# The example is built (and its checks run) only for mutations of examples/: it adds ~30 s to every mutant.
EXAMPLES=OFF
for file in "${FILES[@]}"; do [[ $file == examples/* ]] && EXAMPLES=ON; done
if [[ $EXAMPLES == ON && -z ${MIXTAPE_MNIST_DIR:-} && -z $CHECK_CMD && $CHECK_LIST == 0 ]]; then
  echo "mutate.sh: mutations of examples/ need MIXTAPE_MNIST_DIR (the example's checks read MNIST)" >&2
  exit 2
fi

# ---- the scratch copy: only files that differ are written, so the build stays incremental ---------------------
sync_tree() {
  local n=0 rel
  while IFS= read -r -d '' rel; do
    rel=${rel#./}
    if ! cmp -s "$ROOT/$rel" "$SRC/$rel"; then
      mkdir -p "$(dirname "$SRC/$rel")"
      cp "$ROOT/$rel" "$SRC/$rel"
      n=$((n + 1))
    fi
  done < <(cd "$ROOT" && find . \( -path ./.git -o -path './build*' -o -path ./.deb -o -path ./.whl -o -path ./.gl \
                                   -o -path ./data/mnist -o -name '*.swp' \) -prune -o -type f -print0)
  # Files deleted from the working tree go from the copy too.
  while IFS= read -r -d '' rel; do
    rel=${rel#./}
    [[ -e $ROOT/$rel ]] || { rm -f "$SRC/$rel"; n=$((n + 1)); }
  done < <(cd "$SRC" && find . -type f -print0)
  echo "mutate.sh: scratch copy $SRC updated ($n files)"
}

# Replaces the one occurrence of search by replacement in file; fails loudly on zero or several.
apply_mutation() {
  python3 - "$@" <<'EOF'
import sys
path, search, replace = (a.replace("\\n", "\n") for a in sys.argv[1:])
text = open(path, encoding="utf-8").read()
n = text.count(search)
if n != 1:
    sys.exit(f"mutate.sh: '{search}' occurs {n} times in {path}, not once")
open(path, "w", encoding="utf-8").write(text.replace(search, replace))
EOF
}

# check_all TREE: whether every mutation of the list would apply to TREE (its search text occurs exactly once), in
# one process; names each that would not.
check_all() {
  local args=() i
  for i in "${!IDS[@]}"; do args+=("$1/${FILES[$i]}" "${SEARCHES[$i]}"); done
  python3 - "${args[@]}" <<'EOF'
import sys
bad = 0
for path, search in zip(sys.argv[1::2], sys.argv[2::2]):
    search = search.replace("\\n", "\n")
    n = open(path, encoding="utf-8").read().count(search)
    if n != 1:
        print(f"mutate.sh: '{search}' occurs {n} times in {path}, not once", file=sys.stderr)
        bad += 1
sys.exit(1 if bad else 0)
EOF
}

build() {  # build <log>: 0 built, 1 a static_assert failed, 2 another compile error, 3 nothing to rebuild
  if ninja -C "$BUILD" -j"$JOBS" >"$1" 2>&1; then
    grep -q '^ninja: no work to do' "$1" && return 3
    return 0
  fi
  if grep -q "static assertion failed" "$1"; then return 1; fi
  return 2
}

# run_suite <log>: 0 when the CPU suite passes; prints the first failing test (and Boost case) otherwise.
run_suite() {
  if [[ -n $CHECK_CMD ]]; then
    if (cd "$BUILD" && timeout "$TEST_TIMEOUT" bash -c "$CHECK_CMD") >"$1" 2>&1; then return 0; fi
    echo "the -c command failed: $(grep -m1 -oE 'error: in "[^"]+"' "$1" | sed -E 's/error: in "(.*)"/\1/' || true)"
    return 1
  fi
  if (cd "$BUILD" && ctest -L cpu -E "$EXCLUDE" --timeout "$TEST_TIMEOUT" --stop-on-failure --output-on-failure \
        -j"$JOBS") >"$1" 2>&1; then
    return 0
  fi
  local test boost_case
  local outcome='Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Child aborted|OTHER_FAULT'
  test=$(grep -m1 -oE "[0-9]+ - [A-Za-z0-9_]+ \(($outcome)" "$1" |
         sed -E 's/^[0-9]+ - //; s/$/)/' || true)
  [[ -n $test ]] || test=$(grep -m1 -E '\*\*\*(Failed|Timeout|Exception)' "$1" | awk '{print $4}' || true)
  boost_case=$(grep -m1 -oE 'error: in "[^"]+"' "$1" | sed -E 's/error: in "(.*)"/\1/' || true)
  echo "${test:-?}${boost_case:+: $boost_case}"
  return 1
}

if ((CHECK_LIST)); then
  check_all "$ROOT" || exit 1
  echo "mutate.sh: all ${#IDS[@]} mutations of $LIST apply to the working tree"
  exit 0
fi

mkdir -p "$SRC" "$LOGS"
START=$(date +%s)
sync_tree
# Every mutation must apply before anything is built.
check_all "$SRC" || exit 2
if [[ ! -f $BUILD/build.ninja ]]; then
  # ccache when there is one (setup.sh does not install it): a core/ mutant rebuilds everything
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTAPE_CUDA=OFF -DMIXTAPE_WERROR=OFF \
        -DMIXTAPE_BUILD_BENCH=OFF -DMIXTAPE_BUILD_EXAMPLES=$EXAMPLES -DMIXTAPE_TEST_TIMEOUT_MAX=$TEST_TIMEOUT \
        "${launcher[@]}" >"$LOGS/configure.log"
elif ! grep -qx "MIXTAPE_BUILD_EXAMPLES:BOOL=$EXAMPLES" "$BUILD/CMakeCache.txt" ||
     ! grep -qE "^MIXTAPE_TEST_TIMEOUT_MAX:[A-Z]+=$TEST_TIMEOUT\$" "$BUILD/CMakeCache.txt"; then
  cmake -S "$SRC" -B "$BUILD" -DMIXTAPE_BUILD_EXAMPLES=$EXAMPLES -DMIXTAPE_TEST_TIMEOUT_MAX=$TEST_TIMEOUT \
        >"$LOGS/configure.log"
fi
echo "mutate.sh: building the unmutated copy (the example: $EXAMPLES)"
status=0
build "$LOGS/baseline-build.log" || status=$?
if ((status == 1 || status == 2)); then
  echo "mutate.sh: the unmutated copy does not build: $LOGS/baseline-build.log" >&2
  exit 2
fi
if ((BASELINE)); then
  echo "mutate.sh: running the CPU suite on the unmutated copy"
  if ! why=$(run_suite "$LOGS/baseline-test.log"); then
    echo "mutate.sh: the unmutated suite fails ($why): every mutant would look killed; see $LOGS/baseline-test.log" >&2
    exit 2
  fi
fi

declare -a RESULTS DETAILS SECONDS_TAKEN
survivors=0 broken=0
for i in "${!IDS[@]}"; do
  id=${IDS[$i]} file=${FILES[$i]}
  t0=$(date +%s)
  backup=$(mktemp)
  cp "$SRC/$file" "$backup"
  # Restore the file even when the script is interrupted mid-mutant.
  trap 'cp "$backup" "$SRC/$file"; rm -f "$backup"' EXIT
  apply_mutation "$SRC/$file" "${SEARCHES[$i]}" "${REPLACES[$i]}" || exit 2
  log=$LOGS/${id#=}
  echo "mutate.sh: [$((i + 1))/${#IDS[@]}] $id ($file): ${DESCS[$i]}"
  status=0
  build "$log.build.log" || status=$?
  if ((status == 1)); then
    where=$(grep -m1 -oE '[^ ]+:[0-9]+:[0-9]+: error: static assertion failed' "$log.build.log" |
            sed -E 's/: error.*//; s|.*/src/||')
    RESULTS[$i]=KILLED DETAILS[$i]="static_assert: $where"
  elif ((status == 2)); then
    RESULTS[$i]=BUILD-FAILED DETAILS[$i]="see $log.build.log"
    broken=$((broken + 1))
  elif ((status == 3)); then
    RESULTS[$i]=NOT-BUILT DETAILS[$i]="$file is not in this build"
    broken=$((broken + 1))
  elif why=$(run_suite "$log.test.log"); then
    if [[ $id == =* ]]; then RESULTS[$i]=EQUIVALENT; else RESULTS[$i]=SURVIVED; survivors=$((survivors + 1)); fi
    DETAILS[$i]="the tests passed"
  else
    RESULTS[$i]=KILLED DETAILS[$i]=$why
  fi
  cp "$backup" "$SRC/$file"
  rm -f "$backup"
  trap - EXIT
  SECONDS_TAKEN[$i]=$(($(date +%s) - t0))
  echo "mutate.sh:     ${RESULTS[$i]} (${SECONDS_TAKEN[$i]} s) ${DETAILS[$i]}"
done

echo
printf '%-32s %-12s %5s  %s\n' mutation outcome secs "killed by / why"
for i in "${!IDS[@]}"; do
  printf '%-32s %-12s %5s  %s\n' "${IDS[$i]#=}" "${RESULTS[$i]}" "${SECONDS_TAKEN[$i]}" "${DETAILS[$i]}"
done
echo
echo "mutate.sh: ${#IDS[@]} mutants, $survivors survived, $broken did not build (or built nothing);" \
     "$(($(date +%s) - START)) s in all (logs in $LOGS)"
((survivors == 0 && broken == 0))
