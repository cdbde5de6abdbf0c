"""The distance-bias op on packed (varlen) batches: the public function (what ``syntax_bias_attention(...,
cu_seqlens=...)`` runs), its argument checks, the C++ path and the reference; none of it needs Triton.

``out[t] = softmax_j(q_t . k_j * scale + c * table[bucket(d(t, j))]) v`` over the keys j of t's own sequence, with
q, k, v ``[T, H, D]`` (flash-attention's varlen layout), ``cu_seqlens int32 [S + 1]`` and the packed distance
``uint8 [sum n_s^2]`` of a :class:`~syntaxkernels.trees.PackedTreeBatch` (sequence s's ``n_s x n_s`` block at
``sum_{r < s} n_r^2``, row stride ``n_s``). :func:`implementation <._host.implementation>` picks the path: the
Triton kernels (:mod:`._varlen_kernels`, tiles shared by sequences: no padding, nothing of size ``T^2``) on CUDA,
the C++ kernels of the padded op on the sequences laid out ``[S, H, max n, D]`` inside the op on CPU, else the
reference sequence by sequence (:func:`reference_bias_attention_varlen`, the specification).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ... import _validation as V
from ... import reference
from ...specs import BucketSpec
from ...plan import as_plan
from .._dispatch import triton_status
from . import _cpu
from ._host import bucket_args, implementation, kernel_arguments, position_route, warn_once

if triton_status() == "ok":  # the kernels and launchers (without Triton: the C++ kernels and the reference)
    from . import _varlen_kernels
else:
    _varlen_kernels = None

__all__ = ["syntax_bias_attention_varlen", "reference_bias_attention_varlen", "walked_tiles"]



def _check_packed_qkv(q, k, v):
    """q, k, v ``[T, H, D]``, ``[T, H_kv, D]``, ``[T, H_kv, Dv]`` of one float dtype (``H % H_kv == 0``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"packed {name} must be a tensor [T, H, D] (flash-attention's varlen layout), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    grouped = k.shape[1] != q.shape[1] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    if (q.shape[0], q.shape[2]) != (k.shape[0], k.shape[2]) or v.shape[:2] != k.shape[:2] or (
            k.shape[1] != q.shape[1] and not grouped):
        raise ValueError(f"packed q, k, v must be [T, H, D], [T, H_kv, D], [T, H_kv, Dv] (H_kv = H, or a divisor of "
                         f"H: grouped-query attention); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_varlen(q, k, v, plan, table, buckets, window):
    """The packed call's checks: q, k, v ``[T, H, D]`` of the plan's T tokens on its device, the table, the window
    (the plan's own structure was checked when it was made)."""
    if not isinstance(buckets, BucketSpec):
        raise TypeError(f"buckets must be a BucketSpec, got {type(buckets).__name__}")
    if not (q.device == k.device == v.device == plan.distance.device == plan.cu_seqlens.device):
        raise ValueError("q, k, v, distance and cu_seqlens must be on one device")
    if plan.sequence.shape[0] != q.shape[0]:
        raise ValueError(f"cu_seqlens must end at T = {q.shape[0]} (the packed q's tokens); the batch has "
                         f"{plan.sequence.shape[0]} tokens")
    H = q.shape[1]
    T_b = buckets.num_buckets
    if table.shape not in ((T_b,), (H, T_b)):
        raise ValueError(f"table must have shape [{T_b}] or [{H}, {T_b}], got {tuple(table.shape)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 254):
        raise ValueError(f"window must be None or an int in 0..254, got {window!r}")


def reference_bias_attention_varlen(q, k, v, distance, table, *, buckets, cu_seqlens, scale=None, bias_scale=None,
                                    window=None, causal=False, dropout_p: float = 0.0,
                                    dropout_seed: Optional[int] = None, position_window: Optional[int] = None,
                                    position_buckets=None, position_table=None):
    """The specification: :func:`syntaxkernels.reference.syntax_bias_attention` run sequence by sequence
    (``[1, H, n, D]`` each, its ``n x n`` distance block), outputs concatenated back to ``[T, H, Dv]``. Rows of an
    empty sequence do not exist; gradients flow through autograd. Dropout: sequence s draws the mask of batch
    item s (:func:`syntaxkernels.reference.dropout_keep`), as the padded batch of the same sequences would. A
    positional window counts positions within each sequence (``|i - j| <= position_window``, i and j the tokens'
    positions in it), and so does T5's relative-position term (``position_buckets``, ``position_table``)."""
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
                                            bias_scale=bias_scale, window=window, causal=causal,
                                            dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_item=s,
                                            position_window=position_window, position_buckets=position_buckets,
                                            position_table=position_table)
        outs.append(o[0].transpose(0, 1))
    if not outs:
        zero = 0 * v.sum() + (0 * position_table.sum() if position_table is not None else 0)
        return q.new_zeros((0, q.shape[1], v.shape[-1])) + zero
    return torch.cat(outs, 0)


def _cpu_layout(plan):
    """``(sequence [T], position [T], lengths int32 [S], padded distance uint8 [S, N, N])`` of a packed CPU batch
    (N its longest sequence): the C++ CPU kernels' layout, derived once per batch."""
    from ...plan import DistancePlan
    from ...trees.batch import aligned_distance

    def compute():
        distance, cu_seqlens = plan.distance, plan.cu_seqlens
        cu = cu_seqlens.to(torch.int64)
        lengths = cu[1:] - cu[:-1]
        S = lengths.shape[0]
        N = int(lengths.max()) if S else 0
        sequence = plan.sequence.long()
        position = torch.arange(sequence.shape[0]) - cu[sequence]
        padded = torch.full((S, N, N), 255, dtype=torch.uint8)
        offsets = plan.distance_offsets.tolist()
        for s_, n in enumerate(lengths.tolist()):
            if n:
                padded[s_, :n, :n] = distance[offsets[s_]:offsets[s_] + n * n].view(n, n)
        lengths32 = lengths.to(torch.int32)
        return sequence, position, lengths32, DistancePlan(aligned_distance(padded), symmetric=plan.symmetric,
                                                           kernel_lengths=lengths32)
    return plan.derived(("cpu layout",), compute)


def _cpu_bias_attention_varlen(q, k, v, plan, table, buckets, scale, bias_scale, window, causal, dropout_p=0.0,
                               dropout_seed=None, position_window=None, position_buckets=None, position_table=None):
    """The CPU path of ``backend="auto"``: the existing fused C++ CPU op on the sequences laid out ``[S, H, N, D]``
    inside the op (N the longest sequence: only the attention sees padding, never the packed row's other layers),
    the output gathered back to ``[T, H, Dv]``; gradients through the same gather/scatter. A positional window is
    the padded op's, and so is T5's relative-position term (each sequence starts at position 0 of its row)."""
    sequence, position, lengths, padded = _cpu_layout(plan)
    S, N = padded.distance.shape[:2]

    def lay_out(x):
        y = x.new_zeros((S, N) + tuple(x.shape[1:]))
        y = y.index_put((sequence, position), x)
        return y.transpose(1, 2)  # [S, H, N, D]

    out = _cpu.cpu_bias_attention(lay_out(q), lay_out(k), lay_out(v), padded, table, buckets=buckets, scale=scale,
                                  bias_scale=bias_scale, window=window, causal=causal, dropout_p=dropout_p,
                                  dropout_seed=dropout_seed, position_window=position_window,
                                  position_buckets=position_buckets, position_table=position_table)
    return out.transpose(1, 2)[sequence, position]


def syntax_bias_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance,
                                 table: torch.Tensor, *, buckets: BucketSpec, cu_seqlens: Optional[torch.Tensor] = None,
                                 max_seqlen: Optional[int] = None, scale: Optional[float] = None, bias_scale=None,
                                 window: Optional[int] = None, causal: bool = False, deterministic: bool = False,
                                 backend: str = "auto", dropout_p: float = 0.0,
                                 dropout_seed: Optional[int] = None,
                                 position_window: Optional[int] = None, position_buckets=None,
                                 position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Distance-bias attention on a packed batch (what ``syntax_bias_attention(..., cu_seqlens=...)`` runs).

    Args:
        q, k: ``[T, H, D]``; v: ``[T, H, Dv]`` (flash-attention's varlen layout; strided is fine); k, v may have
            ``H_kv`` heads, ``H % H_kv == 0`` (grouped-query attention).
        distance: the :class:`~syntaxkernels.trees.PackedTreeBatch` (the batch's plan), or with ``cu_seqlens`` a
            packed distance uint8 ``[sum n_s^2]`` (a plan made for the call).
        table: ``[T_b]`` or ``[H, T_b]``; buckets: :class:`BucketSpec`; scale, bias_scale, window, causal: as in
            :func:`syntaxkernels.syntax_bias_attention` (causal: ``j <= i`` within each sequence).
        cu_seqlens: int32 ``[S + 1]``, with a distance tensor (a plan has its own); max_seqlen: accepted for
            flash-attention compatibility, not needed (the kernels find each block's sequences on the device).
        deterministic: accepted; the Triton path is always deterministic (no atomics).
        backend: "auto" (Triton on CUDA tensors; on CPU tensors the fused C++ CPU kernels of
            :mod:`._cpu`, run on the sequences laid out ``[S, H, max n, D]`` inside the op; float64
            and head dims above 128 on CUDA: the reference), "triton" (CUDA, or CPU under TRITON_INTERPRET=1) or
            "reference" (the reference, sequence by sequence).
        dropout_p, dropout_seed: attention dropout on the probabilities, as in
            :func:`syntaxkernels.syntax_bias_attention`; sequence s draws the mask of batch item s (the padded
            batch of the same sequences drops the same pairs).
        position_window: allow only ``|i - j| <= position_window`` with i and j the positions within the sequence
            (the padded batch of the same sequences allows the same pairs); the Triton kernels skip the key (query)
            tiles outside every row's (key's) window.
        position_buckets, position_table: T5's relative-position term, as in
            :func:`syntaxkernels.syntax_bias_attention`, positions counted within each sequence.
    Returns:
        ``[T, H, Dv]`` in q's dtype; a row without an allowed key is 0. Attention never crosses sequences.

    Equivalent PyTorch (sequence by sequence, :func:`reference_bias_attention_varlen`)::

        out = torch.cat([syntaxkernels.reference.syntax_bias_attention(
                  q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None],
                  distance[offset_s:offset_s + n * n].view(1, n, n), table, buckets=buckets, ...)[0].transpose(0, 1)
              for each sequence s = [a, b) of n = b - a tokens])
    """
    _check_packed_qkv(q, k, v)
    plan = as_plan(distance, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                   num_tokens=q.shape[0] if cu_seqlens is not None else None)
    if not plan.is_packed:
        raise ValueError("a packed call needs a packed plan (PackedTreeBatch) or cu_seqlens")
    _check_varlen(q, k, v, plan, table, buckets, window)
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'reference', got {backend!r}")
    V.check_dropout(dropout_p, dropout_seed)
    V.check_position_window(position_window)
    V.check_position_bias(position_buckets, position_table, q)
    chosen = position_route(implementation(q, v, backend), position_buckets, backend, packed=True)
    if chosen == "cpp" and q.shape[0] > 0:  # the fused C++ kernels
        return _cpu_bias_attention_varlen(q, k, v, plan, table, buckets, scale, bias_scale, window, causal,
                                          dropout_p, dropout_seed, position_window, position_buckets, position_table)
    if chosen != "triton":
        return reference_bias_attention_varlen(q, k, v, plan.distance, table, buckets=buckets,
                                               cu_seqlens=plan.cu_seqlens, scale=scale, bias_scale=bias_scale,
                                               window=window, causal=causal, dropout_p=dropout_p,
                                               dropout_seed=dropout_seed, position_window=position_window,
                                               position_buckets=position_buckets, position_table=position_table)
    fused_scale, fused_strength = kernel_arguments(q, scale, bias_scale)
    try:
        return _varlen_kernels._VarlenBiasAttention.apply(
            q, k, v, table, fused_strength, plan.distance, plan.cu_seqlens, plan.sequence, plan.distance_offsets,
            position_table,
            (float(fused_scale), -1 if window is None else int(window), bool(causal), bucket_args(buckets),
             backend == "auto", float(dropout_p), dropout_seed,
             # (a window past T tokens is none: kept in int32 range)
             -1 if position_window is None else min(int(position_window), q.shape[0]), position_buckets))
    except _varlen_kernels.KernelDoesNotFit as error:
        if backend != "auto":
            raise
        warn_once(f"syntax_bias_attention runs the reference on this GPU: {error}")
        return reference_bias_attention_varlen(q, k, v, plan.distance, table, buckets=buckets,
                                               cu_seqlens=plan.cu_seqlens, scale=scale, bias_scale=bias_scale,
                                               window=window, causal=causal, dropout_p=dropout_p,
                                               dropout_seed=dropout_seed, position_window=position_window,
                                               position_buckets=position_buckets, position_table=position_table)


def walked_tiles(lengths, block: int, step: int) -> Tuple[int, int]:
    """``(programs, tiles walked)`` over a packed batch of sequences of ``lengths`` (host ints), as the kernels
    walk it: one program per ``block`` consecutive tokens, each walking the ``step``-wide tiles of the span of its
    sequences (the forward and dQ: ``block = BLOCK_M, step = BLOCK_N``; dK/dV: ``block = BLOCK_N, step =
    BLOCK_M``). Not causal. A model of the loop bounds above, for the inspection report (keep it in step)."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    T = cu[-1]
    if T == 0:
        return 0, 0
    import bisect

    def sequence_of(t):  # the sequence holding token t (empty sequences hold none)
        return bisect.bisect_right(cu, t) - 1

    programs = -(-T // block)
    walked = 0
    for p in range(programs):
        first, last = p * block, min(p * block + block, T) - 1
        span = cu[sequence_of(last) + 1] - cu[sequence_of(first)]
        walked += -(-span // step)
    return programs, walked
