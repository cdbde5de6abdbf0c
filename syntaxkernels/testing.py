"""Helpers for checking a fused op against the reference (used by the tests and ``python -m syntaxkernels verify``).

The rule (one tolerance table, here): the kernel's error against a float64 reference may be at most
``factor`` (2) times the error of the same computation done by the reference in the kernel's dtype, plus a
small absolute floor per dtype for outputs that the low-precision reference happens to get exactly.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Dict, Iterator, List

import torch

__all__ = ["ABS_FLOOR", "error_bound", "assert_close_to_reference", "compare_to_reference", "count_host_reads",
           "HOST_READS"]

ABS_FLOOR: Dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def error_bound(ref_lowp: torch.Tensor, ref_fp64: torch.Tensor, dtype: torch.dtype, factor: float = 2.0) -> float:
    """``factor * max|ref_lowp - ref_fp64| + ABS_FLOOR[dtype]`` (scaled by the reference's magnitude)."""
    base = (ref_lowp.detach().double() - ref_fp64.detach().double()).abs().max().item() if ref_fp64.numel() else 0.0
    magnitude = max(1.0, ref_fp64.detach().abs().max().item()) if ref_fp64.numel() else 1.0
    return factor * base + ABS_FLOOR[dtype] * magnitude


def compare_to_reference(actual: torch.Tensor, ref_fp64: torch.Tensor, ref_lowp: torch.Tensor,
                         factor: float = 2.0):
    """``(ok, error, bound)`` for one tensor."""
    if actual.shape != ref_fp64.shape:
        return False, float("inf"), 0.0
    if not torch.isfinite(actual.detach()).all():
        return False, float("nan"), 0.0
    err = (actual.detach().double() - ref_fp64.detach().double()).abs().max().item() if actual.numel() else 0.0
    bound = error_bound(ref_lowp, ref_fp64, actual.dtype, factor)
    return err <= bound, err, bound


def assert_close_to_reference(actual: torch.Tensor, ref_fp64: torch.Tensor, ref_lowp: torch.Tensor, name: str = "",
                              factor: float = 2.0) -> None:
    """Raise ``AssertionError`` naming ``name`` when ``actual`` is further from the fp64 reference than allowed."""
    ok, err, bound = compare_to_reference(actual, ref_fp64, ref_lowp, factor)
    if not ok:
        raise AssertionError(f"{name}: max abs error {err:.3e} > bound {bound:.3e} (dtype {actual.dtype}, shape "
                             f"{tuple(actual.shape)})")


#: Tensor methods that read a value back to the host (a device synchronisation on a GPU tensor).
HOST_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "numpy", "cpu")


@contextlib.contextmanager
def count_host_reads() -> Iterator[List[str]]:
    """Record every host read (:data:`HOST_READS`) that the package's own code makes inside the block.

    Yields a list that fills with ``"method at file:line"`` entries; reads made by other code (tests, Triton's
    interpreter, PyTorch) are not recorded. On a GPU each recorded read would stall the stream and break
    CUDA-graph capture, so a valid call of a fused op should record none.
    """
    package = os.path.dirname(os.path.abspath(__file__))
    here = os.path.abspath(__file__)
    reads: List[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name, original):
        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            filename = os.path.abspath(frame.f_code.co_filename)
            if filename.startswith(package) and filename != here:
                reads.append(f"{name} at {os.path.relpath(filename, package)}:{frame.f_lineno}")
            return original(self, *args, **kwargs)
        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
