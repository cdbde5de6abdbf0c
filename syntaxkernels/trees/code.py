"""Code as a structure source: a tree-sitter syntax tree mapped onto a tokenizer's tokens, and its plan.

:func:`from_tree_sitter` parses source code with tree-sitter (the ``tree-sitter`` package and a grammar: the
``tree-sitter-python`` package for ``language="python"``, ``tree-sitter-language-pack`` for other names, or a
``tree_sitter.Language`` / ``Parser`` of any grammar) and attaches every token to the **smallest named node
covering its span** (the deepest one where a chain of nodes covers the same bytes: ``expression_statement`` over
``call`` gives ``call``; a span no named node covers goes to the root). The distance between two tokens is the
number of edges between them in the syntax tree of named nodes with every token a leaf child of its node:

- ``distance[i, j] = edges(node_i, node_j) + 2`` for two different tokens (1 edge up from each token to its node),
  so two tokens of one node (``foo`` and ``_bar`` of the identifier ``foo_bar``) are 2 apart, and a keyword
  attached to its statement is 3 from a token of one of the statement's direct named children;
- 0 on the diagonal, saturating at 254; 255 on padding rows and columns, as for trees.

Tokens without a span (start == end: a tokenizer's special tokens, ``(0, 0)`` in a fast tokenizer's
``offset_mapping``) get no node: with ``special="root"`` (the default) each is a leaf child of the root node (2 from
a token attached to the root, ``depth + 2`` from one attached to a node at depth ``depth``; 2 between two special
tokens), with ``special="unreachable"`` 255 to every other token (0 on its diagonal). Anonymous tree-sitter nodes
(keywords, punctuation) are not nodes here: a token inside one belongs to its smallest named ancestor.

How it is built (no O(N^2) Python step): one walk over the syntax tree in Python (``O(nodes)``), the attachment by a
vectorised search over the nodes' byte ranges (``O(T log nodes)`` plus one NumPy pass per tree level), the
all-pairs distance of the M named nodes that hold a token or lie above one by the C++ tree builder
(``sk.tree_distance``'s, ``M^2`` bytes, threads over the batch, GIL released), and the tokens' rows gathered from it
in blocks of rows (``np.take``, straight into the plan's buffer: ``distance[i, j] = node_distance[node_i, node_j] +
2``). Measured on this package's own sources (benchmarks/RESULTS.md, "Code as a structure source"; a shared 2-core
CPU at load 4.6-4.8): 2,048 tokens (733 nodes) in 15 ms, 8,192 tokens (3,853 nodes) in 0.21 s (medians of 7); the
node distance is 0.5 MiB / 14.2 MiB beside the result's ``T^2`` bytes (4 MiB / 64 MiB), and the 8,192-token build
raised the process's peak memory by 105 MiB.

The code-model relations of the node path (shortest path, signed ancestor and sibling distances, the steps up and
down, binned, several per token pair) are built from this plan by ``sk.RelationBatch.code_model(plan, ...)`` (and
``sk.trees.code_relation_distances`` for the reference): :mod:`syntaxkernels.trees.code_relations`. The plan's
sub-network relations (parent_d, child_d, sibling_d of
a ``MaskSpec``) are tree relations over tokens and are refused (:attr:`CodeTreeBatch.relations_refused`).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from ..plan import ItemPlan
from ..specs import MAX_PATH, UNREACHABLE
from .batch import DISTANCE_ALIGNMENT, _map_distance, build_tree_tensors

__all__ = ["from_tree_sitter", "CodeTreeBatch", "syntax_nodes", "attach_tokens"]

#: Rows of the token distance gathered at once (bounds the temporary to ``ROW_BLOCK x M`` bytes).
ROW_BLOCK = 1024


def _round_up(n: int) -> int:
    return -(-n // DISTANCE_ALIGNMENT) * DISTANCE_ALIGNMENT


def _parser(language):
    """A ``tree_sitter.Parser`` for ``language``: a name, a ``tree_sitter.Language`` or a ``Parser``."""
    try:
        import tree_sitter
    except ImportError:
        raise ImportError("from_tree_sitter needs the tree-sitter package and a grammar: pip install tree-sitter "
                          "tree-sitter-python (or tree-sitter-language-pack for other languages)") from None
    if isinstance(language, tree_sitter.Parser):
        return language
    if isinstance(language, tree_sitter.Language):
        return tree_sitter.Parser(language)
    if not isinstance(language, str):
        raise TypeError(f"language must be a name, a tree_sitter.Language or a tree_sitter.Parser, got "
                        f"{type(language).__name__}")
    if language == "python":
        try:
            import tree_sitter_python
        except ImportError:
            tree_sitter_python = None
        if tree_sitter_python is not None:
            return tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))
    try:
        from tree_sitter_language_pack import get_parser
    except ImportError:
        raise ImportError(f"no tree-sitter grammar for {language!r}: pip install tree-sitter-{language} and pass "
                          f"tree_sitter.Language(tree_sitter_{language}.language()), or pip install "
                          "tree-sitter-language-pack") from None
    return get_parser(language)


def syntax_nodes(tree) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[str]]:
    """The named nodes of a tree-sitter ``Tree`` in pre-order, the root first (kept even when not named):
    ``(start int64 [K], end int64 [K], parent int64 [K], types)``, byte offsets, ``parent`` the nearest named
    ancestor's index (-1 for the root). One walk with a tree cursor, ``O(nodes)``."""
    starts: List[int] = []
    ends: List[int] = []
    parents: List[int] = []
    types: List[str] = []
    cursor = tree.walk()
    owner = [-1]  # the named node that owns the children of each cursor level
    while True:
        node = cursor.node
        up = owner[-1]
        if node.is_named or up < 0:
            me = len(starts)
            starts.append(node.start_byte)
            ends.append(node.end_byte)
            parents.append(up)
            types.append(node.type)
        else:
            me = up
        if cursor.goto_first_child():
            owner.append(me)
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                        np.asarray(parents, dtype=np.int64), types)
            owner.pop()


def attach_tokens(starts: np.ndarray, ends: np.ndarray, parents: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """int64 ``[T]``: each span's smallest covering node (the deepest), -1 for an empty span (start == end).

    ``starts``, ``ends``, ``parents``: :func:`syntax_nodes`' (pre-order: starts never decrease). The last node in
    pre-order starting at or before a span's start lies inside every node covering the span; its deepest ancestor
    (or itself) ending at or after the span's end is the answer. Spans no node covers go to the root (node 0).
    """
    T = spans.shape[0]
    s, e = spans[:, 0], spans[:, 1]
    cur = np.searchsorted(starts, s, side="right") - 1
    cur[cur < 0] = 0
    while True:
        climb = (ends[cur] < e) & (parents[cur] >= 0)
        if not climb.any():
            break
        cur[climb] = parents[cur[climb]]
    cur[s == e] = -1
    return cur if T else np.zeros(0, dtype=np.int64)


def _item_spans(b: int, item, limit: int, lengths_b: Optional[int], unit: str = "bytes") -> np.ndarray:
    """One item's spans as int64 ``[T, 2]``, checked (item and token named in the ValueError)."""
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu().numpy()
    try:
        spans = np.asarray(item)
    except (TypeError, ValueError):
        raise ValueError(f"batch item {b}: offsets must be (start, end) pairs") from None
    if spans.size == 0:
        spans = spans.reshape(0, 2).astype(np.int64)  # (an empty list reads as float64)
    if spans.ndim != 2 or spans.shape[1] != 2 or spans.dtype.kind not in "iu":
        raise ValueError(f"batch item {b}: offsets must be integer (start, end) pairs [T, 2], got shape "
                         f"{tuple(spans.shape)} of {spans.dtype}")
    spans = spans.astype(np.int64)
    if lengths_b is not None:
        if not 0 <= lengths_b <= spans.shape[0]:
            raise ValueError(f"batch item {b}: lengths[{b}] = {lengths_b} is outside 0..{spans.shape[0]} (its "
                             "offsets)")
        spans = spans[:lengths_b]
    s, e = spans[:, 0], spans[:, 1]
    bad = np.flatnonzero((s < 0) | (e < s) | (e > limit))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"batch item {b}, token {t}: span ({s[t]}, {e[t]}) out of range (the source has {limit} "
                         f"{unit}; expected 0 <= start <= end <= that)")
    real = np.flatnonzero(e > s)
    if real.size > 1:
        overlap = np.flatnonzero(s[real[1:]] < e[real[:-1]])
        if overlap.size:
            t, prev = int(real[overlap[0] + 1]), int(real[overlap[0]])
            raise ValueError(f"batch item {b}, token {t}: span ({s[t]}, {e[t]}) starts before the end of token "
                             f"{prev}'s span ({s[prev]}, {e[prev]}): spans must be sorted and not overlap")
    return spans


def _char_to_byte(data: bytes) -> np.ndarray:
    """int64 ``[chars + 1]``: the byte offset of every character of UTF-8 ``data`` (and of its end)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    return np.concatenate([np.flatnonzero((raw & 0xC0) != 0x80), [raw.size]]).astype(np.int64)


def _item_tokens(b, source, spans_in, parser, char_offsets, lengths_b):
    """``(spans int64 [T, 2] bytes, token node int64 [T], kept nodes' parents, types, spans)`` of one item."""
    if isinstance(source, str):
        data = source.encode("utf-8")
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        raise ValueError(f"batch item {b}: source must be str or bytes, got {type(source).__name__}")
    if char_offsets:
        table = _char_to_byte(data)
        spans = _item_spans(b, spans_in, table.size - 1, lengths_b, "characters")
        spans = table[spans]
    else:
        spans = _item_spans(b, spans_in, len(data), lengths_b)
    starts, ends, parents, types = syntax_nodes(parser.parse(data))
    token_node = attach_tokens(starts, ends, parents, spans)
    # keep the nodes holding a token and every node above one (and the root); renumber them in pre-order
    keep = np.zeros(starts.size, dtype=bool)
    keep[0] = True
    keep[token_node[token_node >= 0]] = True
    for node in range(starts.size - 1, 0, -1):  # children come after their parent in pre-order
        if keep[node]:
            keep[parents[node]] = True
    index = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    kept_parents = np.where(parents[kept] >= 0, index[parents[kept]], -1)
    token_kept = np.where(token_node >= 0, index[np.maximum(token_node, 0)], -1)
    node_spans = np.stack([starts[kept], ends[kept]], axis=1)
    return spans, token_kept, kept_parents, [types[i] for i in kept], node_spans


def gather_rows(target: np.ndarray, table: np.ndarray, nodes: np.ndarray) -> None:
    """``target[i, j] = table[nodes[i], nodes[j]]`` (``target`` ``[T, T]``, rows of any stride; ``table`` ``[M, M]``;
    ``nodes`` int64 ``[T]``), gathered in blocks of :data:`ROW_BLOCK` rows: a ``[ROW_BLOCK, M]`` temporary, then a
    gather straight into the target's rows (no ``T^2`` temporary)."""
    T = target.shape[0]
    for r0 in range(0, T, ROW_BLOCK):
        r1 = min(T, r0 + ROW_BLOCK)
        np.take(np.take(table, nodes[r0:r1], axis=0), nodes, axis=1, out=target[r0:r1])


def _fill_block(out: torch.Tensor, node_distance: torch.Tensor, token_node: np.ndarray, special: str) -> None:
    """``out`` (uint8 ``[T, T]``, rows of any stride) = the tokens' distance from the nodes' (module docstring).
    ``node_distance`` (uint8 ``[M, M]``, the C++ builder's block of this item) is changed in place to ``+ 2``."""
    T = out.shape[0]
    if T == 0:
        return
    nodes = np.maximum(token_node, 0)  # a special token stands at the root (node 0)
    leaves = node_distance.numpy()
    np.minimum(leaves, MAX_PATH - 2, out=leaves)  # the two leaf edges, saturating at 254
    np.add(leaves, 2, out=leaves)
    gather_rows(out.numpy(), leaves, nodes)
    out.diagonal().zero_()
    if special == "unreachable":
        lone = torch.from_numpy(np.flatnonzero(token_node < 0))
        if lone.numel():
            out[lone] = UNREACHABLE
            out[:, lone] = UNREACHABLE
            out[lone, lone] = 0


_RELATIONS_REFUSED = (
    "the sub-network relations (parent_d, child_d, sibling_d of a MaskSpec) are defined on trees over the tokens "
    "(one head per token); a code tree's tokens hang from syntax nodes that are not tokens, so they are not defined "
    "for a CodeTreeBatch. Use syntax_bias_attention with the CodeTreeBatch (window=d keeps the pairs within d edges)")


class CodeTreeBatch(ItemPlan):
    """The plan of a batch of source files over their tokens (:func:`from_tree_sitter`), padded or packed.

    Attributes:
        lengths: int64 ``[B]``: each item's tokens.
        token_nodes: int64 ``[B, N]`` (padded; -1 on padding) or ``[T]`` (packed): each token's node, an index into
            its item's node lists; -1 for a token without a span.
        node_types: per item, the kept nodes' tree-sitter types (pre-order, the root first): the nodes holding a
            token and every node above one.
        node_parents: per item, int64 ``[M_b]``: each kept node's parent (-1 for the root).
        node_spans: per item, int64 ``[M_b, 2]``: each kept node's byte range.
        token_spans: per item, int64 ``[T_b, 2]``: the tokens' byte spans (char offsets converted).
        distance, kernel_lengths (padded) or cu_seqlens, sequence, distance_offsets, max_seqlen (packed): the plan's.
    """

    #: Why ``syntax_subnetwork_attention`` refuses this plan.
    relations_refused = _RELATIONS_REFUSED

    def __init__(self, distance: torch.Tensor, *, lengths: torch.Tensor, token_nodes: torch.Tensor,
                 node_types, node_parents, node_spans, token_spans, special: str,
                 kernel_lengths: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                 sequence: Optional[torch.Tensor] = None, distance_offsets: Optional[torch.Tensor] = None,
                 max_seqlen: Optional[int] = None):
        self.lengths = lengths
        self.token_nodes = token_nodes
        self.node_types = node_types
        self.node_parents = node_parents
        self.node_spans = node_spans
        self.token_spans = token_spans
        self.special = special
        super().__init__(distance, symmetric=True, kernel_lengths=kernel_lengths, cu_seqlens=cu_seqlens,
                         sequence=sequence, distance_offsets=distance_offsets, max_seqlen=max_seqlen)

    def _map(self, fn) -> "CodeTreeBatch":
        def opt(t):
            return None if t is None else fn(t)
        distance = fn(self.distance) if self.is_packed else _map_distance(fn, self.distance)
        moved = CodeTreeBatch(distance, lengths=fn(self.lengths), token_nodes=fn(self.token_nodes),
                              node_types=self.node_types, node_parents=self.node_parents, node_spans=self.node_spans,
                              token_spans=self.token_spans, special=self.special,
                              kernel_lengths=opt(self.kernel_lengths), cu_seqlens=opt(self.cu_seqlens),
                              sequence=opt(self.sequence), distance_offsets=opt(self.distance_offsets),
                              max_seqlen=self.max_seqlen)
        return self._carry_derived(moved, fn)

    def __repr__(self) -> str:
        kind = "packed" if self.is_packed else "padded"
        return (f"CodeTreeBatch({kind}, items={self.num_items}, distance={tuple(self.distance.shape)}, "
                f"derived={len(self._derived)}, device={self.device})")


def from_tree_sitter(source, offsets, *, language="python", char_offsets: bool = False, lengths=None,
                     special: str = "root", packed: bool = False, size: Optional[int] = None,
                     num_threads: int = 0) -> CodeTreeBatch:
    """The plan of source code over its tokens: the tree-sitter syntax tree's distances (module docstring).

    Args:
        source: one file's text (``str``, encoded as UTF-8, or ``bytes``), or a list of them (a batch).
        offsets: the tokens' spans, ``[(start, end), ...]`` (an int ``[T, 2]`` tensor/array works too), one list per
            item for a batch; a padded tokenizer batch's ``offset_mapping`` ``[B, N, 2]`` with ``lengths``. Sorted,
            not overlapping; ``start == end`` marks a token without a span (a special token).
        language: ``"python"`` (the ``tree-sitter-python`` package), another grammar name (through
            ``tree-sitter-language-pack``), a ``tree_sitter.Language`` or a ``tree_sitter.Parser``.
        char_offsets: the offsets count characters of the ``str`` source (what Hugging Face fast tokenizers'
            ``offset_mapping`` gives) and are converted to bytes through its UTF-8 encoding; False (default): they
            count bytes of the UTF-8 source.
        lengths: int ``[B]``, each item's tokens (the first ``lengths[b]`` spans; give ``attention_mask.sum(-1)``
            for a right-padded tokenizer batch); None: all of them.
        special: a token without a span is a leaf child of the root (``"root"``) or 255 from every other token
            (``"unreachable"``).
        packed: the items end to end (q, k, v ``[T, H, D]``; the distance stored per item, ``sum T_b^2`` bytes).
        size: N for a padded batch (at least the longest item); None: the longest.
        num_threads: the C++ node-tree builder's threads over the batch (0: torch's).
    Returns:
        :class:`CodeTreeBatch`, a symmetric :class:`~syntaxkernels.plan.DistancePlan`: ``distance`` uint8
        ``[B, N, N]`` (rows 16-byte aligned) or ``[sum T_b^2]`` (packed), with each token's node and the nodes.
    Raises:
        ValueError naming the batch item and token for a span out of range (negative, ``end < start``, past the
        source), or one that starts before the previous span's end (unsorted or overlapping); ImportError saying
        what to install when tree-sitter or the grammar is missing.
    """
    if special not in ("root", "unreachable"):
        raise ValueError(f"special must be 'root' or 'unreachable', got {special!r}")
    if isinstance(source, (str, bytes, bytearray, memoryview)):
        sources, items = [source], [offsets]
        if lengths is not None:
            lengths = torch.as_tensor(lengths).reshape(1)
    else:
        sources = list(source)
        items = list(offsets) if not isinstance(offsets, torch.Tensor) else [offsets[b] for b in
                                                                              range(offsets.shape[0])]
        if len(items) != len(sources):
            raise ValueError(f"offsets has {len(items)} items for {len(sources)} sources")
    B = len(sources)
    length_list = [None] * B
    if lengths is not None:
        values = torch.as_tensor(lengths)
        if values.dim() != 1 or values.shape[0] != B or values.dtype.is_floating_point:
            raise ValueError(f"lengths must be an int tensor [B] = [{B}], got {tuple(values.shape)} of {values.dtype}")
        length_list = [int(v) for v in values.tolist()]
    parser = _parser(language)
    built = [_item_tokens(b, sources[b], items[b], parser, char_offsets, length_list[b]) for b in range(B)]
    # the node trees' distances in one call of the C++ builder (threads over the items)
    _, _, node_distance, _, _ = build_tree_tensors([p.tolist() for _, _, p, _, _ in built],
                                                   num_threads=num_threads)
    counts = [int(t.shape[0]) for _, t, _, _, _ in built]
    n_nodes = [int(p.shape[0]) for _, _, p, _, _ in built]
    longest = max(counts, default=0)
    token_spans = [torch.from_numpy(s) for s, _, _, _, _ in built]
    node_parents = [torch.from_numpy(p) for _, _, p, _, _ in built]
    node_types = [t for _, _, _, t, _ in built]
    node_spans = [torch.from_numpy(s) for _, _, _, _, s in built]
    lengths_t = torch.tensor(counts, dtype=torch.int64)
    common = dict(node_types=node_types, node_parents=node_parents, node_spans=node_spans, token_spans=token_spans,
                  special=special)
    if packed:
        if size is not None:
            raise ValueError("size does not apply to a packed batch")
        sizes = torch.tensor([n * n for n in counts], dtype=torch.int64)
        offsets_t = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
        distance = torch.empty(int(offsets_t[-1]), dtype=torch.uint8)
        for b, (_, token_node, _, _, _) in enumerate(built):
            n = counts[b]
            start = int(offsets_t[b])
            _fill_block(distance[start:start + n * n].view(n, n), node_distance[b, :n_nodes[b], :n_nodes[b]],
                    token_node, special)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths_t, 0)])
        sequence = torch.searchsorted(cu[1:], torch.arange(int(cu[-1])), right=True).to(torch.int32)
        token_nodes = (torch.from_numpy(np.concatenate([t for _, t, _, _, _ in built])) if B
                       else torch.zeros(0, dtype=torch.int64))
        return CodeTreeBatch(distance, lengths=lengths_t, token_nodes=token_nodes, cu_seqlens=cu.to(torch.int32),
                             sequence=sequence, distance_offsets=offsets_t, max_seqlen=longest, **common)
    if size is None:
        size = longest
    elif isinstance(size, bool) or not isinstance(size, int) or size < longest:
        raise ValueError(f"size must be an int at least the longest item ({longest} tokens), got {size!r}")
    buffer = torch.full((B, _round_up(size), _round_up(size)), UNREACHABLE, dtype=torch.uint8)
    distance = buffer[:, :size, :size]
    token_nodes = torch.full((B, size), -1, dtype=torch.int64)
    for b, (_, token_node, _, _, _) in enumerate(built):
        n = counts[b]
        _fill_block(distance[b, :n, :n], node_distance[b, :n_nodes[b], :n_nodes[b]], token_node, special)
        token_nodes[b, :n] = torch.from_numpy(token_node)
    return CodeTreeBatch(distance, lengths=lengths_t, token_nodes=token_nodes,
                         kernel_lengths=lengths_t.to(torch.int32), **common)
