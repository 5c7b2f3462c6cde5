#!/usr/bin/env bash
# Why more combine programs cost the call more than they cost alone (kernel v8, small calls), on one GPU in one
# run, with docs/experiments/kernel_v8/p_combine_launch_order.patch: the call, its split launch and its combine
# (results/launch_times.py) at the exported tables' configs, with the tile from 32 splits (v8), 16 or 8, each
# with the combine under programmatic dependent launch as in v8, letting the next kernel launch only after its
# stores, or launched without it. PATCHES="p_combine_launch_order q_split_late_trigger" adds the split kernel's
# trigger after its stores (rule split_late=1), so that the combine launches only as the split ends.
#   OUT=out bash results/run_kernel_v8_launch_order.sh
#   OUT=out C=16,24,32,48,64,80,96 RULES=default,pdl=0,late=1 bash results/run_kernel_v8_launch_order.sh
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
patched $(for p in ${PATCHES:-p_combine_launch_order}; do echo "docs/experiments/kernel_v8/$p.patch"; done)
step launch_order 400 python3 results/launch_times.py --concurrency "${C:-1,4,8,16}" --configs table \
  --rules "${RULES:-default,late=1,pdl=0,min_splits=16,min_splits=16+late=1,min_splits=16+pdl=0,min_splits=8,min_splits=8+pdl=0}"
grep -v '^{' "$OUT/launch_order.log" | tail -80 | cut -c1-150
