"""Memory traffic of the backward per valid pair: what it must move (essential) and the scratch it writes and reads
back, a model of the launchers' buffers (``ops/bias_attention/_launch.py``, ``_varlen_kernels.py``; keep it in
step with them).

Per batch item (or packed sequence) of ``L`` tokens and head, in bytes (``e``: the element size of q's dtype):

- **essential**: q, k, v and dO read once, dQ, dK, dV written once (``7 L D e``), the log-sum-exp rows read
  (``4 L``), the tiled and packed kernels also read the output O (``L D e``: their delta is ``rowsum(dO * O)``),
  and the item's uint8 distance once for all heads (``L^2 / H``);
- **scratch**, each byte written once and read once (no cache counted: an upper bound of what reaches DRAM), at
  the positions the short-row kernels store and read (``S(n)``: a block's ``n`` positions inside the length
  rounded up to 8, one 32-byte sector of fp32; :func:`~syntaxkernels.ops.bias_attention._backward._stored`):

  - rows of at most 64 tokens (one tile): each head's fp32 dS tile, its ``S(L)`` query rows written whole
    (``S(L) BLOCK``), read back at ``S(L)^2``;
  - rows of 65..128 tokens (the two-block kernels): each walked tile's dS, written whole in the first key block
    and at ``S(keys)`` in the second, read back at ``S(rows) S(keys)``; for an item longer than a block, each
    tile's fp32 dK and dV shares (``(BLOCK_D + BLOCK_DV) S(keys)``, added by the sum kernel), each query block's one
    dQ share when its rows reach both key blocks (``BLOCK_D BLOCK``, added by the program itself) and those rows'
    delta (written, read and updated, read: ``4 * 4`` a row);
  - the same rows with the key blocks outer (the sm90 family at head dims up to 64, and the small family's grouped
    launches there: the configs' KEYS_OUTER, as :func:`~syntaxkernels.ops.bias_attention._launch.short2_grouping`
    gives it for the workload's items and heads,
    :func:`~syntaxkernels.ops.bias_attention._backward._bias_bwd_short2_keys_kernel`): each walked step of
    ``ROWS`` query rows writes its dS at the key block's ``S(keys)`` keys, read back at ``S(rows) S(keys)``; for an
    item longer than a block, the rows reaching both key blocks write their first key block's dQ product as an
    fp32 share and read it back (``2 * 4 * BLOCK_D`` a row) and their delta (written by the first pass, read and
    updated, read: ``4 * 4`` a row); dK and dV stay in registers;
  - the tiled and packed kernels: the fp32 delta rows, written by the dQ kernel and read by the dK/dV and table
    kernels (``3 * 4 L``);
  - the packed kernels on a batch of short sequences (``_varlen_kernels.stores_ds``): each head's fp32 dS at the
    sequence's allowed pairs, stored by the dK/dV kernel and read by the table kernel (``2 * 4 L^2``; causal
    ``L (L + 1) / 2`` pairs);
  - the table gradient's per-program bucket sums (``4 T`` per program, once for all heads).

``python -m syntaxkernels inspect --workload ... --traffic`` prints it per workload. A model, not a measurement:
a GPU's L2 keeps part of the scratch (a two-block item's 512 KiB a head at D = 64 fits, a batch's does not).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

__all__ = ["backward_traffic", "format_traffic", "short2_buffers"]


def short2_buffers(B: int, H: int, D: int, DV: int, block: int, table_grad: bool = True,
                   dq_transposed: bool = True, keys_outer: bool = False) -> Dict[str, tuple]:
    """The fp32 scratch buffers :func:`~syntaxkernels.ops.bias_attention._launch._short2_backward` allocates, by
    name: their shapes (the dK and dV shares ``[B, H, 2, BLOCK_D, 2 BLOCK]``, none with ``keys_outer``; dQ's one
    share ``[B, H, BLOCK_D, 2 BLOCK]`` (``[B, H, 2 BLOCK, BLOCK_D]`` unless formed transposed), and with the table
    gradient each head's dS tiles ``[B, H, 2, 2, BLOCK, BLOCK]``)."""
    from syntaxkernels.ops._primitives import head_block

    bd, bdv = head_block(D), head_block(DV)
    out = dict(dq_part=(B, H, bd, 2 * block) if dq_transposed else (B, H, 2 * block, bd))
    if not keys_outer:
        out.update(dk_part=(B, H, 2, bd, 2 * block), dv_part=(B, H, 2, bdv, 2 * block))
    if table_grad:
        out["ds"] = (B, H, 2, 2, block, block)
    return out


def _stored(n: int) -> int:
    """Positions the short-row kernels store of a block's ``n`` inside the length: ``n`` rounded up to 8."""
    return -(-n // 8) * 8


def _short2_item(L: int, block: int, bd: int, bdv: int, causal: bool) -> int:
    """Scratch bytes per head of one item of ``L`` tokens in the two-block kernels (module docstring)."""
    rows = [max(0, min(block, L - qb * block)) for qb in range(2)]
    total = 0
    for qb in range(2):
        if not rows[qb]:
            continue
        num_k = 2 if L > block else 1
        if causal:
            num_k = min(num_k, qb + 1)
        for kb in range(num_k):
            keys = block if kb == 0 else _stored(rows[1])
            total += 4 * (block * keys + _stored(rows[qb]) * _stored(rows[kb]))  # dS written, read
            if L > block:
                total += 2 * 4 * (bd + bdv) * keys  # dK, dV shares
        if num_k == 2:
            total += 2 * 4 * bd * block + 4 * 4 * rows[qb]  # dQ share, delta rows
    return total


def _short2_keys_item(L: int, block: int, bd: int, causal: bool, rows: int) -> int:
    """Scratch bytes per head of one item of ``L`` tokens in the two-block kernel with the key blocks outer
    (module docstring; ``rows``: its ROWS)."""
    blocks = -(-L // block)
    walked = -(-L // rows) * rows  # the query rows the steps cover
    total = 0
    for kb in range(blocks):
        keys = _stored(min(block, L - kb * block))
        for qb in range(kb if causal else 0, blocks):
            written = min(walked, (qb + 1) * block) - qb * block
            total += 4 * (written * keys + _stored(min(block, L - qb * block)) * keys)  # dS written, read
    if blocks == 2:  # rows reaching both key blocks (causal: the second query block's)
        for qb in range(1 if causal else 0, 2):
            written = min(walked, (qb + 1) * block) - qb * block
            total += 2 * 4 * bd * written + 4 * 4 * min(block, L - qb * block)  # dQ share, delta rows
    return total


def _path(N: int, D: int, dtype, arch: int, causal: bool, B: int = 1, heads: int = 12, short_rows: int = -1):
    """``("short" | "short2" | "tiled", config)``: the padded backward a call of ``N`` tokens runs (a shared table;
    ``short_rows`` the plan's, :func:`~syntaxkernels.plan.rows_are_short`); the two-block kernel's config as ``B``
    items of ``heads`` heads launch it (grouped: its GROUPED_CONFIG)."""
    from syntaxkernels.ops._primitives import interpret_as
    from syntaxkernels.ops.bias_attention import _launch
    from syntaxkernels.specs import BucketSpec
    from syntaxkernels.tools.inspection import fake_gpu

    previous = interpret_as(arch)  # (under the interpreter the configs follow this, not the faked driver)
    try:
        with fake_gpu(arch):
            configs = _launch.launch_configs(N, D, D, dtype, 1, -1, BucketSpec(), causal=causal, short_rows=short_rows)
            if configs.short is not None and N > configs.short["BLOCK_M"]:  # (grids sized for arch's multiprocessors)
                configs = configs._replace(short=_launch.short2_grouping(configs.short, B, heads)[0])
    finally:
        interpret_as(previous)
    if configs.short is None:
        return "tiled", configs
    return ("short" if N <= configs.short["BLOCK_M"] else "short2"), configs


def backward_traffic(workload, head_dim: int = 64, dtype: str = "bf16", arch: int = 90, heads: int = 12,
                     causal: bool = False, buckets=None) -> dict:
    """The backward's bytes per valid pair and head of ``workload`` (a :class:`~syntaxkernels.tools.workloads.Workload`,
    a shared learnable table: the table gradient on), as the module docstring models them: ``essential``,
    ``scratch``, their ``ratio``, the ``path`` ("short", "short2", "tiled", "packed"), ``keys_outer`` (the two-block
    kernel with the key blocks outer) and ``per_long_item``: scratch
    and essential KiB per head of the batch's longest item."""
    import torch

    from syntaxkernels.specs import BucketSpec

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    e = torch.tensor([], dtype=torch_dtype).element_size()
    D = head_dim
    T = (buckets or BucketSpec()).num_buckets
    lengths = [int(n) for n in workload.lengths]
    stored_ds = False
    if workload.packed:
        from syntaxkernels.ops.bias_attention._varlen_kernels import stores_ds

        path, block = "packed", None
        stored_ds = stores_ds(True, sum(L * L for L in lengths), sum(lengths))
    else:
        path, configs = _path(workload.N, D, torch_dtype, arch, causal, workload.batch_size, heads,
                              int(workload.short_rows))
        block = configs.short["BLOCK_M"] if configs.short is not None else None
    essential: List[float] = []
    scratch: List[float] = []
    keys_outer = path == "short2" and bool(configs.short.get("KEYS_OUTER"))
    if path == "short2":  # the head dims of the launcher's shares
        shares = short2_buffers(1, 1, D, D, block)
        bd, bdv = shares["dk_part"][3], shares["dv_part"][3]
    for L in lengths:
        base = 7 * L * D * e + 4 * L + L * L / heads
        if path in ("tiled", "packed"):
            essential.append(base + L * D * e)
            pairs = (L * (L + 1) // 2 if causal else L * L) if stored_ds else 0
            scratch.append(3 * 4 * L + 2 * 4 * pairs)
            continue
        essential.append(base)
        if path == "short":
            scratch.append(4 * (_stored(L) * block + _stored(L) ** 2))  # dS written (whole rows), read
        elif keys_outer:
            scratch.append(_short2_keys_item(L, block, bd, causal, configs.short.get("ROWS", block)))
        else:
            scratch.append(_short2_item(L, block, bd, bdv, causal))
    # The table gradient's per-program bucket sums (written once, read once; one per tile or program, all heads).
    if path == "short":
        programs = len(lengths)
    elif path == "short2":
        programs = 4 * len(lengths)
    else:
        programs = sum(-(-L // 64) for L in lengths)  # ~ one per query block (the tiled and packed table kernels)
    partials = 2 * 4 * T * programs / heads
    valid = sum(L * L for L in lengths)
    total_essential, total_scratch = sum(essential), sum(scratch) + partials
    longest = max(range(len(lengths)), key=lambda i: lengths[i]) if lengths else None
    return dict(path=path, block=block, keys_outer=keys_outer, essential=total_essential / valid if valid else 0.0,
                scratch=total_scratch / valid if valid else 0.0,
                ratio=total_scratch / total_essential if total_essential else 0.0,
                per_long_item=None if longest is None else dict(
                    tokens=lengths[longest], scratch_kib=scratch[longest] / 1024,
                    essential_kib=essential[longest] / 1024))


def format_traffic(rows: Sequence[dict]) -> str:
    """The ``--traffic`` table: one row per (workload, head dim) of :func:`backward_traffic` results (each with
    ``workload`` and ``head_dim`` added)."""
    import textwrap

    header = (f"{'workload':<18} {'D':>4} {'path':<7} {'essential':>9} {'scratch':>8} {'ratio':>6} "
              f"{'longest':>7} {'its scratch':>11} {'essential':>9}")
    lines = ["backward memory traffic per valid pair and head (bytes; a model of the launchers' buffers)", header,
             "-" * len(header)]
    for r in rows:
        long = r["per_long_item"] or {}
        path = r["path"] + ("k" if r.get("keys_outer") else "")
        lines.append(f"{r['workload']:<18} {r['head_dim']:>4} {path:<7} {r['essential']:>9.1f} "
                     f"{r['scratch']:>8.1f} {r['ratio']:>6.2f} {long.get('tokens', 0):>7} "
                     f"{long.get('scratch_kib', 0.0):>9.1f} K {long.get('essential_kib', 0.0):>7.1f} K")
    lines += textwrap.wrap(
        "essential: q, k, v, dO read and dQ, dK, dV written once (the tiled and packed paths also read O), the "
        "log-sum-exp rows, the distance once for all heads; scratch: the fp32 buffers the backward writes and reads "
        "back (dS tiles for the table gradient; the two-block kernels' dQ/dK/dV shares of items over one block; "
        "the packed dK/dV kernel's stored dS on short sequences; delta rows; the bucket sums) at the positions written and read (inside the length, rounded up to 8, where "
        "the kernels mask them), no cache counted; ratio: scratch / essential; "
        "longest: the batch's longest item and its scratch and essential KiB per head. A model of the launchers' "
        "buffers (syntaxkernels/tools/traffic.py), not a measurement. Path short2k: the two-block kernel with the key "
        "blocks outer (no dK/dV shares).", 110)
    return "\n".join(lines)
