"""T5's relative-position term (``position_buckets``, ``position_table``) in the fused C++ CPU kernels.

Padded batches (``backend="auto"`` on CPU tensors, the "cpp" path): against the reference in float64 and in the
kernel's dtype (the tolerance rule of :mod:`syntaxkernels.tools.testing`), forward and every gradient (q, k, v, the
tree table, the bias scale, the position table), float32 and bfloat16, odd N (1 up to 300: past the backward's
64-row blocks, the forward's 128-row blocks and the spec's reach), padding, causal with a unidirectional spec, a
distance window, a positional window, grouped-query k and v, dropout; the C++ kernels run it (no fallback); two runs
give the same bits. Packed batches (the "packed cpp" path): against the reference sequence by sequence, with an
empty sequence.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import RelativePositionSpec, reference
from syntaxkernels.ops.bias_attention import _cpu, _host, _varlen
from syntaxkernels.tools.testing import assert_bias_attention_close, assert_close_to_reference, bias_attention_case

from conftest import needs_cpp
from test_packed import make_packed_case

GRADS = ("dq", "dk", "dv", "dtable", "dbias_scale", "dposition")


def _auto(*args, **kw):
    return sk.syntax_bias_attention(*args, backend="auto", **kw)


def _position_table(H, spec, seed):
    return torch.randn(H, spec.num_buckets, generator=torch.Generator().manual_seed(seed))


def _grads(op, case, dtype, grad_out, spec, ptable, **kw):
    """``(out, grads)`` of ``op`` on a padded case, grads of :data:`GRADS` (``dposition`` the position table's)."""
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (case[n].to(dtype).detach().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(pdtype).detach().requires_grad_()
    c = case["bias_scale"].to(pdtype).detach().requires_grad_()
    pt = ptable.to(pdtype).detach().requires_grad_()
    out = op(q, k, v, case["distance"], table, buckets=case["buckets"], bias_scale=c, lengths=case["lengths"],
             position_buckets=spec, position_table=pt, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c, pt), grad_out.to(dtype))
    return out, dict(zip(GRADS, grads))


def _assert_close(case, got, ref64, reflow, dtype):
    """Every tensor within the rule; none all zeros where the reference's is not."""
    drop = lambda run: (run[0], {n: g for n, g in run[1].items() if n != "dposition"})  # noqa: E731
    assert got[0].dtype == dtype and got[0].shape == ref64[0].shape
    assert_bias_attention_close(case, drop(got), drop(ref64), drop(reflow), dtype)
    assert_close_to_reference(got[1]["dposition"], ref64[1]["dposition"], reflow[1]["dposition"], "dposition")
    for name in GRADS:
        assert got[1][name].shape == ref64[1][name].shape, name
        if ref64[1][name].abs().max() > 1e-3:
            assert got[1][name].abs().max() > 0, f"{name} is all zeros"


def _grad_out(case, seed=99):
    B, H, N, _ = case["q"].shape
    return torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(seed))


# id, (H, N, lengths), options of bias_attention_case, spec, options of the call, dtypes
CASES = [
    ("n1", (2, 1, [1, 1]), {}, RelativePositionSpec(8, 20), {}, "both"),
    ("n7", (2, 7, [7, 5]), {}, RelativePositionSpec(6, 7), {}, "both"),
    ("n37-perhead", (3, 37, [37, 22]), dict(per_head=True), RelativePositionSpec(8, 20), {}, "both"),
    ("n130-t5", (2, 130, [130, 71]), {}, RelativePositionSpec(), {}, "both"),
    ("n300-past-reach", (2, 300, [300, 141]), dict(per_head=True), RelativePositionSpec(16, 40), {}, "both"),
    ("causal-unidirectional", (2, 130, [130, 90]), {}, RelativePositionSpec(8, 30, False), dict(causal=True),
     "both"),
    ("window2-empty-row", (2, 37, [37, 22]), dict(isolated=[(0, 3), (1, 0)]), RelativePositionSpec(8, 20),
     dict(window=2), "fp32"),
    ("position-window5", (2, 130, [130, 77]), {}, RelativePositionSpec(8, 20), dict(position_window=5), "both"),
    ("gqa-4x2-causal", (4, 37, [37, 22]), dict(kv_heads=2), RelativePositionSpec(8, 20, False), dict(causal=True),
     "both"),
    ("dropout-gqa", (4, 203, [203, 131]), dict(kv_heads=1, per_head=True), RelativePositionSpec(8, 20),
     dict(dropout_p=0.2, dropout_seed=2 ** 40 + 7), "both"),
]

PARAMS = [pytest.param(*c[1:5], dtype, id=f"{c[0]}-{name}")
          for c in CASES for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
          if c[5] == "both" or name == c[5]]


@needs_cpp
@pytest.mark.parametrize("shape,case_opts,spec,kw,dtype", PARAMS)
def test_cpp_relative_position_matches_the_reference(monkeypatch, shape, case_opts, spec, kw, dtype):
    H, N, lengths = shape
    case = bias_attention_case(2, H, N, 16, lengths=lengths, seed=N + H, **case_opts)
    ptable = _position_table(H, spec, seed=N)
    g = _grad_out(case)
    calls = []
    real = _cpu.cpu_bias_attention
    monkeypatch.setattr(_cpu, "cpu_bias_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    got = _grads(_auto, case, dtype, g, spec, ptable, **kw)
    assert [c["position_buckets"] for c in calls] == [spec]  # the C++ kernels ran it, no fallback
    ref = reference.syntax_bias_attention
    ref64 = _grads(ref, case, torch.float64, g, spec, ptable, **kw)
    _assert_close(case, got, ref64, _grads(ref, case, dtype, g, spec, ptable, **kw), dtype)
    if N > 1:  # the term matters: a zero position table gives another output
        plain = _grads(ref, case, torch.float64, g, spec, torch.zeros_like(ptable), **kw)
        assert (plain[0] - ref64[0]).abs().max() > 1e-3
    if case_opts.get("isolated"):
        assert got[0][0, :, 3].abs().max() == 0 and got[1]["dq"][0, :, 3].abs().max() == 0  # the empty row


@needs_cpp
def test_cpp_relative_position_is_deterministic():
    spec = RelativePositionSpec(16, 40)
    case = bias_attention_case(3, 4, 300, 16, lengths=[300, 200, 131], seed=5, per_head=True, kv_heads=2)
    ptable = _position_table(4, spec, seed=6)
    g = _grad_out(case)
    kw = dict(dropout_p=0.1, dropout_seed=11)
    first = _grads(_auto, case, torch.float32, g, spec, ptable, **kw)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        second = _grads(_auto, case, torch.float32, g, spec, ptable, **kw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first[0], second[0])
    for name in GRADS:
        assert torch.equal(first[1][name], second[1][name]), name


@needs_cpp
def test_cpp_without_the_term_is_unchanged():
    """A zero position table adds exact zeros: the same bits as no term (out and the shared gradients)."""
    spec = RelativePositionSpec(8, 20)
    case = bias_attention_case(2, 2, 130, 16, lengths=[130, 60], seed=8)
    g = _grad_out(case)
    with_zero = _grads(_auto, case, torch.float32, g, spec, torch.zeros(2, spec.num_buckets))
    q, k, v = (case[n].detach().requires_grad_() for n in ("q", "k", "v"))
    out = _auto(q, k, v, case["distance"], case["table"], buckets=case["buckets"], bias_scale=case["bias_scale"],
                lengths=case["lengths"])
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert torch.equal(out, with_zero[0])
    for name, grad in zip(("dq", "dk", "dv"), grads):
        assert torch.equal(grad, with_zero[1][name]), name


@needs_cpp
def test_cpp_ops_check_the_position_lut():
    case = bias_attention_case(1, 2, 8, 16)
    lut = _host.bias_lut(case["table"], case["bias_scale"], case["buckets"], -1)
    with pytest.raises(RuntimeError, match="position_lut"):
        torch.ops.syntaxkernels.bias_attention_cpu_fwd(case["q"], case["k"], case["v"], case["distance"], lut,
                                                       case["lengths"].int(), 0.25, -1, False, 0, 0, 1.0, -1,
                                                       torch.zeros(2, 5), 3)


# ---------------------------------------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------------------------------------

def _packed_run(case, dtype, backend, spec, ptable, **kw):
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (case[n].to(dtype).detach().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(pdtype).detach().requires_grad_()
    c = case["bias_scale"].to(pdtype).detach().requires_grad_()
    pt = ptable.to(pdtype).detach().requires_grad_()
    packed = case["packed"]
    args = dict(buckets=case["buckets"], bias_scale=c, position_buckets=spec, position_table=pt, **kw)
    if backend == "spec":
        out = _varlen.reference_bias_attention_varlen(q, k, v, packed.distance, table, cu_seqlens=packed.cu_seqlens,
                                                      **args)
    else:
        out = sk.syntax_bias_attention(q, k, v, packed, table, backend=backend, **args)
    grads = torch.autograd.grad(out, (q, k, v, table, c, pt), case["grad_out"].to(dtype))
    return out, dict(zip(GRADS, grads))


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("lengths,kw", [([7, 0, 37, 1, 130], {}), ([50, 0, 23], dict(causal=True)),
                                        ([40, 9], dict(position_window=4, dropout_p=0.2, dropout_seed=3))],
                         ids=["plain-empty", "causal-empty", "window-dropout"])
def test_packed_cpp_relative_position_matches_the_reference(monkeypatch, dtype, lengths, kw):
    spec = RelativePositionSpec(8, 20, bidirectional=not kw.get("causal", False))
    case = make_packed_case(lengths, 2, 16, per_head=True, seed=sum(lengths))
    ptable = _position_table(2, spec, seed=len(lengths))
    calls = []
    real = _cpu.cpu_bias_attention
    monkeypatch.setattr(_cpu, "cpu_bias_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    got = _packed_run(case, dtype, "auto", spec, ptable, **kw)
    assert [c["position_buckets"] for c in calls] == [spec]  # the packed C++ path ran it
    _assert_close(case, got, _packed_run(case, torch.float64, "spec", spec, ptable, **kw),
                  _packed_run(case, dtype, "spec", spec, ptable, **kw), dtype)


@needs_cpp
def test_cpp_relative_position_under_torch_compile():
    """torch.compile (aot_eager, fullgraph: no graph break) of the op with the term on a TreeBatch: the output and
    every gradient (the position table's included) equal eager. (The C++ Function takes the RelativePositionSpec
    itself: building one from its numbers inside the traced region read its bucket table to the host.)"""
    spec = RelativePositionSpec(8, 20)
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0, 4, 5], [-1, 0, 0, 2]])
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 7, 8, generator=g).requires_grad_() for _ in range(3))
    table = torch.randn(2, sk.BucketSpec().num_buckets, generator=g).requires_grad_()
    ptable = _position_table(2, spec, seed=5).requires_grad_()

    def run(q, k, v, table, ptable):
        return sk.syntax_bias_attention(q, k, v, trees, table, buckets=sk.BucketSpec(), position_buckets=spec,
                                        position_table=ptable)

    torch._dynamo.reset()
    inputs = (q, k, v, table, ptable)
    want = run(*inputs)
    got = torch.compile(run, backend="aot_eager", fullgraph=True)(*inputs)
    torch.testing.assert_close(got, want)
    grad_out = torch.randn(want.shape, generator=g)
    for a, b in zip(torch.autograd.grad(got, inputs, grad_out), torch.autograd.grad(want, inputs, grad_out)):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()


def test_cpp_paths_take_the_term():
    assert {"cpp", "packed cpp"} <= set(_host.POSITION_PATHS)
    assert _host.position_route("cpp", RelativePositionSpec(), "auto") == "cpp"
    assert _host.position_route("cpp", RelativePositionSpec(), "auto", packed=True) == "cpp"


@needs_cpp
def test_opcheck_with_the_position_lut():
    """The custom ops with a position LUT: schema, fake implementations (the offset sums' shape), autograd
    registration; the offset sums are zeros unless asked for."""
    spec = RelativePositionSpec(8, 6)
    case = bias_attention_case(2, 2, 20, 16, lengths=[20, 11], per_head=True, seed=1)
    lut = _host.bias_lut(case["table"], case["bias_scale"], case["buckets"], 3)
    plut = _host.position_lut(spec, _position_table(2, spec, seed=2))
    args = (case["q"], case["k"], case["v"], case["distance"], lut, case["lengths"].to(torch.int32), 0.2, 3, True,
            0, 0, 1.0, -1, plut, spec.reach)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.bias_attention_cpu_fwd(*args)
    bwd = (torch.randn_like(out), *args[:3], lse, *args[3:6], case["buckets"].lut(), case["buckets"].num_buckets,
           0.2, 3, True, True, 0, 0, 1.0, -1, plut, spec.reach)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_bwd, bwd + (True,), test_utils=utils)
    sums = torch.ops.syntaxkernels.bias_attention_cpu_bwd(*bwd, True)[4]
    assert sums.shape == (2, 2 * spec.reach + 1) and sums.abs().max() > 0
    assert torch.ops.syntaxkernels.bias_attention_cpu_bwd(*bwd, False)[4].abs().max() == 0
