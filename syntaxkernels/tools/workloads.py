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
  :class:`Workload` objects whose :meth:`Workload.tree_batch` is the ``TreeBatch`` a data loader would hand over.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["random_forest", "random_document", "generated_sentences", "chain", "treebank_heads", "pack_sentences",
           "chain_sentences", "connect_sentences", "Workload", "WORKLOADS", "WORKLOAD_GROUPS", "workload_names",
           "named_workload", "sentence_source"]


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
WORKLOADS = ("sentences", "pairs", "finetune-128", "finetune-512", "packed", "sentences-packed", "long-4096",
             "long-8192", "odd-77", "odd-1000")
#: Names that stand for several workloads.
WORKLOAD_GROUPS = {"long": ("long-4096", "long-8192"), "odd": ("odd-77", "odd-1000"),
                   "finetune": ("finetune-128", "finetune-512"), "all": WORKLOADS}


@dataclass
class Workload:
    """One batch of a named workload: token-level trees, the padded N, and where the trees came from.

    ``heads[b]`` are the 0-based token heads of row b (``lengths[b]`` tokens); the batch is padded to ``N``.
    """

    name: str
    heads: List[List[int]]
    N: int
    source: str  # "treebank <file>" or "generated trees (no treebank)"
    description: str
    packed: bool = False  # the rows are the sequences of one packed (padding-free) batch: packed_batch()

    @property
    def lengths(self) -> List[int]:
        return [len(h) for h in self.heads]

    @property
    def batch_size(self) -> int:
        return len(self.heads)

    def valid_pairs(self) -> int:
        """(query, key) pairs inside the lengths: what the attention computes for a user (no window, causal)."""
        return sum(n * n for n in self.lengths)

    def padded_heads(self, rows: Optional[Sequence[int]] = None):
        """``(heads int64 [B, N] padded with -1, lengths int64 [B])`` of the given rows (default: all)."""
        import torch

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
        order = sorted(range(self.batch_size), key=lambda b: -len(self.heads[b]))
        return sorted(order[:2])

    def summary(self) -> str:
        lengths = self.lengths
        if self.packed:
            return (f"{self.name}: S = {self.batch_size} sequences packed into T = {sum(lengths)} tokens, lengths "
                    f"{min(lengths)}..{max(lengths)} (mean {sum(lengths) / len(lengths):.1f}), no padding; "
                    f"{self.source}")
        return (f"{self.name}: B = {self.batch_size}, N = {self.N}, lengths {min(lengths)}..{max(lengths)} "
                f"(mean {sum(lengths) / len(lengths):.1f}), valid pairs {self.valid_pairs() / (len(lengths) * self.N ** 2):.3f} "
                f"of B*N^2; {self.source}")


def workload_names(spec: str) -> List[str]:
    """The workloads a comma-separated ``spec`` names (a name, a group of :data:`WORKLOAD_GROUPS`, or "all");
    raises ``ValueError`` naming the known ones."""
    names: List[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        found = WORKLOAD_GROUPS.get(part, (part,) if part in WORKLOADS else None)
        if found is None:
            raise ValueError(f"unknown workload {part!r}; the workloads are {', '.join(WORKLOADS)} "
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
    - ``finetune-128`` / ``finetune-512``: 32 ``[CLS]`` sentences (real lengths) padded to a fixed N;
    - ``packed``: 8 rows of whole consecutive sentences packed into 1024-token forests (one tree each);
    - ``sentences-packed``: 256 ``[CLS]`` sentences as one padding-free packed batch (``Workload.packed``: the
      varlen kernels, sequences sharing tiles);
    - ``long-4096`` / ``long-8192``: one tree (consecutive sentences, each root under the previous one's) of
      at most N tokens;
    - ``odd-77`` / ``odd-1000``: 4 rows of sentences under one root token, filling N = 77 / 1000.

    Tokens are words (one piece each: no tokenizer is involved); the special tokens are placed as a BERT-style
    tokenizer places them.
    """
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
    if name in ("finetune-128", "finetune-512"):
        N = int(name.split("-")[1])
        heads = [_with_cls([[s]]) for s in take(32, N - 2)]
        return Workload(name, heads, N, source, f"32 sentences, [CLS] s [SEP], padded to N = {N}")
    if name == "packed":
        heads = pack_sentences(pool, 1024, rows=8, start=start)
        return Workload(name, heads, 1024, source, "8 rows of whole sentences packed into 1024 tokens (a forest)")
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
