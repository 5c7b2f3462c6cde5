#!/usr/bin/env bash
# One device call of the H200 search: resumes from results/h200.db when it exists, stops cleanly
# (SIGINT = after the running trial) before the call's 10-minute limit, and hands the database back.
# Usage (on the lent GPU machine, repo root): bash results/run_h200.sh SPACE.yaml SECONDS
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
DB=/tmp/h200.db
[ -f results/h200.db ] && cp results/h200.db $DB
start=$(date +%s)
timeout -s INT -k 60 "$2" python3 -m tuner search "$1" --db sqlite:///$DB -q 2>&1 | tee $OUT/search.log
echo "wall $(( $(date +%s) - start )) s"
python3 - <<'PY'
import sqlite3
con = sqlite3.connect("/tmp/h200.db"); con.execute("PRAGMA wal_checkpoint(TRUNCATE)"); con.execute("PRAGMA journal_mode=DELETE"); con.close()
PY
cp $DB $OUT/h200.db
python3 -m tuner trials --db sqlite:///$DB -f csv > $OUT/trials.csv
for c in 1 8 48 64 80 96; do python3 -m tuner best --concurrency $c --db sqlite:///$DB 2>/dev/null | tail -n +3; done
