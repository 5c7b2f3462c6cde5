#!/usr/bin/env bash
# Kernel v8's combine variants on one GPU, in one run: the GPU tests, then where each call's time goes
# (results/launch_times.py) under several settings of the combine's shape rule, and for kernel v7's combine
# (kernels/decode.py at V7_REV) on the same points.
# The default rules name COMBINE_PROGRAMS, a constant of the rule's first draft only: run it as it was run, on
# kernels/decode.py at d50539d (the adopted rule has COMBINE_TILE_MIN_SPLITS instead, see results/launch_times.py).
#   OUT=out V7_REV=9808445 bash results/run_kernel_v8_variants.sh
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
C=${C:-1,2,4,8,16,48,96}
RULES=${RULES:-default,programs=1,max_splits=64+max_rows=4096,max_splits=64+max_rows=1000000,programs=1024+max_splits=64+max_rows=4096}
step gpu_tests 120 python3 -m pytest -q tests/test_gpu.py tests/test_flashmla_gpu.py
step rules 240 python3 results/launch_times.py --concurrency "$C" --configs table --rules "$RULES"
step rules_t32 120 python3 results/launch_times.py --concurrency 1,2,4 --configs T32-w4-s1-c256-p1 --rules "$RULES"
keep=$(mktemp -d); cp kernels/decode.py "$keep"
git show "${V7_REV:-9808445}:kernels/decode.py" > kernels/decode.py
step v7 120 python3 results/launch_times.py --concurrency "$C" --configs table
step v7_t32 60 python3 results/launch_times.py --concurrency 1,2,4 --configs T32-w4-s1-c256-p1
cp "$keep/decode.py" kernels/
for f in gpu_tests rules rules_t32 v7 v7_t32; do echo "== $f"; grep -v '^{' "$OUT/$f.log" | tail -80 | cut -c1-150; done
