"""Bucket and mask specifications: how tree distances become table indices and Syntax-BERT masks.

``BucketSpec`` maps each of the 256 uint8 distance values (0..254 = path length, 255 = unreachable) to a
bias-table index through a 256-entry lookup table (LUT). ``MaskSpec`` chooses which Syntax-BERT relation
masks a sub-network layer uses and fixes their output order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

UNREACHABLE = 255
MAX_PATH = 254

__all__ = ["BucketSpec", "RelativePositionSpec", "MaskSpec", "RELATIONS", "DENSE_MASKS", "UNREACHABLE", "MAX_PATH"]


@dataclass(frozen=True)
class BucketSpec:
    """How a tree distance selects an entry of the bias table.

    Args:
        max_distance: distances at or beyond this share the last distance bucket (default 10).
        log_distance: ``None`` for the clamp scheme (``bucket = min(d, max_distance)``). An integer ``E``
            (``1 <= E < max_distance``) keeps distances ``0..E`` exact and spreads ``E < d <= max_distance``
            over log2-spaced buckets: ``bucket = E + ceil(log2(d / E))``, clamped at ``bucket(max_distance)``.
        unreachable_bucket: when True, distance 255 (different trees, padding) gets its own last bucket;
            when False it is clamped like a long distance.

    ``num_buckets`` is the table length T; ``lut()`` returns the ``int64 [256]`` table index of every
    distance value.
    """

    max_distance: int = 10
    log_distance: Optional[int] = None
    unreachable_bucket: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_distance, int) or isinstance(self.max_distance, bool):
            raise TypeError(f"BucketSpec.max_distance must be an int, got {type(self.max_distance).__name__}")
        if not 1 <= self.max_distance <= MAX_PATH:
            raise ValueError(f"BucketSpec.max_distance must be in 1..{MAX_PATH}, got {self.max_distance}")
        if self.log_distance is not None:
            if not isinstance(self.log_distance, int) or isinstance(self.log_distance, bool):
                raise TypeError("BucketSpec.log_distance must be an int or None")
            if not 1 <= self.log_distance < self.max_distance:
                raise ValueError(
                    f"BucketSpec.log_distance must satisfy 1 <= log_distance < max_distance "
                    f"({self.max_distance}), got {self.log_distance}"
                )

    def _distance_bucket(self, d: int) -> int:
        d = min(d, self.max_distance)
        if self.log_distance is None or d <= self.log_distance:
            return d
        e = self.log_distance
        return e + math.ceil(math.log2(d / e) - 1e-12)

    @property
    def num_distance_buckets(self) -> int:
        """Buckets used by reachable distances (0..254)."""
        return self._distance_bucket(self.max_distance) + 1

    @property
    def num_buckets(self) -> int:
        """Table length T (distance buckets, plus one for unreachable when ``unreachable_bucket``)."""
        return self.num_distance_buckets + (1 if self.unreachable_bucket else 0)

    def lut(self, device: Optional[torch.device | str] = None) -> torch.Tensor:
        """``int64 [256]``: the table index of each distance value 0..255."""
        values: List[int] = [self._distance_bucket(d) for d in range(UNREACHABLE)]
        values.append(self.num_distance_buckets if self.unreachable_bucket else self._distance_bucket(UNREACHABLE))
        return torch.tensor(values, dtype=torch.int64, device=device)

    def bucket_names(self) -> List[str]:
        """Readable label of every bucket, e.g. ``['0', '1', ..., '>=10', 'unreachable']``."""
        lut = self.lut().tolist()
        names = []
        for t in range(self.num_distance_buckets):
            ds = [d for d in range(UNREACHABLE) if lut[d] == t]
            if ds[-1] == MAX_PATH:
                names.append(f">={ds[0]}")
            elif len(ds) == 1:
                names.append(str(ds[0]))
            else:
                names.append(f"{ds[0]}-{ds[-1]}")
        if self.unreachable_bucket:
            names.append("unreachable")
        return names


@dataclass(frozen=True)
class RelativePositionSpec:
    """T5's relative-position buckets: how the offset ``r = j - i`` of key j from query i selects an entry of a
    per-head position table (a term added beside the tree bias, computed from the indices in the kernels).

    The rule (T5's): bidirectional (an encoder's self-attention), half the buckets take ``r <= 0`` and half ``r > 0``
    (offset by ``num_buckets / 2``), each half on ``|r|``; otherwise (a causal decoder) every bucket takes ``-min(r,
    0)`` (keys after the query share bucket 0). Within a half of ``n`` buckets (``n = num_buckets`` or its half),
    ``m = n // 2`` offsets ``0..m-1`` are exact and longer ones share log-spaced buckets: ``m + floor(log(a / m) /
    log(max_distance / m) * (n - m))`` computed in float32 as T5 computes it, capped at ``n - 1``. Every offset with
    ``|r| >= max_distance`` is in the last bucket of its half, so the kernels clamp ``r`` to ``[-reach, reach]``
    (``reach = max_distance``) and read ``2 * reach + 1`` entries.

    Args:
        num_buckets: table length P (T5: 32); bidirectional needs at least 4, causal at least 2.
        max_distance: offsets at or beyond it share the last bucket (T5: 128); more than the exact range ``m``.
        bidirectional: True for an encoder (T5's encoder), False for a causal decoder.
    """

    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def __post_init__(self) -> None:
        for name in ("num_buckets", "max_distance"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"RelativePositionSpec.{name} must be an int, got {type(value).__name__}")
        if not isinstance(self.bidirectional, bool):
            raise TypeError("RelativePositionSpec.bidirectional must be a bool")
        least = 4 if self.bidirectional else 2
        if self.num_buckets < least:
            raise ValueError(f"RelativePositionSpec.num_buckets must be >= {least} "
                             f"({'bidirectional' if self.bidirectional else 'causal'}), got {self.num_buckets}")
        if not self._exact < self.max_distance <= 65535:
            raise ValueError(f"RelativePositionSpec.max_distance must be in {self._exact + 1}..65535 (more than the "
                             f"{self._exact} exact offsets), got {self.max_distance}")
        # The buckets of the clamped offsets as plain ints, once (what boundaries() and the kernels' gradient
        # boundaries read; no tensor work then, also while torch.compile traces).
        object.__setattr__(self, "_lut_values", tuple(self.lut().tolist()))

    @property
    def _half(self) -> int:
        return self.num_buckets // 2 if self.bidirectional else self.num_buckets

    @property
    def _exact(self) -> int:
        return self._half // 2

    @property
    def reach(self) -> int:
        """Offsets are clamped to ``[-reach, reach]`` without changing their bucket (``reach = max_distance``)."""
        return self.max_distance

    def bucket(self, relative: torch.Tensor) -> torch.Tensor:
        """``int64`` bucket of every offset ``r = j - i`` in ``relative`` (an integer tensor of any shape)."""
        relative = relative.to(torch.int64)
        half, exact = self._half, self._exact
        if self.bidirectional:
            base = (relative > 0).to(torch.int64) * half
            magnitude = relative.abs()
        else:
            base = torch.zeros_like(relative)
            magnitude = -torch.clamp(relative, max=0)
        # float32 as T5 computes it (its buckets are the contract); log(0) is never selected
        scaled = (torch.log(magnitude.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
                  * (half - exact))
        large = torch.clamp(exact + scaled.to(torch.int64), max=half - 1)
        return base + torch.where(magnitude < exact, magnitude, large)

    def lut(self, device: Optional[torch.device | str] = None) -> torch.Tensor:
        """``int64 [2 * reach + 1]``: the bucket of offset ``r`` at index ``r + reach`` (``r`` in ``[-reach, reach]``;
        a farther offset has its clamped offset's bucket)."""
        return self.bucket(torch.arange(-self.reach, self.reach + 1, device=device))

    def boundaries(self) -> List[int]:
        """The offsets where a new bucket starts, ascending (``lut()`` changes value there): the bucket of ``r`` is
        constant between consecutive boundaries, so a sum over a bucket is a difference of prefix sums in ``r``."""
        lut = self._lut_values
        return [r - self.reach for r in range(1, len(lut)) if lut[r] != lut[r - 1]]

    def bias(self, table: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[H, n, n]``: ``table[h, bucket(j - i)]`` for a sequence of n tokens (the reference's term)."""
        positions = torch.arange(n, device=table.device)
        return table.to(dtype)[:, self.bucket(positions[None, :] - positions[:, None])]


#: The relation masks, in output order: each kind and the distance of its first mask. An enabled kind gives
#: ``max_distance`` masks, ``<kind>_<first>`` .. ``<kind>_<first + max_distance - 1>``. The one list the Python
#: and C++ list builders take their relation names, their order, R and their cache keys from (a new kind: an entry
#: here and a field of :class:`MaskSpec`, its walk in csrc/relation_lists.cpp, its pairs in
#: :func:`syntaxkernels.reference.syntax_masks`).
RELATIONS = (("parent", 1), ("child", 1), ("sibling", 2))
#: The dense masks (no key lists), after the relations, in output order.
DENSE_MASKS = ("pairwise", "full")


@dataclass(frozen=True)
class MaskSpec:
    """Which Syntax-BERT relation masks a sub-network attention uses, and their order.

    For query token i and key token j (docs/semantics.md, "Syntax-BERT masks"):

    - ``parent_d``  (d = 1..max_distance): i is an ancestor of j at tree distance d;
    - ``child_d``   (d = 1..max_distance): i is a descendant of j at tree distance d;
    - ``sibling_d`` (d = 2..max_distance+1): same tree, neither an ancestor of the other, distance d;
    - ``pairwise``: i and j are in different trees (segments);
    - ``full``: every valid key.

    ``names`` lists them in output order (:data:`RELATIONS`, then :data:`DENSE_MASKS`); ``num_masks`` is their
    count M. The relation masks come first: ``relation_kinds`` (the enabled kinds), ``num_relations`` (R) and
    ``relation_names``; then ``dense_kinds``.
    """

    max_distance: int = 3
    parent: bool = True
    child: bool = True
    sibling: bool = True
    pairwise: bool = False
    full: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_distance, int) or isinstance(self.max_distance, bool):
            raise TypeError("MaskSpec.max_distance must be an int")
        if not 1 <= self.max_distance <= 64:
            raise ValueError(f"MaskSpec.max_distance must be in 1..64, got {self.max_distance}")
        if self.num_masks == 0:
            raise ValueError("MaskSpec enables no mask: turn on at least one of parent/child/sibling/pairwise/full")

    @property
    def relation_kinds(self) -> Tuple[str, ...]:
        """The enabled relation kinds in output order (what the C++ list builder walks)."""
        return tuple(kind for kind, _ in RELATIONS if getattr(self, kind))

    @property
    def num_relations(self) -> int:
        """R: the relation masks (``max_distance`` per enabled kind)."""
        return self.max_distance * len(self.relation_kinds)

    @property
    def dense_kinds(self) -> Tuple[str, ...]:
        """The enabled dense masks in output order: ``("pairwise", "full")``, those enabled."""
        return tuple(kind for kind in DENSE_MASKS if getattr(self, kind))

    def kinds(self) -> List[tuple]:
        """``[(kind, d), ...]`` in output order; kind is one of parent/child/sibling/pairwise/full, d the
        distance (0 for pairwise and full)."""
        first = dict(RELATIONS)
        relations = [(kind, first[kind] + step) for kind in self.relation_kinds for step in range(self.max_distance)]
        return relations + [(kind, 0) for kind in self.dense_kinds]

    @property
    def names(self) -> List[str]:
        return [f"{kind}_{d}" if d else kind for kind, d in self.kinds()]

    @property
    def relation_names(self) -> Tuple[str, ...]:
        """The names of the R relation masks (the first R of ``names``)."""
        return tuple(self.names[:self.num_relations])

    @property
    def num_masks(self) -> int:
        return self.num_relations + len(self.dense_kinds)

    def relation_key(self) -> tuple:
        """What the relation lists of this spec depend on (a batch caches its lists under it): specs that differ
        only in their dense masks share them."""
        return ("relations", self.max_distance, self.relation_kinds)
