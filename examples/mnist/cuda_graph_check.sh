#!/bin/sh
# examples/mnist/cuda_graph_check.sh MNIST — ctest example_mnist_cuda_graph: --cuda-graph trains as eager steps do.
#
# For the MLP and the CNN in fp16 (AdamW, seed 0; the MLP under OneCycleLR, which moves lr and beta1 every step, the
# CNN under the default cosine schedule): 300 steps with --cuda-graph (3 eager, then replays of one captured step)
# against 300 eager steps; the replays run the eager steps' kernels on the same values with the options the schedule
# set, and draw the same dropout masks, so the test accuracy must match to the printed digit. Skips without
# MIXTAPE_MNIST_DIR or without a GPU.
set -u
mnist=$1
[ -n "${MIXTAPE_MNIST_DIR:-}" ] || { echo "MIXTAPE_MNIST_DIR is unset: skipped"; exit 0; }
run() { "$mnist" --device cuda --precision fp16 --max-steps 300 --log-interval 100 "$@" 2>&1; }
accuracy() { printf '%s\n' "$1" | grep -o 'test accuracy [0-9.]*%' | tail -1; }
for model in mlp cnn; do
  schedule=cosine
  [ "$model" = mlp ] && schedule=onecycle
  if ! eager=$(run --model "$model" --schedule "$schedule"); then
    case "$eager" in *"--device cuda:"*) echo "no CUDA device: skipping GPU test"; exit 0 ;; esac
    printf '%s\n' "$eager"
    exit 1
  fi
  graph=$(run --model "$model" --schedule "$schedule" --cuda-graph) || { printf '%s\n' "$graph"; exit 1; }
  printf '%s\n%s\n' "$eager" "$graph"
  a=$(accuracy "$eager")
  b=$(accuracy "$graph")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "$model: eager '$a', with --cuda-graph '$b'"
    exit 1
  fi
  echo "$model: eager and --cuda-graph: $a"
done
