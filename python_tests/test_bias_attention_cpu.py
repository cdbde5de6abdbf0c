"""The fused C++ distance-bias attention (CPU) against the float64 reference: forward and every gradient (q, k, v,
table, bias scale) on odd sizes, ragged batches with empty items, rows without an allowed key, windows, causal,
shared and per-head tables, log buckets, fp32 / bf16 / fp16; bit-identical results run to run and for 1 and 2
threads; strided inputs; the torch.library ops; ``backend="auto"`` routing; bad inputs.
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops.bias_attention import _cpu as C
from syntaxkernels.ops.bias_attention import _host
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads
from syntaxkernels.tools.workloads import random_document

from conftest import HAS_EDGE_CPP

HAS_BIAS_CPP = HAS_EDGE_CPP and hasattr(sk._ext.load(), "bias_attention_forward")
# One torch thread (conftest's fixture: the shared 2-core machine); the thread-count test sets its own.
pytestmark = [pytest.mark.skipif(not HAS_BIAS_CPP, reason="C++ extension not built"),
              pytest.mark.usefixtures("one_thread")]


def make_case(B, H, N, D, dtype, **opts):
    """The shared case (:func:`syntaxkernels.tools.testing.bias_attention_case`: random trees, ``roots`` per item, or the
    given ``heads`` rows, ``isolated`` tokens; random q, k, v, table) with bias scale c = 0.9."""
    return bias_attention_case(B, H, N, D, dtype, bias_scale=0.9, **opts)


def run(case, dtype, kernel, grad_out, **kw):
    """Forward + backward of the C++ op (``kernel``) or the reference, inputs in ``dtype`` (table and bias scale
    in float32, or float64 for float64): (out, dict of the five gradients)."""
    fn = C.cpu_bias_attention if kernel else reference.syntax_bias_attention
    return bias_attention_grads(fn, case, dtype, grad_out, **kw)


def check_against_reference(case, dtype, **kw):
    """Forward and every gradient against the float64 reference (the rule of :mod:`syntaxkernels.tools.testing`, the
    bias-scale gradient by its own rule: one scalar summing every bucket's error, checked through the table
    gradient and ``c * dscale == sum(table * dtable)``), gradients in the reference's dtypes, none all zeros where
    the reference's is not, and query rows at or past the length and their gradients exactly zero."""
    B, H, N, _ = case["q"].shape
    grad_out = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(1))
    out, grads = run(case, dtype, True, grad_out, **kw)
    out64, grads64 = run(case, torch.float64, False, grad_out, **kw)
    outlp, gradslp = run(case, dtype, False, grad_out, **kw)
    assert out.dtype == dtype and out.shape == out64.shape
    assert_bias_attention_close(case, (out, grads), (out64, grads64), (outlp, gradslp), dtype)
    for name in grads:
        assert grads[name].dtype == gradslp[name].dtype
        if name != "dbias_scale" and grads64[name].abs().max() > 1e-3:
            assert grads[name].abs().max() > 0, f"{name} is all zeros"
    # Query rows at or past the length are exactly zero, and so are their gradients.
    for b, L in enumerate(case["lengths"].tolist()):
        assert torch.all(out[b, :, L:] == 0)
        assert torch.all(grads["dq"][b, :, L:] == 0)
        assert torch.all(grads["dk"][b, :, L:] == 0) and torch.all(grads["dv"][b, :, L:] == 0)
    return out, grads


# id, (B, H, N, D), dtype, case options, op options
CASES = [
    ("N1-fp32-D32", (2, 2, 1, 32), torch.float32, dict(), dict()),
    ("N17-fp32-D32-shared", (2, 2, 17, 32), torch.float32, dict(), dict()),
    ("N17-bf16-D128", (1, 2, 17, 128), torch.bfloat16, dict(), dict()),
    ("N100-bf16-D64-ragged-empty-perhead", (3, 2, 100, 64), torch.bfloat16, dict(lengths=[100, 0, 37], per_head=True),
     dict()),
    ("N129-fp32-D32-ragged-window2", (2, 2, 129, 32), torch.float32, dict(lengths=[129, 70]), dict(window=2)),
    ("N129-bf16-D64-causal", (2, 2, 129, 64), torch.bfloat16, dict(), dict(causal=True)),
    ("N100-fp16-D32-perhead-window1-causal", (2, 2, 100, 32), torch.float16, dict(per_head=True, lengths=[100, 61]),
     dict(window=1, causal=True)),
    ("N40-fp32-D48-Dv24", (2, 2, 40, 48), torch.float32, dict(Dv=24), dict()),
    ("N64-fp32-D32-logbuckets", (2, 2, 64, 32), torch.float32, dict(buckets=sk.BucketSpec(16, log_distance=4)), dict()),
    ("N64-fp32-D32-bigtable", (2, 2, 64, 32), torch.float32,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1), dict()),
    ("N50-fp32-D32-window0-forest", (2, 2, 50, 32), torch.float32, dict(roots=5), dict(window=0)),
    ("N70-fp32-D128-window1", (1, 2, 70, 128), torch.float32, dict(), dict(window=1)),
    ("N100-fp32-D16-no-allowed-key-rows", (2, 1, 100, 16), torch.float32,
     dict(isolated=[(0, 3), (0, 64), (1, 99)], lengths=[100, 100]), dict(window=3)),
    # More than one span of keys (256) and several query blocks (64): the online softmax across spans, live-tile
    # runs cut at a span, causal blocks past the diagonal.
    ("N300-fp32-D64-ragged-causal-perhead", (2, 2, 300, 64), torch.float32, dict(lengths=[300, 257], per_head=True),
     dict(causal=True)),
    ("N600-fp32-D32-packed-window4", (1, 2, 600, 32), torch.float32,
     dict(heads=[random_document(random.Random(3), [40] * 15)]), dict(window=4)),
    ("N520-bf16-D64-ragged", (2, 1, 520, 64), torch.bfloat16, dict(lengths=[520, 300]), dict()),
]


@pytest.mark.parametrize("shape,dtype,opts,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_and_gradients(shape, dtype, opts, kw):
    check_against_reference(make_case(*shape, dtype, **opts), dtype, **kw)


def test_rows_without_an_allowed_key_are_zero_and_finite():
    case = make_case(1, 2, 40, 16, torch.float32, isolated=[(0, 5), (0, 39)])
    grad_out = torch.randn(1, 2, 40, 16)
    out, grads = run(case, torch.float32, True, grad_out, window=2)
    assert torch.all(out[0, :, [5, 39]] == 0)
    assert torch.all(grads["dq"][0, :, [5, 39]] == 0)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_float_bias_scale_default_scale_and_no_table_gradient():
    case = make_case(2, 2, 33, 32, torch.float32, lengths=[33, 20])
    args = [case[n] for n in ("q", "k", "v", "distance", "table")]
    for c in (None, 0.5):
        out = C.cpu_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3, lengths=case["lengths"])
        ref = reference.syntax_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3,
                                              lengths=case["lengths"])
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    # Gradients for q only (the table needs none): the same dq as with the table gradient on.
    q = case["q"].clone().requires_grad_()
    (dq,) = torch.autograd.grad(C.cpu_bias_attention(q, *args[1:], buckets=case["buckets"]).sum(), q)
    q64 = case["q"].double().requires_grad_()
    (dq64,) = torch.autograd.grad(reference.syntax_bias_attention(
        q64, *[a.double() if a.is_floating_point() else a for a in args[1:]], buckets=case["buckets"]).sum(), q64)
    torch.testing.assert_close(dq.double(), dq64, atol=1e-5, rtol=1e-5)


def test_strided_inputs_and_output_gradient():
    """q, k, v as head-split views of a [B, N, 3, H, D] projection; the output gradient an expanded tensor."""
    case = make_case(2, 2, 45, 32, torch.float32, lengths=[45, 30])
    packed = torch.randn(2, 45, 3, 2, 32, dtype=torch.float64)

    def grads(x, kernel):
        x = x.clone().requires_grad_()
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
        fn = C.cpu_bias_attention if kernel else reference.syntax_bias_attention
        table = case["table"].to(x.dtype)
        out = fn(q, k, v, case["distance"], table, buckets=case["buckets"], lengths=case["lengths"], window=6)
        return out, torch.autograd.grad(out.sum(), x)[0]

    out, g = grads(packed.float(), True)
    assert not packed.float()[:, :, 0].transpose(1, 2).is_contiguous()
    out64, g64 = grads(packed, False)
    torch.testing.assert_close(out.double(), out64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=1e-5)


def _all_results(case, grad_out, **kw):
    out, grads = run(case, torch.float32, True, grad_out, **kw)
    return [out, *grads.values()]


def test_bit_identical_run_to_run_and_for_one_and_two_threads():
    """Same bits every run and with 1 or 2 threads (the table gradient's sums in a fixed order); the values are
    checked against the reference too, so a consistently wrong result fails."""
    case = make_case(3, 3, 200, 32, torch.float32, lengths=[200, 131, 77], per_head=True)
    grad_out = torch.randn(3, 3, 200, 32)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 1, 2):
            torch.set_num_threads(count)
            results.append(_all_results(case, grad_out, causal=True))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    check_against_reference(case, torch.float32, causal=True)


def test_auto_backend_routes_cpu_inputs_to_the_cpp_kernels(monkeypatch):
    case = make_case(2, 2, 20, 32, torch.float32, lengths=[20, 9])
    args = [case[n] for n in ("q", "k", "v", "distance", "table")]
    calls = []
    original = C._SyntaxBiasAttentionCPU.apply
    monkeypatch.setattr(C._SyntaxBiasAttentionCPU, "apply", lambda *a: calls.append(1) or original(*a))
    out = sk.syntax_bias_attention(*args, buckets=case["buckets"], lengths=case["lengths"])
    assert calls == [1]
    ref = sk.syntax_bias_attention(*args, buckets=case["buckets"], lengths=case["lengths"], backend="reference")
    assert calls == [1]  # "reference" stays the reference
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    # float64 runs the reference under "auto".
    out64 = sk.syntax_bias_attention(*[a.double() if a.is_floating_point() else a for a in args],
                                     buckets=case["buckets"], lengths=case["lengths"])
    assert calls == [1] and out64.dtype == torch.float64


def test_module_gets_the_cpp_kernels(monkeypatch):
    calls = []
    original = C._SyntaxBiasAttentionCPU.apply
    monkeypatch.setattr(C._SyntaxBiasAttentionCPU, "apply", lambda *a: calls.append(1) or original(*a))
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1], [1, -1, 1]])
    module = sk.nn.SyntaxBiasedSelfAttention(16, 4, per_head=True)
    ref = sk.nn.SyntaxBiasedSelfAttention(16, 4, per_head=True, backend="reference")
    ref.load_state_dict(module.state_dict())
    x = torch.randn(2, 5, 16)
    out = module(x, trees)
    assert calls
    torch.testing.assert_close(out, ref(x, trees), atol=2e-5, rtol=1e-5)
    out.square().sum().backward()
    assert module.distance_bias.grad is not None and module.distance_bias.grad.abs().max() > 0


@pytest.mark.parametrize("bad,match", [
    (dict(window=-1), "window"),
    (dict(window=True), "window"),
    (dict(bias_scale=torch.ones(2)), "bias_scale"),
    (dict(table=torch.zeros(5)), "table"),
    (dict(distance=torch.zeros(1, 8, 8, dtype=torch.int32)), "distance"),
    (dict(lengths=torch.tensor([9])), "lengths"),
    (dict(deterministic="yes"), "deterministic"),
], ids=["window-negative", "window-bool", "bias_scale-size", "table-shape", "distance-dtype", "lengths-range",
        "deterministic-type"])
def test_bad_inputs_raise_the_same_value_errors(bad, match):
    case = make_case(1, 1, 8, 32, torch.float32)
    kw = dict(q=case["q"], k=case["k"], v=case["v"], distance=case["distance"], table=case["table"],
              buckets=case["buckets"])
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        sk.syntax_bias_attention(**kw)


def test_kernel_rejects_inconsistent_tensors():
    case = make_case(1, 2, 8, 16, torch.float32)
    lut = _host.bias_lut(case["table"], case["bias_scale"], case["buckets"], -1)
    lengths = case["lengths"].to(torch.int32)
    with pytest.raises(RuntimeError, match="lut"):
        C.bias_attention_cpu_forward(case["q"], case["k"], case["v"], case["distance"], lut[:, :100], lengths, 0.25,
                                     -1, False)
    with pytest.raises(RuntimeError, match="lengths"):
        C.bias_attention_cpu_forward(case["q"], case["k"], case["v"], case["distance"], lut, case["lengths"], 0.25,
                                     -1, False)


def test_opcheck_forward_and_backward():
    case = make_case(2, 2, 20, 32, torch.float32, lengths=[20, 11], per_head=True)
    lut = _host.bias_lut(case["table"], case["bias_scale"], case["buckets"], 3)
    args = (case["q"], case["k"], case["v"], case["distance"], lut, case["lengths"].to(torch.int32), 0.2, 3, True)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.bias_attention_cpu_fwd(*args)
    assert lse.dtype == torch.float32 and torch.isinf(lse[1, :, 11:]).all()
    bwd = (torch.randn_like(out), *args[:3], lse, *args[3:6], case["buckets"].lut(), case["buckets"].num_buckets,
           0.2, 3, True, True)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_bwd, bwd, test_utils=utils)


def test_torch_compile_fullgraph():
    case = make_case(2, 2, 24, 32, torch.float32, lengths=[24, 13])
    table = case["table"].clone().requires_grad_()
    q = case["q"].clone().requires_grad_()

    def f(q, k, v, distance, table, lengths):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), lengths=lengths, window=4)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    out = compiled(q, case["k"], case["v"], case["distance"], table, case["lengths"])
    out.sum().backward()
    ref = reference.syntax_bias_attention(q.detach(), case["k"], case["v"], case["distance"], table.detach(),
                                          buckets=sk.BucketSpec(), lengths=case["lengths"], window=4)
    torch.testing.assert_close(out.detach(), ref, atol=2e-5, rtol=1e-5)
    assert table.grad is not None and table.grad.abs().max() > 0


def test_treebank_batch_matches_the_reference(ud_dev_path):
    """Real sentences packed into rows of N = 256 (forests), shared table: forward and every gradient."""
    from syntaxkernels.tools.workloads import pack_sentences, treebank_heads

    rows = pack_sentences(treebank_heads(ud_dev_path, limit=200), 256, rows=2)
    lengths = [len(r) for r in rows]
    case = make_case(2, 2, 256, 64, torch.float32, heads=rows, lengths=lengths)
    check_against_reference(case, torch.float32)


def test_cpu_bench_checks_each_size_before_timing_it(monkeypatch):
    """The CPU bench rows (``python -m syntaxkernels bench``) at a toy size: each size is checked against the fp64
    reference first, and a wrong kernel raises instead of giving a row."""
    from syntaxkernels.tools.checks import bias_attention_cpu as bench

    rows = bench.cpu_rows([(64, 2)], rounds=1, memory=False)
    assert len(rows) == 1 and rows[0]["fwd_bwd_vs_sdpa"] > 0 and rows[0]["reference_vs_cpp"] > 0
    assert rows[0]["checked"].startswith("out, dq")
    real = bench._cpp
    monkeypatch.setattr(bench, "_cpp", lambda *a, **kw: (lambda got: [got[0] * 1.1, *got[1:]])(real(*a, **kw)))
    with pytest.raises(RuntimeError, match="not timed"):
        bench.cpu_rows([(64, 2)], rounds=1, memory=False)
