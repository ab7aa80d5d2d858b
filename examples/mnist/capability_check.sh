#!/bin/sh
# examples/mnist/capability_check.sh MNIST — ctest example_mnist_capabilities: the portable CPU kernels train to the
# vector kernels' bits.
#
# The MLP in fp32 and in fp16 (autocast + GradScaler), 40 steps of AdamW, seed 0, saved with --save: once with
# every instruction set the CPU has, then with MIXTAPE_CPU_CAPABILITY at avx2 and at default (core/cpu_capability.h).
# Their paths differ in the f16 <-> f32 conversions (F16C, AVX2 or half.h's loop: bit-exact by design) and AdamW's
# update (AVX-512 or the portable loop: the same roundings, no contraction), and share OpenBLAS's sgemm, so the
# checkpoints must be the same bytes: what a CPU without AVX-512 or without AVX2 computes, checked on one that has
# them. (bf16's GEMM and the CNN's Winograd convolutions compute in another order where AVX-512 is withheld: their
# suites check those paths against float64, test_ops_cpu_at_default.) Skips without MIXTAPE_MNIST_DIR.
set -u
mnist=$1
[ -n "${MIXTAPE_MNIST_DIR:-}" ] || { echo "MIXTAPE_MNIST_DIR is unset: skipped"; exit 0; }
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
for precision in fp32 fp16; do
  for level in all avx2 default; do
    out=$dir/$precision-$level.safetensors
    setting="MIXTAPE_CPU_CAPABILITY=$level"
    [ "$level" = all ] && setting="-u MIXTAPE_CPU_CAPABILITY"
    # shellcheck disable=SC2086 # $setting is one or two words, split on purpose
    log=$(env $setting "$mnist" --model mlp --precision "$precision" --max-steps 40 --threads 2 --save "$out" 2>&1) ||
      { printf '%s\n' "$log"; exit 1; }
    case "$log" in *"ignoring MIXTAPE_CPU_CAPABILITY"*) printf '%s\n' "$log"; exit 1 ;; esac
    if [ "$level" != all ]; then
      cmp -s "$dir/$precision-all.safetensors" "$out" || {
        echo "mlp $precision: the checkpoint at MIXTAPE_CPU_CAPABILITY=$level differs from the one at the CPU's level"
        exit 1
      }
      echo "mlp $precision: MIXTAPE_CPU_CAPABILITY=$level saves the same bytes"
    fi
  done
done
