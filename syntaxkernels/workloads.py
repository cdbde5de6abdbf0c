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
  ``align_to_tokens(connect=True)`` builds from a tokenizer's ``[CLS]``: every two tokens are a few edges apart).
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence

__all__ = ["random_forest", "random_document", "generated_sentences", "chain", "treebank_heads", "pack_sentences",
           "chain_sentences", "connect_sentences"]


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

    from . import data
    from .trees import read_conllu

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
