"""Fused sub-network attention (Triton, under the interpreter on CPU) against the reference.

Forward outputs, the non-empty flags and dq, dk, dv for every mask kind, forests with the pairwise mask,
single-token sentences, ragged batches with an empty item, odd N; the block metadata against a PyTorch
computation and against the reference masks (no allowed pair is ever skipped); bad inputs.
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.checks.reference import random_document, random_forest
from syntaxkernels.ops import subnetwork_attention as subnet
from syntaxkernels.testing import assert_close_to_reference

# The kernels run on the GPU when there is one, else under the interpreter (conftest sets TRITON_INTERPRET=1).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------------------------------------
# Tree generators
# ---------------------------------------------------------------------------------------------------------

def chain(length: int):
    return [-1] + list(range(length - 1))


def make_trees(kind: str, n: int, seed: int = 0) -> sk.TreeBatch:
    """A batch of three items of at most ``n`` tokens (see the ids of ``CASES``)."""
    rng = random.Random(seed)
    if kind == "ragged":  # one sentence per item, lengths n, ~n/2 and 0
        rows = [random_forest(rng, n), random_forest(rng, max(1, n // 2)), []]
    elif kind == "forest":  # sentence pairs and documents (several trees per item)
        split = max(1, n // 3)
        rows = [random_document(rng, [split, n - split]),
                random_document(rng, [max(1, n // 5)] * 3),
                random_document(rng, [1, max(1, n - 1)])]
        rows = [r[:n] for r in rows]
    elif kind == "single":  # every token its own one-token sentence, plus a chain
        rows = [[-1] * n, [-1] * max(1, n - 3), chain(n)]
    else:
        raise ValueError(kind)
    heads = torch.full((len(rows), n), -1, dtype=torch.int64)
    for b, row in enumerate(rows):
        if row:
            heads[b, :len(row)] = torch.tensor(row)
    return sk.TreeBatch.from_heads(heads, lengths=[len(r) for r in rows]).to(DEVICE)


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against the reference
# ---------------------------------------------------------------------------------------------------------

ALL = sk.MaskSpec(max_distance=3, pairwise=True, full=True)
SYNTAX = sk.MaskSpec(max_distance=3, full=False)
PARENT = sk.MaskSpec(max_distance=3, child=False, sibling=False, full=False)
CHILD = sk.MaskSpec(max_distance=2, parent=False, sibling=False, full=False)
SIBLING = sk.MaskSpec(max_distance=3, parent=False, child=False, full=False)
PAIRWISE = sk.MaskSpec(max_distance=1, parent=False, child=False, sibling=False, pairwise=True, full=False)
FULL = sk.MaskSpec(max_distance=1, parent=False, child=False, sibling=False, full=True)
DEFAULT = sk.MaskSpec()  # parent/child/sibling 1..3 and full: M = 10

# (id, tree kind, N, masks, dtype, D, config override)
SMALL = dict(BLOCK_M=16, BLOCK_N=16)
CASES = [
    ("ragged-N17-default-fp32-D32", "ragged", 17, DEFAULT, torch.float32, 32, None),
    ("ragged-N100-default-bf16-D64", "ragged", 100, DEFAULT, torch.bfloat16, 64, None),
    ("ragged-N64-syntax-fp32-D32-blocks16-G3", "ragged", 64, SYNTAX, torch.float32, 32, dict(SMALL, GROUP=3)),
    ("ragged-N1-default-fp32-D32", "ragged", 1, DEFAULT, torch.float32, 32, None),
    ("forest-N17-all-fp32-D64", "forest", 17, ALL, torch.float32, 64, None),
    ("forest-N64-all-bf16-D32-blocks16-G4", "forest", 64, ALL, torch.bfloat16, 32, dict(SMALL, GROUP=4)),
    ("forest-N64-pairwise-fp32-D32-blocks16", "forest", 64, PAIRWISE, torch.float32, 32, dict(SMALL, GROUP=1)),
    ("forest-N64-parent-fp32-D32-blocks16", "forest", 64, PARENT, torch.float32, 32, dict(SMALL, GROUP=2)),
    ("forest-N64-child-bf16-D32-blocks16", "forest", 64, CHILD, torch.bfloat16, 32, dict(SMALL, GROUP=2)),
    ("forest-N64-sibling-fp32-D64-blocks16", "forest", 64, SIBLING, torch.float32, 64, dict(SMALL, GROUP=2)),
    ("forest-N100-all-bf16-D64", "forest", 100, ALL, torch.bfloat16, 64, None),
    ("forest-N129-default-bf16-D32", "forest", 129, DEFAULT, torch.bfloat16, 32, None),
    ("single-N17-all-fp32-D32", "single", 17, ALL, torch.float32, 32, None),
    ("single-N64-full-bf16-D64-blocks16", "single", 64, FULL, torch.bfloat16, 64, dict(SMALL, GROUP=1)),
]


@pytest.fixture
def config_override():
    """Set ``subnet._CONFIG_OVERRIDE`` for one test (smaller tiles exercise block skipping at small N)."""
    def set_override(value):
        subnet._CONFIG_OVERRIDE = value

    yield set_override
    subnet._CONFIG_OVERRIDE = None


def _qkv(B, H, N, D, dtype):
    return [torch.randn(B, H, N, D, dtype=torch.float64, device=DEVICE) for _ in range(3)]


def _run(fn, q, k, v, grad):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out, nonempty = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad.to(out.dtype))
    return out, nonempty, grads


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(case, config_override):
    _, kind, N, masks, dtype, D, override = case
    config_override(override)
    trees = make_trees(kind, N)
    B, H = trees.batch_size, 1
    q, k, v = _qkv(B, H, N, D, dtype)
    grad = torch.randn(B, masks.num_masks, H, N, D, dtype=torch.float64, device=DEVICE)

    def kernel(q, k, v):
        return sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")

    def ref(q, k, v):
        return reference.syntax_subnetwork_attention(q, k, v, trees, masks)

    out, nonempty, grads = _run(kernel, q.to(dtype), k.to(dtype), v.to(dtype), grad)
    ref64, nonempty64, grads64 = _run(ref, q, k, v, grad)
    reflow, _, gradslow = _run(ref, q.to(dtype), k.to(dtype), v.to(dtype), grad)

    assert out.dtype == dtype and out.shape == (B, masks.num_masks, H, N, D)
    assert nonempty.dtype == torch.bool and torch.equal(nonempty, nonempty64)
    assert_close_to_reference(out, ref64, reflow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)
    # Empty (token, mask) rows are exactly zero.
    empty = ~nonempty[:, :, None, :, None].expand_as(out)
    assert torch.all(out[empty] == 0)
    if bool(nonempty.any()):
        assert all(bool(g.abs().sum() > 0) for g in grads), "a gradient is all zeros"


def test_empty_rows_have_zero_gradients():
    """Tokens whose every mask is empty (single-token sentences, padding) get exactly zero dq."""
    trees = make_trees("single", 17)
    masks = SYNTAX  # no syntax relation exists in one-token sentences; item 2 is a chain
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(3, 2, 17, 32, torch.float32))
    out, nonempty = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")
    assert not bool(nonempty[:2].any()) and bool(nonempty[2].any())
    assert torch.all(out[:2] == 0)
    out.sum().backward()
    assert torch.all(q.grad[:2] == 0) and torch.all(k.grad[:2] == 0) and torch.all(v.grad[:2] == 0)
    assert torch.isfinite(q.grad).all() and bool(q.grad[2].abs().sum() > 0)


def test_default_scale_and_explicit_scale():
    trees = make_trees("ragged", 17)
    q, k, v = (t.float() for t in _qkv(3, 1, 17, 32, torch.float32))
    out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, scale=0.3, backend="triton")
    ref, _ = reference.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_strided_inputs():
    """q, k, v as transposed views of a [B, N, H, D] projection (no copies in the op)."""
    trees = make_trees("forest", 17)
    x = torch.randn(3, 17, 2, 3 * 32, device=DEVICE)
    q, k, v = (t.transpose(1, 2) for t in x.split(32, dim=-1))
    assert not q.is_contiguous()
    out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, ALL, backend="triton")
    ref, _ = reference.syntax_subnetwork_attention(q, k, v, trees, ALL)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Block metadata
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("masks", [DEFAULT, ALL, PAIRWISE, CHILD], ids=["default", "all", "pairwise", "child"])
def test_block_bits_kernel_matches_torch_and_covers_every_pair(masks):
    trees = make_trees("forest", 100, seed=3)
    bits_kernel = subnet.subnetwork_block_bits(trees, masks, 16, 16, use_kernel=True)
    bits_torch = subnet.subnetwork_block_bits(trees, masks, 16, 16, use_kernel=False)
    assert torch.equal(bits_kernel, bits_torch)
    # Soundness: every allowed pair of mask m lies in a tile that has mask m's bit.
    codes, needs, _ = subnet.mask_codes(masks)
    allowed = reference.syntax_masks(trees, masks)  # [B, M, N, N]
    B, M, N, _ = allowed.shape
    blocks = -(-N // 16)
    padded = torch.zeros(B, M, blocks * 16, blocks * 16, dtype=torch.bool, device=allowed.device)
    padded[..., :N, :N] = allowed
    tile_has_pair = padded.view(B, M, blocks, 16, blocks, 16).any(dim=5).any(dim=3)
    for m in range(M):
        has_bit = (bits_torch.to(torch.int32) & needs[m]) != 0
        assert not bool((tile_has_pair[:, m] & ~has_bit).any()), f"mask {masks.names[m]} has a pair in a skipped tile"
    # The syntax masks skip tiles on documents.
    stats = subnet.subnetwork_block_stats(trees, masks, 16, 16)
    assert 0.0 < stats["visited_mask_fraction"] <= stats["visited_fraction"] <= stats["valid_fraction"] <= 1.0
    if masks is DEFAULT:
        assert stats["syntax_fraction"] < stats["valid_fraction"]


def test_block_stats_on_treebank(ud_dev_path):
    sentences = sk.trees.read_conllu(ud_dev_path)[:40]
    heads, offset = [], 0
    for s in sentences:
        if offset + len(s.heads) > 512:
            break
        heads += [h + offset if h >= 0 else -1 for h in s.heads]
        offset += len(s.heads)
    trees = sk.TreeBatch.from_heads([heads])
    stats = subnet.subnetwork_block_stats(trees, DEFAULT, 64, 64)
    assert stats["syntax_fraction"] < 0.5 * stats["valid_fraction"]


def test_mask_codes_and_groups():
    codes, needs, max_d = subnet.mask_codes(ALL)
    assert len(codes) == ALL.num_masks and max_d == 4  # sibling_4
    assert codes[ALL.names.index("parent_2")] == 8 and codes[ALL.names.index("child_1")] == 5
    assert codes[ALL.names.index("sibling_3")] == 14 and codes[ALL.names.index("pairwise")] == 1
    assert codes[-1] == -1 and needs[-1] == subnet.BIT_VALID
    for group in (1, 2, 3, 4):
        groups = subnet._mask_groups(codes, needs, group)
        assert sorted(m for g in groups for m in g) == list(range(len(codes)))
        assert all(1 <= len(g) <= group for g in groups)
        # syntax masks never share a group with the dense ones
        assert all(len({needs[m] == subnet.BIT_SYNTAX for m in g}) == 1 for g in groups)


# ---------------------------------------------------------------------------------------------------------
# Dispatch and bad inputs
# ---------------------------------------------------------------------------------------------------------

def test_auto_on_cpu_is_the_reference():
    trees = make_trees("ragged", 17).to("cpu")
    q, k, v = (t.float().cpu() for t in _qkv(3, 1, 17, 32, torch.float32))
    out, nonempty = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    ref, ref_nonempty = reference.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    assert torch.equal(out, ref) and torch.equal(nonempty, ref_nonempty)


def test_float64_falls_back_under_auto_and_is_refused_by_triton():
    trees = make_trees("ragged", 17)
    q, k, v = _qkv(3, 1, 17, 32, torch.float64)
    out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="auto")
    assert out.dtype == torch.float64
    with pytest.raises(ValueError, match="float64"):
        sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="triton")


def test_bad_inputs():
    trees = make_trees("ragged", 17)
    q, k, v = (t.float() for t in _qkv(3, 1, 17, 32, torch.float32))
    with pytest.raises(TypeError, match="trees"):
        sk.syntax_subnetwork_attention(q, k, v, trees.distance, DEFAULT, backend="triton")
    with pytest.raises(TypeError, match="masks"):
        sk.syntax_subnetwork_attention(q, k, v, trees, "parent", backend="triton")
    with pytest.raises(ValueError, match="backend"):
        sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="cuda")
    with pytest.raises(ValueError, match="distance"):
        sk.syntax_subnetwork_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], trees, DEFAULT, backend="triton")
    with pytest.raises(ValueError, match="q, k, v"):
        sk.syntax_subnetwork_attention(q, k[:, :, :10], v, trees, DEFAULT, backend="triton")
    with pytest.raises(ValueError, match="head dim"):
        sk.syntax_subnetwork_attention(q, k, v[..., :16], trees, DEFAULT, backend="triton")
    with pytest.raises(ValueError, match="float16, bfloat16"):
        sk.syntax_subnetwork_attention(q.long(), k.long(), v.long(), trees, DEFAULT, backend="triton")


def test_library_ops_pass_opcheck():
    """The torch.library triton ops have valid schemas and fake (shape-only) implementations."""
    trees = make_trees("forest", 17)
    q, k, v = (t.float() for t in _qkv(3, 1, 17, 32, torch.float32))
    codes, needs, max_d = subnet.mask_codes(ALL)
    args = (q, k, v, trees.distance, trees.depth, trees.segment, codes, needs, max_d, 0.2)
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.syntaxkernels.subnetwork_attention_fwd, args, test_utils=utils)
    out, lse, nonempty, bits = torch.ops.syntaxkernels.subnetwork_attention_fwd(*args)
    assert lse.shape == (3, ALL.num_masks, 1, 17) and bits.dtype == torch.int8
    bwd_args = (torch.randn_like(out), q, k, v, out, lse, trees.distance, trees.depth, trees.segment, bits, codes,
                needs, 0.2)
    torch.library.opcheck(torch.ops.syntaxkernels.subnetwork_attention_bwd, bwd_args, test_utils=utils)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_cuda_real_sizes(dtype, head_dim):
    """Real sizes on a GPU: 4 documents of ~512 tokens, 4 heads, M = 11, and backend='auto' picks Triton."""
    rng = random.Random(1)
    rows = [random_document(rng, [rng.randint(5, 40) for _ in range(20)])[:512] for _ in range(4)]
    trees = sk.TreeBatch.from_heads(rows).to(DEVICE)
    N = trees.max_len
    q, k, v = _qkv(4, 4, N, head_dim, dtype)
    grad = torch.randn(4, ALL.num_masks, 4, N, head_dim, dtype=torch.float64, device=DEVICE)

    def kernel(q, k, v):
        return sk.syntax_subnetwork_attention(q, k, v, trees, ALL, backend="auto")

    def ref(q, k, v):
        return reference.syntax_subnetwork_attention(q, k, v, trees, ALL)

    out, nonempty, grads = _run(kernel, q.to(dtype), k.to(dtype), v.to(dtype), grad)
    ref64, nonempty64, grads64 = _run(ref, q, k, v, grad)
    reflow, _, gradslow = _run(ref, q.to(dtype), k.to(dtype), v.to(dtype), grad)
    assert torch.equal(nonempty, nonempty64)
    assert_close_to_reference(out, ref64, reflow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)
