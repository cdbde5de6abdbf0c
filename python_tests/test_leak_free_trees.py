"""Leak-free tree distances for causal models (``leak_free=True`` on the builders): the C++ builder and the Python
fallback against the brute-force reference (:func:`syntaxkernels.reference.leak_free_distance`) on random forests,
padding, n = 1, several roots and long chains; the causal property (re-attaching later tokens never changes an
earlier row); the plan (not symmetric) and what a leak-free batch refuses; causal distance-bias attention on a
leak-free batch against the reference, forward and every gradient (C++, reference, Triton under the interpreter,
packed).
"""
import pickle
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _ext, reference
from syntaxkernels.specs import MAX_PATH, UNREACHABLE
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads
from syntaxkernels.tools.workloads import random_forest
from syntaxkernels.trees.batch import is_tree_distance

from conftest import KERNEL_DEVICE, needs_triton

HAS_CPP = _ext.available() and hasattr(_ext.load(), "leak_free_tree_distance")
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="C++ extension (with leak_free_tree_distance) not built")
BACKENDS = [pytest.param("cpp", marks=needs_cpp), "python"]


def random_rows(seed: int, count: int, longest: int):
    """Ragged rows of random forests: one or several roots, some of length 0 and 1."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        n = rng.choice([0, 1, 2, rng.randint(1, longest), rng.randint(1, longest)])
        rows.append(random_forest(rng, n, num_trees=rng.choice([1, 1, 2, 3]), extra_root_prob=rng.choice([0, 0.1])))
    return rows


def expected_batch(rows, N):
    """uint8 [B, N, N]: the reference per row, 255 on padding."""
    out = torch.full((len(rows), N, N), UNREACHABLE, dtype=torch.uint8)
    for b, row in enumerate(rows):
        n = len(row)
        if n:
            out[b, :n, :n] = reference.leak_free_distance(row)
    return out


def reattach_later(rng: random.Random, heads, t: int):
    """A copy of ``heads`` whose tokens > t each get a new random head (or become roots), the result still a forest:
    a new head is never in the token's own subtree."""
    heads = list(heads)
    later = list(range(t + 1, len(heads)))
    rng.shuffle(later)
    for k in later:
        while True:
            h = rng.randrange(-1, len(heads))
            node = h
            while node not in (-1, k):
                node = heads[node]
            if h != k and node != k:
                heads[k] = h
                break
    return heads


# ------------------------------------------------------------------------------------------------ the reference


def test_reference_on_hand_made_trees():
    # 2 is the root; 0 and 1 hang from it, 3 from 2, 4 from 1.
    heads = [2, 2, -1, 2, 1]
    assert reference.leak_free_distance(heads).tolist() == [
        [0, 255, 255, 255, 255],
        [255, 0, 255, 255, 255],  # 0 -- 2 -- 1 runs through the later token 2
        [1, 1, 0, 255, 255],
        [2, 2, 1, 0, 255],
        [3, 1, 2, 3, 0],
    ]
    # A root that comes last (every other token its dependent): no earlier pair is connected.
    star = reference.leak_free_distance([4, 4, 4, 4, -1])
    assert torch.equal(star[:4, :4], torch.where(torch.eye(4, dtype=torch.bool), 0, 255).to(torch.uint8))
    assert star[4, :4].tolist() == [1, 1, 1, 1]


# ------------------------------------------------------------------------------------------------ the builders


@pytest.mark.parametrize("backend", BACKENDS)
def test_builders_equal_the_reference_on_random_forests(backend):
    rows = random_rows(0, 40, 30)
    trees = sk.TreeBatch.from_heads(rows, leak_free=True, backend=backend)
    N = trees.max_len
    assert torch.equal(trees.distance, expected_batch(rows, N))
    # depth and segment are the whole tree's.
    plain = sk.TreeBatch.from_heads(rows)
    assert torch.equal(trees.depth, plain.depth) and torch.equal(trees.segment, plain.segment)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_heads_with_lengths_padding_and_n1(backend):
    rng = random.Random(5)
    rows = [random_forest(rng, 9, num_trees=2), [-1], [], random_forest(rng, 4)]
    N = 11
    heads = torch.full((len(rows), N), -1, dtype=torch.int64)
    for b, row in enumerate(rows):
        heads[b, :len(row)] = torch.tensor(row, dtype=torch.int64)
        heads[b, len(row):] = 0  # padding entries are ignored, whatever they hold
    lengths = torch.tensor([len(r) for r in rows])
    trees = sk.TreeBatch.from_heads(heads, lengths, leak_free=True, backend=backend)
    assert torch.equal(trees.distance, expected_batch(rows, N))
    assert trees.distance[1, 0, 0] == 0 and trees.depth[2].eq(-1).all()
    assert torch.equal(sk.tree_distance(heads, lengths, leak_free=True, backend=backend), expected_batch(rows, N))


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_chains_saturate_at_max_path(backend):
    n = 300
    left = [-1] + list(range(n - 1))  # token i's head is i - 1: every prefix is connected
    right = list(range(1, n)) + [-1]  # token i's head is i + 1: the prefix 0..i is the chain 0 .. i
    trees = sk.TreeBatch.from_heads([left, right], leak_free=True, backend=backend)
    full = sk.tree_distance([left, right])
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for b, row in enumerate((left, right)):
        got = trees.distance[b]
        assert torch.equal(got, reference.leak_free_distance(row))
        assert torch.equal(got[lower], full[b][lower])  # every path to an earlier token stays inside 0..i
        assert got[n - 1, 0] == MAX_PATH and got[MAX_PATH, 0] == MAX_PATH and got[MAX_PATH - 1, 0] == MAX_PATH - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_upper_triangle_is_unreachable_and_diagonal_zero(backend):
    rows = random_rows(3, 20, 25)
    trees = sk.TreeBatch.from_heads(rows, leak_free=True, backend=backend)
    N = trees.max_len
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
    assert trees.distance[:, upper].eq(UNREACHABLE).all()
    for b, row in enumerate(rows):
        diagonal = trees.distance[b].diagonal()
        assert diagonal[:len(row)].eq(0).all() and diagonal[len(row):].eq(UNREACHABLE).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_equal_the_whole_tree_when_every_head_is_earlier(backend):
    # Every head earlier than its token: every prefix is one tree and its paths stay inside it.
    rng = random.Random(7)
    rows = [[-1] + [rng.randrange(i) for i in range(1, n)] for n in (1, 2, 17, 40)]
    trees = sk.TreeBatch.from_heads(rows, leak_free=True, backend=backend)
    full = sk.tree_distance(rows)
    N = trees.max_len
    lower = torch.tril(torch.ones(N, N, dtype=torch.bool))
    assert torch.equal(trees.distance[:, lower], full[:, lower])


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_later_heads_never_changes_an_earlier_row(backend):
    rng = random.Random(11)
    leaked = checked = 0
    for trial in range(12):
        n = rng.randint(2, 30)
        heads = random_forest(rng, n, num_trees=rng.choice([1, 2]))
        # Every cut t, each with a few re-attachments of the tokens after it, built in one batch.
        cuts = [t for t in range(n - 1) for _ in range(3)]
        others = [reattach_later(rng, heads, t) for t in cuts]
        assert all(other[:t + 1] == heads[:t + 1] for t, other in zip(cuts, others))
        built = sk.TreeBatch.from_heads([heads] + others, leak_free=True, backend=backend).distance
        full = sk.tree_distance([heads] + others)
        for index, t in enumerate(cuts, start=1):
            assert torch.equal(built[0, :t + 1], built[index, :t + 1]), f"trial {trial}: rows 0..{t} changed"
            # The whole-tree distance does leak: its earlier rows change with the later heads (the test has teeth).
            leaked += not torch.equal(full[0, :t + 1], full[index, :t + 1])
            checked += 1
    assert leaked > checked // 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_heads_raise_the_builders_errors(backend):
    with pytest.raises(ValueError, match="batch item 1, token 2: head 7 out of range"):
        sk.TreeBatch.from_heads([[-1, 0], [-1, 0, 7]], leak_free=True, backend=backend)
    with pytest.raises(ValueError, match="batch item 0, token 0: on a cycle"):
        sk.TreeBatch.from_heads([[1, 0, -1]], leak_free=True, backend=backend)
    with pytest.raises(ValueError, match="sequence 1, token 1: self-loop"):
        sk.PackedTreeBatch.from_heads([[-1], [-1, 1]], leak_free=True, backend=backend)


def test_cuda_backend_is_refused():
    with pytest.raises(ValueError, match="no CUDA builder"):
        sk.TreeBatch.from_heads([[-1, 0]], leak_free=True, backend="cuda")


@needs_cpp
def test_threads_give_the_same_result():
    rows = random_rows(13, 200, 60)
    heads, lengths = sk.trees.normalize_heads(rows)
    one = _ext.load().leak_free_tree_distance(heads, lengths, 1)
    four = _ext.load().leak_free_tree_distance(heads, lengths, 4)
    assert all(torch.equal(x, y) for x, y in zip(one, four))


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_builder_equals_the_reference(backend):
    rows = random_rows(17, 25, 30)
    packed = sk.PackedTreeBatch.from_heads(rows, leak_free=True, backend=backend)
    assert packed.leak_free and not packed.symmetric
    for s, row in enumerate(rows):
        assert torch.equal(packed.sequence_distance(s), reference.leak_free_distance(row).view(len(row), len(row)))
    padded = packed.to_padded()
    assert padded.leak_free and torch.equal(padded.distance, expected_batch(rows, packed.max_seqlen))
    # TreeBatch.from_heads(..., packed=True) and from_batch keep the option.
    assert torch.equal(sk.TreeBatch.from_heads(rows, packed=True, leak_free=True).distance, packed.distance)
    assert torch.equal(sk.PackedTreeBatch.from_batch(padded).distance, packed.distance)


# ------------------------------------------------------------------------------------------------ the plan


def test_the_plan_is_not_symmetric_and_survives_moves():
    rows = random_rows(19, 6, 12)
    trees = sk.TreeBatch.from_heads(rows, leak_free=True)
    assert trees.leak_free and not trees.symmetric
    assert not is_tree_distance(trees.distance)  # the mark means "symmetric"
    assert not is_tree_distance(sk.tree_distance(rows, leak_free=True))
    for moved in (trees.to("cpu"), pickle.loads(pickle.dumps(trees))):
        assert moved.leak_free and not moved.symmetric and not is_tree_distance(moved.distance)
        assert torch.equal(moved.distance, trees.distance)
    transposed = trees.transposed_distance()
    assert torch.equal(transposed, trees.distance.transpose(1, 2))
    plain = sk.TreeBatch.from_heads(rows)
    assert plain.symmetric and not plain.leak_free and is_tree_distance(plain.distance)


def test_edge_lists_and_masks_are_refused():
    trees = sk.TreeBatch.from_heads([[-1, 0, 0]], leak_free=True)
    packed = sk.PackedTreeBatch.from_heads([[-1, 0, 0]], leak_free=True)
    for batch in (trees, packed):
        with pytest.raises(ValueError, match="relation_lists: a leak-free batch"):
            batch.relation_lists(sk.MaskSpec())
        with pytest.raises(ValueError, match="window_lists: a leak-free batch"):
            batch.window_lists(2)
    with pytest.raises(ValueError, match="leak-free TreeBatch"):
        reference.syntax_masks(trees, sk.MaskSpec())


def test_collator_passes_the_option():
    items = [{"input_ids": [5, 6, 7], "heads": [2, 2, -1]}, {"input_ids": [8], "heads": [-1]}]
    out = sk.trees.TreeCollator(leak_free=True)(items)
    assert out["trees"].leak_free
    assert torch.equal(out["trees"].distance, expected_batch([it["heads"] for it in items], 3))
    packed = sk.trees.TreeCollator(leak_free=True, packed=True)(items)["trees"]
    assert packed.leak_free and torch.equal(packed.sequence_distance(0), reference.leak_free_distance([2, 2, -1]))
    assert not sk.trees.TreeCollator()(items)["trees"].leak_free
    with pytest.raises(ValueError, match="leak_free does not combine"):
        sk.trees.TreeCollator(leak_free=True, windows=(2,))


# ------------------------------------------------------------------------------------------------ attention


def leak_free_case(B, H, N, D, lengths, seed=0):
    """A bias-attention case whose structure is a leak-free TreeBatch (``case["distance"]``) and its distance tensor
    (``case["tensor"]``, for the reference)."""
    rng = random.Random(seed)
    rows = [random_forest(rng, n, num_trees=2) for n in lengths]
    case = bias_attention_case(B, H, N, D, torch.float32, lengths=lengths, heads=rows, seed=seed, per_head=True)
    heads = torch.full((B, N), -1, dtype=torch.int64)
    for b, row in enumerate(rows):
        heads[b, :len(row)] = torch.tensor(row, dtype=torch.int64)
    trees = sk.TreeBatch.from_heads(heads, case["lengths"], leak_free=True)
    case["distance"], case["tensor"] = trees, trees.distance.contiguous()
    return case


def reference_results(case, dtype, grad_out, **kw):
    ref_case = dict(case, distance=case["tensor"])
    return bias_attention_grads(reference.syntax_bias_attention, ref_case, dtype, grad_out, **kw)


@pytest.mark.parametrize("backend", [pytest.param("auto", marks=needs_cpp), "reference"])
def test_causal_bias_attention_on_a_leak_free_batch(backend):
    case = leak_free_case(3, 2, 37, 32, [37, 20, 1])
    grad_out = torch.randn(3, 2, 37, 32, generator=torch.Generator().manual_seed(2))
    kw = dict(causal=True)
    got = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, grad_out, backend=backend, **kw)
    ref64 = reference_results(case, torch.float64, grad_out, **kw)
    ref32 = reference_results(case, torch.float32, grad_out, **kw)
    assert_bias_attention_close(case, got, ref64, ref32, torch.float32)


@needs_triton
def test_causal_bias_attention_triton_reads_the_transposed_copy():
    # N = 70: the tiled backward (the one-tile kernels of short rows read the distance row-wise, whatever its symmetry).
    case = leak_free_case(2, 2, 70, 32, [70, 41], seed=3)
    grad_out = torch.randn(2, 2, 70, 32, generator=torch.Generator().manual_seed(4))
    kw = dict(causal=True)
    got = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, grad_out, device=KERNEL_DEVICE,
                               backend="triton", **kw)
    got = (got[0].cpu(), {name: g.cpu() for name, g in got[1].items()})
    ref64 = reference_results(case, torch.float64, grad_out, **kw)
    ref32 = reference_results(case, torch.float32, grad_out, **kw)
    assert_bias_attention_close(case, got, ref64, ref32, torch.float32)
    # Claiming symmetry (the dK/dV kernel then reads the distance itself at [b, j, i], 255 above the diagonal) gives
    # other key gradients: the transposed copy is what makes them exact.
    wrong = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, grad_out, device=KERNEL_DEVICE,
                                 backend="triton", symmetric=True, **kw)
    for name in ("dk", "dv"):
        assert (wrong[1][name].cpu() - ref64[1][name]).abs().max() > 0.1


@pytest.mark.parametrize("backend", [pytest.param("auto", marks=needs_cpp), "reference"])
def test_packed_causal_bias_attention_matches_the_padded_batch(backend):
    rng = random.Random(23)
    rows = [random_forest(rng, n, num_trees=2) for n in (13, 1, 8)]
    packed = sk.PackedTreeBatch.from_heads(rows, leak_free=True)
    padded = packed.to_padded()
    H, D, T = 2, 16, packed.num_tokens
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(T, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(sk.BucketSpec().num_buckets, generator=gen, dtype=torch.float64, requires_grad=True)
    out = sk.syntax_bias_attention(q, k, v, packed, table, buckets=sk.BucketSpec(), causal=True, backend=backend)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, table))

    lengths = packed.lengths()
    S, N = len(rows), packed.max_seqlen
    keep = torch.arange(N)[None, :] < lengths[:, None]

    def lay_out(x):
        y = x.new_zeros(S, N, H, D)
        y[keep] = x
        return y.transpose(1, 2)

    ref = reference.syntax_bias_attention(lay_out(q), lay_out(k), lay_out(v), padded.distance.contiguous(), table,
                                          buckets=sk.BucketSpec(), lengths=lengths, causal=True)
    ref = ref.transpose(1, 2)[keep]
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, table))
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_subnetwork_attention_refuses_a_leak_free_batch():
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1]], leak_free=True)
    q = torch.randn(1, 1, 4, 8)
    for masks in (sk.MaskSpec(), sk.MaskSpec(parent=False, child=False, sibling=False, pairwise=True, full=True)):
        with pytest.raises(ValueError, match="leak-free"):
            sk.syntax_subnetwork_attention(q, q, q, trees, masks)
