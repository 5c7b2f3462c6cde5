#!/usr/bin/env bash
# Kernel v8 on one GPU, in two parts (each step has its own time limit; the searches resume what results/h200.db
# holds, so a step cut short by its limit stops after its running trial and a later run continues it):
#   OUT=out PHASE=1 bash results/run_kernel_v8.sh   # bounded TPE re-tunes of the V3.2 and V4 spaces
#   OUT=out PHASE=2 bash results/run_kernel_v8.sh   # the layer space, export, final bench, layer call, GPU tests
# Each search first measures the baseline, the previous kernel's five best configs and their untried values,
# then the --first configs (those whose many splits the combine's tile serves at C <= 8), then TPE's picks.
# What each step printed goes to $OUT.
set -u
OUT=${OUT:-results/out}
DB=${TUNER_DB:-sqlite:///results/h200.db}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
if [ "${PHASE:-1}" = 1 ]; then
  step v32_search 250 python3 -m tuner search search_spaces/v32_tp8.yaml --db "$DB" --sampler tpe --n-trials 10 -q \
    --first T32-w4-s1-c256-p1,T32-w4-s1-c256-p3
  step v4_search 290 python3 -m tuner search search_spaces/v4_flash_tp4.yaml --db "$DB" --sampler tpe --n-trials 9 -q \
    --first T16-w4-s1-c512-p2
else
  step layer_search 300 python3 -m tuner search search_spaces/v4_flash_layer_tp4.yaml --db "$DB" --sampler tpe \
    --n-trials 8 -q
  step export 60 python3 -m tuner export --db "$DB"
  step bench_final 150 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_final.json"
  step bench_call 60 python3 -m kernels.bench_call --out "$OUT/bench_call.json"
  step gpu_tests 90 python3 -m pytest -q tests/test_gpu.py tests/test_flashmla_gpu.py
  tar czf "$OUT/configs.tgz" kernels/configs
fi
gzip -c results/h200.db > "$OUT/h200.db.gz"
for f in "$OUT"/*_search.log "$OUT"/bench_final.log; do
  if [ -f "$f" ]; then echo "== $f"; tail -18 "$f" | cut -c1-150; fi
done
