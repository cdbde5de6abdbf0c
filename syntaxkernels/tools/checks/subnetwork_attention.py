"""Checks and benches of the sub-network attention (``python -m syntaxkernels verify|bench``).

CHECKS: the op against the fp64 reference (forward, non-empty flags, dq, dk, dv): the Triton path on the current
device (CUDA, or CPU under ``TRITON_INTERPRET=1``; skipped otherwise) and the C++ path (CPU).
BENCHES: the edge counts of the relation masks on packed documents (any device: a property of the trees; treebank
sentences, or generated ones without the treebank),
and forward times on CUDA, each size checked against the reference before it is timed.
"""
from __future__ import annotations

import random
from typing import Dict

import torch

from . import Bench, Check, Skip
from .. import workloads
from syntaxkernels._interpreter import interpreting
from ..workloads import random_document


def _usable(device: str, backend: str) -> None:
    if backend == "triton" and device == "cpu" and not interpreting():
        raise Skip("the Triton kernels run on CPU only under TRITON_INTERPRET=1")
    if backend == "auto" and device != "cpu":
        raise Skip("the C++ path takes CPU tensors (run verify on the CPU)")
    if backend == "auto":
        from syntaxkernels import _ext

        if not _ext.available():
            raise Skip("the C++ extension is not built")


def _check(device: str, backend: str, dtype: torch.dtype, n: int, pairwise: bool):
    import syntaxkernels as sk
    from syntaxkernels import reference
    from syntaxkernels.tools.testing import compare_to_reference

    _usable(device, backend)
    rng = random.Random(0)
    rows = [random_document(rng, [n // 3, n - n // 3]), random_document(rng, [max(1, n // 2)]), []]
    trees = sk.TreeBatch.from_heads(rows).to(device)
    n = trees.max_len
    masks = sk.MaskSpec(pairwise=pairwise)
    B, H, D = len(rows), 2, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    grad = torch.randn(B, masks.num_masks, H, n, D, generator=gen, dtype=torch.float64).to(device)

    def run(fn, dt):
        args = [t.to(dt).requires_grad_(True) for t in (q, k, v)]
        out, nonempty = fn(*args)
        return (out, nonempty, *torch.autograd.grad(out, args, grad.to(dt)))

    kernel = run(lambda a, b, c: sk.syntax_subnetwork_attention(a, b, c, trees, masks, backend=backend), dtype)
    ref64 = run(lambda a, b, c: reference.syntax_subnetwork_attention(a, b, c, trees, masks), torch.float64)
    reflow = run(lambda a, b, c: reference.syntax_subnetwork_attention(a, b, c, trees, masks), dtype)
    if not torch.equal(kernel[1], ref64[1]):
        return False, "non-empty flags differ from the reference"
    details = []
    ok_all = True
    for name, i in (("out", 0), ("dq", 2), ("dk", 3), ("dv", 4)):
        ok, err, bound = compare_to_reference(kernel[i], ref64[i], reflow[i])
        ok_all &= ok
        details.append(f"{name} {err:.1e}/{bound:.1e}")
    return ok_all, ", ".join(details)


def _sentences():
    """``(heads of every sentence, what they are)``: the treebank's sentences, or generated forests of 1-40 tokens
    (mostly one tree, like parsed sentences) when ``SYNTAXKERNELS_UD`` names no file."""
    from syntaxkernels import data

    if data.treebank_available():
        return workloads.treebank_heads(), "treebank sentences"
    return workloads.generated_sentences(4000, seed=0), "generated (no treebank)"


def subnetwork_edge_stats(trees, masks) -> Dict[str, float]:
    """How much work the relation masks of ``masks`` (a MaskSpec) are on ``trees`` (a TreeBatch; any device).

    Returns ``edges`` (E, the listed pairs of every relation mask), ``edges_per_token`` (E over the valid
    tokens), ``valid_pairs`` (sum over items of length^2: the pairs a dense mask visits), ``relation_density``
    (E / (R * valid_pairs): the fraction of R dense masked attentions' work the relation masks need) and, per
    relation name, its edge count.
    """
    lengths = trees.lengths.long()
    valid_pairs = float((lengths * lengths).sum())
    tokens = float(lengths.sum())
    stats: Dict[str, float] = dict(edges=0.0, edges_per_token=0.0, valid_pairs=valid_pairs, relation_density=0.0)
    if masks.num_relations:
        lists = trees.relation_lists(masks)
        counts = (lists.row_ptr[1:] - lists.row_ptr[:-1]).view(lists.batch_size, lists.max_len, -1).sum(dim=(0, 1))
        for name, count in zip(lists.names, counts.tolist()):
            stats[name] = float(count)
        stats["edges"] = float(lists.num_edges)
        stats["edges_per_token"] = lists.num_edges / max(tokens, 1.0)
        stats["relation_density"] = lists.num_edges / max(lists.num_relations * valid_pairs, 1.0)
    return stats


def _bench_edges(device: str, quick: bool):
    import syntaxkernels as sk

    sentences, source = _sentences()
    masks = sk.MaskSpec()
    rows = []
    for n in ([512] if quick else [512, 1024, 4096]):
        trees = sk.TreeBatch.from_heads([workloads.pack_sentences(sentences, n, rows=1)[0]])
        stats = subnetwork_edge_stats(trees, masks)
        rows.append(dict(N=n, tokens=int(trees.lengths.sum()), edges=int(stats["edges"]),
                         edges_per_token=round(stats["edges_per_token"], 2),
                         relation_density=round(stats["relation_density"], 5), data=source))
    return rows


def time_rows(device: str, sentences, sizes, timer, heads: int = 12, dim: int = 64, tokens: int = 8192):
    """Forward times (``timer(fn) -> ms``) of the Triton path and the reference in bf16 on documents packed from
    ``sentences``, B = ``tokens // N`` rows of N tokens, default masks. Each size is first checked against the
    fp64 reference on its first row (outputs and non-empty flags); a size that fails raises instead of being
    timed."""
    import syntaxkernels as sk
    from syntaxkernels import reference
    from syntaxkernels.tools.testing import compare_to_reference

    masks = sk.MaskSpec()
    rows = []
    for n in sizes:
        batch = max(1, tokens // n)
        heads_rows = workloads.pack_sentences(sentences, n, rows=batch)
        trees = sk.TreeBatch.from_heads(heads_rows)
        trees.relation_lists(masks)
        trees = trees.to(device)
        n = trees.max_len
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(batch, heads, n, dim, generator=gen).to(device, torch.bfloat16) for _ in range(3))

        first = sk.TreeBatch.from_heads(heads_rows[:1]).to(device)
        m = first.max_len
        q1, k1, v1 = (t[:1, :, :m] for t in (q, k, v))
        out, nonempty = sk.syntax_subnetwork_attention(q1, k1, v1, first, masks, backend="triton")
        ref64, ref_nonempty = reference.syntax_subnetwork_attention(q1.double(), k1.double(), v1.double(), first,
                                                                    masks)
        reflow, _ = reference.syntax_subnetwork_attention(q1, k1, v1, first, masks)
        ok, err, bound = compare_to_reference(out, ref64, reflow)
        if not ok or not torch.equal(nonempty, ref_nonempty):
            raise RuntimeError(f"N={n}: the Triton path disagrees with the reference (out {err:.1e}/{bound:.1e}, "
                               f"flags equal: {torch.equal(nonempty, ref_nonempty)}), so it is not timed")
        for name, fn in (("syntaxkernels", lambda: sk.syntax_subnetwork_attention(q, k, v, trees, masks,
                                                                                   backend="triton")),
                         ("reference", lambda: reference.syntax_subnetwork_attention(q, k, v, trees, masks))):
            rows.append(dict(provider=name, N=n, batch=batch, fwd_ms=round(timer(fn), 3),
                             checked=f"out {err:.1e}/{bound:.1e} vs fp64 (first row)"))
    return rows


def _bench_cuda(device: str, quick: bool):
    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise Skip("timings need a CUDA device")
    import triton

    sentences, source = _sentences()
    rows = time_rows(device, sentences, [512] if quick else [512, 2048], triton.testing.do_bench)
    return [dict(row, data=source) for row in rows]


def check_replay(device):
    """The edge-list launchers' replay (``syntaxkernels.ops._replay``): the sub-network op's relations on one batch,
    a first layer recorded and a second one (other q, k, v) replayed, give outputs and every gradient bit-identical
    to the launchers as written, and both programs (forward, backward) were replayed."""
    import syntaxkernels as sk
    from syntaxkernels.ops import _replay

    _usable(device, "triton")
    rng = random.Random(1)
    trees = sk.TreeBatch.from_heads([random_document(rng, [20, 17]), random_document(rng, [30])]).to(device)
    masks = sk.MaskSpec()
    B, N, H, D = trees.distance.shape[0], trees.max_len, 2, 64

    def layer(seed):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(B, H, N, D, generator=gen).to(device, torch.bfloat16).requires_grad_()
                   for _ in range(3))
        out, nonempty = sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")
        grad = torch.randn(out.shape, generator=gen).to(device, torch.bfloat16)
        return [out, nonempty, *torch.autograd.grad(out, (q, k, v), grad)]

    enabled = _replay.set_enabled(True)
    try:
        _replay.clear()
        layer(3)
        replayed = layer(4)
        programs = [p for key, p in _replay.programs().items() if key[0].startswith("edge_attention")]
        _replay.set_enabled(False)
        written = layer(4)
    finally:
        _replay.set_enabled(enabled)
    differ = [name for name, x, y in zip(("out", "nonempty", "dq", "dk", "dv"), replayed, written)
              if not torch.equal(x, y)]
    used = len(programs) == 2 and all(p is not None and p.replays == 1 for p in programs)
    detail = f"{len(programs)} edge-list programs, " + ("each replayed once" if used else "NOT replayed")
    detail += f", {', '.join(differ)} differ FAIL" if differ else ", bit-identical to as written"
    return not differ and used, detail


CHECKS = [
    Check("subnetwork_attention.launcher_replay", check_replay),
    Check("subnetwork_attention.triton_fp32_forest_default_masks_n37",
          lambda device: _check(device, "triton", torch.float32, 37, False)),
    Check("subnetwork_attention.triton_bf16_forest_pairwise_n70",
          lambda device: _check(device, "triton", torch.bfloat16, 70, True)),
    Check("subnetwork_attention.cpp_fp32_forest_pairwise_n70",
          lambda device: _check(device, "auto", torch.float32, 70, True)),
]

BENCHES = [
    Bench("subnetwork_attention relation edges (packed documents)", _bench_edges),
    Bench("subnetwork_attention forward time (bf16, H=12, D=64)", _bench_cuda),
]
