"""Helpers for checking a fused op against the reference (used by the tests and ``python -m syntaxkernels verify``).

The rule (one tolerance table, here): the kernel's error against a float64 reference may be at most
``factor`` (2) times the error of the same computation done by the reference in the kernel's dtype, plus a
small absolute floor per dtype for outputs that the low-precision reference happens to get exactly.
"""
from __future__ import annotations

from typing import Dict

import torch

__all__ = ["ABS_FLOOR", "error_bound", "assert_close_to_reference", "compare_to_reference"]

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
