"""Code as a structure source: ``sk.trees.from_tree_sitter`` against a plain-Python oracle (every named node of the
tree-sitter tree, each token a leaf child of the smallest named node covering it, a breadth-first search over that
graph), on snippets and on this package's own source files; tokens spanning several nodes, whitespace tokens,
special tokens, unicode (byte and character offsets), errors; and the distance-bias attention on the plan against
the float64 reference (C++ path)."""
import random
import re
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

tree_sitter = pytest.importorskip(
    "tree_sitter", reason="needs tree-sitter and a grammar: pip install tree-sitter tree-sitter-python")
tree_sitter_python = pytest.importorskip(
    "tree_sitter_python", reason="needs the Python grammar: pip install tree-sitter-python")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import _ext, reference  # noqa: E402
from syntaxkernels.tools.testing import assert_bias_attention_close  # noqa: E402
from syntaxkernels.trees import CodeTreeBatch, from_tree_sitter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))

pytestmark = pytest.mark.usefixtures("one_thread")

SNIPPETS = [
    "def f(x):\n    return foo_bar(x) + 1\n",
    "# a comment\nimport os, sys\n\nclass A(B):\n    '''doc'''\n    x: int = 3\n\n    def m(self, *a, **k):\n"
    "        if a and not k:\n            return [i * 2 for i in a if i]\n"
    "        return {k: v for k, v in k.items()}\n",
    "x = (1 +\n     2)  # trailing\n\n\n",
    "s = 'caf\u00e9 \u65e5\u672c' + f\"{x!r:>4}\"\nnaïve = lambda y: y ** 2\n",
    "def broken(:\n    pass\n",  # an ERROR node
    "",
]


# -- the oracle ----------------------------------------------------------------------------------------------

def named_nodes(tree):
    """Every named node (the root always) by recursion over ``children``: ``[(start, end, depth, parent, type)]``,
    ``parent`` the nearest named ancestor's index."""
    out = []

    def visit(node, parent, depth):
        me = parent
        if node.is_named or parent is None:
            me = len(out)
            out.append((node.start_byte, node.end_byte, depth, parent, node.type))
            depth += 1
        for child in node.children:
            visit(child, me, depth)

    visit(tree.root_node, None, 0)
    return out


def oracle_attach(tree, nodes, spans):
    """Each span's smallest covering named node (an index into ``nodes``; None for an empty span): down from the
    root through the child covering the span (children do not overlap), the last named node met (root: 0)."""
    index = {(start, end, depth): i for i, (start, end, depth, _, _) in enumerate(nodes)}
    out = []
    for s, e in spans:
        if s == e:
            out.append(None)
            continue
        node, depth, best = tree.root_node, 0, 0
        while True:
            inside = [c for c in node.children if c.start_byte <= s and c.end_byte >= e]
            if not inside:
                break
            node = inside[0]
            if node.is_named:
                depth += 1
                best = index[(node.start_byte, node.end_byte, depth)]
        out.append(best)
    return out


def oracle_distance(nodes, attach, special, rows=None):
    """uint8 [T, T] (or the given rows): breadth-first search over the named nodes and the token leaves."""
    T = len(attach)
    K = len(nodes)
    adjacency = [[] for _ in range(K + T)]
    for i, (_, _, _, parent, _) in enumerate(nodes):
        if parent is not None:
            adjacency[i].append(parent)
            adjacency[parent].append(i)
    for t, node in enumerate(attach):
        if node is None and special == "unreachable":
            continue
        node = 0 if node is None else node
        adjacency[K + t].append(node)
        adjacency[node].append(K + t)
    rows = range(T) if rows is None else rows
    out = torch.full((len(rows), T), 255, dtype=torch.uint8)
    for r, t in enumerate(rows):
        seen = {K + t: 0}
        queue = deque([K + t])
        while queue:
            v = queue.popleft()
            for u in adjacency[v]:
                if u not in seen:
                    seen[u] = seen[v] + 1
                    queue.append(u)
        for u, d in seen.items():
            if u >= K:
                out[r, u - K] = min(d, 254)
    return out


def tokenize(text, rng=None, merge=0.0):
    """Byte spans of ``text`` (UTF-8): words split into pieces of at most 3 characters (subwords), whitespace runs,
    single other characters; with ``merge``, neighbouring spans joined at that rate (tokens spanning several
    nodes)."""
    byte_at = np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])  # character -> byte offset
    spans = []
    for m in re.finditer(r"\w+|\s+|[^\w\s]", text):
        s, e = m.span()
        if m.group().isspace() or not rng:
            spans.append((s, e))
            continue
        while s < e:
            step = min(e - s, rng.randint(1, 3))
            spans.append((s, s + step))
            s += step
    if rng and merge:
        merged = []
        for span in spans:
            if merged and rng.random() < merge:
                merged[-1] = (merged[-1][0], span[1])
            else:
                merged.append(span)
        spans = merged
    return [(int(byte_at[s]), int(byte_at[e])) for s, e in spans]


def check_item(plan, b, text, spans, special="root", rows=None):
    data = text.encode("utf-8")
    tree = PARSER.parse(data)
    nodes = named_nodes(tree)
    attach = oracle_attach(tree, nodes, spans)
    # every token attached to the smallest covering named node: same range, type and depth
    got = plan.token_nodes[b, :len(spans)] if not plan.is_packed else None
    if got is None:
        start = int(plan.cu_seqlens[b])
        got = plan.token_nodes[start:start + len(spans)]
    parents = plan.node_parents[b].tolist()
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    for t, (node, want) in enumerate(zip(got.tolist(), attach)):
        if want is None:
            assert node == -1, (b, t)
            continue
        ws, we, wdepth, _, wtype = nodes[want]
        assert (tuple(plan.node_spans[b][node].tolist()), depth[node], plan.node_types[b][node]) == \
            ((ws, we), wdepth, wtype), (b, t, spans[t])
    want = oracle_distance(nodes, attach, special, rows)
    block = plan.sequence_distance(b)
    got_rows = block if rows is None else block[list(rows)]
    assert torch.equal(got_rows, want), (b, (got_rows != want).nonzero()[:5])


# -- the builder against the oracle ------------------------------------------------------------------------

@pytest.mark.parametrize("special", ["root", "unreachable"])
@pytest.mark.parametrize("seed", [0, 1])
def test_snippets_match_the_oracle(seed, special):
    """Subword pieces, whitespace tokens, tokens spanning several nodes (merged neighbours), special tokens at
    both ends; padded and packed, one batch."""
    rng = random.Random(seed)
    batch = [tokenize(text, rng, merge=0.3 * seed) for text in SNIPPETS]
    batch = [[(0, 0)] + spans + [(0, 0)] for spans in batch]
    plan = from_tree_sitter(SNIPPETS, batch, special=special)
    packed = from_tree_sitter(SNIPPETS, batch, special=special, packed=True)
    assert isinstance(plan, CodeTreeBatch) and plan.symmetric
    assert plan.lengths.tolist() == [len(s) for s in batch]
    N = max(len(s) for s in batch)
    assert plan.distance.shape == (len(SNIPPETS), N, N) and plan.distance.stride(1) % 16 == 0
    for b, (text, spans) in enumerate(zip(SNIPPETS, batch)):
        check_item(plan, b, text, spans, special)
        check_item(packed, b, text, spans, special)
        n = len(spans)
        assert torch.all(plan.distance[b, n:] == 255) and torch.all(plan.distance[b, :, n:] == 255)
    if special == "unreachable":
        assert plan.distance[0, 0, 1] == 255 and plan.distance[0, 0, 0] == 0


def test_one_item_and_attachment_convention():
    """Two pieces of one identifier are 2 apart (both leaves of it); a keyword sits on its statement."""
    text = "def f(x):\n    return foo_bar(x)\n"
    spans = [(m.start(), m.end()) for m in re.finditer(r"[a-z]+|_[a-z]+|\S", text)]
    words = [text[s:e] for s, e in spans]
    plan = from_tree_sitter(text, spans)
    types = [plan.node_types[0][n] for n in plan.token_nodes[0].tolist()]
    foo, bar = words.index("foo"), words.index("_bar")
    assert types[foo] == types[bar] == "identifier" and plan.distance[0, foo, bar] == 2
    assert types[words.index("def")] == "function_definition" and types[words.index("return")] == "return_statement"
    # return_statement -> call -> identifier: 2 edges, plus the two leaf edges
    assert plan.distance[0, words.index("return"), foo] == 4


@pytest.mark.long_on_cpu
@pytest.mark.parametrize("path", ["syntaxkernels/trees/graph.py", "syntaxkernels/plan.py"])
def test_real_source_files(path):
    """A file of this package, subword pieces and whitespace tokens: every token's node is the smallest covering
    named node (all tokens), and the distance rows of 12 tokens match the breadth-first search."""
    text = (ROOT / path).read_text(encoding="utf-8")
    spans = tokenize(text, random.Random(3), merge=0.1)
    plan = from_tree_sitter(text, spans)
    assert plan.lengths.tolist() == [len(spans)] and len(spans) > 2000
    rows = sorted(random.Random(4).sample(range(len(spans)), 12))
    check_item(plan, 0, text, spans, rows=rows)
    assert torch.equal(plan.distance[0], plan.distance[0].T)


def test_unicode_byte_and_character_offsets_agree():
    text = SNIPPETS[3]
    spans = tokenize(text, random.Random(5))
    data = text.encode("utf-8")
    assert len(data) > len(text)
    char_of = {len(text[:i].encode("utf-8")): i for i in range(len(text) + 1)}  # byte offset -> character
    chars = [(char_of[s], char_of[e]) for s, e in spans]
    by_bytes = from_tree_sitter(data, spans)
    by_chars = from_tree_sitter(text, chars, char_offsets=True)
    assert torch.equal(by_bytes.distance, by_chars.distance)
    assert torch.equal(by_chars.token_spans[0], torch.tensor(spans))
    check_item(by_chars, 0, text, spans)
    # character offsets read as bytes land elsewhere (past the accented characters): a different attachment
    assert not torch.equal(from_tree_sitter(text, chars).token_nodes, by_chars.token_nodes)


def test_padded_offset_mapping_with_lengths():
    """A tokenizer batch's offset_mapping [B, N, 2] (padding (0, 0)) with its lengths = the per-item lists."""
    texts = SNIPPETS[:3]
    items = [[(0, 0)] + tokenize(t) + [(0, 0)] for t in texts]
    N = max(len(i) for i in items)
    mapping = torch.zeros(len(items), N, 2, dtype=torch.int64)
    for b, spans in enumerate(items):
        mapping[b, :len(spans)] = torch.tensor(spans)
    lengths = torch.tensor([len(i) for i in items])
    plan = from_tree_sitter(texts, mapping, lengths=lengths)
    want = from_tree_sitter(texts, items)
    assert torch.equal(plan.distance, want.distance) and torch.equal(plan.kernel_lengths, lengths.int())
    wide = from_tree_sitter(texts, items, size=N + 5)
    assert wide.distance.shape[1:] == (N + 5, N + 5)
    assert torch.equal(wide.distance[:, :N, :N], want.distance)


def test_language_as_language_or_parser():
    text = SNIPPETS[0]
    spans = tokenize(text)
    want = from_tree_sitter(text, spans).distance
    language = tree_sitter.Language(tree_sitter_python.language())
    assert torch.equal(from_tree_sitter(text, spans, language=language).distance, want)
    assert torch.equal(from_tree_sitter(text, spans, language=tree_sitter.Parser(language)).distance, want)


# -- errors -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spans, message", [
    ([(0, 3), (4, 99)], r"batch item 1, token 1: span \(4, 99\) out of range \(the source has 10 bytes"),
    ([(0, 3), (-1, 2)], r"batch item 1, token 1: span \(-1, 2\) out of range"),
    ([(0, 3), (5, 4)], r"batch item 1, token 1: span \(5, 4\) out of range"),
    ([(0, 3), (2, 5)], r"batch item 1, token 1: span \(2, 5\) starts before the end of token 0's span \(0, 3\)"),
    ([(4, 5), (0, 0), (0, 3)], r"batch item 1, token 2: span \(0, 3\) starts before the end of token 0's span"),
])
def test_bad_offsets_name_the_item_and_token(spans, message):
    with pytest.raises(ValueError, match=message):
        from_tree_sitter(["x = 1\n", "def f(): 1"], [[(0, 1)], spans])


def test_other_errors():
    with pytest.raises(ValueError, match=r"batch item 0, token 0: span \(0, 4\) out of range \(the source has 3 "
                                         "characters"):
        from_tree_sitter("\u00e9t\u00e9", [(0, 4)], char_offsets=True)
    with pytest.raises(ValueError, match="special must be"):
        from_tree_sitter("x", [(0, 1)], special="drop")
    with pytest.raises(ValueError, match="offsets has 1 items for 2 sources"):
        from_tree_sitter(["x", "y"], [[(0, 1)]])
    with pytest.raises(ValueError, match=r"batch item 0: lengths\[0\] = 3 is outside 0..1"):
        from_tree_sitter(["x"], [[(0, 1)]], lengths=[3])
    with pytest.raises(ValueError, match=r"batch item 0: offsets must be integer"):
        from_tree_sitter("x", [(0.0, 1.0)])
    with pytest.raises(TypeError, match="language must be"):
        from_tree_sitter("x", [(0, 1)], language=3)


def test_subnetwork_relations_are_refused():
    plan = from_tree_sitter("x = 1\n", [(0, 1), (2, 3), (4, 5)])
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(TypeError, match="CodeTreeBatch"):
        sk.syntax_subnetwork_attention(q, q, q, plan, sk.MaskSpec())


# -- the ops on the plan ------------------------------------------------------------------------------------

@pytest.mark.skipif(not (_ext.available() and hasattr(_ext.load(), "bias_attention_forward")),
                    reason="C++ extension (bias attention) not built")
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_bias_attention_on_the_plan_matches_reference(packed):
    """Forward and every gradient of the C++ path against the float64 reference on the plan's own distance."""
    from syntaxkernels.ops.bias_attention import _varlen
    from syntaxkernels.trees import pack_padded

    texts = SNIPPETS[:3]
    items = [[(0, 0)] + tokenize(t, random.Random(7)) for t in texts]
    plan = from_tree_sitter(texts, items, packed=packed)
    sizes = [len(i) for i in items]
    B, N, H, D = len(items), max(sizes), 2, 16
    gen = torch.Generator().manual_seed(0)
    buckets = sk.BucketSpec(max_distance=12, log_distance=6)
    case = dict(q=torch.randn(B, H, N, D, generator=gen), k=torch.randn(B, H, N, D, generator=gen),
                v=torch.randn(B, H, N, D, generator=gen), table=torch.randn(H, buckets.num_buckets, generator=gen),
                grad_out=torch.randn(B, H, N, D, generator=gen), lengths=torch.tensor(sizes), buckets=buckets,
                bias_scale=torch.tensor([0.9]))
    lengths = case["lengths"]

    def run(dtype, spec):
        def prep(x):
            return pack_padded(x.transpose(1, 2), lengths) if packed else x
        q, k, v = (prep(case[n]).to(dtype).requires_grad_() for n in ("q", "k", "v"))
        pdtype = torch.float64 if dtype == torch.float64 else torch.float32
        table = case["table"].to(pdtype).requires_grad_()
        c = case["bias_scale"].to(pdtype).requires_grad_()
        if not spec:
            out = sk.syntax_bias_attention(q, k, v, plan, table, buckets=buckets, bias_scale=c)
        elif packed:
            out = _varlen.reference_bias_attention_varlen(q, k, v, plan.distance, table, buckets=buckets,
                                                          cu_seqlens=plan.cu_seqlens, bias_scale=c)
        else:
            out = reference.syntax_bias_attention(q, k, v, plan.distance, table, buckets=buckets, bias_scale=c,
                                                  lengths=plan.kernel_lengths)
        grads = torch.autograd.grad(out, (q, k, v, table, c), prep(case["grad_out"]).to(dtype))
        return out, dict(zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads))

    got, ref64, ref32 = run(torch.float32, False), run(torch.float64, True), run(torch.float32, True)
    assert_bias_attention_close(case, got, ref64, ref32, torch.float32)
    assert got[1]["dtable"].abs().max() > 0
