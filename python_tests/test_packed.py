"""Packed (padding-free) batches: the packed tree builder and the varlen bias op against the reference.

The reference of a packed op is the padded-batch reference run sequence by sequence (``[1, H, n, D]`` each with
its own ``n x n`` distance), computed in float64 and in the kernel's dtype (the tolerance rule of
:mod:`syntaxkernels.tools.testing`). The Triton kernels run on ``DEVICE`` (CUDA, or the CPU under TRITON_INTERPRET=1);
sizes are small so the file stays well under a minute on two cores.
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _ext
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops.bias_attention import _host, _varlen
from syntaxkernels.ops.bias_attention import _varlen_kernels as bv
from syntaxkernels.tools.testing import assert_bias_attention_close, count_host_reads
from syntaxkernels.trees import PackedTreeBatch
from syntaxkernels.tools.workloads import random_forest

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_triton

HAS_PACKED_CPP = _ext.available() and hasattr(_ext.load(), "packed_tree_distance")
needs_packed_cpp = pytest.mark.skipif(not HAS_PACKED_CPP, reason="C++ extension (packed builder) not built")


def forests(lengths, seed=0, roots=1):
    rng = random.Random(seed)
    return [random_forest(rng, n, num_trees=roots) if n else [] for n in lengths]


# ---------------------------------------------------------------------------------------------------------
# Packed trees
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [pytest.param("cpp", marks=needs_packed_cpp), "python"])
def test_packed_batch_equals_the_padded_batch_sequence_by_sequence(backend):
    lengths = [5, 0, 1, 17, 300, 3]
    rows = forests(lengths, seed=1, roots=2)
    packed = PackedTreeBatch.from_heads(rows, backend=backend)
    padded = sk.TreeBatch.from_heads(rows)
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.cu_seqlens.tolist() == [0, 5, 5, 6, 23, 323, 326]
    assert packed.max_seqlen == 300 and packed.num_sequences == 6 and packed.num_tokens == 326
    assert packed.distance.dtype == torch.uint8 and packed.distance.shape == (sum(n * n for n in lengths),)
    assert packed.distance_offsets.tolist()[:3] == [0, 25, 25]
    for s, n in enumerate(lengths):
        a = int(packed.cu_seqlens[s])
        assert torch.equal(packed.sequence_distance(s), padded.distance[s, :n, :n])
        assert torch.equal(packed.depth[a:a + n], padded.depth[s, :n])
        assert torch.equal(packed.segment[a:a + n], padded.segment[s, :n])
        assert packed.positions[a:a + n].tolist() == list(range(n))
        assert packed.sequence[a:a + n].tolist() == [s] * n
    assert torch.equal(packed.heads, torch.tensor(sum(rows, []), dtype=torch.int64))


def test_from_heads_packed_flag_and_tensor_inputs():
    rows = forests([4, 7, 2], seed=2)
    via_flag = sk.TreeBatch.from_heads(rows, packed=True)
    assert isinstance(via_flag, PackedTreeBatch)
    padded = sk.TreeBatch.from_heads(rows)
    from_tensor = sk.TreeBatch.from_heads(padded.heads, padded.lengths, packed=True)
    from_cu = PackedTreeBatch.from_heads(torch.tensor(sum(rows, [])), torch.tensor([0, 4, 11, 13]))
    from_batch = PackedTreeBatch.from_batch(padded)
    for other in (from_tensor, from_cu, from_batch):
        assert torch.equal(other.distance, via_flag.distance)
        assert torch.equal(other.cu_seqlens, via_flag.cu_seqlens)
    back = via_flag.to_padded()
    assert torch.equal(back.distance, padded.distance) and torch.equal(back.lengths, padded.lengths)


def test_global_heads_and_edge_lists_in_packed_numbering():
    rows = forests([6, 3, 9], seed=3)
    packed = PackedTreeBatch.from_heads(rows)
    padded = sk.TreeBatch.from_heads(rows)
    assert packed.global_heads().tolist() == sum(
        ([h + off if h >= 0 else -1 for h in r] for r, off in zip(rows, [0, 6, 9])), [])
    lists = packed.window_lists(2).to_dense()[0, 0]  # [T, T] in packed numbering
    ref = padded.window_lists(2).to_dense()[:, 0]
    for s, (a, n) in enumerate(((0, 6), (6, 3), (9, 9))):
        assert torch.equal(lists[a:a + n, a:a + n], ref[s, :n, :n])
    same = packed.sequence[:, None] == packed.sequence[None, :]
    assert not lists[~same].any()  # no pair crosses sequences
    masks = sk.MaskSpec(max_distance=2)
    rel = packed.relation_lists(masks).to_dense()[0]
    rel_ref = padded.relation_lists(masks).to_dense()
    for s, (a, n) in enumerate(((0, 6), (6, 3), (9, 9))):
        assert torch.equal(rel[:, a:a + n, a:a + n], rel_ref[s, :, :n, :n])
    assert not rel[:, ~same].any()


@pytest.mark.parametrize("backend", [pytest.param("cpp", marks=needs_packed_cpp), "python"])
@pytest.mark.parametrize("rows,cu,match", [
    ([[-1, 0], [-1, 5, 1]], None, r"sequence 1, token 1: head 5 out of range"),
    ([[-1], [1, -1], [-1, 1, 1]], None, r"sequence 2, token 1: self-loop"),
    ([[-1, 2, 1]], None, r"sequence 0, token 1: on a cycle"),
    ([[-1, 0, 0, 0]], [0, 2, 3], r"cu_seqlens\[2\] = 3 but there are 4 heads"),
    ([[-1, 0, 0, 0]], [0, 3, 2, 4], r"sequence 1: cu_seqlens\[2\] = 2 is smaller"),
    ([[-1, 0, 0, 0]], [1, 4], r"cu_seqlens\[0\] = 1"),
])
def test_bad_inputs_name_the_sequence_and_token(backend, rows, cu, match):
    with pytest.raises(ValueError, match=match):
        if cu is None:
            PackedTreeBatch.from_heads(rows, backend=backend)
        else:
            PackedTreeBatch.from_heads(torch.tensor(sum(rows, [])), torch.tensor(cu), backend=backend)


def test_non_integer_head_names_the_sequence():
    with pytest.raises(ValueError, match=r"sequence 1, token 0: head 'x' is not an integer"):
        PackedTreeBatch.from_heads([[-1], ["x"]])


def test_to_and_pin_memory_keep_everything():
    packed = PackedTreeBatch.from_heads(forests([3, 4], seed=4))
    packed.window_lists(1)
    moved = packed.to("cpu")
    assert moved is packed or torch.equal(moved.distance, packed.distance)
    copy = packed.to(torch.device("cpu"), non_blocking=True)
    assert torch.equal(copy.cu_seqlens, packed.cu_seqlens) and copy.cached_window_lists(1) is not None
    if torch.cuda.is_available():
        pinned = packed.pin_memory()
        assert pinned.distance.is_pinned() and pinned.cached_window_lists(1).col.is_pinned()


def test_packed_bytes_are_the_sum_of_squares_not_the_padded_square():
    lengths = [14, 3, 40, 9, 22]
    packed = PackedTreeBatch.from_heads(forests(lengths))
    padded = sk.TreeBatch.from_heads(forests(lengths))
    assert packed.distance.numel() == sum(n * n for n in lengths)
    assert padded.distance.untyped_storage().nbytes() >= len(lengths) * 40 * 40
    assert packed.distance.numel() < padded.distance.untyped_storage().nbytes() / 2


# ---------------------------------------------------------------------------------------------------------
# The varlen bias op
# ---------------------------------------------------------------------------------------------------------


def make_packed_case(lengths, H, D, *, per_head=False, buckets=None, seed=0, roots=2, Dv=None):
    gen = torch.Generator().manual_seed(seed)
    rows = forests(lengths, seed=seed, roots=roots)
    packed = PackedTreeBatch.from_heads(rows)
    T = packed.num_tokens
    buckets = buckets or sk.BucketSpec()
    nb = buckets.num_buckets
    return dict(packed=packed, q=torch.randn(T, H, D, generator=gen), k=torch.randn(T, H, D, generator=gen),
                v=torch.randn(T, H, Dv or D, generator=gen),
                table=torch.randn((H, nb) if per_head else (nb,), generator=gen),
                bias_scale=torch.tensor([0.7]), buckets=buckets,
                grad_out=torch.randn(T, H, Dv or D, generator=gen))


def _run_packed(case, dtype, backend, **kw):
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    packed = case["packed"].to(DEVICE)
    # detach(): a new leaf with the input's strides (clone() would make a strided view contiguous)
    q, k, v = (case[n].to(DEVICE, dtype).detach().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(DEVICE, pdtype).detach().requires_grad_()
    c = case["bias_scale"].to(DEVICE, pdtype).detach().requires_grad_()
    if backend == "spec":  # the reference sequence by sequence
        out = _varlen.reference_bias_attention_varlen(q, k, v, packed.distance, table, buckets=case["buckets"],
                                                      cu_seqlens=packed.cu_seqlens, bias_scale=c, **kw)
    else:
        out = sk.syntax_bias_attention(q, k, v, packed.distance, table, buckets=case["buckets"], bias_scale=c,
                                       cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen, backend=backend,
                                       **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), case["grad_out"].to(DEVICE, dtype), allow_unused=True)
    return out, dict(zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads))


def check_packed(case, dtype, **kw):
    """Forward and every gradient against the sequence-by-sequence reference in float64 (the rule of
    :mod:`syntaxkernels.tools.testing`, the bias-scale gradient by its own rule), none all zeros where the reference's
    is not."""
    out, grads = _run_packed(case, dtype, "triton", **kw)
    assert_matches_reference(case, (out, grads), _run_packed(case, torch.float64, "spec", **kw),
                             _run_packed(case, dtype, "spec", **kw), dtype)
    return out, grads


def assert_matches_reference(case, got, ref_fp64, ref_lowp, dtype):
    """``(out, grads)`` of a fused path against the reference's in float64 and in ``dtype``
    (:func:`assert_bias_attention_close`): out in ``dtype`` with the reference's shape, each gradient within the
    rule, none all zeros where the reference's is not; the gradients have their inputs' shapes."""
    (out, grads), (out64, grads64) = got, ref_fp64
    assert out.dtype == dtype and out.shape == out64.shape
    for name in grads:
        assert grads[name].shape == grads64[name].shape, name
    assert_bias_attention_close(case, got, ref_fp64, ref_lowp, dtype)
    for name in grads:
        if grads64[name].abs().max() > 1e-3:
            assert grads[name].abs().max() > 0, f"{name} is all zeros"


# id, lengths, H, D, dtype, options
PACKED_CASES = [
    ("one-sequence-N1", [1], 2, 32, torch.float32, {}),
    ("one-sequence-N45", [45], 1, 32, torch.float32, dict(per_head=False)),
    ("ragged-empty-shared", [5, 0, 17, 1, 9, 3], 2, 32, torch.float32, {}),
    ("ragged-perhead-window2", [12, 7, 30, 2], 2, 32, torch.float32, dict(per_head=True, window=2)),
    ("ragged-causal-bf16", [20, 9, 14], 2, 64, torch.bfloat16, dict(causal=True)),
    ("ragged-fp16-D128-window1", [8, 23, 4], 1, 128, torch.float16, dict(window=1, per_head=True)),
    ("logbuckets-D48", [33, 6], 2, 48, torch.float32, dict(buckets=sk.BucketSpec(16, log_distance=4))),
    ("window0-forest", [11, 13], 1, 32, torch.float32, dict(window=0, roots=4)),
    ("bigtable-41-buckets", [20, 45], 1, 32, torch.float32,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1, per_head=True)),
]


@needs_triton
@pytest.mark.parametrize("lengths,H,D,dtype,opts", [c[1:] for c in PACKED_CASES], ids=[c[0] for c in PACKED_CASES])
@pytest.mark.long_on_cpu
def test_varlen_forward_and_gradients(lengths, H, D, dtype, opts):
    opts = dict(opts)
    kw = {k: opts.pop(k) for k in ("window", "causal") if k in opts}
    case = make_packed_case(lengths, H, D, **opts)
    check_packed(case, dtype, **kw)


# id, lengths, H, D, dtype, case options, call options
TABLE_PATH_CASES = [
    ("shared-empty-one", [9, 0, 23, 1, 14], 3, 32, torch.float32, {}, {}),
    ("causal-dropout-bf16", [20, 9, 31, 2], 2, 64, torch.bfloat16, {}, dict(causal=True, dropout_p=0.2,
                                                                           dropout_seed=5)),
    ("grouped-window", [17, 6, 30], 4, 32, torch.float32, dict(kv_heads=2), dict(window=3)),
    ("dropout-D128-fp16", [12, 5, 1], 1, 128, torch.float16, {}, dict(dropout_p=0.3, dropout_seed=2)),
    ("66-buckets-position-window", [40, 3, 25], 2, 32, torch.float32,
     dict(buckets=sk.BucketSpec(128, log_distance=62), roots=1), dict(position_window=5)),
]


@needs_triton
@pytest.mark.parametrize("lengths,H,D,dtype,opts,kw", [c[1:] for c in TABLE_PATH_CASES],
                         ids=[c[0] for c in TABLE_PATH_CASES])
@pytest.mark.parametrize("stored", [True, False], ids=["stored-ds", "recomputed"])
@pytest.mark.long_on_cpu
def test_shared_table_gradient_from_stored_or_recomputed_ds(monkeypatch, lengths, H, D, dtype, opts, kw, stored):
    """A shared table's gradient both ways the launcher takes it: from the dS the dK/dV kernel stores (batches of
    short sequences) and recomputed by the table kernel (long ones; forced here by the limit), forward and every
    gradient against the reference, every scratch buffer filled with NaN first (the table kernel reads only the
    pairs the dK/dV kernel wrote: causal tiles, windows, empty and one-token sequences, dropout; grouped k/v take
    the recomputation whatever the limit, and so does dropout above head dim 64)."""
    from conftest import nan_scratch

    nan_scratch(monkeypatch)
    monkeypatch.setattr(bv, "STORED_DS_PAIRS_PER_TOKEN", 128 if stored else 0)
    taken = []
    original = bv.stores_ds
    monkeypatch.setattr(bv, "stores_ds", lambda *a: taken.append(original(*a)) or taken[-1])
    opts = dict(opts)
    kv_heads = opts.pop("kv_heads", H)
    case = make_packed_case(lengths, H, D, seed=41, **opts)
    case["k"], case["v"] = case["k"][:, :kv_heads].contiguous(), case["v"][:, :kv_heads].contiguous()
    check_packed(case, dtype, **kw)
    # grouped-query attention and dropout above head dim 64 recompute dS either way
    assert taken == [stored and kv_heads == H and not (kw.get("dropout_p") and D > 64)]


@pytest.mark.parametrize("arch,block_n,stages", [(86, 32, 2), (120, 16, 1), (90, 32, 1)])
def test_consumer_blackwell_takes_its_own_packed_tiles(arch, block_n, stages):
    """sm_120 reads CONSUMER_BLACKWELL_CONFIGS' varlen entry (the dS-storing dK/dV at D = 128: 16-key blocks, one
    stage); sm_86, of the same small family, and sm_90 keep the table's; a family named explicitly takes no
    override."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    previous = P.interpret_as(arch)
    try:
        config = bv.select_varlen_config("dkdv_ds", torch.bfloat16, 128)
        assert (config["BLOCK_M"], config["BLOCK_N"], config["num_stages"]) == (32, block_n, stages)
        assert bv.select_varlen_config("dkdv_ds", torch.bfloat16, 128, family="small")["BLOCK_N"] == 32
    finally:
        P.interpret_as(previous)
    # A GPU named by its architecture takes its own tiles whatever GPU runs this (the workload overview names one).
    assert bv.select_varlen_config("dkdv_ds", torch.bfloat16, 128, arch=arch)["BLOCK_N"] == block_n
    assert bv.select_varlen_config("dkdv_ds", torch.bfloat16, 128, "small" if arch != 90 else "sm90",
                                   arch)["BLOCK_N"] == block_n


def test_the_workload_overview_shows_a_named_gpus_own_packed_tiles():
    """The overview without compiling (``bench``'s rows) reads the tiles of the GPU it names: the small family's
    dS-storing dK/dV tile on sentences-packed at D = 128, and sm_120's own (CONSUMER_BLACKWELL_CONFIGS)."""
    from syntaxkernels.tools import inspection

    tiles = {arch: inspection.workload_overview(["sentences-packed"], "small", (128,), arch=arch)[0]["dkdv_tile"]
             for arch in (None, 86, 120)}
    assert tiles == {None: "32x32", 86: "32x32", 120: "32x16"}


def test_stored_ds_only_for_short_sequences_and_a_shared_table():
    """The launcher's rule: dS is stored for a shared table's gradient when the batch holds at most
    STORED_DS_PAIRS_PER_TOKEN pairs a token (sum n_s^2 <= 128 T), from the plan's sizes alone, without grouped-query
    attention and without dropout above head dim 64."""
    limit = bv.STORED_DS_PAIRS_PER_TOKEN
    assert limit == 128
    assert bv.stores_ds(True, 128 * 1000, 1000) and not bv.stores_ds(True, 128 * 1000 + 1, 1000)
    assert not bv.stores_ds(False, 10, 10)  # a per-head table (the dK/dV kernel sums it) or no table gradient
    assert not bv.stores_ds(True, 10, 10, kv_group=2)  # grouped-query attention
    assert bv.stores_ds(True, 10, 10, dropout=True, head_block=64)
    assert not bv.stores_ds(True, 10, 10, dropout=True, head_block=128)  # dropout above head dim 64
    sentences = [12, 30, 7, 64, 128]
    assert bv.stores_ds(True, sum(n * n for n in sentences), sum(sentences))
    assert not bv.stores_ds(True, 300 * 300 + 3 * 3, 303)  # one long sequence among short ones: recomputed


@needs_triton
@pytest.mark.long_on_cpu
def test_long_sequence_300_with_short_ones_on_real_tiles():
    """Lengths 1..300 in one batch, with the configured tiles (fp16: forward and dQ 16 x 32, dK/dV 32 x 32): query
    blocks spanning several short sequences, and a 300-token sequence spanning many blocks."""
    assert bv._BLOCK_OVERRIDE is None
    case = make_packed_case([300, 1, 2, 31, 33, 5], 1, 32, seed=5)
    check_packed(case, torch.float16)


@needs_triton
@pytest.mark.parametrize("arch", [80, 86, 90])
def test_every_family_config(arch):
    """The tiles of each GPU family (interpret_as): sm80, small (sm_86) and sm90."""
    previous = P.interpret_as(arch) if DEVICE == "cpu" else None
    try:
        if DEVICE != "cpu":
            pytest.skip("families are forced under the interpreter only")
        case = make_packed_case([19, 4, 40], 1, 64, seed=6, per_head=True)
        check_packed(case, torch.bfloat16, window=3)
    finally:
        if previous is not None:
            P.interpret_as(previous)


def _chain(n):
    return [-1] + list(range(n - 1))


@needs_triton
@pytest.mark.parametrize("buckets,per_head,kw", [
    (sk.BucketSpec(128, log_distance=62), False, dict(causal=True)),  # 66 buckets, a table shared by 3 heads
    (sk.BucketSpec(254, log_distance=28), True, dict(window=40)),  # 34 buckets, reached past the log start
    (sk.BucketSpec(), False, dict(window=1)),  # 12 buckets (unrolled); off-diagonal tiles of one distance
], ids=["66-shared-causal", "34-perhead-window", "12-shared-window1"])
def test_table_gradient_on_long_chains_every_bucket_path(monkeypatch, buckets, per_head, kw):
    """The packed table kernel's bucket paths (a runtime loop over the bucket range of each tile past 31 buckets,
    unrolled below) on chains long enough to reach the far and log-spaced buckets, with single-token and empty
    sequences and an odd T, on 16 x 16 tiles (many tiles, each a range of buckets, some without a live pair)."""
    monkeypatch.setattr(bv, "_BLOCK_OVERRIDE", (16, 16))
    rows = [_chain(70), [-1], [], _chain(33), forests([10], seed=31)[0], [-1]]
    H = 3 if not per_head else 2
    case = make_packed_case([1], H, 16, per_head=per_head, buckets=buckets, seed=32)
    packed = PackedTreeBatch.from_heads(rows)
    T = packed.num_tokens
    assert T % 2 == 1 and int(packed.distance[packed.distance < 255].max()) == 69
    gen = torch.Generator().manual_seed(33)
    case.update(packed=packed, q=torch.randn(T, H, 16, generator=gen), k=torch.randn(T, H, 16, generator=gen),
                v=torch.randn(T, H, 16, generator=gen), grad_out=torch.randn(T, H, 16, generator=gen))
    check_packed(case, torch.float32, **kw)


@needs_triton
@pytest.mark.parametrize("kw", [dict(window=4), dict(causal=True)], ids=["window4", "causal"])
@pytest.mark.long_on_cpu
def test_small_tiles_cross_many_sequences(monkeypatch, kw):
    """16 x 16 tiles: every block holds several sequences and its key span starts mid-tile."""
    monkeypatch.setattr(bv, "_BLOCK_OVERRIDE", (16, 16))
    case = make_packed_case([3, 7, 1, 0, 12, 2, 25, 4], 2, 32, seed=7, per_head=True)
    check_packed(case, torch.float32, **kw)


@needs_triton
def test_strided_qkv_views_of_one_projection(monkeypatch):
    """q, k, v as views of one fused [T, 3, H, D] projection (strided, as varlen callers pass them), and a v
    head dim unlike q's."""
    case = make_packed_case([6, 19, 2], 2, 32, seed=23)
    T = case["q"].shape[0]
    fused = torch.randn(T, 3, 2, 32, generator=torch.Generator().manual_seed(24))
    case["q"], case["k"] = fused[:, 0], fused[:, 1]
    case["v"] = torch.randn(T, 2, 48, generator=torch.Generator().manual_seed(25)).transpose(0, 1).contiguous() \
        .transpose(0, 1)
    case["grad_out"] = torch.randn(T, 2, 48, generator=torch.Generator().manual_seed(26))
    assert not case["q"].is_contiguous() and not case["v"].is_contiguous()
    seen = []
    original = bv.varlen_forward
    monkeypatch.setattr(bv, "varlen_forward", lambda q, k, v, *a, **kw: seen.append(
        (q.is_contiguous(), v.is_contiguous())) or original(q, k, v, *a, **kw))
    check_packed(case, torch.float32)
    assert (False, False) in seen  # the kernels got the strided views themselves


@needs_triton
@pytest.mark.long_on_cpu
def test_packed_equals_padded_op():
    """The packed op's outputs and gradients equal the padded op's on the same sequences (fp32)."""
    case = make_packed_case([9, 21, 4], 2, 32, seed=8)
    packed = case["packed"]
    out_p, grads_p = _run_packed(case, torch.float32, "triton")
    padded = packed.to_padded().to(DEVICE)
    lengths = padded.lengths
    S, N = padded.heads.shape

    def to_padded(x):
        y = torch.zeros(S, N, *x.shape[1:], dtype=x.dtype)
        y[torch.arange(N)[None, :] < lengths.cpu()[:, None]] = x.cpu()
        return y.transpose(1, 2).to(DEVICE)  # [S, H, N, D]

    q, k, v = (to_padded(case[n]).requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(DEVICE).requires_grad_()
    c = case["bias_scale"].to(DEVICE).requires_grad_()
    out = sk.syntax_bias_attention(q, k, v, padded.distance, table, buckets=case["buckets"], bias_scale=c,
                                   lengths=lengths, backend="triton")
    grads = torch.autograd.grad(out, (q, k, v, table, c), to_padded(case["grad_out"]))
    back = sk.trees.pack_padded
    torch.testing.assert_close(out_p, back(out.transpose(1, 2), lengths), rtol=1e-5, atol=1e-5)
    for name, g in zip(("dq", "dk", "dv"), grads[:3]):
        torch.testing.assert_close(grads_p[name], back(g.transpose(1, 2), lengths), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads_p["dtable"], grads[3], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads_p["dbias_scale"], grads[4], rtol=1e-4, atol=1e-5)


@needs_triton
@pytest.mark.long_on_cpu
def test_deterministic_and_without_host_reads():
    case = make_packed_case([7, 30, 2], 2, 32, seed=9)
    first = _run_packed(case, torch.float16, "triton")[1]
    second = _run_packed(case, torch.float16, "triton")[1]
    for name in first:
        assert torch.equal(first[name], second[name]), name
    # The table gradient of a table shared by the heads: the table kernel's per-program sums, reduced in order.
    assert first["dtable"].abs().max() > 0
    packed = case["packed"].to(DEVICE)
    q, k, v = (case[n].to(DEVICE) for n in ("q", "k", "v"))
    q.requires_grad_()
    table = case["table"].to(DEVICE).requires_grad_()
    with count_host_reads() as reads:  # the whole op on the batch's plan: checks, forward and backward
        out = sk.syntax_bias_attention(q, k, v, packed, table, buckets=case["buckets"], backend="triton")
        out.sum().backward()
    assert reads == [], reads
    assert q.grad is not None and table.grad is not None


@pytest.mark.parametrize("opts", [dict(), dict(per_head=True, window=2), dict(causal=True)],
                         ids=["shared", "perhead-window", "causal"])
def test_auto_on_cpu_runs_the_cpp_kernels_and_matches_the_reference(opts):
    """backend="auto" on CPU tensors: the C++ CPU kernels (on the sequences laid out [S, H, N, D] inside the op),
    forward and every gradient against the reference sequence by sequence."""
    if not _ext.available() or not hasattr(_ext.load(), "bias_attention_forward"):
        pytest.skip("C++ extension not built")
    opts = dict(opts)
    kw = {k: opts.pop(k) for k in ("window", "causal") if k in opts}
    case = make_packed_case([6, 0, 11, 1, 23], 2, 16, seed=10, **opts)
    from syntaxkernels.ops.bias_attention import _cpu as bias_attention_cpu

    calls = []
    original = bias_attention_cpu.cpu_bias_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bias_attention_cpu, "cpu_bias_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
        packed = case["packed"]
        q, k, v = (case[n].clone().requires_grad_() for n in ("q", "k", "v"))
        table = case["table"].clone().requires_grad_()
        c = case["bias_scale"].clone().requires_grad_()
        out = sk.syntax_bias_attention(q, k, v, packed.distance, table, buckets=case["buckets"], bias_scale=c,
                                       cu_seqlens=packed.cu_seqlens, backend="auto", **kw)
    assert calls == [1]
    grads = torch.autograd.grad(out, (q, k, v, table, c), case["grad_out"])
    out64, grads64 = _run_packed(case, torch.float64, "spec", **kw)
    torch.testing.assert_close(out.double(), out64.cpu(), rtol=1e-4, atol=1e-5)
    for g, name in zip(grads, ("dq", "dk", "dv", "dtable", "dbias_scale")):
        torch.testing.assert_close(g.double(), grads64[name].cpu().reshape(g.shape), rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("change,match", [
    (dict(distance=torch.zeros(5, dtype=torch.uint8)), r"has 5 bytes but .* need sum n_s\^2 = 61"),
    (dict(cu_seqlens=torch.tensor([0, 5, 10], dtype=torch.int32), distance=torch.zeros(50, dtype=torch.uint8)),
     r"end at T = 11"),
    (dict(q=torch.randn(2, 11, 2, 16)), r"packed q must be a tensor \[T, H, D\]"),
    (dict(distance=torch.zeros(61, dtype=torch.int64)), r"uint8 \[sum n_s\^2\]"),
    (dict(lengths=torch.tensor([5, 6])), r"lengths does not apply"),
])
def test_bad_varlen_inputs(change, match):
    case = make_packed_case([5, 6], 2, 16, seed=11)
    args = dict(q=case["q"], k=case["k"], v=case["v"], distance=case["packed"].distance,
                cu_seqlens=case["packed"].cu_seqlens)
    args.update(change)
    extra = {"lengths": args.pop("lengths")} if "lengths" in args else {}
    with pytest.raises(ValueError, match=match):
        sk.syntax_bias_attention(args["q"], args["k"], args["v"], args["distance"], case["table"],
                                 buckets=case["buckets"], cu_seqlens=args["cu_seqlens"], backend="reference",
                                 **extra)


# ---------------------------------------------------------------------------------------------------------
# The sentences-packed workload
# ---------------------------------------------------------------------------------------------------------


def test_walked_tiles_model_matches_a_brute_force_count():
    """The inspection's model of the varlen loops (walked_tiles) against a direct count of each block's span."""
    lengths = [3, 0, 40, 1, 17, 33, 2]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T = cu[-1]
    seq = [s for s, n in enumerate(lengths) for _ in range(n)]
    for block, step in ((32, 32), (16, 32), (32, 16)):
        walked = 0
        for start in range(0, T, block):
            first, last = seq[start], seq[min(start + block, T) - 1]
            walked += -(-(cu[last + 1] - cu[first]) // step)
        assert _varlen.walked_tiles(lengths, block, step) == (-(-T // block), walked)


def test_table_walk_model_counts_live_tiles_and_bucket_ranges():
    """The inspection's model of the packed table kernel's walk (varlen_table_walk) against a direct count on a
    small packed batch: per walked tile, whether it has a valid pair and the buckets between its least and
    greatest distance."""
    from types import SimpleNamespace

    from syntaxkernels.tools.inspection import varlen_table_walk

    lengths = [3, 40, 1, 17, 5]
    rows = [_chain(n) if n > 10 else forests([n], seed=n)[0] for n in lengths]
    packed = PackedTreeBatch.from_heads(rows)
    workload = SimpleNamespace(lengths=lengths, packed_batch=lambda: packed)
    spec = sk.BucketSpec(8)
    lut = spec.lut()
    cu = packed.cu_seqlens.tolist()
    seq = packed.sequence.tolist()
    dense = {}
    for s_, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        block = packed.sequence_distance(s_)
        for i in range(a, b):
            for j in range(a, b):
                dense[i, j] = int(block[i - a, j - a])
    T = cu[-1]
    expected = dict(walked=0, live=0, one_bucket=0, mixed=0, buckets_mixed=0)
    for first in range(0, T, 16):
        last = min(first + 16, T) - 1
        for start in range(cu[seq[first]], cu[seq[last] + 1], 32):
            expected["walked"] += 1
            d = [dense[i, j] for i in range(first, last + 1) for j in range(start, min(start + 32, T))
                 if (i, j) in dense]
            if not d:
                continue
            expected["live"] += 1
            count = int(lut[max(d)] - lut[min(d)]) + 1
            expected["one_bucket" if count == 1 else "mixed"] += 1
            expected["buckets_mixed"] += count if count > 1 else 0
    assert varlen_table_walk(workload, 16, 32, spec) == expected
    # (without a window every walked tile holds a valid pair: each sequence of a block's span has rows in it)
    assert expected["mixed"] > 0 and expected["live"] == expected["walked"]


def _valid_share(workload, family="sm90"):
    config = bv.select_varlen_config("fwd", torch.bfloat16, 64, family)
    _, walked = _varlen.walked_tiles(workload.lengths, config["BLOCK_M"], config["BLOCK_N"])
    return workload.valid_pairs() / (walked * config["BLOCK_M"] * config["BLOCK_N"])


def test_sentences_packed_workload_fills_a_quarter_of_its_tiles_generated():
    from syntaxkernels.tools import workloads

    sentences = workloads.generated_sentences(400, seed=3, max_length=40)
    w = workloads.named_workload("sentences-packed", sentences, "generated (test)")
    assert w.packed and w.batch_size == 256
    batch = w.packed_batch()
    assert batch.num_tokens == sum(w.lengths) and batch.distance.numel() == w.valid_pairs()
    for family in ("sm90", "sm80", "small"):
        assert _valid_share(w, family) >= 0.25


def test_sentences_packed_workload_on_the_treebank(ud_dev_path):
    from syntaxkernels.tools import workloads

    w = workloads.named_workload("sentences-packed", workloads.treebank_heads(ud_dev_path), "treebank")
    share = _valid_share(w)
    assert share >= 0.25, share
    # The padded forward tile (128 x 64) on the same sentences padded to each 32-sentence batch's longest.
    padded = sum(32 * -(-max(w.lengths[i:i + 32]) // 128) * -(-max(w.lengths[i:i + 32]) // 64) * 128 * 64
                 for i in range(0, w.batch_size, 32))
    assert w.valid_pairs() / padded < share / 2


COMPILE_SCRIPT = """
import json, sys
from syntaxkernels.tools import inspection as I
reports = []
for arch in (80, 90):
    reports += I.inspect_workload("sentences-packed", "bf16", 64, arch)
json.dump(dict(problems=I.workload_problems(reports), kernels=sorted({r.kernel for r in reports}),
               areas=[(r.cost or {}).get("area") for r in reports if r.kernel.startswith("_varlen")]), sys.stdout)
"""


@pytest.mark.slow  # compiles for sm_80 and sm_90 in a subprocess without the interpreter
def test_sentences_packed_kernels_compile_without_spills():
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["problems"] == [], result["problems"]
    # The packed kernels, and the one-program epilogue that turns the table kernel's bucket sums into the table's
    # gradients.
    assert result["kernels"] == ["_bias_table_grad_kernel", "_varlen_dkdv_kernel", "_varlen_dq_kernel",
                                 "_varlen_fwd_kernel", "_varlen_table_kernel"]
    assert all(a is not None and 1 <= a <= 4 for a in result["areas"]), result["areas"]


ADDRESS_SCRIPT = """
import json, re, sys
from syntaxkernels.tools import inspection as I

def definitions(ttir):
    found = {}
    for line in ttir.splitlines():
        m = re.match(r"\\s*(%[\\w.]+)(?::\\d+)? = ([\\w.]+) ?(.*)", line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    return found

def sources(name, found, depth=0):
    # the ops (or arguments) a value comes from through shape-only ops and sign extensions
    if name not in found or depth > 40:
        return {name}
    op, rest = found[name]
    if op in ("tt.expand_dims", "tt.splat", "tt.broadcast", "ttg.convert_layout", "arith.extsi"):
        return sources(re.match(r"(%[\\w.]+)", rest).group(1), found, depth + 1)
    return {op}

from syntaxkernels.ops.bias_attention import _varlen_kernels as bv

w = I._workload("sentences-packed")
launches = []
for limit in (bv.STORED_DS_PAIRS_PER_TOKEN, 0):  # dS stored by the dK/dV kernel, and recomputed by the table kernel
    bv.STORED_DS_PAIRS_PER_TOKEN = limit
    with I.fake_gpu(90), I.capture_launches(keep_going=True) as captured:
        I._user_call_packed(w.packed_batch(), "bf16", 64)
    launches += [(launch, "" if limit else ":recomputed") for launch in captured]
out = {}
for launch, variant in launches:
    name = launch.kernel.fn.__name__
    if not name.startswith("_varlen"):
        continue
    name += variant
    ttir = launch.compiled.asm["ttir"]
    found = definitions(ttir)
    narrow, wide = [], []
    for m in re.finditer(r"= arith\\.muli (%[\\w.]+), (%[\\w.]+) : (\\S+)", ttir):
        a, b = sources(m.group(1), found), sources(m.group(2), found)
        (wide if "i64" in m.group(3) else narrow).append(sorted(a | b))
    out[name] = dict(narrow=narrow, wide=wide)
json.dump(out, sys.stdout)
"""

ROW_STRIDES = {"%stride_qt", "%stride_kt", "%stride_vt", "%stride_gt", "%stride_ot", "%stride_xt", "%stride_yt"}


@pytest.mark.slow  # compiles for sm_90 in a subprocess without the interpreter
def test_packed_row_offsets_are_int64_before_any_stride():
    """Large packed batches (``T * H * D >= 2^31``) must not overflow a row offset: in the typed IR of every
    packed kernel, an int32 product of a row stride (``stride_*t``) takes an in-tile index (``tl.arange``, below
    the block side) as its other factor; a token index times a row stride is an int64 product."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", ADDRESS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    kernels = ["_varlen_dkdv_kernel", "_varlen_dq_kernel", "_varlen_fwd_kernel", "_varlen_table_kernel"]
    assert sorted(result) == sorted(kernels + [k + ":recomputed" for k in kernels])
    for name, products in result.items():
        for factors in products["narrow"]:
            if (ROW_STRIDES | {"%stride_dsh"}) & set(factors):
                assert "tt.make_range" in factors, (name, factors)
        # every row stride the kernel reads is also multiplied in int64 (the tile's first token, or the key rows);
        # the table kernel that reads the stored dS reads no row of q, k, v, dO
        used = ROW_STRIDES & {f for factors in products["narrow"] + products["wide"] for f in factors}
        wide = ROW_STRIDES & {f for factors in products["wide"] for f in factors}
        assert (used or name == "_varlen_table_kernel") and used == wide, (name, used, wide)
        # the stored dS's head offset (head x sum n_s^2 may pass 2^31) is an int64 product where it is read or written
        if name in ("_varlen_dkdv_kernel", "_varlen_table_kernel"):
            assert any("%stride_dsh" in factors for factors in products["wide"]), name


# ---------------------------------------------------------------------------------------------------------
# Collation
# ---------------------------------------------------------------------------------------------------------


def _items(lengths, seed=12):
    rows = forests(lengths, seed=seed)
    return [dict(input_ids=list(range(100 + i, 100 + i + n)), heads=r, labels=[1] * n)
            for i, (n, r) in enumerate(zip(lengths, rows))], rows


def test_collator_packed_batch_layout():
    items, rows = _items([4, 1, 6])
    out = sk.trees.TreeCollator(packed=True, max_tokens=16, windows=(1,))(items)
    assert out["input_ids"].shape == (1, 11) and out["labels"].shape == (1, 11)
    assert out["input_ids"][0].tolist() == sum((it["input_ids"] for it in items), [])
    assert out["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5]
    assert out["cu_seq_lens_q"].tolist() == [0, 4, 5, 11] and out["cu_seq_lens_q"].dtype == torch.int32
    assert out["max_length_q"] == out["max_length_k"] == out["max_seqlen"] == 6
    assert "attention_mask" not in out
    trees = out["trees"]
    assert isinstance(trees, PackedTreeBatch) and trees.cached_window_lists(1) is not None
    assert torch.equal(trees.distance, PackedTreeBatch.from_heads(rows).distance)
    with pytest.raises(ValueError, match="11 tokens .* max_tokens = 10"):
        sk.trees.TreeCollator(packed=True, max_tokens=10)(items)


def test_collator_packed_matches_transformers_flattening():
    transformers = pytest.importorskip("transformers")
    items, _ = _items([5, 2, 7])
    ours = sk.trees.TreeCollator(packed=True)(items)
    theirs = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
        [{"input_ids": it["input_ids"]} for it in items])
    assert torch.equal(ours["input_ids"], torch.as_tensor(theirs["input_ids"]))
    assert torch.equal(ours["position_ids"], torch.as_tensor(theirs["position_ids"]))
    assert ours["cu_seq_lens_q"].tolist() == torch.as_tensor(theirs["cu_seq_lens_q"]).tolist()
    assert ours["max_length_q"] == int(theirs["max_length_q"])


def test_token_budget_batch_sampler():
    sampler = sk.trees.TokenBudgetBatchSampler([5, 3, 9, 1, 2], 10)
    assert list(sampler) == [[0, 1], [2, 3], [4]] and len(sampler) == 3
    with pytest.raises(ValueError, match="item 2 has 9 tokens"):
        sk.trees.TokenBudgetBatchSampler([5, 3, 9], 8)


# ---------------------------------------------------------------------------------------------------------
# Window and sub-network attention on packed trees
# ---------------------------------------------------------------------------------------------------------


def _padded_case(lengths, H, D, seed, roots=2):
    """A packed batch and the same sequences padded ([S, H, N, D] inputs), q/k/v/grad shared by both."""
    gen = torch.Generator().manual_seed(seed)
    packed = PackedTreeBatch.from_heads(forests(lengths, seed=seed, roots=roots))
    padded = packed.to_padded()
    T = packed.num_tokens
    q, k, v = (torch.randn(T, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    return packed, padded, q, k, v


def _to_padded(x, padded):
    S, N = padded.heads.shape
    y = x.new_zeros((S, N) + tuple(x.shape[1:]))
    y[torch.arange(N)[None, :] < padded.lengths[:, None]] = x
    return y.transpose(1, 2)  # [S, H, N, D]


def _padded_grads(fn_packed, fn_padded, q, k, v, padded, dtype):
    """Outputs and q/k/v gradients of the packed path (inputs in ``dtype``) and of the padded reference (fp64),
    the padded ones packed back to [T, ...]."""
    qs, ks, vs = (x.to(DEVICE, dtype).clone().requires_grad_() for x in (q, k, v))
    out = fn_packed(qs, ks, vs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = torch.autograd.grad(out, (qs, ks, vs), g.to(DEVICE, dtype))
    qp, kp, vp = (_to_padded(x, padded).requires_grad_() for x in (q, k, v))
    ref = fn_padded(qp, kp, vp)  # token-major [T, ...] packed back
    ref_grads = torch.autograd.grad(ref, (qp, kp, vp), g)
    ref_grads = [sk.trees.pack_padded(x.transpose(1, 2), padded.lengths) for x in ref_grads]
    return out, grads, ref, ref_grads


@pytest.mark.parametrize("backend,dtype", [pytest.param("auto", torch.float32, id="cpp-or-reference"),
                                           pytest.param("triton", torch.float32, marks=needs_triton, id="triton")])
@pytest.mark.parametrize("window", [0, 2])
def test_packed_window_attention_equals_the_padded_reference(backend, dtype, window):
    packed, padded, q, k, v = _padded_case([7, 1, 0, 19, 4], 2, 16, seed=13)
    dev_packed = packed.to(DEVICE)

    def run_packed(q, k, v):
        return sk.ops.syntax_window_attention(q, k, v, dev_packed, window=window, backend=backend)

    def run_padded(q, k, v):
        out = sk.reference.gat_attention(q, k, v, padded.distance, window=window, lengths=padded.lengths)
        return sk.trees.pack_padded(out.transpose(1, 2), padded.lengths)

    out, grads, ref, ref_grads = _padded_grads(run_packed, run_padded, q, k, v, padded, dtype)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double().cpu(), r, rtol=1e-4, atol=1e-5)


@needs_triton
def test_packed_window_without_lists_on_the_fused_kernel(monkeypatch):
    """The path CUDA takes when the window lists are not built (no host synchronisation): the varlen kernel with a
    zero table and the window, here forced by hiding the lists."""
    packed, padded, q, k, v = _padded_case([9, 3, 14], 1, 16, seed=14)
    dev_packed = packed.to(DEVICE)
    monkeypatch.setattr(PackedTreeBatch, "window_lists", lambda self, w: None)

    def run_packed(q, k, v):
        return sk.ops.syntax_window_attention(q, k, v, dev_packed, window=1, backend="triton")

    def run_padded(q, k, v):
        out = sk.reference.gat_attention(q, k, v, padded.distance, window=1, lengths=padded.lengths)
        return sk.trees.pack_padded(out.transpose(1, 2), padded.lengths)

    out, grads, ref, ref_grads = _padded_grads(run_packed, run_padded, q, k, v, padded, torch.float32)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double().cpu(), r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", [pytest.param("auto", id="cpp"), pytest.param("triton", marks=needs_triton),
                                     "reference"])
@pytest.mark.parametrize("masks", [sk.MaskSpec(max_distance=2, pairwise=True), sk.MaskSpec(parent=False, child=False,
                                                                                            sibling=False, pairwise=True)],
                         ids=["all", "dense-only"])
@pytest.mark.long_on_cpu
def test_packed_subnetwork_attention_equals_the_padded_reference(backend, masks):
    packed, padded, q, k, v = _padded_case([6, 1, 0, 15, 5], 2, 16, seed=15, roots=2)
    dev_packed = packed.to(DEVICE)
    M = masks.num_masks

    def run_packed(q, k, v):
        out, nonempty = sk.syntax_subnetwork_attention(q, k, v, dev_packed, masks, backend=backend)
        run_packed.nonempty = nonempty
        return out

    def run_padded(q, k, v):
        out, nonempty = sk.reference.syntax_subnetwork_attention(q, k, v, padded, masks)  # [S, M, H, N, D]
        run_padded.nonempty = sk.trees.pack_padded(nonempty.transpose(1, 2), padded.lengths)
        return sk.trees.pack_padded(out.permute(0, 3, 1, 2, 4), padded.lengths)  # [T, M, H, D]

    out, grads, ref, ref_grads = _padded_grads(run_packed, run_padded, q, k, v, padded, torch.float32)
    assert out.shape == (packed.num_tokens, M, 2, 16)
    assert torch.equal(run_packed.nonempty.cpu(), run_padded.nonempty)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double().cpu(), r, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# transformers, padding-free (DataCollatorWithFlattening's layout)
# ---------------------------------------------------------------------------------------------------------


def _tiny_bert(method, **kwargs):
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForTokenClassification(config)
    enable_syntax_attention(model, method, **kwargs)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 0.5)  # non-trivial syntax parameters: the trees change the outputs
    return model.eval()


@pytest.mark.parametrize("method,kwargs", [("bias", {}), ("bias", dict(per_head=True, layers=[1])),
                                           ("subnetwork", dict(masks=sk.MaskSpec(max_distance=2, pairwise=True),
                                                               variant="package")),  # paper/release: N-dependent
                                           ("gat", dict(gat_config=dict(num_layers=2, num_heads=2, head_dim=8,
                                                                        window=2, probe_rank=4)))],
                         ids=["bias", "bias-perhead-layer1", "subnetwork", "gat-probe"])
@pytest.mark.long_on_cpu
def test_transformers_packed_equals_padded(method, kwargs):
    """A tiny BERT from a config: the padding-free batch (TreeCollator(packed=True): input_ids [1, T],
    position_ids, cu_seq_lens_*, PackedTreeBatch) gives the padded batch's logits at every token and the same
    gradients for every parameter (syntax parameters included)."""
    model = _tiny_bert(method, **kwargs)
    lengths = [9, 3, 14, 1]
    rows = [[-1] + [0 if h < 0 else h + 1 for h in r] for r in forests([n - 1 for n in lengths], seed=16)]
    gen = torch.Generator().manual_seed(17)
    items = [dict(input_ids=torch.randint(4, 100, (n,), generator=gen).tolist(), heads=r,
                  labels=torch.randint(0, 2, (n,), generator=gen).tolist()) for n, r in zip(lengths, rows)]
    padded = sk.trees.TreeCollator()(items)
    packed = sk.trees.TreeCollator(packed=True)(items)

    from syntaxkernels.integrations.transformers import syntax_aux_loss

    pos = torch.randint(0, 18, (sum(lengths),), generator=gen)
    extra_pad, extra_pack = {}, {}
    if method == "gat":
        extra_pad["syntax_pos"] = torch.zeros(padded["input_ids"].shape, dtype=torch.int64).index_put(
            (torch.arange(len(lengths)).repeat_interleave(torch.tensor(lengths)),
             torch.cat([torch.arange(n) for n in lengths])), pos)
        extra_pack["syntax_pos"] = pos[None]

    def step(batch, **inputs):
        model.zero_grad()
        out = model(syntax_trees=batch["trees"], labels=batch["labels"], **inputs)
        loss = out.loss
        aux = syntax_aux_loss(model)
        if method == "gat":
            assert aux is not None
            loss = loss + 0.1 * aux
        loss.backward()
        return out.logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    logits_pad, grads_pad = step(padded, input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                                 **extra_pad)
    flash_kwargs = {k: packed[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    logits_pack, grads_pack = step(packed, input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                                   **flash_kwargs, **extra_pack)
    torch.testing.assert_close(logits_pack[0], sk.trees.pack_padded(logits_pad, padded["lengths"]), rtol=1e-4,
                               atol=1e-5)
    assert grads_pad.keys() == grads_pack.keys()
    for name in grads_pad:
        # Packed and padded rows add the same per-token gradients in another order: an entry that sums many
        # large terms differs at fp32 rounding of the tensor's largest entries (the embeddings: ~1e3, 6e-5 apart).
        atol = max(1e-5, 1e-7 * grads_pad[name].abs().max().item())
        torch.testing.assert_close(grads_pack[name], grads_pad[name], rtol=1e-4, atol=atol, msg=name)


def test_transformers_packed_trees_must_match_the_row():
    model = _tiny_bert("bias")
    items, _ = _items([4, 5])
    for item in items:
        item["input_ids"] = [i % 90 + 5 for i in item["input_ids"]]
    packed = sk.trees.TreeCollator(packed=True)(items)
    with pytest.raises(ValueError, match=r"need input_ids \[1, T\] = \[1, 9\]"):
        model(input_ids=packed["input_ids"][:, :8], syntax_trees=packed["trees"])


@pytest.mark.parametrize("module", ["bias", "subnetwork"])
def test_nn_modules_take_a_packed_row(module):
    """sk.nn self-attention modules on one packed row [1, T, E] with a PackedTreeBatch: the padded batch's outputs
    at every token and the same parameter gradients."""
    rows = forests([5, 9, 1, 3], seed=18)
    packed, padded = PackedTreeBatch.from_heads(rows), sk.TreeBatch.from_heads(rows)
    torch.manual_seed(1)
    if module == "bias":
        m = sk.nn.SyntaxBiasedSelfAttention(32, 4, per_head=True)
    else:
        m = sk.nn.SyntaxBertSelfAttention(32, 4, masks=sk.MaskSpec(max_distance=2, pairwise=True), variant="package")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "proj" not in name:
                p.normal_(0.0, 0.5)
    x = torch.randn(4, 9, 32)
    out_pad = m(x, padded)
    g = torch.randn(out_pad.shape)
    mask = torch.arange(9)[None, :] < padded.lengths[:, None]
    grads_pad = torch.autograd.grad((out_pad * g * mask[..., None]).sum(), list(m.parameters()))
    out_pack = m(sk.trees.pack_padded(x, padded.lengths)[None], packed)
    grads_pack = torch.autograd.grad((out_pack[0] * sk.trees.pack_padded(g, padded.lengths)).sum(),
                                     list(m.parameters()))
    torch.testing.assert_close(out_pack[0], sk.trees.pack_padded(out_pad, padded.lengths), rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip(m.named_parameters(), grads_pack, grads_pad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlmr", "camembert", "electra", "distilbert"])
def test_transformers_packed_every_family(arch):
    """Every supported family (one row of FAMILIES each) takes the packed row: the padded batch's logits at every
    token. RoBERTa-style families number positions from ``pad_token_id + 1``: their position_ids are shifted."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters
    from test_integration_transformers import _config

    classes = {"bert": transformers.BertForTokenClassification, "roberta": transformers.RobertaForTokenClassification,
               "xlmr": transformers.XLMRobertaForTokenClassification,
               "camembert": transformers.CamembertForTokenClassification,
               "electra": transformers.ElectraForTokenClassification,
               "distilbert": transformers.DistilBertForTokenClassification}
    model = classes[arch](_config(arch, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    enable_syntax_attention(model, "bias")
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 0.5)
    model.eval()
    lengths = [9, 3, 14]
    rows = [[-1] + [0 if h < 0 else h + 1 for h in r] for r in forests([n - 1 for n in lengths], seed=19)]
    gen = torch.Generator().manual_seed(20)
    items = [dict(input_ids=torch.randint(4, 100, (n,), generator=gen).tolist(), heads=r)
             for n, r in zip(lengths, rows)]
    padded = sk.trees.TreeCollator(pad_token_id=model.config.pad_token_id or 0)(items)
    packed = sk.trees.TreeCollator(packed=True)(items)
    positions = packed["position_ids"]
    if arch in ("roberta", "xlmr", "camembert"):
        positions = positions + model.config.pad_token_id + 1
    expected = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                     syntax_trees=padded["trees"]).logits
    got = model(input_ids=packed["input_ids"], position_ids=positions, syntax_trees=packed["trees"]).logits
    torch.testing.assert_close(got[0], sk.trees.pack_padded(expected, padded["lengths"]), rtol=1e-4, atol=1e-5)


@needs_triton
def test_torch_compile_fullgraph_and_opcheck():
    case = make_packed_case([5, 9, 3], 2, 32, seed=21)
    packed = case["packed"].to(DEVICE)
    q = case["q"].to(DEVICE).requires_grad_()
    table = case["table"].to(DEVICE).requires_grad_()
    k, v = case["k"].to(DEVICE), case["v"].to(DEVICE)

    def f(q, k, v, distance, table, cu):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), cu_seqlens=cu,
                                        window=3, backend="triton")

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if DEVICE == "cuda" else "eager")
    out = compiled(q, k, v, packed.distance, table, packed.cu_seqlens)
    out.sum().backward()
    ref = _varlen.reference_bias_attention_varlen(q.detach(), k, v, packed.distance, table.detach(),
                                                  buckets=sk.BucketSpec(), cu_seqlens=packed.cu_seqlens, window=3)
    torch.testing.assert_close(out.detach(), ref, atol=2e-5, rtol=1e-5)
    assert table.grad is not None and table.grad.abs().max() > 0
    args = (q.detach(), k, v, packed.distance, table.detach().reshape(1, -1), torch.ones(1, device=DEVICE),
            _host._bucket_lut(sk.BucketSpec(), q), packed.cu_seqlens, packed.sequence, packed.distance_offsets, 0.2, 3,
            False)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_varlen_fwd, args,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("rows", [[], [[]], [[], []]], ids=["no-sequence", "one-empty", "two-empty"])
def test_batches_without_tokens(rows):
    packed = PackedTreeBatch.from_heads(rows)
    assert packed.num_tokens == 0 and packed.num_sequences == len(rows) and packed.max_seqlen == 0
    q = torch.randn(0, 2, 16, requires_grad=True)
    table = torch.zeros(sk.BucketSpec().num_buckets, requires_grad=True)
    backends = ["auto", "reference"] + (["triton"] if DEVICE == "cpu" and P.interpreting() else [])
    for backend in backends:
        out = sk.syntax_bias_attention(q, q, q, packed.distance, table, buckets=sk.BucketSpec(),
                                       cu_seqlens=packed.cu_seqlens, backend=backend)
        assert out.shape == (0, 2, 16)
    out, nonempty = sk.syntax_subnetwork_attention(q, q, q, packed, sk.MaskSpec())
    assert out.shape == (0, sk.MaskSpec().num_masks, 2, 16) and nonempty.shape == (0, sk.MaskSpec().num_masks)
    assert sk.ops.syntax_window_attention(q, q, q, packed, window=2).shape == (0, 2, 16)


def test_collator_packed_with_a_tokenizer_equals_its_padded_trees():
    """Sentence items with a fast tokenizer: the packed batch holds the padded batch's token trees, ids and
    word ids, without padding."""
    pytest.importorskip("transformers")
    from syntaxkernels.trees import Sentence
    from test_tree_inputs import WORDPIECES, _bert_like

    tokenizer = _bert_like(WORDPIECES)
    sentences = [Sentence(words=["the", "cats", "unbelievable", "."], heads=[1, -1, 1, 1]),
                 Sentence(words=["a", "dog", "ran"], heads=[1, 2, -1])]
    padded = sk.trees.TreeCollator(tokenizer=tokenizer)(sentences)
    packed = sk.trees.TreeCollator(tokenizer=tokenizer, packed=True)(sentences)
    lengths = padded["lengths"]
    assert torch.equal(packed["input_ids"][0], sk.trees.pack_padded(padded["input_ids"], lengths))
    assert "attention_mask" not in packed and packed["word_ids"] == padded["word_ids"]
    trees = packed["trees"]
    for s, n in enumerate(lengths.tolist()):
        assert torch.equal(trees.sequence_distance(s), padded["trees"].distance[s, :n, :n])


def test_dataloader_workers_build_packed_batches():
    """TreeCollator(packed=True) in a DataLoader worker with TokenBudgetBatchSampler: the batch pickles across
    processes, its edge lists included."""
    from torch.utils.data import DataLoader

    items, rows = _items([4, 7, 2, 9, 5], seed=22)
    sampler = sk.trees.TokenBudgetBatchSampler([len(r) for r in rows], 12)
    loader = DataLoader(items, batch_sampler=sampler, num_workers=1,
                        collate_fn=sk.trees.TreeCollator(packed=True, max_tokens=12, windows=(1,)))
    batches = list(loader)
    assert [b["lengths"].tolist() for b in batches] == [[4, 7], [2, 9], [5]]
    for b, chunk in zip(batches, ([0, 1], [2, 3], [4])):
        expected = PackedTreeBatch.from_heads([rows[i] for i in chunk])
        assert torch.equal(b["trees"].distance, expected.distance)
        assert b["trees"].cached_window_lists(1) is not None
