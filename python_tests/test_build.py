"""Build checks: the CUDA sources compile for sm_80/sm_90 with the machine's nvcc, the CMake build and its
C++ tests pass, one source list feeds both builds, and the package works with the extension disabled."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUDA_SOURCE = ROOT / "csrc" / "cuda" / "tree_distance_cuda.cu"


def _sources(variable):
    text = (ROOT / "cmake" / "sources.cmake").read_text()
    body = re.search(r"set\(\s*" + variable + r"\s+(.*?)\)", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in body.splitlines() if line.split("#")[0].strip()]


def test_one_source_list_covers_every_source_file():
    listed = set()
    for variable in ("SYNTAXKERNELS_CORE_SOURCES", "SYNTAXKERNELS_BINDING_SOURCES", "SYNTAXKERNELS_CUDA_SOURCES",
                     "SYNTAXKERNELS_TEST_SOURCES"):
        listed.update(_sources(variable))
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cpp", ".cu")}
    assert listed == on_disk
    setup_text = (ROOT / "setup.py").read_text()
    cmake_text = (ROOT / "CMakeLists.txt").read_text()
    assert "sources.cmake" in setup_text and "cmake/sources.cmake" in cmake_text
    assert not re.search(r"csrc/[\w/]+\.(cpp|cu)", setup_text + cmake_text), "a source path outside the one list"


def test_cuda_source_has_no_torch_headers():
    for path in (CUDA_SOURCE, CUDA_SOURCE.with_suffix(".h")):
        includes = re.findall(r"#include\s*[<\"]([^>\"]+)", path.read_text())
        assert not [i for i in includes if i.startswith(("torch", "ATen", "c10"))], (path, includes)


@pytest.mark.timeout(300)
@pytest.mark.long_on_cpu
def test_cuda_source_compiles_for_sm80_and_sm90(tmp_path):
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                    if os.environ.get("CUDA_HOME") else None)
    if not nvcc or not os.path.exists(nvcc):
        pytest.skip("nvcc not found")
    out = tmp_path / "tree_distance_cuda.o"
    command = [nvcc, "-O3", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
               "-I", str(ROOT / "csrc"), "-c", str(CUDA_SOURCE), "-o", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump") or str(Path(nvcc).with_name("cuobjdump"))
    if os.path.exists(cuobjdump):
        listing = subprocess.run([cuobjdump, "--list-elf", str(out)], capture_output=True, text=True).stdout
        assert "sm_80" in listing and "sm_90" in listing, listing


@pytest.mark.timeout(180)
@pytest.mark.long_on_cpu
def test_cmake_build_and_ctest(tmp_path):
    cmake, ctest = shutil.which("cmake"), shutil.which("ctest")
    if not cmake or not ctest:
        pytest.skip("cmake not found")
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [
        [cmake, "-S", str(ROOT), "-B", str(build), *generator],
        [cmake, "--build", str(build), "--parallel", "2"],
        [ctest, "--test-dir", str(build), "--output-on-failure"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=170)
        assert result.returncode == 0, f"{' '.join(step)}\n{result.stdout}\n{result.stderr}"
    assert "100% tests passed" in result.stdout


def _run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **env})


@pytest.mark.timeout(150)
@pytest.mark.long_on_cpu
def test_package_works_with_the_extension_disabled():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import syntaxkernels as sk\n"
        "    from syntaxkernels import _ext\n"
        "    d = sk.tree_distance([[-1, 0, 1], [-1]])\n"
        "assert not [w for w in caught if 'C++ extension' in str(w.message)]\n"  # disabled on purpose: silent
        "assert not _ext.available() and 'disabled' in _ext.status()\n"
        "assert d[0].tolist() == [[0, 1, 2], [1, 0, 1], [2, 1, 0]] and d[1, 0, 0] == 0 and d[1, 0, 1] == 255\n"
        "b = sk.TreeBatch.from_heads([[1, -1]])\n"
        "assert b.depth.tolist() == [[1, 0]]\n"
        "print('ok')\n"
    )
    result = _run_python(code, SYNTAXKERNELS_DISABLE_EXTENSION="1")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.timeout(150)
@pytest.mark.long_on_cpu
def test_missing_extension_warns_once_and_falls_back():
    code = (
        "import sys, warnings\n"
        "sys.modules['syntaxkernels._C'] = None\n"  # makes `from . import _C` raise ImportError
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import syntaxkernels as sk\n"
        "    for _ in range(3):\n"
        "        d = sk.tree_distance([[-1, 0]])\n"
        "ours = [w for w in caught if 'C++ extension could not be loaded' in str(w.message)]\n"
        "assert len(ours) == 1, [str(w.message) for w in caught]\n"
        "assert d[0].tolist() == [[0, 1], [1, 0]]\n"
        "print('ok')\n"
    )
    result = _run_python(code)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def _setup_module(monkeypatch):
    """setup.py's globals, run with ``setuptools.setup`` replaced (nothing is built), and what it passed to it."""
    import runpy

    import setuptools

    passed = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: passed.update(kwargs))
    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test"), passed


def test_build_jobs_are_capped_by_memory_unless_max_jobs_is_set(monkeypatch):
    """ninja's default (a job per core plus two) as long as each job has COMPILE_JOB_BYTES (the measured peak of
    one compiler, 2.3 GB, with a margin), at least one job; MAX_JOBS always wins."""
    setup, _ = _setup_module(monkeypatch)
    jobs, GiB = setup["build_jobs"], 2**30
    assert setup["COMPILE_JOB_BYTES"] >= int(2.3 * GiB)
    assert jobs({}, 16, 4 * GiB)[0] == 1  # a 16-core machine with 4 GiB free: one compiler, not 18
    assert jobs({}, 16, 12 * GiB)[0] == 12 * GiB // setup["COMPILE_JOB_BYTES"] == 4
    assert jobs({}, 2, 64 * GiB)[0] == 4  # plenty of memory: ninja's default
    assert jobs({}, 2, GiB // 2)[0] == 1
    assert jobs({}, 8, None)[0] == 10  # memory unknown: ninja's default
    assert jobs({"MAX_JOBS": "7"}, 2, GiB)[0] is None  # left as set
    assert "4.0 GiB available" in jobs({}, 16, 4 * GiB)[1]
    environ = {}
    setup["cap_build_jobs"](environ)
    assert int(environ["MAX_JOBS"]) >= 1
    environ = {"MAX_JOBS": "3"}
    setup["cap_build_jobs"](environ)
    assert environ == {"MAX_JOBS": "3"}


def test_the_build_command_sets_max_jobs_before_compiling(monkeypatch):
    """The build_ext command setup.py installs caps MAX_JOBS (here with 3 GiB of memory free: one job) before
    torch's BuildExtension compiles, which reads it when it runs ninja; a MAX_JOBS already set is kept."""
    from setuptools import Distribution
    from torch.utils.cpp_extension import BuildExtension

    setup, passed = _setup_module(monkeypatch)
    seen = []
    monkeypatch.setattr(BuildExtension, "build_extensions", lambda self: seen.append(os.environ.get("MAX_JOBS")))
    command = passed["cmdclass"]["build_ext"](Distribution())
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setitem(setup["cap_build_jobs"].__globals__, "available_memory", lambda: 3 * 2**30)  # 3 GiB free
    command.build_extensions()
    assert seen == ["1"]
    monkeypatch.setenv("MAX_JOBS", "1")
    command.build_extensions()
    assert seen[-1] == "1"
