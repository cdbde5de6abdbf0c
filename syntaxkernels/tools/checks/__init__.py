"""Self-checks and quick benchmarks behind ``python -m syntaxkernels verify`` and ``bench``.

Each module listed in ``MODULES`` defines

- ``CHECKS``: a list of ``Check(name, fn)``; ``fn(device) -> (ok: bool, detail: str)`` compares one op
  (or one builder) against its reference on ``device``; raising ``Skip("why")`` marks it not applicable;
- optionally ``BENCHES``: a list of ``Bench(name, fn)``; ``fn(device, quick: bool) -> list[dict]`` rows.

A module that fails to import is reported as a failed check, not hidden. A bench that needs an optional
dependency which is not installed gives one row saying so instead of stopping the others.

:func:`shuffled_program_order` runs Triton kernels under the interpreter with their programs in a random order
(as a GPU scheduler may run them), so checks of run-to-run determinism can fail on a CPU too.
"""
from __future__ import annotations

import contextlib
import importlib
import random
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

MODULES = [
    "syntaxkernels.tools.checks.trees",
    "syntaxkernels.tools.checks.reference",
    "syntaxkernels.tools.checks.bias_attention",
    "syntaxkernels.tools.checks.bias_attention_cpu",
    "syntaxkernels.tools.checks.subnetwork_attention",
]


class Skip(Exception):
    """Raised by a check that does not apply on this device or install."""


@dataclass
class Check:
    name: str
    fn: Callable


@dataclass
class Bench:
    name: str
    fn: Callable


#: ``progress(index, total, name, row)``: called before each check with ``row=None`` and after it with its row.
Progress = Callable[[int, int, str, Optional[dict]], None]


def _modules():
    """``(name, module or None, error or None)`` for every module of ``MODULES``.

    A module that does not import gives its exception (reported as a failed check), a listed module that does
    not exist included; only a missing ``triton`` gives a ``Skip``.
    """
    for name in MODULES:
        try:
            yield name, importlib.import_module(name), None
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] == "triton":
                yield name, None, Skip(f"{name}: triton is not installed")
                continue
            yield name, None, exc
        except Exception as exc:  # noqa: BLE001 - reported as a failure
            yield name, None, exc


def _matches(name: str, select: str) -> bool:
    return not select or select.lower() in name.lower()


def check_names() -> List[str]:
    """Names of every check of the importable modules (what ``--select`` matches against)."""
    return [c.name for _, module, _ in _modules() if module is not None for c in getattr(module, "CHECKS", [])]


def bench_names() -> List[str]:
    return [b.name for _, module, _ in _modules() if module is not None for b in getattr(module, "BENCHES", [])]


def run_checks(device: str, select: str = "", progress: Optional[Progress] = None) -> List[dict]:
    """Run every check whose name contains ``select`` (case-insensitive) and return one row per check.

    Rows: ``check``, ``status`` ("pass", "FAIL" or "skip"), ``seconds``, ``detail``. A module that fails to
    import gives a "FAIL" row whatever ``select`` is (it may hold the selected checks).
    """
    planned = []  # (name, fn or None, row for a module that did not import)
    for module_name, module, error in _modules():
        if isinstance(error, Skip):
            if _matches(module_name, select):
                planned.append((module_name, None, dict(check=module_name, status="skip", seconds=0.0,
                                                        detail=str(error))))
            continue
        if error is not None:
            planned.append((module_name, None, dict(check=module_name, status="FAIL", seconds=0.0,
                                                    detail=f"import failed: {error!r}")))
            continue
        for check in getattr(module, "CHECKS", []):
            if _matches(check.name, select):
                planned.append((check.name, check.fn, None))
    rows = []
    for index, (name, fn, row) in enumerate(planned):
        if progress is not None:
            progress(index, len(planned), name, None)
        if row is None:
            start = time.perf_counter()
            try:
                ok, detail = fn(device)
                status = "pass" if ok else "FAIL"
            except Skip as why:
                status, detail = "skip", str(why)
            except Exception as exc:  # noqa: BLE001
                status, detail = "FAIL", f"{exc!r}\n{traceback.format_exc(limit=3)}"
            row = dict(check=name, status=status, seconds=time.perf_counter() - start, detail=detail)
        rows.append(row)
        if progress is not None:
            progress(index, len(planned), name, row)
    return rows


def _missing_module(exc: BaseException) -> Optional[str]:
    """The top-level name of the module whose absence raised ``exc`` (a ModuleNotFoundError), else None."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return exc.name.split(".")[0]
    return None


def run_benches(device: str, quick: bool, select: str = "") -> List[dict]:
    """Rows of every bench whose name contains ``select``, each with its ``bench`` name.

    A bench that raises ``Skip`` gives one row with ``skipped`` (the reason); one that needs an optional module
    that is not installed gives ``skipped="<module> is not installed"``; any other exception gives one row with
    ``error`` (the caller reports it and exits non-zero) and the other benches still run.
    """
    rows = []
    for module_name, module, error in _modules():
        if module is None:
            continue
        for bench in getattr(module, "BENCHES", []):
            if not _matches(bench.name, select):
                continue
            try:
                for row in bench.fn(device, quick):
                    rows.append(dict(bench=bench.name, **row))
            except Skip as why:
                rows.append(dict(bench=bench.name, skipped=str(why)))
            except Exception as exc:  # noqa: BLE001 - one bench must not stop the others
                missing = _missing_module(exc)
                if missing is not None:
                    rows.append(dict(bench=bench.name, skipped=f"{missing} is not installed (optional: pip install "
                                                                f"{missing}, or the [bench] extra)"))
                else:
                    rows.append(dict(bench=bench.name, error=f"{exc!r}"))
    return rows


# ------------------------------------------------------------------------------- program order (interpreter)


@contextlib.contextmanager
def shuffled_program_order(seed: int) -> Iterator[None]:
    """Run every Triton launch's programs in a random order (a permutation of the grid) under the interpreter.

    ``TRITON_INTERPRET=1`` runs a grid's programs one after another in index order, so an order-dependent
    result (floating-point atomics, a program reading what another wrote) is still the same on every run and a
    run-to-run comparison cannot fail. Inside this context each launch runs every program exactly once, in an
    order drawn from ``seed``; a reduction whose result depends on the order then gives different bits for
    different seeds, as it would on a GPU. Raises ``Skip`` when the interpreter is not in use or its grid loop
    is not the one this was written for (Triton 3.x); every launch checks that its programs were visited in
    index order before they were remapped.
    """
    from syntaxkernels._interpreter import interpreting

    if not interpreting():
        raise Skip("shuffling the program order needs TRITON_INTERPRET=1")
    try:
        from triton.runtime import interpreter
    except ImportError as exc:
        raise Skip(f"triton's interpreter is not importable: {exc!r}")
    builder = getattr(interpreter, "interpreter_builder", None)
    if builder is None or not all(hasattr(builder, a) for a in ("set_grid_dim", "set_grid_idx")):
        raise Skip("this Triton's interpreter has no set_grid_dim/set_grid_idx to reorder programs")
    rng = random.Random(seed)
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    state = {"dims": (1, 1, 1), "order": [0], "next": 0}

    def shuffled_dim(nx, ny, nz):
        set_dim(nx, ny, nz)
        order = list(range(nx * ny * nz))
        rng.shuffle(order)
        state.update(dims=(nx, ny, nz), order=order, next=0)

    def shuffled_idx(x, y, z):
        _, ny, nz = state["dims"]
        k = state["next"]
        if k >= len(state["order"]) or (x * ny + y) * nz + z != k:
            raise RuntimeError("shuffled_program_order: the interpreter did not visit the grid in index order")
        state["next"] = k + 1
        flat = state["order"][k]
        set_idx(flat // (ny * nz), (flat // nz) % ny, flat % nz)

    own = {name: vars(builder)[name] for name in ("set_grid_dim", "set_grid_idx") if name in vars(builder)}
    builder.set_grid_dim, builder.set_grid_idx = shuffled_dim, shuffled_idx
    try:
        yield
    finally:
        for name in ("set_grid_dim", "set_grid_idx"):
            if name in own:
                setattr(builder, name, own[name])
            else:
                delattr(builder, name)  # back to the class's method
