"""Valid calls of the fused ops, the modules and the transformers hook read nothing back to the host in forward
or backward: the package's one check of host synchronisation (the GPU suite's sync-free step runs this file).

On a GPU every read of a device tensor's value (``bool(t)``, ``.item()``, ``.tolist()``, ...) stalls the stream
and breaks CUDA-graph capture. :func:`syntaxkernels.tools.testing.count_host_reads` records the reads the package's own
code makes; the inputs' checks that would read (lengths in range, a key-padding mask that pads a suffix) are
made to take their device path (``_validation._on_host`` patched), as they do for GPU tensors, where they
become device-side assertions. Runs on the kernel device (CUDA when present, else the interpreter). On CUDA each
call is also made, after a warm-up call (compilation and caches may synchronise), under
``torch.cuda.set_sync_debug_mode("error")``, which fails on a synchronisation from any code, PyTorch's
included; the ``gpu`` cases add real sizes (documents of up to 256 tokens, bf16, autocast for the modules).
"""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _validation
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.tools.testing import count_host_reads
from syntaxkernels.tools.workloads import random_document

from conftest import KERNEL_DEVICE as DEVICE
from conftest import requires_cuda

SIZES = ["small", pytest.param("gpu", marks=requires_cuda)]


@pytest.fixture
def device_checks(monkeypatch):
    monkeypatch.setattr(_validation, "_on_host", lambda tensor: False)


def reads_of(fn):
    """The host reads the package makes in ``fn()``. On CUDA ``fn`` runs once first (warm-up), then under
    ``torch.cuda.set_sync_debug_mode("error")``: a synchronisation raises."""
    cuda = DEVICE == "cuda"
    if cuda:
        fn()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with count_host_reads() as reads:
            fn()
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    if cuda:
        torch.cuda.synchronize()
    return reads


def _heads(size):
    if size == "small":
        return [[1, -1, 1, 2, 2, -1, 5], [-1, 0, 0, 1]]
    rng = random.Random(1)  # documents of several sentences (so the pairwise mask has keys), ragged
    return [random_document(rng, [rng.randint(3, 30) for _ in range(12)])[:256] for _ in range(2)]


def _dims(size):
    """(heads, head dim, model width, dtype) of a size."""
    return (2, 32, 64, torch.float32) if size == "small" else (4, 64, 256, torch.bfloat16)


def _trees(size="small"):
    return sk.TreeBatch.from_heads(_heads(size)).to(DEVICE)


def _qkv(trees, size):
    H, D, _, dtype = _dims(size)
    B, N = trees.distance.shape[:2]
    return [torch.randn(B, H, N, D, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.long_on_cpu
def test_bias_attention_forward_backward_reads_nothing(device_checks, size):
    trees = _trees(size)
    N = trees.distance.shape[1]
    q, k, v = _qkv(trees, size)
    T = sk.BucketSpec().num_buckets
    per_head = torch.randn(q.shape[1], T, device=DEVICE, requires_grad=True)
    shared = torch.randn(T, device=DEVICE, requires_grad=True)
    c = torch.tensor([0.7], device=DEVICE, requires_grad=True)
    lengths = trees.lengths.to(DEVICE)
    padding = torch.arange(N, device=DEVICE)[None, :] >= lengths[:, None]
    # (lengths or a key-padding mask, window, deterministic, table)
    for lengths_or_mask, window, deterministic, table in ((lengths, None, False, per_head),
                                                          (padding, 2, False, per_head), (lengths, 4, True, shared)):
        def run():
            out = sk.syntax_bias_attention(q, k, v, trees.distance, table, buckets=sk.BucketSpec(), bias_scale=c,
                                           lengths=lengths_or_mask, window=window, deterministic=deterministic,
                                           backend="triton")
            out.sum().backward()

        reads = reads_of(run)
        assert reads == [], reads
    lut = torch.zeros(256, device=DEVICE)
    reads = reads_of(lambda: ba.lut_attention(q, k, v, trees.distance, lut, trees.lengths.to(DEVICE)).sum().backward())
    assert reads == [], reads


def _module_run(module, trees, size):
    E = _dims(size)[2]
    x = torch.randn(2, trees.distance.shape[1], E, device=DEVICE, requires_grad=True)

    def run():
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=size == "gpu"):
            y = module(x, trees)
        y.float().sum().backward()

    return run


@pytest.mark.parametrize("size", SIZES)
def test_bias_module_reads_nothing(device_checks, size):
    trees = _trees(size)
    module = sk.nn.SyntaxBiasedSelfAttention(_dims(size)[2], 2, backend="triton").to(DEVICE)
    reads = reads_of(_module_run(module, trees, size))
    assert reads == [], reads


def _trees_with_lists(masks, window, size="small"):
    """Trees whose relation and window lists were built on the CPU first, as ``TreeCollator`` does in workers."""
    trees = sk.TreeBatch.from_heads(_heads(size))
    trees.relation_lists(masks)
    trees.window_lists(window)
    return trees.to(DEVICE)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("masks", [sk.MaskSpec(), sk.MaskSpec(full=False), sk.MaskSpec(pairwise=True)],
                         ids=["default", "relations", "all"])
def test_subnetwork_attention_reads_nothing(device_checks, masks, size):
    trees = _trees_with_lists(masks, 2, size)
    q, k, v = _qkv(trees, size)

    def run():
        out, _ = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")
        out.float().square().sum().backward()

    reads = reads_of(run)
    assert reads == [], reads


@pytest.mark.parametrize("size", SIZES)
def test_window_attention_reads_nothing(device_checks, size):
    window = 2
    trees = _trees_with_lists(sk.MaskSpec(), window, size)
    q, k, v = _qkv(trees, size)
    reads = reads_of(lambda: sk.ops.syntax_window_attention(q, k, v, trees, window=window,
                                                            backend="triton").sum().backward())
    assert reads == [], reads


@pytest.mark.parametrize("size", SIZES)
def test_subnetwork_module_reads_nothing(device_checks, size):
    masks = sk.MaskSpec()
    trees = _trees_with_lists(masks, 2, size)
    module = sk.nn.SyntaxBertSelfAttention(_dims(size)[2], 2, masks=masks, backend="triton").to(DEVICE)
    reads = reads_of(_module_run(module, trees, size))
    assert reads == [], reads


def test_transformers_tree_check_reads_nothing_when_the_data_is_on_the_device(monkeypatch):
    """With the mask on the model's device the hook's lengths check is queued on the device (no host read) and
    the trees (from a CPU collator) are moved to it; a mismatch still stops the forward. (Forced on CPU tensors by
    treating them as device memory; the mismatches are checked on CPU only, since on a GPU they are device-side
    assertions, which end the CUDA context.)"""
    pytest.importorskip("transformers")
    from syntaxkernels.integrations import transformers as integration

    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2, 0]])
    N = trees.max_len
    hidden = torch.randn(2, N, 32, device=DEVICE)
    valid = torch.arange(N, device=DEVICE)[None, :] < trees.lengths.to(DEVICE)[:, None]
    monkeypatch.setattr(_validation, "_on_host", lambda tensor: False)
    checked = []
    reads = reads_of(lambda: checked.append(integration._check_trees(trees, hidden, valid)))
    assert reads == [], reads
    if DEVICE == "cpu":
        assert checked[-1] is trees
    else:
        assert checked[-1].device == hidden.device
    hidden, valid = hidden.cpu(), valid.cpu()
    with pytest.raises(RuntimeError, match="lengths differ from the attention mask"):
        integration._check_trees(trees, hidden, torch.ones_like(valid))
    with pytest.raises(RuntimeError, match="lengths differ from the attention mask"):
        integration._check_trees(trees, hidden, None)  # padded trees, no mask


def test_counter_records_the_package_reads():
    """The counter itself: a read made by the package is recorded, one made here is not."""
    with count_host_reads() as reads:
        bool(torch.ones(1))
        _validation.normalize_lengths(torch.tensor([1]), torch.zeros(1, 1, 2, 1))  # a CPU check: one read
    assert len(reads) == 1 and "_validation.py" in reads[0]
