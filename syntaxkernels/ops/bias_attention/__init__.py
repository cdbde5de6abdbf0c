"""Fused distance-bias attention: ``softmax(q k^T * scale + c * table[bucket(d)]) v``, forward and backward.

Limits: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``); fp16, bf16, fp32 inputs (fp32
accumulation; fp64 goes to the reference); head dims up to 128 (32, 64, 128 run unpadded; other sizes are
masked to the next power of two >= 32 inside the kernel); any N; q, k, v, the output gradient and the distance
are read through their strides (no copies; a distance whose rows are not 16-byte aligned is copied into padded
rows, :func:`syntaxkernels.trees.aligned_distance`). The dK/dV kernel reads the pair (i, j) at
``distance[b, j, i]`` so that its transposed tile is contiguous: the distance itself when it is known to be
symmetric (tree distances are), else a transposed copy.

How the bias reaches a score (one gather per element). Once per call, a 256-entry table per head is built
on the device: ``lut[h, d] = c * table[h, bucket(d)] * log2(e)`` for every uint8 distance d, and ``-inf`` for
``d > window``. A kernel loads the uint8 distance tile (vectorised, prefetched with K and V), gathers
``lut[h, d]`` and adds it to ``q.k * scale * log2(e)``: the softmax runs in the log2 domain. The window costs
nothing per element; padding and causality are masked only on the tiles that need it.

Interior and boundary tiles. Each kernel walks its tiles in two loops: first the interior ones, whose pairs
are all allowed by the sequence length and causality, with no mask at all; then the boundary ones (the key
block that holds the end of the sequence, the causal diagonal) with masked loads and masked scores. Query
rows past the length are zeroed in the epilogue (their log-sum-exp is ``+inf``, so their probabilities are
0 in the backward).

Where each part lives (this folder):

- ``__init__.py`` (here): the public functions :func:`syntax_bias_attention` and :func:`lut_attention`, and
  :func:`implementation`, what a call runs: the Triton kernels, the C++ kernels or the reference
  (:func:`syntaxkernels.reference.syntax_bias_attention`, the specification).
- ``configs.py``: every kernel's launch configuration, one table (:data:`.configs.CONFIGS`).
- ``_forward.py``: ``_bias_fwd_kernel`` (output rows and their log2-sum-exp for one query block, online
  softmax) and ``_bias_fwd_short_kernel`` (rows of at most 64 tokens: one tile a sequence, every head).
- ``_backward.py``: ``_bias_bwd_dq_kernel`` (``delta = rowsum(dO * O)`` and dQ for one query block; it runs first
  and owns whole rows, so it also corrects delta for the table gradient), ``_bias_bwd_dkdv_kernel`` (dK, dV for
  one key block, walking query blocks: transposed tiles, no atomics), ``_bias_bwd_table_kernel`` (the table
  gradient, one query block and every head of a shared table a program), and the short-row backward
  (``_bias_bwd_short_kernel`` / ``_bias_bwd_short_t_kernel``, ``_bias_bwd_short2_kernel`` (with
  ``_bias_bwd_short2_sum_kernel``) or ``_bias_bwd_short2_keys_kernel`` (key blocks outer: sm_90 and sm_100 at head
  dims up to 64, the small family's grouped launches there too), and ``_bias_bwd_short_table_kernel``: rows of at
  most 128 tokens with a shared table, fp16/bf16: dQ, dK, dV and each head's dS for every head of a sequence in
  one program, then the heads' dS summed and reduced per bucket once).
- ``_launch.py``: the ``torch.library`` Triton ops (launchers) and their host work; ``_autograd.py``: the
  autograd Functions over them.
- ``_cpu.py``: the C++ kernels' ops and autograd (CPU tensors); ``_varlen.py`` and ``_varlen_kernels.py``: packed
  (varlen) batches (``cu_seqlens``); ``_host.py``: what every path shares (the LUT, the kernels' arguments, the
  table gradient from the per-bucket sums, the choice of implementation); ``_relations.py``: several relations per
  score (a ``RelationBatch``: the relations' tables gathered into one table per code, then this op on the code).

Only ``configs.py``, ``_forward.py``, ``_backward.py``, ``_launch.py``, ``_autograd.py`` and ``_varlen_kernels.py``
import Triton; they are imported when Triton is (:func:`.._dispatch.triton_status`), so that without it the op
still runs the C++ kernels on CPU tensors and the reference elsewhere.

Table gradient. With ``G[t] = sum of dS over the pairs in bucket t``, ``d table = c * G`` and
``d c = sum_t table[t] * G[t]``: one per-bucket reduction serves both. A table shared by the heads has one
bucket pattern for every head, so the table kernel recomputes each head's dS for a tile (two tensor-core
products), sums the heads' dS in registers and reduces the sum per bucket once: device metadata gives every
tile's bucket set; a tile wholly in one bucket (every tile between two packed sentences, most tiles far from
the diagonal of a long tree) adds its row sums there, a tile spanning several buckets sums dS for each bucket
it holds (a compare, a select and an add per element and bucket, into one ``[BLOCK_M]`` accumulator per
bucket), and that cost is shared by the H heads. A query block's most frequent one-bucket tiles are not
walked at all: every row of dS sums to zero, so their bucket gets minus everything walked. Per-head tables take
one head per program. Each program writes its ``[T]`` sums once; a fixed-order sum reduces them. No atomics:
every gradient is bit-identical run to run (``deterministic=True`` costs nothing).

Block skipping: with ``window`` set, :mod:`syntaxkernels.ops.block_meta` finds each tile's distance range
on the device and the kernels walk compacted lists of live tiles (interior first).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import _validation as V
from ... import reference
from ...plan import StructurePlan, as_plan
from ...specs import BucketSpec, RelativePositionSpec
from .._dispatch import triton_status, triton_unsupported
from . import _cpu, _relations
from ._host import LUT_BUCKETS, implementation, kernel_arguments, position_route, warn_once
from ._varlen import syntax_bias_attention_varlen

if triton_status() == "ok":  # the kernels and launchers (without Triton: the C++ kernels and the reference)
    from .. import _primitives
    from . import _autograd, _varlen_kernels
else:
    _primitives = _autograd = _varlen_kernels = None

__all__ = ["syntax_bias_attention", "lut_attention", "implementation"]



def _check_head_dim(q: torch.Tensor, v: torch.Tensor) -> None:
    why = triton_unsupported(q, v)
    if why is not None:
        raise ValueError(why)


def lut_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance, lut: torch.Tensor,
                  lengths=None, scale: Optional[float] = None, *, symmetric: Optional[bool] = None,
                  cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fused attention with a fixed bias per distance value: ``softmax(q k^T * scale + lut[d_ij]) v``.

    For masks expressible by distance (the sub-network op's ``full`` and ``pairwise`` masks, windows): no
    table gradient, gradients for q, k, v only. Triton only (CUDA tensors, or CPU under the interpreter); without
    Triton it raises RuntimeError saying why.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``.
        distance: the batch's :class:`~syntaxkernels.plan.StructurePlan` (a :class:`~syntaxkernels.TreeBatch` or
            :class:`~syntaxkernels.PackedTreeBatch`), or a uint8 ``[B, N, N]`` distance (a plan made for the call).
        lut: float ``[256]`` or ``[H, 256]``: the natural-log bias of each distance value; ``-inf`` = pair not
            allowed.
        lengths: ``int [B]`` or a boolean key-padding mask (with a distance tensor; a plan has its own);
            scale: default ``1 / sqrt(D)``.
        symmetric: as in :func:`syntax_bias_attention`.
        cu_seqlens: a packed batch given as tensors: q, k, v ``[T, H, D]`` and a packed distance; attention stays
            within each sequence (``lengths`` and ``symmetric`` do not apply).
    Returns:
        ``[B, H, N, Dv]`` (packed: ``[T, H, Dv]``) in q's dtype; rows with no allowed key (and rows past the
        length) are 0.
    """
    if _autograd is None:
        raise RuntimeError(f"lut_attention runs on the Triton kernels only: {triton_status()}")
    plan = as_plan(distance, lengths, symmetric=symmetric, cu_seqlens=cu_seqlens,
                   num_tokens=q.shape[0] if cu_seqlens is not None else None)
    if not plan.is_packed:  # (a packed batch: the sub-network op's packed path checked it)
        V.check_qkv(q, k, v)
        V.check_distance(plan.distance, q)
    _check_head_dim(q, v)
    if lut.shape[-1] != 256 or lut.dim() not in (1, 2) or (lut.dim() == 2 and lut.shape[0] != q.shape[1]):
        raise ValueError(f"lut must have shape [256] or [H, 256], got {tuple(lut.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    lut = lut.to(torch.float32).reshape(-1, 256).contiguous()  # (natural log: the kernels scale it to log2)
    try:
        if plan.is_packed:
            return _varlen_kernels._VarlenLut.apply(q, k, v, plan.distance, lut, plan.cu_seqlens, plan.sequence,
                                                    plan.distance_offsets, float(scale))
        return _autograd.lut_attention(q, k, v, lut, plan, float(scale))
    except _primitives.KernelDoesNotFit as error:  # the reference: a table of one bucket per distance value
        warn_once(f"lut_attention runs the reference on this GPU: {error}")
        table = lut[0] if lut.shape[0] == 1 else lut
        if plan.is_packed:
            return syntax_bias_attention_varlen(q, k, v, plan, table, buckets=LUT_BUCKETS, scale=scale,
                                                backend="reference")
        return reference.syntax_bias_attention(q, k, v, plan.distance, table, buckets=LUT_BUCKETS, scale=scale,
                                               lengths=plan.kernel_lengths)


def _check_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic, position_window,
                  position_buckets, position_table) -> None:
    """:func:`syntax_bias_attention`'s shape, dtype, device and type checks (no tensor value is read:
    :func:`syntaxkernels._validation.check_once` runs them once per shape class)."""
    V.check_position_window(position_window)
    V.check_position_bias(position_buckets, position_table, q)
    V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic)


def syntax_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance, table: torch.Tensor, *,
                          buckets: BucketSpec, scale: Optional[float] = None, bias_scale=None, lengths=None,
                          window: Optional[int] = None, causal: bool = False, deterministic: bool = False,
                          backend: str = "auto", symmetric: Optional[bool] = None,
                          cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                          dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
                          position_window: Optional[int] = None,
                          position_buckets: Optional[RelativePositionSpec] = None,
                          position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention with a learnable tree-distance bias, fused (Triton) or by the reference.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)] (+ position_table[h, pbucket(j - i)])`` over the allowed
    pairs, ``o_i = softmax(s_i) v``.

    The structure comes as the batch's :class:`~syntaxkernels.plan.StructurePlan`: pass the
    :class:`~syntaxkernels.TreeBatch` (or :class:`~syntaxkernels.PackedTreeBatch`) itself to every layer, and what the
    kernels derive from it (tile lists, bucket sets, ...) is computed once for all of them. A bare distance tensor
    (with ``lengths`` or ``cu_seqlens``) works too: a plan is then made for the call, and derived again by the next.

    Packed batches (a :class:`~syntaxkernels.PackedTreeBatch`, or ``cu_seqlens`` int32 ``[S + 1]`` with a packed
    distance uint8 ``[sum n_s^2]``): q, k, v are ``[T, H, D]`` (flash-attention's varlen layout) and attention stays
    within each sequence; ``lengths`` and ``symmetric`` do not apply. See :func:`._varlen.syntax_bias_attention_varlen`.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device. Grouped-query attention: k and v
            may have ``H_kv`` heads with ``H % H_kv == 0`` (query head h reads key/value head ``h // (H / H_kv)``;
            their gradients are summed over the group in a fixed order, no copy of K/V per query head). The output (and on the Triton path
            the gradients) take q's (k's, v's) memory layout: ``[B, N, H, D]`` views of the projections, as ``nn`` and
            transformers split heads, give outputs whose heads merge back without a copy.
        distance: the plan (a TreeBatch / PackedTreeBatch), or ``uint8 [B, N, N]`` (255 = unreachable); any uint8
            distance, symmetric or not (see ``symmetric``). Rows whose start and stride are multiples of 16 bytes (a
            TreeBatch's) are read in place; others are copied into such rows first (B x N x roundup(N, 16) bytes per
            call).
        table: ``[T]`` shared or ``[H, T]`` per head, ``T = buckets.num_buckets``; gets a gradient.
        buckets: :class:`syntaxkernels.BucketSpec`.
        scale: default ``1 / sqrt(D)``.
        bias_scale: the strength c: None (1), a float, or a one-element tensor (gets a gradient).
        lengths: ``int [B]`` or a boolean key-padding mask ``[B, N]`` (True = padding); a plan has its own (given
            here, they replace them for this call). With a tree distance the package built (a :class:`TreeBatch`'s,
            as the batch or as its ``distance``) they must equal the trees' lengths (None: every item N tokens): a
            ``ValueError`` naming the batch item on CPU tensors, a device-side assertion on a GPU, once per plan
            (:func:`syntaxkernels._validation.check_lengths_match_distance`).
        window: allow only ``d_ij <= window`` (0..254); tiles without such a pair are skipped.
        causal: allow only ``j <= i``.
        position_window: allow only ``|i - j| <= position_window`` (a sliding window over positions, as ModernBERT's
            local layers and Mistral attend; combined with ``window``, ``causal`` and the lengths); tiles outside it
            are skipped. Every path takes it (Triton, C++, padded and packed); in a packed batch positions count
            within each sequence.
        position_buckets, position_table: T5's relative-position term (both or neither): a
            :class:`~syntaxkernels.RelativePositionSpec` and a float table ``[H, P]`` (P = its ``num_buckets``; T5's
            ``relative_attention_bias.weight.T``). Adds ``position_table[h, pbucket(j - i)]`` to every score, computed
            from the indices (no ``[N, N]`` tensor); not multiplied by ``bias_scale``; gets a gradient. In a packed
            batch positions count within each sequence. T5 divides no score by sqrt(d): pass ``scale=1.0``. Every
            kernel path takes it (``_host.POSITION_PATHS``: the C++ CPU kernels and the Triton kernels, padded and
            packed; its gradient included); only calls that run the reference anyway (float64, head dims the
            kernels do not take) add it there.
        deterministic: bit-identical gradients run to run (the Triton path always is: no atomics).
        symmetric: whether ``distance[b, i, j] == distance[b, j, i]``. None (default): a plan knows (a TreeBatch's
            distance is a tree distance: symmetric), and so does a tree distance the package built given as a tensor
            (a TreeBatch's ``distance``, :func:`tree_distance`'s result); another tensor is taken as not symmetric.
            The Triton backward
            reads the transposed distance; when it is not known to be symmetric, from a transposed copy (one more
            B x N x N bytes, derived once per plan), so a directed distance gets exact gradients. Passing True for a
            distance that is not symmetric gives wrong dK, dV and table gradients there.
        backend: "auto" (Triton on CUDA tensors, the C++ kernels of :mod:`._cpu` on CPU tensors, with or without
            Triton; inputs the kernels do not take, float64 or head dims above 128 on CUDA, run the reference),
            "triton" (raises ValueError for such inputs, RuntimeError where Triton cannot run) or "reference".
            :func:`implementation` says which runs.
        dropout_p: attention dropout on the probabilities (``p_ij`` zeroed with probability ``dropout_p``, the
            kept ones scaled by ``1 / (1 - dropout_p)``; the softmax's normaliser is the undropped one). The mask is
            a function of ``dropout_seed`` and (item, head, query, key) only
            (:func:`syntaxkernels.reference.dropout_keep`, Philox-4x32-7): every backend draws the same one, the
            backward regenerates it, and a packed batch draws its padded form's mask. 0 (default) compiles it out.
        dropout_seed: an int in ``[0, 2^64)``, needed when ``dropout_p > 0`` (the modules draw one per call from
            torch's generator, so ``torch.manual_seed`` makes training reproducible).
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; query rows past the length and rows with no allowed key are 0.

    Equivalent PyTorch::

        bias = table[..., buckets.lut()[distance.long()]] * c           # [B, 1 or H, N, N]
        s = (q @ k.transpose(-1, -2)) * scale + bias
        allowed = allowed_pairs(distance, lengths, window, causal, position_window)[:, None]
        p = s.masked_fill(~allowed, -inf).softmax(-1)       # NaN in a row with a NaN or +inf allowed score
        p = torch.where(dropout_keep(seed, dropout_p, B, H, N, N), p / (1 - dropout_p), 0)  # dropout_p > 0
        out = p.masked_fill(~allowed.any(-1, keepdim=True), 0) @ v    # a row with no allowed key: 0
    """
    if _relations.is_relations(distance, buckets):  # several relations: their code and one summed table per code
        return _relations.relation_bias_attention(
            syntax_bias_attention, q, k, v, distance, table, buckets=buckets, scale=scale, bias_scale=bias_scale,
            lengths=lengths, window=window, symmetric=symmetric, cu_seqlens=cu_seqlens, backend=backend,
            causal=causal, deterministic=deterministic, dropout_p=dropout_p, dropout_seed=dropout_seed,
            position_window=position_window, position_buckets=position_buckets, position_table=position_table)
    if cu_seqlens is not None or (isinstance(distance, StructurePlan) and distance.is_packed):
        if lengths is not None:  # packed (varlen) batches: their own kernels
            raise ValueError("lengths does not apply to a packed batch (cu_seqlens gives the sequences)")
        return syntax_bias_attention_varlen(q, k, v, distance, table, buckets=buckets, cu_seqlens=cu_seqlens,
                                            max_seqlen=max_seqlen, scale=scale, bias_scale=bias_scale, window=window,
                                            causal=causal, deterministic=deterministic, backend=backend,
                                            dropout_p=dropout_p, dropout_seed=dropout_seed,
                                            position_window=position_window, position_buckets=position_buckets,
                                            position_table=position_table)
    V.check_dropout(dropout_p, dropout_seed)
    V.check_once(_check_inputs, q, k, v, distance.distance if isinstance(distance, StructurePlan) else distance,
                 table, buckets, bias_scale, window, causal, deterministic, position_window, position_buckets,
                 position_table)  # (a layer after the first with the same shapes: checked once)
    plan = as_plan(distance, lengths, symmetric=symmetric)
    chosen = position_route(implementation(q, v, backend), position_buckets, backend)
    if chosen == "cpp":  # the fused C++ kernels
        return _cpu.cpu_bias_attention(q, k, v, plan, table, buckets=buckets, scale=scale, bias_scale=bias_scale,
                                       window=window, causal=causal, dropout_p=dropout_p, dropout_seed=dropout_seed,
                                       position_window=position_window, position_buckets=position_buckets,
                                       position_table=position_table)
    if chosen == "reference":
        return reference.syntax_bias_attention(q, k, v, plan.distance, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=plan.kernel_lengths, window=window,
                                               causal=causal, dropout_p=dropout_p, dropout_seed=dropout_seed,
                                               position_window=position_window, position_buckets=position_buckets,
                                               position_table=position_table)
    scale, bias_scale = kernel_arguments(q, scale, bias_scale)
    try:
        return _autograd.bias_attention(q, k, v, table, bias_scale, plan, scale=scale,
                                        window=-1 if window is None else int(window), causal=bool(causal),
                                        buckets=buckets, fallback=backend == "auto", dropout_p=float(dropout_p),
                                        dropout_seed=dropout_seed,
                                        position_window=-1 if position_window is None else int(position_window),
                                        position_buckets=position_buckets, position_table=position_table)
    except _primitives.KernelDoesNotFit as error:
        if backend != "auto":
            raise
        warn_once(f"syntax_bias_attention runs the reference on this GPU: {error}")
        return reference.syntax_bias_attention(q, k, v, plan.distance, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=plan.kernel_lengths, window=window,
                                               causal=causal, dropout_p=dropout_p, dropout_seed=dropout_seed,
                                               position_window=position_window, position_buckets=position_buckets,
                                               position_table=position_table)
