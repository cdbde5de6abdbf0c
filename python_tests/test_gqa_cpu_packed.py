"""Grouped-query attention (k, v with ``H_kv`` heads, ``H % H_kv == 0``) on the C++ CPU kernels and the packed
(varlen) Triton kernels of the distance-bias op.

Each against the reference (:func:`syntaxkernels.reference.syntax_bias_attention`, whose
:func:`~syntaxkernels.reference.expand_kv_heads` is the head mapping: query head h reads key/value head
``h // (H / H_kv)``) in float64 and in the kernel's dtype (the tolerance rule of :mod:`syntaxkernels.tools.testing`),
forward and every gradient (q, k, v, a shared or per-head table, a tensor bias scale): odd N, padding, an empty row
(an isolated token under a window), causal, window, dropout with a seed (the mask numbered by the query head),
bfloat16 and float32, ``H_kv = H`` unchanged. Also: a grouped call equals the call on k, v repeated per query head
(forward and dQ bit for bit; dK, dV their group sums), the C++ gradients are the same bits for any thread count,
and a packed batch equals its padded form. The Triton kernels run on ``DEVICE`` (CUDA, or the CPU under
TRITON_INTERPRET=1: small shapes).
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.ops.bias_attention import _cpu, _varlen
from syntaxkernels.ops.bias_attention import _host
from syntaxkernels.tools.testing import bias_attention_case, bias_attention_grads
from syntaxkernels.trees import pack_padded

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_cpp, needs_triton
from test_packed import assert_matches_reference, make_packed_case

GROUPS = [(4, 1), (4, 2), (6, 3)]



# ---------------------------------------------------------------------------------------------------------
# The C++ kernels, padded batches
# ---------------------------------------------------------------------------------------------------------

# id, options of the call, options of bias_attention_case
CPP_CASES = [
    ("shared", {}, {}),
    ("perhead-causal", dict(causal=True), dict(per_head=True)),
    # an isolated token: its row (and column) unreachable, so under a window it has no allowed key
    ("window2-empty-row", dict(window=2), dict(isolated=[(0, 3), (1, 0)])),
    ("dropout-perhead", dict(dropout_p=0.3, dropout_seed=2 ** 40 + 7), dict(per_head=True)),
    ("dropout-causal-window1", dict(dropout_p=0.2, dropout_seed=11, causal=True, window=1), {}),
]


def _cpp_case(H, H_kv, case_opts, seed=0, N=37, lengths=(37, 22)):
    return bias_attention_case(2, H, N, 16, lengths=list(lengths), seed=seed, kv_heads=H_kv, **case_opts)


def _grad_out(case):
    B, H, N, _ = case["q"].shape
    return torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(99))


def _cpp(*args, **kw):
    return _cpu.cpu_bias_attention(*args, **kw)


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("H,H_kv", GROUPS + [(3, 3)])
@pytest.mark.parametrize("kw,case_opts", [c[1:] for c in CPP_CASES], ids=[c[0] for c in CPP_CASES])
def test_cpp_grouped_matches_the_reference(H, H_kv, kw, case_opts, dtype):
    case = _cpp_case(H, H_kv, case_opts, seed=H * 10 + H_kv)
    g = _grad_out(case)
    out, grads = bias_attention_grads(_cpp, case, dtype, g, **kw)
    assert grads["dk"].shape == case["k"].shape and grads["dv"].shape == case["v"].shape
    assert_matches_reference(case, (out, grads), bias_attention_grads(reference.syntax_bias_attention, case,
                                                                      torch.float64, g, **kw),
                             bias_attention_grads(reference.syntax_bias_attention, case, dtype, g, **kw), dtype)
    if "window" in kw and case_opts.get("isolated"):
        assert out[0, :, 3].abs().max() == 0 and grads["dq"][0, :, 3].abs().max() == 0  # the empty row


@needs_cpp
def test_auto_runs_the_cpp_kernels_on_grouped_inputs():
    """``backend="auto"`` on grouped CPU inputs runs the C++ kernels (the same bits as calling them)."""
    case = _cpp_case(4, 2, {}, seed=5)
    g = _grad_out(case)
    assert ba.implementation(case["q"], case["v"]) == "cpp"
    out, grads = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, g, window=3)
    direct, direct_grads = bias_attention_grads(_cpp, case, torch.float32, g, window=3)
    assert torch.equal(out, direct)
    for name in grads:
        assert torch.equal(grads[name], direct_grads[name]), name


@needs_cpp
@pytest.mark.parametrize("H,H_kv", GROUPS)
@pytest.mark.parametrize("kw", [{}, dict(dropout_p=0.4, dropout_seed=123, causal=True)], ids=["plain", "dropout"])
def test_cpp_grouped_equals_the_repeated_heads(H, H_kv, kw):
    """The grouped call equals the call on k, v repeated per query head: the output and dQ bit for bit (each
    query head reads the same key/value data, and with dropout draws its own query head's mask), dK and dV the
    sums of the repeated call's over each group; the table gradients alike."""
    case = _cpp_case(H, H_kv, dict(per_head=True), seed=H + H_kv)
    G = H // H_kv
    g = _grad_out(case)
    out, grads = bias_attention_grads(_cpp, case, torch.float32, g, **kw)
    expanded = dict(case, k=case["k"].repeat_interleave(G, 1), v=case["v"].repeat_interleave(G, 1))
    out_x, grads_x = bias_attention_grads(_cpp, expanded, torch.float32, g, **kw)
    assert torch.equal(out, out_x)
    assert torch.equal(grads["dq"], grads_x["dq"])
    B, _, N, D = case["k"].shape
    for name in ("dk", "dv"):
        torch.testing.assert_close(grads[name], grads_x[name].view(B, H_kv, G, N, D).sum(2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads["dtable"], grads_x["dtable"], rtol=1e-5, atol=1e-5)


@needs_cpp
def test_cpp_grouped_gradients_are_the_same_bits_for_any_thread_count():
    case = _cpp_case(6, 2, dict(per_head=True), seed=8, N=150, lengths=(150, 97))
    g = _grad_out(case)
    previous = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            runs.append(bias_attention_grads(_cpp, case, torch.float32, g, dropout_p=0.1, dropout_seed=3))
    finally:
        torch.set_num_threads(previous)
    for out, grads in runs[1:]:
        assert torch.equal(out, runs[0][0])
        for name in grads:
            assert torch.equal(grads[name], runs[0][1][name]), name


# ---------------------------------------------------------------------------------------------------------
# Packed batches: the C++ path (auto on CPU) and the Triton kernels
# ---------------------------------------------------------------------------------------------------------


def _packed_case(lengths, H, H_kv, D, seed=0, isolated=(), **opts):
    """make_packed_case with k, v of ``H_kv`` heads: the first H_kv heads of its k, v, a strided view (the kernels
    read heads in place), and the plan's packed distance, with the tokens of ``isolated`` (packed indices)
    unreachable from every other token and from themselves (an empty row under a window)."""
    case = make_packed_case(lengths, H, D, seed=seed, **opts)
    case["k"], case["v"] = case["k"][:, :H_kv], case["v"][:, :H_kv]
    packed = case["packed"]
    distance = packed.distance.clone()
    cu = packed.cu_seqlens.tolist()
    for t in isolated:
        s = int(packed.sequence[t])
        n, i = cu[s + 1] - cu[s], t - cu[s]
        block = distance[int(packed.distance_offsets[s]):int(packed.distance_offsets[s]) + n * n].view(n, n)
        block[i, :] = 255
        block[:, i] = 255
    case["distance"] = distance
    return case


def _run(case, dtype, backend, **kw):
    """``(out, grads)`` of a packed call: ``backend`` "spec" (the reference sequence by sequence), "auto" on CPU
    tensors (the C++ path) or "triton" (on DEVICE)."""
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    device = "cpu" if backend in ("spec", "auto") else DEVICE
    q, k, v = (case[n].to(device, dtype).detach().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(device, pdtype).detach().requires_grad_()
    c = case["bias_scale"].to(device, pdtype).detach().requires_grad_()
    distance, cu = case["distance"].to(device), case["packed"].cu_seqlens.to(device)
    if backend == "spec":
        out = _varlen.reference_bias_attention_varlen(q, k, v, distance, table, buckets=case["buckets"],
                                                      cu_seqlens=cu, bias_scale=c, **kw)
    else:
        out = sk.syntax_bias_attention(q, k, v, distance, table, buckets=case["buckets"], bias_scale=c,
                                       cu_seqlens=cu, backend=backend, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), case["grad_out"].to(device, dtype))
    return out, dict(zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads))


def _check(case, dtype, backend, **kw):
    out, grads = _run(case, dtype, backend, **kw)
    assert grads["dk"].shape == case["k"].shape and grads["dv"].shape == case["v"].shape
    assert_matches_reference(case, (out, grads), _run(case, torch.float64, "spec", **kw),
                             _run(case, dtype, "spec", **kw), dtype)
    return out, grads


# id, lengths, H, H_kv, D, dtype, make_packed_case options (+ isolated, tiles), call options
PACKED_CASES = [
    ("shared-4x1-fp32", [5, 0, 17, 1, 9], 4, 1, 16, torch.float32, {}, {}),
    ("perhead-4x2-window2-empty-row", [12, 7, 1, 19], 4, 2, 16, torch.float32,
     dict(per_head=True, isolated=[3, 20]), dict(window=2)),
    ("shared-6x3-causal-bf16", [9, 14, 3], 6, 3, 32, torch.bfloat16, {}, dict(causal=True)),
    ("perhead-4x2-dropout-small-tiles", [3, 7, 1, 0, 12, 2, 11], 4, 2, 16, torch.float32,
     dict(per_head=True, tiles=(16, 16)), dict(dropout_p=0.3, dropout_seed=2 ** 40 + 3)),
    # (in bfloat16 this shared-table case's dtable misses the rule's bound, 1.4e-2 against 1.2e-2, on the C++ and
    # the Triton kernels alike and just as much with k, v repeated to H heads: not the grouping's doing)
    ("shared-6x3-dropout-window1-fp32", [6, 13, 1, 9], 6, 3, 16, torch.float32, {},
     dict(dropout_p=0.25, dropout_seed=77, window=1)),
    ("perhead-2x2-unchanged", [8, 15], 2, 2, 16, torch.float32, dict(per_head=True), dict(causal=True)),
]


PACKED_PARAMS = [pytest.param(*c[1:], id=c[0]) for c in PACKED_CASES]


@needs_cpp
@pytest.mark.parametrize("lengths,H,H_kv,D,dtype,opts,kw", PACKED_PARAMS)
def test_packed_cpp_grouped_matches_the_reference(lengths, H, H_kv, D, dtype, opts, kw):
    opts = {k: v for k, v in opts.items() if k != "tiles"}
    case = _packed_case(lengths, H, H_kv, D, seed=len(lengths), **opts)
    assert _host.implementation(case["q"], case["v"]) == "cpp"
    _check(case, dtype, "auto", **kw)


@needs_triton
@pytest.mark.parametrize("lengths,H,H_kv,D,dtype,opts,kw", PACKED_PARAMS)
def test_packed_triton_grouped_matches_the_reference(monkeypatch, lengths, H, H_kv, D, dtype, opts, kw):
    from syntaxkernels.ops.bias_attention import _varlen_kernels as bv

    opts = dict(opts)
    tiles = opts.pop("tiles", None)
    if tiles is not None:
        monkeypatch.setattr(bv, "_BLOCK_OVERRIDE", tiles)
    case = _packed_case(lengths, H, H_kv, D, seed=len(lengths), **opts)
    _check(case, dtype, "triton", **kw)


def _padded_form(case, x):
    """``[T, h, *]`` -> ``[S, h, N, *]``: the packed tokens laid out per sequence (zeros past each length)."""
    packed = case["packed"]
    lengths = packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]
    S, N = lengths.shape[0], int(lengths.max())
    y = torch.zeros(S, N, *x.shape[1:], dtype=x.dtype)
    y[torch.arange(N)[None, :] < lengths[:, None]] = x
    return y.transpose(1, 2), lengths


def _padded_distance(case):
    packed = case["packed"]
    cu, offsets = packed.cu_seqlens.tolist(), packed.distance_offsets.tolist()
    N = max(b - a for a, b in zip(cu, cu[1:]))
    distance = torch.full((len(cu) - 1, N, N), 255, dtype=torch.uint8)
    for s in range(len(cu) - 1):
        n = cu[s + 1] - cu[s]
        distance[s, :n, :n] = case["distance"][offsets[s]:offsets[s] + n * n].view(n, n)
    return distance


@pytest.mark.parametrize("backend", [pytest.param("auto", marks=needs_cpp, id="cpp"),
                                     pytest.param("triton", marks=needs_triton, id="triton")])
def test_packed_grouped_equals_its_padded_form(backend):
    """A packed grouped batch (an empty sequence and a dropout mask included) gives the padded batch of the same
    sequences' output and gradients (sequence s = item s), the padded one by the C++ kernels."""
    case = _packed_case([11, 0, 5, 18], 4, 2, 16, seed=42, per_head=True)
    assert_packed_equals_padded_form(case, backend, dropout_p=0.35, dropout_seed=31337, window=3)


def assert_packed_equals_padded_form(case, backend, **kw):
    """The packed call of ``case`` (:func:`_packed_case`) on ``backend`` gives the output and gradients of the C++
    kernels on the padded batch of the same sequences (item s = sequence s), with the call options ``kw``."""
    out_p, grads_p = _run(case, torch.float32, backend, **kw)
    distance = _padded_distance(case)
    padded = {}
    for name in ("q", "k", "v", "grad_out"):
        padded[name], lengths = _padded_form(case, case[name])
    padded_case = dict(case, distance=distance, lengths=lengths, q=padded["q"], k=padded["k"], v=padded["v"])
    out, grads = bias_attention_grads(_cpp, padded_case, torch.float32, padded["grad_out"], **kw)
    tol = dict(rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(out_p.cpu(), pack_padded(out.transpose(1, 2), lengths), **tol)
    for name in ("dq", "dk", "dv"):
        torch.testing.assert_close(grads_p[name].cpu(), pack_padded(grads[name].transpose(1, 2), lengths), **tol)
    for name in ("dtable", "dbias_scale"):
        torch.testing.assert_close(grads_p[name].cpu(), grads[name], **tol)
