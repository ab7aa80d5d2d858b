#!/bin/sh
# examples/mnist/bad_input_check.sh MNIST — ctest example_mnist_bad_input: bad flags, a missing data directory and a
# damaged file each give one line on stderr, nothing on stdout, and a non-zero exit (2 for flags, 1 for the rest).
# The damaged-file cases need MIXTAPE_MNIST_DIR (they damage a copy of the data, or a checkpoint trained on it).
set -u
mnist=$1
failures=0
expect() {  # expect EXIT TEXT ARGS...: the exit status, a piece of the one stderr line, then the program's arguments
  want_rc=$1 text=$2
  shift 2
  "$mnist" "$@" >"$work/out" 2>"$work/err"
  rc=$?
  lines=$(wc -l <"$work/err")
  if [ "$rc" -ne "$want_rc" ] || [ "$lines" -ne 1 ] || [ -s "$work/out" ] || ! grep -qF -- "$text" "$work/err"; then
    echo "FAIL: mnist $*: exit $rc (want $want_rc), $lines stderr line(s) (want 1, with '$text'):"
    cat "$work/err" "$work/out"
    failures=$((failures + 1))
  else
    echo "ok: mnist $*: $(cat "$work/err")"
  fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

expect 2 "--model" --model rnn
expect 2 "--precision" --precision fp8
expect 2 "--epochs" --epochs 0
expect 2 "--lr" --lr -1
expect 2 "--lr: inf is not a number > 0" --lr inf
expect 2 "--bogus" --bogus
expect 1 "does not hold MNIST" --data "$work/nowhere"
expect 1 "--save: no such directory" --save "$work/nowhere/ckpt.safetensors"
expect 1 "--inspect: no such directory" --inspect "$work/nowhere/numerics"
expect 1 "--cuda-graph" --cuda-graph --device cpu
expect 1 "--cuda-graph" --cuda-graph --inspect "$work/inspect"  # no GPU: needs cuda; a GPU: --inspect reads the host
if [ -n "${MIXTAPE_MNIST_DIR:-}" ]; then
  mkdir "$work/damaged"
  cp "$MIXTAPE_MNIST_DIR"/*-ubyte.gz "$work/damaged/"
  head -c 100000 "$MIXTAPE_MNIST_DIR/train-images-idx3-ubyte.gz" >"$work/damaged/train-images-idx3-ubyte.gz"
  expect 1 "train-images-idx3-ubyte.gz" --data "$work/damaged" --max-steps 1
  expect 1 "--resume: no such file" --data "$MIXTAPE_MNIST_DIR" --resume "$work/nothing.safetensors"
  expect 1 "--batch-size: 60001 is more than the 60000 training images" --data "$MIXTAPE_MNIST_DIR" --batch-size 60001
  # A checkpoint whose epoch is not a number (its header edited in place: same length, so the file stays valid).
  "$mnist" --data "$MIXTAPE_MNIST_DIR" --epochs 2 --max-steps 1 --save "$work/ck.safetensors" >/dev/null 2>&1
  sed 's/"epoch":"1"/"epoch":"x"/' "$work/ck.safetensors" >"$work/bad-epoch.safetensors"
  if cmp -s "$work/ck.safetensors" "$work/bad-epoch.safetensors"; then
    echo "FAIL: the checkpoint written with --save holds no \"epoch\":\"1\" to damage"
    failures=$((failures + 1))
  fi
  expect 1 "holds epoch 'x', not a number of epochs" --data "$MIXTAPE_MNIST_DIR" --epochs 2 \
    --resume "$work/bad-epoch.safetensors"
else
  echo "MIXTAPE_MNIST_DIR is unset: the damaged-file, --resume and --batch-size cases are not run"
fi
[ "$failures" -eq 0 ]
