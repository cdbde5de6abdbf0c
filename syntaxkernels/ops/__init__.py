"""Fused ops: one file per op (Triton kernels -> launcher -> autograd.Function -> public function).

Importing never fails because Triton is missing: a single warning says so and the public ops run the
reference (``backend="triton"`` then raises with the reason).
"""
import warnings

from ._dispatch import triton_status

if triton_status() == "ok":
    from .bias_attention import syntax_bias_attention
    from .subnetwork_attention import syntax_subnetwork_attention
    from .edge_attention import edge_list_attention, syntax_window_attention
else:
    warnings.warn(f"syntaxkernels: {triton_status()}; the fused ops fall back to the PyTorch reference. "
                  "Install triton (it ships with CUDA builds of torch) for the fused kernels.",
                  RuntimeWarning, stacklevel=2)
    from ._without_triton import syntax_bias_attention, syntax_subnetwork_attention, syntax_window_attention
    from .edge_attention import edge_list_attention  # the C++ path needs no Triton

__all__ = ["syntax_bias_attention", "syntax_subnetwork_attention", "edge_list_attention", "syntax_window_attention"]
