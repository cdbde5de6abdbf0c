"""The nn modules run the fused Triton ops when asked (here under TRITON_INTERPRET=1) and agree with the
same modules on the reference backend: outputs and every parameter gradient."""
import copy

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.ops._dispatch import interpreting
from syntaxkernels.tools.testing import assert_close_to_reference

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                                reason="needs CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _trees():
    heads = [[1, -1, 1, 4, 2, 4, -1, 6, 7, 8, 7], [-1, 0, 1, 0, 3]]
    return sk.TreeBatch.from_heads(heads).to(DEVICE)


def _perturb(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def _compare(make, call):
    """Run the module on the reference and on Triton (same weights); compare outputs and parameter grads."""
    torch.manual_seed(0)
    ref64 = _perturb(make("reference")).double().to(DEVICE)
    ref32 = copy.deepcopy(ref64).float()
    fused = copy.deepcopy(ref64).float()
    for module, backend in ((ref64, "reference"), (ref32, "reference"), (fused, "triton")):
        for sub in module.modules():
            if hasattr(sub, "backend"):
                sub.backend = backend
    x = torch.randn(2, 11, 64, dtype=torch.float64, device=DEVICE)
    outs = []
    for module, inp in ((ref64, x), (ref32, x.float()), (fused, x.float())):
        y = call(module, inp)
        y.square().sum().backward()
        outs.append(y)
    assert_close_to_reference(outs[2], outs[0], outs[1], "output")
    grads = 0
    for (name, p64), (_, p32), (_, pf) in zip(ref64.named_parameters(), ref32.named_parameters(),
                                              fused.named_parameters()):
        if p64.grad is None:
            continue
        assert pf.grad is not None, name
        assert_close_to_reference(pf.grad, p64.grad, p32.grad, name)
        grads += int(pf.grad.abs().sum() > 0)
    assert grads >= 4


def test_syntax_biased_self_attention_uses_the_kernel():
    trees = _trees()
    _compare(lambda backend: sk.nn.SyntaxBiasedSelfAttention(64, 2, per_head=True, backend=backend),
             lambda m, x: m(x, trees))


@pytest.mark.long_on_cpu
def test_syntax_bert_self_attention_uses_the_kernel():
    trees = _trees()
    _compare(lambda backend: sk.nn.SyntaxBertSelfAttention(64, 2, masks=sk.MaskSpec(max_distance=2, pairwise=True),
                                                           backend=backend),
             lambda m, x: m(x, trees))


@pytest.mark.long_on_cpu
def test_syntax_gat_uses_the_kernel():
    trees = _trees()
    _compare(lambda backend: sk.nn.SyntaxGAT(64, num_layers=2, num_heads=2, head_dim=32, window=2, backend=backend,
                                             variant="package"),  # the paper's GAT: test_papers.py
             lambda m, x: m(x, trees))
