"""Several relations per score: R structures of one batch (two parses of each sentence, a tree and a coreference
graph, the directed steps up and down a tree, a code model's ancestor / sibling / path distances) as one plan.

Each relation r has its own distance (uint8, 255 = unreachable, as trees and graphs) and its own
:class:`~syntaxkernels.BucketSpec` (``T_r`` buckets), and adds its own learnable table to the score::

    s_ij = q_i . k_j * scale + sum_r c_r * table_r[bucket_r(d_r[i, j])]

:class:`RelationBatch` stores the R distances as **one** uint8 code per pair, the mixed-radix number of the R buckets
(``code = sum_r bucket_r(d_r) * stride_r``, ``stride_0 = 1``, ``stride_r = T_0 ... T_{r-1}``), which needs
``T_0 * ... * T_{R-1} <= 256``: two parses with the default buckets (12 each: 144 codes), three relations of 6
buckets, a code model's relations of a :class:`~syntaxkernels.trees.CodeTreeBatch` (:meth:`RelationBatch.code_model`:
path, ancestor and sibling distances of 6 buckets each, 216 codes). The fused kernels then read one byte per
pair whatever R is, and look the summed bias up per code: the op gathers the R tables into one code table
``[H or 1, 256]`` (``code_table[code] = sum_r c_r * table_r[bucket_r(code)]``, a few hundred elements, once per call)
and runs the distance-bias kernels with one bucket per code value (:data:`CODE_BUCKETS`); autograd takes the code
table's gradient (the kernels' deterministic per-bucket sums of dS) back to each relation's table and strength.
So every path the distance-bias op has (Triton padded, short rows, packed; C++ padded and packed; the reference)
takes several relations, with no relation-specific kernel: one more relation costs the forward nothing per score
element. What it costs is the table gradient's walk over the codes a tile holds (up to ``prod T_r`` buckets instead
of one relation's ``T``) on the Triton path.

The plan is a producer like :class:`~syntaxkernels.GraphBatch`: build it once where the batch is made
(:meth:`RelationBatch.from_plans` of a TreeBatch, a GraphBatch, ... or :meth:`RelationBatch.from_distances` of bare
distances) and pass it to every layer. A relation's distance need not be symmetric (a directed graph, the steps
up a tree): the plan is symmetric only when every relation is, and the backward reads a transposed copy otherwise.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from ..plan import ItemPlan, StructurePlan, structure_plan
from ..specs import BucketSpec, MAX_PATH

__all__ = ["RelationBatch", "CODE_BUCKETS", "relation_codes", "code_buckets"]

#: The bucket spec the kernels run a relation batch with: one bucket per code value 0..255.
CODE_BUCKETS = BucketSpec(max_distance=MAX_PATH)

#: How many codes one byte holds.
NUM_CODES = 256

BucketsLike = Union[BucketSpec, Sequence[BucketSpec]]


def _specs(buckets: BucketsLike, R: int) -> Tuple[BucketSpec, ...]:
    if isinstance(buckets, BucketSpec):
        return (buckets,) * R
    specs = tuple(buckets)
    if len(specs) != R or not all(isinstance(s, BucketSpec) for s in specs):
        raise ValueError(f"buckets must be a BucketSpec or a sequence of {R} BucketSpecs (one per relation), got "
                         f"{buckets!r}")
    return specs


def _check_code_space(specs: Tuple[BucketSpec, ...]) -> Tuple[int, ...]:
    """The strides of the mixed-radix code; ``ValueError`` when the R relations' buckets do not fit one byte."""
    if not specs:
        raise ValueError("a relation batch needs at least one relation")
    strides, size = [], 1
    for spec in specs:
        strides.append(size)
        size *= spec.num_buckets
    if size > NUM_CODES:
        sizes = " x ".join(str(s.num_buckets) for s in specs)
        raise ValueError(f"{len(specs)} relations with {sizes} buckets make {size} codes, more than the {NUM_CODES} "
                         "one byte holds: give the relations fewer buckets (BucketSpec(max_distance=..., "
                         "unreachable_bucket=False) or log_distance)")
    return tuple(strides)


def code_buckets(buckets: Sequence[BucketSpec], device=None) -> torch.Tensor:
    """int64 ``[R, 256]``: the bucket of relation r that each code value holds (codes past ``prod T_r`` never occur;
    they read bucket 0)."""
    specs = tuple(buckets)
    strides = _check_code_space(specs)
    codes = torch.arange(NUM_CODES, device=device)
    rows = [(codes // stride) % spec.num_buckets for spec, stride in zip(specs, strides)]
    size = strides[-1] * specs[-1].num_buckets
    return torch.stack(rows).masked_fill(codes[None] >= size, 0)


def relation_codes(distances: Sequence[torch.Tensor], buckets: BucketsLike) -> torch.Tensor:
    """uint8: the mixed-radix code of the R relations' buckets at every pair (same shape as each distance).

    Args:
        distances: R uint8 tensors of one shape (padded ``[B, N, N]`` or packed ``[sum n_s^2]``).
        buckets: one :class:`~syntaxkernels.BucketSpec` for every relation, or one per relation.
    """
    distances = list(distances)
    specs = _specs(buckets, len(distances))
    strides = _check_code_space(specs)
    first = distances[0]
    code = torch.zeros(first.shape, dtype=torch.int32, device=first.device)
    for r, (d, spec, stride) in enumerate(zip(distances, specs, strides)):
        if not isinstance(d, torch.Tensor) or d.dtype != torch.uint8:
            raise ValueError(f"relation {r}: the distance must be a uint8 tensor, got "
                             f"{getattr(d, 'dtype', type(d).__name__)}")
        if d.shape != first.shape or d.device != first.device:
            raise ValueError(f"relation {r}: distance {tuple(d.shape)} on {d.device} does not match relation 0's "
                             f"{tuple(first.shape)} on {first.device}")
        code += spec.lut(d.device)[d.long()].to(torch.int32) * stride
    return code.to(torch.uint8)


class RelationBatch(ItemPlan):
    """R relations of one batch as one structure plan (module docstring): the distance the kernels read is the
    relations' code, uint8 ``[B, N, N]`` (padded) or ``[sum n_s^2]`` (packed).

    Attributes:
        buckets: the R :class:`~syntaxkernels.BucketSpec` (relation r has ``buckets[r].num_buckets`` table entries).
        code_buckets: int64 ``[R, 256]``: relation r's bucket of each code value (:func:`code_buckets`).
        lengths: int64 ``[B]`` / ``[S]``: each item's tokens.
        distance, kernel_lengths (padded) or cu_seqlens, sequence, distance_offsets, max_seqlen (packed), symmetric:
            the plan's (:class:`~syntaxkernels.plan.StructurePlan`).
    """

    def __init__(self, distance: torch.Tensor, *, buckets: Sequence[BucketSpec], code_buckets: torch.Tensor,
                 lengths: torch.Tensor, symmetric: bool, kernel_lengths: Optional[torch.Tensor] = None,
                 cu_seqlens: Optional[torch.Tensor] = None, sequence: Optional[torch.Tensor] = None,
                 distance_offsets: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
        self.buckets = tuple(buckets)
        self.code_buckets = code_buckets
        self.lengths = lengths
        super().__init__(distance, symmetric=symmetric, kernel_lengths=kernel_lengths, cu_seqlens=cu_seqlens,
                         sequence=sequence, distance_offsets=distance_offsets, max_seqlen=max_seqlen)

    @property
    def num_relations(self) -> int:
        """R."""
        return len(self.buckets)

    @classmethod
    def from_plans(cls, plans: Sequence[StructurePlan], buckets: BucketsLike = BucketSpec()) -> "RelationBatch":
        """The relations of R plans of the same batch (each a :class:`~syntaxkernels.TreeBatch`, a
        :class:`~syntaxkernels.GraphBatch`, a :class:`~syntaxkernels.PackedTreeBatch`, ...): all padded with the same
        ``[B, N, N]`` and lengths, or all packed with the same ``cu_seqlens``. ``buckets``: one spec for every
        relation or one per relation (``prod T_r <= 256``)."""
        plans = list(plans)
        if not plans or not all(isinstance(p, StructurePlan) for p in plans):
            raise TypeError("from_plans takes a non-empty sequence of structure plans (TreeBatch, GraphBatch, ...)")
        first = plans[0]
        for r, plan in enumerate(plans[1:], 1):
            if plan.is_packed != first.is_packed:
                raise ValueError(f"relation {r}: a {'packed' if plan.is_packed else 'padded'} plan among "
                                 f"{'packed' if first.is_packed else 'padded'} ones")
            if plan.distance.shape != first.distance.shape:
                raise ValueError(f"relation {r}: distance {tuple(plan.distance.shape)} does not match relation 0's "
                                 f"{tuple(first.distance.shape)} (one batch, the same tokens)")
            mine, theirs = ((plan.cu_seqlens, first.cu_seqlens) if first.is_packed
                            else (plan.kernel_lengths, first.kernel_lengths))
            if not torch.equal(mine.cpu(), theirs.cpu()):
                raise ValueError(f"relation {r}: its {'cu_seqlens' if first.is_packed else 'lengths'} differ from "
                                 f"relation 0's (one batch, the same items)")
        specs = _specs(buckets, len(plans))
        code = relation_codes([p.distance for p in plans], specs)
        symmetric = all(p.symmetric for p in plans)
        table = code_buckets(specs, code.device)
        if first.is_packed:
            cu = first.cu_seqlens
            return cls(code, buckets=specs, code_buckets=table, lengths=(cu[1:] - cu[:-1]).to(torch.int64),
                       symmetric=symmetric, cu_seqlens=cu, sequence=first.sequence,
                       distance_offsets=first.distance_offsets, max_seqlen=first.max_seqlen)
        from .batch import aligned_distance

        return cls(aligned_distance(code), buckets=specs, code_buckets=table,
                   lengths=first.kernel_lengths.to(torch.int64), symmetric=symmetric,
                   kernel_lengths=first.kernel_lengths)

    @classmethod
    def from_distances(cls, distances, buckets: BucketsLike = BucketSpec(), lengths=None, *,
                       symmetric: Optional[bool] = None) -> "RelationBatch":
        """The relations of bare padded distances: uint8 ``[B, R, N, N]``, or a sequence of R uint8 ``[B, N, N]``.
        ``lengths``: int ``[B]`` or a boolean key-padding mask ``[B, N]`` (None: every item N tokens);
        ``symmetric``: whether every relation is symmetric (None: only what the package built is known to be, as
        :func:`~syntaxkernels.plan.structure_plan` decides per relation)."""
        if isinstance(distances, torch.Tensor):
            if distances.dim() != 4:
                raise ValueError(f"distances must be uint8 [B, R, N, N] or a sequence of [B, N, N], got "
                                 f"{tuple(distances.shape)}")
            distances = list(distances.unbind(1))
        plans = [structure_plan(d, lengths, symmetric=symmetric) for d in distances]
        return cls.from_plans(plans, buckets)

    @classmethod
    def directed_tree(cls, trees, max_steps: int = 7) -> "RelationBatch":
        """The directed tree distance of a :class:`~syntaxkernels.TreeBatch` (padded) as two relations: the steps up
        from the query token to the lowest common ancestor, and the steps down from there to the key token, each
        clipped at ``max_steps`` (``BucketSpec(max_distance=max_steps)``, 255 = another tree or padding in both), so
        that "my head" (1 up, 0 down) and "my dependent" (0 up, 1 down) get different biases. ``max_steps`` at most
        14 (``(max_steps + 2)^2 <= 256`` codes). Not symmetric (up and down swap under transposition).
        ``ValueError`` naming the item when a path reaches 254 edges (the steps need exact distances)."""
        from .batch import TreeBatch

        if not isinstance(trees, TreeBatch):
            raise TypeError(f"directed_tree takes a padded TreeBatch, got {type(trees).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= 14:
            raise ValueError(f"max_steps must be an int in 1..14, got {max_steps!r}")
        d = trees.distance.to(torch.int32)
        saturated = (d == MAX_PATH).flatten(1).any(1)
        if bool(saturated.any()):
            b = int(saturated.nonzero()[0, 0])
            raise ValueError(f"directed_tree: batch item {b} has a path of {MAX_PATH} edges or more; the steps up and "
                             "down need exact distances")
        depth = trees.depth.to(torch.int32)
        reachable = d != 255
        rise = depth[:, :, None] - depth[:, None, :]  # up - down
        up = torch.where(reachable, (d + rise) // 2, 255).to(torch.uint8)
        down = torch.where(reachable, (d - rise) // 2, 255).to(torch.uint8)
        spec = BucketSpec(max_distance=max_steps)
        plans = [structure_plan(x, trees.kernel_lengths, symmetric=False) for x in (up, down)]
        return cls.from_plans(plans, spec)

    @classmethod
    def code_model(cls, code, relations: Sequence[str] = ("path", "ancestor", "sibling"), *, max_path=4,
                   max_ancestor: int = 2, max_sibling: int = 2, max_steps: int = 1,
                   num_threads: int = 0) -> "RelationBatch":
        """A code model's relations of a :class:`~syntaxkernels.trees.CodeTreeBatch` (``sk.trees.from_tree_sitter``,
        padded or packed), each token pair's relations read from its tokens' nodes n_i, n_j
        (:mod:`syntaxkernels.trees.code_relations`):

        - ``"path"``: the plan's token distance (``edges + 2``, 0 on the diagonal), ``BucketSpec(max_distance=
          max_path)`` (or ``max_path`` a BucketSpec, e.g. log-spaced);
        - ``"ancestor"`` (signed): ``depth(n_i) - depth(n_j)`` when n_j is an ancestor-or-self of n_i (steps up,
          >= 0) or a descendant (steps down, < 0), clipped to ``[-max_ancestor, max_ancestor]``, else no relation;
        - ``"sibling"`` (signed): ``index(n_j) - index(n_i)`` when n_i and n_j are children of one node (child
          indices among the parent's kept named children, source order), clipped to ``[-max_sibling, max_sibling]``,
          else no relation;
        - ``"up"`` / ``"down"``: steps from n_i up to the lowest common ancestor and from it down to n_j, clipped
          at ``max_steps``.

        Two tokens of one node: ancestor, sibling, up, down all 0 (path 2); a token and itself: all 0. Tokens
        without a span follow the plan's ``special``: at the root (``"root"``) or no relation to any other token
        (``"unreachable"``). A signed relation clipped at m has ``2m + 2`` buckets (``-m .. m``, none: stored as
        ``s + m``, 255), path and up/down ``max + 2``; the counts multiply to at most 256 codes. Defaults: path,
        ancestor, sibling with one ``BucketSpec(max_distance=4)`` (6 x 6 x 6 = 216 codes); four relations:
        ``("path", "up", "down", "sibling")`` with ``max_sibling=1`` (6 x 3 x 3 x 4 = 216). Not symmetric (but for
        path alone). Built at node level (``[M, M]``, NumPy) and gathered to the tokens in row blocks straight
        into the code: no ``O(N^2)`` Python step, ``T^2 + 2 M^2`` bytes.
        :func:`sk.trees.code_relation_distances <syntaxkernels.trees.code_relation_distances>` gives the same
        relations as R uint8 distances (the float64 reference's input).

        Raises:
            TypeError for a plan that is not a CodeTreeBatch; ValueError for an unknown or repeated relation, a clip
            that is not an int >= 1, more than 256 codes (naming each relation's buckets), or (``up``/``down``) a
            syntax tree deeper than 126 nodes (naming the batch item).
        """
        from .code_relations import code_model_relations

        return code_model_relations(code, relations, max_path=max_path, max_ancestor=max_ancestor,
                                    max_sibling=max_sibling, max_steps=max_steps, num_threads=num_threads)

    def code_table(self, tables, bias_scale=None) -> torch.Tensor:
        """The summed bias of every code, ``[256]`` (every relation's table shared by the heads) or ``[H, 256]``:
        ``code_table[..., code] = sum_r c_r * tables[r][..., bucket_r(code)]``; differentiable in the tables and
        strengths (their gradients come from the code table's).

        Args:
            tables: ``[R, T]`` or ``[R, H, T]`` (every relation with T buckets), or a sequence of R tables ``[T_r]`` /
                ``[H, T_r]``.
            bias_scale: None (1), a float, or a tensor of 1 or R elements (one strength per relation).
        """
        R = self.num_relations
        if isinstance(tables, torch.Tensor):
            if tables.dim() not in (2, 3) or tables.shape[0] != R:
                raise ValueError(f"the table of {R} relations must be [R, T] or [R, H, T] with R = {R}, got "
                                 f"{tuple(tables.shape)}")
            tables = list(tables.unbind(0))
        tables = list(tables)
        if len(tables) != R:
            raise ValueError(f"{len(tables)} tables for {R} relations")
        per_head = {t.dim() for t in tables}
        if not per_head <= {1, 2} or len(per_head) != 1 or len({t.shape[:-1] for t in tables}) != 1:
            raise ValueError("the relations' tables must all be [T_r] (shared by the heads) or all [H, T_r], got "
                             f"{[tuple(t.shape) for t in tables]}")
        for r, (t, spec) in enumerate(zip(tables, self.buckets)):
            if t.shape[-1] != spec.num_buckets:
                raise ValueError(f"relation {r}: its table has {t.shape[-1]} entries, its BucketSpec "
                                 f"{spec.num_buckets} buckets")
        scales = None
        if isinstance(bias_scale, torch.Tensor):
            if bias_scale.numel() not in (1, R):
                raise ValueError(f"bias_scale must have 1 or R = {R} elements, got {bias_scale.numel()}")
            scales = bias_scale.reshape(-1).expand(R) if bias_scale.numel() == 1 else bias_scale.reshape(-1)
        elif bias_scale is not None:
            scales = [float(bias_scale)] * R
        lut = self.code_buckets.to(tables[0].device)
        total = None
        for r, t in enumerate(tables):
            term = t[..., lut[r]]
            if scales is not None:
                term = term * scales[r]
            total = term if total is None else total + term
        return total

    def index_select(self, index) -> "RelationBatch":
        """The items ``index`` (int64 ``[B']`` or a list of item numbers, repeats allowed) of a padded batch as a new
        ``RelationBatch [B', N]`` (derived entries not carried). ``ValueError`` for a packed batch, an index that is
        not 1-D or (on the host) out of range; ``TypeError`` for a non-integer one."""
        from .batch import _map_distance, item_index

        if self.is_packed:
            raise ValueError("index_select takes a padded RelationBatch (a packed batch's items are sequences of "
                             "one row)")
        index = item_index(index, self.num_items, self.device)

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, index.to(t.device))

        return RelationBatch(_map_distance(pick, self.distance), buckets=self.buckets, code_buckets=self.code_buckets,
                             lengths=pick(self.lengths), symmetric=self.symmetric,
                             kernel_lengths=pick(self.kernel_lengths))

    def repeat_interleave(self, repeats: int) -> "RelationBatch":
        """Each item ``repeats`` times in a row, as ``Tensor.repeat_interleave(repeats, dim=0)`` (``generate``'s
        expansion for beam search). ``ValueError`` unless ``repeats`` is an int >= 1."""
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
        return self.index_select(torch.arange(self.num_items).repeat_interleave(repeats))

    def _copied_from(self, other: "RelationBatch", non_blocking: bool) -> None:
        if self.buckets != other.buckets:
            raise ValueError("copy_: the two relation batches bucket their relations differently")
        self.lengths.copy_(other.lengths, non_blocking=non_blocking)

    def _map(self, fn) -> "RelationBatch":
        from .batch import _map_distance

        def opt(t):
            return None if t is None else fn(t)
        distance = fn(self.distance) if self.is_packed else _map_distance(fn, self.distance)
        moved = RelationBatch(distance, buckets=self.buckets, code_buckets=fn(self.code_buckets),
                              lengths=fn(self.lengths), symmetric=self.symmetric,
                              kernel_lengths=opt(self.kernel_lengths), cu_seqlens=opt(self.cu_seqlens),
                              sequence=opt(self.sequence), distance_offsets=opt(self.distance_offsets),
                              max_seqlen=self.max_seqlen)
        return self._carry_derived(moved, fn)

    def __repr__(self) -> str:
        kind = "packed" if self.is_packed else "padded"
        return (f"RelationBatch({kind}, items={self.num_items}, relations={self.num_relations}, "
                f"symmetric={self.symmetric}, distance={tuple(self.distance.shape)}, derived={len(self._derived)}, "
                f"device={self.device})")
