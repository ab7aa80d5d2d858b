#!/bin/sh
# examples/mnist/capability_check.sh MNIST — ctest example_mnist_capabilities: the portable and AVX2 CPU kernels
# train to the widest kernels' bits.
#
# Each model and precision trains 40 steps of AdamW, seed 0, saved with --save: once with every instruction set the
# CPU has, then with MIXTAPE_CPU_CAPABILITY at lower levels (core/cpu_capability.h), and the checkpoints must be the
# same bytes: what a CPU without AVX-512 or without AVX2 computes, checked on one that has them.
# - The MLP in fp32 and fp16 (autocast + GradScaler) at avx2 and default: the paths differ in the f16 <-> f32
#   conversions (F16C, AVX2 or half.h's loop: bit-exact by design) and AdamW's update (AVX-512 or the portable loop:
#   the same roundings, no contraction), and share OpenBLAS's sgemm.
# - The CNN in fp32 and fp16 at avx2: its Winograd convolutions' AVX2 kernels compute every lane as the AVX-512 ones
#   do; max-pool and the dropout masks are exact either way.
# (bf16's GEMM, and the CNN's convolutions at default, im2col + sgemm, sum in another order where AVX-512 or AVX2 is
# withheld: their suites check those paths against float64, test_ops_cpu_at_default.) Skips without
# MIXTAPE_MNIST_DIR.
set -u
mnist=$1
[ -n "${MIXTAPE_MNIST_DIR:-}" ] || { echo "MIXTAPE_MNIST_DIR is unset: skipped"; exit 0; }
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT

# check MODEL PRECISION LEVEL...: the checkpoint at each LEVEL is the one at the CPU's own level, byte for byte.
check() {
  model=$1 precision=$2
  shift 2
  for level in all "$@"; do
    out=$dir/$model-$precision-$level.safetensors
    setting="MIXTAPE_CPU_CAPABILITY=$level"
    [ "$level" = all ] && setting="-u MIXTAPE_CPU_CAPABILITY"
    # shellcheck disable=SC2086 # $setting is one or two words, split on purpose
    log=$(env $setting "$mnist" --model "$model" --precision "$precision" --max-steps 40 --threads 2 --save "$out" \
      2>&1) || { printf '%s\n' "$log"; exit 1; }
    case "$log" in *"ignoring MIXTAPE_CPU_CAPABILITY"*) printf '%s\n' "$log"; exit 1 ;; esac
    if [ "$level" != all ]; then
      cmp -s "$dir/$model-$precision-all.safetensors" "$out" || {
        echo "$model $precision: the checkpoint at MIXTAPE_CPU_CAPABILITY=$level differs from the CPU's own level's"
        exit 1
      }
      echo "$model $precision: MIXTAPE_CPU_CAPABILITY=$level saves the same bytes"
    fi
  done
}
check mlp fp32 avx2 default
check mlp fp16 avx2 default
check cnn fp32 avx2
check cnn fp16 avx2
