"""Checks and quick benchmarks of the tree-distance builders (C++, CUDA, Python) against oracles.

Also the oracles and the competing implementations the tests and ``benchmarks/bench_tree_distance.py``
use: a breadth-first-search oracle, ``scipy.sparse.csgraph.shortest_path``, networkx, and a pure-Python
per-pair lowest-common-ancestor walk, all returning the builders' layout (``uint8``, 255 = unreachable,
saturating at 254), plus generated forests and the shared treebank in batches of 32 sentences.
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import Bench, Check, Skip

Heads = Sequence[int]



# ----------------------------------------------------------------------------------------------- data

from ..workloads import generated_sentences, treebank_heads  # noqa: E402 - the one source of trees


def batches(sentences: Sequence[Heads], batch_size: int = 32) -> List[List[List[int]]]:
    return [[list(s) for s in sentences[i:i + batch_size]] for i in range(0, len(sentences), batch_size)]


def benchmark_batches(batch_size: int = 32, count: Optional[int] = None) -> Tuple[str, List[List[List[int]]]]:
    """``(source, batches)``: the treebank in batches of ``batch_size`` when present, generated otherwise."""
    try:
        sentences = treebank_heads()
        source = f"UD English-EWT dev ({len(sentences)} sentences)"
    except FileNotFoundError:
        from syntaxkernels.data import ENV_VAR

        sentences = generated_sentences(2000)
        source = f"generated forests (2000 sentences, lengths 1-40; no treebank: set {ENV_VAR})"
    result = batches(sentences, batch_size)
    if count is not None:
        result = result[:count]
    return source, result


def padded(sentences: Sequence[Heads]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``heads int64 [B, N]`` (padded with -1) and ``lengths int64 [B]`` of ragged head lists."""
    from syntaxkernels.trees import normalize_heads

    return normalize_heads([list(s) for s in sentences])


def pair_count(sentences: Sequence[Heads]) -> int:
    """Valid (query, key) pairs of a batch: the sum of squared lengths."""
    return sum(len(s) ** 2 for s in sentences)


# -------------------------------------------------------------------------------------------- oracles

def _batch_layout(sentences: Sequence[Heads], n: Optional[int], sentence_fn) -> np.ndarray:
    n = max((len(s) for s in sentences), default=0) if n is None else n
    out = np.full((len(sentences), n, n), 255, dtype=np.uint8)
    for b, s in enumerate(sentences):
        if len(s):
            out[b, : len(s), : len(s)] = sentence_fn(list(s))
    return out


def bfs_sentence(heads: Heads) -> np.ndarray:
    """``uint8 [L, L]`` by a breadth-first search from every token over the undirected head graph."""
    length = len(heads)
    neighbours: List[List[int]] = [[] for _ in range(length)]
    for i, h in enumerate(heads):
        if h >= 0:
            neighbours[i].append(h)
            neighbours[h].append(i)
    out = np.full((length, length), 255, dtype=np.uint8)
    for source in range(length):
        seen = {source: 0}
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for other in neighbours[node]:
                if other not in seen:
                    seen[other] = seen[node] + 1
                    queue.append(other)
        for node, d in seen.items():
            out[source, node] = min(d, 254)
    return out


def bfs_depth_segment(heads: Heads) -> Tuple[np.ndarray, np.ndarray]:
    """``depth int32 [L]`` and ``segment int32 [L]`` (trees numbered by root position) by walking up."""
    roots = [i for i, h in enumerate(heads) if h == -1]
    rank = {r: k for k, r in enumerate(roots)}
    depth = np.zeros(len(heads), dtype=np.int32)
    segment = np.zeros(len(heads), dtype=np.int32)
    for i in range(len(heads)):
        node, steps = i, 0
        while heads[node] != -1:
            node, steps = heads[node], steps + 1
        depth[i], segment[i] = steps, rank[node]
    return depth, segment


def bfs_tree_distance(sentences: Sequence[Heads], n: Optional[int] = None) -> np.ndarray:
    """``uint8 [B, N, N]`` by breadth-first search (the slow, obvious oracle)."""
    return _batch_layout(sentences, n, bfs_sentence)


def _scipy_sentence(heads: Heads) -> np.ndarray:
    import scipy.sparse as sparse
    from scipy.sparse.csgraph import shortest_path

    h = np.asarray(heads, dtype=np.int64)
    child = np.nonzero(h >= 0)[0]
    graph = sparse.csr_matrix((np.ones(child.size), (child, h[child])), shape=(h.size, h.size))
    d = shortest_path(graph, directed=False, unweighted=True)
    return np.where(np.isinf(d), 255, np.minimum(d, 254)).astype(np.uint8)


def scipy_tree_distance(sentences: Sequence[Heads], n: Optional[int] = None) -> np.ndarray:
    """``uint8 [B, N, N]`` with ``scipy.sparse.csgraph.shortest_path``, one call per sentence."""
    return _batch_layout(sentences, n, _scipy_sentence)


def _networkx_sentence(heads: Heads) -> np.ndarray:
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(len(heads)))
    graph.add_edges_from((i, h) for i, h in enumerate(heads) if h >= 0)
    out = np.full((len(heads), len(heads)), 255, dtype=np.uint8)
    for source, lengths in nx.all_pairs_shortest_path_length(graph):
        for target, d in lengths.items():
            out[source, target] = min(d, 254)
    return out


def networkx_tree_distance(sentences: Sequence[Heads], n: Optional[int] = None) -> np.ndarray:
    """``uint8 [B, N, N]`` with ``networkx.all_pairs_shortest_path_length``."""
    return _batch_layout(sentences, n, _networkx_sentence)


def _lca_sentence(heads: Heads) -> np.ndarray:
    length = len(heads)
    depth, _ = bfs_depth_segment(heads)
    out = np.full((length, length), 255, dtype=np.uint8)
    for i in range(length):
        for j in range(length):
            a, b, d = i, j, 0
            while depth[a] > depth[b]:
                a, d = heads[a], d + 1
            while depth[b] > depth[a]:
                b, d = heads[b], d + 1
            while a != b and a != -1:
                a, b, d = heads[a], heads[b], d + 2
            if a == b:
                out[i, j] = min(d, 254)
    return out


def lca_tree_distance(sentences: Sequence[Heads], n: Optional[int] = None) -> np.ndarray:
    """``uint8 [B, N, N]`` by a pure-Python walk to the lowest common ancestor of every pair."""
    return _batch_layout(sentences, n, _lca_sentence)


# --------------------------------------------------------------------------------------------- checks

def _extension():
    from syntaxkernels import _ext

    module = _ext.load()
    if module is None:
        raise Skip("C++ extension not loaded: " + _ext.status())
    return module


def _compare_builders(sentences: Sequence[Heads], pad: int, use_cpp: bool) -> Tuple[bool, str]:
    from syntaxkernels.trees import python_tree_tensors

    heads, lengths = padded(sentences)
    if pad:
        heads = torch.cat([heads, torch.full((heads.shape[0], pad), -1, dtype=torch.int64)], dim=1)
    n = heads.shape[1]
    expected = bfs_tree_distance(sentences, n)
    python = python_tree_tensors(heads, lengths)
    results = {"python": python}
    if use_cpp:
        module = _extension()
        results["cpp (1 thread)"] = module.tree_distance(heads, lengths, 1)
        results["cpp (all threads)"] = module.tree_distance(heads, lengths, 0)
    depth = np.full((len(sentences), n), -1, dtype=np.int32)
    segment = np.full((len(sentences), n), -1, dtype=np.int32)
    for b, s in enumerate(sentences):
        depth[b, : len(s)], segment[b, : len(s)] = bfs_depth_segment(s)
    for name, (dist, dep, seg) in results.items():
        for what, got, want in (("distance", dist, expected), ("depth", dep, depth), ("segment", seg, segment)):
            bad = np.argwhere(got.numpy() != want)
            if bad.size:
                return False, f"{name} {what} differs from the BFS oracle at {tuple(bad[0])} ({len(bad)} entries)"
    return True, f"{len(sentences)} forests, {pair_count(sentences)} pairs: {', '.join(results)} == BFS oracle"


def check_python_vs_bfs(device: str) -> Tuple[bool, str]:
    sentences = generated_sentences(48, seed=1) + [[], [-1], [-1, -1, 0]]
    return _compare_builders(sentences, pad=3, use_cpp=False)


def check_cpp_vs_bfs(device: str) -> Tuple[bool, str]:
    _extension()
    sentences = generated_sentences(96, seed=2) + [[], [-1], list(range(-1, 299))]  # a 300-token chain saturates
    return _compare_builders(sentences, pad=5, use_cpp=True)


def has_scipy() -> bool:
    """True when scipy's graph routines import (scipy is optional: the ``test`` and ``bench`` extras)."""
    try:
        import scipy.sparse.csgraph  # noqa: F401
    except ImportError:
        return False
    return True


def check_treebank(device: str) -> Tuple[bool, str]:
    from syntaxkernels.trees import tree_distance

    try:
        sentences = treebank_heads()
    except FileNotFoundError as exc:
        raise Skip(str(exc))
    oracle, oracle_name = ((scipy_tree_distance, "scipy shortest_path") if has_scipy()
                           else (bfs_tree_distance, "the BFS oracle (scipy is not installed)"))
    for k, batch in enumerate(batches(sentences, 32)):
        got = tree_distance(batch).numpy()
        want = oracle(batch)
        if not np.array_equal(got, want):
            return False, f"batch {k}: tree_distance differs from {oracle_name} at {tuple(np.argwhere(got != want)[0])}"
    from syntaxkernels import _ext

    builder = "C++" if _ext.available() else "Python"
    return True, f"{len(sentences)} treebank sentences ({builder} builder) == {oracle_name}"


BAD_INPUTS = [
    ([[-1, 0, 5]], None),
    ([[-1, -2]], None),
    ([[-1, 1]], None),
    ([[-1, 0], [2, 0, 1]], None),
    ([[-1, 3, 1, 4, 3]], None),
    ([[-1, 0], [-1, 0]], [2, -1]),
    ([[-1, 0], [-1, 0]], [2, 3]),
]


def check_errors(device: str) -> Tuple[bool, str]:
    from syntaxkernels.trees import normalize_heads, python_tree_tensors

    module = _extension()
    for heads, lengths in BAD_INPUTS:
        tensor = padded(heads)[0]
        lengths_t = torch.tensor(lengths) if lengths is not None else padded(heads)[1]
        messages = []
        for build in (lambda: module.tree_distance(tensor, lengths_t, 2),
                      lambda: python_tree_tensors(*normalize_heads(tensor, lengths_t))):
            try:
                build()
                messages.append(None)
            except ValueError as exc:
                messages.append(str(exc))
        if messages[0] is None or messages[0] != messages[1]:
            return False, f"heads {heads}, lengths {lengths}: C++ says {messages[0]!r}, Python {messages[1]!r}"
    return True, f"{len(BAD_INPUTS)} bad inputs: C++ and Python raise the same ValueError"


def check_cuda(device: str) -> Tuple[bool, str]:
    from syntaxkernels import _ext

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise Skip("needs a CUDA device")
    if not _ext.has_cuda_builder():
        raise Skip("the CUDA tree builder is not built: " + _ext.status())
    module = _ext.load()
    sentences = generated_sentences(96, seed=3) + [[], [-1], list(range(-1, 299))]
    try:
        sentences += treebank_heads()[:256]
    except FileNotFoundError:
        pass
    heads, lengths = padded(sentences)
    cpu = module.tree_distance(heads, lengths, 0)
    gpu = module.tree_distance_cuda(heads.to(device), lengths.to(device))
    for name, a, b in zip(("distance", "depth", "segment"), cpu, gpu):
        if b.device.type != "cuda":
            return False, f"{name} came back on {b.device}"
        if not torch.equal(a, b.cpu()):
            return False, f"CUDA {name} differs from C++ at {tuple(torch.nonzero(a != b.cpu())[0].tolist())}"
    for bad, lengths_list in BAD_INPUTS:
        t, l = padded(bad)
        if lengths_list is not None:
            l = torch.tensor(lengths_list)
        messages = []
        for build in (lambda: module.tree_distance(t, l, 1),
                      lambda: module.tree_distance_cuda(t.to(device), l.to(device))):
            try:
                build()
                messages.append(None)
            except ValueError as exc:
                messages.append(str(exc))
        if messages[0] != messages[1]:
            return False, f"heads {bad}: C++ says {messages[0]!r}, CUDA {messages[1]!r}"
    return True, f"{len(sentences)} trees and {len(BAD_INPUTS)} bad inputs: CUDA == C++"


CHECKS = [
    Check("trees.python_builder_vs_bfs", check_python_vs_bfs),
    Check("trees.cpp_builder_vs_python_vs_bfs", check_cpp_vs_bfs),
    Check("trees.treebank_vs_shortest_paths", check_treebank),
    Check("trees.bad_inputs_same_errors_cpp_python", check_errors),
    Check("trees.cuda_builder_vs_cpp", check_cuda),
]


# ------------------------------------------------------------------------------------------ benchmark

def time_per_batch(fn: Callable, batch_list: Sequence, min_seconds: float = 0.2, repeats: int = 3,
                   sync: Callable = lambda: None) -> float:
    """Seconds per batch: the best of ``repeats`` passes over ``batch_list`` (each pass >= min_seconds)."""
    best = float("inf")
    for _ in range(repeats):
        passes, start = 0, time.perf_counter()
        while True:
            for item in batch_list:
                fn(item)
            passes += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / (passes * len(batch_list)))
    return best


def bench_tree_distance(device: str, quick: bool) -> List[dict]:
    """Per-batch time of each builder on batches of 32 sentences, with its ratio to scipy and pairs/s.

    Without scipy (an optional dependency) the builders are still checked (against the BFS oracle) and timed;
    the scipy row says why it is missing and no row has ``vs_scipy``.
    """
    from syntaxkernels import _ext
    from syntaxkernels.trees import python_tree_tensors

    source, batch_list = benchmark_batches(32, count=8 if quick else None)
    tensors = [padded(b) for b in batch_list]
    pairs = sum(pair_count(b) for b in batch_list) / len(batch_list)
    scipy_ok = has_scipy()
    oracle = scipy_tree_distance if scipy_ok else bfs_tree_distance
    want = [oracle(b) for b in batch_list]
    providers: List[Tuple[str, Callable, Sequence, Callable]] = []
    module = _ext.load()
    if module is not None:
        threads = torch.get_num_threads()
        providers.append(("C++, 1 thread", lambda t: module.tree_distance(t[0], t[1], 1), tensors, lambda: None))
        providers.append((f"C++, {threads} threads", lambda t: module.tree_distance(t[0], t[1], 0), tensors,
                          lambda: None))
        if str(device).startswith("cuda") and _ext.has_cuda_builder():
            gpu = [(h.to(device), l.to(device)) for h, l in tensors]
            providers.append(("CUDA", lambda t: module.tree_distance_cuda(t[0], t[1]), gpu, torch.cuda.synchronize))
    providers.append(("Python/NumPy", lambda t: python_tree_tensors(t[0], t[1]), tensors, lambda: None))
    for name, fn, inputs, _ in providers:  # correctness before timing
        for k, item in enumerate(inputs):
            if not np.array_equal(fn(item)[0].cpu().numpy(), want[k]):
                raise AssertionError(f"{name} differs from {oracle.__name__} on batch {k}")
    min_seconds = 0.1 if quick else 0.5
    scipy_s = time_per_batch(scipy_tree_distance, batch_list, min_seconds=min_seconds) if scipy_ok else None
    widths = [int(h.shape[1]) for h, _ in tensors]
    timed = (f"{len(batch_list)} batches of {len(batch_list[0])} sentences (padded to N = {min(widths)}-"
             f"{max(widths)} tokens, {pairs:,.0f} valid pairs a batch on average)")
    rows = []
    for name, fn, inputs, sync in providers:
        seconds = time_per_batch(fn, inputs, min_seconds=min_seconds, sync=sync)
        row = dict(provider=name, batch_ms=seconds * 1e3, pairs_per_s=pairs / seconds, data=source, timed=timed)
        if scipy_s:
            row["vs_scipy"] = scipy_s / seconds
        rows.append(row)
    if scipy_ok:
        rows.append(dict(provider="scipy shortest_path", batch_ms=scipy_s * 1e3, vs_scipy=1.0,
                         pairs_per_s=pairs / scipy_s, data=source, timed=timed))
    else:
        rows.append(dict(provider="scipy shortest_path",
                         skipped="scipy is not installed (pip install scipy, or the [bench] extra)"))
    by_name = {r["provider"]: r for r in rows}
    one, many = by_name.get("C++, 1 thread"), by_name.get(f"C++, {torch.get_num_threads()} threads")
    if one is not None and many is not None and many is not one and many["batch_ms"] >= one["batch_ms"]:
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores now" if hasattr(os, "getloadavg") \
            else ""
        rows.append(dict(provider=many["provider"], note=(
            f"not faster than 1 thread here ({many['batch_ms'] * 1e3:.0f} vs {one['batch_ms'] * 1e3:.0f} us a "
            "batch): the builder starts its threads on every call (tens of microseconds each) and gives each "
            "thread at least 65,536 padded pairs, so on batches this small at most a thread or two run and "
            "starting them costs about what they save; busy cores make it worse" + load)))
    return rows


BENCHES = [Bench("tree_distance", bench_tree_distance)]

