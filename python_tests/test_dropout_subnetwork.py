"""Attention dropout in the sub-network attention: sub-network m drops its probabilities with the Philox mask of
``reference.stream_seed(seed, m)``. Every backend (the C++ edge kernels under "auto" on CPU, the Triton kernels
under the interpreter or on CUDA, the reference) against the float64 reference with the same p and seed: outputs
and the gradients of q, k, v, on ragged batches with padding, empty items and empty rows, relation and dense masks,
split rows, packed batches (which draw their padded form's masks); p = 0 is the op without dropout; the masks the
sub-networks draw are their own streams'; the modules pass a seed drawn from torch's generator.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.nn import SyntaxBertSelfAttention, draw_dropout_seed
from syntaxkernels.ops._dispatch import interpreting
from syntaxkernels.tools.testing import assert_close_to_reference
from syntaxkernels.trees import PackedTreeBatch

from conftest import CPP, KERNEL_DEVICE, TRITON, needs_cpp, needs_triton, trees_of_kind

RELATIONS = sk.MaskSpec(max_distance=3, full=False)  # parent/child/sibling 1..3: the edge kernels only
ALL = sk.MaskSpec(max_distance=2, pairwise=True)  # relations, pairwise, full
DENSE = sk.MaskSpec(max_distance=1, parent=False, child=False, sibling=False, pairwise=True, full=True)
P, SEED = 0.3, 0xDEADBEEF12345678  # a seed above 2^63: the int64 bit pattern reaches the kernels

def _heads(backend: str) -> int:
    return 1 if backend == "triton" and interpreting() else 2


def _run(fn, tensors, grad, dtype):
    inputs = [t.to(dtype).requires_grad_(True) for t in tensors]
    out, nonempty = fn(*inputs)
    return out, nonempty, torch.autograd.grad(out, inputs, grad.to(out.dtype))


def check(trees, masks, backend, device, dtype=torch.float32, D=12, p=P, seed=SEED, H=None):
    """The op under ``backend`` with dropout against the float64 reference with the same p and seed (and the
    reference in ``dtype``, for the tolerance): out, nonempty, dq, dk, dv."""
    trees = trees.to(device)
    H = H or _heads(backend)
    B, N = trees.batch_size, trees.max_len
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    grad = torch.randn(B, masks.num_masks, H, N, D, generator=gen, dtype=torch.float64).to(device)

    def op(q, k, v):
        return sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend=backend, dropout_p=p, dropout_seed=seed)

    def ref(q, k, v):
        return reference.syntax_subnetwork_attention(q, k, v, trees, masks, dropout_p=p, dropout_seed=seed)

    out, nonempty, grads = _run(op, (q, k, v), grad, dtype)
    out64, nonempty64, grads64 = _run(ref, (q, k, v), grad, torch.float64)
    outlow, _, gradslow = _run(ref, (q, k, v), grad, dtype)
    assert out.dtype == dtype and out.shape == (B, masks.num_masks, H, N, D)
    assert torch.equal(nonempty, nonempty64)
    assert_close_to_reference(out, out64, outlow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)
    empty = ~nonempty[:, :, None, :, None].expand_as(out)
    assert torch.all(out[empty] == 0), "an empty (token, mask) row is not exactly zero"
    # The dropout did something (where some row has a key): the undropped reference is far from the dropped one.
    plain, _ = reference.syntax_subnetwork_attention(q, k, v, trees, masks)
    assert not bool(nonempty.any()) or (plain - out64).abs().max() > 1e-2


# ---------------------------------------------------------------------------------------------------------
# The reference: sub-network m is masked attention with the mask of stream_seed(seed, m)
# ---------------------------------------------------------------------------------------------------------

def test_reference_drops_each_subnetwork_with_its_stream():
    """Written out from the definition: softmax over the mask, times dropout_keep(stream_seed(seed, m)) / (1 - p)."""
    trees = trees_of_kind("forest", 13, seed=2)
    B, H, N, D = trees.batch_size, 2, trees.max_len, 5
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64) for _ in range(3))
    out, _ = reference.syntax_subnetwork_attention(q, k, v, trees, ALL, dropout_p=P, dropout_seed=SEED)
    allowed = reference.syntax_masks(trees, ALL)[:, :, None]  # [B, M, 1, N, N]
    scores = (q @ k.transpose(-1, -2)) / D ** 0.5
    for m in range(ALL.num_masks):
        weights = scores.masked_fill(~allowed[:, m], float("-inf")).softmax(-1).nan_to_num(0.0)
        keep = reference.dropout_keep(reference.stream_seed(SEED, m), P, B, H, N, N)
        expected = (weights * keep / (1 - P)) @ v
        torch.testing.assert_close(out[:, m], expected, msg=f"sub-network {ALL.names[m]}")


def test_streams_are_independent_masks():
    masks = [reference.dropout_keep(reference.stream_seed(SEED, m), 0.5, 2, 2, 9, 9) for m in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(masks[a], masks[b])
    assert torch.equal(masks[0], reference.dropout_keep(SEED, 0.5, 2, 2, 9, 9))  # stream 0: the seed itself


# ---------------------------------------------------------------------------------------------------------
# Every backend against the reference with the same seed
# ---------------------------------------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("kind", ["random", "forest", "star", "chain", "packed", "single"])
def test_cpp_relation_masks(kind):
    check(trees_of_kind(kind, 19, seed=1), RELATIONS, "auto", "cpu")


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
def test_cpp_relation_masks_dtypes(dtype):
    check(trees_of_kind("random", 17, seed=3), RELATIONS, "auto", "cpu", dtype=dtype, D=16)


@needs_cpp
@pytest.mark.parametrize("masks", [ALL, DENSE], ids=["all", "dense"])
def test_cpp_auto_with_dense_masks(masks):
    """Under "auto" on CPU the dense masks run on the C++ distance-bias op's dropout."""
    check(trees_of_kind("forest", 15, seed=4), masks, "auto", "cpu")


@needs_triton
@pytest.mark.parametrize("kind,masks", [("forest", ALL), ("random", RELATIONS), ("packed", DENSE), ("star", ALL)],
                         ids=["forest-all", "random-relations", "packed-dense", "star-all"])
@pytest.mark.long_on_cpu
def test_triton(kind, masks):
    check(trees_of_kind(kind, 15, seed=5), masks, "triton", KERNEL_DEVICE)


@needs_triton
@pytest.mark.long_on_cpu
def test_triton_split_rows(monkeypatch):
    """Work items of 4 edges: long rows are split into pieces merged by log-sum-exp (dropped partial sums), and the
    backward's split tokens sum partial dq / dk / dv rows."""
    from syntaxkernels.ops import edge_attention

    monkeypatch.setattr(edge_attention, "SCHEDULE_CHUNK", 4)
    trees = sk.TreeBatch.from_heads([[-1] + [0] * 10 + [1, 1, 1, 1, 1, 2], [-1, 0, 0, 0, 0, 0, 0]])
    schedule = trees.relation_lists(RELATIONS).schedule(4)
    assert schedule.pieces > 0 and schedule.dq_slots > 0 and schedule.dk_slots > 0
    check(trees, RELATIONS, "triton", KERNEL_DEVICE)


def test_reference_backend():
    """backend="reference" through the public op (validation, dispatch) on a ragged batch."""
    check(trees_of_kind("forest", 14, seed=6), ALL, "reference", "cpu")


# ---------------------------------------------------------------------------------------------------------
# p = 0, masks drawn, packed batches
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend_device,masks",
                         [pytest.param(CPP.values[0], RELATIONS, marks=needs_cpp, id="cpp-relations"),
                          pytest.param(CPP.values[0], ALL, marks=needs_cpp, id="cpp-all"),
                          pytest.param(TRITON.values[0], ALL, marks=needs_triton, id="triton-all")])
def test_p_zero_is_the_op_without_dropout(backend_device, masks):
    backend, device = backend_device
    trees = trees_of_kind("random", 13, seed=8).to(device)
    q, k, v = (torch.randn(trees.batch_size, 1, trees.max_len, 8, device=device) for _ in range(3))
    plain, flags = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend=backend)
    zero, zero_flags = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend=backend, dropout_p=0.0,
                                                      dropout_seed=SEED)
    assert torch.equal(plain, zero) and torch.equal(flags, zero_flags)


@pytest.mark.parametrize("backend_device,masks",
                         [pytest.param(CPP.values[0], RELATIONS, marks=needs_cpp, id="cpp"),
                          pytest.param(TRITON.values[0], ALL, marks=needs_triton, id="triton")])
def test_each_subnetwork_draws_its_streams_mask(backend_device, masks):
    """q = k = 0 (uniform weights over the allowed keys) and v = one-hot keys: out[b, m, h, i, j] is
    keep_m(i, j) / (1 - p) / |allowed row|, so the op's dropped pairs are read off the output. Each sub-network's
    equal stream_seed(seed, m)'s mask on its allowed pairs (not the seed's own mask)."""
    backend, device = backend_device
    trees = trees_of_kind("forest", 12, seed=9).to(device)
    B, N, H, p = trees.batch_size, trees.max_len, 2, 0.5
    q = torch.zeros(B, H, N, N, device=device)
    v = torch.eye(N, device=device).expand(B, H, N, N).contiguous()
    out, _ = sk.syntax_subnetwork_attention(q, q, v, trees, masks, backend=backend, dropout_p=p, dropout_seed=SEED)
    allowed = reference.syntax_masks(trees.to("cpu"), masks)  # [B, M, N, N]
    seen = out.cpu() > 0
    for m in range(masks.num_masks):
        keep = reference.dropout_keep(reference.stream_seed(SEED, m), p, B, H, N, N)
        assert torch.equal(seen[:, m], keep & allowed[:, m, None]), masks.names[m]
    # ... and not the seed's own mask (stream 0) on any sub-network m > 0's pairs
    own = reference.dropout_keep(SEED, p, B, H, N, N)
    for m in range(1, masks.num_masks):
        pairs = allowed[:, m, None].expand(B, H, N, N)
        if int(pairs.sum()) >= 8:
            assert not torch.equal(seen[:, m][pairs], own[pairs]), masks.names[m]


def _packed_case(seed=10):
    rows = [[-1, 0, 0, 1, 1, 2, 2, -1, 7], [1, -1, 1, 2], [-1], [-1, 0, 1, 2, 3]]
    return rows, PackedTreeBatch.from_heads(rows), sk.TreeBatch.from_heads(rows)


def check_packed(masks, backend, device):
    """A packed batch with dropout equals the padded batch's reference with the same seed (sequence s = item s),
    outputs and gradients."""
    rows, packed, padded = _packed_case()
    packed = packed.to(device)
    H, D = _heads(backend), 8
    T = packed.num_tokens
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(T, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    grad = torch.randn(T, masks.num_masks, H, D, generator=gen, dtype=torch.float64)
    starts = [sum(len(r) for r in rows[:s]) for s in range(len(rows))]

    def pad(x):
        out = x.new_zeros(len(rows), H, padded.max_len, x.shape[-1])
        for s, r in enumerate(rows):
            out[s, :, :len(r)] = x[starts[s]:starts[s] + len(r)].transpose(0, 1)
        return out

    inputs = [t.float().to(device).requires_grad_(True) for t in (q, k, v)]
    out, _ = sk.syntax_subnetwork_attention(*inputs, packed, masks, backend=backend, dropout_p=P, dropout_seed=SEED)
    grads = torch.autograd.grad(out, inputs, grad.float().to(device))
    ref_inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref, _ = reference.syntax_subnetwork_attention(*(pad(t) for t in ref_inputs), padded, masks, dropout_p=P,
                                                   dropout_seed=SEED)  # [S, M, H, N, D]
    ref_packed = torch.cat([ref[s, :, :, :len(r)].permute(2, 0, 1, 3) for s, r in enumerate(rows)])
    ref_grads = torch.autograd.grad(ref_packed, ref_inputs, grad)
    torch.testing.assert_close(out.double().cpu(), ref_packed, atol=2e-5, rtol=2e-5)
    for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
        torch.testing.assert_close(g.double().cpu(), rg, atol=2e-5, rtol=2e-5, msg=name)


@pytest.mark.parametrize("backend_device", [CPP, TRITON, pytest.param(("reference", "cpu"), id="reference")])
def test_packed_relation_masks_draw_the_padded_masks(backend_device):
    backend, device = backend_device
    check_packed(RELATIONS, backend, device)


@pytest.mark.parametrize("backend_device", [pytest.param(CPP.values[0], marks=[needs_cpp], id="cpp"),
                                            pytest.param(TRITON.values[0], marks=[needs_triton],
                                                         id="triton"),
                                            pytest.param(("reference", "cpu"), id="reference")])
def test_packed_dense_masks_draw_the_padded_masks(backend_device):
    backend, device = backend_device
    check_packed(ALL, backend, device)


def test_dropout_arguments_are_checked():
    trees = trees_of_kind("random", 8)
    q = torch.randn(trees.batch_size, 1, trees.max_len, 4)
    with pytest.raises(ValueError, match="dropout_seed"):
        sk.syntax_subnetwork_attention(q, q, q, trees, RELATIONS, dropout_p=0.1)
    with pytest.raises(ValueError, match="dropout_p"):
        sk.syntax_subnetwork_attention(q, q, q, trees, RELATIONS, dropout_p=1.0, dropout_seed=1)
    with pytest.raises(ValueError, match="dropout_seed"):
        sk.syntax_subnetwork_attention(q, q, q, trees, RELATIONS, dropout_p=0.1, dropout_seed=-1)


# ---------------------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,masks", [pytest.param("auto", RELATIONS, marks=needs_cpp, id="auto-relations"),
                                           pytest.param("reference", ALL, id="reference-all")])
def test_bert_self_attention_drops_probabilities_in_training_mode(backend, masks):
    torch.manual_seed(0)
    E, H = 16, 2
    layer = SyntaxBertSelfAttention(E, H, masks=masks, dropout=0.3, backend=backend, variant="package")
    trees = trees_of_kind("forest", 11, seed=12)
    B, N = trees.batch_size, trees.max_len
    x = torch.randn(B, N, E)
    layer.eval()
    with torch.no_grad():
        evaluated = layer(x, trees)
    layer.train()
    torch.manual_seed(5)
    dropped = layer(x, trees)
    torch.manual_seed(5)
    seed = draw_dropout_seed()  # the seed the layer drew
    q, k, v = (proj(x).view(B, N, H, E // H).transpose(1, 2) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    outputs, nonempty = reference.syntax_subnetwork_attention(q, k, v, trees, masks, dropout_p=0.3,
                                                              dropout_seed=seed)
    expected = layer.out_proj(layer.topical(outputs, nonempty).transpose(1, 2).reshape(B, N, E))
    torch.testing.assert_close(dropped, expected, atol=1e-5, rtol=1e-5)
    assert (dropped - evaluated).abs().max() > 1e-2
    torch.manual_seed(5)
    torch.testing.assert_close(layer(x, trees), dropped)  # reproducible under torch.manual_seed
    with torch.no_grad():
        layer.eval()
        torch.testing.assert_close(layer(x, trees), evaluated)


def test_integration_subnetwork_layers_pass_the_attention_dropout(monkeypatch):
    """The "subnetwork" layers hand transformers' attention dropout to the op (a seed per call), never dropping
    the mixed output; in eval mode they pass 0."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels import ops
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=50, attention_probs_dropout_prob=0.25)
    model = transformers.BertModel(config)
    enable_syntax_attention(model, "subnetwork", masks=RELATIONS, backend="reference", variant="package")
    calls = []
    original = ops.syntax_subnetwork_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("dropout_p", 0.0), kwargs.get("dropout_seed")))
        return original(*args, **kwargs)

    monkeypatch.setattr(ops, "syntax_subnetwork_attention", spy)
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1], [-1, 0]])
    ids = torch.randint(4, 50, (2, 4))
    mask = (torch.arange(4)[None] < trees.lengths[:, None]).long()
    model.train()
    torch.manual_seed(1)
    model(input_ids=ids, attention_mask=mask, syntax_trees=trees)
    assert calls and calls[-1][0] == 0.25 and isinstance(calls[-1][1], int)
    model.eval()
    model(input_ids=ids, attention_mask=mask, syntax_trees=trees)
    assert calls[-1] == (0.0, None)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
@pytest.mark.parametrize("variant", ["paper", "release", "package"])
@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
def test_syntax_bert_batches(backend_device, variant, pair):
    """Syntax-BERT's wordpiece batches (word-level "paper" / "release" masks: their dense masks from segments;
    "package": the token tree) with dropout against the reference with the same seed."""
    from test_papers import _release_batch

    backend, device = backend_device
    texts, word_ids, seqs, attention_mask, _, spec = _release_batch(pair)
    trees = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask,
                                       variant=variant)
    check(trees, spec, backend, device, D=8)
