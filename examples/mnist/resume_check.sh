#!/bin/sh
# examples/mnist/resume_check.sh MNIST — ctest example_mnist_resume: a run stopped after its first epoch and continued
# with --resume ends where the uninterrupted run ends, to the byte; --plot and --inspect write their files.
#
# Two epochs of 10 steps (batch 6000), in two recipes: fp16 with AdamW, the cosine schedule and the GradScaler; fp32
# with SGD (momentum) and onecycle. Each trains once whole and once split: --max-steps 10 (the first epoch, then its
# checkpoint) and --resume from that checkpoint, saving over it. The final checkpoints must be the same bytes
# (weights, optimizer state, loss scale, schedule, generator), and the --metrics files the same lines but for their
# clocks (the resumed run appends to the file). Then a PNG from --plot (fp16's, with the loss scale) and the three
# files of --inspect (its JSON metering fc1.weight's update). Last, the progress bar: drawn on a terminal (a
# pseudo-terminal from script(1)), never into a pipe. And what --metrics says: the schedule's learning rate, the
# GradScaler's loss scale and skipped steps (also in a run that overflows at each step but the first), and each
# logged interval's mean loss. Skips without MIXTAPE_MNIST_DIR; the PNGs are checked where gnuplot is on PATH.
set -u
mnist=$1
[ -n "${MIXTAPE_MNIST_DIR:-}" ] || { echo "MIXTAPE_MNIST_DIR is unset: skipped"; exit 0; }
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT

fail() { printf '%s\n' "$log"; echo "FAIL: $*"; exit 1; }
# run ARGS...: two epochs of 10 steps; the output in $log, and a failed run fails the check.
run() { log=$("$mnist" --epochs 2 --batch-size 6000 --threads 2 "$@" 2>&1) || fail "mnist $*"; }
# The metrics without their clocks (samples/s, seconds): what a resumed run must repeat.
untimed() { sed -E 's/"(samples_per_s|time_s|train_time_s)":[^,}]*,?//g' "$1"; }
is_png() { [ "$(head -c 4 "$1" | tail -c 3)" = PNG ]; }

# check NAME ARGS...: the whole run and the split one end with the same checkpoint and metrics.
check() {
  name=$1
  shift
  run "$@" --save "$dir/$name-whole.st" --metrics "$dir/$name-whole.jsonl"
  run "$@" --max-steps 10 --save "$dir/$name-split.st" --metrics "$dir/$name-split.jsonl"
  run "$@" --resume "$dir/$name-split.st" --save "$dir/$name-split.st" --metrics "$dir/$name-split.jsonl"
  case "$log" in *"resumed from $dir/$name-split.st after epoch 1 (step 10)"*) ;; *) fail "$name: not resumed" ;; esac
  cmp -s "$dir/$name-whole.st" "$dir/$name-split.st" ||
    fail "$name: the resumed run's checkpoint differs from the uninterrupted run's"
  untimed "$dir/$name-whole.jsonl" >"$dir/whole"
  untimed "$dir/$name-split.jsonl" >"$dir/split"
  [ "$(grep -c '"type":"epoch"' "$dir/whole")" -eq 2 ] || fail "$name: $(cat "$dir/whole")"
  diff "$dir/whole" "$dir/split" || fail "$name: the metrics of the split run differ (above)"
  echo "ok: $name: resumed after epoch 1, the same checkpoint and metrics as the uninterrupted run"
}
check fp16-adamw-cosine --precision fp16
check fp32-sgd-onecycle --optimizer sgd --schedule onecycle

# num(key), an awk function: the number a line of --metrics holds at key (0 for null, "" when absent).
num='function num(key) {
  if (!match($0, "\"" key "\":[^,}]*")) return ""
  return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0
}'
# steps FILE AWK: runs AWK (with num) on each step line of FILE; whatever it prints fails the check.
steps() {
  bad=$(awk "$num"' /"type":"step"/ { '"$2"' }' "$1")
  [ -z "$bad" ] || fail "--metrics $1: $bad"
}
# fp16, AdamW at 1e-3 decaying over the 20 steps as cos: the learning rate logged after step s is the one the next
# step takes, 1e-3 (1 + cos(pi s / 20)) / 2; no step overflowed, so the scale is the GradScaler's initial 2^16.
whole=$dir/fp16-adamw-cosine-whole.jsonl
steps "$whole" 'want = 1e-3 * (1 + cos(atan2(0, -1) * num("step") / 20)) / 2
                if ((num("lr") - want) ^ 2 > 1e-24) print "step " num("step") ": lr " num("lr") ", not " want
                if (num("loss_scale") != 65536 || num("skipped_steps") != 0)
                  print "step " num("step") ": scale " num("loss_scale") ", " num("skipped_steps") " skipped"'
steps "$dir/fp32-sgd-onecycle-whole.jsonl" 'if (num("loss_scale") != 1 || num("skipped_steps") != 0) print $0'
# The loss logged at step 10 (the interval's 10 losses summed on the device, read once) is the mean of the losses
# the same run logs with --log-interval 1 (to f32 rounding).
run --precision fp16 --max-steps 10 --log-interval 1 --metrics "$dir/each.jsonl"
mean=$(awk "$num"' /"type":"step"/ { s += num("loss"); n++ } END { if (n == 10) printf "%.17g", s / n }' \
  "$dir/each.jsonl")
[ -n "$mean" ] || fail "--log-interval 1: not 10 step lines in 10 steps"
steps "$whole" 'if (num("step") == 10 && (num("loss") - '"$mean"') ^ 2 > (1e-6 * '"$mean"') ^ 2)
                  print "the loss at step 10, " num("loss") ", is not the mean of its 10 steps, '"$mean"'"'
# A learning rate of 100 overflows from the second step on: each step is skipped and the scale halves, 2^16 / 2^k
# after k skipped steps; the epoch's line says how many.
run --precision fp16 --max-steps 4 --log-interval 1 --lr 100 --metrics "$dir/skips.jsonl"
steps "$dir/skips.jsonl" 'if (num("loss_scale") * 2 ^ num("skipped_steps") != 65536 ||
                              num("skipped_steps") != num("step") - 1)
                            print "step " num("step") ": scale " num("loss_scale") " after " num("skipped_steps") \
                                " skipped steps"'
case "$log" in *"loss scale 8192, 3 steps skipped"*) ;; *) fail "lr 100: not 3 skipped steps at scale 2^13" ;; esac
echo "ok: --metrics: the cosine learning rate, the loss scale and skipped steps (3 of 4 at lr 100), interval means"

if command -v gnuplot >/dev/null; then
  run --precision fp16 --max-steps 12 --log-interval 2 --plot "$dir/run.png"
  is_png "$dir/run.png" || fail "--plot wrote no PNG"
  echo "ok: --plot wrote a PNG"
fi
run --precision fp16 --max-steps 3 --inspect "$dir/numerics" --inspect-step 2
[ "$(head -n 1 "$dir/numerics.txt")" = "step 2" ] || fail "--inspect: numerics.txt does not start with 'step 2'"
grep -q '"ops"' "$dir/numerics.json" || fail "--inspect: numerics.json has no \"ops\""
grep -q '"name": "fc1.weight"' "$dir/numerics.json" || fail "--inspect: numerics.json meters no update of fc1.weight"
if command -v gnuplot >/dev/null; then
  is_png "$dir/numerics.png" || fail "--inspect wrote no PNG"
fi
echo "ok: --inspect wrote numerics.txt, .json$(command -v gnuplot >/dev/null && echo ' and .png')"

# The progress bar: none in the runs above (stderr a pipe); on a terminal the epoch, the bar, steps done of the
# run's, samples/s and the latest loss read, ending full.
case "$log" in *"samples/s  loss"*) fail "a progress bar drawn into a pipe" ;; esac
if script -qec true /dev/null >/dev/null 2>&1; then
  script -qec "'$mnist' --epochs 1 --batch-size 6000 --threads 2 --max-steps 3" /dev/null >"$dir/tty" 2>&1 ||
    { log=$(cat "$dir/tty"); fail "mnist on a pseudo-terminal"; }
  grep -qE 'epoch 1/1 \[#{30}\] 3/3  [0-9]+ samples/s  loss [0-9]+\.[0-9]{4}' "$dir/tty" ||
    { log=$(cat -v "$dir/tty"); fail "no full progress bar with samples/s and the loss on a terminal"; }
  echo "ok: the progress bar on a terminal: $(tr '\r' '\n' <"$dir/tty" | grep -m1 -oE 'epoch 1/1 \[#+\] 3/3 .*')"
else
  echo "no pseudo-terminal here (script(1) failed): the progress bar is not checked"
fi
