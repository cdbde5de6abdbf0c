"""Sub-network attention against the float64 reference: the C++ path (edge kernels + SDPA, CPU) and the Triton path
(edge kernels under the interpreter on CPU, or on CUDA), outputs, non-empty flags and every gradient, on random
trees, forests, stars, chains, packed documents, ragged batches with empty items and one-token sentences, for every
mask kind; through TopicalAttention; dispatch, caching of the lists, validation before backend resolution, bad
inputs. (No host synchronisation once the lists are built: python_tests/test_host_sync.py.)
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.tools.workloads import random_document
from syntaxkernels.ops import subnetwork_attention as subnet
from syntaxkernels.ops._dispatch import interpreting
from syntaxkernels.tools.testing import assert_close_to_reference
from syntaxkernels.trees import batch as tree_batch_module

from conftest import CPP, KERNEL_DEVICE, TRITON, needs_cpp, needs_triton, trees_of_kind



DEFAULT = sk.MaskSpec()  # parent/child/sibling 1..3 and full: M = 10
ALL = sk.MaskSpec(max_distance=3, pairwise=True)
PARENT = sk.MaskSpec(max_distance=2, child=False, sibling=False, full=False)
CHILD = sk.MaskSpec(max_distance=4, parent=False, sibling=False, full=False)
SIBLING = sk.MaskSpec(max_distance=2, parent=False, child=False, full=False)
PAIRWISE = sk.MaskSpec(max_distance=1, parent=False, child=False, sibling=False, pairwise=True, full=False)
FULL = sk.MaskSpec(max_distance=1, parent=False, child=False, sibling=False, full=True)


def run(fn, tensors, grad, dtype):
    inputs = [t.to(dtype).requires_grad_(True) for t in tensors]
    out, nonempty = fn(*inputs)
    return out, nonempty, torch.autograd.grad(out, inputs, grad.to(out.dtype))


def check(trees: sk.TreeBatch, masks, backend, device, dtype, H=None, D=16, seed=0):
    trees = trees.to(device)
    if H is None:  # one head under the interpreter keeps the Triton tests fast
        H = 1 if backend == "triton" and interpreting() else 2
    B, N = trees.batch_size, trees.max_len
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    grad = torch.randn(B, masks.num_masks, H, N, D, generator=gen, dtype=torch.float64).to(device)

    def kernel(q, k, v):
        return sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend=backend)

    def ref(q, k, v):
        return reference.syntax_subnetwork_attention(q, k, v, trees, masks)

    out, nonempty, grads = run(kernel, (q, k, v), grad, dtype)
    out64, nonempty64, grads64 = run(ref, (q, k, v), grad, torch.float64)
    outlow, _, gradslow = run(ref, (q, k, v), grad, dtype)
    assert out.dtype == dtype and out.shape == (B, masks.num_masks, H, N, D)
    assert nonempty.dtype == torch.bool and torch.equal(nonempty, nonempty64)
    assert_close_to_reference(out, out64, outlow, "out")
    for name, g, g64, glow in zip(("dq", "dk", "dv"), grads, grads64, gradslow):
        assert_close_to_reference(g, g64, glow, name)
    empty = ~nonempty[:, :, None, :, None].expand_as(out)
    assert torch.all(out[empty] == 0), "an empty (token, mask) row is not exactly zero"
    alone = ~nonempty.any(dim=1)  # tokens with no key in any mask: exactly zero dq
    assert torch.all(grads[0].permute(0, 2, 1, 3)[alone] == 0)
    if bool((reference.syntax_masks(trees, masks).sum(dim=-1) > 1).any()):
        assert all(bool(g.abs().sum() > 0) for g in grads), "a gradient is all zeros"
    elif bool(nonempty.any()):  # every row is a gather (e.g. child masks only): only v gets a gradient
        assert bool(grads[2].abs().sum() > 0)


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against the float64 reference
# ---------------------------------------------------------------------------------------------------------

def cases(values, triton_values, ids=None):
    """Every value on the C++ path, ``triton_values`` (a subset: the interpreter is slow) on the Triton path."""
    ids = ids or {value: str(value) for value in values}
    return ([pytest.param(CPP.values[0], value, marks=needs_cpp, id=f"cpp-{ids[value]}") for value in values]
            + [pytest.param(TRITON.values[0], value, marks=needs_triton, id=f"triton-{ids[value]}")
               for value in triton_values])


@pytest.mark.parametrize("backend_device,kind", cases(["random", "forest", "star", "chain", "packed", "single"],
                                                      ["random", "star"]))
@pytest.mark.long_on_cpu
def test_default_masks_fp32(backend_device, kind):
    backend, device = backend_device
    check(trees_of_kind(kind, 19), DEFAULT, backend, device, torch.float32)


MASK_IDS = {ALL: "all", PARENT: "parent", CHILD: "child", SIBLING: "sibling", PAIRWISE: "pairwise", FULL: "full"}


@pytest.mark.parametrize("backend_device,masks", cases(list(MASK_IDS), [ALL, CHILD], MASK_IDS))
@pytest.mark.long_on_cpu
def test_every_mask_kind_fp32(backend_device, masks):
    backend, device = backend_device
    check(trees_of_kind("forest", 17, seed=1), masks, backend, device, torch.float32)


@pytest.mark.parametrize("backend_device,kind", cases(["packed", "star"], ["packed"]))
@pytest.mark.long_on_cpu
def test_bfloat16(backend_device, kind):
    backend, device = backend_device
    check(trees_of_kind(kind, 24, seed=2), ALL, backend, device, torch.bfloat16, D=32)


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["fp64", "fp16"])
def test_cpp_float64_and_float16(dtype):
    check(trees_of_kind("random", 18, seed=3), ALL, "auto", "cpu", dtype)


@needs_cpp
def test_treebank_document(ud_dev_path):
    """A real document: UD English-EWT sentences packed into 160 tokens, fp32, C++ path."""
    sentences = sk.trees.read_conllu(ud_dev_path)
    rows = []
    for start in (0, 40):
        doc = []
        for s in sentences[start:]:
            if len(doc) + len(s.heads) > 160:
                break
            doc += [h + len(doc) if h >= 0 else -1 for h in s.heads]
        rows.append(doc)
    check(sk.TreeBatch.from_heads(rows), ALL, "auto", "cpu", torch.float32, H=2, D=32)


@needs_triton
@pytest.mark.long_on_cpu
def test_treebank_sentences_under_one_root_with_split_rows(ud_dev_path, monkeypatch):
    """Real sentences (UD English-EWT) under one [CLS]-like root, ~90 tokens, every mask kind, on the Triton path
    with work items of 4 edges, so the root's and the sentence roots' rows are split and merged."""
    from syntaxkernels.ops import edge_attention
    from syntaxkernels.tools.workloads import connect_sentences

    monkeypatch.setattr(edge_attention, "SCHEDULE_CHUNK", 4)
    sentences = [s.heads for s in sk.trees.read_conllu(ud_dev_path)[:12]]
    rows = connect_sentences(sentences, 90, rows=1)
    trees = sk.TreeBatch.from_heads(rows)
    schedule = trees.relation_lists(ALL).schedule(4)
    assert schedule.pieces > 0 and schedule.dq_slots > 0 and schedule.dk_slots > 0
    check(trees, ALL, "triton", KERNEL_DEVICE, torch.float32, H=1, D=16)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
@pytest.mark.long_on_cpu
def test_through_topical_attention(backend_device):
    """Sub-networks mixed by a (perturbed) TopicalAttention: output and the gradients of q, k, v and of the
    topical parameters against the float64 reference pipeline."""
    backend, device = backend_device
    trees = trees_of_kind("forest", 16, seed=4).to(device)
    B, H, N, D = trees.batch_size, 1 if backend == "triton" and interpreting() else 2, trees.max_len, 8
    torch.manual_seed(4)
    topical = sk.nn.TopicalAttention(H, D).double().to(device)
    with torch.no_grad():
        for p in topical.parameters():
            p.add_(0.3 * torch.randn_like(p))
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64, device=device) for _ in range(3))
    grad = torch.randn(B, H, N, D, dtype=torch.float64, device=device)

    def pipeline(fn, dtype):
        module = topical.to(dtype)
        inputs = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        mixed = module(*fn(*inputs))
        grads = torch.autograd.grad(mixed, inputs + list(module.parameters()), grad.to(dtype))
        return mixed, grads

    got, got_grads = pipeline(lambda a, b, c: sk.syntax_subnetwork_attention(a, b, c, trees, ALL, backend=backend),
                              torch.float32)
    want, want_grads = pipeline(lambda a, b, c: reference.syntax_subnetwork_attention(a, b, c, trees, ALL),
                                torch.float64)
    low, low_grads = pipeline(lambda a, b, c: reference.syntax_subnetwork_attention(a, b, c, trees, ALL),
                              torch.float32)
    assert_close_to_reference(got, want, low, "topical output")
    names = ["dq", "dk", "dv", "d query", "d key_weight", "d value_weight"]
    for name, g, g64, glow in zip(names, got_grads, want_grads, low_grads):
        assert_close_to_reference(g, g64, glow, name)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
def test_strided_inputs(backend_device):
    """q, k, v as transposed views of a [B, N, H, 3D] projection (no copies in the op)."""
    backend, device = backend_device
    trees = trees_of_kind("forest", 17).to(device)
    x = torch.randn(3, 17, 2, 3 * 16, device=device)
    q, k, v = (t.transpose(1, 2) for t in x.split(16, dim=-1))
    assert not q.is_contiguous()
    out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, ALL, backend=backend)
    ref, _ = reference.syntax_subnetwork_attention(q, k, v, trees, ALL)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend_device", [CPP, TRITON])
def test_scale(backend_device):
    backend, device = backend_device
    trees = trees_of_kind("random", 15).to(device)
    q, k, v = (torch.randn(3, 1, 15, 16, device=device) for _ in range(3))
    out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, ALL, scale=0.3, backend=backend)
    ref, _ = reference.syntax_subnetwork_attention(q, k, v, trees, ALL, scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_pairwise_flags_without_a_pair_matrix():
    """The CUDA path's pairwise flags come from per-tree token counts: equal to the reference's."""
    for kind in ("random", "forest", "packed", "single", "star"):
        trees = trees_of_kind(kind, 21, seed=5)
        want = reference.syntax_masks(trees, PAIRWISE)[:, 0].any(dim=-1)
        assert torch.equal(subnet._pairwise_nonempty(trees), want), kind


# ---------------------------------------------------------------------------------------------------------
# Dispatch, caching, validation
# ---------------------------------------------------------------------------------------------------------

@needs_cpp
def test_auto_on_cpu_is_the_edge_path(monkeypatch):
    trees = trees_of_kind("random", 15)
    q, k, v = (torch.randn(3, 1, 15, 16) for _ in range(3))
    want, want_flags = reference.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    monkeypatch.setattr(reference, "syntax_subnetwork_attention", lambda *a, **k: pytest.fail("the reference ran"))
    out, flags = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(flags, want_flags)


@needs_triton
def test_full_mask_is_plain_attention_without_the_distance(monkeypatch):
    """On the Triton path ``full`` runs SDPA over the valid keys: the LUT kernel (which reads the distance) is not
    called for it, and the result still matches the float64 reference (ragged lengths, an empty item)."""
    from syntaxkernels.ops import bias_attention

    def refuse(*args, **kwargs):
        raise AssertionError("the LUT kernel ran for the full mask")

    monkeypatch.setattr(bias_attention, "lut_attention", refuse)
    check(trees_of_kind("random", 14, seed=3), FULL, "triton", KERNEL_DEVICE, torch.float32)
    check(trees_of_kind("forest", 13, seed=4), sk.MaskSpec(max_distance=1), "triton", KERNEL_DEVICE, torch.float32)
    with pytest.raises(AssertionError, match="LUT kernel"):  # pairwise still needs the distance: it does call it
        check(trees_of_kind("forest", 13, seed=4), PAIRWISE, "triton", KERNEL_DEVICE, torch.float32)


@needs_cpp
def test_lists_are_built_once_per_batch_and_masks(monkeypatch):
    trees = trees_of_kind("packed", 20)
    calls = []
    original = tree_batch_module.build_edge_lists
    monkeypatch.setattr(tree_batch_module, "build_edge_lists", lambda *a, **k: calls.append(k) or original(*a, **k))
    q, k, v = (torch.randn(2, 1, 20, 8) for _ in range(3))
    for _ in range(3):
        sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    sk.syntax_subnetwork_attention(q, k, v, trees, ALL)  # same relations: same lists
    assert len(calls) == 1
    sk.syntax_subnetwork_attention(q, k, v, trees, PARENT)
    assert len(calls) == 2


def test_reference_backend_and_float64_triton():
    trees = trees_of_kind("random", 15)
    q, k, v = (torch.randn(3, 1, 15, 16, dtype=torch.float64) for _ in range(3))
    out, flags = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="reference")
    want, want_flags = reference.syntax_subnetwork_attention(q, k, v, trees, DEFAULT)
    assert torch.equal(out, want) and torch.equal(flags, want_flags)
    if torch.cuda.is_available() or interpreting():
        trees = trees.to(KERNEL_DEVICE)
        q, k, v = (t.to(KERNEL_DEVICE) for t in (q, k, v))
        with pytest.raises(ValueError, match="float64"):
            sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="triton")
        out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="auto")
        assert out.dtype == torch.float64


def test_validation_comes_before_backend_resolution():
    trees = trees_of_kind("random", 15)
    q, k, v = (torch.randn(3, 1, 15, 16) for _ in range(3))
    # A bad tensor is reported as such even with a backend that could not run here.
    with pytest.raises(ValueError, match="q, k, v"):
        sk.syntax_subnetwork_attention(q, k[:, :, :10], v, trees, DEFAULT, backend="cuda")
    with pytest.raises(TypeError, match="trees"):
        sk.syntax_subnetwork_attention(q, k, v, trees.distance, DEFAULT, backend="no such backend")
    with pytest.raises(TypeError, match="masks"):
        sk.syntax_subnetwork_attention(q, k, v, trees, "parent", backend="no such backend")
    with pytest.raises(ValueError, match="backend"):
        sk.syntax_subnetwork_attention(q, k, v, trees, DEFAULT, backend="cuda")


def test_bad_inputs():
    trees = trees_of_kind("random", 15)
    q, k, v = (torch.randn(3, 1, 15, 16) for _ in range(3))
    with pytest.raises(ValueError, match="distance"):
        sk.syntax_subnetwork_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], trees, DEFAULT)
    with pytest.raises(ValueError, match="float16, bfloat16"):
        sk.syntax_subnetwork_attention(q.long(), k.long(), v.long(), trees, DEFAULT)
    with pytest.raises(ValueError, match="one device"):
        sk.syntax_subnetwork_attention(q, k, v.to("meta"), trees, DEFAULT)


def test_edge_stats():
    trees = trees_of_kind("packed", 30, seed=6)
    from syntaxkernels.tools.checks.subnetwork_attention import subnetwork_edge_stats

    stats = subnetwork_edge_stats(trees, DEFAULT)
    lists = trees.relation_lists(DEFAULT)
    assert stats["edges"] == lists.num_edges == sum(stats[name] for name in lists.names)
    assert stats["child_1"] == float((trees.heads[trees.segment >= 0] >= 0).sum())  # one parent per non-root
    assert 0 < stats["relation_density"] < 1


# ---------------------------------------------------------------------------------------------------------
# CUDA only
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_cuda_real_sizes(dtype, head_dim):
    """Real sizes on a GPU: 4 documents of ~512 tokens, 4 heads, M = 11, and backend='auto' picks Triton."""
    rng = random.Random(1)
    rows = [random_document(rng, [rng.randint(5, 40) for _ in range(20)])[:512] for _ in range(4)]
    check(sk.TreeBatch.from_heads(rows), ALL, "auto", "cuda", dtype, H=4, D=head_dim)


def test_constant_device_tensors_are_built_once_and_never_while_tracing():
    """The dense masks' LUT (and every constant the ops cache, ops._dispatch.device_constant) is built once per
    device; while tracing with fake tensors a fresh one is built and nothing is remembered."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
    from syntaxkernels.ops import _dispatch

    q = torch.zeros(1)
    lut = subnet._dense_lut("pairwise", q)
    assert subnet._dense_lut("pairwise", q) is lut and lut.shape == (256,) and lut[255] == 0
    assert bool(torch.isinf(lut[:255]).all()) and bool((subnet._dense_lut("full", q) == 0).all())
    before = dict(_dispatch._CONSTANTS)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
        built = _dispatch.device_constant(("a key only used here",), fake, lambda: torch.ones(3))
        assert is_fake(built)
    assert _dispatch._CONSTANTS == before
