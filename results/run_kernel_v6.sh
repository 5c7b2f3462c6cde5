#!/usr/bin/env bash
# Kernel v6 on one GPU, in one run: finish the bounded re-tunes (they resume what results/h200.db holds),
# export the tables, then the final bench with FlashMLA and torch.compile of the reference. What each step
# printed goes to $OUT; a step cut short by its limit stops after its running trial and the next one runs.
#   OUT=out bash results/run_kernel_v6.sh
set -u
OUT=${OUT:-results/out}
DB=${TUNER_DB:-sqlite:///results/h200.db}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
step v4_search 220 python3 -m tuner search search_spaces/v4_flash_tp4.yaml --db "$DB" --sampler tpe --n-trials 9 \
  --first T32-w4-s1-c256-p2-b1,T32-w4-s1-c512-p1 -q
step layer_search 150 python3 -m tuner search search_spaces/v4_flash_layer_tp4.yaml --db "$DB" --sampler tpe --n-trials 7 -q
step export 60 python3 -m tuner export --db "$DB"
step bench_final 170 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_final.json"
tar czf "$OUT/configs.tgz" kernels/configs
gzip -c results/h200.db > "$OUT/h200.db.gz"
