"""The bias op on the inputs real batches bring: odd N (padded distance rows), directed (non-symmetric)
distances, shape checks while torch.compile traces, and every GPU family's tiles under the interpreter."""
import pickle

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.plan import structure_plan
from syntaxkernels.ops import _dispatch
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops.bias_attention import _backward, _forward, _host, _launch, configs
from syntaxkernels.trees import batch as tb

from conftest import KERNEL_DEVICE as DEVICE
from conftest import needs_triton
from test_bias_attention import _spy_launches, check_against_reference, make_case


# ----------------------------------------------------------------------------------------------------------
# Distance layout: rows padded to 16 bytes
# ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N", [1, 5, 16, 17, 77])
def test_tree_batch_distance_rows_are_16_byte_aligned(N):
    heads = [[-1] + list(range(N - 1)), [-1] * (N // 2)]
    trees = sk.TreeBatch.from_heads(heads)
    d = trees.distance
    assert d.shape == (2, N, N) and d.stride(-1) == 1
    assert d.stride(0) % 16 == 0 and d.stride(1) % 16 == 0 and d.storage_offset() % 16 == 0
    # The values are those of the plain builder, padding included.
    assert torch.equal(d, sk.tree_distance(heads))
    assert trees.symmetric and trees.kernel_lengths.dtype == torch.int32
    # .to() and pickling (DataLoader workers) keep the padded rows and what is known of them.
    for moved in (trees.to("cpu", non_blocking=True), trees.to(torch.device("meta")),
                  pickle.loads(pickle.dumps(trees))):
        assert moved.distance.stride() == d.stride() and moved.symmetric
        if moved.distance.device.type != "meta":
            assert torch.equal(moved.distance, d)


def test_aligned_distance_copies_only_unaligned_tensors():
    aligned = torch.zeros(2, 32, 32, dtype=torch.uint8)
    assert tb.aligned_distance(aligned) is aligned
    odd = torch.randint(0, 256, (3, 21, 21), dtype=torch.uint8)
    copy = tb.aligned_distance(odd)
    assert copy.data_ptr() != odd.data_ptr() and torch.equal(copy, odd)
    assert copy.stride() == (32 * 32, 32, 1)  # a [3, 32, 32] buffer: rows and columns padded to 16
    shifted = torch.zeros(16 * 16 + 1, dtype=torch.uint8)[1:].view(1, 16, 16)  # start not 16-byte aligned
    assert tb.aligned_distance(shifted).storage_offset() % 16 == 0
    # A plain tensor is not known to be symmetric, whatever its values.
    assert not structure_plan(aligned).symmetric


@needs_triton
def test_odd_n_reads_the_tree_batch_distance_in_place(monkeypatch):
    """The launchers get the TreeBatch's padded rows themselves (no per-call copy) and per-row buffers whose
    rows are 16 floats apart, whatever N."""
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1, 2, 2], [-1, 0, 1]])
    N = trees.max_len
    q = torch.randn(2, 2, N, 32, device=DEVICE, requires_grad=True)
    k, v = torch.randn_like(q), torch.randn_like(q)
    trees = trees.to(DEVICE)
    d = trees.distance
    seen = []
    real_launch = P.launch

    def spy(kernel, grid, *args, **kwargs):
        name = kernel.fn.__name__
        # The distance's place: after q, k, v (and dout; the dQ kernel also takes the output).
        where = {"_bias_fwd_kernel": 3, "_bias_bwd_dq_kernel": 5, "_bias_bwd_dkdv_kernel": 4,
                 "_bias_bwd_table_kernel": 4}
        if name in where:
            distance = args[where[name]]
            assert distance.dtype == torch.uint8, name
            seen.append((name, distance.data_ptr(), distance.stride()))
        real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    table = torch.randn(sk.BucketSpec().num_buckets, device=DEVICE, requires_grad=True)
    out = sk.syntax_bias_attention(q, k, v, trees, table, buckets=sk.BucketSpec(), backend="triton")
    out.sum().backward()
    assert {name for name, _, _ in seen} == {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel",
                                             "_bias_bwd_table_kernel"}
    for name, ptr, stride in seen:
        assert ptr == d.data_ptr() and stride == d.stride(), name
    _, lse, _, _ = _launch.bias_attention_forward(q.detach(), k, v, d, torch.zeros(1, 12, device=DEVICE),
                                                  torch.ones(1, device=DEVICE), _host._bucket_lut(sk.BucketSpec(), d),
                                                  trees.kernel_lengths, None, None, 0.1, -1, False)
    assert lse.shape == (2, 2, N) and lse.stride(1) % 16 == 0


# ----------------------------------------------------------------------------------------------------------
# Directed distances: exact gradients
# ----------------------------------------------------------------------------------------------------------

def _directed_case(B=2, N=40, dtype=torch.float32, seed=0):
    case = make_case(B, 2, N, 32, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    case["distance"] = torch.randint(0, 256, (B, N, N), dtype=torch.uint8, generator=gen)
    assert not torch.equal(case["distance"], case["distance"].transpose(1, 2))
    return case


@needs_triton
@pytest.mark.parametrize("opts", [dict(), dict(window=6), dict(causal=True)], ids=["plain", "window", "causal"])
@pytest.mark.long_on_cpu
def test_directed_distance_gets_exact_gradients(opts):
    check_against_reference(_directed_case(N=40 if not opts else 33), **opts)


@needs_triton
@pytest.mark.long_on_cpu
def test_symmetric_flag_is_what_the_backward_trusts():
    """symmetric=True on a directed distance reads it transposed as it is: the dK/dV gradients differ from the
    reference's, which shows the default path's transposed copy is what makes them exact."""
    case = _directed_case()
    q, k, v = (case[n].to(DEVICE).requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(DEVICE).requires_grad_()
    d = case["distance"].to(DEVICE)

    def grads(**kw):
        out = sk.syntax_bias_attention(q, k, v, d, table, buckets=case["buckets"], backend="triton", **kw)
        return torch.autograd.grad(out.square().sum(), (q, k, table))

    exact = grads()
    trusted = grads(symmetric=True)
    torch.testing.assert_close(trusted[0], exact[0])  # dQ reads the distance as it is either way
    assert (trusted[1] - exact[1]).abs().max() > 1e-2 * exact[1].abs().max()
    with pytest.raises(ValueError, match="symmetric"):
        sk.syntax_bias_attention(q, k, v, d, table, buckets=case["buckets"], backend="triton", symmetric="yes")


# ----------------------------------------------------------------------------------------------------------
# Shape checks while torch.compile traces
# ----------------------------------------------------------------------------------------------------------

@needs_triton
def test_shape_checks_run_while_compiling():
    case = make_case(1, 2, 24, 32, torch.float32)
    q, k, v = (case[n].to(DEVICE) for n in ("q", "k", "v"))
    small = case["distance"][:, :16, :16].contiguous().to(DEVICE)

    def f(q, k, v, distance, table):
        return sk.syntax_bias_attention(q, k, v, distance, table, buckets=sk.BucketSpec(), backend="triton")

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"distance must have shape \[B, N, N\]"):
        compiled(q, k, v, small, case["table"].to(DEVICE))


def test_cpu_edge_backward_fake_has_the_real_strides():
    """The fake of the C++ edge backward returns contiguous gradients, as the real op does, also for the
    transposed q, k, v the modules pass."""
    from conftest import HAS_EDGE_CPP

    if not HAS_EDGE_CPP:
        pytest.skip("C++ extension not built")
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1], [-1, 0, 1]])
    lists = trees.relation_lists(sk.MaskSpec())
    x = torch.randn(2, 5, 2, 16)
    q, k, v = (x.transpose(1, 2) for _ in range(3))  # [B, H, N, D], not contiguous
    R = lists.num_relations
    out, lse = torch.ops.syntaxkernels.edge_attention_cpu_fwd(q, k, v, lists.row_ptr, lists.col, R, 0.25)
    args = (torch.randn_like(out), q, k, v, out, lse, lists.row_ptr, lists.col, lists.rel, lists.t_ptr,
            lists.t_col, lists.t_rel, 0.25)
    _assert_fake_matches_real(torch.ops.syntaxkernels.edge_attention_cpu_bwd, args)


def _assert_fake_matches_real(op, args):
    """``op``'s fake implementation gives its real outputs' shapes and strides for ``args``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = op(*args)
    with FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    for r, f in zip(real, fake):
        assert r.shape == f.shape and r.stride() == f.stride()


# ----------------------------------------------------------------------------------------------------------
# Padded batches: the work follows the valid pairs
# ----------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(DEVICE != "cpu", reason="counts the interpreter's tensor-core products")
@pytest.mark.parametrize("table_grad", [False, True])
@pytest.mark.long_on_cpu
def test_backward_tensor_core_work_follows_the_length(monkeypatch, table_grad):
    """At L = N / 4 the backward's products (every ``tl.dot``, weighted by its size) are at most twice the
    ideal (L / N)^2 of the full-length work: key blocks past the length walk no query block."""
    work = {}
    kernel = ["?"]

    def counting(f):
        def product(a, b, *rest):
            work[kernel[0]] = work.get(kernel[0], 0) + a.shape[0] * a.shape[1] * b.shape[1]
            return f(a, b, *rest)
        return product

    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        kernel[0] = fn.fn.__name__
        real_launch(fn, grid, *args, **kwargs)

    for kernels in (_forward, _backward):  # the backward's kernels and the query-row helpers they share
        monkeypatch.setattr(kernels, "mma", counting(kernels.mma))
        monkeypatch.setattr(kernels, "mma_acc", counting(kernels.mma_acc))
    monkeypatch.setattr(_launch, "launch", spy)

    def backward_work(N, L):
        work.clear()
        trees = sk.TreeBatch.from_heads([[-1] + list(range(L - 1)) + [-1] * (N - L)], torch.tensor([L]))
        q = torch.randn(1, 1, N, 32, requires_grad=True)
        table = torch.zeros(sk.BucketSpec().num_buckets, requires_grad=table_grad)
        out = sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(),
                                       lengths=trees.lengths, backend="triton")
        out.sum().backward()
        return sum(count for name, count in work.items() if "bwd" in name)

    N = 256
    ratio = backward_work(N, N // 4) / backward_work(N, N)
    assert ratio <= 2 * (1 / 4) ** 2, ratio


# ----------------------------------------------------------------------------------------------------------
# Every family's tiles execute (interpreter)
# ----------------------------------------------------------------------------------------------------------

# A compute capability per config family other than sm_90's (which every other test runs): A100 (sm80) and
# the ~100 KB GPUs (small: RTX 30/40/50, L4, L40S).
FAMILY_ARCHS = [pytest.param(80, id="sm80"), pytest.param(86, id="small")]
FAMILY_CASES = [
    ("N100-bf16-D64-ragged-empty-perhead", (3, 2, 100, 64), torch.bfloat16, dict(lengths=[100, 0, 37], per_head=True),
     dict()),
    ("N77-fp16-D128-causal", (2, 1, 77, 128), torch.float16, dict(lengths=[77, 30]), dict(causal=True)),
    ("N129-bf16-D32-window2", (2, 2, 129, 32), torch.bfloat16, dict(roots=3), dict(window=2)),
    ("N33-fp32-D64-directed", None, torch.float32, None, dict()),
    ("N57-bf16-D128-short-rows", (2, 2, 57, 128), torch.bfloat16, dict(lengths=[57, 20]), dict()),  # one tile a row
    # one tile a row, causal and a window (keys-major tiles on sm_80 and the small family)
    ("N40-fp16-D64-short-rows-causal-window3", (2, 2, 40, 64), torch.float16, dict(lengths=[40, 9]),
     dict(causal=True, window=3)),
    ("N100-bf16-D64-two-blocks", (3, 2, 100, 64), torch.bfloat16, dict(lengths=[100, 64, 70]), dict()),
]


@needs_triton
@pytest.mark.skipif(DEVICE != "cpu", reason="a real GPU runs its own family's configs")
@pytest.mark.parametrize("arch", FAMILY_ARCHS)
@pytest.mark.parametrize("name,shape,dtype,make,opts", FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES])
@pytest.mark.long_on_cpu
def test_every_family_configs_match_the_reference(arch, name, shape, dtype, make, opts):
    previous = P.interpret_as(arch)
    try:
        assert configs.select_config("dkdv", dtype, 64) == configs.select_config("dkdv", dtype, 64, P.arch_family(arch))
        case = _directed_case(N=33) if shape is None else make_case(*shape, dtype, **make)
        check_against_reference(case, **opts)
    finally:
        P.interpret_as(previous)


def test_families_and_shared_memory_limits():
    """Every GPU family users own maps to configs (or to none, for sm_75), each with its shared-memory limit."""
    assert P.arch_family(90) == P.arch_family(100) == "sm90"
    assert P.arch_family(80) == "sm80"
    assert P.arch_family(86) == P.arch_family(89) == P.arch_family(120) == "small"  # ~99 KB of shared memory
    assert P.arch_family(75) == "unsupported"
    for arch in (75, 80, 86, 89, 90, 100, 120):
        assert arch in P.SHARED_LIMIT
    assert P.SHARED_LIMIT[120] == P.SHARED_LIMIT[86] == 101376
    with pytest.raises(ValueError, match="sm_80 or newer"):
        previous = P.interpret_as(75)
        try:
            configs.select_config("fwd", torch.bfloat16, 64)
        finally:
            P.interpret_as(previous)


def test_t4_class_gpus_run_the_reference(monkeypatch):
    """On a GPU older than sm_80 (T4: sm_75) the Triton kernels are not used: backend='auto' runs the reference
    and backend='triton' says why (checked on a stand-in for a CUDA tensor: this machine may have no GPU)."""
    from syntaxkernels.ops import _dispatch

    class CudaTensor:
        device = torch.device("cuda", 0)
        dtype = torch.float16
        shape = (1, 1, 8, 64)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    why = _dispatch.triton_unsupported(CudaTensor(), CudaTensor())
    assert why is not None and "sm_75" in why
    assert _dispatch.kernels_or_reference("auto", "triton", CudaTensor(), CudaTensor()) == "reference"
    with pytest.raises(ValueError, match="sm_75"):
        _dispatch.kernels_or_reference("triton", "triton", CudaTensor(), CudaTensor())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert _dispatch.triton_unsupported(CudaTensor(), CudaTensor()) is None


# ----------------------------------------------------------------------------------------------------------
# Block metadata: computed once per batch, shared by the layers
# ----------------------------------------------------------------------------------------------------------

@needs_triton
def test_block_metadata_is_computed_once_for_all_layers(monkeypatch):
    """Layers of one step share the batch's plan: the live-tile lists and tile bucket sets of a windowed call with
    the table gradient are built by the first call on the TreeBatch and reused by the next, rebuilt after an
    in-place change, and freed with the batch; a bare distance tensor gets a plan per call (derived again)."""
    import gc
    import weakref

    built = []
    real_lists, real_buckets = _launch._build_lists, _launch._tile_buckets
    monkeypatch.setattr(_launch, "_build_lists", lambda *a, **k: built.append("lists") or real_lists(*a, **k))
    monkeypatch.setattr(_launch, "_tile_buckets", lambda *a, **k: built.append("buckets") or real_buckets(*a, **k))
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1, 2, 2, 3, 4], [-1, 0, 1, 2]]).to(DEVICE)
    buckets = sk.BucketSpec()
    N = trees.max_len

    def layer(structure, lengths=None):
        q = torch.randn(2, 2, N, 32, device=DEVICE, requires_grad=True)
        table = torch.zeros(buckets.num_buckets, device=DEVICE, requires_grad=True)
        out = sk.syntax_bias_attention(q, q, q, structure, table, buckets=buckets, lengths=lengths, window=3,
                                       backend="triton")
        out.sum().backward()
        return out

    first = layer(trees)
    once = list(built)
    assert once.count("buckets") == 1 and once.count("lists") >= 2  # forward/dQ and dK/dV tilings
    second = layer(trees)
    assert built == once, "the second layer rebuilt block metadata"
    assert torch.equal(first != 0, second != 0)
    layer(trees.distance, trees.lengths)  # a bare tensor: a plan of its own, derived for this call
    assert len(built) == 2 * len(once)
    trees.lengths[1] = 3  # an in-place change (token 3 of item 1 becomes padding): the metadata is derived again
    trees.distance[1, 3, :] = 255  # (and the distance agrees: a tree distance's padding)
    trees.distance[1, :, 3] = 255
    layer(trees)
    assert len(built) == 3 * len(once)
    kept = [weakref.ref(t) for t in trees.plan_tensors() if t is not trees.distance]
    assert kept
    del trees
    gc.collect()
    assert all(ref() is None for ref in kept)


@needs_triton
def test_a_launch_that_does_not_fit_falls_back_or_says_why(monkeypatch):
    """Triton's OutOfResources at a launch becomes KernelDoesNotFit, naming the GPU and what to do; under
    backend='auto' the op runs the reference instead (with a warning), under 'triton' it raises."""
    from triton.runtime.errors import OutOfResources

    def too_big(kernel, grid, args, kwargs):
        raise OutOfResources(122880, 101376, "shared memory")

    monkeypatch.setattr(P, "_launch", too_big)
    case = make_case(1, 2, 24, 32, torch.float32)
    args = [case[n].to(DEVICE) for n in ("q", "k", "v", "distance", "table")]
    with pytest.raises(P.KernelDoesNotFit, match="does not fit this GPU.*shared memory.*backend='reference'"):
        sk.syntax_bias_attention(*args, buckets=case["buckets"], backend="triton")
    # "auto" picks the Triton kernels only for CUDA tensors (the C++ ones on CPU): emulate that choice here.
    monkeypatch.setattr(_host, "resolve_backend", lambda backend, device: "triton")
    monkeypatch.setattr(_host, "cpu_kernels_take", lambda q, v: False)
    with pytest.warns(RuntimeWarning, match="runs the reference on this GPU"):
        out = sk.syntax_bias_attention(*args, buckets=case["buckets"], backend="auto")
    ref = sk.reference.syntax_bias_attention(*args, buckets=case["buckets"])
    torch.testing.assert_close(out, ref)


@needs_triton
@pytest.mark.parametrize("where", ["backward", "lut", "packed", "packed backward"])
def test_kernels_that_do_not_fit_fall_back_in_the_backward_lut_and_packed_ops(monkeypatch, where):
    """A backward kernel that does not fit this GPU (the forward's did) gives way to the reference under
    backend='auto', with a warning, and the gradients are the reference's; so do lut_attention (forward and
    backward) and the packed op (forward and backward). Under 'triton' the error is raised."""
    from triton.runtime.errors import OutOfResources

    from syntaxkernels.ops.bias_attention import _host as host
    from syntaxkernels.ops.bias_attention import lut_attention

    real = P._launch

    def picky(kernel, grid, args, kwargs):
        name = kernel.fn.__name__
        if ("bwd" in name or "dq" in name or "dkdv" in name) if where.endswith("backward") else True:
            raise OutOfResources(122880, 101376, "shared memory")
        real(kernel, grid, args, kwargs)

    host._WARNED.clear()
    monkeypatch.setattr(P, "_launch", picky)
    monkeypatch.setattr(host, "resolve_backend", lambda backend, device: "triton")
    monkeypatch.setattr(host, "cpu_kernels_take", lambda q, v: False)
    gen = torch.Generator().manual_seed(5)
    buckets = sk.BucketSpec()
    table = torch.randn(buckets.num_buckets, generator=gen).to(DEVICE)
    if where.startswith("packed"):
        trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1], [-1, 0, 0, 2, 2, 3]], packed=True).to(DEVICE)
        shape = (trees.num_tokens, 2, 16)
    else:
        trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1], [-1, 0, 0, 2, 2, 3]]).to(DEVICE)
        shape = (2, 2, trees.max_len, 16)
    q, k, v = (torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_() for _ in range(3))
    if where == "lut":
        lut = torch.zeros(256, device=DEVICE).index_fill_(0, torch.arange(3, 256, device=DEVICE), float("-inf"))

        def run(q, k, v, reference=False):
            if reference:
                return sk.reference.syntax_bias_attention(q, k, v, trees.distance, lut, buckets=host.LUT_BUCKETS,
                                                          lengths=trees.lengths)
            return lut_attention(q, k, v, trees, lut)
        leaves = (q, k, v)
    else:
        t = table.clone().requires_grad_()

        def run(q, k, v, t, reference=False):
            if reference:
                if trees.is_packed:
                    return sk.ops.bias_attention._varlen.reference_bias_attention_varlen(
                        q, k, v, trees.distance, t, buckets=buckets, cu_seqlens=trees.cu_seqlens)
                return sk.reference.syntax_bias_attention(q, k, v, trees.distance, t, buckets=buckets,
                                                          lengths=trees.lengths)
            return sk.syntax_bias_attention(q, k, v, trees, t, buckets=buckets, backend="auto")
        leaves = (q, k, v, t)
    with pytest.warns(RuntimeWarning, match="runs the reference on this GPU"):
        out = run(*leaves)
        grads = torch.autograd.grad(out.sum(), leaves)
    ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    ref = run(*ref_leaves, reference=True)
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref.sum(), ref_leaves)):
        torch.testing.assert_close(got, want)
    if where in ("backward", "packed backward"):
        with pytest.raises(P.KernelDoesNotFit):
            out = sk.syntax_bias_attention(q, k, v, trees, table, buckets=buckets, backend="triton")
            out.sum().backward()


def test_cpu_kernels_take_padded_rows_and_directed_distances():
    """backend='auto' on CPU tensors (the fused C++ kernels) reads a TreeBatch's padded distance rows and a
    directed distance exactly: every gradient against the float64 reference."""
    from conftest import HAS_EDGE_CPP

    if not HAS_EDGE_CPP:
        pytest.skip("C++ extension not built")
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1, 2, 2, 3, 4, 4, 5], [-1, 0, 1, 2, 2]])
    directed = torch.randint(0, 256, (2, 11, 11), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    for distance in (trees.distance, directed):
        assert distance is not directed or not torch.equal(distance, distance.transpose(1, 2))
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 2, 11, 32, generator=gen, dtype=torch.float64) for _ in range(3))
        table = torch.randn(sk.BucketSpec().num_buckets, generator=gen, dtype=torch.float64)
        grads = {}
        for name, dtype, backend in (("cpp", torch.float32, "auto"), ("ref", torch.float64, "reference")):
            leaves = [t.to(dtype).requires_grad_() for t in (q, k, v, table)]
            out = sk.syntax_bias_attention(*leaves[:3], distance, leaves[3], buckets=sk.BucketSpec(),
                                           lengths=trees.lengths, backend=backend)
            grads[name] = [out] + list(torch.autograd.grad(out.square().sum(), leaves))
        for got, want in zip(grads["cpp"], grads["ref"]):
            torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)


def test_cpu_bias_backward_fake_has_the_real_strides():
    """The fake of the C++ bias backward returns what the real op returns (contiguous gradients), also for the
    transposed q, k, v the modules pass: torch.compile's backward graph relies on it."""
    from conftest import HAS_EDGE_CPP

    from syntaxkernels.ops.bias_attention import _cpu  # noqa: F401  (registers the ops)

    if not HAS_EDGE_CPP:
        pytest.skip("C++ extension not built")
    trees = sk.TreeBatch.from_heads([[-1, 0, 0, 1, 1, 2, 2], [-1, 0, 1]])
    x = torch.randn(2, 7, 2, 16)
    q, k, v = (x.transpose(1, 2) for _ in range(3))
    buckets = sk.BucketSpec()
    lut = _host.bias_lut(torch.zeros(buckets.num_buckets), torch.ones(1), buckets, -1)
    lengths = trees.lengths.to(torch.int32)
    out, lse = torch.ops.syntaxkernels.bias_attention_cpu_fwd(q, k, v, trees.distance, lut, lengths, 0.25, -1, False)
    args = (torch.randn_like(out), q, k, v, lse, trees.distance, lut, lengths, buckets.lut(), buckets.num_buckets,
            0.25, -1, False, True)
    _assert_fake_matches_real(torch.ops.syntaxkernels.bias_attention_cpu_bwd, args)


@needs_triton
@pytest.mark.skipif(DEVICE != "cpu", reason="a real GPU runs its own family's configs")
@pytest.mark.parametrize("arch,kernel", [(80, "_bias_bwd_short_t_kernel"), (86, "_bias_bwd_short_t_kernel"),
                                         (90, "_bias_bwd_short_kernel")])
def test_short_rows_take_each_familys_tiles_with_a_directed_distance(monkeypatch, arch, kernel):
    """Rows of at most 64 tokens: mma.sync families (sm_80, the small one) run the keys-major one-tile kernel
    (it writes each head's dS queries-major, for the same table kernel), sm_90 the queries-major one; both read
    each pair at ``distance[b, i, j]`` only, so a directed distance is exact, with causality."""
    names = _spy_launches(monkeypatch)
    previous = P.interpret_as(arch)
    try:
        case = _directed_case(N=45, dtype=torch.bfloat16, seed=2)
        check_against_reference(case, causal=True)
    finally:
        P.interpret_as(previous)
    assert kernel in names and "_bias_bwd_short_table_kernel" in names, names
