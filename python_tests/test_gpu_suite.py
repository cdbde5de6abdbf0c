"""benchmarks/gpu_suite.sh cannot rot: its dry run (no GPU) checks every step's command line, the checker
itself rejects what would break on the GPU machine, and its programs (benchmarks/gpu_checks/) are Python files
that compile and lint."""
import json
import os
import py_compile
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.sh"
PROGRAMS = ROOT / "benchmarks" / "gpu_checks"
#: The steps in the order the suite must run them: GPU-only evidence first, the rest of the tests last.
STEPS = ["preflight", "build", "cuda-builder", "info", "cuda-tests", "verify", "sync-free", "graph-replay",
         "bench_bias_attention", "bench_workloads", "bench_packed", "bench_subnetwork_attention", "bench_end_to_end", "bench_tree_distance",
         "other-tests"]
OUT_FILE_LIMIT = 8


def _suite(*args, out=None, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable)
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(SUITE), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.long_on_cpu
def test_dry_run_checks_every_step(tmp_path):
    result = _suite("--dry-run", out=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in report["steps"]] == STEPS
    assert all(s["status"] == "ok (dry run)" for s in report["steps"]), [(s["name"], s["status"]) for s in
                                                                          report["steps"]]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["results.json", "suite.log", "summary.md"]
    assert len(files) <= OUT_FILE_LIMIT
    by_name = {s["name"]: s for s in report["steps"]}
    assert "--device cuda" in by_name["verify"]["command"]
    assert "not slow" in by_name["cuda-tests"]["command"]
    # The host-sync checks are one test file, run once (not again in other-tests); which of its tests skip (the
    # transformers hook's without transformers) does not change the step.
    assert by_name["sync-free"]["command"].startswith("pytest python_tests/test_host_sync.py ")
    collected = {name: {line.split(":")[0] for line in by_name[name]["output_tail"] if line.startswith("python_tests/")}
                 for name in ("sync-free", "other-tests")}  # (pytest --collect-only -q: "FILE: COUNT" lines)
    assert collected["sync-free"] == {"python_tests/test_host_sync.py"}, collected
    assert collected["other-tests"] and "python_tests/test_host_sync.py" not in collected["other-tests"], collected
    assert "--ignore=python_tests/test_host_sync.py" in by_name["other-tests"]["command"]
    assert "(dry run)" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("check", [
    ["script", "benchmarks/bench_bias_attention.py", "--quik"],              # a misspelt option
    ["script", "benchmarks/bench_bias_attention.py", "--providers", "flexx"],  # an unknown provider
    ["module", "syntaxkernels", "verify", "--device", "tpu"],                 # a device the CLI rejects
    ["pytest", "python_tests", "--deselect=python_tests/test_tree_builder.py::test_no_such_test"],
], ids=["option", "provider", "device", "deselect"])
@pytest.mark.long_on_cpu
def test_checker_rejects_what_would_fail_on_the_gpu(check):
    result = _suite("--check", *check, timeout=300)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "dry run" in result.stdout + result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.long_on_cpu
def test_real_run_without_a_gpu_stops_at_once(tmp_path):
    result = _suite(out=tmp_path, timeout=300)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no CUDA GPU is visible" in result.stdout + (tmp_path / "suite.log").read_text()
    steps = json.loads((tmp_path / "results.json").read_text())["steps"]
    assert [s["name"] for s in steps] == ["preflight"] and steps[0]["status"] == "FAIL"


@pytest.mark.long_on_cpu
def test_the_suites_selection_leaves_out_the_compile_matrix():
    """The GPU suite runs pytest with -m "not slow": the sm_80/sm_90 compilation (minutes, no GPU needed) must
    be marked slow so it does not eat the suite's time, and the quick tests of the same file must stay in."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p",
                           "no:cacheprovider", "python_tests/test_inspection.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    selected = {line.split("::")[1] for line in proc.stdout.splitlines() if "::" in line}
    source = (ROOT / "python_tests" / "test_inspection.py").read_text()
    compiling = {line[4:line.index("(")] for line in source.splitlines()
                 if line.startswith("def test_") and "(reports" in line}
    assert compiling and selected and not compiling & selected, (compiling, selected)


def _suite_programs():
    """The Python files the suite runs: its ``program`` steps and the ``$CHECKS/NAME.py`` it calls itself."""
    source = SUITE.read_text()
    names = set(re.findall(r"\bprogram ([\w.-]+\.py)\b", source)) | set(re.findall(r'\$CHECKS/([\w.-]+\.py)', source))
    return source, names


def test_the_suites_programs_are_python_files_that_compile(tmp_path):
    """No Python hides in a heredoc of the shell script; every program it names is a file of
    benchmarks/gpu_checks/ (and every file there is used) that compiles and has a module docstring."""
    source, names = _suite_programs()
    assert not re.search(r"<<-?\s*['\"]?[A-Za-z_]+", source), "a heredoc in gpu_suite.sh: put programs in files"
    assert names == {p.name for p in PROGRAMS.glob("*.py")}, names
    for name in sorted(names):
        path = PROGRAMS / name
        py_compile.compile(str(path), cfile=str(tmp_path / (name + "c")), doraise=True)
        assert path.read_text().startswith('"""'), f"{name} has no module docstring"


def test_the_suites_programs_lint_clean():
    """pyflakes finds nothing in the suite's programs (they run only on the GPU machine and in the dry run)."""
    pytest.importorskip("pyflakes", reason="pyflakes is in the [test] extra")
    import io

    from pyflakes import api, reporter

    out = io.StringIO()
    report = reporter.Reporter(out, out)
    found = sum(api.checkPath(str(PROGRAMS / name), report) for name in sorted(_suite_programs()[1]))
    assert found == 0, out.getvalue()
