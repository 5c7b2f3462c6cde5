#!/usr/bin/env bash
# Kernel v3 variants on one GPU, in one run: the current kernel with its exported tables, FlashMLA and
# torch.compile of the reference; then each variant patch of docs/experiments/kernel_v3/ applied in
# turn (cumulatively), timed with the same exported configs (config=None). Writes JSON under $OUT.
set -euo pipefail
OUT=${OUT:-results/out}
mkdir -p "$OUT"
C=${C:-1,8,48,64,80,96}
SAMPLES=${SAMPLES:-7}
python3 -m kernels.bench --configs table --concurrency "$C" --samples "$SAMPLES" --out "$OUT/bench_base.json" \
  > "$OUT/bench_base.log" 2>&1 || true
for p in docs/experiments/kernel_v3/*.patch; do
  name=$(basename "$p" .patch)
  git apply "$p"
  python3 -m kernels.bench --configs table --concurrency "$C" --samples "$SAMPLES" --no-ref --no-flashmla \
    --out "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1 || true
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {f.stem[6:]: json.loads(f.read_text()) for f in sorted(out.glob("bench_*.json"))}
base = runs.pop("base")
print("format    C  floor   base  " + "  ".join(f"{k[:14]:>14}" for k in runs) + "  FlashMLA  torch.compile")
bw = max(base["env"]["copy_GBps"].values())
for r in base["rows"]:
    key = (r["format"], r["C"])
    var = [next((x for x in v["rows"] if (x["format"], x["C"]) == key), None) for v in runs.values()]
    cells = "  ".join(f"{x['us']:9.1f}{'' if x['correct'] else '!':1}    " if x else f"{'-':>14}" for x in var)
    print(f"{r['format'][:8]:8} {r['C']:3} {r['bytes'] / bw / 1e3:6.2f} {r['us']:6.1f}  {cells}  {r['flashmla_us']:8.1f}  {r['ref_us']:8.1f}")
PY
