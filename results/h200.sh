#!/usr/bin/env bash
# The H200 runs behind the committed results: one entry point, one PHASE per part of the GPU run.
#   OUT=out PHASE=grids bash results/h200.sh    # every feasible distinct launch of the shipped spaces, on the
#                                               # current kernel, at all 15 levels (GRID_LEVELS picks some)
#                                               # (GRIDS="v32 layer" picks some of v4, v32, layer); logs in $OUT/grids_h200/
#   OUT=out PHASE=search TUNER_DB=sqlite:///fresh.db bash results/h200.sh   # the default strategy at the gridded
#                                               # levels of V4 and V3.2 (SEARCHES="v4" picks one; logs in $OUT/search_h200/),
#                                               # from a fresh database holding only the feasibility cache of results/h200.db
#   OUT=out PHASE=retune bash results/h200.sh   # a cold default search of each shipped space at all 15 levels on
#                                               # the current kernel, into $TUNER_DB (RETUNES="v4 v32" picks some of
#                                               # v4, v32, layer); each search's summary rows (with the time split) in
#                                               # $OUT/retune_h200/SPACE.json, its log beside it; the tables are exported from
#                                               # the database afterwards (`tuner export --db sqlite:///results/h200.db`)
#   OUT=out PHASE=ab OLD=path/decode.py bash results/h200.sh   # a kernel change against the kernel before it
#                                               # (OLD: that kernel's kernels/decode.py, or a folder holding its
#                                               # decode.py and config.py, both swapped in: needed when the change
#                                               # declares a parameter), same configs (the shipped
#                                               # tables), same run, in the order new, old, new: the single-cache
#                                               # bench of both formats and the V4 layer call at AB_LEVELS (default
#                                               # 16,48,96); AB_ALSO (a bench_call --also list, e.g. table-merge)
#                                               # is timed in the new runs' layer call only; JSON and logs in
#                                               # $OUT/$AB (default ab_h200; its figures go to the ledger, results/ledger.py add)
#   OUT=out PHASE=call bash results/h200.sh     # the V4 layer call (window + compressed cache + sink, one
#                                               # split launch) against FlashMLA: its GPU tests, kernels.bench_call at
#                                               # the 15 levels, the single-cache bench of both formats at the 15 levels
#                                               # (shipped tables); $OUT/bench_call_h200.json, bench_single_h200.json and
#                                               # sglang_check_h200.json, a short table printed last;
#                                               # LIMIT defaults to 350 s here
#   OUT=out PHASE=sglang_v32 bash results/h200.sh    # the SGLang plugin's V3.2/GLM-5 hook (kernels.sglang_check_v32)
#                                               # at the 15 capture sizes; $OUT/sglang_check_v32_h200.json
#   OUT=out PHASE=feasibility bash results/h200.sh   # the cold feasibility check of the shipped spaces, as a
#                                               # search compiles it (benchmarks/bench_feasibility.py); JSON in $OUT
#   OUT=out PHASE=checks bash results/h200.sh   # one call for the GPU checks: the merged layer call's GPU test,
#                                               # bench_call against FlashMLA with the MERGE variants (CHECK_ALSO) at
#                                               # CHECK_LEVELS, the V3.2/GLM-5 hook, the new formats; JSON in $OUT
#   OUT=out PHASE=formats bash results/h200.sh  # the newer cache formats (V4.1 fp8 + fp4, GLM-5.3's no-RoPE):
#                                               # their kernel tests on the GPU, then benchmarks/bench_formats.py at
#                                               # the 15 levels (each checked against the fp32 reference first; the
#                                               # no-RoPE cache against FlashMLA's V32_NO_ROPE kernel, V4.1 against
#                                               # our V4 path); $OUT/bench_formats_h200.json, a short table printed
#                                               # last; LIMIT defaults to 240 s here. Their cold re-tunes:
#                                               # PHASE=retune RETUNES="v41 nope"
# Every search resumes what results/h200.db holds, so a phase cut short by LIMIT (seconds, default 540; each
# search gets SIGINT and stops after its running trial) goes on where it stopped when run again.
# $OUT (default results/out, ignored by git) has the layout of results/: a run's files replace the committed ones
# by name. What each step printed goes to $OUT/NAME.log; the database comes back gzipped in 15-MiB parts,
# $OUT/h200.db.gz.part00, part01, ... results/h200.db is built first (results/h200_db.py: the committed base and
# deltas); back home, the returned database becomes the next delta, the only file of it to commit:
#   cat h200.db.gz.part* | gunzip > /tmp/run.db && python results/h200_db.py delta /tmp/run.db
set -u
OUT=${OUT:-results/out}
# a device run may carry the database gzipped (the working tree that travels is limited): unpack it in place
if [ ! -e results/h200.db ] && [ -e .dbcarry/h200.db.gz ]; then gunzip -c .dbcarry/h200.db.gz > results/h200.db
else python3 "$(dirname "$0")/h200_db.py" build || exit 2  # from its committed base and deltas (a no-op when current)
fi
DB=${TUNER_DB:-sqlite:///results/h200.db}
LIMIT=${LIMIT:-$(case "${PHASE:-grids}" in call) echo 350 ;; formats) echo 240 ;; *) echo 540 ;; esac)}
mkdir -p "$OUT"
. "$(dirname "$0")/step.sh"
deadline=$(( $(date +%s) + LIMIT ))
left() { echo $(( deadline - $(date +%s) )); }
# `search NAME SPACE LEVELS ARGS...`: one search within what is left of LIMIT
search() { local name=$1 space=$2 levels=$3; shift 3; local l; l=$(left)
  if [ "$l" -lt 30 ]; then echo "$name: not started, ${l} s left"; return; fi
  mkdir -p "$OUT/$(dirname "$name")"
  step "$name" "$l" python3 -m sparse_mla_tuner search "$space" --db "$DB" --concurrency "$levels" -q "$@"; }
# `retune NAME SPACE`: a whole search (every level), its summary as JSON, within what is left of LIMIT
retune() { local name=$1 space=$2 l; l=$(left)
  if [ "$l" -lt 30 ]; then echo "$name: not started, ${l} s left"; return; fi
  mkdir -p "$OUT/$(dirname "$name")"
  # cold: a Triton cache of its own, so that nothing compiled by an earlier search on this host is reused
  TRITON_CACHE_DIR=$(mktemp -d) step "$name" "$l" sh -c 'exec python3 -m sparse_mla_tuner search "$1" --db "$2" -f json > "$3"' \
    sh "$space" "$DB" "$OUT/$name.json"; }
# a database of an older schema (a new kernel parameter's column) is migrated before a search writes to it
case "${PHASE:-grids}" in retune|grids) [ -e "${DB#sqlite:///}" ] && python3 -m sparse_mla_tuner db upgrade --db "$DB" ;; esac
case "${PHASE:-grids}" in
  retune)
    for g in ${RETUNES:-v4 v32 layer}; do case $g in
      v4) retune retune_h200/v4_flash_tp4 search_spaces/v4_flash_tp4.yaml ;;
      v32) retune retune_h200/v32_tp8 search_spaces/v32_tp8.yaml ;;
      layer) retune retune_h200/v4_flash_layer_tp4 search_spaces/v4_flash_layer_tp4.yaml ;;
      v41) retune retune_h200/v41_flash_layer_tp4 search_spaces/v41_flash_layer_tp4.yaml ;;
      nope) retune retune_h200/glm53_nope_tp4 search_spaces/glm53_nope_tp4.yaml ;;
      *) echo "unknown retune $g (allowed: v4, v32, layer, v41, nope)"; exit 2 ;;
    esac; done ;;
  grids)  # every level by default (GRID_LEVELS=1,96 picks some), continuing the cold default searches of the database
    GRID_LEVELS=${GRID_LEVELS:-1,2,4,8,16,24,32,40,48,56,64,72,80,88,96}
    for g in ${GRIDS:-v4 v32 layer}; do case $g in
      v4) search grids_h200/v4_grid search_spaces/v4_flash_tp4.yaml "$GRID_LEVELS" --sampler grid --n-trials 5000 ;;
      v32) search grids_h200/v32_grid search_spaces/v32_tp8.yaml "$GRID_LEVELS" --sampler grid --n-trials 5000 ;;
      layer) search grids_h200/layer_grid search_spaces/v4_flash_layer_tp4.yaml "$GRID_LEVELS" --sampler grid \
        --n-trials 5000 ;;
      *) echo "unknown grid $g (allowed: v4, v32, layer)"; exit 2 ;;
    esac; done ;;
  search)  # a fresh $TUNER_DB starts with only results/h200.db's feasibility cache (compile checks, no timings)
    fresh=${DB#sqlite:///}
    if [ "$fresh" != results/h200.db ] && [ ! -e "$fresh" ]; then
      python3 -c "import sqlite3, sys; from sparse_mla_tuner.db.store import Store
with Store('sqlite:///' + sys.argv[1]).session(): pass
con = sqlite3.connect(sys.argv[1]); con.execute('ATTACH ? AS src', ('results/h200.db',))
con.execute('INSERT OR IGNORE INTO tuner_feasibility SELECT * FROM src.tuner_feasibility'); con.commit()" "$fresh"
    fi
    for g in ${SEARCHES:-v4 v32}; do case $g in
      v4) search search_h200/v4_search search_spaces/v4_flash_tp4.yaml 1,8,48,96 ;;
      v32) search search_h200/v32_search search_spaces/v32_tp8.yaml 1,8,48,96 ;;
      *) echo "unknown search $g (allowed: v4, v32)"; exit 2 ;;
    esac; done ;;
  ab)
    ab=${AB:-ab_h200}; mkdir -p "$OUT/$ab"
    old=${OLD:?PHASE=ab needs OLD=the previous kernels/decode.py, or a folder with its decode.py and config.py}
    swapped=decode.py; [ -d "$old" ] && [ -e "$old/config.py" ] && swapped="decode.py config.py"
    [ -d "$old" ] || { mkdir -p "$OUT/old_files"; cp "$old" "$OUT/old_files/decode.py"; old=$OUT/old_files; }
    mkdir -p "$OUT/new_files"; for f in $swapped; do cp "kernels/$f" "$OUT/new_files/$f"; done
    for v in new old new2; do
      if [ $v = old ]; then src=$old; also=; else src=$OUT/new_files; also=${AB_ALSO:-}; fi
      for f in $swapped; do cp "$src/$f" "kernels/$f"; done
      step "$ab/ab_$v" 150 python3 -m sparse_mla_tuner.kernels.bench --formats fp8_model1,fp8_v32 --configs table \
        --concurrency "${AB_LEVELS:-16,48,96}" --no-ref --no-flashmla --samples 5 --out "$OUT/$ab/ab_$v.json"
      step "$ab/ab_call_$v" 150 python3 -m sparse_mla_tuner.kernels.bench_call --concurrency "${AB_LEVELS:-16,48,96}" \
        --samples 5 --no-flashmla ${also:+--also "$also"} --out "$OUT/$ab/ab_call_$v.json"
    done
    for f in $swapped; do cp "$OUT/new_files/$f" "kernels/$f"; done
    python3 - "$OUT/$ab" <<'PY'
import json, math, pathlib, sys
out = pathlib.Path(sys.argv[1])
def rows(v):
    single = {(r["format"], r["C"]): r["us"] for r in json.loads((out / f"ab_{v}.json").read_text())["rows"]}
    try:
        call = json.loads((out / f"ab_call_{v}.json").read_text())["rows"]
    except OSError:
        call = []
    return single | {("layer call", r["C"]): r["ours_us"] for r in call}
runs = {v: rows(v) for v in ("new", "old", "new2")}
print(f"{'format':<12} {'C':>4} {'new us':>8} {'old us':>8} {'new2 us':>8} {'new/old':>8}")
for k in runs["old"]:
    n = math.sqrt(runs["new"][k] * runs["new2"][k])
    print(f"{k[0]:<12} {k[1]:>4} {runs['new'][k]:8.2f} {runs['old'][k]:8.2f} {runs['new2'][k]:8.2f} {n / runs['old'][k]:8.3f}")
# the new runs' --also configs of the layer call (AB_ALSO), against the old kernel's layer call
also = {}
for v in ("new", "new2"):
    try:
        for r in json.loads((out / f"ab_call_{v}.json").read_text())["rows"]:
            for name, a in r.get("also", {}).items():
                also.setdefault((name, a["config"], r["C"]), []).append(a["us"])
    except OSError:
        pass
for (name, cfg, c), us in also.items():
    n = math.sqrt(us[0] * us[-1])
    print(f"{name + ' ' + cfg:<40} C={c:>3} {n:8.2f} us, /old {n / runs['old'][('layer call', c)]:.3f}")
PY
    exit 0 ;;
  call)
    levels=1,2,4,8,16,24,32,40,48,56,64,72,80,88,96
    step call_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_flashmla_gpu.py \
      tests/test_gpu.py::test_full_size_layer_call_matches_reference
    step bench_call $(( $(left) / 2 )) python3 -m sparse_mla_tuner.kernels.bench_call --concurrency $levels --samples 5 \
      --also single-table --out "$OUT/bench_call_h200.json"
    step bench_single $(( $(left) * 2 / 3 )) python3 -m sparse_mla_tuner.kernels.bench --formats fp8_model1,fp8_v32 \
      --configs table --concurrency $levels --no-ref --samples 5 --out "$OUT/bench_single_h200.json"
    step sglang_check "$(left)" python3 -m sparse_mla_tuner.kernels.sglang_check --out "$OUT/sglang_check_h200.json"
    for f in "$OUT"/call_tests.log "$OUT"/bench_call.log "$OUT"/bench_single.log "$OUT"/sglang_check.log; do echo "== $f"; tail -5 "$f" | cut -c1-150; done
    python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
try:
    rows = json.loads((out / "bench_call_h200.json").read_text())["rows"]
    print("layer call C  " + " ".join(f"{r['C']:>6}" for r in rows))
    print("ours us       " + " ".join(f"{r['ours_us']:6.1f}" for r in rows))
    print("FlashMLA us   " + " ".join(f"{r.get('flashmla_us', float('nan')):6.1f}" for r in rows))
    print("FlashMLA/ours " + " ".join(f"{r.get('ratio', float('nan')):6.2f}" for r in rows))
    also = [r.get("also", {}).get("single-table", {}).get("us", float("nan")) for r in rows]
    print("512-table us  " + " ".join(f"{u:6.1f}" for u in also))
    print("FlashMLA/512t " + " ".join(f"{r.get('flashmla_us', float('nan')) / u:6.2f}" for r, u in zip(rows, also)))
    print("vs FlashMLA   " + " ".join(f"{'ok' if r.get('ours_vs_flashmla_ok') else 'FAIL':>6}" for r in rows))
except (OSError, KeyError, ValueError) as e:
    print(f"no bench_call table: {e}")
try:
    single = json.loads((out / "bench_single_h200.json").read_text())["rows"]
    for fmt in ("fp8_model1", "fp8_v32"):
        rs = [r for r in single if r["format"] == fmt]
        print(f"{fmt + ' C':<13} " + " ".join(f"{r['C']:>6}" for r in rs))
        print("  ours us     " + " ".join(f"{r['us']:6.1f}" for r in rs))
        print("  % copy      " + " ".join(f"{r['pct_copy']:6.1f}" for r in rs))
        print("  FlashMLA/o  " + " ".join(f"{r['vs_flashmla']:6.2f}" for r in rs))
except (OSError, KeyError, ValueError) as e:
    print(f"no single-cache table: {e}")
PY
    exit 0 ;;
  feasibility)  # the cold feasibility check of the three shipped spaces, as a search compiles it (no cache)
    step feasibility "$(left)" python3 benchmarks/bench_feasibility.py search_spaces/v4_flash_tp4.yaml \
      search_spaces/v32_tp8.yaml search_spaces/v4_flash_layer_tp4.yaml -o "$OUT/feasibility_h200.json"
    tail -8 "$OUT/feasibility.log" ;;
  sglang_v32)  # the SGLang plugin's V3.2/GLM-5 hook at the 15 capture sizes: fp32 reference, FlashMLA, layer call
    step sglang_check_v32 "$(left)" python3 -m sparse_mla_tuner.kernels.sglang_check_v32 \
      --out "$OUT/sglang_check_v32_h200.json"
    tail -20 "$OUT/sglang_check_v32.log" | cut -c1-150
    exit 0 ;;
  formats)
    step formats_tests 75 python3 -m pytest -q -p no:cacheprovider tests/test_formats.py -k "kernel_matches_reference or rule_lifted"
    step bench_formats "$(left)" python3 benchmarks/bench_formats.py --samples 5 --out "$OUT/bench_formats_h200.json"
    for f in "$OUT"/formats_tests.log "$OUT"/bench_formats.log; do echo "== $f"; tail -16 "$f" | cut -c1-150; done
    exit 0 ;;
  checks)  # one GPU run of the kernel's and the engines' GPU checks, each step within what is left of LIMIT:
    # the merged layer call's GPU test, the layer call against FlashMLA with the merge variants (shipped tables, MERGE=1
    # on them, fewer fuller splits), the V3.2/GLM-5 hook and the new cache formats
    levels=${CHECK_LEVELS:-1,2,4,8,16,24,32,40,48,56,64,72,80,88,96}
    step merged_tests 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k merged
    step bench_call_merge $(( $(left) * 2 / 5 )) python3 -m sparse_mla_tuner.kernels.bench_call --concurrency "$levels" \
      --samples 5 --also "${CHECK_ALSO:-table-merge,T32-w4-s1-c16-p3-m1,T16-w4-s1-c16-p2-m1}" \
      --out "$OUT/bench_call_merge_h200.json"
    step sglang_check_v32 $(( $(left) / 3 )) python3 -m sparse_mla_tuner.kernels.sglang_check_v32 \
      --out "$OUT/sglang_check_v32_h200.json"
    step bench_formats "$(left)" python3 benchmarks/bench_formats.py --samples 5 --out "$OUT/bench_formats_h200.json"
    for f in merged_tests bench_call_merge sglang_check_v32 bench_formats; do echo "== $f"; tail -14 "$OUT/$f.log" | cut -c1-160; done
    exit 0 ;;
  *) echo "unknown PHASE=$PHASE (allowed: grids, search, retune, ab, call, feasibility, sglang_v32, formats, checks)"; exit 2 ;;
esac
for f in "$OUT"/*.log "$OUT"/*/*.log; do [ -e "$f" ] || continue; echo "== $f"; tail -22 "$f" | cut -c1-150; done
# the database, gzipped, in parts of at most 15 MiB (a device run returns files of up to 16 MiB):
# `cat h200.db.gz.part* | gunzip > h200.db` puts it together again
db=${DB#sqlite:///}; gzip -c "$db" | split -b 15m -d - "$OUT/$(basename "$db").gz.part"
