#!/usr/bin/env bash
# The combine of large calls on one GPU, in one run (kernel v8 with docs/experiments/kernel_v8/o_large_combine_knobs.patch):
# the call, its split launch and its combine (results/launch_times.py) at the exported tables' configs, with rows of
# 512 merged 1, 2 or 4 per iteration, and with 1, 2, 4 or 8 warps per combine program.
#   OUT=out bash results/run_kernel_v8_large.sh
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
patched docs/experiments/kernel_v8/o_large_combine_knobs.patch
step large 400 python3 results/launch_times.py --concurrency "${C:-16,48,64,80,96}" --configs table \
  --rules "${RULES:-default,large_chunk=2,large_chunk=4,warps=1,warps=2,warps=8,large_chunk=2+warps=2}"
grep -v '^{' "$OUT/large.log" | tail -80 | cut -c1-150
