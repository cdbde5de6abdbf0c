"""The backward kernels of the distance-bias op (recomputing P from the forward's log2-sum-exp).

Tiled kernels, for any N:

- :func:`_bias_bwd_dq_kernel`: ``delta = rowsum(dO * O)`` and dQ for one query block (it runs first and owns whole
  rows, so it also corrects delta for the table gradient);
- :func:`_bias_bwd_dkdv_kernel`: dK, dV for one key block, walking its query blocks (:func:`_query_block_range`)
  in transposed tiles, no atomics;
- :func:`_bias_bwd_table_kernel`: the table gradient, one query block and every head of a shared table a program
  (per-bucket sums of dS: :func:`_bucket_sums`).

Short rows (a table shared by the heads, fp16/bf16): :func:`_bias_bwd_short_kernel` and its keys-major twin
:func:`_bias_bwd_short_t_kernel` (rows of at most 64 tokens, one tile a sequence), :func:`_bias_bwd_short2_kernel`
and :func:`_bias_bwd_short2_sum_kernel` (65..128 tokens, two blocks), then :func:`_bias_bwd_short_table_kernel`
(the heads' dS summed and reduced per bucket once). Launched by :mod:`._launch`.
"""
import triton
import triton.language as tl

from .._primitives import (bucket_from_distance, distance_tile, dropout_keep, in_bucket, load_rows, lut_bias, mma,
                           mma_acc, opaque_int32, opaque_offsets, position_bias, program_ids)
from ._forward import _allowed, _first_head, _head_step, _key_block, _key_block_range, _kv_offset, _tile_scores


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row, q_block,
               offs_n, offs_d, offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn, stride_gd, stride_di,
               stride_dj, qk_scale2, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
               EVEN_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, SYNTAX: tl.constexpr,
               DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
               seed=0, threshold=0, bh=0, keep_scale=1.0, k_start=0, DROPOUT: tl.constexpr = False,
               BAND: tl.constexpr = False, band=0, pos_row=0, reach=0, POSITION: tl.constexpr = False,
               pos_sums=0, bounds=0, key_ok=0, POSITION_GRAD: tl.constexpr = False):
    """One query tile of the dK/dV backward in transposed orientation (keys are rows). With DROPOUT, dV takes the
    kept probabilities (scaled) and dP the kept pairs (scaled): the forward's :func:`dropout_keep` mask. A masked
    tile (MASK) also masks the positional window (BAND). With POSITION the scores carry T5's relative-position
    term, and with POSITION_GRAD the tile's dS is added to ``pos_sums`` (:func:`_offset_prefix_sums`): ``(dk, dv,
    pos_sums)``."""
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    if SYNTAX:
        # The pair (query i, key j) at distance[b, j, i]: the launcher passes a transposed copy unless the
        # distance is symmetric (tree distances are), so this tile is contiguous along the queries.
        dist_t = distance_tile(dist_base, offs_n, offs_m, stride_di, stride_dj, N, MASK, EVEN_N)
        bias_t = lut_bias(lut_row, dist_t, OPAQUE_BIAS, INTERPRETED)
        if POSITION:
            bias_t += position_bias(pos_row, offs_n[:, None] - offs_m[None, :], reach)
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
    if MASK and BAND:
        exponent_t = tl.where(tl.abs(offs_n[:, None] - offs_m[None, :]) <= band, exponent_t, float("-inf"))
    p_t = tl.exp2(exponent_t)
    do = load_rows(do_base, offs_m, offs_dv, stride_gn, stride_gd, length, DV, MASK, EVEN_DV)
    if DROPOUT:
        keep_t = tl.trans(dropout_keep(seed, threshold, bh, offs_m, k_start, BLOCK_M, offs_n.shape[0]))
        dv = mma_acc(tl.where(keep_t, p_t * keep_scale, 0.0).to(do.dtype), do, dv, DOT_PRECISION)
    else:
        dv = mma_acc(p_t.to(do.dtype), do, dv, DOT_PRECISION)
    if MASK:
        delta = tl.load(delta_base + offs_m, mask=offs_m < N, other=0.0)
    else:
        delta = tl.load(delta_base + offs_m)
    dp_t = mma(v, tl.trans(do), DOT_PRECISION)
    if DROPOUT:
        dp_t = tl.where(keep_t, dp_t * keep_scale, 0.0)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = mma_acc(ds_t.to(q.dtype), q, dk, DOT_PRECISION)
    if POSITION_GRAD:
        pos_sums = _offset_prefix_sums(pos_sums, ds_t, k_start, offs_m, key_ok, bounds)
    return dk, dv, pos_sums


@triton.jit
def _offset_prefix_sums(sums, ds_t, k_start, offs_m, key_ok, bounds):
    """Add one transposed tile of dS (keys ``k_start + [0, rows)`` are rows, queries ``offs_m`` columns) to the
    per-boundary sums
    of T5's position-table gradient: ``sums[t] +=`` the sum of dS over the tile's pairs whose offset ``j - i <=
    bounds[t]`` (``j <= i + bounds[t]``), by a prefix sum along the keys and one gather per boundary and query
    column (no atomics, no per-offset loop). Keys past the length (``key_ok`` False) add nothing.

    The offsets of one position bucket are a range, so the differences of consecutive boundaries' sums are the
    buckets' sums (the launcher's :func:`~._host.position_bounds`); the clamp to the reach changes no comparison
    with a boundary inside it, and the last boundary lies past every offset (the tile's total)."""
    prefix = tl.cumsum(tl.where(key_ok[:, None], ds_t, 0.0), 0)
    last = offs_m[None, :] + bounds[:, None] - k_start  # [bounds, queries]: the last key row counted
    below = tl.gather(prefix, tl.minimum(tl.maximum(last, 0), ds_t.shape[0] - 1), 0)
    return sums + tl.sum(tl.where(last < 0, 0.0, below), 1)


@triton.jit
def _query_block_range(Q_LIST, Q_COUNT, b, k_block, length, num_q_blocks, num_k_blocks, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, USE_LISTS: tl.constexpr, CAUSAL: tl.constexpr):
    """The query blocks one key block visits (the dK/dV kernel's :func:`_key_block_range`), ``(list_base,
    interior, boundary, diagonal)``: ``interior`` and ``boundary`` are ``(begin, end)`` index ranges, the blocks
    that need no mask and those that hold the causal diagonal or the sequence end; index i is the block
    ``_query_block(list_base, i, diagonal, MASK, USE_LISTS)``.

    With USE_LISTS they are the device-built live blocks (interior first). Else every query block up to the
    length: the interior ones are their own indices (between the causal diagonal's blocks and the blocks past the
    last full one), and ``diagonal = (first, num_diagonal, tail)`` maps boundary index i to the diagonal's block
    ``first + i`` for ``i < num_diagonal``, then to the tail's ``tail + i - num_diagonal``.
    """
    if USE_LISTS:
        row = b * num_k_blocks + k_block
        list_base = Q_LIST + row * num_q_blocks
        interior = tl.load(Q_COUNT + 2 * row)
        total = tl.load(Q_COUNT + 2 * row + 1)
        ranges = (0, interior), (interior, total)
        diagonal = (0, 0, 0)
    else:
        list_base = Q_LIST
        first = 0
        diagonal_end = 0
        if CAUSAL:
            first = (k_block * BLOCK_N) // BLOCK_M
            diagonal_end = tl.cdiv((k_block + 1) * BLOCK_N - 1, BLOCK_M)
        total = tl.where(k_block * BLOCK_N < length, tl.cdiv(length, BLOCK_M), 0)
        diagonal_end = tl.minimum(diagonal_end, total)
        full = tl.minimum(length // BLOCK_M, total)  # a key block wholly past the length walks nothing
        tail = tl.maximum(diagonal_end, full)
        num_diagonal = tl.maximum(diagonal_end - first, 0)
        ranges = (diagonal_end, full), (0, num_diagonal + tl.maximum(total - tail, 0))
        diagonal = (first, num_diagonal, tail)
    return list_base, ranges[0], ranges[1], diagonal


@triton.jit
def _query_block(list_base, i, diagonal, MASK: tl.constexpr, USE_LISTS: tl.constexpr):
    """The query block of index i of :func:`_query_block_range` (MASK: an index of its boundary range)."""
    q_block = i
    if USE_LISTS:
        q_block = tl.load(list_base + i)
    elif MASK:
        q_block = tl.where(i < diagonal[1], diagonal[0] + i, diagonal[2] + i - diagonal[1])
    return q_block


@triton.jit(do_not_specialize=["seed"])  # (one compile for every seed)
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
    OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False, seed=0, threshold=0, keep_scale=1.0,
    DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
    GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
    POS_BOUNDS=0, POS_PARTIALS=0, NUM_BOUNDS: tl.constexpr = 16, POSITION_GRAD: tl.constexpr = False,
):
    """Backward for one key block: ``dk`` and ``dv``, recomputing P from the saved log2-sum-exp (the table
    gradient is :func:`_bias_bwd_table_kernel`'s).

    Args:
        Q: ``[B, H, N, D]``, DOUT: ``[B, H, N, DV]``; K: ``[B, H / KV_GROUP, N, D]``, V: ``[B, H / KV_GROUP, N,
            DV]`` (strided); DK, DV_OUT: like K, V (strides ``stride_x*``, ``stride_y*``).
        DIST: the distance read as ``[b, j, i]`` (the distance itself when symmetric, else its transpose).
        Q_LIST, Q_COUNT: int32 ``[B, nK, nQ]`` live query blocks of each key block (interior first) and
            ``[B, nK, 2]`` (read when USE_LISTS).
        LSE, DELTA: fp32 ``[B, H, N]`` (rows ``stride_row`` apart).
        N, N_OUT and the others as in the forward (dropout too: the forward's mask, regenerated; T5's
            relative-position term too: POS_LUT, stride_ph, reach, POSITION).
        POS_BOUNDS, POS_PARTIALS, NUM_BOUNDS, POSITION_GRAD: the position table's gradient (compiled out without
            POSITION_GRAD): int32 ``[NUM_BOUNDS]`` offsets (:func:`~._host.position_bounds`) and fp32 ``[B, nK, H,
            NUM_BOUNDS]``, where each program writes, per query head it walks, the sums of dS over the pairs at
            offsets ``j - i <= POS_BOUNDS[t]`` of its key block (:func:`_offset_prefix_sums`; DELTA must be the dQ
            kernel's corrected one, so that every row of dS sums to zero). Reduced in a fixed order by the launcher.
    Grid: ``(nK * B * H / KV_GROUP,)``; one program owns BLOCK_N keys of one key/value head and walks, for each of
    the ``KV_GROUP`` query heads that read it (grouped-query attention: query heads ``kv * KV_GROUP ..``, in that
    order), the query blocks that see them: dK and dV summed over the group in registers (no atomics).
    """
    k_block, bkv, b, kv = program_ids(num_k_blocks, H // KV_GROUP)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_rows(K + b * stride_kb + kv * stride_kh, offs_n, offs_d, stride_kn, stride_kd, length, D, True, EVEN_D)
    v = load_rows(V + b * stride_vb + kv * stride_vh, offs_n, offs_dv, stride_vn, stride_vd, length, DV, True,
                  EVEN_DV)
    dist_base = DIST + b * stride_db
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    list_base, interior, boundary, diagonal = _query_block_range(Q_LIST, Q_COUNT, b, k_block, length, num_q_blocks,
                                                                 num_k_blocks, BLOCK_M, BLOCK_N, USE_LISTS, CAUSAL)
    pos_sums = 0
    bounds = 0
    key_ok = 0
    if POSITION_GRAD:
        bounds = tl.load(POS_BOUNDS + tl.arange(0, NUM_BOUNDS))
        key_ok = offs_n < length
        pos_sums = tl.zeros([NUM_BOUNDS], dtype=tl.float32)
    for g in range(0, KV_GROUP):  # (one trip without grouped-query attention: KV_GROUP is specialised to 1)
        h = kv * KV_GROUP + g
        bh = bkv * KV_GROUP + g  # (b * H + h)
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DOUT + b * stride_gb + h * stride_gh
        lse_base = LSE + bh.to(tl.int64) * stride_row
        delta_base = DELTA + bh.to(tl.int64) * stride_row
        lut_row = LUT + h * stride_lh
        if POSITION_GRAD:
            pos_sums = tl.zeros([NUM_BOUNDS], dtype=tl.float32)
        for i in range(interior[0], interior[1]):
            dk, dv, pos_sums = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row,
                                          _query_block(list_base, i, diagonal, False, USE_LISTS), offs_n, offs_d,
                                          offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn, stride_gd,
                                          stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D, EVEN_DV, EVEN_N, False,
                                          CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED, seed, threshold, bh,
                                          keep_scale, k_block * BLOCK_N, DROPOUT, BAND, band, POS_LUT + h * stride_ph,
                                          reach, POSITION, pos_sums, bounds, key_ok, POSITION_GRAD)
        for i in range(boundary[0], boundary[1]):
            dk, dv, pos_sums = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dist_base, lut_row,
                                          _query_block(list_base, i, diagonal, True, USE_LISTS), offs_n, offs_d,
                                          offs_dv, length, N, D, DV, stride_qn, stride_qd, stride_gn, stride_gd,
                                          stride_di, stride_dj, qk_scale2, BLOCK_M, EVEN_D, EVEN_DV, EVEN_N, True,
                                          CAUSAL, SYNTAX, DOT_PRECISION, OPAQUE_BIAS, INTERPRETED, seed, threshold, bh,
                                          keep_scale, k_block * BLOCK_N, DROPOUT, BAND, band, POS_LUT + h * stride_ph,
                                          reach, POSITION, pos_sums, bounds, key_ok, POSITION_GRAD)
        if POSITION_GRAD:
            slot = ((b * num_k_blocks + k_block) * H + h) * NUM_BOUNDS
            tl.store(POS_PARTIALS + slot + tl.arange(0, NUM_BOUNDS), pos_sums)

    # Epilogue: dK carries the score scale; keys past the length get 0.
    key_ok = offs_n < length
    dk = tl.where(key_ok[:, None], dk * scale, 0.0)
    dv = tl.where(key_ok[:, None], dv, 0.0)
    dk_ptrs = DK + b * stride_xb + kv * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd
    dv_ptrs = DV_OUT + b * stride_yb + kv * stride_yh + offs_n[:, None] * stride_yn + offs_dv[None, :] * stride_yd
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

    Larger tables (a relation batch's 256 codes, log-spaced or windowed tables): ``sums`` is ``[BUCKETS_PAD]``
    and ``present = lowest + 256 * highest``; the tile walks the buckets of that range (a loop whose length is the
    data's), each trip a compare, a select and a whole-tile sum of dS added to its bucket (a few registers
    whatever the table's size: per-row accumulators, ``BLOCK_M x BUCKETS_PAD``, spilled at 256 buckets and cost
    as much per trip as the sum itself). With one bucket per byte value (256 buckets, not log-spaced: a relation
    batch's codes) the walk visits only the codes the tile holds, from each to the next (a min over the tile per
    trip: a few codes of a range of a hundred on two parses or a code model's four relations).
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
        if NUM_BUCKETS == 256 and LOG_DISTANCE == 0:  # (configs.walks_present_codes)
            # One bucket per byte value (a relation batch's codes): a tile holds a few codes scattered over a wide
            # range (the mixed-radix code of R relations), so the walk goes from each code present to the next
            # (a min over the tile per trip) instead of through the range.
            t = present & 255
            highest = present >> 8
            while t <= highest:
                part = tl.sum(tl.sum(tl.where(bucket == t, ds, 0.0), 1), 0)
                sums += tl.where(columns == t, part, 0.0)
                t = tl.min(tl.min(tl.where(bucket > t, bucket, 256), 1), 0)
        else:
            for t in range(present & 255, (present >> 8) + 1):
                part = tl.sum(tl.sum(tl.where(bucket == t, ds, 0.0), 1), 0)
                sums += tl.where(columns == t, part, 0.0)
    return sums


@triton.jit
def _bucket_accumulators(BLOCK_M: tl.constexpr, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
                         BUCKETS_PAD: tl.constexpr):
    """Zeroed per-bucket sums for :func:`_bucket_sums`: a tuple of per-row ``[BLOCK_M]`` (``STATIC_BUCKETS``)
    or ``[BUCKETS_PAD]``."""
    if STATIC_BUCKETS:
        sums = (tl.zeros([BLOCK_M], dtype=tl.float32),) * NUM_BUCKETS
    else:
        sums = tl.zeros([BUCKETS_PAD], dtype=tl.float32)
    return sums


@triton.jit
def _bucket_totals(sums, NUM_BUCKETS: tl.constexpr, STATIC_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr):
    """``[BUCKETS_PAD]``: the sums of :func:`_bucket_sums` per bucket (the per-row ones added over the rows;
    bucket t at index t)."""
    if STATIC_BUCKETS:
        bucket_ids = tl.arange(0, BUCKETS_PAD)
        totals = tl.zeros([BUCKETS_PAD], dtype=tl.float32)
        for t in tl.static_range(NUM_BUCKETS):
            totals += tl.where(bucket_ids == t, tl.sum(sums[t], 0), 0.0)
    else:
        totals = sums
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
                DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, seed=0, threshold=0,
                keep_scale=1.0, DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
                GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False):
    """One tile of the table gradient: dS recomputed for each of the program's ``HEADS`` heads and summed over
    them, then added to the per-bucket sums once (:func:`_bucket_sums`); with DROPOUT dP takes each head's kept
    pairs (scaled). Query head h reads key/value head ``h // KV_GROUP``. With POSITION each head's scores carry
    its own T5 relative-position term."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    dist = distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, N, MASK, EVEN_N)
    bias = lut_bias(lut_row, dist, OPAQUE_BIAS, INTERPRETED)  # the LUT row is the same for every head
    if MASK:
        allowed = _allowed(offs_m, offs_n, length, CAUSAL, BAND, band)
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
            k = load_rows(K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV), offs_n, offs_c,
                          stride_kn, stride_kd, length, D, MASK, EVEN_D)
            scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
        # Rows past the length: zero q and lse = +inf, so P is exactly 0 there without a mask.
        lse = tl.load(LSE + row + offs_m, mask=offs_m < length, other=float("inf"))
        exponent = scores * qk_scale2 + bias - lse[:, None]
        if POSITION:
            exponent += position_bias(POS_LUT + h * stride_ph, offs_n[None, :] - offs_m[:, None], reach)
        if MASK:  # masked before exp2: an excluded pair's exponent may be large
            exponent = tl.where(allowed, exponent, float("-inf"))
        p = tl.exp2(exponent)
        dp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(0, BLOCK_DV, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            do = load_rows(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_c, stride_gn, stride_gd, length, DV,
                           True, EVEN_DV)
            v = load_rows(V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV), offs_n, offs_c,
                          stride_vn, stride_vd, length, DV, MASK, EVEN_DV)
            dp = mma_acc(do, tl.trans(v), dp, DOT_PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed, threshold, b * H + h, offs_m, k_block * BLOCK_N, BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * keep_scale, 0.0)
        delta = tl.load(DELTA + row + offs_m, mask=offs_m < length, other=0.0)
        ds += p * (dp - delta[:, None])
    return _bucket_sums(sums, ds, dist, present, NUM_BUCKETS, STATIC_BUCKETS, MAX_DISTANCE, LOG_DISTANCE,
                        UNREACHABLE_BUCKET, LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED)


@triton.jit(do_not_specialize=["seed"])  # (one compile for every seed)
def _bias_bwd_table_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, TILE_BUCKETS, SKIP_BUCKET, LSE, DELTA, BUCKET_PARTIALS,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    H, N, D, DV, num_q_blocks, num_k_blocks, qk_scale2, HEADS, SPLITS,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    LAST_DISTANCE_BUCKET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr,
    CAUSAL: tl.constexpr, INTERPRETED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    OPAQUE_BIAS: tl.constexpr = False, seed=0, threshold=0, keep_scale=1.0, DROPOUT: tl.constexpr = False,
    KV_GROUP=1, BAND: tl.constexpr = False, band=0, GROUPED_KV: tl.constexpr = False,
    POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
):
    """The table gradient: per bucket, the sum of dS over one query block's pairs and ``HEADS`` heads.

    A table shared by all heads (the default) has one bucket pattern for every head, so each program takes
    all ``H`` heads of its query block (``HEADS = H``): per tile it recomputes dS for each head (two
    tensor-core products, like the dQ kernel's first two), sums the heads' dS in registers and pays the
    per-bucket reduction once, so that reduction's cost per score element is divided by the head count. A
    per-head table takes one head per program (``HEADS = 1``, each head its own LUT row).

    Args:
        Q, K, V, DOUT, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, KV_GROUP: as in the dQ kernel (key lists at this
            kernel's tiling).
        TILE_BUCKETS: int32 ``[B, nQ, nK]``: per tile the bit set of its allowed pairs' buckets, or with more
            than 31 buckets ``lowest + 256 * highest`` (see :func:`_bucket_sums`).
        SKIP_BUCKET: int32 ``[B, nQ]``: per query block the bucket whose one-bucket tiles are skipped (the most
            frequent; -1: none). Every row of dS sums to zero (the corrected delta), so what the skipped tiles
            hold is minus the sum of everything walked: it is added to that bucket in the epilogue, and the far
            tiles of a long tree or between packed sentences cost one compare each (with dropout too: dS is
            formed from the dropped output's delta, so its rows still sum to zero).
        LSE: fp32 ``[B, H, N]``; DELTA: the dQ kernel's corrected delta (every row of dS then sums to zero, so
            the bucket sums are exact up to fp32 rounding); both rows ``stride_row`` apart.
        BUCKET_PARTIALS: fp32 ``[B * G * nQ * SPLITS, NUM_BUCKETS]`` (``G = H / HEADS`` head groups): each
            program's sums, written once and reduced in a fixed order by the launcher.
        SPLITS: the programs one query block's key blocks are split among (the launcher's
            :func:`._launch.table_splits`: one long tree fills the GPU); the skipped tiles' correction is linear, so
            each split adds its own share.
        POS_LUT, stride_ph, reach, POSITION: T5's relative-position term, as in the forward (each head its own).
    Grid: ``(nQ * SPLITS * B * G,)``.
    """
    block_split, bg, b, g = program_ids(num_q_blocks * SPLITS, H // HEADS)
    q_block = block_split // SPLITS
    split = block_split % SPLITS
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
    per_split = (total + SPLITS - 1) // SPLITS  # this program's share of the walk: [first, last)
    first = split * per_split
    last = tl.minimum(first + per_split, total)
    for i in range(first, tl.minimum(last, interior)):
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
                               LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED, DOT_PRECISION, OPAQUE_BIAS, seed,
                               threshold, keep_scale, DROPOUT, KV_GROUP, BAND, band, GROUPED_KV, POS_LUT,
                               stride_ph, reach, POSITION)
    for i in range(tl.maximum(first, interior), last):
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
                               LAST_DISTANCE_BUCKET, BUCKETS_PAD, INTERPRETED, DOT_PRECISION, OPAQUE_BIAS, seed,
                               threshold, keep_scale, DROPOUT, KV_GROUP, BAND, band, GROUPED_KV, POS_LUT,
                               stride_ph, reach, POSITION)

    # Epilogue: rows past the length hold zero dS; one row of partial sums per program.
    bucket_ids = tl.arange(0, BUCKETS_PAD)
    totals = _bucket_totals(sums, NUM_BUCKETS, STATIC_BUCKETS, BUCKETS_PAD)
    # The skipped tiles' share: minus everything walked (the rows of dS sum to zero; each split its own part).
    totals += tl.where(bucket_ids == skip, -tl.sum(totals, 0), 0.0)
    program = bg.to(tl.int64) * (num_q_blocks * SPLITS) + block_split
    tl.store(BUCKET_PARTIALS + program * NUM_BUCKETS + bucket_ids, totals, mask=bucket_ids < NUM_BUCKETS)


@triton.jit(do_not_specialize=["HEAD_GROUPS", "seed"])  # (one compile for every grouping of GROUPED, every seed)
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
    N, N_OUT, D, DV, scale, qk_scale2, HEADS: tl.constexpr, HEAD_GROUPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr = False,
    OPAQUE_BIAS: tl.constexpr = False, GROUPED: tl.constexpr = False, seed=0, threshold=0, keep_scale=1.0,
    DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
    GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
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
        Q: ``[B, H, N, D]``, DOUT: ``[B, H, N, DV]``; K, V: ``[B, H / KV_GROUP, N, D / DV]`` (strided; query head h
            reads key/value head ``h // KV_GROUP``, grouped-query attention). DIST: uint8 ``[B, N, N]``; LUT: fp32
            ``[256]`` (:func:`bias_lut`, one row); LSE: fp32 ``[B, H, N]`` (rows ``stride_row`` apart).
        DQ, DK, DV_OUT: like Q (strides ``stride_x*``, ``stride_y*``, ``stride_z*``): dK and dV per query head (with
            KV_GROUP > 1 the launcher sums each group's in a fixed order).
        DS_OUT: fp32 ``[B, H, BLOCK_M, BLOCK_N]`` (contiguous), written with TABLE_GRAD at the query rows
        :func:`_stored` keeps (inside the length, rounded up to 8; whole rows); the table kernel reads no other.
        seed, threshold, keep_scale, DROPOUT: the forward's attention dropout (its mask regenerated): dV takes the
            kept probabilities, dP the kept pairs (both scaled), so delta = rowsum(P * dP) stays exact.
        POS_LUT, stride_ph, reach, POSITION: T5's relative-position term, as in the forward (compiled out without
            POSITION): each head adds its own :func:`position_bias` tile to the scores it recomputes. Its table's
            gradient is :func:`_bias_bwd_short_table_kernel`'s (POSITION_GRAD), from the dS tiles written here
            (the launcher then sets TABLE_GRAD, which only decides that store).
    Grid: ``(B, HEAD_GROUPS)``: a program takes heads g, g + HEAD_GROUPS, ... (the launcher's
    :func:`._launch.head_groups`). ``HEADS`` is a compile-time constant (one compile per model's head count; the
    grouping stays a runtime argument): with it the grouped loop fits sm_90's own tiles at D = 64 without spilling.
    """
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    # Once for every head: the bias, -inf where the length or causality excludes the pair.
    bias = tl.where(_allowed(offs_m, offs_n, length, CAUSAL, BAND, band),
                    lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED), float("-inf"))
    ds_ptrs = DS_OUT + b * HEADS * (BLOCK_M * BLOCK_N) + offs_m[:, None] * BLOCK_N + offs_n[None, :]
    ds_kept = _stored(offs_m, length)[:, None]  # (the query rows: each head's dS past them is not stored)
    for h in range(_first_head(GROUPED), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
        v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
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
        scores = scores * qk_scale2 + bias
        if POSITION:  # the head's own term (the forward's; its index tile formed per head, not held)
            rows = opaque_offsets(offs_m, INTERPRETED)
            scores += position_bias(POS_LUT + h * stride_ph, offs_n[None, :] - rows[:, None], reach)
        p = tl.exp2(scores - lse[:, None])
        # dV^T = dO^T P first (P is then needed in fp32 only), then dP, dS, dQ = dS K and dK^T = Q^T dS: dS and
        # P are the second operand of the transposed products (no transposed copy of either). Those run over
        # OUT_CHUNK head-dim columns (their M: 64 keeps them on the warp-group instructions).
        if DROPOUT:
            keep = dropout_keep(seed, threshold, b * HEADS + h, offs_m, 0, BLOCK_M, BLOCK_N)
            p_in = tl.where(keep, p * keep_scale, 0.0).to(Q.dtype.element_ty)
        else:
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
        if DROPOUT:
            dp = tl.where(keep, dp * keep_scale, 0.0)
        # dS with the score scale folded in (a row constant): scale * P * (dP - delta) in two operations.
        delta = tl.sum(p * dp, 1) * scale
        ds = p * (dp * scale - delta[:, None])
        if TABLE_GRAD:
            tl.store(ds_ptrs + h * (BLOCK_M * BLOCK_N), ds, mask=ds_kept)
        ds_in = ds.to(Q.dtype.element_ty)
        for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
            offs_c = c + tl.arange(0, OUT_CHUNK)
            if OUT_CHUNK < BLOCK_D or CHUNK < BLOCK_D:  # (whole k and q held from the scores only without chunks)
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
            if OUT_CHUNK < BLOCK_D or CHUNK < BLOCK_D:
                q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            dk = mma(tl.trans(q), ds_in, DOT_PRECISION)
            tl.store(DK + b * stride_yb + h * stride_yh + offs_n[None, :] * stride_yn + offs_c[:, None] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < D))


@triton.jit(do_not_specialize=["HEAD_GROUPS", "seed"])  # (one compile for every grouping of GROUPED, every seed)
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
    N, N_OUT, D, DV, scale, qk_scale2, HEADS, HEAD_GROUPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr = False,
    OPAQUE_BIAS: tl.constexpr = False, GROUPED: tl.constexpr = False, seed=0, threshold=0, keep_scale=1.0,
    DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
    GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
):
    """:func:`_bias_bwd_short_kernel` with keys-major tiles (for mma.sync GPUs): the program forms
    ``S^T = K Q^T``, so that P^T and dS^T, accumulators, are the first operand of ``dV = P^T dO`` and
    ``dK = dS^T Q`` as they are (no layout change); only dQ needs dS transposed. Each head's dS goes to
    ``DS_OUT`` queries-major, as the other kernel's (``[B, H, BLOCK_M, BLOCK_N]``).
    Grid: ``(B, HEAD_GROUPS)``."""
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)  # queries: the columns
    offs_n = tl.arange(0, BLOCK_N)  # keys: the rows
    # dist^T[j, i] = distance[b, i, j] (read once for every head)
    dist_t = distance_tile(DIST + b * stride_db, offs_n, offs_m, stride_dj, stride_di, N, True, EVEN_N)
    allowed_t = (offs_n[:, None] < length) & (offs_m[None, :] < length)
    if CAUSAL:
        allowed_t = allowed_t & (offs_n[:, None] <= offs_m[None, :])
    if BAND:
        allowed_t = allowed_t & (tl.abs(offs_n[:, None] - offs_m[None, :]) <= band)
    bias_t = tl.where(allowed_t, lut_bias(LUT, dist_t, OPAQUE_BIAS, INTERPRETED), float("-inf"))
    ds_ptrs = DS_OUT + b * HEADS * (BLOCK_M * BLOCK_N) + offs_m[None, :] * BLOCK_N + offs_n[:, None]  # [q, k]
    ds_kept = _stored(offs_m, length)[None, :]  # (the query rows: each head's dS past them is not stored)
    for h in range(_first_head(GROUPED), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
        v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
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
        scores_t = scores_t * qk_scale2 + bias_t
        if POSITION:  # the head's own term (keys are rows: the offset j - i is offs_n - offs_m; formed per head)
            columns = opaque_offsets(offs_m, INTERPRETED)
            scores_t += position_bias(POS_LUT + h * stride_ph, offs_n[:, None] - columns[None, :], reach)
        p_t = tl.exp2(scores_t - lse[None, :])
        if DROPOUT:  # (the forward's mask, transposed)
            keep_t = tl.trans(dropout_keep(seed, threshold, b * HEADS + h, offs_m, 0, BLOCK_M, BLOCK_N))
            p_in = tl.where(keep_t, p_t * keep_scale, 0.0).to(Q.dtype.element_ty)
        else:
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
        if DROPOUT:
            dp_t = tl.where(keep_t, dp_t * keep_scale, 0.0)
        delta = tl.sum(p_t * dp_t, 0) * scale  # per query: the columns
        ds_t = p_t * (dp_t * scale - delta[None, :])
        if TABLE_GRAD:
            tl.store(ds_ptrs + h * (BLOCK_M * BLOCK_N), ds_t, mask=ds_kept)
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
def _stored(offs, length):
    """Which of ``offs`` (token positions) the short-row kernels store their fp32 scratch for (dS tiles, the
    two-block shares) and the kernels after them read back: the positions below ``length`` rounded up to a
    multiple of 8 (a 32-byte sector of fp32), so that a masked row stays whole vectors; the stored values past the
    length are zeros (no allowed pair)."""
    return (offs // 8) < (length + 7) // 8


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
                 EVEN_N: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
                 BAND: tl.constexpr = False, band=0):
    """The bias of one tile of :func:`_bias_bwd_short2_kernel` for every head: the LUT gathered at the distance,
    -inf where the length, causality or the positional window (BAND) excludes the pair."""
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    return tl.where(_allowed(offs_m, offs_n, length, CAUSAL, BAND, band), lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED),
                    float("-inf"))


@triton.jit(do_not_specialize=["HEAD_GROUPS"])  # (one compile for every grouping of GROUPED)
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
    B, N, N_OUT, D, DV, scale, qk_scale2, HEADS, HEAD_GROUPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
    GROUPED: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
    GROUPED_KV: tl.constexpr = False,
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
    dK and dV are shares, each from one tile, stored in fp32 (``DK_PART``, ``DV_PART`` ``[B, H, q_block,
    BLOCK_D, 2 * BLOCK_N]``, transposed), which :func:`_bias_bwd_short2_sum_kernel` adds in a fixed order
    (deterministic, no atomics); its dQ rows, owned by this program, take the first key block's product as a
    share (``DQ_PART`` ``[B, H, BLOCK_D, 2 * BLOCK_M]``, ``[B, H, 2 * BLOCK_M, BLOCK_D]`` without DQ_T) that the
    second key block reads back (after the barrier) as its product's accumulator and stores as dQ. With TABLE_GRAD each head's dS goes to
    ``DS_OUT`` (fp32 ``[B, H, 2, 2, BLOCK_M, BLOCK_N]``) for :func:`_bias_bwd_short_table_kernel`. In the second
    key block, dS and the dK, dV shares are written only at the keys :func:`_stored` keeps (inside the length,
    rounded up to 8; every key of the first block is inside a longer item), and the kernels after this one read
    no other. Each pair is read at ``distance[b, i, j]`` only: a directed distance is exact.

    Args: as :func:`_bias_bwd_short_kernel`; DELTA: fp32 rows like LSE (``stride_row``), written then read;
        DQ, DK, DV_OUT: what the kernel does not store (padding rows past a short item's first block, an empty
        item's rows) the sum kernel zeroes.
    Grid: ``(B, 2 * HEAD_GROUPS)``: a program takes one query block and heads g, g + HEAD_GROUPS, ... (the
    launcher's :func:`._launch.head_groups`).
    """
    b = tl.program_id(0).to(tl.int64)
    if GROUPED:
        q_block = tl.program_id(1) % 2
    else:
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
    share_q: tl.constexpr = BLOCK_D * 2 * BLOCK_M  # a head's dQ share (its first key block's, all its rows)
    part_d = b * HEADS * (2 * share_d)  # this item's head 0
    part_dv = b * HEADS * (2 * share_dv)
    delta_rows = DELTA + b * HEADS * stride_row + offs_m
    lse_rows = LSE + b * HEADS * stride_row + offs_m

    # Rows reaching two key blocks: the row sums of P * dP over the second, stored per head.
    if num_k == 2:
        offs_n = BLOCK_N + offs_j
        bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                            EVEN_N, OPAQUE_BIAS, INTERPRETED, BAND, band)
        for h in range(_first_head(GROUPED, 2), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
            lse = tl.load(lse_rows + h * stride_row, mask=row_ok, other=float("inf"))
            p, dp = _short_p_dp(Q + b * stride_qb + h * stride_qh,
                                K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV),
                                V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV),
                                DOUT + b * stride_gb + h * stride_gh, bias, lse,
                                offs_m, offs_n, length, D, DV, stride_qn, stride_qd, stride_kn, stride_kd,
                                stride_vn, stride_vd, stride_gn, stride_gd, qk_scale2, BLOCK_D, BLOCK_DV, CHUNK,
                                EVEN_D, EVEN_DV, DOT_PRECISION)
            tl.store(delta_rows + h * stride_row, tl.sum(p * dp, 1), mask=row_ok)
        tl.debug_barrier()  # read back below in whatever layout the products leave the rows

    for kb in tl.static_range(2):
        if kb == 1:  # the second block reads the delta rows the first stored, maybe from other warps' threads
            tl.debug_barrier()
        if kb < num_k:
            offs_n = kb * BLOCK_N + offs_j
            bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                                EVEN_N, OPAQUE_BIAS, INTERPRETED, BAND, band)
            for h in range(_first_head(GROUPED, 2), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
                q_base = Q + b * stride_qb + h * stride_qh
                k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
                do_base = DOUT + b * stride_gb + h * stride_gh
                lse = tl.load(lse_rows + h * stride_row, mask=row_ok, other=float("inf"))
                v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
                p, dp = _short_p_dp(q_base, k_base, v_base, do_base, bias, lse, offs_m,
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
                    ds_at = (DS_OUT + (((b * HEADS + h) * 2 + q_block) * 2 + kb) * (BLOCK_M * BLOCK_N)
                             + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + offs_j[None, :])
                    if kb == 0:
                        tl.store(ds_at, ds)
                    else:
                        tl.store(ds_at, ds, mask=_stored(offs_n, length)[None, :])
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
                        if kb == 0:  # (every key of the first block is inside a longer item)
                            tl.store(dv_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dv)
                        else:
                            tl.store(dv_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dv,
                                     mask=_stored(offs_n, length)[None, :])
                    else:
                        tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[None, :] * stride_zn
                                 + offs_c[:, None] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                                 mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < DV))
                # dQ: rows reaching one key block store it; rows reaching two store the first block's product as
                # a share and accumulate the second's onto it (this program's own share, ordered by the barrier
                # above).
                dq_share = DQ_PART + (b * HEADS + h) * share_q
                if kb == 0:
                    dq_to_share = num_k == 2
                else:
                    dq_to_share = False
                if DQ_T:
                    dk_share = DK_PART + part_d + h * (2 * share_d) + q_block * share_d
                else:
                    dk_share = DK_PART + q_block * share_d + part_d + h * (2 * share_d)
                for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
                    offs_c = c + tl.arange(0, OUT_CHUNK)
                    k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
                    if DQ_T:  # dQ^T = K^T dS^T
                        dq_at = dq_share + offs_c[:, None] * (2 * BLOCK_M) + offs_m[None, :]
                        if kb == 1:  # (the first block's share, accumulated into by the product)
                            dq = mma_acc(tl.trans(k), tl.trans(ds_in), tl.load(dq_at), DOT_PRECISION)
                        else:
                            dq = mma(tl.trans(k), tl.trans(ds_in), DOT_PRECISION)
                        if dq_to_share:
                            tl.store(dq_at, dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[None, :] * stride_xn
                                     + offs_c[:, None] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[None, :] < N_OUT) & (offs_c[:, None] < D))
                    else:
                        dq_at = dq_share + offs_m[:, None] * BLOCK_D + offs_c[None, :]
                        if kb == 1:
                            dq = mma_acc(ds_in, k, tl.load(dq_at), DOT_PRECISION)
                        else:
                            dq = mma(ds_in, k, DOT_PRECISION)
                        if dq_to_share:
                            tl.store(dq_at, dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn
                                     + offs_c[None, :] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < D))
                    q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
                    dk = mma(tl.trans(q), ds_in, DOT_PRECISION)  # dK^T [OUT_CHUNK, BLOCK_N]
                    if two_blocks:
                        if kb == 0:  # (every key of the first block is inside a longer item)
                            tl.store(dk_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dk)
                        else:
                            tl.store(dk_share + offs_c[:, None] * (2 * BLOCK_N) + offs_n[None, :], dk,
                                     mask=_stored(offs_n, length)[None, :])
                    else:
                        tl.store(DK + b * stride_yb + h * stride_yh + offs_n[None, :] * stride_yn
                                 + offs_c[:, None] * stride_yd, dk.to(DK.dtype.element_ty),
                                 mask=(offs_n[None, :] < N_OUT) & (offs_c[:, None] < D))


@triton.jit
def _short2_share(PART, share, head, rows, keys, stride_r, length, FIRST: tl.constexpr, SECOND: tl.constexpr):
    """One head's ``[rows, keys]`` block of dK^T or dV^T from its two shares (``PART[0]``, ``PART[1]`` are
    ``share`` apart; contiguous keys), added in that order; only the shares and keys the kernel stored are read
    (:func:`_stored`; the others are 0)."""
    ptrs = PART + head + rows[:, None] * stride_r + keys[None, :]
    keep = _stored(keys, length)[None, :]
    if FIRST:
        total = tl.load(ptrs, mask=keep, other=0.0)
        if SECOND:
            total += tl.load(ptrs + share, mask=keep, other=0.0)
    else:
        total = tl.load(ptrs + share, mask=keep, other=0.0)
    return total


@triton.jit
def _bias_bwd_short2_sum_kernel(
    LENGTHS, DK_PART, DV_PART, DQ, DK, DV_OUT,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    B, N, N_OUT, D, DV, HEADS,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
):
    """dK and dV of one head of an item longer than ``BLOCK_M`` from :func:`_bias_bwd_short2_kernel`'s shares:
    each key block's two shares added in a fixed order (the first query block's first), a share of a tile the
    kernel did not walk (causality) not read; the kernel stored such an item's dQ itself. Items of at most
    ``BLOCK_M`` tokens: the kernel stored the gradients of their first block (none of an empty item); the rows it
    did not store (padding) get zeros here, so that no launch clears the gradients first. Grid: ``(B * HEADS,)``."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // HEADS
    h = bh % HEADS
    length = tl.minimum(tl.load(LENGTHS + b), N)
    if length <= BLOCK_M:
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        for blk in tl.static_range(2):
            rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
            unwritten = (rows[:, None] < N_OUT) & ((blk == 1) | (length == 0))
            zeros_d = tl.zeros([BLOCK_M, BLOCK_D], dtype=DQ.dtype.element_ty)
            keep_d = unwritten & (offs_d[None, :] < D)
            tl.store(DQ + b * stride_xb + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                     zeros_d, mask=keep_d)
            tl.store(DK + b * stride_yb + h * stride_yh + rows[:, None] * stride_yn + offs_d[None, :] * stride_yd,
                     zeros_d, mask=keep_d)
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + rows[:, None] * stride_zn
                     + offs_dv[None, :] * stride_zd, tl.zeros([BLOCK_M, BLOCK_DV], dtype=DV_OUT.dtype.element_ty),
                     mask=unwritten & (offs_dv[None, :] < DV))
    else:
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        share_d: tl.constexpr = BLOCK_D * 2 * BLOCK_M  # a head's two shares are adjacent
        share_dv: tl.constexpr = BLOCK_DV * 2 * BLOCK_M
        head_d = bh * (2 * share_d)
        head_dv = bh * (2 * share_dv)
        for blk in tl.static_range(2):
            rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
            # dK, dV rows of key block blk: shares of query blocks 0 and 1. Causal: query block 0 does not reach
            # key block 1.
            earlier = (not CAUSAL) or blk == 0
            dk = tl.trans(_short2_share(DK_PART, share_d, head_d, offs_d, rows, 2 * BLOCK_M, length, earlier, True))
            tl.store(DK + b * stride_yb + h * stride_yh + rows[:, None] * stride_yn + offs_d[None, :] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))
            dv = tl.trans(_short2_share(DV_PART, share_dv, head_dv, offs_dv, rows, 2 * BLOCK_M, length, earlier,
                                        True))
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + rows[:, None] * stride_zn
                     + offs_dv[None, :] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_dv[None, :] < DV))


@triton.jit(do_not_specialize=["HEAD_GROUPS"])  # (one compile for every grouping of GROUPED)
def _bias_bwd_short2_keys_kernel(
    Q, K, V, DOUT, DIST, LUT, LENGTHS, LSE, DELTA, DQ, DK, DV_OUT, DQ_PART, DS_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj, stride_row,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    stride_zb, stride_zh, stride_zn, stride_zd,
    N, N_OUT, D, DV, scale, qk_scale2, HEADS: tl.constexpr, HEAD_GROUPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, DQ_T: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, TABLE_GRAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
    GROUPED: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False, band=0,
    GROUPED_KV: tl.constexpr = False, ROWS: tl.constexpr = 32,
):
    """:func:`_bias_bwd_short2_kernel`'s twin with the key blocks outer (the configs' KEYS_OUTER), as a flash
    backward runs: one program per batch item (and head group) walks its heads, and for each head the key blocks of
    ``BLOCK_N = BLOCK_M`` the length reaches, each over the steps of ROWS query rows that reach it (causal: from the
    diagonal's). A key block's dK and dV accumulate in registers over its steps and are stored once, in q's dtype:
    no shares, no sum kernel, about half the scratch of the query-major kernel (``tools/traffic.py``), at two fp32
    ``[BLOCK_D, BLOCK_N]`` accumulators' registers (spill-free at head dims up to 64).

    ``delta`` (the row sums of ``P * dP``) is exact, as in :func:`_bias_bwd_short2_kernel` (every row of dS sums to
    zero up to fp32 rounding, which the table gradient's bucket sums need: ``rowsum(dO * O)`` from the rounded O
    leaves each row a small error that adds up per bucket): for an item longer than a block, a first pass over the
    second key block stores each head's row sums of ``P * dP`` there in ``DELTA`` (fp32 rows like LSE,
    ``stride_row``), and the first key block adds its own. Rows reaching both key blocks keep delta there and their
    first key block's dQ product in ``DQ_PART`` (fp32 ``[B, H, BLOCK_D, 2 * BLOCK_M]``, ``[B, H, 2 * BLOCK_M,
    BLOCK_D]`` without DQ_T), read back after a barrier: the second key block adds its product to it and stores
    dQ. With TABLE_GRAD each head's dS goes to ``DS_OUT`` (fp32 ``[B, H, 2, 2, BLOCK_M,
    BLOCK_N]``, [query block, key block]) for :func:`_bias_bwd_short_table_kernel`, at the keys :func:`_stored`
    keeps (inside the length, rounded up to 8) of the rows the steps walk; the table kernel reads no other. Blocks
    and steps past the length get zero gradients, so that no launch clears them first. Each pair is read at
    ``distance[b, i, j]`` only: a directed distance is exact.

    Args: as :func:`_bias_bwd_short2_kernel` (no dK/dV shares); ROWS: query rows a step (a multiple of 8 dividing
        BLOCK_M).
    Grid: ``(B, HEAD_GROUPS)``: a program takes heads g, g + HEAD_GROUPS, ... (the launcher's
    :func:`._launch.head_groups`).
    """
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_j = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    two_blocks = length > BLOCK_M
    share_q: tl.constexpr = BLOCK_D * 2 * BLOCK_M  # a head's dQ share (its first key block's, all its rows)
    for h in range(_first_head(GROUPED), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
        v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
        do_base = DOUT + b * stride_gb + h * stride_gh
        dq_share = DQ_PART + (b * HEADS + h) * share_q
        delta_rows = DELTA + (b * HEADS + h) * stride_row
        lse_rows = LSE + (b * HEADS + h) * stride_row
        # The key blocks the length reaches, each over the query rows that reach it in steps of ROWS (runtime
        # loops: one copy of the tile's code, no step's loads hoisted into another's registers).
        num_blocks = (length + BLOCK_N - 1) // BLOCK_N
        num_steps = (length + ROWS - 1) // ROWS
        if two_blocks:  # exact delta: first the row sums of P * dP over the second key block, of the rows reaching it
            offs_n = BLOCK_N + offs_j
            for step in range(BLOCK_M // ROWS if CAUSAL else 0, num_steps):
                offs_m = step * ROWS + offs_r
                row_ok = offs_m < length
                bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                                    EVEN_N, OPAQUE_BIAS, INTERPRETED, BAND, band)
                lse = tl.load(lse_rows + offs_m, mask=row_ok, other=float("inf"))
                p, dp = _short_p_dp(q_base, k_base, v_base, do_base, bias, lse, offs_m, offs_n, length, D, DV,
                                    stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_gn,
                                    stride_gd, qk_scale2, BLOCK_D, BLOCK_DV, CHUNK, EVEN_D, EVEN_DV, DOT_PRECISION)
                tl.store(delta_rows + offs_m, tl.sum(p * dp, 1), mask=row_ok)
            tl.debug_barrier()  # (read back below, maybe by other warps' threads)
        for kb in range(0, num_blocks):
            tl.debug_barrier()  # the second key block reads the delta rows and dQ shares the first stored
            offs_n = kb * BLOCK_N + offs_j
            first_key_block = kb == 0
            dk = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)  # dK^T, dV^T of the key block
            dv = tl.zeros([BLOCK_DV, BLOCK_N], dtype=tl.float32)
            # (causal: from the diagonal's query rows)
            for step in range(kb * (BLOCK_N // ROWS) if CAUSAL else 0, num_steps):
                offs_m = step * ROWS + offs_r
                row_ok = offs_m < length
                qb = (step * ROWS) // BLOCK_M  # the query block of these rows
                # Rows whose keys reach both blocks take dQ in two products, the first key block's as a share.
                if CAUSAL:
                    dq_to_share = first_key_block & two_blocks & (qb == 1)
                else:
                    dq_to_share = first_key_block & two_blocks
                bias = _short2_bias(DIST, LUT, b, offs_m, offs_n, length, N, stride_db, stride_di, stride_dj, CAUSAL,
                                    EVEN_N, OPAQUE_BIAS, INTERPRETED, BAND, band)
                lse = tl.load(lse_rows + offs_m, mask=row_ok, other=float("inf"))
                p, dp = _short_p_dp(q_base, k_base, v_base, do_base, bias, lse, offs_m, offs_n, length, D, DV,
                                    stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_gn,
                                    stride_gd, qk_scale2, BLOCK_D, BLOCK_DV, CHUNK, EVEN_D, EVEN_DV, DOT_PRECISION)
                if first_key_block:  # exact: this block's row sums plus the second's (rows reaching it)
                    delta = tl.sum(p * dp, 1) + tl.load(delta_rows + offs_m, mask=row_ok & dq_to_share, other=0.0)
                    tl.store(delta_rows + offs_m, delta, mask=row_ok & dq_to_share)
                else:
                    delta = tl.load(delta_rows + offs_m, mask=row_ok, other=0.0)
                # dS with the score scale folded in (a row constant), as in the one-tile kernel.
                ds = p * (dp * scale - (delta * scale)[:, None])
                if TABLE_GRAD:
                    tl.store(DS_OUT + (((b * HEADS + h) * 2 + qb) * 2 + kb) * (BLOCK_M * BLOCK_N)
                             + (offs_m - qb * BLOCK_M)[:, None] * BLOCK_N + offs_j[None, :], ds,
                             mask=_stored(offs_n, length)[None, :])
                p_in = p.to(Q.dtype.element_ty)
                ds_in = ds.to(Q.dtype.element_ty)
                do = load_rows(do_base, offs_m, offs_dv, stride_gn, stride_gd, length, DV, True, EVEN_DV)
                dv = mma_acc(tl.trans(do), p_in, dv, DOT_PRECISION)
                q = load_rows(q_base, offs_m, offs_d, stride_qn, stride_qd, length, D, True, EVEN_D)
                dk = mma_acc(tl.trans(q), ds_in, dk, DOT_PRECISION)
                # dQ: rows reaching one key block store it; rows reaching two store the first block's product as
                # a share, and the second block's accumulates onto it (ordered by the barrier above).
                for c in tl.static_range(0, BLOCK_D, OUT_CHUNK):
                    offs_c = c + tl.arange(0, OUT_CHUNK)
                    k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
                    if DQ_T:  # dQ^T = K^T dS^T
                        dq_at = dq_share + offs_c[:, None] * (2 * BLOCK_M) + offs_m[None, :]
                        dq = mma_acc(tl.trans(k), tl.trans(ds_in), tl.load(dq_at, mask=(kb == 1), other=0.0),
                                     DOT_PRECISION)
                        if dq_to_share:
                            tl.store(dq_at, dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[None, :] * stride_xn
                                     + offs_c[:, None] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[None, :] < N_OUT) & (offs_c[:, None] < D))
                    else:
                        dq_at = dq_share + offs_m[:, None] * BLOCK_D + offs_c[None, :]
                        dq = mma_acc(ds_in, k, tl.load(dq_at, mask=(kb == 1), other=0.0), DOT_PRECISION)
                        if dq_to_share:
                            tl.store(dq_at, dq)
                        else:
                            tl.store(DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn
                                     + offs_c[None, :] * stride_xd, dq.to(DQ.dtype.element_ty),
                                     mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < D))
            tl.store(DK + b * stride_yb + h * stride_yh + offs_n[None, :] * stride_yn + offs_d[:, None] * stride_yd,
                     dk.to(DK.dtype.element_ty), mask=(offs_n[None, :] < N_OUT) & (offs_d[:, None] < D))
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + offs_n[None, :] * stride_zn
                     + offs_dv[:, None] * stride_zd, dv.to(DV_OUT.dtype.element_ty),
                     mask=(offs_n[None, :] < N_OUT) & (offs_dv[:, None] < DV))
        # dQ rows of a last block's steps past the length: zero
        for step in range(num_steps, num_blocks * (BLOCK_M // ROWS)):
            rows = step * ROWS + offs_r
            tl.store(DQ + b * stride_xb + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                     tl.zeros([ROWS, BLOCK_D], dtype=DQ.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))
        for kb in range(num_blocks, 2):  # blocks past the length (both of an empty item): zero dK, dV, dQ rows
            rows = kb * BLOCK_N + offs_j
            tl.store(DK + b * stride_yb + h * stride_yh + rows[:, None] * stride_yn + offs_d[None, :] * stride_yd,
                     tl.zeros([BLOCK_N, BLOCK_D], dtype=DK.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))
            tl.store(DV_OUT + b * stride_zb + h * stride_zh + rows[:, None] * stride_zn
                     + offs_dv[None, :] * stride_zd, tl.zeros([BLOCK_N, BLOCK_DV], dtype=DV_OUT.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_dv[None, :] < DV))
            tl.store(DQ + b * stride_xb + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                     tl.zeros([BLOCK_M, BLOCK_D], dtype=DQ.dtype.element_ty),
                     mask=(rows[:, None] < N_OUT) & (offs_d[None, :] < D))


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _bias_bwd_short_table_kernel(
    DS, DIST, BUCKET_LUT, LENGTHS, BUCKET_PARTIALS, stride_db, stride_di, stride_dj, N, scale, window, HEADS,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, STATIC_BUCKETS: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    LAST_DISTANCE_BUCKET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
    CAUSAL: tl.constexpr, INTERPRETED: tl.constexpr, BLOCKS: tl.constexpr = 1, TREE_GRAD: tl.constexpr = True,
    POS_BOUNDS=0, POS_PARTIALS=0, NUM_BOUNDS: tl.constexpr = 16, POSITION_GRAD: tl.constexpr = False,
):
    """The short-row table gradient: one dS tile of a batch item (:func:`_bias_bwd_short_kernel`'s or
    :func:`_bias_bwd_short2_kernel`'s ``DS_OUT``, ``[B, H, BLOCKS, BLOCKS, BLOCK_M, BLOCK_N]``) summed over the
    heads in a fixed order and reduced per bucket once (:func:`_bucket_sums`), read only where the kernel stored
    it (:func:`_stored`: inside the length, rounded up to 8). The tile's bucket set comes from
    its own distance tile (``BUCKET_LUT``: the bucket of each uint8 distance), over the pairs the length,
    causality and ``window`` (-1: none) allow: up to 31 buckets their bit set (an OR over the tile), else the
    lowest and highest; a tile without an allowed pair is not read. Writes
    ``BUCKET_PARTIALS[(b * BLOCKS + q_block) * BLOCKS + k_block]`` (fp32 ``[NUM_BUCKETS]``); TREE_GRAD False
    (only the position table's gradient wanted) compiles that part out.

    POS_BOUNDS, POS_PARTIALS, NUM_BOUNDS, POSITION_GRAD (one tile a sequence, ``BLOCKS = 1``; compiled out without
    POSITION_GRAD): T5's position-table gradient, per head: each head's dS tile, read transposed (keys are rows),
    gets the dK/dV kernel's boundary sums (:func:`_offset_prefix_sums`: the sum of dS over the pairs at offsets
    ``j - i <= POS_BOUNDS[t]``), written to ``POS_PARTIALS[b, h]`` (fp32 ``[B, HEADS, NUM_BOUNDS]``, divided by the
    score scale dS carries), which the launcher adds over the batch in a fixed order. Every row of the short
    kernels' dS sums to zero up to fp32 rounding (exact delta), as the boundary sums need.
    Grid: ``(B, BLOCKS, BLOCKS)``."""
    b = tl.program_id(0).to(tl.int64)
    q_block = tl.program_id(1)
    k_block = tl.program_id(2)
    tile = (b * BLOCKS + q_block) * BLOCKS + k_block
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    if POSITION_GRAD:  # per head, every tile (a tile without an allowed pair holds zeros: its sums are 0)
        bounds = tl.load(POS_BOUNDS + tl.arange(0, NUM_BOUNDS))
        key_ok = offs_n < length
        ptrs_t = (DS + b * HEADS * (BLOCK_M * BLOCK_N) + tl.arange(0, BLOCK_M)[None, :] * BLOCK_N
                  + tl.arange(0, BLOCK_N)[:, None])  # [keys, queries]
        kept_t = _stored(offs_m, length)[None, :]  # (the query rows the one-tile kernels stored, every key)
        for h in range(0, HEADS):
            pos_sums = _offset_prefix_sums(tl.zeros([NUM_BOUNDS], dtype=tl.float32),
                                           tl.load(ptrs_t + h * (BLOCK_M * BLOCK_N), mask=kept_t, other=0.0), 0,
                                           offs_m, key_ok, bounds)
            tl.store(POS_PARTIALS + (b * HEADS + h) * NUM_BOUNDS + tl.arange(0, NUM_BOUNDS), pos_sums / scale)
    if TREE_GRAD:
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
                kept = _stored(offs_m, length)[:, None] & _stored(offs_n, length)[None, :]
                ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for h in range(0, HEADS):
                    ds += tl.load(ptrs + h * (BLOCKS * BLOCKS * BLOCK_M * BLOCK_N), mask=kept, other=0.0)
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
             DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False,
             seed=0, threshold=0, bh=0, keep_scale=1.0, DROPOUT: tl.constexpr = False, BAND: tl.constexpr = False,
             band=0, pos_row=0, reach=0, POSITION: tl.constexpr = False):
    """One key tile of the dQ backward; with TABLE_GRAD it also sums each row of dS (``row_error``); with DROPOUT
    dP takes the forward's kept pairs (scaled); a masked tile also masks the positional window (BAND); with
    POSITION the scores carry T5's relative-position term."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    scores, k = _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn,
                             stride_kd, stride_di, stride_dj, qk_scale2, EVEN_D, EVEN_N, MASK, SYNTAX, DOT_PRECISION,
                             OPAQUE_BIAS, INTERPRETED, pos_row, reach, POSITION)
    exponent = scores - lse[:, None]
    if MASK:  # masked before exp2: an excluded pair's exponent may be large
        exponent = tl.where(_allowed(offs_m, offs_n, length, CAUSAL, BAND, band), exponent, float("-inf"))
    p = tl.exp2(exponent)
    v = load_rows(v_base, offs_n, offs_dv, stride_vn, stride_vd, length, DV, MASK, EVEN_DV)
    dp = mma(do, tl.trans(v), DOT_PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, threshold, bh, offs_m, k_block * BLOCK_N, offs_m.shape[0], BLOCK_N)
        dp = tl.where(keep, dp * keep_scale, 0.0)
    ds = p * (dp - delta[:, None])
    dq = mma_acc(ds.to(k.dtype), k, dq, DOT_PRECISION)
    if TABLE_GRAD:
        row_error += tl.sum(ds, 1)
    return dq, row_error


@triton.jit(do_not_specialize=["seed"])  # (one compile for every seed)
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
    seed=0, threshold=0, keep_scale=1.0, DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False,
    band=0, GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
):
    """Backward for one query block: ``delta = rowsum(dO * O)`` of its rows (no separate launch: this kernel
    runs first and owns whole rows), ``dq``, and the delta the dK/dV and table kernels read.

    An exact softmax backward has rows of dS that sum to zero. ``delta`` is formed from a rounded output
    (fp16/bf16), so its rows sum to a small ``row_error`` instead; per bucket those errors add up over
    thousands of rows. With TABLE_GRAD the kernel writes ``delta + row_error`` (``dS - P * row_error``: rows
    that sum to zero up to fp32 rounding) for the table kernel, which sums dS per bucket.

    Args:
        OUT: the forward's output, like DOUT (strides ``stride_o*``). DQ: like Q (strides ``stride_x*``).
        DELTA: fp32 ``[B, H, N]`` (rows ``stride_row`` apart), written: delta, corrected with TABLE_GRAD (the
            launcher sets it for the position table's gradient too, which the dK/dV kernel sums); 0 for rows past
            the length.
        POS_LUT, stride_ph, reach, POSITION: T5's relative-position term, as in the forward.
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
    k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
    v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
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
                                 OPAQUE_BIAS, INTERPRETED, seed, threshold, bh, keep_scale, DROPOUT, BAND, band,
                                 POS_LUT + h * stride_ph, reach, POSITION)
    for i in range(interior, total):
        dq, row_error = _dq_tile(dq, row_error, q, do, lse, delta, k_base, v_base, dist_base, lut_row,
                                 _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                 stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                 BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, True, CAUSAL, SYNTAX, TABLE_GRAD, DOT_PRECISION,
                                 OPAQUE_BIAS, INTERPRETED, seed, threshold, bh, keep_scale, DROPOUT, BAND, band,
                                 POS_LUT + h * stride_ph, reach, POSITION)

    # Epilogue: dQ carries the score scale; rows past the length get 0 and add nothing to the table gradient.
    row_ok = offs_m < length
    dq = tl.where(row_ok[:, None], dq * scale, 0.0)
    dq_ptrs = DQ + b * stride_xb + h * stride_xh + offs_m[:, None] * stride_xn + offs_d[None, :] * stride_xd
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_d[None, :] < D))
    if TABLE_GRAD:
        delta += row_error
    tl.store(DELTA + row_base + offs_m, delta, mask=offs_m < N)


@triton.jit
def _bias_table_grad_kernel(
    PARTIALS, TABLE, SCALE, DTABLE, DSCALE,
    outer, rows, inner, stride_po, stride_pr, stride_pi, stride_tr, stride_dr,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, BLOCK_P: tl.constexpr, WANT_TABLE: tl.constexpr,
    WANT_SCALE: tl.constexpr, POS_PARTIALS=0, POS_MATRIX=0, DPOS=0, pos_outer=0, pos_rows=0,
    NUM_BOUNDS: tl.constexpr = 16, NUM_POS: tl.constexpr = 16, POS_PAD: tl.constexpr = 16,
    POSITION_GRAD: tl.constexpr = False,
):
    """The table and bias-strength gradients from the backward's per-program bucket sums, in one program; with
    POSITION_GRAD T5's position table's gradient too.

    ``G[r] = sum_{a < outer, i < inner} PARTIALS[a, r, i, :]`` (a fixed order: blocks of BLOCK_P partial rows, each
    block summed as a tile), ``DTABLE[r] = c * G[r]`` in the table's dtype and ``DSCALE = sum_r sum_t TABLE[r, t] *
    G[r, t]`` in the strength's dtype, with ``c = SCALE[0]``: deterministic, no atomics, and no aten epilogue.
    ``DPOS[h] = (sum_{a < pos_outer} POS_PARTIALS[a, h, :]) @ POS_MATRIX`` for the ``pos_rows`` heads (fp32): the
    sums of dS at T5's position boundaries (:func:`._host.position_bounds`) made the position table's gradient by the
    boundaries-to-buckets matrix (:func:`._host.position_matrix_on`), in the same fixed order.

    Args:
        PARTIALS: fp32, row ``(a, r, i)`` at ``a * stride_po + r * stride_pr + i * stride_pi``, ``NUM_BUCKETS``
            contiguous sums each; TABLE / DTABLE: ``[rows, NUM_BUCKETS]`` with row strides ``stride_tr`` /
            ``stride_dr``; SCALE, DSCALE: one element. ``rows = 0``: no tree table gradient (neither wanted).
        POS_PARTIALS: fp32 ``[pos_outer, pos_rows, NUM_BOUNDS]`` contiguous; POS_MATRIX: fp32 ``[NUM_BOUNDS,
            NUM_POS]`` contiguous; DPOS: fp32 ``[pos_rows, NUM_POS]`` contiguous (``POS_PAD``: ``NUM_POS`` padded to
            a power of two).
    Grid: ``(1,)``.
    """
    cols = tl.arange(0, BUCKETS_PAD)
    col_ok = cols < NUM_BUCKETS
    c = tl.load(SCALE).to(tl.float32)
    dscale = tl.zeros([BUCKETS_PAD], dtype=tl.float32)
    for r in range(0, rows):
        g = tl.zeros([BLOCK_P, BUCKETS_PAD], dtype=tl.float32)
        for a in range(0, outer):
            for start in range(0, inner, BLOCK_P):
                offs = start + tl.arange(0, BLOCK_P)
                ptrs = PARTIALS + a * stride_po + r * stride_pr + offs[:, None] * stride_pi + cols[None, :]
                g += tl.load(ptrs, mask=(offs[:, None] < inner) & col_ok[None, :], other=0.0)
        total = tl.sum(g, 0)
        if WANT_TABLE:
            tl.store(DTABLE + r * stride_dr + cols, (c * total).to(DTABLE.dtype.element_ty), mask=col_ok)
        if WANT_SCALE:
            dscale += tl.load(TABLE + r * stride_tr + cols, mask=col_ok, other=0.0).to(tl.float32) * total
    if WANT_SCALE:
        tl.store(DSCALE, tl.sum(dscale, 0).to(DSCALE.dtype.element_ty))
    if POSITION_GRAD:
        bounds = tl.arange(0, NUM_BOUNDS)
        buckets = tl.arange(0, POS_PAD)
        matrix = tl.load(POS_MATRIX + bounds[:, None] * NUM_POS + buckets[None, :], mask=buckets[None, :] < NUM_POS,
                         other=0.0)
        for h in range(0, pos_rows):
            sums = tl.zeros([NUM_BOUNDS], dtype=tl.float32)
            for a in range(0, pos_outer):
                sums += tl.load(POS_PARTIALS + (a * pos_rows + h) * NUM_BOUNDS + bounds)
            tl.store(DPOS + h * NUM_POS + buckets, tl.sum(sums[:, None] * matrix, 0), mask=buckets < NUM_POS)
