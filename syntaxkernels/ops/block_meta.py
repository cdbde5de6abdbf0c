"""Per (query block, key block) metadata built on the device, and compacted lists of live key blocks.

A fused attention kernel tiles the ``[N, N]`` pair space into ``block_m x block_n`` tiles. For windowed or
masked attention most tiles hold no allowed pair; this module finds the live ones without leaving the
device (no host sync) so kernels walk only those:

1. :func:`block_distance_range` (one Triton kernel, one read of the uint8 distance): the smallest and the
   largest distance among the valid pairs of every tile, ``uint8 [B, nQ, nK]`` each. A tile with no valid
   pair (padding only) gets ``min = 255, max = 0``.
2. :func:`live_blocks`: bool ``[B, nQ, nK]`` from those ranges, ``lengths``, an optional window
   (``min <= window``) and causality (the key block starts at or before the query block's last row).
3. :func:`compact_rows`: for every row of a boolean ``[B, R, C]`` matrix, the indices of its True columns
   first, ascending (``int32 [B, R, C]``), and their count (``int32 [B, R]``). Applied to ``live`` it gives
   each query block's key blocks; applied to ``live.transpose(1, 2)``, each key block's query blocks.

Cost: building reads the ``B x N x N`` bytes of distance once (no head dimension); a kernel walking the
lists then costs O(live tiles), i.e. O(tree edges x window) for a windowed pass.

Any kernel can reuse this: the sub-network kernel, for instance, can mark a tile live for mask ``parent_d``
only where ``min <= d <= max``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._primitives import launch, launch_grid, launches_on, load_distance_tile

__all__ = ["block_distance_range", "block_bucket_masks", "block_bucket_masks_torch", "live_blocks", "compact_rows",
           "boundary_tiles", "split_lists"]


@triton.jit
def _tile_ids(LENGTHS, N, num_q_blocks, num_k_blocks):
    """The tile of this program (a 1-D grid of ``nK * nQ * B`` programs, :func:`_tile_grid`): ``(b, q_block,
    k_block, length, out)``, ``out`` its index in a contiguous ``[B, nQ, nK]`` output."""
    pid = tl.program_id(0).to(tl.uint32)  # (unsigned: a division by a runtime value costs about half)
    num_k = tl.cast(num_k_blocks, tl.uint32)
    rest = pid // num_k
    k_block = (pid - rest * num_k).to(tl.int32)
    b = rest // tl.cast(num_q_blocks, tl.uint32)
    q_block = (rest - b * tl.cast(num_q_blocks, tl.uint32)).to(tl.int32)
    b = b.to(tl.int64)
    length = tl.minimum(tl.load(LENGTHS + b), N)
    return b, q_block, k_block, length, pid.to(tl.int64)


@triton.jit
def _tile(DIST, b, q_block, k_block, length, stride_db, stride_di, stride_dj, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """``(offs_m, offs_n, distance, valid)`` of a tile from :func:`_tile_ids`: the uint8 distance tile and the
    pairs inside the item's length. The kernels call it only for tiles that start inside the length (the others,
    padding only on a padded batch, store their empty value at once)."""
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    distance = load_distance_tile(DIST + b * stride_db, offs_m, offs_n, stride_di, stride_dj, length)
    valid = (offs_m[:, None] < length) & (offs_n[None, :] < length)
    return offs_m, offs_n, distance, valid


@triton.jit
def _block_distance_range_kernel(DIST, LENGTHS, MIN_OUT, MAX_OUT,
                                 stride_db, stride_di, stride_dj,
                                 N, num_q_blocks, num_k_blocks,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Smallest and largest distance over the valid pairs of one tile.

    Args:
        DIST: uint8 ``[B, N, N]`` (strided); LENGTHS: int32 ``[B]``.
        MIN_OUT, MAX_OUT: uint8 ``[B, nQ, nK]`` contiguous.
    Grid: :func:`_tile_grid`; one program owns one ``BLOCK_M x BLOCK_N`` tile of one batch item (a tile that starts
    past the length stores its empty value and ends: on a padded batch most do).
    """
    b, q_block, k_block, length, out = _tile_ids(LENGTHS, N, num_q_blocks, num_k_blocks)
    if (q_block * BLOCK_M < length) & (k_block * BLOCK_N < length):
        offs_m, offs_n, distance, valid = _tile(DIST, b, q_block, k_block, length, stride_db, stride_di, stride_dj,
                                                BLOCK_M, BLOCK_N)
        smallest = tl.min(tl.min(tl.where(valid, distance, 255), axis=1), axis=0)
        largest = tl.max(tl.max(tl.where(valid, distance, 0), axis=1), axis=0)
        tl.store(MIN_OUT + out, smallest.to(tl.uint8))
        tl.store(MAX_OUT + out, largest.to(tl.uint8))
    else:  # a tile of padding only
        tl.store(MIN_OUT + out, tl.full([], 255, tl.uint8))
        tl.store(MAX_OUT + out, tl.full([], 0, tl.uint8))


def _tile_warps(block_m: int, block_n: int) -> int:
    """Warps of a block-metadata program: one per 1024 pairs of its tile, one to four. On a padded batch most
    programs hold padding only and exit at once; a 32 x 32 tile on one warp keeps each such program one warp."""
    return max(1, min(4, block_m * block_n // 1024))


def _tile_grid(num_q: int, num_k: int, B: int):
    """One grid axis of ``nK * nQ * B`` programs (CUDA caps the second and third axes at 65,535, which a batch of
    more sequences would pass); :func:`_tile` decodes it."""
    return launch_grid(num_q * num_k, B, 1)


def block_distance_range(distance: torch.Tensor, lengths: torch.Tensor, block_m: int,
                         block_n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(min, max)`` distance over the valid pairs of every tile, each ``uint8 [B, nQ, nK]``.

    Args:
        distance: ``uint8 [B, N, N]`` (any strides), on the device the kernels run on.
        lengths: ``int32 [B]`` valid tokens per item (pass ``N`` for unpadded items).
        block_m, block_n: tile sizes (powers of two >= 16).
    Tiles with no valid pair get ``min = 255``, ``max = 0``.
    """
    B, N, _ = distance.shape
    num_q = triton.cdiv(N, block_m)
    num_k = triton.cdiv(N, block_n)
    if not launches_on(distance):
        return _block_distance_range_torch(distance, lengths, block_m, block_n)
    smallest = torch.empty(B, num_q, num_k, dtype=torch.uint8, device=distance.device)
    largest = torch.empty(B, num_q, num_k, dtype=torch.uint8, device=distance.device)
    if B * num_q * num_k:
        launch(_block_distance_range_kernel, _tile_grid(num_q, num_k, B), distance, lengths, smallest, largest,
               distance.stride(0), distance.stride(1), distance.stride(2), N, num_q, num_k,
               BLOCK_M=block_m, BLOCK_N=block_n, num_warps=_tile_warps(block_m, block_n))
    return smallest, largest


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _block_bucket_mask_kernel(DIST, LENGTHS, BUCKET_LUT, MASK_OUT,
                              stride_db, stride_di, stride_dj,
                              N, num_q_blocks, num_k_blocks, window,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
                              CAUSAL: tl.constexpr):
    """Bit t set when some allowed pair of the tile is in bucket t (t < 32).

    Args:
        DIST: uint8 ``[B, N, N]`` (strided); LENGTHS: int32 ``[B]``; BUCKET_LUT: int32 ``[256]``
            (``BucketSpec.lut()``); MASK_OUT: int32 ``[B, nQ, nK]`` contiguous.
    Grid: :func:`_tile_grid`; one program owns one ``BLOCK_M x BLOCK_N`` tile of one batch item (a tile that starts
    past the length stores its empty value and ends: on a padded batch most do).
    """
    b, q_block, k_block, length, out = _tile_ids(LENGTHS, N, num_q_blocks, num_k_blocks)
    live = (q_block * BLOCK_M < length) & (k_block * BLOCK_N < length)
    if CAUSAL:  # (a tile wholly above the diagonal holds no allowed pair)
        live = live & (k_block * BLOCK_N <= q_block * BLOCK_M + BLOCK_M - 1)
    if live:
        offs_m, offs_n, distance, allowed = _tile(DIST, b, q_block, k_block, length, stride_db, stride_di,
                                                  stride_dj, BLOCK_M, BLOCK_N)
        if HAS_WINDOW:
            allowed = allowed & (distance <= window)
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        bits = tl.where(allowed, 1 << tl.load(BUCKET_LUT + distance), 0)
        present = tl.reduce(tl.reduce(bits, 1, _or), 0, _or)
        tl.store(MASK_OUT + out, present)
    else:  # a tile of padding only (or above the diagonal): no bucket
        tl.store(MASK_OUT + out, tl.full([], 0, tl.int32))


def block_bucket_masks(distance: torch.Tensor, lengths: torch.Tensor, bucket_lut: torch.Tensor, block_m: int,
                       block_n: int, window: Optional[int] = None, causal: bool = False) -> torch.Tensor:
    """int32 ``[B, nQ, nK]``: the set of buckets (a bit mask) of each tile's allowed pairs.

    Allowed: both tokens inside the length, within ``window`` when given, ``j <= i`` when ``causal``. Needs
    ``bucket_lut`` (``BucketSpec.lut()``, int, on distance's device) to map every distance to a bucket below
    32. One read of the uint8 distance on the device, no host synchronisation.
    """
    B, N, _ = distance.shape
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    if not launches_on(distance):
        return block_bucket_masks_torch(distance, lengths, bucket_lut, block_m, block_n, window, causal)
    out = torch.empty(B, num_q, num_k, dtype=torch.int32, device=distance.device)
    if B * num_q * num_k:
        launch(_block_bucket_mask_kernel, _tile_grid(num_q, num_k, B), distance, lengths, bucket_lut.to(torch.int32), out,
               distance.stride(0), distance.stride(1), distance.stride(2), N, num_q, num_k,
               0 if window is None else window, BLOCK_M=block_m, BLOCK_N=block_n, HAS_WINDOW=window is not None,
               CAUSAL=causal, num_warps=_tile_warps(block_m, block_n))
    return out


def block_bucket_masks_torch(distance, lengths, bucket_lut, block_m, block_n, window=None, causal=False):
    """:func:`block_bucket_masks` in PyTorch (any device, no Triton): CPU tensors outside the Triton interpreter,
    and the inspection report's tile statistics."""
    B, N, _ = distance.shape
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    position = torch.arange(N, device=distance.device)
    valid = position[None, :] < lengths.to(torch.int64)[:, None]
    allowed = valid[:, :, None] & valid[:, None, :]
    if window is not None:
        allowed = allowed & (distance.to(torch.int32) <= window)
    if causal:
        allowed = allowed & (position[None, :] <= position[:, None])[None]
    bits = torch.zeros(B, num_q * block_m, num_k * block_n, dtype=torch.int64, device=distance.device)
    bits[:, :N, :N] = torch.where(allowed, 1 << bucket_lut.to(torch.int64)[distance.long()], 0)
    bits = bits.view(B, num_q, block_m, num_k, block_n)
    present = torch.zeros(B, num_q, num_k, dtype=torch.int64, device=distance.device)
    for t in range(int(bucket_lut.max()) + 1):
        present |= ((bits & (1 << t)) != 0).any(dim=4).any(dim=2).to(torch.int64) << t
    return present.to(torch.int32)


def _block_distance_range_torch(distance: torch.Tensor, lengths: torch.Tensor, block_m: int,
                                block_n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`block_distance_range` in PyTorch, for CPU tensors outside the Triton interpreter (the
    inspection report's tile statistics)."""
    B, N, _ = distance.shape
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    position = torch.arange(N, device=distance.device)
    valid = position[None, :] < lengths.to(torch.int64)[:, None]
    pair = valid[:, :, None] & valid[:, None, :]
    d = distance.to(torch.int16)
    smallest = torch.full((B, num_q * block_m, num_k * block_n), 255, dtype=torch.int16, device=distance.device)
    largest = torch.zeros_like(smallest)
    smallest[:, :N, :N] = torch.where(pair, d, torch.full_like(d, 255))
    largest[:, :N, :N] = torch.where(pair, d, torch.zeros_like(d))
    smallest = smallest.view(B, num_q, block_m, num_k, block_n).amin(dim=(2, 4))
    largest = largest.view(B, num_q, block_m, num_k, block_n).amax(dim=(2, 4))
    return smallest.to(torch.uint8), largest.to(torch.uint8)


def live_blocks(min_distance: torch.Tensor, lengths: torch.Tensor, block_m: int, block_n: int,
                window: Optional[int] = None, causal: bool = False, band: Optional[int] = None) -> torch.Tensor:
    """bool ``[B, nQ, nK]``: the tile may hold an allowed pair.

    A tile is live when both its query and key blocks start inside the sequence, its smallest distance is
    ``<= window`` (when given), for causal attention its first key is ``<=`` its last query, and with a
    positional window ``band`` some pair of it has ``|i - j| <= band``.
    """
    B, num_q, num_k = min_distance.shape
    device = min_distance.device
    q_start = torch.arange(num_q, device=device) * block_m
    k_start = torch.arange(num_k, device=device) * block_n
    lengths = lengths.to(torch.int64)
    live = (q_start[None, :, None] < lengths[:, None, None]) & (k_start[None, None, :] < lengths[:, None, None])
    if window is not None:
        live = live & (min_distance.to(torch.int32) <= window)
    if causal:
        live = live & (k_start[None, None, :] <= q_start[None, :, None] + block_m - 1)
    if band is not None:
        near = ((k_start[None, :] <= q_start[:, None] + block_m - 1 + band)
                & (k_start[None, :] + block_n - 1 >= q_start[:, None] - band))
        live = live & near[None]
    return live


def compact_rows(mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indices of the True columns of every row, first and ascending, and their count.

    Args:
        mask: bool ``[B, R, C]``.
    Returns:
        ``indices int32 [B, R, C]`` (entries past the count are 0) and ``counts int32 [B, R]``.
    Equivalent PyTorch (per row): ``mask[b, r].nonzero().flatten()`` padded to C. Runs on the device
    without a host sync (one sort).
    """
    C = mask.shape[-1]
    column = torch.arange(C, device=mask.device, dtype=torch.int32)
    key = torch.where(mask, column, column + C)
    ordered = torch.sort(key, dim=-1).values
    indices = torch.where(ordered < C, ordered, torch.zeros_like(ordered)).to(torch.int32)
    counts = mask.sum(dim=-1, dtype=torch.int32)
    return indices.contiguous(), counts.contiguous()


def boundary_tiles(lengths: torch.Tensor, num_q: int, num_k: int, block_m: int, block_n: int, causal: bool,
                   by_key: bool, band: Optional[int] = None) -> torch.Tensor:
    """bool ``[B, nQ, nK]``: the tiles a kernel must run through its masked path.

    A kernel whose programs own query blocks and walk key blocks (the forward, dQ) needs masks where the key
    block runs past the sequence length (``by_key``); one whose programs own key blocks and walk query blocks
    (dK/dV) needs them where the query block does. Causal attention also masks the tiles that cross the
    diagonal (some key after some query), and a positional window ``band`` the tiles holding a pair with
    ``|i - j| > band``. Every other tile is interior: all its pairs are allowed by the length, causality and the
    positional window, so it is computed without a mask.
    """
    device = lengths.device
    q_start = torch.arange(num_q, device=device) * block_m
    k_start = torch.arange(num_k, device=device) * block_n
    lengths = lengths.to(torch.int64)[:, None, None]
    if by_key:
        boundary = (k_start[None, None, :] + block_n) > lengths
    else:
        boundary = (q_start[None, :, None] + block_m) > lengths
    boundary = boundary.expand(lengths.shape[0], num_q, num_k)
    if causal:
        boundary = boundary | ((k_start[None, None, :] + block_n - 1) > q_start[None, :, None])
    if band is not None:
        far = (((q_start[:, None] + block_m - 1) - k_start[None, :] > band)
               | ((k_start[None, :] + block_n - 1) - q_start[:, None] > band))
        boundary = boundary | far[None]
    return boundary


def split_lists(live: torch.Tensor, boundary: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``live [B, R, C]``: its live columns, interior ones first, then the boundary ones.

    Returns ``indices int32 [B, R, C]`` (ascending within each part; entries past the count are 0) and
    ``counts int32 [B, R, 2]``: the number of interior columns and the number of live columns. A kernel walks
    ``indices[:counts[0]]`` unmasked and ``indices[counts[0]:counts[1]]`` masked. One sort on the device, no
    host synchronisation.
    """
    C = live.shape[-1]
    column = torch.arange(C, device=live.device, dtype=torch.int32)
    key = column + C * boundary.to(torch.int32) + 2 * C * (~live).to(torch.int32)
    ordered = torch.sort(key, dim=-1).values
    indices = torch.where(ordered < 2 * C, ordered % C, torch.zeros_like(ordered)).to(torch.int32)
    interior = (live & ~boundary).sum(dim=-1, dtype=torch.int32)
    total = live.sum(dim=-1, dtype=torch.int32)
    return indices.contiguous(), torch.stack([interior, total], dim=-1).contiguous()
