#!/usr/bin/env bash
# Register caps on kernel v10 (fp8_model1's dots in chunks), on one GPU in one run. Compiled for sm_120, the chunks let
# T32-w8-s1 (PREFETCH 0 or 2) run under a cap of 128 registers with no spill, where v9 spilled 288-328 B
# (docs/data/kernel_v9/chunks/ptx_stats_caps_*_sm120.jsonl). Under 128 registers two 8-warp programs share an SM where
# one did, if the shared memory allows it (2 x 80 KB on the H200; sm_120's 100 KB per SM holds one). The final bench's
# protocol at V4's levels, each config uncapped and capped, with v9's C=96 pick as the reference.
#   OUT=out bash results/run_kernel_v10_caps.sh                                                  # on kernel v10
#   OUT=out PATCH=docs/experiments/kernel_v9/t_chunked_dots.patch bash results/run_kernel_v10_caps.sh   # on v9
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
if [ -n "${PATCH:-}" ]; then patched "$PATCH"; fi
step bench_caps "${LIMIT:-300}" python3 -m kernels.bench --formats fp8_model1 --concurrency "${C:-8,48,80,96}" \
  --configs "${CONFIGS:-T32-w4-s1-c512-p1,T32-w8-s1-c512-p2,T32-w8-s1-c512,T32-w8-s1-c768-p2,T32-w8-s1-c256-p2}" \
  --maxnreg "${CAPS:-0,128}" --no-ref --samples 5 --out "$OUT/bench_caps.json"
grep -v '^[{#]' "$OUT/bench_caps.log" | tail -45 | cut -c1-150
