"""Syntax-BERT sub-network attention: M masked attentions sharing q, k, v (docs/semantics.md, docs/edges.md).

One implementation per mask kind:

- **Relation masks** (``parent_d``, ``child_d``, ``sibling_d``) run on per-row key lists
  (:meth:`TreeBatch.relation_lists`, built by the C++ tree builder once per batch) through
  :func:`syntaxkernels.ops.edge_attention.edge_list_attention`: C++ kernels on CPU tensors (with or without
  Triton), Triton kernels on CUDA tensors (or on CPU under ``TRITON_INTERPRET=1`` with ``backend="triton"``). Work
  O(E * H * D) for the E listed pairs: a ``child_d`` row holds at most one key, all ``parent_d`` rows together at
  most N keys.
- **Dense masks** (``full``: every valid key; ``pairwise``: keys in another tree of the sequence): ``full`` is
  plain attention over the valid keys, SDPA with a ``[B, 1, 1, N]`` key mask from the segments under every
  backend and on every device (the distance is not read); ``pairwise`` wherever the Triton kernels run (CUDA
  tensors, or CPU tensors under ``TRITON_INTERPRET=1`` with ``backend="triton"``) is the fused kernel
  :func:`syntaxkernels.ops.bias_attention.lut_attention` with a fixed bias per distance value (``-inf`` except
  distance 255, i.e. different trees; padding excluded by lengths), and under ``"auto"`` on CPU the SDPA CPU
  kernel with a ``[B, 1, N, N]`` mask.

Packed batches (a :class:`~syntaxkernels.trees.PackedTreeBatch`, q, k, v ``[T, H, D]``):
:func:`packed_subnetwork_attention`, the relation lists in packed numbering and the dense masks within each
sequence. :func:`implementation` says what a call runs.

The outputs come in ``MaskSpec.names`` order (relations, then pairwise, then full). The default CPU path
(:class:`_SubnetworkCPU`) writes all M of them into one ``[B, M, H, N, D]`` tensor, the C++ edge kernels and
``aten::_scaled_dot_product_flash_attention_for_cpu`` side by side, and reads the output gradient's slices in
place; the other paths (Triton, or a value head dim unlike q's) concatenate the parts. Rows with no key output 0
with zero gradients; ``nonempty`` comes from the lists' row offsets and, for the dense masks, from the masks (the
SDPA paths) or per-segment token counts (the fused kernel). On CUDA, with the lists already built
(``TreeCollator(masks=...)`` in the data pipeline, or one earlier call), the Python side of the forward and
backward reads no device value back: the constant tables are built once per device and cached.

Attention dropout (``dropout_p``, ``dropout_seed``): sub-network m drops its probabilities with the mask of
``reference.stream_seed(dropout_seed, m)``; the relation masks through the edge kernels' dropout (relation r is
stream r), the dense masks through :func:`syntaxkernels.ops.bias_attention.syntax_bias_attention` with a table
per distance value (``LUT_BUCKETS``) and its dropout (SDPA draws another generator's mask), packed batches
numbered as their padded form (docs/edges.md, "Attention dropout").
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .. import _validation as V
from .. import reference
from ..specs import MaskSpec
from ..trees.batch import TreeBatch
from . import bias_attention, edge_attention
from ._dispatch import device_constant
from .bias_attention._host import LUT_BUCKETS
from ._packed import check_packed_qkv, is_packed, per_sequence, sequences
from .edge_attention import edge_list_attention

__all__ = ["syntax_subnetwork_attention", "packed_subnetwork_attention", "implementation"]


def implementation(q: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> str:
    """What :func:`syntax_subnetwork_attention` runs for these q and v: "cpp" (the C++ edge kernels and the SDPA
    CPU kernel: CPU tensors under "auto", with or without Triton), "triton" (the Triton edge kernels, the fused LUT
    kernel for ``pairwise`` and SDPA for ``full``) or "reference"; the relation masks' choice
    (:func:`syntaxkernels.ops.edge_attention.implementation`), raising as it does for ``backend="triton"``."""
    return edge_attention.implementation(q, v, backend)


def _valid(trees: TreeBatch) -> torch.Tensor:
    """bool ``[B, N]``: real tokens (padding has segment -1)."""
    return trees.segment >= 0


def _pairwise_nonempty(trees: TreeBatch) -> torch.Tensor:
    """bool ``[B, N]``: a valid token with some valid token in another tree, from per-tree token counts (no
    ``[B, N, N]`` tensor; no synchronisation)."""
    valid = _valid(trees)
    tree = trees.segment.clamp(min=0).long()  # trees are numbered 0.. < N within a sequence
    per_tree = torch.zeros(valid.shape, dtype=torch.int64, device=valid.device)
    per_tree.scatter_add_(1, tree, valid.long())
    same_tree = per_tree.gather(1, tree)
    return valid & (valid.sum(dim=1, keepdim=True) > same_tree)


def _dense_allowed(trees: TreeBatch, kind: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(allowed, nonempty)`` of a dense mask: bool ``allowed`` ``[B, 1, 1, N]`` for full (a key mask from the
    segments: plain attention with lengths), ``[B, 1, N, N]`` for pairwise, and ``nonempty [B, N]``, the rows with
    an allowed key. Rows with no allowed key are given every key (so the softmax stays finite); the callers then
    set them to zero (a select, not a product: a NaN among those keys must not reach their outputs) and zero
    their output gradients: their outputs and (for finite inputs) gradients are exactly zero."""
    valid = _valid(trees)
    if kind == "full":
        keys = valid | ~valid.any(dim=1, keepdim=True)  # an empty item: any key (its rows are zeroed)
        return keys[:, None, None, :], valid
    segment = trees.segment
    pairs = valid[:, :, None] & valid[:, None, :] & (segment[:, :, None] != segment[:, None, :])
    if getattr(trees, "pairwise_self", False):  # the release's pairwise mask holds the token itself
        pairs = pairs | (torch.eye(pairs.shape[-1], dtype=torch.bool, device=pairs.device) & valid[:, :, None])
    nonempty = pairs.any(dim=-1)
    return (pairs | ~nonempty[:, :, None])[:, None], nonempty


def _dense_cpu(q, k, v, trees: TreeBatch, kind: str, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One dense mask with SDPA and the boolean mask of :func:`_dense_allowed`, on any device: the ``full`` mask
    under the Triton backend, and both dense masks on CPU when the C++ path cannot write them into one output
    (v's head dim unlike q's): ``(out [B, H, N, Dv], nonempty [B, N])``."""
    allowed, nonempty = _dense_allowed(trees, kind)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    # A select, not a product: a NaN row times 0 would stay NaN.
    return torch.where(nonempty[:, None, :, None], out, out.new_zeros(())), nonempty


def _dense_lut(kind: str, like: torch.Tensor) -> torch.Tensor:
    """The float32 ``[256]`` bias of a dense mask per distance value on ``like``'s device, built once per device
    (:func:`~syntaxkernels.ops._dispatch.device_constant`): ``full`` 0 everywhere, ``pairwise`` -inf except
    distance 255 (valid pairs in different trees are exactly the valid pairs at distance 255)."""
    def build() -> torch.Tensor:
        if kind == "full":
            return torch.zeros(256, dtype=torch.float32)
        lut = torch.full((256,), float("-inf"), dtype=torch.float32)
        lut[255] = 0.0
        return lut

    return device_constant(("dense mask lut", kind), like, build)


def _dense_fused(q, k, v, trees: TreeBatch, kind: str, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One dense mask with the fused LUT kernel (Triton: CUDA, or the interpreter): ``(out [B, H, N, Dv],
    nonempty [B, N])``."""
    out = bias_attention.lut_attention(q, k, v, trees, _dense_lut(kind, q), scale=scale)
    nonempty = _valid(trees) if kind == "full" else _pairwise_nonempty(trees)
    return out, nonempty


def _dense_table(kind: str, pairwise_self: bool, like: torch.Tensor) -> torch.Tensor:
    """The float32 table over ``LUT_BUCKETS`` (one bucket per distance value) of a dense mask for
    :func:`syntaxkernels.ops.bias_attention.syntax_bias_attention`, built once per device: ``full`` 0 everywhere
    (padding is excluded by the batch's lengths), ``pairwise`` -inf except distance 255 (different trees) and, for
    the release's pairwise mask (``pairwise_self``), distance 0 (the token itself)."""
    def build() -> torch.Tensor:
        buckets = LUT_BUCKETS
        if kind == "full":
            return torch.zeros(buckets.num_buckets, dtype=torch.float32)
        bucket_of = buckets.lut().long()
        table = torch.full((buckets.num_buckets,), float("-inf"), dtype=torch.float32)
        table[bucket_of[255]] = 0.0
        if pairwise_self:
            table[bucket_of[0]] = 0.0
        return table

    return device_constant(("dense mask table", kind, pairwise_self), like, build)


def _dense_dropout(q, k, v, trees: TreeBatch, kind: str, scale: float, dropout_p: float, seed: int,
                   backend: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """One dense mask with attention dropout (mask of seed ``seed``, the sub-network's stream): ``(out [B, H, N,
    Dv], nonempty [B, N])``. SDPA's dropout draws another generator's mask, so the dense masks run on the
    distance-bias op with a table per distance value and its ``dropout_p`` (Triton on CUDA and under the
    interpreter, the fused C++ kernels under "auto" on CPU). A word-level batch (``trees.word_level``: its texts
    are marked by segment only, not by distance) runs the reference's masked attention ([B, H, N, N])."""
    if getattr(trees, "word_level", False):
        allowed, nonempty = _dense_allowed(trees, kind)
        allowed = allowed & nonempty[:, None, :, None]
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        scores = (q @ k.transpose(-1, -2)).to(acc) * scale
        out = reference.masked_attention(scores, allowed, v, dropout_p=dropout_p, dropout_seed=seed)
        return out.to(q.dtype), nonempty
    table = _dense_table(kind, bool(getattr(trees, "pairwise_self", False)), q)
    out = bias_attention.syntax_bias_attention(q, k, v, trees, table, buckets=LUT_BUCKETS, scale=scale,
                                               backend=backend, dropout_p=dropout_p, dropout_seed=seed)
    nonempty = _valid(trees) if kind == "full" else _pairwise_nonempty(trees)
    if kind == "pairwise" and getattr(trees, "pairwise_self", False):
        nonempty = _valid(trees)
    return out, nonempty


def _additive_mask(q: torch.Tensor, trees: TreeBatch, kind: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(mask, keep)`` of a dense mask for the SDPA CPU kernel: an additive mask in q's dtype (0 allowed, -inf
    not, from :func:`_dense_allowed`) and ``keep [B, 1, N, 1]`` in q's dtype, 1 for the rows with a key (the
    others are set to 0, their output gradients multiplied by 0: output and gradients exactly zero)."""
    allowed, nonempty = _dense_allowed(trees, kind)
    mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill_(~allowed, float("-inf"))
    return mask, nonempty[:, None, :, None].to(q.dtype)


class _SubnetworkCPU(torch.autograd.Function):
    """The CPU path in one output tensor: the C++ edge kernels write the R relation outputs, the SDPA CPU kernel
    (``aten::_scaled_dot_product_flash_attention_for_cpu``) the dense ones, straight into ``[B, M, H, N, D]``;
    the backward reads the slices of the output gradient in place. No concatenation, no extra output copy."""

    @staticmethod
    def forward(ctx, q, k, v, row_ptr, col, rel, t_ptr, t_col, t_rel, num_relations, scale, *dense):
        B, H, N, D = q.shape
        R = num_relations
        masks, keeps = dense[0::2], dense[1::2]
        out = q.new_empty((B, R + len(masks), H, N, D))
        lse = torch.empty((B, R, H, N), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        if R:
            torch.ops.syntaxkernels.edge_attention_cpu_fwd_into(q, k, v, row_ptr, col, scale, out[:, :R], lse)
        saved = []
        for m, (mask, keep) in enumerate(zip(masks, keeps)):
            o, o_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask,
                                                                                 scale=scale)
            torch.where(keep != 0, o, o.new_zeros(()), out=out[:, R + m])  # not o * keep: a NaN row times 0 stays NaN
            saved += [o, o_lse]
        ctx.save_for_backward(q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, *dense, *saved)
        ctx.num_relations, ctx.num_dense, ctx.scale = R, len(masks), scale
        return out

    @staticmethod
    def backward(ctx, gout):
        q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, *rest = ctx.saved_tensors
        R, n, scale = ctx.num_relations, ctx.num_dense, ctx.scale
        dense, saved = rest[:2 * n], rest[2 * n:]
        if R:
            dq, dk, dv = torch.ops.syntaxkernels.edge_attention_cpu_bwd(
                gout[:, :R], q, k, v, out[:, :R], lse, row_ptr, col, rel, t_ptr, t_col, t_rel, scale)
        else:
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for m in range(n):
            mask, keep = dense[2 * m], dense[2 * m + 1]
            o, o_lse = saved[2 * m], saved[2 * m + 1]
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                (gout[:, R + m] * keep).contiguous(), q, k, v, o, o_lse, 0.0, False, attn_mask=mask, scale=scale)
            dq.add_(grads[0])
            dk.add_(grads[1])
            dv.add_(grads[2])
        return (dq, dk, dv) + (None,) * (9 + 2 * n)


def syntax_subnetwork_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, masks: MaskSpec, *,
                                scale: Optional[float] = None, backend: str = "auto", dropout_p: float = 0.0,
                                dropout_seed: Optional[int] = None):
    """Syntax-BERT sub-networks: M masked attentions sharing q, k, v.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device.
        trees: a :class:`syntaxkernels.TreeBatch` on q's device (or a
            :class:`~syntaxkernels.trees.PackedTreeBatch` with q, k, v ``[T, H, D]``: then ``(out [T, M, H, Dv],
            nonempty [T, M])``, see :func:`packed_subnetwork_attention`). Its relation lists are built on first use and
            cached on it (on a GPU that first build reads the heads back once; build them in the data pipeline,
            ``TreeCollator(masks=...)``, to avoid it).
        masks: the :class:`syntaxkernels.MaskSpec`; M = ``masks.num_masks``, outputs in ``masks.names`` order.
        scale: score scale, default ``1/sqrt(D)``.
        backend: "auto" (on CPU the C++ edge kernels + SDPA; on CUDA the Triton edge kernels, the fused LUT
            kernel for ``pairwise`` and SDPA for ``full``), "triton" (as "auto" on CUDA, also for CPU tensors under
            ``TRITON_INTERPRET=1``) or "reference". Inputs the Triton kernels do not take (float64, head dims
            above 128) fall back to the reference under "auto" and raise ValueError under "triton".
        dropout_p, dropout_seed: attention dropout on each sub-network's probabilities (docs/semantics.md,
            "Attention dropout"): sub-network m (its index in ``masks.names``) drops pair (i, j) of head h of item
            b with :func:`syntaxkernels.reference.dropout_keep`'s mask of seed
            ``reference.stream_seed(dropout_seed, m)`` (independent masks per sub-network), the kept ones scaled by
            ``1 / (1 - dropout_p)``, the softmax's normaliser undropped; every backend draws the same masks and
            the backward regenerates them. The relation masks run on the edge kernels' dropout variant; the dense
            masks (``full``, ``pairwise``) on :func:`syntaxkernels.ops.bias_attention.syntax_bias_attention` with a
            table per distance value and its dropout (SDPA's generator is not this one). ``dropout_seed``: an int
            in ``[0, 2^64)``, needed when ``dropout_p > 0``.
    Returns:
        ``out [B, M, H, N, Dv]`` in q's dtype (zero where a token's mask is empty; such rows get zero
        gradients) and ``nonempty bool [B, M, N]``.

    Equivalent PyTorch::

        allowed = syntaxkernels.reference.syntax_masks(trees, masks)          # [B, M, N, N]
        scores = (q @ k.transpose(-1, -2)).float() * scale
        out = torch.stack([masked_attention(scores, allowed[:, m, None], v, dropout_p=dropout_p,
                                            dropout_seed=stream_seed(dropout_seed, m)) for m in range(M)], dim=1)
        nonempty = allowed.any(-1)
    """
    if is_packed(trees):  # packed batch: q, k, v [T, H, D]
        return packed_subnetwork_attention(q, k, v, trees, masks, scale=scale, backend=backend,
                                           dropout_p=dropout_p, dropout_seed=dropout_seed)
    V.check_subnetwork_inputs(q, k, v, trees, masks)
    V.check_dropout(dropout_p, dropout_seed)
    dropout_p = float(dropout_p)
    chosen = implementation(q, v, backend)
    if chosen == "reference" or q.numel() == 0 or v.numel() == 0:
        return reference.syntax_subnetwork_attention(q, k, v, trees, masks, scale=scale, dropout_p=dropout_p,
                                                     dropout_seed=dropout_seed)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    kinds = masks.dense_kinds
    if chosen == "cpp" and kinds and q.shape[-1] == v.shape[-1] and dropout_p == 0.0:
        return _cpu_one_pass(q, k, v, trees, masks, kinds, float(scale))
    outs, flags = [], []
    R = masks.num_relations
    if R:
        out, nonempty = edge_list_attention(q, k, v, trees.relation_lists(masks), scale=scale,
                                            backend="triton" if chosen == "triton" else "auto",
                                            dropout_p=dropout_p, dropout_seed=dropout_seed)
        outs.append(out)
        flags.append(nonempty)
    for index, kind in enumerate(kinds):
        if dropout_p > 0.0:  # sub-network R + index: its own stream
            out, nonempty = _dense_dropout(q, k, v, trees, kind, float(scale), dropout_p,
                                           reference.stream_seed(dropout_seed, R + index),
                                           "triton" if chosen == "triton" else "auto")
            outs.append(out[:, None])
            flags.append(nonempty[:, None])
            continue
        # ``full`` is plain attention over the valid keys (SDPA with a key mask from the segments: the distance is
        # never read); ``pairwise`` needs the distance (the fused LUT kernel on Triton devices).
        # The fused kernel reads pairwise as "distance 255"; a word-level batch (trees.syntax_bert_batch) marks
        # its texts by segment only, and its release form adds the diagonal: SDPA with the mask from segments.
        fused = chosen == "triton" and kind == "pairwise" and not getattr(trees, "word_level", False)
        dense = _dense_fused if fused else _dense_cpu
        out, nonempty = dense(q, k, v, trees, kind, float(scale))
        outs.append(out[:, None])
        flags.append(nonempty[:, None])
    if len(outs) == 1:
        return outs[0], flags[0]
    return torch.cat(outs, dim=1), torch.cat(flags, dim=1)


def _cpu_one_pass(q, k, v, trees: TreeBatch, masks: MaskSpec, kinds, scale: float):
    """The C++ + SDPA path into one output tensor (:class:`_SubnetworkCPU`)."""
    flags = []
    if masks.num_relations:
        lists = trees.relation_lists(masks)
        tensors = (lists.row_ptr, lists.col, lists.rel, lists.t_ptr, lists.t_col, lists.t_rel)
        R = lists.num_relations
        flags.append(lists.nonempty)
    else:
        tensors, R = (torch.zeros(1, dtype=torch.int32),) * 6, 0
    dense = []
    for kind in kinds:
        mask, keep = _additive_mask(q, trees, kind)
        dense += [mask, keep]
        flags.append(keep[:, 0, :, 0][:, None] > 0)
    out = _SubnetworkCPU.apply(q, k, v, *tensors, R, scale, *dense)
    return out, torch.cat(flags, dim=1) if len(flags) > 1 else flags[0]


# ---------------------------------------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------------------------------------


def _pairwise_nonempty_packed(trees) -> torch.Tensor:
    """bool ``[T]``: the token's sequence has a token in another tree (per-tree counts, no ``T x T`` tensor)."""
    T = trees.num_tokens
    seq = trees.sequence.long()
    cu = trees.cu_seqlens.to(torch.int64)
    tree_key = cu[seq] + trees.segment.long()  # unique per (sequence, tree): segment < the sequence's length
    per_tree = torch.bincount(tree_key, minlength=T)[tree_key]
    per_sequence = (cu[1:] - cu[:-1])[seq]
    return per_sequence > per_tree


def _packed_numbering(trees) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(token_item, token_pos)`` int32 ``[T]`` of a packed batch: each token's sequence and its position in it (the
    dropout mask's numbering: a packed batch draws its padded form's masks)."""
    seq = trees.sequence.long()
    position = torch.arange(trees.num_tokens, device=seq.device, dtype=torch.int64) - trees.cu_seqlens.long()[seq]
    return seq.to(torch.int32), position.to(torch.int32)


def packed_subnetwork_attention(q, k, v, trees, masks, *, scale: Optional[float] = None, backend: str = "auto",
                                dropout_p: float = 0.0, dropout_seed: Optional[int] = None):
    """:func:`syntax_subnetwork_attention` on a :class:`~syntaxkernels.trees.PackedTreeBatch`:
    q, k ``[T, H, D]``, v ``[T, H, Dv]`` -> ``(out [T, M, H, Dv], nonempty bool [T, M])`` in ``masks.names`` order.

    Relation masks: the relation lists in packed numbering (``trees.relation_lists(masks)``, one ``[1, T]`` row;
    relations never cross sequences) through the existing edge-list kernels. Dense masks within each sequence:
    the varlen fused kernel with a fixed LUT (``full``: every key of the sequence; ``pairwise``: keys in another
    tree of it) on the Triton path; on the C++ path and for "reference", the reference sequence by sequence.

    ``dropout_p``, ``dropout_seed``: as in :func:`syntax_subnetwork_attention`, pairs numbered as in the padded
    form (item = sequence index, positions in the sequence): a packed batch draws its padded form's masks. The
    relation masks number them through the edge kernels' token tables; the dense masks run on the varlen
    distance-bias op with a table per distance value and its dropout."""
    check_packed_qkv(q, k, v, trees)
    V.check_dropout(dropout_p, dropout_seed)
    dropout_p = float(dropout_p)
    chosen = implementation(q.transpose(0, 1)[None], v.transpose(0, 1)[None], backend)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    T, H = q.shape[:2]
    if chosen == "reference" or T == 0:
        return _reference_subnetwork_packed(q, k, v, trees, masks, scale, dropout_p, dropout_seed)
    outs, flags = [], []
    R = masks.num_relations
    if R:
        numbering = _packed_numbering(trees) if dropout_p > 0.0 else None
        out, nonempty = edge_list_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                            v.transpose(0, 1)[None], trees.relation_lists(masks), scale=scale,
                                            backend="triton" if chosen == "triton" else "auto",
                                            dropout_p=dropout_p, dropout_seed=dropout_seed,
                                            dropout_numbering=numbering)
        outs.append(out[0].permute(2, 0, 1, 3))  # [T, R, H, Dv]
        flags.append(nonempty[0].transpose(0, 1))  # [T, R]
    for index, kind in enumerate(masks.dense_kinds):
        if dropout_p > 0.0:  # the varlen bias op's dropout, sub-network R + index's stream
            table = _dense_table(kind, bool(getattr(trees, "pairwise_self", False)), q)
            o = bias_attention.syntax_bias_attention(q, k, v, trees, table, buckets=LUT_BUCKETS, scale=float(scale),
                                                     backend="triton" if chosen == "triton" else "auto",
                                                     dropout_p=dropout_p,
                                                     dropout_seed=reference.stream_seed(dropout_seed, R + index))
        elif chosen == "triton":
            # The fused LUT kernel with the dense mask's LUT: full, every key of the sequence (other trees of it
            # included); pairwise, keys in another tree of the same sequence (distance 255).
            o = bias_attention.lut_attention(q, k, v, trees, _dense_lut(kind, q), scale=float(scale))
        else:
            o = _dense_by_sequence(q, k, v, trees, kind, float(scale))
        nonempty = (torch.ones(T, dtype=torch.bool, device=q.device) if kind == "full"
                    else _pairwise_nonempty_packed(trees))
        outs.append(o[:, None])
        flags.append(nonempty[:, None])
    if len(outs) == 1:
        return outs[0], flags[0]
    return torch.cat(outs, dim=1), torch.cat(flags, dim=1)


def _dense_by_sequence(q, k, v, trees, kind: str, scale: float) -> torch.Tensor:
    """One dense mask, sequence by sequence (the CPU path): ``[T, H, Dv]``."""
    outs = []
    segment = trees.segment
    for a, n, _ in sequences(trees):
        if n == 0:
            continue
        qs, ks, vs = (per_sequence(x, a, n) for x in (q, k, v))
        if kind == "full":
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, scale=scale)
        else:
            seg = segment[a:a + n]
            allowed = seg[:, None] != seg[None, :]
            rows = allowed.any(-1)
            mask = allowed | ~rows[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
            o = o * rows[None, None, :, None].to(o.dtype)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs, 0) if outs else q.new_zeros((0, q.shape[1], v.shape[-1]))


def _reference_subnetwork_packed(q, k, v, trees, masks, scale, dropout_p: float = 0.0,
                                 dropout_seed: Optional[int] = None):
    """The reference sub-network attention sequence by sequence (sequence s drops as batch item s):
    ``(out [T, M, H, Dv], nonempty [T, M])``."""
    outs, flags = [], []
    heads = trees.heads.cpu()
    for s, (a, n, _) in enumerate(sequences(trees)):
        if n == 0:
            continue
        one = TreeBatch.from_heads([heads[a:a + n].tolist()]).to(q.device)
        o, ne = reference.syntax_subnetwork_attention(per_sequence(q, a, n), per_sequence(k, a, n),
                                                      per_sequence(v, a, n), one, masks, scale=scale,
                                                      dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_item=s)
        outs.append(o[0].permute(2, 0, 1, 3))  # [n, M, H, Dv]
        flags.append(ne[0].transpose(0, 1))
    if not outs:
        M = masks.num_masks
        return q.new_zeros((0, M, q.shape[1], v.shape[-1])), torch.zeros((0, M), dtype=torch.bool, device=q.device)
    return torch.cat(outs, 0), torch.cat(flags, 0)
