"""Valid calls of the fused ops and modules read nothing back to the host in forward or backward.

On a GPU every read of a device tensor's value (``bool(t)``, ``.item()``, ``.tolist()``, ...) stalls the stream
and breaks CUDA-graph capture. :func:`syntaxkernels.testing.count_host_reads` records the reads the package's own
code makes; the inputs' checks that would read (lengths in range, a key-padding mask that pads a suffix) are
made to take their device path (``_validation._on_host`` patched), as they do for GPU tensors, where they
become device-side assertions. Runs on the kernel device (CUDA when present, else the interpreter).
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import _validation
from syntaxkernels.ops import bias_attention as ba
from syntaxkernels.testing import count_host_reads

from conftest import KERNEL_DEVICE as DEVICE


@pytest.fixture
def device_checks(monkeypatch):
    monkeypatch.setattr(_validation, "_on_host", lambda tensor: False)


def _trees():
    return sk.TreeBatch.from_heads([[1, -1, 1, 2, 2, -1, 5], [-1, 0, 0, 1]]).to(DEVICE)


def test_bias_attention_forward_backward_reads_nothing(device_checks):
    trees = _trees()
    B, N = trees.distance.shape[:2]
    q, k, v = (torch.randn(B, 2, N, 32, device=DEVICE, requires_grad=True) for _ in range(3))
    table = torch.randn(2, sk.BucketSpec().num_buckets, device=DEVICE, requires_grad=True)
    c = torch.tensor([0.7], device=DEVICE, requires_grad=True)
    padding = torch.arange(N, device=DEVICE)[None, :] >= trees.lengths.to(DEVICE)[:, None]
    for lengths, window in ((trees.lengths.to(DEVICE), None), (padding, 2)):
        with count_host_reads() as reads:
            out = sk.syntax_bias_attention(q, k, v, trees.distance, table, buckets=sk.BucketSpec(), bias_scale=c,
                                           lengths=lengths, window=window, backend="triton")
            out.sum().backward()
        assert reads == [], reads
    lut = torch.zeros(256, device=DEVICE)
    with count_host_reads() as reads:
        ba.lut_attention(q, k, v, trees.distance, lut, trees.lengths.to(DEVICE)).sum().backward()
    assert reads == [], reads


def test_bias_module_reads_nothing(device_checks):
    trees = _trees()
    module = sk.nn.SyntaxBiasedSelfAttention(64, 2, backend="triton").to(DEVICE)
    x = torch.randn(2, trees.distance.shape[1], 64, device=DEVICE, requires_grad=True)
    with count_host_reads() as reads:
        module(x, trees).sum().backward()
    assert reads == [], reads


def _trees_with_lists(masks, window):
    """Trees whose relation and window lists were built on the CPU first, as ``TreeCollator`` does in workers."""
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2, 2, -1, 5], [-1, 0, 0, 1]])
    trees.relation_lists(masks)
    trees.window_lists(window)
    return trees.to(DEVICE)


def test_subnetwork_and_window_attention_read_nothing(device_checks):
    masks, window = sk.MaskSpec(), 2
    trees = _trees_with_lists(masks, window)
    B, N = trees.distance.shape[:2]
    q, k, v = (torch.randn(B, 2, N, 32, device=DEVICE, requires_grad=True) for _ in range(3))
    with count_host_reads() as reads:
        outputs = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")
        outputs[0].sum().backward()
    assert reads == [], reads
    with count_host_reads() as reads:
        sk.ops.syntax_window_attention(q, k, v, trees, window=window, backend="triton").sum().backward()
    assert reads == [], reads


def test_subnetwork_module_reads_nothing(device_checks):
    masks = sk.MaskSpec()
    trees = _trees_with_lists(masks, 2)
    module = sk.nn.SyntaxBertSelfAttention(64, 2, masks=masks, backend="triton").to(DEVICE)
    x = torch.randn(2, trees.distance.shape[1], 64, device=DEVICE, requires_grad=True)
    with count_host_reads() as reads:
        module(x, trees).sum().backward()
    assert reads == [], reads


def test_counter_records_the_package_reads():
    """The counter itself: a read made by the package is recorded, one made here is not."""
    with count_host_reads() as reads:
        bool(torch.ones(1))
        _validation.normalize_lengths(torch.tensor([1]), torch.zeros(1, 1, 2, 1))  # a CPU check: one read
    assert len(reads) == 1 and "_validation.py" in reads[0]
