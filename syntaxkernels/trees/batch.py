"""Tree batches: validation, the all-pairs tree-distance builders, and ``TreeBatch``.

A tree is a vector of 0-based head indices, ``-1`` for a root; several roots make a forest. For a batch
``heads [B, N]`` with ``lengths [B]`` the builders return

- ``distance uint8 [B, N, N]``: edges on the tree path, 0 on the diagonal, saturating at 254;
  255 = unreachable (different trees, or padding);
- ``depth int32 [B, N]``: edges to the token's root, -1 for padding;
- ``segment int32 [B, N]``: which tree the token is in (trees numbered by their root's position), -1 for
  padding.

Three builders give the same result: the C++ extension (``syntaxkernels._C``, parallel over the batch,
GIL released), a CUDA one for tensors already on the GPU, and the pure-Python/NumPy fallback here.
Every builder rejects bad input with a ``ValueError`` naming the batch item and token.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _ext

HeadsLike = Union[torch.Tensor, np.ndarray, Sequence[Sequence[int]]]

__all__ = ["TreeBatch", "tree_distance", "build_tree_tensors", "normalize_heads", "python_tree_tensors"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def normalize_heads(heads: HeadsLike, lengths=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Check and convert heads and lengths to ``int64 [B, N]`` and ``int64 [B]`` on the heads' device.

    ``heads`` is an integer tensor/array ``[B, N]`` (padding entries are ignored) or a ragged list of
    lists (padded with -1; ``lengths`` defaults to the row lengths). Raises ``ValueError`` for a wrong
    rank or dtype, lengths of the wrong shape, negative lengths or lengths larger than N.
    """
    row_lengths = None
    if isinstance(heads, torch.Tensor):
        tensor = heads
    elif isinstance(heads, np.ndarray):
        if heads.dtype.kind not in "iu":
            raise ValueError(f"heads must be an integer array, got dtype {heads.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(heads))
    elif isinstance(heads, (list, tuple)):
        tensor, row_lengths = _pad_rows(heads)
    else:
        raise ValueError(f"heads must be a tensor [B, N] or a list of lists, got {type(heads).__name__}")

    if tensor.dtype not in _INT_DTYPES:
        raise ValueError(f"heads must have an integer dtype, got {tensor.dtype}")
    if tensor.dim() != 2:
        raise ValueError(f"heads must have shape [B, N], got {tuple(tensor.shape)} (rank {tensor.dim()})")
    tensor = tensor.to(torch.int64).contiguous()
    B, N = tensor.shape

    if lengths is None:
        if row_lengths is not None:
            lengths_t = torch.tensor(row_lengths, dtype=torch.int64)
        else:
            lengths_t = torch.full((B,), N, dtype=torch.int64)
    else:
        lengths_t = torch.as_tensor(lengths)
        if lengths_t.dtype == torch.bool or lengths_t.dtype not in _INT_DTYPES:
            raise ValueError(f"lengths must be an integer tensor [B], got dtype {lengths_t.dtype}")
        if lengths_t.dim() != 1 or lengths_t.shape[0] != B:
            raise ValueError(f"lengths must have shape [B] = [{B}], got {tuple(lengths_t.shape)}")
        lengths_t = lengths_t.to(torch.int64)
        lengths_cpu = lengths_t.cpu()
        too_long = lengths_cpu > N
        if row_lengths is not None:
            too_long |= lengths_cpu > torch.tensor(row_lengths, dtype=torch.int64)
        # The per-item loop below only runs to name the first bad item.
        for b in (range(B) if bool((lengths_cpu < 0).any() or too_long.any()) else ()):
            value = int(lengths_cpu[b])
            if value < 0:
                raise ValueError(f"batch item {b}: lengths[{b}] = {value} is negative")
            if value > N:
                raise ValueError(f"batch item {b}: lengths[{b}] = {value} is larger than N = {N}")
            if row_lengths is not None and value > row_lengths[b]:
                raise ValueError(
                    f"batch item {b}: lengths[{b}] = {value} is larger than the {row_lengths[b]} heads given"
                )
    return tensor.to(tensor.device), lengths_t.to(tensor.device)


def _pad_rows(rows_in) -> Tuple[torch.Tensor, List[int]]:
    """``int64 [B, N]`` (padded with -1) and the row lengths of a ragged list of integer sequences."""
    if all(type(r) is list for r in rows_in):
        rows = rows_in
    else:
        rows = []
        for b, r in enumerate(rows_in):
            if isinstance(r, torch.Tensor):
                rows.append(r.tolist())
            elif isinstance(r, (str, bytes)) or not hasattr(r, "__iter__"):
                raise ValueError(f"heads must be a tensor [B, N] or a list of lists; batch item {b} is {r!r}")
            else:
                rows.append(list(r))
    row_lengths = [len(r) for r in rows]
    flat = list(chain.from_iterable(rows))
    if not set(map(type, flat)) <= {int}:  # slow path: name the first non-integer, accept NumPy integers
        for b, row in enumerate(rows):
            for i, h in enumerate(row):
                if isinstance(h, bool) or not isinstance(h, (int, np.integer)):
                    raise ValueError(f"batch item {b}, token {i}: head {h!r} is not an integer")
    n = max(row_lengths, default=0)
    padded = np.full((len(rows), n), -1, dtype=np.int64)
    try:
        values = np.array(flat, dtype=np.int64)
    except OverflowError:
        for b, row in enumerate(rows):
            for i, h in enumerate(row):
                if not -(1 << 63) <= int(h) < (1 << 63):
                    raise ValueError(f"batch item {b}, token {i}: head {h!r} does not fit in int64") from None
        raise
    padded[np.arange(n)[None, :] < np.array(row_lengths, dtype=np.int64)[:, None]] = values
    return torch.from_numpy(padded), row_lengths


def _cycle_error(b: int, h: np.ndarray, unreached: np.ndarray) -> ValueError:
    """The error for tokens that never reach a root: names the smallest token on a cycle."""
    remaining = set(int(i) for i in np.nonzero(unreached)[0])
    # Peel tokens that no remaining token points to; what is left lies on cycles.
    indegree = {i: 0 for i in remaining}
    for i in remaining:
        if int(h[i]) in indegree:
            indegree[int(h[i])] += 1
    stack = [i for i, c in indegree.items() if c == 0]
    while stack:
        i = stack.pop()
        remaining.discard(i)
        p = int(h[i])
        if p in remaining:
            indegree[p] -= 1
            if indegree[p] == 0:
                stack.append(p)
    start = min(remaining)
    path = [start]
    node = int(h[start])
    while node != start:
        path.append(node)
        node = int(h[node])
    path.append(start)
    return ValueError(
        f"batch item {b}, token {start}: on a cycle ({' -> '.join(map(str, path))}) that never reaches a root"
    )


def _validate_sentence(b: int, h: np.ndarray) -> None:
    length = h.shape[0]
    bad = np.nonzero((h < -1) | (h >= length))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"batch item {b}, token {i}: head {int(h[i])} out of range "
            f"(length {length}; expected -1 for a root or 0..{length - 1})"
        )
    loops = np.nonzero(h == np.arange(length))[0]
    if loops.size:
        i = int(loops[0])
        raise ValueError(f"batch item {b}, token {i}: self-loop (its head is itself; use -1 for a root)")


def _sentence_tensors(b: int, h: np.ndarray):
    """distance [L, L] uint8, depth [L] int32, segment [L] int32 for one sentence (validated here)."""
    length = h.shape[0]
    _validate_sentence(b, h)
    big = 1 << 20
    dist = np.full((length, length), big, dtype=np.int32)
    depth = np.full(length, -1, dtype=np.int32)
    segment = np.full(length, -1, dtype=np.int32)
    roots = np.nonzero(h == -1)[0]
    segment[roots] = np.arange(roots.size, dtype=np.int32)
    depth[roots] = 0
    dist[roots, roots] = 0
    processed = roots
    level = roots
    level_depth = 0
    while level.size:
        children = np.nonzero(np.isin(h, level))[0]
        if children.size == 0:
            break
        level_depth += 1
        parents = h[children]
        depth[children] = level_depth
        segment[children] = segment[parents]
        # A new token's path to any earlier token runs through its parent.
        to_old = dist[np.ix_(parents, processed)] + 1
        dist[np.ix_(children, processed)] = to_old
        dist[np.ix_(processed, children)] = to_old.T
        # Tokens of the same level: through the parent of the row token.
        same = dist[np.ix_(parents, children)] + 1
        dist[np.ix_(children, children)] = same
        dist[children, children] = 0
        processed = np.concatenate([processed, children])
        level = children
    unreached = depth < 0
    if unreached.any():
        raise _cycle_error(b, h, unreached)
    out = np.where(dist >= big, 255, np.minimum(dist, 254)).astype(np.uint8)
    return out, depth, segment


def python_tree_tensors(heads: torch.Tensor, lengths: torch.Tensor):
    """The pure-Python/NumPy builder: ``(distance, depth, segment)`` on the CPU.

    O(n^2) per tree with O(1) work per pair: tokens are added level by level and each new token's row is
    its parent's row plus one. Expects the output of :func:`normalize_heads`.
    """
    heads_np = heads.cpu().numpy()
    lengths_np = lengths.cpu().numpy()
    B, N = heads_np.shape
    distance = np.full((B, N, N), 255, dtype=np.uint8)
    depth = np.full((B, N), -1, dtype=np.int32)
    segment = np.full((B, N), -1, dtype=np.int32)
    for b in range(B):
        length = int(lengths_np[b])
        if length == 0:
            continue
        d, dep, seg = _sentence_tensors(b, heads_np[b, :length])
        distance[b, :length, :length] = d
        depth[b, :length] = dep
        segment[b, :length] = seg
    return torch.from_numpy(distance), torch.from_numpy(depth), torch.from_numpy(segment)


def build_tree_tensors(heads: HeadsLike, lengths=None, *, backend: str = "auto", num_threads: int = 0):
    """``(heads, lengths, distance, depth, segment)`` for a batch, all on the heads' device.

    ``backend``: "auto" (CUDA builder for CUDA tensors, else the C++ extension, else Python), "cpp",
    "cuda" or "python". ``num_threads`` (C++ only): 0 = all available threads.
    Ragged lists of list/tuple rows go straight to the C++ extension (same checks and messages as
    :func:`normalize_heads`); other inputs, or no extension, take the Python path.
    """
    if type(heads) in (list, tuple) and backend in ("auto", "cpp"):
        built = _build_from_lists(heads, lengths, num_threads)
        if built is not None:
            return built
    heads_t, lengths_t = normalize_heads(heads, lengths)
    device = heads_t.device
    if backend not in ("auto", "cpp", "cuda", "python"):
        raise ValueError(f"backend must be 'auto', 'cpp', 'cuda' or 'python', got {backend!r}")
    if backend == "auto":
        if device.type == "cuda" and _ext.has_cuda_builder():
            backend = "cuda"
        elif _ext.available():
            backend = "cpp"
        else:
            backend = "python"
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError("backend='cuda' needs heads on a CUDA device")
        if not _ext.has_cuda_builder():
            raise RuntimeError("the CUDA tree builder is not built: " + _ext.status())
        distance, depth, segment = _ext.load().tree_distance_cuda(heads_t, lengths_t)
    elif backend == "cpp":
        if not _ext.available():
            raise RuntimeError("the C++ extension is not available: " + _ext.status())
        distance, depth, segment = _ext.load().tree_distance(heads_t.cpu(), lengths_t.cpu(), int(num_threads))
    else:
        distance, depth, segment = python_tree_tensors(heads_t, lengths_t)
    return heads_t, lengths_t, distance.to(device), depth.to(device), segment.to(device)


def _build_from_lists(rows, lengths, num_threads: int):
    """``build_tree_tensors`` for a ragged list in one extension call, or None where it does not apply.

    None when the extension (or its ``tree_distance_lists``) is missing, ``lengths`` cannot become a tensor,
    or a row is not a plain list/tuple (e.g. a 1-D tensor): the caller then takes the Python path, which
    raises the same errors as the extension for everything the extension does check.
    """
    module = _ext.load()
    if module is None or not hasattr(module, "tree_distance_lists"):
        return None
    if lengths is not None:
        try:
            lengths = torch.as_tensor(lengths)
        except Exception:  # the Python path reports heads errors first, then this one
            return None
    return module.tree_distance_lists(rows, lengths, int(num_threads))


def tree_distance(heads: HeadsLike, lengths=None, *, backend: str = "auto") -> torch.Tensor:
    """All-pairs tree distance ``uint8 [B, N, N]`` (0 diagonal, saturating at 254, 255 = unreachable).

    Args:
        heads: ``int [B, N]`` tensor of 0-based heads (-1 = root) or a ragged list of lists.
        lengths: ``int [B]`` valid lengths (default: N, or the list lengths).
        backend: "auto", "cpp", "cuda" or "python" (see :func:`build_tree_tensors`).

    Equivalent PyTorch: ``scipy.sparse.csgraph.shortest_path`` on the undirected head graph of each item,
    with infinities as 255 and values clipped at 254.
    """
    return build_tree_tensors(heads, lengths, backend=backend)[2]


@dataclass
class TreeBatch:
    """A batch of dependency trees with everything the attention ops need.

    Attributes:
        heads: ``int64 [B, N]`` 0-based heads, -1 for roots (padding entries as given).
        lengths: ``int64 [B]``.
        distance: ``uint8 [B, N, N]``.
        depth: ``int32 [B, N]`` (-1 for padding).
        segment: ``int32 [B, N]`` (-1 for padding).
    """

    heads: torch.Tensor
    lengths: torch.Tensor
    distance: torch.Tensor
    depth: torch.Tensor
    segment: torch.Tensor

    @classmethod
    def from_heads(cls, heads: HeadsLike, lengths=None, *, backend: str = "auto") -> "TreeBatch":
        """Validate ``heads`` and build the distance, depth and segment tensors (see :func:`tree_distance`)."""
        return cls(*build_tree_tensors(heads, lengths, backend=backend))

    @property
    def batch_size(self) -> int:
        return self.heads.shape[0]

    @property
    def max_len(self) -> int:
        return self.heads.shape[1]

    @property
    def device(self) -> torch.device:
        return self.distance.device

    def _map(self, fn) -> "TreeBatch":
        return TreeBatch(*(fn(t) for t in (self.heads, self.lengths, self.distance, self.depth, self.segment)))

    def to(self, *args, **kwargs) -> "TreeBatch":
        """Move every tensor (``TreeBatch.to('cuda', non_blocking=True)``); dtypes are kept."""
        return self._map(lambda t: t.to(*args, **kwargs))

    def pin_memory(self) -> "TreeBatch":
        """Page-locked copies, so DataLoader(pin_memory=True) and non_blocking transfers work."""
        return self._map(lambda t: t.pin_memory())

    def key_padding_mask(self) -> torch.Tensor:
        """``bool [B, N]``, True where the token is padding."""
        positions = torch.arange(self.max_len, device=self.lengths.device)
        return positions[None, :] >= self.lengths[:, None]

    def __len__(self) -> int:
        return self.batch_size

    def __repr__(self) -> str:
        return (f"TreeBatch(batch_size={self.batch_size}, max_len={self.max_len}, "
                f"lengths={self.lengths.tolist()}, device={self.device})")


def sentences_to_heads(sentences) -> List[List[int]]:
    """Ragged head lists of a list of objects with a ``heads`` attribute (e.g. ``trees.Sentence``)."""
    return [list(s.heads) for s in sentences]
