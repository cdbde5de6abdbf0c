"""Tree workloads shared by the tests, ``verify``, the benchmarks and the inspection report.

One place for every generator of trees the project measures or checks against:

- :func:`random_forest`, :func:`random_document`, :func:`generated_sentences`, :func:`chain`: random heads
  (every tree shape and head direction), documents of them, sentence-like forests, chains;
- :func:`treebank_heads`: the sentences of a CoNLL-U treebank (:mod:`syntaxkernels.data` says which file);
- :func:`pack_sentences`: sentences packed one after another into rows of N tokens (many trees per row:
  most pairs unreachable, as when a data loader packs short sentences);
- :func:`chain_sentences`: the sentences of a row joined into one long tree, each sentence's root under the
  previous one's (a document read as one tree: distances grow with the gap between sentences);
- :func:`connect_sentences`: one root token with every sentence's root under it (what
  ``align_to_tokens(connect=True)`` builds from a tokenizer's ``[CLS]``: every two tokens are a few edges apart);
- :func:`named_workload` / :data:`WORKLOADS`: the batches users train on (sentences and sentence pairs under a
  ``[CLS]`` root padded to the batch's longest, fine-tuning batches padded to a fixed N, packed forests, long
  trees, odd N), built from the treebank when it is there and from generated trees otherwise (labelled), as
  :class:`Workload` objects whose :meth:`Workload.tree_batch` is the ``TreeBatch`` a data loader would hand over;
- the relation workloads (:data:`RELATION_WORKLOADS`, group ``relations``): batches whose structure is not one tree
  per row, carried as the structure plan itself (:meth:`Workload.plan`): ``graph`` (enhanced UD graphs as an
  undirected ``GraphBatch``), ``two-parse`` (two parses of each sentence as a 2-relation ``RelationBatch``) and
  ``code-r4`` (this package's own Python sources through ``trees.from_tree_sitter``, the code model's four
  relations as one ``RelationBatch``, ``RelationBatch.code_model``: the kernels run its codes with 256 buckets,
  :data:`~syntaxkernels.trees.relations.CODE_BUCKETS`) and its one-relation baseline ``code-r1`` (the code distance
  alone).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["random_forest", "random_document", "generated_sentences", "chain", "treebank_heads", "pack_sentences",
           "chain_sentences", "connect_sentences", "Workload", "WORKLOADS", "WORKLOAD_GROUPS", "workload_names",
           "named_workload", "sentence_source", "RELATION_WORKLOADS", "graph_source", "perturbed_tree",
           "code_rows", "RELATION_BATCHES", "CODE_R4_RELATIONS"]


def random_forest(rng: random.Random, length: int, num_trees: int = 1, extra_root_prob: float = 0.0) -> List[int]:
    """Random 0-based heads (-1 = root) of ``length`` tokens.

    Tokens are visited in a random order; the first ``min(num_trees, length)`` become roots and every later one
    attaches to a random already-visited token (so every tree shape and every head direction occurs), or, with
    probability ``extra_root_prob``, starts a tree of its own.
    """
    order = list(range(length))
    rng.shuffle(order)
    heads = [-1] * length
    for position, token in enumerate(order):
        if position >= num_trees and not (extra_root_prob and rng.random() < extra_root_prob):
            heads[token] = order[rng.randrange(position)]
    return heads


def random_document(rng: random.Random, lengths: Sequence[int]) -> List[int]:
    """Sentences of the given lengths packed one after another into one sequence (one tree each)."""
    heads: List[int] = []
    for length in lengths:
        offset = len(heads)
        heads += [h + offset if h >= 0 else -1 for h in random_forest(rng, length)]
    return heads


def generated_sentences(count: int, seed: int = 0, max_length: int = 40,
                        extra_root_prob: float = 0.05) -> List[List[int]]:
    """``count`` random forests of 1..max_length tokens, mostly single trees like parsed sentences (each later
    token starts a new tree with probability ``extra_root_prob``)."""
    rng = random.Random(seed)
    return [random_forest(rng, rng.randint(1, max_length), extra_root_prob=extra_root_prob) for _ in range(count)]


def chain(length: int) -> List[int]:
    """A chain: token i's head is i - 1 (distances grow with the gap)."""
    return [-1] + list(range(length - 1)) if length else []


def treebank_heads(path=None, limit: Optional[int] = None) -> List[List[int]]:
    """0-based heads (-1 = root) of every sentence of a CoNLL-U file (default: :func:`data.treebank_path`,
    i.e. ``$SYNTAXKERNELS_UD``).

    Raises :class:`syntaxkernels.data.TreebankNotFound` (a ``FileNotFoundError`` saying how to provide the file)
    when it is absent.
    """
    from pathlib import Path

    from syntaxkernels import data
    from syntaxkernels.trees import read_conllu

    if path is None:
        path = data.require_treebank()
    elif not Path(path).is_file():
        raise data.TreebankNotFound(data.missing_message(Path(path)))
    return [list(s.heads) for s in read_conllu(path)[:limit]]


def _rows(sentences: Sequence[Sequence[int]], N: int, rows: Optional[int], start: int) -> List[List[Sequence[int]]]:
    """Rows of whole consecutive sentences, each holding at most N tokens (longer sentences are skipped).

    From sentence ``start`` on; with ``rows`` given, the sentences are cycled until that many rows are full.
    """
    sentences = [s for s in sentences if 0 < len(s) <= N]
    out: List[List[Sequence[int]]] = []
    current: List[Sequence[int]] = []
    used = 0
    cursor = start
    while sentences and (cursor < len(sentences) if rows is None else len(out) < rows):
        heads = sentences[cursor % len(sentences)]
        cursor += 1
        if used + len(heads) > N:
            out.append(current)
            current, used = [], 0
        current.append(heads)
        used += len(heads)
    if current and (rows is None or len(out) < rows):
        out.append(current)
    return out


def pack_sentences(sentences: Sequence[Sequence[int]], N: int, rows: Optional[int] = None,
                   start: int = 0) -> List[List[int]]:
    """Rows of at most N tokens, each several whole consecutive sentences one after another (each its own
    tree); ``rows`` rows (cycling through the sentences from ``start``), or as many as the sentences fill."""
    out = []
    for row in _rows(sentences, N, rows, start):
        heads: List[int] = []
        for sentence in row:
            offset = len(heads)
            heads += [h + offset if h >= 0 else -1 for h in sentence]
        out.append(heads)
    return out


def chain_sentences(sentences: Sequence[Sequence[int]], N: int, rows: Optional[int] = None,
                    start: int = 0) -> List[List[int]]:
    """Rows like :func:`pack_sentences`, each one tree: every sentence's root hangs under the previous one's."""
    out = []
    for row in _rows(sentences, N, rows, start):
        heads: List[int] = []
        previous_root = -1
        for sentence in row:
            offset = len(heads)
            root = offset + list(sentence).index(-1)
            heads += [h + offset if h >= 0 else previous_root for h in sentence]
            previous_root = root
        out.append(heads)
    return out


def connect_sentences(sentences: Sequence[Sequence[int]], N: int, rows: Optional[int] = None,
                      start: int = 0) -> List[List[int]]:
    """Rows of one tree: token 0 is the root and every sentence's root hangs under it (at most N tokens)."""
    out = []
    for row in _rows(sentences, N - 1, rows, start):
        heads: List[int] = [-1]
        for sentence in row:
            offset = len(heads)
            heads += [h + offset if h >= 0 else 0 for h in sentence]
        out.append(heads)
    return out


# ---------------------------------------------------------------------------------------------------------
# Named workloads: the batches users have
# ---------------------------------------------------------------------------------------------------------

#: The named workloads (see :func:`named_workload`), in report order.
WORKLOADS = ("sentences", "pairs", "finetune-128", "finetune-512", "finetune-1024", "packed", "packed-512",
             "sentences-packed", "long-4096", "long-8192", "odd-77", "odd-1000")
#: The workloads whose structure is a plan other than one tree per row (see :func:`named_workload`); not in
#: ``all`` (the tree workloads, which ``bench`` and ``inspect --host`` walk), their own group ``relations``.
RELATION_WORKLOADS = ("graph", "two-parse", "code-r1", "code-r4")
#: Those whose plan is a ``RelationBatch`` (the kernels run its codes: no other BucketSpec applies).
RELATION_BATCHES = ("two-parse", "code-r4")
#: Names that stand for several workloads.
WORKLOAD_GROUPS = {"long": ("long-4096", "long-8192"), "odd": ("odd-77", "odd-1000"),
                   "finetune": ("finetune-128", "finetune-512", "finetune-1024"), "all": WORKLOADS,
                   "relations": RELATION_WORKLOADS}


@dataclass
class Workload:
    """One batch of a named workload: token-level trees (or another structure), the padded N, and where the
    structure came from.

    ``heads[b]`` are the 0-based token heads of row b (``lengths[b]`` tokens); the batch is padded to ``N``.
    A relation workload (``structure`` ``"graph"``, ``"code"`` or ``"relations"``) carries its plan instead:
    ``build(rows)`` makes the padded plan of those rows (a ``GraphBatch``, a ``CodeTreeBatch`` or a ``RelationBatch``
    of ``relations`` relations bucketed by ``buckets``), ``row_lengths`` are its rows' tokens and ``heads`` may be
    empty (a graph has no heads).
    """

    name: str
    heads: List[List[int]]
    N: int
    source: str  # "treebank <file>" or "generated trees (no treebank)"
    description: str
    packed: bool = False  # the rows are the sequences of one packed (padding-free) batch: packed_batch()
    structure: str = "tree"  # "tree" (heads), "graph" (a GraphBatch), "code" (a CodeTreeBatch), "relations"
    row_lengths: Optional[List[int]] = None  # tokens per row when the rows are not heads
    relations: Optional[int] = None  # R of a relation workload (a RelationBatch)
    buckets: Optional[tuple] = None  # its R BucketSpecs
    build: Optional[Callable] = field(default=None, repr=False, compare=False)  # rows -> the rows' padded plan
    digest: str = ""  # what the plan holds (a hash), for caches keyed by the batch rather than its name

    @property
    def lengths(self) -> List[int]:
        if self.row_lengths is not None:
            return list(self.row_lengths)
        return [len(h) for h in self.heads]

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def short_rows(self) -> bool:
        """The row class a padded plan of the whole batch carries (:func:`~syntaxkernels.plan.rows_are_short` of
        its lengths): the tiles its calls launch."""
        from syntaxkernels.plan import rows_are_short

        return rows_are_short(self.lengths)

    @property
    def kernel_buckets(self):
        """The :class:`~syntaxkernels.BucketSpec` the kernels run with: a relation batch's codes
        (``CODE_BUCKETS``, 256 buckets), else the default ``BucketSpec()`` (trees, graphs)."""
        from syntaxkernels.specs import BucketSpec

        if self.structure == "relations":
            from syntaxkernels.trees.relations import CODE_BUCKETS

            return CODE_BUCKETS
        return BucketSpec()

    def plan(self, rows: Optional[Sequence[int]] = None):
        """The padded structure plan of these rows (default: all) that a layer receives: ``tree_batch`` for a tree
        workload, else the workload's own (a ``GraphBatch`` or ``RelationBatch`` ``[len(rows), N, N]``)."""
        if self.build is None:
            return self.tree_batch(rows)
        return self.build(list(range(self.batch_size)) if rows is None else list(rows))

    def valid_pairs(self) -> int:
        """(query, key) pairs inside the lengths: what the attention computes for a user (no window, causal)."""
        return sum(n * n for n in self.lengths)

    def padded_heads(self, rows: Optional[Sequence[int]] = None):
        """``(heads int64 [B, N] padded with -1, lengths int64 [B])`` of the given rows (default: all)."""
        import torch

        if self.structure != "tree":
            raise ValueError(f"workload {self.name!r} is a {self.structure} workload: it has no heads (use plan())")
        rows = range(self.batch_size) if rows is None else rows
        heads = torch.full((len(rows), self.N), -1, dtype=torch.int64)
        for i, b in enumerate(rows):
            heads[i, :len(self.heads[b])] = torch.tensor(self.heads[b], dtype=torch.int64)
        return heads, torch.tensor([len(self.heads[b]) for b in rows], dtype=torch.int64)

    def tree_batch(self, rows: Optional[Sequence[int]] = None):
        """The :class:`~syntaxkernels.trees.TreeBatch` of these rows, built as a data loader builds it
        (``TreeBatch.from_heads(heads, lengths)``): its ``distance`` and ``lengths`` are what a call receives."""
        from syntaxkernels.trees import TreeBatch

        heads, lengths = self.padded_heads(rows)
        return TreeBatch.from_heads(heads, lengths)

    def packed_batch(self):
        """The :class:`~syntaxkernels.trees.PackedTreeBatch` of every row (a sequence each), end to end, as
        ``TreeCollator(packed=True)`` builds it."""
        from syntaxkernels.trees import PackedTreeBatch

        return PackedTreeBatch.from_heads(self.heads)

    def compile_rows(self) -> List[int]:
        """Rows enough to compile what the whole batch compiles: the JIT specialises on N, strides and pointer
        alignment (divisibility by 16), not on the batch size or the lengths' values, so the longest row and
        one other (a ragged length) stand for the batch."""
        lengths = self.lengths
        order = sorted(range(self.batch_size), key=lambda b: -lengths[b])
        return sorted(order[:2])

    def summary(self) -> str:
        lengths = self.lengths
        if self.packed:
            return (f"{self.name}: S = {self.batch_size} sequences packed into T = {sum(lengths)} tokens, lengths "
                    f"{min(lengths)}..{max(lengths)} (mean {sum(lengths) / len(lengths):.1f}), no padding; "
                    f"{self.source}")
        structure = "" if self.structure == "tree" else f"; {self.description}"
        return (f"{self.name}: B = {self.batch_size}, N = {self.N}, lengths {min(lengths)}..{max(lengths)} "
                f"(mean {sum(lengths) / len(lengths):.1f}), valid pairs {self.valid_pairs() / (len(lengths) * self.N ** 2):.3f} "
                f"of B*N^2{structure}; {self.source}")


def workload_names(spec: str) -> List[str]:
    """The workloads a comma-separated ``spec`` names (a name, a group of :data:`WORKLOAD_GROUPS`, or "all");
    raises ``ValueError`` naming the known ones."""
    names: List[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        found = WORKLOAD_GROUPS.get(part, (part,) if part in WORKLOADS + RELATION_WORKLOADS else None)
        if found is None:
            raise ValueError(f"unknown workload {part!r}; the workloads are {', '.join(WORKLOADS + RELATION_WORKLOADS)} "
                             f"(groups: {', '.join(WORKLOAD_GROUPS)})")
        names += [n for n in found if n not in names]
    return names


_SOURCE_CACHE: Dict[str, Tuple[List[List[int]], str]] = {}


def sentence_source() -> Tuple[List[List[int]], str]:
    """``(sentences, label)``: the treebank's sentences (``$SYNTAXKERNELS_UD``) when the file is there, else
    generated sentence-like trees (4,000, 1..40 tokens, seed 0), labelled as such."""
    from syntaxkernels import data

    path = data.treebank_path()
    key = str(path)
    if key not in _SOURCE_CACHE:
        if data.treebank_available():
            _SOURCE_CACHE[key] = (treebank_heads(path), f"treebank {path.name}")
        else:
            _SOURCE_CACHE[key] = (generated_sentences(4000, seed=0, max_length=40),
                                  f"generated trees (no treebank: {data.ENV_VAR} not set to a file)")
    return _SOURCE_CACHE[key]


def _single_root(heads: Sequence[int]) -> List[int]:
    """A sentence as one tree: a generated forest's extra roots hang under its first root (treebank sentences
    already have one root)."""
    heads = list(heads)
    roots = [i for i, h in enumerate(heads) if h < 0]
    return [roots[0] if (h < 0 and i != roots[0]) else h for i, h in enumerate(heads)]


def _with_cls(texts: Sequence[Sequence[Sequence[int]]]) -> List[int]:
    """``[CLS] text_a [SEP] (text_b [SEP])`` with one token per word, through ``align_to_tokens`` as a tokenizer's
    ``word_ids()`` / ``sequence_ids()`` would drive it: ``[CLS]`` roots the sequence, every sentence root and
    every ``[SEP]`` hangs under it."""
    from syntaxkernels.trees import align_to_tokens

    word_ids: List[Optional[int]] = [None]
    sequence_ids: List[Optional[int]] = [None]
    for t, text in enumerate(texts):
        words = sum(len(s) for s in text)
        word_ids += list(range(words)) + [None]
        sequence_ids += [t] * words + [None]
    sentences = [[_single_root(s) for s in text] for text in texts]
    return align_to_tokens(sentences, word_ids, connect=True, sequence_ids=sequence_ids)


def named_workload(name: str, sentences: Optional[Sequence[Sequence[int]]] = None, source: str = "",
                   start: int = 0) -> Workload:
    """One batch of the named workload (:data:`WORKLOADS`), from ``sentences`` (default :func:`sentence_source`).

    - ``sentences``: 32 consecutive sentences, each ``[CLS] words [SEP]`` under the ``[CLS]`` root, padded to
      the batch's longest (N is whatever that gives: rarely a multiple of 16);
    - ``pairs``: 32 rows of two consecutive sentences, ``[CLS] a [SEP] b [SEP]``, the same way;
    - ``finetune-128`` / ``finetune-512`` / ``finetune-1024``: 32 ``[CLS]`` sentences (real lengths) padded to a
      fixed N (1024: a long-context encoder fine-tuned on sentences; the padded tiles beyond 512 tokens);
    - ``packed``: 8 rows of whole consecutive sentences packed into 1024-token forests (one tree each);
    - ``packed-512``: 16 rows of them packed into 512 tokens, as a model of 512 tokens is pre-trained or
      fine-tuned on documents: full rows of at most 512 tokens (the long tiles, ``TreeBatch.short_rows`` False);
    - ``sentences-packed``: 256 ``[CLS]`` sentences as one padding-free packed batch (``Workload.packed``: the
      varlen kernels, sequences sharing tiles);
    - ``long-4096`` / ``long-8192``: one tree (consecutive sentences, each root under the previous one's) of
      at most N tokens;
    - ``odd-77`` / ``odd-1000``: 4 rows of sentences under one root token, filling N = 77 / 1000.

    The relation workloads (:data:`RELATION_WORKLOADS`; each carries its plan, :meth:`Workload.plan`):

    - ``graph``: 32 consecutive sentences' enhanced UD graphs (:func:`graph_source`: words, then empty nodes,
      the DEPS edges) as an undirected ``GraphBatch``, each ``[CLS] nodes [SEP]`` with ``[CLS]`` linked to the
      sentence's root and to ``[SEP]``, padded to the batch's longest; from ``sentences`` (or without the treebank)
      generated graphs: the trees plus, per token, an edge to its grandparent with probability 0.15 (seed 0);
    - ``two-parse``: the ``sentences`` rows with two parses of each as a 2-relation ``RelationBatch``
      (``BucketSpec()`` each, 12 x 12 = 144 codes): the gold tree and a perturbed one (:func:`perturbed_tree`:
      15% of the words reattached to a random word that is not their descendant, seed 0; still a tree);
    - ``code-r1``: the ``code-r4`` rows with one relation, the code distance itself (the ``CodeTreeBatch``,
      ``BucketSpec()``): the one-relation baseline of ``code-r4``;
    - ``code-r4``: 16 rows of N = 512 tokens of this package's own ``.py`` files (:func:`code_rows`), each parsed
      whole by ``trees.from_tree_sitter``, as the code model's 4-relation ``RelationBatch``
      (``RelationBatch.code_model(plan, CODE_R4_RELATIONS, max_sibling=1)``: path, steps up, steps down,
      sibling; 6 x 3 x 3 x 4 = 216 codes). Needs ``tree-sitter`` and ``tree-sitter-python`` (ImportError
      otherwise).
    """
    if name in RELATION_WORKLOADS:
        return _relation_workload(name, sentences, source, start)
    if sentences is None:
        sentences, source = sentence_source()
    pool = [list(s) for s in sentences if len(s) > 0]
    if not pool:
        raise ValueError("no sentences to build a workload from")

    def take(count: int, limit: int, offset: int = 0) -> List[List[int]]:
        out, i = [], start + offset
        fitting = [s for s in pool if len(s) <= limit]
        for _ in range(count):
            out.append(fitting[i % len(fitting)])
            i += 1
        return out

    if name == "sentences":
        heads = [_with_cls([[s]]) for s in take(32, 510)]
        return Workload(name, heads, max(map(len, heads)), source,
                        "32 sentences, [CLS] s [SEP], padded to the batch's longest")
    if name == "pairs":
        chosen = take(64, 254)
        heads = [_with_cls([[chosen[2 * i]], [chosen[2 * i + 1]]]) for i in range(32)]
        return Workload(name, heads, max(map(len, heads)), source,
                        "32 sentence pairs, [CLS] a [SEP] b [SEP], padded to the batch's longest")
    if name in ("finetune-128", "finetune-512", "finetune-1024"):
        N = int(name.split("-")[1])
        heads = [_with_cls([[s]]) for s in take(32, N - 2)]
        return Workload(name, heads, N, source, f"32 sentences, [CLS] s [SEP], padded to N = {N}")
    if name == "packed":
        heads = pack_sentences(pool, 1024, rows=8, start=start)
        return Workload(name, heads, 1024, source, "8 rows of whole sentences packed into 1024 tokens (a forest)")
    if name == "packed-512":
        heads = pack_sentences(pool, 512, rows=16, start=start)
        return Workload(name, heads, 512, source, "16 rows of whole sentences packed into 512 tokens (a forest)")
    if name == "sentences-packed":
        heads = [_with_cls([[s]]) for s in take(256, 510)]
        return Workload(name, heads, max(map(len, heads)), source,
                        "256 sentences, [CLS] s [SEP], packed end to end without padding (cu_seqlens)", packed=True)
    if name in ("long-4096", "long-8192"):
        N = int(name.split("-")[1])
        heads = chain_sentences([_single_root(s) for s in pool], N, rows=1, start=start)
        return Workload(name, heads, N, source, f"one tree of consecutive sentences, at most {N} tokens")
    if name in ("odd-77", "odd-1000"):
        N = int(name.split("-")[1])
        heads = connect_sentences([_single_root(s) for s in pool], N, rows=4, start=start)
        return Workload(name, heads, N, source, f"4 rows of sentences under one root token, N = {N}")
    raise ValueError(f"unknown workload {name!r}; the workloads are {', '.join(WORKLOADS)}")


# ---------------------------------------------------------------------------------------------------------
# Relation workloads: graphs, two parses, code with four relations (the structure as its plan)
# ---------------------------------------------------------------------------------------------------------

#: The graph workload's edges per row: ``(edges [(a, b), ...] over the row's nodes, nodes, root nodes)``.
GraphRow = Tuple[List[Tuple[int, int]], int, List[int]]

_GRAPH_CACHE: Dict[str, Tuple[List[GraphRow], str]] = {}


def _generated_graphs(sentences: Sequence[Sequence[int]], seed: int = 0, extra: float = 0.15) -> List[GraphRow]:
    """Graphs from trees (the generated stand-in for enhanced UD): every tree edge, and per token with a
    grandparent an edge to it with probability ``extra`` (a propagated head, as enhanced UD's conjuncts and
    controlled subjects add)."""
    rng = random.Random(seed)
    out = []
    for heads in sentences:
        heads = _single_root(heads)
        edges = [(h, i) for i, h in enumerate(heads) if h >= 0]
        edges += [(heads[h], i) for i, h in enumerate(heads) if h >= 0 and heads[h] >= 0 and rng.random() < extra]
        out.append((edges, len(heads), [i for i, h in enumerate(heads) if h < 0]))
    return out


def graph_source() -> Tuple[List[GraphRow], str]:
    """``(graphs, label)``: every treebank sentence's enhanced graph (``read_conllu(..., enhanced=True)``: the words
    then the empty nodes, the DEPS edges; roots: the basic tree's root words) when ``$SYNTAXKERNELS_UD`` names a
    file, else graphs generated from :func:`sentence_source`'s trees (:func:`_generated_graphs`), labelled."""
    from syntaxkernels import data

    path = data.treebank_path()
    key = str(path)
    if key not in _GRAPH_CACHE:
        if data.treebank_available():
            from syntaxkernels.trees import read_conllu

            rows = [(list(s.enhanced_edges), s.num_nodes, s.roots) for s in read_conllu(path, enhanced=True)]
            _GRAPH_CACHE[key] = (rows, f"treebank {path.name} (enhanced graphs)")
        else:
            sentences, label = sentence_source()
            _GRAPH_CACHE[key] = (_generated_graphs(sentences), f"generated graphs: trees + grandparent edges ({label})")
    return _GRAPH_CACHE[key]


def perturbed_tree(heads: Sequence[int], rng: random.Random, share: float = 0.15) -> List[int]:
    """A second parse of a tree: each non-root word, with probability ``share``, reattached to a random word that
    is not itself or one of its descendants (so the result is still one tree with the same roots)."""
    heads = list(heads)
    n = len(heads)
    for i in range(n):
        if heads[i] < 0 or rng.random() >= share:
            continue
        candidates = []
        for j in range(n):
            k = j
            while k >= 0 and k != i:  # j's path to the root: i on it means j is i's descendant (or i)
                k = heads[k]
            if k != i:
                candidates.append(j)
        if candidates:
            heads[i] = rng.choice(candidates)
    return heads


_CODE_CACHE: Dict[tuple, Tuple[List[bytes], List[List[Tuple[int, int]]], str]] = {}


def code_rows(rows: int = 16, N: int = 512, root=None) -> Tuple[List[bytes], List[List[Tuple[int, int]]], str]:
    """``(sources, spans, label)``: ``rows`` rows of at most N tokens of this package's ``.py`` files (sorted by
    path; the package directory ``root``, default this checkout's), each row N consecutive tokens of one file (a
    file's last row shorter), ``sources[b]`` the whole file (UTF-8 bytes, parsed whole) and ``spans[b]`` the row's
    byte spans. Tokens: word runs and single other characters (regex ``\\w+|[^\\w\\s]``; whitespace is no token)."""
    import re
    from pathlib import Path

    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    key = (rows, N, str(root))
    if key not in _CODE_CACHE:
        sources: List[bytes] = []
        spans: List[List[Tuple[int, int]]] = []
        names: List[str] = []
        files = sorted(root.rglob("*.py"))
        for path in files:
            data = path.read_bytes()
            tokens = [m.span() for m in re.finditer(rb"\w+|[^\w\s]", data)]
            if tokens:
                names.append(path.relative_to(root.parent).as_posix())
            for first in range(0, len(tokens), N):
                if len(spans) == rows:
                    break
                sources.append(data)
                spans.append(tokens[first:first + N])
            if len(spans) == rows:
                break
        _CODE_CACHE[key] = (sources, spans, f"this package's sources (the first {len(names)} non-empty .py files "
                                            f"by path: {', '.join(names)}; {sum(map(len, spans))} tokens)")
    return _CODE_CACHE[key]


#: code-r4's relations: the code model's four (``RelationBatch.code_model``), the sibling distance clipped at 1:
#: path 6 buckets, steps up 3, steps down 3, sibling 4 (6 x 3 x 3 x 4 = 216 codes).
CODE_R4_RELATIONS = ("path", "up", "down", "sibling")
CODE_R4_OPTIONS = dict(max_sibling=1)


def _relation_workload(name: str, sentences, source: str, start: int) -> Workload:
    import hashlib

    from syntaxkernels.trees import from_tree_sitter

    def digest(plan) -> str:
        return hashlib.sha1(plan.distance.contiguous().numpy().tobytes()
                            + plan.kernel_lengths.numpy().tobytes()).hexdigest()

    def code_plan(index, sources, spans):  # the code rows' CodeTreeBatch (code-r1's plan, code-r4's source)
        return from_tree_sitter([sources[b] for b in index], [spans[b] for b in index], size=512)

    if name == "graph":
        if sentences is None:
            graphs, source = graph_source()
        else:
            graphs = _generated_graphs([list(s) for s in sentences if len(s) > 0])
        fitting = [g for g in graphs if 0 < g[1] <= 510]
        if not fitting:
            raise ValueError("no sentences to build a workload from")
        chosen = [fitting[(start + i) % len(fitting)] for i in range(32)]
        rows = []
        for edges, n, roots in chosen:  # [CLS] = 0, the nodes 1..n, [SEP] = n + 1
            rows.append(([(a + 1, b + 1) for a, b in edges] + [(0, r + 1) for r in roots] + [(0, n + 1)], n + 2))
        N = max(n for _, n in rows)

        def build(index):
            from syntaxkernels.trees import GraphBatch

            return GraphBatch.from_edges([rows[b][0] for b in index], [rows[b][1] for b in index], size=N,
                                         directed=False)

        w = Workload(name, [], N, source, "enhanced UD graphs as an undirected GraphBatch, [CLS] nodes [SEP] "
                     "([CLS] linked to the root and [SEP]), 32 sentences padded to the batch's longest",
                     structure="graph", row_lengths=[n for _, n in rows], build=build)
        w.digest = digest(w.plan())
        return w
    if name == "two-parse":
        from syntaxkernels.specs import BucketSpec

        base = named_workload("sentences", sentences, source, start) if sentences is not None else \
            named_workload("sentences", start=start)
        rng = random.Random(0)
        pool = [list(s) for s in (sentences if sentences is not None else sentence_source()[0]) if 0 < len(s) <= 510]
        chosen = [pool[(start + i) % len(pool)] for i in range(32)]
        second = [_with_cls([[perturbed_tree(_single_root(s), rng)]]) for s in chosen]
        assert [len(h) for h in second] == base.lengths
        perturbed = Workload(name, second, base.N, base.source, "")

        def build(index):
            from syntaxkernels.trees import RelationBatch

            return RelationBatch.from_plans([base.tree_batch(index), perturbed.tree_batch(index)], BucketSpec())

        w = Workload(name, base.heads, base.N, base.source, "two parses of each sentence as 2 relations (the gold "
                     "tree, a perturbed tree: 15% of words reattached, seed 0), BucketSpec() each: 144 codes",
                     structure="relations", relations=2, buckets=(BucketSpec(),) * 2, build=build)
        w.digest = digest(w.plan())
        return w
    if name == "code-r1":
        sources, spans, label = code_rows()

        def build(index):
            return code_plan(index, sources, spans)

        w = Workload(name, [], 512, label, "the tree-sitter tree of Python code as one relation (the code "
                     "distance, a CodeTreeBatch, BucketSpec()), rows of 512 tokens", structure="code",
                     row_lengths=[len(x) for x in spans], build=build)
        w.digest = digest(w.plan())
        return w
    if name == "code-r4":
        from syntaxkernels.trees import RelationBatch, code_relation_buckets

        sources, spans, label = code_rows()
        N = 512
        specs = code_relation_buckets(CODE_R4_RELATIONS, **CODE_R4_OPTIONS)

        def build(index):
            return RelationBatch.code_model(code_plan(index, sources, spans), CODE_R4_RELATIONS, **CODE_R4_OPTIONS)

        sizes = " x ".join(str(spec.num_buckets) for spec in specs)
        w = Workload(name, [], N, label, "the code model's 4 relations of the tree-sitter tree of Python code "
                     f"(RelationBatch.code_model: {', '.join(CODE_R4_RELATIONS)}, max_sibling=1; {sizes} = "
                     f"{math.prod(spec.num_buckets for spec in specs)} codes), rows of 512 tokens",
                     structure="relations", row_lengths=[len(x) for x in spans], relations=4, buckets=specs,
                     build=build)
        w.digest = digest(w.plan())
        return w
    raise ValueError(f"unknown workload {name!r}; the workloads are {', '.join(WORKLOADS + RELATION_WORKLOADS)}")
