"""The forward kernels of the distance-bias op, and the device helpers the backward's query-row kernels share.

- :func:`_bias_fwd_kernel`: output rows and their log2-sum-exp for one query block (online softmax), walking its
  key blocks (:func:`_key_block_range`: interior ones first, unmasked, then the boundary ones);
- :func:`_bias_fwd_short_kernel`: rows of at most 64 tokens, one tile a sequence and every head in one program.

:func:`_allowed` (length and causality of a tile) and :func:`_tile_scores` (the log2-domain scores of a query-row
tile) also serve the dQ and table kernels (:mod:`._backward`). Launched by :mod:`._launch`.
"""
import triton
import triton.language as tl

from .._primitives import (build_lut, build_position_lut, distance_tile, dropout_keep, load_rows, lut_bias, mma,
                           mma_acc, opaque_offsets, position_bias, program_ids)


@triton.jit
def _allowed(offs_m, offs_n, length, CAUSAL: tl.constexpr, BAND: tl.constexpr = False, band=0):
    """bool ``[M, N]``: query i may attend key j by length, causality and, with BAND, the positional window
    ``|i - j| <= band`` (the distance window lives in the LUT)."""
    ok = (offs_m[:, None] < length) & (offs_n[None, :] < length)
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None])
    if BAND:
        ok = ok & (tl.abs(offs_m[:, None] - offs_n[None, :]) <= band)
    return ok


@triton.jit
def _kv_offset(h, stride, KV_GROUP, GROUPED_KV: tl.constexpr):
    """Where query head h's key/value head ``h // KV_GROUP`` starts along a head stride (grouped-query attention):
    with GROUPED_KV an int32 division (an int64 one is a long subroutine), else ``h * stride`` as without grouping."""
    if GROUPED_KV:
        offset = tl.cast(tl.cast(h, tl.int32) // KV_GROUP, tl.int64) * stride
    else:
        offset = h * stride
    return offset


@triton.jit
def _first_head(GROUPED: tl.constexpr, BLOCKS: tl.constexpr = 1):
    """The first head a short-row program walks: with GROUPED its head group (``program_id(1) // BLOCKS``; group g
    walks heads g, g + HEAD_GROUPS, ...), else 0 (one program walks every head: the loop of a single-axis grid)."""
    if GROUPED:
        return tl.program_id(1) // BLOCKS
    else:
        return 0


@triton.jit
def _head_step(HEAD_GROUPS, GROUPED: tl.constexpr):
    """The step of a short-row program's head loop: HEAD_GROUPS with GROUPED, else 1. The loop's bounds stay kernel
    parameters or constants: no register holds them in kernels at the 255-register limit."""
    if GROUPED:
        return HEAD_GROUPS
    else:
        return 1


@triton.jit
def _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn, stride_kd,
                 stride_di, stride_dj, qk_scale2, EVEN_D: tl.constexpr, EVEN_N: tl.constexpr, MASK: tl.constexpr,
                 SYNTAX: tl.constexpr, DOT_PRECISION: tl.constexpr, OPAQUE_BIAS: tl.constexpr = False,
                 INTERPRETED: tl.constexpr = False, pos_row=0, reach=0, POSITION: tl.constexpr = False):
    """``(scores, k)`` of one query-row tile: the log2-domain ``q k^T * scale * log2(e) + lut[d]`` (the distance
    tile and its bias are read first, the key tile after) and the key tile, for the forward and the dQ kernel.
    With POSITION, T5's relative-position term of the head (:func:`position_bias` from ``pos_row``) is added too."""
    if SYNTAX:
        dist = distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, N, MASK, EVEN_N)
        bias = lut_bias(lut_row, dist, OPAQUE_BIAS, INTERPRETED)
        if POSITION:
            bias += position_bias(pos_row, offs_n[None, :] - offs_m[:, None], reach)
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
              OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False, seed=0, threshold=0, bh=0,
              DROPOUT: tl.constexpr = False, BAND: tl.constexpr = False, band=0, pos_row=0, reach=0,
              POSITION: tl.constexpr = False):
    """One key tile of the forward's online softmax (log2 domain). With DROPOUT the normaliser takes every
    probability and the product with V only the kept ones (:func:`dropout_keep` of row key ``bh``); a masked tile
    (MASK) also masks the positional window (BAND)."""
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    scores, k = _tile_scores(q, k_base, dist_base, lut_row, offs_m, offs_n, offs_d, length, N, D, stride_kn,
                             stride_kd, stride_di, stride_dj, qk_scale2, EVEN_D, EVEN_N, MASK, SYNTAX, DOT_PRECISION,
                             OPAQUE_BIAS, INTERPRETED, pos_row, reach, POSITION)
    if MASK:
        scores = tl.where(_allowed(offs_m, offs_n, length, CAUSAL, BAND, band), scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    if SYNTAX or MASK:  # a row may have seen only -inf so far
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        p = tl.where(dropout_keep(seed, threshold, bh, offs_m, k_block * BLOCK_N, offs_m.shape[0], BLOCK_N), p, 0.0)
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


@triton.jit(do_not_specialize=["seed"])  # (one compile for every seed)
def _bias_fwd_kernel(
    Q, K, V, DIST, LUT, LENGTHS, KV_LIST, KV_COUNT, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj, stride_lh, stride_row,
    H, N, N_OUT, D, DV, num_q_blocks, num_k_blocks, qk_scale2,
    TABLE, SCALE, BUCKETS, stride_tr, window,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, EVEN_N: tl.constexpr, USE_LISTS: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SYNTAX: tl.constexpr = True, OPAQUE_BIAS: tl.constexpr = False,
    INTERPRETED: tl.constexpr = False, seed=0, threshold=0, keep_scale=1.0, DROPOUT: tl.constexpr = False,
    KV_GROUP=1, BAND: tl.constexpr = False, band=0, GROUPED_KV: tl.constexpr = False,
    POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False, PTABLE=0, stride_pt=0, PBUCKETS=0,
    POS_WIDTH: tl.constexpr = 1,
):
    """Forward: output rows and their log2-sum-exp for one query block of one (batch, head).

    Args:
        Q: ``[B, H, N_OUT, D]``, OUT: ``[B, H, N_OUT, DV]``; K: ``[B, H / KV_GROUP, N_OUT, D]``, V: ``[B, H / KV_GROUP,
            N_OUT, DV]`` (strided, one dtype): query head h reads key/value head ``h // KV_GROUP`` (grouped-query
            attention; 1, the default, is specialised: one key/value head a query head, no division); GROUPED_KV: the
            launcher's ``KV_GROUP > 1``.
        N, N_OUT: the padded extent (``roundup(N_OUT, 16)``: the rows and columns of DIST's buffer and of the
            LSE rows, which reads are bounded by, so that masks and addresses stay 16-aligned) and the sequence
            extent (the rows of q, k, v and the outputs, which stores are bounded by).
        DIST: uint8 ``[B, N_OUT, N_OUT]`` in an ``[B, N, N]`` buffer (:func:`aligned_distance`).
        LUT: fp32 ``[H or 1, 256]`` (row stride ``stride_lh``, 0 when shared): the log2-domain bias of every
            distance value, ``-inf`` for pairs outside the window; written here first (:func:`build_lut`) from TABLE
            (``[H or 1, T]``, row stride ``stride_tr``, 0 when shared), SCALE (the strength c), BUCKETS (int32
            ``[256]``, ``BucketSpec.lut()``) and the window (HAS_WINDOW), and read by the backward.
        LENGTHS: int32 ``[B]``.
        KV_LIST, KV_COUNT: int32 ``[B, nQ, nK]`` live key blocks (interior first) and ``[B, nQ, 2]``
            (interior count, live count); read when USE_LISTS.
        LSE: fp32 ``[B, H, N]`` with rows ``stride_row`` apart (N rounded up to 16: aligned row loads), log2
            domain; ``+inf`` for rows past the length or with no allowed key.
        qk_scale2: ``scale * log2(e)``.
        SYNTAX: False compiles out the distance tile and the bias (a plain flash kernel with the same tiles,
            for the inspection report only).
        BAND, band: the positional window ``|i - j| <= band`` (the launcher's ``position_window``): masked in the
            boundary tiles, which the live-tile lists (USE_LISTS) then include; tiles outside it are not walked.
        seed, threshold, keep_scale, DROPOUT: attention dropout on the probabilities (the launcher's
            :func:`~syntaxkernels.ops._primitives.dropout_arguments`): the pairs :func:`dropout_keep` drops leave
            the product with V, the output is scaled by ``keep_scale``; the lse is the undropped one.
        POS_LUT, stride_ph, reach, POSITION: T5's relative-position term (compiled out without POSITION): fp32
            ``[H, 2 * reach + 1]`` (row stride ``stride_ph``), head h's score gets ``POS_LUT[h, clamp(j - i, -reach,
            reach) + reach]`` (log2 domain) beside the tree bias; written here first (:func:`build_position_lut`)
            from PTABLE (``[H, P]``, row stride ``stride_pt``) and PBUCKETS (int ``[2 * reach + 1]``,
            ``RelativePositionSpec.lut()``; POS_WIDTH: a power of two at least its length), read by the backward.
    Grid: ``(nQ * B * H,)``.
    """
    q_block, bh, b, h = program_ids(num_q_blocks, H)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_rows(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qn, stride_qd, length, D, True, EVEN_D)
    k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
    v_base = V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV)
    dist_base = DIST + b * stride_db
    lut_row = LUT + h * stride_lh
    if SYNTAX:
        build_lut(TABLE, SCALE, BUCKETS, lut_row, TABLE + h * stride_tr, window, HAS_WINDOW)
    if POSITION:
        build_position_lut(POS_LUT + h * stride_ph, PTABLE + h * stride_pt, PBUCKETS, 2 * reach + 1, POS_WIDTH)

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
                                  OPAQUE_BIAS, INTERPRETED, seed, threshold, bh, DROPOUT, BAND, band,
                                  POS_LUT + h * stride_ph, reach, POSITION)
    for i in range(interior, total):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, dist_base, lut_row,
                                  _key_block(list_base, i, USE_LISTS), offs_m, offs_d, offs_dv, length, N, D, DV,
                                  stride_kn, stride_kd, stride_vn, stride_vd, stride_di, stride_dj, qk_scale2,
                                  BLOCK_N, EVEN_D, EVEN_DV, EVEN_N, True, CAUSAL, SYNTAX, DOT_PRECISION,
                                  OPAQUE_BIAS, INTERPRETED, seed, threshold, bh, DROPOUT, BAND, band,
                                  POS_LUT + h * stride_ph, reach, POSITION)

    # Epilogue: normalise; rows past the length or without an allowed key (l_i exactly 0) are 0 with lse = +inf.
    # A NaN l_i (a NaN or +inf score among the allowed ones) is normalised: the row and its lse are NaN.
    valid = (offs_m < length) & (l_i != 0.0)
    denom = tl.where(valid, l_i, 1.0)
    if DROPOUT:
        out = tl.where(valid[:, None], acc * (keep_scale / denom)[:, None], 0.0)
    else:
        out = tl.where(valid[:, None], acc / denom[:, None], 0.0)
    lse = tl.where(valid, m_i + tl.log2(denom), float("inf"))
    o_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_dv[None, :] < DV))
    tl.store(LSE + bh.to(tl.int64) * stride_row + offs_m, lse, mask=offs_m < N)


@triton.jit(do_not_specialize=["HEAD_GROUPS", "seed"])  # (one compile for every grouping of GROUPED, every seed)
def _bias_fwd_short_kernel(
    Q, K, V, DIST, LUT, LENGTHS, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj, stride_row,
    N, N_OUT, D, DV, qk_scale2, TABLE, SCALE, BUCKETS, window, HEADS, HEAD_GROUPS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CHUNK: tl.constexpr, OUT_CHUNK: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    EVEN_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr,
    OPAQUE_BIAS: tl.constexpr = False, INTERPRETED: tl.constexpr = False, GROUPED: tl.constexpr = False,
    seed=0, threshold=0, keep_scale=1.0, DROPOUT: tl.constexpr = False, KV_GROUP=1, BAND: tl.constexpr = False,
    band=0, GROUPED_KV: tl.constexpr = False, POS_LUT=0, stride_ph=0, reach=0, POSITION: tl.constexpr = False,
    PTABLE=0, stride_pt=0, PBUCKETS=0, POS_WIDTH: tl.constexpr = 1,
):
    """The forward of short rows (``N <= BLOCK_M = BLOCK_N``: a whole sequence is one tile) with a LUT shared by
    the heads: the output rows and their log2-sum-exp for one batch item and one of ``HEAD_GROUPS`` groups of its
    ``HEADS`` heads (group g: heads g, g + HEAD_GROUPS, ...; the launcher's :func:`._launch.head_groups`: as few
    groups as still fill the GPU).

    The distance tile and its bias are read once and serve the group's heads. The tile holds whole rows, so
    each head's softmax is exact in one pass (the row maximum, then one exp2 per element and the row sum; no
    running rescale): ``out = (P V) / l``, ``lse = m + log2(l)``; rows past the length or without an allowed key
    are 0 with ``lse = +inf``, as in :func:`_bias_fwd_kernel`. Products over head-dim chunks (CHUNK for
    ``q k^T``, OUT_CHUNK for ``P V``).

    Args: as :func:`_bias_fwd_kernel` (LUT and TABLE: one row; no live-tile lists; dropout, KV_GROUP and T5's
    relative-position term likewise: with POSITION the group's heads write their rows of the term's LUT
    first (:func:`build_position_lut`), then each head adds its own :func:`position_bias` tile to its scores
    inside the head loop, the shared bias tile staying the tree's).
    Grid: ``(B, HEAD_GROUPS)``.
    """
    b = tl.program_id(0).to(tl.int64)
    build_lut(TABLE, SCALE, BUCKETS, LUT, TABLE, window, HAS_WINDOW)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dist = distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, N, True, EVEN_N)
    bias = tl.where(_allowed(offs_m, offs_n, length, CAUSAL, BAND, band),
                    lut_bias(LUT, dist, OPAQUE_BIAS, INTERPRETED), float("-inf"))
    if POSITION:
        inv_scale2 = 1.0 / qk_scale2
        for h in range(_first_head(GROUPED), HEADS, _head_step(HEAD_GROUPS, GROUPED)):  # (before the head loop)
            build_position_lut(POS_LUT + h * stride_ph, PTABLE + h * stride_pt, PBUCKETS, 2 * reach + 1, POS_WIDTH)
    for h in range(_first_head(GROUPED), HEADS, _head_step(HEAD_GROUPS, GROUPED)):
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + _kv_offset(h, stride_kh, KV_GROUP, GROUPED_KV)
        if POSITION:
            # The head's own term, as the first product's accumulator (divided by the scale the sum is multiplied
            # by): added after the product, its gathered tile's layout would reach the row reductions, which then
            # run (with the exponent) in both layouts. Its index tile is formed per head (opaque_offsets): not a
            # tile held across the loop.
            rows = opaque_offsets(offs_m, INTERPRETED)
            scores = position_bias(POS_LUT + h * stride_ph, offs_n[None, :] - rows[:, None], reach) * inv_scale2
        for c in tl.static_range(0, BLOCK_D, CHUNK):
            offs_c = c + tl.arange(0, CHUNK)
            q = load_rows(q_base, offs_m, offs_c, stride_qn, stride_qd, length, D, True, EVEN_D)
            k = load_rows(k_base, offs_n, offs_c, stride_kn, stride_kd, length, D, True, EVEN_D)
            if c == 0 and not POSITION:
                scores = mma(q, tl.trans(k), DOT_PRECISION)
            else:
                scores = mma_acc(q, tl.trans(k), scores, DOT_PRECISION)
        scores = scores * qk_scale2 + bias  # (-inf where the shared bias excludes the pair, with the term too)
        m = tl.max(scores, 1)
        m = tl.where(m == float("-inf"), 0.0, m)  # a row without an allowed key: P = 0
        p = tl.exp2(scores - m[:, None])
        l = tl.sum(p, 1)
        valid = (offs_m < length) & (l != 0.0)  # l NaN: the row is NaN (a NaN or +inf score), as in the reference
        denom = tl.where(valid, l, 1.0)
        tl.store(LSE + (b * HEADS + h) * stride_row + offs_m, tl.where(valid, m + tl.log2(denom), float("inf")),
                 mask=offs_m < N)
        if DROPOUT:
            p = tl.where(dropout_keep(seed, threshold, b * HEADS + h, offs_m, 0, BLOCK_M, BLOCK_N), p, 0.0)
            scale_rows = tl.where(valid, keep_scale / denom, 0.0)
        else:
            scale_rows = tl.where(valid, 1.0 / denom, 0.0)
        p_in = p.to(Q.dtype.element_ty)
        for c in tl.static_range(0, BLOCK_DV, OUT_CHUNK):
            offs_c = c + tl.arange(0, OUT_CHUNK)
            v = load_rows(V + b * stride_vb + _kv_offset(h, stride_vh, KV_GROUP, GROUPED_KV), offs_n, offs_c,
                          stride_vn, stride_vd,
                          length, DV, True, EVEN_DV)
            # A select, not only the product with scale_rows: a padding row's q is 0, and 0 times a NaN k is NaN.
            out = tl.where(valid[:, None], mma(p_in, v, DOT_PRECISION) * scale_rows[:, None], 0.0)
            tl.store(OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_c[None, :] * stride_od,
                     out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < N_OUT) & (offs_c[None, :] < DV))
