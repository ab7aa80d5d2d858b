#!/bin/sh
# examples/mnist/bad_input_check.sh MNIST — ctest example_mnist_bad_input: bad flags, a missing data directory, a
# damaged file and a --resume that does not fit its checkpoint each give one line on stderr, nothing on stdout, and a
# non-zero exit (2 for flags, 1 for the rest).
# The damaged-file cases need MIXTAPE_MNIST_DIR (they damage a copy of the data, or a checkpoint trained on it), as
# does a --plot that gnuplot fails half way (the old plot must stay whole).
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
# libgomp would abort or crash starting that many threads
expect 2 "--threads: 100000 is not a number of threads in [1," --threads 100000
expect 1 "does not hold MNIST" --data "$work/nowhere"
expect 1 "--save: no such directory" --save "$work/nowhere/ckpt.safetensors"
expect 1 "--inspect: no such directory" --inspect "$work/nowhere/numerics"
expect 1 "--cuda-graph" --cuda-graph --device cpu
expect 1 "--tf32: TF32 runs on a GPU" --tf32 --device cpu
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
  # Resuming with another recipe than the checkpoint's (the MLP in fp32, AdamW, cosine over 2 epochs), and resuming
  # a run that has trained all its epochs.
  expect 1 "holds model 'mlp', not 'cnn'" --data "$MIXTAPE_MNIST_DIR" --epochs 2 --model cnn \
    --resume "$work/ck.safetensors"
  expect 1 "holds precision 'fp32', not 'bf16'" --data "$MIXTAPE_MNIST_DIR" --epochs 2 --precision bf16 \
    --resume "$work/ck.safetensors"
  expect 1 "holds schedule 'cosine', not 'constant'" --data "$MIXTAPE_MNIST_DIR" --epochs 2 --schedule constant \
    --resume "$work/ck.safetensors"
  expect 1 "holds epochs '2', not '3' (its --schedule spans that many epochs)" --data "$MIXTAPE_MNIST_DIR" \
    --epochs 3 --resume "$work/ck.safetensors"
  "$mnist" --data "$MIXTAPE_MNIST_DIR" --epochs 1 --max-steps 1 --schedule constant --save "$work/done.safetensors" \
    >/dev/null 2>&1
  expect 1 "has already trained 1 epoch(s); ask for more with --epochs" --data "$MIXTAPE_MNIST_DIR" --epochs 1 \
    --schedule constant --resume "$work/done.safetensors"
  # A plot that gnuplot fails half way through (a stand-in that writes part of its output, then exits 1), after
  # the training's own lines: exit 1 with the error last, the plot from before as it was, no temporary beside it.
  mkdir "$work/bin" "$work/plots"
  cat >"$work/bin/gnuplot" <<'EOF'
#!/bin/sh
sed -n "s/^set output '\(.*\)'$/\1/p" "$1" | while read -r out; do printf 'half a png' >"$out"; done
echo "gnuplot: simulated failure" >&2
exit 1
EOF
  chmod +x "$work/bin/gnuplot"
  echo "the plot from before" >"$work/plots/run.png"
  saved_path=$PATH
  PATH="$work/bin:$PATH"
  "$mnist" --data "$MIXTAPE_MNIST_DIR" --max-steps 1 --plot "$work/plots/run.png" >"$work/out" 2>"$work/err"
  rc=$?
  PATH=$saved_path
  if [ "$rc" -ne 1 ] || ! tail -n 1 "$work/err" | grep -qF -- "--plot: gnuplot failed: gnuplot: simulated failure" ||
    [ "$(cat "$work/plots/run.png")" != "the plot from before" ] || [ "$(ls "$work/plots")" != "run.png" ]; then
    echo "FAIL: a failed --plot: exit $rc (want 1), the old plot changed or a file left beside it ($(ls "$work/plots")):"
    cat "$work/err"
    failures=$((failures + 1))
  else
    echo "ok: a failed --plot: $(tail -n 1 "$work/err"); the old plot kept, nothing beside it"
  fi
else
  echo "MIXTAPE_MNIST_DIR is unset: the damaged-file, --resume and --batch-size cases are not run"
fi
[ "$failures" -eq 0 ]
