"""Fused distance-bias attention (Triton) against the reference: forward and every gradient.

Every kernel test runs on ``DEVICE``: CUDA when present, else the CPU under TRITON_INTERPRET=1 (set by
conftest.py); no test builds CPU tensors for the Triton path on a GPU host. Sizes stay small (B <= 3, H <= 2)
so the file runs in a few minutes on two cores; the tiles are shrunk to 16 x 16 where a test needs many
tiles (interior/boundary splits, one-bucket and mixed tiles of the table gradient, live-tile lists) at small N. The CUDA
tests at the bottom run real sizes.
"""
import contextlib
import functools
import random

import pytest
import torch
import triton
import triton.language as tl

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.tools.checks import shuffled_program_order
from syntaxkernels.tools.workloads import random_document
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.ops.bias_attention import _autograd, _host, _launch, configs
from syntaxkernels.ops.block_meta import (block_bucket_masks, block_distance_range, boundary_tiles, compact_rows,
                                          split_lists)
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads
from syntaxkernels.plan import structure_plan

from conftest import KERNEL_DEVICE as DEVICE, spy_launches
from conftest import requires_cuda


def make_case(B, H, N, D, dtype, **opts):
    """The shared case (:func:`syntaxkernels.tools.testing.bias_attention_case`: random trees, ``roots`` per item, or
    the given ``heads`` rows; random q, k, v, table) with bias scale c = 0.8, to run in ``dtype``."""
    return bias_attention_case(B, H, N, D, dtype, bias_scale=0.8, **opts)


def _run(case, dtype, backend, grad_out, **kw):
    """Forward + backward on ``DEVICE``; returns (out, grads dict) with inputs cast to ``dtype`` (table/scale in fp32
    or fp64)."""
    op = functools.partial(sk.syntax_bias_attention, backend=backend)
    return bias_attention_grads(op, case, dtype, grad_out, DEVICE, **kw)


def check_against_reference(case, **kw):
    """Forward and every gradient against the float64 reference (the rule of :mod:`syntaxkernels.tools.testing`, the
    bias-scale gradient by its own rule), no gradient all zeros where the reference's is not, and query rows at
    or past the length exactly zero."""
    dtype = case["dtype"]
    B, H, N, D = case["q"].shape
    grad_out = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(1))
    out, grads = _run(case, dtype, "triton", grad_out, **kw)
    out64, grads64 = _run(case, torch.float64, "reference", grad_out, **kw)
    outlp, gradslp = _run(case, dtype, "reference", grad_out, **kw)
    assert out.dtype == dtype and out.shape == out64.shape
    assert_bias_attention_close(case, (out, grads), (out64, grads64), (outlp, gradslp), dtype)
    for name in grads:
        if grads64[name].abs().max() > 1e-3:
            assert grads[name].abs().max() > 0, f"{name} is all zeros"
    # Query rows at or past the length are exactly zero.
    for b, L in enumerate(case["lengths"].tolist()):
        assert torch.all(out[b, :, L:] == 0)
    return out, grads


# id, (B, H, N, D), dtype, options
CASES = [
    ("N1-fp32-D32", (2, 2, 1, 32), torch.float32, dict()),
    ("N17-fp32-D32-shared", (2, 2, 17, 32), torch.float32, dict()),
    ("N17-bf16-D128", (1, 2, 17, 128), torch.bfloat16, dict()),
    ("N100-bf16-D64-ragged-empty-perhead", (3, 2, 100, 64), torch.bfloat16, dict(lengths=[100, 0, 37], per_head=True)),
    ("N129-fp32-D32-ragged-window2", (2, 2, 129, 32), torch.float32, dict(lengths=[129, 70], window=2)),
    ("N129-bf16-D64-causal", (2, 2, 129, 64), torch.bfloat16, dict(causal=True)),
    ("N100-fp16-D32-perhead-window1-causal", (2, 2, 100, 32), torch.float16,
     dict(per_head=True, window=1, causal=True, lengths=[100, 61])),
    ("N40-fp32-D48-oddhead", (2, 2, 40, 48), torch.float32, dict()),
    ("N64-fp32-D32-logbuckets", (2, 2, 64, 32), torch.float32, dict(buckets=sk.BucketSpec(16, log_distance=4))),
    ("N64-fp32-D32-bigtable", (2, 2, 64, 32), torch.float32,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1)),
    ("N50-fp32-D32-window0-forest", (2, 2, 50, 32), torch.float32, dict(window=0, roots=5)),
    ("N100-fp16-D128-ragged-window2-causal", (2, 1, 100, 128), torch.float16,
     dict(lengths=[100, 45], window=2, causal=True)),
    ("N70-fp32-D128-window1", (1, 2, 70, 128), torch.float32, dict(window=1)),
]


@pytest.mark.parametrize("shape,dtype,opts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.long_on_cpu
def test_forward_and_gradients(shape, dtype, opts):
    opts = dict(opts)
    kw = {k: opts.pop(k) for k in ("window", "causal") if k in opts}
    case = make_case(*shape, dtype, **opts)
    check_against_reference(case, **kw)


def _documents(B, N, sentence, seed=0, chains=False):
    """Rows of packed sentences of about ``sentence`` tokens (many trees: most pairs unreachable); with
    ``chains`` every sentence is a chain of exactly ``sentence`` tokens (long distances inside a sentence)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(B):
        sizes, left = [], N
        while left:
            size = sentence if chains else rng.randint(max(1, sentence // 2), sentence * 3 // 2)
            sizes.append(min(left, size))
            left -= sizes[-1]
        if chains:
            row = []
            for size in sizes:
                row += [-1] + list(range(len(row), len(row) + size - 1))
            rows.append(row)
        else:
            rows.append(random_document(rng, sizes))
    return rows


SMALL_TILE_CASES = [
    # Packed sentences: tiles between sentences are one bucket (unreachable), tiles near the diagonal span
    # several buckets.
    ("packed-bf16-shared", torch.bfloat16, dict(heads=(12, False)), dict()),
    # Packed chains of 48 tokens clamped at 3: tiles far apart inside a sentence are one bucket (the clamp).
    ("chains-fp32-perhead-ragged", torch.float32,
     dict(heads=(48, True), buckets=sk.BucketSpec(3), per_head=True, lengths=[96, 53]), dict()),
    ("chain-fp16-causal", torch.float16, dict(heads="chain", buckets=sk.BucketSpec(4)), dict(causal=True)),
    # Log buckets: the bucket compares are distance ranges.
    ("chain-fp32-logbuckets", torch.float32, dict(heads="chain", buckets=sk.BucketSpec(40, log_distance=4)),
     dict()),
    # Windows walk live-tile lists, interior tiles first.
    ("packed-bf16-window3-ragged", torch.bfloat16, dict(heads=(12, False), lengths=[96, 71]), dict(window=3)),
    ("chain-fp32-window5-causal", torch.float32, dict(heads="chain", lengths=[96, 40]),
     dict(window=5, causal=True)),
]


@pytest.mark.parametrize("dtype,opts,kw", [c[1:] for c in SMALL_TILE_CASES], ids=[c[0] for c in SMALL_TILE_CASES])
@pytest.mark.long_on_cpu
def test_small_tiles_exercise_every_path(monkeypatch, dtype, opts, kw):
    """16x16 tiles at N = 96: interior and boundary loops, one-bucket tiles (one row sum of dS) and tiles
    spanning several buckets (per-bucket sums) in the table kernel, live-tile lists for windows."""
    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    B, N = 2, 96
    opts = dict(opts)
    lengths = opts.pop("lengths", [N] * B)
    kind = opts.pop("heads")
    if kind == "chain":
        heads = [[-1] + list(range(L - 1)) for L in lengths]
    else:
        heads = [_documents(1, L, kind[0], seed=b, chains=kind[1])[0] for b, L in enumerate(lengths)]
    case = make_case(B, 1, N, 32, dtype, lengths=lengths, heads=heads, **opts)
    # The case reaches the table-gradient paths: tiles in several buckets, and (without a window) in one.
    tile_buckets = _launch._tile_buckets(case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32), 16, 16,
                                         kw.get("window", -1), kw.get("causal", False), case["buckets"])
    tile_buckets = tile_buckets.cpu()
    if case["buckets"].num_buckets <= configs.STATIC_BUCKET_LIMIT:
        count = sum((tile_buckets >> t) & 1 for t in range(31))
    else:
        count = (tile_buckets // 256 - tile_buckets % 256 + 1).clamp(min=0)
    assert (count > 1).any()
    if "window" not in kw:  # (inside a small window every tile holds several distances)
        assert (count == 1).any()
    check_against_reference(case, **kw)


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
@pytest.mark.long_on_cpu
def test_table_kernel_skips_the_most_frequent_one_bucket_tiles(monkeypatch, per_head):
    """Each query block's most frequent one-bucket tiles are not walked: the rows of dS sum to zero, so their
    bucket gets minus everything walked. Two 48-token chains in a row at 16 x 16 tiles: far tiles inside a chain
    (the last distance bucket) and tiles between the chains (unreachable); each row of tiles skips one kind and
    walks the other on the one-bucket path, and the gradients equal the float64 reference's."""
    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    chains = [[-1] + list(range(47)) + [-1] + list(range(48, 95))] * 2
    case = make_case(2, 2, 96, 32, torch.bfloat16, heads=chains, per_head=per_head)
    tiles = _launch._tile_buckets(case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32), 16, 16, -1,
                                  False, case["buckets"])
    skip = _launch._skip_buckets(tiles, case["buckets"].num_buckets).cpu()
    tiles = tiles.cpu()
    one_bucket = (tiles > 0) & ((tiles & (tiles - 1)) == 0)
    skipped = one_bucket & (tiles == (1 << skip.clamp(min=0))[..., None]) & (skip >= 0)[..., None]
    assert skipped.any() and (one_bucket & ~skipped).any()  # both paths of a one-bucket tile are taken
    check_against_reference(case)


@pytest.mark.parametrize("per_head,kw", [(False, dict()), (True, dict()), (False, dict(window=20, causal=True))],
                         ids=["shared", "per-head", "window-causal"])
@pytest.mark.long_on_cpu
def test_table_kernel_splits_a_query_blocks_walk(monkeypatch, per_head, kw):
    """The table kernel splits each query block's key blocks among SPLITS programs (one long tree fills the GPU):
    each split adds its own part of the skipped tiles' correction, and the table's and strength's gradients
    equal the float64 reference's and the unsplit kernel's to rounding (two chains of 48 at 16 x 16 tiles:
    skipped, one-bucket and mixed tiles; 4 splits of 6 key blocks leave one split with nothing to walk)."""
    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    grids = []
    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        if fn.fn.__name__ == "_bias_bwd_table_kernel":
            grids.append((tuple(grid), kwargs["SPLITS"]))
        real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    chains = [[-1] + list(range(47)) + [-1] + list(range(48, 95))] * 2
    case = make_case(2, 2, 96, 32, torch.bfloat16, heads=chains, per_head=per_head)
    grad_out = torch.randn(2, 2, 96, 32, generator=torch.Generator().manual_seed(3))
    groups = 2 if per_head else 1
    results = {}
    for splits in (1, 4):
        monkeypatch.setattr(_launch, "table_splits", lambda programs, num_k, device, n=splits: n)
        grids.clear()
        results[splits] = _run(case, torch.bfloat16, "triton", grad_out, **kw)
        assert grids == [((6 * splits * 2 * groups,), splits)], grids
        if splits > 1:
            check_against_reference(case, **kw)
    for name in ("dtable", "dbias_scale"):
        one, split = results[1][1][name].double(), results[4][1][name].double()
        assert (one - split).abs().max() <= 1e-5 * one.abs().max() + 1e-7, name
    for name in ("dq", "dk", "dv"):  # the other kernels do not depend on the split
        assert torch.equal(results[1][1][name], results[4][1][name]), name


def test_table_splits_fill_the_gpu(monkeypatch):
    """Split a query block's walk only where the programs leave multiprocessors idle, and never into walks of
    fewer than four key blocks."""
    monkeypatch.setattr(P, "_MULTIPROCESSORS_OVERRIDE", 132)
    assert _launch.table_splits(64, 128, torch.device("cpu")) == 5  # one 8192-token tree
    assert _launch.table_splits(300, 128, torch.device("cpu")) == 1  # enough programs already
    assert _launch.table_splits(8, 8, torch.device("cpu")) == 2  # few key blocks: at most 8 // 4
    assert _launch.table_splits(8, 3, torch.device("cpu")) == 1


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
@pytest.mark.long_on_cpu
def test_table_gradient_walks_the_heads_of_a_shared_table(monkeypatch, per_head):
    """A table shared by the heads gets its gradient from one program per query block that sums the heads' dS
    before the per-bucket reduction (``HEADS = H``); a per-head table from one program per head. 3 heads,
    16x16 tiles (one-bucket and mixed ones), ragged, against the float64 reference."""
    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    launched = []
    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        if fn.fn.__name__ == "_bias_bwd_table_kernel":
            launched.append((grid, kwargs["HEADS"]))
        real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    heads = [_documents(1, L, 12, seed=b)[0] for b, L in enumerate([64, 41])]
    case = make_case(2, 3, 64, 32, torch.bfloat16, lengths=[64, 41], heads=heads, per_head=per_head)
    check_against_reference(case)
    num_q = 64 // 16
    assert launched == ([((num_q * 2 * 3,), 1)] if per_head else [((num_q * 2,), 3)])


# id, (B, H, N, D), dtype, make_case options, call options: short rows (N <= 64) with a shared table
SHORT_CASES = [
    ("N57-bf16-D64-ragged-empty", (3, 3, 57, 64), torch.bfloat16, dict(lengths=[57, 0, 23]), dict()),
    ("N40-fp16-D128-window2-causal", (2, 2, 40, 128), torch.float16, dict(lengths=[40, 17]),
     dict(window=2, causal=True)),
    ("N40-bf16-D48-bigtable", (2, 2, 40, 48), torch.bfloat16,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1), dict()),
    ("N64-fp16-D32-logbuckets", (2, 2, 64, 32), torch.float16, dict(buckets=sk.BucketSpec(16, log_distance=4)),
     dict()),
    ("N33-bf16-D96-window1", (2, 1, 33, 96), torch.bfloat16, dict(lengths=[33, 5]), dict(window=1)),
]


# Rows of 65..128 tokens with a shared table: the two-block short-row backward (a program per query block of 64)
SHORT2_CASES = [
    ("N100-bf16-D64-ragged-empty", (4, 2, 100, 64), torch.bfloat16, dict(lengths=[100, 0, 23, 65]), dict()),
    ("N128-fp16-D128-window2-causal", (2, 2, 128, 128), torch.float16, dict(lengths=[128, 70]),
     dict(window=2, causal=True)),
    ("N77-bf16-D48-bigtable", (2, 2, 77, 48), torch.bfloat16,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1, lengths=[77, 65]), dict()),
    ("N90-fp16-D32-logbuckets", (2, 1, 90, 32), torch.float16, dict(buckets=sk.BucketSpec(16, log_distance=4)),
     dict()),
    ("N100-bf16-D96-window1-causal", (2, 1, 100, 96), torch.bfloat16, dict(lengths=[99, 64]),
     dict(window=1, causal=True)),
]


def _spy_launches(monkeypatch):
    return spy_launches(monkeypatch)


@pytest.mark.parametrize("shape,dtype,opts,kw", [c[1:] for c in SHORT_CASES], ids=[c[0] for c in SHORT_CASES])
@pytest.mark.long_on_cpu
def test_short_rows_take_the_one_tile_backward(monkeypatch, shape, dtype, opts, kw):
    """Rows of at most 64 tokens with a shared table run the short-row backward (dQ, dK, dV and each head's dS
    in one kernel, the table gradient summed over the heads in a second), exact against the float64
    reference: ragged and empty rows, windows, causal, log-spaced and large tables, odd head dims."""
    names = _spy_launches(monkeypatch)
    check_against_reference(make_case(*shape, dtype, **opts), **kw)
    backward = [n for n in names if n.startswith("_bias_bwd")]
    assert backward == ["_bias_bwd_short_kernel", "_bias_bwd_short_table_kernel"], names
    assert [n for n in names if n.startswith("_bias_fwd")] == ["_bias_fwd_short_kernel"], names


@pytest.mark.parametrize("shape,dtype,opts,kw", [c[1:] for c in SHORT2_CASES], ids=[c[0] for c in SHORT2_CASES])
@pytest.mark.long_on_cpu
def test_rows_up_to_128_take_the_two_block_backward(monkeypatch, shape, dtype, opts, kw):
    """Rows of 65..128 tokens with a shared table run the two-block short-row backward, on the interpreted sm_90
    with the key blocks outer at head dims up to 64 (a program per item: dK, dV accumulated over steps of query
    rows, dQ through one fp32 share, delta from O; no second kernel), else query-major (a program per query block:
    exact delta over both key blocks, fp32 shares of dQ, dK, dV added in a fixed order by a second kernel); the
    table gradient per tile, summed over the heads: exact against the float64 reference: ragged rows, an empty
    row, rows of at most 64 tokens in a longer batch (their second blocks get zeros), a row of 65 (one pair in its
    last tile), windows, causal, log-spaced and large tables, odd head dims."""
    names = _spy_launches(monkeypatch)
    check_against_reference(make_case(*shape, dtype, **opts), **kw)
    backward = [n for n in names if n.startswith("_bias_bwd")]
    if shape[3] <= 64:
        assert backward == ["_bias_bwd_short2_keys_kernel", "_bias_bwd_short_table_kernel"], names
    else:
        assert backward == ["_bias_bwd_short2_kernel", "_bias_bwd_short2_sum_kernel",
                            "_bias_bwd_short_table_kernel"], names


@pytest.mark.parametrize("shape,dtype,opts,kw", [SHORT_CASES[0][1:], SHORT2_CASES[0][1:], SHORT2_CASES[1][1:]],
                         ids=[SHORT_CASES[0][0], SHORT2_CASES[0][0], SHORT2_CASES[1][0]])
def test_short_rows_read_back_only_the_scratch_they_wrote(monkeypatch, shape, dtype, opts, kw):
    """The short-row backward writes its fp32 scratch (each head's dS tiles, the two-block kernel's dQ, dK, dV
    shares) only at the positions inside the lengths (rounded up to 8), and the kernels after it read only those:
    with every buffer the launcher allocates filled with NaN, forward and every gradient still match the float64
    reference (ragged and empty rows, rows of at most 64 in a longer batch, a row of 65, causal with a window)."""
    from conftest import nan_scratch

    shapes = nan_scratch(monkeypatch)
    names = _spy_launches(monkeypatch)
    check_against_reference(make_case(*shape, dtype, **opts), **kw)
    assert "_bias_bwd_short_table_kernel" in names, names
    B, H = shape[:2]
    if shape[2] > 64:  # the two-block buffers: dQ one share a head, dK and dV two
        assert any(s[:2] == (B, H) and len(s) == 4 and 128 in s for s in shapes), shapes
        assert (B, H, 2, 2, 64, 64) in shapes, shapes


def test_short_rows_directed_distance_is_exact(monkeypatch):
    """The short-row backward reads each pair at ``distance[b, i, j]`` only: a directed distance needs no
    transposed copy and its gradients are exact."""
    names = _spy_launches(monkeypatch)
    case = make_case(2, 2, 40, 64, torch.bfloat16, lengths=[40, 29], seed=3)
    case["distance"] = torch.randint(0, 256, (2, 40, 40), dtype=torch.uint8,
                                     generator=torch.Generator().manual_seed(4))
    check_against_reference(case)
    assert "_bias_bwd_short_kernel" in names and "_bias_bwd_dkdv_kernel" not in names


@pytest.mark.parametrize("N,lengths,kernel", [(50, [50, 31], "_bias_bwd_short_kernel"),
                                               (110, [110, 31], "_bias_bwd_short2_keys_kernel")])
@pytest.mark.long_on_cpu
def test_short_rows_equal_the_tiled_kernels_and_are_deterministic(monkeypatch, N, lengths, kernel):
    """The same short batch through the short-row backward (one tile, or two blocks) and through the tiled
    kernels (the short path turned off) agrees to rounding, and the short path is bit-identical run to run
    (programs in a shuffled order the second time: no result depends on which program runs first)."""
    case = make_case(2, 2, N, 64, torch.bfloat16, lengths=lengths, seed=5)
    grad_out = torch.randn(2, 2, N, 64, generator=torch.Generator().manual_seed(6))
    names = _spy_launches(monkeypatch)
    short = [_run(case, torch.bfloat16, "triton", grad_out)]
    with shuffled_program_order(seed=N) if P.interpreting() else contextlib.nullcontext():  # (CUDA: a plain rerun)
        short.append(_run(case, torch.bfloat16, "triton", grad_out))
    assert kernel in names
    for name in short[0][1]:
        assert torch.equal(short[0][1][name], short[1][1][name]), name
    monkeypatch.setattr(configs, "_SHORT_ROWS", False)
    names.clear()
    tiled = _run(case, torch.bfloat16, "triton", grad_out)
    assert kernel not in names and "_bias_bwd_dkdv_kernel" in names
    for name in tiled[1]:
        scale = tiled[1][name].double().abs().max().item()
        err = (short[0][1][name].double() - tiled[1][name].double()).abs().max().item()
        assert err <= 2e-2 * scale + 1e-6, (name, err, scale)


@pytest.mark.parametrize("N,lengths,arch,kernel", [(40, [40, 0, 23], 90, "_bias_bwd_short_kernel"),
                                                    (40, [40, 0, 23], 80, "_bias_bwd_short_t_kernel"),
                                                    (100, [100, 64, 0], 90, "_bias_bwd_short2_keys_kernel"),
                                                    (100, [100, 64, 0], 80, "_bias_bwd_short2_kernel")])
@pytest.mark.long_on_cpu
def test_short_row_head_groups_are_bit_identical(monkeypatch, N, lengths, arch, kernel):
    """The short-row kernels split the heads into groups, one program each (as many as fill the GPU): every
    grouping (all 5 heads in one program; 2 groups of 3 and 2 heads; one head a program) gives bit-identical
    outputs and gradients, the launches take the grid the grouping says, and the result is exact against the
    float64 reference (ragged and empty rows; the one-tile kernels both ways, the two-block ones both ways)."""
    case = make_case(3, 5, N, 32, torch.bfloat16, lengths=lengths, seed=11)
    grad_out = torch.randn(3, 5, N, 32, generator=torch.Generator().manual_seed(12))
    grids = []
    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        if "HEAD_GROUPS" in kwargs:
            grids.append((fn.fn.__name__, tuple(grid), kwargs["HEAD_GROUPS"]))
        real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    monkeypatch.setattr(configs, "GROUPED_SPILLS", set())  # (the grouped loop everywhere, spills or not,
    monkeypatch.setattr(configs, "GROUPED_CONFIGS", {})   # with the family's tiles)
    monkeypatch.setattr(_launch, "_CONFIGS", {})
    previous = P.interpret_as(arch)
    results = {}
    try:
        for groups in (1, 2, 5):  # 1: the loop of a single-axis grid (GROUPED=False)
            monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device, n=groups: n)
            grids.clear()
            results[groups] = _run(case, torch.bfloat16, "triton", grad_out)
            blocks = 2 if kernel == "_bias_bwd_short2_kernel" else 1
            assert (kernel, (3, blocks * groups), groups) in grids, grids
            assert ("_bias_fwd_short_kernel", (3, groups), groups) in grids or N > 64, grids
        monkeypatch.undo()
        _launch._CONFIGS.clear()
        check_against_reference(case)  # (the grouping the interpreted GPU gets)
        # Two groups with the tiles a grouped launch takes where the family's spill (GROUPED_CONFIGS: sm_90)
        monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device: 2)
        names = _spy_launches(monkeypatch)
        check_against_reference(case)
        assert kernel in names
        monkeypatch.undo()
        _launch._CONFIGS.clear()
    finally:
        P.interpret_as(previous)
    for groups in (2, 5):
        assert torch.equal(results[groups][0], results[1][0])
        for name in results[1][1]:
            assert torch.equal(results[groups][1][name], results[1][1][name]), (groups, name)


@pytest.mark.parametrize("arch", [90, 100, 120])
def test_one_tile_backward_tiles_per_variant(monkeypatch, arch):
    """The one-tile backward (rows of at most 64 tokens, HEADS a compile-time constant) on sm_90 at D = 64 takes the
    family's tiles grouped or not (configs.GROUPED_CONFIGS has no entry: its grouped loop is spill-free with them),
    but chunks of 32 with T5's term (configs.POSITION_CONFIGS: 136 B grouped, 88 B not, with the family's), which
    sm_100 does not take (it keeps whole 64-column chunks); sm_120 at D = 128 with grouped-query k, v forms its
    outputs in chunks of 16 (configs.GROUPED_KV_CONFIGS), without them the family's 32; sm_90 at D = 128 with
    grouped-query k, v takes score chunks of 16 on a single-axis grid (32 spill 8 B there), its grouped launches
    the family's 32 on eight warps, and sm_100 Blackwell's 64 on four, grouped or not; with T5's term at D = 128
    sm_90 runs eight warps on a single-axis grid as grouped (configs.POSITION_CONFIGS)."""
    from syntaxkernels.specs import BucketSpec

    monkeypatch.setattr(_launch, "_CONFIGS", {})
    previous = P.interpret_as(arch)
    try:
        def short(D, position=False, grouped=False):
            return _launch.launch_configs(50, D, D, torch.bfloat16, 1, -1, BucketSpec(), position=position,
                                          grouped=grouped).short

        plain = short(64)
        assert "GROUPED_CONFIG" not in plain
        chunks = (plain["CHUNK"], plain["OUT_CHUNK"], plain["DQ_T"])
        with_term = short(64, position=True)
        if arch == 90:
            assert chunks == (64, 64, False) and (with_term["CHUNK"], with_term["OUT_CHUNK"]) == (32, 32)
            gqa = short(128, grouped=True)
            assert gqa["CHUNK"] == 16 and gqa["GROUPED_CONFIG"] == {"num_warps": 8, "CHUNK": 32}
            assert short(128)["CHUNK"] == 32 and short(128)["GROUPED_CONFIG"] == {"num_warps": 8}
            # T5's term at D = 128: eight warps on a single-axis grid too (four spill 8 B there)
            assert short(128, position=True)["num_warps"] == 8 and short(128)["num_warps"] == 4
        elif arch == 100:
            assert (with_term["CHUNK"], with_term["OUT_CHUNK"], with_term["DQ_T"]) == chunks == (64, 64, False)
            gqa = short(128, grouped=True)
            assert (gqa["CHUNK"], gqa["num_warps"], gqa.get("GROUPED_CONFIG", {})) == (64, 4, {})
        else:
            assert with_term == plain
            assert short(128, grouped=True)["OUT_CHUNK"] == 16 and short(128)["OUT_CHUNK"] == 32
    finally:
        P.interpret_as(previous)


@pytest.mark.parametrize("arch", [90, 100])
def test_causal_two_block_rows_take_their_own_grouped_tiles(monkeypatch, arch):
    """configs.CAUSAL_CONFIGS: a causal call of 65..128-token rows at D = 128 on the sm90 family (sm_90, sm_100)
    takes its own grouped tiles for the two-block backward (its grouped loop spills with the family's on sm_90: 48 B,
    24 B grouped-query): sm_90 chunks of 32 with dQ not transposed, sm_100 the family's own tiles (chunks of 32,
    output chunks of 64, dQ transposed: the sm_90 entry would apply there otherwise); the non-causal call, the
    one-tile rows and other families keep theirs (at D = 64 the two-block kernel runs with the key blocks outer,
    its own causal tiles). configs.GROUPED_KV_CONFIGS: sm_120's two-block backward
    at D = 128 with grouped-query k, v forms dQ transposed (the small family's tiles spill 8 B there), causal or
    not; without grouped-query it keeps the family's."""
    from syntaxkernels.specs import BucketSpec

    monkeypatch.setattr(_launch, "_CONFIGS", {})
    previous = P.interpret_as(arch)
    try:
        def short(N, D, causal, grouped=False):
            return _launch.launch_configs(N, D, D, torch.bfloat16, 1, -1, BucketSpec(), grouped=grouped,
                                          causal=causal).short

        for grouped in (False, True):  # (grouped-query k, v or not)
            causal, plain = short(100, 128, True, grouped), short(100, 128, False, grouped)
            assert causal["GROUPED_CONFIG"] == (dict(CHUNK=32, OUT_CHUNK=32, DQ_T=False) if arch == 90
                                                else dict(CHUNK=32, OUT_CHUNK=64, DQ_T=True))
            assert "GROUPED_CONFIG" not in plain
            assert {k: v for k, v in causal.items() if k != "GROUPED_CONFIG"} == plain  # (ungrouped: the family's)
            assert short(100, 96, True, grouped)["GROUPED_CONFIG"] == causal["GROUPED_CONFIG"]  # (D = 96: pads to 128)
        for N, D in ((50, 128), (50, 64)):
            assert short(N, D, True) == short(N, D, False), (N, D)
        # D = 64: the two-block kernel with the key blocks outer (its causal tiles:
        # test_two_block_rows_take_the_key_blocks_outer_on_the_sm90_family)
        assert short(100, 64, True)["KEYS_OUTER"] and short(100, 64, False)["KEYS_OUTER"]
    finally:
        P.interpret_as(previous)
    for other in (80, 86, 120):
        previous = P.interpret_as(other)
        try:
            assert short(100, 128, True) == short(100, 128, False), other
            # dQ transposed: the family's (sm80 yes, small no), but sm_120's with grouped-query k, v
            assert short(100, 128, False)["DQ_T"] is (other == 80)
            assert short(100, 128, False, True)["DQ_T"] is (other != 86) is short(100, 128, True, True)["DQ_T"]
        finally:
            P.interpret_as(previous)


@pytest.mark.parametrize("arch", [90, 100])
def test_two_block_rows_take_the_key_blocks_outer_on_the_sm90_family(monkeypatch, arch):
    """On sm_90 and sm_100 at head dims up to 64 the two-block backward runs with the key blocks outer
    (configs.CONFIGS' KEYS_OUTER: steps of 16 query rows, whole 64-column chunks, dQ transposed), with a positional
    window too; a causal call keeps those tiles grouped, and on sm_90 takes chunks of 32 with dQ not transposed on
    a single-axis grid (configs.CAUSAL_CONFIGS: the family's spill 16 B there with grouped-query k, v); D = 96 and
    128 keep the query-major kernel, and so do the mma.sync families' base configs (the small family's grouped
    launches: the next test)."""
    from syntaxkernels.specs import BucketSpec

    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch)
    try:
        case = make_case(1, 2, 70, 32, torch.bfloat16, lengths=[70], seed=23)
        for kw in (dict(), dict(position_window=9), dict(causal=True)):
            names.clear()
            names.kwargs.clear()
            check_against_reference(case, **kw)
            launched = [k for name, k in zip(names, names.kwargs) if name.startswith("_bias_bwd_short2")]
            assert [name for name in names if name.startswith("_bias_bwd_short2")] == \
                ["_bias_bwd_short2_keys_kernel"], (kw, names)
            assert launched[0]["GROUPED"] and (launched[0]["ROWS"], launched[0]["CHUNK"]) == (16, 32), kw
            # (CHUNK is capped at the head dim's block: 32 here)

        def short(N, D, causal=False):
            return _launch.launch_configs(N, D, D, torch.bfloat16, 1, -1, BucketSpec(), causal=causal).short

        plain, causal = short(100, 64), short(100, 64, True)
        assert plain["KEYS_OUTER"] and (plain["ROWS"], plain["CHUNK"], plain["OUT_CHUNK"], plain["DQ_T"]) == \
            (16, 64, 64, True)
        assert causal["GROUPED_CONFIG"] == dict(CHUNK=64, OUT_CHUNK=64, DQ_T=True)
        ungrouped = (causal["CHUNK"], causal["OUT_CHUNK"], causal["DQ_T"])
        assert ungrouped == ((32, 32, False) if arch == 90 else (64, 64, True))
        for D in (96, 128):
            assert not short(100, D).get("KEYS_OUTER")
    finally:
        P.interpret_as(previous)
    for other in (80, 86, 120):
        assert not configs.select_config("short2", torch.bfloat16, 64, arch=other).get("KEYS_OUTER"), other


@pytest.mark.parametrize("arch", [86, 120])
@pytest.mark.long_on_cpu
def test_two_block_rows_on_the_small_family_take_the_key_blocks_outer_when_grouped(monkeypatch, arch):
    """The small family (sm_86, sm_89, sm_120) at head dims up to 64: grouped launches of the two-block backward run
    with the key blocks outer (the family's GROUPED_CONFIG: steps of 16 rows, chunks of 32, dQ not transposed), a
    single-axis grid (a batch of at least two programs a multiprocessor) the query-major kernel and its sum kernel
    (the key blocks outer spill 8-16 B there on single-axis causal or windowed calls); the head groups are counted
    for the kernel that runs grouped (a program per item). sm_80 and D = 128 keep the query-major kernel. Both
    launches, plain, causal and with a positional window, are exact against the float64 reference."""
    from syntaxkernels.specs import BucketSpec

    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch)
    try:
        def short(N, D):
            return _launch.launch_configs(N, D, D, torch.bfloat16, 1, -1, BucketSpec()).short

        base = short(100, 64)
        assert not base.get("KEYS_OUTER") and base["GROUPED_CONFIG"]["KEYS_OUTER"]
        cpu = torch.device("cpu")
        grouped, groups = _launch.short2_grouping(base, 48, 12, cpu)
        # 48 items on 84 / 170 multiprocessors: groups counted for 48 programs (4 / 6), not 96 (2 / 4)
        assert groups == _launch.head_groups(48, 12, cpu) > _launch.head_groups(96, 12, cpu)
        assert grouped["KEYS_OUTER"] and (grouped["ROWS"], grouped["CHUNK"], grouped["OUT_CHUNK"],
                                          grouped["DQ_T"]) == (16, 32, 32, False)
        assert _launch.short2_grouping(base, 1000, 12, cpu) == (base, 1)
        assert "GROUPED_CONFIG" not in short(100, 128) and not short(100, 128).get("KEYS_OUTER")
        case = make_case(2, 4, 70, 32, torch.bfloat16, lengths=[70, 53], seed=29)
        for groups, kw in ((2, dict()), (2, dict(causal=True)), (2, dict(position_window=9)), (1, dict())):
            monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device, g=groups: g)
            names.clear()
            names.kwargs.clear()
            check_against_reference(case, **kw)
            two_block = [(n, k) for n, k in zip(names, names.kwargs) if n.startswith("_bias_bwd_short2")]
            if groups > 1:
                assert [n for n, _ in two_block] == ["_bias_bwd_short2_keys_kernel"], (kw, names)
                assert two_block[0][1]["GROUPED"] and two_block[0][1]["ROWS"] == 16, kw
            else:
                assert [n for n, _ in two_block] == ["_bias_bwd_short2_kernel", "_bias_bwd_short2_sum_kernel"], names
    finally:
        P.interpret_as(previous)
    previous = P.interpret_as(80)
    try:
        assert "GROUPED_CONFIG" not in _launch.launch_configs(100, 64, 64, torch.bfloat16, 1, -1, BucketSpec()).short
    finally:
        P.interpret_as(previous)


@pytest.mark.parametrize("arch,chunks", [(90, (32, 32, False)), (100, (32, 64, True)), (120, (16, 32, True))])
@pytest.mark.long_on_cpu
def test_causal_two_block_grouped_tiles_are_exact(monkeypatch, arch, chunks):
    """The causal two-block backward at D = 128 with its own grouped tiles (configs.CAUSAL_CONFIGS: sm_90 chunks of
    32 with dQ not transposed, sm_100 the family's; configs.GROUPED_KV_CONFIGS: sm_120 dQ transposed) on an
    interpreted GPU, heads in two groups (sm_120's two-block kernel at D = 128 walks every head in one program:
    configs.GROUPED_SPILLS), grouped-query k and v: exact against the float64 reference (ragged rows, one of at most
    64 tokens)."""
    monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device: 2)
    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch)
    try:
        case = make_case(2, 2, 100, 128, torch.bfloat16, kv_heads=1, lengths=[100, 57], seed=21)
        check_against_reference(case, causal=True)
    finally:
        P.interpret_as(previous)
    launched = [kw for name, kw in zip(names, names.kwargs) if name == "_bias_bwd_short2_kernel"]
    groups = 1 if arch == 120 else 2
    assert launched and all(kw["GROUPED"] is (groups > 1) and kw["HEAD_GROUPS"] == groups for kw in launched), names
    assert all((kw["CHUNK"], kw["OUT_CHUNK"], kw["DQ_T"]) == chunks for kw in launched)


def test_head_groups_fill_the_gpu(monkeypatch):
    """The short-row grids: the fewest head groups with which the programs still give every multiprocessor two,
    groups of equal size or one fewer head; never more groups than heads."""
    cases = [  # (programs, H, multiprocessors) -> groups
        ((32, 12, 132), 6),    # 32 sentences: 6 groups of 2 heads, 192 programs
        ((64, 12, 132), 4),    # 5 wanted -> 3 heads a group: 4 groups, 256 programs
        ((512, 12, 132), 1),   # a large batch fills the GPU alone
        ((1, 12, 132), 12),    # one sentence: a program per head
        ((8, 16, 108), 16),
        ((3, 5, 1), 1),
        ((3, 5, 4), 3),        # 3 wanted: groups of 2, 2 and 1 heads
    ]
    for (programs, H, count), expected in cases:
        monkeypatch.setattr(P, "_MULTIPROCESSORS_OVERRIDE", count)
        assert _launch.head_groups(programs, H, torch.device("cpu")) == expected, (programs, H, count)
    monkeypatch.setattr(P, "_MULTIPROCESSORS_OVERRIDE", None)
    previous = P.interpret_as(80)
    try:
        assert P.multiprocessors(torch.device("cpu")) == P.MULTIPROCESSORS[80] == 108
    finally:
        P.interpret_as(previous)


def test_padded_batches_of_short_rows_take_smaller_tiled_tiles():
    """Calls of 65..512 tokens (a fine-tuning batch padded to 128 or 512) take PADDED_CONFIGS' forward (64 rows, 32
    keys on four warps; 32x32 on two at D = 128 on sm_80 and the small family), dQ (64 rows, 32 keys a step) and
    dK/dV (64 keys, 32 queries a step) tiles on four warps on every family with configs, with dropout too at D = 64
    (its entries after), and the table kernel's 32x32 where it was spill-free; causal calls and calls with T5's term
    too, the term's under their own entries' refinements (applied after the term's), causal calls with the term
    under the refinements naming both, grouped-query calls under the grouped loop's entries and the padded ones naming
    "grouped_kv", calls with a distance window or a positional one, with T5's term too (under the entries naming
    both); longer rows, grouped-query calls with T5's term, dropout at D = 128, and the tests' tile override keep the
    long rows' tiles."""
    spec = sk.BucketSpec()

    def forward(arch, N, D=64, **kw):
        previous = P.interpret_as(arch)
        try:
            window = kw.pop("window", -1)
            c = _launch.launch_configs(N, D, D, torch.bfloat16, 1, window, spec, **kw).fwd
        finally:
            P.interpret_as(previous)
        return c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]

    for arch in (80, 86, 89, 90, 100, 120):
        for D in (64, 128):
            small = (32, 32, 2) if D == 128 and arch not in (90, 100) else (64, 32, 4)
            assert forward(arch, 65, D) == forward(arch, 128, D) == forward(arch, 512, D) == small, (arch, D)
            assert forward(arch, 513, D) != small and forward(arch, 513, D) == forward(arch, 1024, D), (arch, D)
            # a positional window and a distance window (the kernels walk the live-tile lists): the padded tiles too,
            # with T5's term too (sm_80's D = 64 forward with it and a positional window on 32 x 32, two warps)
            assert forward(arch, 300, D, band=200) == small != forward(arch, 600, D, band=200), (arch, D)
            # ... and a narrow positional window (W <= NARROW_BAND_LIMIT) on rows of any length, the plan's summary
            # saying they are long too
            assert forward(arch, 600, D, band=64) == forward(arch, 4096, D, band=0) == small, (arch, D)
            assert forward(arch, 4096, D, band=10, short_rows=0) == small != forward(arch, 4096, D, band=65), (arch, D)
            assert forward(arch, 300, D, window=3) == small != forward(arch, 600, D, window=3), (arch, D)
            assert forward(arch, 300, D, position=True, window=3) == small != forward(
                arch, 600, D, position=True, window=3), (arch, D)
            term_band = (32, 32, 2) if (arch, D) == (80, 64) else small
            assert forward(arch, 300, D, position=True, band=200) == term_band != forward(
                arch, 600, D, position=True, band=200), (arch, D)
            assert forward(arch, 4096, D, position=True, band=16) == term_band, (arch, D)
            assert forward(arch, 300, D, grouped=True) == small != forward(arch, 600, D, grouped=True), (arch, D)
            assert forward(arch, 300, D, causal=True) == small != forward(arch, 600, D, causal=True), (arch, D)
            # causal with T5's term (a T5 decoder): the padded tiles, the small family's D = 64 forward on 64 x 16
            causal_term = (64, 16, 4) if D == 64 and arch in (86, 89, 120) else small
            assert forward(arch, 300, D, causal=True, position=True) == causal_term != forward(
                arch, 600, D, causal=True, position=True), (arch, D)
            assert forward(arch, 300, D, position=True) == small != forward(arch, 600, D, position=True), (arch, D)
        assert forward(arch, 300, 64, dropout=True) == (64, 32, 4), arch  # (with dropout at D = 64 too)
        assert forward(arch, 300, 128, dropout=True) == forward(arch, 600, 128, dropout=True), arch

    def tiles(arch, N, D=64, **kw):
        previous = P.interpret_as(arch)
        try:
            window = kw.pop("window", -1)
            c = _launch.launch_configs(N, D, D, torch.bfloat16, 1, window, spec, **kw)
        finally:
            P.interpret_as(previous)
        return (c.dq["BLOCK_M"], c.dq["BLOCK_N"], c.dq["num_warps"]), (c.dkdv["BLOCK_M"], c.dkdv["BLOCK_N"],
                                                                       c.dkdv["num_warps"])

    padded = ((64, 32, 4), (32, 64, 4))
    for arch in (80, 86, 89, 90, 100, 120):
        for D in (64, 128):
            assert tiles(arch, 512, D) == tiles(arch, 129, D) == padded, (arch, D)
            assert tiles(arch, 513, D) != padded and tiles(arch, 1024, D) == tiles(arch, 513, D), (arch, D)
            assert tiles(arch, 512, D, band=10) == padded, (arch, D)
            assert tiles(arch, 512, D, window=3) == padded, (arch, D)
            # grouped-query k, v: the padded dQ, and dK/dV under the grouped loop's entries (GROUPED_KV_CONFIGS', then
            # the padded ones naming "grouped_kv", where the padded tiles spilled)
            small = arch in (86, 89, 120)
            grouped_dkdv = {(80, 64): (16, 64, 4), (90, 128): (16, 32, 4), (100, 128): (16, 32, 4),
                            (80, 128): (32, 32, 4)}.get((arch, D), (32, 32, 4) if small else padded[1])
            assert tiles(arch, 300, D, grouped=True) == (padded[0], grouped_dkdv), (arch, D)
            assert tiles(arch, 300, D, grouped=True, causal=True) == (
                padded[0], (16, 64, 4) if small and D == 64 else grouped_dkdv), (arch, D)
            assert tiles(arch, 600, D, grouped=True)[1] != grouped_dkdv, (arch, D)
            # ... with a distance window: the small family's D = 128 32 x 32 on one stage (sm_120 16 x 32), sm_120's
            # D = 64 16 x 64 (where the grouped tiles spilled under the lists)
            window_dkdv = {(120, 128): (16, 32, 4), (120, 64): (16, 64, 4)}.get((arch, D), grouped_dkdv)
            assert tiles(arch, 300, D, grouped=True, window=3) == (padded[0], window_dkdv), (arch, D)
            # (with T5's term too the grouped calls keep the long rows' tiles: the padded ones spilled there)
            assert tiles(arch, 300, D, grouped=True, position=True) == tiles(arch, 600, D, grouped=True,
                                                                             position=True), (arch, D)
            assert tiles(arch, 512, D, causal=True) == padded != tiles(arch, 600, D, causal=True), (arch, D)
            # T5's term: the padded tiles, refined where the term's entries over them spilled
            dkdv = {(80, 128): (32, 32, 4), (86, 128): (32, 32, 4), (89, 128): (32, 32, 4), (120, 128): (32, 32, 4),
                    (90, 128): (16, 64, 4), (100, 128): (16, 64, 4)}.get((arch, D), padded[1])
            assert tiles(arch, 300, D, position=True) == (padded[0], dkdv), (arch, D)
            # causal too: sm_90's dK/dV at D = 128 16 x 32 (sm_100 too; 16 x 64 spilled), the small family's at D = 128
            # on one stage (two spilled)
            causal_dkdv = {(90, 128): (16, 32, 4), (100, 128): (16, 32, 4)}.get((arch, D), dkdv)
            assert tiles(arch, 300, D, causal=True, position=True) == (padded[0], causal_dkdv), (arch, D)
    assert tiles(120, 300, 128, grouped=True, causal=True, window=3)[1] == (32, 32, 4)  # (16 x 32 spilled there)
    # A positional window with grouped-query k, v (causal: a sliding-window decoder): the small family's dK/dV on one
    # stage, sm_120's 16 x 64 at D = 64 (32 x 32 spilled) and two stages at D = 128 unless causal
    for arch in (86, 89, 120):
        for D in (64, 128):
            for causal in (False, True):
                previous = P.interpret_as(arch)
                try:
                    dkdv = _launch.launch_configs(300, D, D, torch.bfloat16, 1, -1, spec, grouped=True, causal=causal,
                                                  band=10).dkdv
                finally:
                    P.interpret_as(previous)
                want = ((16, 64, 1) if (arch, D) == (120, 64) else (32, 32, 2) if (arch, D, causal) == (120, 128, False)
                        else (32, 32, 1))
                assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"], dkdv["num_stages"]) == want, (arch, D, causal)
    assert tiles(90, 300, dropout=True)[0][:2] == (64, 32)
    for arch in (80, 86, 89, 90, 100, 120):  # dropout on rows of 65..128 tokens: the tiled backward (the two-block
        assert tiles(arch, 100, dropout=True) == padded, arch  # kernels take no dropout mask) on the padded tiles
    previous = P.interpret_as(120)  # sm_120's forward with dropout: one stage (two spilled 8 B)
    try:
        stages = [_launch.launch_configs(300, 64, 64, torch.bfloat16, 1, -1, spec, dropout=p).fwd["num_stages"]
                  for p in (True, False)]
    finally:
        P.interpret_as(previous)
    assert stages == [1, 2]
    previous = P.interpret_as(100)  # sm_100's forward with either window and dropout: one stage (three spilled)
    try:
        stages = [_launch.launch_configs(300, 64, 64, torch.bfloat16, 1, window, spec, band=band, dropout=p).fwd[
            "num_stages"] for window, band in ((-1, 10), (3, -1)) for p in (True, False)]
        # ... and its dK/dV at D = 64 in causal calls with a positional window: one stage (three kept 8 B on the stack
        # on 1000-token rows, where a narrow window takes these tiles)
        stages += [_launch.launch_configs(N, 64, 64, torch.bfloat16, 1, -1, spec, band=10, causal=True).dkdv[
            "num_stages"] for N in (300, 1000)]
    finally:
        P.interpret_as(previous)
    assert stages == [1, 3, 1, 3, 1, 1]
    for arch in (80, 86, 90, 120):  # dropout at D = 128: exactly the long rows' dropout tiles
        assert tiles(arch, 300, 128, dropout=True) == tiles(arch, 600, 128, dropout=True), arch

    def table(arch, N, D=64, **kw):
        previous = P.interpret_as(arch)
        try:
            window = kw.pop("window", -1)
            c = _launch.launch_configs(N, D, D, torch.bfloat16, 1, window, spec, **kw).table
        finally:
            P.interpret_as(previous)
        return c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]

    # The table kernel: 32x32 on four warps at D = 64 on every family, at D = 128 on the small family and sm_100;
    # sm_80's and sm_90's D = 128 tiles stay, and with dropout the dropout entries' tiles
    for arch in (80, 86, 89, 90, 100, 120):
        assert table(arch, 512) == table(arch, 512, window=3) == (32, 32, 4) != table(arch, 513), arch
        assert table(arch, 300, dropout=True) == table(arch, 600, dropout=True), arch
    for arch in (86, 89, 100, 120):
        assert table(arch, 512, 128) == (32, 32, 4), arch
    for arch in (80, 90):
        assert table(arch, 512, 128) == table(arch, 600, 128), arch
    # With a distance window and dropout, sm_90's table kernel at D = 64 (the dropout entry's 128 x 32 spilled under
    # the lists): padded 32 x 32 on four warps (sm_100 too), longer rows 128 x 16 (sm_100 its 64 x 64)
    for arch, padded_table, long_table in ((90, (32, 32, 4), (128, 16, 8)), (100, (32, 32, 4), (64, 64, 8))):
        assert table(arch, 300, window=3, dropout=True) == padded_table, arch
        assert table(arch, 600, window=3, dropout=True) == long_table, arch
        assert table(arch, 300, dropout=True) == table(arch, 600, dropout=True) != padded_table, arch
        # (grouped-query k, v too, causal too: 64 x 16 on four warps, where the 32 x 32 spilled)
        assert table(arch, 300, window=3, dropout=True, grouped=True) == (64, 16, 4), arch
        assert table(arch, 300, window=3, dropout=True, grouped=True, causal=True) == (64, 16, 4), arch
    previous = P.interpret_as(90)  # (and sm_90's grouped dK/dV there on one stage: three spilled 8 B)
    try:
        assert _launch.launch_configs(300, 64, 64, torch.bfloat16, 1, 3, spec, grouped=True, dropout=True).dkdv[
            "num_stages"] == 1
    finally:
        P.interpret_as(previous)
    # With T5's term ("table_extra" tiles under the term's entries): the small family's D = 128 32x16 (sm_120 32x32),
    # sm_120's D = 64 32x32, sm_100's dK/dV at D = 64 with dropout 32x64 (the dropout entry's 64 queries spilled)
    assert table(86, 300, 128, position=True) == (32, 16, 4) and table(120, 300, 128, position=True) == (32, 32, 4)
    assert table(120, 300, 64, position=True)[:2] == (32, 32)
    assert tiles(100, 300, 64, position=True, dropout=True)[1][:2] == (32, 64)
    # causal with T5's term: sm_90's table kernel at D = 128 64 x 16 on four warps (its 64 x 32 on eight spilled),
    # sm_100 64 x 32 on four
    assert table(90, 300, 128, causal=True, position=True) == (64, 16, 4)
    assert table(100, 300, 128, causal=True, position=True) == (64, 32, 4)
    # T5's term with either window (the entries naming both, where the term's padded tiles spilled under the lists):
    # the table kernel at D = 64 64 x 16 on four warps (sm_100, sm_120 32 x 32), at D = 128 the small family's 64 x 32
    # on eight (sm_120 32 x 32); sm_90's dK/dV at D = 128 16 x 32 (sm_100 16 x 64 with a distance window); with a
    # positional window sm_120's dQ at D = 64 64 x 16
    for window in (dict(window=3), dict(band=10)):
        for arch in (80, 86, 89, 90, 100, 120):
            want = (32, 32, 4) if arch in (100, 120) else (64, 16, 4)
            assert table(arch, 300, 64, position=True, **window) == want, (arch, window)
        for arch in (86, 89):
            assert table(arch, 300, 128, position=True, **window) == (64, 32, 8), (arch, window)
        assert table(120, 300, 128, position=True, **window) == (32, 32, 4)
        assert tiles(90, 300, 128, position=True, **window)[1] == (16, 32, 4)
        assert tiles(100, 300, 128, position=True, **window)[1] == ((16, 64, 4) if "window" in window else (16, 32, 4))
        assert tiles(120, 300, 64, position=True, **window)[0] == ((64, 16, 4) if "band" in window else (64, 32, 4))
        # ... with dropout sm_120's table kernel 64 x 16 on four warps (the dropout entries' 64 x 32 on eight spilled)
        assert table(120, 300, 64, position=True, dropout=True, **window) == (64, 16, 4)
    # ... in a causal call with a distance window: sm_80's forward 32 x 32 on two warps, sm_120's dQ 32 x 32; with
    # dropout sm_80's dK/dV 32 x 32
    assert forward(80, 300, 64, causal=True, position=True, window=3) == (32, 32, 2)
    assert tiles(120, 300, 64, causal=True, position=True, window=3)[0] == (32, 32, 4)
    assert tiles(80, 300, 64, position=True, window=3, dropout=True)[1] == (32, 32, 4)
    previous = configs._BLOCK_OVERRIDE
    try:
        configs._BLOCK_OVERRIDE = (16, 16)
        assert tiles(90, 300) == ((16, 16, 8), (16, 16, 8))
    finally:
        configs._BLOCK_OVERRIDE = previous


@pytest.mark.long_on_cpu
def test_padded_tiles_are_exact(monkeypatch):
    """A padded batch of short rows on the padded tiles (interpreted sm_80: the forward 64x32, dQ 64x32, dK/dV 32x64,
    the table kernel 32x32 on four warps, causal calls and calls with a distance or positional window too (their
    live-tile lists; rows that fill the long tiles with a narrow positional window too), grouped-query ones with the
    grouped loop's dK/dV 16x64; at D = 128 on 65..128 tokens the forward 32x32 on two warps): ragged, empty and full
    rows exact against the float64 reference."""
    kernels = ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel")
    previous = P.interpret_as(80)
    try:
        names = spy_launches(monkeypatch, fresh_configs=True)
        check_against_reference(make_case(3, 2, 150, 64, torch.bfloat16, lengths=[150, 37, 0]))
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == {"_bias_fwd_kernel": (64, 32, 4), "_bias_bwd_dq_kernel": (64, 32, 4),
                         "_bias_bwd_dkdv_kernel": (32, 64, 4), "_bias_bwd_table_kernel": (32, 32, 4)}, tiles
        names.clear()
        names.kwargs.clear()
        check_against_reference(make_case(3, 2, 150, 64, torch.bfloat16, lengths=[150, 37, 0]), causal=True)
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == {"_bias_fwd_kernel": (64, 32, 4), "_bias_bwd_dq_kernel": (64, 32, 4),
                         "_bias_bwd_dkdv_kernel": (32, 64, 4), "_bias_bwd_table_kernel": (32, 32, 4)}, tiles
        names.clear()
        names.kwargs.clear()
        # a distance window and a positional one (the live-tile lists on the padded tiles)
        for window in (dict(window=2), dict(position_window=20)):
            check_against_reference(make_case(3, 2, 150, 64, torch.bfloat16, lengths=[150, 37, 0]), **window)
            tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs)
                     if n in kernels}
            assert tiles == {"_bias_fwd_kernel": (64, 32, 4), "_bias_bwd_dq_kernel": (64, 32, 4),
                             "_bias_bwd_dkdv_kernel": (32, 64, 4), "_bias_bwd_table_kernel": (32, 32, 4)}, tiles
            assert all(k.get("USE_LISTS") for n, k in zip(names, names.kwargs) if n in kernels), window
            names.clear()
            names.kwargs.clear()
        # grouped-query k, v in a causal call (a grouped-query decoder): the grouped loop's 16 x 64 dK/dV
        check_against_reference(make_case(3, 4, 150, 64, torch.bfloat16, lengths=[150, 37, 0], kv_heads=2),
                                causal=True)
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == {"_bias_fwd_kernel": (64, 32, 4), "_bias_bwd_dq_kernel": (64, 32, 4),
                         "_bias_bwd_dkdv_kernel": (16, 64, 4), "_bias_bwd_table_kernel": (32, 32, 4)}, tiles
        names.clear()
        names.kwargs.clear()
        check_against_reference(make_case(2, 1, 70, 128, torch.bfloat16, lengths=[70, 0]))
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == {"_bias_fwd_kernel": (32, 32, 2)}, tiles  # (the two-block short-row backward)
        names.clear()
        names.kwargs.clear()
        # long rows (here 200 tokens past a lowered PADDED_ROW_LIMIT, no plan summary) with a narrow positional
        # window: the padded tiles
        monkeypatch.setattr(configs, "PADDED_ROW_LIMIT", 128)
        assert _launch.launch_configs(200, 64, 64, torch.bfloat16, 1, -1, sk.BucketSpec()).fwd["BLOCK_M"] == 128
        check_against_reference(make_case(2, 2, 200, 64, torch.bfloat16, lengths=[200, 191]), position_window=6)
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == {"_bias_fwd_kernel": (64, 32, 4), "_bias_bwd_dq_kernel": (64, 32, 4),
                         "_bias_bwd_dkdv_kernel": (32, 64, 4), "_bias_bwd_table_kernel": (32, 32, 4)}, tiles
        assert all(k.get("USE_LISTS") for n, k in zip(names, names.kwargs) if n in kernels)
    finally:
        P.interpret_as(previous)


def test_the_plans_row_class_picks_the_padded_tiles_not_n():
    """``launch_configs(..., short_rows=)``, the plan's summary of its lengths: short rows (1) take PADDED_CONFIGS'
    tiles at any N above 64 (beyond 512 tokens too), rows that fill the long tiles (0) keep the long rows' tiles
    at 65..512 tokens, and without a summary (-1) N decides as before; a causal call keeps its own tiles either way."""
    spec = sk.BucketSpec()

    def tiles(arch, N, D, short_rows, **kw):
        previous = P.interpret_as(arch)
        try:
            c = _launch.launch_configs(N, D, D, torch.bfloat16, 1, -1, spec, short_rows=short_rows, **kw)
        finally:
            P.interpret_as(previous)
        return c.fwd, c.dq, c.dkdv, c.table

    for arch in (80, 86, 90, 100, 120):
        for D in (64, 128):
            padded, long = tiles(arch, 300, D, -1), tiles(arch, 1024, D, -1)
            assert padded != long, (arch, D)
            assert tiles(arch, 1024, D, 1) == tiles(arch, 2000, D, 1) == tiles(arch, 65, D, 1) == padded, (arch, D)
            assert tiles(arch, 65, D, 0) == long, (arch, D)  # (above 128 tokens LONG_ROW_CONFIGS: the next test)
            assert tiles(arch, 300, D, 1, causal=True) == padded, (arch, D)  # (causal calls too)
            assert tiles(arch, 300, D, 0, causal=True) == long, (arch, D)
            assert tiles(arch, 64, D, 1) == tiles(arch, 64, D, 0), (arch, D)  # (the one-tile kernels' rows)


def test_long_rows_take_their_own_tiles_above_128_tokens_in_plain_calls():
    """A plan whose rows fill the long tiles (``short_rows`` 0) takes LONG_ROW_CONFIGS over the family's tiles in calls
    of more than 128 tokens (long trees, padded batches of full rows), looked up here by hand for each family (its
    entries, then sm_100's on sm_100); calls with causality, dropout, T5's term, grouped-query k, v or a window, rows
    of 65..128 tokens and plans without a summary keep the family's tiles."""
    spec = sk.BucketSpec()
    kinds = ("fwd", "dq", "dkdv", "table")

    def tiles(arch, N, D, short_rows, window=-1, **kw):
        previous = P.interpret_as(arch)
        try:
            c = _launch.launch_configs(N, D, D, torch.bfloat16, 1, window, spec, short_rows=short_rows, **kw)
        finally:
            P.interpret_as(previous)
        return [getattr(c, kind) for kind in kinds]

    changed = set()
    for arch, family in ((80, "sm80"), (86, "small"), (89, "small"), (90, "sm90"), (100, "sm90"), (120, "small")):
        for D in (64, 128):
            base = tiles(arch, 1024, D, -1)
            names = [family] + (["sm100"] if arch >= 100 and family == "sm90" else [])
            want = [dict(config) for config in base]
            for name in names:
                for (kind, fam, cls, dim), fields in configs.LONG_ROW_CONFIGS.items():
                    if (fam, cls, dim) == (name, "half", D):
                        want[kinds.index(kind)].update(fields)
            assert tiles(arch, 1024, D, 0) == tiles(arch, 300, D, 0) == tiles(arch, 129, D, 0) == want, (arch, D)
            changed |= {(arch, D, kind) for kind, a, b in zip(kinds, base, want) if a != b}
            for kw in (dict(causal=True), dict(dropout=True), dict(position=True), dict(grouped=True),
                       dict(band=10), dict(window=3)):
                assert tiles(arch, 1024, D, 0, **kw) == tiles(arch, 1024, D, -1, **kw), (arch, D, kw)
            assert tiles(arch, 2000, D, -1) == base, (arch, D)  # (no summary: the family's tiles)
    assert {(90, 128, "dq"), (80, 64, "fwd"), (100, 128, "dkdv"), (86, 128, "dq")} <= changed, changed


@pytest.mark.long_on_cpu
def test_short_rows_beyond_512_tokens_and_full_rows_take_their_tiles_exactly(monkeypatch):
    """Through the op on a plan made once from host lengths (``structure_plan``, as a collator's batch): rows of 40
    and 23 tokens padded to 600 run the padded tiles (interpreted sm_90: forward 64x32, dQ 64x32, dK/dV 32x64, table
    32x32), full rows of 300 the long rows' ones (LONG_ROW_CONFIGS over the family's), both exact against the float64
    reference; the same short rows as bare tensors (a plan per call, no lengths read) the family's tiles (N decides);
    full rows of 200 on sm_80, sm_100 and sm_86 LONG_ROW_CONFIGS' backward tiles, exact."""

    def planned(q, k, v, distance, table, lengths=None, **kw):
        plan = structure_plan(distance, lengths.cpu())
        assert plan.short_rows is not None
        return sk.syntax_bias_attention(q, k, v, plan, table, backend="triton", **kw)

    def check(case):
        B, H, N, D = case["q"].shape
        dtype = case["dtype"]
        grad_out = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(1))
        got = bias_attention_grads(planned, case, dtype, grad_out, DEVICE)
        want64 = _run(case, torch.float64, "reference", grad_out)
        assert_bias_attention_close(case, got, want64, _run(case, dtype, "reference", grad_out), dtype)

    kernels = ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel")

    def launched(names):
        return {n: (k["BLOCK_M"], k["BLOCK_N"]) for n, k in zip(names, names.kwargs) if n in kernels}

    previous = P.interpret_as(90)
    try:
        names = spy_launches(monkeypatch, fresh_configs=True)
        short = make_case(2, 1, 600, 32, torch.bfloat16, lengths=[40, 23])
        check(short)
        assert launched(names) == {"_bias_fwd_kernel": (64, 32), "_bias_bwd_dq_kernel": (64, 32),
                                   "_bias_bwd_dkdv_kernel": (32, 64), "_bias_bwd_table_kernel": (32, 32)}, names
        names.clear()
        names.kwargs.clear()
        check(make_case(1, 1, 300, 32, torch.bfloat16, roots=3))
        full = launched(names)
        names.clear()
        names.kwargs.clear()
        check_against_reference(short)  # (bare tensors)
        bare = launched(names)

        def expected(N, D, short_rows):
            want = _launch.launch_configs(N, D, D, torch.bfloat16, 1, -1, sk.BucketSpec(), short_rows=short_rows)
            return {name: (config["BLOCK_M"], config["BLOCK_N"])
                    for name, config in zip(kernels, (want.fwd, want.dq, want.dkdv, want.table))}

        assert full == expected(300, 32, 0), full  # the long rows' tiles (LONG_ROW_CONFIGS' forward, 128x128)
        assert full["_bias_fwd_kernel"] == (128, 128), full
        assert bare == expected(600, 32, -1), bare  # N's rule: the family's tiles
        assert bare["_bias_fwd_kernel"] == (128, 64), bare
        # LONG_ROW_CONFIGS' backward tiles, exact: sm_80's dK/dV 64x128 at D64, sm_100's dQ 128x64 and dK/dV 64x128
        # at D128 (the head dim 80 in the 128 class), the small family's dQ 128x32 at D128.
        for arch, D, tiles in ((80, 32, {"_bias_fwd_kernel": (128, 128), "_bias_bwd_dkdv_kernel": (64, 128)}),
                               (100, 80, {"_bias_fwd_kernel": (128, 128), "_bias_bwd_dq_kernel": (128, 64),
                                          "_bias_bwd_dkdv_kernel": (64, 128)}),
                               (86, 80, {"_bias_bwd_dq_kernel": (128, 32)})):
            P.interpret_as(arch)
            names.clear()
            names.kwargs.clear()
            check(make_case(1, 1, 200, D, torch.bfloat16, roots=2))
            got = launched(names)
            assert got == expected(200, D, 0) and tiles.items() <= got.items(), (arch, D, got)
    finally:
        P.interpret_as(previous)


@pytest.mark.parametrize("N,dtype,rows,family,arch,takes", [
    (57, torch.bfloat16, 1, "sm90", 90, True),
    (64, torch.float16, 1, "sm90", 100, True),
    (65, torch.bfloat16, 1, "sm90", 90, True),  # 65..128: the two-block short-row backward
    (128, torch.bfloat16, 1, "sm80", 80, True),
    (129, torch.bfloat16, 1, "sm90", 90, False),  # longer rows: the tiled kernels
    (57, torch.float32, 1, "sm90", 90, False),  # fp32: the tiled kernels
    (57, torch.bfloat16, 12, "sm90", 90, False),  # per-head tables: the tiled kernels
    (57, torch.bfloat16, 1, "sm80", 80, True),
    (57, torch.bfloat16, 1, "small", 86, True),
    (57, torch.bfloat16, 1, "small", 120, True),
])
def test_short_row_dispatch(N, dtype, rows, family, arch, takes):
    config = configs._short_config(N, dtype, 64, rows, family, arch)
    assert (config is not None) == takes
    if takes:
        assert config["BLOCK_M"] == config["BLOCK_N"] and 2 * config["BLOCK_M"] >= N


@pytest.mark.parametrize("window,causal", [(-1, False), (3, True)])
@pytest.mark.parametrize("spec", [sk.BucketSpec(6), sk.BucketSpec(40)], ids=["bitset", "range"])
def test_tile_buckets_are_the_buckets_of_the_allowed_pairs(spec, window, causal):
    """Up to 31 buckets, each tile's metadata is exactly the set of its allowed pairs' buckets (bits); larger
    tables get a range that holds them all; tiles without an allowed pair are empty."""
    B, N, bm, bn = 2, 80, 16, 32
    heads = [_documents(1, L, 10, seed=b)[0] for b, L in enumerate([80, 45])]
    case = make_case(B, 1, N, 32, torch.float32, lengths=[80, 45], heads=heads, buckets=spec)
    distance, lengths = case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32)
    tile_buckets = _launch._tile_buckets(distance, lengths, bm, bn, window, causal, spec).cpu()  # [B, nQ, nK]
    allowed = reference.allowed_pairs(distance.cpu(), lengths.cpu(), None if window < 0 else window, causal)
    buckets = spec.lut()[distance.cpu().long()]
    for b in range(B):
        for qi in range(triton.cdiv(N, bm)):
            for ki in range(triton.cdiv(N, bn)):
                tile = (slice(qi * bm, (qi + 1) * bm), slice(ki * bn, (ki + 1) * bn))
                present = set(buckets[b][tile][allowed[b][tile]].tolist())
                value = int(tile_buckets[b, qi, ki])
                if spec.num_buckets <= configs.STATIC_BUCKET_LIMIT:
                    assert {t for t in range(31) if value >> t & 1} == present
                elif present:
                    assert value % 256 <= min(present) and max(present) <= value // 256
                else:
                    assert value % 256 > value // 256


@pytest.mark.long_on_cpu
def test_real_block_size_with_padding_and_causal():
    """The launcher's own tile sizes on N just over one tile, ragged and causal."""
    assert configs._BLOCK_OVERRIDE is None
    case = make_case(2, 1, 70, 64, torch.float32, lengths=[70, 66])
    check_against_reference(case, causal=True)


@pytest.mark.long_on_cpu
def test_deterministic_bit_identical(monkeypatch):
    """deterministic=True gives the same bits on every run. The interpreter runs a grid's programs in index order,
    where even an order-dependent reduction (float atomics into the table gradient) repeats its bits, so there the
    repeats run their programs in shuffled orders, as ``verify`` does (checks.shuffled_program_order); on CUDA
    they are plain repeats. Tiles of 32 query rows: with the launcher's 128-row tiles N = 100 is one query block,
    so each table row would sum only B = 2 programs' partials, and a sum of two is the same in either order; here
    8 programs add to each row."""
    from syntaxkernels.tools.checks import shuffled_program_order

    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (32, 64))
    case = make_case(2, 2, 100, 32, torch.bfloat16, lengths=[100, 80], per_head=True)
    grad_out = torch.randn(2, 2, 100, 32)

    def run():
        return _run(case, torch.bfloat16, "triton", grad_out, deterministic=True)

    def repeat(seed):
        if DEVICE == "cuda":
            return run()
        with shuffled_program_order(seed):
            return run()

    runs = [run()] + [repeat(seed) for seed in (1, 2)]
    for again in runs[1:]:
        assert torch.equal(runs[0][0], again[0])
        for name in runs[0][1]:
            assert torch.equal(runs[0][1][name], again[1][name]), name


def test_strided_inputs_without_copies():
    """q/k/v as views of a packed [B, N, 3, H, D] projection (non-contiguous) give the same result."""
    case = make_case(2, 2, 33, 32, torch.float32)
    packed = torch.randn(2, 33, 3, 2, 32, device=DEVICE)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    distance, table = case["distance"].to(DEVICE), case["table"].to(DEVICE)
    kw = dict(buckets=case["buckets"], lengths=case["lengths"].to(DEVICE))
    out = sk.syntax_bias_attention(q, k, v, distance, table, backend="triton", **kw)
    ref = sk.syntax_bias_attention(q.contiguous(), k.contiguous(), v.contiguous(), distance, table,
                                   backend="reference", **kw)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_float_bias_scale_and_default_scale():
    case = make_case(1, 2, 20, 32, torch.float32)
    args = [case[n].to(DEVICE) for n in ("q", "k", "v", "distance", "table")]
    for c in (None, 0.5):
        out = sk.syntax_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3, backend="triton")
        ref = reference.syntax_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_auto_backend_on_cpu_matches_the_reference():
    """On CPU tensors "auto" runs the C++ kernels (python_tests/test_bias_attention_cpu.py checks them)."""
    case = make_case(1, 1, 5, 32, torch.float32)
    out = sk.syntax_bias_attention(case["q"], case["k"], case["v"], case["distance"], case["table"],
                                   buckets=case["buckets"])
    ref = reference.syntax_bias_attention(case["q"], case["k"], case["v"], case["distance"], case["table"],
                                          buckets=case["buckets"])
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", [sk.BucketSpec(), sk.BucketSpec(3), sk.BucketSpec(10, unreachable_bucket=False),
                                  sk.BucketSpec(16, log_distance=4), sk.BucketSpec(254, log_distance=1),
                                  sk.BucketSpec(100, log_distance=7, unreachable_bucket=False)],
                         ids=["default", "max3", "no-unreachable", "log4-16", "log1-254", "log7-100-clamped"])
def test_bias_lut_and_in_kernel_buckets_equal_the_spec(spec):
    """The per-head LUT is ``c * table[bucket(d)] * log2(e)`` (-inf past the window), and the table-gradient
    kernel's compile-time bucket ranges select exactly the distances ``BucketSpec.lut()`` maps to each bucket."""
    table = torch.randn(2, spec.num_buckets, device=DEVICE)
    c = torch.tensor([0.7], device=DEVICE)
    lut = _host.bias_lut(table, c, spec, window=6)
    expect = table[:, spec.lut().to(DEVICE)] * 0.7 * 1.4426950408889634
    expect[:, 7:] = float("-inf")
    torch.testing.assert_close(lut, expect)

    members = torch.empty(spec.num_buckets, 256, dtype=torch.int32, device=DEVICE)
    _bucket_members_kernel[(1,)](torch.arange(256, dtype=torch.uint8, device=DEVICE), members,
                                 NUM_BUCKETS=spec.num_buckets, LOG_DISTANCE=spec.log_distance or 0,
                                 UNREACHABLE_BUCKET=spec.unreachable_bucket,
                                 LAST_DISTANCE_BUCKET=spec.num_distance_buckets - 1)
    expect = spec.lut()[None, :] == torch.arange(spec.num_buckets)[:, None]
    assert torch.equal(members.cpu().bool(), expect)


@triton.jit
def _bucket_members_kernel(D, OUT, NUM_BUCKETS: tl.constexpr, LOG_DISTANCE: tl.constexpr,
                           UNREACHABLE_BUCKET: tl.constexpr, LAST_DISTANCE_BUCKET: tl.constexpr):
    offs = tl.arange(0, 256)
    d = tl.load(D + offs).to(tl.int32)
    for t in tl.static_range(NUM_BUCKETS):
        tl.store(OUT + t * 256 + offs, P.in_bucket(d, t, LOG_DISTANCE, UNREACHABLE_BUCKET,
                                                     LAST_DISTANCE_BUCKET).to(tl.int32))


def test_block_meta_matches_dense_computation():
    case = make_case(2, 1, 50, 32, torch.float32, lengths=[50, 21])
    dist, lengths = case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32)
    smallest, largest = block_distance_range(dist, lengths, 16, 32)
    smallest, largest, dist = smallest.cpu(), largest.cpu(), dist.cpu()
    for b in range(2):
        L = int(lengths[b])
        for qi in range(smallest.shape[1]):
            for ki in range(smallest.shape[2]):
                tile = dist[b, qi * 16:min((qi + 1) * 16, L), ki * 32:min((ki + 1) * 32, L)]
                if tile.numel() == 0:
                    assert smallest[b, qi, ki] == 255 and largest[b, qi, ki] == 0
                else:
                    assert smallest[b, qi, ki] == tile.min() and largest[b, qi, ki] == tile.max()
    mask = torch.rand(3, 4, 9) > 0.6
    idx, counts = compact_rows(mask)
    for b in range(3):
        for r in range(4):
            expect = mask[b, r].nonzero().flatten()
            assert counts[b, r] == expect.numel()
            assert torch.equal(idx[b, r, :expect.numel()].long(), expect)


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
def test_block_bucket_masks_match_dense_computation(block_m, block_n):
    """The bucket set of each tile's allowed pairs, tile by tile from the dense distance: tiles past an item's
    length (a padded item, an empty one) hold none, with a window and causality too."""
    case = make_case(3, 1, 50, 32, torch.float32, lengths=[50, 21, 0])
    dist, lengths = case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32)
    spec = sk.BucketSpec(max_distance=6)
    lut = spec.lut().to(DEVICE)
    for window, causal in [(None, False), (2, False), (None, True), (3, True)]:
        masks = block_bucket_masks(dist, lengths, lut, block_m, block_n, window, causal).cpu()
        assert masks.shape == (3, 4 if block_m == 16 else 2, 2 if block_n == 32 else 4)
        for b, L in enumerate(lengths.tolist()):
            for qi in range(masks.shape[1]):
                for ki in range(masks.shape[2]):
                    want = 0
                    for i in range(qi * block_m, min((qi + 1) * block_m, L)):
                        for j in range(ki * block_n, min((ki + 1) * block_n, L)):
                            d = int(dist[b, i, j])
                            if (window is None or d <= window) and (not causal or j <= i):
                                want |= 1 << int(spec.lut()[d])
                    assert int(masks[b, qi, ki]) == want, (b, qi, ki, window, causal)
    # A program's warps: one per 1024 pairs of its tile, one to four (a padded batch's many empty tiles: one warp).
    from syntaxkernels.ops.block_meta import _tile_warps

    assert [_tile_warps(*t) for t in ((16, 32), (32, 32), (64, 32), (64, 64), (128, 64))] == [1, 1, 2, 4, 4]


def test_split_lists_put_interior_tiles_first():
    live = torch.rand(2, 5, 7) > 0.3
    boundary = torch.rand(2, 5, 7) > 0.6
    idx, counts = split_lists(live, boundary)
    for b in range(2):
        for r in range(5):
            interior = (live[b, r] & ~boundary[b, r]).nonzero().flatten()
            edge = (live[b, r] & boundary[b, r]).nonzero().flatten()
            assert counts[b, r].tolist() == [interior.numel(), interior.numel() + edge.numel()]
            assert idx[b, r, :counts[b, r, 1]].long().tolist() == interior.tolist() + edge.tolist()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("by_key", [False, True])
def test_boundary_tiles_are_exactly_the_tiles_with_a_masked_pair(causal, by_key):
    """A tile is interior only if every pair the kernel computes in it is allowed by length and causality
    (along the dimension its programs walk), so the unmasked loop never needs a mask."""
    lengths = torch.tensor([37, 64, 5])
    bm, bn = 16, 8
    boundary = boundary_tiles(lengths, 4, 8, bm, bn, causal, by_key=by_key)
    for b, L in enumerate(lengths.tolist()):
        for qi in range(4):
            for ki in range(8):
                rows = torch.arange(qi * bm, (qi + 1) * bm)
                cols = torch.arange(ki * bn, (ki + 1) * bn)
                ok = (cols[None, :] < L) if by_key else (rows[:, None] < L)
                ok = ok.expand(bm, bn)
                if causal:
                    ok = ok & (cols[None, :] <= rows[:, None])
                assert bool(boundary[b, qi, ki]) == (not bool(ok.all())), (b, qi, ki)


def test_launch_on_a_gpu_other_than_the_current_one_runs_under_that_device(monkeypatch):
    """Triton launches on the current CUDA device; a launch whose tensors live on another GPU must switch to it
    (here with fake cuda:1 tensors and the CUDA calls recorded, as no GPU is needed to see the decision)."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        on_1, on_0 = torch.empty(4, device="cuda:1"), torch.empty(4, device="cuda:0")
    events = []

    @contextlib.contextmanager
    def device(d):
        events.append(("enter", str(d)))
        yield
        events.append(("exit", str(d)))

    class Launcher:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *a, **kw: events.append(("launch", self.kernel, grid))

    monkeypatch.setattr(P, "interpreting", lambda: False)
    monkeypatch.setattr(P, "_LAUNCH_HOOK", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.library, "wrap_triton", Launcher)
    P.launch("k", (3,), on_1, 7, BLOCK=16)
    assert events == [("enter", "cuda:1"), ("launch", "k", (3,)), ("exit", "cuda:1")]
    events.clear()
    P.launch("k", (3,), 7, on_0)
    assert events == [("launch", "k", (3,))]


def test_grid_is_one_axis_for_any_batch_and_heads():
    """Every launch is a 1-D grid of blocks x B x H programs, decoded in-kernel: 2048 sentences x 32 heads
    (beyond CUDA's 65535 limit of the second axis) launch; past 2^31 programs the launcher says why."""
    assert P.launch_grid(8, 2048, 32) == (8 * 2048 * 32,)
    with pytest.raises(ValueError, match="exceeds one grid axis"):
        P.launch_grid(1 << 12, 1 << 12, 1 << 8)
    assert P.launch_grid(4, 3, 2, 5) == (4 * 3 * 2 * 5,)
    out = torch.empty(3 * 5 * 7, 4, dtype=torch.int64, device=DEVICE)
    _decode_kernel[P.launch_grid(3, 5, 7)](out, 3, 7)
    expect = [[pid % 3, pid // 3, (pid // 3) // 7, (pid // 3) % 7] for pid in range(3 * 5 * 7)]
    assert out.cpu().tolist() == expect


def test_grid_with_relations_decodes_every_program():
    out = torch.empty(3 * 2 * 2 * 4, 5, dtype=torch.int64, device=DEVICE)
    _decode_relations_kernel[P.launch_grid(3, 2, 2, 4)](out, 3, 2, 4)
    expect = []
    for pid in range(3 * 2 * 2 * 4):
        rest = pid // 3
        bh = rest // 4
        expect.append([pid % 3, bh, rest % 4, bh // 2, bh % 2])
    assert out.cpu().tolist() == expect


@triton.jit
def _decode_relations_kernel(OUT, num_blocks, H, R):
    block, bh, r, b, h = P.program_ids_r(num_blocks, H, R)
    pid = tl.program_id(0)
    offs = tl.arange(0, 8)
    values = tl.where(offs == 0, block, tl.where(offs == 1, bh, tl.where(offs == 2, r, tl.where(offs == 3, b, h))))
    tl.store(OUT + pid * 5 + offs, values.to(tl.int64), mask=offs < 5)


@triton.jit
def _decode_kernel(OUT, num_blocks, H):
    block, bh, b, h = P.program_ids(num_blocks, H)
    pid = tl.program_id(0)
    offs = tl.arange(0, 4)
    values = tl.where(offs == 0, block, tl.where(offs == 1, bh, tl.where(offs == 2, b, h)))
    tl.store(OUT + pid * 4 + offs, values.to(tl.int64))


@pytest.mark.parametrize("bad,match", [
    (dict(window=-1), "window"),
    (dict(window=True), "window"),
    (dict(bias_scale=torch.ones(2)), "bias_scale"),
    (dict(table=torch.zeros(5)), "table"),
    (dict(distance=torch.zeros(1, 8, 8, dtype=torch.int32)), "distance"),
    (dict(lengths=torch.tensor([9])), "lengths"),
    (dict(deterministic="yes"), "deterministic"),
    (dict(backend="cuda"), "backend"),
], ids=["window-negative", "window-bool", "bias_scale-size", "table-shape", "distance-dtype", "lengths-range",
        "deterministic-type", "backend-name"])
def test_bad_inputs(bad, match):
    case = make_case(1, 1, 8, 32, torch.float32)
    kw = dict(q=case["q"], k=case["k"], v=case["v"], distance=case["distance"], table=case["table"],
              buckets=case["buckets"], backend="triton")
    kw.update(bad)
    # Everything on the kernel device except lengths, which are checked (with a ValueError naming the item)
    # where they live on the host; lengths already on a GPU get a device-side assertion instead.
    kw = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) and name != "lengths" else value
          for name, value in kw.items()}
    with pytest.raises(ValueError, match=match):
        sk.syntax_bias_attention(**kw)


def test_unsupported_head_dim_and_dtype():
    case = make_case(1, 1, 8, 32, torch.float32)
    distance, table = case["distance"].to(DEVICE), case["table"].to(DEVICE)
    big = torch.randn(1, 1, 8, 160, device=DEVICE)
    with pytest.raises(ValueError, match="head dim 160"):
        sk.syntax_bias_attention(big, big, big, distance, table, buckets=case["buckets"], backend="triton")
    q64 = case["q"].double().to(DEVICE)
    with pytest.raises(ValueError, match="float64"):
        sk.syntax_bias_attention(q64, q64, q64, distance, table, buckets=case["buckets"], backend="triton")
    # Under "auto" the same inputs run the reference (as the sub-network op does).
    for x in (big, q64):
        out = sk.syntax_bias_attention(x, x, x, distance, table.to(x.dtype), buckets=case["buckets"])
        ref = reference.syntax_bias_attention(x, x, x, distance, table.to(x.dtype), buckets=case["buckets"])
        torch.testing.assert_close(out, ref)


@pytest.mark.long_on_cpu
def test_lut_attention_full_and_pairwise_masks():
    """``lut_attention`` with the sub-network op's dense masks: ``full`` (a zero LUT) and ``pairwise`` (only
    unreachable pairs), against masked reference attention; gradients for q, k, v."""
    case = make_case(2, 2, 40, 32, torch.float32, lengths=[40, 23], roots=3)
    distance, lengths = case["distance"].to(DEVICE), case["lengths"].to(DEVICE)
    full = torch.zeros(256, device=DEVICE)
    pairwise = torch.full((256,), float("-inf"), device=DEVICE)
    pairwise[255] = 0.0
    for lut, allowed in ((full, reference.allowed_pairs(distance, lengths)),
                         (pairwise, reference.allowed_pairs(distance, lengths) & (distance == 255))):
        q, k, v = (case[n].to(DEVICE).requires_grad_() for n in ("q", "k", "v"))
        out = ba.lut_attention(q, k, v, distance, lut, lengths)
        scores = (q @ k.transpose(-1, -2)) / 32 ** 0.5
        ref = reference.masked_attention(scores, allowed[:, None], v)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _op_args(case, dtype=torch.float32):
    """The two ops' arguments for a case (window 3): the forward's, and the backward's metadata from the case's
    plan as the autograd Function derives it."""
    from syntaxkernels.plan import structure_plan

    plan = structure_plan(case["distance"].to(DEVICE), case["lengths"].to(DEVICE), symmetric=True)
    table = case["table"].to(DEVICE).reshape(1, -1)
    scale = case["bias_scale"].to(DEVICE)
    q, k, v = (case[n].to(DEVICE, dtype) for n in "qkv")
    configs = _launch.launch_configs(q.shape[2], q.shape[3], v.shape[3], dtype, 1, 3, case["buckets"])
    forward = _launch.forward_metadata(plan, configs, 3, False)
    backward = _launch.backward_metadata(plan, configs, 3, False, case["buckets"], True)
    args = (q, k, v, plan.distance, table, scale, _host._bucket_lut(case["buckets"], q), plan.kernel_lengths, *forward,
            0.2, 3, False)
    return args, backward, (table, scale)


@pytest.mark.long_on_cpu
def test_opcheck_forward_and_backward():
    """torch.library.opcheck on both Triton ops (schema, fake tensors, autograd registration).

    ``test_aot_dispatch_dynamic`` is left out on CPU: under the interpreter the functional decomposition of a
    Triton op would call the Python-interpreted kernel on functional tensors, which it cannot run; it runs on
    CUDA.
    """
    case = make_case(2, 2, 20, 32, torch.float32, lengths=[20, 11])
    args, meta, (table, scale) = _op_args(case)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if DEVICE == "cuda":
        utils = utils + ("test_aot_dispatch_dynamic",)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_fwd, args, test_utils=utils)
    out, lse, lut, pos_lut = torch.ops.syntaxkernels.bias_attention_fwd(*args)
    assert pos_lut.shape == (0, 0)  # (no T5 term)
    dout = torch.randn_like(out)
    bwd_args = (dout, *args[:3], out, lse, args[3], lut, args[7], *meta, *args[10:],
                *_host.bucket_args(case["buckets"]), table, scale, True, True)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_bwd, bwd_args, test_utils=utils)


@pytest.mark.long_on_cpu
def test_torch_compile_fullgraph():
    case = make_case(2, 2, 24, 32, torch.float32, lengths=[24, 13])
    table = case["table"].to(DEVICE).requires_grad_()
    q = case["q"].to(DEVICE).requires_grad_()
    k, v, distance, lengths = (case[n].to(DEVICE) for n in ("k", "v", "distance", "lengths"))

    def f(q, k, v, distance, table, lengths):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), lengths=lengths,
                                        window=4, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "eager"
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    out = compiled(q, k, v, distance, table, lengths)
    out.sum().backward()
    ref = reference.syntax_bias_attention(q.detach(), k, v, distance, table.detach(), buckets=sk.BucketSpec(),
                                          lengths=lengths, window=4)
    torch.testing.assert_close(out.detach(), ref, atol=2e-5, rtol=1e-5)
    assert table.grad is not None and table.grad.abs().max() > 0


# ----------------------------------------------------------------------------------------------------------
# CUDA: real sizes (skipped without a GPU)
# ----------------------------------------------------------------------------------------------------------

CUDA_CASES = [
    ("N512-bf16-D64", (4, 8, 512, 64), torch.bfloat16, dict(lengths=[512, 300, 0, 511])),
    ("N1000-fp16-D128-perhead-causal", (2, 4, 1000, 128), torch.float16, dict(per_head=True), dict(causal=True)),
    ("N2048-bf16-D64-window4", (2, 4, 2048, 64), torch.bfloat16, dict(roots=20), dict(window=4)),
    ("N777-fp32-D32-ragged", (3, 2, 777, 32), torch.float32, dict(lengths=[777, 500, 1])),
]


@requires_cuda
@pytest.mark.parametrize("case_def", CUDA_CASES, ids=[c[0] for c in CUDA_CASES])
def test_cuda_real_sizes(case_def):
    _, shape, dtype, opts, *rest = case_def
    kw = rest[0] if rest else {}
    case = make_case(*shape, dtype, **opts)
    check_against_reference(case, **kw)


@requires_cuda
def test_cuda_auto_backend_uses_triton(monkeypatch):
    case = make_case(2, 2, 128, 64, torch.bfloat16)
    called = []
    original = _autograd._SyntaxBiasAttention.apply
    monkeypatch.setattr(_autograd._SyntaxBiasAttention, "apply", lambda *a: called.append(1) or original(*a))
    q = case["q"].cuda().bfloat16()
    sk.syntax_bias_attention(q, q, q, case["distance"].cuda(), case["table"].cuda(), buckets=case["buckets"])
    assert called
