"""Constituency trees (docs/semantics.md, "Constituency trees"): PTB-style brackets and stanza constituency parses,
turned into what the package already takes.

Syntax-BERT uses dependency *and* constituency trees. A constituency tree relates phrases, not words; the package
gives two views of it over the words:

- **Head rules** (:meth:`PhraseTree.heads`): every phrase's head child by the head table of Collins (1999,
  Appendix A; the NP rule included, the coordination adjustment not), the lexical head percolating up; every other
  child's head word then depends on its phrase's head word. The result is a dependency tree (0-based heads, -1 for
  the root), so :class:`~syntaxkernels.trees.Sentence`, ``align_to_tokens``, ``TreeCollator``,
  :class:`~syntaxkernels.TreeBatch` and :class:`~syntaxkernels.trees.PackedTreeBatch` take it unchanged, padded and
  packed: the distance bias, the GAT's window and Syntax-BERT's parent / child / sibling masks (those of the
  lexicalised tree) all follow. Labels outside the table (SST's sentiment labels) take the first child
  (``rules="collins"``); ``rules="left"`` / ``"right"`` make every phrase left- / right-headed.
- **Phrase distances** (:meth:`PhraseTree.phrase_distance`, :func:`constituency_distance`): the number of edges
  between two words through the phrase nodes (a word's preterminal folded into the word: ``the`` and ``dog`` of
  ``(NP (DT the) (NN dog))`` are 2 apart), saturating at 254 like every distance. A ``uint8 [B, N, N]`` tensor, for
  the ops that take a bare distance (``syntax_bias_attention``, ``DistanceBias.attend``, ``SyntaxGAT``); padded
  batches only (a TreeBatch's relations need heads).

Readers: :func:`read_brackets` (PTB / Penn-style bracketed text or a file of it: several trees, an unlabeled outer
bracket, ``-NONE-`` empty elements and the phrases they leave empty removed, function tags kept in the labels and
ignored by the head rules) and :func:`from_stanza_constituency` (a stanza ``Document`` parsed with the
``constituency`` processor, or stanza trees).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .batch import build_tree_tensors
from .conllu import Sentence

__all__ = ["PhraseTree", "read_brackets", "from_stanza_constituency", "constituency_distance", "COLLINS_HEAD_RULES",
           "PTB_TO_UPOS"]

#: Collins (1999), Appendix A: per phrase label, the search direction and the categories in priority order (for
#: each category in turn, the first child of it in that direction is the head; none: the first child in that
#: direction). NP has its own rule (:func:`_np_head`).
COLLINS_HEAD_RULES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "ADJP": ("left", ("NNS", "QP", "NN", "$", "ADVP", "JJ", "VBN", "VBG", "ADJP", "JJR", "NP", "JJS", "DT", "FW",
                      "RBR", "RBS", "SBAR", "RB")),
    "ADVP": ("right", ("RB", "RBR", "RBS", "FW", "ADVP", "TO", "CD", "JJR", "JJ", "IN", "NP", "JJS", "NN")),
    "CONJP": ("right", ("CC", "RB", "IN")),
    "FRAG": ("right", ()),
    "INTJ": ("left", ()),
    "LST": ("right", ("LS", ":")),
    "NAC": ("left", ("NN", "NNS", "NNP", "NNPS", "NP", "NAC", "EX", "$", "CD", "QP", "PRP", "VBG", "JJ", "JJS",
                     "JJR", "ADJP", "FW")),
    "PP": ("right", ("IN", "TO", "VBG", "VBN", "RP", "FW")),
    "PRN": ("left", ()),
    "PRT": ("right", ("RP",)),
    "QP": ("left", ("$", "IN", "NNS", "NN", "JJ", "RB", "DT", "CD", "NCD", "QP", "JJR", "JJS")),
    "RRC": ("right", ("VP", "NP", "ADVP", "ADJP", "PP")),
    "S": ("left", ("TO", "IN", "VP", "S", "SBAR", "ADJP", "UCP", "NP")),
    "SBAR": ("left", ("WHNP", "WHPP", "WHADVP", "WHADJP", "IN", "DT", "S", "SQ", "SINV", "SBAR", "FRAG")),
    "SBARQ": ("left", ("SQ", "S", "SINV", "SBARQ", "FRAG")),
    "SINV": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "S", "SINV", "ADJP", "NP")),
    "SQ": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "SQ")),
    "UCP": ("right", ()),
    "VP": ("left", ("TO", "VBD", "VBN", "MD", "VBZ", "VB", "VBG", "VBP", "VP", "ADJP", "NN", "NNS", "NP")),
    "WHADJP": ("left", ("CC", "WRB", "JJ", "ADJP")),
    "WHADVP": ("right", ("CC", "WRB")),
    "WHNP": ("left", ("WDT", "WP", "WP$", "WHADJP", "WHPP", "WHNP")),
    "WHPP": ("right", ("IN", "TO", "FW")),
}

#: A coarse map from Penn Treebank tags to UPOS (for the GAT's POS input); anything else is ``X``.
PTB_TO_UPOS: Dict[str, str] = {
    **{t: "NOUN" for t in ("NN", "NNS")}, **{t: "PROPN" for t in ("NNP", "NNPS")},
    **{t: "VERB" for t in ("VB", "VBD", "VBG", "VBN", "VBP", "VBZ")}, "MD": "AUX",
    **{t: "ADJ" for t in ("JJ", "JJR", "JJS", "AFX")}, **{t: "ADV" for t in ("RB", "RBR", "RBS", "WRB")},
    **{t: "DET" for t in ("DT", "PDT", "WDT")}, "IN": "ADP", **{t: "PART" for t in ("TO", "POS", "RP")},
    "CC": "CCONJ", "CD": "NUM", **{t: "PRON" for t in ("PRP", "PRP$", "WP", "WP$", "EX")}, "UH": "INTJ",
    **{t: "SYM" for t in ("SYM", "$", "#")},
    **{t: "PUNCT" for t in (".", ",", ":", "``", "''", "-LRB-", "-RRB-", "HYPH", "NFP")},
}


def _category(label: str) -> str:
    """The label without function tags and indices (``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``; ``-LRB-`` kept)."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


@dataclass
class PhraseTree:
    """One constituency tree over its words.

    Nodes ``0 .. n-1`` are the words (each with its preterminal folded in), nodes ``n ..`` the phrases in pre-order
    (the root phrase first). ``parents[node]`` is the parent phrase's node, -1 for the root.

    Attributes:
        words: the leaves, length n.
        tags: each word's preterminal label (a PTB POS tag; ``""`` for a leaf without one), length n.
        labels: the phrases' labels, in pre-order.
        parents: length ``n + len(labels)``.
    """

    words: List[str]
    tags: List[str]
    labels: List[str]
    parents: List[int]
    _children: Optional[List[List[int]]] = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def children(self) -> List[List[int]]:
        """Each node's children in left-to-right order."""
        if self._children is None:
            out: List[List[int]] = [[] for _ in self.parents]
            order = sorted(range(self.num_nodes), key=self._position)
            for node in order:
                parent = self.parents[node]
                if parent >= 0:
                    out[parent].append(node)
            self._children = out
        return self._children

    def _position(self, node: int) -> Tuple[int, int]:
        """Sort key of a node among its siblings: its first word (phrases before nothing else share one)."""
        return (self._first_word(node), 0 if node < len(self.words) else 1)

    def _first_word(self, node: int) -> int:
        if node < len(self.words):
            return node
        if not hasattr(self, "_first"):
            first = list(range(len(self.words))) + [len(self.words)] * len(self.labels)
            for word in range(len(self.words)):
                p = self.parents[word]
                while p >= 0 and first[p] > word:
                    first[p] = word
                    p = self.parents[p]
            self._first = first
        return self._first[node]

    def node_label(self, node: int) -> str:
        return self.tags[node] if node < len(self.words) else self.labels[node - len(self.words)]

    def heads(self, rules: str = "collins") -> List[int]:
        """Dependency heads of the words (0-based, -1 for the root) by head rules: ``"collins"`` (module
        docstring), ``"left"`` or ``"right"`` (every phrase headed by its first / last child)."""
        if rules not in ("collins", "left", "right"):
            raise ValueError(f"rules must be 'collins', 'left' or 'right', got {rules!r}")
        n = len(self.words)
        children = self.children()
        head_word = list(range(n)) + [-1] * len(self.labels)
        for node in range(self.num_nodes - 1, n - 1, -1):  # pre-order reversed: children before their parent
            kids = children[node]
            if not kids:
                continue
            head_word[node] = head_word[self._head_child(node, kids, rules)]
        out = [-1] * n
        for node in range(n, self.num_nodes):
            h = head_word[node]
            if h < 0:
                continue
            for kid in children[node]:
                if head_word[kid] >= 0 and head_word[kid] != h:
                    out[head_word[kid]] = h
        return out

    def _head_child(self, node: int, kids: List[int], rules: str) -> int:
        if rules == "left" or len(kids) == 1:
            return kids[0]
        if rules == "right":
            return kids[-1]
        cats = [_category(self.node_label(k)) for k in kids]
        label = _category(self.node_label(node))
        if label in ("NP", "NX", "NML"):
            return kids[_np_head(cats)]
        direction, priority = COLLINS_HEAD_RULES.get(label, ("left", ()))
        order = list(range(len(kids))) if direction == "left" else list(range(len(kids) - 1, -1, -1))
        for category in priority:
            for i in order:
                if cats[i] == category:
                    return kids[i]
        return kids[order[0]]

    def phrase_distance(self) -> torch.Tensor:
        """``uint8 [n, n]``: edges between two words through the phrase nodes (module docstring)."""
        n = len(self.words)
        if n == 0:
            return torch.zeros(0, 0, dtype=torch.uint8)
        _, _, distance, _, _ = build_tree_tensors([list(self.parents)])
        return distance[0, :n, :n].contiguous()

    def to_sentence(self, rules: str = "collins") -> Sentence:
        """A :class:`~syntaxkernels.trees.Sentence`: the words, their head-rule heads, ``xpos`` the tags and
        ``upos`` their coarse UPOS (:data:`PTB_TO_UPOS`; ``X`` for anything else)."""
        upos = [PTB_TO_UPOS.get(t, "X") for t in self.tags]
        return Sentence(words=list(self.words), heads=self.heads(rules), upos=upos, xpos=list(self.tags))

    def __str__(self) -> str:
        children = self.children()

        def fmt(node: int) -> str:
            if node < len(self.words):
                return f"({self.tags[node]} {self.words[node]})" if self.tags[node] else self.words[node]
            return f"({self.node_label(node)} " + " ".join(fmt(k) for k in children[node]) + ")"

        roots = [node for node in range(self.num_nodes) if self.parents[node] < 0]
        return " ".join(fmt(r) for r in roots)


def _np_head(cats: List[str]) -> int:
    """Collins's NP rule over the children's categories: the index of the head child."""
    last = len(cats) - 1
    if cats[last] == "POS":
        return last
    for i in range(last, -1, -1):
        if cats[i] in ("NN", "NNP", "NNPS", "NNS", "NX", "POS", "JJR"):
            return i
    for i in range(len(cats)):
        if cats[i] == "NP":
            return i
    for group in (("$", "ADJP", "PRN"), ("CD",), ("JJ", "JJS", "RB", "QP")):
        for i in range(last, -1, -1):
            if cats[i] in group:
                return i
    return last


# ---------------------------------------------------------------------------------------------------- readers


_TOKEN = re.compile(r"\(|\)|[^\s()]+")


class _Node:
    __slots__ = ("label", "children")

    def __init__(self, label: str):
        self.label = label
        self.children: list = []


def _parse(text: str) -> List[_Node]:
    """Bracketed text -> nested nodes (a leaf is a plain string)."""
    roots: List[_Node] = []
    stack: List[_Node] = []
    tokens = _TOKEN.findall(text)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "(":
            label = ""
            if i + 1 < len(tokens) and tokens[i + 1] not in ("(", ")"):
                label = tokens[i + 1]
                i += 1
            node = _Node(label)
            (stack[-1].children if stack else roots).append(node)
            stack.append(node)
        elif tok == ")":
            if not stack:
                raise ValueError(f"read_brackets: unbalanced ')' at token {i}")
            stack.pop()
        else:
            if not stack:
                raise ValueError(f"read_brackets: word {tok!r} outside any bracket")
            stack[-1].children.append(tok)
        i += 1
    if stack:
        raise ValueError(f"read_brackets: {len(stack)} unclosed bracket(s)")
    return roots


def _prune(node):
    """Remove ``-NONE-`` empty elements and the phrases they leave empty; None when nothing is left."""
    if isinstance(node, str):
        return node
    if node.label == "-NONE-":
        return None
    kept = [c for c in (_prune(c) for c in node.children) if c is not None]
    if not kept:
        return None
    node.children = kept
    return node


def _to_tree(root) -> PhraseTree:
    """Nested nodes (``.label``, ``.children``; a leaf: a string, or a node without children) -> PhraseTree."""
    words: List[str] = []
    tags: List[str] = []
    labels: List[str] = []
    word_parent: List[int] = []
    phrase_parent: List[int] = []

    def is_leaf(node) -> bool:
        return isinstance(node, str) or not node.children

    def leaf_text(node) -> str:
        return node if isinstance(node, str) else str(node.label)

    def visit(node, parent: int) -> None:
        if is_leaf(node):  # a bare word under a phrase
            words.append(leaf_text(node))
            tags.append("")
            word_parent.append(parent)
            return
        kids = list(node.children)
        if len(kids) == 1 and is_leaf(kids[0]):  # a preterminal: folded into its word
            words.append(leaf_text(kids[0]))
            tags.append(str(node.label))
            word_parent.append(parent)
            return
        me = len(labels)
        labels.append(str(node.label))
        phrase_parent.append(parent)
        for kid in kids:
            visit(kid, me)

    visit(root, -1)
    n = len(words)
    if not labels:  # a single preterminal or word: one node, no phrase
        return PhraseTree(words, tags, [], [-1] * n)
    parents = [p + n for p in word_parent] + [p + n if p >= 0 else -1 for p in phrase_parent]
    return PhraseTree(words, tags, labels, parents)


def read_brackets(source: Union[str, os.PathLike]) -> List[PhraseTree]:
    """PTB-style bracketed trees from text or a file: one :class:`PhraseTree` per top-level bracket.

    An unlabeled outer bracket with one child (``( (S ...) )``) is dropped; ``-NONE-`` empty elements and the
    phrases they leave empty are removed. ``ValueError`` for unbalanced brackets or a word outside any bracket.
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "(" not in source):
        source = Path(source).read_text(encoding="utf-8")
    trees = []
    for root in _parse(source):
        while root.label == "" and len(root.children) == 1 and not isinstance(root.children[0], str):
            root = root.children[0]
        root = _prune(root)
        if root is not None:
            trees.append(_to_tree(root))
    return trees


def from_stanza_constituency(doc) -> List[PhraseTree]:
    """PhraseTrees from a stanza ``Document`` parsed with the ``constituency`` processor (one per sentence), a
    stanza ``Sentence``, a stanza constituency tree or a list of those (anything with ``label`` and ``children``)."""
    if hasattr(doc, "sentences"):
        return [from_stanza_constituency(s)[0] for s in doc.sentences]
    if hasattr(doc, "constituency") and not hasattr(doc, "children"):
        return from_stanza_constituency(doc.constituency)
    if isinstance(doc, (list, tuple)):
        return [t for item in doc for t in from_stanza_constituency(item)]
    if not (hasattr(doc, "label") and hasattr(doc, "children")):
        raise TypeError(f"expected a stanza Document, Sentence or constituency tree, got {type(doc).__name__}")
    root = doc
    while root.label in ("ROOT", "TOP", "") and len(root.children) == 1 and root.children[0].children:
        root = root.children[0]
    return [_to_tree(root)]


# ---------------------------------------------------------------------------------------------------- batches


def constituency_distance(trees: Sequence[PhraseTree], word_ids: Optional[Sequence[Sequence[Optional[int]]]] = None,
                          *, width: Optional[int] = None) -> torch.Tensor:
    """Phrase distances of a batch, ``uint8 [B, N, N]`` (255 for padding), for the ops that take a distance.

    Without ``word_ids``: over the words (N the longest tree). With ``word_ids`` (a fast tokenizer's, None for special
    tokens): over the tokens, with the token rules of :func:`~syntaxkernels.trees.align_to_tokens` on the node tree
    (the first piece of a word is the word's node, the other pieces its children; the first special token is the
    parent of the root phrase, every other special token its child).
    """
    rows = []
    for b, tree in enumerate(trees):
        n = len(tree)
        if word_ids is None:
            rows.append((tree.parents, n))
            continue
        ids = list(word_ids[b])
        T = len(ids)
        first: Dict[int, int] = {}
        for p, w in enumerate(ids):
            if w is not None:
                if not 0 <= w < n:
                    raise ValueError(f"constituency_distance: batch item {b}, token {p}: word id {w} out of range "
                                     f"({n} words)")
                first.setdefault(w, p)
        missing = [w for w in range(n) if w not in first]
        if missing:
            raise ValueError(f"constituency_distance: batch item {b}: no token for word(s) {missing[:5]}")
        special = next((p for p, w in enumerate(ids) if w is None), None)
        parents = [0] * (T + len(tree.labels))

        def node(x: int) -> int:  # a tree node -> its node here (words: their first piece; phrases: after T)
            return first[x] if x < n else T + x - n

        for p, w in enumerate(ids):
            if w is None:
                parents[p] = -1 if p == special else special
            elif first[w] != p:
                parents[p] = first[w]
            else:
                up = tree.parents[w]
                parents[p] = node(up) if up >= 0 else (special if special is not None else -1)
        for k in range(len(tree.labels)):
            up = tree.parents[n + k]
            parents[T + k] = node(up) if up >= 0 else (special if special is not None else -1)
        rows.append((parents, T))
    N = max((t for _, t in rows), default=0) if width is None else width
    out = torch.full((len(rows), N, N), 255, dtype=torch.uint8)
    for b, (parents, t) in enumerate(rows):
        if t:
            _, _, distance, _, _ = build_tree_tensors([list(parents)])
            out[b, :t, :t] = distance[0, :t, :t]
    return out
