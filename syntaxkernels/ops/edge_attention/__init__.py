"""Edge-list attention: per (batch b, head h, relation r, query row i) a softmax over the keys of the row's list.

``out[b, r, h, i] = sum_j p_j v[b, h, j]`` with ``p = softmax_j(scale * q[b, h, i] . k[b, h, j])`` over the keys
j of row (b, i, r) of an :class:`~syntaxkernels.trees.batch.EdgeLists` (CSR, int32); an empty row outputs 0
and gets zero gradients. The work is O(E * H * D) for E listed pairs: this is the O(M * D * E) path of the
Syntax-BERT relation masks (a ``child_d`` row holds at most one key, so its output is that key's value row;
all ``parent_d`` rows together hold at most N keys; ``sibling_d`` rows a few in real trees) and of the
syntax GAT's tree window. No ``[.., N, N]`` tensor exists, forward or backward.

Where each part lives (this folder):

- ``__init__.py`` (here): the public :func:`edge_list_attention` and :func:`syntax_window_attention` (the GAT's
  windowed attention, also on packed batches: :func:`packed_window_attention`), :func:`implementation` (what a
  call runs: the Triton kernels, the C++ kernels or the reference, the dense masks from the lists), the autograd
  Function ``_EdgeAttention`` over both kernel sets, and the window's path model on CUDA (:func:`window_costs`:
  these kernels or the fused LUT kernel of :mod:`syntaxkernels.ops.bias_attention`).
- ``_kernels.py``: the Triton kernels (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``) and their launchers
  (replayed: :mod:`syntaxkernels.ops._replay`; eager calls run them directly), the ``torch.library`` Triton ops
  ``syntaxkernels::edge_attention_fwd`` / ``_bwd`` that ``torch.compile`` traces; imported when Triton is.
- ``_cpu.py``: the C++ kernels' ops ``syntaxkernels::edge_attention_cpu_fwd`` / ``_cpu_bwd`` / ``_cpu_fwd_into``
  (CPU tensors, no Triton needed).
- ``configs.py``: the Triton kernels' launch configuration (:func:`.configs.edge_config`).

The row logsumexp saved for the backward is base 2 on the Triton path and natural on the C++ path (each pair
of ops reads its own).

Attention dropout (``dropout_p``, ``dropout_seed``): relation r's pairs are dropped with the Philox mask of
``reference.stream_seed(dropout_seed, r)`` (the C++ kernels through ``csrc/philox.h``, the Triton kernels'
``DROPOUT`` variant through ``dropout_keep_pairs``), the backward regenerating it; ``dropout_numbering`` gives a
packed row's pairs their padded numbering (docs/edges.md, "Attention dropout").
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ... import _ext
from ... import _validation as V
from ... import reference
from ...specs import MAX_PATH, BucketSpec
from ...trees.batch import EDGE_CHUNK, EdgeLists, TreeBatch, python_edge_lists
from .._dispatch import device_constant, kernels_or_reference, resolve_backend, triton_status
from .._packed import check_packed_qkv, is_packed, per_sequence, sequences
from ..bias_attention import syntax_bias_attention
from . import _cpu  # noqa: F401 (registers the C++ ops)
from .configs import _next_power_of_2

if triton_status() == "ok":  # the kernels and launchers (without Triton: the C++ kernels and the reference)
    from . import _kernels  # noqa: F401 (registers the Triton ops)

__all__ = ["edge_list_attention", "syntax_window_attention", "packed_window_attention", "implementation",
           "window_costs", "window_takes_edges"]

# The window's path on CUDA (:func:`window_costs`): the issue-slot model of the inspection (sm_90, bf16, forward +
# backward, non-tensor-core instructions). For the edge kernels (``inspection._edge_kernel_costs``: H = 12 heads
# of [B, N, H * D] projections, 2026-12-01, the kernels with row tiles and the lazy softmax), per edge slot: the
# main loops' cheapest paths of the forward, dQ and dK/dV kernels; per work item: each kernel's prologue and epilogue (forward + delta per forward item, dQ per
# query item, dK/dV per key item). For the fused LUT kernel, per score element of its live tiles: the bias
# kernels' window figures (benchmarks/RESULTS.md, 2026-11-30: 14.7 + 14.4 + 19.5 at D = 64, 16.4 + 18.8 + 24.4 at
# D = 128; issue-bound, not tensor-core-bound). By the padded head dim. A model, not a measurement.
EDGE_SLOT_COST = {32: 670.0, 64: 1288.0, 128: 2642.0}
EDGE_ITEM_COST = {32: (756.0, 251.0, 522.0), 64: (1164.0, 396.0, 1056.0), 128: (2176.0, 836.0, 2112.0)}
DENSE_ELEMENT_COST = {32: 48.6, 64: 48.6, 128: 59.6}
#: The tile of the live-tile count the model charges the dense kernel for (``EdgeLists.tile_count``).
DENSE_TILE = 64

#: Edges per work item of the Triton kernels (``EdgeLists.schedule``); tests lower it to split every row.
SCHEDULE_CHUNK = EDGE_CHUNK


# Autograd and the public functions
# --------------------------------------------------------------------------------------------------------

class _EdgeAttention(torch.autograd.Function):
    """Autograd over the edge ops (Triton or C++): gradients for q, k, v (the lists get none). ``dropout``:
    ``(p, seed bits, token_item, token_pos)`` of the op's attention dropout, the same for the backward (the mask is
    regenerated from the seed)."""

    @staticmethod
    def forward(ctx, q, k, v, row_ptr, col, rel, t_ptr, t_col, t_rel, num_relations, scale, sizes, dropout,
                *schedule):
        if sizes is not None:  # the Triton kernels, over the schedule's work items (eager: the launcher directly)
            forward = (torch.ops.syntaxkernels.edge_attention_fwd if torch.compiler.is_compiling()
                       else _kernels.edge_attention_forward)
            out, lse = forward(q, k, v, col, rel, list(schedule), list(sizes), num_relations, scale, *dropout)
        else:
            out, lse = torch.ops.syntaxkernels.edge_attention_cpu_fwd(q, k, v, row_ptr, col, num_relations, scale,
                                                                      *dropout)
        ctx.save_for_backward(q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, *schedule)
        ctx.scale, ctx.sizes, ctx.dropout = scale, sizes, dropout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, *schedule = ctx.saved_tensors
        if ctx.sizes is not None:
            backward = (torch.ops.syntaxkernels.edge_attention_bwd if torch.compiler.is_compiling()
                        else _kernels.edge_attention_backward)
            dq, dk, dv = backward(dout, q, k, v, out, lse, col, rel, t_col, t_rel, list(schedule), list(ctx.sizes),
                                  ctx.scale, *ctx.dropout)
        else:
            dq, dk, dv = torch.ops.syntaxkernels.edge_attention_cpu_bwd(dout, q, k, v, out, lse, row_ptr, col, rel,
                                                                        t_ptr, t_col, t_rel, ctx.scale, *ctx.dropout)
        return (dq, dk, dv) + (None,) * (11 + len(schedule))


def implementation(q: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> str:
    """What :func:`edge_list_attention` (and :func:`syntax_window_attention`, and the sub-network op's relation
    masks) runs for these q and v: "cpp", "triton" or "reference".

    "auto": the C++ kernels on CPU tensors (when the extension is built; any float dtype, any head dim), with or
    without Triton; the Triton kernels on CUDA tensors they take (Triton importable, sm_80 or newer, float16,
    bfloat16, float32, head dims up to ``_dispatch.MAX_HEAD_DIM``); the reference otherwise. "triton": the Triton
    kernels (CPU tensors only under ``TRITON_INTERPRET=1``), RuntimeError where Triton cannot run and ValueError
    for inputs they do not take. The ops decide through this function.
    """
    chosen = resolve_backend(backend, q.device)
    if backend == "auto" and q.device.type == "cpu":
        return "cpp" if _ext.available() and hasattr(_ext.load(), "edge_attention_forward") else "reference"
    return kernels_or_reference(backend, chosen, q, v)


def _check_lists(lists: EdgeLists, q: torch.Tensor) -> None:
    if not isinstance(lists, EdgeLists):
        raise TypeError(f"lists must be an EdgeLists (TreeBatch.relation_lists / window_lists), got "
                        f"{type(lists).__name__}")
    B, _, N, _ = q.shape
    if (lists.batch_size, lists.max_len) != (B, N):
        raise ValueError(f"lists are for B = {lists.batch_size}, N = {lists.max_len} but q has B = {B}, N = {N}")
    if lists.device != q.device:
        raise ValueError(f"lists are on {lists.device} but q is on {q.device}")


def _numbered_keep(seed: int, p: float, B: int, H: int, N: int, numbering) -> torch.Tensor:
    """bool ``[B, H, N, N]``: attention dropout's keep mask of the pairs of a padded layout whose tokens carry their
    own numbering ``(token_item, token_pos)`` (int32 ``[B * N]``: a packed row's sequence and position in it):
    pair (i, j) is :func:`~syntaxkernels.reference.dropout_keep`'s pair (``pos[i]``, ``pos[j]``) of item
    ``item[i]``."""
    item, pos = (t.view(B, N).to(torch.int64) for t in numbering)
    threshold = reference.dropout_threshold(p)
    heads = torch.arange(H, device=item.device, dtype=torch.int64)
    bh = item[:, None, :, None] * H + heads[None, :, None, None]  # [B, H, N, 1]
    rows = pos[:, None, :, None]
    cols = pos[:, None, None, :]
    zero = torch.zeros((), dtype=torch.int64, device=item.device)
    words = reference.philox(int(seed), cols >> 2, rows, bh, zero)
    lane = (cols & 3).expand(B, H, N, N)
    word = torch.stack([w.expand(B, H, N, N) for w in words]).gather(0, lane[None]).squeeze(0)
    return word >= threshold


def _reference_edge_attention(q, k, v, lists: EdgeLists, scale: float, dropout_p: float = 0.0,
                              dropout_seed: Optional[int] = None, numbering=None) -> torch.Tensor:
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q @ k.transpose(-1, -2)).to(acc) * scale
    allowed = lists.to_dense()
    outs = []
    for r in range(lists.num_relations):
        seed = None if dropout_p == 0.0 else reference.stream_seed(dropout_seed, r)
        if numbering is None or dropout_p == 0.0:
            outs.append(reference.masked_attention(scores, allowed[:, r, None], v, dropout_p=dropout_p,
                                                   dropout_seed=seed))
            continue
        B, H, N, _ = q.shape
        weights = reference.masked_softmax(scores, allowed[:, r, None])
        keep = _numbered_keep(seed, dropout_p, B, H, N, numbering)
        weights = torch.where(keep, weights * (1.0 / (1.0 - dropout_p)), torch.zeros((), dtype=weights.dtype,
                                                                                     device=weights.device))
        outs.append((weights.to(v.dtype) @ v).masked_fill(~allowed[:, r, None].any(dim=-1, keepdim=True), 0))
    return torch.stack(outs, dim=1)


def _seed_bits(seed: int) -> int:
    """``seed`` (an int in ``[0, 2^64)``) as its int64 bit pattern, the ops' ``seed`` argument (as
    ``_primitives.seed_bits``, which needs Triton)."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed - (1 << 64) if seed >= (1 << 63) else seed


def _check_numbering(numbering, q: torch.Tensor):
    """``numbering`` (None, or ``(token_item, token_pos)``: int32 ``[B * N]`` each on q's device) checked."""
    if numbering is None:
        return None
    B, _, N, _ = q.shape
    item, pos = numbering
    for t in (item, pos):
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.numel() != B * N
                or t.device != q.device):
            raise ValueError(f"dropout_numbering must be two int32 tensors of B * N = {B * N} tokens on {q.device}")
    return item.contiguous().view(-1), pos.contiguous().view(-1)


def edge_list_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lists: EdgeLists, *,
                        scale: Optional[float] = None, backend: str = "auto", dropout_p: float = 0.0,
                        dropout_seed: Optional[int] = None,
                        dropout_numbering=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention restricted to per-row key lists: one softmax per (batch, head, relation, query row).

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device.
        lists: an :class:`~syntaxkernels.trees.batch.EdgeLists` for B sequences of N tokens on q's device
            (``trees.relation_lists(masks)``, ``trees.window_lists(window)``).
        scale: score scale, default ``1 / sqrt(D)``.
        backend: "auto" (C++ on CPU tensors, Triton on CUDA tensors), "triton" or "reference" (dense masks
            from the lists: the specification, O(N^2)).
        dropout_p, dropout_seed: attention dropout on the probabilities: relation r's pairs are dropped with
            :func:`~syntaxkernels.reference.dropout_keep`'s mask of seed ``reference.stream_seed(dropout_seed, r)``
            (relation 0: the seed itself), the kept ones scaled by ``1 / (1 - dropout_p)`` (the normaliser is the
            undropped one); every backend draws the same mask, the backward regenerates it.
        dropout_numbering: None (pair (i, j) of item b is numbered (b, i, j)) or ``(token_item, token_pos)``, int32
            ``[B * N]`` each: token t of the layout is position ``token_pos[t]`` of item ``token_item[t]`` in the
            mask's numbering (a packed row: its sequence and its position in it; relations never cross items).
    Returns:
        ``out [B, R, H, N, Dv]`` in q's dtype (zero for an empty row, whose gradients are zero too) and
        ``nonempty bool [B, R, N]``.

    Equivalent PyTorch::

        allowed = lists.to_dense()                                   # [B, R, N, N]
        s = (q @ k.transpose(-1, -2)).float() * scale
        out = torch.stack([masked_attention(s, allowed[:, r, None], v, dropout_p=dropout_p,
                                            dropout_seed=stream_seed(dropout_seed, r)) for r in range(R)], dim=1)
    """
    V.check_qkv(q, k, v)
    _check_lists(lists, q)
    V.check_dropout(dropout_p, dropout_seed)
    numbering = _check_numbering(dropout_numbering, q)
    dropout_p = float(dropout_p)
    chosen = implementation(q, v, backend)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if chosen == "reference":
        return _reference_edge_attention(q, k, v, lists, scale, dropout_p, dropout_seed, numbering), lists.nonempty
    if chosen == "triton":
        schedule = lists.schedule(SCHEDULE_CHUNK)
        sizes, tensors = tuple(schedule.sizes()), schedule.tensors()
    else:
        sizes, tensors = None, []
    if dropout_p > 0.0:
        dropout = (dropout_p, _seed_bits(dropout_seed)) + (numbering if numbering is not None else (None, None))
    else:
        dropout = ()
    out = _EdgeAttention.apply(q, k, v, lists.row_ptr, lists.col, lists.rel, lists.t_ptr, lists.t_col,
                               lists.t_rel, lists.num_relations, float(scale), sizes, dropout, *tensors)
    return out, lists.nonempty


def window_costs(lists: EdgeLists, head_dim: int) -> Tuple[float, float]:
    """``(edge, dense)``: the model's instructions per head for one forward + backward of the window on these lists
    by the edge kernels (``EDGE_SLOT_COST`` per edge, as the balanced schedule walks close to one slot per edge,
    plus ``EDGE_ITEM_COST`` per work item of its schedule) and by the fused LUT kernel on its live tiles
    (``DENSE_ELEMENT_COST`` per score element of every live ``DENSE_TILE`` x ``DENSE_TILE`` tile). Host ints only
    (the schedule and the live tiles are built on the CPU when the lists move to the GPU): no synchronisation."""
    dim = min(128, max(32, _next_power_of_2(head_dim)))
    schedule = lists.schedule(SCHEDULE_CHUNK)
    per_item = EDGE_ITEM_COST[dim]
    edge = EDGE_SLOT_COST[dim] * lists.num_edges + sum(
        cost * items for cost, items in zip(per_item, (schedule.f_items.shape[1] + schedule.p_items.shape[1],
                                                      schedule.q_items.shape[1] + schedule.qp_items.shape[1],
                                                      schedule.k_items.shape[1] + schedule.kp_items.shape[1])))
    dense = DENSE_ELEMENT_COST[dim] * DENSE_TILE * DENSE_TILE * lists.tile_count(DENSE_TILE)
    return edge, dense


def window_takes_edges(lists: EdgeLists, head_dim: int) -> bool:
    """Whether the model (:func:`window_costs`) puts the window on the edge kernels rather than the LUT kernel:
    the live-tile density (edges per live tile), not the global density, decides."""
    edge, dense = window_costs(lists, head_dim)
    return edge <= dense


def _window_lists(trees, window: int, lengths, q: torch.Tensor, build: bool) -> Optional[EdgeLists]:
    """The window lists for these inputs, or None where getting them would synchronise a GPU (``build``
    False: only cached lists of a TreeBatch whose own lengths apply)."""
    own_lengths = isinstance(trees, TreeBatch) and (lengths is None or lengths is trees.lengths)
    if own_lengths:
        return trees.window_lists(window) if build else trees.cached_window_lists(window)
    if not build:
        return None
    distance = trees.distance if isinstance(trees, TreeBatch) else trees
    lengths = V.normalize_lengths(lengths, q)
    if isinstance(trees, TreeBatch):
        if lengths is None or torch.equal(lengths.to(trees.lengths.device), trees.lengths.to(torch.int64)):
            return trees.window_lists(window)
        segment = trees.segment
    else:
        B, N, _ = distance.shape
        reachable = (distance != 255).any(dim=-1)  # padding tokens reach nothing, not even themselves
        segment = torch.where(reachable, 0, -1).to(torch.int32)
    depth = torch.zeros_like(segment)
    return python_edge_lists(distance, depth, segment, window=window, lengths=lengths)


def syntax_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, *, window: int,
                            lengths=None, scale: Optional[float] = None, backend: str = "auto") -> torch.Tensor:
    """The syntax GAT's windowed attention: query i attends key j only where ``d(i, j) <= window``.

    Same result as :func:`syntaxkernels.reference.gat_attention`. On CPU it always runs on the window's edge
    lists (C++, or Triton under ``backend="triton"`` with the interpreter): O(E) work for E pairs within the
    window. On CUDA it runs on the edge lists when they are already built (``trees.window_lists(window)``, e.g.
    by ``TreeCollator(windows=...)``) and the cost model puts them there (:func:`window_takes_edges`: the
    edges against the live 64 x 64 tiles), else on the fused dense kernel with block skipping
    (:func:`syntaxkernels.syntax_bias_attention` with a zero table).

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``.
        trees: a :class:`TreeBatch` (its window lists are built once and cached) or ``uint8 distance
            [B, N, N]`` (lists built from it on every call); or a :class:`~syntaxkernels.trees.PackedTreeBatch`,
            with q, k, v ``[T, H, D]`` and a ``[T, H, Dv]`` result
            (:func:`packed_window_attention`).
        window: delta, an int in 0..254 (0: a token sees only itself).
        lengths: ``int [B]`` or a boolean key-padding mask; default: the TreeBatch's lengths (or all N).
        scale: default ``1 / sqrt(D)``.
        backend: "auto", "triton" or "reference".
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; rows past the length are 0.
    """
    if is_packed(trees):  # packed batch: q, k, v [T, H, D]
        return packed_window_attention(q, k, v, trees, window=window, scale=scale, backend=backend)
    V.check_qkv(q, k, v)
    if isinstance(trees, TreeBatch):
        V.check_trees(trees, q)
    else:
        V.check_distance(trees, q)
    if window is None:
        raise ValueError("window must be an int in 0..254, got None")
    V.check_window(window)
    distance = trees.distance if isinstance(trees, TreeBatch) else trees
    chosen = implementation(q, v, backend)
    if chosen == "reference":
        if lengths is None and isinstance(trees, TreeBatch):
            lengths = trees.lengths
        return reference.gat_attention(q, k, v, distance, window=window, lengths=lengths, scale=scale)
    on_gpu = q.device.type == "cuda"
    lists = _window_lists(trees, window, lengths, q, build=not on_gpu)
    if lists is None or (on_gpu and not window_takes_edges(lists, q.shape[-1])):
        if isinstance(trees, TreeBatch) and lengths is trees.lengths:
            lengths = None  # the batch's own: its plan as it is
        zeros = device_constant(("zero table", q.dtype), q,
                                lambda: torch.zeros(BucketSpec(max_distance=1).num_buckets, dtype=q.dtype))
        return syntax_bias_attention(q, k, v, trees, zeros, buckets=BucketSpec(max_distance=1),
                                     scale=scale, lengths=lengths, window=window, backend="triton")
    out, _ = edge_list_attention(q, k, v, lists, scale=scale, backend="triton" if chosen == "triton" else "auto")
    return out[:, 0]


def packed_window_attention(q, k, v, trees, *, window: int, scale: Optional[float] = None,
                            backend: str = "auto") -> torch.Tensor:
    """:func:`syntax_window_attention` on a :class:`~syntaxkernels.trees.PackedTreeBatch`:
    q, k ``[T, H, D]``, v ``[T, H, Dv]`` -> ``[T, H, Dv]``; key j allowed for query i iff both are in one sequence
    and ``d(i, j) <= window``.

    The window's edge lists in packed numbering (``trees.window_lists(window)``: one ``[1, T]`` row) run through
    the existing edge-list kernels (C++ on CPU, Triton on CUDA) when they are built (always on CPU; on CUDA when
    cached, e.g. by ``TreeCollator(packed=True, windows=...)``), else the varlen fused kernel with a zero table
    and the window (no host synchronisation). "reference": the reference sequence by sequence."""
    check_packed_qkv(q, k, v, trees)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_PATH:
        raise ValueError(f"window must be an int in 0..{MAX_PATH}, got {window!r}")
    chosen = implementation(q.transpose(0, 1)[None], v.transpose(0, 1)[None], backend)
    if chosen == "reference" or q.shape[0] == 0:
        outs = [reference.gat_attention(per_sequence(q, a, n), per_sequence(k, a, n), per_sequence(v, a, n), d,
                                        window=window, scale=scale)[0].transpose(0, 1)
                for a, n, d in sequences(trees) if n]
        return torch.cat(outs, 0) if outs else q.new_zeros((0, q.shape[1], v.shape[-1]))
    lists = trees.window_lists(window) if q.device.type != "cuda" else trees.cached_window_lists(window)
    if lists is None:
        buckets = BucketSpec(max_distance=1)
        table = device_constant(("zero table", torch.float32), q,
                                lambda: torch.zeros(buckets.num_buckets, dtype=torch.float32))
        return syntax_bias_attention(q, k, v, trees, table, buckets=buckets, scale=scale, window=window,
                                     backend="triton")  # CUDA with Triton only
    out, _ = edge_list_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], lists,
                                 scale=scale, backend="triton" if chosen == "triton" else "auto")
    return out[0, 0].transpose(0, 1)
