#!/usr/bin/env bash
# Kernel v8 on one GPU, in two parts (each step has its own time limit; the searches resume what results/h200.db
# holds, so a step cut short by its limit stops after its running trial and a later run continues it):
#   OUT=out PHASE=1 bash results/run_kernel_v8.sh   # bounded TPE re-tunes of the V3.2 and V4 spaces
#   OUT=out PHASE=2 bash results/run_kernel_v8.sh   # the rest of V4, the layer space, export, final bench, layer
#                                                   # call, GPU tests
#   OUT=out PHASE=release bash results/run_kernel_v8.sh   # export, final bench, layer call, GPU tests only
# RESUME_S and LAYER_S (seconds) override PHASE=2's limits for the resumed V4 search and the layer search;
# LAYER_S=0 skips the layer search and RELEASE=0 the release steps (to split PHASE=2 over two runs).
# Each search first measures the baseline, the previous kernel's five best configs and their untried values,
# then the --first configs (those whose many splits the combine's tile serves at C <= 8), then TPE's picks.
# What each step printed goes to $OUT.
set -u
OUT=${OUT:-results/out}
DB=${TUNER_DB:-sqlite:///results/h200.db}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
v4_search() { step "$1" "$2" python3 -m tuner search search_spaces/v4_flash_tp4.yaml --db "$DB" --sampler tpe --n-trials 9 \
  -q --first T16-w4-s1-c512-p2; }
if [ "${PHASE:-1}" = 1 ]; then
  step v32_search 250 python3 -m tuner search search_spaces/v32_tp8.yaml --db "$DB" --sampler tpe --n-trials 10 -q \
    --first T32-w4-s1-c256-p1,T32-w4-s1-c256-p3
  v4_search v4_search 290
elif [ "$PHASE" = release ]; then
  release_steps
else  # first the V4 levels that PHASE=1's limit cut off, if any (the search resumes: finished levels are skipped)
  v4_search v4_resumed_search "${RESUME_S:-60}"
  if [ "${LAYER_S:-300}" != 0 ]; then
    step layer_search "${LAYER_S:-300}" python3 -m tuner search search_spaces/v4_flash_layer_tp4.yaml --db "$DB" \
      --sampler tpe --n-trials 8 -q
  fi
  if [ "${RELEASE:-1}" != 0 ]; then release_steps; fi
fi
wrap_up
