"""The public ops when Triton cannot be imported: same signatures, the reference computes everything.

``backend="auto"`` and ``"reference"`` work; ``backend="triton"`` raises with the import error.
"""
from __future__ import annotations

from .. import _validation as V
from .. import reference
from ._dispatch import resolve_backend


def syntax_bias_attention(q, k, v, distance, table, *, buckets, scale=None, bias_scale=None, lengths=None,
                          window=None, causal=False, deterministic=False, backend="auto", symmetric=None):
    """See :func:`syntaxkernels.reference.syntax_bias_attention` (``symmetric`` only matters to the kernels)."""
    V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic)
    resolve_backend(backend, q.device)
    return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                           bias_scale=bias_scale, lengths=lengths, window=window, causal=causal)


def syntax_subnetwork_attention(q, k, v, trees, masks, *, scale=None, backend="auto"):
    """See :func:`syntaxkernels.reference.syntax_subnetwork_attention`."""
    V.check_subnetwork_inputs(q, k, v, trees, masks)
    resolve_backend(backend, q.device)
    return reference.syntax_subnetwork_attention(q, k, v, trees, masks, scale=scale)
