"""The launch configurations of the bias op's Triton kernels: one flat table, and the rules that pick an entry.

:data:`CONFIGS` holds every (kernel, GPU family, dtype class, head-dim class) entry written out: kernels "fwd",
"dq", "dkdv", "table", "table_extra" (the tiled kernels), "fwd_short", "short", "short2" (rows of at most 64 and
128 tokens), the two small kernels after the short-row backward, "short_table" and "short2_sum", and the packed
kernels "varlen_fwd", "varlen_dq", "varlen_dkdv", "varlen_dkdv_ds", "varlen_dkdv_table", "varlen_table",
"varlen_table_ds"; families
"sm90" (Hopper and newer), "sm80" (A100) and "small" (other GPUs with ~100 KB of shared memory a block:
sm_86, sm_89, sm_120); dtype classes "half" (fp16, bf16) and "fp32"; head-dim classes 64 (a padded head dim
``BLOCK_D <= 64``) and 128. The block metadata kernels (:mod:`..block_meta`) take the tiles of the kernel they
serve. :func:`select_config` reads an entry and applies the Blackwell overrides (:data:`BLACKWELL_CONFIGS`,
:data:`CONSUMER_BLACKWELL_CONFIGS`) and the family's opaque-bias rule (:func:`_opaque_bias`). A call's variants take
override tables over it (:func:`._launch.launch_configs`): grouped-query k, v (:data:`GROUPED_KV_CONFIGS`), T5's
position term (:data:`POSITION_CONFIGS`), causal (:data:`CAUSAL_CONFIGS`) and attention dropout
(:data:`DROPOUT_CONFIGS`), in that order.

Each entry is compiled for its family by the inspection report (``python -m syntaxkernels inspect``), which checks
registers, spills and the main loop's instruction mix; the choices are the spill-free ones with the fewest
instructions per score element there.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .._primitives import arch_family, current_arch, head_block

__all__ = ["CONFIGS", "BLACKWELL_CONFIGS", "CONSUMER_BLACKWELL_CONFIGS", "CAUSAL_CONFIGS", "DROPOUT_CONFIGS",
           "SHORT_ROW_LIMIT", "STATIC_BUCKET_LIMIT", "STORED_DS_PAIRS_PER_TOKEN", "select_config"]

#: Rows up to this long take the short-row kernels (see :func:`_short_config`).
SHORT_ROW_LIMIT = 64
#: A packed batch's shared-table gradient sums dS stored by the dK/dV kernel when the batch holds at most this many
#: pairs a token (``sum n_s^2 <= limit * T``: sequences of about the short-row kernels' 128 tokens or fewer), and
#: recomputes it in the table kernel otherwise (:func:`._varlen_kernels.stores_ds`).
STORED_DS_PAIRS_PER_TOKEN = 128
#: Tables up to this many buckets sum dS through compile-time accumulators.
STATIC_BUCKET_LIMIT = 31


def walks_present_codes(num_buckets: int, log_distance) -> bool:
    """Whether the table kernels walk only the buckets a tile holds, from each to the next (a table of one bucket per
    byte value, not log-spaced: a relation batch's codes), rather than the range from its lowest to its highest
    (:func:`._backward._bucket_sums` tests the same constexprs)."""
    return num_buckets == 256 and not log_distance

CONFIGS: Dict[Tuple[str, str, str, int], dict] = {
    # The forward (:func:`._forward._bias_fwd_kernel`). fp32 inputs, here and in every tiled kernel, run exact fp32
    # products (no tensor cores, no TF32): Triton 3.6 lowers them to FMA loops that hold whole operand rows per
    # thread. 16x32 tiles are spill-free up to D = 64; at D = 128 every tiling tried spills (16x16 the least):
    # correct, but not tuned (fp32 is not a performance target; use bf16/fp16 for speed). The small family takes
    # A100's tiles unless said otherwise.
    ("fwd", "sm90", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("fwd", "sm90", "half", 128): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("fwd", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("fwd", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("fwd", "sm80", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("fwd", "sm80", "half", 128): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("fwd", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("fwd", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("fwd", "small", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("fwd", "small", "half", 128): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("fwd", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("fwd", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    # dQ (and delta). The small family at D = 128: 128x16 (A100's 128x32 tiles need 100 KB with two stages).
    ("dq", "sm90", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    ("dq", "sm90", "half", 128): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3),
    ("dq", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dq", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("dq", "sm80", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("dq", "sm80", "half", 128): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("dq", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dq", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("dq", "small", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    ("dq", "small", "half", 128): dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=2),
    ("dq", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dq", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    # dK/dV: BLOCK_N is the key block a program owns and BLOCK_M the query block of one iteration. The small family
    # at D = 64: one stage (sm_120's Blackwell ptxas spills with A100's two; one is spill-free on sm_86, sm_89 and
    # sm_120).
    ("dkdv", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
    ("dkdv", "sm90", "half", 128): dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3),
    ("dkdv", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dkdv", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("dkdv", "sm80", "half", 64): dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2),
    ("dkdv", "sm80", "half", 128): dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=2),
    ("dkdv", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dkdv", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("dkdv", "small", "half", 64): dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=1),
    ("dkdv", "small", "half", 128): dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=2),
    ("dkdv", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("dkdv", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    # The table gradient, starting from dQ's tiles (its loop holds dQ's first two products): it holds two score
    # tiles (this head's and the heads' sum of dS) and each head's operands. One stage on sm_90 at D = 64 and on
    # the small family at D = 128: with the skipped-tile branch two stages spill (sm_90 D64 128x64: 64 B; 64x64 with
    # two stages does not, at +67% main-loop instructions). sm_80 takes two stages (pipelined loads, spill-free on
    # long-4096: D64 255 registers, main loop +14% instructions; D128 -4%). fp32 at D <= 64: on sm_80 16x32
    # spills with one or two stages, 16x16 with one; on sm_90 16x16 spills with two stages, 16x32 with one does not.
    ("table", "sm90", "half", 64): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=1),
    ("table", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
    ("table", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("table", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("table", "sm80", "half", 64): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("table", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2),
    ("table", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2),
    ("table", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("table", "small", "half", 64): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2),
    ("table", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    # The table kernel with a window (live-tile lists), log-spaced buckets or more than 31 buckets holds more
    # state: where its plain tiles spill then, other tiles (sm_90 at D = 64); else the plain ones.
    ("table_extra", "sm90", "half", 64): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    ("table_extra", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
    ("table_extra", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("table_extra", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("table_extra", "sm80", "half", 64): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table_extra", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table_extra", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2),
    ("table_extra", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("table_extra", "small", "half", 64): dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table_extra", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=1),
    ("table_extra", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2),
    ("table_extra", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    # The short-row forward (``N <= 64``, :func:`._forward._bias_fwd_short_kernel`): one 64 x 64 tile a sequence,
    # every head in one program, four warps; whole 64-column products on sm_90, chunks of 32 on mma.sync GPUs
    # (6-11% fewer instructions per element there).
    ("fwd_short", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=64, OUT_CHUNK=64, num_warps=4, num_stages=1),
    ("fwd_short", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=64, OUT_CHUNK=64, num_warps=4, num_stages=1),
    ("fwd_short", "sm80", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, num_warps=4, num_stages=1),
    ("fwd_short", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, num_warps=4, num_stages=1),
    ("fwd_short", "small", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, num_warps=4, num_stages=1),
    ("fwd_short", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32,
                                              num_warps=4, num_stages=1),
    # The short-row backward (``N <= 64``, a sequence one 64 x 64 tile: dQ, dK, dV and each head's dS in one
    # kernel, :func:`._backward._bias_bwd_short_kernel`): four warps (on sm_90 one warp group: wider programs repeat
    # the score tile on every group of warps). CHUNK: the head-dim columns of the score and dP products a step;
    # OUT_CHUNK: of the dQ, dK, dV products (on sm_90 64: a transposed product of 32 rows leaves the warp-group
    # instructions); DQ_T: dQ as dQ^T = K^T dS^T. The spill-free choices with the fewest instructions per element:
    # on sm_90 D64 whole tiles, D128 chunks of 32 with dQ^T. On mma.sync GPUs (whose second operand every warp
    # holds whole) keys-major tiles (KEYS_MAJOR, :func:`._backward._bias_bwd_short_t_kernel`: P^T and dS^T feed dV
    # and dK as they are; dQ not transposed): on sm_80 8.5% (D = 64, chunks of 32) and 16% (D = 128, chunks of
    # 16) fewer instructions per element than the queries-major tiles, 7% on the small family at D = 64. The
    # small family at D = 128 keeps the queries-major kernel (every keys-major choice spills 8-56 B on sm_86 or
    # sm_120) with chunks of 16 (with the opaque bias of :func:`_opaque_bias`, chunks of 32 spill 8 B on sm_86 and
    # sm_89).
    ("short", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=64, OUT_CHUNK=64, DQ_T=False,
                                        num_warps=4, num_stages=1),
    ("short", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=64, DQ_T=True,
                                         num_warps=4, num_stages=1),
    ("short", "sm80", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, DQ_T=False, KEYS_MAJOR=True,
                                        num_warps=4, num_stages=1),
    ("short", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=16, OUT_CHUNK=32, DQ_T=False, KEYS_MAJOR=True,
                                         num_warps=4, num_stages=1),
    ("short", "small", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, DQ_T=False, KEYS_MAJOR=True,
                                         num_warps=4, num_stages=1),
    ("short", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=16, OUT_CHUNK=32, DQ_T=True,
                                          num_warps=4, num_stages=1),
    # Rows of 65..128 tokens (:func:`._backward._bias_bwd_short2_kernel`: a program per query block of 64, two key
    # blocks): the one-tile kernel's queries-major tiles (chunks of 32 with dQ^T on mma.sync GPUs), but for score
    # and dP products over head-dim chunks of 32 on sm_90 at D = 128, of 16 on sm_80 at D = 128 and of 16 with dQ
    # not transposed on the small family (the spill-free choices: with the one-tile kernel's, 16-56 B spill). The
    # sm90 family at D <= 64 runs them with the key blocks outer (KEYS_OUTER,
    # :func:`._backward._bias_bwd_short2_keys_kernel`: a program per item, dK and dV in registers over steps of ROWS
    # query rows, no dK/dV shares: about half the scratch, +8-24% instructions on pairs, -20% on odd-77; the
    # spill-free tiling on sm_90 and sm_100 in every variant, grouped or not: steps of 16 rows, whole 64-column
    # chunks, dQ transposed; steps of 32 spill 16-24 B). The small family at D <= 64 takes it in grouped launches
    # (GROUPED_CONFIG, :func:`._launch.short2_grouping`): steps of 16 rows, chunks of 32, dQ not transposed,
    # spill-free grouped on sm_86 and sm_120 plain, causal, grouped-query, windowed: scratch per valid pair and head
    # 26.9 -> 12.3 B on pairs, 40.3 -> 15.3 on odd-77 (2.82 -> 1.07 of essential), for a trade in instructions as on
    # sm_90 (the whole backward a valid pair, sm_86 / sm_120: pairs 122.8 -> 159.0 / 135.9 -> 155.0, odd-77 205.4 ->
    # 175.6 / 206.4 -> 170.6, finetune-128 252.9 -> 321.8 / 277.6 -> 316.6); its single-axis launches keep the
    # query-major kernel (keys outer there spill 8-16 B causal or windowed, in chunks of 16 too). sm_80 keeps it
    # everywhere: every keys-outer tiling tried spills (40-456 B, eight warps 192 B).
    ("short2", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=64, OUT_CHUNK=64, DQ_T=True, KEYS_OUTER=True,
                                         ROWS=16, num_warps=4, num_stages=1),
    ("short2", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=64, DQ_T=True,
                                          num_warps=4, num_stages=1),
    ("short2", "sm80", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=32, OUT_CHUNK=32, DQ_T=True,
                                         num_warps=4, num_stages=1),
    ("short2", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=16, OUT_CHUNK=32, DQ_T=True,
                                          num_warps=4, num_stages=1),
    ("short2", "small", "half", 64): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=16, OUT_CHUNK=32, DQ_T=False,
                                          num_warps=4, num_stages=1,
                                          GROUPED_CONFIG=dict(KEYS_OUTER=True, ROWS=16, CHUNK=32, OUT_CHUNK=32)),
    ("short2", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=64, CHUNK=16, OUT_CHUNK=32, DQ_T=False,
                                           num_warps=4, num_stages=1),
    # After the short-row backward: the table gradient of its dS tiles
    # (:func:`._backward._bias_bwd_short_table_kernel`, one program a tile) ...
    ("short_table", "sm90", "half", 64): dict(num_warps=4, num_stages=1),
    ("short_table", "sm90", "half", 128): dict(num_warps=4, num_stages=1),
    ("short_table", "sm80", "half", 64): dict(num_warps=4, num_stages=1),
    ("short_table", "sm80", "half", 128): dict(num_warps=4, num_stages=1),
    ("short_table", "small", "half", 64): dict(num_warps=4, num_stages=1),
    ("short_table", "small", "half", 128): dict(num_warps=4, num_stages=1),
    # ... and the two-block kernel's shares added (:func:`._backward._bias_bwd_short2_sum_kernel`, one program a
    # head and item; two warps at D <= 64: fewer instructions).
    ("short2_sum", "sm90", "half", 64): dict(num_warps=2, num_stages=1),
    ("short2_sum", "sm90", "half", 128): dict(num_warps=4, num_stages=1),
    ("short2_sum", "sm80", "half", 64): dict(num_warps=2, num_stages=1),
    ("short2_sum", "sm80", "half", 128): dict(num_warps=4, num_stages=1),
    ("short2_sum", "small", "half", 64): dict(num_warps=2, num_stages=1),
    ("short2_sum", "small", "half", 128): dict(num_warps=4, num_stages=1),
    # The packed (varlen) kernels (:mod:`._varlen_kernels`: forward, dQ, dK/dV, table; read by its
    # ``select_varlen_config``, no overrides). 32 x 32 tiles (16 x 32 for dQ and for the dS-storing dK/dV at D = 64,
    # below): on the EWT dev sentences packed end to end 31% of the pairs computed are valid (128 x 64 tiles: 11%;
    # 64 x 32: 21%; 16 x 32: 38% of the dQ kernel's; 16 x 16: 50%); compiled for every family by the
    # inspection report (the ``sentences-packed`` workload). The gathered bias is opaque to Triton's layout passes
    # (``lut_bias``), so P and dS keep 16-bit operand layouts: dK/dV then fits 4 warps at D = 128 on every family
    # (it took 8 on sm_90 and the small family with the uint8 layouts), and one stage at D = 64 on sm_90 (two
    # spill 8 B there); sm_80's ptxas spills 8 B with the 16 x 16 fp32 tile at D = 64, 16 x 32 with 8 warps is
    # clean there. The table kernel (dS recomputed for each of the 12 heads of a shared table,
    # summed, then reduced per bucket once a tile): 16 x 64 with 4 warps, spill-free on every family; 32 x 32 and
    # 32 x 64 spill with 4 warps (sm_80, sm_100, sm_120) and cost more per valid pair with 8 (sentences-packed,
    # sm_90 D64: 16 x 64 84, 32 x 64 w8 111, 64 x 32 w8 102 instructions per valid pair). "varlen_dkdv_table":
    # the dK/dV kernel of a per-head table, which sums its head's dS per bucket itself (cheaper than the table
    # kernel recomputing dS for one head): the dK/dV tiles, two stages on sm_90 at D = 64 (one spills 8 B on sm_100).
    # fp32 table kernel: 16 x 16 at D = 64 (16 x 32 spills 64-112 B with 4 warps, 8-24 B with 8); fp32 per-head
    # dK/dV on sm_90 at D = 128: 4 warps (8 spill 8 B).
    # Forward (fp16/bf16): 16-query tiles of 32 keys with 2 warps, two stages, as dQ (less walked area per valid pair:
    # 2.65 -> 2.06 score elements on sentences-packed). bf16 per valid pair against 32 x 32 w4: D64 sm_80 119.1 ->
    # 105.4, sm_86/89 119.1 -> 103.6, sm_90 118.1 -> 104.3, sm_100 118.7 -> 103.6, sm_120 118.1 -> 101.5; D128 sm_80
    # 139.2 -> 115.2, sm_86/89 139.2 -> 115.2, sm_90 132.9 -> 114.4, sm_100 133.6 -> 113.9, sm_120 139.2 -> 120.1;
    # spill-free on every family with causal, grouped k/v, dropout, T5's term and a positional window (248-255
    # registers at D = 128).
    ("varlen_fwd", "sm90", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "sm90", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_fwd", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_fwd", "sm80", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "sm80", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_fwd", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_fwd", "small", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "small", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_fwd", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_fwd", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    # dQ (fp16/bf16): 16-query tiles of 32 keys with 2 warps, two stages: per valid pair the smaller walked area
    # (2.65 -> 2.06 score elements, sentences-packed) outweighs the dearer element. bf16 D64 against 32 x 32 w4:
    # sm_80 99.5 -> 84.8, sm_86 105.2 -> 95.1, sm_90 98.6 -> 85.0, sm_100 96.6 -> 81.7, sm_120 105.2 -> 94.5; D128
    # sm_80 114.8 -> 109.7, sm_86 119.4 -> 105.4, sm_90 118.1 -> 111.0, sm_100 116.1 -> 108.7, sm_120 122.7 ->
    # 109.7 (one stage spills 8-16 B on sm_90/sm_100 there); spill-free on every family.
    ("varlen_dq", "sm90", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "sm90", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_dq", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dq", "sm80", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "sm80", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_dq", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dq", "small", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "small", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=2),
    ("varlen_dq", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_dq", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_table", "sm90", "half", 64): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "sm90", "half", 128): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_table", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_table", "sm80", "half", 64): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "sm80", "half", 128): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_table", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_table", "small", "half", 64): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "small", "half", 128): dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),
    ("varlen_table", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_table", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    # "varlen_table_ds": the table kernel's STORED_DS variant (it reads the dS the dK/dV kernel stored, no
    # products): the smallest walked area whose fixed per-tile work stays amortised, one config for every dtype and
    # head dim (it reads no q, k, v). sentences-packed bf16 D64 sm_100, instructions per valid pair (area): 16 x 64
    # w4 38.9 (2.51), 16 x 32 w4 65.7 (2.06), 16 x 32 w2 32.7, 16 x 32 w1 28.8 (one-warp programs), 32 x 16 w2 34.5
    # (2.32), 16 x 16 w2 54.7 (1.78), 32 x 32 w2 42.0 (2.65) (two builds of the head loop's addressing, within 1 of
    # each other); spill-free on every family.
    ("varlen_table_ds", "sm90", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm90", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm80", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm80", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "small", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "small", "half", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_table_ds", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_dkdv", "sm90", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_dkdv", "sm90", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv", "sm80", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv", "sm80", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=1),
    ("varlen_dkdv", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv", "small", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    # "varlen_dkdv_ds": the dK/dV kernel's STORE_DS variant (each head's dS stored for the table kernel). D = 64:
    # 16-query tiles of 32 keys, 2 warps, one stage (sentences-packed bf16, instructions per valid pair against the
    # 32 x 32 w4 tiles: sm_80 122.0 -> 100.0, sm_86 139.6 -> 100.0, sm_90 117.1 -> 98.3, sm_100 116.7 -> 98.0,
    # sm_120 121.7 -> 100.6; the smaller walked area, 2.65 -> 2.32 score elements per valid pair, outweighs the
    # dearer element; two stages cost 5 more). D = 128: the dK/dV tiles, one stage on sm_90 and sm_100 (two spill 8
    # B there; 16 x 32 w2 spills 16-72 B on every family).
    ("varlen_dkdv_ds", "sm90", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_dkdv_ds", "sm90", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),
    ("varlen_dkdv_ds", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv_ds", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv_ds", "sm80", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_dkdv_ds", "sm80", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_ds", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=1),
    ("varlen_dkdv_ds", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv_ds", "small", "half", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1),
    ("varlen_dkdv_ds", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_ds", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv_ds", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv_table", "sm90", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "sm90", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "sm90", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv_table", "sm90", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv_table", "sm80", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "sm80", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "sm80", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=1),
    ("varlen_dkdv_table", "sm80", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
    ("varlen_dkdv_table", "small", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
    ("varlen_dkdv_table", "small", "fp32", 64): dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    ("varlen_dkdv_table", "small", "fp32", 128): dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1),
}

# Blackwell datacenter GPUs (sm_100/103/110) take the sm90 family's configs, but for these, where the Blackwell
# ptxas spills with Hopper's: (kind, dtype class, head-dim class) -> the fields that differ.
BLACKWELL_CONFIGS: Dict[Tuple[str, str, int], dict] = {
    ("short", "half", 128): dict(CHUNK=64, DQ_T=False),
    ("table", "half", 64): dict(num_stages=1),
    ("table", "half", 128): dict(num_stages=1),
    ("table_extra", "half", 64): dict(num_stages=1),
    ("table_extra", "half", 128): dict(num_warps=4, num_stages=1),  # (8 warps: 32 B at 256 buckets, odd-1000)
}
#: The short-row backward kernels walk their heads in groups, a program each (``GROUPED``,
#: :func:`._launch.head_groups`), except where the grouped loop spills (kind, family, head-dim class): there one
#: program walks every head, as on a single-axis grid. These kernels sit at the 255-register limit, and the grouped
#: loop (its first head from the grid's second axis) moves the allocation: compiled as launched on the sentences
#: and pairs workloads (bf16) with the family's tiles, sm_90 spills 8 B (one tile, D64), 24 B (one tile, D128),
#: 32 B (two blocks, D64), sm_100 24 B (two blocks, D64), sm_120 8 B (two blocks, D128): the sm90 family takes
#: other tiles when grouped (GROUPED_CONFIGS), sm_120's two-block kernel at D128 stays ungrouped.
GROUPED_SPILLS = {("short2", "small", 128)}

#: Where the grouped loop spills with the family's tiles, the grouped launches take these instead (spill-free
#: grouped; more instructions per element than the ungrouped tiles, on several times the programs), and a batch
#: large enough to fill the GPU ungrouped keeps the family's tiles: sm_90 one tile D128 eight warps (45.2 / 30.3
#: instructions per element), two blocks D64 chunks of 32 (35.9 / 24.1; sentences and pairs, bf16). The one-tile
#: kernel at D64 on sm_90 took chunks of 32 too (32.9 / 19.1) until its head count became a compile-time constant
#: (``HEADS``): its grouped loop is spill-free with the family's tiles since (19.8 per element, sentences bf16).
GROUPED_CONFIGS = {
    ("short", "sm90", 128): dict(num_warps=8),
}
#: sm_100 and newer in the sm90 family: their own tiles (:data:`BLACKWELL_CONFIGS`) group spill-free (the two-block
#: kernel at D64, query-major, spilled 24 B grouped and took chunks of 32 here until it ran with the key blocks
#: outer there).
BLACKWELL_GROUPED_CONFIGS: Dict[Tuple[str, int], dict] = {}

#: The table-gradient kernel splits a query block's walk among several programs where the grid is small
#: (:func:`._launch.table_splits`), except where the split loop spills (kind, family, dtype class, head-dim class):
#: compiled as launched, the small family at D = 128 spills 8 B on sm_86 and sm_89 (bf16: finetune-512, long-4096,
#: odd-1000), sm_80 and sm_90 in fp32 at D <= 64 8 B (N = 1024).
SPLIT_SPILLS = {("table", "small", "half", 128), ("table_extra", "small", "half", 128), ("table", "sm80", "fp32", 64),
                ("table_extra", "sm80", "fp32", 64), ("table", "sm90", "fp32", 64), ("table_extra", "sm90", "fp32", 64)}

# Consumer Blackwell GPUs (sm_120: RTX 50xx, RTX PRO) take the small family's configs, but for the entries here
# (padded kinds read by select_config, packed ones, "varlen_*", by _varlen_kernels.select_varlen_config). The
# two-block backward at D = 128 took the plain bias (OPAQUE_BIAS=False) while it spilled 8 B with the opaque one;
# since its dQ is added in the program it is spill-free with it (and cheaper: 46.8 instructions per element against
# 72.6, pairs bf16). The packed dK/dV kernel storing dS at D = 128 takes 32-key blocks of 16 there (sentences-packed
# bf16, instructions per valid pair: 152.8 -> 145.3, causal 169.0 -> 153.0; on sm_86 the same tiles cost more,
# 145.2 -> 164.9).
CONSUMER_BLACKWELL_CONFIGS: Dict[Tuple[str, str, int], dict] = {
    ("varlen_dkdv_ds", "half", 128): dict(BLOCK_N=16, num_stages=1),
}


def _opaque_bias(family: str) -> bool:
    """Whether the kernels pass the gathered bias through an opaque move (``OPAQUE_BIAS``,
    :func:`~syntaxkernels.ops._primitives.lut_bias`): on GPUs whose products lower to ``mma.sync`` (sm_80 and the
    small family). Triton 3.6 sizes a dot's register operands from the narrowest load in their backward slice;
    P and dS carry the bias, gathered at the uint8 distance, so without the move their products take 8-bit
    operand layouts (shuffles and selects to form each register operand from the accumulator, a register move for
    every transposed operand load): sm_80 sentences backward 46.5 -> 36.4 per element at D = 64 in the model.
    On sm_90 and newer (wgmma, tcgen05) it changes nothing."""
    return family in ("sm80", "small")


#: Padded batches of short rows (a fine-tuning batch padded to 128, 512 or 1024): calls of more than
#: ``SHORT_ROW_LIMIT`` tokens on a plan whose ``short_rows`` is True (:func:`~syntaxkernels.plan.rows_are_short` of
#: its lengths), or, where the plan has no such summary, of at most ``PADDED_ROW_LIMIT`` tokens (causal calls too: a
#: decoder fine-tuned on padded batches; calls with a distance window or a positional one too: their live-tile lists
#: are built on these tiles; grouped-query k, v too, a grouped-query decoder's, with their own dK/dV entries below,
#: but not with T5's term, where the padded tiles spilled 8-32 B in the small family's dK/dV at D64 and table kernel
#: at D128 and sm_90's dK/dV at D128; with T5's term too: its entries in PADDED_CONFIGS refine the tiles after the
#: term's own, and those naming "causal" too a causal call's, a T5 decoder's, those naming "window" or
#: "position_window" too a call with the term and either window) take :data:`PADDED_CONFIGS` over the tiled
#: forward, dQ, dK/dV and table tiles (the backward's run above ``2 * SHORT_ROW_LIMIT``, where the short-row backward
#: ends, and below it with attention dropout or a scale of 0); with attention dropout at head dims up to 64 the
#: forward, dQ and dK/dV ones and the table kernel's entries naming dropout (the dropout entries apply after the
#: others; at D = 128 the two together spilled 24-104 B on sm_80, the small family and sm_90: those calls keep their
#: tiles).
PADDED_ROW_LIMIT = 512

#: Calls with a positional window of at most this ``W`` (``|i - j| <= W``: a sliding-window layer as ModernBERT's local
#: ones, W = 64) take :data:`PADDED_CONFIGS` whatever the rows' length (long trees, long documents): the live tiles
#: lie in a band of ``2 W + 1`` diagonals, which the long rows' 128-row tiles cover with more dead area than the padded
#: ones' cost in instructions. A layer after the batch's first, per valid pair, the padded tiles against the family's
#: (``inspect --workload long-4096,odd-1000 --arch all --head-dim 64,128 --position-window W``, bf16, spill-free):
#: W = 16 -19..-41%, W = 64 -11..-26% on every family; W = 128 -1..-15% but sm_100 -0..+2%; W = 256 -5..+15%.
NARROW_BAND_LIMIT = 64

#: The tiled forward, dQ, dK/dV and table kernels' tiles on padded batches of short rows (:data:`PADDED_ROW_LIMIT`),
#: over :data:`CONFIGS` (and sm_100's / sm_120's own): ``(kind, family, dtype class, head-dim class) -> fields``. The
#: long rows' tiles (128 query rows a dQ program, 128 keys a dK/dV program) compute 6.4-10.3 score elements a valid pair
#: on 32 sentences padded to 512 (finetune-512, mean 26 tokens); 64 rows and 32 keys a dQ step, 64 keys a dK/dV program
#: on four warps compute 3.2. Compiled on finetune-512 and odd-1000 (4 rows of ~970 tokens, what such tiles cost on long
#: rows; N = 1000 itself keeps the long rows' tiles), the whole backward a valid pair, one kernel changed at a time
#: (spill-free): dQ 64x32 on finetune-512 sm_80 D64 450.4 -> 305.9, D128 410.1 -> 359.9, sm_86 D64 440.1 -> 295.0, D128
#: 393.5 -> 365.9, sm_90 D64 543.4 -> 412.9, D128 431.1 -> 366.3, sm_100 D64 554.0 -> 404.4 (64x64: dearer, or 8-16 B
#: spills); dK/dV 32x64 sm_80 D64 392.2, D128 353.4, sm_86 D64 385.8, D128 337.3, sm_90 D64 410.9, D128 360.0, sm_100
#: D64 432.4, D128 332.0 (16x64 about the same, dearer on long rows; 64x64 spills 8-96 B on the small family and at
#: D128). On odd-1000 the same tiles cost -1% .. +10% (dQ at D128 on sm_80 and sm_86 the most). Both together,
#: finetune-512: D64 -44% .. -49%, D128 -21% .. -34% on every family; with dropout 0.1 at D64 -19% .. -55% (``inspect
#: --workload finetune-512``, spill-free); with the table kernel's entries below, D64 -54% .. -62%, D128 -26% .. -40%.
PADDED_CONFIGS: Dict[tuple, dict] = {
    # The forward (128 query rows a program: 10.3 score elements a valid pair on finetune-512), compiled on
    # finetune-512 and on odd-1000 (what the tiles cost on long rows), the forward a valid pair: 64x32 on four warps
    # at D64 sm_80 197.3 -> 72.6 (odd-1000 17.2 -> 19.8), sm_86 197.3 -> 72.7 (17.2 -> 20.0), sm_90 201.5 -> 73.9
    # (17.7 -> 21.2), sm_100 225.9 -> 76.1 (16.8 -> 20.7), sm_120 201.8 -> 71.0 (17.8 -> 20.6); at D128 sm_90 224.3
    # -> 86.8 (19.7 -> 25.1), sm_100 250.0 -> 85.8 (18.5 -> 24.3); 32x32 on two warps at D128 sm_80 166.5 -> 79.2
    # (23.9 -> 33.2), sm_86 -> 77.6 (23.9 -> 32.8), sm_120 162.7 -> 76.7 (24.4 -> 31.7). (32x32 on two warps at D64:
    # 61-70 but odd-1000 25-31; 64x64: 102-117, spilling 16-32 B at D128 on sm_80 and the small family; 32x64,
    # 64x16: dearer.) On rows of 65..128 tokens the forward is the tiled one too: finetune-128 sm_80 D64 208.2 ->
    # 72.6, sm_90 201.2 -> 73.9, D128 166.5 -> 79.2, 224.3 -> 86.8; pairs 66.3 -> 40.2, 64.7 -> 42.1, 73.2 -> 58.2,
    # 72.0 -> 49.5; odd-77 58.6 -> 43.3, 57.6 -> 45.5, 63.4 -> 58.2, 64.2 -> 53.5 (sm_80, sm_90; D64, D128).
    ("fwd", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("fwd", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("fwd", "sm80", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("fwd", "sm80", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=2),
    ("fwd", "small", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("fwd", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=2),
    # With attention dropout at D64 sm_120's forward on 64x32, two stages, spills 8 B (finetune-512, finetune-128,
    # pairs); one stage does not (the forward a valid pair on finetune-512: 130.7 with dropout 0.1; 74.9 against
    # 71.0 without it, and 21.3 against 20.6 on odd-1000: so only with dropout; 32x32 on two warps 102.6, 64x16 111.6
    # but 25.5 on odd-1000).
    ("fwd", "sm120", "half", 64, "dropout"): dict(num_stages=1),
    ("dq", "sm90", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dq", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dq", "sm80", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dq", "sm80", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dq", "small", "half", 64): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dq", "small", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
    ("dkdv", "sm90", "half", 64): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    ("dkdv", "sm90", "half", 128): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    ("dkdv", "sm80", "half", 64): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    ("dkdv", "sm80", "half", 128): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    ("dkdv", "small", "half", 64): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    ("dkdv", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=64, num_warps=4),
    # The table kernel (after those two; finetune-512, the whole backward): 32x32 on four warps at D64 sm_90 280.4 ->
    # 205.5, sm_80 247.8 -> 207.9, sm_86 240.7 -> 198.7, sm_100 282.9 -> 209.3, sm_120 243.0 -> 202.6 (64x32: 213.9,
    # 240.1, 227.5, 8 B on sm_100, 231.5); at D128 the small family 309.7 -> 272.9 (sm_120 299.2 -> 265.0) and sm_100
    # 261.0 -> 236.3 (64x32 8 B); on sm_90 and sm_80 at D128 32x32 spills, 64x32 gains nothing: their tiles stay.
    ("table", "sm90", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "sm80", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "small", "half", 64): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "small", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "sm100", "half", 128): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    # Calls with T5's relative-position term (entries naming "position" apply after POSITION_CONFIGS' and the others,
    # :func:`padded_overrides`): the tiles above under the term's entries spilled 24 B in the small family's dK/dV
    # and table kernels at D128, 40 B in sm_90's dK/dV at D128 (16x64, three stages), 8 B in sm_100's forward at D64
    # (three stages) and in sm_120's table kernel at D64 (64x32, finetune-128). Swept on finetune-128 and
    # finetune-512 (``--position-buckets 32:128``), the kernel a valid pair: the small family at D128 dK/dV 32x32
    # 142.6 (16x32 163.5, 16x64 217.9), the table kernel 32x16 111.3 (64x32 on eight warps 149.8, 16x32 spills);
    # sm_90 at D128 dK/dV 16x64 on two stages 171.7 (16x32 180.5); sm_100 at D64 the forward on two stages 95.8 (64x16
    # 100.7); sm_120 at D64 the table kernel 32x32 82.1.
    ("dkdv", "small", "half", 128, "position"): dict(BLOCK_M=32, BLOCK_N=32),
    ("table", "small", "half", 128, "position"): dict(BLOCK_M=32, BLOCK_N=16),
    ("dkdv", "sm90", "half", 128, "position"): dict(num_stages=2),
    ("fwd", "sm100", "half", 64, "position"): dict(num_stages=2),
    ("table", "sm120", "half", 64, "position"): dict(BLOCK_M=32),
    # ... and under those, sm_100's dK/dV at D128 on two stages spilled 8 B (three: 166.6), sm_120's table kernel at
    # D128 32x16 16 B (32x32: 101.0); with dropout at D64 sm_100's dK/dV 64x64 (the dropout entry's 64 queries over
    # the padded 64 keys) 8 B: 32x64 (226.0; one stage 345.6).
    ("dkdv", "sm100", "half", 128, "position"): dict(num_stages=3),
    ("table", "sm120", "half", 128, "position"): dict(BLOCK_N=32),
    ("dkdv", "sm100", "half", 64, "position", "dropout"): dict(BLOCK_M=32),
    # With a positional window and dropout sm_100's forward at D64 (64x32, three stages) spilled 8 B at the 128
    # registers it takes (finetune-128, -512): one stage 128.3 a valid pair on finetune-512 (two stages 8 B).
    ("fwd", "sm100", "half", 64, "position_window", "dropout"): dict(num_stages=1),
    # ... and with a distance window and dropout in causal calls (finetune-512, grouped-query too): one stage too.
    ("fwd", "sm100", "half", 64, "window", "dropout"): dict(num_stages=1),
    # ... and sm_90's table kernel at D64 with a distance window and dropout (the dropout entry's 128x32 on eight
    # warps) spilled 16 B on finetune-512: 32x32 on four warps 107.5 a valid pair (227.3 spilling; 64x32 on eight
    # 142.8, 64x64 177.3, 128x16 228.0, 64x32 on four 16 B); sm_100 reads it: 98.5 (its 64x64 137.2).
    ("table", "sm90", "half", 64, "window", "dropout"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    # ... with grouped-query k, v that 32x32 spilled 16 B (finetune-128, -512, odd-77; causal too): 64x16 on four warps
    # 128.7 on finetune-512, 86.3 on odd-77 (128x32 241.8 spilling 8 B and 96.9; 64x32 on eight 150.8 and 95.2, 128x16
    # 259.3 and 110.4); sm_100 111.2 and 74.2 (its 64x64 153.6 and 74.5). And
    # sm_90's dK/dV there (32x64, three stages: 8 B on finetune-128 and -512) on one stage: 126.5 and 83.2 (207.9
    # spilling and 139.3; 32x32 198.5 and 156.1, 16x64 219.4 and 153.2); sm_100 has one stage already.
    ("table", "sm90", "half", 64, "grouped_kv", "window", "dropout"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("dkdv", "sm90", "half", 64, "grouped_kv", "window", "dropout"): dict(num_stages=1),
    # Causal calls with T5's term (a T5 decoder's self-attention on padded batches): the tiles above under the term's
    # and the causal entries spilled 8 B in sm_90's dK/dV at D128 (16x64, two stages; one stage 24 B on pairs and
    # odd-77, three 32-40 B) and table kernel at D128 (64x32 on eight warps, also the family's tile: finetune-128 and
    # -1024), sm_100's dK/dV at D64 (32x64, one stage), the small family's dK/dV at D128 (32x32, two stages) and
    # sm_86's / sm_89's forward at D64 (64x32). Swept on pairs, odd-77 and finetune-128/512/1024 (``--causal
    # --position-buckets 32:128``), the kernel a valid pair on finetune-512 (pairs): sm_90 dK/dV 16x32 181.7 (142.6;
    # 16x32 one stage 189.0, 32x32 187.1, 16x64 on eight warps 265.0), the table kernel 64x16 on four warps 90.9 (64x16
    # on eight 170.7, 64x32 / 32x32 on four 8-32 B), sm_100 back to its 64x32 on four (the 64x16 +5-11% there);
    # sm_100 dK/dV 32x64 on two stages 169.6 (98.4; 16x64 168.1 (102.4), 32x32 168.7, eight warps 196.4); the small
    # family dK/dV one stage (sm_86 pairs' layer 275.8 against 297.4 with 16 queries a block), the forward 64x16
    # (sm_86 100.8 (60.2), sm_120 103.0 against its spill-free 64x32's 111.8; 32x32 on two warps 93.2 (68.0)).
    ("dkdv", "sm90", "half", 128, "causal", "position"): dict(BLOCK_N=32),
    ("table", "sm90", "half", 128, "causal", "position"): dict(BLOCK_N=16, num_warps=4),
    ("table", "sm100", "half", 128, "causal", "position"): dict(BLOCK_N=32),
    ("dkdv", "sm100", "half", 64, "causal", "position"): dict(num_stages=2),
    ("dkdv", "small", "half", 128, "causal", "position"): dict(num_stages=1),
    ("fwd", "small", "half", 64, "causal", "position"): dict(BLOCK_N=16),
    # T5's term with a distance window or a positional window (the live-tile lists): the tiles above under the term's
    # entries spilled 32 B in sm_80's table kernel at D64 (64x32 on four warps), 8 B in the small family's and sm_90's
    # (32x32) and in the small family's at D128 (32x16), 8 B in sm_90's dK/dV at D128 (16x64, two stages); with a
    # positional window also 8 B in sm_80's forward (64x32, two stages) and sm_120's dQ (64x32, one stage) at D64.
    # Swept on finetune-512 (``--position-buckets 32:128 --window 4``, ``--position-window 16``), the kernel a valid
    # pair: the table kernel at D64 64x16 on four warps sm_80 71.1 (32x16 77.2, 32x32 82.1, 64x32 on eight 114.7),
    # sm_86 71.1 (32x16 84.8, 16x32 8 B, 64x32 on eight 114.3), sm_90 69.0 (16x32 71.3, 32x16 86.9, 64x32 on eight
    # 84.7); at D128 on sm_86 64x32 on eight warps 138.0 (the family's tile; 16x16 147.2, 64x16 on eight 179.6, 32x32
    # 32 B, 16x32 8 B), sm_120 keeping its spill-free 32x32 (93.6); sm_90's dK/dV at D128 16x32 on two stages 175.6
    # (one stage 8 B, three 48 B, 32x32 188.7); with a positional window sm_80's forward at D64 32x32 on two warps 92.4
    # (one stage 111.5, 64x16 117.8, 32x32 on four 112.2), sm_120's dQ at D64 64x16 104.3 (32x32 109.1, two stages
    # 112.9, 32x64 138.0). sm_100 and sm_120 keep the spill-free 32x32 table tile at D64 (72.8 and 74.8; sm_100's
    # 64x16 79.0, 8 B with a positional window; sm_120's 32x16 under the term's entry 75.7, 8 B), sm_100 its dK/dV
    # 16x64 at D128 with a distance window (170.5; 16x32 179.1; with a positional window the 16x32 180.5 against 189.7).
    ("table", "sm80", "half", 64, "position", "window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "small", "half", 64, "position", "window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "sm90", "half", 64, "position", "window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "small", "half", 128, "position", "window"): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8),
    ("table", "sm120", "half", 128, "position", "window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("dkdv", "sm90", "half", 128, "position", "window"): dict(BLOCK_N=32),
    ("table", "sm100", "half", 64, "position", "window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "sm120", "half", 64, "position", "window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("dkdv", "sm100", "half", 128, "position", "window"): dict(BLOCK_N=64),
    ("table", "sm80", "half", 64, "position", "position_window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "small", "half", 64, "position", "position_window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "sm90", "half", 64, "position", "position_window"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "small", "half", 128, "position", "position_window"): dict(BLOCK_M=64, BLOCK_N=32, num_warps=8),
    ("table", "sm120", "half", 128, "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("dkdv", "sm90", "half", 128, "position", "position_window"): dict(BLOCK_N=32),
    ("table", "sm100", "half", 64, "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("table", "sm120", "half", 64, "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("fwd", "sm80", "half", 64, "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=2),
    ("dq", "sm120", "half", 64, "position", "position_window"): dict(BLOCK_N=16),
    # ... in causal calls with a distance window (a T5 decoder's): sm_80's forward at D64 spilled 8 B on 64x32 (two
    # stages) and sm_120's dQ on 64x32 (one stage) as with a positional window: the forward 32x32 on two warps 72.5
    # (one stage 105.0), sm_120's dQ 32x32 83.9 (64x16 8 B); with dropout (0.1) sm_80's dK/dV at D64 spilled 32 B on
    # 32x64 (one stage): 32x32 204.8 (16x32 209.0, 16x64 217.6), and with either window sm_120's table kernel 8 B on the
    # dropout entries' 64x32 on eight warps: 64x16 on four 108.7 (32x32 117.1, 64x16 on eight 183.9, 128x16 231.5).
    ("fwd", "sm80", "half", 64, "causal", "position", "window"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=2),
    ("dq", "sm120", "half", 64, "causal", "position", "window"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "sm80", "half", 64, "position", "window", "dropout"): dict(BLOCK_N=32),
    ("table", "sm120", "half", 64, "position", "window", "dropout"): dict(BLOCK_M=64, BLOCK_N=16, num_warps=4),
    ("table", "sm120", "half", 64, "position", "position_window", "dropout"): dict(BLOCK_M=64, BLOCK_N=16,
                                                                                   num_warps=4),
    # Grouped-query k, v (12 query heads on 4 key/value heads: the dK/dV kernel walks its key/value head's group in a
    # loop, GROUPED_KV_CONFIGS' entries over the padded tiles): the padded dK/dV tiles spilled 16-128 B on
    # finetune-512 and -1024 (the small family at D64 32x64 16 B, sm_100 at D64 32x64 on three stages 48 B, sm_80 at
    # D128 32x64 16 B, the small family at D128 32x64 16 B (sm_120 128 B), sm_90 at D128 16x64 on three stages 48 B).
    # Swept on finetune-512 (``--kv-heads 4``), the kernel a valid pair (the family's tiles before): the small family
    # at D64 32x32 80.4 (133.8; 16x64 102.6), sm_100 at D64 one stage 74.3 (518.2; 16x64 317.6), sm_80 at D128 32x32
    # 82.1 (116.1; 16x64 116.1), the small family at D128 32x32 149.0, sm_120 133.8 (296.1, 292.7 spilling 8 B; 16x32
    # 185.7, 158.0), sm_90 at D128 16x32 on one stage 126.6 (323.0; two stages 190.3, three 205.1, 32x32 179.1, 16x64
    # on one 8 B; sm_100 reads it: 116.0 against its 16x64's 115.1); in causal calls the small family at D64 16x64
    # 63.2, sm_120 80.4 (the 32x32 spilled 16 B, sm_120 8 B; 16x32 101.6, 32x16 94.7, 8 B on sm_120).
    ("dkdv", "small", "half", 64, "grouped_kv"): dict(BLOCK_N=32),
    ("dkdv", "sm100", "half", 64, "grouped_kv"): dict(num_stages=1),
    ("dkdv", "sm80", "half", 128, "grouped_kv"): dict(BLOCK_N=32),
    ("dkdv", "small", "half", 128, "grouped_kv"): dict(BLOCK_N=32),
    ("dkdv", "sm90", "half", 128, "grouped_kv"): dict(BLOCK_N=32, num_stages=1),
    ("dkdv", "small", "half", 64, "causal", "grouped_kv"): dict(BLOCK_M=16, BLOCK_N=64),
    # ... and with a distance window (the live-tile lists) the small family's dK/dV at D128 spilled 24 B (sm_120 32
    # B) on 32x32 two stages, sm_120's at D64 8 B on 32x32 one stage. Swept on finetune-512 (``--kv-heads 4 --window
    # 4``), the kernel a valid pair: at D128 32x32 on one stage sm_86 83.2 (sm_120 32 B; 16x32 on one stage 108.1,
    # sm_120 106.7; 16x32 two stages 185.2, 32x16 211.6, 16x64 214.0), at D64 on sm_120 16x64 on one stage 84.1
    # (32x16 83.6, 16x32 8 B, 32x32 on two stages 133.0). In causal calls sm_120's 16x32 at D128 spilled 16 B: 32x32 on
    # one stage 74.0 (16x16 99.0; 32x16 8 B, 16x32 on two stages 8 B).
    ("dkdv", "small", "half", 128, "grouped_kv", "window"): dict(num_stages=1),
    ("dkdv", "sm120", "half", 128, "grouped_kv", "window"): dict(BLOCK_M=16),
    ("dkdv", "sm120", "half", 64, "grouped_kv", "window"): dict(BLOCK_M=16, BLOCK_N=64),
    ("dkdv", "sm120", "half", 128, "causal", "grouped_kv", "window"): dict(BLOCK_M=32),
    # A positional window in grouped-query calls: the small family's dK/dV at D128 spilled 8 B on 32x32 two stages
    # (sm_86; one stage as with a distance window), sm_120's at D64 16 B on 32x32 one stage (16x64 as with a distance
    # window; sm_120 at D128 keeps two stages, spill-free there).
    ("dkdv", "small", "half", 128, "grouped_kv", "position_window"): dict(num_stages=1),
    ("dkdv", "sm120", "half", 128, "grouped_kv", "position_window"): dict(num_stages=2),
    ("dkdv", "sm120", "half", 64, "grouped_kv", "position_window"): dict(BLOCK_M=16, BLOCK_N=64),
    # In a causal grouped-query call (a sliding-window decoder, Mistral's layers): sm_86's dK/dV
    # spilled 24 B at D64 (16x64, one stage) and 8 B at D128 (32x32, two stages). Swept on finetune-512 (``--causal
    # --kv-heads 4 --position-window 16``), the kernel a valid pair on sm_86: 32x32 on one stage D64 74.2 (32x16 89.6,
    # 16x32 97.9), D128 75.9 (16x32 95.3, 32x16 103.9); sm_120 at D128 32x32 on one stage 74.0, at D64 its 16x64 on
    # one stage 85.1 (the 32x32 spilled 16 B there).
    ("dkdv", "small", "half", 64, "causal", "grouped_kv", "position_window"): dict(BLOCK_M=32, BLOCK_N=32,
                                                                                  num_stages=1),
    ("dkdv", "small", "half", 128, "causal", "grouped_kv", "position_window"): dict(num_stages=1),
    ("dkdv", "sm120", "half", 64, "causal", "grouped_kv", "position_window"): dict(BLOCK_M=16, BLOCK_N=64),
    ("dkdv", "sm120", "half", 128, "causal", "grouped_kv", "position_window"): dict(num_stages=1),
    # A narrow positional window on long rows (NARROW_BAND_LIMIT) takes these tiles too: in causal calls sm_100's
    # dK/dV at D64 (32x64, three stages) kept 8 B on the stack on odd-1000 (two stages: on long-4096 and finetune-512);
    # on one stage it does not, 3.9 a valid pair on odd-1000 (4.0 spilling), 96.8 on finetune-512 (98.0; 16x64 105.0).
    ("dkdv", "sm100", "half", 64, "causal", "position_window"): dict(num_stages=1),
}

#: Batches whose plan says their rows are long (:attr:`~syntaxkernels.plan.StructurePlan.short_rows` False: the rows
#: fill the long tiles, as in long trees and padded batches of full rows), over :data:`CONFIGS` (and sm_100's /
#: sm_120's), in calls of more than ``2 * SHORT_ROW_LIMIT`` tokens without causality, grouped-query k, v, a window,
#: T5's term or dropout: ``(kind, family, dtype class, head-dim class) -> fields``. Compiled on the batches of long
#: rows (``inspect --workload packed,packed-512,long-4096,long-8192,odd-1000``: 8 or 16 rows packed into 1024 or 512
#: tokens, one tree of 4071 or 8192 tokens, 4 rows of about 970 padded to 1000), each kernel a valid pair against the
#: family's own tiles, bf16, spill-free (the ranges span the five workloads):
LONG_ROW_CONFIGS: Dict[tuple, dict] = {
    # The forward on wider key steps: sm_80 at D128 128x32 -> 128x64 (-15.0..-17.7%), at D64 128x64 -> 128x128
    # (-4.5..-9.2%); the sm90 family at D64 128x128 on two stages (sm_90 -6.7..-11.9%, sm_100 -3.3..-9.0%, +0.7% on
    # packed-512), sm_100 at D128 128x128 on one stage (-1.0..-7.8%). (128x128 at D128 spills 64 B on sm_90, on one
    # stage too, and on two stages needs 233 KiB of shared memory on sm_100; the small family's wider forward tiles
    # need 100-128 KiB on two stages and spill 16-72 B on one.)
    ("fwd", "sm80", "half", 64): dict(BLOCK_N=128),
    ("fwd", "sm80", "half", 128): dict(BLOCK_N=64),
    ("fwd", "sm90", "half", 64): dict(BLOCK_N=128, num_stages=2),
    ("fwd", "sm100", "half", 128): dict(BLOCK_N=128, num_stages=1),
    # dQ: the sm90 family at D128 128x32 -> 128x64 (sm_90 -13.7..-17.0%, sm_100 -12.9..-17.0%); the small family at
    # D128 128x16 -> 128x32 on one stage (sm_86 -7.3..-8.9%, sm_120 -6.5..-8.1%; two stages need 100 KiB). (sm_80 at
    # D128 128x64 spills 16-24 B; 128x128 at D64 spills 128-208 B on sm_80, the small family and sm_90, and at D128
    # needs 264-297 KiB on two stages; 64x128 on four warps at D128 spills 488 B on sm_90.)
    ("dq", "sm90", "half", 128): dict(BLOCK_N=64),
    ("dq", "small", "half", 128): dict(BLOCK_N=32, num_stages=1),
    # dK/dV: sm_80 at D64 32x128 -> 64x128 (-3.9..-6.0%); sm_100 at D128 64x128 on two stages (-15.9..-18.9%), at
    # D64 128x128 on two stages (-5.7..-10.4%). (At D128 32x128 spills 72-80 B on sm_80 and the small family, and
    # 64x128 64-112 B on sm_90 on one to three stages; 64x64 on four warps 176 B; the small family's 64x128 at D64
    # 8-24 B.)
    ("dkdv", "sm80", "half", 64): dict(BLOCK_M=64),
    ("dkdv", "sm100", "half", 128): dict(BLOCK_M=64, num_stages=2),
    ("dkdv", "sm100", "half", 64): dict(BLOCK_M=128, num_stages=2),
}

# Tests may shrink the tiles (e.g. to 16) to exercise block skipping on small N; None = CONFIGS. Shrunk tiles
# also turn the short-row kernels off (they need a key tile as long as the rows).
_BLOCK_OVERRIDE: Optional[Tuple[int, int]] = None
_SHORT_ROWS = True  # tests may turn the short-row backward off to run the tiled kernels at small N


#: Tiles of the kernels in calls with T5's relative-position term, over :data:`CONFIGS` (those calls also take
#: the table kernel's "table_extra" tiles): ``(kind, family, dtype class, head-dim class) -> fields``, the family's
#: entry first, then "sm100" (sm_100 and newer in the sm90 family) or "sm120" (sm_120 and newer in the small one).
#: Each entry was compiled for its family on the sentences and finetune-512 workloads (``inspect --workload ...
#: --position-buckets 32:128``): the term's gathers, prefix sums and layout conversions take registers and shared
#: memory the plain tiles do not have. Keys may name the call's other variants too (``..., "grouped_kv")``,
#: ``"causal"``): such entries apply only to calls with them, after the plain ones (see :func:`_overrides`).
POSITION_CONFIGS: Dict[tuple, dict] = {
    # sm_90 at D = 64: the dK/dV kernel's three stages spill 8 B with the term's gradient, two do not (the same
    # main-loop instructions); the table kernel's "table_extra" 128x32 with one stage (two: 8 B).
    ("dkdv", "sm90", "half", 64): dict(num_stages=2),
    ("table", "sm90", "half", 64): dict(num_stages=1),
    # sm_90 at D = 64: the one-tile backward spills with the term on the family's tiles (136 B grouped, 88 B
    # not); it takes chunks of 32 there (sm_100 keeps the family's: the entry after it, read from CONFIGS).
    ("short", "sm90", "half", 64): dict(CHUNK=32, OUT_CHUNK=32, DQ_T=False),
    ("short", "sm100", "half", 64): {k: CONFIGS[("short", "sm90", "half", 64)][k] for k in ("CHUNK", "OUT_CHUNK",
                                                                                           "DQ_T")},
    # sm_90 at D = 128: the dK/dV kernel's 32x128 spills 24 B (two or three stages), 16x128 does not; the table
    # kernel's 64x64 spills 40-48 B, 64x32 with one stage does not. (Blackwell takes these too: spill-free there.)
    ("dkdv", "sm90", "half", 128): dict(BLOCK_M=16),
    ("table", "sm90", "half", 128): dict(BLOCK_M=64, BLOCK_N=32, num_stages=1),
    # ... and the forward's 128x64 spills 8 B on odd-1000 (three or two stages; one does not), 128x32 does not and
    # costs less but on odd-1000 (odd-1000 / odd-77 / pairs / finetune-512, the forward a valid pair: 28.2 -> 32.9,
    # 90.3 -> 83.8, 101.0 -> 95.9, 314.6 -> 211.1; sm_100 reads it too, spill-free before and after: 27.1 -> 31.1,
    # 95.1 -> 80.7, 108.3 -> 92.8, 342.9 -> 206.5).
    ("fwd", "sm90", "half", 128): dict(BLOCK_N=32),
    # sm_80: the table kernel's 128x32 spills 8 B at D = 64 (64x32 does not); at D = 128 the dK/dV kernel's 16x128
    # and the table kernel's 64x32 spill 32 B each (64x16 does not; dK/dV 16x64 on four warps spilled 8 B on odd-77,
    # odd-1000 and pairs, 16x32 does not: whole backward 364.8 -> 347.7, 190.1 -> 194.5, 359.5 -> 352.7 a valid
    # pair, finetune-512 1547.9 -> 1492.3; sm_120 the same, its entry below).
    ("table", "sm80", "half", 64): dict(BLOCK_M=64),
    ("dkdv", "sm80", "half", 128): dict(BLOCK_N=32, num_warps=4),
    ("table", "sm80", "half", 128): dict(BLOCK_N=16),
    # The small family: the dK/dV kernel's 128 keys a program spill (sm_86: 72 B at D = 64, 40 B at D = 128); 64
    # keys on four warps do not.
    ("dkdv", "small", "half", 64): dict(BLOCK_N=64, num_warps=4),
    ("dkdv", "small", "half", 128): dict(BLOCK_N=64, num_warps=4),
    # The small family at D = 64: the forward's and dQ's second stage takes 104-120 KiB of shared memory with the
    # term (the family has 99); one stage takes 24 and 44 KiB, the same main-loop instructions.
    ("fwd", "small", "half", 64): dict(num_stages=1),
    ("dq", "small", "half", 64): dict(num_stages=1),
    # sm_100: dQ's three stages spill 8 B at D = 64 on sentences (two do not); sm_120: the table kernel's 128x32
    # spills 8 B there (64x32 does not). sm_100's dK/dV at D = 64 (two stages, the sm_90 entry's) spills 8 B on
    # odd-1000; one stage does not, and costs less on odd-1000, odd-77, pairs and finetune-512 (dK/dV 61.0 -> 59.9,
    # 176.2 -> 172.3, 192.4 -> 188.1, 584.9 -> 567.2 instructions a valid pair).
    ("dq", "sm100", "half", 64): dict(num_stages=2),
    ("dkdv", "sm100", "half", 64): dict(num_stages=1),
    ("table", "sm120", "half", 64): dict(BLOCK_M=64),
    # sm_120 at D = 128: the small family's dK/dV 16x64 spills 8 B on odd-77, odd-1000 and pairs; 16x32 does not
    # (323.3 -> 304.7, 164.4 -> 168.4, 317.9 -> 309.6, finetune-512 1271.5 -> 1220.1 a valid pair).
    ("dkdv", "sm120", "half", 128): dict(BLOCK_N=32),
    # The one-tile short-row backward (rows of at most 64 tokens take the short-row kernels with the term):
    # sm_100 at D = 128 spills 8 B with Blackwell's tiles (whole 64-column chunks); eight warps do not. sm_90 at
    # D = 128 on a single-axis grid spills 8 B on four warps (its grouped launches take eight, GROUPED_CONFIGS):
    # eight there too (sentences, head groups forced to 1: 218.8 -> 298.2 instructions a valid pair; output chunks
    # of 32 408.9, score chunks of 16 16 B, dQ not transposed 48 B).
    ("short", "sm90", "half", 128): dict(num_warps=8),
    ("short", "sm100", "half", 128): dict(num_warps=8),
    # The one-tile short-row forward: sm_120 at D = 128 spills 16 B with the family's tiles (the term's tile is the
    # first product's accumulator); score products over head-dim chunks of 16 do not (eight warps do not either,
    # but compute the exponent twice: 1.6x the instructions).
    ("fwd_short", "sm120", "half", 128): dict(CHUNK=16),
    # The term with the call's other variants (after every plain entry; ``inspect --workload sentences,pairs,odd-77,
    # odd-1000 --position-buckets 32:128`` with ``--kv-heads 4`` or ``--causal``; bytes spilled on odd-77 with the tiles
    # above, then the kernel's instructions a valid pair there before -> after). Grouped-query k, v (the tiled dK/dV
    # kernel's loop over a group's query heads): sm_80 D64 16x128 on eight warps, two stages (8 B) -> 16x64 on four, one
    # stage (238.5 -> 114.4); the small family D64 32x64 (64 B; sm_120 40 B) -> 16x64 (123.3 -> 114.4; sm_120 127.0 ->
    # 114.2); sm_90 D64 two stages (72 B) -> one (230.8 -> 157.9; sm_100 has its one already); the small family D128 two
    # stages (136 B) -> one (257.5 -> 167.2; sm_120, spill-free, 219.2 -> 151.8) and the table kernel 64x32 (16 B;
    # sm_120 8 B) -> 128x16 (103.4 -> 118.0 spill-free; sm_120 99.3 -> 110.3); sm_90 D128 16x128 on three stages (120 B)
    # -> 16x64 on one (268.9 -> 222.9; 16x32 on four warps also spill-free, 245.2), sm_100 keeping its own 16x128
    # (spill-free, 172.8; the sm_90 tiles 189.9); sm_120's grouped one-tile backward at D128 on sentences (8 B) ->
    # output chunks of 32 (265.3 -> 270.6; single-axis launches keep 16, spill-free); its single-axis launches at D64
    # (sentences, head groups forced to 1): sm_90 (16 B) -> keys-major tiles in chunks of 16 (345.3 -> 300.1 the whole
    # backward a valid pair, grouped 387.0 -> 340.1), sm_100 (8 B) -> its own chunks of 64 with dQ transposed (297.7 ->
    # 291.2, grouped 317.3 -> 315.6). Causal: sm_90 D64 dK/dV 64x128 (8 B) -> 32x128 (198.5 -> 151.2; sm_100, spill-free
    # before, 182.1 -> 149.0); sm_120 D128 the table kernel 64x32 (8 B) -> 128x16 (89.2 -> 106.6); on odd-1000 sm_100's
    # forward at D64 128x64 on three stages (96 B) -> 128x32 (25.1 -> 28.4; one stage also spill-free, 25.1, without its
    # loads' overlap) and sm_120's dQ at D64 128x64 (8 B) -> 128x32 (29.7 -> 29.8).
    ("dkdv", "sm80", "half", 64, "grouped_kv"): dict(BLOCK_N=64, num_warps=4, num_stages=1),
    ("dkdv", "small", "half", 64, "grouped_kv"): dict(BLOCK_M=16),
    ("dkdv", "sm90", "half", 64, "grouped_kv"): dict(num_stages=1),
    ("dkdv", "small", "half", 128, "grouped_kv"): dict(num_stages=1),
    ("table", "small", "half", 128, "grouped_kv"): dict(BLOCK_M=128, BLOCK_N=16),
    ("dkdv", "sm90", "half", 128, "grouped_kv"): dict(BLOCK_N=64, num_stages=1),
    ("dkdv", "sm100", "half", 128, "grouped_kv"): dict(BLOCK_N=128),
    ("short", "sm120", "half", 128, "grouped_kv"): dict(GROUPED_CONFIG=dict(OUT_CHUNK=32)),
    ("short", "sm90", "half", 64, "grouped_kv"): dict(KEYS_MAJOR=True, CHUNK=16, OUT_CHUNK=16),
    ("short", "sm100", "half", 64, "grouped_kv"): dict(KEYS_MAJOR=False, CHUNK=64, OUT_CHUNK=64, DQ_T=True),
    ("dkdv", "sm90", "half", 64, "causal"): dict(BLOCK_M=32),
    ("table", "sm120", "half", 128, "causal"): dict(BLOCK_M=128, BLOCK_N=16),
    ("fwd", "sm100", "half", 64, "causal"): dict(BLOCK_N=32),
    ("dq", "sm120", "half", 64, "causal"): dict(BLOCK_N=32),
    # The term with grouped-query k, v in a causal call (``--kv-heads 4 --causal``; bytes spilled on odd-77 with
    # the entries above, then the kernel's instructions a valid pair there before -> after): the small family's table
    # kernel at D64 128x32 (32 B) -> 64x32 (77.8 -> 88.4; 128x16 also spill-free, 93.4); sm_120's dK/dV at D64 16x64
    # (8 B) -> 32x32 (118.1 -> 124.1; 16x32 149.2); the small family's dK/dV at D128 16x64 (16 B) -> 32x32 (167.8 ->
    # 132.2; 16x32 164.2); sm_90's at D128 16x64 on eight warps (16 B) -> 32x32 on four (222.0 -> 164.2; 16x32 188.7,
    # 16x128 24 B, 16x64 on four 80 B); sm_100 keeps its own 16x128 on eight (spill-free).
    ("table", "small", "half", 64, "grouped_kv", "causal"): dict(BLOCK_M=64),
    ("dkdv", "sm120", "half", 64, "grouped_kv", "causal"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "small", "half", 128, "grouped_kv", "causal"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "sm90", "half", 128, "grouped_kv", "causal"): dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
    ("dkdv", "sm100", "half", 128, "grouped_kv", "causal"): dict(BLOCK_M=16, BLOCK_N=128, num_warps=8),
    # The term with a positional window (``--position-window 10``, no dropout; odd-1000 / odd-77, bytes, then the
    # backward a valid pair): the small family's dQ at D64 128x64 (8 B on odd-1000) -> 128x32 (64x64 24 B); its dK/dV
    # at D128 16x64 (16 B on pairs, odd-77, odd-1000, causal or not) -> 32x32 (causal odd-77 289.4; 16x32 310.4);
    # sm_90's dK/dV at D64 64x128 on two stages (8 B on pairs and odd-77, 56 B on odd-1000) -> 32x128 on one (110.9;
    # one stage of 64x128 80 B; sm_100 reads it too: pairs 424.1 -> 382.0, spill-free either way); sm_100's at D128
    # 16x128 on three stages (24 B on odd-1000) -> one (128.5; two 16 B, 16x64 147.6); with grouped-query k, v too,
    # sm_100's dK/dV at D128 16x128 (8 B on odd-1000) -> 16x64 (174.3; 32x32 197.0, four warps 1,256 B).
    ("dq", "small", "half", 64, "position_window"): dict(BLOCK_N=32),
    ("dkdv", "small", "half", 128, "position_window"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "sm90", "half", 64, "position_window"): dict(BLOCK_M=32, num_stages=1),
    ("dkdv", "sm100", "half", 128, "position_window"): dict(num_stages=1),
    ("dkdv", "sm100", "half", 128, "grouped_kv", "position_window"): dict(BLOCK_N=64),
}


#: The tiled dK/dV kernel's tiles with grouped-query k and v (one program walks its key/value head's group of query
#: heads, a loop around the query-block loop), over :data:`CONFIGS`: ``(kind, family, dtype class, head-dim class)
#: -> fields``. Compiled on odd-1000 with 12 query heads on 4 key/value heads, causal (``inspect --workload odd-1000
#: --kv-heads 4 --causal``): the plain tiles spilled 8-64 B there (sm_80 D64 8, D128 24; sm_90 D64 56, D128 64).
GROUPED_KV_CONFIGS: Dict[Tuple[str, str, str, int], dict] = {
    ("dkdv", "sm80", "half", 64): dict(BLOCK_M=16),
    ("dkdv", "sm80", "half", 128): dict(BLOCK_N=64, num_warps=4, num_stages=1),
    ("dkdv", "sm90", "half", 64): dict(BLOCK_M=32),
    ("dkdv", "sm90", "half", 128): dict(BLOCK_M=16),
    # sm_100 (its own tiles spill 168 B at D64 and 376 B at D128 there; the sm90 entries above, then these): one
    # stage at D128.
    ("dkdv", "sm100", "half", 128): dict(BLOCK_M=16, num_stages=1),
    # sm_120, the two-block backward at D128: dQ transposed (the small family's tiles spill 8 B there).
    ("short2", "sm120", "half", 128): dict(DQ_T=True),
    # sm_120, the one-tile backward at D = 128: output products in chunks of 16 (the family's 32 spill 8 B in the
    # grouped loop; sentences bf16, 41.7 -> 40.1 main-loop instructions per element).
    ("short", "sm120", "half", 128): dict(OUT_CHUNK=16),
    # sm_90, the one-tile backward at D = 128 on a single-axis grid: score chunks of 16 (32 spill 8 B; sentences with
    # head groups forced to 1, 173.0 -> 176.5 instructions a valid pair); its grouped launches keep the family's
    # chunks of 32 on eight warps (GROUPED_CONFIGS; 16 there: 325.9 -> 347.9); sm_100 keeps Blackwell's chunks of 64
    # on four warps, grouped or not.
    ("short", "sm90", "half", 128): dict(CHUNK=16, GROUPED_CONFIG=dict(num_warps=8, CHUNK=32)),
    ("short", "sm100", "half", 128): dict(CHUNK=64, GROUPED_CONFIG={}),
}


#: The short-row backward's tiles in causal calls (``launch_configs(..., causal=True)``), over :data:`CONFIGS`:
#: ``(kind, family, dtype class, head-dim class) -> fields`` as :data:`POSITION_CONFIGS` (the family's entry, then
#: "sm100"). Compiled as launched on odd-77 (``inspect --workload odd-77 --causal``, with and without ``--kv-heads
#: 4``): the causal two-block kernel at D = 128 spills in its grouped loop with the family's tiles (sm_90 48 B, 24 B
#: grouped-query; sm_100 8 B grouped-query), not in the single-axis loop. So grouped causal launches take their own
#: tiles (``GROUPED_CONFIG``, as :data:`GROUPED_CONFIGS`; ungrouped ones keep the family's): sm_90 chunks of 32 with
#: dQ not transposed (251 instructions per valid pair, 255 grouped-query; OUT_CHUNK = 64 with them spills 24 B,
#: whole 64-column score chunks 40-96 B, eight warps do not spill at 279-287), sm_100 the family's own tiles (chunks
#: of 32, dQ transposed; since the kernel adds its dQ in the program, pairs bf16: 46.4 / 67.7 main-loop instructions
#: per element, spill-free; the whole 64-column chunks it took before spill 56 B now, with 64 / 32 output chunks
#: 64.7 / 82.0, sm_90's choice 66.7 / 84.1).
CAUSAL_CONFIGS: Dict[Tuple[str, str, str, int], dict] = {
    ("short2", "sm90", "half", 64): dict(CHUNK=32, OUT_CHUNK=32, DQ_T=False,
                                         GROUPED_CONFIG=dict(CHUNK=64, OUT_CHUNK=64, DQ_T=True)),
    ("short2", "sm100", "half", 64): dict(CHUNK=64, OUT_CHUNK=64, DQ_T=True),
    ("short2", "sm90", "half", 128): dict(GROUPED_CONFIG=dict(CHUNK=32, OUT_CHUNK=32, DQ_T=False)),
    ("short2", "sm100", "half", 128): dict(GROUPED_CONFIG=dict(CHUNK=32, OUT_CHUNK=64, DQ_T=True)),
}


#: The kernels' tiles in calls with a positional window (``launch_configs(..., band=W)``: the BAND variant, its
#: boundary tiles masked by ``|i - j| <= W``), over :data:`CONFIGS`: ``(kind, family, dtype class, head-dim class)
#: -> fields`` as :data:`POSITION_CONFIGS`. Compiled as launched on pairs, odd-77 and odd-1000 (``inspect --workload
#: pairs,odd-77,odd-1000 --position-window 10``, no dropout: with dropout, :data:`DROPOUT_CONFIGS`' entries keyed by
#: "position_window"): sm_80's table kernel at D = 128, 64x32 on two stages, spilled 8 B on odd-1000 (1 of the 257
#: kernels); on one stage it does not (38.7 -> 39.9 instructions a valid pair; 64x16 on two stages, also spill-free,
#: 52.9; 128x16 32 B).
BAND_CONFIGS: Dict[tuple, dict] = {
    ("table", "sm80", "half", 128): dict(num_stages=1),
}


#: The kernels' tiles in calls with attention dropout (the ``DROPOUT`` variant: a mask drawn from the seed per score
#: element, in the forward and again in the backward), over :data:`CONFIGS`: ``(kind, family, dtype class, head-dim
#: class) -> fields`` as :data:`POSITION_CONFIGS` (the family's entry, then "sm100" or "sm120"), and entries whose key
#: names the call's other variants too (``..., "causal")``, ``"grouped_kv"``, ``"position"``, ``"position_window"``:
#: see :func:`_overrides`).
#: Compiled as launched with ``inspect --workload sentences,pairs,odd-77,odd-1000,sentences-packed --dropout 0.1``
#: (plain, ``--causal``, ``--kv-heads 4``; one-tile launches also with head groups forced to 1).
DROPOUT_CONFIGS: Dict[tuple, dict] = {
    # The tiled backward (rows over 64 tokens; with dropout also rows of 65..128: the two-block kernels take no mask).
    # Each entry: the family's tiles spilled there with the mask (bytes on pairs / odd-1000), these do not.
    # sm_80 at D = 64: dQ 128x64 (24 / 56 B) -> 128x32, one stage; dK/dV two stages (- / 24 B) -> one; the table
    # kernel 128x32 (40 / 96 B) -> 128x16.
    ("dq", "sm80", "half", 64): dict(BLOCK_N=32, num_stages=1),
    ("dkdv", "sm80", "half", 64): dict(num_stages=1),
    ("table", "sm80", "half", 64): dict(BLOCK_N=16),
    # sm_80 at D = 128: dQ 128x32 (- / 16 B) -> 128x16; dK/dV 16x128 on eight warps (176 / 216 B) -> 16x64 on four,
    # one stage.
    ("dq", "sm80", "half", 128): dict(BLOCK_N=16),
    ("dkdv", "sm80", "half", 128): dict(BLOCK_N=64, num_warps=4, num_stages=1),
    # The small family (sm_86, sm_89; sm_120 reads them too) at D = 64: dQ 128x64 (- / 16 B) -> 128x32, one stage;
    # dK/dV 32x128 on eight warps (- / 8 B) -> 32x64 on four.
    ("dq", "small", "half", 64): dict(BLOCK_N=32, num_stages=1),
    ("dkdv", "small", "half", 64): dict(BLOCK_N=64, num_warps=4),
    # ... at D = 128: dK/dV as sm_80's (192 / 224 B); the table kernel 64x32 (24 / 24 B) -> 64x16 (128x16 spills
    # 8 B on pairs, 32x32 and four warps 56-72 B).
    ("dkdv", "small", "half", 128): dict(BLOCK_N=64, num_warps=4, num_stages=1),
    ("table", "small", "half", 128): dict(BLOCK_N=16),
    # sm_120 at D = 128: the table kernel 128x16 (64x32: 40 / 40 B; 128x16 spill-free there and cheaper than 64x16).
    ("table", "sm120", "half", 128): dict(BLOCK_M=128, BLOCK_N=16),
    # sm_90 at D = 64: the table kernel 128x64 (104 / 208 B) -> 128x32; at D = 128 64x64, two stages (16 / 24 B) ->
    # 128x32, one stage. sm_100: 128x64 (80 / 88 B) -> 64x64 at D = 64, and its own 64x64 (spill-free) at D = 128.
    ("table", "sm90", "half", 64): dict(BLOCK_N=32),
    ("table", "sm90", "half", 128): dict(BLOCK_M=128, BLOCK_N=32, num_stages=1),
    ("table", "sm100", "half", 64): dict(BLOCK_M=64, BLOCK_N=64),
    ("table", "sm100", "half", 128): dict(BLOCK_M=64, BLOCK_N=64),
    # The one-tile backward (rows of at most 64 tokens), grouped launches (sentences: 6 head groups) and single-axis
    # ones (GROUPED_CONFIG: the grouped launches' fields where they differ). sm_90 at D = 64 (32 B grouped, 40 B
    # single-axis) -> output products in chunks of 32, dQ transposed when grouped (the only spill-free tiles found:
    # +34% / +31% instructions a valid pair on sentences; eight warps +60%); sm_100 keeps its own (spill-free).
    ("short", "sm90", "half", 64): dict(OUT_CHUNK=32, GROUPED_CONFIG=dict(DQ_T=True)),
    ("short", "sm100", "half", 64): dict(OUT_CHUNK=64, GROUPED_CONFIG={}),
    # sm_90 at D = 128, grouped on eight warps (24 B) -> score chunks of 16; sm_100 at D = 128 (8 B) -> chunks of
    # 32, grouped or not (its grouped launches keep four warps: the entry replaces the sm_90 one's GROUPED_CONFIG).
    ("short", "sm90", "half", 128): dict(GROUPED_CONFIG=dict(num_warps=8, CHUNK=16)),
    ("short", "sm100", "half", 128): dict(CHUNK=32, GROUPED_CONFIG=dict(CHUNK=32)),
    # Single-axis launches (8 B each with the family's tiles; grouped ones keep them): sm_80 and sm_120 at D = 64
    # score chunks of 16, sm_80 at D = 128 output chunks of 16; sm_86 / sm_89 at D = 128 eight warps (+37%
    # instructions; every four-warp tiling tried spills 8-144 B), sm_120 there its own four (spill-free).
    ("short", "sm80", "half", 64): dict(CHUNK=16, GROUPED_CONFIG=dict(CHUNK=32)),
    ("short", "sm80", "half", 128): dict(OUT_CHUNK=16, GROUPED_CONFIG=dict(OUT_CHUNK=32)),
    ("short", "small", "half", 128): dict(num_warps=8, GROUPED_CONFIG=dict(num_warps=4)),
    ("short", "sm120", "half", 64): dict(CHUNK=16, GROUPED_CONFIG=dict(CHUNK=32)),
    ("short", "sm120", "half", 128): dict(num_warps=4, GROUPED_CONFIG={}),
    # Dropout with other variants of the call (after every plain entry). Causal: the small family's table kernel at
    # D = 64 (128x32: 32 B on odd-77; sm_120 16 B) -> 128x16.
    ("table", "small", "half", 64, "causal"): dict(BLOCK_N=16),
    # A distance window (the live-tile lists): sm_90's table kernel at D = 64 (128x32: 8 B on odd-1000, 16 B on
    # long-4096) -> 128x16 (odd-1000 39.7 a valid pair against 36.0 spilling; 64x32 on eight warps 43.2), sm_100 back
    # to its 64x64 (25.6; 128x16 34.6).
    ("table", "sm90", "half", 64, "window"): dict(BLOCK_N=16),
    ("table", "sm100", "half", 64, "window"): dict(BLOCK_M=64, BLOCK_N=64),
    # sm_80's dK/dV at D = 128 (16x64 on four warps, one stage: 8 B on finetune-128/512/1024 and packed) -> 32x32,
    # cheaper on every workload swept (a valid pair: finetune-512 216.5 -> 170.2, pairs 132.5 -> 126.6, odd-1000 82.4
    # -> 76.7; with grouped-query k, v 187.6 -> 176.3, 147.7 -> 133.0, 104.1 -> 82.5; with T5's term 233.0 -> 240.0,
    # 183.6 -> 178.1, 127.5 -> 107.4). (16x32 169.1 (pairs 133.3), on two stages 169.1; 16x64 on eight warps 360.0.)
    ("dkdv", "sm80", "half", 128, "causal"): dict(BLOCK_M=32, BLOCK_N=32),
    # Grouped-query k, v (4 key/value heads for 12 query heads), over GROUPED_KV_CONFIGS: the dK/dV kernel's loop over
    # a group's query heads (odd-77 / odd-1000): sm_80 D128 16x64 (32 / 32 B) -> 16x32; sm_90 D128 16x128 (56 /
    # 80 B) -> 16x64 (16x32 on four warps also spill-free, more instructions on long rows; every other tiling tried
    # spills 32-216 B); sm_100 D64 32x128 three stages (16 / 24 B) -> one, D128 16x128 (16 B) -> 16x64 on four warps;
    # sm_120 D128 16x64 (16 B) -> 16x32. The table kernel on the small family at D = 64 (16 B; sm_120 8 B) -> 128x16.
    # The one-tile backward: the small family at D = 64 grouped (16 B; sm_120 32 B) -> score chunks of 16; sm_120
    # at D = 128 (48 B grouped, 88 B single-axis) -> output chunks of 32.
    ("dkdv", "sm80", "half", 128, "grouped_kv"): dict(BLOCK_N=32),
    ("dkdv", "sm90", "half", 128, "grouped_kv"): dict(BLOCK_N=64),
    ("dkdv", "sm100", "half", 64, "grouped_kv"): dict(num_stages=1),
    ("dkdv", "sm100", "half", 128, "grouped_kv"): dict(BLOCK_N=64, num_warps=4),
    ("dkdv", "sm120", "half", 128, "grouped_kv"): dict(BLOCK_N=32),
    ("table", "small", "half", 64, "grouped_kv"): dict(BLOCK_N=16),
    ("short", "small", "half", 64, "grouped_kv"): dict(GROUPED_CONFIG=dict(CHUNK=16)),
    ("short", "sm120", "half", 128, "grouped_kv"): dict(OUT_CHUNK=32),
    # sm_90 single-axis launches at D = 64 (8 B): dQ transposed, as the grouped ones (D = 128: GROUPED_KV_CONFIGS'
    # score chunks of 16 serve); sm_100 keeps its own.
    ("short", "sm90", "half", 64, "grouped_kv"): dict(DQ_T=True),
    ("short", "sm100", "half", 64, "grouped_kv"): dict(DQ_T=False),
    # T5's relative-position term (over POSITION_CONFIGS), the tiled kernels and the forward (odd-77 / odd-1000; the
    # one-tile backward: below). sm_80 D64 dK/dV 32x128 (24 / 32 B) -> 32x64 on four warps; D128 dK/dV 16x64 (32 B)
    # -> 16x32 (POSITION_CONFIGS' own since, which the plain dropout entry's 16x64 would override), the forward two
    # stages (32 B) -> one. The small family D64 dK/dV 32x64 (8 B) -> 16x64, the table kernel 128x32 (88 / 96 B) ->
    # 128x16 (sm_120: its own 64x32, spill-free). sm_90 D64 dQ 128x64 (8 / 40 B) -> 128x32, dK/dV 64x128 (24 / 32 B) -> 32x128, the table kernel
    # 128x32 (24 B) -> 64x32; D128 the table kernel 64x32 (24 / 88 B) -> 64x16, dK/dV three stages (8 B) -> two, the
    # forward three (16 B) -> two. sm_100 keeps its own but for dK/dV at D64 64x128 on two stages (POSITION_CONFIGS'
    # one stage spills 16 B with dropout), the forward at D64 128x64 (56 B) -> 128x32 and D128
    # (16 B) -> 128x32, and the table kernel at D128 64x64 (192 / 224 B) -> 64x32. sm_120 D128 dK/dV 16x64 (40 B) ->
    # 16x32 (as POSITION_CONFIGS' own since, over the plain dropout entry).
    ("dkdv", "sm80", "half", 64, "position"): dict(BLOCK_N=64, num_warps=4),
    ("dkdv", "sm80", "half", 128, "position"): dict(BLOCK_N=32),
    ("fwd", "sm80", "half", 128, "position"): dict(num_stages=1),
    ("dkdv", "small", "half", 64, "position"): dict(BLOCK_M=16),
    ("table", "small", "half", 64, "position"): dict(BLOCK_N=16),
    ("table", "sm120", "half", 64, "position"): dict(BLOCK_N=32),
    ("dkdv", "sm120", "half", 128, "position"): dict(BLOCK_N=32),
    ("dq", "sm90", "half", 64, "position"): dict(BLOCK_N=32),
    ("dkdv", "sm90", "half", 64, "position"): dict(BLOCK_M=32),
    ("table", "sm90", "half", 64, "position"): dict(BLOCK_M=64),
    ("table", "sm90", "half", 128, "position"): dict(BLOCK_M=64, BLOCK_N=16),
    ("dkdv", "sm90", "half", 128, "position"): dict(num_stages=2),
    ("fwd", "sm90", "half", 128, "position"): dict(num_stages=2),
    ("dq", "sm100", "half", 64, "position"): dict(BLOCK_N=64),
    ("dkdv", "sm100", "half", 64, "position"): dict(BLOCK_M=64, num_stages=2),
    ("table", "sm100", "half", 64, "position"): dict(BLOCK_M=64, BLOCK_N=64),
    ("fwd", "sm100", "half", 64, "position"): dict(BLOCK_N=32),
    ("table", "sm100", "half", 128, "position"): dict(BLOCK_N=32),
    ("dkdv", "sm100", "half", 128, "position"): dict(num_stages=3),
    ("fwd", "sm100", "half", 128, "position"): dict(BLOCK_N=32, num_stages=3),
    # ... and the one-tile backward with the term (sentences, grouped launches: 6 head groups / single-axis; bytes
    # spilled with the tiles above, then what the entry costs a valid pair against them). sm_90 D64 (144 / 128 B):
    # keys-major tiles in chunks of 16 (597.0 -> 521.5 / 508.9 -> 479.1; queries-major with output chunks of 16
    # spills 32 B grouped, eight warps 706.8); sm_100 D64 (152 / 128 B): keys-major in chunks of 32 (483.5 -> 501.6
    # / 441.0 -> 481.0; eight warps queries-major 518.0 / 477.2). sm_80 D64 (64 / 24 B): output chunks of 16 (600.3
    # -> 600.8 / 555.8 -> 557.9). The small family D64 (32 / 32 B): queries-major on eight warps (592.5 -> 737.4 /
    # 549.5 -> 656.8; every keys-major or four-warp tiling tried spills 8-64 B); sm_120 D64 (152 / 64 B): the same
    # grouped (546.8 -> 641.3), single-axis queries-major in chunks of 16 with dQ transposed (552.9 -> 539.1).
    # sm_90 D128 (8 / 72 B): score chunks of 16, grouped with output chunks of 32 (747.5 -> 913.1 / 647.5 -> 665.4;
    # grouped output chunks of 16 935.9, keys-major 944.0); sm_100 keeps its own (spill-free). The small family
    # D128 grouped (8 B): eight warps as its single-axis launches (742.9 -> 945.2); sm_120 D128 (72 / 56 B): eight
    # warps, score chunks of 32 single-axis (693.7 -> 867.4 / 684.9 -> 727.1). sm_80 D128 (24 / 8 B): grouped output
    # chunks of 16 as its single-axis tiles had (705.4 -> 712.0), single-axis queries-major on eight warps (671.1 ->
    # 923.7; every keys-major tiling tried spills 8-472 B, queries-major on four warps 40-48 B).
    ("short", "sm90", "half", 64, "position"): dict(KEYS_MAJOR=True, CHUNK=16, OUT_CHUNK=16, GROUPED_CONFIG={}),
    ("short", "sm100", "half", 64, "position"): dict(KEYS_MAJOR=True, CHUNK=32, OUT_CHUNK=32, GROUPED_CONFIG={}),
    ("short", "sm80", "half", 64, "position"): dict(OUT_CHUNK=16, GROUPED_CONFIG={}),
    ("short", "small", "half", 64, "position"): dict(KEYS_MAJOR=False, num_warps=8, GROUPED_CONFIG={}),
    ("short", "sm120", "half", 64, "position"): dict(num_warps=4, CHUNK=16, OUT_CHUNK=16, DQ_T=True,
                                                     GROUPED_CONFIG=dict(num_warps=8, OUT_CHUNK=32, DQ_T=False)),
    ("short", "sm90", "half", 128, "position"): dict(CHUNK=16, GROUPED_CONFIG=dict(num_warps=8, CHUNK=16,
                                                                                   OUT_CHUNK=32)),
    ("short", "sm100", "half", 128, "position"): dict(CHUNK=32, GROUPED_CONFIG={}),
    ("short", "small", "half", 128, "position"): dict(GROUPED_CONFIG={}),
    ("short", "sm120", "half", 128, "position"): dict(num_warps=8, CHUNK=32, GROUPED_CONFIG=dict(CHUNK=16)),
    ("short", "sm80", "half", 128, "position"): dict(KEYS_MAJOR=False, num_warps=8, CHUNK=16, OUT_CHUNK=32,
                                                    GROUPED_CONFIG=dict(KEYS_MAJOR=True, num_warps=4, OUT_CHUNK=16)),
    # A positional window (``--position-window 10``; pairs / odd-77 / odd-1000, the tiled kernels): sm_90 D64 dQ
    # 128x64 (- / - / 8 B) -> 128x32 (sm_100 keeps its 64: 128x32 spills 16 B there on odd-1000), D128 the forward's
    # three stages (8 B on odd-1000) -> two (sm_100 reads it too, spill-free); sm_80 D128 the table kernel 64x32
    # (8 B each) -> 64x16 (one stage 32-40 B, 32x32 8-16 B, 128x16 24-56 B, four warps 40-72 B); sm_100 D128 dQ
    # 128x32 (16 / 16 / 40 B) -> 64x32 and dK/dV 32x128 (8 / 8 / - B) -> 32x64 (dQ 128x16 and dK/dV 16x128 also
    # spill-free, dearer on pairs and odd-77; fewer stages spill).
    ("dq", "sm90", "half", 64, "position_window"): dict(BLOCK_N=32),
    ("dq", "sm100", "half", 64, "position_window"): dict(BLOCK_N=64),
    ("fwd", "sm90", "half", 128, "position_window"): dict(num_stages=2),
    ("table", "sm80", "half", 128, "position_window"): dict(BLOCK_N=16, num_stages=2),  # (over BAND_CONFIGS' one)
    # ... with T5's term too (``--dropout 0.1 --position-buckets 32:128 --position-window 10`` on pairs, odd-77,
    # odd-1000: 18 of 357 kernels spilled with the entries above; bytes on odd-77): sm_80's table kernel at D128 64x16
    # on two stages (8 B on pairs and odd-77) -> one; sm_80's dK/dV at D64 32x64 (32 B) -> 16x64; sm_90's forward at
    # D64 128x64 (8 B) -> 128x32 (149.0 -> 120.2 instructions a valid pair); sm_100's dK/dV at D64 64x128 (16 B on
    # odd-1000) -> 32x128; the small family's dK/dV at D128 16x64 (32 B) -> 16x32; sm_100 at D128 dQ 64x32 on three
    # stages (24 B) -> one and dK/dV 16x64 on eight warps (24 B) -> four. The whole backward a valid pair, before ->
    # after on pairs / odd-77 / odd-1000: sm_80 D64 452.9 / 439.5 / 209.2 -> 442.0 / 427.5 / 215.4, the small family
    # D128 526.3 / 524.9 / 278.2 -> 525.0 / 502.5 / 288.4, sm_100 D128 401.3 / 417.0 / 215.2 -> 370.9 / 383.6 / 196.9.
    ("table", "sm80", "half", 128, "position", "position_window"): dict(num_stages=1),
    ("dkdv", "sm80", "half", 64, "position", "position_window"): dict(BLOCK_M=16),
    ("fwd", "sm90", "half", 64, "position", "position_window"): dict(BLOCK_N=32),
    ("dkdv", "sm100", "half", 64, "position", "position_window"): dict(BLOCK_M=32),
    ("dkdv", "small", "half", 128, "position", "position_window"): dict(BLOCK_N=32),
    ("dq", "sm100", "half", 128, "position", "position_window"): dict(num_stages=1),
    ("dkdv", "sm100", "half", 128, "position", "position_window"): dict(num_warps=4),
    ("dq", "sm100", "half", 128, "position_window"): dict(BLOCK_M=64),
    ("dkdv", "sm100", "half", 128, "position_window"): dict(BLOCK_N=64),
    # ... T5's term with grouped-query k, v (``--dropout 0.1 --position-buckets 32:128 --kv-heads 4`` on sentences,
    # pairs, odd-77, odd-1000: 32 of 264 kernels spilled with the entries above; bytes on odd-1000, then the kernel's
    # instructions a valid pair there): the grouped dK/dV loop on sm_100 at D64 64x128 on two stages (1,688 B) ->
    # 32x128 on one (85.6; 16x128 105.2, 32x64 104.5), at D128 16x64 on three (1,016 B) -> 32x32 on one (111.4; one
    # stage of 16x64 64 B, 16x128 on eight warps 96 B, 16x32 172.7); sm_90 at D64 32x128 (104 B) -> 16x128 (98.8;
    # 32x64 8 B), at D128 16x64 on eight warps, two stages (88 B) -> 16x32 on four, one (167.2; 16x64 on one stage
    # 104 B); the small family at D64 16x64 (16 B) -> 32x32 (102.1; 16x32 130.5), at D128 16x64 (40 B on odd-77) ->
    # 16x16 (16x32 8 B, 32x32 24 B) and its table kernel 128x16 (24 B on odd-77) -> 64x16, as sm_120's (8 B); sm_80's
    # grouped one-tile backward at D128 on sentences keys-major (8 B) -> its single-axis tiles (queries-major, eight
    # warps; keys-major in chunks of 16 still 8 B).
    ("dkdv", "sm90", "half", 64, "grouped_kv", "position"): dict(BLOCK_M=16),
    ("dkdv", "sm90", "half", 128, "grouped_kv", "position"): dict(BLOCK_N=32, num_warps=4, num_stages=1),
    ("dkdv", "sm100", "half", 64, "grouped_kv", "position"): dict(BLOCK_M=32, BLOCK_N=128, num_stages=1),
    ("dkdv", "sm100", "half", 128, "grouped_kv", "position"): dict(BLOCK_M=32, BLOCK_N=32, num_stages=1),
    ("dkdv", "small", "half", 64, "grouped_kv", "position"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "small", "half", 128, "grouped_kv", "position"): dict(BLOCK_M=16, BLOCK_N=16),
    ("table", "small", "half", 128, "grouped_kv", "position"): dict(BLOCK_M=64),
    ("short", "sm80", "half", 128, "grouped_kv", "position"): dict(GROUPED_CONFIG={}),
    # ... a positional window with grouped-query k, v (``--dropout 0.1 --position-window 10 --kv-heads 4`` on
    # sentences, pairs, odd-77, odd-1000: 5 of 396 kernels spilled; bytes, then the backward a valid pair): sm_80's
    # table kernel at D64 128x16 on two stages (8 B on pairs and odd-77) -> 64x32 (pairs 375.8 one stage, 374.7 64x16,
    # 363.1); sm_90's at D64 128x32 (8 B on odd-1000) -> 64x32 (151.1; 128x16 152.0); sm_100's dK/dV at D64 32x128 (72 B
    # on pairs and odd-77) -> 32x64 (pairs 323.5; 16x128 348.3, two stages 627.1).
    ("table", "sm80", "half", 64, "grouped_kv", "position_window"): dict(BLOCK_M=64, BLOCK_N=32),
    ("table", "sm90", "half", 64, "grouped_kv", "position_window"): dict(BLOCK_M=64),
    ("dkdv", "sm100", "half", 64, "grouped_kv", "position_window"): dict(BLOCK_N=64),
    # ... grouped-query k, v in a causal call (``--dropout 0.1 --kv-heads 4 --causal`` on sentences, pairs, odd-77,
    # odd-1000: 7 of 264 kernels spilled; bytes, then the backward a valid pair on odd-1000): the small family's dK/dV
    # at D128 16x64 (8 B) -> 32x32 (225.1; 16x32 248.7); sm_90's at D64 32x128 on three stages (16 B on odd-1000) ->
    # one (113.5; two stages 8 B). sm_100 has its one stage already.
    ("dkdv", "small", "half", 128, "causal", "grouped_kv"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "sm90", "half", 64, "causal", "grouped_kv"): dict(num_stages=1),
    # Four variants in one call (``--dropout 0.1 --position-buckets 32:128 --kv-heads 4`` with ``--causal``, with
    # ``--position-window 10``, and with both; sentences, pairs, odd-1000 on sm_80, 86, 90, 100, 120 at D64 and D128;
    # every other four-variant set compiled spill-free): T5's term, grouped-query k, v and dropout in a causal call
    # (4 of 160 kernels spilled; bytes, then the dK/dV kernel a valid pair on pairs / odd-1000): the small family's
    # dK/dV at D128 32x32 (16 B) -> 32x16 (213.3 / 132.3 -> 200.3 / 141.1; 16x16 251.9 / 199.0, 16x32 8 B; sm_120
    # keeps its 32-key blocks, spill-free), sm_100's 32x32 (8 B) -> 32x16 (182.9 / 113.5 -> 196.6 / 138.5; 16x32
    # 244.3 / 172.1, 16x64 128 B, 16x128 on eight warps 56-88 B); with a positional window instead of causal (6 of
    # 160): the small family's dK/dV at D128 16x16 (24 B) -> 32x32 (pairs 609.7 -> 500.8, odd-1000 402.6 -> 281.6 the
    # whole backward a valid pair; 32x16 499.7 / 298.2), sm_100's 32x32 (8 B) -> 32x16 (364.6 / 209.6 -> 381.9 /
    # 237.2; 16x32 432.6 / 272.9), sm_80's table kernel at D64 64x32 (16-56 B) -> 128x16 (412.7 / 208.1 -> 427.1 /
    # 203.0; 64x16 430.8 / 229.5, 32x32 16 B, 64x32 on four warps 64 B); with all five (8 of 234: those and sm_90's
    # dK/dV at D128 32x32, 8 B): the small family and the sm90 family take 32x16 there.
    ("dkdv", "small", "half", 128, "causal", "grouped_kv", "position"): dict(BLOCK_M=32, BLOCK_N=16),
    ("dkdv", "sm100", "half", 128, "causal", "grouped_kv", "position"): dict(BLOCK_M=32, BLOCK_N=16),
    ("dkdv", "small", "half", 128, "grouped_kv", "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=32),
    ("dkdv", "sm100", "half", 128, "grouped_kv", "position", "position_window"): dict(BLOCK_M=32, BLOCK_N=16),
    ("table", "sm80", "half", 64, "grouped_kv", "position", "position_window"): dict(BLOCK_M=128, BLOCK_N=16),
    ("dkdv", "small", "half", 128, "causal", "grouped_kv", "position", "position_window"): dict(BLOCK_M=32,
                                                                                                BLOCK_N=16),
    ("dkdv", "sm90", "half", 128, "causal", "grouped_kv", "position", "position_window"): dict(BLOCK_M=32,
                                                                                               BLOCK_N=16),
}


def _overrides(table: Dict[tuple, dict], dtype: torch.dtype, head_dim: int, family: str, arch: int,
               variants: frozenset = frozenset(), combined: Optional[bool] = None) -> Dict[str, dict]:
    """``kind -> fields`` of an override table (:data:`GROUPED_KV_CONFIGS`, :data:`POSITION_CONFIGS`,
    :data:`BAND_CONFIGS`, :data:`CAUSAL_CONFIGS`, :data:`DROPOUT_CONFIGS`) for this dtype, head dim and GPU: the
    family's entries, then "sm100" (sm_100 and newer in the sm90 family) or "sm120" (sm_120 and newer in the small one).
    A key may name further variants after the head-dim class (``(kind, family, dtype class, head-dim class,
    "causal")``): such an entry applies only to calls with all of them (``variants``: "causal", "grouped_kv"
    (grouped-query k, v), "position" (T5's term), "position_window" (a positional window), "window" (a distance
    window); :data:`PADDED_CONFIGS`: "dropout"), after every plain entry. ``combined``: only the plain entries
    (False) or only those naming variants (True); None: both."""
    cls = "fp32" if dtype == torch.float32 else "half"
    dim_class = 64 if head_block(head_dim) <= 64 else 128
    names = [family] + (["sm100"] if family == "sm90" and arch >= 100 else [])
    names += ["sm120"] if family == "small" and arch >= 120 else []
    found: Dict[str, dict] = {}
    for named in (False, True) if combined is None else (combined,):
        for name in names:
            for (kind, fam, c, d, *more), fields in table.items():
                if (fam, c, d) == (name, cls, dim_class) and bool(more) == named and set(more) <= variants:
                    found[kind] = dict(found.get(kind, {}), **fields)
    return found


def grouped_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`GROUPED_KV_CONFIGS` for this dtype, head dim and GPU."""
    return _overrides(GROUPED_KV_CONFIGS, dtype, head_dim, family, arch)


def position_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int,
                       variants: frozenset = frozenset()) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`POSITION_CONFIGS` for this dtype, head dim and GPU, in a call with these other
    ``variants`` ("causal", "grouped_kv")."""
    return _overrides(POSITION_CONFIGS, dtype, head_dim, family, arch, variants)


def band_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`BAND_CONFIGS` for this dtype, head dim and GPU."""
    return _overrides(BAND_CONFIGS, dtype, head_dim, family, arch)


def causal_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`CAUSAL_CONFIGS` for this dtype, head dim and GPU."""
    return _overrides(CAUSAL_CONFIGS, dtype, head_dim, family, arch)


def padded_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int, dropout: bool = False,
                     variants: frozenset = frozenset(), last: bool = False) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`PADDED_CONFIGS` for this dtype, head dim and GPU: its plain entries (applied
    first), or with ``last`` those naming variants of the call (``variants``: "position"; with ``dropout``
    "dropout"), which apply after every other table's (they refine a variant's own tiles on padded batches). With
    ``dropout`` at head dims up to 64 the forward, dQ and dK/dV entries only (the table kernel keeps the dropout
    entries' tiles: 32x32 on four warps under them spilled 8 B on sm_100), but for the table kernel's entries naming
    "dropout" (applied last), at larger head dims none (the padded tiles and the dropout entries together spilled
    24-104 B)."""
    if dropout and head_block(head_dim) > 64:
        return {}
    named = variants | frozenset({"dropout"} if dropout else ())
    found = _overrides(PADDED_CONFIGS, dtype, head_dim, family, arch, named, combined=last)
    if dropout:
        found.pop("table", None)
        # (but the table kernel's entries naming dropout set its tiles over the dropout entries')
        own = _overrides({key: fields for key, fields in PADDED_CONFIGS.items() if "dropout" in key[4:]}, dtype,
                         head_dim, family, arch, named, combined=True) if last else {}
        found.update({"table": own["table"]} if "table" in own else {})
    return found


def long_row_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`LONG_ROW_CONFIGS` for this dtype, head dim and GPU."""
    return _overrides(LONG_ROW_CONFIGS, dtype, head_dim, family, arch)


def dropout_overrides(dtype: torch.dtype, head_dim: int, family: str, arch: int,
                      variants: frozenset = frozenset()) -> Dict[str, dict]:
    """``kind -> fields`` of :data:`DROPOUT_CONFIGS` for this dtype, head dim and GPU, in a call with these other
    ``variants`` ("causal", "grouped_kv", "position", "position_window")."""
    return _overrides(DROPOUT_CONFIGS, dtype, head_dim, family, arch, variants)


def select_config(kind: str, dtype: torch.dtype, head_dim: int, family: Optional[str] = None,
                  arch: Optional[int] = None) -> dict:
    """The launch configuration of the ``kind`` kernel (a :data:`CONFIGS` kernel: "fwd", "dq", "dkdv", "table",
    "table_extra", "fwd_short", "short", "short2", "short_table", "short2_sum") for ``family`` (default: the current
    GPU's); ``arch`` (default: the current GPU when no family is given) applies
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
    if kind in ("table", "table_extra"):  # split walks unless they spill there (SPLIT_SPILLS)
        config.setdefault("SPLIT", (kind, family, cls, dim_class) not in SPLIT_SPILLS)
    if kind in ("short", "short2"):  # head groups (a second grid axis) unless they spill there (GROUPED_SPILLS)
        config.setdefault("GROUPED", (kind, family, dim_class) not in GROUPED_SPILLS)
        grouped = GROUPED_CONFIGS.get((kind, family, dim_class))
        if arch is not None and arch >= 100 and family == "sm90":  # Blackwell: its own tiles group spill-free
            grouped = BLACKWELL_GROUPED_CONFIGS.get((kind, dim_class))
        if grouped is not None and cls == "half":
            config.setdefault("GROUPED_CONFIG", grouped)
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
    row), or None where :func:`._forward._bias_fwd_kernel` runs. (A two-block form for rows of up to 128 tokens, a
    program per query block with the heads inside and an online softmax over two key blocks, was tried: fewer
    instructions per valid pair on pairs of sentences, more on the odd-77 batch, and more per element than the
    tiled kernel on both.)"""
    if (not _SHORT_ROWS or _BLOCK_OVERRIDE is not None or N > SHORT_ROW_LIMIT or dtype == torch.float32
            or lut_rows != 1):
        return None
    return select_config("fwd_short", dtype, head_dim)
