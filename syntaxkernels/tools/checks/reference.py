"""Self-checks of the pure-PyTorch reference and of the modules built on it.

The reference is the specification, so it is checked against independent definitions: PyTorch's
``scaled_dot_product_attention`` (a zero table is plain attention), Syntax-BERT masks computed by walking
the head pointers, the structural-probe loss computed from an explicit ``[B, N, N, rank]`` difference tensor,
``gradcheck`` in float64, and ``nn.TransformerEncoderLayer`` for the encoder layer.

:func:`brute_force_masks` (the masks from the head pointers alone) is shared with the tests; the random trees come
from :mod:`syntaxkernels.tools.workloads`.
"""
from __future__ import annotations

import random
from typing import List, Sequence

import torch
import torch.nn.functional as F

from . import Check
from syntaxkernels.tools.testing import copy_into_torch_layer
from ..workloads import random_forest  # the one tree generator

__all__ = ["brute_force_masks", "CHECKS"]


def _chain(heads: Sequence[int], i: int) -> List[int]:
    """``[i, head(i), head(head(i)), ..., root]``."""
    chain = [i]
    while heads[chain[-1]] != -1:
        chain.append(heads[chain[-1]])
    return chain


def brute_force_masks(heads: Sequence[Sequence[int]], n: int, masks) -> torch.Tensor:
    """bool ``[B, M, n, n]``: the Syntax-BERT masks of docs/semantics.md, from the head pointers alone.

    ``heads`` is a ragged list (one row per batch item, padded to ``n``). For query i and key j:
    ``parent_d``: walking up d steps from j reaches i; ``child_d``: walking up d steps from i reaches j;
    ``sibling_d``: same root, neither on the other's chain, and the path through their lowest common ancestor
    has d edges; ``pairwise``: different roots; ``full``: both valid.
    """
    kinds = masks.kinds()
    out = torch.zeros(len(heads), len(kinds), n, n, dtype=torch.bool)
    for b, row in enumerate(heads):
        length = len(row)
        chains = [_chain(row, i) for i in range(length)]
        for i in range(length):
            for j in range(length):
                same_tree = chains[i][-1] == chains[j][-1]
                distance = None
                if same_tree:
                    lca = next(a for a in chains[i] if a in chains[j])
                    distance = chains[i].index(lca) + chains[j].index(lca)
                for m, (kind, d) in enumerate(kinds):
                    if kind == "parent":
                        hit = i in chains[j] and chains[j].index(i) == d
                    elif kind == "child":
                        hit = j in chains[i] and chains[i].index(j) == d
                    elif kind == "sibling":
                        hit = same_tree and i not in chains[j] and j not in chains[i] and distance == d
                    elif kind == "pairwise":
                        hit = not same_tree
                    else:
                        hit = True
                    out[b, m, i, j] = hit
    return out


def _rand(*shape, device, gen, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)
    return t.requires_grad_(requires_grad)


def _check_zero_table_is_sdpa(device):
    from syntaxkernels import BucketSpec, TreeBatch, reference

    gen = torch.Generator().manual_seed(1)
    rng = random.Random(1)
    heads = [random_forest(rng, 9, 1), random_forest(rng, 6, 2)]
    trees = TreeBatch.from_heads(heads).to(device)
    q, k, v = (_rand(2, 3, 9, 8, device=device, gen=gen) for _ in range(3))
    buckets = BucketSpec()
    table = torch.zeros(buckets.num_buckets, dtype=torch.float64, device=device)
    out = reference.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, lengths=trees.lengths)
    valid = torch.arange(9, device=device)[None, :] < trees.lengths[:, None]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
    err = ((out - expected) * valid[:, None, :, None]).abs().max().item()
    padded_rows = out[1, :, 6:].abs().max().item()
    return err < 1e-12 and padded_rows == 0.0, f"max |ref - sdpa| = {err:.2e}, padded rows max {padded_rows}"


def _check_masks_brute_force(device):
    from syntaxkernels import MaskSpec, TreeBatch, reference

    rng = random.Random(2)
    masks = MaskSpec(max_distance=3, pairwise=True)
    heads = [random_forest(rng, 11, 1), random_forest(rng, 9, 3), [-1], random_forest(rng, 11, 2)]
    trees = TreeBatch.from_heads(heads).to(device)
    got = reference.syntax_masks(trees, masks).cpu()
    expected = brute_force_masks(heads, 11, masks)
    bad = (got != expected).sum().item()
    return bad == 0, f"{bad} mismatching entries of {got.numel()} ({masks.num_masks} masks)"


def _check_gradcheck(device):
    from syntaxkernels import BucketSpec, MaskSpec, TreeBatch, reference

    gen = torch.Generator().manual_seed(3)
    trees = TreeBatch.from_heads([[1, -1, 1, 2, -1], [-1, 0, 1]]).to(device)
    q, k, v = (_rand(2, 2, 5, 3, device=device, gen=gen, requires_grad=True) for _ in range(3))
    buckets = BucketSpec(max_distance=3)
    table = _rand(2, buckets.num_buckets, device=device, gen=gen, requires_grad=True)
    scale = _rand(1, device=device, gen=gen, requires_grad=True)

    def bias(q, k, v, table, scale):
        return reference.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale,
                                               lengths=trees.lengths, window=2)

    masks = MaskSpec(max_distance=2, pairwise=True)
    query = _rand(2, 3, device=device, gen=gen, requires_grad=True)
    wk, wv = (_rand(2, 3, 3, device=device, gen=gen, requires_grad=True) for _ in range(2))

    def subnetwork(q, k, v, query, wk, wv):
        out, nonempty = reference.syntax_subnetwork_attention(q, k, v, trees, masks)
        return reference.topical_attention(out, nonempty, query, wk, wv)

    ok = torch.autograd.gradcheck(bias, (q, k, v, table, scale), raise_exception=False, fast_mode=True)
    ok_sub = torch.autograd.gradcheck(subnetwork, (q, k, v, query, wk, wv), raise_exception=False, fast_mode=True)
    return ok and ok_sub, f"bias attention gradcheck {ok}, sub-network + topical gradcheck {ok_sub}"


def _check_empty_rows(device):
    from syntaxkernels import BucketSpec, TreeBatch, reference

    gen = torch.Generator().manual_seed(4)
    trees = TreeBatch.from_heads([[-1, 0, -1], [-1, 0, 0]], lengths=[3, 0]).to(device)
    q, k, v = (_rand(2, 2, 3, 4, device=device, gen=gen, requires_grad=True) for _ in range(3))
    buckets = BucketSpec()
    table = _rand(buckets.num_buckets, device=device, gen=gen, requires_grad=True)
    out = reference.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, lengths=trees.lengths,
                                          window=1, causal=True)
    out.sum().backward()
    finite = all(bool(torch.isfinite(t).all()) for t in (out, q.grad, k.grad, v.grad, table.grad))
    empty_zero = out[1].abs().max().item() == 0 and q.grad[1].abs().max().item() == 0
    return finite and empty_zero, f"finite {finite}, empty item output and grad exactly zero {empty_zero}"


def _check_topical_average(device):
    from syntaxkernels import MaskSpec, TreeBatch, reference

    gen = torch.Generator().manual_seed(5)
    trees = TreeBatch.from_heads([[-1, 0, 0, 1, 3, -1], [-1]], lengths=[6, 1]).to(device)
    q, k, v = (_rand(2, 2, 6, 4, device=device, gen=gen) for _ in range(3))
    out, nonempty = reference.syntax_subnetwork_attention(q, k, v, trees, MaskSpec(max_distance=2))
    eye = torch.eye(4, dtype=torch.float64, device=device).expand(2, 4, 4)
    mixed = reference.topical_attention(out, nonempty, torch.zeros(2, 4, dtype=torch.float64, device=device), eye, eye)
    weights = nonempty.to(out.dtype)[:, :, None, :, None]
    average = (out * weights).sum(1) / weights.sum(1).clamp(min=1)
    err = (mixed - average).abs().max().item()
    return err < 1e-12, f"max |topical - average of non-empty sub-networks| = {err:.2e}"


def _check_probe_gram(device):
    from syntaxkernels import TreeBatch, reference

    gen = torch.Generator().manual_seed(6)
    trees = TreeBatch.from_heads([[-1, 0, 1, 1, -1, 4], [2, 2, -1, 2]]).to(device)
    g = _rand(2, 6, 5, device=device, gen=gen)
    proj = _rand(5, 3, device=device, gen=gen)
    dist_loss, depth_loss = reference.structural_probe_loss(g, proj, trees.distance, trees.depth, trees.lengths)
    p = g @ proj
    diff = ((p[:, :, None, :] - p[:, None, :, :]) ** 2).sum(-1)
    valid = trees.depth >= 0
    pairs = valid[:, :, None] & valid[:, None, :] & (trees.distance != 255) & ~torch.eye(6, dtype=torch.bool,
                                                                                         device=device)
    expected_dist = (trees.distance.double() ** 2 - diff).abs()[pairs].mean()
    expected_depth = (trees.depth.double() ** 2 - (p ** 2).sum(-1)).abs()[valid].mean()
    err = max((dist_loss - expected_dist).abs().item(), (depth_loss - expected_depth).abs().item())
    return err < 1e-10, f"max |gram-form - explicit| = {err:.2e}"


def _check_encoder_layer_matches_torch(device):
    from syntaxkernels import TreeBatch
    from syntaxkernels.nn import SyntaxTransformerEncoderLayer

    torch.manual_seed(7)
    trees = TreeBatch.from_heads([[-1, 0, 0, 2, 3, 0, 5], [1, -1, 1, 1]]).to(device)
    ok_all, details = True, []
    for norm_first in (False, True):
        ours = SyntaxTransformerEncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first, method="bias",
                                             backend="reference").to(device).double()
        theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first,
                                                  batch_first=True).to(device).double()
        copy_into_torch_layer(ours, theirs)
        x = torch.randn(2, 7, 16, dtype=torch.float64, device=device)
        padding = trees.key_padding_mask()
        got = ours(x, trees, src_key_padding_mask=padding)
        expected = theirs(x, src_key_padding_mask=padding)
        valid = ~padding
        err = (got - expected)[valid].abs().max().item()
        ok_all &= err < 1e-10
        details.append(f"norm_first={norm_first}: {err:.1e}")
    return ok_all, "fresh bias layer vs nn.TransformerEncoderLayer, max error " + ", ".join(details)


CHECKS = [
    Check("reference.zero_table_is_sdpa", _check_zero_table_is_sdpa),
    Check("reference.masks_vs_brute_force", _check_masks_brute_force),
    Check("reference.gradcheck_fp64", _check_gradcheck),
    Check("reference.empty_rows_zero", _check_empty_rows),
    Check("reference.topical_fresh_is_average", _check_topical_average),
    Check("reference.probe_gram_vs_explicit", _check_probe_gram),
    Check("reference.encoder_layer_vs_torch", _check_encoder_layer_matches_torch),
]
