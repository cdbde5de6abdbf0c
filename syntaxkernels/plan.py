"""One structure plan per batch: what the fused ops read about a batch's structure, made once where the batch is
made and passed to every layer.

A :class:`StructurePlan` holds

- ``distance``: uint8 ``[B, N, N]``, rows aligned to 16 bytes (:func:`~syntaxkernels.trees.aligned_distance`), for a
  padded batch; uint8 ``[sum n_s^2]`` (each sequence's ``n_s x n_s`` block) for a packed one;
- ``symmetric``: whether ``distance[b, i, j] == distance[b, j, i]`` (a tree distance is: the backward then reads the
  transposed tiles from the distance itself);
- a padded batch's ``kernel_lengths`` (int32 ``[B]``), or a packed batch's ``cu_seqlens`` (int32 ``[S + 1]``),
  ``sequence`` (int32 ``[T]``: each token's sequence), ``distance_offsets`` (int64 ``[S + 1]``) and ``max_seqlen``;
- a padded batch's ``short_rows``, a host summary of its lengths made where the plan is made (the lengths are on the
  host there): whether its rows are short against the kernels' long tiles (:func:`rows_are_short`), which picks
  the tiles of every layer's launches; None when the lengths were not on the host;
- what the ops derive from those for a launch configuration (live-tile lists of a window, per-tile bucket sets,
  the transposed copy of a directed distance, edge lists, ...): :meth:`StructurePlan.derived`, computed by the
  first layer that needs it and kept on the plan for the others.

:class:`~syntaxkernels.TreeBatch` and :class:`~syntaxkernels.PackedTreeBatch` are plans: a model passes its batch to
every layer and nothing is derived twice. :func:`structure_plan` makes one from bare tensors (what the ops do, per
call, when given a distance tensor instead of a plan). A new source of structure (graphs, several relations) is a
producer of a plan: the ops read nothing else.

Nothing is remembered anywhere but on the plan, and every tensor a kernel reads is the plan's or the call's, never
looked up behind the caller's back, so that:

- ``torch.compile`` (``mode="reduce-overhead"`` too) sees every tensor as an input or computes it in the graph
  (while compiling, derived entries are computed, never stored);
- a CUDA graph captured with a plan replays exactly with another batch of the same shapes copied into it with
  :meth:`StructurePlan.copy_`, which copies the structure and every derived entry the captured calls read
  (derived from the new batch).

An in-place change of a plan's structure tensors (their version counter) drops what was derived from them.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch

__all__ = ["StructurePlan", "DistancePlan", "ItemPlan", "structure_plan", "register_derivation", "as_plan",
           "rows_are_short"]

#: kind -> function(plan, *arguments) -> value: how each kind of derived entry is computed (registered by the
#: module that reads it), so that :meth:`StructurePlan.copy_` can derive the entries of another batch.
_DERIVATIONS: Dict[str, Callable[..., Any]] = {}


def register_derivation(kind: str, compute: Callable[..., Any]) -> None:
    """Declare how ``plan.derived((kind, *arguments))`` is computed: ``compute(plan, *arguments)`` returns a tensor,
    a tuple of tensors (or None), or an object with a ``to`` method (edge lists)."""
    _DERIVATIONS[kind] = compute


#: The model behind :func:`rows_are_short`: the tiled kernels' long forward tile (rows x keys), the padded batches'
#: smaller one, and how much dearer a score element of the smaller tile is (the inspection's model of the forward on
#: full rows: +15..+39% an element on 970-token rows, -8..-28% a valid pair on 77-token rows for 25% fewer elements).
LONG_TILE, SHORT_TILE, SHORT_TILE_COST = (128, 64), (64, 32), 1.3


def _tile_span(length: int, tile: Tuple[int, int]) -> int:
    rows, keys = tile
    return -(-length // rows) * rows * (-(-length // keys)) * keys


def rows_are_short(lengths) -> bool:
    """Whether a padded batch of rows of these ``lengths`` (ints) is cheaper on the padded batches' tiles: the score
    elements its rows span in :data:`SHORT_TILE` tiles, each :data:`SHORT_TILE_COST` times as dear, fewer than in
    :data:`LONG_TILE` tiles (a tile past a row's length is skipped, so N does not enter). Sentences of 5..60 tokens
    padded to 128 or 512: short (a 30-token row spans 2,048 elements against 8,192); rows of 100 or 500 tokens: not
    (the same elements in either tile); a batch without rows: not."""
    short = sum(_tile_span(n, SHORT_TILE) for n in lengths)
    return short * SHORT_TILE_COST < sum(_tile_span(n, LONG_TILE) for n in lengths)


def _host_short_rows(lengths: Optional[torch.Tensor]) -> Optional[bool]:
    """:func:`rows_are_short` of a lengths tensor on the host (None for one on a GPU: nothing is read back, or while
    ``torch.compile`` traces)."""
    from ._validation import _on_host

    if lengths is None or _compiling() or lengths.dim() != 1 or not _on_host(lengths):
        return None
    return rows_are_short(lengths.tolist())


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _version(t: Optional[torch.Tensor]) -> int:
    if t is None or t.is_inference():  # inference tensors keep no version counter
        return 0
    return t._version


def _map_value(value, fn):
    """``fn`` applied to every tensor of a derived entry (a tensor, a tuple of them, None, or an object with
    ``_map_tensors``/``to``)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map_value(v, fn) for v in value)
    return value._map(fn)


def _value_tensors(value) -> List[torch.Tensor]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple):
        return [t for v in value for t in _value_tensors(v)]
    raise ValueError(f"a derived entry of type {type(value).__name__} (edge lists: their size depends on the batch) "
                     "cannot be copied into a captured plan; CUDA-graph replay takes the bias attention's entries only")


def move_arguments(args, kwargs):
    """``(device or None, non_blocking)`` from ``Tensor.to``-style arguments (a dtype is ignored: a plan's tensors keep
    their integer dtypes)."""
    device, non_blocking = kwargs.get("device"), bool(kwargs.get("non_blocking", False))
    for arg in args:
        if isinstance(arg, torch.Tensor):
            device = arg.device
        elif isinstance(arg, (str, torch.device, int)) and not isinstance(arg, bool):
            device = arg
        elif isinstance(arg, bool):
            non_blocking = arg
    return device, non_blocking


class StructurePlan:
    """Base of every structure plan (module docstring). Subclasses call :meth:`_init_plan` once their tensors are
    set, and list the tensors that define their structure in :meth:`_structure_tensors`.

    ``short_rows`` (padded plans): True when the batch's rows are short against the kernels' long tiles
    (:func:`rows_are_short` of its lengths, made when the plan is made from lengths on the host: a collator's
    batch), False when they fill them, None when not known (lengths made on a GPU; packed plans): the distance-bias
    kernels then choose by N (padded tiles from 65 to 512 tokens). It picks every layer's tiles, never a result
    beyond the summation order; it is part of a captured graph's class (:meth:`copy_`), and may be set (to pin one
    class for every batch a graph replays). It is a summary of the lengths the plan was made with: an in-place
    change of them leaves it as it was."""

    distance: torch.Tensor
    symmetric: bool
    kernel_lengths: Optional[torch.Tensor]
    cu_seqlens: Optional[torch.Tensor]
    sequence: Optional[torch.Tensor]
    distance_offsets: Optional[torch.Tensor]
    max_seqlen: Optional[int]
    short_rows: Optional[bool]

    def _init_plan(self, symmetric: bool, kernel_lengths: Optional[torch.Tensor] = None,
                   short_rows: Optional[bool] = None, summarize: bool = True) -> None:
        """Set the plan's fields (``short_rows``: given, else with ``summarize`` :func:`rows_are_short` of
        ``kernel_lengths`` when they are on the host, else None)."""
        self.symmetric = bool(symmetric)
        self.kernel_lengths = kernel_lengths
        if short_rows is None and summarize:
            short_rows = _host_short_rows(kernel_lengths)
        self.short_rows = None if short_rows is None else bool(short_rows)
        self._derived: Dict[Hashable, Any] = {}
        self._stamp = self._current_stamp()

    # -- what a plan is ------------------------------------------------------------------------------------

    @property
    def is_packed(self) -> bool:
        """True for a packed batch (``cu_seqlens``), False for a padded one (``kernel_lengths``)."""
        return getattr(self, "cu_seqlens", None) is not None and getattr(self, "kernel_lengths", None) is None

    def _structure_tensors(self) -> Tuple[Optional[torch.Tensor], ...]:
        """The tensors the derived entries are computed from (their versions are watched)."""
        if self.is_packed:
            return (self.distance, self.cu_seqlens)
        return (self.distance, self.kernel_lengths)

    def _plan_tensors(self) -> Dict[str, torch.Tensor]:
        """Every tensor of the plan itself by name (what :meth:`copy_` copies before the derived entries)."""
        names = ("distance", "cu_seqlens", "sequence", "distance_offsets") if self.is_packed else (
            "distance", "kernel_lengths")
        return {name: getattr(self, name) for name in names}

    def _current_stamp(self) -> Tuple[int, ...]:
        if _compiling():  # (no version counters while torch.compile traces; nothing is kept then either)
            return ()
        return tuple(_version(t) for t in self._structure_tensors())

    # -- derived entries -----------------------------------------------------------------------------------

    def derived(self, key: Tuple[Hashable, ...], compute: Optional[Callable[[], Any]] = None):
        """The entry ``key`` (``(kind, *arguments)``) derived from this plan, computed on first use and kept.

        ``compute`` (a function of nothing) computes it; without it the kind's registered derivation
        (:func:`register_derivation`) does. While ``torch.compile`` traces it is computed and not kept (in the
        graph); after an in-place change of the structure tensors every kept entry is dropped first.
        """
        if _compiling():
            return compute() if compute is not None else _DERIVATIONS[key[0]](self, *key[1:])
        stamp = self._current_stamp()
        if stamp != self._stamp:
            self._derived.clear()
            self._stamp = stamp
            self._structure_changed()
        try:
            return self._derived[key]
        except KeyError:
            pass
        value = compute() if compute is not None else _DERIVATIONS[key[0]](self, *key[1:])
        self._derived[key] = value
        return value

    def _structure_changed(self) -> None:
        """Hook for subclasses whose own fields derive from the structure tensors (rebuilt after an in-place
        change)."""

    def transposed_distance(self) -> torch.Tensor:
        """The distance read at ``[b, j, i]`` for the pair (i, j): the distance itself when symmetric, else an
        aligned transposed copy (derived once). Padded plans only."""
        if self.symmetric:
            return self.distance
        return self.derived(("transposed distance",))

    def _carry_derived(self, mapped: "StructurePlan", fn) -> "StructurePlan":
        """``mapped`` (this plan moved by ``fn``: ``.to()``, ``.pin_memory()``) with this plan's derived entries
        moved the same way."""
        mapped._derived = {key: _map_value(value, fn) for key, value in self._derived.items()}
        if mapped.short_rows is None:  # (moved to a GPU: the host summary goes with it)
            mapped.short_rows = getattr(self, "short_rows", None)
        mapped._stamp = mapped._current_stamp()
        return mapped

    # -- CUDA graphs ---------------------------------------------------------------------------------------

    def copy_(self, other: "StructurePlan", non_blocking: bool = False) -> "StructurePlan":
        """Copy ``other`` (another batch of the same shapes) into this plan in place: its structure tensors, and for
        every entry derived on this plan, ``other``'s (derived from ``other`` if it has not been). What to do between
        the replays of a CUDA graph captured with this plan; returns ``self``.

        Raises ValueError when the shapes differ (a graph replays one shape class), when :attr:`short_rows` differs
        (it picks the tiles, so it is part of the class: a replay of the captured tiles would round differently from
        an eager call on ``other``; set the attribute on every batch to pin one class) or when an entry cannot be
        copied (edge lists, whose size depends on the batch)."""
        if not isinstance(other, StructurePlan):
            raise TypeError(f"copy_ takes a StructurePlan (a TreeBatch, PackedTreeBatch, ...), got {type(other).__name__}")
        if self.is_packed != other.is_packed:
            raise ValueError("copy_: one plan is packed and the other padded")
        if self.symmetric != other.symmetric:
            raise ValueError("copy_: the plans differ in symmetry (the captured backward reads the distance as it was)")
        if getattr(self, "short_rows", None) != getattr(other, "short_rows", None):
            raise ValueError(f"copy_: the plans' rows differ in class (short_rows {self.short_rows} here, "
                             f"{other.short_rows} given): a captured graph runs the tiles of its class; set "
                             "short_rows to one value on every batch (True: sentences padded to a fixed N, False: "
                             "full rows) to replay them all")
        mine, theirs = self._plan_tensors(), other._plan_tensors()
        for name, t in mine.items():
            o = theirs[name]
            if (t is None) != (o is None) or (t is not None and (t.shape != o.shape or t.dtype != o.dtype)):
                raise ValueError(f"copy_: {name} differs ({_describe(t)} here, {_describe(o)} given); a captured "
                                 "graph replays batches of one shape only")
        pairs = []
        for key, value in self._derived.items():
            mine_t = _value_tensors(value)
            theirs_t = _value_tensors(other.derived(key))
            if len(mine_t) != len(theirs_t) or any(a.shape != b.shape for a, b in zip(mine_t, theirs_t)):
                raise ValueError(f"copy_: the derived entry {key[0]!r} differs in shape between the two batches")
            pairs += list(zip(mine_t, theirs_t))
        for name, t in mine.items():
            if t is not None:
                if name == "distance" and t.dim() == 3:
                    _copy_padded_buffer(t, theirs[name], non_blocking)
                else:
                    t.copy_(theirs[name], non_blocking=non_blocking)
        for a, b in pairs:
            a.copy_(b, non_blocking=non_blocking)
        if getattr(self, "max_seqlen", None) is not None:
            self.max_seqlen = other.max_seqlen
        self._copied_from(other, non_blocking)
        self._stamp = self._current_stamp()
        return self

    def _copied_from(self, other: "StructurePlan", non_blocking: bool) -> None:
        """Hook for subclasses: copy their other fields (heads, depth, ...) from ``other`` of the same shapes."""

    def plan_tensors(self) -> List[torch.Tensor]:
        """Every tensor the fused ops may read from this plan: its structure tensors and its derived entries (the
        inputs a CUDA graph captured with this plan reads)."""
        tensors = [t for t in self._plan_tensors().values() if t is not None]
        for value in self._derived.values():
            try:
                tensors += _value_tensors(value)
            except ValueError:
                continue
        return tensors


def _describe(t: Optional[torch.Tensor]) -> str:
    return "none" if t is None else f"{t.dtype} {tuple(t.shape)}"


def _copy_padded_buffer(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """Copy an aligned distance into another of the same shape, padding bytes included where both have the same
    padded layout (the kernels read up to the padded extent)."""
    from .trees.batch import padded_buffer

    dst_buffer, src_buffer = padded_buffer(dst), padded_buffer(src)
    if dst_buffer is not None and src_buffer is not None and dst_buffer.shape == src_buffer.shape:
        dst_buffer.copy_(src_buffer, non_blocking=non_blocking)
    else:
        dst.copy_(src, non_blocking=non_blocking)


class DistancePlan(StructurePlan):
    """A plan made from bare tensors (:func:`structure_plan`): a padded distance and its lengths, or a packed
    distance and its ``cu_seqlens``."""

    def __init__(self, distance: torch.Tensor, *, symmetric: bool, kernel_lengths: Optional[torch.Tensor] = None,
                 cu_seqlens: Optional[torch.Tensor] = None, sequence: Optional[torch.Tensor] = None,
                 distance_offsets: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                 short_rows: Optional[bool] = None, summarize: bool = True):
        self.distance = distance
        self.cu_seqlens = cu_seqlens
        self.sequence = sequence
        self.distance_offsets = distance_offsets
        self.max_seqlen = max_seqlen
        self._init_plan(symmetric, kernel_lengths, short_rows, summarize)

    @property
    def device(self) -> torch.device:
        return self.distance.device

    def _map(self, fn) -> "DistancePlan":
        moved = DistancePlan(fn(self.distance), symmetric=self.symmetric,
                             kernel_lengths=None if self.kernel_lengths is None else fn(self.kernel_lengths),
                             cu_seqlens=None if self.cu_seqlens is None else fn(self.cu_seqlens),
                             sequence=None if self.sequence is None else fn(self.sequence),
                             distance_offsets=None if self.distance_offsets is None else fn(self.distance_offsets),
                             max_seqlen=self.max_seqlen)
        return self._carry_derived(moved, fn)

    def to(self, *args, **kwargs) -> "DistancePlan":
        """Move every tensor to a device (``Tensor.to``-style arguments; dtypes kept), derived entries included
        (subclasses: their own tensors too, through their ``_map``)."""
        device, non_blocking = move_arguments(args, kwargs)
        if device is None:
            return self
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "DistancePlan":
        return self._map(lambda t: t.pin_memory())

    def __repr__(self) -> str:
        kind = "packed" if self.is_packed else "padded"
        return (f"DistancePlan({kind}, distance={tuple(self.distance.shape)}, symmetric={self.symmetric}, "
                f"derived={len(self._derived)}, device={self.device})")


class ItemPlan(DistancePlan):
    """A :class:`DistancePlan` whose source keeps each item's length (``lengths``: int64 ``[B]`` padded, ``[S]``
    packed; set by the subclass): item counts and each item's distance block (graphs, code trees)."""

    lengths: torch.Tensor

    @property
    def num_items(self) -> int:
        """B (padded) or S (packed)."""
        return self.lengths.shape[0]

    def __len__(self) -> int:
        return self.num_items

    def sequence_distance(self, s: int) -> torch.Tensor:
        """uint8 ``[n_s, n_s]``: item s's distance block (a view; for tests and tools)."""
        n = int(self.lengths[s])
        if not self.is_packed:
            return self.distance[s, :n, :n]
        start = int(self.distance_offsets[s].cpu())
        return self.distance[start:start + n * n].view(n, n)


def structure_plan(distance: torch.Tensor, lengths=None, *, symmetric: Optional[bool] = None,
                   cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                   num_tokens: Optional[int] = None, validate: bool = True,
                   short_rows: Optional[bool] = None, summarize: bool = True) -> DistancePlan:
    """A plan from bare tensors.

    Args:
        distance: uint8 ``[B, N, N]`` (any layout: copied into aligned rows when its rows are not 16-byte aligned),
            or with ``cu_seqlens`` a packed distance uint8 ``[sum n_s^2]``.
        lengths: int ``[B]`` or a boolean key-padding mask ``[B, N]`` (True = padding); None = no padding.
        symmetric: whether the distance is symmetric; None: known for a tree distance the package built (a
            ``TreeBatch``'s, :func:`~syntaxkernels.tree_distance`'s result: the tensor object carries a mark), else
            not known (the backward then reads a transposed copy).
        cu_seqlens: int ``[S + 1]`` of a packed batch; max_seqlen: its longest sequence (optional: no kernel needs
            it); num_tokens: its T (read from ``cu_seqlens`` on the host when None: give it for a CUDA
            ``cu_seqlens``, as the ops do from q's shape, so that nothing is read back).
        validate: check the tensors (shapes, dtypes; the lengths against a tree distance's own padding:
            ``ValueError`` on CPU tensors, a device-side assertion on a GPU).
        short_rows: a padded batch's :attr:`StructurePlan.short_rows` (the tiles' choice); None: from the lengths
            when they are on the host and ``summarize`` (or not given: every row N tokens), else not known (the
            kernels then choose by N).
        summarize: read lengths on the host for ``short_rows`` (the ops' per-call plans, made at every layer from
            bare tensors, do not: they read no tensor value; a plan made once per batch does).
    """
    from . import _validation as V
    from .trees.batch import aligned_distance, is_tree_distance

    if cu_seqlens is not None:
        if lengths is not None:
            raise ValueError("lengths does not apply to a packed batch (cu_seqlens gives the sequences)")
        if validate:
            V.check_packed_structure(distance, cu_seqlens, num_tokens)
        cu = cu_seqlens.to(torch.int32).contiguous() if cu_seqlens.dtype != torch.int32 else cu_seqlens
        cu64 = cu.to(torch.int64)
        if num_tokens is None:
            if not V._on_host(cu64):
                raise ValueError("a packed plan of a CUDA cu_seqlens needs num_tokens (T): build it with "
                                 "PackedTreeBatch, or pass num_tokens")
            num_tokens = int(cu64[-1])
        tokens = torch.arange(num_tokens, device=cu.device)
        sequence = torch.searchsorted(cu64[1:], tokens, right=True).to(torch.int32)
        sizes = (cu64[1:] - cu64[:-1]) ** 2
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=cu.device), torch.cumsum(sizes, 0)])
        return DistancePlan(distance, symmetric=True if symmetric is None else bool(symmetric), cu_seqlens=cu,
                            sequence=sequence, distance_offsets=offsets,
                            max_seqlen=None if max_seqlen is None else int(max_seqlen))
    if validate:
        V.check_plan_distance(distance)
    if symmetric is not None and not isinstance(symmetric, bool):
        raise ValueError(f"symmetric must be None or a bool, got {symmetric!r}")
    tree = is_tree_distance(distance)
    B, N = distance.shape[0], distance.shape[1]
    given = None if lengths is None else V.normalize_plan_lengths(lengths, B, N, distance.device)
    if validate:
        V.check_lengths_match_distance(given, distance)
    if given is None:
        kernel_lengths = torch.full((B,), N, dtype=torch.int32, device=distance.device)
        if short_rows is None and not _compiling():
            short_rows = B > 0 and rows_are_short([N])  # (B rows of N tokens: one row's ratio)
    else:
        kernel_lengths = given.to(torch.int32)
        if short_rows is None and summarize:  # (the lengths as given, where they were on the host, or now)
            host = lengths if isinstance(lengths, torch.Tensor) else torch.as_tensor(lengths)
            host = host if host.dim() == 1 and host.dtype != torch.bool else given
            short_rows = _host_short_rows(host)
    return DistancePlan(aligned_distance(distance), symmetric=tree if symmetric is None else symmetric,
                        kernel_lengths=kernel_lengths, short_rows=short_rows, summarize=False)


def as_plan(structure, lengths=None, *, symmetric: Optional[bool] = None, cu_seqlens=None,
            max_seqlen: Optional[int] = None, num_tokens: Optional[int] = None) -> StructurePlan:
    """``structure`` as a plan: a plan itself (a TreeBatch, PackedTreeBatch, ...; ``lengths`` then overrides its
    lengths for this call only), or a distance tensor with its ``lengths`` / ``cu_seqlens`` (:func:`structure_plan`,
    made for this call; it reads no lengths, so its ``short_rows`` is known only without them: every row N tokens).
    Raises ``TypeError`` for anything else."""
    if isinstance(structure, StructurePlan):
        if cu_seqlens is not None and structure.is_packed and cu_seqlens is not structure.cu_seqlens:
            raise ValueError("cu_seqlens is given by the packed plan; do not pass another")
        if symmetric is not None and symmetric != structure.symmetric:
            return _with_symmetry(structure, symmetric)
        if lengths is None:
            return structure
        if structure.is_packed:
            raise ValueError("lengths does not apply to a packed batch (cu_seqlens gives the sequences)")
        return structure_plan(structure.distance, lengths, symmetric=structure.symmetric, summarize=False)
    if isinstance(structure, torch.Tensor):
        return structure_plan(structure, lengths, symmetric=symmetric, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                              num_tokens=num_tokens, summarize=False)
    raise TypeError("the structure must be a StructurePlan (a TreeBatch or PackedTreeBatch) or a uint8 distance "
                    f"tensor, got {type(structure).__name__}")


def _with_symmetry(plan: StructurePlan, symmetric: bool) -> DistancePlan:
    """``plan`` for one call with another symmetry claim (``symmetric=`` given to an op with a plan)."""
    if plan.is_packed:
        return DistancePlan(plan.distance, symmetric=symmetric, cu_seqlens=plan.cu_seqlens, sequence=plan.sequence,
                            distance_offsets=plan.distance_offsets, max_seqlen=plan.max_seqlen)
    return DistancePlan(plan.distance, symmetric=symmetric, kernel_lengths=plan.kernel_lengths,
                        short_rows=plan.short_rows, summarize=False)
