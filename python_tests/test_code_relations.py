"""The code-model relations of a code plan (``sk.RelationBatch.code_model``, ``sk.trees.code_relation_distances``)
against a plain-Python oracle: the tree-sitter tree's named nodes by recursion, each token's node by descent from
the root (test_code_trees' oracle), the kept nodes, and per token pair a walk up the parents (path, ancestor,
sibling, up, down), on windows of this package's own source files, padded and packed, both ``special`` modes; then
``sk.syntax_bias_attention`` on the code batch against the float64 reference on the oracle's ``[B, R, N, N]``,
forward and every gradient (q, k, v, each relation's table and strength), padded and packed, the C++ kernels and
the Triton kernels (the interpreter on a CPU machine); the errors; one tiny model through the transformers
integration."""
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("tree_sitter", reason="needs tree-sitter and a grammar: pip install tree-sitter tree-sitter-python")
pytest.importorskip("tree_sitter_python", reason="needs the Python grammar: pip install tree-sitter-python")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import reference  # noqa: E402
from syntaxkernels.trees import RelationBatch, code_relation_buckets, code_relation_distances, pack_padded  # noqa
from syntaxkernels.trees.code_relations import CODE_RELATIONS  # noqa: E402

from conftest import CPP, KERNEL_DEVICE, needs_triton  # noqa: E402
from test_code_trees import PARSER, named_nodes, oracle_attach, tokenize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")

#: (file, first token, tokens) windows of the package's own sources
WINDOWS = [("syntaxkernels/trees/graph.py", 0, 260), ("syntaxkernels/plan.py", 900, 240),
           ("syntaxkernels/trees/code.py", 2000, 200)]
SMALL = [("syntaxkernels/trees/graph.py", 400, 38), ("syntaxkernels/plan.py", 1500, 22),
         ("syntaxkernels/specs.py", 300, 30)]

R3 = dict(relations=("path", "ancestor", "sibling"))  # the defaults: one BucketSpec(max_distance=4)
R4 = dict(relations=("path", "up", "down", "sibling"), max_sibling=1)
WIDE = dict(relations=("ancestor", "sibling"), max_ancestor=5, max_sibling=4)


def load(windows, specials=True, seed=3):
    """Texts and each item's spans: a window of subword pieces of a file, a special token at both ends."""
    texts, items = [], []
    for path, first, count in windows:
        text = (ROOT / path).read_text(encoding="utf-8")
        spans = tokenize(text, random.Random(seed), merge=0.1)[first:first + count]
        texts.append(text)
        items.append([(0, 0)] + spans + [(0, 0)] if specials else spans)
    return texts, items


# -- the oracle ----------------------------------------------------------------------------------------------

def oracle_relations(text, spans, special):
    """``{name: [[value or None]]}`` for every token pair of one item, by walking up the parents."""
    tree = PARSER.parse(text.encode("utf-8"))
    nodes = named_nodes(tree)
    attach = oracle_attach(tree, nodes, spans)
    parent = [p for _, _, _, p, _ in nodes]
    keep = {0}
    for a in attach:
        while a is not None and a not in keep:
            keep.add(a)
            a = parent[a]
    children = {}
    for n in range(len(nodes)):  # recursion order: source order
        if n in keep and parent[n] is not None:
            children.setdefault(parent[n], []).append(n)
    index = {c: k for kids in children.values() for k, c in enumerate(kids)}

    def chain(n):
        out = [n]
        while parent[out[-1]] is not None:
            out.append(parent[out[-1]])
        return out

    T = len(spans)
    out = {name: [[None] * T for _ in range(T)] for name in CODE_RELATIONS}
    for i in range(T):
        for j in range(T):
            ni, nj = attach[i], attach[j]
            if i == j:
                for name in CODE_RELATIONS:
                    out[name][i][j] = 0
                continue
            if special == "unreachable" and (ni is None or nj is None):
                continue
            ni, nj = (0 if ni is None else ni), (0 if nj is None else nj)
            up_i, up_j = chain(ni), chain(nj)
            lca = next(a for a in up_i if a in up_j)
            up, down = up_i.index(lca), up_j.index(lca)
            out["path"][i][j] = min(up + down + 2, 254)
            out["up"][i][j], out["down"][i][j] = up, down
            if nj in up_i:  # n_j an ancestor of n_i (or n_i itself): steps up
                out["ancestor"][i][j] = up_i.index(nj)
            elif ni in up_j:  # a descendant: steps down, negative
                out["ancestor"][i][j] = -up_j.index(ni)
            if ni == nj:
                out["sibling"][i][j] = 0
            elif parent[ni] is not None and parent[ni] == parent[nj]:
                out["sibling"][i][j] = index[nj] - index[ni]
    return out


def encode(values, name, m):
    """The uint8 value a relation's BucketSpec reads (module docstring of code_relations)."""
    if values is None:
        return 255
    if name in ("ancestor", "sibling"):
        return max(-m, min(m, values)) + m
    return min(values, 254)


def oracle_distances(texts, items, special, relations, max_ancestor=2, max_sibling=2, N=None):
    """uint8 ``[B, R, N, N]`` of the oracle (255 on padding)."""
    clip = {"ancestor": max_ancestor, "sibling": max_sibling}
    N = N or max(len(s) for s in items)
    out = torch.full((len(items), len(relations), N, N), 255, dtype=torch.uint8)
    for b, (text, spans) in enumerate(zip(texts, items)):
        rel = oracle_relations(text, spans, special)
        for r, name in enumerate(relations):
            T = len(spans)
            out[b, r, :T, :T] = torch.tensor([[encode(v, name, clip.get(name)) for v in row] for row in rel[name]],
                                             dtype=torch.uint8)
    return out


# -- the relations against the oracle -----------------------------------------------------------------------

@pytest.mark.long_on_cpu
@pytest.mark.parametrize("special", ["root", "unreachable"])
def test_relations_of_real_files_match_the_oracle(special):
    """Every relation (path, ancestor, sibling, up, down) on three windows of this package's sources: the R
    distances exactly, and the code of ``RelationBatch.code_model`` holding each relation's bucket; padded and
    packed; the path relation is the plan's own distance."""
    texts, items = load(WINDOWS)
    code = sk.trees.from_tree_sitter(texts, items, special=special)
    packed = sk.trees.from_tree_sitter(texts, items, special=special, packed=True)
    sizes = [len(s) for s in items]
    for options in (R3, R4, WIDE):
        names = options["relations"]
        want = oracle_distances(texts, items, special, names, options.get("max_ancestor", 2),
                                options.get("max_sibling", 2))
        distances, specs = code_relation_distances(code, **options)
        assert specs == code_relation_buckets(**options)
        got = torch.stack(distances, 1)
        for r, name in enumerate(names):
            assert torch.equal(got[:, r], want[:, r]), (name, (got[:, r] != want[:, r]).nonzero()[:5])
        plan = RelationBatch.code_model(code, **options)
        assert plan.num_relations == len(names) and plan.buckets == specs and not plan.symmetric
        assert plan.distance.stride(1) % 16 == 0
        assert torch.equal(plan.kernel_lengths, torch.tensor(sizes, dtype=torch.int32))
        for r, spec in enumerate(specs):
            valid = want[:, r] != 255
            decoded = plan.code_buckets[r][plan.distance.long()]
            assert torch.equal(decoded[valid], spec.lut()[want[:, r].long()][valid]), name
        assert torch.equal(plan.distance, RelationBatch.from_distances(want, specs, code.kernel_lengths).distance)
        packed_plan = RelationBatch.code_model(packed, **options)
        packed_distances, _ = code_relation_distances(packed, **options)
        assert packed_plan.is_packed and torch.equal(packed_plan.cu_seqlens, packed.cu_seqlens)
        for b, n in enumerate(sizes):
            assert torch.equal(packed_plan.sequence_distance(b), plan.distance[b, :n, :n]), b
            start = int(packed.distance_offsets[b])
            for r in range(len(names)):
                assert torch.equal(packed_distances[r][start:start + n * n].view(n, n), want[b, r, :n, :n])
    path = code_relation_distances(code, ("path",))[0][0]
    assert torch.equal(path, code.distance)
    assert RelationBatch.code_model(code, ("path",)).symmetric


def test_relation_values_on_a_snippet():
    """The conventions by hand: pieces of one identifier, an ancestor and a descendant, siblings, specials."""
    text = "def f(x, y):\n    return foo_bar(x) + y\n"
    spans = [(0, 3), (4, 5), (6, 7), (9, 10), (17, 23), (24, 27), (27, 31), (32, 33), (35, 36), (37, 38)]
    words = [text[s:e] for s, e in spans]
    assert words == ["def", "f", "x", "y", "return", "foo", "_bar", "x", "+", "y"]
    code = sk.trees.from_tree_sitter(text, [(0, 0)] + spans)
    (path, anc, sib, up, down), _ = code_relation_distances(code, CODE_RELATIONS, max_ancestor=5, max_sibling=5)
    at = {w: i + 1 for i, w in reversed(list(enumerate(words)))}  # the first occurrence
    foo, bar, ret, plus, x_param, y_param = at["foo"], at["_bar"], at["return"], at["+"], 3, 4

    def signed(t, i, j):
        return None if t[0, i, j] == 255 else int(t[0, i, j]) - 5
    assert path[0, foo, bar] == 2 and signed(anc, foo, bar) == 0 and signed(sib, foo, bar) == 0
    assert path[0, foo, foo] == 0 and signed(anc, foo, foo) == 0
    # return_statement -> binary_operator -> call -> identifier: foo is 3 below "return"
    assert signed(anc, foo, ret) == 3 and signed(anc, ret, foo) == -3
    assert (int(up[0, foo, ret]), int(down[0, foo, ret])) == (3, 0)
    assert (int(up[0, ret, foo]), int(down[0, ret, foo])) == (0, 3)
    # the two parameters: children 0 and 1 of the parameters node
    assert signed(sib, x_param, y_param) == 1 and signed(sib, y_param, x_param) == -1
    assert signed(anc, x_param, y_param) is None and (int(up[0, x_param, y_param]), int(down[0, x_param,
                                                                                              y_param])) == (1, 1)
    assert signed(sib, foo, plus) is None  # an identifier in the call, the operator's token on the operator
    # the special token stands at the root (module -> function_definition -> block -> return_statement)
    assert signed(anc, ret, 0) == 3 and signed(anc, 0, ret) == -3 and path[0, 0, ret] == 5
    # an item without tokens beside it: all padding (padded), nothing (packed)
    for packed in (False, True):
        both = sk.trees.from_tree_sitter(["", text], [[], [(0, 0)] + spans], packed=packed)
        plan = RelationBatch.code_model(both, CODE_RELATIONS[:3])
        alone = RelationBatch.code_model(code, CODE_RELATIONS[:3])
        assert torch.equal(plan.sequence_distance(1), alone.distance[0])
        if not packed:
            assert torch.all(plan.distance[0] == 5 * (1 + 6 + 36))  # "none" (bucket 5) in all three relations


# -- the op on the code relations against the float64 reference ---------------------------------------------

def attention_case(options, seed=0, H=2, D=16):
    texts, items = load(SMALL)
    code = sk.trees.from_tree_sitter(texts, items)
    names = options["relations"]
    specs = code_relation_buckets(**options)
    distance = oracle_distances(texts, items, "root", names, options.get("max_ancestor", 2),
                                options.get("max_sibling", 2))
    B, N = distance.shape[0], distance.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float64) for _ in range(4))
    tables = [torch.randn(H, s.num_buckets, generator=gen, dtype=torch.float64) for s in specs]
    scales = torch.linspace(0.6, 1.4, len(names), dtype=torch.float64)
    return dict(texts=texts, items=items, code=code, specs=specs, distance=distance, q=q, k=k, v=v, grad=grad,
                tables=tables, scales=scales, lengths=code.lengths, options=options)


def spec_run(case):
    """The specification: the reference on the oracle's ``[B, R, N, N]``, relation by relation, float64."""
    inputs = [case[n].clone().requires_grad_() for n in ("q", "k", "v")]
    tables = [t.clone().requires_grad_() for t in case["tables"]]
    scales = case["scales"].clone().requires_grad_()
    out = reference.syntax_bias_attention(*inputs, case["distance"], tables, buckets=case["specs"], bias_scale=scales,
                                          lengths=case["lengths"])
    return out, torch.autograd.grad(out, inputs + tables + [scales], case["grad"])


def check(got, want, atol=3e-5):
    (out, grads), (out_ref, grads_ref) = got, want
    torch.testing.assert_close(out.double().cpu(), out_ref, atol=atol, rtol=1e-4)
    assert len(grads) == len(grads_ref)
    for i, (g, r) in enumerate(zip(grads, grads_ref)):
        torch.testing.assert_close(g.double().cpu(), r, atol=atol, rtol=1e-4, msg=lambda m: f"grad {i}: {m}")
        assert r.abs().max() > 1e-3 and g.abs().max() > 0, f"gradient {i} is all zeros"


#: the Triton interpreter takes seconds per case on a CPU: both layouts and both relation sets, two cases
TRITON_SLOW = [needs_triton, pytest.mark.long_on_cpu]
ATTENTION_CASES = [pytest.param(CPP.values[0], packed, options, marks=CPP.marks, id=f"cpp-{layout}-{name}")
                   for packed, layout in ((False, "padded"), (True, "packed")) for options, name in ((R3, "R3"),
                                                                                                     (R4, "R4"))]
ATTENTION_CASES += [pytest.param(("triton", KERNEL_DEVICE), False, R4, marks=TRITON_SLOW, id="triton-padded-R4"),
                    pytest.param(("triton", KERNEL_DEVICE), True, R3, marks=TRITON_SLOW, id="triton-packed-R3")]


@pytest.mark.parametrize("path, packed, options", ATTENTION_CASES)
def test_attention_on_the_code_relations_matches_the_reference(path, packed, options):
    """Forward and the gradients of q, k, v, every relation's table and strength; packed against the padded
    reference's valid rows."""
    backend, device = path
    case = attention_case(options)
    code = sk.trees.from_tree_sitter(case["texts"], case["items"], packed=True) if packed else case["code"]
    plan = RelationBatch.code_model(code, **options).to(device)
    lengths = case["lengths"]

    def prep(x):
        return (pack_padded(x.transpose(1, 2), lengths) if packed else x).to(device, torch.float32)
    inputs = [prep(case[n]).requires_grad_() for n in ("q", "k", "v")]
    tables = [t.to(device, torch.float32).requires_grad_() for t in case["tables"]]
    scales = case["scales"].to(device, torch.float32).requires_grad_()
    out = sk.syntax_bias_attention(*inputs, plan, tables, buckets=case["specs"], bias_scale=scales, backend=backend)
    grads = torch.autograd.grad(out, inputs + tables + [scales], prep(case["grad"]))
    ref_out, ref_grads = spec_run(case)
    if packed:
        want = [pack_padded(t.transpose(1, 2), lengths) for t in [ref_out] + list(ref_grads[:3])]
        ref_out, ref_grads = want[0], tuple(want[1:]) + tuple(ref_grads[3:])
    check((out, grads), (ref_out, ref_grads))


# -- errors ---------------------------------------------------------------------------------------------------

def test_errors():
    code = sk.trees.from_tree_sitter("x = f(1)\n", [(0, 1), (4, 5), (6, 7)])
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match=r"max_ancestor must be an int in 1\.\.127"):
            RelationBatch.code_model(code, max_ancestor=bad)
    with pytest.raises(ValueError, match=r"max_sibling must be an int in 1\.\.127"):
        RelationBatch.code_model(code, max_sibling=200)
    with pytest.raises(ValueError, match=r"max_path must be an int in 1\.\.254"):
        code_relation_distances(code, max_path=0)
    with pytest.raises(ValueError, match=r"max_steps must be an int"):
        RelationBatch.code_model(code, ("up",), max_steps=0)
    with pytest.raises(ValueError, match=r"\(path 6, ancestor 6, sibling 8 buckets\) make 288 codes, more than "
                                         "the 256 one byte holds"):
        RelationBatch.code_model(code, max_sibling=3)
    with pytest.raises(ValueError, match=r"\(path 6, up 3, down 3, sibling 6 buckets\) make 324 codes"):
        RelationBatch.code_model(code, ("path", "up", "down", "sibling"))
    with pytest.raises(ValueError, match="unknown code relation 'parent'"):
        RelationBatch.code_model(code, ("path", "parent"))
    with pytest.raises(ValueError, match="must not repeat"):
        RelationBatch.code_model(code, ("path", "path"))
    with pytest.raises(ValueError, match="non-empty sequence"):
        RelationBatch.code_model(code, "path")
    with pytest.raises(TypeError, match="take a CodeTreeBatch"):
        RelationBatch.code_model(sk.TreeBatch.from_heads([[-1, 0]]))
    deep = "x = " + "(" * 140 + "1" + ")" * 140 + "\n"
    nested = sk.trees.from_tree_sitter(deep, [(i, i + 1) for i in range(len(deep) - 1)])
    with pytest.raises(ValueError, match="batch item 0: its syntax tree is 14[0-9] nodes deep"):
        RelationBatch.code_model(nested, ("up", "down"))
    RelationBatch.code_model(nested, ("ancestor", "sibling"))  # exact without node distances
    # a log-spaced path relation: the BucketSpec given as max_path
    log = sk.BucketSpec(max_distance=32, log_distance=4, unreachable_bucket=False)
    assert code_relation_buckets(("path", "ancestor"), max_path=log)[0] == log


# -- the transformers integration ------------------------------------------------------------------------------

@pytest.mark.long_on_cpu
def test_transformers_model_takes_the_code_relations():
    """A tiny BERT with ``relations=3`` and the default code relations (one ``BucketSpec(max_distance=4)``):
    fresh, the unpatched model's logits; with random syntax parameters, the logits of the same model on the
    oracle's relations (``RelationBatch.from_distances``), which differ when the ancestor sign is swapped;
    gradients reach every relation's table."""
    import copy

    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    texts, items = load(SMALL[:2])
    code = sk.trees.from_tree_sitter(texts, items)
    plan = RelationBatch.code_model(code)
    B, N = plan.distance.shape[:2]
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                                     initializer_range=0.3)  # (attention that moves the output)
    torch.manual_seed(0)
    plain = transformers.BertForTokenClassification(config).eval()
    model = copy.deepcopy(plain)
    spec = sk.BucketSpec(max_distance=4)
    enable_syntax_attention(model, "bias", buckets=spec, per_head=True, relations=3)
    ids = torch.randint(4, 100, (B, N))
    mask = (torch.arange(N)[None] < code.lengths[:, None]).long()
    valid = mask.bool()
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, syntax_trees=plan).logits[valid],
                               plain(input_ids=ids, attention_mask=mask).logits[valid], atol=1e-5, rtol=1e-5)
    params = syntax_parameters(model)
    with torch.no_grad():
        for p in params.values():
            p.normal_(0.0, 1.0)
    want = oracle_distances(texts, items, "root", R3["relations"])

    def hidden(trees):
        return model(input_ids=ids, attention_mask=mask, syntax_trees=trees, output_hidden_states=True)

    got = hidden(plan)
    oracle = RelationBatch.from_distances(want, spec, code.kernel_lengths)
    torch.testing.assert_close(got.logits, hidden(oracle).logits, atol=1e-5, rtol=1e-5)
    swapped = want.clone()
    ancestor = swapped[:, 1]
    swapped[:, 1] = torch.where(ancestor == 255, ancestor, 4 - ancestor)
    other = hidden(RelationBatch.from_distances(swapped, spec, code.kernel_lengths))
    assert (other.hidden_states[-1][valid] - got.hidden_states[-1][valid]).abs().max() > 1e-2
    got.logits.sum().backward()
    table = next(p for n, p in params.items() if n.endswith("distance_bias"))
    assert all(table.grad[r].abs().sum() > 0 for r in range(3))
