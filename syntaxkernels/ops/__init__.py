"""Fused ops: a folder per big op (``bias_attention/``, ``edge_attention/``: kernels, configs, launchers,
autograd, the C++ path and the public functions), a file per small one (``subnetwork_attention.py``), on a shared
kernel layer (``_primitives.py``, ``block_meta.py``) and ``_dispatch.py`` (the choice of backend, without Triton).

Importing never fails because Triton is missing: every op imports its Triton kernels and launchers only when
Triton imports (:func:`._dispatch.triton_status`), a single warning says so, and each op runs what it would run
without them anyway: the C++ kernels on CPU tensors, the reference elsewhere (``backend="triton"`` raises with the
reason). :data:`IMPLEMENTATION` says, per public op, what a call runs.
"""
import warnings

from ._dispatch import triton_status

if triton_status() != "ok":
    warnings.warn(f"syntaxkernels: {triton_status()}; the Triton kernels are unavailable: CPU tensors run the C++ "
                  "kernels (or the PyTorch reference), CUDA tensors the reference. Install triton (it ships with CUDA "
                  "builds of torch) for the fused GPU kernels.", RuntimeWarning, stacklevel=2)

from . import bias_attention, edge_attention, subnetwork_attention  # noqa: E402
from .bias_attention import syntax_bias_attention  # noqa: E402
from .edge_attention import edge_list_attention, syntax_window_attention  # noqa: E402
from .subnetwork_attention import syntax_subnetwork_attention  # noqa: E402

__all__ = ["syntax_bias_attention", "syntax_subnetwork_attention", "edge_list_attention", "syntax_window_attention"]

#: Per public op, ``implementation(q, v, backend="auto") -> "triton" | "cpp" | "reference"``: what a call with
#: these q and v runs (the function the op itself decides with; ``backend="triton"`` raises where it would).
IMPLEMENTATION = {
    "syntax_bias_attention": bias_attention.implementation,
    "syntax_subnetwork_attention": subnetwork_attention.implementation,
    "edge_list_attention": edge_attention.implementation,
    "syntax_window_attention": edge_attention.implementation,
}
