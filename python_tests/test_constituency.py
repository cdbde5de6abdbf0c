"""Constituency trees: PTB brackets and stanza parses, Collins's head rules to dependency heads (then every op takes
them, padded and packed), and distances through the phrase nodes for the ops that take a distance."""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.trees import PhraseTree, constituency_distance, from_stanza_constituency, read_brackets

PTB = """
( (S (NP-SBJ-1 (DT The) (JJ quick) (NN dog))
     (VP (VBD saw)
         (NP (PRP her))
         (PP (IN in) (NP (DT the) (NN park)))
         (S (NP-SBJ (-NONE- *-1)) (VP (TO to) (VP (VB play)))))
     (. .)) )
(S (NP (NNP John) (POS 's) (NN dog)) (VP (VBZ barks)))
"""


def test_read_brackets_and_collins_heads():
    first, second = read_brackets(PTB)
    assert first.words == ["The", "quick", "dog", "saw", "her", "in", "the", "park", "to", "play", "."]
    assert first.tags[:3] == ["DT", "JJ", "NN"] and "-NONE-" not in first.tags
    assert first.labels[0] == "S" and first.labels[1] == "NP-SBJ-1"  # function tags kept in the labels
    # S -> VP (left: TO IN VP ...), VP -> VBD, NP -> the last noun, PP -> IN (right), inner S -> VP -> TO
    assert first.heads() == [2, 2, 3, -1, 3, 3, 7, 5, 3, 8, 3]
    # Collins's NP rule on a flat (NP John 's dog): no final POS, so the first noun from the right, "dog", heads
    assert second.heads() == [2, 2, 3, -1]
    (possessive,) = read_brackets("(NP (NP (NNP John) (POS 's)) (NN dog))")
    assert possessive.heads() == [1, 2, -1]  # a final POS heads the inner NP; the outer NP's noun heads it

    assert first.heads("left")[0] == -1 and first.heads("right")[-1] == -1
    # str round trip
    assert read_brackets(str(first))[0].heads() == first.heads()


def test_unknown_labels_and_sst_trees():
    (sst,) = read_brackets("(3 (2 It) (4 (2 's) (3 (2 a) (4 (4 good) (2 film)))))")
    assert sst.words == ["It", "'s", "a", "good", "film"]
    assert sst.heads("collins") == [-1, 0, 1, 2, 3]  # unknown labels: the first child heads
    assert sst.heads("right") == [4, 4, 4, 4, -1]


def _path_length(tree: PhraseTree, a: int, b: int) -> int:
    """Edges between two nodes: up from each to their lowest common ancestor."""
    up = {}
    node, d = a, 0
    while node >= 0:
        up[node] = d
        node, d = tree.parents[node], d + 1
    node, d = b, 0
    while node not in up:
        node, d = tree.parents[node], d + 1
    return up[node] + d


def test_phrase_distance_is_the_path_through_phrase_nodes():
    for tree in read_brackets(PTB):
        got = tree.phrase_distance()
        n = len(tree)
        want = torch.tensor([[_path_length(tree, i, j) for j in range(n)] for i in range(n)], dtype=torch.uint8)
        assert torch.equal(got, want)
    batch = constituency_distance(read_brackets(PTB))
    assert batch.shape == (2, 11, 11) and (batch[1, 4:] == 255).all() and (batch[1, :, 4:] == 255).all()


def test_token_level_phrase_distance():
    (tree,) = read_brackets("(S (NP (DT The) (NN dog)) (VP (VBZ barks)))")
    word_ids = [None, 0, 1, 1, 2, None]  # [CLS] The dog ##s barks [SEP]
    d = constituency_distance([tree], [word_ids])[0]
    words = tree.phrase_distance()
    first = {0: 1, 1: 2, 2: 4}
    for a in range(3):
        for b in range(3):
            assert d[first[a], first[b]] == words[a, b]
    assert d[2, 3] == 1 and d[0, 5] == 1 and d[0, 1] == 3  # piece -> first piece; [SEP] -> [CLS] -> S -> NP -> The
    with pytest.raises(ValueError, match="no token for word"):
        constituency_distance([tree], [[None, 0, 1, None]])


def test_stanza_constituency_parses():
    tree_reader = pytest.importorskip("stanza.models.constituency.tree_reader")
    from stanza.models.common.doc import Document

    text = "(ROOT (S (NP (NNS Dogs)) (VP (VBP bark) (ADVP (RB loudly))) (. .)))"
    doc = Document([[{"id": i + 1, "text": w} for i, w in enumerate(["Dogs", "bark", "loudly", "."])]])
    doc.sentences[0].constituency = tree_reader.read_trees(text)[0]
    (tree,) = from_stanza_constituency(doc)
    (same,) = read_brackets(text)
    assert tree.words == same.words == ["Dogs", "bark", "loudly", "."]
    assert tree.heads() == same.heads() == [1, -1, 1, 1]
    assert torch.equal(tree.phrase_distance(), same.phrase_distance())
    with pytest.raises(TypeError, match="stanza"):
        from_stanza_constituency(42)


def test_head_rule_trees_run_every_op_padded_and_packed():
    """Sentences from constituency trees are dependency trees: TreeBatch and PackedTreeBatch, the bias, the window
    and the sub-networks take them; packed equals padded."""
    trees = read_brackets(PTB)
    sentences = [t.to_sentence() for t in trees]
    assert sentences[0].upos[:4] == ["DET", "ADJ", "NOUN", "VERB"]
    rows = [s.heads for s in sentences]
    padded, packed = sk.TreeBatch.from_heads(rows), sk.TreeBatch.from_heads(rows, packed=True)
    x = torch.randn(2, 11, 16)
    flat = sk.trees.pack_padded(x, padded.lengths)[None]
    modules = [sk.nn.SyntaxBiasedSelfAttention(16, 2), sk.nn.SyntaxBertSelfAttention(16, 2, variant="package"),
               sk.nn.SyntaxGAT(16, num_layers=1, num_heads=2, head_dim=4, window=2)]
    for m in modules:
        torch.testing.assert_close(m(flat, packed)[0], sk.trees.pack_padded(m(x, padded), padded.lengths),
                                   atol=1e-5, rtol=1e-5)


def test_phrase_distance_feeds_the_bias_and_the_window():
    trees = read_brackets(PTB)
    distance = constituency_distance(trees)
    lengths = torch.tensor([len(t) for t in trees])
    q, k, v = (torch.randn(2, 2, 11, 8, dtype=torch.float64) for _ in range(3))
    buckets = sk.BucketSpec(max_distance=6)
    table = torch.randn(buckets.num_buckets, dtype=torch.float64)
    want = sk.reference.syntax_bias_attention(q, k, v, distance, table, buckets=buckets, lengths=lengths)
    got = sk.nn.DistanceBias(2, buckets, backend="auto").double()
    with torch.no_grad():
        got.distance_bias.copy_(table)
    torch.testing.assert_close(got.attend(q, k, v, distance, lengths), want)
    gat = sk.nn.SyntaxGAT(8, num_layers=1, num_heads=2, head_dim=4, window=3).double()
    out = gat(torch.randn(2, 11, 8, dtype=torch.float64), distance, lengths=lengths)
    assert out.shape == (2, 11, 8) and (out[1, 4:] == 0).all()


def test_bad_brackets():
    for text, message in [("(S (NP a)", "unclosed"), ("(S a))", "unbalanced"), ("a (S b)", "outside")]:
        with pytest.raises(ValueError, match=message):
            read_brackets(text)


def test_brackets_from_a_file(tmp_path):
    path = tmp_path / "trees.mrg"
    path.write_text(PTB)
    assert [t.words for t in read_brackets(path)] == [t.words for t in read_brackets(PTB)]
    assert [t.words for t in read_brackets(str(path))] == [t.words for t in read_brackets(PTB)]
