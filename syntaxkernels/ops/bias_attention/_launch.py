"""The launchers of the distance-bias op: the ``torch.library`` Triton ops ``syntaxkernels::bias_attention_fwd`` and
``syntaxkernels::bias_attention_bwd`` and the host work around the kernels.

Per call: the tiles of :func:`.configs.select_config`, the live-tile lists of a windowed call and the table
kernel's per-tile bucket sets (:mod:`..block_meta`, built on the device once per batch: :func:`per_batch`), the
row buffers of the log2-sum-exp and delta, and the launches of :mod:`._forward`'s and :mod:`._backward`'s kernels
(the short-row ones for rows of at most 128 tokens: :func:`_short_backward`). No host synchronisation.
"""
from typing import Optional, Tuple

import torch
import triton

from ...specs import BucketSpec
from ...trees.batch import aligned_distance
from .._primitives import (LOG2E, arch_family, current_arch, dot_precision, head_block, interpreting, launch,
                           launch_grid, per_batch)
from ..block_meta import block_bucket_masks, block_distance_range, boundary_tiles, live_blocks, split_lists
from ._backward import (_bias_bwd_dkdv_kernel, _bias_bwd_dq_kernel, _bias_bwd_short2_kernel,
                        _bias_bwd_short2_sum_kernel, _bias_bwd_short_kernel, _bias_bwd_short_t_kernel,
                        _bias_bwd_short_table_kernel, _bias_bwd_table_kernel)
from ._forward import _bias_fwd_kernel, _bias_fwd_short_kernel
from ._host import _bucket_lut, _spec
from .configs import STATIC_BUCKET_LIMIT, _short_config, _short_forward_config, select_config

__all__ = ["bias_attention_forward", "bias_attention_backward"]


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
    return dq, dk, dv, _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 1,
                                             select_config("short_table", q.dtype, max(D, DV)))


def _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, blocks, table_config):
    """The table gradient of the short-row kernels' dS tiles (:func:`_bias_bwd_short_table_kernel`, launched with
    ``table_config``'s warps and stages): fp32 ``[1, T]``, the per-tile bucket sums added in a fixed order."""
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
           num_warps=table_config["num_warps"], num_stages=table_config["num_stages"])
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
    sum_config = select_config("short2_sum", q.dtype, max(D, DV))
    launch(_bias_bwd_short2_sum_kernel, (B * H,),
           lengths, dq_part, dk_part, dv_part, dq, dk, dv, *dq.stride(), *dk.stride(), *dv.stride(),
           B, _padded(N), N, D, DV, H, BLOCK_M=block, BLOCK_D=block_d, BLOCK_DV=block_dv, DQ_T=dq_t,
           CAUSAL=causal, num_warps=sum_config["num_warps"], num_stages=sum_config["num_stages"])
    if not table_grad:
        return dq, dk, dv, torch.zeros((1, T), **f32)
    return dq, dk, dv, _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 2,
                                             select_config("short_table", q.dtype, max(D, DV)))
