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
#   sync-free     forward+backward of both fused ops, the modules and the transformers hook's tree check
#                 under torch.cuda.set_sync_debug_mode("error")
#   bench_*       the benchmark matrix, most important first (bench_workloads: the bias op on the real-batch
#                 workloads of the inspection report, padded and ragged, against SDPA with the same bias;
#                 bench_packed: packed batches against padding to the longest, bias op and a tiny model step)
#   other-tests   the rest of the test suite (-m "not slow"), with whatever time is left
#
# $OUT receives 3 files (at most 8 files are collected from it): results.json (every step: status, exit code,
# seconds, budget, its JSON result and the end of its output), summary.md (the same, readable) and suite.log
# (everything). Exit status: 0 when every step passed, 1 otherwise, 2 when nothing could run.
# --dry-run runs no GPU work: it checks that every step's command imports and parses its arguments (Python
# scripts and CLI commands), that the pytest selections collect, and that the step programs below work on CPU.
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

# Dry checks, all in one process (imports are shared): "dry_check.py KIND ARGS..." checks one command line;
# "dry_check.py --batch QUEUE" checks every line of QUEUE (NAME<TAB>KIND<TAB>ARGS... with tabs between
# arguments), writing NAME.out beside QUEUE and one "NAME<TAB>EXIT CODE<TAB>SECONDS" line per step to stdout.
#   script PATH ARGS / module NAME ARGS: import the script or module and parse its arguments, then stop;
#   pytest ARGS: collect that selection (files, node ids, options, markers), and check --ignore/--deselect paths;
#   program FILE ARGS: run a step program of this suite with --dry-run; pip ARGS: pip and setup.py are there.
cat >"$WORK/dry_check.py" <<'PY'
import argparse, contextlib, io, os, runpy, sys, time


class Parsed(Exception):
    pass


_real_parse_args = argparse.ArgumentParser.parse_args


def _parse_and_stop(self, args=None, namespace=None):
    raise Parsed(_real_parse_args(self, args, namespace))


def check_command(kind, target, argv):
    """Import the script/module and parse ``argv`` with its own argparse parser; stop before any work."""
    argparse.ArgumentParser.parse_args = _parse_and_stop
    saved = sys.argv
    sys.argv = [target, *argv]
    try:
        if kind == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=False)
    except Parsed as parsed:
        print(f"dry run: {target} {' '.join(argv)}: imports and arguments ok -> {vars(parsed.args[0])}")
        return 0
    except SystemExit as exc:
        print(f"dry run: {target} {' '.join(argv)}: exited with {exc.code!r} before its arguments parsed")
        return 2
    finally:
        argparse.ArgumentParser.parse_args = _real_parse_args
        sys.argv = saved
    print(f"dry run: {target} ran to the end without parsing its arguments with argparse")
    return 1


def check_pytest(args):
    problems = []
    for a in args:  # paths pytest would silently accept when stale
        for prefix in ("--ignore=", "--deselect="):
            if a.startswith(prefix):
                path, _, name = a[len(prefix):].partition("::")
                if not os.path.exists(path):
                    problems.append(f"{a}: {path} does not exist")
                elif name and f"def {name.split('[')[0]}(" not in open(path).read():
                    problems.append(f"{a}: {path} has no test {name}")
    for p in problems:
        print(f"dry run: {p}")
    if problems:
        return 1
    import pytest

    code = pytest.main(["--collect-only", "-q", *args])
    print(f"dry run: pytest collection exit code {int(code)}")
    return int(code)


def check_program(path, argv):
    saved = sys.argv
    sys.argv = [path, *argv, "--dry-run"]
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else (print(exc.code) or 1))
    finally:
        sys.argv = saved


def check(kind, args):
    if kind in ("script", "module"):
        return check_command(kind, args[0], args[1:])
    if kind == "pytest":
        return check_pytest(args)
    if kind == "program":
        return check_program(args[0], args[1:])
    if kind == "pip":
        import importlib.util

        ok = importlib.util.find_spec("pip") is not None and os.path.exists("setup.py")
        print(f"dry run: pip {'and setup.py present' if ok else 'or setup.py missing'}; would run pip {' '.join(args)}")
        return 0 if ok else 1
    print(f"dry run: unknown step kind {kind!r}")
    return 1


if sys.argv[1:2] == ["--batch"]:
    queue = sys.argv[2]
    folder = os.path.dirname(queue)
    for line in open(queue):
        name, kind, *args = line.rstrip("\n").split("\t")
        start = time.time()
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                rc = check(kind, args)
            except Exception as exc:  # noqa: BLE001 - the step's problem, reported as its failure
                import traceback

                traceback.print_exc()
                rc = 1
        open(os.path.join(folder, name + ".out"), "w").write(buffer.getvalue())
        print(f"{name}\t{rc}\t{int(time.time() - start)}", flush=True)
else:
    sys.exit(check(sys.argv[1], sys.argv[2:]))
PY

# Environment, CUDA, the test extras.
cat >"$WORK/preflight.py" <<'PY'
import argparse, ast, glob, importlib.metadata as md, json, os, platform, shutil, subprocess, sys

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true")
args = p.parse_args()

def test_extras():
    tree = ast.parse(open("setup.py").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTRAS" for t in node.targets):
            return ast.literal_eval(node.value)["test"]
    raise SystemExit("preflight: setup.py has no EXTRAS = {...} with a 'test' list")

def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

REQUIRED = ("pytest", "pytest-timeout", "hypothesis")  # the suite's pytest steps fail without these
result = {"python": platform.python_version(), "executable": sys.executable, "dry_run": args.dry_run}
extras = test_extras()
missing = [n for n in extras if installed(n) is None]
wheels = sorted(glob.glob(".whl/*.whl"))
if missing and wheels and not args.dry_run:
    # No registry here: only wheels carried in .whl/ can fill the gap.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", ".whl",
                    *missing], check=False)
    missing = [n for n in extras if installed(n) is None]
result["extras"] = {n: installed(n) or "MISSING" for n in extras}
import torch

result.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
              triton=installed("triton"), nvcc=shutil.which("nvcc"))
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    result["gpu"] = f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory >> 30} GiB)"
try:
    result["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    result["nvidia_smi"] = None
json.dump(result, open(args.json, "w"), indent=1)
print(json.dumps(result, indent=1))
bad = [n for n in REQUIRED if n in missing or installed(n) is None]
if bad:
    sys.exit(f"preflight: {', '.join(bad)} missing (needed by the test steps); carry wheels in .whl/")
if missing:
    print(f"preflight: optional test extras missing ({', '.join(missing)}): their tests skip", file=sys.stderr)
if not args.dry_run and not torch.cuda.is_available():
    print("preflight: no CUDA GPU is visible (torch.cuda.is_available() is False): nothing to measure. "
          "Use --dry-run to check the suite on a machine without one.", file=sys.stderr)
    sys.exit(2)
PY

# The CUDA tree builder must exist wherever CUDA does.
cat >"$WORK/cuda_builder.py" <<'PY'
import argparse, json, sys

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true")
args = p.parse_args()
import torch
from syntaxkernels import _ext

module = _ext.load()
result = {"extension": _ext.status(), "cuda_available": torch.cuda.is_available(),
          "cuda_builder": _ext.has_cuda_builder(),
          "has_cuda_binding": bool(module is not None and hasattr(module, "has_cuda"))}
json.dump(result, open(args.json, "w"), indent=1)
print(json.dumps(result))
if module is None and not args.dry_run:
    sys.exit("cuda-builder: FAIL: the C++ extension did not load: " + _ext.status())
if torch.cuda.is_available() and not result["cuda_builder"]:
    banner = "#" * 100
    sys.exit(f"{banner}\nFAIL: CUDA is present but the CUDA tree builder was not built "
             f"(syntaxkernels._C.has_cuda() is false: {_ext.status()}).\nThe build ran without a CUDA toolkit "
             f"or a CUDA torch; see the build step in suite.log.\n{banner}")
PY

# Forward + backward with any host synchronisation an error.
cat >"$WORK/sync_free.py" <<'PY'
import argparse, json, sys, traceback

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true", help="CPU, reference backend: checks the code, not the GPU")
args = p.parse_args()
import torch
import syntaxkernels as sk

device = "cpu" if args.dry_run else "cuda"
backend = "reference" if args.dry_run else "triton"
if not hasattr(torch.cuda, "set_sync_debug_mode"):
    sys.exit("sync-free: this torch has no torch.cuda.set_sync_debug_mode")
heads = [[-1] + [i // 2 for i in range(1, n)] for n in ((30, 17, 9) if args.dry_run else (300, 257, 129))]
trees = sk.TreeBatch.from_heads(heads).to(device)
B, H, N, D = len(heads), 4, trees.max_len, 64
dtype = torch.float32 if args.dry_run else torch.bfloat16

def leaf(*shape, dt=dtype):
    return torch.randn(*shape, device=device, dtype=dt).requires_grad_()

q, k, v = leaf(B, H, N, D), leaf(B, H, N, D), leaf(B, H, N, D)
buckets = sk.BucketSpec()
table, scale = leaf(buckets.num_buckets, dt=torch.float32), leaf(1, dt=torch.float32)

def bias_op():
    out = sk.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale,
                                   lengths=trees.lengths, backend=backend)
    out.backward(torch.ones_like(out))

def bias_op_window():
    out = sk.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, lengths=trees.lengths,
                                   window=4, deterministic=True, backend=backend)
    out.backward(torch.ones_like(out))

def subnetwork_op():
    out, nonempty = sk.syntax_subnetwork_attention(q, k, v, trees, sk.MaskSpec(pairwise=True), backend=backend)
    out.backward(torch.ones_like(out))

E = 64 if args.dry_run else 256
bias_module = sk.nn.SyntaxBiasedSelfAttention(E, 4, backend=backend).to(device)
bert_module = sk.nn.SyntaxBertSelfAttention(E, 4, backend=backend).to(device)
x = torch.randn(B, N, E, device=device, requires_grad=True)

def module(m):
    def run():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=not args.dry_run):
            y = m(x, trees)
        y.float().sum().backward()
    return run

cases = [("bias_attention fwd+bwd (lengths, bias_scale)", bias_op),
         ("bias_attention fwd+bwd (window, deterministic)", bias_op_window),
         ("subnetwork_attention fwd+bwd (pairwise)", subnetwork_op),
         ("nn.SyntaxBiasedSelfAttention fwd+bwd", module(bias_module)),
         ("nn.SyntaxBertSelfAttention fwd+bwd", module(bert_module))]
try:
    from syntaxkernels.integrations import transformers as integration
    cpu_trees = sk.TreeBatch.from_heads(heads)
    hidden = torch.randn(B, N, 64, device=device)
    mask = (torch.arange(N)[None, :] < cpu_trees.lengths[:, None]).to(device)
    cases.append(("transformers hook: tree check and move", lambda: integration._check_trees(cpu_trees, hidden, mask)))
except ImportError as exc:
    print(f"sync-free: transformers integration not checked ({exc})", file=sys.stderr)

def where(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "syntaxkernels" in f.filename]
    return f" at {frames[-1].filename.split('syntaxkernels')[-1]}:{frames[-1].lineno}" if frames else ""

rows, failed = [], 0
for name, fn in cases:
    for g in (q, k, v, table, scale, x):
        g.grad = None
    try:
        fn()  # warm-up outside the debug mode: compilation and caches may synchronise
        if not args.dry_run:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            if not args.dry_run:
                torch.cuda.set_sync_debug_mode(0)
        if not args.dry_run:
            torch.cuda.synchronize()
        rows.append(dict(case=name, status="ok"))
    except Exception as exc:  # noqa: BLE001
        failed += 1
        rows.append(dict(case=name, status="SYNC" if "synchroniz" in str(exc) else "ERROR",
                         detail=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where(exc)}"))
    print(f"{rows[-1]['status']:<5} {name} {rows[-1].get('detail', '')}")
json.dump(dict(device=device, backend=backend, dry_run=args.dry_run, cases=rows), open(args.json, "w"), indent=1)
sys.exit(1 if failed else 0)
PY

# results.json and summary.md from the steps recorded so far (run after every step).
cat >"$WORK/report.py" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET

out, work = sys.argv[1], sys.argv[2]
suite = dict(line.rstrip("\n").split("\t", 1) for line in open(os.path.join(work, "suite.tsv")))

def read_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None

def junit(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = dict(tests=0, failures=0, errors=0, skipped=0, time=0.0)
    failed, slowest = [], []
    for suite_el in root.iter("testsuite"):
        for key in counts:
            counts[key] += float(suite_el.get(key, 0)) if key == "time" else int(suite_el.get(key, 0))
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        slowest.append((float(case.get("time", 0)), name))
        for tag in ("failure", "error"):
            for el in case.findall(tag):
                failed.append(dict(test=name, kind=tag, message=(el.get("message") or "")[:500]))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed"] = failed[:50]
    counts["slowest"] = [dict(test=n, seconds=round(t, 2)) for t, n in sorted(slowest, reverse=True)[:10]]
    return counts

steps = []
for line in open(os.path.join(work, "steps.tsv")):
    name, status, rc, seconds, budget, command = line.rstrip("\n").split("\t")
    step = dict(name=name, status=status, rc=int(rc), seconds=int(seconds), budget=int(budget), command=command)
    step["result"] = junit(os.path.join(work, name + ".xml")) or read_json(os.path.join(work, name + ".json"))
    try:
        tail = open(os.path.join(work, name + ".out"), errors="replace").read().splitlines()[-40:]
        step["output_tail"] = [l[:300] for l in tail]
    except OSError:
        step["output_tail"] = []
    steps.append(step)
ok = all(s["status"].startswith(("ok", "skipped")) for s in steps)
results = dict(suite=dict(suite, ok=ok), steps=steps)
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)

md = [f"# GPU suite {suite['started']}{' (dry run)' if suite['dry_run'] == '1' else ''}", "",
      "| step | status | seconds | budget |", "| --- | --- | --- | --- |"]
md += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['budget']} |" for s in steps]
for s in steps:
    r = s["result"]
    if s["name"] == "info" or (s["status"] != "ok" and not s["status"].startswith("skipped")):
        md += ["", f"## {s['name']}: {s['status']}", "", "```", *s["output_tail"][-25:], "```"]
    if isinstance(r, dict) and "tests" in r:
        md += ["", f"## {s['name']}: {r['passed']} passed, {r['failures']} failed, {r['errors']} errors, "
                   f"{r['skipped']} skipped in {r['time']:.0f} s"]
        md += [f"- {f['kind']}: {f['test']}: {f['message'][:200]}" for f in r["failed"]]
    elif isinstance(r, dict) and "cases" in r:
        md += ["", f"## {s['name']}", ""] + [f"- {c['status']}: {c['case']} {c.get('detail', '')}" for c in r["cases"]]
    elif isinstance(r, dict) and isinstance(r.get("results"), list):
        md += ["", f"## {s['name']} on {r.get('device')}", ""]
        md += [f"- {c['status']}: {c['check']} ({c['seconds']:.1f} s): {c['detail'].splitlines()[0] if c['detail'] else ''}"
               for c in r["results"]]
    elif isinstance(r, dict) and isinstance(r.get("rows"), list) and r["rows"]:
        rows = [row for row in r["rows"] if isinstance(row, dict)]
        cols = []
        for row in rows:
            cols += [c for c in row if c not in cols and not isinstance(row[c], (dict, list))]
        md += ["", f"## {r.get('title', s['name'])}", ""]
        if isinstance(r.get("conditions"), dict):
            md += [" ".join(f"{k}={v}" for k, v in r["conditions"].items()), ""]
        md += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        md += ["| " + " | ".join(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                                 for c in cols) + " |" for row in rows]
    elif isinstance(r, dict) and s["name"].startswith("bench"):
        md += ["", f"## {s['name']}", "", "```", json.dumps(r, indent=1)[:4000], "```"]
md += ["", f"Suite {'passed' if ok else 'FAILED'}; budget {suite['budget']} s."]
open(os.path.join(out, "summary.md"), "w").write("\n".join(md) + "\n")
PY

# ------------------------------------------------------------------------------------------- step runner

record() {  # record NAME STATUS RC SECONDS BUDGET COMMAND
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$WORK/steps.tsv"
  "$PY" "$WORK/report.py" "$OUT" "$WORK" 2>>"$LOG" || echo "gpu_suite: could not write the report" | tee -a "$LOG"
}

# step NAME BUDGET MIN KIND ARGS...
#   KIND script: a Python file, ARGS = PATH ARGS...      module: python -m, ARGS = NAME ARGS...
#        pytest: ARGS = pytest arguments                 program: one of the programs above, ARGS = FILE ARGS...
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
    [ "$kind" = program ] && a2[0]="$WORK/${args[0]}"
    (IFS=$'\t'; printf '%s\t%s\t%s\n' "$name" "$kind" "${a2[*]}") >>"$WORK/dry_queue.tsv"
    printf '%s\t%s\t%s\n' "$name" "$budget" "$command" >>"$WORK/dry_steps.tsv"
    return 0
  fi
  case "$kind" in
    script) cmd=("$PY" "${args[@]}") ;;
    module) cmd=("$PY" -m "${args[@]}") ;;
    pytest) cmd=("$PY" -m pytest "${args[@]}" --junitxml "$WORK/$name.xml") ;;
    program) cmd=("$PY" "$WORK/${args[0]}" "${args[@]:1}") ;;
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
  [ "${CHECK_ONLY[0]:-}" = program ] && CHECK_ONLY[1]="$WORK/${CHECK_ONLY[1]:-}"
  "$PY" "$WORK/dry_check.py" "${CHECK_ONLY[@]}"
  exit $?
fi

# ------------------------------------------------------------------------------------------------ steps

# The GPU tests: every fused op's test file (test_*_attention.py), the fused modules, the CUDA tree builder.
shopt -s nullglob
OP_TESTS=(python_tests/test_*_attention.py)
shopt -u nullglob
GPU_TESTS=("${OP_TESTS[@]}" python_tests/test_modules_fused.py python_tests/test_tree_builder.py::test_cuda_builder_matches_cpp)
IGNORE_GPU_TESTS=()
for f in "${OP_TESTS[@]}" python_tests/test_modules_fused.py python_tests/test_gpu_suite.py; do
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
step sync-free 60 15 program sync_free.py --json @JSON@
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
  "$PY" "$WORK/dry_check.py" --batch "$WORK/dry_queue.tsv" >"$WORK/dry_results.tsv" 2>>"$LOG"
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
