"""T5's relative-position term (``position_buckets``, ``position_table``) in the Triton kernels, padded and packed.

Against the reference in float64 and in the call's dtype (the tolerance rule of :mod:`syntaxkernels.tools.testing`),
forward and every gradient (q, k, v, the tree table, the bias scale, the position table): float32, bfloat16 and
float16, odd N (past the tiles and past the spec's reach), padding, an empty row, causal with a unidirectional spec,
a distance window, a positional window, grouped-query k and v, dropout; the tiled kernels run it past 64 tokens,
the one-tile short-row kernels on rows of at most 64 (queries-major and keys-major, with the position table's
gradient from the short table kernel); the position table's gradient without the tree table's; two runs (the second
in a shuffled program order under the interpreter) give the same bits; the torch.library ops with the term pass
opcheck and compile. Packed batches: the varlen kernels against the reference sequence by sequence (empty sequences, causal,
positional window with dropout). The C++ kernels: test_relative_position_cpu.py.
"""
import contextlib
import functools

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import RelativePositionSpec
from syntaxkernels.ops import _primitives as P
from syntaxkernels.tools.testing import bias_attention_case

from conftest import KERNEL_DEVICE as DEVICE, long_rows_tiles, nan_scratch, needs_triton, spy_launches
from test_relative_position_cpu import GRADS, _assert_close, _grad_out, _position_table


def _grads(backend, case, dtype, grad_out, spec, ptable, want=GRADS, **kw):
    """``(out, grads)`` of ``syntax_bias_attention`` with ``backend`` on ``case`` (on the kernel device for
    "triton"), the gradients ``want`` of :data:`GRADS` (those left out do not require one)."""
    device = DEVICE if backend == "triton" else "cpu"
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = dict(zip(GRADS, (case["q"].to(device, dtype), case["k"].to(device, dtype), case["v"].to(device, dtype),
                              case["table"].to(device, pdtype), case["bias_scale"].to(device, pdtype),
                              ptable.to(device, pdtype))))
    leaves = {n: t.detach().requires_grad_(n in want) for n, t in leaves.items()}
    out = sk.syntax_bias_attention(leaves["dq"], leaves["dk"], leaves["dv"], case["distance"].to(device),
                                   leaves["dtable"], buckets=case["buckets"], bias_scale=leaves["dbias_scale"],
                                   lengths=case["lengths"].to(device), position_buckets=spec,
                                   position_table=leaves["dposition"], backend=backend, **kw)
    grads = torch.autograd.grad(out, [leaves[n] for n in want], grad_out.to(device, dtype))
    return out.cpu(), {n: g.cpu() for n, g in zip(want, grads)}


# id, (H, N, lengths), options of bias_attention_case, spec, options of the call, dtype
CASES = [
    ("tiled-perhead-fp32", (3, 45, [45, 30]), dict(per_head=True), RelativePositionSpec(8, 16), {}, torch.float32),
    ("past-reach-fp32", (2, 130, [130, 71]), {}, RelativePositionSpec(8, 20), {}, torch.float32),
    # Rows of 65..128 tokens (bf16, a shared table): the two-block short-row kernels take no term, the tiled ones run
    ("two-block-rows-bf16", (2, 90, [90, 70]), {}, RelativePositionSpec(), {}, torch.bfloat16),
    ("causal-unidirectional-fp32", (2, 70, [70, 41]), {}, RelativePositionSpec(32, 128, False), dict(causal=True),
     torch.float32),
    ("window-empty-row-gqa-fp32", (4, 40, [40, 17]), dict(kv_heads=2, isolated=[(0, 3)]),
     RelativePositionSpec(8, 20), dict(window=2), torch.float32),
    ("position-window-fp16", (2, 70, [70, 50]), dict(per_head=True), RelativePositionSpec(8, 20),
     dict(position_window=5), torch.float16),
    ("dropout-mqa-fp32", (4, 50, [50, 23]), dict(kv_heads=1), RelativePositionSpec(8, 20),
     dict(dropout_p=0.2, dropout_seed=2 ** 40 + 7), torch.float32),
    # ... with dropout too: the tiles of configs.DROPOUT_CONFIGS' "position" entries (sm_90 at D <= 64)
    ("two-block-rows-dropout-bf16", (2, 90, [90, 70]), {}, RelativePositionSpec(), dict(dropout_p=0.2, dropout_seed=5),
     torch.bfloat16),
]


@needs_triton
@pytest.mark.parametrize("shape,case_opts,spec,kw,dtype", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_triton_relative_position_matches_the_reference(monkeypatch, shape, case_opts, spec, kw, dtype):
    H, N, lengths = shape
    names = spy_launches(monkeypatch, fresh_configs=True)
    case = bias_attention_case(2, H, N, 16, lengths=lengths, seed=N + H, bias_scale=0.8, **case_opts)
    ptable = _position_table(H, spec, seed=N)
    g = _grad_out(case)
    got = _grads("triton", case, dtype, g, spec, ptable, **kw)
    # The tiled kernels ran it (past 64 tokens, or a per-head tree table), the term in every one of them (no
    # short-row kernel, no reference)
    assert {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel"} <= set(names)
    assert not [n for n in names if "short" in n], names
    assert all(k.get("POSITION") for n, k in zip(names, names.kwargs) if n != "_bias_table_grad_kernel")
    ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
    _assert_close(case, got, ref64, _grads("reference", case, dtype, g, spec, ptable, **kw), dtype)
    plain = _grads("reference", case, torch.float64, g, spec, torch.zeros_like(ptable), **kw)
    assert (plain[0] - ref64[0]).abs().max() > 1e-3  # the term matters here
    if case_opts.get("isolated"):
        assert got[0][0, :, 3].abs().max() == 0 and got[1]["dq"][0, :, 3].abs().max() == 0  # the empty row


# id, (H, N, lengths), options of bias_attention_case, spec, options of the call, dtype, GPU family's arch (80: the
# keys-major short backward, 90: the queries-major one), whether the short-row kernels take it
SHORT_CASES = [
    ("short-rows-t5-bf16", (4, 20, [20, 13]), {}, RelativePositionSpec(), {}, torch.bfloat16, 90, True),
    ("short-rows-t5-bf16-keys-major", (4, 20, [20, 13]), {}, RelativePositionSpec(), {}, torch.bfloat16, 80, True),
    ("short-rows-fp16-sentence", (3, 57, [57, 30]), {}, RelativePositionSpec(8, 20), {}, torch.float16, 90, True),
    ("short-causal-unidirectional-fp16", (2, 50, [50, 31]), {}, RelativePositionSpec(32, 128, False),
     dict(causal=True), torch.float16, 80, True),
    ("short-gqa-empty-item-bf16", (4, 40, [40, 0]), dict(kv_heads=2), RelativePositionSpec(8, 20), {},
     torch.bfloat16, 90, True),
    ("short-window-empty-row-gqa-fp16", (4, 33, [33, 17]), dict(kv_heads=2, isolated=[(0, 3)]),
     RelativePositionSpec(8, 20), dict(window=2), torch.float16, 80, True),
    ("short-dropout-mqa-bf16", (4, 50, [50, 23]), dict(kv_heads=1), RelativePositionSpec(8, 20),
     dict(dropout_p=0.2, dropout_seed=2 ** 40 + 7), torch.bfloat16, 80, True),
    ("short-dropout-bf16", (2, 30, [30, 23]), {}, RelativePositionSpec(8, 20),
     dict(dropout_p=0.2, dropout_seed=11), torch.bfloat16, 90, True),
    # ... with the tiles of DROPOUT_CONFIGS' "position" entries: keys-major on sm_90, queries-major on the small
    # family and sm_120 (which are keys-major without them)
    ("short-dropout-bf16-small-family", (2, 30, [30, 23]), {}, RelativePositionSpec(8, 20),
     dict(dropout_p=0.2, dropout_seed=12), torch.bfloat16, 86, True),
    ("short-dropout-fp16-sm120", (3, 41, [41, 17]), {}, RelativePositionSpec(8, 20),
     dict(dropout_p=0.3, dropout_seed=13), torch.float16, 120, True),
    ("short-position-window-bf16", (2, 40, [40, 25]), {}, RelativePositionSpec(8, 20), dict(position_window=5),
     torch.bfloat16, 80, True),
    # A per-head tree table: the short-row kernels hold one bias tile for every head, so the tiled kernels run.
    ("short-rows-perhead-tree-fp16", (3, 40, [40, 21]), dict(per_head=True), RelativePositionSpec(8, 20), {},
     torch.float16, 90, False),
    ("short-rows-perhead-tree-bf16", (3, 40, [40, 21]), dict(per_head=True), RelativePositionSpec(8, 20), {},
     torch.bfloat16, 80, False),
]


@needs_triton
@pytest.mark.parametrize("shape,case_opts,spec,kw,dtype,arch,short", [c[1:] for c in SHORT_CASES],
                         ids=[c[0] for c in SHORT_CASES])
def test_triton_relative_position_on_short_rows(monkeypatch, shape, case_opts, spec, kw, dtype, arch, short):
    """Rows of at most 64 tokens with the term (fp16/bf16, a shared tree table): the one-tile short-row forward and
    backward (queries-major on sm_90's tiles, keys-major on sm_80's; with dropout as DROPOUT_CONFIGS says, with
    grouped-query k, v as POSITION_CONFIGS says: keys-major on sm_90) with
    POSITION, and the position table's gradient from the short table kernel (POSITION_GRAD): forward and every
    gradient against the reference; a per-head tree table takes the tiled kernels. Every buffer the launcher allocates comes filled with NaN: the
    table kernel reads back only the dS the backward stored (inside the lengths)."""
    H, N, lengths = shape
    nan_scratch(monkeypatch)
    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch) if P.interpreting() else None
    try:
        case = bias_attention_case(2, H, N, 16, lengths=lengths, seed=N + H, bias_scale=0.8, **case_opts)
        ptable = _position_table(H, spec, seed=N)
        g = _grad_out(case)
        got = _grads("triton", case, dtype, g, spec, ptable, **kw)
    finally:
        if previous is not None:
            P.interpret_as(previous)
    kernels = {n: k for n, k in zip(names, names.kwargs)}
    if not short:
        assert not [n for n in names if "short" in n], names
        assert {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel"} <= set(names)
    else:
        if P.interpreting():  # sm_80's tiles are keys-major, sm_90's too with the term and dropout or grouped k, v
            keys_major = arch == 80 or (arch == 90 and ("dropout_p" in kw or "kv_heads" in case_opts))
            backward = "_bias_bwd_short_t_kernel" if keys_major else "_bias_bwd_short_kernel"
        else:  # a real GPU takes its own family's kernel
            backward = next(n for n in names if n in ("_bias_bwd_short_kernel", "_bias_bwd_short_t_kernel"))
        assert {"_bias_fwd_short_kernel", backward, "_bias_bwd_short_table_kernel"} <= set(names), names
        assert not {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel"} & set(names), names
        assert kernels["_bias_fwd_short_kernel"].get("POSITION") and kernels[backward].get("POSITION")
        assert kernels["_bias_bwd_short_table_kernel"].get("POSITION_GRAD")
        assert bool(kernels[backward].get("DROPOUT")) == ("dropout_p" in kw)
    ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
    _assert_close(case, got, ref64, _grads("reference", case, dtype, g, spec, ptable, **kw), dtype)
    plain = _grads("reference", case, torch.float64, g, spec, torch.zeros_like(ptable), **kw)
    assert (plain[0] - ref64[0]).abs().max() > 1e-3  # the term matters here
    assert ref64[1]["dposition"].abs().max() > 1e-3
    for b, length in enumerate(lengths):  # rows past the length, and an empty item, are zeros
        assert got[0][b, :, length:].abs().sum() == 0 and got[1]["dq"][b, :, length:].abs().sum() == 0
    if case_opts.get("isolated"):
        assert got[0][0, :, 3].abs().max() == 0 and got[1]["dq"][0, :, 3].abs().max() == 0  # the empty row


@needs_triton
@pytest.mark.parametrize("with_term", [True, False], ids=["term", "no-term"])
def test_triton_short_rows_with_a_zero_scale(monkeypatch, with_term):
    """The short-row kernels divide by the score scale (the term in the forward's first product, the bucket sums of
    the backward's dS): a zero scale runs the tiled kernels instead, forward and backward, and every gradient (the
    tree table's and the position table's too) matches the reference."""
    from syntaxkernels.tools.testing import assert_close_to_reference

    spec = RelativePositionSpec(8, 20)
    case = bias_attention_case(2, 2, 24, 16, lengths=[24, 9], seed=8)
    ptable = _position_table(2, spec, seed=9)
    g = _grad_out(case)
    names = spy_launches(monkeypatch, fresh_configs=True)
    want = GRADS if with_term else GRADS[:5]
    kw = dict(want=want, scale=0.0)
    if with_term:
        got = _grads("triton", case, torch.bfloat16, g, spec, ptable, **kw)
        ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
        reflow = _grads("reference", case, torch.bfloat16, g, spec, ptable, **kw)
    else:  # the tree bias alone (no position arguments)
        from syntaxkernels.tools.testing import bias_attention_grads

        def run(backend, dtype):
            op = functools.partial(sk.syntax_bias_attention, backend=backend, scale=0.0)
            out, grads = bias_attention_grads(op, case, dtype, g, DEVICE if backend == "triton" else "cpu")
            return out.cpu(), {n: grads[m].cpu() for n, m in zip(want, ("dq", "dk", "dv", "dtable", "dbias_scale"))}
        got, ref64, reflow = run("triton", torch.bfloat16), run("reference", torch.float64), run(
            "reference", torch.bfloat16)
    assert not [n for n in names if "short" in n] and "_bias_fwd_kernel" in names, names
    assert_close_to_reference(got[0], ref64[0], reflow[0], "out")
    for name in want:
        assert torch.isfinite(got[1][name]).all(), name
        assert_close_to_reference(got[1][name], ref64[1][name], reflow[1][name], name)


@needs_triton
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("want", [("dq", "dposition"), ("dposition",), ("dk", "dv", "dtable")])
def test_triton_short_rows_position_gradient_alone_or_not_at_all(monkeypatch, want, arch):
    """Short rows: the position table's gradient without the tree table's (the short table kernel then compiles
    the bucket sums out), only it, or none of it (no dS is written for it): each against the reference."""
    from syntaxkernels.tools.testing import assert_close_to_reference

    spec = RelativePositionSpec(16, 40)
    case = bias_attention_case(2, 3, 45, 16, lengths=[45, 26], seed=3)
    ptable = _position_table(3, spec, seed=4)
    g = _grad_out(case)
    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch) if P.interpreting() else None
    try:
        got = _grads("triton", case, torch.bfloat16, g, spec, ptable, want=want)
    finally:
        if previous is not None:
            P.interpret_as(previous)
    ref = _grads("reference", case, torch.float64, g, spec, ptable, want=want)
    reflow = _grads("reference", case, torch.bfloat16, g, spec, ptable, want=want)
    assert "_bias_fwd_short_kernel" in names and "_bias_bwd_dkdv_kernel" not in names, names
    wanted_sums = "dtable" in want or "dposition" in want
    assert ("_bias_bwd_short_table_kernel" in names) == wanted_sums, names
    if wanted_sums:
        table = names.kwargs[names.index("_bias_bwd_short_table_kernel")]
        assert bool(table.get("POSITION_GRAD")) == ("dposition" in want)
        assert table.get("TREE_GRAD", True) == ("dtable" in want)
    for name in want:
        assert_close_to_reference(got[1][name], ref[1][name], reflow[1][name], name)


@needs_triton
@pytest.mark.parametrize("want", [("dq", "dposition"), ("dposition",), ("dk", "dv", "dtable")])
def test_triton_position_gradient_alone_or_not_at_all(monkeypatch, want):
    """The position table's gradient without the tree table's (no table kernel runs), only it, or none of it (the
    dK/dV kernel then compiles its sums out): each against the reference."""
    spec = RelativePositionSpec(16, 40, False)
    case = bias_attention_case(2, 3, 60, 16, lengths=[60, 33], seed=3, per_head=True)
    ptable = _position_table(3, spec, seed=4)
    g = _grad_out(case)
    names = spy_launches(monkeypatch)
    got = _grads("triton", case, torch.float32, g, spec, ptable, want=want, causal=True)
    ref = _grads("reference", case, torch.float64, g, spec, ptable, want=want, causal=True)
    assert ("_bias_bwd_table_kernel" in names) == ("dtable" in want)
    dkdv = names.kwargs[names.index("_bias_bwd_dkdv_kernel")]
    assert bool(dkdv.get("POSITION_GRAD")) == ("dposition" in want)
    for name in want:
        torch.testing.assert_close(got[1][name].double(), ref[1][name], atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize("N,dtype", [(90, torch.float32), (40, torch.bfloat16)], ids=["tiled-fp32", "short-bf16"])
def test_triton_relative_position_is_deterministic(N, dtype):
    """The position table's gradient is a fixed-order sum (per-program sums at the bucket boundaries, reduced
    over the batch and the key blocks, or over the batch on short rows): two runs, the second in a shuffled
    program order, give the same bits."""
    spec = RelativePositionSpec()
    case = bias_attention_case(2, 4, N, 16, lengths=[N, 47 * N // 90], seed=5, kv_heads=2)
    ptable = _position_table(4, spec, seed=6)
    g = _grad_out(case)
    first = _grads("triton", case, dtype, g, spec, ptable)
    from syntaxkernels.tools.checks import shuffled_program_order

    with shuffled_program_order(seed=3) if P.interpreting() else contextlib.nullcontext():
        second = _grads("triton", case, dtype, g, spec, ptable)
    assert torch.equal(first[0], second[0])
    for name in GRADS:
        assert torch.equal(first[1][name], second[1][name]), name


@needs_triton
def test_triton_ops_with_the_position_lut_pass_opcheck():
    """The torch.library Triton ops with T5's term (what torch.compile traces): schema, fake tensors and autograd
    registration; the forward writes the position LUT (the host's ``position_lut`` values, from the table and the
    spec's buckets: no aten gather a layer), which the backward takes; the backward's position-table gradient (its
    boundary sums times the boundaries-to-buckets matrix, in the table gradient's kernel) has its ``[H, P]`` shape
    and is the reference's."""
    from syntaxkernels.ops.bias_attention import _host, _launch
    from syntaxkernels.plan import structure_plan

    spec = RelativePositionSpec(8, 10)
    case = bias_attention_case(2, 2, 20, 32, lengths=[20, 11], seed=1)
    ptable = _position_table(2, spec, seed=2)
    q, k, v = (case[n].to(DEVICE) for n in ("q", "k", "v"))
    table, scale = case["table"].to(DEVICE).reshape(1, -1), case["bias_scale"].to(DEVICE)
    plan = structure_plan(case["distance"].to(DEVICE), case["lengths"].to(DEVICE), symmetric=True)
    bounds = _host.position_bounds(spec)[0].to(DEVICE)
    args = (q, k, v, plan.distance, table, scale, _host._bucket_lut(case["buckets"], q), plan.kernel_lengths, None,
            None, 0.25, -1, False, 0.0, 0, -1, ptable.to(DEVICE), spec.lut(DEVICE), spec.reach)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_fwd, args, test_utils=utils)
    out, lse, blut, lut = torch.ops.syntaxkernels.bias_attention_fwd(*args)
    assert torch.equal(lut.cpu(), _host.position_lut(spec, ptable))
    meta = _launch.backward_metadata(plan, _launch.launch_configs(20, 32, 32, q.dtype, 1, -1, case["buckets"], True),
                                     -1, False, case["buckets"], True)
    dout = torch.randn_like(out)
    bwd = (dout, q, k, v, out, lse, plan.distance, blut, plan.kernel_lengths, *meta, 0.25, -1, False,
           *_host.bucket_args(case["buckets"]), table, scale, True, True, 0.0, 0, -1, lut, spec.reach, bounds,
           _host.position_matrix_on(spec, q))
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_bwd, bwd, test_utils=utils)
    got = torch.ops.syntaxkernels.bias_attention_bwd(*bwd)[5]
    assert got.shape == (2, spec.num_buckets) and got.dtype == torch.float32
    pt = ptable.double().requires_grad_()
    ref = sk.syntax_bias_attention(q.cpu().double(), k.cpu().double(), v.cpu().double(), case["distance"],
                                   case["table"].double(), buckets=case["buckets"], bias_scale=case["bias_scale"],
                                   lengths=case["lengths"], scale=0.25, position_buckets=spec, position_table=pt,
                                   backend="reference")
    expected, = torch.autograd.grad(ref, pt, dout.cpu().double())
    torch.testing.assert_close(got.cpu().double(), expected, atol=2e-5, rtol=2e-5)


@needs_triton
def test_torch_compile_fullgraph_with_the_term():
    """``torch.compile(fullgraph=True)`` over a call with the term: the same output and gradients as eager."""
    spec = RelativePositionSpec(8, 12)
    case = bias_attention_case(2, 2, 24, 32, lengths=[24, 13], seed=2)
    ptable = _position_table(2, spec, seed=3)

    def f(q, k, v, distance, table, lengths, pt):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), lengths=lengths,
                                        position_buckets=spec, position_table=pt, backend="triton")

    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="inductor" if DEVICE == "cuda" else "eager")):
        q, table, pt = (x.to(DEVICE).requires_grad_() for x in (case["q"], case["table"], ptable))
        k, v, distance, lengths = (case[n].to(DEVICE) for n in ("k", "v", "distance", "lengths"))
        out = fn(q, k, v, distance, table, lengths, pt)
        out.sum().backward()
        results.append((out.detach(), q.grad, table.grad, pt.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert results[0][3].abs().max() > 0


# ---------------------------------------------------------------------------------------------------------
# Packed batches (the varlen Triton kernels)
# ---------------------------------------------------------------------------------------------------------

def _packed_grads(case, dtype, backend, spec, ptable, **kw):
    """``(out, grads)`` of a packed case (on the kernel device for "triton"; "spec": the reference sequence by
    sequence), grads of :data:`GRADS`."""
    from syntaxkernels.ops.bias_attention import _varlen

    device = DEVICE if backend == "triton" else "cpu"
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    packed = case["packed"].to(device)
    leaves = [case[n].to(device, dtype) for n in ("q", "k", "v")]
    leaves += [case["table"].to(device, pdtype), case["bias_scale"].to(device, pdtype), ptable.to(device, pdtype)]
    q, k, v, table, c, pt = leaves = [t.detach().requires_grad_() for t in leaves]
    args = dict(buckets=case["buckets"], bias_scale=c, position_buckets=spec, position_table=pt, **kw)
    if backend == "spec":
        out = _varlen.reference_bias_attention_varlen(q, k, v, packed.distance, table, cu_seqlens=packed.cu_seqlens,
                                                      **args)
    else:
        out = sk.syntax_bias_attention(q, k, v, packed.distance, table, cu_seqlens=packed.cu_seqlens,
                                       max_seqlen=packed.max_seqlen, backend=backend, **args)
    grads = torch.autograd.grad(out, leaves, case["grad_out"].to(device, dtype))
    return out.cpu(), {n: g.cpu() for n, g in zip(GRADS, grads)}


@needs_triton
@pytest.mark.parametrize("lengths,per_head,kw,dtype", [
    ([7, 0, 37, 1, 70], True, {}, torch.float32),
    ([50, 0, 23], False, dict(causal=True), torch.float32),
    ([40, 9, 33], False, dict(position_window=4, dropout_p=0.2, dropout_seed=3), torch.bfloat16),
], ids=["perhead-empty-fp32", "causal-shared-fp32", "window-dropout-bf16"])
def test_packed_triton_relative_position_matches_the_reference(monkeypatch, lengths, per_head, kw, dtype):
    """The packed Triton kernels with the term (positions within each sequence; empty sequences) against the
    reference sequence by sequence: forward and every gradient; the varlen kernels ran it with the term (and a
    per-head tree table takes the table kernel, not the dK/dV kernel's inline bucket sums)."""
    from syntaxkernels.ops.bias_attention import _varlen_kernels
    from test_packed import make_packed_case

    names = []
    real = _varlen_kernels.launch
    monkeypatch.setattr(_varlen_kernels, "launch", lambda fn, grid, *a, **k: names.append(
        (fn.fn.__name__, k.get("POSITION"), k.get("TABLE_GRAD"))) or real(fn, grid, *a, **k))
    spec = RelativePositionSpec(8, 20, bidirectional=not kw.get("causal", False))
    case = make_packed_case(lengths, 2, 16, per_head=per_head, seed=sum(lengths))
    ptable = _position_table(2, spec, seed=len(lengths))
    got = _packed_grads(case, dtype, "triton", spec, ptable, **kw)
    kernels = {n for n, position, _ in names if position}
    assert kernels == {"_varlen_fwd_kernel", "_varlen_dq_kernel", "_varlen_dkdv_kernel", "_varlen_table_kernel"}, names
    assert not any(n == "_varlen_dkdv_kernel" and table_grad for n, _, table_grad in names)
    ref64 = _packed_grads(case, torch.float64, "spec", spec, ptable, **kw)
    _assert_close(case, got, ref64, _packed_grads(case, dtype, "spec", spec, ptable, **kw), dtype)


@needs_triton
@pytest.mark.long_on_cpu
def test_the_dkdv_tiles_with_the_term_at_head_dim_128_on_sm80_and_sm120(monkeypatch):
    """With T5's term at D = 128, sm_80's and sm_120's tiled dK/dV kernel takes 32 keys a program
    (configs.POSITION_CONFIGS: 16x64 spilled 8 B there, compiled as launched on odd-77, odd-1000 and pairs), the
    small family keeps 64 (the long rows' tiles: the padded batches' rule off); the call with those tiles is exact
    against the reference (bf16, rows of 70 and 53)."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay
    from syntaxkernels.ops.bias_attention import _launch

    long_rows_tiles(monkeypatch)
    spec = RelativePositionSpec(8, 20)
    _replay.clear()  # (a program recorded by another test would skip the launchers)
    for arch, block_n in ((80, 32), (120, 32), (86, 64)):
        previous = P.interpret_as(arch)
        try:
            configs = _launch.launch_configs(70, 128, 128, torch.bfloat16, 1, -1, sk.BucketSpec(), position=True)
            assert (configs.dkdv["BLOCK_M"], configs.dkdv["BLOCK_N"]) == (16, block_n), (arch, configs.dkdv)
            if arch != 80:
                continue
            names = spy_launches(monkeypatch, fresh_configs=True)
            case = bias_attention_case(2, 2, 70, 128, lengths=[70, 53], seed=5, bias_scale=0.8)
            ptable = _position_table(2, spec, seed=6)
            g = _grad_out(case)
            got = _grads("triton", case, torch.bfloat16, g, spec, ptable)
            dkdv = [k for n, k in zip(names, names.kwargs) if n == "_bias_bwd_dkdv_kernel"]
            assert dkdv and all(k["BLOCK_N"] == 32 and k.get("POSITION") for k in dkdv), dkdv
        finally:
            P.interpret_as(previous)
        ref64 = _grads("reference", case, torch.float64, g, spec, ptable)
        _assert_close(case, got, ref64, _grads("reference", case, torch.bfloat16, g, spec, ptable), torch.bfloat16)


@needs_triton
@pytest.mark.long_on_cpu
def test_calls_with_the_term_and_grouped_query_or_causal_take_their_own_tiles(monkeypatch):
    """POSITION_CONFIGS entries keyed by "grouped_kv" or "causal" apply only to calls with the term and that variant
    (compiled as launched on odd-77, odd-1000 and sentences, the family's tiles spilled there): with grouped-query k, v
    the small family's dK/dV kernel at D = 64 takes 16 queries a block, sm_80's 16x64 on four warps and one stage,
    sm_90's at D = 128 16x64 on one stage while sm_100 keeps its 128 keys, sm_90's one-tile backward runs keys-major in
    chunks of 16; causal, sm_90's dK/dV at D = 64 takes 32 queries a block, sm_120's table kernel at D = 128 128x16,
    sm_100's forward and sm_120's dQ at D = 64 32 keys a block; with both, the small family's table kernel at D = 64
    64x32, 32x32 dK/dV tiles on sm_120 at D = 64 and on the small family and sm_90 at D = 128 (sm_100 keeping its
    16x128 on eight warps); with a positional window, the small family's dQ at D = 64 32 keys a block and its dK/dV
    at D = 128 32x32, sm_100's grouped dK/dV at D = 128 64 keys. Calls without the variant keep the term's plain
    tiles (the long rows' tiles: the padded batches' rule off). The grouped-query calls (sm_86
    tiled, sm_90 one-tile), the causal one (sm_90) and one with both (sm_120) on those tiles are exact against the
    reference (bf16, rows of 70 and 53, 40 and 23)."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay
    from syntaxkernels.ops.bias_attention import _launch

    long_rows_tiles(monkeypatch)

    def tiles(arch, D, kind, **kw):
        previous = P.interpret_as(arch)
        try:
            c = getattr(_launch.launch_configs(70, D, D, torch.bfloat16, 1, -1, sk.BucketSpec(), position=True, **kw),
                        kind)
        finally:
            P.interpret_as(previous)
        return c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]

    assert tiles(86, 64, "dkdv", grouped=True)[:2] == (16, 64) != tiles(86, 64, "dkdv")[:2]
    assert tiles(80, 64, "dkdv", grouped=True)[1:] == (64, 4, 1) != tiles(80, 64, "dkdv")[1:]
    assert tiles(90, 128, "dkdv", grouped=True)[1:2] + tiles(90, 128, "dkdv", grouped=True)[3:] == (64, 1)
    assert tiles(100, 128, "dkdv", grouped=True)[1] == 128
    assert tiles(86, 128, "table", grouped=True)[:2] == (128, 16) != tiles(86, 128, "table")[:2]
    assert tiles(90, 64, "dkdv", causal=True)[0] == 32 != tiles(90, 64, "dkdv")[0]
    assert tiles(120, 128, "table", causal=True)[:2] == (128, 16) != tiles(120, 128, "table")[:2]
    assert tiles(120, 128, "table", grouped=True, causal=True)[:2] == (128, 16)
    assert tiles(100, 64, "fwd", causal=True)[1] == 32 != tiles(100, 64, "fwd")[1]
    # both: grouped-query k, v in a causal call
    assert tiles(86, 64, "table", grouped=True, causal=True)[:2] == (64, 32) != tiles(86, 64, "table", grouped=True)[:2]
    assert tiles(120, 64, "dkdv", grouped=True, causal=True)[:2] == (32, 32) != tiles(120, 64, "dkdv", grouped=True)[:2]
    assert tiles(86, 128, "dkdv", grouped=True, causal=True)[:2] == (32, 32)
    assert tiles(90, 128, "dkdv", grouped=True, causal=True)[:3] == (32, 32, 4)
    assert tiles(100, 128, "dkdv", grouped=True, causal=True)[:3] == (16, 128, 8)
    # a positional window: the small family's dQ at D = 64 32 keys a block, its dK/dV at D = 128 32x32; with
    # grouped-query k, v too, sm_100's dK/dV at D = 128 64 keys a block
    assert tiles(86, 64, "dq", band=10)[1] == 32 != tiles(86, 64, "dq")[1]
    assert tiles(86, 128, "dkdv", band=10)[:2] == (32, 32) != tiles(86, 128, "dkdv")[:2]
    assert tiles(100, 128, "dkdv", grouped=True, band=10)[:2] == (16, 64) != tiles(100, 128, "dkdv", grouped=True)[:2]
    previous = P.interpret_as(90)
    try:  # the one-tile backward on rows of at most 64: sm_90 keys-major with grouped-query k, v
        short = _launch.launch_configs(40, 64, 64, torch.bfloat16, 1, -1, sk.BucketSpec(), position=True,
                                       grouped=True).short
        assert short.get("KEYS_MAJOR") and (short["CHUNK"], short["OUT_CHUNK"]) == (16, 16), short
        plain = _launch.launch_configs(40, 64, 64, torch.bfloat16, 1, -1, sk.BucketSpec(), position=True).short
        assert not plain.get("KEYS_MAJOR"), plain
    finally:
        P.interpret_as(previous)
    assert tiles(120, 64, "dq", causal=True)[1] == 32 != tiles(120, 64, "dq")[1]
    spec = RelativePositionSpec(8, 20)
    for arch, N, options, kw, kernel, tile in (
            (86, 70, dict(kv_heads=2), {}, "_bias_bwd_dkdv_kernel", dict(BLOCK_M=16, BLOCK_N=64)),
            (90, 70, {}, dict(causal=True), "_bias_bwd_dkdv_kernel", dict(BLOCK_M=32, BLOCK_N=128)),
            (90, 40, dict(kv_heads=2), {}, "_bias_bwd_short_t_kernel", dict(CHUNK=16, OUT_CHUNK=16)),
            (120, 70, dict(kv_heads=2), dict(causal=True), "_bias_bwd_dkdv_kernel", dict(BLOCK_M=32, BLOCK_N=32))):
        _replay.clear()  # (a program recorded by another test would skip the launchers)
        previous = P.interpret_as(arch)
        try:
            names = spy_launches(monkeypatch, fresh_configs=True)
            case = bias_attention_case(2, 4, N, 64, lengths=[N, N - 17], seed=5, bias_scale=0.8, **options)
            ptable = _position_table(4, spec, seed=6)
            g = _grad_out(case)
            got = _grads("triton", case, torch.bfloat16, g, spec, ptable, **kw)
            launched = [k for n, k in zip(names, names.kwargs) if n == kernel]
            assert launched and all({f: k[f] for f in tile} == tile and k.get("POSITION") for k in launched), (
                arch, kernel, launched)
        finally:
            P.interpret_as(previous)
        ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
        _assert_close(case, got, ref64, _grads("reference", case, torch.bfloat16, g, spec, ptable, **kw),
                      torch.bfloat16)


@needs_triton
@pytest.mark.long_on_cpu
@pytest.mark.parametrize("arch,kw,tile", [
    (86, dict(causal=True), dict(BLOCK_M=32, BLOCK_N=16)),
    (100, dict(position_window=5), dict(BLOCK_M=32, BLOCK_N=16))], ids=["sm86-causal", "sm100-window"])
def test_four_variants_in_one_call_take_their_own_tiles(monkeypatch, arch, kw, tile):
    """T5's term, grouped-query k, v and dropout with a causal mask (sm_86) or a positional window (sm_100) in one
    call at D = 128 run the dK/dV tiles of DROPOUT_CONFIGS' entries naming all of them (32x16: the tiles of the
    entries naming two spilled there), exact against the reference (bf16, rows of 70 and 53)."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay

    spec = RelativePositionSpec(8, 20)
    kw = dict(kw, dropout_p=0.2, dropout_seed=11)
    _replay.clear()  # (a program recorded by another test would skip the launchers)
    previous = P.interpret_as(arch)
    try:
        names = spy_launches(monkeypatch, fresh_configs=True)
        case = bias_attention_case(2, 4, 70, 128, lengths=[70, 53], seed=7, bias_scale=0.8, kv_heads=2)
        ptable = _position_table(4, spec, seed=8)
        g = _grad_out(case)
        got = _grads("triton", case, torch.bfloat16, g, spec, ptable, **kw)
        launched = [k for n, k in zip(names, names.kwargs) if n == "_bias_bwd_dkdv_kernel"]
        assert launched and all({f: k[f] for f in tile} == tile and k.get("POSITION") and k.get("DROPOUT")
                                for k in launched), launched
    finally:
        P.interpret_as(previous)
    ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
    _assert_close(case, got, ref64, _grads("reference", case, torch.bfloat16, g, spec, ptable, **kw), torch.bfloat16)


@needs_triton
@pytest.mark.long_on_cpu
@pytest.mark.parametrize("arch,D,kw,expected", [
    (86, 128, {}, ((32, 32, 2), (64, 32, 4), (32, 32, 4), (32, 16, 4))),
    (90, 128, dict(causal=True), ((64, 32, 4), (64, 32, 4), (16, 32, 4), (64, 16, 4))),
    (86, 64, dict(causal=True), ((64, 16, 4), (64, 32, 4), (32, 64, 4), (32, 32, 4))),
    (80, 64, dict(position_window=9), ((32, 32, 2), (64, 32, 4), (32, 64, 4), (64, 16, 4))),
    (86, 64, dict(window=2), ((64, 32, 4), (64, 32, 4), (32, 64, 4), (64, 16, 4)))],
    ids=["sm86-D128", "sm90-D128-causal", "sm86-D64-causal", "sm80-D64-position-window", "sm86-D64-window"])
def test_padded_batches_with_the_term_take_the_padded_tiles(monkeypatch, arch, D, kw, expected):
    """A padded batch's call with T5's term (70 tokens: the tiled forward and backward, the two-block kernels take no
    term) runs the padded tiles under the term's entries and their refinements (sm_86 at D = 128: the forward 32x32
    on two warps, dQ 64x32, dK/dV 32x32, the table kernel 32x16), a causal one (a T5 decoder's) under those naming
    causality too (sm_90 at D = 128: dK/dV 16x32, the table kernel 64x16 on four warps; sm_86 at D = 64: the forward
    64x16), one with a distance window or a positional one (the live-tile lists) under those naming either window
    too (the table kernel 64x16 on four warps; sm_80's forward with a positional window 32x32 on two warps), exact
    against the reference (bf16, rows of 70 and 21, one empty)."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay

    spec = RelativePositionSpec(8, 20, bidirectional=not kw.get("causal", False))
    _replay.clear()  # (a program recorded by another test would skip the launchers)
    previous = P.interpret_as(arch)
    try:
        names = spy_launches(monkeypatch, fresh_configs=True)
        case = bias_attention_case(3, 2, 70, D, lengths=[70, 21, 0], seed=5, bias_scale=0.8)
        ptable = _position_table(2, spec, seed=6)
        g = _grad_out(case)
        got = _grads("triton", case, torch.bfloat16, g, spec, ptable, **kw)
        kernels = ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel")
        tiles = {n: (k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for n, k in zip(names, names.kwargs) if n in kernels}
        assert tiles == dict(zip(kernels, expected)), tiles
    finally:
        P.interpret_as(previous)
    ref64 = _grads("reference", case, torch.float64, g, spec, ptable, **kw)
    _assert_close(case, got, ref64, _grads("reference", case, torch.bfloat16, g, spec, ptable, **kw), torch.bfloat16)
