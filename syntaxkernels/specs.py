"""Bucket and mask specifications: how tree distances become table indices and Syntax-BERT masks.

``BucketSpec`` maps each of the 256 uint8 distance values (0..254 = path length, 255 = unreachable) to a
bias-table index through a 256-entry lookup table (LUT). ``MaskSpec`` chooses which Syntax-BERT relation
masks a sub-network layer uses and fixes their output order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

UNREACHABLE = 255
MAX_PATH = 254

__all__ = ["BucketSpec", "MaskSpec", "UNREACHABLE", "MAX_PATH"]


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
class MaskSpec:
    """Which Syntax-BERT relation masks a sub-network attention uses, and their order.

    For query token i and key token j (docs/semantics.md, "Syntax-BERT masks"):

    - ``parent_d``  (d = 1..max_distance): i is an ancestor of j at tree distance d;
    - ``child_d``   (d = 1..max_distance): i is a descendant of j at tree distance d;
    - ``sibling_d`` (d = 2..max_distance+1): same tree, neither an ancestor of the other, distance d;
    - ``pairwise``: i and j are in different trees (segments);
    - ``full``: every valid key.

    ``names`` lists them in output order; ``num_masks`` is their count M.
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
    def names(self) -> List[str]:
        out: List[str] = []
        r = range(1, self.max_distance + 1)
        if self.parent:
            out += [f"parent_{d}" for d in r]
        if self.child:
            out += [f"child_{d}" for d in r]
        if self.sibling:
            out += [f"sibling_{d + 1}" for d in r]
        if self.pairwise:
            out.append("pairwise")
        if self.full:
            out.append("full")
        return out

    @property
    def num_masks(self) -> int:
        d = self.max_distance
        return d * (int(self.parent) + int(self.child) + int(self.sibling)) + int(self.pairwise) + int(self.full)

    def kinds(self) -> List[tuple]:
        """``[(kind, d), ...]`` in output order; kind is one of parent/child/sibling/pairwise/full, d the
        distance (0 for pairwise and full)."""
        out = []
        for name in self.names:
            if "_" in name:
                kind, d = name.split("_")
                out.append((kind, int(d)))
            else:
                out.append((name, 0))
        return out
