"""Attention dropout in the fused C++ CPU kernels of the distance-bias op against the reference.

The C++ path (``backend="auto"`` on CPU tensors) with ``dropout_p`` and ``dropout_seed`` against
``backend="reference"`` with the same ones: forward and every gradient (q, k, v, table, a tensor bias scale) in
float32 and bfloat16 (the tolerance rule of :mod:`syntaxkernels.tools.testing`, as in test_bias_attention_cpu.py),
odd N, padding, rows without an allowed key, causal, windows, per-head tables, several spans of keys; packed
batches; the kernel's mask read back exactly (uniform probabilities and one-hot values) against
:func:`syntaxkernels.reference.dropout_keep`, with its statistics; p = 0, seeds, thread counts, the ops' schemas.
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.ops.bias_attention import _cpu as C
from syntaxkernels.ops.bias_attention import _host
from syntaxkernels.ops._dispatch import dropout_arguments
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads
from syntaxkernels.tools.workloads import random_forest
from syntaxkernels.trees import PackedTreeBatch

from conftest import HAS_EDGE_CPP

HAS_BIAS_CPP = HAS_EDGE_CPP and hasattr(sk._ext.load(), "bias_attention_forward")
pytestmark = [pytest.mark.skipif(not HAS_BIAS_CPP, reason="C++ extension not built"),
              pytest.mark.usefixtures("one_thread")]


def make_case(B, H, N, D, dtype, **opts):
    return bias_attention_case(B, H, N, D, dtype, bias_scale=0.9, **opts)


def auto_op(*args, **kw):
    """The public op under backend="auto" (the C++ kernels for these CPU tensors)."""
    return sk.syntax_bias_attention(*args, backend="auto", **kw)


def reference_op(*args, **kw):
    return sk.syntax_bias_attention(*args, backend="reference", **kw)


def check_against_reference(case, dtype, **kw):
    """Forward and the five gradients of the C++ path against the reference (float64 and ``dtype``) with the same
    dropout arguments in ``kw``; padding rows and their gradients exactly zero. Returns (out, grads)."""
    B, H, N, _ = case["q"].shape
    assert ba.implementation(case["q"].to(dtype), case["v"].to(dtype), "auto") == "cpp"
    grad_out = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(1))
    out, grads = bias_attention_grads(auto_op, case, dtype, grad_out, **kw)
    out64, grads64 = bias_attention_grads(reference_op, case, torch.float64, grad_out, **kw)
    outlp, gradslp = bias_attention_grads(reference_op, case, dtype, grad_out, **kw)
    assert out.dtype == dtype and out.shape == out64.shape
    assert_bias_attention_close(case, (out, grads), (out64, grads64), (outlp, gradslp), dtype)
    for name in grads:
        if name != "dbias_scale" and grads64[name].abs().max() > 1e-3:
            assert grads[name].abs().max() > 0, f"{name} is all zeros"
    for b, L in enumerate(case["lengths"].tolist()):
        assert torch.all(out[b, :, L:] == 0)
        for name in ("dq", "dk", "dv"):
            assert torch.all(grads[name][b, :, L:] == 0)
    return out, grads


# id, (B, H, N, D), dtype, case options, op options (dropout_p, dropout_seed included)
CASES = [
    ("N1-fp32", (2, 2, 1, 32), torch.float32, dict(), dict(dropout_p=0.3, dropout_seed=5)),
    ("N7-fp32-shared", (2, 3, 7, 16), torch.float32, dict(), dict(dropout_p=0.5, dropout_seed=11)),
    ("N33-fp32-ragged-perhead", (3, 2, 33, 32), torch.float32, dict(lengths=[33, 0, 18], per_head=True),
     dict(dropout_p=0.2, dropout_seed=2 ** 40 + 7)),
    ("N70-fp32-window1-no-allowed-key", (2, 2, 70, 32), torch.float32,
     dict(isolated=[(0, 3), (0, 69), (1, 66)], lengths=[70, 67]), dict(window=1, dropout_p=0.25, dropout_seed=3)),
    ("N70-bf16-causal", (2, 2, 70, 64), torch.bfloat16, dict(lengths=[70, 45]),
     dict(causal=True, dropout_p=0.1, dropout_seed=2 ** 64 - 1)),
    ("N33-bf16-perhead-window2", (2, 2, 33, 32), torch.bfloat16, dict(per_head=True),
     dict(window=2, dropout_p=0.4, dropout_seed=2 ** 63 + 12345)),
    # Several query blocks (128 forward, 64 backward) and key spans (512 forward, 256 backward), N not a multiple
    # of 4 or of a block.
    ("N301-fp32-ragged-causal-perhead", (2, 1, 301, 32), torch.float32, dict(lengths=[301, 258], per_head=True),
     dict(causal=True, dropout_p=0.15, dropout_seed=99)),
    ("N523-fp32-window3", (1, 1, 523, 16), torch.float32, dict(lengths=[523]),
     dict(window=3, dropout_p=0.3, dropout_seed=2024)),
]


@pytest.mark.parametrize("shape,dtype,opts,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_and_gradients_with_dropout(shape, dtype, opts, kw):
    check_against_reference(make_case(*shape, dtype, **opts), dtype, **kw)


def test_rows_without_an_allowed_key_stay_zero_with_dropout():
    case = make_case(1, 2, 40, 16, torch.float32, isolated=[(0, 5), (0, 39)])
    grad_out = torch.randn(1, 2, 40, 16)
    out, grads = bias_attention_grads(auto_op, case, torch.float32, grad_out, window=2, dropout_p=0.5,
                                      dropout_seed=8)
    assert torch.all(out[0, :, [5, 39]] == 0)
    assert torch.all(grads["dq"][0, :, [5, 39]] == 0)
    assert all(torch.isfinite(g).all() for g in grads.values())


def one_hot_case(B, H, N, lengths=None):
    """q = k = 0, a zero table and v[b, h, j] = e_j: every allowed row's probabilities are uniform, 1 / L, so the
    dropped output is out[b, h, i, j] = keep_bhij / ((1 - p) L), the kernel's mask itself."""
    case = make_case(B, H, N, 4, torch.float32, lengths=lengths)
    case["q"] = torch.zeros(B, H, N, 4)
    case["k"] = torch.zeros(B, H, N, 4)
    case["v"] = torch.eye(N).expand(B, H, N, N).contiguous()
    case["table"] = torch.zeros_like(case["table"])
    return case


def kernel_mask(case, p, seed):
    """The C++ forward's keep mask, bool [B, H, N, N], read from the one-hot case's output (rows at or past the
    length, and keys past it, False)."""
    args = [case[n] for n in ("q", "k", "v", "distance", "table")]
    out = C.cpu_bias_attention(*args, buckets=case["buckets"], lengths=case["lengths"], dropout_p=p,
                               dropout_seed=seed)
    L = case["lengths"].double()[:, None, None, None].clamp(min=1)
    scaled = out.double() * (1.0 - p) * L
    mask = scaled > 0.5
    # Kept entries are exactly 1 up to fp32 rounding, dropped ones exactly 0.
    assert torch.all((scaled - 1.0).abs()[mask] < 1e-4) and torch.all(scaled[~mask] == 0)
    return mask


@pytest.mark.parametrize("seed", [0, 7, 2 ** 32 + 3, 2 ** 63 + 5, 2 ** 64 - 12345])
def test_the_kernel_draws_the_references_mask_exactly(seed):
    B, H, N = 2, 3, 37
    lengths = [37, 21]
    case = one_hot_case(B, H, N, lengths)
    p = 0.35
    mask = kernel_mask(case, p, seed)
    keep = reference.dropout_keep(seed, p, B, H, N, N)
    valid = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]  # [B, N]
    pairs = (valid[:, None, :, None] & valid[:, None, None, :]).expand(B, H, N, N)
    assert torch.equal(mask, keep & pairs)


def test_mask_statistics():
    """About 40k pairs: the fraction kept is 1 - p within 0.02, for two p; the words' lanes all take part."""
    B, H, N = 1, 4, 100
    case = one_hot_case(B, H, N)
    for p in (0.1, 0.5):
        mask = kernel_mask(case, p, seed=1234)
        assert abs(mask.double().mean().item() - (1.0 - p)) < 0.02
        for lane in range(4):  # keys j with j % 4 == lane read word `lane` of their group
            assert abs(mask[..., lane::4].double().mean().item() - (1.0 - p)) < 0.04


def test_p_zero_is_no_dropout_and_seeds_matter():
    case = make_case(2, 2, 45, 32, torch.float32, lengths=[45, 30])
    grad_out = torch.randn(2, 2, 45, 32, generator=torch.Generator().manual_seed(3))
    base, gbase = bias_attention_grads(auto_op, case, torch.float32, grad_out)
    zero, gzero = bias_attention_grads(auto_op, case, torch.float32, grad_out, dropout_p=0.0, dropout_seed=77)
    assert torch.equal(base, zero) and all(torch.equal(gbase[n], gzero[n]) for n in gbase)
    a, ga = bias_attention_grads(auto_op, case, torch.float32, grad_out, dropout_p=0.3, dropout_seed=1)
    a2, ga2 = bias_attention_grads(auto_op, case, torch.float32, grad_out, dropout_p=0.3, dropout_seed=1)
    b, gb = bias_attention_grads(auto_op, case, torch.float32, grad_out, dropout_p=0.3, dropout_seed=2)
    high, _ = bias_attention_grads(auto_op, case, torch.float32, grad_out, dropout_p=0.3, dropout_seed=1 + 2 ** 32)
    assert torch.equal(a, a2) and all(torch.equal(ga[n], ga2[n]) for n in ga)
    assert not torch.allclose(a, base, atol=1e-3) and not torch.allclose(a, b, atol=1e-3)
    assert not torch.allclose(a, high, atol=1e-3)  # the seed's high word is part of the key
    assert not torch.allclose(ga["dq"], gb["dq"], atol=1e-3)


def test_dropout_results_do_not_depend_on_the_thread_count():
    case = make_case(2, 2, 130, 32, torch.float32, lengths=[130, 77], per_head=True)
    grad_out = torch.randn(2, 2, 130, 32, generator=torch.Generator().manual_seed(4))
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(bias_attention_grads(auto_op, case, torch.float32, grad_out, window=4, dropout_p=0.2,
                                                dropout_seed=31))
    finally:
        torch.set_num_threads(previous)
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2) and all(torch.equal(g1[n], g2[n]) for n in g1)


@pytest.mark.parametrize("dtype,kw", [(torch.float32, dict()), (torch.float32, dict(causal=True, window=2)),
                                      (torch.bfloat16, dict(per_head=True))],
                         ids=["fp32", "fp32-causal-window2", "bf16-perhead"])
def test_packed_batches_with_dropout(dtype, kw):
    """A packed batch on CPU tensors (the C++ kernels on the sequences laid out [S, H, max n, D]: item = sequence)
    against the reference sequence by sequence, forward and every gradient."""
    kw = dict(kw)
    per_head = kw.pop("per_head", False)
    lengths = [6, 0, 11, 1, 23, 5]
    rng = random.Random(5)
    rows = [random_forest(rng, n, num_trees=2) if n else [] for n in lengths]
    packed = PackedTreeBatch.from_heads(rows)
    T, H, D = sum(lengths), 2, 16
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(T, H, D, generator=gen) for _ in range(3))
    buckets = sk.BucketSpec()
    table = torch.randn((H, buckets.num_buckets) if per_head else (buckets.num_buckets,), generator=gen)
    c = torch.tensor([0.9])
    grad_out = torch.randn(T, H, D, generator=gen)

    def run(backend, dt):
        pdt = torch.float64 if dt == torch.float64 else torch.float32
        leaves = [x.to(dt) for x in (q, k, v)] + [table.to(pdt), c.to(pdt)]
        leaves = [x.detach().clone().requires_grad_() for x in leaves]
        out = sk.syntax_bias_attention(*leaves[:3], packed, leaves[3], buckets=buckets, bias_scale=leaves[4],
                                       backend=backend, dropout_p=0.3, dropout_seed=2 ** 50 + 9, **kw)
        return out, dict(zip(("dq", "dk", "dv", "dtable", "dbias_scale"),
                             torch.autograd.grad(out, leaves, grad_out.to(dt))))

    calls = []
    original = C.cpu_bias_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "cpu_bias_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
        got = run("auto", dtype)
    assert calls == [1]
    ref64, reflp = run("reference", torch.float64), run("reference", dtype)
    case = dict(table=table, bias_scale=c, dtype=dtype)
    assert_bias_attention_close(case, got, ref64, reflp, dtype)
    # Packed dropout differs from no dropout (the mask reaches the packed path).
    plain = sk.syntax_bias_attention(q.to(dtype), k.to(dtype), v.to(dtype), packed, table, buckets=buckets,
                                     bias_scale=c, backend="auto", **kw)
    assert not torch.allclose(got[0].float(), plain.float(), atol=1e-2)


def test_opcheck_with_dropout_arguments():
    case = make_case(2, 2, 20, 32, torch.float32, lengths=[20, 11], per_head=True)
    lut = _host.bias_lut(case["table"], case["bias_scale"], case["buckets"], 3)
    drop = dropout_arguments(0.25, 2 ** 64 - 3)
    assert drop[0] == -3 and drop[1] == reference.dropout_threshold(0.25) and drop[2] == pytest.approx(4 / 3)
    args = (case["q"], case["k"], case["v"], case["distance"], lut, case["lengths"].to(torch.int32), 0.2, 3, True,
            *drop)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.bias_attention_cpu_fwd(*args)
    bwd = (torch.randn_like(out), *args[:3], lse, *args[3:6], case["buckets"].lut(), case["buckets"].num_buckets,
           0.2, 3, True, True, *drop)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_cpu_bwd, bwd, test_utils=utils)
