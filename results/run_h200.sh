#!/usr/bin/env bash
# Tune the shipped search spaces on this GPU and refresh the committed results:
#   1. calibrate the A/A noise (independent captures of the baseline) at C=1 and C=96,
#   2. search every concurrency level (resumes: what results/h200.db already holds for this kernel is kept),
#   3. export the engine tables to kernels/configs/ and regenerate docs/h200_report.md with its plots.
# Usage, from the repository root on a machine with a CUDA GPU:
#   bash results/run_h200.sh [SPACE.yaml ...]        (default: both shipped spaces)
# Ctrl-C stops after the running trial; running the script again continues where it stopped.
set -euo pipefail
DB=${TUNER_DB:-sqlite:///results/h200.db}
TUNER=${TUNER:-tuner}
spaces=("$@")
[ ${#spaces[@]} -gt 0 ] || spaces=(search_spaces/v4_flash_tp4.yaml search_spaces/v32_tp8.yaml)

$TUNER db upgrade --db "$DB"
for space in "${spaces[@]}"; do
    $TUNER calibrate "$space" --concurrency 1,96 --db "$DB"
    start=$(date +%s)
    $TUNER search "$space" --db "$DB" -q
    echo "$space: searched in $(( $(date +%s) - start )) s"
done
$TUNER export --db "$DB"
$TUNER report --db "$DB" -o docs/h200_report.md --plots docs/plots
