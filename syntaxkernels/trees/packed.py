"""Packed (padding-free) tree batches: S sequences in T tokens, the distance stored per sequence.

A :class:`PackedTreeBatch` holds S sequences laid end to end, in the layout of flash-attention's varlen
functions and of transformers' ``DataCollatorWithFlattening``:

- ``cu_seqlens int32 [S + 1]``: sequence s is tokens ``[cu_seqlens[s], cu_seqlens[s + 1])`` (empty sequences
  allowed); ``max_seqlen`` (a host int) the longest;
- ``heads int64 [T]``: each sequence's heads, local to the sequence (0-based, -1 for a root);
- ``distance uint8 [sum n_s^2]``: each sequence's ``n_s x n_s`` distance block (row stride ``n_s``, the
  values of :func:`~syntaxkernels.tree_distance`) at ``distance_offsets[s]`` (int64 ``[S + 1]``,
  ``distance_offsets[s] = sum_{r < s} n_r^2``). Pairs of different sequences are never stored (they are not
  attention pairs): ``sum n_s^2`` bytes instead of the ``S * N^2`` of a padded batch (``N`` the longest) or
  ``T^2`` of one packed row;
- ``depth int32 [T]``, ``segment int32 [T]`` (the tree within the sequence, 0 for single-tree sequences);
- ``positions int32 [T]`` (the token's index within its sequence, transformers' ``position_ids``) and
  ``sequence int32 [T]`` (its sequence), derived on the device.

Built in C++ (GIL released, parallel over sequences) by :meth:`PackedTreeBatch.from_heads` (also reached as
``TreeBatch.from_heads(heads, packed=True)``). ``.to()`` / ``.pin_memory()`` move everything, cached edge
lists included. The edge lists (:meth:`relation_lists`, :meth:`window_lists`) are in packed token numbering:
one ``[1, T]`` row whose trees are the sequences' trees (relations and windows never cross sequences).

``from_heads(..., leak_free=True)`` stores each sequence's leak-free distance (as ``TreeBatch``'s: row i the forest
induced on the sequence's tokens ``0..i``); the plan is then not symmetric and the edge lists are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import List, Optional

import numpy as np
import torch

from .. import _ext
from ..plan import StructurePlan
from ..specs import MaskSpec
from .batch import (EdgeLists, TreeBatch, _leak_free_sentence_tensors, _list_spec, _move_arguments, _pad_rows,
                    _refuse_lists, _relation_arguments, _sentence_tensors, build_edge_lists)

__all__ = ["PackedTreeBatch", "packed_tree_tensors", "pack_padded"]


def _as_rows(heads) -> List[List[int]]:
    if isinstance(heads, (torch.Tensor, np.ndarray)):
        raise ValueError("packed heads from a tensor need cu_seqlens: PackedTreeBatch.from_heads(heads [T], "
                         "cu_seqlens=...) or a list of per-sequence lists")
    if not isinstance(heads, (list, tuple)):
        raise ValueError(f"heads must be a list of per-sequence lists, got {type(heads).__name__}")
    try:
        return _pad_rows(heads)
    except ValueError as error:  # "batch item s, token i: head 'x' is not an integer"
        raise _sequence_error(error) from None


def _sequence_error(error: ValueError) -> ValueError:
    text = str(error)
    if text.startswith("batch item "):
        text = "sequence " + text[len("batch item "):]
    return ValueError(text)


def _python_packed(heads: torch.Tensor, cu: torch.Tensor, leak_free: bool = False):
    """The pure-Python packed builder (no extension): the same tensors as the C++ one."""
    sentence = _leak_free_sentence_tensors if leak_free else _sentence_tensors
    cu_list = cu.tolist()
    _check_cu(cu_list, heads.shape[0])
    heads_np = heads.numpy()
    S = len(cu_list) - 1
    offsets = [0]
    for s in range(S):
        n = cu_list[s + 1] - cu_list[s]
        offsets.append(offsets[-1] + n * n)
    distance = np.empty(offsets[-1], dtype=np.uint8)
    depth = np.empty(heads.shape[0], dtype=np.int32)
    segment = np.empty(heads.shape[0], dtype=np.int32)
    for s in range(S):
        a, b = cu_list[s], cu_list[s + 1]
        if a == b:
            continue
        try:
            d, dep, seg = sentence(s, heads_np[a:b])
        except ValueError as error:
            raise _sequence_error(error) from None
        distance[offsets[s]:offsets[s + 1]] = d.reshape(-1)
        depth[a:b] = dep
        segment[a:b] = seg
    return (torch.from_numpy(distance), torch.tensor(offsets, dtype=torch.int64), torch.from_numpy(depth),
            torch.from_numpy(segment))


def _check_cu(cu_list, T: int) -> None:
    if not cu_list or cu_list[0] != 0:
        raise ValueError(f"cu_seqlens[0] = {cu_list[0] if cu_list else None} (expected 0)")
    for s in range(len(cu_list) - 1):
        if cu_list[s + 1] < cu_list[s]:
            raise ValueError(f"sequence {s}: cu_seqlens[{s + 1}] = {cu_list[s + 1]} is smaller than "
                             f"cu_seqlens[{s}] = {cu_list[s]} (a negative length)")
    if cu_list[-1] != T:
        raise ValueError(f"cu_seqlens[{len(cu_list) - 1}] = {cu_list[-1]} but there are {T} heads "
                         "(the last entry must be the token count)")


def packed_tree_tensors(heads: torch.Tensor, cu_seqlens: torch.Tensor, *, backend: str = "auto",
                        num_threads: int = 0, leak_free: bool = False):
    """``(distance uint8 [sum n^2], offsets int64 [S + 1], depth int32 [T], segment int32 [T])`` for packed heads
    ``int [T]`` (local to each sequence) and ``cu_seqlens int [S + 1]``, on the CPU. ``backend``: "auto" (C++
    when built), "cpp" or "python". ``leak_free``: each sequence's leak-free distance (:class:`TreeBatch`).
    ValueError names the sequence and the token within it."""
    if backend not in ("auto", "cpp", "python"):
        raise ValueError(f"backend must be 'auto', 'cpp' or 'python', got {backend!r}")
    heads = heads.to("cpu", torch.int64).contiguous()
    cu = cu_seqlens.to("cpu", torch.int64).contiguous()
    module = _ext.load()
    name = "packed_leak_free_tree_distance" if leak_free else "packed_tree_distance"
    use_cpp = backend == "cpp" or (backend == "auto" and module is not None and hasattr(module, name))
    if use_cpp:
        if module is None or not hasattr(module, name):
            raise RuntimeError(f"the C++ extension (with {name}) is not available: " + _ext.status())
        return getattr(module, name)(heads, cu, int(num_threads))
    return _python_packed(heads, cu, leak_free)


@dataclass(eq=False)
class PackedTreeBatch(StructurePlan):
    """S dependency trees (or forests) packed into T tokens, without padding (module docstring); the batch's
    structure plan (:class:`~syntaxkernels.plan.StructurePlan`), passed as it is to every layer.

    Attributes:
        heads: int64 ``[T]``, local to each sequence. cu_seqlens: int32 ``[S + 1]``. max_seqlen: int.
        distance: uint8 ``[sum n_s^2]``; distance_offsets: int64 ``[S + 1]``.
        depth, segment: int32 ``[T]``. positions, sequence: int32 ``[T]``.
        leak_free: each sequence's distance is leak-free for causal models (not symmetric; depth and segment the
            whole trees'; no edge lists).
    """

    heads: torch.Tensor
    cu_seqlens: torch.Tensor
    distance: torch.Tensor
    distance_offsets: torch.Tensor
    depth: torch.Tensor
    segment: torch.Tensor
    max_seqlen: int
    positions: Optional[torch.Tensor] = None
    sequence: Optional[torch.Tensor] = None
    leak_free: bool = False

    def __post_init__(self):
        if self.sequence is None or self.positions is None:
            T = self.heads.shape[0]
            cu = self.cu_seqlens.to(torch.int64)
            tokens = torch.arange(T, device=cu.device)
            sequence = torch.searchsorted(cu[1:], tokens, right=True)
            self.sequence = sequence.to(torch.int32)
            self.positions = (tokens - cu[sequence]).to(torch.int32)
        self.leak_free = bool(self.leak_free)
        self._init_plan(symmetric=not self.leak_free)

    def __setstate__(self, state):  # unpickled in the main process from a DataLoader worker
        self.__dict__.update(state)
        self._stamp = self._current_stamp()

    def _structure_tensors(self):
        return (self.distance, self.cu_seqlens, self.heads)

    def _copied_from(self, other: "PackedTreeBatch", non_blocking: bool) -> None:
        for name in ("heads", "depth", "segment", "positions"):
            getattr(self, name).copy_(getattr(other, name), non_blocking=non_blocking)

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def from_heads(cls, heads, cu_seqlens=None, *, backend: str = "auto", num_threads: int = 0,
                   leak_free: bool = False) -> "PackedTreeBatch":
        """Build a packed batch.

        Args:
            heads: a list of per-sequence head lists (0-based within the sequence, -1 for a root; ``[]`` is an
                empty sequence), or with ``cu_seqlens`` an int tensor/array ``[T]`` of local heads.
            cu_seqlens: int ``[S + 1]`` (with tensor heads).
            backend: "auto" / "cpp" / "python" (the C++ builder, GIL released, parallel over sequences).
            leak_free: each sequence's leak-free distance for causal models (``TreeBatch.from_heads``).
        Raises ValueError naming the sequence and token (``sequence 3, token 5: head 9 out of range ...``).
        """
        if cu_seqlens is None:
            module = _ext.load()
            if (not leak_free and backend in ("auto", "cpp") and type(heads) in (list, tuple) and module is not None
                    and hasattr(module, "packed_tree_distance_lists")):
                built = module.packed_tree_distance_lists(heads, int(num_threads))
                if built is not None:  # one extension call: read, validate, build
                    flat, cu32, distance, offsets, depth, segment, positions, sequence, max_seqlen = built
                    return cls(flat, cu32, distance, offsets, depth, segment, max_seqlen, positions, sequence)
            padded, lengths = _as_rows(heads)
            if isinstance(heads, (list, tuple)) and all(type(r) is list for r in heads):
                flat = torch.tensor(list(chain.from_iterable(heads)), dtype=torch.int64)
            else:
                mask = torch.arange(padded.shape[1])[None, :] < torch.tensor(lengths, dtype=torch.int64)[:, None]
                flat = padded[mask]
            cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
            if lengths:
                cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
            device = torch.device("cpu")
        else:
            flat = torch.as_tensor(heads)
            if flat.dtype == torch.bool or flat.is_floating_point() or flat.dim() != 1:
                raise ValueError(f"packed heads must be an integer tensor [T], got {flat.dtype} "
                                 f"{tuple(flat.shape)}")
            cu = torch.as_tensor(cu_seqlens)
            if cu.dtype == torch.bool or cu.is_floating_point() or cu.dim() != 1 or cu.shape[0] < 1:
                raise ValueError(f"cu_seqlens must be an integer tensor [S + 1], got {cu.dtype} {tuple(cu.shape)}")
            device = flat.device
        distance, offsets, depth, segment = packed_tree_tensors(flat, cu, backend=backend, num_threads=num_threads,
                                                                leak_free=leak_free)
        cu64 = cu.to("cpu", torch.int64)
        max_seqlen = int((cu64[1:] - cu64[:-1]).max()) if cu64.shape[0] > 1 else 0
        batch = cls(flat.to("cpu", torch.int64), cu64.to(torch.int32), distance, offsets, depth, segment, max_seqlen,
                    leak_free=leak_free)
        return batch if device.type == "cpu" else batch.to(device)

    @classmethod
    def from_batch(cls, trees: TreeBatch) -> "PackedTreeBatch":
        """The packed form of a padded :class:`TreeBatch` (its items as sequences, padding dropped)."""
        lengths = trees.lengths.cpu().tolist()
        heads = trees.heads.cpu()
        return cls.from_heads([heads[b, :n].tolist() for b, n in enumerate(lengths)],
                              leak_free=getattr(trees, "leak_free", False)).to(trees.device)

    # -- shape ---------------------------------------------------------------------------------------------

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    @property
    def num_tokens(self) -> int:
        return self.heads.shape[0]

    @property
    def device(self) -> torch.device:
        return self.heads.device

    def __len__(self) -> int:
        return self.num_sequences

    def lengths(self) -> torch.Tensor:
        """int64 ``[S]``: the sequence lengths (on the batch's device)."""
        cu = self.cu_seqlens.to(torch.int64)
        return cu[1:] - cu[:-1]

    def sequence_distance(self, s: int) -> torch.Tensor:
        """uint8 ``[n_s, n_s]``: sequence s's distance block (a view; host-side offsets, for tests and tools)."""
        cu = self.cu_seqlens.cpu()
        n = int(cu[s + 1] - cu[s])
        start = int(self.distance_offsets[s].cpu())
        return self.distance[start:start + n * n].view(n, n)

    def global_heads(self) -> torch.Tensor:
        """int64 ``[T]``: the heads in packed numbering (``-1`` stays ``-1``): one forest over the T tokens."""
        cu = self.cu_seqlens.to(torch.int64)
        start = cu[self.sequence.long()]
        return torch.where(self.heads >= 0, self.heads + start, torch.full_like(self.heads, -1))

    def to_padded(self) -> TreeBatch:
        """The same sequences as a padded :class:`TreeBatch` ``[S, max_seqlen]`` (for comparisons)."""
        lengths = self.lengths().cpu()
        S, N = self.num_sequences, self.max_seqlen
        heads = torch.full((S, N), -1, dtype=torch.int64)
        mask = torch.arange(N)[None, :] < lengths[:, None]
        heads[mask] = self.heads.cpu()
        return TreeBatch.from_heads(heads, lengths, leak_free=self.leak_free).to(self.device)

    def padded_layout(self):
        """``(sequence int64 [T], position int64 [T], lengths int64 [S], distance uint8 [S, N, N], depth int32 [S, N])``
        with N = ``max_seqlen``: the sequences laid out as a padded batch, for the ops that need one (the structural
        probe). Built once per batch and cached (it reads ``distance_offsets`` on the host: one synchronisation on a
        GPU). ``S * N^2`` bytes, never ``T^2``."""
        return self.derived(("padded layout",), self._padded_layout)

    def _padded_layout(self):
        S, N = self.num_sequences, self.max_seqlen
        device = self.device
        sequence = self.sequence.long()
        cu = self.cu_seqlens.to(torch.int64)
        position = torch.arange(self.num_tokens, device=device) - cu[sequence]
        distance = torch.full((S, N, N), 255, dtype=torch.uint8, device=device)
        offsets = self.distance_offsets.cpu().tolist()
        lengths = (cu[1:] - cu[:-1])
        for s, n in enumerate(lengths.cpu().tolist()):
            if n:
                distance[s, :n, :n] = self.distance[offsets[s]:offsets[s] + n * n].view(n, n)
        depth = torch.full((S, N), -1, dtype=torch.int32, device=device)
        depth[sequence, position] = self.depth
        return (sequence, position, lengths, distance, depth)

    @property
    def nbytes(self) -> int:
        """Bytes of the tree tensors (distance, offsets, heads, depth, segment, cu_seqlens, positions, sequence)."""
        return sum(t.numel() * t.element_size() for t in (self.distance, self.distance_offsets, self.heads, self.depth,
                                                          self.segment, self.cu_seqlens, self.positions,
                                                          self.sequence))

    # -- devices -------------------------------------------------------------------------------------------

    def _map(self, fn) -> "PackedTreeBatch":
        mapped = PackedTreeBatch(fn(self.heads), fn(self.cu_seqlens), fn(self.distance), fn(self.distance_offsets),
                                 fn(self.depth), fn(self.segment), self.max_seqlen, fn(self.positions),
                                 fn(self.sequence), leak_free=self.leak_free)
        return self._carry_derived(mapped, fn)

    def to(self, *args, **kwargs) -> "PackedTreeBatch":
        """Move every tensor (dtypes kept), derived entries (edge lists, tile lists) included."""
        device, non_blocking = _move_arguments(args, kwargs)
        if device is None:
            return self
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "PackedTreeBatch":
        return self._map(lambda t: t.pin_memory())

    # -- edge lists (packed numbering) ---------------------------------------------------------------------

    def _forest(self):
        heads = self.global_heads().cpu().view(1, -1)
        return heads, torch.tensor([heads.shape[1]], dtype=torch.int64)

    def relation_lists(self, masks: MaskSpec) -> EdgeLists:
        """The parent/child/sibling :class:`EdgeLists` of ``masks`` over one ``[1, T]`` row in packed numbering
        (relations never cross sequences), built once per batch and kept."""
        if not isinstance(masks, MaskSpec):
            raise TypeError(f"masks must be a MaskSpec, got {type(masks).__name__}")
        _refuse_lists(self, "relation_lists")

        def build():
            heads, lengths = self._forest()
            return build_edge_lists(heads, lengths, **_relation_arguments(masks)).to(self.device)
        return self.derived(("relation lists", masks.relation_key()), build)

    def window_lists(self, window: int) -> EdgeLists:
        """The window :class:`EdgeLists` (``d(i, j) <= window`` within a sequence) over one ``[1, T]`` row, built
        once per batch and kept."""
        _list_spec(1, {}, window)
        _refuse_lists(self, "window_lists")

        def build():
            heads, lengths = self._forest()
            return build_edge_lists(heads, lengths, window=window).to(self.device)
        return self.derived(("window lists", window), build)

    def cached_window_lists(self, window: int) -> Optional[EdgeLists]:
        return self._derived.get(("window lists", window))

    def __repr__(self) -> str:
        return (f"PackedTreeBatch(sequences={self.num_sequences}, tokens={self.num_tokens}, "
                f"max_seqlen={self.max_seqlen}, distance_bytes={self.distance.numel()}, "
                f"{'leak_free=True, ' if self.leak_free else ''}device={self.device})")


def pack_padded(x: torch.Tensor, lengths) -> torch.Tensor:
    """``[B, N, ...]`` -> ``[T, ...]``: the first ``lengths[b]`` rows of every item, end to end (a helper for
    comparing padded and packed paths)."""
    lengths = torch.as_tensor(lengths, device=x.device)
    mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
    return x[mask]
