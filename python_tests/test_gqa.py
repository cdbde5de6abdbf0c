"""Grouped-query attention in the distance-bias op: k and v with ``H_kv`` heads, ``H % H_kv == 0``.

The reference (the specification: query head h reads key/value head ``h // (H / H_kv)``, gradients summed over
the group) against an independent float64 loop over the heads; the padded Triton kernels (interpreted on the CPU:
every kernel family a grouped call takes) against the reference in forward and every gradient, bit for bit against
the call with k and v repeated, deterministic; bad head counts are a ``ValueError`` that says what is wrong. The C++
kernels and the packed paths: test_gqa_cpu_packed.py.
"""
import contextlib
import math

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads


def by_hand(case, causal=False, window=None):
    """float64, head by head, no shared code with the reference beyond the bucket table: each query head attends
    with its group's key/value head."""
    q, k, v = (case[n].double() for n in ("q", "k", "v"))
    B, H, N, D = q.shape
    G = H // k.shape[1]
    lut = case["buckets"].lut()
    table = case["table"].double()
    out = torch.zeros(B, H, N, v.shape[-1], dtype=torch.float64)
    c = float(case["bias_scale"])
    for b in range(B):
        L = int(case["lengths"][b])
        d = case["distance"][b, :L, :L].long()
        for h in range(H):
            t = table if table.dim() == 1 else table[h]
            s = q[b, h, :L] @ k[b, h // G, :L].T / math.sqrt(D) + c * t[lut[d]]
            allowed = torch.ones(L, L, dtype=torch.bool)
            if causal:
                allowed &= torch.ones(L, L, dtype=torch.bool).tril()
            if window is not None:
                allowed &= d <= window
            p = s.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
            out[b, h, :L] = p @ v[b, h // G, :L]
    return out


@pytest.mark.parametrize("H,H_kv", [(4, 1), (4, 2), (6, 3), (3, 3)])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 3)])
def test_reference_grouped_against_loop(H, H_kv, causal, window):
    case = bias_attention_case(2, H, 9, 8, lengths=[9, 6], per_head=True, seed=H * 7 + H_kv, kv_heads=H_kv)
    args = {n: case[n].double() for n in ("q", "k", "v")}
    out = reference.syntax_bias_attention(args["q"], args["k"], args["v"], case["distance"], case["table"].double(),
                                          buckets=case["buckets"], bias_scale=case["bias_scale"].double(),
                                          lengths=case["lengths"], causal=causal, window=window)
    torch.testing.assert_close(out, by_hand(case, causal, window), rtol=1e-10, atol=1e-10)


def test_reference_grouped_gradients_sum_the_group():
    """dK, dV of a grouped call are the sums over each group of the expanded call's per-head gradients."""
    case = bias_attention_case(2, 4, 7, 8, lengths=[7, 5], seed=3, kv_heads=2)
    grad_out = torch.randn(2, 4, 7, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _, grads = bias_attention_grads(reference.syntax_bias_attention, case, torch.float64, grad_out)
    expanded = dict(case, k=case["k"].repeat_interleave(2, 1), v=case["v"].repeat_interleave(2, 1))
    _, full = bias_attention_grads(reference.syntax_bias_attention, expanded, torch.float64, grad_out)
    torch.testing.assert_close(grads["dk"], full["dk"].view(2, 2, 2, 7, 8).sum(2))
    torch.testing.assert_close(grads["dv"], full["dv"].view(2, 2, 2, 7, 8).sum(2))
    torch.testing.assert_close(grads["dq"], full["dq"])
    torch.testing.assert_close(grads["dtable"], full["dtable"])


def test_bad_head_counts_are_named():
    q = torch.randn(1, 6, 5, 8)
    d = torch.zeros(1, 5, 5, dtype=torch.uint8)
    table = torch.zeros(sk.BucketSpec().num_buckets)
    with pytest.raises(ValueError, match="H_kv to divide H"):
        sk.syntax_bias_attention(q, torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), d, table,
                                 buckets=sk.BucketSpec())
    with pytest.raises(ValueError, match="one H_kv"):
        sk.syntax_bias_attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 2, 5, 8), d, table,
                                 buckets=sk.BucketSpec())
    packed = torch.randn(5, 6, 8)
    with pytest.raises(ValueError, match="grouped-query"):
        sk.syntax_bias_attention(packed, torch.randn(5, 4, 8), torch.randn(5, 4, 8), d.view(-1), table,
                                 buckets=sk.BucketSpec(), cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))


def test_grouped_auto_runs_a_grouped_path():
    """Under "auto" a grouped call runs a path that takes it (the reference where the fused one does not yet)."""
    case = bias_attention_case(2, 4, 7, 8, lengths=[7, 5], seed=1, kv_heads=2)
    grad_out = torch.randn(2, 4, 7, 8, generator=torch.Generator().manual_seed(2))
    out, grads = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, grad_out)
    out64, grads64 = bias_attention_grads(reference.syntax_bias_attention, case, torch.float64, grad_out)
    outlp, gradslp = bias_attention_grads(reference.syntax_bias_attention, case, torch.float32, grad_out)
    assert grads["dk"].shape == case["k"].shape
    assert_bias_attention_close(case, (out, grads), (out64, grads64), (outlp, gradslp), torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# The padded Triton kernels (interpreted on the CPU): every kernel family a grouped call can take
# ---------------------------------------------------------------------------------------------------------------

from conftest import KERNEL_DEVICE as DEVICE, long_rows_tiles, needs_triton, spy_launches  # noqa: E402

from syntaxkernels.ops import _primitives as P  # noqa: E402


def _run(case, dtype, backend, grad_out, **kw):
    def op(*args, **kwargs):
        return sk.syntax_bias_attention(*args, backend=backend, **kwargs)
    return bias_attention_grads(op, case, dtype, grad_out, DEVICE, **kw)


# id, (B, H, H_kv, N, D), dtype, case options, op options, a kernel the call must run, arch (None: the default)
TRITON_CASES = [
    ("short-bf16", (2, 4, 2, 20, 32), torch.bfloat16, dict(lengths=[20, 13]), {}, "_bias_bwd_short_kernel", 90),
    ("short-t-bf16-mqa-causal", (2, 4, 1, 33, 32), torch.bfloat16, dict(lengths=[33, 0]), dict(causal=True),
     "_bias_bwd_short_t_kernel", 80),
    ("short-bf16-dropout", (2, 6, 3, 24, 32), torch.bfloat16, dict(lengths=[24, 7]),
     dict(dropout_p=0.2, dropout_seed=7), "_bias_bwd_short_kernel", 90),
    ("two-block-bf16", (2, 4, 2, 90, 32), torch.bfloat16, dict(lengths=[90, 50]), {}, "_bias_bwd_short2_keys_kernel",
     90),
    ("two-block-queries-bf16-causal", (2, 4, 2, 90, 32), torch.bfloat16, dict(lengths=[90, 50]), dict(causal=True),
     "_bias_bwd_short2_kernel", 80),
    ("tiled-fp32-perhead-causal", (3, 6, 3, 45, 16), torch.float32, dict(lengths=[45, 0, 30], per_head=True),
     dict(causal=True), "_bias_bwd_dkdv_kernel", None),
    ("tiled-fp32-window-mqa", (2, 4, 1, 40, 32), torch.float32, dict(lengths=[40, 17], isolated=[(1, 3)]),
     dict(window=1), "_bias_bwd_table_kernel", None),
    ("tiled-fp32-dropout", (2, 4, 2, 70, 16), torch.float32, dict(lengths=[70, 41]),
     dict(dropout_p=0.3, dropout_seed=2 ** 63 + 3), "_bias_bwd_dkdv_kernel", None),
    ("tiled-fp16-perhead", (2, 4, 2, 36, 32), torch.float16, dict(lengths=[36, 20], per_head=True), {},
     "_bias_bwd_table_kernel", None),
]


@needs_triton
@pytest.mark.parametrize("shape,dtype,opts,kw,kernel,arch", [c[1:] for c in TRITON_CASES],
                         ids=[c[0] for c in TRITON_CASES])
def test_triton_grouped_matches_the_reference(monkeypatch, shape, dtype, opts, kw, kernel, arch):
    """Forward and every gradient of a grouped call on the Triton path against the reference (float64 and the
    call's dtype), with the kernel family the call must take; dK and dV come back in k's and v's shapes."""
    B, H, H_kv, N, D = shape
    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(arch) if arch is not None else None
    try:
        case = bias_attention_case(B, H, N, D, dtype, kv_heads=H_kv, bias_scale=0.8, seed=N, **opts)
        grad_out = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(1))
        got = _run(case, dtype, "triton", grad_out, **kw)
    finally:
        if arch is not None:
            P.interpret_as(previous)
    assert kernel in names, names
    assert got[1]["dk"].shape == (B, H_kv, N, D) and got[1]["dv"].shape == (B, H_kv, N, D)
    ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
    reflp = _run(case, dtype, "reference", grad_out, **kw)
    assert_bias_attention_close(case, got, ref64, reflp, dtype)


@needs_triton
@pytest.mark.parametrize("N,dtype", [(20, torch.bfloat16), (90, torch.bfloat16), (45, torch.float32)])
def test_triton_grouped_forward_is_the_expanded_forward_bit_for_bit(monkeypatch, N, dtype):
    """Each query head reads exactly its group's key/value head: the grouped output equals, bit for bit, the output
    of the same call with k and v repeated per query head (a wrong head mapping differs). Both on the same tiles: the
    padded batches' rule (calls of 65..512 tokens, grouped-query ones left out) is off here."""
    from syntaxkernels.ops import _replay

    long_rows_tiles(monkeypatch)
    _replay.clear()  # (a program recorded with the padded tiles would replay them)
    try:
        case = bias_attention_case(2, 6, N, 32, dtype, kv_heads=2, seed=4, lengths=[N, N // 2])
        args = dict(buckets=case["buckets"], bias_scale=case["bias_scale"].to(DEVICE),
                    lengths=case["lengths"].to(DEVICE), backend="triton")
        q, k, v = (case[n].to(DEVICE, dtype) for n in ("q", "k", "v"))
        distance, table = case["distance"].to(DEVICE), case["table"].to(DEVICE)
        grouped = sk.syntax_bias_attention(q, k, v, distance, table, **args)
        expanded = sk.syntax_bias_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), distance, table,
                                            **args)
    finally:
        _replay.clear()  # (nor may a program recorded here replay the long rows' tiles later)
    assert torch.equal(grouped, expanded)


@needs_triton
def test_triton_grouped_gradients_are_deterministic_and_layout_free():
    """dK/dV are summed over each group in a fixed order: two runs (the second in a shuffled program order under
    the interpreter) are bit-identical; k and v given as ``[B, N, H_kv, D]`` views get gradients in that layout,
    equal to the contiguous call's."""
    from syntaxkernels.tools.checks import shuffled_program_order

    case = bias_attention_case(2, 4, 50, 32, torch.float32, kv_heads=2, seed=9, lengths=[50, 23])
    grad_out = torch.randn(2, 4, 50, 32, generator=torch.Generator().manual_seed(2))
    first = _run(case, torch.float32, "triton", grad_out)
    with shuffled_program_order(seed=3) if P.interpreting() else contextlib.nullcontext():
        second = _run(case, torch.float32, "triton", grad_out)
    for name in first[1]:
        assert torch.equal(first[1][name], second[1][name]), name
    k, v = (case[n].to(DEVICE).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for n in ("k", "v"))
    q, table, c = (case[n].to(DEVICE).requires_grad_() for n in ("q", "table", "bias_scale"))  # (as the first run)
    out = sk.syntax_bias_attention(q, k, v, case["distance"].to(DEVICE), table, buckets=case["buckets"],
                                   bias_scale=c, lengths=case["lengths"].to(DEVICE), backend="triton")
    _, dk, dv, _, _ = torch.autograd.grad(out, (q, k, v, table, c), grad_out.to(DEVICE))
    assert dk.stride() == k.stride() and dv.stride() == v.stride()
    assert torch.equal(dk, first[1]["dk"]) and torch.equal(dv, first[1]["dv"])
