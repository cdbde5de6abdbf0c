"""Edge-list attention against the dense reference: the C++ kernels (CPU) and the Triton kernels (CUDA, or CPU
under TRITON_INTERPRET=1), forward and every gradient, on relation and window lists of random trees, forests,
stars, chains, packed documents, ragged batches with empty items; exact zeros for empty rows; determinism; the
torch.library ops; the GAT's windowed attention (``syntax_window_attention``, ``SyntaxGAT``); bad inputs.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import edge_attention as E
from syntaxkernels.ops.edge_attention import _kernels as EK
from syntaxkernels.ops.edge_attention import configs as EC
from syntaxkernels.ops._dispatch import interpreting
from syntaxkernels.tools.testing import assert_close_to_reference

from conftest import CPP, HAS_EDGE_CPP, KERNEL_DEVICE, TRITON, needs_cpp, needs_triton, trees_of_kind


def lists_of(trees: sk.TreeBatch, which):
    return trees.window_lists(which) if isinstance(which, int) else trees.relation_lists(which)


def run(fn, tensors, grad, dtype):
    """Output and (dq, dk, dv) of ``fn`` on copies of ``tensors`` in ``dtype``, backpropagating ``grad``."""
    inputs = [t.to(dtype).requires_grad_(True) for t in tensors]
    out = fn(*inputs)
    return out, torch.autograd.grad(out, inputs, grad.to(out.dtype))


def check_against_reference(trees, which, backend, device, dtype, H=None, D=16, DV=None, seed=0):
    lists = lists_of(trees, which).to(device)
    if H is None:  # one head under the interpreter keeps the Triton tests fast
        H = 1 if backend == "triton" and interpreting() else 2
    B, N = trees.batch_size, trees.max_len
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float64).to(device) for _ in range(2))
    v = torch.randn(B, H, N, DV or D, generator=gen, dtype=torch.float64).to(device)
    grad = torch.randn(B, lists.num_relations, H, N, DV or D, generator=gen, dtype=torch.float64).to(device)

    def kernel(q, k, v):
        return E.edge_list_attention(q, k, v, lists, backend=backend)[0]

    def ref(q, k, v):
        return E.edge_list_attention(q, k, v, lists, backend="reference")[0]

    out, grads = run(kernel, (q, k, v), grad, dtype)
    out64, grads64 = run(ref, (q, k, v), grad, torch.float64)
    outlow, gradslow = run(ref, (q, k, v), grad, dtype)
    assert out.dtype == dtype and out.shape == (B, lists.num_relations, H, N, DV or D)
    assert_close_to_reference(out, out64, outlow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)
    # Empty rows: exactly zero output; tokens in no list at all: exactly zero gradients.
    empty_rows = ~lists.nonempty[:, :, None, :, None].expand_as(out)
    assert torch.all(out[empty_rows] == 0)
    dense = lists.to_dense()  # [B, R, N, N]
    no_query_edge = ~dense.any(dim=(1, 3))  # token i lists nothing
    no_key_edge = ~dense.any(dim=(1, 2))  # token j is in no list
    assert torch.all(grads[0].permute(0, 2, 1, 3)[no_query_edge] == 0)
    assert torch.all(grads[1].permute(0, 2, 1, 3)[no_key_edge] == 0)
    assert torch.all(grads[2].permute(0, 2, 1, 3)[no_key_edge] == 0)
    counts = lists.row_ptr[1:] - lists.row_ptr[:-1]
    if bool((counts > 1).any()):
        assert all(bool(g.abs().sum() > 0) for g in grads), "a gradient is all zeros"
    elif bool(lists.nonempty.any()):  # every row a gather (a chain's lists): only v gets a gradient
        assert bool(grads[2].abs().sum() > 0)
        if backend == "auto":  # the C++ kernels skip such rows: exactly zero
            assert not bool(grads[0].any()) and not bool(grads[1].any())
    return lists


MASKS = sk.MaskSpec(max_distance=3)
KINDS = ["random", "forest", "star", "chain", "packed"]


# Every case on the C++ kernels; the Triton kernels (slow under the interpreter) on the cases that exercise
# different code paths: long lists (star), several trees, many short rows.
TRITON_KINDS = ("forest", "star", "packed")


def cases(kinds, triton_kinds):
    return ([pytest.param(CPP.values[0], kind, marks=needs_cpp, id=f"cpp-{kind}") for kind in kinds]
            + [pytest.param(TRITON.values[0], kind, marks=needs_triton, id=f"triton-{kind}") for kind in triton_kinds])


@pytest.mark.parametrize("backend_device,kind", cases(KINDS, TRITON_KINDS))
@pytest.mark.long_on_cpu
def test_relation_lists_match_reference_fp32(backend_device, kind):
    backend, device = backend_device
    check_against_reference(trees_of_kind(kind, 19), MASKS, backend, device, torch.float32)


WINDOW_CASES = [("random", 2), ("packed", 4), ("star", 0), ("chain", 254)]


@pytest.mark.parametrize("backend_device,case", cases(WINDOW_CASES, WINDOW_CASES[:2]))
def test_window_lists_match_reference_fp32(backend_device, case):
    backend, device = backend_device
    kind, window = case
    check_against_reference(trees_of_kind(kind, 17), window, backend, device, torch.float32)


# Small work items split every long row across items (partial segments merged by log-sum-exp, partial dq / dk /
# dv summed): the paths that on real batches only hub rows ([CLS], long windows) take.
@needs_triton
@pytest.mark.parametrize("chunk,kind,which", [(3, "star", MASKS), (2, "packed", MASKS), (1, "forest", MASKS),
                                              (2, "random", MASKS), (4, "star", 3), (3, "packed", 254),
                                              (2, "chain", 3)],
                         ids=["3-star-relations", "2-packed-relations", "1-forest-relations", "2-random-relations",
                              "4-star-window3", "3-packed-window254", "2-chain-window3"])
@pytest.mark.long_on_cpu
def test_split_rows_match_reference(monkeypatch, chunk, kind, which):
    monkeypatch.setattr(E, "SCHEDULE_CHUNK", chunk)
    trees = trees_of_kind(kind, 17, seed=12)
    lists = lists_of(trees, which)
    schedule = lists.schedule(chunk)
    assert schedule.dq_slots > 0 and schedule.dk_slots > 0  # some token is split on both sides
    assert schedule.pieces > 0  # some row is split across items
    check_against_reference(trees, which, "triton", KERNEL_DEVICE, torch.float32)


@needs_triton
def test_int64_row_offsets_match_reference(monkeypatch):
    """Tensors spanning 2^31 elements or more take the int64 offsets: forced here by lowering the limit."""
    monkeypatch.setattr(EK, "_INT32_LIMIT", 0)
    monkeypatch.setattr(E, "SCHEDULE_CHUNK", 3)
    check_against_reference(trees_of_kind("packed", 15, seed=14), MASKS, "triton", KERNEL_DEVICE, torch.float32)


def test_schedule_items_cover_every_edge_once_longest_first():
    """The work items partition each token's edges (query and key side) into chunks, sorted longest first; the
    split rows' partial slots are consecutive, in edge order."""
    from syntaxkernels.trees.batch import build_edge_schedule

    trees = trees_of_kind("star", 23, seed=13)
    for lists in (trees.relation_lists(MASKS), trees.window_lists(2)):
        B, R, N = lists.nonempty.shape
        for chunk in (1, 3, 32):
            s = build_edge_schedule(lists.row_ptr, lists.t_ptr, B, N, R, chunk)
            # Whole rows' and split rows' forward items are apart (each sorted); together they are one table.
            assert bool((s.f_items[-1] == -1).all()) and bool((s.p_items[-1] >= 0).all())
            for table in (s.f_items, s.p_items):
                assert bool((table[-2, :-1] >= table[-2, 1:]).all())
            forward = torch.cat([s.f_items, s.p_items], dim=1)
            forward = forward[:, torch.argsort(-forward[-2], stable=True)]
            sides = []
            for whole, split in ((s.q_items, s.qp_items), (s.k_items, s.kp_items)):
                assert bool((whole[-1] == -1).all()) and bool((split[-1] >= 0).all())
                for table in (whole, split):
                    assert bool((table[-2, :-1] >= table[-2, 1:]).all())
                both = torch.cat([whole, split], dim=1)
                sides.append(both[:, torch.argsort(-both[-2], stable=True)])
            for items, ptr, per, splits in ((forward, lists.row_ptr, 1, (s.merge_rows, s.merge_ptr, s.pieces)),
                                            (sides[0], lists.row_ptr, R, (s.dq_tokens, s.dq_ptr, s.dq_slots)),
                                            (sides[1], lists.t_ptr, R, (s.dk_tokens, s.dk_ptr, s.dk_slots))):
                coordinates = items[:-3].long()
                unit = coordinates[0] * N + coordinates[1]
                if coordinates.shape[0] == 3:  # forward items: rows (b, i, r)
                    unit = unit * R + coordinates[2]
                first, count, slot = (row.long() for row in items[-3:])
                assert bool((count[:-1] >= count[1:]).all()) and bool((count >= 1).all()) and bool((count <= chunk).all())
                covered = torch.zeros(lists.num_edges, dtype=torch.int64)
                for u, f, c in zip(unit.tolist(), first.tolist(), count.tolist()):
                    assert ptr[u * per] <= f and f + c <= ptr[(u + 1) * per]
                    covered[f:f + c] += 1
                assert bool((covered == 1).all())
                # The split units' slots: each used by one item of that unit, in edge order.
                units, offsets, slots = splits
                assert int(offsets[-1]) == slots and sorted(slot[slot >= 0].tolist()) == list(range(slots))
                for k, u in enumerate(units.tolist()):
                    mine = (unit == u).nonzero().flatten()
                    by_edge = mine[torch.argsort(first[mine])]
                    assert slot[by_edge].tolist() == list(range(int(offsets[k]), int(offsets[k + 1])))
                assert bool((slot[~torch.isin(unit, units.long())] == -1).all())


@needs_cpp
def test_cpp_schedule_and_tiles_equal_the_pytorch_ones(monkeypatch):
    """The C++ schedule builder and live-tile count (used when the extension is built) give exactly the tables of
    the PyTorch fallback, for relation and window lists, several chunk sizes and tiles."""
    from syntaxkernels.trees import batch as tree_batch

    for kind in ("star", "packed", "forest", "random"):
        trees = trees_of_kind(kind, 21, seed=15)
        for lists in (trees.relation_lists(MASKS), trees.window_lists(3)):
            B, R, N = lists.nonempty.shape
            built = {chunk: tree_batch.build_edge_schedule(lists.row_ptr, lists.t_ptr, B, N, R, chunk)
                     for chunk in (1, 3, 32)}
            tiles = {tile: lists.tile_count(tile) for tile in (4, 16, 64)}
            with monkeypatch.context() as patch:
                patch.setattr(tree_batch._ext, "load", lambda: None)
                for chunk, cpp in built.items():
                    ref = tree_batch.build_edge_schedule(lists.row_ptr, lists.t_ptr, B, N, R, chunk)
                    assert cpp.sizes() == ref.sizes()
                    for a, b in zip(cpp.tensors(), ref.tensors()):
                        assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b)
                for tile, count in tiles.items():
                    assert tree_batch._live_tiles_torch(lists, tile) == count


@pytest.mark.parametrize("backend_device,kind", cases(["forest", "star"], ["star"]))
def test_bfloat16(backend_device, kind):
    backend, device = backend_device
    n = 15 if backend == "triton" else 23
    check_against_reference(trees_of_kind(kind, n, seed=2), MASKS, backend, device, torch.bfloat16, D=32)


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["fp64", "fp16"])
def test_cpp_float64_and_float16(dtype):
    check_against_reference(trees_of_kind("forest", 21, seed=3), sk.MaskSpec(max_distance=2, pairwise=True), "auto",
                            "cpu", dtype)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
def test_value_head_dim_differs_and_is_not_a_power_of_two(backend_device):
    backend, device = backend_device
    check_against_reference(trees_of_kind("random", 20, seed=4), sk.MaskSpec(max_distance=2), backend, device,
                            torch.float32, D=20, DV=24)


@needs_triton
@pytest.mark.parametrize("dtype,D,DV", [(torch.float32, 64, 64), (torch.bfloat16, 128, 128),
                                        (torch.float32, 100, 72), (torch.bfloat16, 64, 40)],
                         ids=["fp32-64", "bf16-128", "fp32-100-72", "bf16-64-40"])
@pytest.mark.long_on_cpu
def test_rows_over_several_threads_match_reference(dtype, D, DV):
    """Head dims whose rows the kernels spread over 2 or 4 threads (``edge_config``'s TPR; the forward's half
    types over half as many), padded ones included: the row tiles' column order covers every element once."""
    cfg = EC.edge_config(dtype, max(D, DV))
    assert cfg["TPR"] > 1
    check_against_reference(trees_of_kind("star", 15, seed=7), MASKS, "triton", KERNEL_DEVICE, dtype, D=D, DV=DV)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
def test_strided_inputs_and_gradient(backend_device):
    """q, k, v as head-split views of a [B, N, H, 3D] projection; the output gradient a slice of a larger one."""
    backend, device = backend_device
    trees = trees_of_kind("packed", 18, seed=5)
    lists = trees.relation_lists(MASKS).to(device)
    B, N, H, D = trees.batch_size, trees.max_len, 2, 16
    x = torch.randn(B, N, H, 3 * D, dtype=torch.float64, device=device)
    wide = torch.randn(B, lists.num_relations + 2, H, N, D, dtype=torch.float64, device=device)

    def split(x):
        return [t.transpose(1, 2) for t in x.split(D, dim=-1)]

    xs = x.float().requires_grad_(True)
    q, k, v = split(xs)
    assert not q.is_contiguous()
    out, _ = E.edge_list_attention(q, k, v, lists, backend=backend)
    (grad_x,) = torch.autograd.grad(out, xs, wide[:, 1:-1].float())
    x64 = x.clone().requires_grad_(True)
    ref, _ = E.edge_list_attention(*split(x64), lists, backend="reference")
    (grad64,) = torch.autograd.grad(ref, x64, wide[:, 1:-1])
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_x.double(), grad64, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
def test_scale_argument(backend_device):
    backend, device = backend_device
    trees = trees_of_kind("forest", 15, seed=6)
    lists = trees.relation_lists(MASKS).to(device)
    q, k, v = (torch.randn(3, 1, 15, 16, device=device) for _ in range(3))
    out, _ = E.edge_list_attention(q, k, v, lists, scale=0.7, backend=backend)
    ref, _ = E.edge_list_attention(q, k, v, lists, scale=0.7, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    default, _ = E.edge_list_attention(q, k, v, lists, backend=backend)
    assert not torch.allclose(default, out)


@needs_triton
@pytest.mark.parametrize("which", [MASKS, 3], ids=["relations", "window3"])
def test_wide_score_range_moves_the_lazy_softmax_reference(which):
    """Scores spread over tens of log2 units: the forward's lazy online softmax moves its reference point
    (RESCALE_SLACK) after a row's first edge too; output and gradients still match the float64 reference."""
    trees = trees_of_kind("star", 17, seed=3)
    lists = lists_of(trees, which).to(KERNEL_DEVICE)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 1, 17, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    grad = torch.randn(2, lists.num_relations, 1, 17, 16, generator=gen, dtype=torch.float64)
    scale = 4.0  # score std ~16: a later key often beats the reference by more than 2^8

    def fn(backend):
        return lambda q, k, v: E.edge_list_attention(q, k, v, lists, scale=scale, backend=backend)[0]

    tensors = tuple(t.to(KERNEL_DEVICE) for t in (q, k, v))
    out, grads = run(fn("triton"), tensors, grad.to(KERNEL_DEVICE), torch.float32)
    ref, grads64 = run(fn("reference"), tensors, grad.to(KERNEL_DEVICE), torch.float64)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-3, rtol=1e-3)


@needs_cpp
def test_cpp_is_deterministic_across_thread_counts():
    trees = trees_of_kind("star", 40, seed=7)
    lists = trees.relation_lists(MASKS)
    q, k, v = (torch.randn(2, 3, 40, 32, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, lists.num_relations, 3, 40, 32)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 1):
            torch.set_num_threads(count)
            out, _ = E.edge_list_attention(q, k, v, lists)
            results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_auto_backend_on_cpu_runs_the_cpp_kernels(monkeypatch):
    trees = trees_of_kind("random", 12)
    lists = trees.relation_lists(MASKS)
    q, k, v = (torch.randn(3, 1, 12, 8) for _ in range(3))
    assert E.implementation(q, v, "auto") == ("cpp" if HAS_EDGE_CPP else "reference")
    if HAS_EDGE_CPP:
        monkeypatch.setattr(E, "_reference_edge_attention", lambda *a: pytest.fail("the reference ran"))
        E.edge_list_attention(q, k, v, lists)


# ---------------------------------------------------------------------------------------------------------
# The torch.library ops
# ---------------------------------------------------------------------------------------------------------

def _op_args(device):
    trees = trees_of_kind("forest", 7)
    lists = trees.relation_lists(sk.MaskSpec(max_distance=2)).to(device)
    q, k, v = (torch.randn(3, 2, 7, 16, device=device) for _ in range(3))
    return lists, q, k, v


@needs_cpp
def test_cpp_ops_pass_opcheck():
    lists, q, k, v = _op_args("cpu")
    utils = ("test_schema", "test_faketensor")
    args = (q, k, v, lists.row_ptr, lists.col, lists.num_relations, 0.25)
    torch.library.opcheck(torch.ops.syntaxkernels.edge_attention_cpu_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.edge_attention_cpu_fwd(*args)
    assert lse.dtype == torch.float32 and torch.isinf(lse[~lists.nonempty[:, :, None, :].expand_as(lse)]).all()
    bwd = (torch.randn_like(out), q, k, v, out, lse, lists.row_ptr, lists.col, lists.rel, lists.t_ptr, lists.t_col,
           lists.t_rel, 0.25)
    torch.library.opcheck(torch.ops.syntaxkernels.edge_attention_cpu_bwd, bwd, test_utils=utils)


@needs_triton
@pytest.mark.parametrize("chunk", [32, 2])
def test_triton_ops_pass_opcheck(chunk):
    lists, q, k, v = _op_args(KERNEL_DEVICE)
    schedule = lists.schedule(chunk)
    utils = ("test_schema", "test_faketensor")
    args = (q, k, v, lists.col, lists.rel, schedule.tensors(), schedule.sizes(), lists.num_relations, 0.25)
    torch.library.opcheck(torch.ops.syntaxkernels.edge_attention_fwd, args, test_utils=utils)
    out, lse = torch.ops.syntaxkernels.edge_attention_fwd(*args)
    assert out.shape == (3, lists.num_relations, 2, 7, 16) and lse.shape == (3, lists.num_relations, 2, 7)
    assert torch.isinf(lse[~lists.nonempty[:, :, None, :].expand_as(lse)]).all()
    bwd = (torch.randn_like(out), q, k, v, out, lse, lists.col, lists.rel, lists.t_col, lists.t_rel,
           schedule.tensors(), schedule.sizes(), 0.25)
    torch.library.opcheck(torch.ops.syntaxkernels.edge_attention_bwd, bwd, test_utils=utils)


@needs_cpp
def test_cpp_kernel_rejects_inconsistent_lists():
    lists, q, k, v = _op_args("cpu")
    bad = lists.col.clone()
    bad[0] = 7  # a token past N
    with pytest.raises(RuntimeError, match="outside 0..6"):
        torch.ops.syntaxkernels.edge_attention_cpu_fwd(q, k, v, lists.row_ptr, bad, lists.num_relations, 0.25)
    with pytest.raises(RuntimeError, match="offsets"):
        torch.ops.syntaxkernels.edge_attention_cpu_fwd(q, k, v, lists.row_ptr[:-1], lists.col, lists.num_relations,
                                                       0.25)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------------------

def test_bad_inputs():
    trees = trees_of_kind("random", 12)
    lists = trees.relation_lists(MASKS)
    q, k, v = (torch.randn(3, 1, 12, 8) for _ in range(3))
    with pytest.raises(TypeError, match="EdgeLists"):
        E.edge_list_attention(q, k, v, trees, backend="reference")
    with pytest.raises(ValueError, match="lists are for B = 3, N = 12"):
        E.edge_list_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], lists)
    with pytest.raises(ValueError, match="q, k, v"):
        E.edge_list_attention(q, k[:, :, :10], v, lists)
    with pytest.raises(ValueError, match="backend"):
        E.edge_list_attention(q, k, v, lists, backend="cuda")
    with pytest.raises(ValueError, match="window"):
        E.syntax_window_attention(q, k, v, trees, window=255)
    with pytest.raises(ValueError, match="window"):
        E.syntax_window_attention(q, k, v, trees, window=None)
    with pytest.raises(ValueError, match="distance"):
        E.syntax_window_attention(q, k, v, trees.distance.float(), window=2)


@needs_triton
def test_triton_refuses_float64_and_wide_heads():
    trees = trees_of_kind("random", 12)
    lists = trees.relation_lists(MASKS).to(KERNEL_DEVICE)
    q = torch.randn(3, 1, 12, 8, dtype=torch.float64, device=KERNEL_DEVICE)
    with pytest.raises(ValueError, match="float64"):
        E.edge_list_attention(q, q, q, lists, backend="triton")
    wide = torch.randn(3, 1, 12, 160, device=KERNEL_DEVICE)
    with pytest.raises(ValueError, match="head dims"):
        E.edge_list_attention(wide, wide, wide, lists, backend="triton")


# ---------------------------------------------------------------------------------------------------------
# The GAT's windowed attention
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend_device,window", cases([0, 1, 3], [1]))
def test_window_attention_matches_gat_reference(backend_device, window):
    backend, device = backend_device
    trees = trees_of_kind("packed", 21, seed=8).to(device)
    q, k, v = (torch.randn(2, 2, 21, 16, dtype=torch.float64, device=device) for _ in range(3))
    grad = torch.randn(2, 2, 21, 16, dtype=torch.float64, device=device)
    out, grads = run(lambda q, k, v: E.syntax_window_attention(q, k, v, trees, window=window, backend=backend),
                     (q, k, v), grad, torch.float32)
    out64, grads64 = run(lambda q, k, v: reference.gat_attention(q, k, v, trees.distance, window=window,
                                                                 lengths=trees.lengths), (q, k, v), grad,
                         torch.float64)
    outlow, gradslow = run(lambda q, k, v: reference.gat_attention(q, k, v, trees.distance, window=window,
                                                                   lengths=trees.lengths), (q, k, v), grad,
                           torch.float32)
    assert_close_to_reference(out, out64, outlow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)


@needs_cpp
def test_window_attention_from_distance_and_custom_lengths():
    """A bare distance tensor, and lengths shorter than the trees' (int or key-padding mask): lists from the
    distance, padding keys never weighted, padding rows zero."""
    trees = trees_of_kind("random", 16, seed=9)
    q, k, v = (torch.randn(3, 2, 16, 8, dtype=torch.float64) for _ in range(3))
    for lengths in (None, torch.tensor([10, 5, 0]), torch.arange(16)[None, :] >= torch.tensor([[12], [8], [0]])):
        want = reference.gat_attention(q, k, v, trees.distance, window=2,
                                       lengths=trees.lengths if lengths is None else lengths)
        for source in (trees, trees.distance):
            got = E.syntax_window_attention(q, k, v, source, window=2, lengths=lengths)
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@needs_cpp
def test_syntax_gat_runs_the_window_on_edge_lists():
    trees = trees_of_kind("packed", 20, seed=10)
    torch.manual_seed(0)
    fast = sk.nn.SyntaxGAT(16, num_layers=2, num_heads=2, head_dim=8, window=2, num_pos_tags=0).double()
    slow = sk.nn.SyntaxGAT(16, num_layers=2, num_heads=2, head_dim=8, window=2, num_pos_tags=0,
                           backend="reference").double()
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    out_fast, out_slow = fast(x, trees), slow(x, trees)
    assert ("window lists", 2) in trees._derived  # the edge path ran and kept its lists on the batch's plan
    torch.testing.assert_close(out_fast, out_slow, atol=1e-12, rtol=0)
    grads_fast = torch.autograd.grad(out_fast.square().sum(), list(fast.parameters()))
    grads_slow = torch.autograd.grad(out_slow.square().sum(), list(slow.parameters()))
    for a, b in zip(grads_fast, grads_slow):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def _heads(rows, N):
    heads = torch.full((len(rows), N), -1, dtype=torch.int64)
    for b, row in enumerate(rows):
        heads[b, :len(row)] = torch.tensor(row)
    return sk.TreeBatch.from_heads(heads, torch.tensor([len(r) for r in rows]))


def test_window_path_model_decides_on_live_tiles_not_global_density():
    """The window's path on a GPU (``window_takes_edges``): the edge kernels where the live 64 x 64 tiles hold
    few pairs, the LUT kernel where they are dense. A random tree of 2048 tokens (heads anywhere before the token)
    spreads its window-1 pairs over most tiles (edges); one long tree of sentences keeps them near the diagonal:
    window 4 leaves ~11 score elements of live tiles per edge (the LUT kernel) though it keeps only 1.3% of the
    B N^2 pairs, where the old global-density rule (E <= B N^2 / 16) put both on the edges."""
    import random

    from syntaxkernels.tools.workloads import chain_sentences, connect_sentences, generated_sentences

    rng = random.Random(0)
    scattered = _heads([[-1] + [rng.randrange(i) for i in range(1, 2048)]], 2048).window_lists(1)
    sentences = generated_sentences(400, seed=0, max_length=40)
    local = _heads(chain_sentences(sentences, 2048, rows=1), 2048).window_lists(4)
    for lists, edges in ((scattered, True), (local, False)):
        B, _, N = lists.nonempty.shape
        assert E.window_takes_edges(lists, 64) is edges and lists.num_edges <= B * N * N / 16
        edge, dense_cost = E.window_costs(lists, 64)
        s = lists.schedule()
        items = (s.f_items.shape[1] + s.p_items.shape[1], s.q_items.shape[1] + s.qp_items.shape[1],
                 s.k_items.shape[1] + s.kp_items.shape[1])
        assert edge == E.EDGE_SLOT_COST[64] * lists.num_edges + sum(
            c * n for c, n in zip(E.EDGE_ITEM_COST[64], items))
        assert dense_cost == E.DENSE_ELEMENT_COST[64] * 64 * 64 * lists.tile_count()
    # The live tiles, counted against a direct enumeration of the pairs.
    dense = _heads(connect_sentences(sentences, 256, rows=2), 256).window_lists(4)
    dense_pairs = dense.to_dense()[:, 0].nonzero()
    assert dense.tile_count() == len({(int(b), int(i) // 64, int(j) // 64) for b, i, j in dense_pairs})
    assert dense.tile_count(16) == len({(int(b), int(i) // 16, int(j) // 16) for b, i, j in dense_pairs})


def test_lists_moved_to_another_device_carry_schedule_and_tiles(monkeypatch):
    """The lists come with their schedule and (windows) live tiles built on the CPU; ``EdgeLists.to`` (to another
    device) builds them first if missing, so a GPU call reads nothing back; the moved lists carry them. The move
    goes to the meta device here (no GPU)."""
    lists = trees_of_kind("packed", 20).window_lists(2)
    assert lists.cached_schedule() is not None and lists.live_tiles is not None
    lists._schedules.clear()
    lists.live_tiles = None
    moved = lists.to("meta")
    assert lists.cached_schedule() is not None and lists.live_tiles == lists.tile_count()
    assert moved.cached_schedule() is not None and moved.live_tiles == lists.live_tiles
    assert moved.cached_schedule().q_items.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_window_uses_cached_lists_only():
    trees = trees_of_kind("packed", 64, seed=11)
    q, k, v = (torch.randn(2, 2, 64, 32, device="cuda") for _ in range(3))
    on_gpu = trees.to("cuda")
    dense = E.syntax_window_attention(q, k, v, on_gpu, window=1)  # no cached lists: the dense kernel
    assert ("window lists", 1) not in on_gpu._derived
    trees.window_lists(1)
    cached = trees.to("cuda")
    edges = E.syntax_window_attention(q, k, v, cached, window=1)
    torch.testing.assert_close(edges, dense, atol=2e-3, rtol=2e-3)
