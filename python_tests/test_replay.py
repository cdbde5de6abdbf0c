"""Launcher replay (``syntaxkernels.ops._replay``): a launcher's host work recorded on the first call of a shape class
and replayed on the next ones gives exactly what the launcher as written gives, on every kernel path (the
distance-bias op's and the edge-list op's).

Each case runs batch A (recorded) and then batch B (the same shape class, other trees and other values: replayed)
with replay on, and batch B again with replay off; outputs and every gradient must be bit-identical, and every
recorded program must have been replayed. Plus: what the key holds (alignment, aliasing, the GPU and tile state),
what is never replayed (host reads, traced calls), dropout seeds, and the launches a replay makes on a compiled GPU
kernel (sm_90, not run) against the ones the launcher makes as written.
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops import _replay
from syntaxkernels.ops.bias_attention import configs, lut_attention

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_triton

pytestmark = [needs_triton, pytest.mark.replay]


def _heads(lengths, seed):
    """Random trees of these lengths (a head per token, -1 the root)."""
    rng = random.Random(seed)
    return [[-1] + [rng.randrange(i) for i in range(1, n)] for n in lengths]


def _inputs(batch, H, D, seed, per_head=False, kv_heads=None, packed=False, buckets=None, position=None):
    gen = torch.Generator().manual_seed(seed)
    buckets = buckets or sk.BucketSpec()
    if packed:
        shape, kv_shape = (batch.num_tokens, H, D), (batch.num_tokens, kv_heads or H, D)
    else:
        B, N = batch.distance.shape[:2]
        shape, kv_shape = (B, H, N, D), (B, kv_heads or H, N, D)
    # q as the [B, N, H, D] view nn and transformers make (the kernels take strides; outputs follow the layout).
    q = torch.randn(shape, generator=gen) if packed else torch.randn(
        (shape[0], shape[2], shape[1], D), generator=gen).transpose(1, 2)
    tensors = dict(q=q, k=torch.randn(kv_shape, generator=gen), v=torch.randn(kv_shape, generator=gen),
                   table=torch.randn((H, buckets.num_buckets) if per_head else (buckets.num_buckets,), generator=gen),
                   bias_scale=torch.tensor([0.7]))
    if position is not None:
        tensors["position_table"] = torch.randn(H, position.num_buckets, generator=gen)
    grad = torch.randn(shape, generator=gen)
    return tensors, grad


def _run(batch, tensors, grad, **kw):
    leaves = {name: t.to(DEVICE).detach().requires_grad_() for name, t in tensors.items()}
    extra = {}
    if "position_table" in leaves:
        extra = dict(position_table=leaves["position_table"], scale=1.0)
    out = sk.syntax_bias_attention(leaves["q"], leaves["k"], leaves["v"], batch.to(DEVICE), leaves["table"],
                                   bias_scale=leaves["bias_scale"], backend="triton", **extra, **kw)
    grads = torch.autograd.grad(out, tuple(leaves.values()), grad.to(DEVICE))
    return (out,) + grads


CASES = {
    # name: (lengths, options); every batch B has the lengths of A and other trees.
    "short": ([5, 17, 30], {}),
    "short-causal": ([9, 23], dict(causal=True)),
    "short-per-head": ([12, 20], dict(per_head=True)),
    "short-gqa": ([11, 19], dict(kv_heads=1)),
    "short-t5": ([10, 21], dict(position=sk.RelativePositionSpec(8, 16))),
    "short-66-buckets": ([14, 33], dict(buckets=sk.BucketSpec(128, 62))),
    "two-block": ([70, 90], {}),
    "tiled": ([20, 37], dict(tiles=True)),
    "tiled-window": ([20, 37], dict(tiles=True, window=2)),
    "tiled-band-causal": ([20, 37], dict(tiles=True, position_window=5, causal=True)),
    "packed-stored-ds": ([5, 17, 30], dict(packed=True)),
    "packed-long": ([150], dict(packed=True)),
    "packed-gqa-causal": ([9, 26], dict(packed=True, kv_heads=1, causal=True)),
    "packed-t5": ([12, 20], dict(packed=True, position=sk.RelativePositionSpec(8, 16))),
    # Attention dropout: batch B's seed is another one of the same classes (neither 1 nor a multiple of 16, int32).
    "short-dropout": ([9, 30], dict(dropout_p=0.25, seeds=(12345, 54321))),
    "tiled-dropout-causal": ([20, 37], dict(tiles=True, causal=True, dropout_p=0.25, seeds=(12345, 54321))),
    "packed-dropout": ([9, 30], dict(packed=True, dropout_p=0.25, seeds=(12345, 54321))),
    "packed-dropout-large-seed": ([9, 30], dict(packed=True, dropout_p=0.1, seeds=(2 ** 63 + 7, 2 ** 63 + 99))),
}


@pytest.mark.long_on_cpu
@pytest.mark.parametrize("name", list(CASES))
def test_a_replayed_call_is_bit_identical_to_the_launcher_as_written(monkeypatch, name):
    lengths, options = CASES[name]
    options = dict(options)
    packed, tiles = options.pop("packed", False), options.pop("tiles", False)
    per_head, kv_heads = options.pop("per_head", False), options.pop("kv_heads", None)
    buckets, position = options.pop("buckets", None), options.pop("position", None)
    seeds = options.pop("seeds", (None, None))
    if tiles:  # the tiled kernels at small N (as the tests of those kernels run them)
        monkeypatch.setattr(configs, "_SHORT_ROWS", False)
        monkeypatch.setattr(configs, "_BLOCK_OVERRIDE", (16, 16))
    if position is not None:
        options.update(position_buckets=position)
    batches = [sk.TreeBatch.from_heads(_heads(lengths, seed), packed=packed) for seed in (1, 2)]
    assert not torch.equal(batches[0].distance, batches[1].distance)
    runs = [_inputs(batch, 2, 16, seed, per_head=per_head, kv_heads=kv_heads, packed=packed, buckets=buckets,
                    position=position) for seed, batch in zip((3, 4), batches)]
    kw = dict(buckets=buckets or sk.BucketSpec(), **options)
    seeded = [dict(kw, dropout_seed=seed) if seed is not None else kw for seed in seeds]
    _run(batches[0], *runs[0], **seeded[0])  # recorded
    replayed = _run(batches[1], *runs[1], **seeded[1])  # replayed
    programs = _replay.programs()
    assert len(programs) == 2 and all(p is not None and p.replays == 1 for p in programs.values()), programs
    _replay.set_enabled(False)
    written = _run(batches[1], *runs[1], **seeded[1])
    for got, want in zip(replayed, written):
        assert torch.equal(got, want)
        assert got.stride() == want.stride()


EDGE_CASES = {
    # name: (lists, options, schedule chunk or None)
    "relations": ("relations", {}, None),
    "relations-split-rows": ("relations", {}, 2),
    "window": ("window", {}, None),
    "relations-dropout": ("relations", dict(dropout_p=0.25, seeds=(12345, 54321)), None),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_list_attention_replays_bit_identical(monkeypatch, name):
    """The edge-list op's launchers (the sub-network op's relations, the GAT's window): a layer after the first on
    the same batch's lists (their schedule's sizes are the shape class) replays, bit-identical to as written."""
    from syntaxkernels.ops import edge_attention

    kind, options, chunk = EDGE_CASES[name]
    options = dict(options)
    seeds = options.pop("seeds", (None, None))
    if chunk is not None:
        monkeypatch.setattr(edge_attention, "SCHEDULE_CHUNK", chunk)
    batch = sk.TreeBatch.from_heads(_heads([9, 21, 30], 5)).to(DEVICE)
    lists = batch.relation_lists(sk.MaskSpec()) if kind == "relations" else batch.window_lists(2)

    def run(seed, dropout_seed):
        gen = torch.Generator().manual_seed(seed)
        B, N = batch.distance.shape[:2]
        q, k, v = (torch.randn(B, N, 2, 16, generator=gen).transpose(1, 2).to(DEVICE).requires_grad_()
                   for _ in range(3))
        out, nonempty = edge_attention.edge_list_attention(q, k, v, lists, backend="triton",
                                                           dropout_seed=dropout_seed, **options)
        grads = torch.autograd.grad(out, (q, k, v), torch.randn(out.shape, generator=gen).to(DEVICE))
        return (out, nonempty) + grads

    run(3, seeds[0])  # recorded
    replayed = run(4, seeds[1])
    programs = _replay.programs()
    assert len(programs) == 2 and all(p is not None and p.replays == 1 for p in programs.values()), programs
    _replay.set_enabled(False)
    written = run(4, seeds[1])
    for got, want in zip(replayed, written):
        assert torch.equal(got, want)
        assert got.stride() == want.stride()


def test_verify_checks_the_edge_list_replay_and_can_fail(monkeypatch):
    from syntaxkernels.tools.checks.subnetwork_attention import check_replay

    ok, detail = check_replay(DEVICE)
    assert ok and detail == "2 edge-list programs, each replayed once, bit-identical to as written", detail
    monkeypatch.setattr(_replay._Launch, "run", lambda self, registers, seed_bits=None: None)  # replays launch nothing
    ok, detail = check_replay(DEVICE)
    assert not ok and "differ FAIL" in detail, detail


@pytest.mark.parametrize("name", ["short", "tiled-window", "packed-stored-ds"])
def test_the_python_helpers_replay_as_the_extension_does(monkeypatch, name):
    """Without the C++ extension the key and the program's buffers and views come from the Python helpers
    (``_flatten``, ``_make_tensors``): a replayed call is bit-identical to the launcher as written there too."""
    monkeypatch.setattr(_replay, "_NATIVE", None)
    test_a_replayed_call_is_bit_identical_to_the_launcher_as_written(monkeypatch, name)
    assert all(p.tensors is None and p.specs for p in _replay.programs().values())


def test_recording_and_replaying_read_nothing_on_the_host():
    """Recording a shape class and replaying it read no tensor value on the host (a read would stall the stream
    and break CUDA-graph capture)."""
    from syntaxkernels.tools.testing import count_host_reads

    for packed in (False, True):
        batches = [sk.TreeBatch.from_heads(_heads([9, 21], seed), packed=packed) for seed in (1, 2)]
        with count_host_reads() as reads:
            for seed, batch in zip((3, 4), batches):
                _run(batch, *_inputs(batch, 2, 16, seed, packed=packed), buckets=sk.BucketSpec())
        assert reads == [], reads
        assert all(p is not None and p.replays >= 1 for p in _replay.programs().values())


def test_lut_attention_replays_padded_and_packed():
    for packed in (False, True):
        _replay.clear()
        results = []
        for seed in (1, 2):
            batch = sk.TreeBatch.from_heads(_heads([7, 19], seed), packed=packed).to(DEVICE)
            gen = torch.Generator().manual_seed(seed)
            shape = (batch.num_tokens, 2, 16) if packed else (2, 2, batch.distance.shape[1], 16)
            q, k, v = (torch.randn(shape, generator=gen).to(DEVICE).requires_grad_() for _ in range(3))
            lut = torch.randn(256, generator=gen).to(DEVICE)
            out = lut_attention(q, k, v, batch, lut)
            results.append((batch, q, k, v, lut, out, torch.autograd.grad(out.sum(), (q, k, v))))
        assert all(p is not None and p.replays == 1 for p in _replay.programs().values())
        batch, q, k, v, lut, out, grads = results[1]
        previous = _replay.set_enabled(False)
        want = lut_attention(q, k, v, batch, lut)
        want_grads = torch.autograd.grad(want.sum(), (q, k, v))
        _replay.set_enabled(previous)
        assert torch.equal(out, want) and all(torch.equal(a, b) for a, b in zip(grads, want_grads))


# ----------------------------------------------------------------------------------------------------------
# What the key holds, and what is never replayed
# ----------------------------------------------------------------------------------------------------------

needs_extension = pytest.mark.skipif(_replay._native() is None, reason="the C++ extension is not loaded")
HELPERS = [pytest.param(True, id="extension", marks=needs_extension), pytest.param(False, id="python")]


@pytest.mark.parametrize("native", HELPERS)
def test_the_key_holds_alignment_aliasing_values_and_state(monkeypatch, native):
    if not native:
        monkeypatch.setattr(_replay, "_NATIVE", None)
    calls = []

    @_replay.replayed()
    def launcher(x, y, n):
        calls.append(n)
        return x.new_empty(x.shape).copy_(x) + n

    base = torch.zeros(64)
    launcher(base[:16], base[16:32], 1)
    launcher(base[:16].clone(), base[16:32], 1)     # other tensors, same class: replayed
    assert len(calls) == 1
    launcher(base[1:17], base[16:32], 1)            # q not 16-byte aligned: recorded again
    same = base[:16]
    launcher(same, same, 1)                         # the two arguments one tensor: recorded again
    launcher(base[:16], base[16:32], 2)             # another value
    launcher(base[:8].view(2, 4), base[16:32], 1)   # another shape
    assert len(calls) == 5
    previous = P.interpret_as(80)                   # another GPU's configs
    try:
        launcher(base[:16], base[16:32], 1)
    finally:
        P.interpret_as(previous)
    assert len(calls) == 6
    x = torch.arange(16.0)
    assert torch.equal(launcher(x, base[16:32], 1), x + 1)  # replayed on new values


@pytest.mark.parametrize("native", HELPERS)
def test_the_key_walks_nested_arguments_and_refuses_tensor_subclasses(monkeypatch, native):
    if not native:
        monkeypatch.setattr(_replay, "_NATIVE", None)
    x, y = torch.zeros(2, 3), torch.zeros(3, 2).t()
    leaves, key = _replay._key("f", (x, (y, [x, None]), 2.5, "s", torch.float16), {"z": y})
    assert [id(t) for t in leaves] == [id(x), id(y), id(x), id(y)]
    assert key[0] == "f" and 2.5 in key and "s" in key and torch.float16 in key and "z" in key
    same = _replay._key("f", (torch.ones(2, 3), (torch.ones(3, 2).t(), [torch.ones(2, 3), None]), 2.5, "s",
                              torch.float16), {"z": torch.ones(3, 2).t()})[1]
    assert same != key  # (identity: the call above passed x and y twice each)
    x2, y2 = torch.ones(2, 3), torch.ones(3, 2).t()
    assert _replay._key("f", (x2, (y2, [x2, None]), 2.5, "s", torch.float16), {"z": y2})[1] == key
    for other in ((torch.zeros(2, 3), (y, [x, None])),                       # x's first use another tensor
                  (x, (y.contiguous(), [x, None])),                         # y's strides
                  (x, (y, (x, None))),                                      # a tuple for the list
                  (x.to(torch.float64), (y, [x, None]))):                   # a dtype
        assert _replay._key("f", other + (2.5, "s", torch.float16), {"z": y})[1] != key

    class Sub(torch.Tensor):
        pass

    assert _replay._key("f", (x, (y, [x.as_subclass(Sub)])), {}) == (None, None)


@pytest.mark.parametrize("native", HELPERS)
def test_a_program_makes_its_buffers_and_views_before_its_launches(monkeypatch, native):
    """The allocations and the views of arguments a launcher makes are made first, in one call of the extension
    (or by the Python helper), with the recorded geometry; a buffer whose one use is a view is made as that view."""
    if not native:
        monkeypatch.setattr(_replay, "_NATIVE", None)

    @_replay.replayed()
    def launcher(x, table):
        rows = table.view(1, -1)                                  # a view of an argument
        out = torch.empty((3, 4), dtype=torch.float16, device=x.device).t()  # covering view: empty_strided
        stats = torch.empty((2, 48), dtype=torch.float32, device=x.device)[:, 3:40]  # a partial view, offset 3
        scratch = torch.empty((0,), dtype=torch.float32, device=x.device)
        zeros = torch.zeros((2, 3), dtype=torch.float16, device=x.device)    # filled buffers
        rows_lse = torch.full((5,), float("inf"), dtype=torch.float32, device=x.device)
        counts = torch.full((2,), 3, dtype=torch.int32, device=x.device)   # an integer fill: an aten step
        out.copy_(x.t())
        return out, stats, scratch, rows * 2, zeros, rows_lse, counts

    args = (torch.randn(3, 4).to(torch.float16), torch.arange(6.0))
    written = launcher(*args)
    (program,) = _replay.programs().values()
    kinds = sorted(spec[0] for spec in program.specs)
    assert kinds == ["buffer", "buffer_view", "filled", "filled", "strided", "view"], program.specs
    # (x.t() comes after the integer fill, an aten op: views are hoisted up to the first one only)
    assert [step[0] if step[0] == "view" else str(step[1]) for step in program.steps] == [
        "aten.full.default", "view", "aten.copy_.default", "aten.mul.Tensor"], program.steps
    assert (program.tensors is not None) == native
    args = (torch.randn(3, 4).to(torch.float16), torch.arange(6.0) + 1)
    replayed = launcher(*args)
    assert program.replays == 1
    assert torch.equal(replayed[0], args[0].t()) and torch.equal(replayed[3], (args[1] * 2).view(1, -1))
    for got, want in zip(replayed[4:], written[4:]):
        assert torch.equal(got, want)  # (zeros, inf, 3)
    for got, want in zip(replayed, written):
        assert (got.shape, got.stride(), got.dtype, got.device) == (want.shape, want.stride(), want.dtype, want.device)
        assert got.untyped_storage().nbytes() == want.untyped_storage().nbytes()
        assert got.storage_offset() == want.storage_offset()


def test_a_constant_built_while_recording_is_a_constant_of_the_program():
    """A device constant (``_dispatch.device_constant``: built once per key and device) first built inside a
    recording is not part of the program: replays take the built value, as every later call does, instead of
    building it again (T5's bucket LUT was 17 aten ops a call this way)."""
    from syntaxkernels.ops._dispatch import device_constant

    key = ("a test's constant", object())

    @_replay.replayed()
    def launcher(x):
        return x + device_constant(key, x, lambda: torch.arange(4.0) * 2)

    assert torch.equal(launcher(torch.zeros(4)), torch.arange(4.0) * 2)
    (program,) = _replay.programs().values()
    assert [str(step[1]) for step in program.steps] == ["aten.add.Tensor"], program.steps
    assert torch.equal(launcher(torch.ones(4)), torch.arange(4.0) * 2 + 1) and program.replays == 1


def test_a_launcher_that_reads_a_value_on_the_host_is_not_replayed():
    calls = []

    @_replay.replayed()
    def launcher(x):
        calls.append(1)
        return x * int(x.sum().item())

    x = torch.ones(4)
    assert torch.equal(launcher(x), x * 4)
    assert torch.equal(launcher(torch.full((4,), 2.0)), torch.full((4,), 16.0))  # run as written again
    assert len(calls) == 2 and list(_replay.programs().values()) == [None]


def test_a_recording_takes_its_own_threads_launches_only():
    """The recorder is per thread: another thread's launch while a launcher is being recorded is not in its
    program (DataParallel replicas run their layers in threads)."""
    import threading

    import triton
    import triton.language as tl

    @triton.jit
    def fill(X, value, N: tl.constexpr):
        tl.store(X + tl.arange(0, N), tl.full((N,), value, tl.float32))

    inside, done = threading.Event(), threading.Event()

    @_replay.replayed()
    def launcher(x, wait):
        P.launch(fill, (1,), x, 1.0, N=16)
        if wait:
            inside.set()
            done.wait(30)
        return x

    def other():
        inside.wait(30)
        P.launch(fill, (1,), torch.zeros(16, device=DEVICE), 2.0, N=16)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    launcher(torch.zeros(16, device=DEVICE), True)
    thread.join()
    (program,) = _replay.programs().values()
    assert program is not None and program.launches == 1
    assert torch.equal(launcher(torch.zeros(16, device=DEVICE), True), torch.ones(16, device=DEVICE))


def test_a_dropout_seed_keys_by_its_classes_not_its_value():
    """Seeds of the same classes (Triton's: == 1, a multiple of 16, the integer type) share a program; another class
    records its own."""
    batch = sk.TreeBatch.from_heads(_heads([7, 19], 1)).to(DEVICE)
    (tensors, grad) = _inputs(batch, 2, 16, 0)
    for seed in (12345, 54321, 777, 4096):  # the last a multiple of 16
        _run(batch, tensors, grad, buckets=sk.BucketSpec(), dropout_p=0.25, dropout_seed=seed)
    programs = list(_replay.programs().values())
    assert len(programs) == 4 and sorted(p.replays for p in programs) == [0, 0, 2, 2], [p.replays for p in programs]


def test_an_unhashable_argument_runs_as_written():
    calls = []

    @_replay.replayed()
    def launcher(x, options):
        calls.append(1)
        return x + options["add"]

    for _ in range(2):
        assert torch.equal(launcher(torch.zeros(2), {"add": 1.0}), torch.ones(2))
    assert len(calls) == 2 and _replay.programs() == {}


def test_programs_are_bounded(monkeypatch):
    monkeypatch.setattr(_replay, "MAX_PROGRAMS", 3)

    @_replay.replayed()
    def launcher(x):
        return x + 1

    for n in range(1, 7):
        launcher(torch.zeros(n))
    assert len(_replay.programs()) == 3


def test_replay_off_runs_as_written():
    calls = []

    @_replay.replayed()
    def launcher(x):
        calls.append(1)
        return x + 1

    previous = _replay.set_enabled(False)
    try:
        launcher(torch.zeros(2))
        launcher(torch.zeros(2))
    finally:
        _replay.set_enabled(previous)
    assert len(calls) == 2 and _replay.programs() == {}


# ----------------------------------------------------------------------------------------------------------
# On compiled GPU kernels (sm_90, compiled and not run: a subprocess without the interpreter)
# ----------------------------------------------------------------------------------------------------------

COMPILED_SCRIPT = r"""
import torch
import syntaxkernels as sk
from syntaxkernels.ops import _primitives as P, _replay
from syntaxkernels.tools import host

def heads(lengths, seed):
    import random
    rng = random.Random(seed)
    return [[-1] + [rng.randrange(i) for i in range(1, n)] for n in lengths]

launched = []
def record(compiled, g0, g1, g2, args):
    launched.append((compiled, (g0, g1, g2), args))

def launches(batch, replay):
    _replay.set_enabled(replay)
    step = host._layer(batch, 2, 16, torch.bfloat16)
    launched.clear()
    step()
    return list(launched)

def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
    return a == b

with host._compiled_not_run(90):
    P._DIRECT_LAUNCH_OVERRIDE = record
    for packed in (False, True):
        a, b = (sk.TreeBatch.from_heads(heads([9, 30, 52], seed), packed=packed) for seed in (1, 2))
        launches(a, False)                  # every kernel compiled (the first launch of each)
        written = launches(b, False)
        _replay.clear()
        launches(a, True)                   # recorded
        launches(b, True)                   # replayed: the first replay finds each compiled kernel
        replayed = launches(b, True)        # straight to the compiled kernels
        assert all(p is not None and p.replays == 2 for p in _replay.programs().values()), _replay.programs()
        assert len(written) == len(replayed) >= 4, (len(written), len(replayed))
        for (c1, g1, a1), (c2, g2, a2) in zip(written, replayed):
            assert c1 is c2 and g1 == g2 and len(a1) == len(a2), (c1.name, c2.name, g1, g2)
            bad = [i for i, (x, y) in enumerate(zip(a1, a2)) if not same(x, y)]
            assert not bad, (c1.name, bad)

    # Dropout: the seed changes every call; the compiled entries do not grow with it, and each launch takes its seed.
    _replay.set_enabled(False)
    batch = sk.TreeBatch.from_heads(heads([9, 30], 3))
    layer = sk.nn.DistanceBias(2, backend="triton")
    x = torch.zeros(2, 30, 32, dtype=torch.bfloat16, requires_grad=True)
    def dropout_step():
        q = x.view(2, 30, 2, 16).transpose(1, 2)
        out = layer.attend(q, q, q, batch, dropout_p=0.25)
        torch.autograd.grad(out.sum(), (x,))
    dropout_step(); dropout_step()
    entries = len(P._COMPILED)
    seeds = set()
    for _ in range(6):
        launched.clear()
        dropout_step()
        seeds.add(tuple(a for _, _, args in launched for a in args if isinstance(a, int) and abs(a) >= 1 << 20))
    assert len(P._COMPILED) <= entries + 2, (entries, len(P._COMPILED))  # (at most the other classes of a seed)
    assert len(seeds) == 6, seeds
    # Replayed: each call's seed reaches its launches.
    _replay.set_enabled(True)
    _replay.clear()
    seeds = set()
    for _ in range(6):
        launched.clear()
        dropout_step()
        seeds.add(tuple(a for _, _, args in launched for a in args if isinstance(a, int) and abs(a) >= 1 << 20))
    assert len(seeds) == 6, seeds
    assert sum(p.replays for p in _replay.programs().values()) >= 4, _replay.programs()
print("OK")
"""


@pytest.mark.slow  # compiles the layer's kernels for sm_90 in a subprocess without the interpreter
def test_replayed_launches_equal_the_written_ones_on_compiled_kernels():
    """A replay launches the same compiled kernels with the same grids and arguments as the launcher as written
    (tensors: the same shapes, strides and dtypes), padded and packed; dropout seeds do not grow the compiled-entry
    cache and reach every launch, written and replayed."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILED_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-4000:]
