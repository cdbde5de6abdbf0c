"""The launchers of the distance-bias op: the ``torch.library`` Triton ops ``syntaxkernels::bias_attention_fwd`` and
``syntaxkernels::bias_attention_bwd`` (what ``torch.compile`` traces; eager calls run the same functions directly,
:mod:`._autograd`) and the host work around the kernels.

Per call: the tiles of :func:`.configs.select_config` (:func:`launch_configs`: resolved once per shape class), the
row buffers of the log2-sum-exp and delta, and the launches of :mod:`._forward`'s and :mod:`._backward`'s kernels
(the short-row ones for rows of at most 128 tokens: :func:`_short_backward`). What the kernels read about the
batch's structure beyond the distance and lengths (the live-tile lists of a windowed call, the table kernel's
per-tile bucket sets, the transposed copy of a directed distance) is derived from the batch's
:class:`~syntaxkernels.plan.StructurePlan` once for every layer (:func:`forward_metadata`,
:func:`backward_metadata`) and passed in as tensors: nothing is looked up behind the caller's back. No host
synchronisation.
"""
from typing import NamedTuple, Optional, Tuple

import torch
import triton

from ...plan import register_derivation
from ...specs import BucketSpec
from .._primitives import (LOG2E, arch_family, current_arch, dot_precision, dropout_arguments, head_block, interpreting, launch,
                           launch_grid, multiprocessors)
from .. import _replay
from ..block_meta import block_bucket_masks, block_distance_range, boundary_tiles, live_blocks, split_lists
from ._backward import (_bias_bwd_dkdv_kernel, _bias_bwd_dq_kernel, _bias_bwd_short2_keys_kernel,
                        _bias_bwd_short2_kernel, _bias_bwd_short2_sum_kernel, _bias_bwd_short_kernel,
                        _bias_bwd_short_t_kernel, _bias_bwd_short_table_kernel, _bias_bwd_table_kernel,
                        _bias_table_grad_kernel)
from ._forward import _bias_fwd_kernel, _bias_fwd_short_kernel
from ._host import _bucket_lut, _spec, output_like
from . import configs as _configs
from .configs import STATIC_BUCKET_LIMIT, _short_config, _short_forward_config, select_config

__all__ = ["bias_attention_forward", "bias_attention_backward", "launch_configs", "forward_metadata",
           "backward_metadata", "head_groups", "table_splits"]


class LaunchConfigs(NamedTuple):
    """The kernels and tiles one call runs, resolved once per shape class (:func:`launch_configs`)."""

    fwd_short: Optional[dict]  # the short-row forward, or None (the tiled one: ``fwd``)
    fwd: dict
    short: Optional[dict]  # the short-row backward (one tile or two blocks), or None (the tiled kernels below)
    dq: dict
    dkdv: dict
    table: dict  # the tiled table-gradient kernel ("table", or "table_extra" with a window, log buckets, T > 31)


#: Programs per multiprocessor the short-row grids aim for: two, so that one program's loads overlap another's
#: products (the short-row kernels use at most half a multiprocessor's registers or shared memory).
PROGRAMS_PER_MULTIPROCESSOR = 2


def head_groups(programs: int, H: int, device) -> int:
    """How many groups the short-row kernels split the ``H`` heads into (their ``HEAD_GROUPS``: group g takes heads
    g, g + groups, ...; a program per group) when ``programs`` programs (batch items, or items times query blocks)
    share them: the fewest, so that each group's programs re-read the distance tile and gather its bias as few
    times as possible, with which the ``programs * groups`` programs still give every multiprocessor of
    ``device``'s GPU :data:`PROGRAMS_PER_MULTIPROCESSOR` programs, and every group the same number of heads or one
    fewer. B = 32 sentences and 12 heads on 132 multiprocessors: 6 groups of 2 heads, 192 programs (were 32, all 12
    heads each). The results do not depend on the grouping (each head's work is the same; tested bit-identical)."""
    target = PROGRAMS_PER_MULTIPROCESSOR * multiprocessors(device)
    groups = min(H, max(1, -(-target // max(programs, 1))))
    per_group = -(-H // groups)
    return -(-H // per_group)


#: The fewest key blocks one table-gradient program walks when a query block's walk is split (each split pays
#: the program's prologue and one more row of partial sums).
MIN_KEY_BLOCKS_PER_SPLIT = 4


def table_splits(programs: int, num_k_blocks: int, device) -> int:
    """How many programs share one query block's walk in the table-gradient kernel (its ``SPLITS``): enough that
    the ``programs`` (query blocks x batch x head groups) give every multiprocessor
    :data:`PROGRAMS_PER_MULTIPROCESSOR` programs, each walking at least :data:`MIN_KEY_BLOCKS_PER_SPLIT` of the
    ``num_k_blocks`` key blocks. One 8192-token tree, 128-row blocks on 132 multiprocessors: 64 query blocks,
    split in 5 (320 programs); 32 rows padded to 512 (4 query blocks each): split in 2."""
    target = PROGRAMS_PER_MULTIPROCESSOR * multiprocessors(device)
    wanted = -(-target // max(programs, 1))
    return max(1, min(wanted, num_k_blocks // MIN_KEY_BLOCKS_PER_SPLIT))


_CONFIGS = {}


def launch_configs(N: int, D: int, DV: int, dtype: torch.dtype, lut_rows: int, window: int,
                   spec: BucketSpec, position: bool = False, grouped: bool = False,
                   scale: float = 1.0, causal: bool = False, dropout: bool = False,
                   band: int = -1, short_rows: int = -1) -> LaunchConfigs:
    """Which kernels (and tiles) a call of ``N`` tokens, head dims ``D``/``DV``, ``dtype``, a LUT of ``lut_rows`` rows
    (1: a table shared by the heads) runs on the current GPU; remembered per shape class (these arguments, the GPU and
    the tests' tile overrides). ``position``: a call with T5's relative-position term: the one-tile short-row kernels
    on rows of at most :data:`.configs.SHORT_ROW_LIMIT` tokens (they take the term), else the tiled kernels (also on
    rows of 65..128 tokens: the two-block kernels take no term), the table kernel's "table_extra" tiles and
    :data:`.configs.POSITION_CONFIGS` (the term's registers; entries for the term in causal or grouped-query calls
    too). ``grouped``: grouped-query k and v (fewer key/value heads than query heads): the tiled dK/dV kernel's
    :data:`.configs.GROUPED_KV_CONFIGS` (its loop over the group's query heads). ``scale``: the score scale; below
    1e-30 in magnitude (0: a call that ignores q k^T) the tiled kernels run, as the short-row ones divide by it (their
    bucket sums and the term in their first product carry it). ``causal``: a causal call: the short-row backward's
    :data:`.configs.CAUSAL_CONFIGS` (kind "short" or "short2", whichever ``short`` holds). ``dropout``: a call with
    attention dropout (the kernels' ``DROPOUT`` variant): :data:`.configs.DROPOUT_CONFIGS` (the mask's registers;
    entries for dropout with the other variants of the call too), after the others. ``band``: the positional window's
    ``W`` (``|i - j| <= W``; -1: none): :data:`.configs.BAND_CONFIGS`, and the dropout entries keyed by it
    (``"position_window"``). ``short_rows``: the plan's :attr:`~syntaxkernels.plan.StructurePlan.short_rows` (1: the
    batch's rows are short against the long tiles, 0: they are not, -1: not known). A padded batch of short rows
    (``N > SHORT_ROW_LIMIT`` and ``short_rows`` 1, or not known and ``N <=`` :data:`.configs.PADDED_ROW_LIMIT`;
    calls with a distance window or a positional one, causal calls, grouped-query k, v and T5's term too, T5's term
    with either window too, but not T5's term with grouped-query k, v; dropout at head dims up to 64), and a call of
    any rows with a positional window of at most :data:`.configs.NARROW_BAND_LIMIT`, takes
    :data:`.configs.PADDED_CONFIGS`' forward, dQ, dK/dV and table tiles first, and its entries naming the call's
    variants ("window" too: a distance window) or dropout last (with dropout its table kernel's entries only where
    they name dropout). A batch of long rows (``short_rows`` 0,
    ``N > 2 * SHORT_ROW_LIMIT``, without a window, causality, grouped-query k, v, a positional window, T5's term or
    dropout) takes :data:`.configs.LONG_ROW_CONFIGS` over the family's tiles."""
    arch = current_arch()
    tiny = abs(scale) < 1e-30
    narrow = 0 <= band <= _configs.NARROW_BAND_LIMIT
    key = (N, D, DV, dtype, lut_rows, window >= 0, spec, arch, short_rows, _configs._BLOCK_OVERRIDE,
           _configs._SHORT_ROWS, narrow, position, grouped, tiny, causal, dropout, band >= 0)
    found = _CONFIGS.get(key)
    if found is not None:
        return found
    family = arch_family(arch)
    width = max(D, DV)
    extra = window >= 0 or (spec.log_distance or 0) > 0 or spec.num_buckets > STATIC_BUCKET_LIMIT or position
    short_ok = not tiny and (not position or N <= _configs.SHORT_ROW_LIMIT)  # (the two-block kernels take no term)
    found = LaunchConfigs(
        fwd_short=_short_forward_config(N, dtype, width, lut_rows) if not tiny else None,
        fwd=select_config("fwd", dtype, width),
        short=_short_config(N, dtype, width, lut_rows, family, arch) if short_ok else None,
        dq=select_config("dq", dtype, width, family),
        dkdv=select_config("dkdv", dtype, width, family),
        table=select_config("table_extra" if extra else "table", dtype, width, family, arch))
    variants = frozenset(name for name, on in (("causal", causal), ("grouped_kv", grouped), ("position", position),
                                               ("position_window", band >= 0), ("window", window >= 0)) if on)
    rows_short = short_rows > 0 if short_rows >= 0 else N <= _configs.PADDED_ROW_LIMIT
    padded = (N > _configs.SHORT_ROW_LIMIT and (rows_short or narrow) and not (position and grouped)
              and _configs._BLOCK_OVERRIDE is None)
    long_rows = (short_rows == 0 and N > 2 * _configs.SHORT_ROW_LIMIT and window < 0 and not variants and not dropout
                 and _configs._BLOCK_OVERRIDE is None)
    overrides = [_configs.padded_overrides(dtype, width, family, arch, dropout, variants)] if padded else []
    overrides += [_configs.long_row_overrides(dtype, width, family, arch)] if long_rows else []
    overrides += [_configs.grouped_overrides(dtype, width, family, arch)] if grouped else []
    overrides += [_configs.position_overrides(dtype, width, family, arch, variants)] if position else []
    overrides += [_configs.band_overrides(dtype, width, family, arch)] if band >= 0 else []
    overrides += [_configs.causal_overrides(dtype, width, family, arch)] if causal else []
    overrides += [_configs.dropout_overrides(dtype, width, family, arch, variants)] if dropout else []
    overrides += [_configs.padded_overrides(dtype, width, family, arch, dropout, variants, last=True)] if padded else []
    # An override's kind names a field of LaunchConfigs, but "short" and "short2" both name ``short`` (the one-tile
    # or the two-block kernel, by N): an entry of the other one is not this call's.
    short_kind = "short" if N <= _configs.SHORT_ROW_LIMIT else "short2"
    for override in overrides:
        updates = {}
        for kind, fields in override.items():
            if kind in ("short", "short2"):
                if kind != short_kind:
                    continue
                kind = "short"
            if getattr(found, kind) is not None:
                updates[kind] = dict(getattr(found, kind), **fields)
        found = found._replace(**updates)
    if not torch.compiler.is_compiling():  # (a traced call keeps nothing)
        _CONFIGS[key] = found
    return found


# ---------------------------------------------------------------------------------------------------------
# What the kernels read about the structure: derived from the batch's plan, once for every layer
# ---------------------------------------------------------------------------------------------------------


def _build_lists(distance, lengths, block_m, block_n, window, causal, by_key, band=-1):
    """Live-tile lists (interior first) of a call with a distance window (``window >= 0``) or a positional one
    (``band >= 0``): ``(indices int32 [B, R, C], counts int32 [B, R, 2])``."""
    smallest, _ = block_distance_range(distance, lengths, block_m, block_n)
    band = None if band < 0 else band
    live = live_blocks(smallest, lengths, block_m, block_n, window=None if window < 0 else window, causal=causal,
                       band=band)
    boundary = boundary_tiles(lengths, live.shape[1], live.shape[2], block_m, block_n, causal, by_key=by_key,
                              band=band)
    if not by_key:  # programs own key blocks: rows are key blocks
        live, boundary = live.transpose(1, 2), boundary.transpose(1, 2)
    return split_lists(live, boundary)


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


@torch.library.triton_op("syntaxkernels::bias_tile_lists", mutates_args=())
def _lists_op(distance: torch.Tensor, lengths: torch.Tensor, block_m: int, block_n: int, window: int, causal: bool,
              by_key: bool, band: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`_build_lists` as a ``torch.library`` op: what ``torch.compile`` traces (its kernels in the graph)."""
    return _build_lists(distance, lengths, block_m, block_n, window, causal, by_key, band)


@torch.library.triton_op("syntaxkernels::bias_tile_buckets", mutates_args=())
def _tile_buckets_op(distance: torch.Tensor, lengths: torch.Tensor, block_m: int, block_n: int, window: int,
                     causal: bool, max_distance: int, log_distance: int, unreachable_bucket: bool) -> torch.Tensor:
    """:func:`_tile_buckets` as a ``torch.library`` op."""
    return _tile_buckets(distance, lengths, block_m, block_n, window, causal,
                         _spec(max_distance, log_distance, unreachable_bucket))


def _derive_lists(plan, block_m, block_n, window, causal, by_key, band=-1):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_tile_lists(plan.distance, plan.kernel_lengths, block_m, block_n, window,
                                                       causal, by_key, band)
    return _build_lists(plan.distance, plan.kernel_lengths, block_m, block_n, window, causal, by_key, band)


def _derive_tile_buckets(plan, block_m, block_n, window, causal, spec):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_tile_buckets(plan.distance, plan.kernel_lengths, block_m, block_n, window,
                                                         causal, spec.max_distance, spec.log_distance or 0,
                                                         spec.unreachable_bucket)
    return _tile_buckets(plan.distance, plan.kernel_lengths, block_m, block_n, window, causal, spec)


# The plan's derived entries (kept on the batch's plan for every layer; keys ("bias lists", block_m, block_n, window,
# causal, by_key, band) and ("bias tile buckets" | "bias skip bucket", block_m, block_n, window, causal, spec)).
register_derivation("bias lists", _derive_lists)
register_derivation("bias tile buckets", _derive_tile_buckets)
register_derivation("bias skip bucket", lambda plan, *key: _skip_buckets(plan.derived(("bias tile buckets",) + key),
                                                                          key[-1].num_buckets))


class ForwardMetadata(NamedTuple):
    kv_list: Optional[torch.Tensor] = None
    kv_count: Optional[torch.Tensor] = None


class BackwardMetadata(NamedTuple):
    distance_t: Optional[torch.Tensor] = None  # the distance read at [b, j, i] (None: the short-row kernels)
    dq_list: Optional[torch.Tensor] = None
    dq_count: Optional[torch.Tensor] = None
    dkdv_list: Optional[torch.Tensor] = None
    dkdv_count: Optional[torch.Tensor] = None
    table_list: Optional[torch.Tensor] = None
    table_count: Optional[torch.Tensor] = None
    tile_buckets: Optional[torch.Tensor] = None
    skip_bucket: Optional[torch.Tensor] = None


def backward_configs(configs: LaunchConfigs, N: int, dropout: bool) -> LaunchConfigs:
    """The backward's kernels: ``configs``, or with dropout on rows of 65..128 tokens the tiled ones (the two-block
    short-row kernels take no dropout mask; the one-tile kernels do)."""
    if dropout and configs.short is not None and N > configs.short["BLOCK_M"]:
        return configs._replace(short=None)
    return configs


def forward_metadata(plan, configs: LaunchConfigs, window: int, causal: bool, band: int = -1) -> ForwardMetadata:
    """What the forward kernel reads beyond the distance and lengths: the live key blocks of a call with a distance
    window or a positional one (``band``)."""
    if configs.fwd_short is not None or (window < 0 and band < 0):
        return ForwardMetadata()
    config = configs.fwd
    return ForwardMetadata(*plan.derived(("bias lists", config["BLOCK_M"], config["BLOCK_N"], window, causal, True,
                                          band)))


def backward_metadata(plan, configs: LaunchConfigs, window: int, causal: bool, spec: BucketSpec,
                      table_grad: bool, band: int = -1) -> BackwardMetadata:
    """What the backward kernels read beyond the distance and lengths (derived from ``plan`` once per batch)."""
    if configs.short is not None:
        return BackwardMetadata()
    lists = {}
    for name, config, by_key in (("dq", configs.dq, True), ("dkdv", configs.dkdv, False),
                                 ("table", configs.table, True)):
        if (window >= 0 or band >= 0) and (name != "table" or table_grad):
            lists[name] = plan.derived(("bias lists", config["BLOCK_M"], config["BLOCK_N"], window, causal, by_key,
                                        band))
        else:
            lists[name] = (None, None)
    tile_buckets = skip_bucket = None
    if table_grad:
        key = (configs.table["BLOCK_M"], configs.table["BLOCK_N"], window, causal, spec)
        tile_buckets = plan.derived(("bias tile buckets",) + key)
        skip_bucket = plan.derived(("bias skip bucket",) + key)
    return BackwardMetadata(plan.transposed_distance(), *lists["dq"], *lists["dkdv"], *lists["table"], tile_buckets,
                            skip_bucket)


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


def _tile_state():
    return _configs._BLOCK_OVERRIDE, _configs._SHORT_ROWS


_replay.STATE.append(_tile_state)  # (the tests' tile overrides are part of every replay key)


@_replay.replayed(seed=14)
def bias_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                           table: torch.Tensor, bias_scale: torch.Tensor, bucket_lut: torch.Tensor,
                           lengths: torch.Tensor, kv_list: Optional[torch.Tensor], kv_count: Optional[torch.Tensor],
                           scale: float, window: int, causal: bool, dropout_p: float = 0.0,
                           dropout_seed: int = 0, band: int = -1, position_table: Optional[torch.Tensor] = None,
                           pos_buckets: Optional[torch.Tensor] = None, reach: int = 0, short_rows: int = -1
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Forward launcher: ``(out [B, H, N, Dv] in q's dtype and layout, lse2 fp32 [B, H, N], lut fp32 [H or 1, 256],
    pos_lut fp32 [H, 2 * reach + 1])`` (``pos_lut`` None without T5's term; the op returns ``[0, 0]`` then).

    Args:
        q: ``[B, H, N, D]``; k: ``[B, H_kv, N, D]``, v: ``[B, H_kv, N, Dv]`` (``H_kv`` divides ``H``: grouped-query
            attention when smaller; any strides; ``out`` takes q's layout: ``[B, N, H, Dv]``
            memory when q is such a view, so merging the heads back costs no copy); distance: uint8 ``[B, N, N]``
            with rows aligned to 16 bytes (a plan's).
        table: ``[H or 1, T]`` (rows contiguous), bias_scale: one element (the strength c), bucket_lut: int
            ``[256]`` (``BucketSpec.lut()``): the kernel writes the log2-domain LUT it gathers from,
            ``lut[h, d] = c * table[h, bucket(d)] * log2(e)`` (``-inf`` past the window), which the backward reads.
        lengths: int32 ``[B]``; kv_list, kv_count: a windowed call's live key blocks (:func:`forward_metadata`),
            else None; scale: score scale; window: -1 for none; causal: ``j <= i``; band: the positional window
            ``|i - j| <= band`` (-1: none; the tiled kernel then needs the live-tile lists).
        dropout_p, dropout_seed: attention dropout on the probabilities (0: compiled out); the lse stays the
            undropped one, so the backward recomputes P and regenerates the mask from the seed.
        position_table, pos_buckets, reach: T5's relative-position term (None: none): its table ``[H, P]`` (rows
            contiguous) and ``RelativePositionSpec.lut()`` (int ``[2 * reach + 1]``) on the device: the kernel writes
            the log2-domain LUT it gathers from, ``pos_lut[h, r] = table[h, pos_buckets[r]] * log2(e)`` (the values
            of :func:`._host.position_lut`), which the backward reads; the short-row forward takes it too.
        short_rows: the plan's ``short_rows`` (1, 0, or -1: not known), which picks the tiles
            (:func:`launch_configs`); the results depend on it through the tiles' summation order only.
    """
    B, H, N, D = q.shape
    DV = v.shape[-1]
    rows = table.shape[0]
    group = H // k.shape[1]  # query heads per key/value head (grouped-query attention; 1 without)
    out = output_like(q, DV)
    lse = _row_buffer(B, H, N, q.device)
    lut = torch.empty((rows, 256), dtype=torch.float32, device=q.device)
    pos_lut, position = _forward_position(q, position_table, pos_buckets, reach, out.numel() > 0)
    drop = {**_dropout(dropout_p, dropout_seed), **_band(band), **position}
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse, _host_lut(table, bias_scale, bucket_lut, window), pos_lut
    stride_tr = table.stride(0) if rows > 1 else 0
    lut_args = (table, bias_scale, bucket_lut)
    configs = launch_configs(N, D, DV, q.dtype, rows, window, _NO_BUCKETS, position_table is not None,
                             H > k.shape[1], scale, causal, dropout_p > 0.0, band, short_rows)
    short = configs.fwd_short
    if short is not None:  # one tile a sequence, a group of heads in one program
        groups = head_groups(B, H, q.device)
        launch(_bias_fwd_short_kernel, (B, groups),
               q, k, v, distance, lut, lengths, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
               *distance.stride(), lse.stride(1), _padded(N), N, D, DV, scale * LOG2E, *lut_args, window, HEADS=H,
               HEAD_GROUPS=groups, GROUPED=groups > 1,  # (by name: the inspection reads both)
               BLOCK_M=short["BLOCK_M"], BLOCK_N=short["BLOCK_N"], BLOCK_D=head_block(D), BLOCK_DV=head_block(DV),
               CHUNK=min(short["CHUNK"], head_block(D)), OUT_CHUNK=min(short["OUT_CHUNK"], head_block(DV)),
               EVEN_D=head_block(D) == D, EVEN_DV=head_block(DV) == DV, EVEN_N=_even(_padded(N), short),
               CAUSAL=causal, DOT_PRECISION=dot_precision(q.dtype), HAS_WINDOW=window >= 0,
               num_warps=short["num_warps"], num_stages=short["num_stages"], OPAQUE_BIAS=short["OPAQUE_BIAS"],
               INTERPRETED=interpreting(), **_kv_group(group), **drop)
        return out, lse, lut, pos_lut
    config = configs.fwd
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    use_lists = kv_list is not None
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    launch(_bias_fwd_kernel, launch_grid(num_q, B, H),
           q, k, v, distance, lut, lengths, kv_list if use_lists else lengths, kv_count if use_lists else lengths,
           out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *distance.stride(),
           lut.stride(0) if rows > 1 else 0, lse.stride(1), H, _padded(N), N, D, DV, num_q, num_k,
           scale * LOG2E, *lut_args, stride_tr, window,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_block(D), BLOCK_DV=head_block(DV),
           EVEN_D=head_block(D) == D, EVEN_DV=head_block(DV) == DV, EVEN_N=_even(_padded(N), config),
           USE_LISTS=use_lists, CAUSAL=causal, DOT_PRECISION=dot_precision(q.dtype), HAS_WINDOW=window >= 0,
           num_warps=config["num_warps"], num_stages=config["num_stages"], OPAQUE_BIAS=config["OPAQUE_BIAS"],
           INTERPRETED=interpreting(), **_kv_group(group), **drop)
    return out, lse, lut, pos_lut


def _dropout(p: float, seed: int) -> dict:
    """The kernels' dropout arguments by name: none (the kernels' defaults: DROPOUT compiled out) for ``p == 0``."""
    if p == 0.0:
        return {}
    seed, threshold, keep_scale = dropout_arguments(p, seed)
    return dict(seed=seed, threshold=threshold, keep_scale=keep_scale, DROPOUT=True)


def _position(pos_lut: Optional[torch.Tensor], reach: int) -> dict:
    """The kernels' arguments for T5's relative-position term by name: none (POSITION compiled out) without a LUT."""
    if pos_lut is None:
        return {}
    return dict(POS_LUT=pos_lut, stride_ph=pos_lut.stride(0), reach=reach, POSITION=True)


def _forward_position(q: torch.Tensor, position_table: Optional[torch.Tensor], pos_buckets: Optional[torch.Tensor],
                      reach: int, launches: bool) -> Tuple[Optional[torch.Tensor], dict]:
    """A forward's T5 LUT and its kernel's arguments by name: ``(None, {})`` without the term; else an fp32 ``[H, 2 *
    reach + 1]`` buffer the kernel writes first (:func:`.._primitives.build_position_lut`, from ``position_table``
    ``[H, P]`` and ``pos_buckets``, ``RelativePositionSpec.lut()`` on the device) and the backward reads, or, when
    nothing ``launches`` (an empty call), the same values from the host and no arguments."""
    if position_table is None:
        return None, {}
    if not launches:
        return torch.index_select(position_table.to(torch.float32), 1, pos_buckets) * LOG2E, {}
    if position_table.stride(-1) != 1:  # (the kernels gather along a row)
        position_table = position_table.contiguous()
    pos_lut = torch.empty((position_table.shape[0], 2 * reach + 1), dtype=torch.float32, device=q.device)
    return pos_lut, dict(_position(pos_lut, reach), PTABLE=position_table, stride_pt=position_table.stride(0),
                         PBUCKETS=pos_buckets, POS_WIDTH=triton.next_power_of_2(2 * reach + 1))


def op_position_lut(pos_lut: Optional[torch.Tensor], q: torch.Tensor) -> torch.Tensor:
    """A forward op's fourth output: the launcher's T5 LUT, or an empty ``[0, 0]`` without the term (an op's outputs
    are tensors; the eager launchers allocate nothing for it)."""
    return pos_lut if pos_lut is not None else torch.empty((0, 0), dtype=torch.float32, device=q.device)


def _kv_group(group: int) -> dict:
    """The kernels' grouped-query arguments by name: none (one key/value head a query head, compiled as without
    grouping) for ``group == 1``."""
    return {} if group == 1 else dict(KV_GROUP=group, GROUPED_KV=True)


def _band(band: int) -> dict:
    """The kernels' positional-window arguments by name: none (BAND compiled out) for ``band < 0``."""
    return {} if band < 0 else dict(BAND=True, band=int(band))


def _host_lut(table, bias_scale, bucket_lut, window):
    """The LUT the kernel would write, built with tensor ops (an empty call: no kernel runs)."""
    lut = table.to(torch.float32)[:, bucket_lut] * (bias_scale.to(torch.float32).reshape(1, 1) * LOG2E)
    if window >= 0:
        lut = lut.masked_fill(torch.arange(256, device=lut.device)[None, :] > window, float("-inf"))
    return lut.contiguous()


def table_gradient(partials: torch.Tensor, outer: int, rows: int, inner: int, table: torch.Tensor,
                   bias_scale: torch.Tensor, want_table: bool, want_scale: bool,
                   position: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Tuple[torch.Tensor, ...]:
    """``(d table, d bias_scale, d position table)`` from the backward's per-program sums, by one small kernel
    (:func:`._backward._bias_table_grad_kernel`): ``partials`` fp32 ``[outer, rows, inner, T]`` (contiguous), summed
    over ``outer`` and ``inner`` for each of the table's ``rows``; ``table`` ``[rows, T]`` (rows contiguous).
    ``position``: T5's term, ``(boundary partials fp32 [programs, H, K], the boundaries-to-buckets matrix fp32 [K,
    P])`` (:func:`._host.position_matrix_on`): the position table's gradient, fp32 ``[H, P]``, in the same launch. A
    gradient not wanted comes back as an empty tensor (no launch when none is)."""
    T = table.shape[-1]
    device = partials.device
    dtable = torch.empty(table.shape, dtype=table.dtype, device=device) if want_table else _nothing(device)
    dscale = torch.empty(bias_scale.shape, dtype=bias_scale.dtype, device=device) if want_scale else _nothing(device)
    dpos = _nothing(device)
    if not (want_table or want_scale or position is not None):
        return dtable, dscale, dpos
    pos_args = {}
    if position is not None:
        pos_partials, matrix = position
        bounds, P = matrix.shape
        dpos = torch.empty((pos_partials.shape[1], P), dtype=torch.float32, device=device)
        pos_args = dict(POS_PARTIALS=pos_partials, POS_MATRIX=matrix, DPOS=dpos, pos_outer=pos_partials.shape[0],
                        pos_rows=pos_partials.shape[1], NUM_BOUNDS=bounds, NUM_POS=P,
                        POS_PAD=max(16, triton.next_power_of_2(P)), POSITION_GRAD=True)
    pad = max(16, triton.next_power_of_2(T))
    launch(_bias_table_grad_kernel, (1,), partials, table, bias_scale, dtable if want_table else partials,
           dscale if want_scale else partials, outer, rows, inner, rows * inner * T, inner * T, T,
           table.stride(0) if rows > 1 else 0, T, NUM_BUCKETS=T, BUCKETS_PAD=pad, BLOCK_P=max(1, min(64, 2048 // pad)),
           WANT_TABLE=want_table, WANT_SCALE=want_scale, num_warps=4, num_stages=1, **pos_args)
    return dtable, dscale, dpos


def _nothing(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=device)


#: The forward's choice of kernels does not depend on the buckets: one key for every BucketSpec.
_NO_BUCKETS = BucketSpec()


def table_heads(H: int, shared_table: bool) -> int:
    """Heads one table-gradient program takes: all of them for a table shared by the heads (the per-bucket
    reduction is paid once per tile, not once per head), one for per-head tables."""
    return H if shared_table else 1


@_replay.replayed(seed=19)
def bias_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor,
                            lengths: torch.Tensor, meta: BackwardMetadata, scale: float, window: int, causal: bool,
                            spec: BucketSpec, table: torch.Tensor, bias_scale: torch.Tensor, want_table: bool,
                            want_scale: bool, dropout_p: float = 0.0, dropout_seed: int = 0,
                            band: int = -1, pos_lut: Optional[torch.Tensor] = None, reach: int = 0,
                            pos_bounds: Optional[torch.Tensor] = None,
                            pos_matrix: Optional[torch.Tensor] = None, short_rows: int = -1
                            ) -> Tuple[torch.Tensor, ...]:
    """Backward launcher: ``(dq, dk, dv, d table, d bias_scale, d position table)``, the first three in q's, k's and
    v's layouts; the table's (``[H or 1, T]``, like ``table``) and the strength's (like ``bias_scale``) from the
    per-bucket sums of dS ``G`` (``d table = c * G``, ``d c = sum(table * G)``), each an empty tensor unless wanted;
    with ``pos_bounds`` and ``pos_matrix`` T5's position table's gradient, fp32 ``[H, P]`` (the sums of dS at the
    position boundaries times the boundaries-to-buckets matrix, :func:`._host.position_matrix_on`, in the table
    gradient's kernel), else an empty tensor.

    Args: as :func:`bias_attention_forward`, plus ``dout`` (like out, any strides), ``out``, ``lse``, the forward's
    ``lut``, ``meta`` (:func:`backward_metadata`: the transposed distance the dK/dV kernel reads, the live-tile lists
    of a windowed call, the table kernel's tile bucket sets), the BucketSpec, the table and strength, and which of
    their gradients to compute; the forward's dropout (its mask regenerated from the seed; rows of 65..128 tokens
    then run the tiled kernels: the two-block ones take no mask), the positional window ``band``, and T5's
    relative-position term (``pos_lut``, ``reach`` as in the forward; ``pos_bounds``: int32, its table's gradient
    wanted, :func:`._host.position_bounds`, with ``pos_matrix``).
    """
    dq, dk, dv, sums, pos_partials = _backward_kernels(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale,
                                                       window, causal, spec, want_table or want_scale,
                                                       _dropout(dropout_p, dropout_seed), _band(band),
                                                       _position(pos_lut, reach), pos_bounds, short_rows)
    if pos_partials is not None and pos_matrix is None:
        raise ValueError("pos_bounds needs pos_matrix (the boundaries-to-buckets matrix, _host.position_matrix_on)")
    position = None if pos_partials is None else (pos_partials, pos_matrix)
    if sums is None:  # no tree-table gradient (the kernel then reduces only the position sums, if any)
        sums = (lut if pos_partials is None else pos_partials, 0, 0, 0)
    return (dq, dk, dv) + table_gradient(*sums, table, bias_scale, want_table, want_scale, position)


def _backward_kernels(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal, spec, table_grad,
                      drop: dict, band: dict, position: dict = None, pos_bounds: Optional[torch.Tensor] = None,
                      short_rows: int = -1):
    """The backward's kernels: ``(dq, dk, dv, sums, pos_partials)``, ``sums`` the per-program bucket sums of dS as
    ``(partials [outer, rows, inner, T], outer, rows, inner)`` (None without ``table_grad``), ``pos_partials`` the
    per-program sums at the position boundaries, fp32 ``[programs, H, len(pos_bounds)]`` (None without
    ``pos_bounds``; :func:`table_gradient` sums them)."""
    position = position or {}
    B, H, N, D = q.shape
    DV = v.shape[-1]
    T = spec.num_buckets
    max_distance, log_distance, unreachable_bucket = spec.max_distance, spec.log_distance or 0, spec.unreachable_bucket
    rows = lut.shape[0]
    group = H // k.shape[1]  # query heads per key/value head (grouped-query attention; 1 without)
    dq, dk, dv = output_like(q, D), output_like(k, D), output_like(v, DV)
    pos_sums = None
    if dq.numel() == 0 or dv.numel() == 0:
        sums = (torch.zeros((1, rows, 1, T), dtype=torch.float32, device=q.device), 1, rows, 1) if table_grad else None
        if pos_bounds is not None:
            pos_sums = torch.zeros((1, H, pos_bounds.numel()), dtype=torch.float32, device=q.device)
        return dq.zero_(), dk.zero_(), dv.zero_(), sums, pos_sums
    stride_lh = lut.stride(0) if rows > 1 else 0
    configs = launch_configs(N, D, DV, q.dtype, rows, window, spec, bool(position), H > k.shape[1], scale, causal,
                             bool(drop), band.get("band", -1), short_rows)
    dkdv_config, dq_config = configs.dkdv, configs.dq
    block_d, block_dv = head_block(D), head_block(DV)
    precision = dot_precision(q.dtype)

    delta = _row_buffer(B, H, N, q.device)  # written by the dQ kernel (corrected with the table gradient)
    if lse.stride(1) != delta.stride(1) or lse.stride(2) != 1:  # an lse not from bias_attention_forward
        lse = _row_buffer(B, H, N, q.device, fill=float("inf")).copy_(lse)  # rows past N: no probability
    short = backward_configs(configs, N, bool(drop)).short
    if short is not None:
        if group == 1:
            return _short_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec,
                                   table_grad, short, dq, dk, dv, delta, drop, band, position, pos_bounds)
        # Grouped-query attention: the short-row kernels store each query head's dK and dV (in q's dtype, as
        # without grouping: fp32 stores would spill), summed over each group here in fp32, in a fixed order.
        dk_heads = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
        dv_heads = torch.empty((B, H, N, DV), dtype=q.dtype, device=q.device)
        dq, dk_heads, dv_heads, sums, pos_sums = _short_backward(dout, q, k, v, lse, distance, lut, lengths, scale,
                                                                 window, causal, spec, table_grad, short, dq,
                                                                 dk_heads, dv_heads, delta, drop, band, position,
                                                                 pos_bounds)
        dk.copy_(dk_heads.view(B, H // group, group, N, D).sum(2, dtype=torch.float32))
        dv.copy_(dv_heads.view(B, H // group, group, N, DV).sum(2, dtype=torch.float32))
        return dq, dk, dv, sums, pos_sums
    # The dK/dV kernel reads the pair (query i, key j) at [b, j, i] (a tile contiguous along the queries).
    distance_t = meta.distance_t
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), stride_lh, delta.stride(1))
    strides_t = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance_t.stride(), stride_lh,
                 delta.stride(1))

    # dQ first: programs own query blocks and write delta (corrected with the table gradient: see the kernel).
    block_m, block_n = dq_config["BLOCK_M"], dq_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    kv_list, kv_count = meta.dq_list, meta.dq_count
    use_lists = kv_list is not None
    launch(_bias_bwd_dq_kernel, launch_grid(num_q, B, H),
           q, k, v, dout, out, distance, lut, lengths, kv_list if use_lists else lengths,
           kv_count if use_lists else lengths, lse, dq, delta, *strides[:16], *out.stride(), *strides[16:],
           *dq.stride(),
           H, _padded(N), N, D, DV, num_q, num_k, scale, scale * LOG2E,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
           EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), dq_config), USE_LISTS=use_lists, CAUSAL=causal,
           TABLE_GRAD=table_grad or pos_bounds is not None, DOT_PRECISION=precision,
           num_warps=dq_config["num_warps"], num_stages=dq_config["num_stages"],
           OPAQUE_BIAS=dq_config["OPAQUE_BIAS"], INTERPRETED=interpreting(), **_kv_group(group), **drop, **band,
           **position)

    # dK and dV: programs own key blocks of one key/value head (and walk its group's query heads).
    block_m, block_n = dkdv_config["BLOCK_M"], dkdv_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    q_list, q_count = meta.dkdv_list, meta.dkdv_count
    use_lists = q_list is not None
    gradient = {}
    if pos_bounds is not None:  # each program's sums at the boundaries, per query head: [B, nK, H, bounds]
        partials = torch.empty((B, num_k, H, pos_bounds.numel()), dtype=torch.float32, device=q.device)
        gradient = dict(POS_BOUNDS=pos_bounds, POS_PARTIALS=partials, NUM_BOUNDS=pos_bounds.numel(),
                        POSITION_GRAD=True)
    launch(_bias_bwd_dkdv_kernel, launch_grid(num_k, B, H // group),
           q, k, v, dout, distance_t, lut, lengths, q_list if use_lists else lengths,
           q_count if use_lists else lengths, lse, delta, dk, dv, *strides_t, *dk.stride(), *dv.stride(),
           H, _padded(N), N, D, DV, num_q, num_k, scale, scale * LOG2E,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
           EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), dkdv_config), USE_LISTS=use_lists, CAUSAL=causal,
           DOT_PRECISION=precision, num_warps=dkdv_config["num_warps"], num_stages=dkdv_config["num_stages"],
           OPAQUE_BIAS=dkdv_config["OPAQUE_BIAS"], INTERPRETED=interpreting(), **_kv_group(group), **drop, **band,
           **position, **gradient)
    if pos_bounds is not None:  # (summed over the batch and the key blocks by the table gradient's kernel)
        pos_sums = gradient["POS_PARTIALS"].view(B * num_k, H, pos_bounds.numel())
    if not table_grad:
        return dq, dk, dv, None, pos_sums

    # The table gradient: programs own a query block and a group of heads (all of them for a shared table).
    table_config = configs.table
    block_m, block_n = table_config["BLOCK_M"], table_config["BLOCK_N"]
    num_q, num_k = triton.cdiv(N, block_m), triton.cdiv(N, block_n)
    heads = table_heads(H, rows == 1)
    groups = H // heads
    kv_list, kv_count = meta.table_list, meta.table_count
    use_lists = kv_list is not None
    tile_buckets, skip_bucket = meta.tile_buckets, meta.skip_bucket
    splits = table_splits(num_q * B * groups, num_k, q.device) if table_config["SPLIT"] else 1
    partials = torch.empty((B * groups * num_q * splits, T), dtype=torch.float32, device=q.device)
    launch(_bias_bwd_table_kernel, launch_grid(num_q * splits, B, groups),
           q, k, v, dout, distance, lut, lengths, kv_list if use_lists else lengths,
           kv_count if use_lists else lengths, tile_buckets, skip_bucket, lse, delta, partials, *strides,
           H, _padded(N), D, DV, num_q, num_k, scale * LOG2E, HEADS=heads,  # (by name: the inspection reads it)
           SPLITS=splits,
           NUM_BUCKETS=T, BUCKETS_PAD=max(16, triton.next_power_of_2(T)), STATIC_BUCKETS=T <= STATIC_BUCKET_LIMIT,
           MAX_DISTANCE=max_distance, LOG_DISTANCE=log_distance, UNREACHABLE_BUCKET=unreachable_bucket,
           LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=min(64, block_d, block_dv),
           EVEN_D=block_d == D, EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), table_config), USE_LISTS=use_lists, CAUSAL=causal,
           INTERPRETED=interpreting(), DOT_PRECISION=precision,
           num_warps=table_config["num_warps"], num_stages=table_config["num_stages"],
           OPAQUE_BIAS=table_config["OPAQUE_BIAS"], **_kv_group(group), **drop, **band, **position)
    # A fixed-order sum of the per-program bucket sums: deterministic. Rows: [1, T] shared, [H, T] per head.
    return dq, dk, dv, (partials, B, groups, num_q * splits), pos_sums


def _short_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec, table_grad, config,
                    dq, dk, dv, delta, drop=None, band=None, position=None, pos_bounds=None):
    """:func:`bias_attention_backward` for short rows (one tile a sequence): :func:`_bias_bwd_short_kernel`
    (every head of one batch item a program: dQ, dK, dV and each head's dS), then with ``table_grad`` or
    ``pos_bounds`` :func:`_bias_bwd_short_table_kernel` (the heads' dS summed and reduced per bucket once; each
    head's sums at T5's position boundaries). ``dk``, ``dv``: per query head (``[B, H, N, *]``: grouped-query k, v
    are read at head ``h // (H / H_kv)``, their gradients summed by the caller); ``position``: T5's term's kernel
    arguments (:func:`_position`; one tile a sequence only). Returns ``(dq, dk, dv, sums, pos_sums)`` as
    :func:`_backward_kernels`."""
    B, H, N, D = q.shape
    DV = v.shape[-1]
    block = config["BLOCK_M"]
    block_d, block_dv = head_block(D), head_block(DV)
    position = position or {}
    if N > block:
        assert not position, "the two-block short-row kernels take no relative-position term"
        return _short2_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec,
                                table_grad, config, dq, dk, dv, delta, band) + (None,)
    # Each head's dS: B * H tiles of BLOCK^2 fp32 (16 KiB a head and sequence at BLOCK = 64).
    want_ds = table_grad or pos_bounds is not None
    ds = torch.empty((B, H, block, block), dtype=torch.float32, device=q.device) if want_ds else lengths
    groups = head_groups(B, H, q.device) if config["GROUPED"] else 1
    if groups > 1 and "GROUPED_CONFIG" in config:  # (tiles that stay spill-free with the grouped loop)
        config = {**config, **config["GROUPED_CONFIG"]}
    launch(_bias_bwd_short_t_kernel if config.get("KEYS_MAJOR") else _bias_bwd_short_kernel, (B, groups),
           q, k, v, dout, distance, lut, lengths, lse, dq, dk, dv, ds,
           *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), lse.stride(1),
           *dq.stride(), *dk.stride(), *dv.stride(),
           _padded(N), N, D, DV, scale, scale * LOG2E, HEADS=H,  # (by name: the inspection reads both)
           HEAD_GROUPS=groups, GROUPED=groups > 1,
           BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DV=block_dv,
           CHUNK=min(config["CHUNK"], block_d, block_dv), OUT_CHUNK=min(config["OUT_CHUNK"], block_d, block_dv),
           DQ_T=config["DQ_T"], EVEN_D=block_d == D, EVEN_DV=block_dv == DV,
           EVEN_N=_even(_padded(N), config), CAUSAL=causal, TABLE_GRAD=want_ds, DOT_PRECISION=dot_precision(q.dtype),
           INTERPRETED=interpreting(), OPAQUE_BIAS=config["OPAQUE_BIAS"], **_kv_group(H // k.shape[1]),
           num_warps=config["num_warps"], num_stages=config["num_stages"], **(drop or {}), **(band or {}),
           **position)
    if not want_ds:
        return dq, dk, dv, None, None
    return (dq, dk, dv) + _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 1,
                                                select_config("short_table", q.dtype, max(D, DV)), table_grad,
                                                pos_bounds)


def _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, blocks, table_config,
                          table_grad=True, pos_bounds=None):
    """``(sums, pos_partials)``: the per-tile bucket sums of the short-row kernels' dS tiles
    (:func:`_bias_bwd_short_table_kernel`, launched with ``table_config``'s warps and stages), as
    :func:`_backward_kernels` returns them (one table row; None without ``table_grad``), and with ``pos_bounds`` (one
    tile a sequence) each item's and head's sums at T5's position boundaries, fp32 ``[B, H, len(pos_bounds)]``
    (summed by :func:`table_gradient`), else None."""
    B, N = distance.shape[0], distance.shape[-1]
    T = spec.num_buckets
    block = config["BLOCK_M"]
    partials = torch.empty((B * blocks * blocks, T), dtype=torch.float32, device=ds.device) if table_grad else lengths
    gradient = {}
    if pos_bounds is not None:
        assert blocks == 1, "the position boundary sums take one tile a sequence"
        gradient = dict(POS_BOUNDS=pos_bounds, NUM_BOUNDS=pos_bounds.numel(), POSITION_GRAD=True,
                        POS_PARTIALS=torch.empty((B, H, pos_bounds.numel()), dtype=torch.float32, device=ds.device))
    launch(_bias_bwd_short_table_kernel, (B, blocks, blocks),
           ds, distance, _bucket_lut(spec, distance), lengths, partials, *distance.stride(), _padded(N), scale,
           window, HEADS=H, NUM_BUCKETS=T, BUCKETS_PAD=max(16, triton.next_power_of_2(T)),
           STATIC_BUCKETS=T <= STATIC_BUCKET_LIMIT, MAX_DISTANCE=spec.max_distance,
           LOG_DISTANCE=spec.log_distance or 0, UNREACHABLE_BUCKET=spec.unreachable_bucket,
           LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1, BLOCK_M=block, BLOCK_N=block,
           EVEN_N=_even(_padded(N), config), CAUSAL=causal, INTERPRETED=interpreting(), BLOCKS=blocks,
           num_warps=table_config["num_warps"], num_stages=table_config["num_stages"],
           **({} if table_grad else dict(TREE_GRAD=False)), **gradient)
    pos_sums = gradient["POS_PARTIALS"] if gradient else None
    return ((partials, 1, 1, B * blocks * blocks) if table_grad else None), pos_sums


def short2_grouping(config: dict, B: int, H: int, device=None) -> Tuple[dict, int]:
    """The two-block backward's tiles and head groups for ``B`` items of ``H`` heads: ``(config, groups)``. Grouped
    launches (``groups > 1``) take the config's GROUPED_CONFIG over it (tiles that stay spill-free with the grouped
    head loop), which may switch to the key blocks outer (KEYS_OUTER: a program per item and group, else one per
    query block); the groups are counted for the kernel that runs grouped (``B`` programs a group with the key
    blocks outer, else ``2 B``). The launcher, the inspection and the traffic model ask here."""
    keys_outer = bool(config.get("KEYS_OUTER") or config.get("GROUPED_CONFIG", {}).get("KEYS_OUTER"))
    groups = head_groups(B if keys_outer else 2 * B, H, device) if config["GROUPED"] else 1
    if groups > 1 and "GROUPED_CONFIG" in config:
        config = {**config, **config["GROUPED_CONFIG"]}
    return config, groups


def _short2_backward(dout, q, k, v, lse, distance, lut, lengths, scale, window, causal, spec, table_grad, config,
                     dq, dk, dv, delta, band=None):
    """:func:`bias_attention_backward` for rows of 65..128 tokens: :func:`_bias_bwd_short2_kernel` (every head
    of one batch item and query block a program; items of at most 64 tokens store their gradients, longer ones
    fp32 shares), :func:`_bias_bwd_short2_sum_kernel` (the shares added in a fixed order); or, with the config's
    KEYS_OUTER, :func:`_bias_bwd_short2_keys_kernel` alone (every head of one batch item a program: each key block's
    dK, dV accumulated over its query rows, dQ of rows reaching two key blocks through one fp32 share of the
    program's own); then with ``table_grad`` the heads' dS summed and reduced per bucket once per tile. ``delta``:
    the caller's row buffer (lse's row stride), for the first pass's row sums."""
    B, H, N, D = q.shape
    config, groups = short2_grouping(config, B, H, q.device)
    keys_outer = bool(config.get("KEYS_OUTER"))
    DV = v.shape[-1]
    block = config["BLOCK_M"]
    block_d, block_dv = head_block(D), head_block(DV)
    f32 = dict(dtype=torch.float32, device=q.device)
    # The buffers traffic.short2_buffers models (keep them in step). dQ's first-key-block share [B, H, BLOCK_D,
    # 2 * BLOCK] ([B, H, 2 * BLOCK, BLOCK_D] unless formed transposed), written and read back by the program that
    # owns the rows; query-major, the dK, dV shares [B, H, 2, BLOCK_D, 2 * BLOCK] (a head's two adjacent: the sum
    # kernel reads both from one address; the transposed products store contiguous rows). Written and read only
    # for items longer than BLOCK, at the positions _stored keeps.
    dq_t = config["DQ_T"]
    dq_part = torch.empty((B, H, block_d, 2 * block) if dq_t else (B, H, 2 * block, block_d), **f32)
    # Each head's dS: B * H * 4 tiles of BLOCK^2 fp32 (64 KiB a head and sequence at BLOCK = 64; the rows and
    # columns past the length neither written nor read).
    ds = torch.empty((B, H, 2, 2, block, block), **f32) if table_grad else lengths
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *distance.stride(), lse.stride(1),
               *dq.stride(), *dk.stride(), *dv.stride())
    common = dict(HEADS=H, HEAD_GROUPS=groups, GROUPED=groups > 1,  # (by name: the inspection reads both)
                  BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DV=block_dv,
                  CHUNK=min(config["CHUNK"], block_d, block_dv),
                  OUT_CHUNK=min(config["OUT_CHUNK"], block_d, block_dv), DQ_T=dq_t, EVEN_D=block_d == D,
                  EVEN_DV=block_dv == DV, EVEN_N=_even(_padded(N), config), CAUSAL=causal, TABLE_GRAD=table_grad,
                  DOT_PRECISION=dot_precision(q.dtype), num_warps=config["num_warps"],
                  num_stages=config["num_stages"], INTERPRETED=interpreting(), OPAQUE_BIAS=config["OPAQUE_BIAS"],
                  **_kv_group(H // k.shape[1]), **(band or {}))
    if keys_outer:
        launch(_bias_bwd_short2_keys_kernel, (B, groups),
               q, k, v, dout, distance, lut, lengths, lse, delta, dq, dk, dv, dq_part, ds, *strides,
               _padded(N), N, D, DV, scale, scale * LOG2E, ROWS=config["ROWS"], **common)
    else:
        dk_part = torch.empty((B, H, 2, block_d, 2 * block), **f32)
        dv_part = torch.empty((B, H, 2, block_dv, 2 * block), **f32)
        launch(_bias_bwd_short2_kernel, (B, 2 * groups),
               q, k, v, dout, distance, lut, lengths, lse, delta, dq, dk, dv, dq_part, dk_part, dv_part, ds, *strides,
               B, _padded(N), N, D, DV, scale, scale * LOG2E, **common)
        sum_config = select_config("short2_sum", q.dtype, max(D, DV))
        launch(_bias_bwd_short2_sum_kernel, (B * H,),
               lengths, dk_part, dv_part, dq, dk, dv, *dq.stride(), *dk.stride(), *dv.stride(),
               B, _padded(N), N, D, DV, H, BLOCK_M=block, BLOCK_D=block_d, BLOCK_DV=block_dv, CAUSAL=causal,
               num_warps=sum_config["num_warps"], num_stages=sum_config["num_stages"])
    if not table_grad:
        return dq, dk, dv, None
    return dq, dk, dv, _short_table_gradient(ds, distance, lengths, window, causal, spec, scale, config, H, 2,
                                             select_config("short_table", q.dtype, max(D, DV)))[0]


# ---------------------------------------------------------------------------------------------------------
# The torch.library ops: what torch.compile traces (eager calls run the launchers above directly)
# ---------------------------------------------------------------------------------------------------------


@torch.library.triton_op("syntaxkernels::bias_attention_fwd", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor, table: torch.Tensor,
                bias_scale: torch.Tensor, bucket_lut: torch.Tensor, lengths: torch.Tensor,
                kv_list: Optional[torch.Tensor], kv_count: Optional[torch.Tensor], scale: float, window: int,
                causal: bool, dropout_p: float = 0.0,
                dropout_seed: int = 0, band: int = -1, position_table: Optional[torch.Tensor] = None,
                pos_buckets: Optional[torch.Tensor] = None, reach: int = 0, short_rows: int = -1
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`bias_attention_forward` as a ``torch.library`` op (``dropout_seed`` the int64 bit pattern of the seed:
    :func:`~syntaxkernels.ops._primitives.dropout_arguments`)."""
    out, lse, lut, pos_lut = bias_attention_forward(q, k, v, distance, table, bias_scale, bucket_lut, lengths, kv_list,
                                                    kv_count, scale, window, causal, dropout_p, dropout_seed, band,
                                                    position_table, pos_buckets, reach, short_rows)
    return out, lse, lut, op_position_lut(pos_lut, q)


@torch.library.triton_op("syntaxkernels::bias_attention_bwd", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor, lengths: torch.Tensor,
                 distance_t: Optional[torch.Tensor], dq_list: Optional[torch.Tensor], dq_count: Optional[torch.Tensor],
                 dkdv_list: Optional[torch.Tensor], dkdv_count: Optional[torch.Tensor],
                 table_list: Optional[torch.Tensor], table_count: Optional[torch.Tensor],
                 tile_buckets: Optional[torch.Tensor], skip_bucket: Optional[torch.Tensor], scale: float, window: int,
                 causal: bool, max_distance: int, log_distance: int, unreachable_bucket: bool, table: torch.Tensor,
                 bias_scale: torch.Tensor, want_table: bool, want_scale: bool, dropout_p: float = 0.0,
                 dropout_seed: int = 0, band: int = -1, pos_lut: Optional[torch.Tensor] = None, reach: int = 0,
                 pos_bounds: Optional[torch.Tensor] = None, pos_matrix: Optional[torch.Tensor] = None,
                 short_rows: int = -1
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`bias_attention_backward` as a ``torch.library`` op (the metadata and the BucketSpec spelled out)."""
    meta = BackwardMetadata(distance_t, dq_list, dq_count, dkdv_list, dkdv_count, table_list, table_count, tile_buckets,
                            skip_bucket)
    return bias_attention_backward(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal,
                                   _spec(max_distance, log_distance, unreachable_bucket), table, bias_scale, want_table,
                                   want_scale, dropout_p, dropout_seed, band, pos_lut, reach, pos_bounds, pos_matrix,
                                   short_rows)
