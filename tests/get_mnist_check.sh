#!/usr/bin/env bash
# tests/get_mnist_check.sh SCRIPT — ctest get_mnist: scripts/get_mnist.sh against local mirrors (file:// URLs through
# MIXTAPE_MNIST_MIRRORS), made from the real files in MIXTAPE_MNIST_DIR: a mirror serving a damaged copy is passed
# over for the next, the four files arrive with their MD5s and the umask's mode, no temporary file stays, files
# present are kept, a damaged one is fetched again, part files a killed run left are deleted once stale, and with
# no mirror reachable it says "offline" and falls back to Debian's Fashion-MNIST. apt-get is a stub here that fails:
# the check never installs anything, so the fallback ends in Fashion-MNIST where dataset-fashion-mnist is installed
# and in a clear failure where it is not.
set -u
script=$(realpath "$1")
if [ -z "${MIXTAPE_MNIST_DIR:-}" ]; then
  echo "MIXTAPE_MNIST_DIR is unset: skipping the get_mnist.sh check (it serves the real files as a mirror)"
  exit 0
fi
if ! command -v curl >/dev/null; then
  echo "no curl on this machine: skipping the get_mnist.sh check (setup.sh installs it)"
  exit 0
fi
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
for f in "${files[@]}"; do
  if [ ! -f "$MIXTAPE_MNIST_DIR/$f" ]; then
    echo "$MIXTAPE_MNIST_DIR has no $f (the mirror serves the .gz files): skipping the get_mnist.sh check"
    exit 0
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check DESCRIPTION COMMAND...: the command's status says whether the description holds
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
same_as_real() { cmp -s "$MIXTAPE_MNIST_DIR/$1" "$2/$1"; }
all_real() { local f; for f in "${files[@]}"; do same_as_real "$f" "$1" || return 1; done; }
no_part_files() { [ -z "$(find "$1" -name '*.part.*')" ]; }
mode_of() { stat -c %a "$1"; }

# The mirrors: "damaged" serves train-labels with one byte changed and nothing else; "good" serves the real four.
mkdir -p "$work/damaged" "$work/good"
cp "$MIXTAPE_MNIST_DIR"/*-ubyte.gz "$work/good/"
cp "$MIXTAPE_MNIST_DIR/train-labels-idx1-ubyte.gz" "$work/damaged/"
printf 'x' | dd of="$work/damaged/train-labels-idx1-ubyte.gz" bs=1 seek=1000 conv=notrunc 2>/dev/null
mirrors="file://$work/damaged/ file://$work/good/"
mkdir -p "$work/bin"
printf '#!/bin/sh\necho "apt-get: the get_mnist check installs nothing" >&2\nexit 100\n' >"$work/bin/apt-get"
chmod +x "$work/bin/apt-get"
fetch() {  # fetch DIR MIRRORS: runs the script (DIR empty: MIXTAPE_MNIST_DIR unset); its output in $work/log
  local dir_env=("MIXTAPE_MNIST_DIR=$1")
  [ -z "$1" ] && dir_env=(-u MIXTAPE_MNIST_DIR)
  env "${dir_env[@]}" PATH="$work/bin:$PATH" MIXTAPE_MNIST_MIRRORS="$2" bash "$script" >"$work/log" 2>&1
}

out=$work/data
check "a first run downloads the four files and exits 0" fetch "$out" "$mirrors"
cat "$work/log"
check "the damaged copy is named and passed over" grep -q "train-labels-idx1-ubyte.gz from file://$work/damaged/: MD5 mismatch" "$work/log"
check "the four files are the real ones" all_real "$out"
check "no temporary file is left" no_part_files "$out"
check "the files take the umask's mode (022: 644)" [ "$( (umask 022; fetch "$work/m644" "$mirrors"; mode_of "$work/m644/t10k-labels-idx1-ubyte.gz") )" = 644 ]
check "the files take the umask's mode (077: 600)" [ "$( (umask 077; fetch "$work/m600" "$mirrors"; mode_of "$work/m600/t10k-labels-idx1-ubyte.gz") )" = 600 ]

check "a second run, with no mirror at all, keeps the four files" fetch "$out" "file://$work/nowhere/"
check "... saying each is present with its MD5" [ "$(grep -c 'present, MD5 ok' "$work/log")" = 4 ]
check "... and downloads nothing" eval '! grep -q downloaded "$work/log"'

printf 'x' | dd of="$out/t10k-images-idx3-ubyte.gz" bs=1 seek=5000 conv=notrunc 2>/dev/null
check "a file damaged on disk is fetched again" fetch "$out" "$mirrors"
check "... saying its MD5 was wrong" grep -q "t10k-images-idx3-ubyte.gz: present but its MD5 is wrong" "$work/log"
check "... and it is the real one again" same_as_real t10k-images-idx3-ubyte.gz "$out"

mkdir -p "$work/cwd"
(cd "$work/cwd" && fetch "" "file://$work/good/")
check "without MIXTAPE_MNIST_DIR it fills ./data/mnist" all_real "$work/cwd/data/mnist"
check "... and its last line names the folder alone" [ "$(tail -n 1 "$work/log")" = "get_mnist: dataset: MNIST in ./data/mnist" ]

stale=$out/.train-images-idx3-ubyte.gz.part.Stale1 live=$out/.t10k-labels-idx1-ubyte.gz.part.Live22
head -c 1000 /dev/urandom >"$stale" && touch -d '-16 minutes' "$stale"
head -c 1000 /dev/urandom >"$live" && touch -d '-5 minutes' "$live"
touch "$out/.unrelated"
check "a run with part files a killed run left exits 0" fetch "$out" "$mirrors"
check "... deleting the one last written 16 minutes ago" [ ! -e "$stale" ]
check "... keeping the one written 5 minutes ago (a live download's, for all it knows)" [ -e "$live" ]
check "... and other files" [ -e "$out/.unrelated" ]

fetch "$work/offline" "file://$work/nowhere/ file://$work/nowhere-either/"
rc=$?
cat "$work/log"
check "offline, it says so in one line" [ "$(grep -c 'offline (no MNIST mirror reachable)' "$work/log")" = 1 ]
check "... and leaves no file" [ -z "$(ls -A "$work/offline")" ]
fashion=/usr/share/datasets/fashion-mnist
if [ -f "$fashion/train-images-idx3-ubyte.gz" ] || [ -f "$fashion/train-images-idx3-ubyte" ]; then
  check "... and names Debian's Fashion-MNIST, installed here, exiting 0" \
    eval '[ $rc = 0 ] && grep -q "dataset: Fashion-MNIST in $fashion" "$work/log"'
else
  check "... and, with no Fashion-MNIST installed and apt-get failing, says so and exits 1" \
    eval '[ $rc = 1 ] && grep -q "no dataset available" "$work/log"'
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "get_mnist.sh: every check passed"
