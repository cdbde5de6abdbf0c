"""Fused distance-bias attention (Triton) against the reference: forward and every gradient.

On a CPU machine the kernels run under TRITON_INTERPRET=1 (set by conftest.py); sizes stay small (B = 2,
H = 2) so the file runs in a few minutes on two cores. The CUDA tests at the bottom run real sizes.
"""
import random

import pytest
import torch
import triton
import triton.language as tl

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.ops._primitives import bucket_from_distance
from syntaxkernels.ops.block_meta import block_distance_range, build_block_meta, compact_rows
from syntaxkernels.testing import assert_close_to_reference

from conftest import requires_cuda

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_heads(length: int, rng: random.Random, roots: int = 1):
    """0-based heads of a random forest with ``roots`` trees (root = -1)."""
    heads = []
    for i in range(length):
        if i < roots:
            heads.append(-1)
        else:
            heads.append(rng.randrange(0, i))
    return heads


def make_case(B, H, N, D, dtype, *, lengths=None, per_head=False, buckets=None, seed=0, roots=2):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lengths = [N] * B if lengths is None else list(lengths)
    heads = [random_heads(L, rng, roots=min(roots, max(L, 1))) for L in lengths]
    buckets = buckets or sk.BucketSpec()
    distance = sk.tree_distance([h for h in heads], torch.tensor(lengths)) if N else torch.empty(B, 0, 0,
                                                                                                dtype=torch.uint8)
    if distance.shape[-1] < N:
        pad = torch.full((B, N, N), 255, dtype=torch.uint8)
        n = distance.shape[-1]
        pad[:, :n, :n] = distance
        distance = pad
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    T = buckets.num_buckets
    table = torch.randn((H, T) if per_head else (T,), generator=gen)
    bias_scale = torch.tensor([0.8])
    return dict(q=q, k=k, v=v, distance=distance, table=table, bias_scale=bias_scale,
                lengths=torch.tensor(lengths), buckets=buckets, dtype=dtype)


def _run(case, dtype, backend, grad_out, **kw):
    """Forward + backward; returns (out, grads dict) with inputs cast to ``dtype`` (table/scale in fp32 or fp64)."""
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (case[n].to(DEVICE, dtype).requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(DEVICE, pdtype).requires_grad_()
    c = case["bias_scale"].to(DEVICE, pdtype).requires_grad_()
    out = sk.syntax_bias_attention(q, k, v, case["distance"].to(DEVICE), table, buckets=case["buckets"],
                                   bias_scale=c, lengths=case["lengths"].to(DEVICE), backend=backend, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), grad_out.to(DEVICE, dtype))
    return out, dict(zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads))


def check_bias_scale_grad(case, grads, grads64, gradslp):
    """``d c = sum_t table[t] G[t]`` is one scalar summing every bucket's error, so with half inputs the
    "2x the same-dtype reference" rule on it alone is a coin toss. Check instead (1) that it equals
    ``sum(table * d table) / c`` computed from the kernel's own table gradient (checked element-wise
    against the reference), and (2) that its error is within the error that the reference's per-bucket
    errors, weighted by |table|, allow."""
    table = case["table"].to(DEVICE, torch.float64)
    c = float(case["bias_scale"])
    from_table = (table * grads["dtable"].double()).sum() / c
    torch.testing.assert_close(grads["dbias_scale"].double().reshape(()), from_table, rtol=1e-5, atol=1e-5)
    bucket_err = (gradslp["dtable"].double() - grads64["dtable"].double()).abs()
    bound = 2 * (table.abs() * bucket_err).sum() / c + 1e-4 * grads64["dbias_scale"].abs().max()
    err = (grads["dbias_scale"].double() - grads64["dbias_scale"].double()).abs().max()
    assert err <= bound, f"dbias_scale: error {err:.3e} > bound {bound:.3e}"


def check_against_reference(case, **kw):
    dtype = case["dtype"]
    B, H, N, D = case["q"].shape
    grad_out = torch.randn(B, H, N, case["v"].shape[-1], generator=torch.Generator().manual_seed(1))
    out, grads = _run(case, dtype, "triton", grad_out, **kw)
    out64, grads64 = _run(case, torch.float64, "reference", grad_out, **kw)
    outlp, gradslp = _run(case, dtype, "reference", grad_out, **kw)
    assert out.dtype == dtype and out.shape == out64.shape
    assert_close_to_reference(out, out64, outlp, "out")
    for name in grads:
        if name == "dbias_scale" and dtype != torch.float32:
            check_bias_scale_grad(case, grads, grads64, gradslp)
        else:
            assert_close_to_reference(grads[name], grads64[name], gradslp[name], name)
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
    ("N64-fp32-D32-bigtable-gather", (2, 2, 64, 32), torch.float32,
     dict(buckets=sk.BucketSpec(40, unreachable_bucket=False), roots=1)),
    ("N50-fp32-D32-window0-forest", (2, 2, 50, 32), torch.float32, dict(window=0, roots=5)),
    # D128 backward: the dK/dV and dQ kernels use different tilings, each with its own live-block lists.
    ("N100-fp16-D128-ragged-window2-causal", (2, 1, 100, 128), torch.float16,
     dict(lengths=[100, 45], window=2, causal=True)),
    ("N70-fp32-D128-window1", (1, 2, 70, 128), torch.float32, dict(window=1)),
]


@pytest.mark.parametrize("shape,dtype,opts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_and_gradients(shape, dtype, opts):
    opts = dict(opts)
    kw = {k: opts.pop(k) for k in ("window", "causal") if k in opts}
    case = make_case(*shape, dtype, **opts)
    check_against_reference(case, **kw)


def test_window_block_skipping_small_tiles(monkeypatch):
    """16x16 tiles on a chain: most tiles are dead under window=2 and are skipped, the result still matches."""
    monkeypatch.setattr(ba, "_BLOCK_OVERRIDE", (16, 16))
    N = 128
    case = make_case(2, 2, N, 32, torch.float32, lengths=[128, 50])
    chain = [[-1] + list(range(N - 1)), [-1] + list(range(49))]
    case["distance"] = sk.tree_distance(chain, torch.tensor([128, 50]))
    meta = build_block_meta(case["distance"].to(DEVICE), case["lengths"].to(DEVICE, torch.int32), 16, 16, window=2)
    assert meta.density() < 0.3
    check_against_reference(case, window=2)


def test_real_block_size_with_padding_and_causal():
    """The launcher's own tile sizes on N just over one tile, ragged and causal."""
    assert ba._BLOCK_OVERRIDE is None
    case = make_case(2, 1, 70, 64, torch.float32, lengths=[70, 66])
    check_against_reference(case, causal=True)


def test_deterministic_bit_identical():
    case = make_case(2, 2, 100, 32, torch.bfloat16, lengths=[100, 80], per_head=True)
    grad_out = torch.randn(2, 2, 100, 32)
    runs = [_run(case, torch.bfloat16, "triton", grad_out, deterministic=True) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0])
    for name in runs[0][1]:
        assert torch.equal(runs[0][1][name], runs[1][1][name]), name


def test_strided_inputs_without_copies():
    """q/k/v as views of a packed [B, N, 3, H, D] projection (non-contiguous) give the same result."""
    case = make_case(2, 2, 33, 32, torch.float32)
    packed = torch.randn(2, 33, 3, 2, 32)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    kw = dict(buckets=case["buckets"], lengths=case["lengths"])
    out = sk.syntax_bias_attention(q, k, v, case["distance"], case["table"], backend="triton", **kw)
    ref = sk.syntax_bias_attention(q.contiguous(), k.contiguous(), v.contiguous(), case["distance"], case["table"],
                                   backend="reference", **kw)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_float_bias_scale_and_default_scale():
    case = make_case(1, 2, 20, 32, torch.float32)
    args = (case["q"], case["k"], case["v"], case["distance"], case["table"])
    for c in (None, 0.5):
        out = sk.syntax_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3, backend="triton")
        ref = reference.syntax_bias_attention(*args, buckets=case["buckets"], bias_scale=c, scale=0.3)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_auto_backend_picks_reference_on_cpu():
    case = make_case(1, 1, 5, 32, torch.float32)
    out = sk.syntax_bias_attention(case["q"], case["k"], case["v"], case["distance"], case["table"],
                                   buckets=case["buckets"])
    ref = reference.syntax_bias_attention(case["q"], case["k"], case["v"], case["distance"], case["table"],
                                          buckets=case["buckets"])
    assert torch.equal(out, ref)


@triton.jit
def _bucket_kernel(D, OUT, MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE: tl.constexpr):
    offs = tl.arange(0, 256)
    d = tl.load(D + offs).to(tl.int32)
    tl.store(OUT + offs, bucket_from_distance(d, MAX_DISTANCE, LOG_DISTANCE, UNREACHABLE))


@pytest.mark.parametrize("spec", [sk.BucketSpec(), sk.BucketSpec(3), sk.BucketSpec(10, unreachable_bucket=False),
                                  sk.BucketSpec(16, log_distance=4), sk.BucketSpec(254, log_distance=1),
                                  sk.BucketSpec(100, log_distance=7, unreachable_bucket=False)],
                         ids=["default", "max3", "no-unreachable", "log4-16", "log1-254", "log7-100-clamped"])
def test_in_kernel_bucket_equals_lut(spec):
    d = torch.arange(256, dtype=torch.uint8, device=DEVICE)
    out = torch.empty(256, dtype=torch.int32, device=DEVICE)
    _bucket_kernel[(1,)](d, out, *ba.bucket_args(spec))
    assert torch.equal(out.cpu().long(), spec.lut())


def test_block_meta_matches_dense_computation():
    case = make_case(2, 1, 50, 32, torch.float32, lengths=[50, 21])
    dist, lengths = case["distance"], case["lengths"].to(torch.int32)
    smallest, largest = block_distance_range(dist, lengths, 16, 32)
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
    with pytest.raises(ValueError, match=match):
        sk.syntax_bias_attention(**kw)


def test_unsupported_head_dim_and_dtype():
    case = make_case(1, 1, 8, 32, torch.float32)
    big = torch.randn(1, 1, 8, 160)
    with pytest.raises(ValueError, match="head dim 160"):
        sk.syntax_bias_attention(big, big, big, case["distance"], case["table"], buckets=case["buckets"],
                                 backend="triton")
    q64 = case["q"].double()
    with pytest.raises(ValueError, match="float64"):
        sk.syntax_bias_attention(q64, q64, q64, case["distance"], case["table"], buckets=case["buckets"],
                                 backend="triton")


def _op_args(case, dtype=torch.float32):
    lengths = case["lengths"].to(torch.int32)
    return (case["q"].to(dtype), case["k"].to(dtype), case["v"].to(dtype), case["distance"], case["table"],
            case["bias_scale"], lengths, 0.2, 3, False, *ba.bucket_args(case["buckets"]))


def test_opcheck_forward_and_backward():
    """torch.library.opcheck on both Triton ops (schema, fake tensors, autograd registration).

    ``test_aot_dispatch_dynamic`` is left out on CPU: under the interpreter the functional decomposition of a
    Triton op would call the Python-interpreted kernel on functional tensors, which it cannot run; it is
    covered by the CUDA test below.
    """
    case = make_case(2, 2, 20, 32, torch.float32, lengths=[20, 11])
    args = _op_args(case)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if DEVICE == "cuda":
        utils = utils + ("test_aot_dispatch_dynamic",)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.bias_attention_fwd(*args)
    dout = torch.randn_like(out)
    bwd_args = (dout, *args[:3], out, lse, *args[3:])
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_bwd, bwd_args, test_utils=utils)


def test_torch_compile_fullgraph():
    case = make_case(2, 2, 24, 32, torch.float32, lengths=[24, 13])
    table = case["table"].clone().requires_grad_()
    q = case["q"].clone().requires_grad_()

    def f(q, k, v, distance, table, lengths):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), lengths=lengths,
                                        window=4, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "eager"
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    args = (q, case["k"], case["v"], case["distance"], table, case["lengths"])
    out = compiled(*args)
    out.sum().backward()
    ref = reference.syntax_bias_attention(q.detach(), case["k"], case["v"], case["distance"], case["table"],
                                          buckets=sk.BucketSpec(), lengths=case["lengths"], window=4)
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
    original = ba._SyntaxBiasAttention.apply
    monkeypatch.setattr(ba._SyntaxBiasAttention, "apply", lambda *a: called.append(1) or original(*a))
    q = case["q"].cuda().bfloat16()
    sk.syntax_bias_attention(q, q, q, case["distance"].cuda(), case["table"].cuda(), buckets=case["buckets"])
    assert called
