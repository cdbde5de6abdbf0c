"""The code-model relations of a :class:`~syntaxkernels.trees.CodeTreeBatch`: several signed relations per token
pair read from the syntax tree's node path (shortest path, ancestor and sibling distances, the steps up and down),
binned, as one :class:`~syntaxkernels.RelationBatch` (:meth:`RelationBatch.code_model
<syntaxkernels.RelationBatch.code_model>`), or as R uint8 distances for the float64 reference
(:func:`code_relation_distances`).

Token i stands at node ``n_i`` (the smallest named node covering its span, :func:`~syntaxkernels.trees.
from_tree_sitter`); a token without a span stands at the root with the plan's ``special="root"`` and has no
relation to any other token with ``special="unreachable"``. The relations of the pair (i, j):

- ``"path"``: the plan's token distance (``edges(n_i, n_j) + 2`` for two different tokens, 0 on the diagonal,
  saturating at 254), binned by ``BucketSpec(max_distance=max_path)`` (or the :class:`~syntaxkernels.BucketSpec`
  given as ``max_path``).
- ``"ancestor"`` (signed): ``n_j`` an ancestor of ``n_i`` or ``n_i`` itself: ``depth(n_i) - depth(n_j) >= 0``
  (steps up); ``n_j`` a descendant of ``n_i``: ``depth(n_i) - depth(n_j) < 0`` (steps down, negative); otherwise no
  relation.
- ``"sibling"`` (signed): ``n_i`` and ``n_j`` children of one node: ``index(n_j) - index(n_i)``, their child indices
  among the parent's kept named children in source order (positive: the key's node comes later); otherwise no
  relation.
- ``"up"`` / ``"down"``: the steps from ``n_i`` up to the lowest common ancestor of ``n_i`` and ``n_j``, and from it
  down to ``n_j`` (``edges(n_i, n_j) = up + down``; an ancestor is ``(k, 0)``, a descendant ``(0, k)``, a sibling
  ``(1, 1)``).

Two tokens of one node (the pieces of one identifier, two special tokens with ``special="root"``) get path 2 and
ancestor 0, sibling 0, up 0, down 0; a token and itself the same with path 0. The root's tokens are their own
siblings at 0 (the root has no parent) and siblings of no other token.

Encoding (the uint8 distance each relation's BucketSpec reads; 255 = no relation, padding): a signed relation
clipped to ``[-m, m]`` is stored as ``s + m`` (``0..2m``) and binned by ``BucketSpec(max_distance=2m)``: ``2m + 2``
buckets (``-m .. m``, then "none"); ``up`` / ``down`` as their steps, binned by ``BucketSpec(max_distance=
max_steps)`` (``max_steps + 2`` buckets). The relations' bucket counts multiply to the codes one byte must hold
(``prod T_r <= 256``). Defaults: ``("path", "ancestor", "sibling")`` with ``max_path=4``, ``max_ancestor=2``,
``max_sibling=2``: three relations of the same ``BucketSpec(max_distance=4)`` (6 buckets each, 216 codes), so one
spec serves all of them (``enable_syntax_attention(model, "bias", buckets=sk.BucketSpec(max_distance=4),
relations=3)``). Four relations: ``("path", "up", "down", "sibling")`` with ``max_steps=1`` (the default) and
``max_sibling=1``: 6 x 3 x 3 x 4 = 216 codes.

How it is built (no O(N^2) Python step): per item, the kept nodes' depths, pre-order subtree ends and child indices
(``O(M)`` Python), the all-pairs node distance by the C++ tree builder when ``path``, ``up`` or ``down`` is asked
(``M^2`` bytes), then the ``[M, M]`` node table of the relations' code (NumPy, in blocks of 512 node rows with
uint8 / int16 temporaries), and the tokens' rows gathered from it in blocks of 1,024 rows straight into the
plan's buffer (``code[i, j] = node_code[n_i, n_j]``, the diagonal and special tokens set after). Measured on this package's own
sources (benchmarks/RESULTS.md, "Code as a structure source"; ``benchmarks/code_trees.py --relations``; a shared
2-core CPU at load 4.6-5.1, medians of 7, beside the ``from_tree_sitter`` call itself): the default three
relations at 2,048 tokens (701 nodes) in 39 ms, at 8,192 tokens (3,805 nodes) in 0.21 s; ``("path", "up", "down",
"sibling")`` in 23 ms and 0.45 s. Memory: the node distance and the node code, ``2 M^2`` bytes (1 MiB / 28 MiB),
beside the result's ``T^2`` bytes (4 MiB / 64 MiB); the 8,192-token build raised the process's peak memory by
91 MiB over the plan's build.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..specs import MAX_PATH, UNREACHABLE, BucketSpec
from .batch import DISTANCE_ALIGNMENT, build_tree_tensors
from .code import CodeTreeBatch, gather_rows

__all__ = ["code_relation_distances", "code_relation_buckets", "CODE_RELATIONS", "DEFAULT_CODE_RELATIONS"]

#: The relations a code model can ask for (module docstring).
CODE_RELATIONS = ("path", "ancestor", "sibling", "up", "down")

#: The default set: shortest path, ancestor and sibling distances.
DEFAULT_CODE_RELATIONS = ("path", "ancestor", "sibling")

#: Node rows of the relations computed at once (bounds the int16 temporaries to ``NODE_BLOCK x M`` elements).
NODE_BLOCK = 512

#: Two nodes' steps up and down are exact while the node tree is at most this deep (their distance below 254).
MAX_STEPS_DEPTH = (MAX_PATH - 2) // 2

_SIGNED = ("ancestor", "sibling")

PathBuckets = Union[int, BucketSpec]


def _clip(name: str, value, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{name} must be an int in 1..{high}, got {value!r}")
    return value


def _setup(relations, max_path, max_ancestor, max_sibling, max_steps, codes: bool = True
           ) -> Tuple[Tuple[str, ...], Dict[str, int], Tuple[BucketSpec, ...]]:
    """``(names, clips, specs)``: the relations asked for, each one's clip and BucketSpec; ``ValueError`` for an
    unknown or repeated name, a bad clip, or (``codes``) more codes than one byte holds."""
    if isinstance(relations, str) or not isinstance(relations, Sequence) or not relations:
        raise ValueError(f"relations must be a non-empty sequence of names from {CODE_RELATIONS}, got "
                         f"{relations!r}")
    names = tuple(relations)
    unknown = [n for n in names if n not in CODE_RELATIONS]
    if unknown:
        raise ValueError(f"unknown code relation {unknown[0]!r}: the relations are {CODE_RELATIONS}")
    if len(set(names)) != len(names):
        raise ValueError(f"relations must not repeat a name, got {names}")
    clips: Dict[str, int] = {}
    specs = []
    for name in names:
        if name == "path":
            if isinstance(max_path, BucketSpec):
                specs.append(max_path)
                continue
            clips[name] = _clip("max_path", max_path, MAX_PATH)
            specs.append(BucketSpec(max_distance=max_path))
        elif name in _SIGNED:
            m = _clip(f"max_{name}", max_ancestor if name == "ancestor" else max_sibling, MAX_PATH // 2)
            clips[name] = m
            specs.append(BucketSpec(max_distance=2 * m))
        else:
            clips[name] = _clip("max_steps", max_steps, MAX_PATH)
            specs.append(BucketSpec(max_distance=max_steps))
    size = int(np.prod([s.num_buckets for s in specs]))
    if codes and size > 256:
        parts = ", ".join(f"{n} {s.num_buckets}" for n, s in zip(names, specs))
        raise ValueError(f"the code relations ({parts} buckets) make {size} codes, more than the 256 one byte holds: "
                         "lower max_path, max_ancestor, max_sibling or max_steps (a signed relation clipped at m has "
                         "2m + 2 buckets, path and up/down max + 2), or ask for fewer relations")
    return names, clips, tuple(specs)


def code_relation_buckets(relations: Sequence[str] = DEFAULT_CODE_RELATIONS, *, max_path: PathBuckets = 4,
                          max_ancestor: int = 2, max_sibling: int = 2, max_steps: int = 1) -> Tuple[BucketSpec, ...]:
    """The R BucketSpecs of the code relations (module docstring), one per name: what a layer or a table is built
    with (``sk.nn.DistanceBias(H, buckets=..., relations=R)``). ``ValueError`` as :meth:`RelationBatch.code_model
    <syntaxkernels.RelationBatch.code_model>`."""
    return _setup(relations, max_path, max_ancestor, max_sibling, max_steps)[2]


def _diagonal_value(name: str, clips: Dict[str, int]) -> int:
    """A relation's value between a token and itself (and, but for ``path``, between two tokens of one node)."""
    return clips[name] if name in _SIGNED else 0


class _Item:
    """One item's kept nodes: parents, depth, pre-order subtree end, child index, node distance (or None)."""

    def __init__(self, b: int, parents: np.ndarray, distance: Optional[np.ndarray], need_steps: bool):
        M = parents.shape[0]
        if M == 0 or parents[0] != -1 or np.any(parents[1:] >= np.arange(1, M)) or np.any(parents[1:] < 0):
            raise ValueError(f"batch item {b}: node_parents must list the nodes in pre-order, the root first")
        par = parents.tolist()
        depth = [0] * M
        for i in range(1, M):  # parents come before their children in pre-order
            depth[i] = depth[par[i]] + 1
        size = [1] * M
        for i in range(M - 1, 0, -1):
            size[par[i]] += size[i]
        self.M = M
        self.parents = parents.astype(np.int32)
        self.depth = np.asarray(depth, dtype=np.int16)
        self.index = np.arange(M, dtype=np.int32)
        self.end = self.index + np.asarray(size, dtype=np.int32)  # node i's subtree: nodes i .. end - 1
        order = np.argsort(parents, kind="stable")  # children of one parent stay in pre-order (source) order
        grouped = parents[order]
        child = np.empty(M, dtype=np.int16)
        child[order] = np.arange(M) - np.searchsorted(grouped, grouped, side="left")
        self.child = child
        self.distance = distance
        if need_steps and int(self.depth.max()) > MAX_STEPS_DEPTH:
            raise ValueError(f"batch item {b}: its syntax tree is {int(self.depth.max())} nodes deep; the steps up "
                             f"and down need exact node distances (a tree at most {MAX_STEPS_DEPTH} deep)")

    def values(self, name: str, clip: int, a0: int, a1: int) -> np.ndarray:
        """uint8 ``[a1 - a0, M]``: relation ``name`` between nodes ``a0 .. a1 - 1`` and every node (encoded)."""
        if name == "path":
            v = np.minimum(self.distance[a0:a1], MAX_PATH - 2)
            return np.add(v, 2, out=v)  # the two leaf edges of two different tokens
        if name == "sibling":
            mine = self.parents[a0:a1, None]
            same = (mine == self.parents[None, :]) & (mine >= 0)
            step = self.child[None, :] - self.child[a0:a1, None]
            np.clip(step, -clip, clip, out=step)
            v = np.where(same, (step + clip).astype(np.uint8), np.uint8(UNREACHABLE))
            if a0 == 0:
                v[0, 0] = clip  # the root and itself
            return v
        rise = self.depth[a0:a1, None] - self.depth[None, :]  # depth(n_i) - depth(n_j), int16
        if name == "ancestor":
            row = self.index[a0:a1, None]
            col = self.index[None, :]
            related = (col <= row) & (row < self.end[None, :])  # n_j an ancestor of n_i (or itself)
            related |= (row <= col) & (col < self.end[a0:a1, None])  # or a descendant
            np.clip(rise, -clip, clip, out=rise)
            return np.where(related, (rise + clip).astype(np.uint8), np.uint8(UNREACHABLE))
        d = self.distance[a0:a1].astype(np.int16)  # exact: the tree is at most MAX_STEPS_DEPTH deep
        return (((d + rise) if name == "up" else (d - rise)) // 2).astype(np.uint8)


def _items(code: CodeTreeBatch, names, num_threads: int) -> List[_Item]:
    parents = [p.detach().cpu().numpy().astype(np.int64) for p in code.node_parents]
    distance = None
    if any(n in ("path", "up", "down") for n in names) and parents:
        _, _, distance, _, _ = build_tree_tensors([p.tolist() for p in parents], num_threads=num_threads)
        distance = distance.numpy()
    need_steps = "up" in names or "down" in names
    return [_Item(b, p, None if distance is None else distance[b, :p.shape[0], :p.shape[0]], need_steps)
            for b, p in enumerate(parents)]


def _node_table(item: _Item, names, clips, luts=None) -> List[np.ndarray]:
    """The node tables: one uint8 ``[M, M]`` per relation (``luts`` None), or the one table of their code."""
    M = item.M
    tables = [np.empty((M, M), dtype=np.uint8) for _ in (names if luts is None else [0])]
    for a0 in range(0, M, NODE_BLOCK):
        a1 = min(M, a0 + NODE_BLOCK)
        if luts is None:
            for r, name in enumerate(names):
                tables[r][a0:a1] = item.values(name, clips.get(name, 0), a0, a1)
            continue
        code = tables[0][a0:a1]
        for r, (name, lut) in enumerate(zip(names, luts)):  # each lut: bucket x stride, uint8 (the sum < 256)
            if r == 0:
                np.take(lut, item.values(name, clips.get(name, 0), a0, a1), out=code)
            else:
                code += np.take(lut, item.values(name, clips.get(name, 0), a0, a1))
    return tables


def _fill(out: torch.Tensor, table: np.ndarray, token_node: np.ndarray, special: str, diagonal: int,
          lone: int) -> None:
    """``out`` (uint8 ``[n, n]``, rows of any stride) = ``table[n_i, n_j]``; the diagonal ``diagonal``; with
    ``special="unreachable"`` the rows and columns of tokens without a node ``lone``."""
    if out.shape[0] == 0:
        return
    gather_rows(out.numpy(), table, np.maximum(token_node, 0))  # a special token stands at the root (node 0)
    if special == "unreachable":
        alone = torch.from_numpy(np.flatnonzero(token_node < 0))
        if alone.numel():
            out[alone] = lone
            out[:, alone] = lone
    out.diagonal().fill_(diagonal)


def _token_nodes(code: CodeTreeBatch) -> List[np.ndarray]:
    nodes = code.token_nodes.detach().cpu()
    counts = code.lengths.cpu().tolist()
    if code.is_packed:
        cu = code.cu_seqlens.cpu().tolist()
        return [nodes[cu[b]:cu[b + 1]].numpy() for b in range(len(counts))]
    return [nodes[b, :n].numpy() for b, n in enumerate(counts)]


def _check_plan(code) -> None:
    if not isinstance(code, CodeTreeBatch):
        raise TypeError(f"the code relations take a CodeTreeBatch (sk.trees.from_tree_sitter), got "
                        f"{type(code).__name__}")


def _outputs(code: CodeTreeBatch, count: int, fill: int) -> List[torch.Tensor]:
    """``count`` uint8 buffers shaped as the plan's distance, filled with ``fill`` (padding): packed ``[sum n^2]``,
    padded ``[B, N, N]`` with 16-byte aligned rows."""
    if code.is_packed:
        return [torch.empty(code.distance.shape, dtype=torch.uint8) for _ in range(count)]
    B, N = code.distance.shape[0], code.distance.shape[-1]
    rounded = -(-N // DISTANCE_ALIGNMENT) * DISTANCE_ALIGNMENT
    return [torch.full((B, rounded, rounded), fill, dtype=torch.uint8)[:, :N, :N] for _ in range(count)]


def _blocks(code: CodeTreeBatch, out: torch.Tensor, counts: List[int]) -> List[torch.Tensor]:
    """Each item's ``[n, n]`` block of ``out``."""
    if code.is_packed:
        offsets = code.distance_offsets.cpu().tolist()
        return [out[offsets[b]:offsets[b] + n * n].view(n, n) for b, n in enumerate(counts)]
    return [out[b, :n, :n] for b, n in enumerate(counts)]


def code_relation_distances(code: CodeTreeBatch, relations: Sequence[str] = DEFAULT_CODE_RELATIONS, *,
                            max_path: PathBuckets = 4, max_ancestor: int = 2, max_sibling: int = 2,
                            max_steps: int = 1, num_threads: int = 0
                            ) -> Tuple[List[torch.Tensor], Tuple[BucketSpec, ...]]:
    """The code relations (module docstring) as R uint8 distances and their BucketSpecs: what the float64 reference
    takes (``sk.reference.syntax_bias_attention(q, k, v, torch.stack(distances, 1), tables, buckets=specs,
    lengths=...)`` for a padded batch) and what :meth:`RelationBatch.code_model
    <syntaxkernels.RelationBatch.code_model>` stores as one code. ``R T^2`` bytes: for inspection and checks.
    Arguments and errors as ``code_model``'s, but for the limit of 256 codes (the distances are not one code).

    Returns:
        ``(distances, buckets)``: R uint8 tensors shaped as ``code.distance`` (padded ``[B, N, N]``, 255 on padding;
        packed ``[sum T_b^2]``), on the CPU, and the R :class:`~syntaxkernels.BucketSpec`.
    """
    _check_plan(code)
    names, clips, specs = _setup(relations, max_path, max_ancestor, max_sibling, max_steps, codes=False)
    counts = code.lengths.cpu().tolist()
    outs = _outputs(code, len(names), UNREACHABLE)
    for item, token_node, blocks in zip(_items(code, names, num_threads), _token_nodes(code),
                                        zip(*[_blocks(code, o, counts) for o in outs])):
        for r, table in enumerate(_node_table(item, names, clips)):
            _fill(blocks[r], table, token_node, code.special, _diagonal_value(names[r], clips), UNREACHABLE)
    return outs, specs


def code_model_relations(code: CodeTreeBatch, relations: Sequence[str] = DEFAULT_CODE_RELATIONS, *,
                         max_path: PathBuckets = 4, max_ancestor: int = 2, max_sibling: int = 2, max_steps: int = 1,
                         num_threads: int = 0):
    """:meth:`RelationBatch.code_model <syntaxkernels.RelationBatch.code_model>` (its docstring)."""
    from .relations import RelationBatch, code_buckets

    _check_plan(code)
    names, clips, specs = _setup(relations, max_path, max_ancestor, max_sibling, max_steps)
    strides = [int(np.prod([s.num_buckets for s in specs[:r]])) for r in range(len(specs))]
    luts = [(s.lut().numpy() * stride).astype(np.uint8) for s, stride in zip(specs, strides)]

    def code_of(values) -> int:
        return int(sum(int(lut[v]) for lut, v in zip(luts, values)))

    diagonal = code_of([_diagonal_value(n, clips) for n in names])
    lone = code_of([UNREACHABLE] * len(names))  # no relation (and padding) in every relation
    counts = code.lengths.cpu().tolist()
    (out,) = _outputs(code, 1, lone)
    for item, token_node, block in zip(_items(code, names, num_threads), _token_nodes(code),
                                       _blocks(code, out, counts)):
        (table,) = _node_table(item, names, clips, luts)
        _fill(block, table, token_node, code.special, diagonal, lone)
    table = code_buckets(specs)
    symmetric = names == ("path",)
    lengths = code.lengths.cpu()
    if code.is_packed:
        built = RelationBatch(out, buckets=specs, code_buckets=table, lengths=lengths, symmetric=symmetric,
                              cu_seqlens=code.cu_seqlens.cpu(), sequence=code.sequence.cpu(),
                              distance_offsets=code.distance_offsets.cpu(), max_seqlen=code.max_seqlen)
    else:
        built = RelationBatch(out, buckets=specs, code_buckets=table, lengths=lengths, symmetric=symmetric,
                              kernel_lengths=code.kernel_lengths.cpu())
    return built if code.device.type == "cpu" else built.to(code.device)
