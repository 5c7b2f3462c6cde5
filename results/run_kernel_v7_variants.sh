#!/usr/bin/env bash
# Kernel v7's variant runs on one GPU, each in one run: the GPU tests, the kernel against the variants of
# docs/experiments/kernel_v7 (results/run_kernel_v3.sh), then where each call's time goes
# (results/launch_times.py), for the kernel and, with LAST_PATCH, with that patch applied.
#   OUT=out VARIANTS=n_combine_unrolled LAST_PATCH=n_combine_unrolled bash results/run_kernel_v7_variants.sh
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
CONFIGS=${CONFIGS:-T32-w4-s1-c256-p1,T32-w4-s1-c512-p1,T32-w4-s1-c256-p3,T32-w4-s1-c512-p3,T32-w4-s1-c256-p1-b1,T32-w4-s1-c256-p3-b1}
step gpu_tests 120 python3 -m pytest -q tests/test_gpu.py tests/test_flashmla_gpu.py
step variants 400 env OUT="$OUT/variants" C=1,8,48,96 PATCH_DIR=docs/experiments/kernel_v7 \
  VARIANTS="${VARIANTS:-m_index_two_ahead}" BASE_CONFIGS=$CONFIGS VCONFIGS=$CONFIGS BASE_FLAGS="--no-ref --no-flashmla" \
  LIMIT=200 bash results/run_kernel_v3.sh
step launch_times 120 python3 results/launch_times.py --concurrency 1,8,48,96 --configs table
if [ -n "${LAST_PATCH:-}" ]; then
  keep=$(mktemp -d); cp kernels/*.py "$keep"
  git apply "docs/experiments/kernel_v7/$LAST_PATCH.patch"
  step "launch_times_$LAST_PATCH" 120 python3 results/launch_times.py --concurrency 1,8,48,96 --configs table
  cp "$keep"/*.py kernels/
fi
tail -12 "$OUT/variants.log"
for f in "$OUT"/launch_times*.log; do echo "$f"; tail -10 "$f"; done
