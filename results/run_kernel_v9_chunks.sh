#!/usr/bin/env bash
# Kernel v9 against a candidate on one GPU in one run: fp8_model1's two dots in four chunks of 128 contiguous dims
# (docs/experiments/kernel_v9/t_chunked_dots.patch), so that no dot's q operand is the whole [16, 512]. Compiled
# for sm_90 it cuts the split kernel's registers (T32-w4-s1-p1 255 with a 64 B spill -> 255 without; T16-w4-s1-p2
# 254 -> 168; T32-w8-s1-p2 228 -> 156). The final bench's protocol at fixed configs (the v9 table's picks at these
# levels, and configs the cut may favour), first on v9 as committed, then with the patch.
#   OUT=out bash results/run_kernel_v9_chunks.sh
#   OUT=out PHASE=written bash results/run_kernel_v9_chunks.sh   # the patch as written with v9's tables: the final
#                                                                # bench, the layer call and the GPU tests
set -u
OUT=${OUT:-results/out}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
C=${C:-1,8,48,80,96}
CONFIGS=${CONFIGS:-T16-w4-s1-c512-p2,T64-w8-s1-c768-p1,T32-w4-s1-c256-p1,T32-w4-s1-c512-p1,T16-w4-s1-c512-p0,T16-w4-s1-c768-p2,T32-w8-s1-c512-p2,T64-w8-s1-c512-p2,T32-w4-s1-c512-p2}
if [ "${PHASE:-}" = written ]; then
  patched docs/experiments/kernel_v9/t_chunked_dots.patch
  step bench_final 150 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_final.json"
  step bench_call 60 python3 -m kernels.bench_call --out "$OUT/bench_call.json"
  step gpu_tests 90 python3 -m pytest -q tests/test_gpu.py tests/test_flashmla_gpu.py
  tail -14 "$OUT/bench_final.log"; tail -12 "$OUT/bench_call.log"; tail -1 "$OUT/gpu_tests.log"
  exit 0
fi
bench() { step "$1" "${LIMIT:-230}" python3 -m kernels.bench --formats fp8_model1 --concurrency "$C" --configs "$CONFIGS" \
  --no-ref --samples 5 --out "$OUT/$1.json"; }
bench bench_v9
patched docs/experiments/kernel_v9/t_chunked_dots.patch
bench bench_chunks
python3 - "$OUT" <<'PY'
import json, sys
rows = {}
for tag in ("v9", "chunks"):
    for r in json.load(open(f"{sys.argv[1]}/bench_{tag}.json"))["rows"]:
        rows.setdefault((r["C"], r["config"]), {})[tag] = r
print(f"{'C':>3} {'config':22} {'v9 us':>7} {'chunks us':>9} {'FlashMLA':>8}  ok")
for (c, cfg), d in sorted(rows.items()):
    v, n = d.get("v9", {}), d.get("chunks", {})
    f = n.get("flashmla_us") or v.get("flashmla_us") or float("nan")
    print(f"{c:>3} {cfg:22} {v.get('us', float('nan')):7.2f} {n.get('us', float('nan')):9.2f} {f:8.2f}  {v.get('correct')} {n.get('correct')}")
PY
