"""Fused distance-bias attention: ``softmax(q k^T * scale + c * table[bucket(d)]) v``, forward and backward.

Limits: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``); fp16, bf16, fp32 inputs (fp32
accumulation; fp64 goes to the reference); head dims up to 128 (32, 64, 128 run unpadded; other sizes are
masked to the next power of two >= 32 inside the kernel); any N; q, k, v, distance and the output gradient are
read through their strides (no copies).

Layers (one file, three layers):

- ``_bias_attn_fwd_kernel``, ``_bias_attn_bwd_preprocess_kernel``, ``_bias_attn_bwd_dkdv_kernel``,
  ``_bias_attn_bwd_dq_kernel``: the Triton kernels. The uint8 distance tile is read in-kernel, the bucket
  is computed from the distance with integer ops (equal to ``BucketSpec.lut()``) and the bias from the
  table: no ``[B, H, N, N]`` tensor exists, forward or backward.
- ``bias_attention_forward`` / ``bias_attention_backward``: launchers registered as ``torch.library``
  Triton ops (``syntaxkernels::bias_attention_fwd`` / ``_bwd``) so ``torch.compile(fullgraph=True)`` traces
  them; their fake implementations only allocate outputs.
- ``_SyntaxBiasAttention`` (autograd.Function) and the public :func:`syntax_bias_attention`, which validates
  and dispatches on ``backend``.

Table gradient: with ``G[t] = sum of dS over the pairs in bucket t``, ``d table = c * G`` and
``d c = sum_t table[t] * G[t]``. The dq kernel sums dS per bucket on chip (only the buckets present in each
tile) and writes one ``[T]`` row per program into a ``[B, H, nQ, T]`` partials buffer; a second reduction sums
it. No atomics anywhere: dq, dk, dv and the table gradient are bit-identical run to run, so
``deterministic=True`` costs nothing extra (it is accepted and guaranteed).

Block skipping: with ``window`` set, :mod:`syntaxkernels.ops.block_meta` computes each tile's minimum
distance on the device and compacted live key-block lists; the kernels walk only live tiles. Without a
window the loops stop at the sequence length (ragged batches) and at the diagonal (causal).
"""
from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import _validation as V
from .. import reference
from ..specs import BucketSpec
from ._dispatch import resolve_backend
from ._primitives import (
    LOG2E,
    accumulate_bucket_row_sums,
    accumulate_bucket_sums,
    bucket_from_distance,
    finish_bucket_sums,
    finish_softmax,
    gather_bias,
    launch,
    load_distance_tile,
    load_tile,
    mma,
    online_softmax_step,
    pair_allowed,
    store_tile,
)
from .block_meta import build_block_meta

__all__ = ["syntax_bias_attention", "bias_attention_forward", "bias_attention_backward", "select_config"]

MAX_HEAD_DIM = 128


# ---------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _bias_attn_fwd_kernel(
    Q, K, V, DIST, TABLE, BIAS_SCALE, LENGTHS, KV_BLOCKS, KV_COUNTS, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_db, stride_di, stride_dj,
    stride_th,
    H, N, D, DV, num_q_blocks, num_k_blocks, qk_scale2, window,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_LISTS: tl.constexpr, HAS_WINDOW: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    NUM_BUCKETS: tl.constexpr,
):
    """Forward: output rows and their log2-sum-exp for one query block.

    Args:
        Q, K: ``[B, H, N, D]``; V, OUT: ``[B, H, N, DV]`` (strided, one dtype).
        DIST: uint8 ``[B, N, N]``; TABLE: fp32 ``[H or 1, T]`` (row stride
            ``stride_th``, 0 for a shared table); BIAS_SCALE: fp32 ``[1]``; LENGTHS: int32 ``[B]``.
        KV_BLOCKS, KV_COUNTS: int32 ``[B, nQ, nK]`` / ``[B, nQ]`` live key blocks (read when USE_LISTS).
        LSE: fp32 ``[B, H, N]`` contiguous, log2 domain.
        qk_scale2: ``scale * log2(e)``.
        MAX_DISTANCE, LOG_DISTANCE (0 = clamp scheme), UNREACHABLE_BUCKET: the BucketSpec (see
            :func:`bucket_from_distance`).
    Grid: ``(cdiv(N, BLOCK_M), B * H)``; one program owns BLOCK_M query rows of one (batch, head) and
    walks their key blocks with an online softmax.
    """
    q_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)

    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qn, stride_qd, length, D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dist_base = DIST + b * stride_db
    table_row = TABLE + h * stride_th
    bias_scale2 = tl.load(BIAS_SCALE).to(tl.float32) * 1.4426950408889634

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    accumulator = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Which key blocks to visit: the compacted live list, or every block up to the length (and diagonal).
    list_base = KV_BLOCKS + (b * num_q_blocks + q_block) * num_k_blocks
    if USE_LISTS:
        num_visits = tl.load(KV_COUNTS + b * num_q_blocks + q_block)
    else:
        num_visits = tl.cdiv(length, BLOCK_N)
        if CAUSAL:
            num_visits = tl.minimum(num_visits, tl.cdiv((q_block + 1) * BLOCK_M, BLOCK_N))
        num_visits = tl.where(q_block * BLOCK_M < length, num_visits, 0)

    # Main loop: scores, in-kernel bias gather, mask, online softmax, P @ V.
    for visit in range(0, num_visits):
        if USE_LISTS:
            k_block = tl.load(list_base + visit)
        else:
            k_block = visit
        offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, length, D)
        v = load_tile(v_base, offs_n, offs_dv, stride_vn, stride_vd, length, DV)
        qk = mma(q, tl.trans(k), DOT_PRECISION)
        distance = load_distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, length)
        bucket = bucket_from_distance(distance, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET)
        scores2 = qk * qk_scale2 + gather_bias(bucket, table_row, bias_scale2, NUM_BUCKETS)
        allowed = pair_allowed(offs_m, offs_n, length, distance, window, HAS_WINDOW, CAUSAL)
        scores2 = tl.where(allowed, scores2, float("-inf"))
        running_max, alpha, p, running_sum = online_softmax_step(running_max, running_sum, scores2)
        accumulator = accumulator * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PRECISION)

    # Epilogue: normalise; rows past the length or without an allowed key are 0.
    out, lse2 = finish_softmax(accumulator, running_max, running_sum)
    store_tile(OUT + b * stride_ob + h * stride_oh, out, offs_m, offs_dv, stride_on, stride_od, N, DV)
    tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse2, mask=offs_m < N)


@triton.jit
def _bias_attn_bwd_preprocess_kernel(
    OUT, DOUT, DELTA,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_gb, stride_gh, stride_gn, stride_gd,
    H, N, DV,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """``delta[b, h, i] = sum_d out * dout`` in fp32.

    Args:
        OUT, DOUT: ``[B, H, N, DV]`` (strided); DELTA: fp32 ``[B, H, N]`` contiguous.
    Grid: ``(cdiv(N, BLOCK_M), B * H)``; one program owns BLOCK_M rows.
    """
    q_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    out = load_tile(OUT + b * stride_ob + h * stride_oh, offs_m, offs_dv, stride_on, stride_od, N, DV)
    dout = load_tile(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_dv, stride_gn, stride_gd, N, DV)
    delta = tl.sum(out.to(tl.float32) * dout.to(tl.float32), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * N + offs_m, delta, mask=offs_m < N)


@triton.jit
def _bias_attn_bwd_dkdv_kernel(
    Q, K, V, DOUT, DIST, TABLE, BIAS_SCALE, LENGTHS, Q_BLOCKS, Q_COUNTS, LSE, DELTA, DK, DV_OUT,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj,
    stride_th,
    stride_xb, stride_xh, stride_xn, stride_xd,
    stride_yb, stride_yh, stride_yn, stride_yd,
    H, N, D, DV, num_q_blocks, num_k_blocks, scale, qk_scale2, window,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_LISTS: tl.constexpr, HAS_WINDOW: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    NUM_BUCKETS: tl.constexpr,
):
    """Backward for one key block: ``dk`` and ``dv``, recomputing P from the saved log2-sum-exp.

    Args:
        Q, K: ``[B, H, N, D]``; V, DOUT: ``[B, H, N, DV]`` (strided); DK, DV_OUT: like K, V (strides
            ``stride_x*`` and ``stride_y*``).
        Q_BLOCKS, Q_COUNTS: int32 ``[B, nK, nQ]`` / ``[B, nK]`` live query blocks (read when USE_LISTS).
        LSE, DELTA: fp32 ``[B, H, N]``. Others as in the forward.
    Grid: ``(cdiv(N, BLOCK_N), B * H)``; one program owns BLOCK_N keys of one (batch, head) and walks the
    query blocks that see them (no atomics).
    """
    k_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)

    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_tile(K + b * stride_kb + h * stride_kh, offs_n, offs_d, stride_kn, stride_kd, length, D)
    v = load_tile(V + b * stride_vb + h * stride_vh, offs_n, offs_dv, stride_vn, stride_vd, length, DV)
    q_base = Q + b * stride_qb + h * stride_qh
    dout_base = DOUT + b * stride_gb + h * stride_gh
    dist_base = DIST + b * stride_db
    table_row = TABLE + h * stride_th
    row_base = bh.to(tl.int64) * N
    bias_scale2 = tl.load(BIAS_SCALE).to(tl.float32) * 1.4426950408889634

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # Which query blocks to visit: the live list, or every block from the diagonal (causal) to the length.
    list_base = Q_BLOCKS + (b * num_k_blocks + k_block) * num_q_blocks
    first = 0
    if USE_LISTS:
        num_visits = tl.load(Q_COUNTS + b * num_k_blocks + k_block)
    else:
        if CAUSAL:
            first = (k_block * BLOCK_N) // BLOCK_M
        num_visits = tl.cdiv(length, BLOCK_M) - first
        num_visits = tl.where(k_block * BLOCK_N < length, num_visits, 0)

    # Main loop: recompute P^T, accumulate dV += P^T dO and dK += dS^T Q.
    for visit in range(0, num_visits):
        if USE_LISTS:
            q_block = tl.load(list_base + visit)
        else:
            q_block = first + visit
        offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        q = load_tile(q_base, offs_m, offs_d, stride_qn, stride_qd, length, D)
        dout = load_tile(dout_base, offs_m, offs_dv, stride_gn, stride_gd, length, DV)
        lse2 = tl.load(LSE + row_base + offs_m, mask=offs_m < N, other=0.0)
        delta = tl.load(DELTA + row_base + offs_m, mask=offs_m < N, other=0.0)
        qk = mma(q, tl.trans(k), DOT_PRECISION)
        distance = load_distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, length)
        bucket = bucket_from_distance(distance, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET)
        scores2 = qk * qk_scale2 + gather_bias(bucket, table_row, bias_scale2, NUM_BUCKETS)
        allowed = pair_allowed(offs_m, offs_n, length, distance, window, HAS_WINDOW, CAUSAL)
        p = tl.where(allowed, tl.exp2(scores2 - lse2[:, None]), 0.0)
        dv += mma(tl.trans(p.to(dout.dtype)), dout, DOT_PRECISION)
        dp = mma(dout, tl.trans(v), DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dk += mma(tl.trans(ds.to(q.dtype)), q, DOT_PRECISION)

    # Epilogue: dK carries the score scale; keys past the length get 0.
    dk = dk * scale
    store_tile(DK + b * stride_xb + h * stride_xh, dk, offs_n, offs_d, stride_xn, stride_xd, N, D)
    store_tile(DV_OUT + b * stride_yb + h * stride_yh, dv, offs_n, offs_dv, stride_yn, stride_yd, N, DV)


@triton.jit
def _bias_attn_bwd_dq_kernel(
    Q, K, V, DOUT, DIST, TABLE, BIAS_SCALE, LENGTHS, KV_BLOCKS, KV_COUNTS, LSE, DELTA, DQ, BUCKET_PARTIALS,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_db, stride_di, stride_dj,
    stride_th,
    stride_xb, stride_xh, stride_xn, stride_xd,
    H, N, D, DV, num_q_blocks, num_k_blocks, scale, qk_scale2, window,
    NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, ROW_CORRECTED: tl.constexpr,
    MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_LISTS: tl.constexpr, HAS_WINDOW: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Backward for one query block: ``dq`` and the per-bucket sums of dS (the table gradient, on chip).

    Args:
        DQ: like Q (strides ``stride_x*``). BUCKET_PARTIALS: fp32 ``[B, H, nQ, NUM_BUCKETS]``: this program's
            ``G[t] = sum of dS over its pairs in bucket t``, written once.
        ROW_CORRECTED: sum dS per row and bucket (``[BLOCK_M, BUCKETS_PAD]`` in registers) and remove each
            row's rounding error (see :func:`accumulate_bucket_row_sums`); used for half types with
            ``BUCKETS_PAD <= 32``. Otherwise dS is summed per bucket directly.
        Others as in the dK/dV kernel (KV lists as in the forward).
    Grid: ``(cdiv(N, BLOCK_M), B * H)``; one program owns BLOCK_M query rows of one (batch, head).
    """
    q_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)

    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    bucket_ids = tl.arange(0, BUCKETS_PAD)
    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qn, stride_qd, length, D)
    dout = load_tile(DOUT + b * stride_gb + h * stride_gh, offs_m, offs_dv, stride_gn, stride_gd, length, DV)
    row_base = bh.to(tl.int64) * N
    lse2 = tl.load(LSE + row_base + offs_m, mask=offs_m < N, other=0.0)
    delta = tl.load(DELTA + row_base + offs_m, mask=offs_m < N, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dist_base = DIST + b * stride_db
    table_row = TABLE + h * stride_th
    bias_scale2 = tl.load(BIAS_SCALE).to(tl.float32) * 1.4426950408889634

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bucket_sums = tl.zeros([BUCKETS_PAD], dtype=tl.float32)
    if ROW_CORRECTED:
        ds_rows = tl.zeros([BLOCK_M, BUCKETS_PAD], dtype=tl.float32)
        p_rows = tl.zeros([BLOCK_M, BUCKETS_PAD], dtype=tl.float32)

    list_base = KV_BLOCKS + (b * num_q_blocks + q_block) * num_k_blocks
    if USE_LISTS:
        num_visits = tl.load(KV_COUNTS + b * num_q_blocks + q_block)
    else:
        num_visits = tl.cdiv(length, BLOCK_N)
        if CAUSAL:
            num_visits = tl.minimum(num_visits, tl.cdiv((q_block + 1) * BLOCK_M, BLOCK_N))
        num_visits = tl.where(q_block * BLOCK_M < length, num_visits, 0)

    # Main loop: recompute P, dS = P (dP - delta); dQ += dS K; per-bucket sums of dS.
    for visit in range(0, num_visits):
        if USE_LISTS:
            k_block = tl.load(list_base + visit)
        else:
            k_block = visit
        offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, length, D)
        v = load_tile(v_base, offs_n, offs_dv, stride_vn, stride_vd, length, DV)
        qk = mma(q, tl.trans(k), DOT_PRECISION)
        distance = load_distance_tile(dist_base, offs_m, offs_n, stride_di, stride_dj, length)
        bucket = bucket_from_distance(distance, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE_BUCKET)
        scores2 = qk * qk_scale2 + gather_bias(bucket, table_row, bias_scale2, NUM_BUCKETS)
        allowed = pair_allowed(offs_m, offs_n, length, distance, window, HAS_WINDOW, CAUSAL)
        p = tl.where(allowed, tl.exp2(scores2 - lse2[:, None]), 0.0)
        dp = mma(dout, tl.trans(v), DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += mma(ds.to(k.dtype), k, DOT_PRECISION)
        if ROW_CORRECTED:
            ds_rows, p_rows = accumulate_bucket_row_sums(ds_rows, p_rows, bucket, ds, p, allowed, bucket_ids,
                                                         NUM_BUCKETS)
        else:
            bucket_sums = accumulate_bucket_sums(bucket_sums, bucket, ds, allowed, bucket_ids, NUM_BUCKETS)

    # Epilogue: dQ carries the score scale; one row of bucket sums per program.
    if ROW_CORRECTED:
        bucket_sums = finish_bucket_sums(ds_rows, p_rows)
    dq = dq * scale
    store_tile(DQ + b * stride_xb + h * stride_xh, dq, offs_m, offs_d, stride_xn, stride_xd, N, D)
    partial_row = BUCKET_PARTIALS + (bh.to(tl.int64) * num_q_blocks + q_block) * NUM_BUCKETS
    tl.store(partial_row + bucket_ids, bucket_sums, mask=bucket_ids < NUM_BUCKETS)


# ---------------------------------------------------------------------------------------------------------
# Configurations (block sizes, warps, stages) and the compile matrix
# ---------------------------------------------------------------------------------------------------------

# Candidate configurations per kernel ("fwd", "dkdv", "dq"), dtype class ("half" or "fp32") and head-dim
# class (BLOCK_D <= 64 or 128). The first entry is the one the launcher uses; every entry is compiled for
# sm_80 and sm_90 by python_tests/test_compile_bias.py and must build without register spills (read with
# ``ptxas -v``; the numbers are in the comments). The dK/dV and dQ kernels have separate entries: their
# register budgets differ (dQ also keeps the per-row, per-bucket sums of the table gradient), and each
# walks block lists built for its own tiling. Which candidate is fastest must be measured on a GPU
# (benchmarks/bench_bias_attention.py --tune).
CONFIGS: Dict[Tuple[str, str, int], List[dict]] = {
    ("fwd", "half", 64): [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
                          dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)],
    ("fwd", "half", 128): [dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
                           dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)],
    ("fwd", "fp32", 64): [dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)],
    # fp32 D128: 32x32 with 4 warps spills ~1 KB on sm_90 (exact fp32 dots hold whole rows of q).
    ("fwd", "fp32", 128): [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=2)],
    ("dkdv", "half", 64): [dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)],
    # half D128: 64x32 / 32x64 with 8 warps spill 48-160 B on one arch or the other; 32x32 is clean on both.
    ("dkdv", "half", 128): [dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=2)],
    # fp32 (exact fp32 dots, no tensor cores): 32x32 with 4 warps spilled 16 B to 16 KB; 16x32 spills 8 B
    # at D64 with a 32-bucket table on sm_90.
    ("dkdv", "fp32", 64): [dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)],
    ("dkdv", "fp32", 128): [dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=1)],
    # half D64: 4 warps spill 28 B on sm_90 with tables of more than 32 buckets.
    ("dq", "half", 64): [dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=2)],
    # half D128: every 32- and 64-row tile tried (4, 8, 16 warps; 1-2 stages) spills on sm_80 or sm_90
    # with the per-row bucket sums in registers; 16 query rows per program are clean on both (mma.sync).
    ("dq", "half", 128): [dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2)],
    # fp32 D64: 32x32 spills 20-24 B (8 warps at T = 12, 4 warps at T = 256), 32x16 4 B at D32.
    ("dq", "fp32", 64): [dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)],
    ("dq", "fp32", 128): [dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1)],
}

# Tests may shrink the tiles (e.g. to 16) to exercise block skipping on small N; None = CONFIGS.
_BLOCK_OVERRIDE: Optional[Tuple[int, int]] = None


def _head_block(dim: int) -> int:
    return max(32, triton.next_power_of_2(dim))


def _dtype_class(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "half"


def select_config(kind: str, dtype: torch.dtype, head_dim: int, index: int = 0) -> dict:
    """The launch configuration of the ``kind`` ("fwd", "dkdv" or "dq") kernel for this dtype and head dim."""
    cls = 64 if _head_block(head_dim) <= 64 else 128
    config = dict(CONFIGS[(kind, _dtype_class(dtype), cls)][index])
    if _BLOCK_OVERRIDE is not None:
        config["BLOCK_M"], config["BLOCK_N"] = _BLOCK_OVERRIDE
    return config


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (TF32 would miss the fp32 tolerance); half types use tensor cores;
    # bf16 under the interpreter is widened first (see _primitives.mma).
    if dtype == torch.float32:
        return "ieee"
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "upcast"
    return "tf32"


def bucket_args(buckets: BucketSpec) -> Tuple[int, int, bool]:
    """``(max_distance, log_distance or 0, unreachable_bucket)``: the BucketSpec as kernel constexprs."""
    return buckets.max_distance, buckets.log_distance or 0, buckets.unreachable_bucket


# ---------------------------------------------------------------------------------------------------------
# Launchers (torch.library Triton ops)
# ---------------------------------------------------------------------------------------------------------


def _table_rows(table: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """fp32 table as ``[rows, T]`` and its row stride (0 for a shared ``[T]`` table)."""
    table32 = table.to(torch.float32).contiguous()
    if table32.dim() == 1:
        return table32, 0
    return table32, table32.stride(0)


def _meta(distance, lengths, block_m, block_n, window, causal, transposed):
    if window < 0:
        return None
    return build_block_meta(distance, lengths, block_m, block_n, window=window, causal=causal,
                            transposed=transposed)


@torch.library.triton_op("syntaxkernels::bias_attention_fwd", mutates_args=())
def bias_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                           table: torch.Tensor, bias_scale: torch.Tensor, lengths: torch.Tensor, scale: float,
                           window: int, causal: bool, max_distance: int, log_distance: int,
                           unreachable_bucket: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher: ``(out [B, H, N, Dv] in q's dtype, lse2 fp32 [B, H, N])``.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]`` (any strides); distance: uint8 ``[B, N, N]``.
        table: ``[T]`` or ``[H, T]``; bias_scale: one-element tensor.
        lengths: int32 ``[B]``; window: ``-1`` for none; scale: score scale.
        max_distance, log_distance (0 = none), unreachable_bucket: the BucketSpec (:func:`bucket_args`).
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    out = torch.empty((B, H, N, DV), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    config = select_config("fwd", q.dtype, max(D, DV))
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    meta = _meta(distance, lengths, block_m, block_n, window, causal, transposed=False)
    table32, stride_th = _table_rows(table)
    scale_t = bias_scale.reshape(1).to(torch.float32)
    use_lists = meta is not None
    kv_blocks = meta.kv_blocks if use_lists else lengths
    kv_counts = meta.kv_counts if use_lists else lengths
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    if out.numel() == 0 or N == 0:
        out.zero_()
        lse.zero_()
        return out, lse
    launch(_bias_attn_fwd_kernel, (num_q, B * H),
           q, k, v, distance, table32, scale_t, lengths, kv_blocks, kv_counts, out, lse,
           *q.stride(), *k.stride(), *v.stride(), *out.stride(), *distance.stride(), stride_th,
           H, N, D, DV, num_q, num_k, scale * LOG2E, max(window, 0),
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_head_block(D), BLOCK_DV=_head_block(DV),
           USE_LISTS=use_lists, HAS_WINDOW=window >= 0, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
           MAX_DISTANCE=max_distance, LOG_DISTANCE=log_distance, UNREACHABLE_BUCKET=unreachable_bucket,
           NUM_BUCKETS=table.shape[-1], num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out, lse


@torch.library.triton_op("syntaxkernels::bias_attention_bwd", mutates_args=())
def bias_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, distance: torch.Tensor, table: torch.Tensor,
                            bias_scale: torch.Tensor, lengths: torch.Tensor, scale: float, window: int,
                            causal: bool, max_distance: int, log_distance: int,
                            unreachable_bucket: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                torch.Tensor]:
    """Backward launcher: ``(dq, dk, dv, G)``; ``G`` fp32 ``[T]`` or ``[H, T]`` (like the table) holds the
    per-bucket sums of dS, so ``d table = c * G`` and ``d c = sum(table * G)``.

    Args: as :func:`bias_attention_forward`, plus ``dout`` (like out, any strides), ``out`` and ``lse``.
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    T = table.shape[-1]
    dq = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, H, N, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, H, N, DV), dtype=v.dtype, device=q.device)
    dkdv_config = select_config("dkdv", q.dtype, max(D, DV))
    dq_config = select_config("dq", q.dtype, max(D, DV))
    num_q_dq = triton.cdiv(N, dq_config["BLOCK_M"])
    partials = torch.zeros((B, H, num_q_dq, T), dtype=torch.float32, device=q.device)
    if dq.numel() and N:
        table32, stride_th = _table_rows(table)
        scale_t = bias_scale.reshape(1).to(torch.float32)
        delta = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
        block_dv = _head_block(DV)
        launch(_bias_attn_bwd_preprocess_kernel, (triton.cdiv(N, 64), B * H),
               out, dout, delta, *out.stride(), *dout.stride(), H, N, DV, BLOCK_M=64, BLOCK_DV=block_dv)
        strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), stride_th)
        # One block-list build per tiling (the two kernels share it when their tiles are equal).
        metas = {}
        for config in (dkdv_config, dq_config):
            tiles = (config["BLOCK_M"], config["BLOCK_N"])
            if tiles not in metas:
                metas[tiles] = _meta(distance, lengths, *tiles, window, causal, transposed=True)
        for kernel_kind, config in (("dkdv", dkdv_config), ("dq", dq_config)):
            block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
            meta = metas[(block_m, block_n)]
            use_lists = meta is not None
            num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
            common = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_head_block(D), BLOCK_DV=block_dv,
                          USE_LISTS=use_lists, HAS_WINDOW=window >= 0, CAUSAL=causal,
                          DOT_PRECISION=_dot_precision(q.dtype), MAX_DISTANCE=max_distance,
                          LOG_DISTANCE=log_distance, UNREACHABLE_BUCKET=unreachable_bucket, NUM_BUCKETS=T,
                          num_warps=config["num_warps"], num_stages=config["num_stages"])
            sizes = (H, N, D, DV, num_q, num_k, scale, scale * LOG2E, max(window, 0))
            if kernel_kind == "dkdv":
                launch(_bias_attn_bwd_dkdv_kernel, (num_k, B * H),
                       q, k, v, dout, distance, table32, scale_t, lengths,
                       meta.q_blocks if use_lists else lengths, meta.q_counts if use_lists else lengths,
                       lse, delta, dk, dv, *strides, *dk.stride(), *dv.stride(), *sizes, **common)
            else:
                launch(_bias_attn_bwd_dq_kernel, (num_q, B * H),
                       q, k, v, dout, distance, table32, scale_t, lengths,
                       meta.kv_blocks if use_lists else lengths, meta.kv_counts if use_lists else lengths,
                       lse, delta, dq, partials, *strides, *dq.stride(), *sizes,
                       BUCKETS_PAD=max(16, triton.next_power_of_2(T)),
                       ROW_CORRECTED=q.dtype != torch.float32 and T <= 32, **common)
    else:
        dq.zero_()
        dk.zero_()
        dv.zero_()
    # Second, small reduction of the per-program bucket sums (a fixed-order sum: deterministic).
    bucket_grad = partials.sum(dim=(0, 1, 2)) if table.dim() == 1 else partials.sum(dim=(0, 2))
    return dq, dk, dv, bucket_grad


# ---------------------------------------------------------------------------------------------------------
# Autograd and the public function
# ---------------------------------------------------------------------------------------------------------


class _SyntaxBiasAttention(torch.autograd.Function):
    """Autograd over the two Triton ops; gradients for q, k, v, the table and a tensor ``bias_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, distance, table, bias_scale, lengths, scale, window, causal, bucket_spec):
        out, lse = torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, table, bias_scale, lengths,
                                                              scale, window, causal, *bucket_spec)
        ctx.save_for_backward(q, k, v, out, lse, distance, table, bias_scale, lengths)
        ctx.scale, ctx.window, ctx.causal, ctx.bucket_spec = scale, window, causal, bucket_spec
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, table, bias_scale, lengths = ctx.saved_tensors
        dq, dk, dv, bucket_grad = torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, table, bias_scale, lengths, ctx.scale, ctx.window, ctx.causal,
            *ctx.bucket_spec)
        c = bias_scale.to(torch.float32).reshape(())
        dtable = (c * bucket_grad).to(table.dtype) if ctx.needs_input_grad[4] else None
        dscale = None
        if ctx.needs_input_grad[5]:
            dscale = (table.to(torch.float32) * bucket_grad).sum().reshape(bias_scale.shape).to(bias_scale.dtype)
        return dq, dk, dv, None, dtable, dscale, None, None, None, None, None


def _check_head_dim(q: torch.Tensor, v: torch.Tensor) -> None:
    for name, dim in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if dim > MAX_HEAD_DIM or dim < 1:
            raise ValueError(f"{name} head dim {dim} is not supported by the Triton kernel (1..{MAX_HEAD_DIM}; "
                             "32, 64 and 128 run without padding); use backend='reference' for larger heads")


def syntax_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                          table: torch.Tensor, *, buckets: BucketSpec, scale: Optional[float] = None,
                          bias_scale=None, lengths=None, window: Optional[int] = None, causal: bool = False,
                          deterministic: bool = False, backend: str = "auto") -> torch.Tensor:
    """Attention with a learnable tree-distance bias, fused (Triton) or by the reference.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)]`` over the allowed pairs, ``o_i = softmax(s_i) v``.

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device.
        distance: ``uint8 [B, N, N]`` (255 = unreachable).
        table: ``[T]`` shared or ``[H, T]`` per head, ``T = buckets.num_buckets``; gets a gradient.
        buckets: :class:`syntaxkernels.BucketSpec`.
        scale: default ``1 / sqrt(D)``.
        bias_scale: the strength c: None (1), a float, or a one-element tensor (gets a gradient).
        lengths: ``int [B]`` or a boolean key-padding mask ``[B, N]`` (True = padding).
        window: allow only ``d_ij <= window`` (0..254); tiles without such a pair are skipped.
        causal: allow only ``j <= i``.
        deterministic: bit-identical gradients run to run (the Triton path always is: no atomics).
        backend: "auto" (Triton on CUDA tensors), "triton" or "reference".
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; query rows past the length and rows with no allowed key are 0.

    Equivalent PyTorch::

        bias = table[..., buckets.lut()[distance.long()]] * c           # [B, 1 or H, N, N]
        s = (q @ k.transpose(-1, -2)) * scale + bias
        s = s.masked_fill(~allowed_pairs(distance, lengths, window, causal)[:, None], -inf)
        out = torch.nan_to_num(s.softmax(-1)) @ v
    """
    if not V.compiling():
        V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window)
        if not isinstance(deterministic, bool):
            raise ValueError(f"deterministic must be a bool, got {deterministic!r}")
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be a bool, got {causal!r}")
    chosen = resolve_backend(backend, q.device)
    if chosen == "triton" and q.dtype == torch.float64:
        if backend == "triton":
            raise ValueError("q has dtype float64, which the Triton kernel does not support "
                             "(float16, bfloat16, float32); use backend='reference' or 'auto'")
        chosen = "reference"
    if chosen == "reference":
        return reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=lengths, window=window,
                                               causal=causal)
    if not V.compiling():
        _check_head_dim(q, v)
    B, H, N, D = q.shape
    lengths = V.normalize_lengths(lengths, q)
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.int32, device=q.device)
    else:
        lengths = lengths.to(torch.int32)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if bias_scale is None or not isinstance(bias_scale, torch.Tensor):
        value = 1.0 if bias_scale is None else float(bias_scale)
        bias_scale = torch.full((1,), value, dtype=torch.float32, device=q.device)
    return _SyntaxBiasAttention.apply(q, k, v, distance, table, bias_scale, lengths, float(scale),
                                      -1 if window is None else int(window), bool(causal), bucket_args(buckets))


# ---------------------------------------------------------------------------------------------------------
# Compile matrix (python_tests/test_compile_bias.py)
# ---------------------------------------------------------------------------------------------------------

# Strides a launch on contiguous tensors with N and D multiples of 16 sees as multiples of 16.
_DIVISIBLE_STRIDES = tuple(f"stride_{t}{a}" for t in "qkvogxy" for a in "bhn") + ("stride_db", "stride_di")

_TRITON_DTYPE = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}
_TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def compile_specs(dtypes=("fp16", "bf16", "fp32"), head_dims=(32, 64, 128), all_configs: bool = True,
                  plain_variants: bool = True, table_sizes=(12, 32, 256)):
    """:class:`syntaxkernels.ops._compile.KernelSpec` for every kernel of this op.

    The attention kernels are built in their heaviest variant (live lists, window and causal masks on) with
    every candidate config of :data:`CONFIGS`; with ``plain_variants`` also the dense variant (no lists, no
    window, not causal) with the launcher's config, all with the default table size (the first of
    ``table_sizes``, T = 12). Each further table size is built in the heaviest variant with the launcher's
    config: T <= 16 selects the bias from scalar loads, larger tables gather it from memory; T <= 32 keeps
    the per-row bucket sums of half types (``[BLOCK_M, 32]`` at most), larger tables sum per bucket only.
    The preprocess kernel once per dtype; the block-metadata kernel once per tiling in :data:`CONFIGS`.
    """
    from ._compile import kernel_spec
    from .block_meta import _block_distance_range_kernel

    specs = []
    for dname in dtypes:
        dt = _TRITON_DTYPE[dname]
        torch_dtype = _TORCH_DTYPE[dname]
        half = dname != "fp32"
        unit = dict(stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1, stride_gd=1, stride_dj=1,
                    stride_xd=1, stride_yd=1)
        for head_dim in head_dims:
            block_d = _head_block(head_dim)
            for kind in ("fwd", "dkdv", "dq"):
                cls = 64 if block_d <= 64 else 128
                configs = CONFIGS[(kind, _dtype_class(torch_dtype), cls)]
                configs = configs if all_configs else configs[:1]
                variants = [(True, True, True, configs, table_sizes[0])]
                if plain_variants:
                    variants.append((False, False, False, configs[:1], table_sizes[0]))
                variants += [(True, True, True, configs[:1], size) for size in table_sizes[1:]]
                for use_lists, has_window, causal, variant_configs, num_buckets in variants:
                    for index, config in enumerate(variant_configs):
                        flags = dict(MAX_DISTANCE=num_buckets - 2, LOG_DISTANCE=0, UNREACHABLE_BUCKET=True,
                                     NUM_BUCKETS=num_buckets, USE_LISTS=use_lists, HAS_WINDOW=has_window, CAUSAL=causal,
                                     DOT_PRECISION=_dot_precision(torch_dtype), BLOCK_D=block_d,
                                     BLOCK_DV=block_d, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"])
                        tag = (f"{dname} D{head_dim} T{num_buckets} "
                               f"{'lists+window+causal' if use_lists else 'dense'} "
                               f"cfg{index} {config['BLOCK_M']}x{config['BLOCK_N']} w{config['num_warps']} "
                               f"s{config['num_stages']}")
                        options = dict(num_warps=config["num_warps"], num_stages=config["num_stages"],
                                       needs_mma=half, divisible_args=_DIVISIBLE_STRIDES)
                        pointers = dict(Q=dt, K=dt, V=dt, DIST="u8", TABLE="fp32", BIAS_SCALE="fp32",
                                        LENGTHS="i32", LSE="fp32")
                        if kind == "fwd":
                            pointers.update(KV_BLOCKS="i32", KV_COUNTS="i32", OUT=dt)
                            specs.append(kernel_spec(_bias_attn_fwd_kernel, f"fwd {tag}", pointers,
                                                     dict(unit, **flags), float_args=("qk_scale2",), **options))
                            continue
                        pointers.update(DOUT=dt, DELTA="fp32")
                        if kind == "dkdv":
                            dkdv = dict(pointers, Q_BLOCKS="i32", Q_COUNTS="i32", DK=dt, DV_OUT=dt)
                            specs.append(kernel_spec(_bias_attn_bwd_dkdv_kernel, f"bwd_dkdv {tag}", dkdv,
                                                     dict(unit, **flags), float_args=("scale", "qk_scale2"),
                                                     **options))
                            continue
                        dq = dict(pointers, KV_BLOCKS="i32", KV_COUNTS="i32", DQ=dt, BUCKET_PARTIALS="fp32")
                        specs.append(kernel_spec(_bias_attn_bwd_dq_kernel, f"bwd_dq {tag}", dq,
                                                 dict(unit, BUCKETS_PAD=max(16, triton.next_power_of_2(num_buckets)),
                                                      ROW_CORRECTED=half and num_buckets <= 32, **flags),
                                                 float_args=("scale", "qk_scale2"), **options))
        specs.append(kernel_spec(_bias_attn_bwd_preprocess_kernel, f"bwd_preprocess {dname} D128",
                                 dict(OUT=dt, DOUT=dt, DELTA="fp32"),
                                 dict(stride_od=1, stride_gd=1, BLOCK_M=64, BLOCK_DV=128), needs_mma=False))
    # The block-metadata kernel runs with the tiling of every config (its lists feed that kernel).
    tilings = sorted({(c["BLOCK_M"], c["BLOCK_N"]) for configs in CONFIGS.values() for c in configs})
    for block_m, block_n in tilings:
        specs.append(kernel_spec(_block_distance_range_kernel, f"block_distance_range {block_m}x{block_n}",
                                 dict(DIST="u8", LENGTHS="i32", MIN_OUT="u8", MAX_OUT="u8"),
                                 dict(stride_dj=1, BLOCK_M=block_m, BLOCK_N=block_n), needs_mma=False))
    return specs
