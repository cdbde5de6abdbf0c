"""The Triton kernels of the distance-bias op on packed (varlen) batches: S sequences in T tokens, no padding.

``out[t] = softmax_j(q_t . k_j * scale + c * table[bucket(d(t, j))]) v`` over the keys j of t's own sequence, with
q, k, v ``[T, H, D]`` (flash-attention's varlen layout), ``cu_seqlens int32 [S + 1]`` and the packed distance
``uint8 [sum n_s^2]`` of a :class:`~syntaxkernels.trees.PackedTreeBatch` (sequence s's ``n_s x n_s`` block at
``sum_{r < s} n_r^2``, row stride ``n_s``). Forward, dq, dk, dv and the table (and bias-scale) gradient;
deterministic (no atomics), no host synchronisation, nothing of size ``T^2``; every row offset is formed in
int64 before a stride multiplies it (:func:`_rows_at`), so ``T * H * D`` may pass 2^31.

Tiles are shared by sequences. A query block is BLOCK_M consecutive packed tokens, whatever sequences they
belong to; it visits the key tiles of ``[start of its first token's sequence, end of its last token's
sequence)`` (tiles start there, not at multiples of BLOCK_N), and pairs of different sequences are masked
(their token's sequence ids differ). The dK/dV kernel is the mirror image (a key block visits the query
tiles of its sequences). The distance of a pair (i, j) of sequence s is gathered at
``offsets[s] + (i - start_s) * n_s + (j - start_s)``: one per-row base and a column offset, so each element
costs one masked uint8 load and one LUT gather (the LUT of :func:`._host.bias_lut`). The tile sides
are small (32 x 32) so that short sequences fill them: on UD English-EWT dev (median 10 words plus [CLS] and
[SEP]) 31% of the pairs the tiles compute are valid, against 3.7% for batches of 32 padded to their longest with
128 x 64 tiles (``python -m syntaxkernels inspect --workload sentences-packed`` reports the figure: 38% on its
256 sentences).

Kernels:

- ``_varlen_fwd_kernel``: one query block: output rows and their log2-sum-exp (online softmax).
- ``_varlen_dq_kernel``: one query block: dQ, and ``delta + rowsum(dS)`` (the corrected delta, as in the
  padded op: the table kernel's per-bucket sums then see rows of dS summing to zero).
- ``_varlen_dkdv_kernel``: one key block of one key/value head: dK, dV, summed over the head's group of query
  heads in order (and for a per-head table each query head's per-bucket sums of dS; with STORE_DS each head's dS,
  stored for the table kernel).
- ``_varlen_table_kernel``: one query block and the heads of a shared table: dS
  recomputed per head (or, STORED_DS, read where the dK/dV kernel stored it: batches of short sequences,
  :func:`stores_ds`) and summed over the heads, then added to the buckets once per element (the padded op's
  ``_bucket_sums``, over the bucket range of the tile's live distances); one ``[T_b]`` row per program,
  reduced in a fixed order by the launcher (the table gradient without atomics).

``delta = rowsum(dO * O)`` is formed by the dQ kernel from its own rows (no separate reduction).

Grouped-query attention: k and v may have ``H_kv`` heads (``H % H_kv == 0``); every kernel reads key/value head
``h // kv_group`` for query head h (``kv_group = H / H_kv``, a runtime argument that Triton specialises at 1, so
the plain op compiles as before), no copy of K/V per query head.

Every tile takes the masked path (a packed tile holds several sequences). Windows come from the LUT (``-inf``
beyond the window); ``causal`` keeps ``j <= i`` (within a sequence, as packed positions keep the order). A
positional window (the BAND variant, runtime ``band``) keeps ``|i - j| <= band``: two tokens of one sequence lie as
far apart in the packed row as in their sequence, so the packed indices give it, and a block walks only the tiles
within ``band`` of its own tokens.

Also here: the choice of configuration (:func:`select_varlen_config`, from :data:`.configs.CONFIGS`), the
launchers (``torch.library`` Triton ops ``syntaxkernels::bias_attention_varlen_fwd`` / ``_bwd``) and the autograd
Functions (:class:`_VarlenBiasAttention`; :class:`_VarlenLut`, a fixed per-distance bias). The public function, the C++ path and the reference of packed
batches: :mod:`._varlen`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ...specs import BucketSpec
from .._primitives import (LOG2E, arch_family, build_lut, build_position_lut, current_arch, dot_precision,
                           dropout_arguments, dropout_keep_pairs, head_block, interpreting, launch, launch_grid,
                           load_rows, lut_bias, mma, mma_acc, position_bias, program_ids, seed_bits, KernelDoesNotFit)
from .. import _replay
from .._dispatch import device_constant
from ._backward import _bucket_accumulators, _bucket_sums, _bucket_totals, _offset_prefix_sums
from ._host import (LUT_BUCKETS, _bucket_lut, _spec, bucket_args, kernel_tables, position_bounds_on,
                    position_matrix_on, reference_gradients, warn_once)
from .configs import CONFIGS, CONSUMER_BLACKWELL_CONFIGS, STATIC_BUCKET_LIMIT, STORED_DS_PAIRS_PER_TOKEN

__all__ = ["varlen_forward", "varlen_backward", "select_varlen_config", "stores_ds"]


# ---------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _rows_meta(SEQ, CU, DOFF, offs, T):
    """Per packed token of ``offs``: ``(sequence id, distance row base, sequence start)``; -1, 0, 0 past T.

    The pair (i, j) of one sequence is at ``DIST + base_i + j`` (``base_i = offset_s + (i - start_s) * n_s -
    start_s``); ``start_s`` (int64, the sequence's first packed token) gives positions within the sequence."""
    in_range = offs < T
    seq = tl.load(SEQ + offs, mask=in_range, other=-1)
    safe = tl.maximum(seq, 0)
    start = tl.load(CU + safe, mask=in_range, other=0).to(tl.int64)
    end = tl.load(CU + safe + 1, mask=in_range, other=0).to(tl.int64)
    base = tl.load(DOFF + safe, mask=in_range, other=0) + (offs.to(tl.int64) - start) * (end - start) - start
    return seq, base, start


@triton.jit
def _cols_meta(SEQ, CU, DOFF, offs, T):
    """Per packed token of ``offs`` taken as the *key* of a pair: ``(sequence id, base, n, start)``: the pair (query
    i, key j) is at ``DIST + base_j + i * n_j`` (``base_j = offset_s - start_s * n_s + j - start_s``); ``start_s``
    int64 as in :func:`_rows_meta`."""
    in_range = offs < T
    seq = tl.load(SEQ + offs, mask=in_range, other=-1)
    safe = tl.maximum(seq, 0)
    start = tl.load(CU + safe, mask=in_range, other=0).to(tl.int64)
    end = tl.load(CU + safe + 1, mask=in_range, other=0).to(tl.int64)
    n = end - start
    base = tl.load(DOFF + safe, mask=in_range, other=0) - start * n + offs.to(tl.int64) - start
    return seq, base, n, start


@triton.jit
def _transposed_pairs(base_n, offs_n, len_n, start_m, rows):
    """int64 ``[BLOCK_N, BLOCK_M]``: where the pairs (query ``start_m + rows[i]``, key ``offs_n[j]``) of one
    sequence lie in a buffer laid out like the packed distance but transposed in each sequence's block (key-major:
    ``offset_s + (j - start_s) * n_s + (i - start_s)``), from :func:`_cols_meta`'s ``base_n``, ``len_n`` of the keys
    (``base_n = offset_s - start_s * n_s + j - start_s``). Key rows, consecutive queries adjacent: the layout the
    dK/dV kernel's transposed dS tile stores without a shuffle."""
    return (base_n + offs_n.to(tl.int64) * (len_n - 1) + start_m)[:, None] + rows[None, :]


@triton.jit
def _keep(seed, threshold, bh, start, offs_m, offs_n):
    """bool ``[BLOCK_M, BLOCK_N]``: the attention-dropout keep mask of the pairs (query ``offs_m[i]``, key
    ``offs_n[j]``) of a packed tile, both packed token indices, with ``bh [BLOCK_M]`` (``sequence * H + head``) and
    ``start [BLOCK_M]`` (the sequence's first token) of each query row: the positions in the sequence are ``offs -
    start`` (:func:`syntaxkernels.reference.dropout_keep` of batch item = sequence). Only the pairs of one
    sequence (the allowed ones) draw a meaningful bit; the others are masked by the caller. One Philox call per
    pair (:func:`._primitives.dropout_keep_pairs`: a tile's keys are not aligned to 4 within a sequence)."""
    start32 = start.to(tl.int32)
    cols = offs_n[None, :] - start32[:, None]
    rows = offs_m[:, None] - start32[:, None] + cols * 0
    return dropout_keep_pairs(seed, threshold, bh[:, None], rows, cols)


@triton.jit
def _keep_t(seed, threshold, bh, start, offs_n, offs_m):
    """:func:`_keep` transposed, ``[BLOCK_N, BLOCK_M]`` (keys are rows, as in the dK/dV kernel): ``bh [BLOCK_N]``
    and ``start [BLOCK_N]`` of each key; the pair (key ``offs_n[j]``, query ``offs_m[i]``) draws query position
    ``offs_m[i] - start[j]`` and key position ``offs_n[j] - start[j]``."""
    start32 = start.to(tl.int32)
    rows = offs_m[None, :] - start32[:, None]
    cols = offs_n[:, None] - start32[:, None] + rows * 0
    return dropout_keep_pairs(seed, threshold, bh[:, None], rows, cols)


@triton.jit
def _span(SEQ, CU, block_start, BLOCK: tl.constexpr, T):
    """``[first, end)``: the tokens of the sequences that the block ``[block_start, block_start + BLOCK)`` touches."""
    last = tl.minimum(block_start + BLOCK, T) - 1
    first_seq = tl.load(SEQ + block_start)
    last_seq = tl.load(SEQ + last)
    return tl.load(CU + first_seq), tl.load(CU + last_seq + 1)


@triton.jit
def _rows_at(base, first, stride):
    """``base + first * stride`` in int64: row ``first`` (a packed token index) of a ``[T, ...]`` operand.

    Every packed row offset goes through here before a stride multiplies it (``T * stride`` passes 2^31 on large
    packed batches, e.g. 2^20 tokens of 16 heads x 128); the offsets inside a tile (``arange * stride``) stay
    small."""
    return base + tl.cast(first, tl.int64) * stride


@triton.jit
def _in_band(rows, cols, band):
    """The positional window of packed tokens ``rows`` and ``cols`` (broadcast): ``|rows - cols| <= band``. Two
    tokens of one sequence lie as far apart in the packed row as in their sequence, so on the pairs the sequence
    test keeps this is ``|pos_i - pos_j| <= band`` with the positions counted within the sequence."""
    return tl.abs(rows - cols) <= band


@triton.jit
def _band_range(start, end, first, BLOCK: tl.constexpr, band):
    """``[start, end)`` cut to the tokens within ``band`` of some token of the block ``[first, first + BLOCK)``:
    the tiles a block walks with a positional window (the rest hold no pair in the window)."""
    return tl.maximum(start, first - band), tl.minimum(end, first + BLOCK + band)


@triton.jit
def _scores(q, k_base, lut_row, DIST, SEQ, seq_m, base_m, offs_m, start_n, cols, offs_d, kend, D, stride_kt,
            stride_kd, qk_scale2, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, SYNTAX: tl.constexpr,
            TILE_BASE: tl.constexpr, OPAQUE_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, BAND: tl.constexpr = False,
            band=0, pos_row=0, reach=0, POSITION: tl.constexpr = False):
    """``(scores, allowed, k)`` of the tile of keys ``start_n + cols``: log2-domain scores with the bias, -inf where
    not allowed (another sequence, causality, and with BAND the positional window: :func:`_in_band`). With POSITION
    T5's relative-position term of the head (:func:`position_bias` at the packed offset, which is the offset within
    the sequence on the allowed pairs)."""
    offs_n = start_n + cols
    seq_n = tl.load(SEQ + offs_n, mask=offs_n < kend, other=-2)
    allowed = seq_m[:, None] == seq_n[None, :]
    if CAUSAL:
        allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
    if BAND:
        allowed = allowed & _in_band(offs_m[:, None], offs_n[None, :], band)
    if TILE_BASE:  # the tile's first row as an int64 base, int32 offsets inside it
        k = load_rows(_rows_at(k_base, start_n, stride_kt), cols, offs_d, stride_kt, stride_kd, kend - start_n, D,
                      True, EVEN_D)
    else:  # int64 row offsets (fewer instructions in the forward's loop at D <= 64; the dQ kernel prefers the above)
        k = load_rows(k_base, offs_n.to(tl.int64), offs_d, stride_kt, stride_kd, kend, D, True, EVEN_D)
    scores = mma(q, tl.trans(k), DOT_PRECISION) * qk_scale2
    if SYNTAX:
        dist = tl.load(DIST + base_m[:, None] + offs_n[None, :], mask=allowed, other=255)
        scores += lut_bias(lut_row, dist, OPAQUE_BIAS, INTERPRETED)
        if POSITION:
            scores += position_bias(pos_row, offs_n[None, :] - offs_m[:, None], reach)
    scores = tl.where(allowed, scores, float("-inf"))
    return scores, allowed, k


@triton.jit(do_not_specialize=["seed"])  # (one compile for every seed)
def _varlen_fwd_kernel(
    Q, K, V, DIST, LUT, SEQ, CU, DOFF, OUT, LSE,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od, stride_lut, stride_lse,
    H, T, D, DV, num_q_blocks, qk_scale2,
    TABLE, SCALE, BUCKETS, stride_tr, window, seed, threshold, keep_scale, kv_group,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False,
    INTERPRETED: tl.constexpr = False, DROPOUT: tl.constexpr = False, BAND: tl.constexpr = False, band=0,
    POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False, PTABLE=0, stride_pt=0, PBUCKETS=0,
    POS_WIDTH: tl.constexpr = 1,
):
    """Forward for one packed query block of one head.

    Args:
        Q: ``[T, H, D]``, K: ``[T, H_kv, D]``; V: ``[T, H_kv, DV]``, OUT: ``[T, H, DV]`` (strided); query head h
            reads key/value head ``h // kv_group`` (``kv_group = H / H_kv``, grouped-query attention; 1 without it,
            a value Triton specialises). DIST: uint8 ``[sum n^2]``. LUT: fp32 ``[H or 1,
            256]`` (row stride ``stride_lut``, 0 when shared), log2 domain, -inf = not allowed: written first
            (:func:`build_lut`) from TABLE (row stride ``stride_tr``), SCALE, BUCKETS and the window, as the padded
            forward does.
        SEQ: int32 ``[T]`` sequence of each token; CU: int32 ``[S + 1]``; DOFF: int64 ``[S + 1]`` distance offsets.
        LSE: fp32 ``[H, T]`` (row stride ``stride_lse``), log2 domain, +inf for rows without an allowed key.
        seed, threshold, keep_scale: attention dropout with DROPOUT (:func:`._primitives.dropout_arguments`;
            unused otherwise): the probabilities of the dropped pairs (:func:`_keep`) leave the product with V, the
            normaliser keeps them, the output is scaled by ``keep_scale``. LSE stays the undropped softmax's.
        BAND, band: the positional window ``|pos_i - pos_j| <= band`` (positions within the sequence): masked in
            every tile (:func:`_in_band`), and the key tiles beyond every row's window are not walked
            (:func:`_band_range`). Off, it compiles as without.
        POS_LUT, stride_ph, reach, POSITION: T5's relative-position term, as in the padded forward (offsets within
            each sequence; the LUT written first from PTABLE, stride_pt, PBUCKETS, POS_WIDTH).
    Grid: ``(cdiv(T, BLOCK_M) * H,)``.
    """
    q_block, bh, b, h = program_ids(num_q_blocks, H)
    first = q_block * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = first + rows
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    seq_m, base_m, seq_start_m = _rows_meta(SEQ, CU, DOFF, offs_m, T)
    q = load_rows(_rows_at(Q + h * stride_qh, first, stride_qt), rows, offs_d, stride_qt, stride_qd, T - first, D,
                  True, EVEN_D)
    k_base = K + (h // kv_group) * stride_kh
    v_base = V + (h // kv_group) * stride_vh
    lut_row = LUT + h * stride_lut
    if SYNTAX:
        build_lut(TABLE, SCALE, BUCKETS, lut_row, TABLE + h * stride_tr, window, HAS_WINDOW)
    if POSITION:
        build_position_lut(POS_LUT + h * stride_ph, PTABLE + h * stride_pt, PBUCKETS, 2 * reach + 1, POS_WIDTH)
    kstart, kend = _span(SEQ, CU, q_block * BLOCK_M, BLOCK_M, T)
    if CAUSAL:
        kend = tl.minimum(kend, tl.minimum(q_block * BLOCK_M + BLOCK_M, T))
    if BAND:
        kstart, kend = _band_range(kstart, kend, first, BLOCK_M, band)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for start_n in range(kstart, kend, BLOCK_N):
        scores, allowed, k = _scores(q, k_base, lut_row, DIST, SEQ, seq_m, base_m, offs_m, start_n, cols, offs_d,
                                     kend, D, stride_kt, stride_kd, qk_scale2, EVEN_D, CAUSAL, DOT_PRECISION, SYNTAX,
                                     BLOCK_D > 64, OPAQUE_BIAS, INTERPRETED, BAND, band, POS_LUT + h * stride_ph,
                                     reach, POSITION)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:  # the normaliser above is the undropped softmax's; the product takes the kept pairs only
            p = tl.where(_keep(seed, threshold, seq_m * H + h, seq_start_m, offs_m, start_n + cols), p, 0.0)
        if BLOCK_D > 64:  # (the cheaper address form per head dim: see _scores)
            v = load_rows(_rows_at(v_base, start_n, stride_vt), cols, offs_dv, stride_vt, stride_vd, kend - start_n,
                          DV, True, EVEN_DV)
        else:
            v = load_rows(v_base, (start_n + cols).to(tl.int64), offs_dv, stride_vt, stride_vd, kend, DV, True,
                          EVEN_DV)
        acc = mma_acc(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
        m_i = m_new

    valid = (offs_m < T) & (l_i != 0.0)  # l_i NaN (a NaN or +inf score): the row is NaN, not 0
    denom = tl.where(valid, l_i, 1.0)
    out = tl.where(valid[:, None], acc / denom[:, None], 0.0)
    if DROPOUT:
        out = out * keep_scale
    lse = tl.where(valid, m_i + tl.log2(denom), float("inf"))
    o_ptrs = _rows_at(OUT + h * stride_oh, first, stride_ot) + rows[:, None] * stride_ot + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV))
    tl.store(LSE + h * stride_lse + offs_m, lse, mask=offs_m < T)


@triton.jit(do_not_specialize=["seed"])
def _varlen_dq_kernel(
    Q, K, V, DOUT, OUT, DIST, LUT, SEQ, CU, DOFF, LSE, DQ, DELTA_CORRECTED,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_gt, stride_gh, stride_gd, stride_ot, stride_oh, stride_od, stride_xt, stride_xh, stride_xd, stride_lut,
    stride_lse, H, T, D, DV, num_q_blocks, scale, qk_scale2, seed, threshold, keep_scale, kv_group,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TABLE_GRAD: tl.constexpr = True, SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False,
    INTERPRETED: tl.constexpr = False, DROPOUT: tl.constexpr = False, BAND: tl.constexpr = False, band=0,
    POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
):
    """dQ for one packed query block, and delta for the dK/dV kernel (fp32 ``[H, T]``): ``delta = rowsum(dO * O)``,
    formed here from its own rows (no separate reduction), corrected with TABLE_GRAD to ``delta + rowsum(dS)`` (the
    rows of dS then sum to zero for the per-bucket sums). Arguments as in the forward (K, V ``[T, H_kv, *]``, read
    at head ``h // kv_group``); DOUT and OUT ``[T, H, DV]``
    (strides ``stride_g*`` and ``stride_o*``), DQ like Q (strides ``stride_x*``). With DROPOUT (seed, threshold,
    keep_scale as in the forward; O is the dropped output) ``dP = (dO V^T) * keep * keep_scale`` and ``dS = P (dP -
    delta)`` with the undropped P: the forward's mask, drawn again (:func:`_keep`). BAND, band: the positional
    window, as in the forward (masked, far key tiles not walked); POS_LUT, stride_ph, reach, POSITION: T5's
    relative-position term, as in the forward (the launcher sets TABLE_GRAD for its table's gradient too)."""
    q_block, bh, b, h = program_ids(num_q_blocks, H)
    first = q_block * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = first + rows
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    seq_m, base_m, seq_start_m = _rows_meta(SEQ, CU, DOFF, offs_m, T)
    q = load_rows(_rows_at(Q + h * stride_qh, first, stride_qt), rows, offs_d, stride_qt, stride_qd, T - first, D,
                  True, EVEN_D)
    do = load_rows(_rows_at(DOUT + h * stride_gh, first, stride_gt), rows, offs_dv, stride_gt, stride_gd, T - first,
                   DV, True, EVEN_DV)
    o = load_rows(_rows_at(OUT + h * stride_oh, first, stride_ot), rows, offs_dv, stride_ot, stride_od, T - first,
                  DV, True, EVEN_DV)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    lse = tl.load(LSE + h * stride_lse + offs_m, mask=offs_m < T, other=float("inf"))
    k_base = K + (h // kv_group) * stride_kh
    v_base = V + (h // kv_group) * stride_vh
    lut_row = LUT + h * stride_lut
    kstart, kend = _span(SEQ, CU, q_block * BLOCK_M, BLOCK_M, T)
    if CAUSAL:
        kend = tl.minimum(kend, tl.minimum(q_block * BLOCK_M + BLOCK_M, T))
    if BAND:
        kstart, kend = _band_range(kstart, kend, first, BLOCK_M, band)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_error = tl.zeros([BLOCK_M], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for start_n in range(kstart, kend, BLOCK_N):
        scores, allowed, k = _scores(q, k_base, lut_row, DIST, SEQ, seq_m, base_m, offs_m, start_n, cols, offs_d,
                                     kend, D, stride_kt, stride_kd, qk_scale2, EVEN_D, CAUSAL, DOT_PRECISION, SYNTAX,
                                     True, OPAQUE_BIAS, INTERPRETED, BAND, band, POS_LUT + h * stride_ph, reach,
                                     POSITION)
        p = tl.exp2(scores - lse[:, None])  # -inf where not allowed (and lse = +inf for empty rows): 0
        v = load_rows(_rows_at(v_base, start_n, stride_vt), cols, offs_dv, stride_vt, stride_vd,
                      kend - start_n, DV, True, EVEN_DV)
        dp = mma(do, tl.trans(v), DOT_PRECISION)
        if DROPOUT:
            dp = tl.where(_keep(seed, threshold, seq_m * H + h, seq_start_m, offs_m, start_n + cols), dp * keep_scale,
                          0.0)
        ds = p * (dp - delta[:, None])
        dq = mma_acc(ds.to(k.dtype), k, dq, DOT_PRECISION)
        row_error += tl.sum(ds, 1)

    row_ok = offs_m < T
    dq = tl.where(row_ok[:, None], dq * scale, 0.0)
    dq_ptrs = _rows_at(DQ + h * stride_xh, first, stride_xt) + rows[:, None] * stride_xt + offs_d[None, :] * stride_xd
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    if TABLE_GRAD:
        delta += row_error
    tl.store(DELTA_CORRECTED + h * stride_lse + offs_m, delta, mask=row_ok)


@triton.jit(do_not_specialize=["seed"])
def _varlen_dkdv_kernel(
    Q, K, V, DOUT, DIST, LUT, SEQ, CU, DOFF, LSE, DELTA, DK, DV_OUT, BUCKET_LUT, BUCKET_PARTIALS,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_gt, stride_gh, stride_gd, stride_xt, stride_xh, stride_xd, stride_yt, stride_yh, stride_yd,
    stride_lut, stride_lse,
    H, T, D, DV, num_k_blocks, scale, qk_scale2, seed, threshold, keep_scale, kv_group,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
    TABLE_GRAD: tl.constexpr = False, NUM_BUCKETS: tl.constexpr = 1, BUCKETS_PAD: tl.constexpr = 16,
    STATIC_BUCKETS: tl.constexpr = True, MAX_DISTANCE: tl.constexpr = 1, LOG_DISTANCE: tl.constexpr = 0,
    UNREACHABLE_BUCKET: tl.constexpr = False, LAST_DISTANCE_BUCKET: tl.constexpr = 0,
    DROPOUT: tl.constexpr = False, BAND: tl.constexpr = False, band=0,
    POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False, POS_BOUNDS=0, POS_PARTIALS=0,
    NUM_BOUNDS: tl.constexpr = 16, POSITION_GRAD: tl.constexpr = False, DS=0, stride_dsh=0,
    STORE_DS: tl.constexpr = False,
):
    """dK, dV for one packed key block (BLOCK_N keys) of one key/value head, walking the query tiles of its
    sequences in transposed orientation (keys are rows). Grouped-query attention (K, V, DK, DV_OUT ``[T, H_kv, *]``,
    ``kv_group = H / H_kv``): the program walks the query heads ``h = kv * kv_group + g``, g = 0, 1, ... in order,
    each adding its products to the same dK, dV registers (a fixed order, no atomics); ``kv_group = 1`` (Triton
    specialises it) is one pass. DELTA: the dQ kernel's (corrected when the table takes a gradient, as in the
    padded op). A shared table's gradient is not here (:func:`_varlen_table_kernel` sums the heads' dS first);
    with TABLE_GRAD (a per-head table) this program also sums each query head's dS per bucket over each tile's
    bucket range (:func:`_tile_buckets`, :func:`._backward._bucket_sums`) and writes them once per head to
    ``BUCKET_PARTIALS [H * nK, NUM_BUCKETS]`` (row ``h * nK + key block``; BUCKET_LUT: int64 ``[256]``,
    ``BucketSpec.lut()``; both unused otherwise). With DROPOUT (seed, threshold, keep_scale as in the forward):
    ``dV = (P * keep)^T dO * keep_scale`` and dP takes the keep as in the dQ kernel (the mask of :func:`_keep_t`,
    the forward's pairs transposed, numbered by the query head). BAND, band: the positional window, as in the
    forward (masked; the query tiles beyond every key's window are not walked). POS_LUT, stride_ph, reach,
    POSITION: T5's relative-position term, as in the forward; with POSITION_GRAD (POS_BOUNDS, POS_PARTIALS
    ``[nK, H, NUM_BOUNDS]``, NUM_BOUNDS) the sums of each query head's dS at the position boundaries, as the padded
    dK/dV kernel writes them (:func:`._backward._offset_prefix_sums`; pairs of other sequences hold zero dS).
    With STORE_DS each query head's dS goes to ``DS`` (fp32 ``[H, sum n_s^2]``, head stride ``stride_dsh``; each
    sequence's block key-major, :func:`_transposed_pairs`), the allowed pairs only, for
    :func:`_varlen_table_kernel`'s STORED_DS variant to sum (the table gradient without a second recomputation).
    Grid: ``(cdiv(T, BLOCK_N) * H_kv,)``."""
    k_block, bkv, b, kv = program_ids(num_k_blocks, H // kv_group)
    first = k_block * BLOCK_N
    keys = tl.arange(0, BLOCK_N)
    offs_n = first + keys
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    seq_n, base_n, len_n, seq_start_n = _cols_meta(SEQ, CU, DOFF, offs_n, T)
    len_n32 = len_n.to(tl.int32)
    k = load_rows(_rows_at(K + kv * stride_kh, first, stride_kt), keys, offs_d, stride_kt, stride_kd, T - first, D,
                  True, EVEN_D)
    v = load_rows(_rows_at(V + kv * stride_vh, first, stride_vt), keys, offs_dv, stride_vt, stride_vd, T - first, DV,
                  True, EVEN_DV)
    qstart, qend = _span(SEQ, CU, first, BLOCK_N, T)
    if CAUSAL:
        qstart = tl.maximum(qstart, first)
    if BAND:
        qstart, qend = _band_range(qstart, qend, first, BLOCK_N, band)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    rows = tl.arange(0, BLOCK_M)
    if POSITION_GRAD:
        bounds = tl.load(POS_BOUNDS + tl.arange(0, NUM_BOUNDS))
        key_ok = offs_n < T
        pos_sums = tl.zeros([NUM_BOUNDS], dtype=tl.float32)
    for g in range(0, kv_group):
        h = kv * kv_group + g
        q_base = Q + h * stride_qh
        do_base = DOUT + h * stride_gh
        lut_row = LUT + h * stride_lut
        if TABLE_GRAD:
            sums = _bucket_accumulators(BLOCK_N, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
        if POSITION_GRAD:
            pos_sums = tl.zeros([NUM_BOUNDS], dtype=tl.float32)
        for start_m in range(qstart, qend, BLOCK_M):
            offs_m = start_m + rows
            in_range = offs_m < qend
            seq_m = tl.load(SEQ + offs_m, mask=in_range, other=-2)
            allowed_t = seq_n[:, None] == seq_m[None, :]
            if CAUSAL:
                allowed_t = allowed_t & (offs_n[:, None] <= offs_m[None, :])
            if BAND:
                allowed_t = allowed_t & _in_band(offs_n[:, None], offs_m[None, :], band)
            q = load_rows(_rows_at(q_base, start_m, stride_qt), rows, offs_d, stride_qt, stride_qd, qend - start_m,
                          D, True, EVEN_D)
            lse = tl.load(LSE + h * stride_lse + offs_m, mask=in_range, other=float("inf"))
            scores_t = mma(k, tl.trans(q), DOT_PRECISION) * qk_scale2
            if SYNTAX:
                # int64 per key and tile, int32 inside the tile (rows < BLOCK_M, n_j <= 2^24: n_j^2 bytes are stored)
                tile_base = base_n + tl.cast(start_m, tl.int64) * len_n
                dist_t = tl.load(DIST + tile_base[:, None] + rows[None, :] * len_n32[:, None], mask=allowed_t,
                                 other=255)
                bias_t = lut_bias(lut_row, dist_t, OPAQUE_BIAS, INTERPRETED)
                scores_t += bias_t
                if POSITION:
                    scores_t += position_bias(POS_LUT + h * stride_ph, offs_n[:, None] - offs_m[None, :], reach)
            p_t = tl.exp2(tl.where(allowed_t, scores_t - lse[None, :], float("-inf")))
            do = load_rows(_rows_at(do_base, start_m, stride_gt), rows, offs_dv, stride_gt, stride_gd,
                           qend - start_m, DV, True, EVEN_DV)
            if DROPOUT:  # (keep_scale applied to dV once at the end)
                keep_t = _keep_t(seed, threshold, seq_n * H + h, seq_start_n, offs_n, offs_m)
                dv = mma_acc(tl.where(keep_t, p_t, 0.0).to(do.dtype), do, dv, DOT_PRECISION)
            else:
                dv = mma_acc(p_t.to(do.dtype), do, dv, DOT_PRECISION)
            delta = tl.load(DELTA + h * stride_lse + offs_m, mask=in_range, other=0.0)
            dp_t = mma(v, tl.trans(do), DOT_PRECISION)
            if DROPOUT:
                dp_t = tl.where(keep_t, dp_t * keep_scale, 0.0)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = mma_acc(ds_t.to(q.dtype), q, dk, DOT_PRECISION)
            if STORE_DS:  # this head's dS at the allowed pairs, for the table kernel (STORED_DS)
                tl.store(DS + h.to(tl.int64) * stride_dsh + _transposed_pairs(base_n, offs_n, len_n, start_m, rows),
                         ds_t, mask=allowed_t)
            if POSITION_GRAD:
                pos_sums = _offset_prefix_sums(pos_sums, ds_t, first, offs_m, key_ok, bounds)
            if TABLE_GRAD and SYNTAX:  # a per-head table: this head's dS per bucket here, no recomputation
                walk, present = _tile_buckets(BUCKET_LUT, dist_t, allowed_t & (bias_t != float("-inf")),
                                              NUM_BUCKETS, STATIC_BUCKETS)
                if walk:
                    sums = _bucket_sums(sums, ds_t, dist_t, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE,
                                        LOG_DISTANCE, UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD,
                                        INTERPRETED)
        if TABLE_GRAD:  # one row of bucket sums per program and query head (keys past T hold zero dS)
            bucket_ids = tl.arange(0, BUCKETS_PAD)
            totals = _bucket_totals(sums, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
            program = (b * H + h) * num_k_blocks + k_block
            tl.store(BUCKET_PARTIALS + program * NUM_BUCKETS + bucket_ids, totals, mask=bucket_ids < NUM_BUCKETS)
        if POSITION_GRAD:
            slot = (k_block.to(tl.int64) * H + h) * NUM_BOUNDS
            tl.store(POS_PARTIALS + slot + tl.arange(0, NUM_BOUNDS), pos_sums)

    key_ok = offs_n < T
    dk = tl.where(key_ok[:, None], dk * scale, 0.0)
    if DROPOUT:
        dv = dv * keep_scale
    dv = tl.where(key_ok[:, None], dv, 0.0)
    dk_ptrs = _rows_at(DK + kv * stride_xh, first, stride_xt) + keys[:, None] * stride_xt + offs_d[None, :] * stride_xd
    dv_ptrs = (_rows_at(DV_OUT + kv * stride_yh, first, stride_yt) + keys[:, None] * stride_yt
               + offs_dv[None, :] * stride_yd)
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=key_ok[:, None] & (offs_d[None, :] < D))
    tl.store(dv_ptrs, dv.to(DV_OUT.dtype.element_ty), mask=key_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _tile_buckets(BUCKET_LUT, dist, live, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr):
    """``(walk, present)`` of one tile for :func:`._backward._bucket_sums`, from its live pairs' distances: the
    bucket of a distance does not decrease with it (clamped, log-spaced, then the unreachable bucket), so the
    buckets of the tile lie between those of its least and greatest live distance. Up to 31 buckets ``present``
    is the bit set of that range (a superset of the buckets held: exact for one bucket), else ``lowest + 256 *
    highest``. Two reductions per element, two LUT reads per tile; ``walk`` is False without a live pair."""
    d = dist.to(tl.int32)
    least = tl.min(tl.where(live, d, 256))
    greatest = tl.max(tl.where(live, d, -1))
    walk = least <= greatest
    lowest = tl.load(BUCKET_LUT + tl.minimum(least, 255)).to(tl.int64)
    highest = tl.load(BUCKET_LUT + tl.maximum(greatest, 0)).to(tl.int64)
    if STATIC_BUCKETS:  # bits lowest..highest (highest <= 30), formed in int64
        present = (((2 << highest) - 1) ^ ((1 << lowest) - 1)).to(tl.int32)
    else:
        present = (lowest + 256 * highest).to(tl.int32)
    return walk, present


@triton.jit(do_not_specialize=["seed"])
def _varlen_table_kernel(
    Q, K, V, DOUT, DIST, LUT, BUCKET_LUT, SEQ, CU, DOFF, LSE, DELTA, BUCKET_PARTIALS,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_gt, stride_gh, stride_gd, stride_lut, stride_lse,
    H, T, D, DV, num_q_blocks, qk_scale2, HEADS, seed, threshold, keep_scale, kv_group,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    LAST_DISTANCE_BUCKET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, CAUSAL: tl.constexpr,
    INTERPRETED: tl.constexpr, DOT_PRECISION: tl.constexpr, DROPOUT: tl.constexpr = False,
    BAND: tl.constexpr = False, band=0, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
    DS=0, stride_dsh=0, STORED_DS: tl.constexpr = False,
):
    """The table gradient of a packed batch: per bucket, the sum of dS over one packed query block's pairs and
    ``HEADS`` heads (the padded op's :func:`._backward._bias_bwd_table_kernel` on packed tiles).

    The block walks the key tiles of its sequences as :func:`_varlen_dq_kernel` does. A table shared by the heads
    (``HEADS = H``) has one bucket pattern for every head: per tile the kernel recomputes dS for each head (two
    products, as the dQ kernel's first two), sums the heads' dS in registers and routes the sum to the buckets
    once (:func:`._backward._bucket_sums`, the buckets of :func:`_tile_buckets`). With ``HEADS = 1`` a program
    takes one head and its own LUT row (the launcher sends per-head tables to the dK/dV kernel's TABLE_GRAD
    variant instead, which needs no recomputation). A tile without a live pair (another sequence, beyond the window,
    above the causal diagonal) costs its distance reductions only.

    Args:
        Q, K, V, DOUT, DIST, LUT, SEQ, CU, DOFF, LSE, kv_group: as in the dQ kernel (query head h reads key/value
            head ``h // kv_group``); BUCKET_LUT: int64 ``[256]``
            (``BucketSpec.lut()``).
        DELTA: fp32 ``[H, T]`` (row stride ``stride_lse``), the dQ kernel's corrected delta ``delta +
            rowsum(dS)``: the rows of dS recomputed from it sum to zero up to fp32 rounding, as in the padded op.
        BUCKET_PARTIALS: fp32 ``[(H / HEADS) * nQ, NUM_BUCKETS]``: each program's sums, written once and reduced in
            a fixed order by the launcher (no atomics).
        seed, threshold, keep_scale: with DROPOUT, each head's dP takes that head's keep mask as in the dQ kernel.
        BAND, band: the positional window, as in the dQ kernel; POS_LUT, stride_ph, reach, POSITION: T5's
            relative-position term, each head its own.
        DS, stride_dsh, STORED_DS: with STORED_DS the heads' dS is read from ``DS`` (fp32 ``[H, sum n_s^2]``,
            written by the dK/dV kernel's STORE_DS variant at the allowed pairs, which are the ones read) instead
            of recomputed: one masked load a head and element in place of two products and an exponential (the
            launcher takes it where the scratch is small: :data:`STORED_DS_PAIRS_PER_TOKEN`).
    Grid: ``(nQ * H / HEADS,)``.
    """
    q_block, bg, b, g = program_ids(num_q_blocks, H // HEADS)
    h0 = g * HEADS
    first = q_block * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = first + rows
    row_ok = offs_m < T
    seq_m, base_m, seq_start_m = _rows_meta(SEQ, CU, DOFF, offs_m, T)
    lut_row = LUT + h0 * stride_lut
    kstart, kend = _span(SEQ, CU, first, BLOCK_M, T)
    if CAUSAL:
        kend = tl.minimum(kend, tl.minimum(first + BLOCK_M, T))
    if BAND:
        kstart, kend = _band_range(kstart, kend, first, BLOCK_M, band)
    cols = tl.arange(0, BLOCK_N)
    sums = _bucket_accumulators(BLOCK_M, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    for start_n in range(kstart, kend, BLOCK_N):
        offs_n = start_n + cols
        seq_n = tl.load(SEQ + offs_n, mask=offs_n < kend, other=-2)
        allowed = seq_m[:, None] == seq_n[None, :]
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        if BAND:
            allowed = allowed & _in_band(offs_m[:, None], offs_n[None, :], band)
        dist = tl.load(DIST + base_m[:, None] + offs_n[None, :], mask=allowed, other=255)
        bias = tl.load(lut_row + dist.to(tl.int32))  # the same LUT row for every head of the program
        # Live: allowed and not beyond the window (-inf); a NaN bias stays live (its NaN reaches its bucket).
        walk, present = _tile_buckets(BUCKET_LUT, dist, allowed & (bias != float("-inf")), NUM_BUCKETS,
                                      STATIC_BUCKETS)
        if walk and STORED_DS:  # the dK/dV kernel's dS, summed over the heads
            ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            _, base_n, len_n, _ = _cols_meta(SEQ, CU, DOFF, offs_n, T)
            ds_ptrs = DS + h0.to(tl.int64) * stride_dsh + tl.trans(_transposed_pairs(base_n, offs_n, len_n, first,
                                                                                      rows))
            for j in range(0, HEADS):
                ds += tl.load(ds_ptrs, mask=allowed, other=0.0)
                ds_ptrs += stride_dsh
            sums = _bucket_sums(sums, ds, dist, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE,
                                UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED)
        elif walk:
            ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for j in range(0, HEADS):
                h = h0 + j
                kvh = h // kv_group  # its key/value head (grouped-query attention)
                # The products run over head-dim chunks of at most 64: fewer operand registers live.
                scores = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for c in tl.static_range(0, BLOCK_D, CHUNK):
                    offs_c = c + tl.arange(0, CHUNK)
                    q = load_rows(_rows_at(Q + h * stride_qh, first, stride_qt), rows, offs_c, stride_qt, stride_qd,
                                  T - first, D, True, EVEN_D)
                    k = load_rows(_rows_at(K + kvh * stride_kh, start_n, stride_kt), cols, offs_c, stride_kt,
                                  stride_kd, kend - start_n, D, True, EVEN_D)
                    scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
                lse = tl.load(LSE + h * stride_lse + offs_m, mask=row_ok, other=float("inf"))
                exponent = scores * qk_scale2 + bias - lse[:, None]
                if POSITION:
                    exponent += position_bias(POS_LUT + h * stride_ph, offs_n[None, :] - offs_m[:, None], reach)
                exponent = tl.where(allowed, exponent, float("-inf"))
                p = tl.exp2(exponent)
                # Dropout: dS = P * (dP * keep * keep_scale - delta). The mask is drawn before the dP product
                # (P * keep * keep_scale kept) above head dim 64 and after it below: the order that stays within
                # the registers (compiled for sm_80 and sm_90).
                if DROPOUT and BLOCK_DV > 64:
                    kept = tl.where(_keep(seed, threshold, seq_m * H + h, seq_start_m, offs_m, offs_n),
                                    p * keep_scale, 0.0)
                dp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for c in tl.static_range(0, BLOCK_DV, CHUNK):
                    offs_c = c + tl.arange(0, CHUNK)
                    do = load_rows(_rows_at(DOUT + h * stride_gh, first, stride_gt), rows, offs_c, stride_gt,
                                   stride_gd, T - first, DV, True, EVEN_DV)
                    v = load_rows(_rows_at(V + kvh * stride_vh, start_n, stride_vt), cols, offs_c, stride_vt,
                                  stride_vd, kend - start_n, DV, True, EVEN_DV)
                    dp = mma_acc(do, tl.trans(v), dp, DOT_PRECISION)
                delta = tl.load(DELTA + h * stride_lse + offs_m, mask=row_ok, other=0.0)
                if DROPOUT and BLOCK_DV > 64:
                    ds += kept * dp - p * delta[:, None]
                else:
                    if DROPOUT:
                        dp = tl.where(_keep(seed, threshold, seq_m * H + h, seq_start_m, offs_m, offs_n),
                                      dp * keep_scale, 0.0)
                    ds += p * (dp - delta[:, None])
            sums = _bucket_sums(sums, ds, dist, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE,
                                UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED)

    bucket_ids = tl.arange(0, BUCKETS_PAD)
    totals = _bucket_totals(sums, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    program = bg.to(tl.int64) * num_q_blocks + q_block
    tl.store(BUCKET_PARTIALS + program * NUM_BUCKETS + bucket_ids, totals, mask=bucket_ids < NUM_BUCKETS)


# ---------------------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------------------

#: Tests may force tile sides (BLOCK_M, BLOCK_N); None = the table's (:data:`.configs.CONFIGS`).
_BLOCK_OVERRIDE: Optional[Tuple[int, int]] = None


def stores_ds(shared_table_gradient: bool, pairs: int, tokens: int, kv_group: int = 1, dropout: bool = False,
              head_block: int = 64) -> bool:
    """Whether a packed backward's table gradient reads dS stored by the dK/dV kernel (STORE_DS / STORED_DS)
    rather than recomputing it: a shared table's gradient (``shared_table_gradient``; a per-head table's is summed
    inside the dK/dV kernel) on a batch of at most :data:`STORED_DS_PAIRS_PER_TOKEN` pairs a token (``pairs = sum
    n_s^2``, the packed distance's size, known without a device read): sequences of ~128 tokens or fewer, where the
    fp32 scratch (``H * pairs * 4`` bytes, written once and read once) moves no more than about q, k, v and dO read
    and dQ, dK, dV written at D = 64. Grouped-query attention (``kv_group > 1``) and dropout above head dim 64
    (``head_block``: the padded head dim) keep the recomputation: there the dK/dV kernel spills with the store (a
    group of query heads up to 304 B at D = 128, dropout 8-16 B)."""
    return (shared_table_gradient and kv_group == 1 and not (dropout and head_block > 64)
            and pairs <= STORED_DS_PAIRS_PER_TOKEN * tokens)


def select_varlen_config(kind: str, dtype: torch.dtype, head_dim: int, family: Optional[str] = None,
                         arch: Optional[int] = None) -> dict:
    """The launch configuration of the varlen ``kind`` ("fwd", "dq", "dkdv", "dkdv_ds", "dkdv_table", "table",
    "table_ds") kernel (:data:`.configs.CONFIGS`) for ``family`` (default: ``arch``'s, or the current GPU's when
    neither is given); on sm_120 and newer (``arch``, or the current GPU when no family is given) with
    :data:`.configs.CONSUMER_BLACKWELL_CONFIGS`' ``varlen_*`` entries."""
    if family is None and arch is None:
        arch = current_arch()
    family = family or arch_family(arch)
    if family == "unsupported":
        raise ValueError("no Triton configs for this GPU: the kernels need sm_80 or newer")
    cls = "fp32" if dtype == torch.float32 else "half"
    dim_class = 64 if head_block(head_dim) <= 64 else 128
    config = dict(CONFIGS[("varlen_" + kind, family, cls, dim_class)])
    if arch is not None and arch >= 120 and family == "small":
        config.update(CONSUMER_BLACKWELL_CONFIGS.get(("varlen_" + kind, cls, dim_class), {}))
    if _BLOCK_OVERRIDE is not None:
        config["BLOCK_M"], config["BLOCK_N"] = _BLOCK_OVERRIDE
    return config




# ---------------------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------------------


def _varlen_tile_state():
    return _BLOCK_OVERRIDE


_replay.STATE.append(_varlen_tile_state)


@_replay.replayed(seed=15)
def varlen_forward(q, k, v, distance, table, bias_scale, bucket_lut, cu_seqlens, sequence, offsets, scale: float,
                   window: int, causal: bool, syntax: bool = True, dropout_p: float = 0.0,
                   dropout_seed: Optional[int] = None, band: int = -1, position_table: Optional[torch.Tensor] = None,
                   pos_buckets: Optional[torch.Tensor] = None, reach: int = 0):
    """``(out [T, H, DV] in q's dtype, lse2 fp32 [H, T], lut fp32 [H or 1, 256], pos_lut fp32 [H, 2 * reach + 1]
    or None)`` from q ``[T, H, D]`` and k, v
    ``[T, H_kv, *]`` (``H % H_kv == 0``, grouped-query attention: query head h reads key/value head
    ``h // (H / H_kv)`` in place, no copy per query head): the kernel writes the
    log2-domain LUT from ``table`` (``[H or 1, T_b]``, rows contiguous), ``bias_scale`` and ``bucket_lut``
    (``BucketSpec.lut()``) and the window (-1: none), as the padded forward does; the packed plan's ``cu_seqlens``
    (int32 ``[S + 1]``), ``sequence`` (int32 ``[T]``) and ``distance_offsets`` (int64 ``[S + 1]``).
    ``dropout_p > 0``: attention dropout with the mask of ``dropout_seed`` (an int in ``[0, 2^64)``; sequence s
    draws batch item s's mask), the kernels' DROPOUT variant. ``band >= 0``: the positional window ``|pos_i - pos_j|
    <= band`` within each sequence, the kernels' BAND variant (-1: none). ``position_table``, ``pos_buckets``,
    ``reach``: T5's relative-position term (its ``[H, P]`` table and ``RelativePositionSpec.lut()`` on the device;
    None: none), the kernels' POSITION variant: the kernel writes ``pos_lut`` (:func:`._host.position_lut`'s
    values), which the backward reads."""
    from ._launch import _band, _forward_position

    T, H, D = q.shape
    DV = v.shape[-1]
    rows = table.shape[0]
    out = torch.empty((T, H, DV), dtype=q.dtype, device=q.device)
    lse = torch.empty((H, T), dtype=torch.float32, device=q.device)
    lut = torch.empty((rows, 256), dtype=torch.float32, device=q.device)
    pos_lut, position = _forward_position(q, position_table, pos_buckets, reach, T > 0 and H > 0)
    if T == 0 or H == 0:
        return out, lse, lut, pos_lut
    config = select_varlen_config("fwd", q.dtype, max(D, DV))
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    num_q = triton.cdiv(T, block_m)
    seed, threshold, keep_scale = dropout_arguments(dropout_p, dropout_seed)
    launch(_varlen_fwd_kernel, launch_grid(num_q, 1, H),
           q, k, v, distance, lut, sequence, cu_seqlens, offsets, out, lse, *q.stride(), *k.stride(), *v.stride(),
           *out.stride(), lut.stride(0) if rows > 1 else 0, lse.stride(0), H, T, D, DV, num_q, scale * LOG2E,
           table, bias_scale, bucket_lut, table.stride(0) if rows > 1 else 0, window, seed, threshold, keep_scale,
           H // k.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_block(D), BLOCK_DV=head_block(DV),
           EVEN_D=head_block(D) == D, EVEN_DV=head_block(DV) == DV, CAUSAL=causal,
           DOT_PRECISION=dot_precision(q.dtype), HAS_WINDOW=window >= 0, SYNTAX=syntax, OPAQUE_BIAS=True,
           INTERPRETED=interpreting(), DROPOUT=dropout_p > 0.0, **_band(band), **position,
           num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out, lse, lut, pos_lut


@_replay.replayed(seed=20)
def varlen_backward(dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale: float,
                    causal: bool, spec: BucketSpec, table, bias_scale, want_table: bool, want_scale: bool,
                    syntax: bool = True, dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
                    band: int = -1, pos_lut: Optional[torch.Tensor] = None, reach: int = 0,
                    pos_bounds: Optional[torch.Tensor] = None, pos_matrix: Optional[torch.Tensor] = None):
    """``(dq, dk, dv, d table, d bias_scale, d position table)`` (the table's and the strength's empty tensors unless
    wanted; T5's position table's gradient fp32 ``[H, P]`` with ``pos_bounds`` and ``pos_matrix``, else empty; dk, dv
    ``[T, H_kv, *]`` like k, v, each key/value head's the sum over its group's query heads, walked in order by the dK/dV
    kernel's program of that head): the dQ kernel (and delta, corrected when the table takes a gradient), the dK/dV
    kernel, then with a table gradient the table kernel (:func:`_varlen_table_kernel`: the heads of a shared table
    summed before the per-bucket reduction; on a batch of short sequences, :func:`stores_ds`, from the dS the dK/dV
    kernel stored into an fp32 ``[H, sum n_s^2]`` buffer, else recomputed) and the kernel that reduces its per-program
    sums in a fixed order (:func:`._launch.table_gradient`). ``dropout_p``, ``dropout_seed``: the forward's (``out`` its
    dropped output); every kernel draws the mask again. ``band``: the forward's positional window (-1: none).
    ``pos_lut``, ``reach``: the forward's relative-position term; ``pos_bounds``: its table's gradient wanted
    (:func:`._host.position_bounds`), summed at the boundaries by the dK/dV kernel (a per-head tree table then takes the
    table kernel, not the dK/dV kernel's inline sums), its per-program sums reduced and multiplied by ``pos_matrix``
    (:func:`._host.position_matrix_on`) in the table-gradient kernel: no aten kernel."""
    from ._launch import _band, _nothing, _position, table_gradient, table_heads

    T, H, D = q.shape
    DV = v.shape[-1]
    NB = spec.num_buckets
    rows = lut.shape[0]
    table_grad = (want_table or want_scale) and syntax
    dq = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    H_kv = k.shape[1]
    kv_group = H // H_kv  # query heads per key/value head (grouped-query attention; 1 without it)
    dk = torch.empty((T, H_kv, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((T, H_kv, DV), dtype=v.dtype, device=q.device)
    position = _position(pos_lut, reach)
    if pos_bounds is not None and pos_matrix is None:
        raise ValueError("pos_bounds needs pos_matrix (the boundaries-to-buckets matrix, _host.position_matrix_on)")
    if T == 0 or H == 0:
        partials = torch.zeros((1, 1, 1, NB), dtype=torch.float32, device=q.device)
        dpos = _nothing(q.device)
        if pos_bounds is not None:
            dpos = torch.zeros((H, pos_matrix.shape[1]), dtype=torch.float32, device=q.device)
        return (dq, dk, dv) + table_gradient(partials, 1, 1, 1, table, bias_scale, want_table, want_scale)[:2] + (
            dpos,)
    cu, seq = cu_seqlens, sequence
    stride_lut = lut.stride(0) if rows > 1 else 0
    block_d, block_dv = head_block(D), head_block(DV)
    precision = dot_precision(q.dtype)
    dropout = dropout_arguments(dropout_p, dropout_seed)  # (seed, threshold, keep_scale)
    dropping = dropout_p > 0.0

    config = select_varlen_config("dq", q.dtype, max(D, DV))
    num_q = triton.cdiv(T, config["BLOCK_M"])
    delta = torch.empty((H, T), dtype=torch.float32, device=q.device)  # written by the dQ kernel
    launch(_varlen_dq_kernel, launch_grid(num_q, 1, H),
           q, k, v, dout, out, distance, lut, seq, cu, offsets, lse, dq, delta,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *out.stride(), *dq.stride(), stride_lut,
           lse.stride(0), H, T, D, DV, num_q, scale, scale * LOG2E, *dropout, kv_group,
           BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d, BLOCK_DV=block_dv,
           EVEN_D=block_d == D, EVEN_DV=block_dv == DV, CAUSAL=causal, DOT_PRECISION=precision,
           TABLE_GRAD=table_grad or pos_bounds is not None, SYNTAX=syntax, OPAQUE_BIAS=True,
           INTERPRETED=interpreting(), DROPOUT=dropping, **_band(band), **position, num_warps=config["num_warps"],
           num_stages=config["num_stages"])

    # A per-head table: the dK/dV kernel sums its own head's dS per bucket (a separate kernel would recompute dS
    # for one head only); a shared table: the table kernel below sums the heads first.
    inline = table_grad and rows > 1 and not position
    # A shared table of a batch of short sequences: the dK/dV kernel stores each head's dS (fp32, the valid pairs
    # only: H x 4 bytes a pair) and the table kernel sums them; otherwise the table kernel recomputes dS.
    stored = stores_ds(table_grad and not inline, distance.numel(), T, kv_group, dropping, max(block_d, block_dv))
    config = select_varlen_config("dkdv_table" if inline else "dkdv_ds" if stored else "dkdv", q.dtype, max(D, DV))
    num_k = triton.cdiv(T, config["BLOCK_N"])
    gradient = {}
    if pos_bounds is not None:  # each program's sums at the boundaries, per query head: [nK, H, bounds]
        gradient = dict(POS_BOUNDS=pos_bounds, POS_PARTIALS=torch.empty((num_k, H, pos_bounds.numel()),
                                                                        dtype=torch.float32, device=q.device),
                        NUM_BOUNDS=pos_bounds.numel(), POSITION_GRAD=True)
    bucket_args_ = dict(TABLE_GRAD=True, NUM_BUCKETS=NB, BUCKETS_PAD=max(16, triton.next_power_of_2(NB)),
                        STATIC_BUCKETS=NB <= STATIC_BUCKET_LIMIT, MAX_DISTANCE=spec.max_distance,
                        LOG_DISTANCE=spec.log_distance or 0, UNREACHABLE_BUCKET=spec.unreachable_bucket,
                        LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1) if inline else {}
    partials = torch.empty((H * num_k, NB), dtype=torch.float32, device=q.device) if inline else delta
    scratch = dict(DS=torch.empty((H, distance.numel()), dtype=torch.float32, device=q.device),
                   stride_dsh=distance.numel()) if stored else {}
    launch(_varlen_dkdv_kernel, launch_grid(num_k, 1, H_kv),  # one program per (key block, key/value head)
           q, k, v, dout, distance, lut, seq, cu, offsets, lse, delta, dk, dv,
           _bucket_lut(spec, q) if inline else seq, partials,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(), stride_lut,
           lse.stride(0), H, T, D, DV, num_k, scale, scale * LOG2E, *dropout, kv_group,
           BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d, BLOCK_DV=block_dv,
           EVEN_D=block_d == D, EVEN_DV=block_dv == DV, CAUSAL=causal, DOT_PRECISION=precision, SYNTAX=syntax,
           OPAQUE_BIAS=True, INTERPRETED=interpreting(), DROPOUT=dropping, **bucket_args_, **_band(band),
           **position, **gradient, **scratch, STORE_DS=stored, num_warps=config["num_warps"],
           num_stages=config["num_stages"])
    # T5's table: the programs' boundary sums, reduced over the key blocks in a fixed order (deterministic) and
    # multiplied by the matrix in the table-gradient kernel, beside the tree table's gradient
    pos = None if pos_bounds is None else (gradient["POS_PARTIALS"], pos_matrix)
    if inline:  # row h sums its own num_k programs
        return (dq, dk, dv) + table_gradient(partials, 1, H, num_k, table, bias_scale, want_table, want_scale, pos)
    if not table_grad:
        if want_table or want_scale:  # no bias (syntax=False): the table takes no part, its gradients are zero
            partials = torch.zeros((1, rows, 1, NB), dtype=torch.float32, device=q.device)
            return (dq, dk, dv) + table_gradient(partials, 1, rows, 1, table, bias_scale, want_table, want_scale, pos)
        if pos is None:
            return dq, dk, dv, _nothing(q.device), _nothing(q.device), _nothing(q.device)
        return (dq, dk, dv) + table_gradient(pos[0], 0, 0, 0, table, bias_scale, False, False, pos)

    config = select_varlen_config("table_ds" if stored else "table", q.dtype, max(D, DV))
    num_q = triton.cdiv(T, config["BLOCK_M"])
    heads = table_heads(H, rows == 1)
    groups = H // heads
    partials = torch.empty((groups * num_q, NB), dtype=torch.float32, device=q.device)
    launch(_varlen_table_kernel, launch_grid(num_q, 1, groups),
           q, k, v, dout, distance, lut, _bucket_lut(spec, q), seq, cu, offsets, lse, delta, partials,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), stride_lut, lse.stride(0),
           H, T, D, DV, num_q, scale * LOG2E, HEADS=heads,  # (by name: the inspection reads it)
           seed=dropout[0], threshold=dropout[1], keep_scale=dropout[2], kv_group=kv_group, DROPOUT=dropping,
           NUM_BUCKETS=NB, BUCKETS_PAD=max(16, triton.next_power_of_2(NB)), STATIC_BUCKETS=NB <= STATIC_BUCKET_LIMIT,
           MAX_DISTANCE=spec.max_distance, LOG_DISTANCE=spec.log_distance or 0,
           UNREACHABLE_BUCKET=spec.unreachable_bucket, LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1,
           BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d, BLOCK_DV=block_dv,
           CHUNK=min(64, block_d, block_dv), EVEN_D=block_d == D, EVEN_DV=block_dv == DV, CAUSAL=causal,
           INTERPRETED=interpreting(), DOT_PRECISION=precision, **_band(band), **position, **scratch,
           STORED_DS=stored, num_warps=config["num_warps"], num_stages=config["num_stages"])
    # Per-head tables: row h sums its own num_q programs; a shared table sums all num_q of its one group.
    return (dq, dk, dv) + table_gradient(partials, 1, groups, num_q, table, bias_scale, want_table, want_scale, pos)


@torch.library.triton_op("syntaxkernels::bias_attention_varlen_fwd", mutates_args=())
def varlen_forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor, table: torch.Tensor,
                      bias_scale: torch.Tensor, bucket_lut: torch.Tensor, cu_seqlens: torch.Tensor,
                      sequence: torch.Tensor, offsets: torch.Tensor, scale: float, window: int,
                      causal: bool, dropout_p: float = 0.0, dropout_seed: int = 0,
                      band: int = -1, position_table: Optional[torch.Tensor] = None,
                      pos_buckets: Optional[torch.Tensor] = None, reach: int = 0
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`varlen_forward` as a torch.library op (``torch.compile`` traces the kernels through it);
    ``dropout_seed`` as :func:`~syntaxkernels.ops._primitives.seed_bits` writes it."""
    from ._launch import op_position_lut

    out, lse, lut, pos_lut = varlen_forward(q, k, v, distance, table, bias_scale, bucket_lut, cu_seqlens, sequence,
                                            offsets, scale, window, causal, dropout_p=dropout_p,
                                            dropout_seed=dropout_seed, band=band, position_table=position_table,
                                            pos_buckets=pos_buckets, reach=reach)
    return out, lse, lut, op_position_lut(pos_lut, q)


@torch.library.triton_op("syntaxkernels::bias_attention_varlen_bwd", mutates_args=())
def varlen_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor, cu_seqlens: torch.Tensor,
                       sequence: torch.Tensor, offsets: torch.Tensor, scale: float, causal: bool, max_distance: int,
                       log_distance: int, unreachable_bucket: bool, table: torch.Tensor, bias_scale: torch.Tensor,
                       want_table: bool, want_scale: bool, dropout_p: float = 0.0, dropout_seed: int = 0,
                       band: int = -1, pos_lut: Optional[torch.Tensor] = None, reach: int = 0,
                       pos_bounds: Optional[torch.Tensor] = None, pos_matrix: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`varlen_backward` as a torch.library op; the BucketSpec as :func:`._host.bucket_args`, ``dropout_seed``
    as :func:`~syntaxkernels.ops._primitives.seed_bits` writes it."""
    return varlen_backward(dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal,
                           _spec(max_distance, log_distance, unreachable_bucket), table, bias_scale, want_table,
                           want_scale, dropout_p=dropout_p, dropout_seed=dropout_seed, band=band, pos_lut=pos_lut,
                           reach=reach, pos_bounds=pos_bounds, pos_matrix=pos_matrix)



def _forward(q, k, v, distance, table, bias_scale, bucket_lut, cu_seqlens, sequence, offsets, scale, window, causal,
             dropout_p=0.0, dropout_seed=None, band=-1, position_table=None, pos_buckets=None, reach=0):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_attention_varlen_fwd(q, k, v, distance, table, bias_scale, bucket_lut,
                                                                 cu_seqlens, sequence, offsets, scale, window, causal,
                                                                 dropout_p, seed_bits(dropout_seed or 0), band,
                                                                 position_table, pos_buckets, reach)
    return varlen_forward(q, k, v, distance, table, bias_scale, bucket_lut, cu_seqlens, sequence, offsets, scale,
                          window, causal, dropout_p=dropout_p, dropout_seed=dropout_seed, band=band,
                          position_table=position_table, pos_buckets=pos_buckets, reach=reach)


def _backward(dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal, spec, table,
              bias_scale, want_table, want_scale, dropout_p=0.0, dropout_seed=None, band=-1, pos_lut=None, reach=0,
              pos_bounds=None, pos_matrix=None):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_attention_varlen_bwd(
            dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal, *bucket_args(spec),
            table, bias_scale, want_table, want_scale, dropout_p, seed_bits(dropout_seed or 0), band, pos_lut, reach,
            pos_bounds, pos_matrix)
    return varlen_backward(dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal, spec,
                           table, bias_scale, want_table, want_scale, dropout_p=dropout_p, dropout_seed=dropout_seed,
                           band=band, pos_lut=pos_lut, reach=reach, pos_bounds=pos_bounds, pos_matrix=pos_matrix)


@_replay.replayed(seed=13)
def _forward_step(q, k, v, table, bias_scale, distance, cu_seqlens, sequence, offsets, scale, window, causal,
                  dropout_p, dropout_seed, band, position, position_table, bucket_spec):
    """The forward of :class:`_VarlenBiasAttention` but its autograd bookkeeping: ``(out, lse, lut, rows,
    pos_lut)``; one replayed unit (:mod:`.._replay`)."""
    rows, ptable, pos_buckets, reach = kernel_tables(table, position, position_table)
    out, lse, lut, pos_lut = _forward(q, k, v, distance, rows, bias_scale, _bucket_lut(_spec(*bucket_spec), q),
                                      cu_seqlens, sequence, offsets, scale, window, causal, dropout_p, dropout_seed,
                                      band, ptable, pos_buckets, reach)
    return out, lse, lut, rows, pos_lut if position is not None else None


@_replay.replayed(seed=19)
def _backward_step(dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal, bucket_spec,
                   rows, bias_scale, want_table, want_scale, dropout_p, dropout_seed, band, pos_lut, position,
                   want_position, position_table):
    """The kernels of :class:`_VarlenBiasAttention`'s backward, one replayed unit: :func:`_backward`'s results, the
    last T5's table's gradient in its dtype (None without ``want_position``)."""
    dq, dk, dv, dtable, dscale, dposition = _backward(
        dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, scale, causal, _spec(*bucket_spec),
        rows, bias_scale, want_table, want_scale, dropout_p, dropout_seed, band, pos_lut,
        0 if position is None else position.reach, position_bounds_on(position, q) if want_position else None,
        position_matrix_on(position, q) if want_position else None)
    return dq, dk, dv, dtable, dscale, dposition.to(position_table.dtype) if want_position else None


# ---------------------------------------------------------------------------------------------------------
# Autograd and the public functions
# ---------------------------------------------------------------------------------------------------------


class _VarlenBiasAttention(torch.autograd.Function):
    """Autograd over the varlen Triton kernels: gradients for q, k, v, the table, a tensor bias_scale and T5's
    position table. Inputs: ``q, k, v, table, bias_scale``, the packed plan's ``distance, cu_seqlens, sequence,
    distance_offsets``, ``position_table`` (T5's relative-position term's ``[H, P]``, None without the term), then
    one tuple of the call's other arguments (one input, not nine: a Function's apply costs about half a
    microsecond per input): ``scale, window, causal``, the BucketSpec as :func:`._host.bucket_args`, ``fallback``
    (a backward kernel that does not fit this GPU gives way to the reference, with a warning), ``dropout_p`` and
    ``dropout_seed`` (attention dropout: the kernels' DROPOUT variant; the backward draws the forward's mask again),
    ``band`` (the positional window ``|pos_i - pos_j| <= band`` within each sequence, -1 for none: the kernels' BAND
    variant) and ``position`` (T5's term's RelativePositionSpec, or None)."""

    @staticmethod
    def forward(ctx, q, k, v, table, bias_scale, distance, cu_seqlens, sequence, offsets, position_table, static):
        scale, window, causal, bucket_spec, fallback, dropout_p, dropout_seed, band, position = static
        out, lse, lut, rows, pos_lut = _forward_step(q, k, v, table, bias_scale, distance, cu_seqlens, sequence,
                                                     offsets, scale, window, causal, dropout_p, dropout_seed, band,
                                                     position, position_table, bucket_spec)
        ctx.save_for_backward(q, k, v, out, lse, distance, rows, bias_scale, cu_seqlens, sequence, offsets, lut,
                              pos_lut, position_table)
        ctx.scale, ctx.causal, ctx.bucket_spec, ctx.table_shape = scale, causal, bucket_spec, table.shape
        ctx.window, ctx.fallback = window, fallback
        ctx.dropout_p, ctx.dropout_seed, ctx.band, ctx.position = dropout_p, dropout_seed, band, position
        return out

    @staticmethod
    def backward(ctx, dout):
        (q, k, v, out, lse, distance, rows, bias_scale, cu_seqlens, sequence, offsets, lut, pos_lut,
         position_table) = ctx.saved_tensors
        want_table, want_scale = bool(ctx.needs_input_grad[3]), bool(ctx.needs_input_grad[4])
        want_position = bool(ctx.needs_input_grad[9])
        spec = ctx.position
        rest = (None,) * 4
        try:
            dq, dk, dv, dtable, dscale, dposition = _backward_step(
                dout, q, k, v, out, lse, distance, lut, cu_seqlens, sequence, offsets, ctx.scale, ctx.causal,
                ctx.bucket_spec, rows, bias_scale, want_table, want_scale, ctx.dropout_p, ctx.dropout_seed,
                ctx.band, pos_lut, spec, want_position, position_table)
        except KernelDoesNotFit as error:
            if not ctx.fallback:
                raise
            from ._varlen import reference_bias_attention_varlen

            warn_once(f"syntax_bias_attention's backward runs the reference on this GPU: {error}")

            def run(q, k, v, table, c, position_table):
                return reference_bias_attention_varlen(q, k, v, distance, table, buckets=_spec(*ctx.bucket_spec),
                                                       cu_seqlens=cu_seqlens, scale=ctx.scale, bias_scale=c,
                                                       window=None if ctx.window < 0 else ctx.window,
                                                       causal=ctx.causal, dropout_p=ctx.dropout_p,
                                                       dropout_seed=ctx.dropout_seed,
                                                       position_window=None if ctx.band < 0 else ctx.band,
                                                       position_buckets=spec,
                                                       position_table=None if spec is None else position_table)
            grads = reference_gradients(ctx.needs_input_grad[:5] + (want_position,), dout,
                                        (q, k, v, rows.view(ctx.table_shape), bias_scale, position_table), run)
            return tuple(grads[:5]) + rest + (grads[5], None)
        return ((dq, dk, dv, dtable.view(ctx.table_shape) if want_table else None, dscale if want_scale else None)
                + rest + (dposition, None))


class _VarlenLut(torch.autograd.Function):
    """Varlen attention with a fixed per-distance bias (``lut [H or 1, 256]``, natural log, -inf = not allowed):
    gradients for q, k, v only. Inputs: ``q, k, v, distance, lut, cu_seqlens, sequence, distance_offsets,
    scale``."""

    @staticmethod
    def forward(ctx, q, k, v, distance, lut, cu_seqlens, sequence, offsets, scale):
        one = device_constant(("bias strength", 1.0), q, lambda: torch.ones(1, dtype=torch.float32))
        # The LUT is a table of one bucket per distance value (LUT_BUCKETS); the kernel scales it to log2.
        out, lse, lut2, _ = _forward(q, k, v, distance, lut, one, _bucket_lut(LUT_BUCKETS, q), cu_seqlens, sequence,
                                     offsets, scale, -1, False)
        ctx.save_for_backward(q, k, v, out, lse, distance, lut2, cu_seqlens, sequence, offsets, lut, one)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, lut2, cu_seqlens, sequence, offsets, lut, one = ctx.saved_tensors
        try:
            dq, dk, dv, _, _, _ = _backward(dout, q, k, v, out, lse, distance, lut2, cu_seqlens, sequence, offsets,
                                         ctx.scale, False, LUT_BUCKETS, lut, one, False, False)
        except KernelDoesNotFit as error:
            from ._varlen import reference_bias_attention_varlen

            warn_once(f"lut_attention's backward runs the reference on this GPU: {error}")
            table = lut[0] if lut.shape[0] == 1 else lut

            def run(q, k, v):
                return reference_bias_attention_varlen(q, k, v, distance, table, buckets=LUT_BUCKETS,
                                                       cu_seqlens=cu_seqlens, scale=ctx.scale)
            dq, dk, dv = reference_gradients(ctx.needs_input_grad[:3], dout, (q, k, v), run)
        return dq, dk, dv, None, None, None, None, None, None
