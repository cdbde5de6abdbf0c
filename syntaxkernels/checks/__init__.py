"""Self-checks and quick benchmarks behind ``python -m syntaxkernels verify`` and ``bench``.

Each module listed in ``MODULES`` defines

- ``CHECKS``: a list of ``Check(name, fn)``; ``fn(device) -> (ok: bool, detail: str)`` compares one op
  (or one builder) against its reference on ``device``; raising ``Skip("why")`` marks it not applicable;
- optionally ``BENCHES``: a list of ``Bench(name, fn)``; ``fn(device, quick: bool) -> list[dict]`` rows.

A module that fails to import is reported as a failed check, not hidden.
"""
from __future__ import annotations

import importlib
import time
import traceback
from dataclasses import dataclass
from typing import Callable, List

MODULES = [
    "syntaxkernels.checks.trees",
    "syntaxkernels.checks.reference",
    "syntaxkernels.checks.bias_attention",
    "syntaxkernels.checks.subnetwork_attention",
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


def _modules():
    for name in MODULES:
        try:
            yield name, importlib.import_module(name), None
        except ModuleNotFoundError as exc:
            if exc.name == name:  # not written yet
                continue
            if exc.name and exc.name.split(".")[0] == "triton":
                yield name, None, Skip(f"{name}: triton is not installed")
                continue
            yield name, None, exc
        except Exception as exc:  # noqa: BLE001 - reported as a failure
            yield name, None, exc


def run_checks(device: str, select: str = "") -> List[dict]:
    """Run every check (whose name contains ``select``) and return result rows."""
    rows = []
    for module_name, module, error in _modules():
        if isinstance(error, Skip):
            rows.append(dict(check=module_name, status="skip", seconds=0.0, detail=str(error)))
            continue
        if error is not None:
            rows.append(dict(check=module_name, status="FAIL", seconds=0.0, detail=f"import failed: {error!r}"))
            continue
        for check in getattr(module, "CHECKS", []):
            if select and select not in check.name:
                continue
            start = time.perf_counter()
            try:
                ok, detail = check.fn(device)
                status = "pass" if ok else "FAIL"
            except Skip as why:
                status, detail = "skip", str(why)
            except Exception as exc:  # noqa: BLE001
                status, detail = "FAIL", f"{exc!r}\n{traceback.format_exc(limit=3)}"
            rows.append(dict(check=check.name, status=status, seconds=time.perf_counter() - start, detail=detail))
    return rows


def run_benches(device: str, quick: bool, select: str = "") -> List[dict]:
    rows = []
    for module_name, module, error in _modules():
        if module is None:
            continue
        for bench in getattr(module, "BENCHES", []):
            if select and select not in bench.name:
                continue
            try:
                for row in bench.fn(device, quick):
                    rows.append(dict(bench=bench.name, **row))
            except Skip as why:
                rows.append(dict(bench=bench.name, skipped=str(why)))
    return rows
