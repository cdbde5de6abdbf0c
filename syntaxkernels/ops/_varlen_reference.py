"""The packed (varlen) ops' parts that need no Triton: argument checks, the references sequence by sequence, and
the packed window attention (edge lists through the C++ or Triton edge kernels, or the reference).

:mod:`.bias_attention_varlen` (which imports triton) re-exports all of it; :mod:`._without_triton` uses it when
Triton cannot be imported, so that packed calls work there too.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _validation as V
from .. import reference
from ..specs import BucketSpec


def _check_varlen(q, k, v, distance, table, buckets, cu_seqlens, window, causal):
    if not isinstance(buckets, BucketSpec):
        raise TypeError(f"buckets must be a BucketSpec, got {type(buckets).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"packed {name} must be a tensor [T, H, D] (flash-attention's varlen layout), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q.shape != k.shape or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"packed q, k, v must be [T, H, D], [T, H, D], [T, H, Dv]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device == distance.device == cu_seqlens.device):
        raise ValueError("q, k, v, distance and cu_seqlens must be on one device")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError("cu_seqlens must be an int32 (or int64) tensor [S + 1]")
    if distance.dtype != torch.uint8 or distance.dim() != 1:
        raise ValueError(f"a packed distance must be uint8 [sum n_s^2] (PackedTreeBatch.distance), got {distance.dtype} "
                         f"{tuple(distance.shape)}")
    H = q.shape[1]
    T_b = buckets.num_buckets
    if table.shape not in ((T_b,), (H, T_b)):
        raise ValueError(f"table must have shape [{T_b}] or [{H}, {T_b}], got {tuple(table.shape)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 254):
        raise ValueError(f"window must be None or an int in 0..254, got {window!r}")
    if cu_seqlens.device.type == "cpu" and not V.compiling():  # checks that read cu_seqlens (never on a GPU: no
        # host synchronisation; not while torch.compile traces)
        cu = cu_seqlens.to(torch.int64)
        if int(cu[0]) != 0 or int(cu[-1]) != q.shape[0] or bool((cu[1:] < cu[:-1]).any()):
            raise ValueError(f"cu_seqlens must start at 0, never decrease and end at T = {q.shape[0]}, got "
                             f"{cu.tolist()[:8]}{'...' if cu.shape[0] > 8 else ''}")
        need = int(((cu[1:] - cu[:-1]) ** 2).sum())
        if distance.shape[0] != need:
            raise ValueError(f"the packed distance has {distance.shape[0]} bytes but the sequences of cu_seqlens "
                             f"need sum n_s^2 = {need}")


def reference_bias_attention_varlen(q, k, v, distance, table, *, buckets, cu_seqlens, scale=None, bias_scale=None,
                                    window=None, causal=False):
    """The specification: :func:`syntaxkernels.reference.syntax_bias_attention` run sequence by sequence
    (``[1, H, n, D]`` each, its ``n x n`` distance block), outputs concatenated back to ``[T, H, Dv]``. Rows of an
    empty sequence do not exist; gradients flow through autograd."""
    cu = cu_seqlens.to("cpu", torch.int64).tolist()
    outs = []
    offset = 0
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        n = b - a
        if n == 0:
            continue
        block = distance[offset:offset + n * n].view(1, n, n)
        offset += n * n
        qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = reference.syntax_bias_attention(qs, ks, vs, block, table, buckets=buckets, scale=scale,
                                            bias_scale=bias_scale, window=window, causal=causal)
        outs.append(o[0].transpose(0, 1))
    if not outs:
        return q.new_zeros((0, q.shape[1], v.shape[-1])) + 0 * v.sum()
    return torch.cat(outs, 0)


def _sequences(trees):
    """Host-side ``[(start, n, distance block [1, n, n])]`` of a packed batch (the reference paths only)."""
    cu = trees.cu_seqlens.to("cpu", torch.int64).tolist()
    offsets = trees.distance_offsets.to("cpu").tolist()
    out = []
    for s in range(len(cu) - 1):
        a, n = cu[s], cu[s + 1] - cu[s]
        out.append((a, n, trees.distance[offsets[s]:offsets[s] + n * n].view(1, n, n)))
    return out


def _per_sequence(x, a, n):
    return x[a:a + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]


def _check_packed_qkv(q, k, v, trees) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"with packed trees, {name} must be [T, H, D] (flash-attention's varlen layout), got "
                             f"{tuple(t.shape)}")
    if q.shape[0] != trees.num_tokens or k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"packed q, k, v must be [T, H, *] with T = {trees.num_tokens} (the trees' tokens), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def packed_window_attention(q, k, v, trees, *, window: int, scale: Optional[float] = None,
                            backend: str = "auto") -> torch.Tensor:
    """:func:`syntaxkernels.ops.syntax_window_attention` on a :class:`~syntaxkernels.trees.PackedTreeBatch`:
    q, k ``[T, H, D]``, v ``[T, H, Dv]`` -> ``[T, H, Dv]``; key j allowed for query i iff both are in one sequence
    and ``d(i, j) <= window``.

    The window's edge lists in packed numbering (``trees.window_lists(window)``: one ``[1, T]`` row) run through
    the existing edge-list kernels (C++ on CPU, Triton on CUDA) when they are built (always on CPU; on CUDA when
    cached, e.g. by ``TreeCollator(packed=True, windows=...)``), else the varlen fused kernel with a zero table
    and the window (no host synchronisation). "reference": the reference sequence by sequence."""
    from .edge_attention import edge_list_attention, resolve_edge_backend
    from ..specs import MAX_PATH

    _check_packed_qkv(q, k, v, trees)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_PATH:
        raise ValueError(f"window must be an int in 0..{MAX_PATH}, got {window!r}")
    chosen = resolve_edge_backend(backend, q.transpose(0, 1)[None], v.transpose(0, 1)[None])
    if chosen == "reference" or q.shape[0] == 0:
        outs = [reference.gat_attention(_per_sequence(q, a, n), _per_sequence(k, a, n), _per_sequence(v, a, n), d,
                                        window=window, scale=scale)[0].transpose(0, 1)
                for a, n, d in _sequences(trees) if n]
        return torch.cat(outs, 0) if outs else q.new_zeros((0, q.shape[1], v.shape[-1]))
    lists = trees.window_lists(window) if q.device.type != "cuda" else trees.cached_window_lists(window)
    if lists is None:
        buckets = BucketSpec(max_distance=1)
        table = torch.zeros(buckets.num_buckets, dtype=torch.float32, device=q.device)
        from .bias_attention_varlen import syntax_bias_attention_varlen  # CUDA with Triton only

        return syntax_bias_attention_varlen(q, k, v, trees.distance, table, buckets=buckets,
                                            cu_seqlens=trees.cu_seqlens, scale=scale, window=window,
                                            backend="triton")
    out, _ = edge_list_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], lists,
                                 scale=scale, backend="triton" if chosen == "triton" else "auto")
    return out[0, 0].transpose(0, 1)


def _reference_subnetwork_packed(q, k, v, trees, masks, scale):
    """The reference sub-network attention sequence by sequence: ``(out [T, M, H, Dv], nonempty [T, M])``."""
    from ..trees.batch import TreeBatch

    outs, flags = [], []
    heads = trees.heads.cpu()
    for a, n, _ in _sequences(trees):
        if n == 0:
            continue
        one = TreeBatch.from_heads([heads[a:a + n].tolist()]).to(q.device)
        o, ne = reference.syntax_subnetwork_attention(_per_sequence(q, a, n), _per_sequence(k, a, n),
                                                      _per_sequence(v, a, n), one, masks, scale=scale)
        outs.append(o[0].permute(2, 0, 1, 3))  # [n, M, H, Dv]
        flags.append(ne[0].transpose(0, 1))
    if not outs:
        M = masks.num_masks
        return q.new_zeros((0, M, q.shape[1], v.shape[-1])), torch.zeros((0, M), dtype=torch.bool, device=q.device)
    return torch.cat(outs, 0), torch.cat(flags, 0)
