"""Fused distance-bias attention (placeholder until the Triton kernel lands: dispatches to the reference)."""
from __future__ import annotations

from .. import reference
from ._dispatch import resolve_backend


def syntax_bias_attention(q, k, v, distance, table, *, buckets, scale=None, bias_scale=None, lengths=None,
                          window=None, causal=False, deterministic=False, backend="auto"):
    """See :func:`syntaxkernels.reference.syntax_bias_attention` for the semantics."""
    if resolve_backend(backend, q.device) == "triton":
        raise NotImplementedError("the Triton bias-attention kernel has not landed yet")
    return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                           bias_scale=bias_scale, lengths=lengths, window=window, causal=causal)
