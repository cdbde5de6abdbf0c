#!/usr/bin/env bash
# One-shot GPU suite (one H200, < 8 minutes): build, info, verify, CUDA tests, every JSON benchmark.
#
#   OUT=/path/to/results bash benchmarks/gpu_suite.sh
#
# Each stage has its own time budget; a failing or timed-out stage is reported and the others still run.
# Writes to $OUT (8 files, the device tool's limit): suite.log, verify.json, pytest.txt, summary.md, and
# bench_<name>.json for the four benchmarks below.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$(pwd)/gpu_out}"
mkdir -p "$OUT"
unset TRITON_INTERPRET
LOG="$OUT/suite.log"
SUMMARY="$OUT/summary.md"
: >"$LOG"
declare -a STAGES=()
START=$(date +%s)

stage() {  # stage NAME BUDGET_SECONDS COMMAND...
  local name=$1 budget=$2
  shift 2
  local t0=$(date +%s)
  echo "=== [$name] (budget ${budget}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$budget" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local status=ok
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="TIMEOUT"
  [ $rc -ne 0 ] && [ "$status" = ok ] && status="FAIL (rc=$rc)"
  echo "=== [$name] $status in ${dt}s" | tee -a "$LOG"
  STAGES+=("| $name | $status | ${dt}s |")
}

DEADLINE=$(( START + 450 ))  # leave room for the summary inside 8 minutes

stage build 120 python -m pip install --no-build-isolation --no-deps -e .
stage info 20 python -m syntaxkernels info
stage verify 60 python -m syntaxkernels verify --json "$OUT/verify.json"
stage cuda-tests 100 bash -c "python -m pytest python_tests -m 'not slow' -x -q -p no:cacheprovider > '$OUT/pytest.txt' 2>&1; rc=\$?; tail -5 '$OUT/pytest.txt'; exit \$rc"

# Benchmarks, most important first; each is skipped when the suite's deadline is near.
bench() {  # bench NAME BUDGET ARGS...
  local name=$1 budget=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    echo "=== [$name] skipped: suite deadline reached" | tee -a "$LOG"
    STAGES+=("| $name | skipped (deadline) | 0s |")
    return
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  stage "$name" "$budget" python "benchmarks/$name.py" "$@" --json "$OUT/$name.json"
}
bench bench_bias_attention 100 --quick
bench bench_subnetwork_attention 90 --quick
bench bench_end_to_end 60 --device cuda --steps 5 --batches 4
bench bench_tree_distance 20 --batches 8 --min-seconds 0.2

{
  echo "# GPU suite $(date -Iseconds)"
  echo
  python -m syntaxkernels info 2>/dev/null | sed 's/^/    /'
  echo
  echo "| stage | status | time |"
  echo "| --- | --- | --- |"
  for s in "${STAGES[@]}"; do echo "$s"; done
  echo
  echo "Total: $(( $(date +%s) - START ))s"
  for f in "$OUT"/bench_*.json; do
    [ -e "$f" ] || continue
    python - "$f" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
rows = [r for r in data.get("rows", []) if isinstance(r, dict) and "ms" in r]
print(f"\n## {data.get('title', sys.argv[1])}\n")
print(" ".join(f"{k}={v}" for k, v in data.get("conditions", {}).items()) + "\n")
cols = [c for c in ("provider", "D", "N", "B", "H", "mode", "ms", "tflops", "peak_mib") if any(c in r for r in rows)]
print("| " + " | ".join(cols) + " |")
print("|" + " --- |" * len(cols))
for r in rows:
    print("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |")
other = [r for r in data.get("rows", []) if isinstance(r, dict) and "ms" not in r]
for r in other:
    print(f"- {r.get('provider', '')} N={r.get('N', '')} D={r.get('D', '')}: {r.get('note', '')}")
PY
  done
} >"$SUMMARY" 2>>"$LOG"
cat "$SUMMARY"
