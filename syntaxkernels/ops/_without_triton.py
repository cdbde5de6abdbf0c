"""The public ops when Triton cannot be imported: same signatures, the reference computes everything.

``backend="auto"`` and ``"reference"`` work; ``backend="triton"`` raises with the import error. Packed batches
work too: ``syntax_bias_attention(..., cu_seqlens=...)`` and ``syntax_subnetwork_attention`` with a
:class:`~syntaxkernels.trees.PackedTreeBatch` run the reference sequence by sequence; ``syntax_window_attention``
with one runs on its edge lists (the C++ kernels on CPU, as without packing) or the reference
(:mod:`._varlen_reference`, which needs no Triton).
"""
from __future__ import annotations

import math

from .. import _validation as V
from .. import reference
from ._dispatch import resolve_backend
from ._varlen_reference import (_check_packed_qkv, _check_varlen, _reference_subnetwork_packed,
                                packed_window_attention, reference_bias_attention_varlen)
from .edge_attention import syntax_window_attention as _window_attention


def _packed(trees) -> bool:
    from ..trees.packed import PackedTreeBatch

    return isinstance(trees, PackedTreeBatch)


def syntax_bias_attention(q, k, v, distance, table, *, buckets, scale=None, bias_scale=None, lengths=None,
                          window=None, causal=False, deterministic=False, backend="auto", symmetric=None,
                          cu_seqlens=None, max_seqlen=None):
    """See :func:`syntaxkernels.reference.syntax_bias_attention` (``symmetric`` only matters to the kernels); with
    ``cu_seqlens``, :func:`._varlen_reference.reference_bias_attention_varlen` (``max_seqlen`` is not needed)."""
    if cu_seqlens is not None:
        if lengths is not None:
            raise ValueError("lengths does not apply to a packed batch (cu_seqlens gives the sequences)")
        _check_varlen(q, k, v, distance, table, buckets, cu_seqlens, window, causal)
        resolve_backend(backend, q.device)
        return reference_bias_attention_varlen(q, k, v, distance, table, buckets=buckets, cu_seqlens=cu_seqlens,
                                               scale=scale, bias_scale=bias_scale, window=window, causal=causal)
    V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic)
    resolve_backend(backend, q.device)
    return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                           bias_scale=bias_scale, lengths=lengths, window=window, causal=causal)


def syntax_subnetwork_attention(q, k, v, trees, masks, *, scale=None, backend="auto"):
    """See :func:`syntaxkernels.reference.syntax_subnetwork_attention`; a packed batch sequence by sequence."""
    if _packed(trees):
        _check_packed_qkv(q, k, v, trees)
        V.check_masks(masks)
        resolve_backend(backend, q.device)
        return _reference_subnetwork_packed(q, k, v, trees, masks, 1.0 / math.sqrt(q.shape[-1]) if scale is None
                                            else scale)
    V.check_subnetwork_inputs(q, k, v, trees, masks)
    resolve_backend(backend, q.device)
    return reference.syntax_subnetwork_attention(q, k, v, trees, masks, scale=scale)


def syntax_window_attention(q, k, v, trees, *, window, lengths=None, scale=None, backend="auto"):
    """See :func:`syntaxkernels.ops.edge_attention.syntax_window_attention` (which needs no Triton); a packed batch
    through :func:`._varlen_reference.packed_window_attention`."""
    if _packed(trees):  # as with Triton: the packed batch's cu_seqlens give the sequences
        return packed_window_attention(q, k, v, trees, window=window, scale=scale, backend=backend)
    return _window_attention(q, k, v, trees, window=window, lengths=lengths, scale=scale, backend=backend)
