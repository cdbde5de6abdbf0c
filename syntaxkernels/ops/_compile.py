"""Compile ``@triton.jit`` kernels for real GPUs without one, and read their register use and tensor-core code.

Used by the compile tests (python_tests/test_compile_*.py) of every fused op. The interpreter
(``TRITON_INTERPRET=1``) accepts code that does not compile, so each kernel, with each configuration it
may be launched with, is also built here for ``GPUTarget("cuda", 80, 32)`` and ``("cuda", 90, 32)``:

1. :func:`kernel_spec` describes one launch variant (argument types, constexpr values, warps, stages).
   Pointer arguments are marked 16-byte aligned and innermost strides specialised to 1, like a launch on
   contiguous tensors.
2. :func:`compile_spec` builds PTX with ``triton.compile(ASTSource(...))``, runs the ``ptxas`` shipped in
   Triton's package with ``-v`` on it, and parses registers and spill bytes; it looks for ``mma.sync``
   (sm_80) or ``wgmma`` (sm_90) in the PTX.

Must run in a process where ``TRITON_INTERPRET`` is unset (the interpreter replaces ``@triton.jit``).
:func:`compile_many` runs specs in a small process pool.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

__all__ = ["KernelSpec", "CompileResult", "kernel_spec", "compile_spec", "compile_many", "ptxas_path",
           "format_results"]

ARCHS = (80, 90)


@dataclass
class KernelSpec:
    """One kernel variant to compile.

    Attributes:
        label: readable id (kernel, dtype, head dim, config).
        module, name: where the ``@triton.jit`` function lives (imported in the worker process).
        signature: argument name -> Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``, ``"constexpr"``).
        constexprs: argument name -> value for every constexpr (and specialised) argument.
        pointer_args: names of arguments to mark divisible by 16 (pointers: 16-byte aligned).
        num_warps, num_stages: launch options.
        needs_mma: the kernel must use tensor cores (mma.sync on sm_80, wgmma or mma.sync on sm_90).
    """

    label: str
    module: str
    name: str
    signature: Dict[str, str]
    constexprs: Dict[str, object]
    pointer_args: List[str]
    num_warps: int = 4
    num_stages: int = 2
    needs_mma: bool = True


@dataclass
class CompileResult:
    label: str
    arch: int
    registers: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    shared_bytes: int = -1
    mma: bool = False
    wgmma: bool = False
    needs_mma: bool = True
    seconds: float = 0.0
    error: Optional[str] = None
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def kernel_spec(fn, label: str, pointer_types: Dict[str, str], constexprs: Dict[str, object],
                float_args: Iterable[str] = (), divisible_args: Iterable[str] = (), num_warps: int = 4,
                num_stages: int = 2, needs_mma: bool = True) -> KernelSpec:
    """Build a :class:`KernelSpec` for a ``@triton.jit`` function.

    Args:
        fn: the JITFunction (its module and name are recorded; the worker re-imports it).
        pointer_types: pointer argument name -> element type (``"fp16"``, ``"u8"``, ``"i32"``, ...).
        constexprs: values of the constexpr arguments, plus any integer argument specialised to a value
            (e.g. an innermost stride of 1); names the kernel does not take are ignored.
        float_args: fp32 scalar arguments; every other argument is ``i32``.
        divisible_args: integer arguments known to be multiples of 16 (strides of contiguous tensors whose
            inner sizes are multiples of 16), marked like the JIT marks them at launch; without the mark the
            compiler cannot vectorise loads along those rows.
    """
    float_args = set(float_args)
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    signature: Dict[str, str] = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointer_types:
            signature[name] = "*" + pointer_types[name]
        elif name in float_args:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    missing = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs]
    if missing:
        raise ValueError(f"{label}: no value for constexpr arguments {missing}")
    inner = getattr(fn, "fn", fn)
    aligned = [n for n in pointer_types if n not in constexprs]
    aligned += [n for n in divisible_args if n in fn.arg_names and n not in constexprs and n not in aligned]
    return KernelSpec(label, inner.__module__, inner.__name__, signature, dict(constexprs), aligned, num_warps,
                      num_stages, needs_mma)


def ptxas_path() -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(path):
        raise FileNotFoundError(f"ptxas not found at {path}")
    return path


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def compile_spec(spec: KernelSpec, arch: int) -> CompileResult:
    """Compile one spec for ``sm_<arch>`` and check it (see the module docstring)."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("compile_spec needs TRITON_INTERPRET unset (run it in a subprocess)")
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    result = CompileResult(spec.label, arch, needs_mma=spec.needs_mma)
    start = time.perf_counter()
    try:
        fn = getattr(importlib.import_module(spec.module), spec.name)
        names = list(fn.arg_names)
        attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in spec.pointer_args}
        src = ASTSource(fn, spec.signature, constexprs=spec.constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages))
        ptx = compiled.asm["ptx"]
        gpu_name = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        with tempfile.TemporaryDirectory() as tmp:
            ptx_file = os.path.join(tmp, "kernel.ptx")
            with open(ptx_file, "w") as f:
                f.write(ptx)
            proc = subprocess.run([ptxas_path(), "-v", f"--gpu-name={gpu_name}", ptx_file, "-o",
                                   os.path.join(tmp, "kernel.cubin")], capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed: {log[-2000:]}")
        regs = _REGS.search(log)
        spills = _SPILL.search(log)
        smem = _SMEM.search(log)
        result.registers = int(regs.group(1)) if regs else -1
        if spills:
            result.spill_stores, result.spill_loads = int(spills.group(1)), int(spills.group(2))
        else:
            result.spill_stores = result.spill_loads = 0
        result.shared_bytes = int(compiled.metadata.shared) if hasattr(compiled.metadata, "shared") else (
            int(smem.group(1)) if smem else -1)
        result.mma = "mma.sync" in ptx
        result.wgmma = "wgmma.mma_async" in ptx
    except Exception as exc:  # noqa: BLE001 - reported as a problem of this spec
        result.error = f"{type(exc).__name__}: {exc}"[:2000]
    result.seconds = time.perf_counter() - start
    if result.error:
        result.problems.append(f"compile error: {result.error}")
    else:
        if result.spill_stores > 0 or result.spill_loads > 0:
            result.problems.append(f"register spills ({result.spill_stores} B stores, {result.spill_loads} B loads)")
        if spec.needs_mma and not (result.mma or result.wgmma):
            result.problems.append("no tensor-core instruction (mma.sync / wgmma) in the PTX")
    return result


def _worker(args):
    spec, arch = args
    return compile_spec(spec, arch)


def compile_many(specs: Sequence[KernelSpec], archs: Sequence[int] = ARCHS, processes: int = 2) -> List[CompileResult]:
    """Compile every spec for every arch (a process pool of ``processes`` workers); results in order."""
    jobs = [(s, a) for s in specs for a in archs]
    if processes <= 1:
        return [_worker(j) for j in jobs]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(processes) as pool:
        return pool.map(_worker, jobs, chunksize=1)


def format_results(results: Sequence[CompileResult]) -> str:
    """A plain-text table: label, arch, registers, spills, tensor-core instructions, time, problems."""
    lines = [f"{'kernel':<64} {'sm':>3} {'regs':>4} {'spill':>9} {'smem':>6} {'tc':>6} {'s':>5}  problems"]
    for r in results:
        tc = "wgmma" if r.wgmma else ("mma" if r.mma else "-")
        lines.append(f"{r.label:<64} {r.arch:>3} {r.registers:>4} {r.spill_stores:>4}/{r.spill_loads:<4} "
                     f"{r.shared_bytes:>6} {tc:>6} {r.seconds:>5.1f}  {'; '.join(r.problems)}")
    return "\n".join(lines)
