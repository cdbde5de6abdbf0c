"""Fused Syntax-BERT sub-network attention (placeholder until the Triton kernel lands: dispatches to the reference)."""
from __future__ import annotations

from .. import reference
from ._dispatch import resolve_backend


def syntax_subnetwork_attention(q, k, v, trees, masks, *, scale=None, backend="auto"):
    """See :func:`syntaxkernels.reference.syntax_subnetwork_attention` for the semantics."""
    if resolve_backend(backend, q.device) == "triton":
        raise NotImplementedError("the Triton sub-network kernel has not landed yet")
    return reference.syntax_subnetwork_attention(q, k, v, trees, masks, scale=scale)
