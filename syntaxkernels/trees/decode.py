"""Trees from arc scores: the maximum spanning dependency tree of each sentence (:func:`decode_tree`).

A scorer (:class:`syntaxkernels.nn.TreePredictor`, or any biaffine or probe-based one) gives per sentence a matrix
``scores [N, N]``: ``scores[h, d]`` for ``h != d`` is the score of word ``h`` as the head of word ``d``, and the
diagonal ``scores[d, d]`` is the score of word ``d`` as the root word. :func:`decode_tree` returns the heads of the
highest-scoring tree with exactly one root word, in :meth:`TreeBatch.from_heads`'s convention (0-based heads, -1 for
the root word), so the result feeds the ops' structure plans directly.

Algorithm: Chu-Liu/Edmonds (non-projective, as UD trees are), over the words plus an artificial root whose arcs are
the diagonal: every word takes its best incoming arc, a cycle is contracted into one node (arcs into it re-scored
by what replacing the member's cycle arc changes), until no cycle is left, then the cycles are expanded. The dense
bookkeeping keeps it ``O(N^2)`` per sentence (only the contracted node's arcs change at each contraction).

Single root: an arc weighs the pair ``(-[it is a root arc], score)``, compared lexicographically, so the best tree
has the fewest root arcs (one, whenever a single-rooted tree is allowed) and among those the highest total score:
exact, with no large constant subtracted from the root scores. Scores are summed in double precision; ties go to
the lower head index (among trees of equal score any one may be returned).

``-inf`` marks a forbidden arc. NaN or ``+inf`` scores, and allowed arcs that form no single-rooted tree, raise
``ValueError`` naming the batch item.

Two decoders give the same trees: the C++ extension (``syntaxkernels._C.decode_tree``: parallel over the batch, GIL
released) and the pure-Python one here (used when the extension lacks it, or with ``backend="python"``).
"""
from __future__ import annotations

import math
from typing import List

import numpy as np
import torch

from .. import _ext

__all__ = ["decode_tree", "python_decode_tree"]

_NO_ARC = -math.inf


def _decode_one(where: str, s: np.ndarray) -> List[int]:
    """Heads of one sentence's ``s [n, n]`` (float64, validated): the module's algorithm, step for step with the
    C++ decoder (csrc/mst_decode.cpp)."""
    n = s.shape[0]
    m = n + 1
    score = np.full((m, m), _NO_ARC)
    roots = np.zeros((m, m), dtype=np.int64)
    score[1:, 1:] = s
    np.fill_diagonal(score, _NO_ARC)
    score[0, 1:] = np.diag(s)
    roots[0, 1:] = -1
    arc_head = np.repeat(np.arange(m)[:, None], m, axis=1)
    arc_dep = np.repeat(np.arange(m)[None, :], m, axis=0)
    alive = [True] * m
    group = list(range(m))

    def key(u, v):
        return (int(roots[u, v]), float(score[u, v]))

    def best_parent(v):
        best = -1
        for u in range(m):
            if not alive[u] or u == v or score[u, v] == _NO_ARC:
                continue
            if best < 0 or key(u, v) > key(best, v):
                best = u
        return best

    parent = [-1] * m
    for v in range(1, m):
        parent[v] = best_parent(v)
        if parent[v] < 0:
            raise ValueError(f"{where}, word {v - 1}: no allowed head (every score in column {v - 1} is -inf)")
    mark = [0] * m  # 0 unvisited, 1 reaches the root, 2 on the current walk
    mark[0] = 1
    cycles = []  # (c, members, member arcs, groups before contraction)
    while True:
        start = next((v for v in range(1, m) if alive[v] and mark[v] == 0), -1)
        if start < 0:
            break
        walk = []
        node = start
        while mark[node] == 0:
            mark[node] = 2
            walk.append(node)
            node = parent[node]
        if mark[node] == 1:
            for v in walk:
                mark[v] = 1
            continue
        for v in walk:
            mark[v] = 0
        c = node
        members, v = [], c
        while True:
            members.append(v)
            v = parent[v]
            if v == c:
                break
        member_arcs = [(int(arc_head[parent[x], x]), int(arc_dep[parent[x], x])) for x in members]
        cycles.append((c, members, member_arcs, list(group)))
        in_cycle = set(members)
        for u in range(m):
            if not alive[u] or u in in_cycle:
                continue
            best_in = None
            best_out = -1
            for x in members:
                if score[u, x] != _NO_ARC:
                    value = (int(roots[u, x] - roots[parent[x], x]), float(score[u, x] - score[parent[x], x]))
                    if best_in is None or value > best_in[0]:
                        best_in = (value, x)
                if u != 0 and score[x, u] != _NO_ARC and (best_out < 0 or key(x, u) > key(best_out, u)):
                    best_out = x
            if best_in is not None:
                (r, sc), x = best_in
                roots[u, c], score[u, c] = r, sc
                arc_head[u, c], arc_dep[u, c] = arc_head[u, x], arc_dep[u, x]
            else:
                score[u, c] = _NO_ARC
            if u != 0:
                if best_out >= 0:
                    roots[c, u], score[c, u] = roots[best_out, u], score[best_out, u]
                    arc_head[c, u], arc_dep[c, u] = arc_head[best_out, u], arc_dep[best_out, u]
                else:
                    score[c, u] = _NO_ARC
        for x in members:
            if x != c:
                alive[x] = False
            mark[x] = 0
        group = [c if not alive[g] else g for g in group]
        for u in range(1, m):
            if alive[u] and u != c and not alive[parent[u]]:
                parent[u] = c
        parent[c] = best_parent(c)
        if parent[c] < 0:
            raise ValueError(f"{where}: the allowed arcs (scores above -inf) form no tree")

    enter = [None] * m
    for v in range(1, m):
        if alive[v]:
            enter[v] = (int(arc_head[parent[v], v]), int(arc_dep[parent[v], v]))
    for c, members, member_arcs, groups in reversed(cycles):
        h, d = enter[c]
        holder = groups[d]
        for x, arc in zip(members, member_arcs):
            enter[x] = (h, d) if x == holder else arc
    heads = [enter[v][0] - 1 for v in range(1, m)]
    root_words = sum(h == -1 for h in heads)
    if root_words != 1:
        raise ValueError(f"{where}: the allowed arcs (scores above -inf) form no tree with a single root word "
                         f"(the best has {root_words})")
    return heads


def python_decode_tree(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The pure-Python decoder: heads int64 ``[B, N]`` of float ``scores [B, N, N]`` (CPU) and int64 ``lengths
    [B]``; the C++ decoder's results and ValueErrors (lengths first, then the lowest bad item)."""
    B, N = scores.shape[0], scores.shape[1]
    lengths_list = lengths.tolist()
    for b, n in enumerate(lengths_list):
        if n < 0:
            raise ValueError(f"batch item {b}: lengths[{b}] = {n} is negative")
        if n > N:
            raise ValueError(f"batch item {b}: lengths[{b}] = {n} is larger than N = {N}")
    heads = torch.full((B, N), -1, dtype=torch.int64)
    values = scores.to(torch.float32).numpy().astype(np.float64)
    for b, n in enumerate(lengths_list):
        block = values[b, :n, :n]
        bad = np.argwhere(np.isnan(block) | (block == math.inf))
        if bad.size:
            h, d = (int(i) for i in bad[0])
            raise ValueError(f"batch item {b}: scores[{h}, {d}] = {float(scores[b, h, d]):g} (scores must be "
                             f"finite, or -inf for a forbidden arc)")
        if n:
            heads[b, :n] = torch.tensor(_decode_one(f"batch item {b}", block))
    return heads


def decode_tree(scores: torch.Tensor, lengths=None, *, backend: str = "auto", num_threads: int = 0) -> torch.Tensor:
    """The maximum spanning tree with one root word of each sentence (module docstring).

    Args:
        scores: float ``[B, N, N]`` (or ``[N, N]`` for one sentence): ``scores[b, h, d]`` the score of word ``h``
            as the head of word ``d``, the diagonal ``scores[b, d, d]`` the score of ``d`` as the root word; ``-inf``
            forbids an arc. Any device and floating dtype (decoded on the CPU in float32; no gradient).
        lengths: int ``[B]``, the words of each sentence (the rest is padding, never read); None: all ``N``.
        backend: "auto" (the C++ decoder when built, else Python), "cpp" or "python".
        num_threads: C++ threads over the batch; 0 = torch's.
    Returns:
        heads int64 ``[B, N]`` (``[N]`` for a 2-D input) on the scores' device: 0-based heads, -1 for the one root
        word and for padding; ``TreeBatch.from_heads(heads, lengths)`` takes them as they are.
    Raises ValueError naming the batch item for NaN or ``+inf`` scores, a length out of ``0..N``, or allowed arcs
    that form no single-rooted tree.
    """
    if not isinstance(scores, torch.Tensor):
        raise ValueError(f"scores must be a tensor [B, N, N], got {type(scores).__name__}")
    single = scores.dim() == 2
    if single:
        scores = scores.unsqueeze(0)
    if scores.dim() != 3 or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"scores must have shape [B, N, N] (or [N, N]), got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must have a floating dtype, got {scores.dtype}")
    B, N = scores.shape[0], scores.shape[1]
    device = scores.device
    if lengths is None:
        lengths_t = torch.full((B,), N, dtype=torch.int64)
    else:
        lengths_t = torch.as_tensor(lengths)
        if lengths_t.dtype == torch.bool or lengths_t.is_floating_point() or lengths_t.is_complex():
            raise ValueError(f"lengths must be integers [B], got dtype {lengths_t.dtype}")
        if lengths_t.dim() != 1 or lengths_t.shape[0] != B:
            raise ValueError(f"lengths must have shape [B] = [{B}], got {tuple(lengths_t.shape)}")
        lengths_t = lengths_t.detach().to("cpu", torch.int64).contiguous()
    scores_cpu = scores.detach().to("cpu", torch.float32).contiguous()
    if backend not in ("auto", "cpp", "python"):
        raise ValueError(f"backend must be 'auto', 'cpp' or 'python', got {backend!r}")
    module = _ext.load()
    has = module is not None and hasattr(module, "decode_tree")
    if backend == "cpp" and not has:
        raise RuntimeError("the C++ extension (with decode_tree) is not available: " + _ext.status())
    if backend == "cpp" or (backend == "auto" and has):
        heads = module.decode_tree(scores_cpu, lengths_t, int(num_threads))
    else:
        heads = python_decode_tree(scores_cpu, lengths_t)
    heads = heads.to(device)
    return heads[0] if single else heads
