"""NaN and Inf in the inputs propagate on every path (docs/semantics.md, "Non-finite inputs").

One NaN or +Inf is planted in q, k, v or the bias table at a valid token, and every path's output and gradients are
compared with what the rule says, computed here from the inputs alone (:func:`expected`, float64, independent of
every path): a row with a NaN or +Inf among its allowed scores is NaN, forward and backward; a NaN or Inf in v_j
reaches the columns of the rows that give key j weight; the gradients of a poisoned row reach its allowed keys'
dk, dv and table buckets. Paths: the fused C++ kernels (padded and packed, fp32 and bf16), the Triton kernels under
the interpreter (the tiled fp32 kernels, the one-tile bf16 kernels, the packed kernels), the edge-list kernels (C++
and Triton: sub-network relation masks and the GAT window) and the reference. Rows with no allowed key (padding)
stay exactly 0 with zero gradients. With a window or causal, where the rule depends on how a path masks a pair (an
additive ``-inf`` lets a NaN score through, a dense product spreads ``0 * NaN``), the planted value must still reach
everything the rule says (a superset), and exactly that where the path masks exactly (the C++ kernels' forward).
"""
import math

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference

from conftest import KERNEL_DEVICE, needs_cpp, needs_triton

pytestmark = pytest.mark.usefixtures("one_thread")

# Two ragged items: a forest of two trees (12 tokens) and a 7-token tree padded to 12.
HEADS = [[1, -1, 1, 2, 3, 4, 1, 6, 7, 8, -1, 10], [-1, 0, 0, 2, 2, 4, 4]]
B, H, N, D = 2, 2, 12, 16
BUCKETS = sk.BucketSpec()
INJECTIONS = ["q-nan", "q-inf", "k-nan", "v-nan", "v-inf", "table-nan", "table-inf"]


def inputs(what: str):
    """``(q, k, v, table)`` float64 (q, k, v ``[B, H, N, D]``, table ``[T]``) with one value planted at a valid token:
    q of (0, 1, 2), k and v of (1, 0, 2), or the table's distance-2 bucket (pairs of every item fall in it). For
    ``q-inf`` every k is positive in that dimension, so row (0, 1, 2)'s scores are all +Inf (never -Inf)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(BUCKETS.num_buckets, generator=gen, dtype=torch.float64)
    value = float("nan") if what.endswith("nan") else float("inf")
    if what.startswith("q"):
        q[0, 1, 2, 3] = value
        k[..., 3] = k[..., 3].abs()
    elif what.startswith("k"):
        k[1, 0, 2, 0] = value
    elif what.startswith("v"):
        v[1, 0, 2, 0] = value
    else:
        table[BUCKETS.lut()[2]] = value
    return q, k, v, table


def expected(q, k, v, allowed, bias=None, pair_bucket=None, num_buckets=None, scale=None):
    """Where the rule puts non-finite values, from the inputs alone (float64): a dict of bool tensors ``out``
    (``[B, H, N, Dv]``), ``dq``, ``dk``, ``dv`` (their inputs' shapes) and, given ``pair_bucket`` (``[B, N, N]``
    bucket of every pair), ``dtable`` (``[T]``).

    ``allowed`` ``[B, 1 or H, N, N]``; ``bias`` the added bias (``[B, 1 or H, N, N]``, may hold NaN/Inf). A row is
    *score-poisoned* when an allowed score is NaN or +Inf: its output and its probabilities are NaN. It gives every
    allowed key weight otherwise (the scores here never underflow), so a non-finite ``v[j, d]`` reaches column d of
    the rows that allow j, and poisons their backward (``dO . v_j``). A poisoned row's dq is NaN, so are dk of
    every key it allows (and dv of those keys when its probabilities are NaN), and the table gradient of the
    buckets of its allowed pairs.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    allowed = allowed.expand_as(scores)
    score_poisoned = (allowed & (scores.isnan() | scores.isposinf())).any(-1)  # [B, H, N]
    weighted = allowed & ~score_poisoned[..., None]  # pairs with weight > 0 in rows that have weights
    bad_v = ~v.isfinite()
    out = score_poisoned[..., None] | ((weighted.double() @ bad_v.double()) > 0)
    poisoned = score_poisoned | (weighted & bad_v.any(-1)[..., None, :]).any(-1)
    result = dict(out=out,
                  dq=poisoned[..., None].expand(q.shape),
                  dk=(allowed & poisoned[..., None]).any(-2)[..., None].expand(k.shape),
                  dv=(allowed & score_poisoned[..., None]).any(-2)[..., None].expand(v.shape))
    if pair_bucket is not None:
        pairs = allowed & poisoned[..., None]
        buckets = pair_bucket[:, None].expand_as(pairs)[pairs]
        dtable = torch.zeros(num_buckets, dtype=torch.bool)
        dtable[buckets] = True
        result["dtable"] = dtable
    return result


def check(name, got, want, valid=None, exact=True):
    """``got``'s non-finite entries against the rule's (``want``), within ``valid`` (broadcast): equal, or (not
    ``exact``) a superset. The rule must expect something somewhere, or the planted value tested nothing."""
    bad = ~got.detach().cpu().double().isfinite()
    if valid is not None:
        bad, want = bad & valid, want & valid
    if exact:
        missing, extra = want & ~bad, bad & ~want
        assert not missing.any() and not extra.any(), (
            f"{name}: {int(missing.sum())} entries finite where the rule says non-finite, {int(extra.sum())} "
            f"non-finite where it says finite (first missing {missing.nonzero()[:3].tolist()}, first extra "
            f"{extra.nonzero()[:3].tolist()})")
    else:
        missing = want & ~bad
        assert not missing.any(), f"{name}: {int(missing.sum())} entries finite where the rule says non-finite"


# ----------------------------------------------------------------------------------------------------------
# Distance-bias attention, padded: C++, Triton, reference
# ----------------------------------------------------------------------------------------------------------

BIAS_PATHS = [
    pytest.param("auto", torch.float32, marks=needs_cpp, id="cpp-fp32"),
    pytest.param("auto", torch.bfloat16, marks=needs_cpp, id="cpp-bf16"),
    pytest.param("triton", torch.float32, marks=needs_triton, id="triton-fp32-tiled"),
    pytest.param("triton", torch.bfloat16, marks=needs_triton, id="triton-bf16-short-rows"),
    pytest.param("reference", torch.float64, id="reference"),
]


def bias_run(what, backend, dtype, **opts):
    """Forward and backward of ``syntax_bias_attention`` on the planted inputs: ``(out, grads, want, valid)``."""
    trees = sk.TreeBatch.from_heads(HEADS)
    q64, k64, v64, table64 = inputs(what)
    device = KERNEL_DEVICE if backend == "triton" else "cpu"
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.to(device, dtype).requires_grad_() for t in (q64, k64, v64)]
    leaves.append(table64.to(device, pdtype).requires_grad_())
    trees = trees.to(device)
    out = sk.syntax_bias_attention(*leaves[:3], trees.distance, leaves[3], buckets=BUCKETS, lengths=trees.lengths,
                                   backend=backend, **opts)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, out.dtype)
    grads = dict(zip(("dq", "dk", "dv", "dtable"), torch.autograd.grad(out, leaves, grad_out)))
    distance = trees.distance.cpu()
    lengths = trees.lengths.cpu()
    allowed = reference.allowed_pairs(distance, lengths, opts.get("window"), opts.get("causal", False))[:, None]
    bias = reference.gather_bias(distance, table64, BUCKETS, dtype=torch.float64)
    want = expected(q64, k64, v64, allowed, bias, BUCKETS.lut()[distance.long()], BUCKETS.num_buckets)
    valid = (torch.arange(N)[None, :] < lengths[:, None])[:, None, :, None]
    return out, grads, want, valid


@pytest.mark.parametrize("what", INJECTIONS)
@pytest.mark.parametrize("backend, dtype", BIAS_PATHS)
def test_bias_attention_propagates_nonfinite(backend, dtype, what):
    """Within the lengths (no window, not causal) every path's output and gradients are non-finite exactly where
    the rule says; padding rows stay exactly 0, and so does their dq (but on the one-tile Triton backward, where a
    padding row's zero q times a NaN k, or its zero dO times a NaN v, reaches it: docs/semantics.md)."""
    out, grads, want, valid = bias_run(what, backend, dtype)
    check("out", out, want["out"], valid)
    for name in ("dq", "dk", "dv"):
        check(name, grads[name], want[name], valid)
    check("dtable", grads["dtable"], want["dtable"])
    padding = ~valid.expand_as(out.cpu())
    assert torch.all(out.detach().cpu()[padding] == 0)
    if not (backend == "triton" and dtype == torch.bfloat16 and what[0] in "kv"):
        assert torch.all(grads["dq"].cpu()[padding] == 0)


MASKED = [pytest.param(dict(window=2), id="window2"), pytest.param(dict(causal=True), id="causal")]


@pytest.mark.parametrize("what", INJECTIONS)
@pytest.mark.parametrize("opts", MASKED)
@pytest.mark.parametrize("backend, dtype", BIAS_PATHS)
def test_bias_attention_propagates_nonfinite_with_window_or_causal(backend, dtype, what, opts):
    """With a window or causal the planted value reaches at least what the rule says, forward and backward. The
    C++ kernels and the reference mask the excluded scores exactly: a planted q, k or table value reaches exactly
    the rows the rule says (the Triton kernels add the window as -inf, and the one-tile kernels causality too, so
    a NaN score there may reach more rows; a planted v value reaches more rows through a product's 0 * NaN)."""
    out, grads, want, valid = bias_run(what, backend, dtype, **opts)
    check("out", out, want["out"], valid, exact=backend != "triton" and not what.startswith("v"))
    for name in ("dq", "dk", "dv"):
        check(name, grads[name], want[name], valid, exact=False)
    check("dtable", grads["dtable"], want["dtable"], exact=False)


# ----------------------------------------------------------------------------------------------------------
# Packed batches: the C++ path (padded layout inside the op), the varlen Triton kernels, the reference
# ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("what", INJECTIONS)
@pytest.mark.parametrize("backend, dtype", [
    pytest.param("auto", torch.float32, marks=needs_cpp, id="cpp-fp32"),
    pytest.param("triton", torch.float32, marks=needs_triton, id="triton-fp32-varlen"),
    pytest.param("reference", torch.float64, id="reference"),
])
def test_packed_bias_attention_propagates_nonfinite(backend, dtype, what):
    """The same sequences packed: exactly where the rule says on the C++ path (the sequences laid out padded inside
    the op) and the reference; at least there on the varlen Triton kernels, whose 32-token tiles mix sequences, so
    that a product's 0 * NaN carries a value to the other sequences of its tiles (docs/semantics.md)."""
    exact = backend != "triton"
    packed = sk.TreeBatch.from_heads(HEADS, packed=True)
    padded = sk.TreeBatch.from_heads(HEADS)
    q64, k64, v64, table64 = inputs(what)
    lengths = padded.lengths
    device = KERNEL_DEVICE if backend == "triton" else "cpu"
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32

    def pack(x):  # [B, H, N, D] -> [T, H, D]
        return sk.trees.pack_padded(x.transpose(1, 2), lengths)

    leaves = [pack(t).to(device, dtype).requires_grad_() for t in (q64, k64, v64)]
    leaves.append(table64.to(device, pdtype).requires_grad_())
    packed = packed.to(device)
    out = sk.syntax_bias_attention(*leaves[:3], packed.distance, leaves[3], buckets=BUCKETS,
                                   cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen, backend=backend)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    distance = padded.distance
    allowed = reference.allowed_pairs(distance, lengths)[:, None]
    bias = reference.gather_bias(distance, table64, BUCKETS, dtype=torch.float64)
    want = expected(q64, k64, v64, allowed, bias, BUCKETS.lut()[distance.long()], BUCKETS.num_buckets)
    check("out", out, pack(want["out"]), exact=exact)
    for name, grad in zip(("dq", "dk", "dv"), grads[:3]):
        check(name, grad, pack(want[name]), exact=exact)
    check("dtable", grads[3], want["dtable"], exact=exact)


# ----------------------------------------------------------------------------------------------------------
# Edge-list kernels: sub-network relation masks and the GAT window (C++ and Triton), and their references
# ----------------------------------------------------------------------------------------------------------

EDGE_PATHS = [
    pytest.param("auto", torch.float32, marks=needs_cpp, id="cpp-fp32"),
    pytest.param("auto", torch.bfloat16, marks=needs_cpp, id="cpp-bf16"),
    pytest.param("triton", torch.float32, marks=needs_triton, id="triton-fp32"),
]
# Relation masks (a chain of child_d rows: one key each, the gathers) and full (SDPA with a key mask).
MASKS = sk.MaskSpec(max_distance=2)


def _edge_leaves(what, backend, dtype):
    q64, k64, v64, _ = inputs(what if not what.startswith("table") else "q-nan")
    device = KERNEL_DEVICE if backend == "triton" else "cpu"
    return (q64, k64, v64), [t.to(device, dtype).requires_grad_() for t in (q64, k64, v64)], device


@pytest.mark.parametrize("what", [w for w in INJECTIONS if not w.startswith("table")])
@pytest.mark.parametrize("backend, dtype", EDGE_PATHS)
@pytest.mark.long_on_cpu
def test_subnetwork_attention_propagates_nonfinite(backend, dtype, what):
    """Every mask's output and the summed gradients, exactly where the rule says (one-key rows, the gathers of the
    C++ kernels, included)."""
    trees = sk.TreeBatch.from_heads(HEADS)
    (q64, k64, v64), leaves, device = _edge_leaves(what, backend, dtype)
    out, nonempty = sk.syntax_subnetwork_attention(*leaves, trees.to(device), MASKS, backend=backend)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    masks = reference.syntax_masks(trees, MASKS)  # [B, M, N, N]
    wants = [expected(q64, k64, v64, masks[:, m, None]) for m in range(MASKS.num_masks)]
    valid = (torch.arange(N)[None, :] < trees.lengths[:, None])[:, None, :, None]
    for m, name in enumerate(MASKS.names):
        check(f"out[{name}]", out[:, m], wants[m]["out"], valid)
        assert torch.all(out[:, m].cpu()[~nonempty[:, m, None, :, None].cpu().expand_as(out[:, m])] == 0)
    for name, grad in zip(("dq", "dk", "dv"), grads):
        want = torch.stack([w[name] for w in wants]).any(0)
        check(name, grad, want, valid)


@pytest.mark.parametrize("what", [w for w in INJECTIONS if not w.startswith("table")])
@pytest.mark.parametrize("backend, dtype", EDGE_PATHS + [pytest.param("reference", torch.float64, id="reference")])
def test_window_attention_propagates_nonfinite(backend, dtype, what):
    trees = sk.TreeBatch.from_heads(HEADS)
    (q64, k64, v64), leaves, device = _edge_leaves(what, backend, dtype)
    out = sk.ops.syntax_window_attention(*leaves, trees.to(device), window=2, backend=backend)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    want = expected(q64, k64, v64, reference.allowed_pairs(trees.distance, trees.lengths, 2)[:, None])
    valid = (torch.arange(N)[None, :] < trees.lengths[:, None])[:, None, :, None]
    check("out", out, want["out"], valid, exact=backend != "reference")
    for name, grad in zip(("dq", "dk", "dv"), grads):
        check(name, grad, want[name], valid, exact=backend != "reference")


# ----------------------------------------------------------------------------------------------------------
# The reference's rule itself, and rows without an allowed key
# ----------------------------------------------------------------------------------------------------------

def test_reference_rows_follow_softmax_and_sdpa():
    """masked_attention: a row with a NaN or +Inf score is NaN throughout (as torch.softmax and SDPA make it: before,
    a +Inf score left finite weights beside it), a -Inf score gets weight 0; a row with no allowed key is exactly 0,
    even beside a NaN in v."""
    scores = torch.tensor([[0.5, float("inf"), 1.0], [0.5, float("nan"), 1.0], [0.5, -float("inf"), 1.0]],
                          dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = reference.masked_attention(scores, torch.ones(3, 3, dtype=torch.bool), v)
    softmax = torch.softmax(scores.detach(), -1) @ v.detach()
    assert out[:2].isnan().all() and torch.equal(out.isnan(), softmax.isnan())
    torch.testing.assert_close(out[2], softmax[2])
    zeros = torch.zeros(1, 1, 3, 4, dtype=torch.float64)  # SDPA with q = k = 0: its scores are the float mask
    sdpa = torch.nn.functional.scaled_dot_product_attention(zeros, zeros, v.detach()[None, None],
                                                            attn_mask=scores.detach())
    assert torch.equal(sdpa[0, 0].isnan(), out.isnan())
    out.sum().backward()
    assert scores.grad[:2].isnan().all() and v.grad.isnan().any()

    v = torch.randn(3, 4, dtype=torch.float64)
    v[1, 2] = float("nan")
    out = reference.masked_attention(torch.randn(2, 3, dtype=torch.float64), torch.tensor([[True] * 3, [False] * 3]), v)
    assert out[0, 2].isnan() and torch.equal(out[1], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("backend, dtype", BIAS_PATHS)
def test_padding_rows_stay_zero_beside_a_nan_row(backend, dtype):
    """A NaN in a valid row never reaches the padding rows, whose outputs and gradients stay exactly 0 (the
    empty-row rule is about masks, and a NaN row is not an empty one)."""
    out, grads, want, valid = bias_run("q-nan", backend, dtype)
    assert out.isnan().any()
    padding = ~valid.expand_as(out.cpu())
    for t in (out, grads["dq"], grads["dk"], grads["dv"]):
        assert torch.all(t.detach().cpu()[padding] == 0)
