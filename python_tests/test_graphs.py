"""Graphs as a structure source: ``sk.graph_distance`` / ``sk.GraphBatch`` (C++ and Python builders) against a
networkx breadth-first-search oracle, the enhanced UD graphs of ``read_conllu(..., enhanced=True)``, and the
distance-bias attention with a graph plan (padded and packed, directed and not) against the float64 reference,
forward and every gradient, on the C++ kernels and the Triton kernels (interpreter on a CPU machine)."""
import random

import networkx as nx
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _ext, reference
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops.bias_attention import _varlen, configs
from syntaxkernels.tools.testing import assert_bias_attention_close
from syntaxkernels.trees import GraphBatch, read_conllu

from conftest import KERNEL_DEVICE

HAS_GRAPH_CPP = _ext.available() and hasattr(_ext.load(), "graph_distance")
needs_graph_cpp = pytest.mark.skipif(not HAS_GRAPH_CPP, reason="C++ extension (graph_distance) not built")
BACKENDS = [pytest.param("cpp", marks=needs_graph_cpp), "python"]

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the oracle ----------------------------------------------------------------------------------------------

def oracle(pairs, n, directed):
    """uint8 [n, n] from networkx's breadth-first search: 255 unreachable, clipped at 254."""
    graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(pairs)
    out = torch.full((n, n), 255, dtype=torch.uint8)
    for source in range(n):
        for target, d in nx.single_source_shortest_path_length(graph, source).items():
            out[source, target] = min(d, 254)
    return out


def random_graph(rng, n, edges, self_loops=True, duplicates=True):
    """``edges`` random pairs over n tokens (disconnected pieces are likely at low density), with some self-loops and
    repeated edges."""
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(edges)] if n else []
    if n and self_loops:
        pairs += [(i, i) for i in rng.sample(range(n), min(2, n))]
    if pairs and duplicates:
        pairs += rng.sample(pairs, min(3, len(pairs)))
    rng.shuffle(pairs)
    return pairs


def random_batch(seed):
    rng = random.Random(seed)
    sizes = [0, 1, 5, 17, 40, 33]
    graphs = [random_graph(rng, n, rng.randint(0, 2 * n)) for n in sizes]
    return graphs, sizes


# -- the builders against the oracle -------------------------------------------------------------------------

@pytest.mark.parametrize("directed", [False, True], ids=["undirected", "directed"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_graphs_match_bfs_oracle(backend, directed, seed):
    graphs, sizes = random_batch(seed)
    distance = sk.graph_distance(graphs, sizes, directed=directed, backend=backend)
    N = max(sizes)
    assert distance.dtype == torch.uint8 and distance.shape == (len(sizes), N, N)
    for b, (pairs, n) in enumerate(zip(graphs, sizes)):
        assert torch.equal(distance[b, :n, :n], oracle(pairs, n, directed)), (b, n)
        assert torch.all(distance[b, n:, :] == 255) and torch.all(distance[b, :, n:] == 255)
    symmetric = torch.equal(distance, distance.transpose(1, 2))
    assert symmetric == (not directed)  # (these directed graphs have one-way edges)


@pytest.mark.parametrize("directed", [False, True], ids=["undirected", "directed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_paths_saturate_at_254(backend, directed):
    """A path of 300 tokens (distances up to 299, clipped at 254) and a cycle of 600 (up to 300 undirected, 599
    directed), beside a piece unreachable from both."""
    path = [(i, i + 1) for i in range(299)]
    cycle = [(i, (i + 1) % 600) for i in range(600)] + [(600, 601)]
    distance = sk.graph_distance([path, cycle], [300, 602], directed=directed, backend=backend)
    assert torch.equal(distance[0, :300, :300], oracle(path, 300, directed))
    assert torch.equal(distance[1], oracle(cycle, 602, directed))
    assert int(distance[0, 0, 299]) == 254 and int(distance[0, 0, 254]) == 254 and int(distance[0, 0, 253]) == 253
    assert int(distance[0, 299, 0]) == (255 if directed else 254)
    assert int(distance[1, 0, 600]) == 255


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_edges_padded_with_minus_one_equal_lists(backend):
    graphs, sizes = random_batch(3)
    E = max(len(g) for g in graphs) + 2
    edges = torch.full((len(graphs), E, 2), -1, dtype=torch.int32)
    for b, pairs in enumerate(graphs):
        if pairs:  # padding pairs first, then the edges: (-1, -1) may sit anywhere
            edges[b, 2:2 + len(pairs)] = torch.tensor(pairs, dtype=torch.int32)
    for directed in (False, True):
        from_tensor = sk.graph_distance(edges, torch.tensor(sizes), directed=directed, backend=backend)
        from_lists = sk.graph_distance(graphs, sizes, directed=directed, backend=backend)
        assert torch.equal(from_tensor, from_lists)
        per_item = sk.graph_distance([torch.tensor(g, dtype=torch.int64).view(-1, 2) for g in graphs], sizes,
                                     directed=directed, backend=backend)
        assert torch.equal(per_item, from_lists)


def test_default_lengths_size_and_layout():
    d = sk.graph_distance([[(0, 2)], [(1, 0)], []])
    assert d.shape == (3, 3, 3)  # one past the largest endpoint: 3, 2, 0
    assert d[1].tolist() == [[0, 1, 255], [1, 0, 255], [255, 255, 255]]
    assert torch.all(d[2] == 255)
    d = sk.graph_distance([[(0, 1)]], [4], size=20)
    assert d.shape == (1, 20, 20) and d.stride(1) % 16 == 0 and d.stride(0) % 16 == 0
    assert d[0, :4, :4].diagonal().tolist() == [0, 0, 0, 0] and int(d[0, 3, 0]) == 255
    assert torch.all(d[0, 4:] == 255) and torch.all(d[0, :, 4:] == 255)


@needs_graph_cpp
def test_cpp_threads_and_python_builder_agree():
    graphs, sizes = random_batch(5)
    graphs, sizes = graphs * 20, sizes * 20
    one = _ext.load().graph_distance(*sk.trees.graph.normalize_edges(graphs, sizes)[:2], 40, 48, True, 1)
    many = _ext.load().graph_distance(*sk.trees.graph.normalize_edges(graphs, sizes)[:2], 40, 48, True, 4)
    assert torch.equal(one, many)
    assert torch.equal(sk.graph_distance(graphs, sizes, directed=True, backend="python"), one[:, :40, :40])


# -- errors --------------------------------------------------------------------------------------------------

BAD = [
    ([[(0, 1)], [(0, 1), (2, 3)]], [2, 3], r"^batch item 1, edge 1: \(2, 3\): target 3 out of range \(length 3; "
                                           r"expected 0..2\)$"),
    ([[(0, 1)], [(5, 0)]], [2, 3], r"^batch item 1, edge 0: \(5, 0\): source 5 out of range"),
    ([[(0, -1)]], [2], r"^batch item 0, edge 0: \(0, -1\) has a negative endpoint \(only a \(-1, -1\) pair pads"),
    ([[(-2, -2)]], [2], r"^batch item 0, edge 0: \(-2, -2\) has a negative endpoint"),
    ([[(0, 1)], [(0, 9)], [(0, 9)]], [2, 2, 2], r"^batch item 1, edge 0"),  # the lowest bad item
    ([[(0, 1)]], [-1], r"^batch item 0: lengths\[0\] = -1 is negative$"),
    ([[(0, 1)]], [2, 2], r"lengths must have shape \[B\] = \[1\], got \(2,\)"),
    ([[(0, 1, 2)]], None, r"^batch item 0, edge 0: \(0, 1, 2\) is not a \(source, target\) pair$"),
    ([[(0, 1.5)]], None, r"^batch item 0, edge 0: \(0, 1.5\) is not a pair of integers$"),
    ([[0, 1]], None, r"^batch item 0, edge 0: 0 is not a \(source, target\) pair$"),
    (torch.zeros(2, 3, dtype=torch.int64), None, r"edges must have shape \[B, E, 2\]"),
    (torch.zeros(2, 3, 2), None, r"edges must be an integer tensor \[B, E, 2\], got dtype torch.float32"),
    ("0 1", None, r"edges must be an int tensor \[B, E, 2\] or a list of per-item edge lists, got str"),
]


@pytest.mark.parametrize("edges,lengths,match", BAD)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_edges_raise_value_errors_naming_item_and_edge(backend, edges, lengths, match):
    with pytest.raises(ValueError, match=match):
        sk.graph_distance(edges, lengths, backend=backend)


def test_other_argument_errors():
    with pytest.raises(ValueError, match=r"size must be an int at least the longest length \(3\), got 2"):
        sk.graph_distance([[(0, 2)]], size=2)
    with pytest.raises(ValueError, match="directed must be a bool"):
        sk.graph_distance([[(0, 1)]], directed="yes")
    with pytest.raises(ValueError, match="backend must be"):
        sk.graph_distance([[(0, 1)]], backend="gpu")
    with pytest.raises(ValueError, match="packed graphs come as a list"):
        GraphBatch.from_edges(torch.zeros(1, 1, 2, dtype=torch.int64), packed=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_errors_name_the_sequence(backend):
    with pytest.raises(ValueError, match=r"^sequence 1, edge 2: \(0, 4\): target 4 out of range \(length 3"):
        GraphBatch.from_edges([[(0, 1)], [(0, 1), (1, 2), (0, 4)]], [2, 3], packed=True, backend=backend)
    with pytest.raises(ValueError, match=r"^sequence 0: lengths\[0\] = -3 is negative"):
        GraphBatch.from_edges([[]], [-3], packed=True, backend=backend)


# -- the plan ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("directed", [False, True], ids=["undirected", "directed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_batch_padded_and_packed(backend, directed):
    graphs, sizes = random_batch(7)
    padded = GraphBatch.from_edges(graphs, sizes, directed=directed, backend=backend)
    packed = GraphBatch.from_edges(graphs, sizes, directed=directed, packed=True, backend=backend)
    assert isinstance(padded, sk.plan.StructurePlan) and not padded.is_packed and packed.is_packed
    assert padded.symmetric == packed.symmetric == (not directed) and padded.directed == directed
    assert padded.kernel_lengths.dtype == torch.int32 and padded.kernel_lengths.tolist() == sizes
    assert packed.cu_seqlens.tolist() == [0] + torch.tensor(sizes).cumsum(0).tolist()
    assert packed.max_seqlen == max(sizes) and packed.distance.numel() == sum(n * n for n in sizes)
    assert packed.sequence.tolist() == [s for s, n in enumerate(sizes) for _ in range(n)]
    for s, (pairs, n) in enumerate(zip(graphs, sizes)):
        want = oracle(pairs, n, directed)
        assert torch.equal(packed.sequence_distance(s), want) and torch.equal(padded.sequence_distance(s), want)
    for moved in (padded.to("cpu", non_blocking=True), padded._map(lambda t: t.clone()), packed.to("cpu")):
        original = packed if moved.is_packed else padded
        assert isinstance(moved, GraphBatch) and moved.directed == directed and moved.symmetric == (not directed)
        assert torch.equal(moved.distance, original.distance) and torch.equal(moved.lengths, original.lengths)
        assert moved.distance.stride() == original.distance.stride()  # the aligned layout is kept


def test_directed_plan_derives_the_transposed_distance_once():
    plan = GraphBatch.from_edges([[(0, 1), (1, 2)]], directed=True)
    t = plan.transposed_distance()
    assert torch.equal(t, plan.distance.transpose(1, 2)) and t.stride(1) % 16 == 0
    assert plan.transposed_distance() is t
    undirected = GraphBatch.from_edges([[(0, 1), (1, 2)]])
    assert undirected.transposed_distance() is undirected.distance


def test_subnetwork_relations_are_refused_with_the_reason():
    plan = GraphBatch.from_edges([[(0, 1), (2, 1)]])
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match="defined on trees .* not defined for a GraphBatch"):
        sk.syntax_subnetwork_attention(q, q, q, plan, sk.MaskSpec())
    packed = GraphBatch.from_edges([[(0, 1), (2, 1)]], packed=True)
    with pytest.raises(TypeError, match="defined on trees"):
        sk.syntax_subnetwork_attention(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), packed,
                                       sk.MaskSpec())


# -- the bias attention with a graph plan ----------------------------------------------------------------------

GRAPH_SIZES = [37, 29, 0]  # ragged, one empty item


def graph_case(directed, seed=0, H=2, D=16):
    rng = random.Random(seed)
    graphs = [random_graph(rng, n, n + 4) for n in GRAPH_SIZES]
    if directed:
        graphs[0] += [(i, i + 1) for i in range(20)]  # a long one-way path: far from symmetric
    return graphs, attention_case(GRAPH_SIZES, seed, H, D)


def attention_case(sizes, seed=0, H=2, D=16):
    """q, k, v, grad_out [B, H, N, D], a per-head table and the bias scale for items of ``sizes`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    B, N = len(sizes), max(sizes)
    buckets = sk.BucketSpec(max_distance=16, log_distance=6, unreachable_bucket=True)
    case = dict(q=torch.randn(B, H, N, D, generator=gen), k=torch.randn(B, H, N, D, generator=gen),
                v=torch.randn(B, H, N, D, generator=gen), table=torch.randn(H, buckets.num_buckets, generator=gen),
                bias_scale=torch.tensor([0.9]), lengths=torch.tensor(sizes), buckets=buckets)
    case["grad_out"] = torch.randn(B, H, N, D, generator=gen)
    return case


def run_padded(case, plan, dtype, backend, device="cpu", **kw):
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (case[n].to(device, dtype).requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(device, pdtype).requires_grad_()
    c = case["bias_scale"].to(device, pdtype).requires_grad_()
    if backend == "spec":  # the reference on the plan's own tensors
        out = reference.syntax_bias_attention(q, k, v, plan.distance.to(device), table, buckets=case["buckets"],
                                              bias_scale=c, lengths=plan.kernel_lengths.to(device), **kw)
    else:
        out = sk.syntax_bias_attention(q, k, v, plan.to(device), table, buckets=case["buckets"], bias_scale=c,
                                       backend=backend, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), case["grad_out"].to(device, dtype))
    return out.cpu(), {n: g.cpu() for n, g in zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads)}


def check(case, got, ref64, reflp, dtype):
    assert_bias_attention_close(case, got, ref64, reflp, dtype)
    for name, g in got[1].items():
        if ref64[1][name].abs().max() > 1e-3:
            assert g.abs().max() > 0, f"{name} is all zeros"


PATHS = [pytest.param("auto", "cpu", marks=needs_graph_cpp, id="cpp"),
         pytest.param("triton", KERNEL_DEVICE, id="triton",
                      marks=pytest.mark.skipif(not (torch.cuda.is_available() or P.interpreting()),
                                               reason="needs CUDA or TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("directed", [False, True], ids=["undirected", "directed"])
@pytest.mark.parametrize("backend,device", PATHS)
@pytest.mark.parametrize("kw", [{}, {"window": 3}], ids=["full", "window3"])
def test_bias_attention_padded_graph_plan_matches_reference(monkeypatch, backend, device, directed, kw):
    """Forward and every gradient against the float64 reference; the tiled backward (short rows off) reads the
    distance at [b, j, i]: the transposed copy of a directed graph's distance, the distance itself otherwise."""
    monkeypatch.setattr(configs, "_SHORT_ROWS", False)
    graphs, case = graph_case(directed)
    plan = GraphBatch.from_edges(graphs, GRAPH_SIZES, directed=directed)
    assert torch.equal(plan.distance, plan.distance.transpose(1, 2)) == (not directed)
    dtype = torch.float32
    got = run_padded(case, plan, dtype, backend, device, **kw)
    ref64 = run_padded(case, plan, torch.float64, "spec", **kw)
    reflp = run_padded(case, plan, dtype, "spec", **kw)
    check(case, got, ref64, reflp, dtype)
    assert torch.all(got[0][2] == 0)  # the empty item


def run_packed(case, plan, dtype, backend, device="cpu", **kw):
    from syntaxkernels.trees import pack_padded

    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    lengths = case["lengths"]
    q, k, v = (pack_padded(case[n].transpose(1, 2), lengths).to(device, dtype).requires_grad_()
               for n in ("q", "k", "v"))
    table = case["table"].to(device, pdtype).requires_grad_()
    c = case["bias_scale"].to(device, pdtype).requires_grad_()
    grad_out = pack_padded(case["grad_out"].transpose(1, 2), lengths).to(device, dtype)
    if backend == "spec":
        out = _varlen.reference_bias_attention_varlen(q, k, v, plan.distance.to(device), table,
                                                      buckets=case["buckets"], cu_seqlens=plan.cu_seqlens,
                                                      bias_scale=c, **kw)
    else:
        out = sk.syntax_bias_attention(q, k, v, plan.to(device), table, buckets=case["buckets"], bias_scale=c,
                                       backend=backend, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), grad_out)
    return out.cpu(), {n: g.cpu() for n, g in zip(("dq", "dk", "dv", "dtable", "dbias_scale"), grads)}


@pytest.mark.parametrize("directed", [False, True], ids=["undirected", "directed"])
@pytest.mark.parametrize("backend,device", PATHS)
def test_bias_attention_packed_graph_plan_matches_reference(backend, device, directed):
    graphs, case = graph_case(directed, seed=1)
    plan = GraphBatch.from_edges(graphs, GRAPH_SIZES, directed=directed, packed=True)
    dtype = torch.float32
    got = run_packed(case, plan, dtype, backend, device)
    ref64 = run_packed(case, plan, torch.float64, "spec")
    reflp = run_packed(case, plan, dtype, "spec")
    check(case, got, ref64, reflp, dtype)


def test_bare_graph_distance_is_taken_as_not_symmetric():
    """``sk.graph_distance``'s tensor carries no symmetry: the ops then read a transposed copy (exact either way)."""
    graphs, case = graph_case(True)
    distance = sk.graph_distance(graphs, GRAPH_SIZES, directed=True)
    plan = sk.plan.as_plan(distance, case["lengths"])
    assert plan.symmetric is False


# -- enhanced UD graphs ----------------------------------------------------------------------------------------

ENHANCED = """# sent_id = e1
# text = they like to write
1\tthey\tthey\tPRON\tPRP\t_\t2\tnsubj\t2:nsubj|2.1:nsubj:xsubj\t_
2\tlike\tlike\tVERB\tVBP\t_\t0\troot\t0:root\t_
2.1\twrite\twrite\tVERB\tVB\t_\t_\t_\t2:xcomp\tCopyOf=4
3\tto\tto\tPART\tTO\t_\t4\tmark\t4:mark\t_
4\twrite\twrite\tVERB\tVB\t_\t2\txcomp\t2:xcomp|2.1:conj:and\t_

"""


def test_read_conllu_enhanced_graph_and_empty_nodes():
    (sentence,) = read_conllu(ENHANCED, enhanced=True)
    assert sentence.heads == [1, -1, 3, 1] and len(sentence.words) == 4
    assert sentence.empty_nodes == [("2.1", "write")] and sentence.num_nodes == 5
    # the empty node 2.1 is node 4 (after the 4 words); 0:root gives no edge; word 4 has two heads
    assert sentence.enhanced_edges == [(1, 0), (4, 0), (3, 2), (1, 3), (4, 3), (1, 4)]
    assert sentence.enhanced_deprels == ["nsubj", "nsubj:xsubj", "mark", "xcomp", "conj:and", "xcomp"]
    (plain,) = read_conllu(ENHANCED)
    assert plain.enhanced_edges == [] and plain.empty_nodes == [] and plain.heads == sentence.heads
    d = sk.graph_distance([sentence.enhanced_edges], [sentence.num_nodes])
    assert int(d[0, 0, 3]) == 2  # they -> write: through 2.1 (or like)
    d = sk.graph_distance([sentence.enhanced_edges], [sentence.num_nodes], directed=True)
    assert int(d[0, 4, 3]) == 1 and int(d[0, 3, 4]) == 255 and int(d[0, 1, 0]) == 1


@pytest.mark.parametrize("deps,match", [
    ("2", r"line \d+: DEPS entry '2' of word 1 is not head:relation"),
    ("7:nsubj", r"DEPS head 7 of word 1 names no word or empty node of the sentence \(4 words, 1 empty nodes\)"),
    ("3.5:nsubj", r"DEPS head 3.5 of word 1 names no word"),
    ("_", r"word 1 has no DEPS \(enhanced=True reads"),
])
def test_read_conllu_enhanced_errors(deps, match):
    text = ENHANCED.replace("2:nsubj|2.1:nsubj:xsubj", deps)
    with pytest.raises(ValueError, match=match):
        read_conllu(text, enhanced=True)
    read_conllu(text)  # the basic layer alone does not read DEPS
    with pytest.raises(ValueError, match="enhanced must be a bool"):
        read_conllu(ENHANCED, enhanced=1)


@pytest.mark.long_on_cpu
def test_treebank_enhanced_graphs_match_bfs_oracle(ud_dev_path):
    """Every sentence's enhanced graph (empty nodes included), directed and undirected, padded and packed, against
    the oracle; then a directed batch of them through the bias attention's C++ path agrees with the reference."""
    sentences = read_conllu(ud_dev_path, enhanced=True)
    graphs = [s.enhanced_edges for s in sentences]
    sizes = [s.num_nodes for s in sentences]
    assert any(s.empty_nodes for s in sentences)  # the treebank has elided predicates
    assert any(len(set(d for _, d in s.enhanced_edges)) < len(s.enhanced_edges) for s in sentences)  # several heads
    for directed in (False, True):
        packed = GraphBatch.from_edges(graphs, sizes, directed=directed, packed=True)
        for start in range(0, len(graphs), 500):
            chunk = slice(start, start + 500)
            padded = GraphBatch.from_edges(graphs[chunk], sizes[chunk], directed=directed)
            for b, (pairs, n) in enumerate(zip(graphs[chunk], sizes[chunk])):
                want = oracle(pairs, n, directed)
                assert torch.equal(padded.sequence_distance(b), want), (start + b, directed)
                assert torch.equal(packed.sequence_distance(start + b), want), (start + b, directed)
    # A batch of sentences with empty nodes and several heads, directed, through the C++ kernels.
    chosen = [s for s in sentences if s.empty_nodes][:2] + sentences[:6]
    plan = GraphBatch.from_edges([s.enhanced_edges for s in chosen], [s.num_nodes for s in chosen], directed=True)
    case = attention_case([s.num_nodes for s in chosen], seed=2)
    got = run_padded(case, plan, torch.float32, "auto")
    check(case, got, run_padded(case, plan, torch.float64, "spec"), run_padded(case, plan, torch.float32, "spec"),
          torch.float32)


# -- the transformers integration ----------------------------------------------------------------------------

TREE_HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2, 0]]


def tree_edges(heads):
    return [(i, h) for i, h in enumerate(heads) if h >= 0]


def _syntax_bert(method="bias"):
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model.set_attn_implementation("sdpa")
    enable_syntax_attention(model, method, **({"gat_config": dict(num_layers=1, num_heads=2, head_dim=8, window=2)}
                                             if method == "gat" else {}))
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 0.5)
    return model.eval()


def test_transformers_bias_takes_a_graph_plan_padded_and_packed():
    """A tree is a graph: the GraphBatch of its edges (undirected) through a syntax BERT gives what the TreeBatch
    gives, padded and packed; a directed GraphBatch runs and gets gradients, and is not the undirected result."""
    model = _syntax_bert()
    trees = sk.TreeBatch.from_heads(TREE_HEADS)
    graphs = [tree_edges(h) for h in TREE_HEADS]
    lengths = [len(h) for h in TREE_HEADS]
    plan = GraphBatch.from_edges(graphs, lengths)
    ids = torch.randint(4, 100, (2, 9))
    mask = (torch.arange(9)[None, :] < trees.lengths[:, None]).long()
    valid = mask.bool()
    want = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
    got = model(input_ids=ids, attention_mask=mask, syntax_trees=plan).last_hidden_state
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)
    directed = GraphBatch.from_edges(graphs, lengths, directed=True)
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=directed).last_hidden_state
    out[valid].sum().backward()
    table = model.encoder.layer[0].attention.self.syntax.distance_bias
    assert table.grad is not None and table.grad.abs().sum() > 0
    assert not torch.allclose(out[valid], want[valid], atol=1e-4)
    # packed: one row of both sequences, position ids restarting at each
    packed_ids = torch.cat([ids[0, :9], ids[1, :6]])[None]
    positions = torch.cat([torch.arange(9), torch.arange(6)])[None]
    want = model(input_ids=packed_ids, position_ids=positions,
                 syntax_trees=sk.PackedTreeBatch.from_heads(TREE_HEADS)).last_hidden_state
    got = model(input_ids=packed_ids, position_ids=positions,
                syntax_trees=GraphBatch.from_edges(graphs, lengths, packed=True)).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    short_mask = (torch.arange(9)[None, :] < torch.tensor([9, 5])[:, None]).long()
    with pytest.raises(ValueError, match="batch item 1"):  # the plan's lengths against the attention mask
        model(input_ids=ids, attention_mask=short_mask, syntax_trees=plan)


@pytest.mark.parametrize("method", ["gat", "subnetwork"])
def test_transformers_tree_methods_refuse_a_graph_with_the_reason(method):
    model = _syntax_bert(method)
    plan = GraphBatch.from_edges([tree_edges(h) for h in TREE_HEADS], [9, 6])
    ids = torch.randint(4, 100, (2, 9))
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 6])[:, None]).long()
    with pytest.raises(TypeError, match="heads" if method == "gat" else "defined on trees"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=plan)
