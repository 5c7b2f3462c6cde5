#!/usr/bin/env bash
# A deeper search at V3.2 C=96 on kernel v10 (its level sits on the 94 us line), then the tables exported and the
# final bench, on one GPU in one run. The search resumes the level's study (--n-trials counts its trials in all).
#   OUT=out bash results/run_kernel_v10_v32_c96.sh
set -u
OUT=${OUT:-results/out}
DB=${TUNER_DB:-sqlite:///results/h200.db}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
step v32_c96_search "${LIMIT:-170}" python3 -m tuner search search_spaces/v32_tp8.yaml --db "$DB" --sampler tpe \
  --n-trials "${N_TRIALS:-45}" --concurrency 96 -q
step export 60 python3 -m tuner export --db "$DB"
step bench_final 110 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_final.json"
tar czf "$OUT/configs.tgz" kernels/configs
wrap_up
