"""The batch's structure plan (``syntaxkernels.plan``): one plan per batch, passed to every layer; nothing derived
behind the caller's back, so a captured graph replays exactly with another batch copied in; and a layer's device
work is a handful of kernels, no copies.

The replay test records every launch of a layer's forward and backward (the op's whole device work: the LUT is
written by the forward kernel, the table's gradients by the backward's last kernel), copies another batch of the
same shapes into the captured plan (``copy_``) and new inputs into the captured tensors, replays the recorded
launches as they were, and compares with an eager call on the other batch: what a CUDA graph does, on the CPU
under the Triton interpreter (or on CUDA)."""
import pickle

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import RelativePositionSpec
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops.bias_attention import configs
from syntaxkernels.plan import DistancePlan, StructurePlan, rows_are_short, structure_plan

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_triton


def _padded_heads(rows, N):
    heads = torch.full((len(rows), N), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        heads[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
    return heads, torch.tensor([len(r) for r in rows])


def _batch(rows, N):
    heads, lengths = _padded_heads(rows, N)
    return sk.TreeBatch.from_heads(heads, lengths).to(DEVICE)


def _chain(n, start=0):
    return [-1] + [start + i for i in range(n - 1)]


# ----------------------------------------------------------------------------------------------------------
# What a plan is
# ----------------------------------------------------------------------------------------------------------

def test_tree_batches_are_plans():
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0, 0]])
    assert isinstance(trees, StructurePlan) and trees.symmetric and not trees.is_packed
    assert trees.kernel_lengths.dtype == torch.int32 and trees.kernel_lengths.tolist() == [4, 3]
    packed = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0, 0]], packed=True)
    assert isinstance(packed, StructurePlan) and packed.is_packed and packed.symmetric
    assert packed.plan_tensors()[0] is packed.distance


def test_a_bare_distance_is_not_known_symmetric_and_gets_aligned_rows():
    d = torch.zeros(2, 21, 21, dtype=torch.uint8)
    plan = structure_plan(d)
    assert isinstance(plan, DistancePlan) and not plan.symmetric
    assert plan.distance.stride(1) % 16 == 0 and torch.equal(plan.distance, d)
    assert plan.kernel_lengths.tolist() == [21, 21]
    assert structure_plan(d, symmetric=True).symmetric
    with pytest.raises(ValueError, match="symmetric must be None or a bool"):
        structure_plan(d, symmetric="yes")


def test_lengths_that_disagree_with_a_tree_distance_are_refused():
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 2], [-1, 0]])
    with pytest.raises(ValueError, match=r"batch item 1: lengths\[1\] = 4 but the trees of distance have 2 tokens"):
        structure_plan(trees.distance, torch.tensor([4, 4]))
    structure_plan(trees.distance, torch.tensor([4, 2]))  # its own lengths
    # A distance that is not a padded tree's (no 0 / 255 diagonal) is taken with any lengths.
    structure_plan(torch.full((2, 4, 4), 3, dtype=torch.uint8), torch.tensor([4, 1]))
    # Through the op too (a bare tensor with lengths).
    q = torch.zeros(2, 1, 4, 8)
    with pytest.raises(ValueError, match="batch item 1"):
        sk.syntax_bias_attention(q, q, q, trees.distance, torch.zeros(sk.BucketSpec().num_buckets),
                                 buckets=sk.BucketSpec(), lengths=torch.tensor([4, 3]), backend="reference")


@pytest.mark.parametrize("cu,size,match", [
    ([0, 3, 2], 9 + 1, "never decrease"),
    ([1, 3, 5], 8, "start at 0"),
    ([0, 3, 5], 12, "need sum n_s\\^2 = 13"),
])
def test_packed_structure_is_checked_where_it_lives(cu, size, match):
    with pytest.raises(ValueError, match=match):
        structure_plan(torch.zeros(size, dtype=torch.uint8), cu_seqlens=torch.tensor(cu, dtype=torch.int32))


def test_derived_entries_are_kept_moved_pickled_and_dropped_after_an_in_place_change():
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1], [-1, 0]])
    calls = []
    first = trees.derived(("test entry",), lambda: calls.append(1) or trees.distance.sum(dim=1))
    assert trees.derived(("test entry",), lambda: calls.append(1) or None) is first and calls == [1]
    for moved in (trees.to("cpu"), pickle.loads(pickle.dumps(trees))):
        assert torch.equal(moved.derived(("test entry",), lambda: None), first)
    trees.lengths[1] = 1  # an in-place change of the structure: derived again, the kernels' lengths too
    again = trees.derived(("test entry",), lambda: calls.append(2) or trees.distance.sum(dim=1))
    assert calls == [1, 2] and again is not first and trees.kernel_lengths.tolist() == [4, 1]


def test_copy_refuses_another_shape_and_edge_lists():
    a = sk.TreeBatch.from_heads([[-1, 0, 1], [-1, 0, 0]])
    b = sk.TreeBatch.from_heads([[-1, 0, 1, 2], [-1, 0, 0, 1]])
    with pytest.raises(ValueError, match="distance differs"):
        a.copy_(b)
    c = sk.TreeBatch.from_heads([[-1, 0, 0], [-1, 0, 1]])
    a.window_lists(1)
    with pytest.raises(ValueError, match="edge lists"):
        a.copy_(c)
    with pytest.raises(TypeError):
        a.copy_(c.distance)


def test_copy_copies_the_structure_and_what_was_derived():
    a = sk.TreeBatch.from_heads([[-1, 0, 1, 2, 3], [-1, 0, 0]])
    b = sk.TreeBatch.from_heads([[-1, 0, 0, 0, 0], [-1, 0, 1, 1, 1]])
    entry = a.derived(("transposed distance",))  # a registered kind: copy_ derives b's
    a.copy_(b)
    for name in ("heads", "lengths", "depth", "segment", "kernel_lengths"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.distance, b.distance)
    assert a.derived(("transposed distance",)) is entry and torch.equal(entry, b.distance.transpose(1, 2))


def test_rows_are_short_is_the_tile_model_by_hand():
    """Score elements spanned in 64x32 tiles, each 1.3 times as dear, against 128x64 tiles: a 30-token row 2,048 x
    1.3 against 8,192 (short), 77 tokens 128 x 96 x 1.3 = 15,974 against 16,384 (short), 100 tokens 128 x 128 in
    both (not), 500 tokens 512 x 512 in both (not); a batch is summed over its rows (one 500-token row and 31 of 20
    tokens: 325,632 x 1.3 = 423,322 against 516,096, short); no rows: not."""
    assert rows_are_short([30] * 4) and rows_are_short([77]) and rows_are_short([500] + [20] * 31)
    assert not rows_are_short([100, 100]) and not rows_are_short([500]) and not rows_are_short([])
    assert not rows_are_short([0, 0])


def test_short_rows_is_made_with_the_plan_from_host_lengths(monkeypatch):
    """A plan made from lengths on the host carries their summary (TreeBatch, structure_plan from a tensor or a list,
    or without lengths: every row N); given, it wins; lengths on a GPU (pretended) leave it unknown, and a plan
    moved (``to``) or pickled keeps what it had; an in-place change of the lengths leaves it as it was."""
    from syntaxkernels import _validation

    short = _batch([_chain(30), _chain(5)], 100)
    full = _batch([_chain(100), _chain(99)], 100)
    assert short.short_rows is True and full.short_rows is False
    d = torch.zeros(2, 300, 300, dtype=torch.uint8)
    assert structure_plan(d).short_rows is False and structure_plan(d[:, :40, :40]).short_rows is True
    assert structure_plan(d, torch.tensor([20, 30])).short_rows is True
    assert structure_plan(d, [300, 299]).short_rows is False
    assert structure_plan(d, [300, 299], short_rows=True).short_rows is True
    assert pickle.loads(pickle.dumps(short)).short_rows is True
    monkeypatch.setattr(_validation, "_on_host", lambda t: False)  # lengths that live on a GPU
    assert structure_plan(d, torch.tensor([20, 30])).short_rows is None
    assert short.to(DEVICE).short_rows is True  # (moved: the summary made on the host goes with it)
    unknown = structure_plan(d, torch.tensor([20, 30]))
    assert unknown.short_rows is None and unknown.to(DEVICE).short_rows is None
    monkeypatch.undo()
    full.lengths.fill_(3)
    full.derived(("transposed distance",))  # (the change is noticed: derived entries dropped, the summary kept)
    assert full.short_rows is False


def test_copy_refuses_a_plan_of_another_row_class_unless_pinned():
    """``short_rows`` picks the tiles, so it is part of a captured graph's class: ``copy_`` refuses a batch of the
    other class (a replay of the captured tiles would round unlike an eager call on it); set on both, it copies."""
    a = _batch([_chain(30), _chain(5)], 100)
    b = _batch([_chain(100), _chain(99)], 100)
    with pytest.raises(ValueError, match="short_rows True here, False given"):
        a.copy_(b)
    b.short_rows = True
    a.copy_(b)
    assert torch.equal(a.lengths, b.lengths) and a.short_rows is True


@pytest.mark.parametrize("leak_free", [False, True])
def test_index_select_and_repeat_interleave_pick_items(leak_free):
    """``TreeBatch.index_select`` / ``repeat_interleave`` (generate's beam expansion) equal the batch built from the
    picked items' heads: every tensor, the aligned distance layout, and the op's output on it."""
    rows = [[-1, 0, 1, 2, 3], [-1, 0, 0], [1, -1, 1, 1, 2]]
    heads, lengths = _padded_heads(rows, 5)
    trees = sk.TreeBatch.from_heads(heads, lengths, leak_free=leak_free)
    trees.derived(("test entry",), lambda: trees.distance.sum(dim=1))
    for picked, order in ((trees.index_select([2, 0, 2]), [2, 0, 2]),
                          (trees.index_select(torch.tensor([1])), [1]),
                          (trees.repeat_interleave(2), [0, 0, 1, 1, 2, 2])):
        want = sk.TreeBatch.from_heads(heads[order], lengths[order], leak_free=leak_free)
        for name in ("heads", "lengths", "distance", "depth", "segment", "kernel_lengths"):
            assert torch.equal(getattr(picked, name), getattr(want, name)), name
        assert picked.leak_free == leak_free and picked.symmetric == (not leak_free) and not picked._derived
        assert picked.distance.stride(1) % 16 == 0 and picked.distance.stride(0) % 16 == 0
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(len(order), 2, 5, 8, generator=g) for _ in range(3))
        table = torch.randn(sk.BucketSpec().num_buckets, generator=g)
        got = sk.syntax_bias_attention(q, k, v, picked, table, buckets=sk.BucketSpec(), causal=leak_free)
        ref = sk.syntax_bias_attention(q, k, v, want, table, buckets=sk.BucketSpec(), causal=leak_free)
        torch.testing.assert_close(got, ref)
    assert trees.repeat_interleave(1) is trees
    with pytest.raises(ValueError, match="0..2"):
        trees.index_select([0, 3])
    with pytest.raises(ValueError, match="1-D"):
        trees.index_select([[0]])
    with pytest.raises(TypeError, match="integer"):
        trees.index_select(torch.tensor([0.0]))
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="repeats"):
            trees.repeat_interleave(bad)


# ----------------------------------------------------------------------------------------------------------
# Device work per layer
# ----------------------------------------------------------------------------------------------------------

def _record(monkeypatch, run=True):
    """Every launch of the package (kernel, grid, args, kwargs), run as well when ``run``."""
    launches = []

    def hook(kernel, grid, args, kwargs):
        launches.append((kernel, grid, args, kwargs))
        if run:  # outside any dispatch mode: the interpreter's own copies to and from the host are not the op's
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                kernel[grid](*args, **kwargs)

    monkeypatch.setattr(P, "_LAUNCH_HOOK", hook)  # (restored after the test)
    return launches


def _layer(trees, dtype, H=2, D=32, window=None, table=None, seed=0, causal=False, position=None):
    """One layer as a model runs it: projections [B, N, H * D] split into heads, a shared table and a learnable
    strength (and with ``position``, a RelativePositionSpec, T5's term with a learnable ``[H, P]`` table), forward
    and backward; returns the tensors (inputs, output, gradients)."""
    g = torch.Generator().manual_seed(seed)
    if trees.is_packed:
        T = trees.num_tokens
        x = [torch.randn(T, H * D, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3)]
        q, k, v = (t.view(T, H, D) for t in x)
        grad = torch.randn(T, H * D, generator=g).to(DEVICE, dtype)
    else:
        B, N = trees.distance.shape[:2]
        x = [torch.randn(B, N, H * D, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3)]
        q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x)
        grad = torch.randn(B, N, H * D, generator=g).to(DEVICE, dtype)
    buckets = sk.BucketSpec()
    if table is None:
        table = torch.randn(buckets.num_buckets, generator=g).to(DEVICE).requires_grad_()
    c = torch.full((1,), 0.7, device=DEVICE, requires_grad=True)
    term, leaves = {}, [table, c]
    if position is not None:
        ptable = torch.randn(H, position.num_buckets, generator=g).to(DEVICE).requires_grad_()
        term, leaves = dict(position_buckets=position, position_table=ptable), leaves + [ptable]
    out = sk.syntax_bias_attention(q, k, v, trees, table, buckets=buckets, bias_scale=c, window=window, causal=causal,
                                   backend="triton", **term)
    merged = out.reshape(out.shape[0], -1) if trees.is_packed else out.transpose(1, 2).reshape(grad.shape)
    grads = torch.autograd.grad(merged, x + leaves, grad)
    return dict(x=x, grad=grad, table=table, c=c, out=out, grads=grads)


@needs_triton
@pytest.mark.parametrize("name,rows,N,kernels,position", [
    ("sentences", [_chain(30), _chain(17), [-1, 0, 0, 1]], 30,
     ["_bias_fwd_short_kernel", "_bias_bwd_short_kernel", "_bias_bwd_short_table_kernel", "_bias_table_grad_kernel"],
     None),
    ("packed", [_chain(30), _chain(17), [-1, 0, 0, 1]], None,
     ["_varlen_fwd_kernel", "_varlen_dq_kernel", "_varlen_dkdv_kernel", "_varlen_table_kernel",
      "_bias_table_grad_kernel"], None),
    ("sentences-t5", [_chain(30), _chain(17), [-1, 0, 0, 1]], 30,
     ["_bias_fwd_short_kernel", "_bias_bwd_short_kernel", "_bias_bwd_short_table_kernel", "_bias_table_grad_kernel"],
     RelativePositionSpec(8, 20)),
    ("packed-t5", [_chain(30), _chain(17), [-1, 0, 0, 1]], None,
     ["_varlen_fwd_kernel", "_varlen_dq_kernel", "_varlen_dkdv_kernel", "_varlen_table_kernel",
      "_bias_table_grad_kernel"], RelativePositionSpec(8, 20)),
    ("tiled-t5", [_chain(70), _chain(41)], 70,
     ["_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel",
      "_bias_table_grad_kernel"], RelativePositionSpec(8, 20)),
])
def test_a_layer_launches_four_kernels_and_no_aten_kernel(monkeypatch, name, rows, N, kernels, position):
    """A layer on padded sentences (rows of at most 64 tokens) and on a packed batch: four kernels (five packed:
    its table gradient has a kernel of its own) forward and backward (the LUT written by the forward kernel, the
    table's gradients by the last), no aten kernel and no copy: the outputs and gradients are allocated in the
    projections' layout, so merging the heads back and the way into the projections copy nothing. With T5's term
    (padded one-tile and tiled kernels, packed) the same: its LUT written by the forward kernel too, its table's
    gradient made by the table-gradient kernel from the dK/dV kernel's boundary sums."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from syntaxkernels.tools.host import _COPIES, _NO_KERNEL

    trees = sk.TreeBatch.from_heads(rows, packed=True).to(DEVICE) if N is None else _batch(rows, N)
    _layer(trees, torch.bfloat16, position=position)  # (the first layer derives what the others reuse)
    aten = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in _NO_KERNEL:
                aten.append(func.__name__)
            return func(*args, **(kwargs or {}))

    launches = _record(monkeypatch)
    with Count():
        _layer(trees, torch.bfloat16, seed=1, position=position)
    # (the test's own inputs: randn, the casts to the device and dtype, the table, the strength)
    ours = [a for a in aten if a.split(".")[0] not in ("randn", "_to_copy", "full", "normal_", "detach")]
    assert [k.fn.__name__ for k, *_ in launches] == kernels
    assert ours == [], ours
    assert not [a for a in aten if a.split(".")[0] in _COPIES and a.split(".")[0] != "_to_copy"]


@needs_triton
def test_the_host_report_counts_no_device_kernel_for_the_dropout_seed():
    """``inspect --host --dropout``: the seed a layer draws from torch's CPU generator every call (``random_`` into
    an int64 scalar, then ``item``) is host work whatever the device, not a device kernel; any other ``random_`` or
    host read still counts."""
    from syntaxkernels.tools import host
    from syntaxkernels.tools.inspection import _kernels_on_cpu_tensors

    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1], [-1, 0, 0]])
    with _kernels_on_cpu_tensors():
        counted = host.count_device_kernels(host._layer(trees, 2, 16, torch.bfloat16, dropout=0.1))["aten"]
    assert not {"random_.from", "_local_scalar_dense.default"} & set(counted), counted

    def other():
        torch.zeros(3, dtype=torch.int64).random_(0, 5)
        torch.zeros(()).item()
    counted = host.count_device_kernels(other)["aten"]
    assert counted["random_.from"] == 1 and counted["_local_scalar_dense.default"] == 1, counted


# ----------------------------------------------------------------------------------------------------------
# CUDA graphs by construction: replay the recorded launches with another batch copied in
# ----------------------------------------------------------------------------------------------------------

def _replay_matches_eager(monkeypatch, make_a, make_b, **layer):
    a, b = make_a(), make_b()
    _layer(a, torch.bfloat16, **layer)  # a warm-up, as before a capture: the plan derives what it needs
    launches = _record(monkeypatch)
    captured = _layer(a, torch.bfloat16, **layer)
    P.set_launch_hook(None)
    eager = _layer(b, torch.bfloat16, table=captured["table"].detach().clone().requires_grad_(), seed=3, **layer)
    # Copy the other batch and the other inputs into the captured ones, then replay the launches as recorded.
    a.copy_(b)
    with torch.no_grad():
        for mine, theirs in zip(captured["x"], eager["x"]):
            mine.copy_(theirs)
        captured["grad"].copy_(eager["grad"])
    # (the output gradient reaches the kernels as the view the backward got: the same storage)
    for kernel, grid, args, kwargs in launches:
        kernel[grid](*args, **kwargs)
    assert torch.equal(captured["out"], eager["out"])
    for got, want in zip(captured["grads"], eager["grads"]):
        assert torch.equal(got, want)
    return launches


@needs_triton
def test_replay_with_another_batch_is_bit_identical_short_rows(monkeypatch):
    N = 40
    make_a = lambda: _batch([_chain(40), _chain(23), [-1, 0, 0, 1, 1]], N)  # noqa: E731
    make_b = lambda: _batch([[-1] + [0] * 39, _chain(7), _chain(31)], N)  # noqa: E731
    names = [k.fn.__name__ for k, *_ in _replay_matches_eager(monkeypatch, make_a, make_b)]
    assert "_bias_bwd_short_kernel" in names


@needs_triton
def test_replay_with_another_batch_is_bit_identical_tiled_with_a_window(monkeypatch):
    """The tiled kernels with a window: the live-tile lists and tile bucket sets are the plan's derived entries,
    copied from the other batch by ``copy_`` (a plan that derived them behind the caller's back would replay the
    first batch's)."""
    monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    N = 48
    make_a = lambda: _batch([_chain(48), _chain(20), [-1, 0, 0, 1, 1]], N)  # noqa: E731
    make_b = lambda: _batch([[-1] + [0] * 47, _chain(33), _chain(9)], N)  # noqa: E731
    names = [k.fn.__name__ for k, *_ in _replay_matches_eager(monkeypatch, make_a, make_b, window=2)]
    assert "_bias_bwd_table_kernel" in names and "_block_distance_range_kernel" not in names


@needs_triton
def test_replay_with_another_packed_batch_is_bit_identical(monkeypatch):
    make_a = lambda: sk.TreeBatch.from_heads([_chain(12), _chain(20), [-1, 0, 0]], packed=True).to(DEVICE)  # noqa
    make_b = lambda: sk.TreeBatch.from_heads([[-1] + [0] * 11, _chain(20), [-1, 0, 1]], packed=True).to(DEVICE)  # noqa
    _replay_matches_eager(monkeypatch, make_a, make_b)


# ----------------------------------------------------------------------------------------------------------
# The direct launch path (compiled for sm_90, not run: a subprocess without the interpreter)
# ----------------------------------------------------------------------------------------------------------

DIRECT_SCRIPT = r"""
import torch
from syntaxkernels import RelativePositionSpec
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops.bias_attention._backward import _bias_table_grad_kernel
from syntaxkernels.tools.inspection import fake_gpu

launched = []
P._DIRECT_LAUNCH_OVERRIDE = lambda compiled, g0, g1, g2, args: launched.append((compiled, g0, args))
def go(partials, outer, rows, inner, T=12):
    table, scale = torch.zeros(rows, T), torch.ones(1)
    d1, d2 = torch.empty(rows, T), torch.empty(1)
    P.launch(_bias_table_grad_kernel, (1,), partials, table, scale, d1, d2, outer, rows, inner, rows * inner * T,
             inner * T, T, T if rows > 1 else 0, T, NUM_BUCKETS=T, BUCKETS_PAD=16, BLOCK_P=32, WANT_TABLE=True,
             WANT_SCALE=True, num_warps=4, num_stages=1)
with fake_gpu(90):
    base = torch.zeros(1024)
    go(base[:600], 1, 1, 50)          # a first launch: compiled through the JIT (not counted by the override)
    go(base[:600], 1, 1, 50)          # the same specialisation: the direct path
    go(base[:600].clone(), 1, 1, 50)  # other tensors, same alignment and integers: the same compiled kernel
    go(base[1:601], 1, 1, 50)         # a partials pointer not 16-byte aligned: compiled again, not reused
    go(base[1:601], 1, 1, 50)
    go(base[:512], 1, 1, 32)          # other integers (32 is divisible by 16, 50 is not): compiled again
    go(base[:512], 1, 1, 32)
    keys = [k for k in P._COMPILED if k[0] is _bias_table_grad_kernel]
    assert len(keys) == 3, len(keys)
    kernels = [id(c) for c, _, _ in launched]
    assert len(launched) == 4 and kernels[0] == kernels[1] and len(set(kernels)) == 3, kernels
    # The launcher gets every parameter in signature order: the positional ones, then the constexprs.
    args = launched[0][2]
    assert len(args) == len(_bias_table_grad_kernel.signature.parameters), len(args)
    first = list(_bias_table_grad_kernel.signature.parameters).index("NUM_BUCKETS")
    assert args[first:first + 5] == (12, 16, 32, True, True), args[first:first + 5]
    # Tensors passed by name: keyed by dtype and alignment (not by the tensor), each launch with its own tensors.
    def by_name(dtable, dscale, T=12):
        P.launch(_bias_table_grad_kernel, (1,), base[:600], torch.zeros(1, T), torch.ones(1), DTABLE=dtable,
                 DSCALE=dscale, outer=1, rows=1, inner=50, stride_po=50 * T, stride_pr=50 * T, stride_pi=T,
                 stride_tr=0, stride_dr=T, NUM_BUCKETS=T, BUCKETS_PAD=16, BLOCK_P=32, WANT_TABLE=True,
                 WANT_SCALE=True, num_warps=4, num_stages=1)
    count = len(P._COMPILED)
    first, second = (torch.empty(1, 12), torch.empty(1)), (torch.empty(1, 12), torch.empty(1))
    by_name(*first)   # compiled (a new specialisation: the arguments by name)
    by_name(*second)  # other tensors by name, same dtypes and alignment: the same kernel, launched with these
    by_name(*first)
    assert len(P._COMPILED) == count + 1, len(P._COMPILED) - count
    entry = [v for k, v in P._COMPILED.items() if k[0] is _bias_table_grad_kernel][-1]
    assert all(x is None or not isinstance(x, torch.Tensor) for x in entry[1]), entry[1]  # none kept alive
    (_, _, a2), (_, _, a3) = launched[-2:]
    assert a2[3] is second[0] and a2[4] is second[1] and a3[3] is first[0] and a3[4] is first[1]
print("OK")
"""


@pytest.mark.slow  # compiles a kernel for sm_90 in a subprocess without the interpreter
def test_the_direct_launch_path_reuses_a_kernel_only_where_the_jit_would():
    """After its first launch, a specialisation goes straight to Triton's C launcher; the key holds every argument
    the JIT specialises on, so another alignment or another integer compiles again instead of reusing a kernel
    specialised for something else."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", DIRECT_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
