"""sk.trees.align_edges_to_tokens / align_edges_batch: a word-level graph (an enhanced UD graph) on subword tokens.

Checked: a hand-worked example (pieces, special tokens, an empty node contracted); the invariant that a tree given
as its edges gives, undirected, the same token distance as ``align_to_tokens`` + ``TreeBatch`` (random trees and
tokenisations, with and without special tokens, several sentences, truncation with ``missing_words="reattach"``,
roots given or inferred); why ``roots`` is named (a root with an incoming edge); the errors; the batch form with
an attention mask; and benchmarks/enhanced_miniature.py end to end on two steps.
"""
import importlib.util
import json
import pathlib
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.trees import align_edges_batch, align_edges_to_tokens, align_to_tokens

# Words w0..w3 and one empty node (node 4); w1 is the root, w3's only head is the empty node: 1 -> 4 -> 3.
EDGES = [(1, 0), (1, 4), (4, 3), (3, 2)]
# [CLS] w0 w1 w1 w2 w3 w3 [SEP]
WORD_IDS = [None, 0, 1, 1, 2, 3, 3, None]


def test_hand_checked_example():
    edges = align_edges_to_tokens(EDGES, 5, WORD_IDS, num_words=4, roots=[1])
    # w1 -> w0 and (through the empty node) w1 -> w3 on first pieces; w3 -> w2; [CLS] -> root w1 and -> [SEP];
    # the second pieces hang from the first.
    assert edges == [(2, 1), (2, 5), (5, 4), (0, 2), (0, 7), (2, 3), (5, 6)]
    d = sk.GraphBatch.from_edges([edges], [8]).distance[0]
    assert d[4].tolist() == [3, 3, 2, 3, 0, 1, 2, 4]  # w2: w2 - w3 - w1 - [CLS] - [SEP]
    directed = sk.GraphBatch.from_edges([edges], [8], directed=True).distance[0]
    assert directed[0, 4] == 3 and directed[4, 0] == 255


def _random_tree(rng, n):
    heads = [-1] * n
    order = list(range(n))
    rng.shuffle(order)
    for k, w in enumerate(order[1:], 1):
        heads[w] = order[rng.randrange(k)]
    return heads


def _word_ids(rng, n, specials):
    ids = [None] if specials else []
    for w in range(n):
        ids += [w] * rng.choice([1, 1, 2, 3])
    return ids + ([None] if specials else [])


def _tree_distance(text, word_ids, missing_words="error"):
    heads = align_to_tokens(text, word_ids, missing_words=missing_words)
    return sk.TreeBatch.from_heads([heads]).distance[0].long()


def _graph_distance(text, word_ids, roots_given, missing_words="error"):
    heads, offset, edges, roots = [], 0, [], []
    for sentence in text:
        for i, h in enumerate(sentence):
            if h >= 0:
                edges.append((h + offset, i + offset))
            else:
                roots.append(i + offset)
        offset += len(sentence)
    token_edges = align_edges_to_tokens(edges, offset, word_ids, roots=roots if roots_given else None,
                                        missing_words=missing_words)
    n = len(word_ids)
    return sk.GraphBatch.from_edges([token_edges], [n], size=n).distance[0].long()


@pytest.mark.parametrize("specials", [True, False])
@pytest.mark.parametrize("roots_given", [True, False])
def test_a_tree_as_edges_gives_the_tree_distance(specials, roots_given):
    rng = random.Random(7)
    for _ in range(40):
        text = [_random_tree(rng, rng.randint(1, 9)) for _ in range(rng.randint(1, 3))]
        word_ids = _word_ids(rng, sum(map(len, text)), specials)
        assert torch.equal(_graph_distance(text, word_ids, roots_given), _tree_distance(text, word_ids))


def test_truncated_tree_reattaches_as_align_to_tokens():
    rng = random.Random(3)
    for _ in range(40):
        text = [_random_tree(rng, rng.randint(2, 9))]
        word_ids = _word_ids(rng, len(text[0]), True)
        cut = rng.randint(2, len(word_ids) - 1)
        truncated = word_ids[:cut] + [None]  # the tokenizer keeps [SEP] after cutting the text
        assert torch.equal(_graph_distance(text, truncated, True, "reattach"),
                           _tree_distance(text, truncated, "reattach"))


def test_roots_are_named_because_a_root_can_have_an_incoming_edge():
    # 0 -> 1 and 1 -> 0 (a relative clause's subject pointing back to its head): no node without a head.
    inferred = align_edges_to_tokens([(0, 1), (1, 0)], 2, [None, 0, 1, None])
    named = align_edges_to_tokens([(0, 1), (1, 0)], 2, [None, 0, 1, None], roots=[0])
    assert (0, 1) not in inferred and (0, 1) in named
    d = sk.GraphBatch.from_edges([named], [4]).distance[0]
    assert d[0].tolist() == [0, 1, 2, 1]


def test_an_empty_root_passes_the_root_on():
    edges = align_edges_to_tokens([(2, 0), (2, 1)], 3, [None, 0, 1], num_words=2, roots=[2])
    assert sorted(edges) == [(0, 1), (0, 2)]


@pytest.mark.parametrize("call, message", [
    (lambda: align_edges_to_tokens([(0, 5)], 3, [None, 0, 1, 2]), r"edge 0: \(0, 5\): target 5 out of range"),
    (lambda: align_edges_to_tokens([(0, 1, 2)], 3, [None, 0, 1, 2]), r"edge 0: .* is not a pair of ints"),
    (lambda: align_edges_to_tokens([(0, 1)], 3, [None, 0, 1, 3]), r"word_ids\[3\] = 3 out of range"),
    (lambda: align_edges_to_tokens([(0, 1)], 3, [None, 0, 1]), r"no token for word\(s\) 2"),
    (lambda: align_edges_to_tokens([(0, 1)], 2, [None, 0, 1], num_words=3), r"num_words must be"),
    (lambda: align_edges_to_tokens([(0, 1)], 2, [None, 0, 1], roots=[2]), r"roots: 2 out of range"),
    (lambda: align_edges_to_tokens([(0, 1)], 2, [None, 0, 1], missing_words="drop"), r"missing_words"),
    (lambda: align_edges_batch([dict(edges=[(0, 1)], num_nodes=2), dict(edges=[(0, 4)], num_nodes=2)],
                               [[None, 0, 1], [None, 0, 1]]), r"^batch item 1: edge 0: \(0, 4\)"),
    (lambda: align_edges_batch([[(0, 1)]], [[None, 0, 1]]), r"batch item 0: expected a mapping"),
    (lambda: align_edges_batch([dict(edges=[], num_nodes=1)], [[None, 0], [None, 0]]), r"graphs has 1 items"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_batch_cuts_padding_by_the_attention_mask():
    graphs = [dict(edges=[(1, 0)], num_nodes=2), dict(edges=EDGES, num_nodes=5, num_words=4, roots=[1])]
    word_ids = [[None, 0, 1, None, None, None, None, None], WORD_IDS]
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0], [1] * 8])
    edges, lengths = align_edges_batch(graphs, word_ids, attention_mask=mask)
    assert lengths.tolist() == [4, 8]
    assert edges[0] == [(2, 1), (0, 2), (0, 3)] and edges[1] == align_edges_to_tokens(EDGES, 5, WORD_IDS,
                                                                                      num_words=4, roots=[1])


def _miniature():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "enhanced_miniature.py"
    spec = importlib.util.spec_from_file_location("enhanced_miniature", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_enhanced_miniature_says_what_is_missing(tmp_path, capsys):
    module = _miniature()
    assert module.main(["--data", str(tmp_path / "none.conllu")]) == 0
    assert "enhanced_miniature" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["--runs", "basic,tree"])
    assert "unknown run 'tree'" in capsys.readouterr().err


@pytest.mark.long_on_cpu
def test_enhanced_miniature_runs(ud_dev_path, tmp_path):
    """benchmarks/enhanced_miniature.py end to end on two steps (its figures: benchmarks/RESULTS.md)."""
    pytest.importorskip("transformers")
    pytest.importorskip("all_minilm_l6_v2")
    module = _miniature()
    out = tmp_path / "runs.json"
    assert module.main(["--data", str(ud_dev_path), "--steps", "2", "--held-out", "20", "--runs",
                        "basic,enhanced,both", "--threads", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["basic", "enhanced", "both"]
    for row in results.values():
        assert 0.0 <= row["accuracy"] <= 1.0 and row["words"] > 0
    assert len(results["both"]["bias_max_and_scales_per_syntax_layer"][0][1]) == 2  # two relations
