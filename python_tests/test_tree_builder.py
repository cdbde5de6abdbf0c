"""The tree-distance builders (C++ extension and Python/NumPy fallback) against hand-computed trees, a BFS
oracle and scipy's shortest_path; their input validation; TreeBatch."""
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import syntaxkernels as sk
from syntaxkernels import _ext
from syntaxkernels.tools import workloads
from syntaxkernels.tools.checks import trees as oracles
from syntaxkernels.trees import TreeBatch, build_tree_tensors, python_tree_tensors

HAS_CPP = _ext.available()
BACKENDS = ["python", pytest.param("cpp", marks=pytest.mark.skipif(not HAS_CPP, reason="C++ extension not built"))]
requires_cpp = pytest.mark.skipif(not HAS_CPP, reason="C++ extension not built")


def build(heads, lengths=None, backend="python", num_threads=0):
    """(distance, depth, segment) as NumPy arrays."""
    _, _, distance, depth, segment = build_tree_tensors(heads, lengths, backend=backend, num_threads=num_threads)
    return distance.numpy(), depth.numpy(), segment.numpy()


def expected_depth_segment(sentences, n):
    depth = np.full((len(sentences), n), -1, dtype=np.int32)
    segment = np.full((len(sentences), n), -1, dtype=np.int32)
    for b, s in enumerate(sentences):
        if s:
            depth[b, : len(s)], segment[b, : len(s)] = oracles.bfs_depth_segment(s)
    return depth, segment


# ----------------------------------------------------------------------------------- hand-computed trees

@pytest.mark.parametrize("backend", BACKENDS)
def test_chain(backend):
    distance, depth, segment = build([[-1, 0, 1, 2, 3]], backend=backend)
    index = np.arange(5)
    np.testing.assert_array_equal(distance[0], np.abs(index[:, None] - index[None, :]))
    np.testing.assert_array_equal(depth[0], index)
    np.testing.assert_array_equal(segment[0], 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_star_rooted_in_the_middle(backend):
    # Token 2 is the root; every other token hangs off it.
    distance, depth, segment = build([[2, 2, -1, 2, 2]], backend=backend)
    want = np.full((5, 5), 2)
    want[2, :] = want[:, 2] = 1
    np.fill_diagonal(want, 0)
    np.testing.assert_array_equal(distance[0], want)
    np.testing.assert_array_equal(depth[0], [1, 1, 0, 1, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_right_headed_tree(backend):
    # 0 <- 1 <- 3 -> 2 ; 3 is the root; 4 attaches to 2.
    heads = [1, 3, 3, -1, 2]
    distance, depth, _ = build([heads], backend=backend)
    want = np.array([
        [0, 1, 3, 2, 4],
        [1, 0, 2, 1, 3],
        [3, 2, 0, 1, 1],
        [2, 1, 1, 0, 2],
        [4, 3, 1, 2, 0],
    ])
    np.testing.assert_array_equal(distance[0], want)
    np.testing.assert_array_equal(depth[0], [2, 1, 1, 0, 2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_forest(backend):
    # Tree A = {0, 1, 2} rooted at 1; tree B = {3, 4} rooted at 4; tree C = {5}.
    distance, depth, segment = build([[1, -1, 1, 4, -1, -1]], backend=backend)
    np.testing.assert_array_equal(segment[0], [0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(depth[0], [1, 0, 1, 1, 0, 0])
    assert distance[0, 0, 2] == 2 and distance[0, 3, 4] == 1 and distance[0, 5, 5] == 0
    for i, j in [(0, 3), (2, 4), (1, 5), (4, 5)]:
        assert distance[0, i, j] == 255 and distance[0, j, i] == 255


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_token_and_padding(backend):
    heads = torch.tensor([[-1, 99, 99], [-1, 0, 7], [5, 5, 5]])  # padding entries are never read
    distance, depth, segment = build(heads, torch.tensor([1, 2, 0]), backend=backend)
    assert distance[0, 0, 0] == 0
    off_diagonal = np.ones((3, 3), dtype=bool)
    off_diagonal[0, 0] = False
    assert (distance[0][off_diagonal] == 255).all()
    np.testing.assert_array_equal(distance[1, :2, :2], [[0, 1], [1, 0]])
    assert (distance[1, 2, :] == 255).all() and (distance[1, :, 2] == 255).all()
    assert (distance[2] == 255).all()
    np.testing.assert_array_equal(depth, [[0, -1, -1], [0, 1, -1], [-1, -1, -1]])
    np.testing.assert_array_equal(segment, [[0, -1, -1], [0, 0, -1], [-1, -1, -1]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_distance_saturates_at_254(backend):
    chain = [-1] + list(range(299))
    distance, depth, _ = build([chain], backend=backend)
    assert distance[0, 0, 253] == 253 and distance[0, 0, 254] == 254 and distance[0, 299, 0] == 254
    assert depth[0, 299] == 299


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_shapes(backend):
    for heads, lengths, shape in [
        (torch.zeros(0, 4, dtype=torch.int64), None, (0, 4, 4)),
        (torch.zeros(3, 0, dtype=torch.int64), None, (3, 0, 0)),
        ([], None, (0, 0, 0)),
        ([[], []], None, (2, 0, 0)),
        (torch.full((2, 3), -1), torch.tensor([0, 0]), (2, 3, 3)),
    ]:
        distance, depth, segment = build(heads, lengths, backend=backend)
        assert distance.shape == shape and depth.shape == shape[:2] and segment.shape == shape[:2]
        assert (distance == 255).all() and (depth == -1).all() and (segment == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_list_tuple_numpy_and_small_int_dtypes(backend):
    want = build(torch.tensor([[-1, 0, 0], [1, -1, -1]]), torch.tensor([3, 2]), backend=backend)
    for heads, lengths in [
        ([[-1, 0, 0], [1, -1]], None),
        (([-1, 0, 0], (1, -1)), None),
        ([np.array([-1, 0, 0]), torch.tensor([1, -1])], None),
        ([[np.int32(-1), np.int64(0), 0], [1, -1]], None),
        (np.array([[-1, 0, 0], [1, -1, 5]], dtype=np.int16), [3, 2]),
        (torch.tensor([[-1, 0, 0], [1, -1, -1]], dtype=torch.int8), torch.tensor([3, 2], dtype=torch.int32)),
        (torch.tensor([[-1, 1], [0, -1], [0, 5]]).t(), torch.tensor([3, 2])),  # non-contiguous
    ]:
        got = build(heads, lengths, backend=backend)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_public_api_and_auto_backend():
    heads = [[-1, 0, 1], [-1]]
    distance = sk.tree_distance(heads)
    assert distance.dtype == torch.uint8 and distance.shape == (2, 3, 3)
    np.testing.assert_array_equal(distance.numpy(), oracles.bfs_tree_distance(heads, 3))
    batch = TreeBatch.from_heads(heads)
    assert batch.lengths.tolist() == [3, 1] and batch.heads.dtype == torch.int64
    assert batch.depth.dtype == torch.int32 and batch.segment.dtype == torch.int32
    assert torch.equal(batch.distance, distance)
    assert batch.key_padding_mask().tolist() == [[False, False, False], [False, True, True]]


# ------------------------------------------------------------------------------------- property tests

@st.composite
def forests(draw, max_items=6, max_length=24):
    """A batch of random forests (heads point left and right), some padding columns and garbage padding."""
    count = draw(st.integers(0, max_items))
    sentences = []
    for _ in range(count):
        length = draw(st.integers(0, max_length))
        order = draw(st.permutations(range(length)))
        heads = [-1] * length
        for k in range(1, length):
            if draw(st.integers(0, 9)) > 0:  # 1 in 10 tokens starts a new tree
                heads[order[k]] = order[draw(st.integers(0, k - 1))]
        sentences.append(heads)
    extra = draw(st.integers(0, 3))
    garbage = draw(st.integers(-5, 40))
    return sentences, extra, garbage


def padded_with_garbage(sentences, extra, garbage):
    n = max((len(s) for s in sentences), default=0) + extra
    heads = torch.full((len(sentences), n), garbage, dtype=torch.int64)
    for b, s in enumerate(sentences):
        if s:
            heads[b, : len(s)] = torch.tensor(s)
    return heads, torch.tensor([len(s) for s in sentences], dtype=torch.int64), n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests())
def test_random_forests_match_scipy_bfs_and_each_other(case):
    sentences, extra, garbage = case
    heads, lengths, n = padded_with_garbage(sentences, extra, garbage)
    want_distance = oracles.scipy_tree_distance(sentences, n)
    np.testing.assert_array_equal(oracles.bfs_tree_distance(sentences, n), want_distance)
    want_depth, want_segment = expected_depth_segment(sentences, n)
    results = {"python": python_tree_tensors(heads, lengths)}
    if HAS_CPP:
        module = _ext.load()
        results["cpp"] = module.tree_distance(heads, lengths, 1)
        results["cpp-threads"] = module.tree_distance(heads, lengths, 3)
    for name, (distance, depth, segment) in results.items():
        np.testing.assert_array_equal(distance.numpy(), want_distance, err_msg=name)
        np.testing.assert_array_equal(depth.numpy(), want_depth, err_msg=name)
        np.testing.assert_array_equal(segment.numpy(), want_segment, err_msg=name)


@requires_cpp
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_large_batches_with_threads_match_python(seed):
    sentences = workloads.generated_sentences(70, seed=seed, max_length=60)
    heads, lengths = oracles.padded(sentences)
    want = python_tree_tensors(heads, lengths)
    for threads in (1, 2, 4):
        for a, b in zip(_ext.load().tree_distance(heads, lengths, threads), want):
            assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------- bad inputs

BAD_TREES = [
    ([[-1, 0, 3]], None, "batch item 0, token 2: head 3 out of range (length 3; expected -1 for a root or 0..2)"),
    ([[-1, -2]], None, "batch item 0, token 1: head -2 out of range (length 2; expected -1 for a root or 0..1)"),
    # Out of range against the length, even if inside N.
    (torch.tensor([[-1, 2, 0]]), [2], "batch item 0, token 1: head 2 out of range (length 2; expected -1 for a root or 0..1)"),
    ([[-1, 0], [0, 1]], None, "batch item 1, token 0: self-loop (its head is itself; use -1 for a root)"),
    ([[-1, 0], [1, 2, 0]], None, "batch item 1, token 0: on a cycle (0 -> 1 -> 2 -> 0) that never reaches a root"),
    ([[-1, 4, 1, 2, 3]], None, "batch item 0, token 1: on a cycle (1 -> 4 -> 3 -> 2 -> 1) that never reaches a root"),
    # A tail hanging off a cycle: the smallest token ON the cycle is named.
    ([[-1, 5, 1, 4, 3, 3]], None, "batch item 0, token 3: on a cycle (3 -> 4 -> 3) that never reaches a root"),
    # Range errors come before self-loops and cycles within an item; the lowest bad item wins.
    ([[1, 0], [2, 1, 9]], None, "batch item 0, token 0: on a cycle (0 -> 1 -> 0) that never reaches a root"),
    ([[-1], [1, 1, 9]], None, "batch item 1, token 2: head 9 out of range (length 3; expected -1 for a root or 0..2)"),
]

BAD_SHAPES = [
    (torch.tensor([[-1, 0]]), [3], "batch item 0: lengths[0] = 3 is larger than N = 2"),
    (torch.tensor([[-1, 0], [-1, 0]]), [2, -1], "batch item 1: lengths[1] = -1 is negative"),
    ([[-1, 0], [-1]], [2, 2], "batch item 1: lengths[1] = 2 is larger than the 1 heads given"),
    (torch.tensor([[-1.0, 0.0]]), None, "heads must have an integer dtype, got torch.float32"),
    (torch.tensor([[True, False]]), None, "heads must have an integer dtype, got torch.bool"),
    (np.array([[-1.0, 0.0]]), None, "heads must be an integer array, got dtype float64"),
    (torch.tensor([-1, 0]), None, "heads must have shape [B, N], got (2,) (rank 1)"),
    (torch.zeros(1, 2, 2, dtype=torch.int64), None, "heads must have shape [B, N], got (1, 2, 2) (rank 3)"),
    (torch.tensor([[-1, 0]]), [2, 2], "lengths must have shape [B] = [1], got (2,)"),
    (torch.tensor([[-1, 0]]), torch.tensor([2.0]), "lengths must be an integer tensor [B], got dtype torch.float32"),
    ([[-1, 0.0]], None, "batch item 0, token 1: head 0.0 is not an integer"),
    ([[-1, 0], [-1, "0"]], None, "batch item 1, token 1: head '0' is not an integer"),
    ([[-1, None]], None, "batch item 0, token 1: head None is not an integer"),
    ([[-1, True]], None, "batch item 0, token 1: head True is not an integer"),
    ([[-1, 2**70]], None, f"batch item 0, token 1: head {2**70} does not fit in int64"),
    ([[-1, 0], 3], None, "heads must be a tensor [B, N] or a list of lists; batch item 1 is 3"),
    ("-1 0", None, "heads must be a tensor [B, N] or a list of lists, got str"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,lengths,message", BAD_TREES + BAD_SHAPES, ids=[c[2][:48] for c in BAD_TREES + BAD_SHAPES])
def test_bad_input_errors(backend, heads, lengths, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        build(heads, lengths, backend=backend)


@requires_cpp
@pytest.mark.parametrize("heads,lengths,message", BAD_TREES + BAD_SHAPES[:2],
                         ids=[c[2][:48] for c in BAD_TREES + BAD_SHAPES[:2]])
def test_extension_validates_on_its_own(heads, lengths, message):
    """_C.tree_distance raises the same ValueError without the Python checks in front of it."""
    if isinstance(heads, list):
        tensor, lengths_t, _ = padded_with_garbage(heads, 0, -1)
    else:
        tensor, lengths_t = heads, torch.full((heads.shape[0],), heads.shape[1])
    if lengths is not None:
        lengths_t = torch.tensor(lengths)
    for threads in (1, 2):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            _ext.load().tree_distance(tensor, lengths_t, threads)


@requires_cpp
def test_extension_rejects_bad_tensors_without_crashing():
    module = _ext.load()
    cases = [
        (torch.zeros(2, 3), torch.tensor([3, 3]), "heads must have an integer dtype, got torch.float32"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor([3]), "heads must have shape [B, N], got (3,) (rank 1)"),
        (torch.zeros(1, 3, dtype=torch.int64), torch.tensor([[3]]), "lengths must have shape [B] = [1], got (1, 1)"),
        (torch.zeros(1, 3, dtype=torch.int64), torch.tensor([3.0]),
         "lengths must be an integer tensor [B], got dtype torch.float32"),
        # A broadcast view with an absurd N: rejected before anything is allocated.
        (torch.zeros(1, 1, dtype=torch.int64).expand(1, 2**40), torch.tensor([0]),
         f"heads of shape (1, {2**40}) need a distance tensor [B, N, N] too large to address"),
    ]
    for heads, lengths, message in cases:
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            module.tree_distance(heads, lengths, 0)
    assert module.has_cuda() in (True, False)


@requires_cpp
def test_lowest_bad_item_is_reported_whatever_the_thread_count():
    sentences = workloads.generated_sentences(400, seed=5, max_length=80)
    heads, lengths = oracles.padded(sentences)
    heads[300, 0] = 0  # a self-loop (every generated sentence has a token 0)
    heads[120, : lengths[120]] = -1
    heads[120, int(lengths[120]) - 1] = 1000  # out of range
    length = int(lengths[120])
    message = (f"batch item 120, token {length - 1}: head 1000 out of range "
               f"(length {length}; expected -1 for a root or 0..{length - 1})")
    for threads in (1, 2, 3, 8):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            _ext.load().tree_distance(heads, lengths, threads)


# ------------------------------------------------------------------- ragged lists straight to the extension

def outcome(fn):
    """("ok", tensors), ("none", None) or ("error", message) of fn(); errors other than ValueError propagate."""
    try:
        result = fn()
        return ("none", None) if result is None else ("ok", tuple(result))
    except ValueError as exc:
        return "error", str(exc)


def assert_same_outcome(got, want):
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert got[1] == want[1]
    else:
        assert len(got[1]) == len(want[1]) == 5
        for name, a, b in zip(("heads", "lengths", "distance", "depth", "segment"), got[1], want[1]):
            assert a.dtype == b.dtype and a.device == b.device, name
            assert torch.equal(a, b), name


def list_paths(heads, lengths=None):
    """Outcomes of the Python path, build_tree_tensors(backend="cpp") and _C.tree_distance_lists."""
    python = outcome(lambda: build_tree_tensors(heads, lengths, backend="python"))
    cpp = outcome(lambda: build_tree_tensors(heads, lengths, backend="cpp", num_threads=1))
    lengths_t = None if lengths is None else torch.as_tensor(lengths)
    direct = outcome(lambda: _ext.load().tree_distance_lists(heads, lengths_t, 2))
    return python, cpp, direct


@st.composite
def ragged_lists(draw):
    """Ragged head lists (valid forests, or with out-of-range/self-loop heads), rows as lists or tuples,
    entries as ints or NumPy integers, and optional lengths (sometimes cutting rows short)."""
    sentences, _, _ = draw(forests())
    rows = []
    for s in sentences:
        row = list(s)
        if row and draw(st.integers(0, 7)) == 0:
            row[draw(st.integers(0, len(row) - 1))] = draw(st.integers(-3, len(row) + 2))
        kinds = draw(st.lists(st.sampled_from([int, np.int64, np.int32, np.int8]), min_size=len(row),
                              max_size=len(row)))
        row = [kind(h) if kind is not np.int8 or -128 <= h < 128 else h for kind, h in zip(kinds, row)]
        rows.append(tuple(row) if draw(st.booleans()) else row)
    lengths = None
    if draw(st.booleans()):
        lengths = [draw(st.integers(0, len(r))) for r in rows]
        if draw(st.booleans()):
            lengths = np.array(lengths, dtype=draw(st.sampled_from([np.int64, np.int32, np.uint8])))
    container = tuple if draw(st.booleans()) else list
    return container(rows), lengths


@requires_cpp
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_lists())
@pytest.mark.long_on_cpu
def test_ragged_lists_extension_path_matches_python_path(case):
    heads, lengths = case
    python, cpp, direct = list_paths(heads, lengths)
    assert direct[0] != "none"
    assert_same_outcome(cpp, python)
    assert_same_outcome(direct, python)


LIST_CASES = [
    ([], None), ([], []), ([[]], None), ([[], []], None), ([[], [-1]], None), ([[-1], []], [1, 0]),
    ([[-1, 0, 1], (-1,), [np.int64(-1), np.int16(0)]], None),
    ([[-1, 0, 1], [-1]], torch.tensor([2, 1], dtype=torch.int32)),
    ([[-1, 0, 1], [-1]], np.array([0, 0], dtype=np.uint8)),
    # Errors: types first (over the whole batch), then int64 overflow, then lengths, then the trees.
    ([[-1, 0.0]], None), ([[-1, 0], [-1, "0"]], None), ([[-1, None]], None), ([[-1, True]], None),
    ([[-1, np.True_]], None), ([[-1, np.float32(0)]], None), ([[-1, [0]]], None), ([[torch.tensor(0)]], None),
    ([[-1, 2**70]], None), ([[-1, -2**63 - 1]], None), ([[-1, 2**63]], None), ([[2**63 - 1]], None),
    ([[np.uint64(2**64 - 1)]], None), ([[-1, 2**70], [-1, "x"]], None), ([[-1, 2**70], [2**80]], None),
    ([[-1, 2**70]], [5]), ([[-1, 0], [-1]], [2, 2]), ([[-1, 0]], [3]), ([[-1, 0], [-1]], [2, -1]),
    ([[-1, 0]], [2, 2]), ([[-1, 0]], [[2]]), ([[-1, 0]], torch.tensor([2.0])), ([[-1, 0]], [True]),
    ([[-1, 0]], torch.tensor(2)), ([[-1, 0]], 2), ([[-1, 0.5]], [3]),
    ([[-1, 0, 3]], None), ([[-1, 0], [0, 1]], None), ([[-1, 0], [1, 2, 0]], None), ([[-1, 0, 2]], [2]),
    # Rows that are not lists or tuples take the Python path (tensor rows work; the rest is an error).
    ([[-1, 0], torch.tensor([-1, 0, 1])], None), ([np.array([-1, 0])], None), ([[-1, 0], 3], None),
    ([[-1, 0], "-1 0"], None), ([range(-1, 1)], [1]),
]


@requires_cpp
@pytest.mark.parametrize("heads,lengths", LIST_CASES, ids=[str(i) for i in range(len(LIST_CASES))])
def test_list_cases_same_result_or_message_on_both_paths(heads, lengths):
    python, cpp, direct = list_paths(heads, lengths)
    assert_same_outcome(cpp, python)
    plain = type(heads) in (list, tuple) and all(type(r) in (list, tuple) for r in heads)
    if plain:
        assert_same_outcome(direct, python)
    else:  # the extension hands such batches back to the Python path
        assert direct == ("none", None)


@requires_cpp
def test_list_error_messages_are_the_documented_ones():
    cases = [
        ([[-1, 2**70], [-1, "x"]], None, "batch item 1, token 1: head 'x' is not an integer"),
        ([[-1, 2**70], [2**80]], None, f"batch item 0, token 1: head {2**70} does not fit in int64"),
        ([[np.uint64(2**64 - 1)]], None, "batch item 0, token 0: head np.uint64(18446744073709551615) does not fit in int64"),
        ([[-1, np.True_]], None, "batch item 0, token 1: head np.True_ is not an integer"),
        ([[-1, 2**70]], [5], f"batch item 0, token 1: head {2**70} does not fit in int64"),
        ([[-1, 0]], [True], "lengths must be an integer tensor [B], got dtype torch.bool"),
        ([[-1, 0]], [[2]], "lengths must have shape [B] = [1], got (1, 1)"),
    ]
    for heads, lengths, message in cases:
        for backend in ("python", "cpp"):
            with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
                build_tree_tensors(heads, lengths, backend=backend)


@requires_cpp
def test_lists_skip_the_python_normalization(monkeypatch):
    """Plain ragged lists go to _C.tree_distance_lists (normalize_heads is not called); tensor rows do not."""
    from syntaxkernels.trees import batch as batch_module

    calls = []
    original = batch_module.normalize_heads
    monkeypatch.setattr(batch_module, "normalize_heads", lambda *a, **k: calls.append(1) or original(*a, **k))
    sentences = workloads.generated_sentences(20, seed=3, max_length=30)
    got = build_tree_tensors(sentences)
    assert calls == []
    want = build_tree_tensors(sentences, backend="python")
    assert calls == [1]
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    build_tree_tensors([torch.tensor(s) for s in sentences])
    assert calls == [1, 1]


# ------------------------------------------------------------------------------------------ treebank

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.long_on_cpu
def test_treebank_matches_scipy(ud_dev_path, backend):
    sentences = workloads.treebank_heads(ud_dev_path)
    assert len(sentences) == 2001
    for batch in oracles.batches(sentences, 32):
        distance, depth, segment = build(batch, backend=backend)
        np.testing.assert_array_equal(distance, oracles.scipy_tree_distance(batch))
        want_depth, want_segment = expected_depth_segment(batch, distance.shape[1])
        np.testing.assert_array_equal(depth, want_depth)
        np.testing.assert_array_equal(segment, want_segment)


# ----------------------------------------------------------------------------------------- TreeBatch

def test_tree_batch_to_and_pin_memory():
    batch = TreeBatch.from_heads([[-1, 0, 0], [-1]])
    moved = batch.to("cpu")
    assert moved.distance.dtype == torch.uint8 and torch.equal(moved.distance, batch.distance)
    assert len(moved) == 2 and moved.max_len == 3 and "batch_size=2" in repr(moved)
    try:
        pinned = batch.pin_memory()
    except RuntimeError as exc:  # page-locked memory needs a CUDA (or other accelerator) runtime
        pytest.skip(f"pin_memory unavailable on this build: {exc}")
    assert pinned.distance.is_pinned() and torch.equal(pinned.distance, batch.distance)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_builder_matches_cpp():
    if not _ext.has_cuda_builder():
        pytest.skip("CUDA builder not built")
    sentences = workloads.generated_sentences(64, seed=9)
    heads, lengths = oracles.padded(sentences)
    cpu = _ext.load().tree_distance(heads, lengths, 1)
    gpu = TreeBatch.from_heads(heads.cuda(), lengths.cuda())
    assert gpu.distance.is_cuda
    for a, b in zip(cpu, (gpu.distance, gpu.depth, gpu.segment)):
        assert torch.equal(a, b.cpu())
    with pytest.raises(ValueError, match=re.escape("on a cycle (0 -> 1 -> 0)")):
        _ext.load().tree_distance_cuda(torch.tensor([[1, 0]]).cuda(), torch.tensor([2]).cuda())


@requires_cpp
def test_concurrent_calls_from_python_threads():
    """The builder releases the GIL; concurrent calls from Python threads give the sequential result."""
    from concurrent.futures import ThreadPoolExecutor

    heads, lengths = oracles.padded(workloads.generated_sentences(64, seed=11, max_length=50))
    want = _ext.load().tree_distance(heads, lengths, 1)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: _ext.load().tree_distance(heads, lengths, t), [1, 2, 1, 2, 0, 0]))
    for result in results:
        for a, b in zip(result, want):
            assert torch.equal(a, b)


# ------------------------------------------------------------------------------- relation and window lists

from syntaxkernels.tools.checks.reference import brute_force_masks  # noqa: E402
from syntaxkernels.trees.batch import EdgeLists, build_edge_lists, python_edge_lists  # noqa: E402

LIST_SPECS = [sk.MaskSpec(max_distance=3), sk.MaskSpec(max_distance=1, sibling=False),
              sk.MaskSpec(max_distance=4, parent=False, child=False), sk.MaskSpec(max_distance=2, parent=False)]


def relation_spec(masks):
    return dict(max_distance=masks.max_distance, parent=masks.parent, child=masks.child, sibling=masks.sibling)


def assert_lists_are(lists: EdgeLists, want: torch.Tensor):
    """``lists`` hold exactly the pairs of the bool [B, R, N, N] ``want``, keys and queries increasing."""
    B, R, N, _ = want.shape
    assert (lists.batch_size, lists.num_relations, lists.max_len) == (B, R, N)
    assert torch.equal(lists.to_dense(), want)
    assert torch.equal(lists.nonempty, want.any(dim=-1))
    ptr, t_ptr = lists.row_ptr.long(), lists.t_ptr.long()
    assert ptr[0] == 0 and ptr[-1] == lists.num_edges == t_ptr[-1] and bool((ptr[1:] >= ptr[:-1]).all())
    rows = torch.repeat_interleave(torch.arange(B * N * R), ptr[1:] - ptr[:-1])
    assert torch.equal(lists.rel.long(), rows % R)
    t_rows = torch.repeat_interleave(torch.arange(B * N * R), t_ptr[1:] - t_ptr[:-1])
    assert torch.equal(lists.t_rel.long(), t_rows % R)
    transposed = torch.zeros(B * N * R * N, dtype=torch.bool)
    transposed[t_rows * N + lists.t_col.long()] = True  # [b, j, r, i]
    assert torch.equal(transposed.view(B, N, R, N).permute(0, 2, 3, 1), want)
    for index, row_of in ((lists.col.long(), rows), (lists.t_col.long(), t_rows)):  # increasing within a row
        same_row = row_of[1:] == row_of[:-1]
        assert bool((index[1:][same_row] > index[:-1][same_row]).all())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(max_items=4, max_length=16))
@pytest.mark.long_on_cpu
def test_relation_lists_match_the_head_chains(case):
    """C++ lists (and the PyTorch fallback) hold exactly the pairs of the masks computed by walking the head chains
    (an oracle independent of the distance matrix)."""
    sentences, extra, garbage = case
    heads, lengths, n = padded_with_garbage(sentences, extra, garbage)
    batch = TreeBatch.from_heads(heads, lengths)
    for masks in LIST_SPECS:
        want = brute_force_masks(sentences, n, masks)[:, :masks.max_distance * (masks.parent + masks.child
                                                                                 + masks.sibling)]
        lists = [python_edge_lists(batch.distance, batch.depth, batch.segment, **relation_spec(masks))]
        if HAS_CPP:
            lists.append(build_edge_lists(heads, lengths, **relation_spec(masks), num_threads=2))
        for built in lists:
            assert_lists_are(built, want)
            assert built.names == tuple(masks.names[:built.num_relations])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(max_items=4, max_length=16), st.sampled_from([0, 1, 2, 5, 254]))
@pytest.mark.long_on_cpu
def test_window_lists_are_the_pairs_within_the_window(case, window):
    sentences, extra, garbage = case
    heads, lengths, n = padded_with_garbage(sentences, extra, garbage)
    batch = TreeBatch.from_heads(heads, lengths)
    want = (batch.distance.int() <= window)[:, None]
    assert_lists_are(python_edge_lists(batch.distance, batch.depth, batch.segment, window=window), want)
    if HAS_CPP:
        lists = build_edge_lists(heads, lengths, window=window)
        assert_lists_are(lists, want)
        assert lists.names == (f"window_{window}",)


@requires_cpp
def test_lists_of_a_long_chain_and_a_star():
    """Distances saturate at 254 (window 254 keeps the whole tree); a star's sibling lists are quadratic."""
    chain = list(range(-1, 299))
    lists = build_edge_lists(torch.tensor([chain]), torch.tensor([300]), window=254)
    assert lists.num_edges == 300 * 300
    assert build_edge_lists(torch.tensor([chain]), torch.tensor([300]), window=253).num_edges < 300 * 300
    star = torch.tensor([[-1] + [0] * 99])
    lists = build_edge_lists(star, torch.tensor([100]), max_distance=1, parent=False, child=False)
    assert lists.num_edges == 99 * 98 and lists.names == ("sibling_2",)


@pytest.mark.parametrize("heads, lengths, message", [
    ([[-1, 0], [-1, 2, 3, 1]], None, "batch item 1, token 1: on a cycle (1 -> 2 -> 3 -> 1) that never reaches a root"),
    ([[-1, 0, 3]], None, "batch item 0, token 2: head 3 out of range (length 3; expected -1 for a root or 0..2)"),
    ([[-1, 1]], None, "batch item 0, token 1: self-loop (its head is itself; use -1 for a root)"),
    ([[-1], [-1]], [1, 2], "batch item 1: lengths[1] = 2 is larger than N = 1"),
])
def test_list_builder_reports_the_tree_builders_errors(heads, lengths, message):
    heads_t, given, _ = padded_with_garbage(heads, 0, -1)
    lengths_t = torch.tensor(lengths) if lengths is not None else given
    with pytest.raises(ValueError) as tree_error:
        TreeBatch.from_heads(heads_t, lengths_t)
    assert str(tree_error.value) == message
    if HAS_CPP:
        for spec in (dict(max_distance=2), dict(window=3)):
            with pytest.raises(ValueError) as list_error:
                build_edge_lists(heads_t, lengths_t, **spec)
            assert str(list_error.value) == message


def test_list_builder_rejects_bad_specs():
    heads, lengths = torch.tensor([[-1, 0]]), torch.tensor([2])
    with pytest.raises(ValueError, match="max_distance"):
        build_edge_lists(heads, lengths, max_distance=0)
    with pytest.raises(ValueError, match="no relation enabled"):
        build_edge_lists(heads, lengths, parent=False, child=False, sibling=False)
    with pytest.raises(ValueError, match="window"):
        build_edge_lists(heads, lengths, window=255)
    with pytest.raises(ValueError, match="window"):
        TreeBatch.from_heads([[-1, 0]]).window_lists(-1)
    with pytest.raises(TypeError, match="MaskSpec"):
        TreeBatch.from_heads([[-1, 0]]).relation_lists("parent")
    def _tensors(heads):
        batch = TreeBatch.from_heads(heads)
        return batch.distance, batch.depth, batch.segment

    # the relation keywords are the kinds of specs.RELATIONS, nothing else (both builders)
    for builder, inputs in ((build_edge_lists, (heads, lengths)), (python_edge_lists, _tensors(heads))):
        with pytest.raises(TypeError, match="'sibbling' .*parent, child, sibling"):
            builder(*inputs, sibbling=False)


def test_mask_spec_is_the_one_list_of_relations():
    """Names, order, R and the lists' cache key all come from MaskSpec (specs.RELATIONS, then DENSE_MASKS)."""
    from syntaxkernels.specs import DENSE_MASKS, RELATIONS

    assert [kind for kind, _ in RELATIONS] == ["parent", "child", "sibling"] and DENSE_MASKS == ("pairwise", "full")
    masks = sk.MaskSpec(max_distance=2, child=False, pairwise=True)
    assert masks.relation_kinds == ("parent", "sibling") and masks.dense_kinds == ("pairwise", "full")
    assert masks.num_relations == 4 and masks.num_masks == 6
    assert masks.relation_names == ("parent_1", "parent_2", "sibling_2", "sibling_3")
    assert masks.names == [*masks.relation_names, "pairwise", "full"]
    assert masks.kinds() == [("parent", 1), ("parent", 2), ("sibling", 2), ("sibling", 3), ("pairwise", 0), ("full", 0)]
    assert masks.relation_key() == sk.MaskSpec(max_distance=2, child=False, full=False).relation_key()
    assert masks.relation_key() != sk.MaskSpec(max_distance=3, child=False).relation_key()
    dense_only = sk.MaskSpec(parent=False, child=False, sibling=False)
    assert dense_only.num_relations == 0 and dense_only.relation_names == () and dense_only.names == ["full"]


@requires_cpp
def test_cpp_list_builder_walks_the_kinds_it_is_given():
    """The C++ builder takes the relation kinds by name, in the spec's order, and rejects unknown or repeated ones."""
    module = _ext.load()
    heads, lengths = torch.tensor([[-1, 0, 1, 0, 3]]), torch.tensor([5])
    batch = TreeBatch.from_heads(heads, lengths)
    for kinds in (["parent", "child", "sibling"], ["sibling", "parent"], ["child"]):
        row_ptr, col, *_ = module.edge_lists(heads, lengths, 2, kinds, -1, 1)
        R = 2 * len(kinds)
        names = [f"{kind}_{d + (kind == 'sibling')}" for kind in kinds for d in (1, 2)]
        dense = torch.zeros(5 * R * 5, dtype=torch.bool)
        rows = torch.repeat_interleave(torch.arange(5 * R), (row_ptr[1:] - row_ptr[:-1]).long())
        dense[rows * 5 + col.long()] = True
        got = dense.view(5, R, 5).permute(1, 0, 2)
        want = torch.stack([sk.reference.syntax_masks(batch, sk.MaskSpec(max_distance=2, full=False))[
            0, sk.MaskSpec(max_distance=2, full=False).names.index(name)] for name in names])
        assert torch.equal(got, want), kinds
    with pytest.raises(ValueError, match="unknown relation kind 'uncle'"):
        module.edge_lists(heads, lengths, 2, ["parent", "uncle"], -1, 1)
    with pytest.raises(ValueError, match="relation kind 'parent' listed twice"):
        module.edge_lists(heads, lengths, 2, ["parent", "parent"], -1, 1)
    with pytest.raises(ValueError, match="no relation enabled"):
        module.edge_lists(heads, lengths, 2, [], -1, 1)


def test_tree_batch_caches_lists_and_carries_them():
    batch = TreeBatch.from_heads([[-1, 0, 0, 1], [1, -1]])
    masks = sk.MaskSpec(max_distance=2)
    lists = batch.relation_lists(masks)
    assert batch.relation_lists(sk.MaskSpec(max_distance=2, pairwise=True)) is lists  # same relations
    assert batch.window_lists(2) is batch.window_lists(2) and batch.cached_window_lists(3) is None
    moved = batch.to("cpu")
    assert moved.relation_lists(masks) is not lists and torch.equal(moved.relation_lists(masks).col, lists.col)
    assert moved.cached_window_lists(2) is not None
    assert lists.to(torch.float16).col.dtype == torch.int32  # a dtype never converts the lists


def test_tree_batch_pins_its_lists():
    batch = TreeBatch.from_heads([[-1, 0, 0, 1], [1, -1]])
    masks = sk.MaskSpec(max_distance=2)
    batch.relation_lists(masks)
    batch.window_lists(2)
    try:
        pinned = batch.pin_memory()
    except RuntimeError as exc:  # page-locked memory needs a CUDA (or other accelerator) runtime
        pytest.skip(f"pin_memory unavailable on this build: {exc}")
    assert pinned.relation_lists(masks).col.is_pinned() and pinned.cached_window_lists(2).t_ptr.is_pinned()


def test_collator_builds_lists_in_dataloader_workers():
    from syntaxkernels.trees import TreeCollator

    masks = sk.MaskSpec(max_distance=2)
    collator = TreeCollator(masks=masks, windows=(1, 3))
    items = [{"input_ids": [5, 6, 7], "heads": [-1, 0, 1]}, {"input_ids": [8, 9], "heads": [1, -1]}]
    loader = torch.utils.data.DataLoader(items * 2, batch_size=2, collate_fn=collator, num_workers=1)
    for batch in loader:
        trees = batch["trees"]
        keys = {key for key in trees._derived if key[0] in ("window lists", "relation lists")}
        assert ("window lists", 1) in keys and ("window lists", 3) in keys and len(keys) == 3
        want = TreeBatch.from_heads([[-1, 0, 1], [1, -1]])
        assert torch.equal(trees.relation_lists(masks).col, want.relation_lists(masks).col)
    with pytest.raises(ValueError, match="windows"):
        TreeCollator(windows=(255,))
    with pytest.raises(TypeError, match="masks"):
        TreeCollator(masks="parent")
