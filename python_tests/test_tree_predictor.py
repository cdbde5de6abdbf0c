"""TreePredictor: biaffine arc scores, the head cross-entropy on gold trees, decoding to valid TreeBatches."""
import math

import pytest
import torch

from syntaxkernels.nn import TreePredictor
from syntaxkernels.trees import TreeBatch, decode_tree


def random_heads(n, generator):
    """A random single-rooted tree over n words: each word after a random first one attaches to an earlier one
    of a random order."""
    order = torch.randperm(n, generator=generator).tolist()
    heads = [-1] * n
    for k in range(1, n):
        heads[order[k]] = order[int(torch.randint(0, k, (1,), generator=generator))]
    return heads


def padded(rows, N):
    return torch.tensor([row + [-1] * (N - len(row)) for row in rows])


def test_scores_shape_diagonal_and_padding_mask():
    torch.manual_seed(0)
    model = TreePredictor(8, 16)
    torch.nn.init.normal_(model.weight)
    torch.nn.init.normal_(model.root)
    hidden = torch.randn(3, 5, 8)
    lengths = torch.tensor([5, 2, 0])
    scores = model(hidden, lengths)
    assert scores.shape == (3, 5, 5)
    for b, n in enumerate(lengths.tolist()):
        assert torch.isfinite(scores[b, :n, :n]).all()
        assert torch.isneginf(scores[b, n:, :]).all() and torch.isneginf(scores[b, :, n:]).all()
    # the diagonal is the root score b_d . r + r_0, independent of the other words
    dep = torch.nn.functional.leaky_relu(model.dep_mlp(hidden), 0.1)
    assert torch.allclose(scores[0].diagonal(), dep[0] @ model.root + model.root_bias, atol=1e-5)
    # padding never changes a real item's scores
    changed = hidden.clone()
    changed[1, 2:] = 100.0
    assert torch.equal(model(changed, lengths)[1, :2, :2], scores[1, :2, :2])


def test_loss_matches_explicit_cross_entropy_and_ignores_padding():
    torch.manual_seed(1)
    model = TreePredictor(6, 8)
    torch.nn.init.normal_(model.weight)
    hidden = torch.randn(2, 4, 6, requires_grad=True)
    heads = padded([[1, -1, 1, 2], [-1, 0]], 4)
    lengths = torch.tensor([4, 2])
    loss = model.loss(hidden, heads, lengths)
    scores = model(hidden, lengths)
    terms = []
    for b, n in enumerate(lengths.tolist()):
        for d in range(n):
            target = d if heads[b, d] < 0 else int(heads[b, d])
            terms.append(-torch.log_softmax(scores[b, :n, d], dim=0)[target])
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-6)
    loss.backward()
    assert torch.isfinite(hidden.grad).all()
    assert hidden.grad[1, 2:].abs().max() == 0  # padding words get no gradient
    # a TreeBatch gives the same loss
    trees = TreeBatch.from_heads(heads, lengths)
    assert torch.allclose(model.loss(hidden, trees), loss)


def test_loss_errors_name_item_and_word():
    model = TreePredictor(4, 4)
    with pytest.raises(ValueError, match=r"batch item 1, word 0: gold head 3 out of range"):
        model.loss(torch.randn(2, 3, 4), torch.tensor([[-1, 0, 0], [3, -1, 0]]))
    with pytest.raises(ValueError, match=r"batch item 0, word 2: gold head 2"):
        model.loss(torch.randn(1, 3, 4), torch.tensor([[-1, 0, 2]]))
    with pytest.raises(ValueError, match=r"batch item 0: lengths\[0\] = 4 is out of range"):
        model(torch.randn(1, 3, 4), torch.tensor([4]))


def test_learns_toy_trees_and_predicts_valid_ones():
    # Each word's features carry its own random identity and (as a separate block) its head's identity: the
    # scorer must learn to match a dependent's "head slot" with the head's "identity"; the root word has a flag.
    generator = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    dim, N, B = 16, 7, 48
    rows, hidden = [], torch.zeros(B, N, 2 * dim + 1)
    lengths = torch.randint(2, N + 1, (B,), generator=generator)
    for b in range(B):
        n = int(lengths[b])
        heads = random_heads(n, generator)
        rows.append(heads)
        ids = torch.randn(n, dim, generator=generator)
        hidden[b, :n, :dim] = ids
        for d, h in enumerate(heads):
            if h < 0:
                hidden[b, d, -1] = 1.0
            else:
                hidden[b, d, dim:2 * dim] = ids[h]
    gold = padded(rows, N)
    model = TreePredictor(2 * dim + 1, 32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        optimizer.zero_grad()
        loss = model.loss(hidden, gold, lengths)
        first = loss.item() if first is None else first
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.25 * first
    trees = model.predict(hidden, lengths)
    assert isinstance(trees, TreeBatch)
    assert trees.lengths.tolist() == lengths.tolist()
    correct = total = 0
    for b in range(B):
        n = int(lengths[b])
        predicted = trees.heads[b, :n].tolist()
        assert sum(h == -1 for h in predicted) == 1
        correct += sum(p == g for p, g in zip(predicted, rows[b]))
        total += n
    assert correct / total > 0.9


def test_predict_is_the_decoded_tree_of_the_scores():
    torch.manual_seed(3)
    model = TreePredictor(5, 6)
    torch.nn.init.normal_(model.weight)
    hidden = torch.randn(4, 6, 5)
    lengths = torch.tensor([6, 1, 3, 0])
    trees = model.predict(hidden, lengths)
    expected = decode_tree(model(hidden, lengths), lengths, backend="python")
    assert torch.equal(trees.heads, expected)
    assert not math.isnan(model.loss(hidden, trees).item())
