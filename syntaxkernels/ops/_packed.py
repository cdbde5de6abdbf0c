"""Packed (varlen) batches through the ops: what their packed paths share (no Triton): the argument check of
q, k, v against a :class:`~syntaxkernels.trees.PackedTreeBatch` and its sequences one by one (the reference
paths)."""
from __future__ import annotations

import torch


def is_packed(trees) -> bool:
    """Whether ``trees`` is a :class:`~syntaxkernels.trees.PackedTreeBatch` (q, k, v then ``[T, H, D]``)."""
    from ..trees.packed import PackedTreeBatch

    return isinstance(trees, PackedTreeBatch)


def sequences(trees):
    """Host-side ``[(start, n, distance block [1, n, n])]`` of a packed batch (the reference paths only)."""
    cu = trees.cu_seqlens.to("cpu", torch.int64).tolist()
    offsets = trees.distance_offsets.to("cpu").tolist()
    out = []
    for s in range(len(cu) - 1):
        a, n = cu[s], cu[s + 1] - cu[s]
        out.append((a, n, trees.distance[offsets[s]:offsets[s] + n * n].view(1, n, n)))
    return out


def per_sequence(x, a, n):
    return x[a:a + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]


def check_packed_qkv(q, k, v, trees) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"with packed trees, {name} must be [T, H, D] (flash-attention's varlen layout), got "
                             f"{tuple(t.shape)}")
    if q.shape[0] != trees.num_tokens or k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"packed q, k, v must be [T, H, *] with T = {trees.num_tokens} (the trees' tokens), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
