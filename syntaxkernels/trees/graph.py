"""Graphs as a structure source: all-pairs shortest paths of sparse graphs, and :class:`GraphBatch`, their plan.

A graph is a list of edges ``(source, target)`` over the tokens ``0 .. n-1``: enhanced UD dependencies (the
CoNLL-U DEPS column, :func:`~syntaxkernels.trees.read_conllu` with ``enhanced=True``), semantic dependency graphs,
coreference chains and entity links across the sentences of a document, any edge list. For a batch the builders
return

- ``distance uint8 [B, N, N]``: the number of edges on a shortest path from token i to token j (following the
  edges source -> target when ``directed``, either way when not), 0 on the diagonal, saturating at 254;
  255 = unreachable, and on every row and column of padding (its diagonal too), as for trees.

A directed graph's distance is not symmetric: ``distance[b, i, j]`` is the path from the query i to the key j.
Self-loops and repeated edges are allowed and change nothing.

Edges come per item as a list of pairs (``[(0, 1), (1, 2)]``; a ``[E_b, 2]`` tensor or array works too), or as an
int tensor ``[B, E, 2]`` padded with ``(-1, -1)`` pairs. A pair with a negative endpoint other than ``(-1, -1)``
and an endpoint past the item's length raise ``ValueError`` naming the batch item and the edge.

Two builders give the same result: the C++ extension (``syntaxkernels._C.graph_distance``: one breadth-first
search per source token, ``O(n (n + E))`` per item, parallel over the batch, GIL released) and the pure-Python
fallback here (used when the extension is absent, or with ``backend="python"``).

:class:`GraphBatch` is the batch's :class:`~syntaxkernels.plan.StructurePlan` (padded, or packed: the sequences end
to end, the distance stored per sequence as for :class:`~syntaxkernels.PackedTreeBatch`): pass it to
``syntax_bias_attention`` as a tree batch is passed; it knows whether its distance is symmetric (undirected), so a
directed graph's backward reads a transposed copy derived once per batch. Sub-network relations (parent_d,
child_d, sibling_d of a ``MaskSpec``) are defined on trees only and refused for a graph
(:attr:`GraphBatch.relations_refused` says why); the distance window (``window=``) works on any distance.
"""
from __future__ import annotations

from collections import deque
from typing import List, Optional, Tuple

import numpy as np
import torch

from .. import _ext
from ..plan import ItemPlan
from ..specs import MAX_PATH, UNREACHABLE
from .batch import DISTANCE_ALIGNMENT, _map_distance

__all__ = ["graph_distance", "GraphBatch", "normalize_edges", "python_graph_distance", "build_graph_distance",
           "packed_graph_tensors"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _round_up(n: int) -> int:
    return -(-n // DISTANCE_ALIGNMENT) * DISTANCE_ALIGNMENT


def _item_pairs(b: int, item, where: str) -> np.ndarray:
    """One item's edges as int64 ``[E_b, 2]``: a sequence of pairs, or an integer tensor/array ``[E_b, 2]``."""
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        if item.dtype.kind not in "iu":
            raise ValueError(f"{where} {b}: edges must be integers, got dtype {item.dtype}")
        if item.size == 0:
            return np.zeros((0, 2), dtype=np.int64)
        if item.ndim != 2 or item.shape[1] != 2:
            raise ValueError(f"{where} {b}: edges must have shape [E, 2], got {tuple(item.shape)}")
        return item.astype(np.int64)
    if isinstance(item, (str, bytes)) or not hasattr(item, "__iter__"):
        raise ValueError(f"{where} {b}: expected a list of (source, target) pairs, got {item!r}")
    pairs = list(item)
    out = np.empty((len(pairs), 2), dtype=np.int64)
    for e, pair in enumerate(pairs):
        try:
            s, t = pair
        except (TypeError, ValueError):
            raise ValueError(f"{where} {b}, edge {e}: {pair!r} is not a (source, target) pair") from None
        for value in (s, t):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{where} {b}, edge {e}: {pair!r} is not a pair of integers")
        out[e, 0], out[e, 1] = int(s), int(t)
    return out


def _default_length(pairs: np.ndarray) -> int:
    """Tokens of an item without lengths: one past the largest endpoint (0 for no edges)."""
    real = pairs[(pairs[:, 0] != -1) | (pairs[:, 1] != -1)] if pairs.size else pairs
    return int(real.max()) + 1 if real.size else 0


def _check_lengths(lengths, B: int, where: str = "batch item") -> List[int]:
    values = torch.as_tensor(lengths)
    if values.dtype == torch.bool or values.dtype not in _INT_DTYPES:
        raise ValueError(f"lengths must be integers [B], got dtype {values.dtype}")
    if values.dim() != 1 or values.shape[0] != B:
        raise ValueError(f"lengths must have shape [B] = [{B}], got {tuple(values.shape)}")
    out = values.cpu().tolist()
    for b, n in enumerate(out):
        if n < 0:
            raise ValueError(f"{where} {b}: lengths[{b}] = {n} is negative")
    return out


def normalize_edges(edges, lengths=None, *, size: Optional[int] = None):
    """``(edges int64 [B, E, 2] CPU, lengths int64 [B] CPU, N)`` of a padded batch of graphs.

    Args:
        edges: an integer tensor/array ``[B, E, 2]`` padded with ``(-1, -1)``, or a list of per-item edge lists
            (pairs, or ``[E_b, 2]`` tensors/arrays).
        lengths: int ``[B]``: the tokens of each graph; None: one past each item's largest endpoint (give lengths
            when the last tokens have no edge).
        size: N, the padded token count (at least the longest length); None: the longest length.
    Raises ValueError for a malformed edge list, naming the batch item (and edge), or bad lengths. Endpoints are
    checked against the lengths by the builders.
    """
    if isinstance(edges, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(edges) if isinstance(edges, torch.Tensor) else torch.from_numpy(np.asarray(edges))
        if tensor.dtype == torch.bool or tensor.dtype not in _INT_DTYPES:
            raise ValueError(f"edges must be an integer tensor [B, E, 2], got dtype {tensor.dtype}")
        if tensor.dim() != 3 or tensor.shape[2] != 2:
            raise ValueError(f"edges must have shape [B, E, 2] (or be a list of per-item edge lists), got "
                             f"{tuple(tensor.shape)}")
        padded = tensor.detach().to("cpu", torch.int64).contiguous()
        items = None
    elif isinstance(edges, (list, tuple)):
        items = [_item_pairs(b, item, "batch item") for b, item in enumerate(edges)]
        E = max((p.shape[0] for p in items), default=0)
        padded = torch.full((len(items), E, 2), -1, dtype=torch.int64)
        for b, p in enumerate(items):
            padded[b, :p.shape[0]] = torch.from_numpy(p)
    else:
        raise ValueError(f"edges must be an int tensor [B, E, 2] or a list of per-item edge lists, got "
                         f"{type(edges).__name__}")
    B = padded.shape[0]
    if lengths is None:
        arrays = items if items is not None else [padded[b].numpy() for b in range(B)]
        length_list = [_default_length(p) for p in arrays]
    else:
        length_list = _check_lengths(lengths, B)
    longest = max(length_list, default=0)
    if size is None:
        size = longest
    elif isinstance(size, bool) or not isinstance(size, int) or size < longest:
        raise ValueError(f"size must be an int at least the longest length ({longest}), got {size!r}")
    return padded, torch.tensor(length_list, dtype=torch.int64), int(size)


def _edge_error(where: str, pairs: np.ndarray, length: int) -> Optional[str]:
    """The builders' message for a bad edge of one item (``where``: "batch item 3"), or None."""
    for e in range(pairs.shape[0]):
        s, t = int(pairs[e, 0]), int(pairs[e, 1])
        if s == -1 and t == -1:
            continue
        prefix = f"{where}, edge {e}: ({s}, {t})"
        if s < 0 or t < 0:
            return prefix + " has a negative endpoint (only a (-1, -1) pair pads an edge list)"
        if s >= length or t >= length:
            which, value = ("source", s) if s >= length else ("target", t)
            return f"{prefix}: {which} {value} out of range (length {length}; expected 0..{length - 1})"
    return None


def _bfs_block(where: str, pairs: np.ndarray, length: int, directed: bool) -> np.ndarray:
    """uint8 ``[length, length]``: one breadth-first search per source over adjacency lists (validated here)."""
    message = _edge_error(where, pairs, length)
    if message is not None:
        raise ValueError(message)
    out = np.full((length, length), UNREACHABLE, dtype=np.uint8)
    adjacency: List[List[int]] = [[] for _ in range(length)]
    for s, t in pairs.tolist():
        if s < 0 or s == t:
            continue
        adjacency[s].append(t)
        if not directed:
            adjacency[t].append(s)
    for source in range(length):
        seen = {source: 0}
        queue = deque([source])
        while queue:
            v = queue.popleft()
            d = seen[v] + 1
            for u in adjacency[v]:
                if u not in seen:
                    seen[u] = d
                    queue.append(u)
        row = out[source]
        for u, d in seen.items():
            row[u] = min(d, MAX_PATH)
    return out


def python_graph_distance(edges: torch.Tensor, lengths: torch.Tensor, N: int, P: Optional[int] = None, *,
                          directed: bool = False) -> torch.Tensor:
    """The pure-Python builder: uint8 ``[B, P, P]`` (P >= N, default N) of :func:`normalize_edges`' output, 255
    outside each item's block. Raises the C++ builder's ValueErrors (lengths, then the lowest bad item)."""
    P = N if P is None else P
    B = edges.shape[0]
    lengths_list = lengths.tolist()
    for b, n in enumerate(lengths_list):
        if n < 0:
            raise ValueError(f"batch item {b}: lengths[{b}] = {n} is negative")
        if n > N:
            raise ValueError(f"batch item {b}: lengths[{b}] = {n} is larger than N = {N}")
    out = np.full((B, P, P), UNREACHABLE, dtype=np.uint8)
    edges_np = edges.numpy()
    for b in range(B):
        n = lengths_list[b]
        out[b, :n, :n] = _bfs_block(f"batch item {b}", edges_np[b], n, directed)
    return torch.from_numpy(out)


def _use_cpp(backend: str, name: str) -> bool:
    if backend not in ("auto", "cpp", "python"):
        raise ValueError(f"backend must be 'auto', 'cpp' or 'python', got {backend!r}")
    module = _ext.load()
    has = module is not None and hasattr(module, name)
    if backend == "cpp" and not has:
        raise RuntimeError(f"the C++ extension (with {name}) is not available: " + _ext.status())
    return backend == "cpp" or (backend == "auto" and has)


def build_graph_distance(edges, lengths=None, *, directed: bool = False, size: Optional[int] = None,
                         backend: str = "auto", num_threads: int = 0):
    """``(edges int64 [B, E, 2], lengths int64 [B], distance uint8 [B, N, N])``, the distance an aligned view (rows
    of 16-byte multiples, :func:`~syntaxkernels.trees.aligned_distance`'s layout), everything on the CPU.
    ``backend``: "auto" (C++ when built, else Python), "cpp" or "python"; ``num_threads`` (C++): 0 = torch's."""
    if not isinstance(directed, bool):
        raise ValueError(f"directed must be a bool, got {directed!r}")
    edges_t, lengths_t, N = normalize_edges(edges, lengths, size=size)
    P = _round_up(N)
    if _use_cpp(backend, "graph_distance"):
        buffer = _ext.load().graph_distance(edges_t, lengths_t, N, P, directed, int(num_threads))
    else:
        buffer = python_graph_distance(edges_t, lengths_t, N, P, directed=directed)
    return edges_t, lengths_t, buffer[:, :N, :N]


def graph_distance(edges, lengths=None, *, directed: bool = False, size: Optional[int] = None,
                   backend: str = "auto") -> torch.Tensor:
    """All-pairs shortest-path distance ``uint8 [B, N, N]`` of a batch of sparse graphs (module docstring).

    Args:
        edges: per item a list of ``(source, target)`` pairs (or an int ``[E_b, 2]`` tensor), or an int tensor
            ``[B, E, 2]`` padded with ``(-1, -1)``.
        lengths: int ``[B]``, each graph's tokens; None: one past its largest endpoint.
        directed: follow edges source -> target only (the distance is then not symmetric); else either way.
        size: N (at least the longest length); None: the longest length.
        backend: "auto" (the C++ builder when built, else Python), "cpp" or "python".
    Returns:
        ``uint8 [B, N, N]`` on the edges' device (a tensor's; else the CPU): 0 diagonal, saturating at 254, 255 for
        unreachable pairs and on padding rows and columns (their diagonal too). Rows are 16-byte aligned, so the
        ops read it in place. Pass a :class:`GraphBatch` to the ops to keep the symmetry known.
    Raises ValueError naming the batch item and edge for an endpoint out of range or a negative endpoint outside
    a ``(-1, -1)`` padding pair.

    The same result as ``networkx.single_source_shortest_path_length`` from every token (the tests compare the
    two), clipped at 254 with 255 for unreachable.
    """
    device = edges.device if isinstance(edges, torch.Tensor) else torch.device("cpu")
    distance = build_graph_distance(edges, lengths, directed=directed, size=size, backend=backend)[2]
    return distance if device.type == "cpu" else _map_distance(lambda t: t.to(device), distance)


def _packed_items(edges, lengths) -> Tuple[List[np.ndarray], List[int]]:
    if isinstance(edges, (torch.Tensor, np.ndarray)) or not isinstance(edges, (list, tuple)):
        raise ValueError("packed graphs come as a list of per-sequence edge lists (pairs or [E_s, 2] tensors), got "
                         f"{type(edges).__name__}")
    items = [_item_pairs(s, item, "sequence") for s, item in enumerate(edges)]
    if lengths is None:
        length_list = [_default_length(p) for p in items]
    else:
        length_list = _check_lengths(lengths, len(items), "sequence")
    return items, length_list


def packed_graph_tensors(edges: torch.Tensor, edge_offsets: torch.Tensor, cu_seqlens: torch.Tensor, *,
                         directed: bool = False, backend: str = "auto", num_threads: int = 0):
    """``(distance uint8 [sum n_s^2], offsets int64 [S + 1])`` of packed graphs: sequence s's edges (pairs local to
    the sequence) are ``edges[edge_offsets[s]:edge_offsets[s + 1]]`` (int ``[E, 2]``), its tokens
    ``[cu_seqlens[s], cu_seqlens[s + 1])``. ValueError names the sequence and the edge within it."""
    edges = edges.to("cpu", torch.int64).contiguous()
    edge_offsets = edge_offsets.to("cpu", torch.int64).contiguous()
    cu = cu_seqlens.to("cpu", torch.int64).contiguous()
    if _use_cpp(backend, "packed_graph_distance"):
        return _ext.load().packed_graph_distance(edges, edge_offsets, cu, directed, int(num_threads))
    cu_list, eo = cu.tolist(), edge_offsets.tolist()
    S = len(cu_list) - 1
    offsets = [0]
    blocks = []
    for s in range(S):
        n = cu_list[s + 1] - cu_list[s]
        offsets.append(offsets[-1] + n * n)
        blocks.append(_bfs_block(f"sequence {s}", edges[eo[s]:eo[s + 1]].numpy(), n, directed).reshape(-1))
    distance = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint8)
    return torch.from_numpy(distance), torch.tensor(offsets, dtype=torch.int64)


_RELATIONS_REFUSED = (
    "the sub-network relations (parent_d, child_d, sibling_d of a MaskSpec) are defined on trees (one head per "
    "token); a graph has several heads per token (or none), so they are not defined for a GraphBatch. Use "
    "syntax_bias_attention with the GraphBatch (window=d keeps the pairs within d edges)")


class GraphBatch(ItemPlan):
    """A batch of graphs: the batch's :class:`~syntaxkernels.plan.StructurePlan` (module docstring), padded or packed.

    Attributes:
        edges: int64 ``[B, E, 2]`` padded with ``(-1, -1)`` (padded batch), or ``[E, 2]`` local to each sequence
            with ``edge_offsets`` int64 ``[S + 1]`` (packed batch).
        lengths: int64 ``[B]`` / ``[S]``: each graph's tokens.
        directed: whether edges were followed source -> target only; ``symmetric`` is ``not directed``.
        distance, kernel_lengths (padded) or cu_seqlens, sequence, distance_offsets, max_seqlen (packed): the plan's
            (:class:`~syntaxkernels.plan.StructurePlan`).
    """

    #: Why ``syntax_subnetwork_attention`` refuses this plan (its relations are tree relations).
    relations_refused = _RELATIONS_REFUSED

    def __init__(self, distance: torch.Tensor, *, edges: torch.Tensor, lengths: torch.Tensor, directed: bool,
                 edge_offsets: Optional[torch.Tensor] = None, kernel_lengths: Optional[torch.Tensor] = None,
                 cu_seqlens: Optional[torch.Tensor] = None, sequence: Optional[torch.Tensor] = None,
                 distance_offsets: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
        self.edges = edges
        self.edge_offsets = edge_offsets
        self.lengths = lengths
        self.directed = bool(directed)
        super().__init__(distance, symmetric=not directed, kernel_lengths=kernel_lengths, cu_seqlens=cu_seqlens,
                         sequence=sequence, distance_offsets=distance_offsets, max_seqlen=max_seqlen)

    @classmethod
    def from_edges(cls, edges, lengths=None, *, directed: bool = False, packed: bool = False,
                   size: Optional[int] = None, backend: str = "auto", num_threads: int = 0) -> "GraphBatch":
        """Build the plan of a batch of graphs.

        Args:
            edges, lengths, directed, size, backend: as in :func:`graph_distance` (``size`` for a padded batch).
            packed: the graphs end to end without padding (q, k, v ``[T, H, D]``; the distance stored per sequence,
                ``sum n_s^2`` bytes, as a :class:`~syntaxkernels.PackedTreeBatch`); ``edges`` is then a list of
                per-sequence edge lists, endpoints local to each sequence.
        The plan lives on the edges' device (a tensor's; else the CPU); it is built on the CPU.
        """
        if not isinstance(directed, bool):
            raise ValueError(f"directed must be a bool, got {directed!r}")
        device = edges.device if isinstance(edges, torch.Tensor) else torch.device("cpu")
        if packed:
            if size is not None:
                raise ValueError("size does not apply to a packed batch")
            items, length_list = _packed_items(edges, lengths)
            flat = (torch.from_numpy(np.concatenate(items)) if items else torch.zeros((0, 2), dtype=torch.int64))
            counts = torch.tensor([p.shape[0] for p in items], dtype=torch.int64)
            edge_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
            lengths_t = torch.tensor(length_list, dtype=torch.int64)
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths_t, 0)])
            distance, offsets = packed_graph_tensors(flat, edge_offsets, cu, directed=directed, backend=backend,
                                                     num_threads=num_threads)
            T = int(cu[-1])
            sequence = torch.searchsorted(cu[1:], torch.arange(T), right=True).to(torch.int32)
            return cls(distance, edges=flat, edge_offsets=edge_offsets, lengths=lengths_t, directed=directed,
                       cu_seqlens=cu.to(torch.int32), sequence=sequence, distance_offsets=offsets,
                       max_seqlen=max(length_list, default=0))
        edges_t, lengths_t, distance = build_graph_distance(edges, lengths, directed=directed, size=size,
                                                            backend=backend, num_threads=num_threads)
        batch = cls(distance, edges=edges_t, lengths=lengths_t, directed=directed,
                    kernel_lengths=lengths_t.to(torch.int32))
        return batch if device.type == "cpu" else batch.to(device)

    def _structure_tensors(self):
        return super()._structure_tensors() + (self.edges,)

    def _copied_from(self, other: "GraphBatch", non_blocking: bool) -> None:
        if self.directed != other.directed:
            raise ValueError("copy_: one graph batch is directed and the other not")
        self.lengths.copy_(other.lengths, non_blocking=non_blocking)
        self.edges, self.edge_offsets = other.edges, other.edge_offsets  # host-side edge lists: not read by kernels

    # -- devices -------------------------------------------------------------------------------------------

    def _map(self, fn) -> "GraphBatch":
        def opt(t):
            return None if t is None else fn(t)
        distance = fn(self.distance) if self.is_packed else _map_distance(fn, self.distance)
        moved = GraphBatch(distance, edges=fn(self.edges), edge_offsets=opt(self.edge_offsets),
                           lengths=fn(self.lengths), directed=self.directed, kernel_lengths=opt(self.kernel_lengths),
                           cu_seqlens=opt(self.cu_seqlens), sequence=opt(self.sequence),
                           distance_offsets=opt(self.distance_offsets), max_seqlen=self.max_seqlen)
        return self._carry_derived(moved, fn)

    def __repr__(self) -> str:
        kind = "packed" if self.is_packed else "padded"
        return (f"GraphBatch({kind}, items={self.num_items}, directed={self.directed}, "
                f"distance={tuple(self.distance.shape)}, derived={len(self._derived)}, device={self.device})")
