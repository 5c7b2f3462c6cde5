#!/usr/bin/env bash
# Kernel v3 variants on one GPU, in one run: the current kernel with its exported tables (with FlashMLA
# and torch.compile of the reference unless BASE_FLAGS says otherwise), then each variant -- a chain of
# patches from $PATCH_DIR (default docs/experiments/kernel_v3) joined by '+' -- applied to kernels/ as it
# was at the start and timed with the same exported configs (config=None), plus any configs named in
# $VCONFIGS (a variant may want other configs than the tables tuned for the kernel before it).
# Writes JSON and logs under $OUT; the summary is read from the logs' JSON lines, so a run cut short still
# reports what it measured. Each column is a variant's fastest correct config at that point.
#   VARIANTS="a_bf16_partials a_bf16_partials+c_fp16_operands" bash results/run_kernel_v3.sh
#   PATCH_DIR=docs/experiments/kernel_v4 VARIANTS="e_prefetch" VCONFIGS=T32-w8-s1-c512 bash results/run_kernel_v3.sh
# Optional: BASE_CONFIGS (more configs for the base run), VFORMATS (the formats the variants run on; default both),
# VC (the variants' concurrency levels; default $C).
set -euo pipefail
OUT=${OUT:-results/out}
mkdir -p "$OUT"
C=${C:-1,8,48,64,80,96}
SAMPLES=${SAMPLES:-7}
VARIANTS=${VARIANTS:-"d_fused_combine"}
PATCH_DIR=${PATCH_DIR:-docs/experiments/kernel_v3}
VCONFIGS=${VCONFIGS:+,$VCONFIGS}
LIMIT=${LIMIT:-0}  # seconds per bench run; 0 = no limit
BASE_CONFIGS=${BASE_CONFIGS:+,$BASE_CONFIGS}
VFORMATS=${VFORMATS:-fp8_model1,fp8_v32}
VC=${VC:-$C}
clean=$(mktemp -d)
cp kernels/*.py "$clean"  # each variant starts from the kernel as it is now (a patch may touch any of its files)
timeout "$LIMIT" python3 -m kernels.bench --configs "table$BASE_CONFIGS" --concurrency "$C" --samples "$SAMPLES" ${BASE_FLAGS:-} \
  --out "$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1 || true
for v in $VARIANTS; do
  cp "$clean"/*.py kernels/
  for p in ${v//+/ }; do git apply "$PATCH_DIR/$p.patch"; done
  timeout "$LIMIT" python3 -m kernels.bench --configs "table$VCONFIGS" --concurrency "$VC" --formats "$VFORMATS" --samples "$SAMPLES" \
    --no-ref --no-flashmla \
    --out "$OUT/bench_${v//+/_}.json" > "$OUT/bench_${v//+/_}.log" 2>&1 || true
done
cp "$clean"/*.py kernels/
python3 - "$OUT" $VARIANTS <<'PY'
import json, math, pathlib, sys
out, names = pathlib.Path(sys.argv[1]), sys.argv[2:]


def rows(name):  # the JSON lines of a bench log: one per (format, C, config) measured
    path = out / f"bench_{name.replace('+', '_')}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in (json.loads(x) for x in lines if x.startswith('{"format"')) if r["correct"]]


def best(rs, key):
    pts = [r for r in rs if (r["format"], r["C"]) == key]
    return min(pts, key=lambda r: r["us"]) if pts else None


base = rows("base")
runs = {n: rows(n) for n in names}
print("format    C   base  " + f"{'base, best config':>24}  " + "  ".join(f"{k[-24:]:>24}" for k in runs) + "  FlashMLA  torch.compile")
for r in [r for r in base if r["config"] == "table"]:
    key = (r["format"], r["C"])
    cells = []
    for v in [base, *runs.values()]:
        b = best(v, key)
        cells.append(f"{b['us']:6.1f} {b['config'][:17]:>17}" if b else f"{'-':>24}")
    peer = r.get("flashmla_us", math.nan)
    print(f"{r['format'][:8]:8} {r['C']:3} {r['us']:6.1f}  {'  '.join(cells)}  {peer:8.1f}  {r['ref_us']:8.1f}")
PY
