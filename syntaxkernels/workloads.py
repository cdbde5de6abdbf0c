"""Tree workloads shared by the tests, ``verify``, the benchmarks and the inspection report.

One place for every generator of trees the project measures or checks against:

- :func:`random_forest`, :func:`random_document`: random heads (every tree shape and head direction);
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
from typing import Iterable, List, Optional, Sequence

__all__ = ["random_forest", "random_document", "treebank_heads", "pack_sentences", "chain_sentences",
           "connect_sentences"]


def random_forest(rng: random.Random, length: int, num_trees: int = 1) -> List[int]:
    """Random 0-based heads (-1 = root) of ``length`` tokens in ``min(num_trees, length)`` trees.

    Tokens are visited in a random order; the first ``num_trees`` become roots and every later one attaches
    to a random already-visited token, so every tree shape and every head direction (left or right) occurs.
    """
    order = list(range(length))
    rng.shuffle(order)
    heads = [-1] * length
    for position, token in enumerate(order):
        if position >= num_trees:
            heads[token] = order[rng.randrange(position)]
    return heads


def random_document(rng: random.Random, lengths: Sequence[int]) -> List[int]:
    """Sentences of the given lengths packed one after another into one sequence (one tree each)."""
    heads: List[int] = []
    for length in lengths:
        offset = len(heads)
        heads += [h + offset if h >= 0 else -1 for h in random_forest(rng, length)]
    return heads


def treebank_heads(path=None, limit: Optional[int] = None) -> List[List[int]]:
    """0-based heads (-1 = root) of every sentence of a CoNLL-U file (default: :func:`data.treebank_path`).

    Raises :class:`syntaxkernels.data.TreebankNotFound` (saying how to provide the file) when it is absent.
    """
    from . import data
    from .trees import read_conllu

    path = data.require_treebank() if path is None else path
    sentences = read_conllu(path)
    return [list(s.heads) for s in sentences[:limit]]


def _rows(sentences: Iterable[Sequence[int]], N: int) -> List[List[Sequence[int]]]:
    """Greedy rows of whole sentences, each row holding at most N tokens (longer sentences are skipped)."""
    rows: List[List[Sequence[int]]] = []
    current: List[Sequence[int]] = []
    used = 0
    for heads in sentences:
        if len(heads) > N or not heads:
            continue
        if used + len(heads) > N:
            rows.append(current)
            current, used = [], 0
        current.append(heads)
        used += len(heads)
    if current:
        rows.append(current)
    return rows


def pack_sentences(sentences: Iterable[Sequence[int]], N: int, rows: Optional[int] = None) -> List[List[int]]:
    """Rows of at most N tokens, each several whole sentences one after another (each its own tree)."""
    out = []
    for row in _rows(sentences, N)[:rows]:
        heads: List[int] = []
        for sentence in row:
            offset = len(heads)
            heads += [h + offset if h >= 0 else -1 for h in sentence]
        out.append(heads)
    return out


def chain_sentences(sentences: Iterable[Sequence[int]], N: int, rows: Optional[int] = None) -> List[List[int]]:
    """Rows like :func:`pack_sentences`, each one tree: every sentence's root hangs under the previous one's."""
    out = []
    for row in _rows(sentences, N)[:rows]:
        heads: List[int] = []
        previous_root = -1
        for sentence in row:
            offset = len(heads)
            root = offset + list(sentence).index(-1)
            heads += [h + offset if h >= 0 else previous_root for h in sentence]
            previous_root = root
        out.append(heads)
    return out


def connect_sentences(sentences: Iterable[Sequence[int]], N: int, rows: Optional[int] = None) -> List[List[int]]:
    """Rows of one tree: token 0 is the root and every sentence's root hangs under it (at most N tokens)."""
    out = []
    for row in _rows(sentences, N - 1)[:rows]:
        heads: List[int] = [-1]
        for sentence in row:
            offset = len(heads)
            heads += [h + offset if h >= 0 else 0 for h in sentence]
        out.append(heads)
    return out
