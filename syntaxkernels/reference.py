"""Pure-PyTorch reference of every op: the specification the fused kernels are tested against.

Readable before fast: these functions materialise ``[B, H, N, N]`` scores and ``[B, M, N, N]`` masks.
They are autograd-correct (fp64 ``gradcheck`` passes), run on any device, and take the same arguments as
the public ops (``backend`` and ``deterministic`` are accepted and ignored).

Numerics: matrix products run in the input dtype, scores, bias and softmax in float32 (float64 for
float64 inputs), like an ordinary PyTorch implementation.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from . import _validation as V
from .specs import BucketSpec, MaskSpec

__all__ = [
    "syntax_bias_attention",
    "gather_bias",
    "allowed_pairs",
    "masked_attention",
    "syntax_masks",
    "syntax_subnetwork_attention",
]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_attention(scores: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the allowed keys only; a row with no allowed key outputs zeros.

    Args:
        scores: float ``[B, H, N, N]`` (already scaled and biased).
        allowed: bool broadcastable to scores.
        v: ``[B, H, N, Dv]``.
    Returns:
        ``[B, H, N, Dv]`` in v's dtype. Gradients of empty rows are exactly zero, never NaN.
    """
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    weights = weights / denom.masked_fill(denom == 0, 1.0)
    return weights.to(v.dtype) @ v


def allowed_pairs(distance: torch.Tensor, lengths: Optional[torch.Tensor] = None, window: Optional[int] = None,
                  causal: bool = False) -> torch.Tensor:
    """bool ``[B, N, N]``: query i may attend key j.

    Both tokens valid (``< lengths``), ``distance <= window`` when a window is given (unreachable never),
    and ``j <= i`` when causal.
    """
    B, N, _ = distance.shape
    allowed = torch.ones(B, N, N, dtype=torch.bool, device=distance.device)
    if lengths is not None:
        valid = torch.arange(N, device=distance.device)[None, :] < lengths[:, None]
        allowed = allowed & valid[:, :, None] & valid[:, None, :]
    if window is not None:
        allowed = allowed & (distance.to(torch.int32) <= window)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool, device=distance.device).tril()[None]
    return allowed


def gather_bias(distance: torch.Tensor, table: torch.Tensor, buckets: BucketSpec, bias_scale=None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The bias ``c * table[bucket(d_ij)]`` as ``[B, 1, N, N]`` (shared table) or ``[B, H, N, N]`` (per head)."""
    bucket = buckets.lut(distance.device)[distance.long()]
    table = table.to(dtype)
    if table.dim() == 1:
        bias = table[bucket][:, None]
    else:
        bias = table[:, bucket].permute(1, 0, 2, 3)
    if bias_scale is not None:
        bias = bias * (bias_scale.to(dtype) if isinstance(bias_scale, torch.Tensor) else bias_scale)
    return bias


def syntax_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                          table: torch.Tensor, *, buckets: BucketSpec, scale: Optional[float] = None,
                          bias_scale=None, lengths=None, window: Optional[int] = None, causal: bool = False,
                          deterministic: bool = False, backend: str = "reference") -> torch.Tensor:
    """Attention with a learnable tree-distance bias.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)]``, softmax over allowed keys, ``o_i = sum_j p_ij v_j``.

    Args:
        q, k, v: ``[B, H, N, D]`` (v may have its own last dim).
        distance: ``uint8 [B, N, N]`` from :func:`syntaxkernels.tree_distance`.
        table: ``[T]`` shared by all heads or ``[H, T]`` per head, ``T = buckets.num_buckets``.
        buckets: the :class:`BucketSpec` mapping distances to table entries.
        scale: score scale, default ``1/sqrt(D)``.
        bias_scale: the strength c (float or one-element tensor), default 1.
        lengths: ``int [B]`` or boolean key-padding mask ``[B, N]``: keys at j >= length get no weight and
            query rows at i >= length output 0.
        window: allow only pairs with ``d_ij <= window``.
        causal: allow only ``j <= i``.
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; rows with no allowed key are 0.
    """
    if not V.compiling():
        V.check_qkv(q, k, v)
        V.check_distance(distance, q)
        V.check_table(table, buckets, q)
        V.check_bias_scale(bias_scale, q)
        V.check_window(window)
    lengths = V.normalize_lengths(lengths, q)
    acc = _acc_dtype(q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)).to(acc) * scale
    scores = scores + gather_bias(distance, table, buckets, bias_scale, acc)
    allowed = allowed_pairs(distance, lengths, window, causal)[:, None]
    return masked_attention(scores, allowed, v)


def syntax_masks(trees, masks: MaskSpec) -> torch.Tensor:
    """bool ``[B, M, N, N]``: ``[b, m, i, j]`` is True when key j is in query i's mask m (DESIGN.md §2).

    Derived from ``trees.distance``, ``trees.depth`` and ``trees.segment``: i is an ancestor of j iff they
    are in the same tree and ``depth[j] - depth[i] == d(i, j)``.
    """
    V.check_masks(masks)
    dist = trees.distance.to(torch.int32)
    depth = trees.depth.to(torch.int32)
    segment = trees.segment.to(torch.int32)
    valid = segment >= 0
    pair_valid = valid[:, :, None] & valid[:, None, :]
    same_tree = pair_valid & (segment[:, :, None] == segment[:, None, :])
    depth_gap = depth[:, None, :] - depth[:, :, None]  # depth[j] - depth[i]
    ancestor = same_tree & (depth_gap == dist)  # i is an ancestor of j (or i == j)
    descendant = same_tree & (-depth_gap == dist)  # i is a descendant of j (or i == j)
    out = []
    for kind, d in masks.kinds():
        if kind == "parent":
            out.append(ancestor & (dist == d))
        elif kind == "child":
            out.append(descendant & (dist == d))
        elif kind == "sibling":
            out.append(same_tree & ~ancestor & ~descendant & (dist == d))
        elif kind == "pairwise":
            out.append(pair_valid & ~same_tree)
        else:
            out.append(pair_valid)
    return torch.stack(out, dim=1)


def syntax_subnetwork_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, masks: MaskSpec, *,
                                scale: Optional[float] = None,
                                backend: str = "reference") -> Tuple[torch.Tensor, torch.Tensor]:
    """Syntax-BERT sub-networks: M masked attentions sharing q, k, v.

    Args:
        q, k, v: ``[B, H, N, D]``.
        trees: a :class:`syntaxkernels.TreeBatch` on q's device (distance, depth, segment).
        masks: the :class:`MaskSpec`; M = ``masks.num_masks``.
        scale: default ``1/sqrt(D)``.
    Returns:
        ``out [B, M, H, N, D]`` (zero where a token's mask is empty) and ``nonempty bool [B, M, N]``.
    """
    if not V.compiling():
        V.check_qkv(q, k, v)
        V.check_trees(trees, q)
        V.check_masks(masks)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    allowed = syntax_masks(trees, masks)
    scores = (q @ k.transpose(-1, -2)).to(_acc_dtype(q.dtype)) * scale
    out = torch.stack([masked_attention(scores, allowed[:, m, None], v) for m in range(masks.num_masks)], dim=1)
    return out, allowed.any(dim=-1)
