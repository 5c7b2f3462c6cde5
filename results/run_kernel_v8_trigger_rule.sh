#!/usr/bin/env bash
# Kernel v8 with docs/experiments/kernel_v8/r_split_trigger_rule.patch on one GPU, in one run: the split kernel lets
# the combine launch only after its stores when the split launch has more programs than the GPU has SMs. The call,
# its split and its combine at every level of the exported tables' configs, with the rule and without (split_late=0,
# kernel v8), then the final bench and the layer call with the rule.
#   OUT=out bash results/run_kernel_v8_trigger_rule.sh
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
patched docs/experiments/kernel_v8/r_split_trigger_rule.patch
step rule_times 200 python3 results/launch_times.py --concurrency 1,2,4,8,16,24,32,40,48,56,64,72,80,88,96 \
  --configs table --rules default,split_late=0
step bench_rule 150 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_rule.json"
step bench_call_rule 60 python3 -m kernels.bench_call --out "$OUT/bench_call_rule.json"
grep -v '^{' "$OUT/rule_times.log" | tail -64 | cut -c1-150
tail -14 "$OUT/bench_rule.log"; tail -12 "$OUT/bench_call_rule.log"
