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

Edge lists (:class:`EdgeLists`, :func:`build_edge_lists`): for the relation masks of a ``MaskSpec``
(parent_d, child_d, sibling_d) or a tree window (``d(i, j) <= window``), the keys of every query row in CSR
form, int32, with the transposed lists a backward gathers from. Built by the C++ extension from the heads in
O(E) (no N x N matrix), with a PyTorch fallback from the distance, depth and segment tensors.
``TreeBatch.relation_lists(masks)`` and ``TreeBatch.window_lists(window)`` build them once per batch (derived
entries of the plan); ``.to()`` and ``.pin_memory()`` carry them.

Layout. A ``TreeBatch``'s distance is a ``[B, N, N]`` view of a ``[B, roundup(N, 16), roundup(N, 16)]`` buffer
(:func:`aligned_distance`), so that the fused kernels read distance tiles with vector loads whatever N is;
``.to()`` and ``.pin_memory()`` move the padded buffer.
A ``TreeBatch`` is the batch's structure plan (:class:`~syntaxkernels.plan.StructurePlan`): it knows its distance
is symmetric (the bias op's backward then reads it transposed without a copy), holds the kernels' int32 lengths,
and keeps what the ops derive from it (edge lists, tile lists) for every layer.

Leak-free distances (``leak_free=True`` on the builders, docs/semantics.md "Leak-free distances for causal
models"): row i is the forest induced on tokens ``0..i`` (255 for ``j > i`` and for paths through a later token),
so that no row depends on the heads of later tokens. Not symmetric (the plan says so); depth and segment stay the
whole tree's, and the edge lists, built from the whole tree, are refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _ext
from ..plan import StructurePlan, move_arguments as _move_arguments
from ..reference import _mask_pairs
from ..specs import MAX_PATH, RELATIONS, UNREACHABLE, MaskSpec

HeadsLike = Union[torch.Tensor, np.ndarray, Sequence[Sequence[int]]]

__all__ = ["TreeBatch", "tree_distance", "build_tree_tensors", "normalize_heads", "python_tree_tensors", "EdgeLists",
           "build_edge_lists", "python_edge_lists", "EdgeSchedule", "build_edge_schedule", "EDGE_CHUNK", "aligned_distance",
           "padded_buffer", "is_tree_distance"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


#: Byte alignment of a distance's start and its batch and row strides (what 16-byte vector loads need).
DISTANCE_ALIGNMENT = 16


def _round_up(n: int) -> int:
    return -(-n // DISTANCE_ALIGNMENT) * DISTANCE_ALIGNMENT


def _aligned(distance: torch.Tensor) -> bool:
    B, N, M = distance.shape
    stride_b, stride_i, stride_j = distance.stride()
    if stride_j != 1 or stride_i % DISTANCE_ALIGNMENT or stride_b % DISTANCE_ALIGNMENT:
        return False
    if torch.compiler.is_compiling():  # storage offsets cannot be traced: a bare tensor is copied (a plan made
        return False  # outside the compiled region, such as a TreeBatch, never comes here)
    if distance.storage_offset() % DISTANCE_ALIGNMENT or stride_i < _round_up(M) or stride_b < _round_up(N) * stride_i:
        return False
    return distance.untyped_storage().nbytes() >= distance.storage_offset() + B * stride_b


def aligned_distance(distance: torch.Tensor) -> torch.Tensor:
    """``distance`` (uint8 ``[B, N, M]``) laid out for the fused kernels: start, batch and row strides multiples
    of 16 bytes, and room for ``roundup(N, 16)`` rows of ``roundup(M, 16)`` bytes per item.

    Itself when it already is (a contiguous distance with N a multiple of 16, or a :class:`TreeBatch`'s); else
    a copy: a ``[B, N, M]`` view of a ``[B, roundup(N, 16), roundup(M, 16)]`` buffer on the same device, whose
    padding bytes are 255 (unreachable). Aligned rows give the kernels vector loads and asynchronous copies of
    the distance tiles, and the padded extent lets them bound their reads by a multiple of 16 (at N not a
    multiple of 16 they would otherwise load single bytes and spill).
    """
    if _aligned(distance):
        return distance
    B, N, M = distance.shape
    padded = torch.full((B, _round_up(N), _round_up(M)), UNREACHABLE, dtype=distance.dtype, device=distance.device)
    view = padded[:, :N, :M]
    view.copy_(distance)
    return view


def padded_buffer(distance: torch.Tensor) -> Optional[torch.Tensor]:
    """The ``[B, rows, width]`` buffer behind an :func:`aligned_distance` view (rows and width the padded extents),
    or None when ``distance`` is not such a view of a buffer of its own."""
    B, N, M = distance.shape
    if not _aligned(distance) or distance.storage_offset() != 0:
        return None
    stride_b, width = distance.stride(0), distance.stride(1)
    rows = stride_b // width
    if rows * width != stride_b or distance.untyped_storage().nbytes() < B * stride_b:
        return None
    return distance.as_strided((B, rows, width), (stride_b, width, 1))


def _map_distance(fn, distance: torch.Tensor) -> torch.Tensor:
    """``fn`` (``.to()``, ``.pin_memory()``) applied to the padded buffer behind an :func:`aligned_distance` view,
    so the result keeps its layout (``fn`` on the view itself would return a contiguous, unaligned copy)."""
    B, N, M = distance.shape
    if distance.is_contiguous():
        return fn(distance)
    buffer = padded_buffer(distance)
    if buffer is None:
        return fn(distance)
    return fn(buffer)[:, :N, :M]


#: The attribute that marks a tensor object as a tree distance the package built (a ``TreeBatch``'s, or
#: :func:`tree_distance`'s result): symmetric, 0 on its tokens' diagonal and 255 on padding. It lives on the tensor
#: object (a view or a copy of it is not marked), not in any cache.
TREE_DISTANCE_MARK = "_syntaxkernels_tree_distance"


def _mark_tree_distance(distance: torch.Tensor) -> torch.Tensor:
    setattr(distance, TREE_DISTANCE_MARK, True)
    return distance


def is_tree_distance(distance) -> bool:
    """Whether ``distance`` (this tensor object) is a tree distance the package built: a ``TreeBatch``'s, or
    :func:`tree_distance`'s result (symmetric, its padding marked 255 on the diagonal)."""
    return getattr(distance, TREE_DISTANCE_MARK, False) is True


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
    out = np.where(dist >= big, UNREACHABLE, np.minimum(dist, MAX_PATH)).astype(np.uint8)
    return out, depth, segment


def _path_max(h: np.ndarray) -> np.ndarray:
    """int64 ``[L, L]``: the largest token on the tree path between i and j (i and j included) for tokens of one
    tree (other pairs: unspecified), built level by level like :func:`_sentence_tensors` (a new token's path to an
    earlier one runs through its parent). Expects a validated forest."""
    length = h.shape[0]
    tokens = np.arange(length, dtype=np.int64)
    largest = np.full((length, length), -1, dtype=np.int64)
    largest[tokens, tokens] = tokens
    roots = np.nonzero(h == -1)[0]
    processed = roots
    level = roots
    while level.size:
        children = np.nonzero(np.isin(h, level))[0]
        if children.size == 0:
            break
        parents = h[children]
        to_old = np.maximum(largest[np.ix_(parents, processed)], children[:, None])
        largest[np.ix_(children, processed)] = to_old
        largest[np.ix_(processed, children)] = to_old.T
        largest[np.ix_(children, children)] = np.maximum(largest[np.ix_(parents, children)], children[:, None])
        largest[children, children] = children
        processed = np.concatenate([processed, children])
        level = children
    return largest


def _leak_free_sentence_tensors(b: int, h: np.ndarray):
    """:func:`_sentence_tensors` with the leak-free distance: the tree path between i and j (j <= i) when no token
    on it is later than i, else 255 (and 255 above the diagonal). depth and segment are the whole tree's."""
    distance, depth, segment = _sentence_tensors(b, h)
    rows = np.arange(h.shape[0], dtype=np.int64)[:, None]
    keep = _path_max(h) <= rows
    return np.where(keep, distance, np.uint8(UNREACHABLE)).astype(np.uint8), depth, segment


def python_tree_tensors(heads: torch.Tensor, lengths: torch.Tensor, leak_free: bool = False):
    """The pure-Python/NumPy builder: ``(distance, depth, segment)`` on the CPU.

    O(n^2) per tree with O(1) work per pair: tokens are added level by level and each new token's row is
    its parent's row plus one. Expects the output of :func:`normalize_heads`. ``leak_free``: the leak-free
    distance (module docstring), from the same rows and each pair's largest token on its path.
    """
    sentence = _leak_free_sentence_tensors if leak_free else _sentence_tensors
    heads_np = heads.cpu().numpy()
    lengths_np = lengths.cpu().numpy()
    B, N = heads_np.shape
    distance = np.full((B, N, N), UNREACHABLE, dtype=np.uint8)
    depth = np.full((B, N), -1, dtype=np.int32)
    segment = np.full((B, N), -1, dtype=np.int32)
    for b in range(B):
        length = int(lengths_np[b])
        if length == 0:
            continue
        d, dep, seg = sentence(b, heads_np[b, :length])
        distance[b, :length, :length] = d
        depth[b, :length] = dep
        segment[b, :length] = seg
    return torch.from_numpy(distance), torch.from_numpy(depth), torch.from_numpy(segment)


def build_tree_tensors(heads: HeadsLike, lengths=None, *, backend: str = "auto", num_threads: int = 0,
                       leak_free: bool = False):
    """``(heads, lengths, distance, depth, segment)`` for a batch, all on the heads' device.

    ``backend``: "auto" (CUDA builder for CUDA tensors, else the C++ extension, else Python), "cpp",
    "cuda" or "python". ``num_threads`` (C++ only): 0 = all available threads.
    Ragged lists of list/tuple rows go straight to the C++ extension (same checks and messages as
    :func:`normalize_heads`); other inputs, or no extension, take the Python path.
    ``leak_free``: the leak-free distance for causal models (module docstring), by the C++ extension (CUDA heads
    are built on the CPU and copied back; ``backend="cuda"`` raises ValueError), else the Python builder.
    """
    if leak_free:
        return _build_leak_free(heads, lengths, backend, num_threads)
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


def _build_leak_free(heads: HeadsLike, lengths, backend: str, num_threads: int):
    """:func:`build_tree_tensors` with ``leak_free=True``."""
    heads_t, lengths_t = normalize_heads(heads, lengths)
    device = heads_t.device
    if backend not in ("auto", "cpp", "cuda", "python"):
        raise ValueError(f"backend must be 'auto', 'cpp', 'cuda' or 'python', got {backend!r}")
    if backend == "cuda":
        raise ValueError("leak_free=True has no CUDA builder: use backend='auto' (built on the CPU, copied to the "
                         "heads' device) or 'cpp'")
    module = _ext.load()
    has_cpp = module is not None and hasattr(module, "leak_free_tree_distance")
    if backend == "cpp" and not has_cpp:
        raise RuntimeError("the C++ extension (with leak_free_tree_distance) is not available: " + _ext.status())
    if backend != "python" and has_cpp:
        distance, depth, segment = module.leak_free_tree_distance(heads_t.cpu(), lengths_t.cpu(), int(num_threads))
    else:
        distance, depth, segment = python_tree_tensors(heads_t, lengths_t, leak_free=True)
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


_ITEM = re.compile(r"^batch item (\d+), token \d+: ")

ROOTLESS_HINT = ("; batch item {b} has no root (no head is -1): CoNLL-U heads (1-based, 0 = root) convert with "
                 "sk.trees.from_conllu_heads, 'a root is its own head' with sk.trees.from_self_root")


def _rootless_hint(error: ValueError, heads, lengths) -> ValueError:
    """``error`` with a pointer to the head converters when the batch item it names has no root (-1): heads in
    another convention (CoNLL-U's 1-based heads, 0 for the root) then show up as a self-loop, a head out of range
    or a cycle. Runs only after a builder has raised, so valid batches never pay for it."""
    match = _ITEM.match(str(error))
    if match is None:
        return error
    b = int(match.group(1))
    try:
        row = heads[b]
        row = row.tolist() if hasattr(row, "tolist") else list(row)
        if lengths is not None:
            row = row[: int(lengths[b])]
        rootless = bool(row) and all(int(h) >= 0 for h in row)
    except Exception:  # noqa: BLE001 - the hint is optional; the builder's error stands as it is
        return error
    if not rootless:
        return error
    return ValueError(str(error) + ROOTLESS_HINT.format(b=b))


def tree_distance(heads: HeadsLike, lengths=None, *, backend: str = "auto", leak_free: bool = False) -> torch.Tensor:
    """All-pairs tree distance ``uint8 [B, N, N]`` (0 diagonal, saturating at 254, 255 = unreachable).

    Args:
        heads: ``int [B, N]`` tensor of 0-based heads (-1 = root) or a ragged list of lists.
        lengths: ``int [B]`` valid lengths (default: N, or the list lengths).
        backend: "auto", "cpp", "cuda" or "python" (see :func:`build_tree_tensors`).
        leak_free: the leak-free distance for causal models instead (module docstring; not symmetric, so not
            marked as a tree distance: pass ``symmetric=False`` or nothing to the ops).
    Returns:
        ``uint8 [B, N, N]`` on the heads' device; rows and columns of padding tokens are 255 (their diagonal
        too). Raises ``ValueError`` for bad heads or lengths, naming the batch item and token.

    The same result as ``scipy.sparse.csgraph.shortest_path(directed=False, unweighted=True)`` on the head
    graph of each item (edges child -- head), with infinities written as 255 and values clipped at 254
    (the tests compare the two).
    """
    try:
        distance = build_tree_tensors(heads, lengths, backend=backend, leak_free=leak_free)[2]
    except ValueError as error:
        raise _rootless_hint(error, heads, lengths) from None
    return distance if leak_free else _mark_tree_distance(distance)


#: Edges per work item of the GPU edge kernels (:class:`EdgeSchedule`): longer rows are split into chunks.
EDGE_CHUNK = 32


def _live_tiles_torch(host: "EdgeLists", tile: int) -> int:
    """:meth:`EdgeLists.tile_count` in PyTorch (without the C++ extension)."""
    B, R, N = host.nonempty.shape
    nt = -(-N // tile)
    # Per query block (b, i // tile), the edges it holds are one contiguous span of the CSR.
    bounds = torch.arange(0, B * nt + 1, dtype=torch.int64)
    token_ends = torch.clamp((bounds % nt) * tile, max=N) + (bounds // nt) * N
    token_ends[-1] = B * N
    span = host.row_ptr.long()[token_ends * R]
    block = torch.repeat_interleave(torch.arange(B * nt, dtype=torch.int64), span[1:] - span[:-1])
    ids = block * nt + host.col.long() // tile
    return int((torch.bincount(ids, minlength=B * nt * nt) > 0).sum())


@dataclass
class EdgeLists:
    """Per-row key lists of ``R`` relations over ``B`` sequences of ``N`` tokens (CSR, int32, one device).

    Rows are ``(b, i, r)`` (query token i of sequence b, relation r), row id ``(b * N + i) * R + r``; the keys
    (token indices within the sequence) of a row are ``col[row_ptr[row]:row_ptr[row + 1]]``, increasing. As
    the R rows of one query are consecutive, ``col[row_ptr[(b*N + i)*R]:row_ptr[(b*N + i + 1)*R]]`` are all
    its edges, each with its relation in ``rel``. The transposed lists hold, per key row ``(b, j, r)``, the
    queries i whose row r lists j (``t_col``, increasing, with ``t_rel``): a backward gathers dk and dv
    through them without atomics. Padding rows are empty. Memory is O(E + B N R).

    Attributes:
        row_ptr, t_ptr: int32 ``[B * N * R + 1]``.
        col, rel, t_col, t_rel: int32 ``[E]``.
        nonempty: bool ``[B, R, N]``: row (b, i, r) has at least one key.
        names: the relation names, in order (``MaskSpec.relation_names``, or ``window_<w>``).
    """

    row_ptr: torch.Tensor
    col: torch.Tensor
    rel: torch.Tensor
    t_ptr: torch.Tensor
    t_col: torch.Tensor
    t_rel: torch.Tensor
    nonempty: torch.Tensor
    names: Tuple[str, ...]
    _schedules: Dict[int, "EdgeSchedule"] = field(default_factory=dict, repr=False, compare=False)
    #: Live 64 x 64 tiles of the pairs (host int, counted on the CPU; None until :meth:`tile_count`).
    live_tiles: Optional[int] = field(default=None, repr=False, compare=False)

    def tile_count(self, tile: int = 64) -> int:
        """Tiles of ``tile x tile`` (query block, key block) of the ``B`` sequences that hold at least one listed
        pair (any relation): what a block-sparse dense kernel walks. Counted once on the CPU (``tile = 64``
        cached in :attr:`live_tiles`; lists on a GPU are copied back for it)."""
        if tile == 64 and self.live_tiles is not None:
            return self.live_tiles
        host = self if self.device.type == "cpu" else self.to("cpu")
        B, R, N = host.nonempty.shape
        module = _ext.load()
        if host.num_edges == 0:
            found = 0
        elif module is not None and hasattr(module, "live_tiles"):
            found = int(module.live_tiles(host.row_ptr.contiguous(), host.col.contiguous(), B, N, R, tile))
        else:
            found = _live_tiles_torch(host, tile)
        if tile == 64:
            self.live_tiles = found
        return found

    @property
    def batch_size(self) -> int:
        return self.nonempty.shape[0]

    @property
    def num_relations(self) -> int:
        return self.nonempty.shape[1]

    @property
    def max_len(self) -> int:
        return self.nonempty.shape[2]

    @property
    def num_edges(self) -> int:
        """E (host-side metadata: no device synchronisation)."""
        return self.col.shape[0]

    @property
    def device(self) -> torch.device:
        return self.col.device

    def _map(self, fn) -> "EdgeLists":
        tensors = (self.row_ptr, self.col, self.rel, self.t_ptr, self.t_col, self.t_rel, self.nonempty)
        mapped = EdgeLists(*(fn(t) for t in tensors), names=self.names)
        mapped._schedules = {key: schedule._map(fn) for key, schedule in self._schedules.items()}
        mapped.live_tiles = self.live_tiles
        return mapped

    def schedule(self, chunk: int = EDGE_CHUNK) -> "EdgeSchedule":
        """The balanced work lists of the GPU kernels (:class:`EdgeSchedule`), built once per chunk size and
        cached. Built on the CPU; lists on a GPU without a cached schedule are copied back for it (one
        synchronisation: :meth:`to` builds the default schedule before moving CPU lists to a GPU, so lists
        from ``TreeCollator`` or ``TreeBatch.to`` never pay it)."""
        if chunk not in self._schedules:
            host = self if self.device.type == "cpu" else self.to("cpu")
            built = build_edge_schedule(host.row_ptr, host.t_ptr, self.batch_size, self.max_len,
                                        self.num_relations, chunk)
            self._schedules[chunk] = built if self.device.type == "cpu" else built._map(
                lambda t: t.to(self.device, non_blocking=True))
        return self._schedules[chunk]

    def cached_schedule(self, chunk: int = EDGE_CHUNK) -> Optional["EdgeSchedule"]:
        return self._schedules.get(chunk)

    def to(self, *args, **kwargs) -> "EdgeLists":
        """Move every tensor to a device (``lists.to('cuda', non_blocking=True)``); a dtype argument is
        ignored: the lists stay int32 (and bool)."""
        device, non_blocking = _move_arguments(args, kwargs)
        if device is None:
            return self
        if torch.device(device).type != "cpu" and self.device.type == "cpu":
            self.schedule()  # on the host, before the move: a GPU call then reads nothing back
            if self.num_relations == 1 and self.names[0].startswith("window"):
                self.tile_count()  # the window's path model (ops.edge_attention.window_takes_edges)
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "EdgeLists":
        return self._map(lambda t: t.pin_memory())

    def to_dense(self) -> torch.Tensor:
        """bool ``[B, R, N, N]``: ``[b, r, i, j]`` is True when row (b, i, r) lists key j. For tests and small
        inputs only (it is the matrix the lists avoid)."""
        B, R, N = self.nonempty.shape
        dense = torch.zeros(B * N * R * N, dtype=torch.bool, device=self.device)
        rows = torch.repeat_interleave(torch.arange(B * N * R, device=self.device),
                                       (self.row_ptr[1:] - self.row_ptr[:-1]).long())
        dense[rows * N + self.col.long()] = True
        return dense.view(B, N, R, N).permute(0, 2, 1, 3)

    def __repr__(self) -> str:
        return (f"EdgeLists(batch_size={self.batch_size}, max_len={self.max_len}, relations={list(self.names)}, "
                f"edges={self.num_edges}, device={self.device})")


@dataclass
class EdgeSchedule:
    """Balanced work lists for the GPU edge kernels over an :class:`EdgeLists` (int32, on the lists' device).

    A *work item* is up to ``chunk`` consecutive edges: in the forward, of one row ``(b, i, r)``; in dQ, of one
    query token over every relation (``row_ptr``); in dK/dV, of one key token's transposed edges (``t_ptr``).
    Longer rows and tokens (a ``[CLS]`` root's sibling lists, long windows) are split into chunks of exactly
    ``chunk`` edges and a shorter last one. Each side's items are ordered by edge count, longest first (stable:
    ties keep row order), so the ``BLOCK_E`` items a program walks in lockstep have nearly equal lengths and
    the edge slots a kernel walks stay close to the real edges.

    Attributes:
        f_items: ``[6, I_f]``: the forward items of whole rows: per item its row's b, i and r, first edge, edge
            count and partial slot (-1: whole rows are written directly).
        p_items: ``[6, I_p]``: the forward items of split rows (the same rows; slot >= 0: written to a partial
            buffer), launched apart so the common kernel carries no partial store; likewise ``qp_items`` and
            ``kp_items`` (``[5, .]``): the dQ and dK/dV items of split tokens, apart from ``q_items`` and
            ``k_items`` (whole tokens, slot -1).
        merge_rows, merge_ptr: the split rows and, per row, its partial slots ``merge_ptr[k] .. merge_ptr[k + 1]``
            (in edge order): the forward merges them by log-sum-exp.
        q_items: ``[5, I_q]``: per dQ item its token's b and i, first edge, count and dq partial slot (-1: the
            token is not split).
        dq_tokens, dq_ptr: the split query tokens and their dq partial slots (summed in order).
        k_items: ``[5, I_k]``: the key token's b and i, first transposed edge, count, dk/dv partial slot.
        dk_tokens, dk_ptr: the split key tokens and their partial slots.
        pieces, dq_slots, dk_slots: host ints, the partial buffers' lengths; chunk: the chunk size.
    """

    f_items: torch.Tensor
    merge_rows: torch.Tensor
    merge_ptr: torch.Tensor
    q_items: torch.Tensor
    dq_tokens: torch.Tensor
    dq_ptr: torch.Tensor
    k_items: torch.Tensor
    dk_tokens: torch.Tensor
    dk_ptr: torch.Tensor
    p_items: torch.Tensor
    qp_items: torch.Tensor
    kp_items: torch.Tensor
    pieces: int
    dq_slots: int
    dk_slots: int
    chunk: int

    def tensors(self) -> List[torch.Tensor]:
        return [self.f_items, self.merge_rows, self.merge_ptr, self.q_items, self.dq_tokens, self.dq_ptr,
                self.k_items, self.dk_tokens, self.dk_ptr, self.p_items, self.qp_items, self.kp_items]

    def sizes(self) -> List[int]:
        return [self.pieces, self.dq_slots, self.dk_slots]

    def _map(self, fn) -> "EdgeSchedule":
        return EdgeSchedule(*(fn(t) for t in self.tensors()), self.pieces, self.dq_slots, self.dk_slots,
                            self.chunk)


def _chunked_items(ptr: torch.Tensor, chunk: int):
    """Items of up to ``chunk`` edges per unit (a row or a token) from per-unit edge offsets ``ptr`` (int64
    ``[U + 1]``), sorted longest first: ``(items int32 [4, I], split_units, split_ptr, slots)``. ``items``
    rows: unit, first edge, count, slot (the items of units with more than one item are numbered
    consecutively per unit, in edge order; -1 otherwise)."""
    degree = ptr[1:] - ptr[:-1]
    pieces = (degree + chunk - 1) // chunk
    units = torch.arange(degree.numel(), dtype=torch.int64)
    unit = torch.repeat_interleave(units, pieces)
    item_start = torch.cumsum(pieces, 0) - pieces
    within = torch.arange(unit.numel(), dtype=torch.int64) - torch.repeat_interleave(item_start, pieces)
    first = ptr[:-1][unit] + within * chunk
    count = torch.minimum(degree[unit] - within * chunk, torch.full_like(first, chunk))
    split = pieces[unit] > 1
    slot = torch.where(split, torch.cumsum(split.long(), 0) - 1, torch.full_like(unit, -1))
    split_units = units[pieces > 1]
    split_ptr = torch.zeros(split_units.numel() + 1, dtype=torch.int64)
    split_ptr[1:] = torch.cumsum(pieces[pieces > 1], 0)
    order = torch.argsort(-count, stable=True)
    items = torch.stack([unit, first, count, slot])[:, order]
    return items, split_units.to(torch.int32), split_ptr.to(torch.int32), int(split.sum())


def _with_coordinates(items: torch.Tensor, N: int, R: int) -> torch.Tensor:
    """``[4, I]`` items of rows (``R > 0``: unit ``(b * N + i) * R + r``) or tokens (``R == 0``: ``b * N + i``) as the
    kernels read them, int32: ``[b, i, (r,) first, count, slot]`` (no integer division in a kernel)."""
    unit = items[0]
    token = unit // R if R else unit
    coordinates = [token // N, token % N] + ([unit % R] if R else [])
    return torch.stack(coordinates + [items[1], items[2], items[3]]).to(torch.int32).contiguous()


def _split_pieces(f_items: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(f_items, p_items)``: a forward item table's whole-row items and split-row items, each in its order."""
    split = f_items[-1] >= 0
    return f_items[:, ~split].contiguous(), f_items[:, split].contiguous()


def _split_schedule(f_items, merge_rows, merge_ptr, q_items, dq_tokens, dq_ptr, k_items, dk_tokens, dk_ptr, pieces,
                    dq_slots, dk_slots, chunk) -> "EdgeSchedule":
    """The :class:`EdgeSchedule` with each side's items of split units apart from the whole ones."""
    f_whole, f_split = _split_pieces(f_items)
    q_whole, q_split = _split_pieces(q_items)
    k_whole, k_split = _split_pieces(k_items)
    return EdgeSchedule(f_whole, merge_rows, merge_ptr, q_whole, dq_tokens, dq_ptr, k_whole, dk_tokens, dk_ptr,
                        f_split, q_split, k_split, int(pieces), int(dq_slots), int(dk_slots), chunk)


def build_edge_schedule(row_ptr: torch.Tensor, t_ptr: torch.Tensor, B: int, N: int, R: int,
                        chunk: int = EDGE_CHUNK) -> EdgeSchedule:
    """The :class:`EdgeSchedule` of CPU lists (``row_ptr``, ``t_ptr``: int32 ``[B * N * R + 1]``), in
    O(E / chunk + B N R) vectorised PyTorch on the CPU."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    module = _ext.load()
    if module is not None and hasattr(module, "edge_schedule"):  # the C++ builder: O(E / chunk + B N R)
        *tensors, pieces, dq_slots, dk_slots = module.edge_schedule(
            row_ptr.to(torch.int32).contiguous(), t_ptr.to(torch.int32).contiguous(), B, N, R, chunk)
        return _split_schedule(*tensors, pieces, dq_slots, dk_slots, chunk)
    row_ptr, t_ptr = row_ptr.to(torch.int64), t_ptr.to(torch.int64)
    f_items, merge_rows, merge_ptr, pieces = _chunked_items(row_ptr, chunk)
    # Every relation of a token is consecutive: per-token offsets are every R-th row offset.
    q_items, dq_tokens, dq_ptr, dq_slots = _chunked_items(row_ptr[::R] if R > 1 else row_ptr, chunk)
    k_items, dk_tokens, dk_ptr, dk_slots = _chunked_items(t_ptr[::R] if R > 1 else t_ptr, chunk)
    return _split_schedule(_with_coordinates(f_items, N, R), merge_rows, merge_ptr, _with_coordinates(q_items, N, 0),
                           dq_tokens, dq_ptr, _with_coordinates(k_items, N, 0), dk_tokens, dk_ptr, pieces, dq_slots,
                           dk_slots, chunk)


def _relation_arguments(masks: MaskSpec) -> dict:
    """The :func:`build_edge_lists` keywords of the relation masks of ``masks``."""
    return dict(max_distance=masks.max_distance, **{kind: kind in masks.relation_kinds for kind, _ in RELATIONS})


def _list_spec(max_distance: int, relations: Dict[str, bool], window: Optional[int]) -> Optional[MaskSpec]:
    """Checks the list builders' arguments; returns their relation masks as a :class:`MaskSpec` (no dense masks:
    it gives the lists' names, order and R), or None for a window.

    ``relations`` holds the builders' relation keywords: one per kind of :data:`~syntaxkernels.specs.RELATIONS`,
    each True unless given, so a new kind needs no new keyword here.
    """
    kinds = [kind for kind, _ in RELATIONS]
    unknown = sorted(set(relations) - set(kinds))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} (the relation kinds are {', '.join(kinds)})")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_PATH:
            raise ValueError(f"window must be an int in 0..{MAX_PATH}, got {window!r}")
        return None
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or not 1 <= max_distance <= 64:
        raise ValueError(f"max_distance must be an int in 1..64, got {max_distance!r}")
    flags = {kind: relations.get(kind, True) for kind in kinds}
    if not any(flags.values()):
        raise ValueError(f"no relation enabled: at least one of {', '.join(kinds)} must be True")
    return MaskSpec(max_distance, **flags, pairwise=False, full=False)


def _finish_lists(row_ptr, col, rel, t_ptr, t_col, t_rel, B: int, N: int, names) -> EdgeLists:
    nonempty = (row_ptr[1:] > row_ptr[:-1]).view(B, N, len(names)).permute(0, 2, 1).contiguous()
    return EdgeLists(row_ptr, col, rel, t_ptr, t_col, t_rel, nonempty, tuple(names))


def python_edge_lists(distance: torch.Tensor, depth: torch.Tensor, segment: torch.Tensor, *, max_distance: int = 3,
                      window: Optional[int] = None, lengths: Optional[torch.Tensor] = None,
                      **relations: bool) -> EdgeLists:
    """The edge lists from the distance, depth and segment tensors with PyTorch ops (any device).

    The fallback of :func:`build_edge_lists` (no C++ extension) and the way to get window lists from a bare
    distance tensor: relation r of pair (i, j) follows docs/semantics.md (i is an ancestor of j iff same
    segment and ``depth[j] - depth[i] == d(i, j)``); a window keeps ``d(i, j) <= window``. One ``[B, N, N]``
    boolean mask exists at a time (the size of the distance tensor itself). ``lengths`` (int ``[B]``, windows
    only) additionally drops tokens at ``>= lengths[b]``. On CUDA it synchronises (``nonzero``). The relation
    keywords are those of :func:`build_edge_lists`.
    """
    spec = _list_spec(max_distance, relations, window)
    B, N, _ = distance.shape
    device = distance.device
    valid = segment.to(torch.int32) >= 0
    if lengths is not None:
        valid = valid & (torch.arange(N, device=device)[None, :] < lengths.to(device)[:, None])
    if window is not None:
        names = (f"window_{window}",)
        dist = distance.to(torch.int32)
        masks = [lambda: valid[:, :, None] & valid[:, None, :] & (dist <= window)]
    else:
        names = spec.relation_names
        pairs = _mask_pairs(distance, depth, segment, valid)
        masks = [lambda kind=kind, d=d: pairs(kind, d) for kind, d in spec.kinds()]
    R = len(masks)
    keys, tkeys = [], []
    for r, make in enumerate(masks):
        b, i, j = make().nonzero(as_tuple=True)
        keys.append((((b * N + i) * R + r) * N + j))
        tkeys.append((((b * N + j) * R + r) * N + i))
    index = torch.int64
    key = torch.cat(keys) if keys else torch.zeros(0, dtype=index, device=device)
    tkey = torch.cat(tkeys) if tkeys else torch.zeros(0, dtype=index, device=device)
    key, _ = torch.sort(key)
    tkey, _ = torch.sort(tkey)
    rows = B * N * R

    def csr(sorted_keys):
        row = sorted_keys // N
        ptr = torch.zeros(rows + 1, dtype=torch.int64, device=device)
        ptr[1:] = torch.cumsum(torch.bincount(row, minlength=rows), 0)
        return (ptr.to(torch.int32), (sorted_keys % N).to(torch.int32), (row % R).to(torch.int32))

    row_ptr, col, rel = csr(key)
    t_ptr, t_col, t_rel = csr(tkey)
    return _finish_lists(row_ptr, col, rel, t_ptr, t_col, t_rel, B, N, names)


def _prepared(lists: EdgeLists) -> EdgeLists:
    """CPU lists with what a GPU call needs from the host built now (in the data pipeline's workers when
    ``TreeCollator`` builds the lists): the balanced schedule and, for window lists, the live-tile count."""
    lists.schedule()
    if lists.num_relations == 1 and lists.names[0].startswith("window"):
        lists.tile_count()
    return lists


def build_edge_lists(heads: torch.Tensor, lengths: torch.Tensor, *, max_distance: int = 3,
                     window: Optional[int] = None, num_threads: int = 0, **relations: bool) -> EdgeLists:
    """The relation lists (``window=None``) or window lists of a batch, by the C++ builder, on the heads' device.

    Args:
        heads: int ``[B, N]`` 0-based heads (-1 = root); lengths: int ``[B]``.
        max_distance, **relations: the relation masks (as in :class:`MaskSpec`): one keyword per kind of
            :data:`~syntaxkernels.specs.RELATIONS` (``parent``, ``child``, ``sibling``), each True unless set
            False; R = ``MaskSpec.num_relations``, in ``MaskSpec.names`` order (parent_1..D, child_1..D,
            sibling_2..D+1). Another keyword raises TypeError.
        window: instead, one relation: every key within ``window`` edges (0..254; the token itself included).
        num_threads: C++ threads (0 = torch's intra-op thread count).
    Returns:
        :class:`EdgeLists` on the heads' device, with their GPU schedule (:meth:`EdgeLists.schedule`) and, for a
        window, live-tile count already built on the CPU. Tensors on a GPU are copied to the CPU for the build
        (one synchronisation: build the lists in the data pipeline, e.g. ``TreeCollator(masks=...)``, to avoid it).

    Raises ValueError for bad heads or lengths (the tree builder's messages) or a bad spec. Without the C++
    extension, builds the tree tensors and uses :func:`python_edge_lists`.
    """
    spec = _list_spec(max_distance, relations, window)
    device = heads.device
    module = _ext.load()
    if module is None or not hasattr(module, "edge_lists"):
        batch = TreeBatch.from_heads(heads, lengths)
        return _prepared(python_edge_lists(batch.distance, batch.depth, batch.segment, max_distance=max_distance,
                                           window=window, **relations)).to(device)
    heads_cpu = heads.to("cpu", torch.int64).contiguous()
    lengths_cpu = lengths.to("cpu", torch.int64).contiguous()
    B, N = heads_cpu.shape
    if spec is not None:
        kinds, names = spec.relation_kinds, spec.relation_names
    else:
        kinds, names = (), (f"window_{window}",)
    lists = module.edge_lists(heads_cpu, lengths_cpu, max_distance, list(kinds), -1 if window is None else window,
                              int(num_threads))
    built = _prepared(_finish_lists(*lists, B, N, names))
    return built if device.type == "cpu" else built.to(device, non_blocking=True)


def _refuse_lists(trees, what: str) -> None:
    """ValueError for the edge lists of a leak-free batch: they are built from the whole tree."""
    if getattr(trees, "leak_free", False):
        raise ValueError(f"{what}: a leak-free batch (leak_free=True) has no edge lists (they come from the whole "
                         "tree, which would leak later tokens' heads into earlier rows); build the batch without "
                         "leak_free for the relation masks and tree windows")


def item_index(index, count: int, device) -> torch.Tensor:
    """``index`` (a list or tensor of item numbers, repeats allowed) as int64 ``[B']`` on ``device``, checked for a
    batch of ``count`` items: ``TypeError`` for non-integer numbers, ``ValueError`` for an index that is not 1-D or
    (read on the host, when it is there) out of range. The ``index_select`` of the batch plans."""
    index = torch.as_tensor(index)
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"index_select takes integer item numbers, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"index_select takes a 1-D index of item numbers, got shape {tuple(index.shape)}")
    if index.device.type == "cpu" and index.numel() and (int(index.min()) < 0 or int(index.max()) >= count):
        raise ValueError(f"index_select: item numbers must be in 0..{count - 1}, got "
                         f"{int(index.min())}..{int(index.max())}")
    return index.to(device, torch.int64)


@dataclass(eq=False)
class TreeBatch(StructurePlan):
    """A batch of dependency trees with everything the attention ops need: the batch's structure plan
    (:class:`~syntaxkernels.plan.StructurePlan`), passed as it is to every layer.

    Attributes:
        heads: ``int64 [B, N]`` 0-based heads, -1 for roots (padding entries as given).
        lengths: ``int64 [B]``.
        distance: ``uint8 [B, N, N]``, symmetric, rows and columns padded to multiples of 16
            (:func:`aligned_distance`; a view, not contiguous unless N is a multiple of 16).
        depth: ``int32 [B, N]`` (-1 for padding).
        segment: ``int32 [B, N]`` (-1 for padding).
        leak_free: the distance is leak-free for causal models (``from_heads(..., leak_free=True)``): row i is the
            forest induced on tokens ``0..i``, 255 for ``j > i``; not symmetric. depth and segment are then still
            the whole tree's (``segment >= 0`` marks the real tokens), and :meth:`relation_lists`,
            :meth:`window_lists` (built from the whole tree) raise ValueError.
        kernel_lengths: ``int32 [B]``, the lengths the fused kernels read.
        short_rows: whether the rows are short against the kernels' long tiles (:func:`~syntaxkernels.plan.
            rows_are_short` of the lengths, made when the batch is built from lengths on the host; None when they
            were on a GPU; given, it is kept): it picks the tiles of every layer
            (:class:`~syntaxkernels.plan.StructurePlan`).

    Edge lists (:meth:`relation_lists`, :meth:`window_lists`) and what the fused ops derive for their tiles are
    built on first use and kept on the batch (:meth:`~syntaxkernels.plan.StructurePlan.derived`).
    """

    heads: torch.Tensor
    lengths: torch.Tensor
    distance: torch.Tensor
    depth: torch.Tensor
    segment: torch.Tensor
    leak_free: bool = False
    short_rows: Optional[bool] = field(default=None, repr=False)

    def __post_init__(self):
        self.leak_free = bool(self.leak_free)
        self.distance = aligned_distance(self.distance)
        if not self.leak_free:  # the mark says "symmetric": a leak-free distance is not
            _mark_tree_distance(self.distance)
        self._init_plan(symmetric=not self.leak_free, kernel_lengths=self.lengths.to(torch.int32),
                        short_rows=self.short_rows)

    def __setstate__(self, state):  # unpickled in the main process from a DataLoader worker
        self.__dict__.update(state)
        if not self.__dict__.get("leak_free", False):
            _mark_tree_distance(self.distance)
        self._stamp = self._current_stamp()  # fresh tensors, the same data: what was derived still holds

    def _structure_tensors(self):
        return (self.distance, self.lengths, self.heads)

    def _structure_changed(self) -> None:
        self.kernel_lengths = self.lengths.to(torch.int32)

    def _copied_from(self, other: "TreeBatch", non_blocking: bool) -> None:
        for name in ("heads", "lengths", "depth", "segment"):
            getattr(self, name).copy_(getattr(other, name), non_blocking=non_blocking)

    @classmethod
    def from_heads(cls, heads: HeadsLike, lengths=None, *, backend: str = "auto", packed: bool = False,
                   leak_free: bool = False):
        """Validate ``heads`` and build the distance, depth and segment tensors (see :func:`tree_distance`).

        ``packed=True`` returns a :class:`~syntaxkernels.trees.packed.PackedTreeBatch` instead: the sequences end
        to end without padding, the distance stored per sequence (``sum n^2`` bytes); ``heads`` is then a list of
        per-sequence lists (``lengths`` must be None; an ``[B, N]`` tensor with ``lengths`` is packed too).

        ``leak_free=True``: distances for causal models (docs/semantics.md, "Leak-free distances for causal
        models"): ``distance[b, i, j]`` for ``j <= i`` is the path in the forest induced on tokens ``0..i`` (255
        when the tree path runs through a later token), 255 for ``j > i``; row i never depends on the heads of
        later tokens. The batch is then not symmetric (the bias op's backward reads a transposed copy, derived
        once per batch); depth and segment are the whole tree's; the edge lists are refused (ValueError).

        A ``ValueError`` about an item without a root (no -1) adds a pointer to the head converters
        (:func:`~syntaxkernels.trees.from_conllu_heads`, :func:`~syntaxkernels.trees.from_self_root`)."""
        if packed:
            from .packed import PackedTreeBatch

            if isinstance(heads, (torch.Tensor, np.ndarray)):
                heads_t, lengths_t = normalize_heads(heads, lengths)
                rows = [row[:n].tolist() for row, n in zip(heads_t.cpu(), lengths_t.cpu().tolist())]
                return PackedTreeBatch.from_heads(rows, backend=backend, leak_free=leak_free).to(heads_t.device)
            if lengths is not None:
                raise ValueError("TreeBatch.from_heads(..., packed=True): give the sequences as lists (lengths "
                                 "must be None) or heads [B, N] as a tensor with lengths")
            return PackedTreeBatch.from_heads(heads, backend=backend, leak_free=leak_free)
        try:
            return cls(*build_tree_tensors(heads, lengths, backend=backend, leak_free=leak_free),
                       leak_free=leak_free)
        except ValueError as error:
            raise _rootless_hint(error, heads, lengths) from None

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
        mapped = TreeBatch(fn(self.heads), fn(self.lengths), _map_distance(fn, self.distance), fn(self.depth),
                           fn(self.segment), leak_free=self.leak_free, short_rows=self.short_rows)
        return self._carry_derived(mapped, fn)

    def to(self, *args, **kwargs) -> "TreeBatch":
        """Move every tensor (``TreeBatch.to('cuda', non_blocking=True)``), derived entries (edge lists, tile
        lists) included; dtypes are kept."""
        return self._map(lambda t: t.to(*args, **kwargs))

    def pin_memory(self) -> "TreeBatch":
        """Page-locked copies (derived entries included), so DataLoader(pin_memory=True) and non_blocking
        transfers work."""
        return self._map(lambda t: t.pin_memory())

    def index_select(self, index) -> "TreeBatch":
        """The batch items ``index`` (int64 ``[B']`` or a list of item numbers in ``0..B-1``, repeats allowed) as a
        new ``TreeBatch [B', N]`` on this batch's device: every tensor indexed along the batch, the distance keeping
        its aligned layout, ``leak_free`` kept. Entries derived on this batch (edge lists, tile lists) are not
        carried: the new batch derives its own on first use.

        Raises ``ValueError`` for an index that is not 1-D or (read on the host, when it is there) out of range,
        ``TypeError`` for a non-integer one."""
        index = item_index(index, self.batch_size, self.device)

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, index.to(t.device))

        return TreeBatch(pick(self.heads), pick(self.lengths), _map_distance(pick, self.distance), pick(self.depth),
                         pick(self.segment), leak_free=self.leak_free)

    def repeat_interleave(self, repeats: int) -> "TreeBatch":
        """Each item ``repeats`` times in a row (``[t0, t0, t1, t1]`` for 2): ``TreeBatch [B * repeats, N]``, what
        ``Tensor.repeat_interleave(repeats, dim=0)`` does to the batch's input tensors (``generate`` expands its
        inputs so for beam search and ``num_return_sequences``). ``ValueError`` unless ``repeats`` is an int >= 1."""
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
        if repeats == 1:
            return self
        return self.index_select(torch.arange(self.batch_size).repeat_interleave(repeats))

    def relation_lists(self, masks: MaskSpec) -> EdgeLists:
        """The :class:`EdgeLists` of the parent/child/sibling masks of ``masks`` (R of them, in
        ``masks.names`` order), built once per batch and kept (``pairwise`` and ``full`` are dense masks: no
        lists). Raises ValueError when ``masks`` enables none of parent, child, sibling."""
        if not isinstance(masks, MaskSpec):
            raise TypeError(f"masks must be a MaskSpec, got {type(masks).__name__}")
        _refuse_lists(self, "relation_lists")
        return self.derived(("relation lists", masks.relation_key()),
                            lambda: build_edge_lists(self.heads, self.lengths, **_relation_arguments(masks)))

    def window_lists(self, window: int) -> EdgeLists:
        """The :class:`EdgeLists` of the tree window ``d(i, j) <= window`` (one relation; the GAT's attention),
        built once per batch and kept."""
        _list_spec(1, {}, window)
        _refuse_lists(self, "window_lists")
        return self.derived(("window lists", window),
                            lambda: build_edge_lists(self.heads, self.lengths, window=window))

    def cached_window_lists(self, window: int) -> Optional[EdgeLists]:
        """The window lists if already built (never builds: no synchronisation), else None."""
        return self._derived.get(("window lists", window))

    def key_padding_mask(self) -> torch.Tensor:
        """``bool [B, N]``, True where the token is padding."""
        positions = torch.arange(self.max_len, device=self.lengths.device)
        return positions[None, :] >= self.lengths[:, None]

    def __len__(self) -> int:
        return self.batch_size

    def __repr__(self) -> str:
        """A summary: the lengths themselves for up to 8 items, else their min, mean and max (a treebank's 2,001
        lengths would bury everything else), and the edge lists cached on the batch."""
        lengths = self.lengths.tolist()
        if len(lengths) <= 8:
            shown = f"lengths={lengths}"
        else:
            shown = (f"lengths min/mean/max={min(lengths)}/{sum(lengths) / len(lengths):.1f}/{max(lengths)}, "
                     f"tokens={sum(lengths)}")
        cached = f", derived={len(self._derived)}" if self._derived else ""
        cached += ", leak_free=True" if self.leak_free else ""
        return f"TreeBatch(batch_size={self.batch_size}, max_len={self.max_len}, {shown}{cached}, device={self.device})"
