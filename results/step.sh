# Sourced by results/h200.sh. `step NAME LIMIT CMD...` runs CMD with its output in $OUT/NAME.log; past LIMIT
# seconds it gets SIGINT (a search stops after its running trial, and a later run resumes it). Prints NAME, the
# exit status and the seconds taken.
step() { local name=$1 limit=$2; shift 2; local t=$(date +%s)
  timeout -s INT "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name: rc=$? $(( $(date +%s) - t )) s"; }
