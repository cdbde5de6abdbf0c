"""The Triton kernels of edge-list attention and their launchers (replayed, :mod:`.._replay`; the ``torch.library``
Triton ops ``syntaxkernels::edge_attention_fwd`` / ``_bwd`` for ``torch.compile``), over the lists' balanced schedule
(:class:`~syntaxkernels.trees.batch.EdgeSchedule`: work items of at most ``SCHEDULE_CHUNK`` edges, sorted longest
first).

- ``_edge_fwd_kernel``: one program per ``BLOCK_E`` items of one head, each a row (b, i, r) or a chunk of one; its
  main loop takes one edge per item per iteration, with an online softmax;
- ``_edge_merge_kernel``: a split row's chunks, by log-sum-exp;
- ``_edge_bwd_delta_kernel``: ``delta = rowsum(dO * O)`` of the rows with edges;
- ``_edge_bwd_dq_kernel``: items of a query token's edges over every relation;
- ``_edge_bwd_dkdv_kernel``: items of a key token's transposed edges;
- ``_edge_sum_kernel``: a split token's partial dq / dk / dv rows, in order.

No atomics, deterministic. Imported by :mod:`syntaxkernels.ops.edge_attention` only when Triton is.
"""
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import _replay
from .._primitives import LOG2E, dropout_arguments, dropout_keep_pairs, dropout_stream_seed, launch
from .configs import _next_power_of_2, edge_config

__all__ = ["edge_attention_forward", "edge_attention_backward"]


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@triton.jit
def _cols(BLOCK: tl.constexpr, TPR: tl.constexpr, VEC: tl.constexpr):
    """Column offsets ``[TPR, 1, BLOCK // (TPR * VEC), VEC]`` of a row of ``BLOCK`` elements: a row tile is
    ``[TPR, rows, chunks, VEC]``, thread piece t of a row holding its chunks ``c * TPR + t`` of ``VEC``
    elements (16 bytes). The compiler orders a load's dims by contiguity, ties by dim index: the vector, then
    the ``TPR`` threads of a row, then the rows, and each thread holds ``BLOCK // TPR`` elements of one row.
    A plain ``[rows, BLOCK]`` tile spreads a bf16 D = 64 row over 8 threads, and every per-row scalar (index
    math, the online softmax, the dot's shuffle tree) then runs 8 times."""
    mid = tl.arange(0, TPR)
    hi = tl.arange(0, BLOCK // (TPR * VEC))
    lo = tl.arange(0, VEC)
    return (mid[:, None, None, None] * VEC + hi[None, None, :, None] * (TPR * VEC)) + lo[None, None, None, :]

@triton.jit
def _bcast(x):
    """A per-row ``[E]`` vector as ``[1, E, 1, 1]``, against row tiles (:func:`_cols`)."""
    return x[None, :, None, None]

@triton.jit
def _rowsum(x):
    """``[E]`` row sums of a row tile (:func:`_cols`): in-thread over the vector and the chunks, then over the
    ``TPR`` threads of a row."""
    return tl.sum(tl.sum(tl.sum(x, axis=3), axis=2), axis=0)

@triton.jit
def _row_stat(base, index, live, other, TPR: tl.constexpr):
    """``base[index[e]]`` as ``[TPR, E, 1, 1]``, every thread of a row holding its row's value: the
    compiler lays this load out as the row tiles (:func:`_cols`), where an ``[E]`` load got a layout of its
    own and a shared-memory conversion per iteration."""
    ptrs = base + (_bcast(index) + tl.zeros([TPR, 1, 1, 1], dtype=index.dtype))
    return tl.load(ptrs, mask=_bcast(live), other=other)

@triton.jit
def _f32(tile):
    """A loaded tile as fp32; bf16 through its bits (``bits << 16``), which compiles to one instruction per
    element (a shift, or a mask of a 32-bit word's high half) instead of the extract-and-shift pair of the
    plain conversion."""
    if tile.dtype == tl.bfloat16:
        return (tile.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return tile.to(tl.float32)

@triton.jit
def _gather(base, row_off, cols, n_cols, live, EVEN: tl.constexpr):
    """fp32 row tile (:func:`_cols`) of rows ``base[row_off[e] + cols]`` (last dim contiguous); 0 where not
    ``live``."""
    ptrs = base + _bcast(row_off) + cols
    if EVEN:
        tile = tl.load(ptrs, mask=_bcast(live), other=0.0)
    else:
        tile = tl.load(ptrs, mask=_bcast(live) & (cols < n_cols), other=0.0)
    return _f32(tile)

@triton.jit
def _row_gather(base, row_base, row_off, cols, n_cols, EVEN: tl.constexpr):
    """fp32 row tile (:func:`_cols`) of rows ``base[row_base[e] + row_off[e] + cols]`` without a row mask:
    dead slots read a valid row (token 0 of their sequence) whose weight is exactly 0."""
    ptrs = base + _bcast(row_base + row_off) + cols
    if EVEN:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=cols < n_cols, other=0.0)
    return _f32(tile)

@triton.jit
def _rows_at(base, row_off, cols, n_cols, EVEN: tl.constexpr):
    """:func:`_row_gather` with the rows' offsets already ``[TPR, E, 1, 1]``."""
    ptrs = base + row_off + cols
    if EVEN:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=cols < n_cols, other=0.0)
    return _f32(tile)

@triton.jit
def _idx(index, SMALL: tl.constexpr):
    """``index`` as the offsets' integer type: int32 when ``SMALL`` (the launcher checked that every offset
    into every tensor of the call fits), else int64."""
    if SMALL:
        return index
    else:
        return index.to(tl.int64)

@triton.jit
def _offset(index, stride, SMALL: tl.constexpr):
    """``index * stride`` in the offsets' integer type (see :func:`_idx`)."""
    return _idx(index, SMALL) * stride

@triton.jit
def _items(ITEMS, I, block, BLOCK_E: tl.constexpr, F: tl.constexpr, SMALL: tl.constexpr):
    """The ``BLOCK_E`` work items of ``block`` (columns of the int32 ``[F + 3, I]`` item table, sorted longest
    first; rows ``b, i, (r,) first, count, slot``, ``F`` = 2 or 3 coordinates): ``(ok, b (int64), i (int64),
    rows F.. as first, count, slot, longest)``; ``longest`` is the block's first item's count."""
    index = block * BLOCK_E + tl.arange(0, BLOCK_E)
    ok = index < I
    b = _idx(tl.load(ITEMS + index, mask=ok, other=0), SMALL)
    i = _idx(tl.load(ITEMS + I + index, mask=ok, other=0), SMALL)
    first = tl.load(ITEMS + F * I + index, mask=ok, other=0)
    count = tl.load(ITEMS + (F + 1) * I + index, mask=ok, other=0)
    slot = tl.load(ITEMS + (F + 2) * I + index, mask=ok, other=-1)
    longest = tl.load(ITEMS + (F + 1) * I + block * BLOCK_E)
    return index, ok, b, i, first, count, slot, longest

@triton.jit
def _keep_factor(seed, threshold, keep_scale, r, b, h, i, j, H, N, TOK_ITEM, TOK_POS, NUMBERED: tl.constexpr):
    """Attention dropout's factor of the pairs (query i, key j) of relation r, item b, head h (int tensors of
    one shape, or scalars): ``keep_scale`` where relation r's mask (seed ``dropout_stream_seed(seed, r)``)
    keeps the pair, else 0. NUMBERED: the pairs' item and positions come from the int32 ``[B * N]`` tables
    ``TOK_ITEM`` / ``TOK_POS`` (a packed row: the token's sequence and its position in it), else ``(b, i, j)``."""
    full = b * 0 + i * 0 + j * 0 + r * 0  # every argument at the pairs' shape
    if NUMBERED:
        row_tok = b * N + i + full
        item = tl.load(TOK_ITEM + row_tok)
        row = tl.load(TOK_POS + row_tok)
        col = tl.load(TOK_POS + b * N + j + full)
    else:
        item = b + full
        row = i + full
        col = j + full
    keep = dropout_keep_pairs(dropout_stream_seed(seed, r + full), threshold, item * H + h, row, col)
    return tl.where(keep, keep_scale, 0.0)

@triton.jit(do_not_specialize=["seed", "threshold"])  # (one compile for every seed)
def _edge_fwd_kernel(
    Q, K, V, COL, ITEMS, OUT, LSE, PART_O, PART_L,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_or, stride_oh, stride_on,
    H, N, R, D, DV, I, qk_scale2,
    BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, SMALL: tl.constexpr, PIECES: tl.constexpr,
    TPR: tl.constexpr, VEC: tl.constexpr, RESCALE_SLACK: tl.constexpr = 8.0,
    seed=0, threshold=0, keep_scale=1.0, TOK_ITEM=None, TOK_POS=None,
    DROPOUT: tl.constexpr = False, NUMBERED: tl.constexpr = False,
):
    """Forward of ``BLOCK_E`` forward work items (:class:`~syntaxkernels.trees.batch.EdgeSchedule`) of one head.

    Args:
        Q, K: ``[B, H, N, D]``; V: ``[B, H, N, DV]`` (last dim contiguous, other strides free).
        COL: int32 ``[E]`` (the lists' keys in row order); ITEMS: int32 ``[4, I]`` (row, first edge, count,
            partial slot).
        OUT: ``[B, R, H, N, DV]`` (strided, last dim contiguous, zero-filled: empty rows stay 0); LSE: fp32
            ``[B, R, H, N]`` contiguous, +inf-filled: the base-2 logsumexp of the row's scores
            (``qk_scale2 = scale * log2(e)``). PART_O fp32 ``[P, H, DV]``, PART_L fp32 ``[P, H]``: the pieces
            of split rows (merged by ``_edge_merge_kernel``).
        seed, threshold, keep_scale, TOK_ITEM, TOK_POS, DROPOUT, NUMBERED: attention dropout (:func:`_keep_factor`:
            relation r's mask of ``dropout_stream_seed(seed, r)``); the kept pairs' weights are scaled by
            ``keep_scale`` in the sum with V, the normaliser and LSE stay the undropped ones.
    Grid: ``(cdiv(I, BLOCK_E) * H,)``, the heads of one block adjacent. Each iteration takes edge t of every
    item of the block (gather k and v rows, one dot, an online-softmax step); the items are sorted longest
    first, so the block's first item bounds the loop and few slots are empty.
    """
    pid = tl.program_id(0)
    h = _idx(pid % H, SMALL)
    block = pid // H
    index, ok, b, i, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 3, SMALL)
    r = _idx(tl.load(ITEMS + 2 * I + index, mask=ok, other=0), SMALL)
    offs_d = _cols(BLOCK_D, TPR, VEC)
    offs_dv = _cols(BLOCK_DV, TPR, VEC)
    q = _gather(Q + h * stride_qh, b * stride_qb + i * stride_qn, offs_d, D, ok, EVEN_D)
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    k_row = b * stride_kb
    v_row = b * stride_vb
    # Lazy online softmax: m_i is a reference point, not the running max. It moves (and acc, l_i are rescaled)
    # only when a score exceeds it by more than RESCALE_SLACK (a block-wide test, so the common step is one
    # FFMA per element: acc += p v); p <= 2^RESCALE_SLACK. Exact at the end: lse = m_i + log2(l_i),
    # o = acc / l_i for any reference. -1e30 rather than -inf: dead rows' p = exp2(-inf - m_i) = 0, never NaN.
    m_i = tl.full([BLOCK_E], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_E], dtype=tl.float32)
    acc = tl.zeros([TPR, BLOCK_E, BLOCK_DV // (TPR * VEC), VEC], dtype=tl.float32)
    for t in range(0, longest):
        live = t < count
        j = tl.load(COL + first + t, mask=live, other=0)
        k = _row_gather(k_base, k_row, _offset(j, stride_kn, SMALL), offs_d, D, EVEN_D)
        v = _row_gather(v_base, v_row, _offset(j, stride_vn, SMALL), offs_dv, DV, EVEN_DV)
        s = tl.where(live, _rowsum(q * k) * qk_scale2, float("-inf"))
        grow = s > m_i + RESCALE_SLACK
        if tl.max(grow.to(tl.int32), axis=0) > 0:
            m_new = tl.where(grow, s, m_i)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * _bcast(alpha)
            l_i = l_i * alpha
            m_i = m_new
        p = tl.exp2(s - m_i)
        l_i += p
        if DROPOUT:
            p = p * _keep_factor(seed, threshold, keep_scale, r, b, h, i, j, H, N, TOK_ITEM, TOK_POS, NUMBERED)
        acc += _bcast(p) * v
    denom = tl.where(ok, l_i, 1.0)
    lse = m_i + tl.log2(denom)
    o = acc * _bcast(1.0 / denom)
    # The item's coordinates again (loaded, not kept live across the loop: fp32 spilled 8 B keeping them).
    index, ok, b, i, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 3, SMALL)
    r = _idx(tl.load(ITEMS + 2 * I + index, mask=ok, other=0), SMALL)
    col_ok = offs_dv < DV
    if PIECES:  # chunks of split rows: to their partial slots (merged by _edge_merge_kernel)
        part = _idx(slot, SMALL) * H + h
        tl.store(PART_O + _bcast(part) * DV + offs_dv, o, mask=_bcast(ok) & col_ok)
        tl.store(PART_L + part, lse, mask=ok)
    else:  # whole rows: to the output
        out_off = b * stride_ob + r * stride_or + h * stride_oh + i * stride_on
        if EVEN_DV:
            tl.store(OUT + _bcast(out_off) + offs_dv, o.to(OUT.dtype.element_ty), mask=_bcast(ok))
        else:
            tl.store(OUT + _bcast(out_off) + offs_dv, o.to(OUT.dtype.element_ty),
                     mask=_bcast(ok) & col_ok)
        tl.store(LSE + ((b * R + r) * H + h) * N + i, lse, mask=ok)

@triton.jit
def _edge_merge_kernel(
    PART_O, PART_L, ROWS, PTR, OUT, LSE,
    stride_ob, stride_or, stride_oh, stride_on,
    H, N, R, DV, S,
    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """Merge the partial segments of the ``S`` split rows (``ROWS``: row ids ``(b * N + i) * R + r``, their
    slots ``PTR[k] .. PTR[k + 1]``) by log-sum-exp, in slot order, into OUT and LSE. Grid
    ``(cdiv(S, BLOCK_S) * H,)``."""
    pid = tl.program_id(0)
    h = (pid % H).to(tl.int64)
    block = pid // H
    index = block * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = index < S
    row = tl.load(ROWS + index, mask=ok, other=0).to(tl.int64)
    lo = tl.load(PTR + index, mask=ok, other=0)
    n = tl.load(PTR + index + 1, mask=ok, other=0) - lo
    offs = tl.arange(0, BLOCK_DV)
    col_ok = offs[None, :] < DV
    m_i = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([BLOCK_S, BLOCK_DV], dtype=tl.float32)
    for t in range(0, tl.max(n, axis=0)):
        live = t < n
        part = (lo + t).to(tl.int64) * H + h
        lse = tl.load(PART_L + part, mask=live, other=float("-inf"))
        o = tl.load(PART_O + part[:, None] * DV + offs[None, :], mask=live[:, None] & col_ok, other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        w = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + w[:, None] * o
        l_i = l_i * alpha + w
        m_i = m_new
    denom = tl.where(l_i > 0.0, l_i, 1.0)
    r = row % R
    i = (row // R) % N
    b = row // (R * N)
    out_off = b * stride_ob + r * stride_or + h * stride_oh + i * stride_on
    tl.store(OUT + out_off[:, None] + offs[None, :], (acc / denom[:, None]).to(OUT.dtype.element_ty),
             mask=ok[:, None] & col_ok)
    tl.store(LSE + ((b * R + r) * H + h) * N + i, m_i + tl.log2(denom), mask=ok)

@triton.jit
def _edge_sum_kernel(PART, TOKENS, PTR, OUT, H, N, D, S, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """``OUT[b, h, i] = sum of the fp32 partial rows PART[slot, h]`` (slots ``PTR[k] .. PTR[k + 1]`` of split
    token ``TOKENS[k] = b * N + i``, summed in order). OUT ``[B, H, N, D]`` contiguous. Grid
    ``(cdiv(S, BLOCK_S) * H,)``."""
    pid = tl.program_id(0)
    h = (pid % H).to(tl.int64)
    block = pid // H
    index = block * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = index < S
    token = tl.load(TOKENS + index, mask=ok, other=0).to(tl.int64)
    lo = tl.load(PTR + index, mask=ok, other=0)
    n = tl.load(PTR + index + 1, mask=ok, other=0) - lo
    offs = tl.arange(0, BLOCK_D)
    col_ok = offs[None, :] < D
    acc = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
    for t in range(0, tl.max(n, axis=0)):
        live = t < n
        part = (lo + t).to(tl.int64) * H + h
        acc += tl.load(PART + part[:, None] * D + offs[None, :], mask=live[:, None] & col_ok, other=0.0)
    b = token // N
    i = token % N
    tl.store(OUT + ((b * H + h) * N + i)[:, None] * D + offs[None, :], acc.to(OUT.dtype.element_ty),
             mask=ok[:, None] & col_ok)

@triton.jit
def _edge_bwd_delta_kernel(
    OUT, DOUT, DELTA, ITEMS,
    stride_ob, stride_or, stride_oh, stride_on,
    stride_gb, stride_gr, stride_gh, stride_gn,
    H, N, R, DV, I,
    BLOCK_E: tl.constexpr, BLOCK_DV: tl.constexpr, SMALL: tl.constexpr,
):
    """``DELTA[b, r, h, i] = sum_d dO * O`` (fp32 ``[B, R, H, N]`` contiguous) for the rows of the forward work
    items (the rows with edges: only those are read; a split row's items write the same value). Grid
    ``(cdiv(I, BLOCK_E) * H,)``."""
    pid = tl.program_id(0)
    h = _idx(pid % H, SMALL)
    block = pid // H
    index, ok, b, i, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 3, SMALL)
    r = _idx(tl.load(ITEMS + 2 * I + index, mask=ok, other=0), SMALL)
    offs = tl.arange(0, BLOCK_DV)
    mask = ok[:, None] & (offs[None, :] < DV)
    o = tl.load(OUT + (b * stride_ob + r * stride_or + h * stride_oh + i * stride_on)[:, None] + offs[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DOUT + (b * stride_gb + r * stride_gr + h * stride_gh + i * stride_gn)[:, None] + offs[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + ((b * R + r) * H + h) * N + i, tl.sum(o * do, axis=1), mask=ok)

@triton.jit(do_not_specialize=["seed", "threshold"])  # (one compile for every seed)
def _edge_bwd_dq_kernel(
    Q, K, V, DOUT, LSE, DELTA, COL, REL, ITEMS, DQ, DQ_PART,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_gb, stride_gr, stride_gh, stride_gn,
    H, N, R, D, DV, I, qk_scale2, sm_scale,
    BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, SMALL: tl.constexpr, PIECES: tl.constexpr,
    TPR: tl.constexpr, VEC: tl.constexpr,
    seed=0, threshold=0, keep_scale=1.0, TOK_ITEM=None, TOK_POS=None,
    DROPOUT: tl.constexpr = False, NUMBERED: tl.constexpr = False,
):
    """dq of ``BLOCK_E`` query-side work items of one head, summed over every relation.

    Per edge (key j, relation r from REL): gather k_j, v_j and dO of (r, i); ``p = exp2(s - lse)``,
    ``ds = p (dO . v_j - delta)``, ``dq += ds k_j``. DQ: ``[B, H, N, D]`` contiguous (zero-filled: tokens
    without edges); an item of a split token writes fp32 ``DQ_PART[slot, h]`` instead (summed by
    ``_edge_sum_kernel``). DROPOUT: the forward's mask regenerated (:func:`_keep_factor`), ``ds = p (m dO . v_j -
    delta)`` with m the pair's factor and delta the dropped output's. Grid ``(cdiv(I, BLOCK_E) * H,)``.
    """
    pid = tl.program_id(0)
    h = _idx(pid % H, SMALL)
    block = pid // H
    index, ok, b, qi, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 2, SMALL)
    has = count > 0
    offs_d = _cols(BLOCK_D, TPR, VEC)
    offs_dv = _cols(BLOCK_DV, TPR, VEC)
    q = _gather(Q + h * stride_qh, b * stride_qb + qi * stride_qn, offs_d, D, has, EVEN_D)
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    do_base = DOUT + h * stride_gh
    k_row = b * stride_kb
    v_row = b * stride_vb
    do_row = b * stride_gb + qi * stride_gn
    stat_base = b * R * H * N + h * N + qi
    dq = tl.zeros([TPR, BLOCK_E, BLOCK_D // (TPR * VEC), VEC], dtype=tl.float32)
    for t in range(0, longest):
        live = t < count
        e = first + t
        j = _row_stat(COL, e, live, 0, TPR)  # [TPR, E, 1, 1], as in _edge_bwd_dkdv_kernel
        rel = _row_stat(REL, e, live, 0, TPR)
        stat = _bcast(stat_base) + rel * (H * N)
        lse = tl.load(LSE + stat, mask=_bcast(live), other=float("inf"))
        delta = tl.load(DELTA + stat, mask=_bcast(live), other=0.0)
        k = _rows_at(k_base, _bcast(k_row) + _offset(j, stride_kn, SMALL), offs_d, D, EVEN_D)
        v = _rows_at(v_base, _bcast(v_row) + _offset(j, stride_vn, SMALL), offs_dv, DV, EVEN_DV)
        do = _rows_at(do_base, _bcast(do_row) + _offset(rel, stride_gr, SMALL), offs_dv, DV, EVEN_DV)
        p = tl.exp2(_bcast(_rowsum(q * k)) * qk_scale2 - lse)
        dp = _bcast(_rowsum(do * v))
        if DROPOUT:
            dp = dp * _keep_factor(seed, threshold, keep_scale, rel, _bcast(b), h, _bcast(qi), j, H, N, TOK_ITEM,
                                   TOK_POS, NUMBERED)
        ds = p * (dp - delta)
        dq += ds * k
    dq = dq * sm_scale
    col_ok = offs_d < D
    if PIECES:  # items of split tokens: fp32 partial rows (summed by _edge_sum_kernel)
        part = _idx(slot, SMALL) * H + h
        tl.store(DQ_PART + _bcast(part) * D + offs_d, dq, mask=_bcast(ok) & col_ok)
    else:
        tl.store(DQ + _bcast((b * H + h) * N + qi) * D + offs_d, dq.to(DQ.dtype.element_ty),
                 mask=_bcast(ok) & col_ok)

@triton.jit(do_not_specialize=["seed", "threshold"])  # (one compile for every seed)
def _edge_bwd_dkdv_kernel(
    Q, K, V, DOUT, LSE, DELTA, T_COL, T_REL, ITEMS, DK, DV_OUT, DK_PART, DV_PART,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_gb, stride_gr, stride_gh, stride_gn,
    H, N, R, D, DV, I, qk_scale2, sm_scale,
    BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, SMALL: tl.constexpr, PIECES: tl.constexpr,
    TPR: tl.constexpr, VEC: tl.constexpr,
    seed=0, threshold=0, keep_scale=1.0, TOK_ITEM=None, TOK_POS=None,
    DROPOUT: tl.constexpr = False, NUMBERED: tl.constexpr = False,
):
    """dk and dv of ``BLOCK_E`` key-side work items of one head, over the transposed lists.

    Per transposed edge (query i, relation r): gather q_i and dO of (r, i); ``p = exp2(s - lse)``,
    ``ds = p (dO . v_j - delta)``, ``dk += ds q_i``, ``dv += p dO``. DK ``[B, H, N, D]``, DV_OUT
    ``[B, H, N, DV]``, contiguous, zero-filled; items of split key tokens write fp32 ``DK_PART`` /
    ``DV_PART[slot, h]``. DROPOUT: the forward's mask regenerated (:func:`_keep_factor`), ``dv += p m dO``,
    ``ds = p (m dO . v_j - delta)``. Grid ``(cdiv(I, BLOCK_E) * H,)``.
    """
    pid = tl.program_id(0)
    h = _idx(pid % H, SMALL)
    block = pid // H
    index, ok, b, kj, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 2, SMALL)
    has = count > 0
    offs_d = _cols(BLOCK_D, TPR, VEC)
    offs_dv = _cols(BLOCK_DV, TPR, VEC)
    k = _gather(K + h * stride_kh, b * stride_kb + kj * stride_kn, offs_d, D, has, EVEN_D)
    v = _gather(V + h * stride_vh, b * stride_vb + kj * stride_vn, offs_dv, DV, has, EVEN_DV)
    q_base = Q + h * stride_qh
    do_base = DOUT + h * stride_gh
    q_row = b * stride_qb
    do_row = b * stride_gb
    stat_base = b * R * H * N + h * N
    dk = tl.zeros([TPR, BLOCK_E, BLOCK_D // (TPR * VEC), VEC], dtype=tl.float32)
    dv = tl.zeros([TPR, BLOCK_E, BLOCK_DV // (TPR * VEC), VEC], dtype=tl.float32)
    for t in range(0, longest):
        live = t < count
        e = first + t
        # Per-row values as [TPR, E, 1, 1] (_row_stat) from the item's edge on: one layout for the statistics'
        # and the rows' addresses (an [E] load of i and rel was made twice, once per layout).
        i = _row_stat(T_COL, e, live, 0, TPR)
        rel = _row_stat(T_REL, e, live, 0, TPR)
        stat = _bcast(stat_base) + rel * (H * N) + i
        lse = tl.load(LSE + stat, mask=_bcast(live), other=float("inf"))
        delta = tl.load(DELTA + stat, mask=_bcast(live), other=0.0)
        q = _rows_at(q_base, _bcast(q_row) + _offset(i, stride_qn, SMALL), offs_d, D, EVEN_D)
        do = _rows_at(do_base, _bcast(do_row) + _offset(rel, stride_gr, SMALL) + _offset(i, stride_gn, SMALL),
                      offs_dv, DV, EVEN_DV)
        p = tl.exp2(_bcast(_rowsum(q * k)) * qk_scale2 - lse)
        dp = _bcast(_rowsum(do * v))
        if DROPOUT:
            m = _keep_factor(seed, threshold, keep_scale, rel, _bcast(b), h, i, _bcast(kj), H, N, TOK_ITEM, TOK_POS,
                             NUMBERED)
            ds = p * (dp * m - delta)
            dv += (p * m) * do
        else:
            ds = p * (dp - delta)
            dv += p * do
        dk += ds * q
    dk = dk * sm_scale
    # The item's coordinates loaded again, not kept live across the loop (keeping them spilled 8 B at bf16
    # D = 64 with H = 12 on sm_90).
    index, ok, b, kj, first, count, slot, longest = _items(ITEMS, I, block, BLOCK_E, 2, SMALL)
    # Both stores, masked by the slot, in both launches (PIECES unused here: a whole-token-only epilogue
    # spilled 8 B at fp32 D = 128 on sm_80).
    out_rows = _bcast((b * H + h) * N + kj)
    direct = _bcast(ok & (slot < 0))
    split = _bcast(ok & (slot >= 0))
    part = _bcast(_idx(slot, SMALL) * H + h)
    tl.store(DK + out_rows * D + offs_d, dk.to(DK.dtype.element_ty), mask=direct & (offs_d < D))
    tl.store(DV_OUT + out_rows * DV + offs_dv, dv.to(DV_OUT.dtype.element_ty),
             mask=direct & (offs_dv < DV))
    tl.store(DK_PART + part * D + offs_d, dk, mask=split & (offs_d < D))
    tl.store(DV_PART + part * DV + offs_dv, dv, mask=split & (offs_dv < DV))

# ----------------------------------------------------------------------------------------------------
# Launchers (torch.library Triton ops)
# ----------------------------------------------------------------------------------------------------

def _tiles(q: torch.Tensor, v: torch.Tensor, *rest: torch.Tensor) -> dict:
    D, DV = q.shape[-1], v.shape[-1]
    cfg = edge_config(q.dtype, max(D, DV))
    block_d, block_dv = max(16, _next_power_of_2(D)), max(16, _next_power_of_2(DV))
    # A row's threads split both head dims: TPR * VEC <= the smaller padded one.
    tpr = max(1, min(cfg["TPR"], min(block_d, block_dv) // cfg["VEC"]))
    # Offsets in int32 when every tensor the kernels index (inputs, outputs, statistics, partials) spans
    # fewer than 2^31 elements.
    extent = max(sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1
                 for t in (q, v) + rest)
    return dict(BLOCK_E=cfg["BLOCK_E"], BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
                EVEN_DV=block_dv == DV, SMALL=extent < _INT32_LIMIT, TPR=tpr, VEC=cfg["VEC"],
                num_warps=max(1, cfg["BLOCK_E"] * tpr // 32))

def _wide_rows(tiles: dict, dtype: torch.dtype) -> dict:
    """``tiles`` with half the threads per row for half types (``edge_config``'s ``FWD_TPR`` / ``DQ_TPR``)."""
    tpr = max(1, tiles["TPR"] // 2) if dtype in (torch.float16, torch.bfloat16) else tiles["TPR"]
    return dict(tiles, TPR=tpr, num_warps=max(1, tiles["BLOCK_E"] * tpr // 32))

def _fwd_tiles(tiles: dict, dtype: torch.dtype) -> dict:
    """The forward's launch (``FWD_TPR``, ``FWD_BLOCK_E``): one warp of ``32 // TPR`` rows."""
    tiles = _wide_rows(tiles, dtype)
    return dict(tiles, BLOCK_E=max(1, 32 // tiles["TPR"]), num_warps=1)

_MERGE_BLOCK = 32
_INT32_LIMIT = 2 ** 31  # every tensor of a call spans fewer elements: int32 offsets (tests lower it)


def _offset_state():
    return _INT32_LIMIT


_replay.STATE.append(_offset_state)  # (a test's lowered limit is part of every replay key)

def _dropout(dropout_p: float, seed: int, token_item: Optional[torch.Tensor],
             token_pos: Optional[torch.Tensor]) -> dict:
    """The kernels' dropout arguments (none when ``dropout_p == 0``: the variant without dropout compiles)."""
    if dropout_p == 0.0:
        return {}
    seed, threshold, keep_scale = dropout_arguments(dropout_p, seed)
    numbered = token_item is not None
    return dict(seed=seed, threshold=threshold, keep_scale=keep_scale, TOK_ITEM=token_item if numbered else None,
                TOK_POS=token_pos if numbered else None, DROPOUT=True, NUMBERED=numbered)

def _sum_partials(part, tokens, ptr, out, H, N):
    S, width = tokens.shape[0], out.shape[-1]
    if S:
        launch(_edge_sum_kernel, (triton.cdiv(S, _MERGE_BLOCK) * H,), part, tokens, ptr, out, H, N, width, S,
               BLOCK_S=_MERGE_BLOCK, BLOCK_D=max(16, _next_power_of_2(width)), num_warps=4)

@_replay.replayed(seed=10)
def edge_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col: torch.Tensor,
                           rel: torch.Tensor, schedule: List[torch.Tensor], sizes: List[int],
                           num_relations: int, scale: float, dropout_p: float = 0.0, seed: int = 0,
                           token_item: Optional[torch.Tensor] = None,
                           token_pos: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton forward launcher: ``(out [B, R, H, N, Dv] in q's dtype, lse2 fp32 [B, R, H, N])``. Replayed
    (:mod:`.._replay`: its host work recorded once per shape class, as the layers after a model's first take it);
    :func:`_forward_op` is the ``torch.library`` op that ``torch.compile`` traces.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]`` (any strides; a non-contiguous last dim is copied).
        col, rel: int32 ``[E]`` (an :class:`EdgeLists`' edges); schedule, sizes: its
            :class:`EdgeSchedule`'s ``tensors()`` and ``sizes()``.
        num_relations: R; scale: score scale.
        dropout_p, seed: attention dropout (0: none); relation r's mask has seed ``stream_seed(seed, r)``
            (``seed``: the int64 bit pattern, :func:`~syntaxkernels.ops._primitives.seed_bits`).
        token_item, token_pos: int32 ``[B * N]`` (both or neither): the pairs' item and positions in the mask's
            numbering (a packed row), else ``(b, i, j)``.
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    R = num_relations
    f_items, merge_rows, merge_ptr, p_items = schedule[0], schedule[1], schedule[2], schedule[9]
    pieces = sizes[0]
    I = f_items.shape[1] + p_items.shape[1]
    out = torch.zeros((B, R, H, N, DV), dtype=q.dtype, device=q.device)
    lse = torch.full((B, R, H, N), float("inf"), dtype=torch.float32, device=q.device)
    if out.numel() == 0 or I == 0:
        return out, lse
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    part_o = torch.empty((max(pieces, 1), H, DV), dtype=torch.float32, device=q.device)
    part_l = torch.empty((max(pieces, 1), H), dtype=torch.float32, device=q.device)
    tiles = _fwd_tiles(_tiles(q, v, k, out, lse, part_o, part_l), q.dtype)
    for items, split in ((f_items, False), (p_items, True)):
        if items.shape[1]:
            launch(_edge_fwd_kernel, (triton.cdiv(items.shape[1], tiles["BLOCK_E"]) * H,),
                   q, k, v, col, items, out, lse, part_o, part_l,
                   q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                   out.stride(3), H, N, R, D, DV, items.shape[1], scale * LOG2E, PIECES=split, **tiles,
                   **_dropout(dropout_p, seed, token_item, token_pos))
    S = merge_rows.shape[0]
    if S:
        launch(_edge_merge_kernel, (triton.cdiv(S, _MERGE_BLOCK) * H,), part_o, part_l, merge_rows, merge_ptr,
               out, lse, out.stride(0), out.stride(1), out.stride(2), out.stride(3), H, N, R, DV, S,
               BLOCK_S=_MERGE_BLOCK, BLOCK_DV=tiles["BLOCK_DV"], num_warps=4)
    return out, lse

@_replay.replayed(seed=14)
def edge_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, col: torch.Tensor, rel: torch.Tensor,
                            t_col: torch.Tensor, t_rel: torch.Tensor, schedule: List[torch.Tensor],
                            sizes: List[int], scale: float, dropout_p: float = 0.0, seed: int = 0,
                            token_item: Optional[torch.Tensor] = None,
                            token_pos: Optional[torch.Tensor] = None
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton backward launcher: ``(dq, dk [B, H, N, D], dv [B, H, N, Dv])`` in q's dtype. Replayed as the forward
    is; :func:`_backward_op` is its ``torch.library`` op.

    Args: as :func:`edge_attention_forward`, plus ``dout`` (like out, any strides), the forward's ``out`` and
    ``lse`` and the transposed edges ``t_col``, ``t_rel`` (the forward's dropout arguments: its mask regenerated;
    delta is ``rowsum(dO * O)`` of the dropped output).
    """
    drop = _dropout(dropout_p, seed, token_item, token_pos)
    B, H, N, D = q.shape
    DV = v.shape[-1]
    R = out.shape[1]
    q_items, dq_tokens, dq_ptr, k_items, dk_tokens, dk_ptr = schedule[3:9]
    qp_items, kp_items = schedule[10], schedule[11]
    dq_slots, dk_slots = sizes[1], sizes[2]
    dq = torch.zeros((B, H, N, D), dtype=q.dtype, device=q.device)
    dk = torch.zeros((B, H, N, D), dtype=q.dtype, device=q.device)
    dv = torch.zeros((B, H, N, DV), dtype=q.dtype, device=q.device)
    I = q_items.shape[1] + qp_items.shape[1]
    if B * H * N == 0 or R == 0 or D == 0 or DV == 0 or I == 0:
        return dq, dk, dv
    q, k, v, out, dout = (_last_dim_contiguous(t) for t in (q, k, v, out, dout))
    delta = torch.empty((B, R, H, N), dtype=torch.float32, device=q.device)  # read only where rows have edges
    f32 = dict(dtype=torch.float32, device=q.device)
    dq_part = torch.empty((max(dq_slots, 1), H, D), **f32)
    dk_part = torch.empty((max(dk_slots, 1), H, D), **f32)
    dv_part = torch.empty((max(dk_slots, 1), H, DV), **f32)
    tiles = _tiles(q, v, k, out, dout, lse, delta, dq, dv, dq_part, dv_part)
    for items in (schedule[0], schedule[9]):  # the rows with edges: whole rows, then the split rows' chunks
        if items.shape[1]:
            launch(_edge_bwd_delta_kernel, (triton.cdiv(items.shape[1], 64) * H,),
                   out, dout, delta, items, out.stride(0), out.stride(1), out.stride(2), out.stride(3),
                   dout.stride(0), dout.stride(1), dout.stride(2), dout.stride(3), H, N, R, DV, items.shape[1],
                   BLOCK_E=64, BLOCK_DV=tiles["BLOCK_DV"], SMALL=tiles["SMALL"], num_warps=4)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2),
               dout.stride(3))
    for items, split in ((q_items, False), (qp_items, True)):
        if items.shape[1]:
            launch(_edge_bwd_dq_kernel, (triton.cdiv(items.shape[1], tiles["BLOCK_E"]) * H,), q, k, v, dout,
                   lse, delta, col, rel, items, dq, dq_part, *strides, H, N, R, D, DV, items.shape[1],
                   scale * LOG2E, scale, PIECES=split, **_wide_rows(tiles, q.dtype), **drop)
    _sum_partials(dq_part, dq_tokens, dq_ptr, dq, H, N)
    for items, split in ((k_items, False), (kp_items, True)):
        if items.shape[1]:
            launch(_edge_bwd_dkdv_kernel, (triton.cdiv(items.shape[1], tiles["BLOCK_E"]) * H,), q, k, v, dout,
                   lse, delta, t_col, t_rel, items, dk, dv, dk_part, dv_part, *strides, H, N, R, D, DV,
                   items.shape[1], scale * LOG2E, scale, PIECES=split, **tiles, **drop)
    _sum_partials(dk_part, dk_tokens, dk_ptr, dk, H, N)
    _sum_partials(dv_part, dk_tokens, dk_ptr, dv, H, N)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------------------
# The torch.library ops: what torch.compile traces (eager calls run the launchers above directly)
# ---------------------------------------------------------------------------------------------------------


@torch.library.triton_op("syntaxkernels::edge_attention_fwd", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col: torch.Tensor, rel: torch.Tensor,
                schedule: List[torch.Tensor], sizes: List[int], num_relations: int, scale: float,
                dropout_p: float = 0.0, seed: int = 0, token_item: Optional[torch.Tensor] = None,
                token_pos: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`edge_attention_forward` as a ``torch.library`` op."""
    return edge_attention_forward(q, k, v, col, rel, schedule, sizes, num_relations, scale, dropout_p, seed,
                                  token_item, token_pos)


@torch.library.triton_op("syntaxkernels::edge_attention_bwd", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, col: torch.Tensor, rel: torch.Tensor, t_col: torch.Tensor, t_rel: torch.Tensor,
                 schedule: List[torch.Tensor], sizes: List[int], scale: float, dropout_p: float = 0.0, seed: int = 0,
                 token_item: Optional[torch.Tensor] = None, token_pos: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`edge_attention_backward` as a ``torch.library`` op."""
    return edge_attention_backward(dout, q, k, v, out, lse, col, rel, t_col, t_rel, schedule, sizes, scale, dropout_p,
                                   seed, token_item, token_pos)
