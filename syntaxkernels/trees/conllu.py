"""CoNLL-U reading and head-index conventions.

``read_conllu`` turns a CoNLL-U file (or its text) into :class:`Sentence` objects whose ``heads`` follow
the package convention: 0-based indices into the sentence's syntactic words, ``-1`` for the root.

CoNLL-U details handled:

- multiword-token range lines (``1-2  don't``) are not syntactic words: they are skipped, and recorded in
  ``Sentence.multiword_tokens`` as ``(first, last, form)`` (0-based, inclusive word positions);
- empty nodes of enhanced dependencies (``8.1``) are skipped, unless ``enhanced=True``: then the DEPS column is read
  into the enhanced graph (:attr:`Sentence.enhanced_edges`) and each empty node becomes a node after the words
  (the sentence's k-th empty node in file order is node ``L + k``, L its words);
- comment lines (``# ...``) are kept in ``Sentence.comments``; ``# sent_id = ...`` and ``# text = ...``
  fill ``sent_id`` and ``text``;
- sentences are separated by one or more blank lines; the last one may end without a blank line;
- a malformed line raises ``ValueError`` naming the line number: wrong column count, a bad word ID,
  IDs out of sequence, a non-integer head, a head out of range, a self-loop, or a cycle.

Head conventions (``from_conllu_heads``, ``from_self_root``) convert arrays from the two other common
conventions: CoNLL-U's 1-based heads with 0 for the root, and "the root is its own parent".
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import torch

__all__ = ["Sentence", "read_conllu", "from_conllu_heads", "from_self_root"]

_NUM_COLUMNS = 10


@dataclass
class Sentence:
    """One dependency-parsed sentence (its syntactic words, not its surface tokens).

    Attributes:
        words: word forms, length L.
        heads: 0-based head of each word, ``-1`` for a root (length L).
        upos, xpos, lemmas, feats, deprel, deps, misc: the other CoNLL-U columns (length L, ``"_"`` where
            unknown); empty lists when the source did not provide them.
        multiword_tokens: ``(first, last, form)`` for each multiword surface token, 0-based inclusive word
            positions (``don't`` -> ``(3, 4, "don't")`` for words ``do``, ``n't``).
        sent_id, text: from the ``# sent_id = ...`` and ``# text = ...`` comments, when present.
        comments: every comment line of the sentence, without the leading ``#`` and surrounding spaces.
        enhanced_edges: with ``read_conllu(..., enhanced=True)``, the enhanced graph (DEPS column) as
            ``(head, dependent)`` node pairs, 0-based: nodes ``0 .. L-1`` are the words, ``L + k`` the k-th empty
            node (``8.1``) in file order; the root attachment ``0:root`` gives no edge. Several heads per node
            are several edges. Empty otherwise.
        enhanced_deprels: the relation of each enhanced edge (``nsubj:xsubj``, ``conj:and``, ...).
        empty_nodes: ``(ID, form)`` of each empty node in file order (``("8.1", "write")``), with
            ``enhanced=True``.
    """

    words: List[str]
    heads: List[int]
    upos: List[str] = field(default_factory=list)
    deprel: List[str] = field(default_factory=list)
    xpos: List[str] = field(default_factory=list)
    lemmas: List[str] = field(default_factory=list)
    feats: List[str] = field(default_factory=list)
    deps: List[str] = field(default_factory=list)
    misc: List[str] = field(default_factory=list)
    multiword_tokens: List[Tuple[int, int, str]] = field(default_factory=list)
    sent_id: Optional[str] = None
    text: Optional[str] = None
    comments: List[str] = field(default_factory=list)
    enhanced_edges: List[Tuple[int, int]] = field(default_factory=list)
    enhanced_deprels: List[str] = field(default_factory=list)
    empty_nodes: List[Tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.words = list(self.words)
        self.heads = [int(h) for h in self.heads]
        if len(self.heads) != len(self.words):
            raise ValueError(f"Sentence: {len(self.words)} words but {len(self.heads)} heads")
        for name in ("upos", "deprel", "xpos", "lemmas", "feats", "deps", "misc"):
            values = list(getattr(self, name))
            if values and len(values) != len(self.words):
                raise ValueError(f"Sentence: {len(self.words)} words but {len(values)} {name}")
            setattr(self, name, values)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def num_nodes(self) -> int:
        """Nodes of the enhanced graph: the words, then the empty nodes (``len(words) + len(empty_nodes)``)."""
        return len(self.words) + len(self.empty_nodes)

    @property
    def roots(self) -> List[int]:
        """Positions of the root words (one for a well-formed UD sentence)."""
        return [i for i, h in enumerate(self.heads) if h == -1]

    def to_conllu(self) -> str:
        """The sentence as CoNLL-U text (comments, multiword ranges and words; ends with a blank line)."""
        lines = [f"# {c}" for c in self.comments]
        ranges = {first: (last, form) for first, last, form in self.multiword_tokens}

        def col(values: List[str], i: int) -> str:
            return values[i] if values else "_"

        for i, word in enumerate(self.words):
            if i in ranges:
                last, form = ranges[i]
                lines.append(f"{i + 1}-{last + 1}\t{form}" + "\t_" * 8)
            lines.append("\t".join([
                str(i + 1), word, col(self.lemmas, i), col(self.upos, i), col(self.xpos, i), col(self.feats, i),
                str(self.heads[i] + 1), col(self.deprel, i), col(self.deps, i), col(self.misc, i),
            ]))
        return "\n".join(lines) + "\n\n"


def _open_source(path_or_text) -> Tuple[Iterable[str], str]:
    """Lines of the input and a name for error messages.

    A ``str`` containing a newline or a tab is CoNLL-U text; any other ``str`` or ``os.PathLike`` is a
    path; an object with ``read()`` is a text stream.
    """
    if isinstance(path_or_text, str) and ("\n" in path_or_text or "\t" in path_or_text):
        return io.StringIO(path_or_text), "<text>"
    if isinstance(path_or_text, str) and not path_or_text.strip():
        raise ValueError(f"read_conllu: path_or_text is {path_or_text!r}, neither a file name nor CoNLL-U text "
                         "(expected a path to a CoNLL-U file, CoNLL-U text with at least one newline or tab, or a "
                         "text stream); an unset path variable?")
    if isinstance(path_or_text, (str, os.PathLike)):
        path = Path(path_or_text)
        if path.is_dir():
            inside = sorted(p.name for p in path.glob("*.conllu"))
            held = f" (it holds {', '.join(inside[:3])}{' ...' if len(inside) > 3 else ''})" if inside else ""
            raise IsADirectoryError(f"read_conllu: {str(path_or_text)!r} is a directory, expected the path of a "
                                    f"CoNLL-U file{held}")
        if not path.is_file():
            what = "no such file" if not path.exists() else "not a regular file"
            raise FileNotFoundError(f"read_conllu: {what} {str(path_or_text)!r}")
        return path.read_text(encoding="utf-8").splitlines(), str(path)
    if hasattr(path_or_text, "read"):
        return io.StringIO(path_or_text.read()), getattr(path_or_text, "name", "<stream>")
    raise ValueError(
        f"read_conllu: path_or_text must be a path, CoNLL-U text or a text stream, got {type(path_or_text).__name__}"
    )


class _Builder:
    """Accumulates the lines of one sentence and checks it when it ends."""

    def __init__(self, source: str, enhanced: bool = False) -> None:
        self.source = source
        self.enhanced = enhanced
        self.reset()

    def reset(self) -> None:
        self.comments: List[str] = []
        self.columns: List[List[str]] = []
        self.line_numbers: List[int] = []
        self.ranges: List[Tuple[int, int, str, int]] = []
        self.empty_lines: List[Tuple[List[str], int]] = []
        self.first_line: Optional[int] = None

    @property
    def empty(self) -> bool:
        return not self.columns and not self.comments and not self.ranges

    def error(self, line_number: int, message: str) -> ValueError:
        return ValueError(f"{self.source}, line {line_number}: {message}")

    def add_comment(self, line_number: int, text: str) -> None:
        if self.first_line is None:
            self.first_line = line_number
        self.comments.append(text)

    def add_line(self, line_number: int, line: str) -> None:
        if self.first_line is None:
            self.first_line = line_number
        cols = line.split("\t")
        if len(cols) != _NUM_COLUMNS:
            raise self.error(line_number, f"expected {_NUM_COLUMNS} tab-separated columns, got {len(cols)}: {line!r}")
        word_id = cols[0]
        if "-" in word_id:
            parts = word_id.split("-")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise self.error(line_number, f"bad multiword token range {word_id!r}")
            first, last = int(parts[0]), int(parts[1])
            if first < 1 or last < first:
                raise self.error(line_number, f"bad multiword token range {word_id!r}")
            if first != len(self.columns) + 1:
                raise self.error(line_number, f"multiword token range {word_id!r} does not start at the next "
                                              f"word ({len(self.columns) + 1})")
            self.ranges.append((first - 1, last - 1, cols[1], line_number))
            return
        if "." in word_id:
            parts = word_id.split(".")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise self.error(line_number, f"bad empty-node ID {word_id!r}")
            if self.enhanced:
                self.empty_lines.append((cols, line_number))
            return  # empty nodes belong to enhanced dependencies only
        if not word_id.isdigit():
            raise self.error(line_number, f"bad word ID {word_id!r} (expected an integer, a range a-b or a decimal a.b)")
        expected = len(self.columns) + 1
        if int(word_id) != expected:
            raise self.error(line_number, f"word ID {word_id} out of sequence (expected {expected})")
        head = cols[6]
        if not (head.isdigit() or (head.startswith("-") and head[1:].isdigit())):
            raise self.error(line_number, f"head {head!r} of word {word_id} is not an integer")
        if int(head) < 0:
            raise self.error(line_number, f"head {head} of word {word_id} is negative (0 marks the root)")
        self.columns.append(cols)
        self.line_numbers.append(line_number)

    def finish(self) -> Optional[Sentence]:
        if not self.columns:
            if self.ranges:
                raise self.error(self.ranges[0][3], "multiword token range with no words")
            self.reset()
            return None  # comments only (e.g. a trailing "# newdoc"): not a sentence
        n = len(self.columns)
        heads = []
        for cols, line_number in zip(self.columns, self.line_numbers):
            head = int(cols[6])
            if head > n:
                raise self.error(line_number, f"head {head} of word {cols[0]} out of range (sentence has {n} words)")
            if head == int(cols[0]):
                raise self.error(line_number, f"word {cols[0]} is its own head")
            heads.append(head - 1)
        cycle = _find_cycle(heads)
        if cycle is not None:
            path = " -> ".join(str(i + 1) for i in cycle)
            raise self.error(self.line_numbers[cycle[0]], f"heads form a cycle ({path}) that never reaches the root")
        for first, last, _, line_number in self.ranges:
            if last >= n:
                raise self.error(line_number, f"multiword token range {first + 1}-{last + 1} goes past the last word {n}")
        edges, deprels, empty = self.enhanced_graph(n) if self.enhanced else ([], [], [])
        meta: Dict[str, str] = {}
        for comment in self.comments:
            key, sep, value = comment.partition("=")
            if sep:
                meta.setdefault(key.strip(), value.strip())
        columns = list(zip(*self.columns))
        sentence = Sentence(
            words=list(columns[1]), heads=heads, lemmas=list(columns[2]), upos=list(columns[3]),
            xpos=list(columns[4]), feats=list(columns[5]), deprel=list(columns[7]), deps=list(columns[8]),
            misc=list(columns[9]), multiword_tokens=[(f, l, form) for f, l, form, _ in self.ranges],
            sent_id=meta.get("sent_id"), text=meta.get("text"), comments=list(self.comments),
            enhanced_edges=edges, enhanced_deprels=deprels, empty_nodes=empty,
        )
        self.reset()
        return sentence


    def enhanced_graph(self, n: int):
        """``(edges, deprels, empty_nodes)`` of the DEPS column (see :attr:`Sentence.enhanced_edges`): words are
        nodes 0 .. n-1, the k-th empty node is node n + k."""
        node = {str(i + 1): i for i in range(n)}
        empty = []
        for k, (cols, line_number) in enumerate(self.empty_lines):
            major = int(cols[0].split(".")[0])
            if major > n:
                raise self.error(line_number, f"empty node {cols[0]} comes after word {major}, past the last word {n}")
            if cols[0] in node:
                raise self.error(line_number, f"empty node {cols[0]} appears twice")
            node[cols[0]] = n + k
            empty.append((cols[0], cols[1]))
        edges: List[Tuple[int, int]] = []
        deprels: List[str] = []
        lines = list(zip(self.columns, self.line_numbers)) + self.empty_lines
        for cols, line_number in lines:
            deps = cols[8]
            if deps == "_":
                raise self.error(line_number, f"word {cols[0]} has no DEPS (enhanced=True reads the enhanced graph of "
                                              "the DEPS column; this file has none: read it with enhanced=False)")
            dependent = node[cols[0]]
            for entry in deps.split("|"):
                head, sep, relation = entry.partition(":")
                if not sep or not relation:
                    raise self.error(line_number, f"DEPS entry {entry!r} of word {cols[0]} is not head:relation")
                if head == "0":
                    continue  # the root attachment: no edge
                if head not in node:
                    raise self.error(line_number, f"DEPS head {head} of word {cols[0]} names no word or empty node "
                                                  f"of the sentence ({n} words, {len(empty)} empty nodes)")
                edges.append((node[head], dependent))
                deprels.append(relation)
        return edges, deprels, empty


def _find_cycle(heads: List[int]) -> Optional[List[int]]:
    """A cycle of words (starting at its smallest) if some word never reaches a root, else None."""
    n = len(heads)
    state = [0] * n  # 0 unvisited, 1 on the current path, 2 reaches a root
    for start in range(n):
        path = []
        node = start
        while node != -1 and state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node]
        if node != -1 and state[node] == 1:
            cycle = path[path.index(node):]
            k = cycle.index(min(cycle))
            cycle = cycle[k:] + cycle[:k]
            return cycle + [cycle[0]]
        for p in path:
            state[p] = 2
    return None


def read_conllu(path_or_text: Union[str, os.PathLike, io.TextIOBase], *, enhanced: bool = False) -> List[Sentence]:
    """Read CoNLL-U into a list of :class:`Sentence` (0-based heads, -1 for the root).

    Args:
        path_or_text: a path (``str`` or ``pathlib.Path``), the CoNLL-U text itself (a ``str`` that contains
            a newline or a tab), or an open text stream.
        enhanced: also read the enhanced dependency graph of the DEPS column (``head:rel|head:rel``, several heads
            per word) into :attr:`Sentence.enhanced_edges` (``(head, dependent)`` pairs) and
            :attr:`Sentence.enhanced_deprels`. Empty nodes (``8.1``) are nodes of that graph: the sentence's k-th
            empty node in file order is node ``L + k`` after its L words (:attr:`Sentence.empty_nodes`,
            :attr:`Sentence.num_nodes`), so a path through an elided predicate keeps its length. Build the graph
            over ``num_nodes`` tokens (``GraphBatch.from_edges([s.enhanced_edges ...], lengths=[s.num_nodes ...])``);
            the words' distances are the first L rows and columns. A word without DEPS (``_``) raises ValueError.

    Multiword-token range lines and empty nodes are skipped (ranges are kept in
    ``Sentence.multiword_tokens``). Raises ``ValueError`` with the line number for a malformed line or for an
    empty (or blank) string, ``FileNotFoundError`` for a missing file and ``IsADirectoryError`` for a directory.
    """
    lines, source = _open_source(path_or_text)
    if not isinstance(enhanced, bool):
        raise ValueError(f"read_conllu: enhanced must be a bool, got {enhanced!r}")
    builder = _Builder(source, enhanced)
    sentences: List[Sentence] = []
    line_number = 0
    for line_number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if line_number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        if not line.strip():
            sentence = builder.finish()
            if sentence is not None:
                sentences.append(sentence)
        elif line.startswith("#"):
            builder.add_comment(line_number, line[1:].strip())
        else:
            builder.add_line(line_number, line)
    sentence = builder.finish()
    if sentence is not None:
        sentences.append(sentence)
    return sentences


def _convert(heads, name: str, fn):
    """Apply ``fn(array, positions, where)`` to a list (nested or ragged), NumPy array or tensor of heads,
    returning the same kind of object."""
    if isinstance(heads, torch.Tensor):
        if heads.dtype.is_floating_point or heads.dtype == torch.bool or heads.is_complex():
            raise ValueError(f"{name}: heads must have an integer dtype, got {heads.dtype}")
        positions = torch.arange(heads.shape[-1], device=heads.device) if heads.dim() else None
        return fn(heads, positions, torch.where)
    if isinstance(heads, np.ndarray):
        if heads.dtype.kind not in "iu":
            raise ValueError(f"{name}: heads must have an integer dtype, got {heads.dtype}")
        return fn(heads, np.arange(heads.shape[-1]) if heads.ndim else None, np.where)
    if isinstance(heads, (list, tuple)) and any(isinstance(r, (list, tuple, np.ndarray, torch.Tensor)) for r in heads):
        return [_convert(row, name, fn) for row in heads]  # one row at a time: rows may be ragged
    if not isinstance(heads, (list, tuple)):
        raise ValueError(f"{name}: heads must be a list, NumPy array or tensor, got {type(heads).__name__}")
    for i, h in enumerate(heads):
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)):
            raise ValueError(f"{name}: head {i} is {h!r}, not an integer")
    array = np.asarray(heads, dtype=np.int64)
    return fn(array, np.arange(array.shape[-1]), np.where).tolist()


def from_conllu_heads(heads, *, ignore_index: Optional[int] = None):
    """Convert CoNLL-U heads (1-based, 0 = root) to the package convention (0-based, -1 = root).

    Args:
        heads: a list (or list of lists, possibly ragged), NumPy array or tensor of any shape.
        ignore_index: values equal to this (e.g. a padding value) are returned unchanged.

    Returns the same kind of object (list, array or tensor). Raises ``ValueError`` for negative heads.
    """
    def fn(h, _positions, where):
        keep = h == ignore_index if ignore_index is not None else None
        bad = (h < 0) if keep is None else ((h < 0) & ~keep)
        if bool(bad.any()):
            raise ValueError(f"from_conllu_heads: heads must be >= 0 (0 marks the root), got {int(h[bad].min())}")
        out = h - 1
        return out if keep is None else where(keep, h, out)

    return _convert(heads, "from_conllu_heads", fn)


def from_self_root(heads, *, ignore_index: Optional[int] = None):
    """Convert "the root is its own parent" heads (0-based, ``heads[i] == i`` for a root) to -1 roots.

    Args:
        heads: a list (or list of lists, possibly ragged), NumPy array or tensor; the last dimension indexes
            tokens, so ``heads[..., i] == i`` marks token i as a root.
        ignore_index: values equal to this (e.g. a padding value) are returned unchanged.

    Returns the same kind of object. Raises ``ValueError`` for negative heads (other than ``ignore_index``).
    """
    def fn(h, positions, where):
        if positions is None:
            raise ValueError("from_self_root: heads must have at least one dimension")
        keep = h == ignore_index if ignore_index is not None else None
        bad = (h < 0) if keep is None else ((h < 0) & ~keep)
        if bool(bad.any()):
            raise ValueError(f"from_self_root: heads must be >= 0 (a root is its own head), got {int(h[bad].min())}")
        out = where(h == positions, -1, h)
        return out if keep is None else where(keep, h, out)

    return _convert(heads, "from_self_root", fn)
