# Sourced by the results/run_*.sh scripts. `step NAME LIMIT CMD...` runs CMD with its output in
# $OUT/NAME.log; past LIMIT seconds it gets SIGINT (a search stops after its running trial, and a later
# run resumes it). Prints NAME, the exit status and the seconds taken.
step() { local name=$1 limit=$2; shift 2; local t=$(date +%s)
  timeout -s INT "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name: rc=$? $(( $(date +%s) - t )) s"; }

# The end of a re-tune, after its last search (run_kernel_v7.sh and v8, PHASE=2): the tables exported from
# $DB, the final bench, the layer call, the GPU tests, and the tables themselves to $OUT/configs.tgz.
release_steps() {
  step export 60 python3 -m tuner export --db "$DB"
  step bench_final 150 python3 -m kernels.bench --configs table --samples 7 --out "$OUT/bench_final.json"
  step bench_call 60 python3 -m kernels.bench_call --out "$OUT/bench_call.json"
  step gpu_tests 90 python3 -m pytest -q tests/test_gpu.py tests/test_flashmla_gpu.py
  tar czf "$OUT/configs.tgz" kernels/configs
}

# The database to $OUT/h200.db.gz, the end of each search's log and of the final bench's, then every log and JSON
# file of $OUT packed into $OUT/logs.tgz (tar xzf it where they belong).
wrap_up() {
  gzip -c results/h200.db > "$OUT/h200.db.gz"
  for f in "$OUT"/*_search.log "$OUT"/bench_final.log; do
    if [ -f "$f" ]; then echo "== $f"; tail -18 "$f" | cut -c1-150; fi
  done
  (cd "$OUT" && shopt -s nullglob && files=(*.log *.json) && [ ${#files[@]} -gt 0 ] && tar czf logs.tgz "${files[@]}" \
    && rm -f "${files[@]}")
}

# `patched PATCH...`: the working tree with each patch applied in turn, each reverted (last first) when the script exits.
patched() { local p undo=""
  for p in "$@"; do git apply "$p" && undo="git apply -R '$p'; $undo"; done
  trap "$undo" EXIT; }
