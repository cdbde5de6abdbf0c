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

Kernels (one file, top to bottom: kernels -> launchers -> autograd -> public functions):

- ``_bias_fwd_kernel``: output rows and their log2-sum-exp for one query block (online softmax).
- ``_bias_bwd_dq_kernel``: ``delta = rowsum(dO * O)`` and dQ for one query block (it runs first and owns whole
  rows, so it also corrects delta for the table gradient: see the kernel).
- ``_bias_bwd_dkdv_kernel``: dK, dV for one key block, walking query blocks (transposed tiles, no atomics).
- ``_bias_bwd_table_kernel``: the table gradient, one query block and every head of a shared table a program.
- ``_bias_bwd_short_kernel`` and ``_bias_bwd_short_table_kernel``: the backward of rows of at most 64 tokens
  (one tile a sequence, a shared table, fp16/bf16): dQ, dK, dV and each head's dS for every head of a sequence in
  one program, then the heads' dS summed and reduced per bucket once.

Table gradient. With ``G[t] = sum of dS over the pairs in bucket t``, ``d table = c * G`` and
``d c = sum_t table[t] * G[t]``: one per-bucket reduction serves both. A table shared by the heads has one
bucket pattern for every head, so the table kernel recomputes each head's dS for a tile (two tensor-core
products), sums the heads' dS in registers and reduces the sum per bucket once: device metadata gives every
tile's bucket set; a tile wholly in one bucket (every tile between two packed sentences, most tiles far from
the diagonal of a long tree) adds its row sums there, a tile spanning several buckets sums dS for each bucket
it holds (a compare, a select and an add per element and bucket, into one ``[BLOCK_M]`` accumulator per
bucket), and that cost is shared by the H heads. A query block's most frequent one-bucket tiles are not
walked at all: every row of dS sums to zero, so their bucket gets minus everything walked. Per-head tables take
one head per program. Each program writes its ``[T]`` sums once; a fixed-order sum reduces them. No atomics: every gradient is bit-identical run
to run (``deterministic=True`` costs nothing).

Block skipping: with ``window`` set, :mod:`syntaxkernels.ops.block_meta` finds each tile's distance range
on the device and the kernels walk compacted lists of live tiles (interior first).
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import _validation as V
from .. import reference
from ..specs import BucketSpec
from ._dispatch import device_constant, kernels_or_reference, resolve_backend, triton_unsupported
from ._primitives import (LOG2E, arch_family, bucket_from_distance, current_arch, distance_tile, dot_precision,
                          head_block, in_bucket, interpreting, KernelDoesNotFit, launch, launch_grid, load_rows,
                          lut_bias, mma, mma_acc, opaque_int32, per_batch, program_ids)
from .block_meta import block_bucket_masks, block_distance_range, boundary_tiles, live_blocks, split_lists
from ..trees.batch import aligned_distance, known_symmetric

__all__ = ["syntax_bias_attention", "lut_attention", "bias_attention_forward", "bias_attention_backward",
           "select_config", "bias_lut", "bucket_args"]



# ---------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _allowed(offs_m, offs_n, length, CAUSAL: tl.constexpr):
    """bool ``[M, N]``: query i may attend key j by length and causality (the window lives in the LUT)."""
    ok = (offs_m[:, None] < length) & (offs_n[None, :] < length)
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None])
    return ok


@triton.jit
def _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn, stride_kd,
                 stride_di, stride_dj, qk_scale2, EVEN_D: tl.constexpr, EVEN_N: tl.constexpr, MASK: tl.constexpr,
                 SYNTAX: tl.constexpr, DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False,
                 INTERPRETED: tl.constexpr = False):
    """``(scores, k)`` of one query-row tile: the log2-domain ``q k^T * scale * log2(e) + lut[d]`` (the distance
    tile and its bias are read first, the key tile after) and the key tile, for the forward and the dQ kernel."""
    if SYNTAX:
        dist = distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, N, MASK, EVEN_N)
        bias = lut_bias(lut_row, dist, OPAQUE_BIAS, INTERPRETED)
    k = load_rows(k_base, offs_n, offs_d, stride_kn, stride_kd, length, D, MASK, EVEN_D)
    scores = mma(q, tl.trans(k), DOT_PRECISION) * qk_scale2
    if SYNTAX:
        scores += bias
    return scores, k


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, k_base, v_base, dist_base, lut_row, k_block, offs_m, offs_d, offs_dv, length, N,
              D, DV, stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr,
              MASK: tl.constexpr, CAUSAL: tl.constexpr, SYNTAX: tl.constexpr, DOT_PRECISION: tl.constexpr,
              OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False):
    """One key tile of the forward's online softmax (log2 domain)."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    scores, k = _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn,
                             stride_kd, stride_di, stride_dj, qk_scale2, EVEN_D, EVEN_N, MASK, SYNTAX, DOT_PRECISION,
                             OPAQUE_BIAS, INTERPRETED)
    if MASK:
        scores = tl.where(_allowed(offs_m, offs_n, length, CAUSAL), scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    if SYNTAX or MASK:  # a row may have seen only -inf so far
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    alpha = tl.exp2(m_i - m_new_safe)
    p = tl.exp2(scores - m_new_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_rows(v_base, offs_n, offs_dv, stride_vn, stride_vd, length, DV, MASK, EVEN_DV)
    acc = mma_acc(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _key_block_range(KV_LIST, KV_COUNT, b, q_block, length, num_q_blocks, num_k_blocks,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_LISTS: tl.constexpr, CAUSAL: tl.constexpr):
    """The key blocks one query block visits, ``(list_base, interior, total)``: the i-th is
    ``_key_block(list_base, i, USE_LISTS)``; blocks ``[0, interior)`` need no mask, ``[interior, total)`` hold the
    sequence end or the causal diagonal. With USE_LISTS they are the device-built live blocks (interior first),
    else every block up to the length (and the diagonal)."""
    if USE_LISTS:
        row = b * num_q_blocks + q_block
        list_base = KV_LIST + row * num_k_blocks
        interior = tl.load(KV_COUNT + 2 * row)
        total = tl.load(KV_COUNT + 2 * row + 1)
    else:
        list_base = KV_LIST
        total = tl.cdiv(length, BLOCK_N)
        interior = length // BLOCK_N
        if CAUSAL:
            total = tl.minimum(total, tl.cdiv((q_block + 1) * BLOCK_M, BLOCK_N))
            interior = tl.minimum(interior, (q_block * BLOCK_M + 1) // BLOCK_N)
        total = tl.where(q_block * BLOCK_M < length, total, 0)
        interior = tl.minimum(interior, total)
    return list_base, interior, total


@triton.jit
def _key_block(list_base, i, USE_LISTS: tl.constexpr):
    """The i-th key block of :func:`_key_block_range`."""
    k_block = i
    if USE_LISTS:
        k_block = tl.load(list_base + i)
    return k_block


@triton.jit
def _bias_fwd_kernel(
    Q, K, V, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    H, N, N_OUT, D, DV, num_q_blocks, num_k_blocks, qk_scale2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
):
    """Forward: output rows and their log2-sum-exp for one query block of one (batch, head).

    Args:
        Q, K: ``[B, H, N_OUT, D]``; V, OUT: ``[B, H, N_OUT, DV]`` (strided, one dtype).
        N, N_OUT: the padded extent (``roundup(N_OUT, 16)``: the rows and columns of DIST's buffer and of the
            LSE rows, which reads are bounded by, so that masks and addresses stay 16-aligned) and the sequence
            extent (the rows of q, k, v and the outputs, which stores are bounded by).
        DIST: uint8 ``[B, N_OUT, N_OUT]`` in an ``[B, N, N]`` buffer (:func:`aligned_distance`).
        LUT: fp32 ``[H or 1, 256]`` (row stride ``stride_lh``, 0 when shared):
            the log2-domain bias of every distance value, ``-inf`` for pairs outside the window.
        LENGTHS: int32 ``[B]``.
        KV_LIST, KV_COUNT: int32 ``[B, nQ, nK]`` live key blocks (interior first) and ``[B, nQ, 2]``
            (interior count, live count); read when USE_LISTS.
        LSE: fp32 ``[B, H, N]`` with rows ``stride_row`` apart (N rounded up to 16: aligned row loads), log2
            domain; ``+inf`` for rows past the length or with no allowed key.
        qk_scale2: ``scale * log2(e)``.
        SYNTAX: False compiles out the distance tile and the bias (a plain flash kernel with the same tiles,
            for the inspection report only).
    Grid: ``(nQ * B * H,)``.
    """
    q_block, bh, b, h = program_ids(num_q_blocks, H)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_rows(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qn, stride_qd, length, D, True, EVEN_D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dist_base = DIST + b * stride_db
    lut_row = LUT + h * stride_lh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    list_base, interior, total = _key_block_range(KV_LIST, KV_COUNT, b, q_block, length, num_q_blocks,
                                                  num_k_blocks, BLOCK_M, BLOCK_N, USE_LISTS, CAUSAL)
    for i in range(0, interior):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, dist_base, lut_row,
                                  _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                  BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, False, CAUSAL, SYNTAX, DOT_PRECISION,
                                  OPAQUE_BIAS, INTERPRETED)
    for i in range(interior, total):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, dist_base, lut_row,
                                  _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                  BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, True, CAUSAL, SYNTAX, DOT_PRECISION,
                                  OPAQUE_BIAS, INTERPRETED)

    # Epilogue: normalise; rows past the length or without an allowed key are 0 with lse = +inf.
    valid = (offs_m < length) & (l_i > 0.0)
    denom = tl.where(valid, l_i, 1.0)
    out = tl.where(valid[:, None], acc / denom[:, None], 0.0)
    lse = tl.where(valid, m_i + tl.log2(denom), float("inf"))
    o_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_dv[None, :] < DV))
    tl.store(LSE + bh.to(tl.int64) * stride_row + offs_m, lse, mask=offs_m < N)


@triton.jit
def _bias_fwd_short_kernel(
    Q, K, V, DIST, LUT, LENGTHS, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj, stride_row,
    N, N_OUT, D, DV, qk_scale2, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False,
    INTERPRETED: tl.constexpr = False,
):
    """The forward of short rows (``N <= BLOCK_M = BLOCK_N``: a whole sequence is one tile) with a LUT shared by
    the heads: the output rows and their log2-sum-exp for one batch item and every head.

    The distance tile and its bias are read once and serve all ``HEADS`` heads. The tile holds whole rows, so
    each head's softmax is exact in one pass (the row maximum, then one exp2 per element and the row sum; no
    running rescale): ``out = (P V) / l``, ``lse = m + log2(l)``; rows past the length or without an allowed key
    are 0 with ``lse = +inf``, as in :func:`_bias_fwd_kernel`. Products over head-dim chunks (CHUNK for
    ``q k^T``, OUT_CHUNK for ``P V``).

    Args: as :func:`_bias_fwd_kernel` (LUT: one row; no live-tile lists). Grid: ``(B,)``.
    """
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    bias = tl.where(_allowed(offs_m, offs_n, length, CAUSAL), lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED),
                    float("-inf"))
    for h in range(0, HEADS):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + h * stride_kh
        for c in tl.static_range(0, BLOCK_D, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if c == 0:
                scores = mma(q, tl.trans(k), DOT_PRECISION)
            else:
                scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
        scores = scores * qk_scale2 + bias
        m = tl.max(scores, 1)
        m = tl.where(m == float("-inf"), 0.0, m)  # a row without an allowed key: P = 0
        p = tl.exp2(scores - m[:, None])
        l = tl.sum(p, 1)
        valid = (offs_m < length) & (l > 0.0)
        denom = tl.where(valid, l, 1.0)
        tl.store(LSE + (b * HEADS + h) * stride_row + offs_m, tl.where(valid, m + tl.log2(denom), float("inf")),
                 mask=offs_m < N)
        p_in = p.to(Q.dtype.element_ty)
        scale_rows = tl.where(valid, 1.0 / denom, 0.0)
        for c in tl.static_range(0, BLOCK_DV, OUT_CHUNK):
            offs_c = c + tl.arange(0, OUT_CHUNK)
            v = load_rows(V + b * stride_vb + h * stride_vh, offs_n, offs_c, stride_vn, stride_vd, length, DV, True,
                          EVEN_DV)
            out = mma(p_in, v, DOT_PRECISION) * scale_rows[:, None]
            tl.store(OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_c[None, :] * stride_od,
                     out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < DV))


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row, q_block,
               offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn, stride_gd, stride_di,
               stride_dj, qk_scale2, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
               EVEN_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, SYNTAX: tl.constexpr,
               DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False):
    """One query tile of the dK/dV backward in transposed orientation (keys are rows)."""
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    if SYNTAX:
        # The pair (query i, key j) at distance[b, j, i]: the launcher passes a transposed copy unless the
        # distance is symmetric (tree distances are), so this tile is contiguous along the queries.
        dist_t = distance_tile(dist_base, offs_n, offs_m, stride_di, stride_dj, N, MASK, EVEN_N)
        bias_t = lut_bias(lut_row, dist_t, OPAQUE_BIAS, INTERPRETED)
    q = load_rows(q_base, offs_m, offs_d, stride_qn, stride_qd, length, D, MASK, EVEN_D)
    if MASK:
        lse = tl.load(lse_base + offs_m, mask=offs_m < N, other=float("inf"))
    else:
        lse = tl.load(lse_base + offs_m)
    scores_t = mma(k, tl.trans(q), DOT_PRECISION) * qk_scale2
    if SYNTAX:
        scores_t += bias_t
    # Query rows past the length have zero q (masked load) and lse = +inf, so their P is exactly 0 without a
    # mask; only causality needs one.
    exponent_t = scores_t - lse[None, :]
    if MASK and CAUSAL:  # masked before exp2: an excluded pair's exponent may be large
        exponent_t = tl.where(offs_n[:, None] <= offs_m[None, :], exponent_t, float("-inf"))
    p_t = tl.exp2(exponent_t)
    do = load_rows(do_base, offs_m, offs_dv, stride_gn, stride_gd, length, DV, MASK, EVEN_DV)
    dv = mma_acc(p_t.to(do.dtype), do, dv, DOT_PRECISION)
    if MASK:
        delta = tl.load(delta_base + offs_m, mask=offs_m < N, other=0.0)
    else:
        delta = tl.load(delta_base + offs_m)
    dp_t = mma(v, tl.trans(do), DOT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = mma_acc(ds_t.to(q.dtype), q, dk, DOT_PRECISION)
    return dk, dv


@triton.jit
def _bias_bwd_dkdv_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, Q_LIST, Q_COUNT, LSE, DELTA, DK, DV_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    H, N, N_OUT, D, DV, num_q_blocks, num_k_blocks, scale, qk_scale2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, SYNTAX: tl.constexpr = True,
    OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
):
    """Backward for one key block: ``dk`` and ``dv``, recomputing P from the saved log2-sum-exp (the table
    gradient is :func:`_bias_bwd_table_kernel`'s).

    Args:
        Q, K: ``[B, H, N, D]``; V, DOUT: ``[B, H, N, DV]`` (strided); DK, DV_OUT: like K, V (strides
            ``stride_x*``, ``stride_y*``).
        DIST: the distance read as ``[b, j, i]`` (the distance itself when symmetric, else its transpose).
        Q_LIST, Q_COUNT: int32 ``[B, nK, nQ]`` live query blocks of each key block (interior first) and
            ``[B, nK, 2]`` (read when USE_LISTS).
        LSE, DELTA: fp32 ``[B, H, N]`` (rows ``stride_row`` apart).
        N, N_OUT and the others as in the forward.
    Grid: ``(nK * B * H,)``; one program owns BLOCK_N keys and walks the query blocks that see them.
    """
    k_block, bh, b, h = program_ids(num_k_blocks, H)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_rows(K + b * stride_kb + h * stride_kh, offs_n, offs_d, stride_kn, stride_kd, length, D, True, EVEN_D)
    v = load_rows(V + b * stride_vb + h * stride_vh, offs_n, offs_dv, stride_vn, stride_vd, length, DV, True,
                  EVEN_DV)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DOUT + b * stride_gb + h * stride_gh
    lse_base = LSE + bh.to(tl.int64) * stride_row
    delta_base = DELTA + bh.to(tl.int64) * stride_row
    dist_base = DIST + b * stride_db
    lut_row = LUT + h * stride_lh

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if USE_LISTS:
        row = b * num_k_blocks + k_block
        list_base = Q_LIST + row * num_q_blocks
        interior = tl.load(Q_COUNT + 2 * row)
        total = tl.load(Q_COUNT + 2 * row + 1)
        for i in range(0, interior):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row,
                                tl.load(list_base + i), offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn,
                                stride_qd, stride_gn, stride_gd, stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D,
                                EVEN_DV, EVEN_N, False, CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED)
        for i in range(interior, total):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row,
                                tl.load(list_base + i), offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn,
                                stride_qd, stride_gn, stride_gd, stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D,
                                EVEN_DV, EVEN_N, True, CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED)
    else:
        # Query blocks [first, total): masked where they cross the causal diagonal ([first, diagonal_end)) or
        # run past the length ([tail, total)); the ones in between are interior.
        first = 0
        diagonal_end = 0
        if CAUSAL:
            first = (k_block * BLOCK_N) // BLOCK_M
            diagonal_end = tl.cdiv((k_block + 1) * BLOCK_N - 1, BLOCK_M)
        total = tl.where(k_block * BLOCK_N < length, tl.cdiv(length, BLOCK_M), 0)
        diagonal_end = tl.minimum(diagonal_end, total)
        full = tl.minimum(length // BLOCK_M, total)  # a key block wholly past the length walks nothing
        tail = tl.maximum(diagonal_end, full)
        for q_block in range(diagonal_end, full):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row, q_block,
                                offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn,
                                stride_gd, stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D, EVEN_DV, EVEN_N, False,
                                CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED)
        num_diagonal = tl.maximum(diagonal_end - first, 0)
        for i in range(0, num_diagonal + tl.maximum(total - tail, 0)):
            q_block = tl.where(i < num_diagonal, first + i, tail + i - num_diagonal)
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row, q_block,
                                offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn,
                                stride_gd, stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D, EVEN_DV, EVEN_N, True,
                                CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED)

    # Epilogue: dK carries the score scale; keys past the length get 0.
    key_ok = offs_n < length
    dk = tl.where(key_ok[:, None], dk * scale, 0.0)
    dv = tl.where(key_ok[:, None], dv, 0.0)
    dk_ptrs = DK + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd
    dv_ptrs = DV_OUT + b * stride_yb + h * stride_yh + offs_n[:, None] * stride_yn + offs_dv[None, :] * stride_yd
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=(offs_n[:, None] < N_OUT) & (offs_d[None, :] < D))
    tl.store(dv_ptrs, dv.to(DV_OUT.dtype.element_ty), mask=(offs_n[:, None] < N_OUT) & (offs_dv[None, :] < DV))


@triton.jit
def _bucket_sums(sums, ds, dist, present, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
                 MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
                 LAST_DISTANCE_BUCKET: tl.constexpr, BUCKETS_PAD: tl.constexpr, INTERPRETED: tl.constexpr):
    """Add one tile of dS (summed over the program's heads) to the per-bucket, per-row sums.

    Tables of up to 31 buckets (``STATIC_BUCKETS``): ``present`` is the bit set of the buckets of the tile's
    allowed pairs (device metadata) and ``sums`` one ``[BLOCK_M]`` accumulator per bucket (a tuple indexed at
    compile time). A tile wholly in one bucket adds its row sums of dS there (one add per element); a tile
    holding several sums dS for each (a compare, a select and an add per element and bucket); a tile without
    an allowed pair costs nothing. The cost is per tile, not per head: the heads' dS were summed first.

    Larger tables: ``sums`` is ``[BLOCK_M, BUCKETS_PAD]`` and ``present = lowest + 256 * highest``; the tile
    walks the buckets of that range (a loop whose length is the data's).
    """
    if STATIC_BUCKETS:
        if (present & (present - 1)) == 0:  # one bucket (or none: nothing to add)
            if present != 0:
                rows = tl.sum(ds, 1)
                for t in tl.static_range(NUM_BUCKETS):
                    if present == (1 << t):
                        sums = sums[:t] + (sums[t] + rows,) + sums[t + 1:]
        else:
            dist32 = opaque_int32(dist.to(tl.int32), ds, INTERPRETED)  # widened once, in dS's layout
            for t in tl.static_range(NUM_BUCKETS):
                if ((present >> t) & 1) != 0:
                    sel = in_bucket(dist32, t, LOG_DISTANCE, UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET)
                    sums = sums[:t] + (sums[t] + tl.sum(tl.where(sel, ds, 0.0), 1),) + sums[t + 1:]
    else:
        bucket = bucket_from_distance(dist.to(tl.int32), MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET)
        columns = tl.arange(0, BUCKETS_PAD)
        for t in range(present & 255, (present >> 8) + 1):
            part = tl.sum(tl.where(bucket == t, ds, 0.0), 1)
            sums += tl.where(columns[None, :] == t, part[:, None], 0.0)
    return sums


@triton.jit
def _bucket_accumulators(BLOCK_M: tl.constexpr, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
                         BUCKETS_PAD: tl.constexpr):
    """Zeroed per-row, per-bucket sums for :func:`_bucket_sums`: a tuple of ``[BLOCK_M]`` (``STATIC_BUCKETS``)
    or ``[BLOCK_M, BUCKETS_PAD]``."""
    if STATIC_BUCKETS:
        sums = (tl.zeros([BLOCK_M], dtype=tl.float32),) * NUM_BUCKETS
    else:
        sums = tl.zeros([BLOCK_M, BUCKETS_PAD], dtype=tl.float32)
    return sums


@triton.jit
def _bucket_totals(sums, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr):
    """``[BUCKETS_PAD]``: the per-row sums of :func:`_bucket_sums` added over the rows (bucket t at index t)."""
    if STATIC_BUCKETS:
        bucket_ids = tl.arange(0, BUCKETS_PAD)
        totals = tl.zeros([BUCKETS_PAD], dtype=tl.float32)
        for t in tl.static_range(NUM_BUCKETS):
            totals += tl.where(bucket_ids == t, tl.sum(sums[t], 0), 0.0)
    else:
        totals = tl.sum(sums, 0)
    return totals


@triton.jit
def _table_tile(sums, Q, K, V, DOUT, LSE, DELTA, dist_base, lut_row, present, b, h0, k_block, offs_m, length, N, H, HEADS, D, DV, stride_qb, stride_qh, stride_qn, stride_qd, stride_kb,
                stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, stride_gb, stride_gh,
                stride_gn, stride_gd, stride_di, stride_dj, stride_row, qk_scale2, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr,
                EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr,
                MASK: tl.constexpr, CAUSAL: tl.constexpr, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
                MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
                LAST_DISTANCE_BUCKET: tl.constexpr, BUCKETS_PAD: tl.constexpr, INTERPRETED: tl.constexpr,
                DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False):
    """One tile of the table gradient: dS recomputed for each of the program's ``HEADS`` heads and summed over
    them, then added to the per-bucket sums once (:func:`_bucket_sums`)."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    dist = distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, N, MASK, EVEN_N)
    bias = lut_bias(lut_row, dist, OPAQUE_BIAS, INTERPRETED)  # the LUT row is the same for every head
    if MASK:
        allowed = _allowed(offs_m, offs_n, length, CAUSAL)
    ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for j in range(0, HEADS):
        h = h0 + j
        row = (b * H + h) * stride_row
        # The products run over head-dim chunks of at most 64 (two at D = 128): fewer operand registers live.
        scores = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(0, BLOCK_D, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            q = load_rows(Q + b * stride_qb + h * stride_qh, offs_m, offs_c, stride_qn, stride_qd, length, D, True,
                          EVEN_D)
            k = load_rows(K + b * stride_kb + h * stride_kh, offs_n, offs_c, stride_kn, stride_kd, length, D, MASK,
                          EVEN_D)
            scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
        # Rows past the length: zero q and lse = +inf, so P is exactly 0 there without a mask.
        lse = tl.load(LSE + row + offs_m, mask=offs_m < length, other=float("inf"))
        exponent = scores * qk_scale2 + bias - lse[:, None]
        if MASK:  # masked before exp2: an excluded pair's exponent may be large
            exponent = tl.where(allowed, exponent, float("-inf"))
        p = tl.exp2(exponent)
        dp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(0, BLOCK_DV, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            do = load_rows(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_c, stride_gn, stride_gd, length, DV,
                           True, EVEN_DV)
            v = load_rows(V + b * stride_vb + h * stride_vh, offs_n, offs_c, stride_vn, stride_vd, length, DV, MASK,
                          EVEN_DV)
            dp = mma_acc(do, tl.trans(v), dp, DOT_PRECISION)
        delta = tl.load(DELTA + row + offs_m, mask=offs_m < length, other=0.0)
        ds += p * (dp - delta[:, None])
    return _bucket_sums(sums, ds, dist, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE,
                        UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED)


@triton.jit
def _bias_bwd_table_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, TILE_BUCKETS, SKIP_BUCKET, LSE, DELTA, BUCKET_PARTIALS,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    H, N, D, DV, num_q_blocks, num_k_blocks, qk_scale2, HEADS,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    LAST_DISTANCE_BUCKET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr,
    CAUSAL: tl.constexpr, INTERPRETED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    OPAQUE_BIAS: tl.constexpr = False,
):
    """The table gradient: per bucket, the sum of dS over one query block's pairs and ``HEADS`` heads.

    A table shared by all heads (the default) has one bucket pattern for every head, so each program takes
    all ``H`` heads of its query block (``HEADS = H``): per tile it recomputes dS for each head (two
    tensor-core products, like the dQ kernel's first two), sums the heads' dS in registers and pays the
    per-bucket reduction once, so that reduction's cost per score element is divided by the head count. A
    per-head table takes one head per program (``HEADS = 1``, each head its own LUT row).

    Args:
        Q, K, V, DOUT, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT: as in the dQ kernel (key lists at this
            kernel's tiling).
        TILE_BUCKETS: int32 ``[B, nQ, nK]``: per tile the bit set of its allowed pairs' buckets, or with more
            than 31 buckets ``lowest + 256 * highest`` (see :func:`_bucket_sums`).
        SKIP_BUCKET: int32 ``[B, nQ]``: per query block the bucket whose one-bucket tiles are skipped (the most
            frequent; -1: none). Every row of dS sums to zero (the corrected delta), so what the skipped tiles
            hold is minus the sum of everything walked: it is added to that bucket in the epilogue, and the far
            tiles of a long tree or between packed sentences cost one compare each.
        LSE: fp32 ``[B, H, N]``; DELTA: the dQ kernel's corrected delta (every row of dS then sums to zero, so
            the bucket sums are exact up to fp32 rounding); both rows ``stride_row`` apart.
        BUCKET_PARTIALS: fp32 ``[B * G * nQ, NUM_BUCKETS]`` (``G = H / HEADS`` head groups): each program's
            sums, written once and reduced in a fixed order by the launcher.
    Grid: ``(nQ * B * G,)``.
    """
    q_block, bg, b, g = program_ids(num_q_blocks, H // HEADS)
    h0 = g * HEADS
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dist_base = DIST + b * stride_db
    lut_row = LUT + h0 * stride_lh
    bucket_row = TILE_BUCKETS + (b * num_q_blocks + q_block) * num_k_blocks
    skip = tl.load(SKIP_BUCKET + b * num_q_blocks + q_block)
    skip_set = tl.where(skip >= 0, 1 << tl.maximum(skip, 0), -1)  # the bit set of a skipped tile (-1: none)
    sums = _bucket_accumulators(BLOCK_M, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    list_base, interior, total = _key_block_range(KV_LIST, KV_COUNT, b, q_block, length, num_q_blocks,
                                                  num_k_blocks, BLOCK_M, BLOCK_N, USE_LISTS, CAUSAL)
    for i in range(0, interior):
        k_block = _key_block(list_base, i, USE_LISTS)
        present = tl.load(bucket_row + k_block)
        if present != skip_set:
            sums = _table_tile(sums, Q, K, V, DOUT, LSE, DELTA, dist_base, lut_row, present, b,
                               h0, k_block, offs_m, length, N, H, HEADS, D, DV, stride_qb, stride_qh,
                               stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd, stride_vb,
                               stride_vh, stride_vn, stride_vd, stride_gb, stride_gh, stride_gn, stride_gd,
                               stride_di, stride_dj, stride_row, qk_scale2, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
                               CHUNK, EVEN_D, EVEN_DV, EVEN_N, False, CAUSAL,
                               NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET,
                               LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED, DOT_PRECISION, OPAQUE_BIAS)
    for i in range(interior, total):
        k_block = _key_block(list_base, i, USE_LISTS)
        present = tl.load(bucket_row + k_block)
        if present != skip_set:
            sums = _table_tile(sums, Q, K, V, DOUT, LSE, DELTA, dist_base, lut_row, present, b,
                               h0, k_block, offs_m, length, N, H, HEADS, D, DV, stride_qb, stride_qh,
                               stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd, stride_vb,
                               stride_vh, stride_vn, stride_vd, stride_gb, stride_gh, stride_gn, stride_gd,
                               stride_di, stride_dj, stride_row, qk_scale2, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
                               CHUNK, EVEN_D, EVEN_DV, EVEN_N, True, CAUSAL,
                               NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET,
                               LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED, DOT_PRECISION, OPAQUE_BIAS)

    # Epilogue: rows past the length hold zero dS; one row of partial sums per program.
    bucket_ids = tl.arange(0, BUCKETS_PAD)
    totals = _bucket_totals(sums, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    # The skipped tiles' share: minus everything walked (the rows of dS sum to zero).
    totals += tl.where(bucket_ids == skip, -tl.sum(totals, 0), 0.0)
    program = bg.to(tl.int64) * num_q_blocks + q_block
    tl.store(BUCKET_PARTIALS + program * NUM_BUCKETS + bucket_ids, totals, mask=bucket_ids < NUM_BUCKETS)


@triton.jit
def _bias_bwd_short_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, LSE, DQ, DK, DV_OUT, DS_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    N, N_OUT, D, DV, scale, qk_scale2, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr = False,
    OPAQUE_BIAS: tl.constexpr = False,
):
    """The backward of short rows (``N <= BLOCK_M = BLOCK_N``: a whole sequence is one tile) with a LUT shared
    by the heads: dQ, dK, dV and each head's dS for one batch item and every head, in one pass.

    The distance tile and its bias are read once and serve all ``HEADS`` heads. Per head: the scores and dP
    (two tensor-core products), ``delta`` as the row sums of ``P * dP`` (exact: the tile holds whole rows, so
    each row of dS sums to zero up to fp32 rounding; the output is not read), dS, and three products stored at
    once, each complete because the tile holds every query and every key: ``dV^T = dO^T P``, ``dQ = dS K``,
    ``dK^T = Q^T dS`` (five products a head, the fewest a backward can do). With TABLE_GRAD each head's dS
    (carrying the score scale) goes to ``DS_OUT`` for :func:`_bias_bwd_short_table_kernel`: summed here in
    registers it would spill. Each pair is read at ``distance[b, i, j]`` only: a directed distance is exact.

    Args:
        Q, K: ``[B, H, N, D]``; V, DOUT: ``[B, H, N, DV]`` (strided). DIST: uint8 ``[B, N, N]``; LUT: fp32
            ``[256]`` (:func:`bias_lut`, one row); LSE: fp32 ``[B, H, N]`` (rows ``stride_row`` apart).
        DQ, DK, DV_OUT: like Q, K, V (strides ``stride_x*``, ``stride_y*``, ``stride_z*``).
        DS_OUT: fp32 ``[B, H, BLOCK_M, BLOCK_N]`` (contiguous), written with TABLE_GRAD.
    Grid: ``(B,)``.
    """
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    # Once for every head: the bias, -inf where the length or causality excludes the pair.
    bias = tl.where(_allowed(offs_m, offs_n, length, CAUSAL), lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED),
                    float("-inf"))
    ds_ptrs = DS_OUT + b * HEADS * (BLOCK_M * BLOCK_N) + offs_m[:, None] * BLOCK_N + offs_n[None, :]
    for h in range(0, HEADS):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        do_base = DOUT + b * stride_gb + h * stride_gh
        # The products run over head-dim chunks of CHUNK columns; with one chunk the q and k tiles are read
        # once for both of their products.
        for c in tl.static_range(0, BLOCK_D, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if c == 0:
                scores = mma(q, tl.trans(k), DOT_PRECISION)
            else:
                scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
        # Rows past the length: zero q and lse = +inf, so P is exactly 0 there.
        lse = tl.load(LSE + (b * HEADS + h) * stride_row + offs_m, mask=offs_m < length, other=float("inf"))
        p = tl.exp2(scores * qk_scale2 + bias - lse[:, None])
        # dV^T = dO^T P first (P is then needed in fp32 only), then dP, dS, dQ = dS K and dK^T = Q^T dS: dS and
        # P are the second operand of the transposed products (no transposed copy of either). Those run over
        # OUT_CHUNK head-dim columns (their M: 64 keeps them on the warp-group instructions).
        p_in = p.to(Q.dtype.element_ty)
        if OUT_CHUNK != CHUNK:
            for c in tl.static_range(0, BLOCK_DV, OUT_CHUNK):
                offs_c = c + tl.arange(0, OUT_CHUNK)
                do = load_rows(do_base, offs_m, offs_c, stride_gn, stride_gd, length, DV, True, EVEN_DV)
                dv = mma(tl.trans(do), p_in, DOT_PRECISION)
                tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[None, :] * stride_zn
                         + offs_c[:, None] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                         mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < DV))
        for c in tl.static_range(0, BLOCK_DV, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            do = load_rows(do_base, offs_m, offs_c, stride_gn, stride_gd, length, DV, True, EVEN_DV)
            if OUT_CHUNK == CHUNK:
                dv = mma(tl.trans(do), p_in, DOT_PRECISION)
                tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[None, :] * stride_zn
                         + offs_c[:, None] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                         mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < DV))
            v = load_rows(v_base, offs_n, offs_c, stride_vn, stride_vd, length, DV, True, EVEN_DV)
            if c == 0:
                dp = mma(do, tl.trans(v), DOT_PRECISION)
            else:
                dp = mma_acc(do, tl.trans(v), dp, DOT_PRECISION)
        # dS with the score scale folded in (a row constant): scale * P * (dP - delta) in two operations.
        delta = tl.sum(p * dp, 1) * scale
        ds = p * (dp * scale - delta[:, None])
        if TABLE_GRAD:
            tl.store(ds_ptrs + h * (BLOCK_M * BLOCK_N), ds)
        ds_in = ds.to(Q.dtype.element_ty)
        for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
            offs_c = c + tl.arange(0, OUT_CHUNK)
            if OUT_CHUNK < BLOCK_D:
                k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if DQ_T:  # dQ^T = K^T dS^T: dS only ever a second operand (fewer registers at D = 128 on sm_90)
                dq = mma(tl.trans(k), tl.trans(ds_in), DOT_PRECISION)
                tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[None, :] * stride_xn
                         + offs_c[:, None] * stride_xd, dq.to(DQ.dtype.element_ty),
                         mask=(offs_m[None, :] < N_OUT) & (offs_c[:, None] < D))
            else:
                dq = mma(ds_in, k, DOT_PRECISION)
                tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn
                         + offs_c[None, :] * stride_xd, dq.to(DQ.dtype.element_ty),
                         mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < D))
            if OUT_CHUNK < BLOCK_D:
                q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            dk = mma(tl.trans(q), ds_in, DOT_PRECISION)
            tl.store(DK + b * stride_yb + h * stride_yh + offs_n[None, :] * stride_yn + offs_c[:, None] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < D))


@triton.jit
def _bias_bwd_short_t_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, LSE, DQ, DK, DV_OUT, DS_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    N, N_OUT, D, DV, scale, qk_scale2, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr = False,
    OPAQUE_BIAS: tl.constexpr = False,
):
    """:func:`_bias_bwd_short_kernel` with keys-major tiles (for mma.sync GPUs): the program forms
    ``S^T = K Q^T``, so that P^T and dS^T, accumulators, are the first operand of ``dV = P^T dO`` and
    ``dK = dS^T Q`` as they are (no layout change); only dQ needs dS transposed. Each head's dS goes to
    ``DS_OUT`` queries-major, as the other kernel's (``[B, H, BLOCK_M, BLOCK_N]``). Grid: ``(B,)``."""
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)  # queries: the columns
    offs_n = tl.arange(0, BLOCK_N)  # keys: the rows
    # dist^T[j, i] = distance[b, i, j] (read once for every head)
    dist_t = distance_tile(DIST + b * stride_db, offs_n, offs_m, stride_dj, stride_di, N, True, EVEN_N)
    allowed_t = (offs_n[:, None] < length) & (offs_m[None, :] < length)
    if CAUSAL:
        allowed_t = allowed_t & (offs_n[:, None] <= offs_m[None, :])
    bias_t = tl.where(allowed_t, lut_bias(LUT, dist_t, OPAQUE_BIAS, INTERPRETED), float("-inf"))
    ds_ptrs = DS_OUT + b * HEADS * (BLOCK_M * BLOCK_N) + offs_m[None, :] * BLOCK_N + offs_n[:, None]  # [q, k]
    for h in range(0, HEADS):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        do_base = DOUT + b * stride_gb + h * stride_gh
        for c in tl.static_range(0, BLOCK_D, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if c == 0:
                scores_t = mma(k, tl.trans(q), DOT_PRECISION)
            else:
                scores_t = mma_acc(k, tl.trans(q), scores_t, DOT_PRECISION)
        lse = tl.load(LSE + (b * HEADS + h) * stride_row + offs_m, mask=offs_m < length, other=float("inf"))
        p_t = tl.exp2(scores_t * qk_scale2 + bias_t - lse[None, :])
        p_in = p_t.to(Q.dtype.element_ty)
        for c in tl.static_range(0, BLOCK_DV, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            do = load_rows(do_base, offs_m, offs_c, stride_gn, stride_gd, length, DV, True, EVEN_DV)
            dv = mma(p_in, do, DOT_PRECISION)  # dV = P^T dO [keys, CHUNK]
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[:, None] * stride_zn
                     + offs_c[None, :] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                     mask=(offs_n[:, None] < N_OUT) & (offs_c[None, :] < DV))
            v = load_rows(v_base, offs_n, offs_c, stride_vn, stride_vd, length, DV, True, EVEN_DV)
            if c == 0:
                dp_t = mma(v, tl.trans(do), DOT_PRECISION)
            else:
                dp_t = mma_acc(v, tl.trans(do), dp_t, DOT_PRECISION)
        delta = tl.sum(p_t * dp_t, 0) * scale  # per query: the columns
        ds_t = p_t * (dp_t * scale - delta[None, :])
        if TABLE_GRAD:
            tl.store(ds_ptrs + h * (BLOCK_M * BLOCK_N), ds_t)
        ds_in = ds_t.to(Q.dtype.element_ty)
        for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
            offs_c = c + tl.arange(0, OUT_CHUNK)
            q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            dk = mma(ds_in, q, DOT_PRECISION)  # dK = dS^T Q [keys, OUT_CHUNK]
            tl.store(DK + b * stride_yb + h * stride_yh + offs_n[:, None] * stride_yn + offs_c[None, :] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(offs_n[:, None] < N_OUT) & (offs_c[None, :] < D))
            k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if DQ_T:  # dQ^T = K^T dS^T
                dq = mma(tl.trans(k), ds_in, DOT_PRECISION)
                tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[None, :] * stride_xn
                         + offs_c[:, None] * stride_xd, dq.to(DQ.dtype.element_ty),
                         mask=(offs_m[None, :] < N_OUT) & (offs_c[:, None] < D))
            else:
                dq = mma(tl.trans(ds_in), k, DOT_PRECISION)
                tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn
                         + offs_c[None, :] * stride_xd, dq.to(DQ.dtype.element_ty),
                         mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < D))


@triton.jit
def _short_p_dp(q_base, k_base, v_base, do_base, bias, lse, offs_m, offs_n, length, D, DV, stride_qn, stride_qd,
                stride_kn, stride_kd, stride_vn, stride_vd, stride_gn, stride_gd, qk_scale2, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """``(P, dP)`` of one head's tile in :func:`_bias_bwd_short2_kernel`: ``P = exp2(q k^T * scale * log2(e) +
    bias - lse)`` (``bias``: the LUT's bias, -inf where excluded) and ``dP = dO V^T``, each product over head-dim
    chunks of CHUNK columns."""
    for c in tl.static_range(0, BLOCK_D, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
        k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
        if c == 0:
            scores = mma(q, tl.trans(k), DOT_PRECISION)
        else:
            scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
    p = tl.exp2(scores * qk_scale2 + bias - lse[:, None])
    for c in tl.static_range(0, BLOCK_DV, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        do = load_rows(do_base, offs_m, offs_c, stride_gn, stride_gd, length, DV, True, EVEN_DV)
        v = load_rows(v_base, offs_n, offs_c, stride_vn, stride_vd, length, DV, True, EVEN_DV)
        if c == 0:
            dp = mma(do, tl.trans(v), DOT_PRECISION)
        else:
            dp = mma_acc(do, tl.trans(v), dp, DOT_PRECISION)
    return p, dp


@triton.jit
def _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL: tl.constexpr,
                 EVEN_N: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False):
    """The bias of one tile of :func:`_bias_bwd_short2_kernel` for every head: the LUT gathered at the distance,
    -inf where the length or causality excludes the pair."""
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    return tl.where(_allowed(offs_m, offs_n, length, CAUSAL), lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED),
                    float("-inf"))


@triton.jit
def _bias_bwd_short2_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, LSE, DELTA, DQ, DK, DV_OUT, DQ_PART, DK_PART, DV_PART, DS_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    B, N, N_OUT, D, DV, scale, qk_scale2, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
):
    """The backward of rows of ``BLOCK_M < N <= 2 * BLOCK_M`` tokens (two sentences of a pair under one root, a
    fine-tuning batch padded to 128) with a LUT shared by the heads: one program per batch item and query block
    of ``BLOCK_M = BLOCK_N`` rows walks the key blocks its rows reach and, inside each, every head (the tile's
    bias gathered once for all of them).

    An item of at most ``BLOCK_M`` tokens is one tile, as in :func:`_bias_bwd_short_kernel`: the first program
    forms the exact ``delta`` (row sums of ``P * dP``) in the tile and stores dQ, dK, dV themselves (the outputs
    come zeroed: the rows past the first block stay 0); the second does nothing. A longer item's rows reach two
    key blocks: a first pass over the second key block stores each head's row sums of ``P * dP`` there
    (``DELTA``), the first key block adds its own in the tile (exact delta: every row of dS sums to zero up to
    fp32 rounding), and the second is then walked again (two extra products on half the tiles). Such an item's
    products are shares, each from one tile, stored in fp32 (``*_PART[b, h, q_block or k_block]``, transposed
    ``[BLOCK_D, 2 * BLOCK_M]`` but dQ without DQ_T), which :func:`_bias_bwd_short2_sum_kernel` adds in a fixed
    order (deterministic, no atomics). With TABLE_GRAD each head's dS goes to ``DS_OUT`` (fp32
    ``[B, H, 2, 2, BLOCK_M, BLOCK_N]``) for :func:`_bias_bwd_short_table_kernel`. Each pair is read at
    ``distance[b, i, j]`` only: a directed distance is exact.

    Args: as :func:`_bias_bwd_short_kernel`; DELTA: fp32 rows like LSE (``stride_row``), written then read;
        DQ, DK, DV_OUT zeroed.
    Grid: ``(B, 2)``.
    """
    b = tl.program_id(0).to(tl.int64)
    q_block = tl.program_id(1)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, BLOCK_N)
    row_ok = offs_m < length
    two_blocks = length > BLOCK_M  # the item's products are shares
    # Key blocks holding an allowed pair of these rows (none when the block starts past the length).
    num_k = (length + BLOCK_N - 1) // BLOCK_N
    if CAUSAL:
        num_k = tl.minimum(num_k, q_block + 1)
    if q_block * BLOCK_M >= length:
        num_k = 0
    share_d: tl.constexpr = BLOCK_D * 2 * BLOCK_N  # one share to the next (a head's two are adjacent)
    share_dv: tl.constexpr = BLOCK_DV * 2 * BLOCK_N
    part_d = b * HEADS * (2 * share_d)  # this item's head 0
    part_dv = b * HEADS * (2 * share_dv)
    delta_rows = DELTA + b * HEADS * stride_row + offs_m
    lse_rows = LSE + b * HEADS * stride_row + offs_m

    # Rows reaching two key blocks: the row sums of P * dP over the second, stored per head.
    if num_k == 2:
        offs_n = BLOCK_N + offs_j
        bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                            EVEN_N, OPAQUE_BIAS, INTERPRETED)
        for h in range(0, HEADS):
            lse = tl.load(lse_rows + h * stride_row, mask=row_ok, other=float("inf"))
            p, dp = _short_p_dp(Q + b * stride_qb + h * stride_qh, K + b * stride_kb + h * stride_kh,
                                V + b * stride_vb + h * stride_vh, DOUT + b * stride_gb + h * stride_gh, bias, lse,
                                offs_m, offs_n, length, D, DV, stride_qn, stride_qd, stride_kn, stride_kd,
                                stride_vn, stride_vd, stride_gn, stride_gd, qk_scale2, BLOCK_D, BLOCK_DV, CHUNK,
                                EVEN_D, EVEN_DV, DOT_PRECISION)
            tl.store(delta_rows + h * stride_row, tl.sum(p * dp, 1), mask=row_ok)
        tl.debug_barrier()  # read back below in whatever layout the products leave the rows

    for kb in tl.static_range(2):
        if kb < num_k:
            offs_n = kb * BLOCK_N + offs_j
            bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                                EVEN_N, OPAQUE_BIAS, INTERPRETED)
            for h in range(0, HEADS):
                q_base = Q + b * stride_qb + h * stride_qh
                k_base = K + b * stride_kb + h * stride_kh
                do_base = DOUT + b * stride_gb + h * stride_gh
                lse = tl.load(lse_rows + h * stride_row, mask=row_ok, other=float("inf"))
                p, dp = _short_p_dp(q_base, k_base, V + b * stride_vb + h * stride_vh, do_base, bias, lse, offs_m,
                                    offs_n, length, D, DV, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn,
                                    stride_vd, stride_gn, stride_gd, qk_scale2, BLOCK_D, BLOCK_DV, CHUNK, EVEN_D,
                                    EVEN_DV, DOT_PRECISION)
                if kb == 0:  # this block's row sums (plus the second block's, when the rows reach it)
                    delta = tl.sum(p * dp, 1)
                    if num_k == 2:
                        delta += tl.load(delta_rows + h * stride_row, mask=row_ok, other=0.0)
                        tl.store(delta_rows + h * stride_row, delta, mask=row_ok)
                else:
                    delta = tl.load(delta_rows + h * stride_row, mask=row_ok, other=0.0)
                # dS with the score scale folded in (a row constant), as in the one-tile kernel.
                ds = p * (dp * scale - (delta * scale)[:, None])
                if TABLE_GRAD:
                    tl.store(DS_OUT + (((b * HEADS + h) * 2 + q_block) * 2 + kb) * (BLOCK_M * BLOCK_N)
                             + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + offs_j[None, :], ds)
                p_in = p.to(Q.dtype.element_ty)
                ds_in = ds.to(Q.dtype.element_ty)
                # (the two orders of the share offsets: the spill-free one for each family's tiles)
                if DQ_T:
                    dv_share = DV_PART + part_dv + h * (2 * share_dv) + q_block * share_dv
                else:
                    dv_share = DV_PART + q_block * share_dv + part_dv + h * (2 * share_dv)
                for c in tl.static_range(0, BLOCK_DV, OUT_CHUNK):
                    offs_c = c + tl.arange(0, OUT_CHUNK)
                    do = load_rows(do_base, offs_m, offs_c, stride_gn, stride_gd, length, DV, True, EVEN_DV)
                    dv = mma(tl.trans(do), p_in, DOT_PRECISION)  # dV^T [OUT_CHUNK, BLOCK_N]
                    if two_blocks:
                        tl.store(dv_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dv)
                    else:
                        tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[None, :] * stride_zn
                                 + offs_c[:, None] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                                 mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < DV))
                if DQ_T:
                    dq_share = DQ_PART + part_d + h * (2 * share_d) + kb * share_d
                    dk_share = DK_PART + part_d + h * (2 * share_d) + q_block * share_d
                else:
                    dq_share = DQ_PART + kb * share_d + part_d + h * (2 * share_d)
                    dk_share = DK_PART + q_block * share_d + part_d + h * (2 * share_d)
                for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
                    offs_c = c + tl.arange(0, OUT_CHUNK)
                    k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
                    if DQ_T:  # dQ^T = K^T dS^T
                        dq = mma(tl.trans(k), tl.trans(ds_in), DOT_PRECISION)
                        if two_blocks:
                            tl.store(dq_share + offs_c[:, None] * (2 * BLOCK_M) + offs_m[None, :], dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[None, :] * stride_xn
                                     + offs_c[:, None] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[None, :] < N_OUT) & (offs_c[:, None] < D))
                    else:
                        dq = mma(ds_in, k, DOT_PRECISION)
                        if two_blocks:
                            tl.store(dq_share + offs_m[:, None] * BLOCK_D + offs_c[None, :], dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn
                                     + offs_c[None, :] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < D))
                    q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
                    dk = mma(tl.trans(q), ds_in, DOT_PRECISION)  # dK^T [OUT_CHUNK, BLOCK_N]
                    if two_blocks:
                        tl.store(dk_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dk)
                    else:
                        tl.store(DK + b * stride_yb + h * stride_yh + offs_n[None, :] * stride_yn
                                 + offs_c[:, None] * stride_yd, dk.to(DK.dtype.element_ty),
                                 mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < D))


@triton.jit
def _short2_share(PART, share, head, rows, cols, stride_r, FIRST: tl.constexpr, SECOND: tl.constexpr):
    """One head's ``[rows, cols]`` block of a gradient from its two shares (``PART[0]``, ``PART[1]`` are
    ``share`` apart; contiguous columns), added in that order; only the shares the kernel stored are read."""
    ptrs = PART + head + rows[:, None] * stride_r + cols[None, :]
    if FIRST:
        total = tl.load(ptrs)
        if SECOND:
            total += tl.load(ptrs + share)
    else:
        total = tl.load(ptrs + share)
    return total


@triton.jit
def _bias_bwd_short2_sum_kernel(
    LENGTHS, DQ_PART, DK_PART, DV_PART, DQ, DK, DV_OUT,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    B, N, N_OUT, D, DV, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DQ_T: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """dQ, dK, dV of one head of an item longer than ``BLOCK_M`` from :func:`_bias_bwd_short2_kernel`'s shares:
    each row block's two shares added in a fixed order (the first query or key block's first), a share of a
    tile the kernel did not walk (causality) read as 0. Items of at most ``BLOCK_M`` tokens: nothing (the
    kernel stored their gradients). Grid: ``(B * HEADS,)``."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // HEADS
    h = bh % HEADS
    length = tl.minimum(tl.load(LENGTHS + b), N)
    if length > BLOCK_M:
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        share_d: tl.constexpr = BLOCK_D * 2 * BLOCK_M  # a head's two shares are adjacent
        share_dv: tl.constexpr = BLOCK_DV * 2 * BLOCK_M
        head_d = bh * (2 * share_d)
        head_dv = bh * (2 * share_dv)
        for blk in tl.static_range(2):
            rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
            # dQ rows of query block blk: shares of key blocks 0 and 1; dK, dV rows of key block blk: shares of
            # query blocks 0 and 1. Causal: query block 0 does not reach key block 1.
            later = (not CAUSAL) or blk == 1
            if DQ_T:
                dq = tl.trans(_short2_share(DQ_PART, share_d, head_d, offs_d, rows, 2 * BLOCK_M, True, later))
            else:
                dq = _short2_share(DQ_PART, share_d, head_d, rows, offs_d, BLOCK_D, True, later)
            tl.store(DQ + b * stride_xb + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                     dq.to(DQ.dtype.element_ty), mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))
            earlier = (not CAUSAL) or blk == 0
            dk = tl.trans(_short2_share(DK_PART, share_d, head_d, offs_d, rows, 2 * BLOCK_M, earlier, True))
            tl.store(DK + b * stride_yb + h * stride_yh + rows[:, None] * stride_yn + offs_d[None, :] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))
            dv = tl.trans(_short2_share(DV_PART, share_dv, head_dv, offs_dv, rows, 2 * BLOCK_M, earlier, True))
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + rows[:, None] * stride_zn
                     + offs_dv[None, :] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_dv[None, :] < DV))


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _bias_bwd_short_table_kernel(
    DS, DIST, BUCKET_LUT, LENGTHS, BUCKET_PARTIALS, stride_db, stride_di, stride_dj, N, scale, window, HEADS,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    LAST_DISTANCE_BUCKET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
    CAUSAL: tl.constexpr, INTERPRETED: tl.constexpr, BLOCKS: tl.constexpr = 1,
):
    """The short-row table gradient: one dS tile of a batch item (:func:`_bias_bwd_short_kernel`'s or
    :func:`_bias_bwd_short2_kernel`'s ``DS_OUT``, ``[B, H, BLOCKS, BLOCKS, BLOCK_M, BLOCK_N]``) summed over the
    heads in a fixed order and reduced per bucket once (:func:`_bucket_sums`). The tile's bucket set comes from
    its own distance tile (``BUCKET_LUT``: the bucket of each uint8 distance), over the pairs the length,
    causality and ``window`` (-1: none) allow: up to 31 buckets their bit set (an OR over the tile), else the
    lowest and highest; a tile without an allowed pair is not read. Writes
    ``BUCKET_PARTIALS[(b * BLOCKS + q_block) * BLOCKS + k_block]`` (fp32 ``[NUM_BUCKETS]``).
    Grid: ``(B, BLOCKS, BLOCKS)``."""
    b = tl.program_id(0).to(tl.int64)
    q_block = tl.program_id(1)
    k_block = tl.program_id(2)
    tile = (b * BLOCKS + q_block) * BLOCKS + k_block
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    sums = _bucket_accumulators(BLOCK_M, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    # A tile past the length (the second block of a short sequence) or above the causal diagonal: nothing to read.
    reach = (q_block * BLOCK_M < length) & (k_block * BLOCK_N < length)
    if CAUSAL:
        reach = reach & (k_block * BLOCK_N < (q_block + 1) * BLOCK_M)
    if reach:
        dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
        allowed = _allowed(offs_m, offs_n, length, CAUSAL) & ((window < 0) | (dist.to(tl.int32) <= window))
        bucket = tl.load(BUCKET_LUT + dist.to(tl.int32)).to(tl.int32)
        if STATIC_BUCKETS:
            present = tl.reduce(tl.where(allowed, 1 << bucket, 0), None, _bit_or)
            walk = present != 0
        else:  # lowest + 256 * highest; lowest > highest: no allowed pair
            lowest = tl.min(tl.where(allowed, bucket, NUM_BUCKETS))
            highest = tl.max(tl.where(allowed, bucket, 0))
            present = lowest + 256 * highest
            walk = lowest <= highest
        if walk:
            ptrs = (DS + (b * HEADS * BLOCKS * BLOCKS + q_block * BLOCKS + k_block) * (BLOCK_M * BLOCK_N)
                    + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
            ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for h in range(0, HEADS):
                ds += tl.load(ptrs + h * (BLOCKS * BLOCKS * BLOCK_M * BLOCK_N))
            sums = _bucket_sums(sums, ds, dist, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE,
                                UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED)
    bucket_ids = tl.arange(0, BUCKETS_PAD)
    totals = _bucket_totals(sums, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    tl.store(BUCKET_PARTIALS + tile * NUM_BUCKETS + bucket_ids, totals / scale,  # (dS carried the score scale)
             mask=bucket_ids < NUM_BUCKETS)


@triton.jit
def _dq_tile(dq, row_error, q, do, lse, delta, k_base, v_base, dist_base, lut_row, k_block, offs_m, offs_d,
             offs_dv, length, N, D, DV, stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
             BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr,
             MASK: tl.constexpr, CAUSAL: tl.constexpr, SYNTAX: tl.constexpr, TABLE_GRAD: tl.constexpr,
             DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False):
    """One key tile of the dQ backward; with TABLE_GRAD it also sums each row of dS (``row_error``)."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    scores, k = _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn,
                             stride_kd, stride_di, stride_dj, qk_scale2, EVEN_D, EVEN_N, MASK, SYNTAX, DOT_PRECISION,
                             OPAQUE_BIAS, INTERPRETED)
    exponent = scores - lse[:, None]
    if MASK:  # masked before exp2: an excluded pair's exponent may be large
        exponent = tl.where(_allowed(offs_m, offs_n, length, CAUSAL), exponent, float("-inf"))
    p = tl.exp2(exponent)
    v = load_rows(v_base, offs_n, offs_dv, stride_vn, stride_vd, length, DV, MASK, EVEN_DV)
    dp = mma(do, tl.trans(v), DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    dq = mma_acc(ds.to(k.dtype), k, dq, DOT_PRECISION)
    if TABLE_GRAD:
        row_error += tl.sum(ds, 1)
    return dq, row_error


@triton.jit
def _bias_bwd_dq_kernel(
    Q, K, V, DOUT, OUT, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, LSE, DQ, DELTA,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    H, N, N_OUT, D, DV, num_q_blocks, num_k_blocks, scale, qk_scale2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr,
    CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
):
    """Backward for one query block: ``delta = rowsum(dO * O)`` of its rows (no separate launch: this kernel
    runs first and owns whole rows), ``dq``, and the delta the dK/dV and table kernels read.

    An exact softmax backward has rows of dS that sum to zero. ``delta`` is formed from a rounded output
    (fp16/bf16), so its rows sum to a small ``row_error`` instead; per bucket those errors add up over
    thousands of rows. With TABLE_GRAD the kernel writes ``delta + row_error`` (``dS - P * row_error``: rows
    that sum to zero up to fp32 rounding) for the table kernel, which sums dS per bucket.

    Args:
        OUT: the forward's output, like DOUT (strides ``stride_o*``). DQ: like Q (strides ``stride_x*``).
        DELTA: fp32 ``[B, H, N]`` (rows ``stride_row`` apart), written: delta, corrected with TABLE_GRAD; 0 for
            rows past the length.
        Others as in the dK/dV kernel (key lists as in the forward).
    Grid: ``(nQ * B * H,)``.
    """
    q_block, bh, b, h = program_ids(num_q_blocks, H)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # delta first, 32 columns at a time (a small transient before the loop's operands are live); 0 past the
    # length (masked loads).
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    for c in tl.static_range(0, BLOCK_DV, 32):
        offs_c = c + tl.arange(0, 32)
        out = load_rows(OUT + b * stride_ob + h * stride_oh, offs_m, offs_c, stride_on, stride_od, length, DV, True,
                        EVEN_DV)
        dout = load_rows(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_c, stride_gn, stride_gd, length, DV,
                         True, EVEN_DV)
        delta += tl.sum(out.to(tl.float32) * dout.to(tl.float32), axis=1)
    q = load_rows(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qn, stride_qd, length, D, True, EVEN_D)
    do = load_rows(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_dv, stride_gn, stride_gd, length, DV, True,
                   EVEN_DV)
    row_base = bh.to(tl.int64) * stride_row
    lse = tl.load(LSE + row_base + offs_m, mask=offs_m < length, other=float("inf"))
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dist_base = DIST + b * stride_db
    lut_row = LUT + h * stride_lh

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_error = tl.zeros([BLOCK_M], dtype=tl.float32)
    list_base, interior, total = _key_block_range(KV_LIST, KV_COUNT, b, q_block, length, num_q_blocks,
                                                  num_k_blocks, BLOCK_M, BLOCK_N, USE_LISTS, CAUSAL)
    for i in range(0, interior):
        dq, row_error = _dq_tile(dq, row_error, q, do, lse, delta, k_base, v_base, dist_base, lut_row,
                                 _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                 stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                 BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, False, CAUSAL, SYNTAX, TABLE_GRAD, DOT_PRECISION,
                                 OPAQUE_BIAS, INTERPRETED)
    for i in range(interior, total):
        dq, row_error = _dq_tile(dq, row_error, q, do, lse, delta, k_base, v_base, dist_base, lut_row,
                                 _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                 stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                 BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, True, CAUSAL, SYNTAX, TABLE_GRAD, DOT_PRECISION,
                                 OPAQUE_BIAS, INTERPRETED)

    # Epilogue: dQ carries the score scale; rows past the length get 0 and add nothing to the table gradient.
    row_ok = offs_m < length
    dq = tl.where(row_ok[:, None], dq * scale, 0.0)
    dq_ptrs = DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn + offs_d[None, :] * stride_xd
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_d[None, :] < D))
    if TABLE_GRAD:
        delta += row_error
    tl.store(DELTA + row_base + offs_m, delta, mask=offs_m < N)


# ---------------------------------------------------------------------------------------------------------
# Configurations (block sizes, warps, stages)
# ---------------------------------------------------------------------------------------------------------

# Per kernel ("fwd", "dkdv", "dq", "table"), GPU family ("sm90": Hopper and newer, "sm80": A100, "small":
# other GPUs with ~100 KB of shared memory per block), dtype class ("half" or "fp32") and head-dim class
# (BLOCK_D <= 64 or 128). Each entry is compiled for sm_80 and sm_90 by the inspection report
# (``python -m syntaxkernels inspect``), which checks registers, spills and the main loop's instruction mix;
# the choices below are the spill-free ones with the fewest instructions per score element there. For "dkdv",
# BLOCK_N is the key block a program owns and BLOCK_M the query block of one iteration; "table" starts from dQ's
# tiles (its loop holds dQ's first two products).
_C = dict
CONFIGS: Dict[Tuple[str, str, str, int], dict] = {
    ("fwd", "sm90", "half", 64): _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("fwd", "sm90", "half", 128): _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("fwd", "sm80", "half", 64): _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("fwd", "sm80", "half", 128): _C(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("dkdv", "sm90", "half", 64): _C(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
    ("dkdv", "sm90", "half", 128): _C(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3),
    ("dkdv", "sm80", "half", 64): _C(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2),
    ("dkdv", "sm80", "half", 128): _C(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=2),
    ("dq", "sm90", "half", 64): _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("dq", "sm90", "half", 128): _C(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3),
    ("dq", "sm80", "half", 64): _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("dq", "sm80", "half", 128): _C(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
}
# The table kernel holds two score tiles (this head's and the heads' sum of dS) and each head's operands: the
# spill-free tilings with the fewest instructions per element on the workloads of the inspection report (one
# stage on sm_90 at D = 64 and on the small family at D = 128: with the skipped-tile branch two stages spill).
CONFIGS[("table", "sm90", "half", 64)] = _C(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=1)
CONFIGS[("table", "sm90", "half", 128)] = _C(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)
CONFIGS[("table", "sm80", "half", 64)] = _C(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=1)
CONFIGS[("table", "sm80", "half", 128)] = _C(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=1)
# fp32 inputs run exact fp32 products (no tensor cores, no TF32): Triton 3.6 lowers them to FMA loops that hold
# whole operand rows per thread. 16x32 tiles are spill-free up to D = 64; at D = 128 every tiling tried spills
# (16x16 the least): correct, but not tuned (fp32 is not a performance target; use bf16/fp16 for speed).
for _kind in ("fwd", "dkdv", "dq", "table"):
    for _arch in ("sm90", "sm80"):
        CONFIGS[(_kind, _arch, "fp32", 64)] = _C(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
        CONFIGS[(_kind, _arch, "fp32", 128)] = _C(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
# The table kernel's fp32 tiles at D <= 64 (with its skipped-tile branch): on sm_80 16x32 spills with one or two
# stages, 16x16 with one; on sm_90 16x16 spills with two stages, 16x32 with one does not.
CONFIGS[("table", "sm80", "fp32", 64)] = _C(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2)
CONFIGS[("table", "sm90", "fp32", 64)] = _C(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
# GPUs with about 100 KB of shared memory a block (sm_86, sm_89) take A100's tiles, but for dQ at D = 128, whose
# 128x32 tiles need 100 KB with two stages (128x16 is spill-free there).
for (_kind, _arch, _cls, _dim), _config in list(CONFIGS.items()):
    if _arch == "sm80":
        CONFIGS[(_kind, "small", _cls, _dim)] = dict(_config)
CONFIGS[("dq", "small", "half", 128)] = _C(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=2)
CONFIGS[("table", "small", "half", 128)] = _C(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=1)
# sm_120 (RTX 50xx, RTX PRO Blackwell: compiled by the Blackwell ptxas) spills with A100's 2-stage D = 64 dK/dV
# tiles; one stage is spill-free on sm_86, sm_89 and sm_120.
CONFIGS[("dkdv", "small", "half", 64)] = _C(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=1)

# The table kernel with a window (live-tile lists), log-spaced buckets or more than 31 buckets holds more state: where
# its plain tiles spill then, "table_extra" (default: the plain ones).
CONFIGS[("table_extra", "sm90", "half", 64)] = _C(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)
for (_kind, _arch, _cls, _dim), _config in list(CONFIGS.items()):
    if _kind == "table" and ("table_extra", _arch, _cls, _dim) not in CONFIGS:
        CONFIGS[("table_extra", _arch, _cls, _dim)] = dict(_config)

# The short-row backward (``N <= 64``, a sequence one 64 x 64 tile: dQ, dK, dV and each head's dS in one
# kernel, :func:`_bias_bwd_short_kernel`): four warps (on sm_90 one warp group: wider programs repeat the score
# tile on every group of warps). CHUNK: the head-dim columns of the score and dP products a step; OUT_CHUNK: of the
# dQ, dK, dV products (on sm_90 64: a transposed product of 32 rows leaves the warp-group instructions); DQ_T: dQ as
# dQ^T = K^T dS^T. The spill-free choices with the fewest instructions per element: on sm_90 D64 whole tiles, D128
# chunks of 32 with dQ^T; on sm_80 and the small family (mma.sync, whose second operand every warp holds whole)
# chunks of 32 everywhere.
CONFIGS[("short", "sm90", "half", 64)] = _C(BLOCK_M=64, BLOCK_N=64, CHUNK=64, OUT_CHUNK=64, DQ_T=False,
                                           num_warps=4, num_stages=1)
CONFIGS[("short", "sm90", "half", 128)] = _C(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=64, DQ_T=True,
                                            num_warps=4, num_stages=1)
for _arch in ("sm80", "small"):
    for _dim in (64, 128):
        CONFIGS[("short", _arch, "half", _dim)] = _C(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, DQ_T=True,
                                                    num_warps=4, num_stages=1)

# The short-row forward (``N <= 64``, :func:`_bias_fwd_short_kernel`): one 64 x 64 tile a sequence, every head in
# one program, four warps; whole 64-column products on sm_90, chunks of 32 on mma.sync GPUs (6-11% fewer
# instructions per element there).
for _arch in ("sm90", "sm80", "small"):
    for _dim in (64, 128):
        chunk = 64 if _arch == "sm90" else 32
        CONFIGS[("fwd_short", _arch, "half", _dim)] = _C(BLOCK_M=64, BLOCK_N=64, CHUNK=chunk, OUT_CHUNK=chunk,
                                                        num_warps=4, num_stages=1)

# Rows of 65..128 tokens (:func:`_bias_bwd_short2_kernel`: a program per query block of 64, two key blocks):
# the one-tile kernel's tiles, but for score and dP products over head-dim chunks of 32 on sm_90 at D = 64, of 16
# on sm_80 at D = 128 and of 16 with dQ not transposed on the small family (the spill-free choices: with the
# one-tile kernel's, 16-56 B spill).
for (_kind, _arch, _cls, _dim), _config in list(CONFIGS.items()):
    if _kind == "short":
        CONFIGS[("short2", _arch, _cls, _dim)] = dict(_config)
CONFIGS[("short2", "sm90", "half", 64)]["CHUNK"] = 32
CONFIGS[("short2", "sm80", "half", 128)]["CHUNK"] = 16
for _dim in (64, 128):
    CONFIGS[("short2", "small", "half", _dim)].update(CHUNK=16, DQ_T=False)
# The one-tile kernel on mma.sync GPUs forms keys-major tiles (KEYS_MAJOR, :func:`_bias_bwd_short_t_kernel`:
# P^T and dS^T feed dV and dK as they are; dQ not transposed): on sm_80 8.5% (D = 64, chunks of 32) and 16%
# (D = 128, chunks of 16) fewer instructions per element than the queries-major tiles, 7% on the small family at
# D = 64. The small family at D = 128 keeps the queries-major kernel (every keys-major choice spills 8-56 B on
# sm_86 or sm_120).
CONFIGS[("short", "sm80", "half", 64)].update(KEYS_MAJOR=True, DQ_T=False)
CONFIGS[("short", "sm80", "half", 128)].update(KEYS_MAJOR=True, DQ_T=False, CHUNK=16)
CONFIGS[("short", "small", "half", 64)].update(KEYS_MAJOR=True, DQ_T=False)
# The small family at D = 128 takes chunks of 16 (with the opaque bias of :func:`_opaque_bias`, chunks of 32 spill
# 8 B on sm_86 and sm_89).
CONFIGS[("short", "small", "half", 128)]["CHUNK"] = 16


def _opaque_bias(family: str) -> bool:
    """Whether the kernels pass the gathered bias through an opaque move (``OPAQUE_BIAS``,
    :func:`~syntaxkernels.ops._primitives.lut_bias`): on GPUs whose products lower to ``mma.sync`` (sm_80 and the
    small family). Triton 3.6 sizes a dot's register operands from the narrowest load in their backward slice;
    P and dS carry the bias, gathered at the uint8 distance, so without the move their products take 8-bit
    operand layouts (shuffles and selects to form each register operand from the accumulator, a register move for
    every transposed operand load): sm_80 sentences backward 46.5 -> 36.4 per element at D = 64 in the model.
    On sm_90 and newer (wgmma, tcgen05) it changes nothing."""
    return family in ("sm80", "small")

# Blackwell datacenter GPUs (sm_100/103/110) take the sm90 family's configs, but for these, where the Blackwell
# ptxas spills with Hopper's: (kind, dtype class, head-dim class) -> the fields that differ.
BLACKWELL_CONFIGS: Dict[Tuple[str, str, int], dict] = {
    ("short", "half", 128): _C(CHUNK=64, DQ_T=False),
    ("table", "half", 64): _C(num_stages=1),
    ("table", "half", 128): _C(num_stages=1),
    ("table_extra", "half", 64): _C(num_stages=1),
    ("table_extra", "half", 128): _C(num_stages=1),
}
# Consumer Blackwell GPUs (sm_120: RTX 50xx, RTX PRO) take the small family's configs, but for these, where the
# Blackwell ptxas spills with them: the two-block backward at D = 128 spills 8 B with the opaque bias
# (:func:`_opaque_bias`) whatever its chunks; without it, it is spill-free.
CONSUMER_BLACKWELL_CONFIGS: Dict[Tuple[str, str, int], dict] = {
    ("short2", "half", 128): _C(OPAQUE_BIAS=False),
}

# Tests may shrink the tiles (e.g. to 16) to exercise block skipping on small N; None = CONFIGS. Shrunk tiles
# also turn the short-row backward off (it needs a key tile as long as the rows).
_BLOCK_OVERRIDE: Optional[Tuple[int, int]] = None
SHORT_ROW_LIMIT = 64  # rows up to this long take the short-row backward (see _short_config)
_SHORT_ROWS = True  # tests may turn the short-row backward off to run the tiled kernels at small N


def select_config(kind: str, dtype: torch.dtype, head_dim: int, family: Optional[str] = None,
                  arch: Optional[int] = None) -> dict:
    """The launch configuration of the ``kind`` ("fwd", "dkdv", "dq", "table", "table_extra") kernel for ``family`` (default:
    the current GPU's); ``arch`` (default: the current GPU when no family is given) applies
    :data:`BLACKWELL_CONFIGS` on sm_100 and newer in the sm90 family and :data:`CONSUMER_BLACKWELL_CONFIGS` on sm_120
    and newer in the small family. ``OPAQUE_BIAS`` is the family's :func:`_opaque_bias` unless an entry says
    otherwise."""
    if family is None and arch is None:
        arch = current_arch()
    family = family or arch_family(arch)
    if family == "unsupported":
        raise ValueError(f"no Triton configs for this GPU (compute capability {current_arch()}): the kernels need "
                         "sm_80 or newer, and the ops run the reference there (backend='auto')")
    cls = "fp32" if dtype == torch.float32 else "half"
    dim_class = 64 if head_block(head_dim) <= 64 else 128
    config = dict(CONFIGS[(kind, family, cls, dim_class)])
    if arch is not None and arch >= 100 and family == "sm90":
        config.update(BLACKWELL_CONFIGS.get((kind, cls, dim_class), {}))
    if arch is not None and arch >= 120 and family == "small":
        config.update(CONSUMER_BLACKWELL_CONFIGS.get((kind, cls, dim_class), {}))
    config.setdefault("OPAQUE_BIAS", _opaque_bias(family))
    if _BLOCK_OVERRIDE is not None:
        config["BLOCK_M"], config["BLOCK_N"] = _BLOCK_OVERRIDE
    return config


def _short_config(N: int, dtype: torch.dtype, head_dim: int, lut_rows: int, family: str,
                  arch: Optional[int]) -> Optional[dict]:
    """The short-row backward's configuration, or None where the tiled kernels run: rows of at most
    :data:`SHORT_ROW_LIMIT` tokens, fp16/bf16, one LUT row (a table shared by the heads, or none), a family with
    short-row tiles (all with Triton configs)."""
    kind = "short" if N <= SHORT_ROW_LIMIT else "short2"
    if (not _SHORT_ROWS or _BLOCK_OVERRIDE is not None or N > 2 * SHORT_ROW_LIMIT or dtype == torch.float32
            or lut_rows != 1 or (kind, family, "half", 64 if head_block(head_dim) <= 64 else 128) not in CONFIGS):
        return None
    return select_config(kind, dtype, head_dim, family, arch)


def _short_forward_config(N: int, dtype: torch.dtype, head_dim: int, lut_rows: int) -> Optional[dict]:
    """The short-row forward's configuration (rows of at most :data:`SHORT_ROW_LIMIT` tokens, fp16/bf16, one LUT
    row), or None where :func:`_bias_fwd_kernel` runs. (A two-block form for rows of up to 128 tokens, a program
    per query block with the heads inside and an online softmax over two key blocks, was tried: fewer
    instructions per valid pair on pairs of sentences, more on the odd-77 batch, and more per element than the
    tiled kernel on both.)"""
    if (not _SHORT_ROWS or _BLOCK_OVERRIDE is not None or N > SHORT_ROW_LIMIT or dtype == torch.float32
            or lut_rows != 1):
        return None
    return select_config("fwd_short", dtype, head_dim)


def bucket_args(buckets: BucketSpec) -> Tuple[int, int, bool]:
    """``(max_distance, log_distance or 0, unreachable_bucket)``: the BucketSpec as kernel constexprs."""
    return buckets.max_distance, buckets.log_distance or 0, buckets.unreachable_bucket


def _spec(max_distance: int, log_distance: int, unreachable_bucket: bool) -> BucketSpec:
    return BucketSpec(max_distance, log_distance or None, unreachable_bucket)


def _bucket_lut(spec: BucketSpec, like: torch.Tensor) -> torch.Tensor:
    """``BucketSpec.lut()`` on ``like``'s device, built once per (spec, device) (:func:`device_constant`): no
    host-to-device copy per call."""
    return device_constant(("bucket lut", spec), like, spec.lut)


def bias_lut(table: torch.Tensor, bias_scale: torch.Tensor, buckets: BucketSpec, window: int) -> torch.Tensor:
    """The per-head distance LUT the kernels gather from: fp32 ``[H or 1, 256]``, log2 domain.

    ``lut[h, d] = c * table[h, bucket(d)] * log2(e)``, ``-inf`` for ``d > window`` (``window < 0``: none).
    Built on the table's device with a few small tensor ops (no host synchronisation).
    """
    rows = table.to(torch.float32).reshape(-1, table.shape[-1])
    lut = rows[:, _bucket_lut(buckets, table)] * (bias_scale.to(torch.float32).reshape(1, 1) * LOG2E)
    if window >= 0:
        beyond = torch.arange(256, device=table.device) > window
        lut = lut.masked_fill(beyond[None, :], float("-inf"))
    return lut.contiguous()


# ---------------------------------------------------------------------------------------------------------
# Launchers (torch.library Triton ops)
# ---------------------------------------------------------------------------------------------------------


def _lists(distance, lengths, block_m, block_n, window, causal, by_key):
    """Live-tile lists (interior first) for a windowed call, or None (the kernels then walk ranges); computed
    once per batch (:func:`per_batch`: every layer shares them)."""
    if window < 0:
        return None, None
    return per_batch((distance, lengths), ("lists", block_m, block_n, window, causal, by_key),
                     lambda: _build_lists(distance, lengths, block_m, block_n, window, causal, by_key))


def _build_lists(distance, lengths, block_m, block_n, window, causal, by_key):
    smallest, _ = block_distance_range(distance, lengths, block_m, block_n)
    live = live_blocks(smallest, lengths, block_m, block_n, window=window, causal=causal)
    boundary = boundary_tiles(lengths, live.shape[1], live.shape[2], block_m, block_n, causal, by_key=by_key)
    if not by_key:  # programs own key blocks: rows are key blocks
        live, boundary = live.transpose(1, 2), boundary.transpose(1, 2)
    return split_lists(live, boundary)


def _padded(N: int) -> int:
    """The kernels' padded extent: N rounded up to 16 (see the forward kernel's ``N, N_OUT``)."""
    return -(-N // 16) * 16


def _row_buffer(B: int, H: int, N: int, device, fill: Optional[float] = None) -> torch.Tensor:
    """fp32 ``[B, H, N]`` for per-row statistics (log-sum-exp, delta): a view of ``[B, H, roundup(N, 16)]``, whose
    rows the kernels read and write up to the padded extent with aligned vectors whatever N is (``fill``: the
    padding's value, for a buffer no kernel writes)."""
    shape = (B, H, _padded(N))
    rows = torch.empty(shape, dtype=torch.float32, device=device) if fill is None else torch.full(
        shape, fill, dtype=torch.float32, device=device)
    return rows[..., :N]


def _even(N: int, config: dict) -> bool:
    return N % config["BLOCK_M"] == 0 and N % config["BLOCK_N"] == 0


@torch.library.triton_op("syntaxkernels::bias_attention_fwd", mutates_args=())
def bias_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                           lut: torch.Tensor, lengths: torch.Tensor, scale: float, window: int,
                           causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher: ``(out [B, H, N, Dv] in q's dtype, lse2 fp32 [B, H, N])``.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]`` (any strides); distance: uint8 ``[B, N, N]``.
        lut: fp32 ``[H or 1, 256]`` (:func:`bias_lut`: log2-domain bias per distance, -inf = not allowed).
        lengths: int32 ``[B]``; scale: score scale; window: the window folded into ``lut`` (-1: none), used
            here only to skip tiles with no pair inside it; causal: allow only ``j <= i``.
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    out = torch.empty((B, H, N, DV), dtype=q.dtype, device=q.device)
    lse = _row_buffer(B, H, N, q.device)
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse
    distance = aligned_distance(distance)
    lut = lut.contiguous()
    short = _short_forward_config(N, q.dtype, max(D, DV), lut.shape[0])
    if short is not None:  # one tile a sequence, every head in one program
        launch(_bias_fwd_short_kernel, (B,),
               q, k, v, distance, lut, lengths, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
               *distance.stride(), lse.stride(1), _padded(N), N, D, DV, scale * LOG2E, HEADS=H,
               BLOCK_M=short["BLOCK_M"], BLOCK_N=short["BLOCK_N"], BLOCK_D=head_block(D), BLOCK_DV=head_block(DV),
               CHUNK=min(short["CHUNK"], head_block(D)), OUT_CHUNK=min(short["OUT_CHUNK"], head_block(DV)),
               EVEN_D=head_block(D) == D, EVEN_DV=head_block(DV) == DV, EVEN_N=_even(_padded(N), short),
               CAUSAL=causal, DOT_PRECISION=dot_precision(q.dtype), num_warps=short["num_warps"],
               num_stages=short["num_stages"], OPAQUE_BIAS=short["OPAQUE_BIAS"], INTERPRETED=interpreting())
        return out, lse
    config = select_config("fwd", q.dtype, max(D, DV))
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    kv_list, kv_count = _lists(distance, lengths, block_m, block_n, window, causal, by_key=True)
    use_lists = kv_list is not None
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    launch(_bias_fwd_kernel, launch_grid(num_q, B, H),
           q, k, v, distance, lut, lengths, kv_list if use_lists else lengths, kv_count if use_lists else lengths,
           out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *distance.stride(),
           lut.stride(0) if lut.shape[0] > 1 else 0, lse.stride(1), H, _padded(N), N, D, DV, num_q, num_k,
           scale * LOG2E,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_block(D), BLOCK_DV=head_block(DV),
           EVEN_D=head_block(D) == D, EVEN_DV=head_block(DV) == DV, EVEN_N=_even(_padded(N), config),
           USE_LISTS=use_lists, CAUSAL=causal, DOT_PRECISION=dot_precision(q.dtype),
           num_warps=config["num_warps"], num_stages=config["num_stages"], OPAQUE_BIAS=config["OPAQUE_BIAS"],
           INTERPRETED=interpreting())
    return out, lse


STATIC_BUCKET_LIMIT = 31  # tables up to this many buckets sum dS through compile-time accumulators


def _tile_buckets(distance, lengths, block_m, block_n, window, causal, spec: BucketSpec) -> torch.Tensor:
    """The table kernel's metadata: int32 ``[B, nQ, nK]``, per tile the buckets of its allowed pairs.

    Up to :data:`STATIC_BUCKET_LIMIT` buckets it is their bit set (:func:`block_meta.block_bucket_masks`);
    larger tables: ``lowest + 256 * highest`` from each tile's distance range (``lowest > highest``: no
    allowed pair). Device tensors, no host synchronisation.
    """
    T = spec.num_buckets
    lut = _bucket_lut(spec, distance)
    window_or_none = None if window < 0 else window
    if T <= STATIC_BUCKET_LIMIT:
        return block_bucket_masks(distance, lengths, lut, block_m, block_n, window_or_none, causal)
    smallest, largest = block_distance_range(distance, lengths, block_m, block_n)
    live = live_blocks(smallest, lengths, block_m, block_n, window=window_or_none, causal=causal)
    if window >= 0:
        largest = torch.minimum(largest, torch.full_like(largest, window))
    lowest = torch.where(live, lut[smallest.long()], torch.full_like(smallest, T, dtype=torch.int64))
    highest = torch.where(live, lut[largest.long()], torch.zeros_like(smallest, dtype=torch.int64))
    return (lowest + 256 * highest).to(torch.int32).contiguous()


def _skip_buckets(tile_buckets: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """int32 ``[B, nQ]``: per query block the bucket whose one-bucket tiles the table kernel skips, the one
    with the most such tiles in that block's row of tiles (-1: none, or a table of more than
    :data:`STATIC_BUCKET_LIMIT` buckets). Device tensors, no host synchronisation."""
    B, nQ = tile_buckets.shape[:2]
    if num_buckets > STATIC_BUCKET_LIMIT:
        return torch.full((B, nQ), -1, dtype=torch.int32, device=tile_buckets.device)
    bits = 1 << torch.arange(num_buckets, dtype=torch.int32, device=tile_buckets.device)
    counts = (tile_buckets[..., None] == bits).sum(dim=2)  # [B, nQ, T]: one-bucket tiles per bucket
    best, bucket = counts.max(dim=-1)
    return torch.where(best > 0, bucket, torch.full_like(bucket, -1)).to(torch.int32).contiguous()


def table_heads(H: int, shared_table: bool) -> int:
    """Heads one table-gradient program takes: all of them for a table shared by the heads (the per-bucket
    reduction is paid once per tile, not once per head), one for per-head tables."""
    return H if shared_table else 1


@torch.library.triton_op("syntaxkernels::bias_attention_bwd", mutates_args=())
def bias_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor,
                            lengths: torch.Tensor, scale: float, window: int, causal: bool, max_distance: int,
                            log_distance: int, unreachable_bucket: bool, table_grad: bool,
                            symmetric: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launcher: ``(dq, dk, dv, G)``; ``G`` fp32 ``[H or 1, T]`` (like the LUT's rows) holds the
    per-bucket sums of dS, so ``d table = c * G`` and ``d c = sum(table * G)`` (zeros unless ``table_grad``).

    Args: as :func:`bias_attention_forward`, plus ``dout`` (like out, any strides), ``out``, ``lse``, the
    BucketSpec (:func:`bucket_args`), ``table_grad`` (compute G) and ``symmetric``: the distance is symmetric
    (a tree distance), so the dK/dV kernel reads its transposed tiles from it; else from a transposed copy.
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    spec = _spec(max_distance, log_distance, unreachable_bucket)
    T = spec.num_buckets
    rows = lut.shape[0]
    dq = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, H, N, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, H, N, DV), dtype=v.dtype, device=q.device)
    if dq.numel() == 0 or dv.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_(), torch.zeros((rows, T), dtype=torch.float32, device=q.device)
    lut = lut.contiguous()
    stride_lh = lut.stride(0) if rows > 1 else 0
    distance = aligned_distance(distance)
    # The dK/dV kernel reads the pair (query i, key j) at [b, j, i] (a tile contiguous along the queries).
    distance_t = distance if symmetric else per_batch((distance,), "transposed",
                                                      lambda: aligned_distance(distance.transpose(1, 2)))
    arch = current_arch()
    family = arch_family(arch)
    dkdv_config = select_config("dkdv", q.dtype, max(D, DV), family)
    dq_config = select_config("dq", q.dtype, max(D, DV), family)
    block_d, block_dv = head_block(D), head_block(DV)
    precision = dot_precision(q.dtype)

    delta = _row_buffer(B, H, N, q.device)  # written by the dQ kernel (corrected with the table gradient)
    if lse.stride(1) != delta.stride(1) or lse.stride(2) != 1:  # an lse not from bias_attention_forward
        lse = _row_buffer(B, H, N, q.device, fill=float("inf")).copy_(lse)  # rows past N: no probability
    short = _short_config(N, q.dtype, max(D, DV), rows, family, arch)
    if short is not None:
        return _short_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec, table_grad,
                               short, dq, dk, dv, delta)
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), stride_lh, delta.stride(1))
    strides_t = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance_t.stride(), stride_lh,
                 delta.stride(1))

    # dQ first: programs own query blocks and write delta (corrected with the table gradient: see the kernel).
    block_m, block_n = dq_config["BLOCK_M"], dq_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    kv_list, kv_count = _lists(distance, lengths, block_m, block_n, window, causal, by_key=True)
    use_lists = kv_list is not None
    launch(_bias_bwd_dq_kernel, launch_grid(num_q, B, H),
           q, k, v, dout, out, distance, lut, lengths, kv_list if use_lists else lengths,
           kv_count if use_lists else lengths, lse, dq, delta, *strides[:16], *out.stride(), *strides[16:],
           *dq.stride(),
           H, _padded(N), N, D, DV, num_q, num_k, scale, scale * LOG2E,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
           EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), dq_config), USE_LISTS=use_lists, CAUSAL=causal,
           TABLE_GRAD=table_grad, DOT_PRECISION=precision,
           num_warps=dq_config["num_warps"], num_stages=dq_config["num_stages"],
           OPAQUE_BIAS=dq_config["OPAQUE_BIAS"], INTERPRETED=interpreting())

    # dK and dV: programs own key blocks.
    block_m, block_n = dkdv_config["BLOCK_M"], dkdv_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    q_list, q_count = _lists(distance, lengths, block_m, block_n, window, causal, by_key=False)
    use_lists = q_list is not None
    launch(_bias_bwd_dkdv_kernel, launch_grid(num_k, B, H),
           q, k, v, dout, distance_t, lut, lengths, q_list if use_lists else lengths,
           q_count if use_lists else lengths, lse, delta, dk, dv, *strides_t, *dk.stride(), *dv.stride(),
           H, _padded(N), N, D, DV, num_q, num_k, scale, scale * LOG2E,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
           EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), dkdv_config), USE_LISTS=use_lists, CAUSAL=causal,
           DOT_PRECISION=precision, num_warps=dkdv_config["num_warps"], num_stages=dkdv_config["num_stages"],
           OPAQUE_BIAS=dkdv_config["OPAQUE_BIAS"], INTERPRETED=interpreting())
    if not table_grad:
        return dq, dk, dv, torch.zeros((rows, T), dtype=torch.float32, device=q.device)

    # The table gradient: programs own a query block and a group of heads (all of them for a shared table).
    extra = window >= 0 or log_distance > 0 or T > STATIC_BUCKET_LIMIT
    table_config = select_config("table_extra" if extra else "table", q.dtype, max(D, DV), family, arch)
    block_m, block_n = table_config["BLOCK_M"], table_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    heads = table_heads(H, rows == 1)
    groups = H // heads
    kv_list, kv_count = _lists(distance, lengths, block_m, block_n, window, causal, by_key=True)
    use_lists = kv_list is not None
    tile_buckets = per_batch((distance, lengths), ("tile buckets", block_m, block_n, window, causal, spec),
                             lambda: _tile_buckets(distance, lengths, block_m, block_n, window, causal, spec))
    skip_bucket = per_batch((distance, lengths), ("skip bucket", block_m, block_n, window, causal, spec),
                            lambda: _skip_buckets(tile_buckets, T))
    partials = torch.empty((B * groups * num_q, T), dtype=torch.float32, device=q.device)
    launch(_bias_bwd_table_kernel, launch_grid(num_q, B, groups),
           q, k, v, dout, distance, lut, lengths, kv_list if use_lists else lengths,
           kv_count if use_lists else lengths, tile_buckets, skip_bucket, lse, delta, partials, *strides,
           H, _padded(N), D, DV, num_q, num_k, scale * LOG2E, HEADS=heads,  # (by name: the inspection reads it)
           NUM_BUCKETS=T, BUCKETS_PAD=max(16, triton.next_power_of_2(T)), STATIC_BUCKETS=T <= STATIC_BUCKET_LIMIT,
           MAX_DISTANCE=max_distance, LOG_DISTANCE=log_distance, UNREACHABLE_BUCKET=unreachable_bucket,
           LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=min(64, block_d, block_dv),
           EVEN_D=block_d == D, EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), table_config), USE_LISTS=use_lists, CAUSAL=causal,
           INTERPRETED=interpreting(), DOT_PRECISION=precision,
           num_warps=table_config["num_warps"], num_stages=table_config["num_stages"],
           OPAQUE_BIAS=table_config["OPAQUE_BIAS"])
    # A fixed-order sum of the per-program bucket sums: deterministic. Rows: [1, T] shared, [H, T] per head.
    bucket_grad = partials.view(B, groups, num_q, T).sum(dim=(0, 2))
    return dq, dk, dv, bucket_grad


def _short_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec, table_grad, config,
                    dq, dk, dv, delta):
    """:func:`bias_attention_backward` for short rows (one tile a sequence): :func:`_bias_bwd_short_kernel`
    (every head of one batch item a program: dQ, dK, dV and each head's dS), then with ``table_grad``
    :func:`_bias_bwd_short_table_kernel` (the heads' dS summed and reduced per bucket once)."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    T = spec.num_buckets
    block = config["BLOCK_M"]
    block_d, block_dv = head_block(D), head_block(DV)
    if N > block:
        return _short2_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec,
                                table_grad, config, dq, dk, dv, delta)
    # Each head's dS: B * H tiles of BLOCK^2 fp32 (16 KiB a head and sequence at BLOCK = 64).
    ds = torch.empty((B, H, block, block), dtype=torch.float32, device=q.device) if table_grad else lengths
    launch(_bias_bwd_short_t_kernel if config.get("KEYS_MAJOR") else _bias_bwd_short_kernel, (B,),
           q, k, v, dout, distance, lut, lengths, lse, dq, dk, dv, ds,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), lse.stride(1),
           *dq.stride(), *dk.stride(), *dv.stride(),
           _padded(N), N, D, DV, scale, scale * LOG2E, HEADS=H,  # (by name: the inspection reads it)
           BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DV=block_dv,
           CHUNK=min(config["CHUNK"], block_d, block_dv), OUT_CHUNK=min(config["OUT_CHUNK"], block_d, block_dv),
           DQ_T=config["DQ_T"], EVEN_D=block_d == D, EVEN_DV=block_dv == DV,
           EVEN_N=_even(_padded(N), config), CAUSAL=causal, TABLE_GRAD=table_grad, DOT_PRECISION=dot_precision(q.dtype),
           INTERPRETED=interpreting(), OPAQUE_BIAS=config["OPAQUE_BIAS"],
           num_warps=config["num_warps"], num_stages=config["num_stages"])
    if not table_grad:
        return dq, dk, dv, torch.zeros((1, T), dtype=torch.float32, device=q.device)
    return dq, dk, dv, _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 1)


def _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, blocks):
    """The table gradient of the short-row kernels' dS tiles (:func:`_bias_bwd_short_table_kernel`): fp32
    ``[1, T]``, the per-tile bucket sums added in a fixed order."""
    B, N = distance.shape[0], distance.shape[-1]
    T = spec.num_buckets
    block = config["BLOCK_M"]
    partials = torch.empty((B * blocks * blocks, T), dtype=torch.float32, device=ds.device)
    launch(_bias_bwd_short_table_kernel, (B, blocks, blocks),
           ds, distance, _bucket_lut(spec, distance), lengths, partials, *distance.stride(), _padded(N), scale,
           window, HEADS=H, NUM_BUCKETS=T, BUCKETS_PAD=max(16, triton.next_power_of_2(T)),
           STATIC_BUCKETS=T <= STATIC_BUCKET_LIMIT, MAX_DISTANCE=spec.max_distance,
           LOG_DISTANCE=spec.log_distance or 0, UNREACHABLE_BUCKET=spec.unreachable_bucket,
           LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1, BLOCK_M=block, BLOCK_N=block,
           EVEN_N=_even(_padded(N), config), CAUSAL=causal, INTERPRETED=interpreting(), BLOCKS=blocks,
           num_warps=4, num_stages=1)
    return partials.sum(dim=0).view(1, T)


def _short2_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec, table_grad, config,
                     dq, dk, dv, delta):
    """:func:`bias_attention_backward` for rows of 65..128 tokens: :func:`_bias_bwd_short2_kernel` (every head
    of one batch item and query block a program; items of at most 64 tokens store their gradients, longer ones
    fp32 shares), :func:`_bias_bwd_short2_sum_kernel` (the shares added in a fixed order), then with
    ``table_grad`` the heads' dS summed and reduced per bucket once per tile. ``delta``: the caller's row buffer
    (lse's row stride), for the first pass's row sums."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    T = spec.num_buckets
    block = config["BLOCK_M"]
    block_d, block_dv = head_block(D), head_block(DV)
    f32 = dict(dtype=torch.float32, device=q.device)
    for grad in (dq, dk, dv):  # rows past an item's first block stay 0 where the item ends in it
        grad.zero_()
    # Shares [B, H, 2, BLOCK_D, 2 * BLOCK] (a head's two adjacent: the sum kernel reads both from one address; the
    # transposed products store contiguous rows), dQ's [B, H, 2, 2 * BLOCK, BLOCK_D] unless it is formed transposed;
    # read only for items longer than BLOCK.
    dq_t = config["DQ_T"]
    dq_part = torch.empty((B, H, 2, block_d, 2 * block) if dq_t else (B, H, 2, 2 * block, block_d), **f32)
    dk_part = torch.empty((B, H, 2, block_d, 2 * block), **f32)
    dv_part = torch.empty((B, H, 2, block_dv, 2 * block), **f32)
    # Each head's dS: B * H * 4 tiles of BLOCK^2 fp32 (64 KiB a head and sequence at BLOCK = 64).
    ds = torch.empty((B, H, 2, 2, block, block), **f32) if table_grad else lengths
    launch(_bias_bwd_short2_kernel, (B, 2),
           q, k, v, dout, distance, lut, lengths, lse, delta, dq, dk, dv, dq_part, dk_part, dv_part, ds,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), lse.stride(1),
           *dq.stride(), *dk.stride(), *dv.stride(),
           B, _padded(N), N, D, DV, scale, scale * LOG2E, HEADS=H,  # (by name: the inspection reads it)
           BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DV=block_dv,
           CHUNK=min(config["CHUNK"], block_d, block_dv), OUT_CHUNK=min(config["OUT_CHUNK"], block_d, block_dv),
           DQ_T=dq_t, EVEN_D=block_d == D, EVEN_DV=block_dv == DV,
           EVEN_N=_even(_padded(N), config), CAUSAL=causal, TABLE_GRAD=table_grad, DOT_PRECISION=dot_precision(q.dtype),
           num_warps=config["num_warps"], num_stages=config["num_stages"], INTERPRETED=interpreting(),
           OPAQUE_BIAS=config["OPAQUE_BIAS"])
    launch(_bias_bwd_short2_sum_kernel, (B * H,),
           lengths, dq_part, dk_part, dv_part, dq, dk, dv, *dq.stride(), *dk.stride(), *dv.stride(),
           B, _padded(N), N, D, DV, H, BLOCK_M=block, BLOCK_D=block_d, BLOCK_DV=block_dv, DQ_T=dq_t,
           CAUSAL=causal, num_warps=2 if max(block_d, block_dv) <= 64 else 4, num_stages=1)  # (2: fewer instructions)
    if not table_grad:
        return dq, dk, dv, torch.zeros((1, T), **f32)
    return dq, dk, dv, _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 2)


# ---------------------------------------------------------------------------------------------------------
# Autograd and the public functions
# ---------------------------------------------------------------------------------------------------------


class _SyntaxBiasAttention(torch.autograd.Function):
    """Autograd over the two Triton ops; gradients for q, k, v, the table and a tensor ``bias_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, distance, table, bias_scale, lengths, scale, window, causal, bucket_spec, symmetric):
        lut = bias_lut(table, bias_scale, _spec(*bucket_spec), window)
        out, lse = torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, lut, lengths, scale, window, causal)
        ctx.save_for_backward(q, k, v, out, lse, distance, table, bias_scale, lengths, lut)
        ctx.scale, ctx.window, ctx.causal, ctx.bucket_spec = scale, window, causal, bucket_spec
        ctx.symmetric = symmetric
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, table, bias_scale, lengths, lut = ctx.saved_tensors
        table_grad = bool(ctx.needs_input_grad[4] or ctx.needs_input_grad[5])
        dq, dk, dv, bucket_grad = torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, lut, lengths, ctx.scale, ctx.window, ctx.causal, *ctx.bucket_spec,
            table_grad, ctx.symmetric)
        dtable, dscale = table_gradients(bucket_grad, table, bias_scale, *ctx.needs_input_grad[4:6])
        return dq, dk, dv, None, dtable, dscale, None, None, None, None, None, None


def kernel_arguments(q: torch.Tensor, lengths, scale: Optional[float], bias_scale):
    """What the fused kernels (Triton and C++) take for the public arguments: int32 lengths on q's device (one
    tensor per batch, :func:`_int32_lengths`), the float score scale (default ``1 / sqrt(D)``) and the bias
    strength as a one-element tensor (a number or None becomes a constant one)."""
    lengths = _int32_lengths(lengths, q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if bias_scale is None or not isinstance(bias_scale, torch.Tensor):
        value = 1.0 if bias_scale is None else float(bias_scale)
        bias_scale = torch.full((1,), value, dtype=torch.float32, device=q.device)
    return lengths, scale, bias_scale


def table_gradients(bucket_grad: torch.Tensor, table: torch.Tensor, bias_scale: torch.Tensor, want_table: bool,
                    want_scale: bool):
    """``(d table, d bias_scale)`` (None where not wanted) from the per-bucket sums of dS ``G`` (``[H or 1, T]``,
    what the backward kernels return): ``d table = c * G`` and ``d c = sum_t table[t] * G[t]``."""
    bucket_grad = bucket_grad.reshape(table.shape)
    c = bias_scale.to(torch.float32).reshape(())
    dtable = (c * bucket_grad).to(table.dtype) if want_table else None
    dscale = None
    if want_scale:
        dscale = (table.to(torch.float32) * bucket_grad).sum().reshape(bias_scale.shape).to(bias_scale.dtype)
    return dtable, dscale


class _LutAttention(torch.autograd.Function):
    """Attention with a fixed per-distance bias (no table gradient): gradients for q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, distance, lut2, lengths, scale, symmetric):
        out, lse = torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, lut2, lengths, scale, -1, False)
        ctx.save_for_backward(q, k, v, out, lse, distance, lut2, lengths)
        ctx.scale, ctx.symmetric = scale, symmetric
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, lut2, lengths = ctx.saved_tensors
        # No table gradient: the BucketSpec arguments are unused (any valid spec would do).
        dq, dk, dv, _ = torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, lut2, lengths, ctx.scale, -1, False, *bucket_args(BucketSpec()),
            False, ctx.symmetric)
        return dq, dk, dv, None, None, None, None, None


def _check_head_dim(q: torch.Tensor, v: torch.Tensor) -> None:
    why = triton_unsupported(q, v)
    if why is not None:
        raise ValueError(why)


def _int32_lengths(lengths, q: torch.Tensor) -> torch.Tensor:
    """int32 ``[B]`` lengths on q's device (validated); one tensor per batch (:func:`per_batch`), so the block
    metadata computed from it is shared by every layer."""
    B, _, N, _ = q.shape
    if lengths is None:
        return torch.full((B,), N, dtype=torch.int32, device=q.device)

    def normalize():
        normalized = V.normalize_lengths(lengths, q)
        return normalized.to(torch.int32)

    if not isinstance(lengths, torch.Tensor):
        return normalize()
    return per_batch((lengths,), ("int32 lengths", B, N, str(q.device)), normalize)


def _aligned(distance: torch.Tensor) -> torch.Tensor:
    """:func:`aligned_distance`, copied once per batch when it copies (a distance not from a TreeBatch)."""
    return per_batch((distance,), "aligned", lambda: aligned_distance(distance))


def _symmetric(symmetric: Optional[bool], distance: torch.Tensor) -> bool:
    if symmetric is None:
        return known_symmetric(distance)
    if not isinstance(symmetric, bool):
        raise ValueError(f"symmetric must be None or a bool, got {symmetric!r}")
    return symmetric


def lut_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor,
                  lengths=None, scale: Optional[float] = None, *, symmetric: Optional[bool] = None) -> torch.Tensor:
    """Fused attention with a fixed bias per distance value: ``softmax(q k^T * scale + lut[d_ij]) v``.

    For masks expressible by distance (the sub-network op's ``full`` and ``pairwise`` masks, windows): no
    table gradient, gradients for q, k, v only. Triton only (CUDA tensors, or CPU under the interpreter).

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; distance: uint8 ``[B, N, N]``.
        lut: float ``[256]`` or ``[H, 256]``: the natural-log bias of each distance value; ``-inf`` = pair not
            allowed.
        lengths: ``int [B]`` or a boolean key-padding mask; scale: default ``1 / sqrt(D)``.
        symmetric: as in :func:`syntax_bias_attention`.
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; rows with no allowed key (and rows past the length) are 0.
    """
    V.check_qkv(q, k, v)
    V.check_distance(distance, q)
    _check_head_dim(q, v)
    if lut.shape[-1] != 256 or lut.dim() not in (1, 2) or (lut.dim() == 2 and lut.shape[0] != q.shape[1]):
        raise ValueError(f"lut must have shape [256] or [H, 256], got {tuple(lut.shape)}")
    symmetric = _symmetric(symmetric, distance)
    lengths = _int32_lengths(lengths, q)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    lut2 = (lut.to(torch.float32).reshape(-1, 256) * LOG2E).contiguous()
    return _LutAttention.apply(q, k, v, _aligned(distance), lut2, lengths, float(scale), symmetric)


def syntax_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                          table: torch.Tensor, *, buckets: BucketSpec, scale: Optional[float] = None,
                          bias_scale=None, lengths=None, window: Optional[int] = None, causal: bool = False,
                          deterministic: bool = False, backend: str = "auto",
                          symmetric: Optional[bool] = None, cu_seqlens: Optional[torch.Tensor] = None,
                          max_seqlen: Optional[int] = None) -> torch.Tensor:
    """Attention with a learnable tree-distance bias, fused (Triton) or by the reference.

    Packed batches: with ``cu_seqlens`` (int32 ``[S + 1]``), q, k, v are ``[T, H, D]`` (flash-attention's varlen
    layout), ``distance`` is a :class:`~syntaxkernels.trees.PackedTreeBatch`'s per-sequence distance (uint8
    ``[sum n_s^2]``) and attention stays within each sequence; ``lengths`` and ``symmetric`` do not apply. See
    :func:`syntaxkernels.ops.bias_attention_varlen.syntax_bias_attention_varlen`.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)]`` over the allowed pairs, ``o_i = softmax(s_i) v``.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device.
        distance: ``uint8 [B, N, N]`` (255 = unreachable); any uint8 distance, symmetric or not (see
            ``symmetric``). Rows whose start and stride are multiples of 16 bytes (a :class:`TreeBatch`'s) are read
            in place; others are copied into such rows first (B x N x roundup(N, 16) bytes per call).
        table: ``[T]`` shared or ``[H, T]`` per head, ``T = buckets.num_buckets``; gets a gradient.
        buckets: :class:`syntaxkernels.BucketSpec`.
        scale: default ``1 / sqrt(D)``.
        bias_scale: the strength c: None (1), a float, or a one-element tensor (gets a gradient).
        lengths: ``int [B]`` or a boolean key-padding mask ``[B, N]`` (True = padding).
        window: allow only ``d_ij <= window`` (0..254); tiles without such a pair are skipped.
        causal: allow only ``j <= i``.
        deterministic: bit-identical gradients run to run (the Triton path always is: no atomics).
        symmetric: whether ``distance[b, i, j] == distance[b, j, i]``. None (default): known for a
            :class:`TreeBatch`'s distance and :func:`tree_distance`'s result, else taken as not symmetric. The
            Triton backward reads the transposed distance; when it is not known to be symmetric, from a transposed
            copy (one more B x N x N bytes), so a directed distance gets exact gradients. Passing True for a
            distance that is not symmetric gives wrong dK, dV and table gradients there.
        backend: "auto" (Triton on CUDA tensors, the C++ kernels of :mod:`.bias_attention_cpu` on CPU tensors;
            inputs the kernels do not take, float64 or head dims above 128 on CUDA, run the reference), "triton"
            (raises ValueError for such inputs) or "reference".
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; query rows past the length and rows with no allowed key are 0.

    Equivalent PyTorch::

        bias = table[..., buckets.lut()[distance.long()]] * c           # [B, 1 or H, N, N]
        s = (q @ k.transpose(-1, -2)) * scale + bias
        s = s.masked_fill(~allowed_pairs(distance, lengths, window, causal)[:, None], -inf)
        out = torch.nan_to_num(s.softmax(-1)) @ v
    """
    if cu_seqlens is not None:  # packed (varlen) batches: their own kernels
        from .bias_attention_varlen import syntax_bias_attention_varlen

        if lengths is not None:
            raise ValueError("lengths does not apply to a packed batch (cu_seqlens gives the sequences)")
        return syntax_bias_attention_varlen(q, k, v, distance, table, buckets=buckets, cu_seqlens=cu_seqlens,
                                            max_seqlen=max_seqlen, scale=scale, bias_scale=bias_scale,
                                            window=window, causal=causal, deterministic=deterministic,
                                            backend=backend)
    V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic)
    symmetric = _symmetric(symmetric, distance)
    chosen = kernels_or_reference(backend, resolve_backend(backend, q.device), q, v)
    if backend == "auto" and q.device.type == "cpu":  # the fused C++ kernels (float64: the reference)
        from .bias_attention_cpu import cpu_bias_attention, cpu_kernels_take

        if cpu_kernels_take(q, v):
            return cpu_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale, bias_scale=bias_scale,
                                      lengths=lengths, window=window, causal=causal)
    if chosen == "reference":
        return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=lengths, window=window,
                                               causal=causal)
    lengths, scale, bias_scale = kernel_arguments(q, lengths, scale, bias_scale)
    try:
        return _SyntaxBiasAttention.apply(q, k, v, _aligned(distance), table, bias_scale, lengths, float(scale),
                                          -1 if window is None else int(window), bool(causal), bucket_args(buckets),
                                          symmetric)
    except KernelDoesNotFit as error:
        if backend != "auto":
            raise
        _warn_once(f"syntax_bias_attention runs the reference on this GPU: {error}")
        return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=lengths, window=window, causal=causal)


_WARNED = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
