"""Attention dropout on the packed (varlen) Triton kernels of the distance-bias op.

The kernels' DROPOUT variant (forward, dQ, dK/dV with and without the per-head table sums, the shared-table kernel)
against the reference with the same ``dropout_p`` and ``dropout_seed``: the reference run sequence by sequence
(sequence s draws batch item s's mask), in float64 and in the kernel's dtype (the tolerance rule of
:mod:`syntaxkernels.tools.testing`), forward and every gradient. Also: ``p = 0`` is exactly the plain result, the
seed decides the mask, and the packed result equals the padded reference of the same sequences (packed and padded
batches draw one mask). Small sizes: the kernels run under the interpreter on CPU-only machines.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops._dispatch import seed_bits
from syntaxkernels.ops.bias_attention import _host
from syntaxkernels.ops.bias_attention import _varlen_kernels as bv

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_triton
from test_packed import _run_packed, check_packed, make_packed_case

pytestmark = needs_triton

# id, lengths, H, D, dtype, options (make_packed_case's, window, causal, tiles), p, seed
DROPOUT_CASES = [
    # a shared table: the table kernel (every head's dS with its own mask, summed)
    ("shared-empty-fp32", [5, 0, 17, 1, 40], 2, 32, torch.float32, {}, 0.3, 12345),
    # a per-head table: the dK/dV kernel's bucket sums; a window
    ("perhead-window2-fp32", [12, 7, 1, 30], 2, 32, torch.float32, dict(per_head=True, window=2), 0.5, 7),
    # 16 x 16 tiles: every block holds several sequences, their keys start mid-group of 4; causal
    ("small-tiles-causal-fp32", [3, 7, 1, 0, 12, 2, 25, 4], 2, 16, torch.float32,
     dict(per_head=True, causal=True, tiles=(16, 16)), 0.2, 2 ** 40 + 3),
    ("causal-bf16", [20, 9, 14], 2, 64, torch.bfloat16, dict(causal=True), 0.25, 99),
    # head dim 80 (blocks of 128): the table kernel draws the mask before its dP product
    ("shared-D80-window3-fp32", [6, 0, 13, 1], 2, 80, torch.float32, dict(window=3), 0.3, 5),
]


def _case(lengths, H, D, opts, seed=0):
    opts = dict(opts)
    kw = {k: opts.pop(k) for k in ("window", "causal") if k in opts}
    tiles = opts.pop("tiles", None)
    return make_packed_case(lengths, H, D, seed=seed, **opts), kw, tiles


@pytest.mark.parametrize("lengths,H,D,dtype,opts,p,seed", [c[1:] for c in DROPOUT_CASES],
                         ids=[c[0] for c in DROPOUT_CASES])
def test_dropout_forward_and_gradients_match_the_reference(monkeypatch, lengths, H, D, dtype, opts, p, seed):
    case, kw, tiles = _case(lengths, H, D, opts, seed=len(lengths))
    if tiles is not None:
        monkeypatch.setattr(bv, "_BLOCK_OVERRIDE", tiles)
    out, _ = check_packed(case, dtype, dropout_p=p, dropout_seed=seed, **kw)
    plain, _ = _run_packed(case, dtype, "triton", **kw)
    assert not torch.equal(out, plain)  # the mask dropped something


def test_p_zero_is_exactly_the_plain_result():
    case, kw, _ = _case([6, 13, 1], 2, 32, dict(window=3), seed=40)
    out0, grads0 = _run_packed(case, torch.float32, "triton", dropout_p=0.0, dropout_seed=5, **kw)
    out, grads = _run_packed(case, torch.float32, "triton", **kw)
    assert torch.equal(out0, out)
    for name in grads:
        assert torch.equal(grads0[name], grads[name]), name


def test_the_seed_decides_the_mask():
    """Same seed: the same output bit for bit; another seed: another output. A seed past 2^63 (the full 64 bits
    reach the key), through the kernels and through the torch.library op (an int64 argument), against the
    reference."""
    case, kw, _ = _case([9, 4, 21], 2, 32, {}, seed=41)
    p = 0.4
    a, _ = _run_packed(case, torch.float32, "triton", dropout_p=p, dropout_seed=2024)
    b, _ = _run_packed(case, torch.float32, "triton", dropout_p=p, dropout_seed=2024)
    c, _ = _run_packed(case, torch.float32, "triton", dropout_p=p, dropout_seed=2025)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-2
    big = 2 ** 64 - 12345
    got, _ = _run_packed(case, torch.float32, "triton", dropout_p=p, dropout_seed=big)
    ref, _ = _run_packed(case, torch.float32, "spec", dropout_p=p, dropout_seed=big)
    torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-5, atol=1e-5)
    low, _ = _run_packed(case, torch.float32, "spec", dropout_p=p, dropout_seed=big & 0xFFFFFFFF)
    assert (got - low).abs().max() > 1e-2  # the seed's high word counts

    packed = case["packed"].to(DEVICE)
    q, k, v = (case[n].to(DEVICE) for n in ("q", "k", "v"))
    args = (q, k, v, packed.distance, case["table"].reshape(1, -1).to(DEVICE), case["bias_scale"].to(DEVICE),
            _host._bucket_lut(case["buckets"], q), packed.cu_seqlens, packed.sequence, packed.distance_offsets,
            q.shape[-1] ** -0.5, -1, False, p, seed_bits(big))
    op_out, _, _, _ = torch.ops.syntaxkernels.bias_attention_varlen_fwd(*args)
    torch.testing.assert_close(op_out, ref.detach().to(op_out.dtype), rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.syntaxkernels.bias_attention_varlen_fwd, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_packed_dropout_equals_the_padded_reference():
    """The packed Triton result (output and every gradient) equals the padded reference of the same sequences
    with the same p and seed, item s = sequence s (an empty sequence included): both draw one mask."""
    case, kw, _ = _case([11, 0, 5, 18], 2, 32, dict(per_head=True), seed=42)
    p, seed = 0.35, 31337
    out_p, grads_p = _run_packed(case, torch.float32, "triton", dropout_p=p, dropout_seed=seed)
    padded = case["packed"].to_padded()
    lengths = padded.lengths
    S, N = padded.heads.shape

    def to_padded(x):
        y = torch.zeros(S, N, *x.shape[1:], dtype=x.dtype)
        y[torch.arange(N)[None, :] < lengths[:, None]] = x
        return y.transpose(1, 2)  # [S, H, N, D]

    q, k, v = (to_padded(case[n]).double().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].double().requires_grad_()
    c = case["bias_scale"].double().requires_grad_()
    out = reference.syntax_bias_attention(q, k, v, padded.distance, table, buckets=case["buckets"], bias_scale=c,
                                          lengths=lengths, dropout_p=p, dropout_seed=seed)
    grads = torch.autograd.grad(out, (q, k, v, table, c), to_padded(case["grad_out"]).double())
    back = sk.trees.pack_padded
    torch.testing.assert_close(out_p.cpu(), back(out.transpose(1, 2), lengths).float(), rtol=1e-5, atol=2e-5)
    for name, g in zip(("dq", "dk", "dv"), grads[:3]):
        torch.testing.assert_close(grads_p[name].cpu(), back(g.transpose(1, 2), lengths).float(), rtol=1e-5,
                                   atol=2e-5, msg=name)
    torch.testing.assert_close(grads_p["dtable"].cpu(), grads[3].float(), rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(grads_p["dbias_scale"].cpu(), grads[4].float(), rtol=1e-4, atol=2e-5)
