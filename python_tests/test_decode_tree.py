"""decode_tree: the maximum spanning tree with one root word, checked against a brute-force oracle that enumerates
every head assignment forming a single-rooted tree (N <= 6), on both decoders (C++ and pure Python)."""
import itertools
import math

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _ext
from syntaxkernels.trees import TreeBatch, decode_tree

HAS_CPP = _ext.available() and hasattr(_ext.load(), "decode_tree")
BACKENDS = [pytest.param("cpp", marks=pytest.mark.skipif(not HAS_CPP, reason="C++ extension lacks decode_tree"),
                         id="cpp"), "python"]


def is_single_rooted_tree(heads):
    n = len(heads)
    if sum(h == -1 for h in heads) != 1:
        return False
    for start in range(n):
        node, steps = start, 0
        while heads[node] != -1:
            node = heads[node]
            steps += 1
            if steps > n:
                return False
    return True


def tree_score(scores, heads):
    """Total score in float64: the arc h -> d reads scores[h, d], the root word d reads scores[d, d]."""
    return sum(float(scores[d if h == -1 else h, d]) for d, h in enumerate(heads))


def oracle_best(scores):
    """The highest total score over every single-rooted tree with finite arcs (None when there is none)."""
    n = scores.shape[0]
    best = None
    choices = [[-1] + [h for h in range(n) if h != d] for d in range(n)]
    for heads in itertools.product(*choices):
        if not is_single_rooted_tree(heads):
            continue
        value = tree_score(scores, heads)
        if value == -math.inf:
            continue
        if best is None or value > best:
            best = value
    return best


def check_against_oracle(scores, heads):
    heads = heads.tolist()
    assert is_single_rooted_tree(heads), heads
    best = oracle_best(scores)
    got = tree_score(scores, heads)
    assert got == pytest.approx(best, rel=1e-9, abs=1e-9), (heads, got, best)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_random_scores_match_oracle(backend, n):
    generator = torch.Generator().manual_seed(100 + n)
    trials = 40 if n <= 5 else 6
    scores = torch.randn(trials, n, n, generator=generator)
    heads = decode_tree(scores, backend=backend)
    assert heads.shape == (trials, n) and heads.dtype == torch.int64
    for b in range(trials):
        check_against_oracle(scores[b].double(), heads[b])


@pytest.mark.parametrize("backend", BACKENDS)
def test_strong_root_scores_still_give_one_root(backend):
    # Every word prefers to be a root: an unconstrained maximum spanning tree would take several root arcs.
    generator = torch.Generator().manual_seed(7)
    scores = torch.randn(20, 5, 5, generator=generator)
    scores.diagonal(dim1=1, dim2=2).add_(5.0)
    heads = decode_tree(scores, backend=backend)
    for b in range(20):
        check_against_oracle(scores[b].double(), heads[b])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cycle_heavy_scores(backend):
    # Mutual best heads (i <-> i+1) force contractions, nested when the contracted nodes form cycles again.
    generator = torch.Generator().manual_seed(11)
    scores = torch.randn(30, 6, 6, generator=generator) * 0.1
    for i in range(0, 6, 2):
        scores[:, i, i + 1] += 3.0
        scores[:, i + 1, i] += 3.0
    scores[:, 1, 2] += 2.0
    scores[:, 3, 4] += 2.0
    scores[:, 5, 0] += 2.0
    heads = decode_tree(scores, backend=backend)
    for b in range(30):
        check_against_oracle(scores[b].double(), heads[b])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties(backend):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 3, (40, 5, 5), generator=generator).float()
    heads = decode_tree(scores, backend=backend)
    for b in range(40):
        check_against_oracle(scores[b].double(), heads[b])
    flat = decode_tree(torch.zeros(1, 6, 6), backend=backend)  # every tree ties
    assert is_single_rooted_tree(flat[0].tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_forbidden_arcs(backend):
    generator = torch.Generator().manual_seed(5)
    scores = torch.randn(30, 5, 5, generator=generator)
    forbid = torch.rand(30, 5, 5, generator=generator) < 0.4
    scores[forbid] = -math.inf
    scores[:, 0, 0] = 0.0  # word 0 may be the root and head every word: a tree always exists
    scores[:, 0, 1:] = torch.where(torch.isinf(scores[:, 0, 1:]), torch.zeros(()), scores[:, 0, 1:])
    heads = decode_tree(scores, backend=backend)
    for b in range(30):
        check_against_oracle(scores[b].double(), heads[b])
        assert all(scores[b, d if h == -1 else h, d] > -math.inf for d, h in enumerate(heads[b].tolist()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_and_lengths(backend):
    generator = torch.Generator().manual_seed(9)
    scores = torch.randn(5, 6, 6, generator=generator)
    lengths = torch.tensor([6, 3, 1, 0, 5])
    padded = scores.clone()
    for b, n in enumerate(lengths.tolist()):  # padding is never read: garbage there changes nothing
        padded[b, n:, :] = float("nan")
        padded[b, :, n:] = float("nan")
    heads = decode_tree(padded, lengths, backend=backend)
    for b, n in enumerate(lengths.tolist()):
        assert heads[b, n:].eq(-1).all()
        if n:
            check_against_oracle(scores[b, :n, :n].double(), heads[b, :n])
            alone = decode_tree(scores[b, :n, :n], backend=backend)
            assert torch.equal(alone, heads[b, :n])
    trees = TreeBatch.from_heads(heads, lengths)
    assert trees.lengths.tolist() == lengths.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_word(backend):
    assert decode_tree(torch.tensor([[[-3.0]]]), backend=backend).tolist() == [[-1]]


@pytest.mark.skipif(not HAS_CPP, reason="C++ extension lacks decode_tree")
def test_backends_agree_on_larger_sentences():
    generator = torch.Generator().manual_seed(21)
    scores = torch.randn(16, 40, 40, generator=generator)
    lengths = torch.randint(1, 41, (16,), generator=generator)
    cpp = decode_tree(scores, lengths, backend="cpp", num_threads=2)
    python = decode_tree(scores, lengths, backend="python")
    assert torch.equal(cpp, python)
    TreeBatch.from_heads(cpp, lengths)  # valid trees
    for b in range(16):
        assert sum(h == -1 for h in cpp[b, :lengths[b]].tolist()) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_item(backend):
    scores = torch.randn(3, 4, 4)
    scores[2, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"batch item 2: scores\[1, 3\] = nan"):
        decode_tree(scores, backend=backend)
    scores[2, 1, 3] = float("inf")
    scores[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"batch item 1: scores\[0, 0\] = inf"):
        decode_tree(scores, backend=backend)
    with pytest.raises(ValueError, match=r"batch item 1: lengths\[1\] = 5 is larger than N = 4"):
        decode_tree(torch.randn(2, 4, 4), torch.tensor([4, 5]), backend=backend)
    with pytest.raises(ValueError, match=r"batch item 0: lengths\[0\] = -1 is negative"):
        decode_tree(torch.randn(2, 4, 4), torch.tensor([-1, 2]), backend=backend)
    blocked = torch.randn(1, 3, 3)
    blocked[0, :, 2] = -math.inf
    with pytest.raises(ValueError, match=r"batch item 0, word 2: no allowed head"):
        decode_tree(blocked, backend=backend)
    rootless = torch.randn(2, 3, 3)
    rootless[1].diagonal().fill_(-math.inf)
    with pytest.raises(ValueError, match=r"batch item 1: the allowed arcs .* form no tree"):
        decode_tree(rootless, backend=backend)
    two_roots = torch.full((1, 3, 3), -math.inf)
    two_roots[0, 0, 0] = two_roots[0, 1, 1] = 0.0
    two_roots[0, 0, 2] = 0.0
    with pytest.raises(ValueError, match=r"batch item 0: .*single root word \(the best has 2\)"):
        decode_tree(two_roots, backend=backend)


def test_shapes_and_exports():
    assert sk.trees.decode_tree is decode_tree
    with pytest.raises(ValueError, match=r"shape \[B, N, N\]"):
        decode_tree(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="floating dtype"):
        decode_tree(torch.zeros(1, 3, 3, dtype=torch.int64))
    assert decode_tree(torch.randn(4, 4)).shape == (4,)
    assert decode_tree(torch.randn(2, 0, 0)).shape == (2, 0)


@pytest.mark.skipif(not HAS_CPP, reason="C++ extension lacks decode_tree")
def test_threads_give_the_same_trees_and_the_lowest_bad_item():
    generator = torch.Generator().manual_seed(31)
    scores = torch.randn(64, 48, 48, generator=generator)  # enough work for several threads
    lengths = torch.randint(0, 49, (64,), generator=generator)
    one = decode_tree(scores, lengths, backend="cpp", num_threads=1)
    four = decode_tree(scores, lengths, backend="cpp", num_threads=4)
    assert torch.equal(one, four)
    assert torch.equal(one[:8], decode_tree(scores[:8], lengths[:8], backend="python"))
    scores[40, 0, 1] = float("nan")
    scores[50, 0, 1] = float("nan")
    lengths[40] = lengths[50] = 48
    with pytest.raises(ValueError, match=r"batch item 40: scores\[0, 1\] = nan"):
        decode_tree(scores, lengths, backend="cpp", num_threads=4)
