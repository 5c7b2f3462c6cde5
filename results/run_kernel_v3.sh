#!/usr/bin/env bash
# Kernel v3 variants on one GPU, in one run: the current kernel with its exported tables (with FlashMLA
# and torch.compile of the reference unless BASE_FLAGS says otherwise), then each variant -- a chain of
# patches from docs/experiments/kernel_v3/ joined by '+' -- applied to kernels/decode.py as it was at the start and
# timed with the same exported configs (config=None). Writes JSON and logs under $OUT.
#   VARIANTS="a_bf16_partials a_bf16_partials+c_fp16_operands" bash results/run_kernel_v3.sh
set -euo pipefail
OUT=${OUT:-results/out}
mkdir -p "$OUT"
C=${C:-1,8,48,64,80,96}
SAMPLES=${SAMPLES:-7}
VARIANTS=${VARIANTS:-"d_fused_combine"}
clean=$(mktemp)
cp kernels/decode.py "$clean"  # each variant starts from the kernel as it is now
python3 -m kernels.bench --configs table --concurrency "$C" --samples "$SAMPLES" ${BASE_FLAGS:-} \
  --out "$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1 || true
for v in $VARIANTS; do
  cp "$clean" kernels/decode.py
  for p in ${v//+/ }; do git apply "docs/experiments/kernel_v3/$p.patch"; done
  python3 -m kernels.bench --configs table --concurrency "$C" --samples "$SAMPLES" --no-ref --no-flashmla \
    --out "$OUT/bench_${v//+/_}.json" > "$OUT/bench_${v//+/_}.log" 2>&1 || true
done
python3 - "$OUT" $VARIANTS <<'PY'
import json, pathlib, sys
out, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
base = json.loads((out / "bench_base.json").read_text())
runs = {n: json.loads((out / f"bench_{n.replace('+', '_')}.json").read_text()) for n in names}
bw = max(base["env"]["copy_GBps"].values())
print("format    C  floor   base  " + "  ".join(f"{k[-16:]:>16}" for k in runs) + "  FlashMLA  torch.compile")
for r in base["rows"]:
    key = (r["format"], r["C"])
    var = [next((x for x in v["rows"] if (x["format"], x["C"]) == key), None) for v in runs.values()]
    cells = "  ".join(f"{x['us']:15.1f}{'' if x['correct'] else '!':1}" if x else f"{'-':>16}" for x in var)
    print(f"{r['format'][:8]:8} {r['C']:3} {r['bytes'] / bw / 1e3:6.2f} {r['us']:6.1f}  {cells}  "
          f"{r['flashmla_us']:8.1f}  {r['ref_us']:8.1f}")
PY
