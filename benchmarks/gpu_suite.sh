#!/usr/bin/env bash
# GPU suite: all the evidence that needs a CUDA GPU, in one run of at most 8 minutes.
#
#   OUT=/path/to/results bash benchmarks/gpu_suite.sh       # on a machine with a CUDA GPU
#   bash benchmarks/gpu_suite.sh --dry-run                   # anywhere (CI, no GPU): checks every step
#   bash benchmarks/gpu_suite.sh --check script|module|pytest ARGS...   # dry-check one command line
#
# Steps, the GPU-only evidence first; each has its own deadline (seconds, cut to what is left of the whole
# budget, 480 s by default: --budget S) and records a JSON result in $OUT/results.json:
#   preflight     python, torch, CUDA, Triton, nvcc; the test extras (missing ones installed from ./.whl/ when
#                 wheels are there: the GPU machine cannot download); stops the suite when no GPU is visible
#   build         pip install --no-build-isolation --no-deps --no-index -e .
#   cuda-builder  FAILS LOUDLY when CUDA is present but syntaxkernels._C.has_cuda() is false
#   info          python -m syntaxkernels info
#   cuda-tests    pytest of the GPU tests (every python_tests/test_*_attention.py, the fused modules, the CUDA
#                 tree builder), -m "not slow" (the sm_80/sm_90 compile matrices are slow: CI runs them on CPU)
#   verify        python -m syntaxkernels verify --device cuda
#   sync-free     python_tests/test_host_sync.py: forward+backward of the fused ops, the modules and the
#                 transformers hook's tree check, with no host read and under
#                 torch.cuda.set_sync_debug_mode("error")
#   graph-replay  a bias layer captured in a CUDA graph (and compiled with mode="reduce-overhead") replayed with
#                 other batches copied into its plan: bit-identical to eager; a layer's host time on the GPU host
#   bench_*       the benchmark matrix, most important first (bench_workloads: the bias op on the real-batch
#                 workloads of the inspection report, padded and ragged, against SDPA with the same bias;
#                 bench_packed: packed batches against padding to the longest, bias op and a tiny model step)
#   other-tests   the rest of the test suite (-m "not slow"), with whatever time is left
#
# $OUT receives 3 files (at most 8 files are collected from it): results.json (every step: status, exit code,
# seconds, budget, its JSON result and the end of its output), summary.md (the same, readable) and suite.log
# (everything). Exit status: 0 when every step passed, 1 otherwise, 2 when nothing could run.
# --dry-run runs no GPU work: it checks that every step's command imports and parses its arguments (Python
# scripts and CLI commands), that the pytest selections collect, and that the suite's step programs
# (benchmarks/gpu_checks/) work on CPU.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY_RUN=0
BUDGET=480
RESERVE=15   # seconds kept for the final summary
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift 2 ;;
    --check) shift; CHECK_ONLY=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

PY="${PYTHON:-$(command -v python3 || command -v python)}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
if [ "$DRY_RUN" = 1 ]; then
  OUT="${OUT:-$WORK/out}"
else
  OUT="${OUT:-$ROOT/gpu_out}"
  unset TRITON_INTERPRET   # real kernels on the GPU
fi
mkdir -p "$OUT"
LOG="$OUT/suite.log"
: >"$LOG"
export PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=$(( START + BUDGET - RESERVE ))
printf 'started\t%s\nbudget\t%s\ndry_run\t%s\n' "$(date -Iseconds)" "$BUDGET" "$DRY_RUN" >"$WORK/suite.tsv"
: >"$WORK/steps.tsv"

# ------------------------------------------------------------------------------------ step programs (Python)

# The suite's own programs are plain Python files in benchmarks/gpu_checks/ (each says what it does at its top):
#   dry_check.py    the dry checks of every step's command line (--dry-run, --check), all in one process
#   preflight.py    environment, CUDA, the test extras            cuda_builder.py  the CUDA tree builder exists
#   report.py       results.json and summary.md from the steps recorded so far (run after every step)
# The sync-free step is python_tests/test_host_sync.py: on CUDA its checks run under
# torch.cuda.set_sync_debug_mode("error").
CHECKS="$ROOT/benchmarks/gpu_checks"

# ------------------------------------------------------------------------------------------- step runner

record() {  # record NAME STATUS RC SECONDS BUDGET COMMAND
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$WORK/steps.tsv"
  "$PY" "$CHECKS/report.py" "$OUT" "$WORK" 2>>"$LOG" || echo "gpu_suite: could not write the report" | tee -a "$LOG"
}

# step NAME BUDGET MIN KIND ARGS...
#   KIND script: a Python file, ARGS = PATH ARGS...      module: python -m, ARGS = NAME ARGS...
#        pytest: ARGS = pytest arguments                 program: a file of benchmarks/gpu_checks/, ARGS = FILE ARGS...
#        pip:    ARGS = pip arguments
# Under --dry-run a step is only queued; dry_check.py --batch checks them all at the end.
# The step's JSON goes to $WORK/NAME.json (the placeholder @JSON@ in ARGS), pytest's JUnit XML to $WORK/NAME.xml.
FAILED=0
step() {
  local name=$1 budget=$2 min=$3 kind=$4
  shift 4
  local args=()
  local a
  for a in "$@"; do args+=("${a//@JSON@/$WORK/$name.json}"); done
  local command
  command="$kind ${args[*]}"
  local now left
  now=$(date +%s)
  left=$(( DEADLINE - now ))
  if [ "$DRY_RUN" = 0 ] && [ "$left" -lt "$min" ]; then
    echo "=== [$name] skipped: ${left}s left of the budget, the step needs at least ${min}s" | tee -a "$LOG"
    record "$name" "skipped (deadline)" 0 0 "$budget" "$command"
    return
  fi
  [ "$DRY_RUN" = 0 ] && [ "$budget" -gt "$left" ] && budget=$left
  local cmd=()
  if [ "$DRY_RUN" = 1 ]; then  # checked later, all in one process (see dry_check.py)
    local a2=("${args[@]}")
    [ "$kind" = program ] && a2[0]="$CHECKS/${args[0]}"
    (IFS=$'\t'; printf '%s\t%s\t%s\n' "$name" "$kind" "${a2[*]}") >>"$WORK/dry_queue.tsv"
    printf '%s\t%s\t%s\n' "$name" "$budget" "$command" >>"$WORK/dry_steps.tsv"
    return 0
  fi
  case "$kind" in
    script) cmd=("$PY" "${args[@]}") ;;
    module) cmd=("$PY" -m "${args[@]}") ;;
    pytest) cmd=("$PY" -m pytest "${args[@]}" --junitxml "$WORK/$name.xml") ;;
    program) cmd=("$PY" "$CHECKS/${args[0]}" "${args[@]:1}") ;;
    pip) cmd=("$PY" -m pip "${args[@]}") ;;
  esac
  echo "=== [$name] (budget ${budget}s) ${cmd[*]}" | tee -a "$LOG"
  local t0=$now
  timeout --signal=INT --kill-after=15 "$budget" "${cmd[@]}" >"$WORK/$name.out" 2>&1  # INT: pytest still reports
  local rc=$?
  cat "$WORK/$name.out" >>"$LOG"
  local dt=$(( $(date +%s) - t0 ))
  local status="ok"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT"; elif [ $rc -ne 0 ]; then status="FAIL"; fi
  [ "$status" = ok ] || FAILED=1
  echo "=== [$name] $status (exit $rc) in ${dt}s" | tee -a "$LOG"
  tail -n 5 "$WORK/$name.out"
  record "$name" "$status" "$rc" "$dt" "$budget" "$command"
  return $rc
}

if [ "${CHECK_ONLY+set}" = set ]; then  # --check KIND ARGS...: the dry check of one command line
  [ "${CHECK_ONLY[0]:-}" = program ] && CHECK_ONLY[1]="$CHECKS/${CHECK_ONLY[1]:-}"
  "$PY" "$CHECKS/dry_check.py" "${CHECK_ONLY[@]}"
  exit $?
fi

# ------------------------------------------------------------------------------------------------ steps

# The GPU tests: every fused op's test file (test_*_attention.py), the fused modules, the CUDA tree builder.
shopt -s nullglob
OP_TESTS=(python_tests/test_*_attention.py)
shopt -u nullglob
GPU_TESTS=("${OP_TESTS[@]}" python_tests/test_modules_fused.py python_tests/test_tree_builder.py::test_cuda_builder_matches_cpp)
IGNORE_GPU_TESTS=()
for f in "${OP_TESTS[@]}" python_tests/test_modules_fused.py python_tests/test_host_sync.py python_tests/test_gpu_suite.py; do
  IGNORE_GPU_TESTS+=("--ignore=$f")
done
PYTEST_OPTS=(-m "not slow" -q -p no:cacheprovider --timeout 120 -rfE)

step preflight 60 20 program preflight.py --json @JSON@
preflight_rc=$?
if [ "$preflight_rc" -ne 0 ]; then
  echo "gpu_suite: preflight failed (exit $preflight_rc): stopping; see $OUT/suite.log" | tee -a "$LOG"
  exit 2
fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"   # parallel compile jobs of the extension build
step build 240 60 pip install --no-build-isolation --no-deps --no-index -e .
step cuda-builder 60 10 program cuda_builder.py --json @JSON@
step info 30 10 module syntaxkernels info
step cuda-tests 150 30 pytest "${GPU_TESTS[@]}" "${PYTEST_OPTS[@]}"
step verify 90 20 module syntaxkernels verify --device cuda --json @JSON@
step sync-free 90 15 pytest python_tests/test_host_sync.py "${PYTEST_OPTS[@]}"
step graph-replay 90 20 program graph_replay.py --json @JSON@
step bench_bias_attention 90 30 script benchmarks/bench_bias_attention.py --quick --json @JSON@
step bench_workloads 60 20 script benchmarks/bench_bias_attention.py --workloads sentences,pairs,finetune-128,packed,odd-1000 \
  --modes fwd,fwd+bwd --json @JSON@
step bench_packed 45 15 script benchmarks/bench_packed.py --device cuda --quick --json @JSON@
step bench_subnetwork_attention 60 20 script benchmarks/bench_subnetwork_attention.py --quick --skip-cpu --json @JSON@
step bench_end_to_end 60 20 script benchmarks/bench_end_to_end.py --device cuda --steps 5 --batches 4 --json @JSON@
step bench_tree_distance 30 10 script benchmarks/bench_tree_distance.py --batches 8 --min-seconds 0.2 --json @JSON@
step other-tests 600 30 pytest python_tests "${PYTEST_OPTS[@]}" "${IGNORE_GPU_TESTS[@]}" \
  --deselect=python_tests/test_tree_builder.py::test_cuda_builder_matches_cpp

if [ "$DRY_RUN" = 1 ]; then
  echo "=== dry run: checking $(wc -l <"$WORK/dry_queue.tsv") steps in one process" | tee -a "$LOG"
  "$PY" "$CHECKS/dry_check.py" --batch "$WORK/dry_queue.tsv" >"$WORK/dry_results.tsv" 2>>"$LOG"
  [ "$(wc -l <"$WORK/dry_results.tsv")" -eq "$(wc -l <"$WORK/dry_queue.tsv")" ] || FAILED=1
  while IFS=$'\t' read -r name rc seconds; do
    IFS=$'\t' read -r _ budget command < <(awk -F'\t' -v n="$name" '$1 == n' "$WORK/dry_steps.tsv")
    status="ok (dry run)"
    [ "$rc" -eq 0 ] || { status="FAIL (dry run)"; FAILED=1; }
    cat "$WORK/$name.out" >>"$LOG"
    echo "=== [$name] $status (exit $rc) in ${seconds}s" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || tail -n 20 "$WORK/$name.out"
    record "$name" "$status" "$rc" "$seconds" "$budget" "$command"
  done <"$WORK/dry_results.tsv"
fi

files=$(find "$OUT" -type f | wc -l)
echo "gpu_suite: $files files in $OUT (at most 8 are collected); total $(( $(date +%s) - START ))s" \
  | tee -a "$LOG"
[ "$files" -le 8 ] || FAILED=1
cat "$OUT/summary.md"
exit $FAILED
