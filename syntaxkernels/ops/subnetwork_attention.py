"""Block-sparse Syntax-BERT sub-network attention: M masked attentions sharing q, k, v in one pass.

Limits: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``); float16, bfloat16 and float32 inputs
(float32 dots run in IEEE fp32, never TF32), fp32 accumulation; head dims up to 128 (masked to the next
power of two >= 32; 32, 64, 128 are compiled and checked for sm_80/sm_90); v's head dim equal to q's; any N;
float64 inputs use the reference.

How it works (DESIGN.md §2, §5):

- **Pair codes.** Every (query i, key j) pair gets one small integer from the distance, depth and segment
  tiles: 0 = not a valid pair, 1 = valid pair in different trees, 2 = the same token, and
  ``4 * d + r`` for two tokens of one tree at distance d >= 1, with r = 0 when i is an ancestor of j, 1 when
  i is a descendant of j, 2 otherwise. The relation masks partition those codes, so mask m is the
  comparison ``code == mask_code[m]`` (``parent_d`` = 4d, ``child_d`` = 4d + 1, ``sibling_d`` = 4d + 2,
  ``pairwise`` = 1) or ``code > 0`` (``full``, code -1). No ``[M, N, N]`` mask and no score matrix exist.
- **Block metadata.** One kernel reads each ``[BLOCK_M, BLOCK_N]`` tile of the uint8 distances once and
  writes a bit set per block pair: bit 0 = some valid pair, bit 1 = some pair across trees, bit 2 = some
  pair of one tree at distance ``1..max_syntax_distance``. Each mask needs one bit (full: 0, pairwise: 1,
  parent/child/sibling: 2); the kernels walk compacted lists of the key blocks whose bits a program needs,
  so the syntax masks cost O(live blocks near each sentence's diagonal), not O(N^2).
- **Mask groups (forward).** Program (query block, batch*head, group) owns up to ``GROUP`` masks: it
  computes ``QK^T`` once per visited tile and runs one online softmax per mask of its group, each with its
  own ``[BLOCK_M, D]`` fp32 accumulator. ``GROUP`` is chosen per dtype and head dim so that the accumulators
  fit in registers without spilling (checked with ``ptxas -v``; ``KERNEL_CONFIGS``): 2 for 16-bit D = 32, 1
  otherwise (a second accumulator spills there). The syntax masks form
  groups that walk the syntax-live list; ``pairwise`` and ``full`` form a dense group over valid blocks.
- **Backward.** Only sums over masks are needed (``dv = sum_m P_m^T dO_m``, ``dq, dk`` from
  ``dS = sum_m dS_m``), so the backward programs loop over all M masks with two fp32 accumulators and compute
  ``QK^T`` once per tile: one program per key block (dk, dv) and one per query block (dq), no atomics.
  Each mask keeps its own row logsumexp ``lse [B, M, H, N]`` (+inf for an empty row, which makes its
  probabilities, outputs and gradients exactly zero).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .. import _validation as V
from .. import reference
from ..specs import MaskSpec
from ._dispatch import interpreting, resolve_backend

import triton
import triton.language as tl

from ._primitives import LOG2E, launch, online_softmax_step
from .block_meta import compact_rows

__all__ = [
    "syntax_subnetwork_attention",
    "subnetwork_block_stats",
    "subnetwork_block_bits",
    "subnetwork_attention_forward",
    "subnetwork_attention_backward",
    "mask_codes",
    "forward_config",
    "KERNEL_CONFIGS",
]

# Bits of the per-block-pair metadata and the bit each mask kind needs.
BIT_VALID = 1
BIT_CROSS = 2
BIT_SYNTAX = 4
_KIND_BIT = {"parent": BIT_SYNTAX, "child": BIT_SYNTAX, "sibling": BIT_SYNTAX, "pairwise": BIT_CROSS,
             "full": BIT_VALID}
_KIND_REL = {"parent": 0, "child": 1, "sibling": 2}
_LOG2E = tl.constexpr(LOG2E)
FULL_CODE = -1
PAIRWISE_CODE = 1


# --------------------------------------------------------------------------------------------------------
# Mask encoding and configs (host side)
# --------------------------------------------------------------------------------------------------------

def mask_codes(masks: MaskSpec) -> Tuple[List[int], List[int], int]:
    """``(codes, need_bits, max_syntax_distance)`` of a MaskSpec, in output order.

    ``codes[m]`` is the pair code mask m accepts (-1 = every valid pair), ``need_bits[m]`` the block bit a
    tile must have for mask m to have any pair in it, ``max_syntax_distance`` the largest distance of a
    parent/child/sibling mask (0 when there is none).
    """
    codes, needs, max_d = [], [], 0
    for kind, d in masks.kinds():
        if kind in _KIND_REL:
            codes.append(4 * d + _KIND_REL[kind])
            max_d = max(max_d, d)
        elif kind == "pairwise":
            codes.append(PAIRWISE_CODE)
        else:
            codes.append(FULL_CODE)
        needs.append(_KIND_BIT[kind])
    return codes, needs, max_d


# Per (dtype family, padded head dim): (BLOCK_M, BLOCK_N, GROUP, forward warps, forward stages, dk/dv warps,
# dq warps, backward stages). The forward and both backward kernels share the tiles, hence one block metadata.
# Every entry compiles for sm_80 and sm_90 without register spills (python_tests/test_compile_subnetwork.py);
# GROUP (masks whose [BLOCK_M, D] accumulators one forward program holds) is the largest that does.
KERNEL_CONFIGS: Dict[Tuple[str, int], Tuple[int, int, int, int, int, int, int, int]] = {
    ("16bit", 32): (64, 32, 2, 4, 2, 4, 4, 2),
    ("16bit", 64): (32, 16, 1, 8, 2, 8, 8, 2),
    ("16bit", 128): (32, 16, 1, 8, 2, 8, 8, 2),
    ("fp32", 32): (32, 32, 1, 8, 2, 4, 8, 2),
    ("fp32", 64): (32, 32, 1, 8, 2, 4, 4, 2),
    ("fp32", 128): (32, 32, 1, 8, 1, 8, 8, 1),
}

# Tests set this to a dict of config entries (e.g. 16x16 tiles to exercise block skipping at small N, or a
# GROUP size); None = KERNEL_CONFIGS.
_CONFIG_OVERRIDE: Optional[Dict[str, int]] = None


def forward_config(dtype: torch.dtype, head_dim: int) -> Dict[str, int]:
    """The launch config (shared by the forward and backward kernels) for ``dtype`` and a power-of-two
    ``head_dim`` (the padded head dim ``BLOCK_D``)."""
    family = "fp32" if dtype == torch.float32 else "16bit"
    block_m, block_n, group, warps, stages, dkdv_warps, dq_warps, bwd_stages = KERNEL_CONFIGS[(family, head_dim)]
    config = dict(BLOCK_M=block_m, BLOCK_N=block_n, GROUP=group, num_warps=warps, num_stages=stages,
                  dkdv_num_warps=dkdv_warps, dq_num_warps=dq_warps, bwd_num_stages=bwd_stages)
    if _CONFIG_OVERRIDE:
        config.update(_CONFIG_OVERRIDE)
    return config


def _mask_groups(codes: Sequence[int], needs: Sequence[int], group: int) -> List[List[int]]:
    """Split the masks into forward groups of at most ``group``: syntax masks together (balanced), then the
    dense ones (pairwise, full), so a group's list holds only the tiles its masks need."""
    groups = []
    for bit_set in ([m for m in range(len(codes)) if needs[m] == BIT_SYNTAX],
                    [m for m in range(len(codes)) if needs[m] != BIT_SYNTAX]):
        if not bit_set:
            continue
        n_groups = -(-len(bit_set) // group)
        size = -(-len(bit_set) // n_groups)
        groups += [bit_set[i:i + size] for i in range(0, len(bit_set), size)]
    return groups


# --------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------

@triton.jit
def _pair_code(dist, depth_q, depth_k, seg_q, seg_k):
    """Pair code of (query, key) tiles (see the module docstring); the arguments broadcast together.

    ``dist`` int32 tile, ``depth_*`` / ``seg_*`` int32 row or column vectors (segment -1 = padding).
    """
    pair_valid = (seg_q >= 0) & (seg_k >= 0)
    same_tree = pair_valid & (seg_q == seg_k)
    depth_gap = depth_k - depth_q
    relation = tl.where(depth_gap == dist, 0, tl.where(depth_gap == -dist, 1, 2))
    tree_code = tl.where(dist == 0, 2, 4 * dist + relation)
    return tl.where(same_tree, tree_code, tl.where(pair_valid, 1, 0))

@triton.jit
def _mask_select(code, mask_code):
    """bool tile: pairs of mask ``mask_code`` (-1 = every valid pair)."""
    return (code == mask_code) | ((mask_code < 0) & (code > 0))

@triton.jit
def _dot(a, b, acc, DOT_PRECISION: tl.constexpr, UPCAST_BF16: tl.constexpr):
    """``a @ b (+ acc)`` with fp32 accumulation. ``UPCAST_BF16`` (set only under ``TRITON_INTERPRET=1`` for
    bfloat16 inputs) multiplies in fp32: the Triton 3.6 interpreter's ``tl.dot`` multiplies the raw bits of
    bfloat16 operands. The product of two bfloat16 numbers is exact in fp32, so the result is the same."""
    if UPCAST_BF16:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _masked_softmax_step(accumulator, running_max, running_sum, scores2, allowed, v, DOT_PRECISION: tl.constexpr,
                         UPCAST_BF16: tl.constexpr):
    """One key tile of one mask's online softmax: ``scores2`` (log2 domain) restricted to ``allowed``."""
    new_max, alpha, p, new_sum = online_softmax_step(running_max, running_sum,
                                                     tl.where(allowed, scores2, float("-inf")))
    accumulator = _dot(p.to(v.dtype), v, accumulator * alpha[:, None], DOT_PRECISION, UPCAST_BF16)
    return accumulator, new_max, new_sum


@triton.jit
def _finish_mask(accumulator, running_max, running_sum, out_ptrs, lse_ptrs, nonempty_ptrs, row_ok,
                 write_nonempty, D_MASK):
    """Normalise one mask's accumulator and store its output, logsumexp (+inf when empty) and flags."""
    nonempty = running_sum > 0.0
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, running_sum, 1.0), 0.0)
    out = accumulator * inv[:, None]
    tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty), mask=row_ok[:, None] & D_MASK[None, :])
    lse = tl.where(nonempty, running_max + tl.log2(tl.where(nonempty, running_sum, 1.0)), float("inf"))
    tl.store(lse_ptrs, lse, mask=row_ok)
    tl.store(nonempty_ptrs, nonempty.to(tl.int8), mask=row_ok & write_nonempty)

@triton.jit
def _subnetwork_block_meta_kernel(
    dist_ptr, seg_ptr, bits_ptr,
    N, num_q_blocks, num_k_blocks,
    stride_db, stride_dq, stride_dk, stride_sb, stride_sn,
    MAX_SYNTAX_DISTANCE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Block bits of one ``[BLOCK_M, BLOCK_N]`` tile of the distance matrix.

    Args:
        dist_ptr: uint8 ``[B, N, N]``; seg_ptr: int32 ``[B, N]`` (-1 = padding).
        bits_ptr: int8 ``[B, QB, KB]`` output: bit 0 any valid pair, bit 1 any pair across trees, bit 2 any
            pair of one tree at distance 1..MAX_SYNTAX_DISTANCE.
    Grid: ``(QB, KB, B)``; a program owns one block pair.
    """
    qb = tl.program_id(0)
    kb = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    seg_b = seg_ptr + b * stride_sb
    dist_b = dist_ptr + b * stride_db
    offs_q = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    seg_q = tl.load(seg_b + offs_q * stride_sn, mask=offs_q < N, other=-1)
    seg_k = tl.load(seg_b + offs_k * stride_sn, mask=offs_k < N, other=-1)
    dist = tl.load(dist_b + (offs_q[:, None] * stride_dq + offs_k[None, :] * stride_dk),
                   mask=(offs_q[:, None] < N) & (offs_k[None, :] < N), other=255).to(tl.int32)
    pair_valid = (seg_q[:, None] >= 0) & (seg_k[None, :] >= 0)
    same_tree = pair_valid & (seg_q[:, None] == seg_k[None, :])
    syntax = same_tree & (dist >= 1) & (dist <= MAX_SYNTAX_DISTANCE)
    any_valid = tl.max(tl.max(pair_valid.to(tl.int32), 1), 0)
    any_cross = tl.max(tl.max((pair_valid & ~same_tree).to(tl.int32), 1), 0)
    any_syntax = tl.max(tl.max(syntax.to(tl.int32), 1), 0)
    bits = any_valid + 2 * any_cross + 4 * any_syntax
    tl.store(bits_ptr + (b * num_q_blocks + qb) * num_k_blocks + kb, bits.to(tl.int8))

@triton.jit
def _subnetwork_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, nonempty_ptr,
    dist_ptr, depth_ptr, seg_ptr,
    lists_ptr, counts_ptr, group_table_ptr,
    sm_scale, H, N, num_q_blocks, num_k_blocks,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_om, stride_oh, stride_on, stride_od,
    stride_lb, stride_lm, stride_lh, stride_ln,
    stride_eb, stride_em, stride_en,
    stride_db, stride_dq, stride_dk, stride_tb, stride_tn, stride_sb, stride_sn,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_BF16: tl.constexpr,
):
    """Forward of up to GROUP masks for one query block of one (batch, head).

    Args:
        q, k, v: ``[B, H, N, D]``; out: ``[B, M, H, N, D]``; lse: fp32 ``[B, M, H, N]`` (base-2 logsumexp of
            the scaled scores, +inf for an empty row); nonempty: int8 ``[B, M, N]`` (written by head 0).
        dist: uint8 ``[B, N, N]``; depth, seg: int32 ``[B, N]``.
        lists: int32 ``[C, B, QB, KB]`` compacted live key blocks per list class; counts: int32 ``[C, B, QB]``.
        group_table: int32 ``[G, 1 + 2 * GROUP]``: list class, then (output mask index or -1, pair code) per
            slot.
    Grid: ``(QB, B * H, number of groups)``.
    """
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    grp = tl.program_id(2)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # Scalar base pointers of this (batch, head): tile offsets below stay int32.
    q_bh = q_ptr + b * stride_qb + h * stride_qh
    k_bh = k_ptr + b * stride_kb + h * stride_kh
    v_bh = v_ptr + b * stride_vb + h * stride_vh
    dist_b = dist_ptr + b * stride_db
    depth_b = depth_ptr + b * stride_tb
    seg_b = seg_ptr + b * stride_sb
    B = tl.num_programs(1) // H

    table = group_table_ptr + grp * (1 + 2 * GROUP)
    list_class = tl.load(table)
    mask0 = tl.load(table + 1)
    code0 = tl.load(table + 2)
    mask1 = -1
    code1 = 0
    mask2 = -1
    code2 = 0
    mask3 = -1
    code3 = 0
    if GROUP > 1:
        mask1 = tl.load(table + 3)
        code1 = tl.load(table + 4)
    if GROUP > 2:
        mask2 = tl.load(table + 5)
        code2 = tl.load(table + 6)
    if GROUP > 3:
        mask3 = tl.load(table + 7)
        code3 = tl.load(table + 8)

    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = offs_m < N
    q = tl.load(q_bh + (offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd),
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    depth_q = tl.load(depth_b + offs_m * stride_tn, mask=row_ok, other=0)
    seg_q = tl.load(seg_b + offs_m * stride_sn, mask=row_ok, other=-1)
    qk_scale = sm_scale * _LOG2E

    acc0 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    max0 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    sum0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    max1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    sum1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    max2 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    sum2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    max3 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    sum3 = tl.zeros([BLOCK_M], dtype=tl.float32)

    row_of_lists = (list_class * B + b) * num_q_blocks + qb
    count = tl.load(counts_ptr + row_of_lists)
    block_list = lists_ptr + row_of_lists * num_k_blocks
    # Walk the live key blocks of this query block: one QK^T per tile, one softmax step per mask.
    for idx in range(0, count):
        kb = tl.load(block_list + idx)
        offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        k = tl.load(k_bh + (offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd),
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_bh + (offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd),
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        dist = tl.load(dist_b + (offs_m[:, None] * stride_dq + offs_n[None, :] * stride_dk),
                       mask=row_ok[:, None] & col_ok[None, :], other=255).to(tl.int32)
        depth_k = tl.load(depth_b + offs_n * stride_tn, mask=col_ok, other=0)
        seg_k = tl.load(seg_b + offs_n * stride_sn, mask=col_ok, other=-1)
        code = _pair_code(dist, depth_q[:, None], depth_k[None, :], seg_q[:, None], seg_k[None, :])
        scores = _dot(q, k, None, DOT_PRECISION, UPCAST_BF16) * qk_scale
        acc0, max0, sum0 = _masked_softmax_step(acc0, max0, sum0, scores, _mask_select(code, code0), v,
                                                DOT_PRECISION, UPCAST_BF16)
        if GROUP > 1:
            acc1, max1, sum1 = _masked_softmax_step(acc1, max1, sum1, scores, _mask_select(code, code1), v,
                                                    DOT_PRECISION, UPCAST_BF16)
        if GROUP > 2:
            acc2, max2, sum2 = _masked_softmax_step(acc2, max2, sum2, scores, _mask_select(code, code2), v,
                                                    DOT_PRECISION, UPCAST_BF16)
        if GROUP > 3:
            acc3, max3, sum3 = _masked_softmax_step(acc3, max3, sum3, scores, _mask_select(code, code3), v,
                                                    DOT_PRECISION, UPCAST_BF16)

    # Normalise and store each mask of the group (slots past the group's size have mask index -1).
    row_offs = offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    out_base = out_ptr + b * stride_ob + h * stride_oh
    lse_base = lse_ptr + b * stride_lb + h * stride_lh + (offs_m * stride_ln)
    flag_base = nonempty_ptr + b * stride_eb + (offs_m * stride_en)
    first_head = h == 0
    _finish_mask(acc0, max0, sum0, out_base + mask0 * stride_om + row_offs, lse_base + mask0 * stride_lm,
                 flag_base + mask0 * stride_em, row_ok & (mask0 >= 0), first_head, d_ok)
    if GROUP > 1:
        _finish_mask(acc1, max1, sum1, out_base + mask1 * stride_om + row_offs, lse_base + mask1 * stride_lm,
                     flag_base + mask1 * stride_em, row_ok & (mask1 >= 0), first_head, d_ok)
    if GROUP > 2:
        _finish_mask(acc2, max2, sum2, out_base + mask2 * stride_om + row_offs, lse_base + mask2 * stride_lm,
                     flag_base + mask2 * stride_em, row_ok & (mask2 >= 0), first_head, d_ok)
    if GROUP > 3:
        _finish_mask(acc3, max3, sum3, out_base + mask3 * stride_om + row_offs, lse_base + mask3 * stride_lm,
                     flag_base + mask3 * stride_em, row_ok & (mask3 >= 0), first_head, d_ok)

@triton.jit
def _subnetwork_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    dist_ptr, depth_ptr, seg_ptr,
    tlists_ptr, tcounts_ptr, bits_ptr, mask_code_ptr, mask_need_ptr,
    sm_scale, H, N, M, num_q_blocks, num_k_blocks,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_om, stride_oh, stride_on, stride_od,
    stride_lb, stride_lm, stride_lh, stride_ln,
    stride_db, stride_dq, stride_dk, stride_tb, stride_tn, stride_sb, stride_sn,
    stride_gb, stride_gh, stride_gn, stride_gd,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_BF16: tl.constexpr,
):
    """dk and dv of one key block of one (batch, head), summed over the M masks.

    Args:
        q, k, v: ``[B, H, N, D]``; dk, dv: ``[B, H, N, D]`` written in the input dtype with the gradient
            strides ``stride_g*``; do: ``[B, M, H, N, D]``.
        lse, delta: fp32 ``[B, M, H, N]`` (same strides); delta = rowsum(dO * O) per mask.
        tlists: int32 ``[B, KB, QB]`` live query blocks per key block; tcounts: int32 ``[B, KB]``.
        bits: int8 ``[B, QB, KB]`` block bits; mask_code, mask_need: int32 ``[M]``.
    Grid: ``(KB, B * H)``. Tiles are held transposed (keys along rows).
    """
    kb = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # Scalar base pointers of this (batch, head): tile offsets below stay int32.
    q_bh = q_ptr + b * stride_qb + h * stride_qh
    k_bh = k_ptr + b * stride_kb + h * stride_kh
    v_bh = v_ptr + b * stride_vb + h * stride_vh
    dist_b = dist_ptr + b * stride_db
    depth_b = depth_ptr + b * stride_tb
    seg_b = seg_ptr + b * stride_sb
    do_bh = do_ptr + b * stride_ob + h * stride_oh
    lse_bh = lse_ptr + b * stride_lb + h * stride_lh
    delta_bh = delta_ptr + b * stride_lb + h * stride_lh

    offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    col_ok = offs_n < N
    k = tl.load(k_bh + (offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd),
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(v_bh + (offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd),
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    depth_k = tl.load(depth_b + offs_n * stride_tn, mask=col_ok, other=0)
    seg_k = tl.load(seg_b + offs_n * stride_sn, mask=col_ok, other=-1)
    qk_scale = sm_scale * _LOG2E

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    count = tl.load(tcounts_ptr + b * num_k_blocks + kb)
    block_list = tlists_ptr + (b * num_k_blocks + kb) * num_q_blocks
    for idx in range(0, count):
        qb = tl.load(block_list + idx)
        bits = tl.load(bits_ptr + (b * num_q_blocks + qb) * num_k_blocks + kb).to(tl.int32)
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N
        q = tl.load(q_bh + (offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd),
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        depth_q = tl.load(depth_b + offs_m * stride_tn, mask=row_ok, other=0)
        seg_q = tl.load(seg_b + offs_m * stride_sn, mask=row_ok, other=-1)
        # The distance matrix is symmetric: read the tile with keys along rows.
        dist = tl.load(dist_b + (offs_n[:, None] * stride_dq + offs_m[None, :] * stride_dk),
                       mask=col_ok[:, None] & row_ok[None, :], other=255).to(tl.int32)
        code = _pair_code(dist, depth_q[None, :], depth_k[:, None], seg_q[None, :], seg_k[:, None])
        scores_t = _dot(k, tl.trans(q), None, DOT_PRECISION, UPCAST_BF16) * qk_scale
        ds_t = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        # Every mask with a pair in this tile: dv += P^T dO, and accumulate dS^T over the masks.
        for m in range(0, M):
            need = tl.load(mask_need_ptr + m)
            if (bits & need) != 0:
                mask_code = tl.load(mask_code_ptr + m)
                row_stats = m * stride_lm + offs_m * stride_ln
                lse = tl.load(lse_bh + row_stats, mask=row_ok, other=float("inf"))
                delta = tl.load(delta_bh + row_stats, mask=row_ok, other=0.0)
                do = tl.load(do_bh + m * stride_om + (offs_m[:, None] * stride_on + offs_d[None, :] * stride_od),
                             mask=row_ok[:, None] & d_ok[None, :], other=0.0)
                p_t = tl.where(_mask_select(code, mask_code), tl.exp2(scores_t - lse[None, :]), 0.0)
                dv = _dot(p_t.to(do.dtype), do, dv, DOT_PRECISION, UPCAST_BF16)
                dp_t = _dot(v, tl.trans(do), None, DOT_PRECISION, UPCAST_BF16)
                ds_t += p_t * (dp_t - delta[None, :])
        dk = _dot(ds_t.to(q.dtype), q, dk, DOT_PRECISION, UPCAST_BF16)

    dk = dk * sm_scale
    out_offs = offs_n[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(dk_ptr + b * stride_gb + h * stride_gh + out_offs, dk.to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None] & d_ok[None, :])
    tl.store(dv_ptr + b * stride_gb + h * stride_gh + out_offs, dv.to(dv_ptr.dtype.element_ty),
             mask=col_ok[:, None] & d_ok[None, :])


@triton.jit
def _subnetwork_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    dist_ptr, depth_ptr, seg_ptr,
    lists_ptr, counts_ptr, bits_ptr, mask_code_ptr, mask_need_ptr,
    sm_scale, H, N, M, num_q_blocks, num_k_blocks,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_om, stride_oh, stride_on, stride_od,
    stride_lb, stride_lm, stride_lh, stride_ln,
    stride_db, stride_dq, stride_dk, stride_tb, stride_tn, stride_sb, stride_sn,
    stride_gb, stride_gh, stride_gn, stride_gd,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_BF16: tl.constexpr,
):
    """dq of one query block of one (batch, head), summed over the M masks.

    Args: as :func:`_subnetwork_bwd_dkdv_kernel`; dq ``[B, H, N, D]`` (gradient strides); lists int32
        ``[B, QB, KB]`` live key blocks per query block, counts int32 ``[B, QB]``.
    Grid: ``(QB, B * H)``.
    """
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # Scalar base pointers of this (batch, head): tile offsets below stay int32.
    q_bh = q_ptr + b * stride_qb + h * stride_qh
    k_bh = k_ptr + b * stride_kb + h * stride_kh
    v_bh = v_ptr + b * stride_vb + h * stride_vh
    dist_b = dist_ptr + b * stride_db
    depth_b = depth_ptr + b * stride_tb
    seg_b = seg_ptr + b * stride_sb
    do_bh = do_ptr + b * stride_ob + h * stride_oh
    lse_bh = lse_ptr + b * stride_lb + h * stride_lh
    delta_bh = delta_ptr + b * stride_lb + h * stride_lh

    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = offs_m < N
    q = tl.load(q_bh + (offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd),
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    depth_q = tl.load(depth_b + offs_m * stride_tn, mask=row_ok, other=0)
    seg_q = tl.load(seg_b + offs_m * stride_sn, mask=row_ok, other=-1)
    qk_scale = sm_scale * _LOG2E

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    count = tl.load(counts_ptr + b * num_q_blocks + qb)
    block_list = lists_ptr + (b * num_q_blocks + qb) * num_k_blocks
    for idx in range(0, count):
        kb = tl.load(block_list + idx)
        bits = tl.load(bits_ptr + (b * num_q_blocks + qb) * num_k_blocks + kb).to(tl.int32)
        offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        k = tl.load(k_bh + (offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd),
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_bh + (offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd),
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        dist = tl.load(dist_b + (offs_m[:, None] * stride_dq + offs_n[None, :] * stride_dk),
                       mask=row_ok[:, None] & col_ok[None, :], other=255).to(tl.int32)
        depth_k = tl.load(depth_b + offs_n * stride_tn, mask=col_ok, other=0)
        seg_k = tl.load(seg_b + offs_n * stride_sn, mask=col_ok, other=-1)
        code = _pair_code(dist, depth_q[:, None], depth_k[None, :], seg_q[:, None], seg_k[None, :])
        scores = _dot(q, tl.trans(k), None, DOT_PRECISION, UPCAST_BF16) * qk_scale
        ds = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        # Every mask with a pair in this tile: accumulate dS over the masks.
        for m in range(0, M):
            need = tl.load(mask_need_ptr + m)
            if (bits & need) != 0:
                mask_code = tl.load(mask_code_ptr + m)
                row_stats = m * stride_lm + offs_m * stride_ln
                lse = tl.load(lse_bh + row_stats, mask=row_ok, other=float("inf"))
                delta = tl.load(delta_bh + row_stats, mask=row_ok, other=0.0)
                do = tl.load(do_bh + m * stride_om + (offs_m[:, None] * stride_on + offs_d[None, :] * stride_od),
                             mask=row_ok[:, None] & d_ok[None, :], other=0.0)
                p = tl.where(_mask_select(code, mask_code), tl.exp2(scores - lse[:, None]), 0.0)
                dp = _dot(do, tl.trans(v), None, DOT_PRECISION, UPCAST_BF16)
                ds += p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, DOT_PRECISION, UPCAST_BF16)

    dq = dq * sm_scale
    out_offs = offs_m[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(dq_ptr + b * stride_gb + h * stride_gh + out_offs, dq.to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


# --------------------------------------------------------------------------------------------------------
# Block metadata and compacted lists
# --------------------------------------------------------------------------------------------------------

def _block_bits_torch(distance: torch.Tensor, segment: torch.Tensor, max_syntax_distance: int, block_m: int,
                      block_n: int) -> torch.Tensor:
    """The block bits with PyTorch ops (any device, no Triton; one batch item at a time to bound memory)."""
    B, N, _ = distance.shape
    num_q = -(-N // block_m)
    num_k = -(-N // block_n)
    bits = torch.zeros(B, num_q, num_k, dtype=torch.int8, device=distance.device)
    for b in range(B):
        dist = torch.full((num_q * block_m, num_k * block_n), 255, dtype=torch.uint8, device=distance.device)
        dist[:N, :N] = distance[b]
        seg_q = torch.full((num_q * block_m,), -1, dtype=torch.int32, device=distance.device)
        seg_k = torch.full((num_k * block_n,), -1, dtype=torch.int32, device=distance.device)
        seg_q[:N] = segment[b]
        seg_k[:N] = segment[b]
        pair_valid = (seg_q[:, None] >= 0) & (seg_k[None, :] >= 0)
        same_tree = pair_valid & (seg_q[:, None] == seg_k[None, :])
        syntax = same_tree & (dist >= 1) & (dist.to(torch.int32) <= max_syntax_distance)

        def any_in_block(x):
            return x.view(num_q, block_m, num_k, block_n).any(dim=3).any(dim=1).to(torch.int8)

        bits[b] = any_in_block(pair_valid) + 2 * any_in_block(pair_valid & ~same_tree) + 4 * any_in_block(syntax)
    return bits


def _block_bits_triton(distance: torch.Tensor, segment: torch.Tensor, max_syntax_distance: int, block_m: int,
                       block_n: int) -> torch.Tensor:
    """The block bits with :func:`_subnetwork_block_meta_kernel` (one read of the uint8 distances)."""
    B, N, _ = distance.shape
    num_q = triton.cdiv(N, block_m)
    num_k = triton.cdiv(N, block_n)
    bits = torch.empty(B, num_q, num_k, dtype=torch.int8, device=distance.device)
    if bits.numel():
        launch(_subnetwork_block_meta_kernel, (num_q, num_k, B),
               distance, segment, bits, N, num_q, num_k,
               distance.stride(0), distance.stride(1), distance.stride(2), segment.stride(0), segment.stride(1),
               max_syntax_distance, BLOCK_M=block_m, BLOCK_N=block_n)
    return bits


def subnetwork_block_bits(trees, masks: MaskSpec, block_m: int = 64, block_n: int = 64,
                          use_kernel: Optional[bool] = None) -> torch.Tensor:
    """int8 ``[B, QB, KB]`` block bits on the trees' device: 1 = some valid pair, 2 = some pair across trees,
    4 = some same-tree pair at distance 1..(largest parent/child/sibling distance of ``masks``).

    ``use_kernel``: None = the Triton kernel on CUDA and PyTorch ops elsewhere; True/False forces one (the
    kernel runs on CPU only under ``TRITON_INTERPRET=1``).
    """
    V.check_masks(masks)
    _, _, max_d = mask_codes(masks)
    segment = trees.segment.to(torch.int32)
    if use_kernel is None:
        use_kernel = trees.distance.is_cuda
    if use_kernel:
        return _block_bits_triton(trees.distance, segment, max_d, block_m, block_n)
    return _block_bits_torch(trees.distance, segment, max_d, block_m, block_n)


def subnetwork_block_stats(trees, masks: MaskSpec, block_m: int = 64, block_n: int = 64) -> Dict[str, float]:
    """How much of the block grid the kernels visit (a property of the trees and the tiling; works on CPU).

    Returns a dict: ``blocks`` (``B * QB * KB``), ``valid_fraction`` (block pairs holding a valid pair),
    ``syntax_fraction`` (block pairs the parent/child/sibling masks visit), ``cross_fraction`` (block pairs
    holding a pair across trees), ``visited_fraction`` (block pairs any mask visits: the backward's tiles) and
    ``visited_mask_fraction`` = ``sum_m tiles(m) / (M * blocks)``, the density of the M masked attentions'
    work, used to scale FLOP counts.
    """
    bits = subnetwork_block_bits(trees, masks, block_m, block_n).to(torch.int32)
    _, needs, _ = mask_codes(masks)
    total = max(bits.numel(), 1)
    need_all = 0
    for n in needs:
        need_all |= n
    per_mask = sum(int(((bits & n) != 0).sum()) for n in needs)

    def fraction(bit):
        return float(((bits & bit) != 0).sum()) / total

    return dict(blocks=bits.numel(), block_m=block_m, block_n=block_n, num_masks=len(needs),
                valid_fraction=fraction(BIT_VALID), syntax_fraction=fraction(BIT_SYNTAX),
                cross_fraction=fraction(BIT_CROSS), visited_fraction=fraction(need_all),
                visited_mask_fraction=per_mask / (total * len(needs)))


# --------------------------------------------------------------------------------------------------------
# Launchers (torch.library Triton ops)
# --------------------------------------------------------------------------------------------------------

def _block_d(head_dim: int, dtype: torch.dtype) -> int:
    """The padded head dim of the kernels (a power of two >= 32)."""
    return max(32, triton.next_power_of_2(head_dim))


def _upcast_bf16(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and interpreting()


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (TF32 would miss the fp32 tolerance); half types use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def _group_table(codes: Sequence[int], needs: Sequence[int], group: int):
    """``(rows, class_needs)``: per forward group, its list class and (mask index, code) per slot (-1, 0 when
    unused); ``class_needs[c]`` is the block bit set of list class c."""
    class_needs: List[int] = []
    rows = []
    for members in _mask_groups(codes, needs, group):
        need = 0
        for m in members:
            need |= needs[m]
        if need not in class_needs:
            class_needs.append(need)
        row = [class_needs.index(need)]
        for slot in range(group):
            row += [members[slot], codes[members[slot]]] if slot < len(members) else [-1, 0]
        rows.append(row)
    return rows, class_needs


def _need_all(needs: Sequence[int]) -> int:
    need = 0
    for n in needs:
        need |= n
    return need


@torch.library.triton_op("syntaxkernels::subnetwork_attention_fwd", mutates_args=())
def subnetwork_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                                 depth: torch.Tensor, segment: torch.Tensor, codes: List[int], needs: List[int],
                                 max_syntax_distance: int,
                                 scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward launcher: ``(out [B, M, H, N, D] in q's dtype, lse2 fp32 [B, M, H, N], nonempty bool [B, M, N],
    bits int8 [B, QB, KB])``; the block bits are kept for the backward.

    Args:
        q, k, v: ``[B, H, N, D]`` (any strides); distance: uint8 ``[B, N, N]``; depth, segment: int32 ``[B, N]``.
        codes, needs: per mask its pair code and block bit (:func:`mask_codes`).
        max_syntax_distance: largest parent/child/sibling distance (0 when none); scale: score scale.
    """
    B, H, N, D = q.shape
    M = len(codes)
    cfg = forward_config(q.dtype, _block_d(D, q.dtype))
    block_m, block_n, group = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["GROUP"]
    bits = _block_bits_triton(distance, segment, max_syntax_distance, block_m, block_n)
    rows, class_needs = _group_table(codes, needs, group)
    live = torch.stack([(bits & need) != 0 for need in class_needs])  # [C, B, QB, KB]
    lists, counts = compact_rows(live.flatten(0, 1))
    table = torch.tensor(rows, dtype=torch.int32, device=q.device)
    out = torch.empty(B, M, H, N, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, M, H, N, dtype=torch.float32, device=q.device)
    nonempty = torch.empty(B, M, N, dtype=torch.int8, device=q.device)
    num_q, num_k = bits.shape[1], bits.shape[2]
    if out.numel():
        launch(_subnetwork_fwd_kernel, (num_q, B * H, len(rows)),
               q, k, v, out, lse, nonempty, distance, depth, segment, lists, counts, table,
               scale, H, N, num_q, num_k,
               *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(), *nonempty.stride(),
               *distance.stride(), *depth.stride(), *segment.stride(),
               HEAD_DIM=D, BLOCK_D=_block_d(D, q.dtype), BLOCK_M=block_m, BLOCK_N=block_n, GROUP=group,
               DOT_PRECISION=_dot_precision(q.dtype), UPCAST_BF16=_upcast_bf16(q.dtype), num_warps=cfg["num_warps"],
               num_stages=cfg["num_stages"])
    return out, lse, nonempty.bool(), bits


@torch.library.triton_op("syntaxkernels::subnetwork_attention_bwd", mutates_args=())
def subnetwork_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  out: torch.Tensor, lse: torch.Tensor, distance: torch.Tensor,
                                  depth: torch.Tensor, segment: torch.Tensor, bits: torch.Tensor,
                                  codes: List[int], needs: List[int],
                                  scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launcher: ``(dq, dk, dv)``, each ``[B, H, N, D]`` in q's dtype, summed over the M masks.

    Args: as :func:`subnetwork_attention_forward`, plus ``grad_out`` (like out, any strides), ``out``, ``lse``
    and the forward's block ``bits``.
    """
    B, H, N, D = q.shape
    M = len(codes)
    cfg = forward_config(q.dtype, _block_d(D, q.dtype))
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    live = (bits & _need_all(needs)) != 0
    lists, counts = compact_rows(live)
    tlists, tcounts = compact_rows(live.transpose(1, 2))
    delta = (grad_out.float() * out.float()).sum(dim=-1).contiguous()
    lse = lse.contiguous()
    code_t = torch.tensor(codes, dtype=torch.int32, device=q.device)
    need_t = torch.tensor(needs, dtype=torch.int32, device=q.device)
    dq = torch.empty(B, H, N, D, dtype=q.dtype, device=q.device)
    dk = torch.empty_like(dq)
    dv = torch.empty_like(dq)
    num_q, num_k = bits.shape[1], bits.shape[2]
    if dq.numel():
        common = dict(HEAD_DIM=D, BLOCK_D=_block_d(D, q.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
                      DOT_PRECISION=_dot_precision(q.dtype), UPCAST_BF16=_upcast_bf16(q.dtype),
                      num_stages=cfg["bwd_num_stages"])
        strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *lse.stride(),
                   *distance.stride(), *depth.stride(), *segment.stride(), *dq.stride())
        launch(_subnetwork_bwd_dkdv_kernel, (num_k, B * H),
               q, k, v, grad_out, lse, delta, dk, dv, distance, depth, segment, tlists, tcounts, bits, code_t,
               need_t, scale, H, N, M, num_q, num_k, *strides, num_warps=cfg["dkdv_num_warps"], **common)
        launch(_subnetwork_bwd_dq_kernel, (num_q, B * H),
               q, k, v, grad_out, lse, delta, dq, distance, depth, segment, lists, counts, bits, code_t, need_t,
               scale, H, N, M, num_q, num_k, *strides, num_warps=cfg["dq_num_warps"], **common)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------------------
# Autograd and the public function
# --------------------------------------------------------------------------------------------------------

class _SubnetworkAttention(torch.autograd.Function):
    """Autograd over the two Triton ops: gradients for q, k, v (the trees get none)."""

    @staticmethod
    def forward(ctx, q, k, v, distance, depth, segment, codes, needs, max_syntax_distance, scale):
        out, lse, nonempty, bits = torch.ops.syntaxkernels.subnetwork_attention_fwd(
            q, k, v, distance, depth, segment, codes, needs, max_syntax_distance, scale)
        ctx.save_for_backward(q, k, v, out, lse, distance, depth, segment, bits)
        ctx.codes, ctx.needs, ctx.scale = codes, needs, scale
        ctx.mark_non_differentiable(nonempty)
        return out, nonempty

    @staticmethod
    def backward(ctx, grad_out, grad_nonempty):
        q, k, v, out, lse, distance, depth, segment, bits = ctx.saved_tensors
        dq, dk, dv = torch.ops.syntaxkernels.subnetwork_attention_bwd(
            grad_out, q, k, v, out, lse, distance, depth, segment, bits, ctx.codes, ctx.needs, ctx.scale)
        return dq, dk, dv, None, None, None, None, None, None, None


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128


def _triton_unsupported(q: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Triton kernels cannot take these inputs (None when they can)."""
    if q.dtype not in _TRITON_DTYPES:
        return f"q has dtype {q.dtype}; the Triton kernels take float16, bfloat16 or float32"
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"q has head dim {q.shape[-1]}; the Triton kernels take head dims up to {MAX_HEAD_DIM}"
    if v.shape[-1] != q.shape[-1]:
        return f"v has head dim {v.shape[-1]} but q has {q.shape[-1]}; the Triton kernels need them equal"
    return None


def syntax_subnetwork_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, masks: MaskSpec, *,
                                scale: Optional[float] = None, backend: str = "auto"):
    """Syntax-BERT sub-networks: M masked attentions sharing q, k, v, fused and block-sparse.

    Args:
        q, k, v: ``[B, H, N, D]``; float16/bfloat16/float32 for the Triton kernels (float64, head dims above
            128 or a v head dim unlike q's fall back to the reference under ``backend="auto"``).
        trees: a :class:`syntaxkernels.TreeBatch` on q's device (distance uint8 ``[B, N, N]``, depth and
            segment ``[B, N]``).
        masks: the :class:`syntaxkernels.MaskSpec`; M = ``masks.num_masks``, outputs in ``masks.names`` order.
        scale: score scale, default ``1/sqrt(D)``.
        backend: "auto" (Triton for CUDA tensors), "triton" or "reference".
    Returns:
        ``out [B, M, H, N, D]`` in q's dtype (zero where a token's mask is empty; such rows get zero
        gradients) and ``nonempty bool [B, M, N]``.

    Equivalent PyTorch::

        allowed = syntaxkernels.reference.syntax_masks(trees, masks)          # [B, M, N, N]
        scores = (q @ k.transpose(-1, -2)).float() * scale
        out = torch.stack([masked_attention(scores, allowed[:, m, None], v) for m in range(M)], dim=1)
        nonempty = allowed.any(-1)
    """
    if not V.compiling():
        V.check_subnetwork_inputs(q, k, v, trees, masks)
    chosen = resolve_backend(backend, q.device)
    if chosen == "triton":
        why = _triton_unsupported(q, v)
        if why is not None:
            if backend == "triton":
                raise ValueError(f"backend='triton': {why}; use backend='reference' or 'auto'")
            chosen = "reference"
    if chosen == "reference" or q.numel() == 0:
        return reference.syntax_subnetwork_attention(q, k, v, trees, masks, scale=scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    codes, needs, max_d = mask_codes(masks)
    return _SubnetworkAttention.apply(q, k, v, trees.distance, trees.depth.to(torch.int32),
                                      trees.segment.to(torch.int32), codes, needs, max_d, float(scale))


# --------------------------------------------------------------------------------------------------------
# The compile matrix (python_tests/test_compile_subnetwork.py)
# --------------------------------------------------------------------------------------------------------

_TRITON_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def compile_specs(dtypes=("fp16", "bf16", "fp32"), head_dims=(32, 64, 128), groups=None):
    """:class:`syntaxkernels.ops._compile.KernelSpec` for every kernel of this op: the forward (with the
    config's GROUP, or each of ``groups`` when given), both backward kernels, and the block-metadata kernel
    for every block size in use. Innermost strides are specialised to 1, as on contiguous tensors."""
    from ._compile import kernel_spec

    unit = dict(stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1, stride_ln=1, stride_en=1, stride_dk=1,
                stride_tn=1, stride_sn=1, stride_gd=1)
    specs = []
    block_sizes = set()
    for dname in dtypes:
        dtype = _TRITON_DTYPE[dname]
        half = dtype != torch.float32
        for head_dim in head_dims:
            cfg = forward_config(dtype, _block_d(head_dim, dtype))
            block_sizes.add((cfg["BLOCK_M"], cfg["BLOCK_N"]))
            flags = dict(unit, HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim, dtype), BLOCK_M=cfg["BLOCK_M"],
                         BLOCK_N=cfg["BLOCK_N"], DOT_PRECISION=_dot_precision(dtype),
                     UPCAST_BF16=False)
            options = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], needs_mma=half)
            dkdv_options = dict(num_warps=cfg["dkdv_num_warps"], num_stages=cfg["bwd_num_stages"], needs_mma=half)
            dq_options = dict(num_warps=cfg["dq_num_warps"], num_stages=cfg["bwd_num_stages"], needs_mma=half)
            tag = f"{dname} D{head_dim} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}"
            fwd_tag = f"{tag} w{cfg['num_warps']} s{cfg['num_stages']}"
            dkdv_tag = f"{tag} w{cfg['dkdv_num_warps']} s{cfg['bwd_num_stages']}"
            dq_tag = f"{tag} w{cfg['dq_num_warps']} s{cfg['bwd_num_stages']}"
            tensors = dict(q_ptr=dname, k_ptr=dname, v_ptr=dname, dist_ptr="u8", depth_ptr="i32", seg_ptr="i32",
                           lse_ptr="fp32")
            for group in (groups or (cfg["GROUP"],)):
                fwd = dict(tensors, out_ptr=dname, nonempty_ptr="i8", lists_ptr="i32", counts_ptr="i32",
                           group_table_ptr="i32")
                specs.append(kernel_spec(_subnetwork_fwd_kernel, f"fwd G{group} {fwd_tag}", fwd,
                                         dict(flags, GROUP=group), float_args=("sm_scale",), **options))
            bwd = dict(tensors, do_ptr=dname, delta_ptr="fp32", bits_ptr="i8", mask_code_ptr="i32",
                       mask_need_ptr="i32")
            specs.append(kernel_spec(_subnetwork_bwd_dkdv_kernel, f"bwd_dkdv {dkdv_tag}",
                                     dict(bwd, dk_ptr=dname, dv_ptr=dname, tlists_ptr="i32", tcounts_ptr="i32"),
                                     flags, float_args=("sm_scale",), **dkdv_options))
            specs.append(kernel_spec(_subnetwork_bwd_dq_kernel, f"bwd_dq {dq_tag}",
                                     dict(bwd, dq_ptr=dname, lists_ptr="i32", counts_ptr="i32"),
                                     flags, float_args=("sm_scale",), **dq_options))
    for block_m, block_n in sorted(block_sizes):
        specs.append(kernel_spec(_subnetwork_block_meta_kernel, f"block_meta {block_m}x{block_n}",
                                 dict(dist_ptr="u8", seg_ptr="i32", bits_ptr="i8"),
                                 dict(stride_dk=1, stride_sn=1, BLOCK_M=block_m, BLOCK_N=block_n), needs_mma=False))
    return specs
