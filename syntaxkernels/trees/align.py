"""Word-level dependency trees to subword-token trees (docs/semantics.md, "Words to subword tokens").

Given word-level heads and a fast tokenizer's ``word_ids()`` (``None`` for special and padding tokens):

- the first piece of a word carries the word's head, mapped to the head word's first piece;
- the other pieces of a word are children of its first piece;
- the first special token (``[CLS]``, ``<s>``) is the root of the whole sequence; with ``connect=True``
  every sentence root attaches to it, so the sequence is one tree;
- every other special token (``[SEP]``, ``</s>``, padding) attaches to the first special token.

``connect=False`` keeps each sentence a separate tree (its root word's first piece has head -1); the
special tokens then form one more tree of their own, rooted at the first special token. Without any
special token (``add_special_tokens=False``) and ``connect=True``, the first sentence root in token order
becomes the root of the sequence and the other sentence roots attach to it.

Texts and sentence pairs. A *text* is one sentence or a list of sentences (a sentence is a
:class:`~syntaxkernels.trees.Sentence`, anything with a ``heads`` attribute, or a plain list of 0-based
heads); its words are the concatenation of its sentences' words, and word ids index into them. For a
pair, tokenised as ``tokenizer(words_a, words_b, is_split_into_words=True)``, word ids restart at 0 in
the second text: pass ``sequence_ids=encoding.sequence_ids()`` and ``sentences=[text_a, text_b]`` (with
``sequence_ids`` given, ``sentences`` is always one entry per text, indexed by sequence id).

Missing words. ``missing_words="error"`` (default) rejects word ids that leave a word of a text without any
token. ``missing_words="reattach"`` accepts them — for truncation (``truncation=True`` cuts the end of a
text, or its start with ``truncation_side="left"``) and for words the tokenizer turns into no pieces: a
token whose head word is missing re-attaches to the nearest ancestor word that is present, or, when none
is, counts as a sentence root (attached to the sequence root with ``connect=True``). A word that keeps
only some of its pieces is represented by the first piece that remains.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..variants import check_variant

__all__ = ["align_to_tokens", "align_batch", "align_edges_to_tokens", "align_edges_batch"]

_ROOT = -2  # placeholder for "a sentence root" until the sequence root is known


def _sentence_heads(obj) -> Optional[List[int]]:
    """The heads of a sentence-like object, or None if it is not one."""
    if hasattr(obj, "heads"):
        return [int(h) for h in obj.heads]
    if isinstance(obj, (list, tuple, np.ndarray, torch.Tensor)):
        values = obj.tolist() if isinstance(obj, (np.ndarray, torch.Tensor)) else list(obj)
        if all(isinstance(h, (int, np.integer)) and not isinstance(h, bool) for h in values):
            return [int(h) for h in values]
    return None


def _text_heads(obj) -> Optional[List[List[int]]]:
    """A text (one sentence or a list of sentences) as a list of head lists, or None if it is not one."""
    heads = _sentence_heads(obj)
    if heads is not None:
        return [heads]
    if isinstance(obj, (list, tuple)):
        sentences = [_sentence_heads(s) for s in obj]
        if all(s is not None for s in sentences):
            return sentences
    return None


def _texts(sentences, sequence_ids) -> List[List[List[int]]]:
    if sequence_ids is None:
        text = _text_heads(sentences)
        if text is None:
            raise ValueError(
                "sentences must be a text: a Sentence, a list of heads, or a list of those (for a sentence "
                "pair pass sequence_ids= and sentences=[text_a, text_b])"
            )
        return [text]
    if _sentence_heads(sentences) is not None:
        return [[_sentence_heads(sentences)]]
    if not isinstance(sentences, (list, tuple)):
        raise ValueError(f"sentences must be a list of texts when sequence_ids is given, got {type(sentences).__name__}")
    texts = []
    for t, text in enumerate(sentences):
        heads = _text_heads(text)
        if heads is None:
            raise ValueError(f"sentences[{t}] is not a text (a Sentence, a list of heads, or a list of those)")
        texts.append(heads)
    return texts


def _word_heads(t: int, text: List[List[int]]) -> List[int]:
    """Concatenated word heads of a text (indices into the text's words, -1 for each sentence root)."""
    heads: List[int] = []
    for k, sentence in enumerate(text):
        offset = len(heads)
        length = len(sentence)
        hint = ("" if -1 in sentence else
                "; the sentence has no root (no head is -1): CoNLL-U heads (1-based, 0 = root) convert with "
                "sk.trees.from_conllu_heads")
        for i, h in enumerate(sentence):
            if not -1 <= h < length:
                raise ValueError(f"sentences: text {t}, sentence {k}, word {i}: head {h} out of range "
                                 f"(length {length}; expected -1 for a root or 0..{length - 1}){hint}")
            if h == i:
                raise ValueError(f"sentences: text {t}, sentence {k}, word {i}: self-loop (use -1 for a root)"
                                 f"{hint}")
            heads.append(-1 if h == -1 else h + offset)
    return heads


def align_to_tokens(
    sentences,
    word_ids: Sequence[Optional[int]],
    *,
    connect: bool = True,
    sequence_ids: Optional[Sequence[Optional[int]]] = None,
    missing_words: str = "error",
    variant: str = "paper",
) -> List[int]:
    """Token-level heads (0-based, -1 for a root) for one tokenised sequence.

    Args:
        sentences: a text (a Sentence, a list of heads, or a list of those for several sentences); with
            ``sequence_ids``, a list of texts indexed by sequence id (``[text_a, text_b]`` for a pair).
        word_ids: length N, from ``encoding.word_ids()`` of a fast tokenizer (``None`` for special and
            padding tokens).
        connect: one tree per sequence rooted at the first special token (True), or one tree per sentence
            plus one for the special tokens (False). See the module docstring.
        sequence_ids: length N, from ``encoding.sequence_ids()`` (``None`` for special tokens); needed for
            sentence pairs, whose word ids restart at 0 in the second text.
        missing_words: "error" or "reattach" (truncation; words with no pieces). See the module docstring.
        variant: the layout of syntax-augmented mBERT's token tree (docs/semantics.md, "Paper, release and
            package"). ``"paper"`` (default) and ``"package"``: the rules above (the paper's section 2.2: an edge
            from [CLS] to each sentence root and to the [SEP] tokens). ``"release"``: as the authors' data
            processors build it (``processors/utils_classify.py``, ``utils_tag.py``, ``process_sentence``): in a
            sentence pair (``sequence_ids`` given) every special token after the first hangs from the last
            token of the text before it; in a text with several sentence roots, the first root word's first
            piece is the sentence root and every piece of the other root words hangs from it. Needs
            ``connect=True``.

    Returns:
        ``list[int]`` of length N, ready for ``TreeBatch.from_heads([heads])``.

    Raises ``ValueError`` for word ids out of range, word ids that go back within a text (a pair without
    ``sequence_ids``), a text with no token, missing words with ``missing_words="error"``, and bad heads.
    """
    if missing_words not in ("error", "reattach"):
        raise ValueError(f"missing_words must be 'error' or 'reattach', got {missing_words!r}")
    check_variant(variant)
    if variant == "release" and not connect:
        raise ValueError("align_to_tokens(variant='release') builds the release's one tree per sequence: it needs "
                         "connect=True (connect=False is a package layout: variant='package')")
    texts = _texts(sentences, sequence_ids)
    word_ids = list(word_ids)
    n = len(word_ids)
    if sequence_ids is not None:
        sequence_ids = list(sequence_ids)
        if len(sequence_ids) != n:
            raise ValueError(f"sequence_ids has {len(sequence_ids)} entries but word_ids has {n}")
    text_heads = [_word_heads(t, text) for t, text in enumerate(texts)]
    first_piece: List[List[Optional[int]]] = [[None] * len(h) for h in text_heads]
    last_word = [-1] * len(texts)
    token_word: List[Optional[Tuple[int, int]]] = [None] * n
    root_token: Optional[int] = None

    for p, w in enumerate(word_ids):
        if w is None:
            if root_token is None:
                root_token = p
            continue
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise ValueError(f"word_ids[{p}] = {w!r} is not an integer or None")
        w = int(w)
        if sequence_ids is None:
            t = 0
        else:
            s = sequence_ids[p]
            if s is None:
                raise ValueError(f"token {p}: word_ids[{p}] = {w} but sequence_ids[{p}] is None")
            t = int(s)
            if not 0 <= t < len(texts):
                raise ValueError(f"token {p}: sequence_ids[{p}] = {t} but {len(texts)} text(s) were given "
                                 "(sentences must hold one text per sequence id)")
        num_words = len(text_heads[t])
        if not 0 <= w < num_words:
            raise ValueError(f"token {p}: word_ids[{p}] = {w} out of range: text {t} has {num_words} words")
        if w < last_word[t]:
            hint = (" (a sentence pair? pass sequence_ids=encoding.sequence_ids() and sentences=[text_a, text_b])"
                    if sequence_ids is None else "")
            raise ValueError(f"token {p}: word_ids[{p}] = {w} comes after word {last_word[t]} of text {t}: "
                             f"word ids must not go back within a text{hint}")
        last_word[t] = w
        if first_piece[t][w] is None:
            first_piece[t][w] = p
        token_word[p] = (t, w)

    for t, pieces in enumerate(first_piece):
        missing = [w for w, p in enumerate(pieces) if p is None]
        if not missing:
            continue
        if len(missing) == len(pieces):
            raise ValueError(f"text {t} has {len(pieces)} words but no token belongs to it "
                             "(with sequence_ids, sentences must hold one text per sequence id)")
        if missing_words == "error":
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise ValueError(f"word_ids do not cover every word: text {t} ({len(pieces)} words) has no token "
                             f"for word(s) {shown}; after truncation pass missing_words='reattach'")

    out = [-1] * n
    for p in range(n):
        tw = token_word[p]
        if tw is None:
            out[p] = -1 if p == root_token else root_token
            continue
        t, w = tw
        first = first_piece[t][w]
        if p != first:
            out[p] = first
            continue
        heads = text_heads[t]
        h = heads[w]
        steps = 0
        while h != -1 and first_piece[t][h] is None:
            h = heads[h]
            steps += 1
            if steps > len(heads):
                raise ValueError(f"sentences: text {t}, word {w}: the heads above it form a cycle")
        out[p] = _ROOT if h == -1 else first_piece[t][h]

    if variant == "release":
        _release_layout(out, token_word, text_heads, root_token, pairs=sequence_ids is not None)
    if connect:
        sequence_root = root_token
        if sequence_root is None:
            sequence_root = next((p for p in range(n) if out[p] == _ROOT), None)
        return [-1 if p == sequence_root else (sequence_root if h == _ROOT else h) for p, h in enumerate(out)]
    return [-1 if h == _ROOT else h for h in out]


def _release_layout(out: List[int], token_word, text_heads, root_token: Optional[int], pairs: bool) -> None:
    """Rewrite the token heads ``out`` in place into the release's layout (``align_to_tokens(variant="release")``):
    every piece of a root word of a text but the first hangs from that first piece; in a pair, every special token
    after the first hangs from the nearest token before it that is not special."""
    first_root: dict = {}
    for p, tw in enumerate(token_word):
        if tw is None:
            continue
        t, w = tw
        if text_heads[t][w] != -1:
            continue
        if t not in first_root:
            first_root[t] = p
            out[p] = _ROOT
        else:
            out[p] = first_root[t]
    if not pairs:
        return
    last_word_token = None
    for p, tw in enumerate(token_word):
        if tw is not None:
            last_word_token = p
        elif p != root_token and last_word_token is not None:
            out[p] = last_word_token


def _is_batch_encoding(obj) -> bool:
    return callable(getattr(obj, "word_ids", None)) and hasattr(obj, "encodings")


def batch_word_ids(word_ids, attention_mask=None):
    """``(word_ids as B lists, attention_mask)`` from B lists or a fast tokenizer's ``BatchEncoding`` (its
    ``word_ids(b)``, and its ``attention_mask`` unless one is given)."""
    if _is_batch_encoding(word_ids):
        encoding = word_ids
        if attention_mask is None and "attention_mask" in encoding:
            attention_mask = encoding["attention_mask"]
        word_ids = [encoding.word_ids(b) for b in range(len(encoding.encodings))]
    return [list(w) for w in word_ids], attention_mask


def align_batch(
    sentences: Sequence,
    word_ids,
    *,
    connect: bool = True,
    sequence_ids: Optional[Sequence[Sequence[Optional[int]]]] = None,
    attention_mask=None,
    missing_words: str = "error",
    pad_value: int = -1,
    variant: str = "paper",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`align_to_tokens` for a batch: padded heads and lengths for ``TreeBatch.from_heads``.

    Args:
        sentences: B items, each what :func:`align_to_tokens` takes.
        word_ids: B lists of word ids (length N_b), or a ``BatchEncoding`` of a fast tokenizer (its
            ``word_ids(b)`` and, unless given, its ``attention_mask`` are used).
        sequence_ids: B lists (``[encoding.sequence_ids(b) for b in range(B)]``) for sentence pairs.
        attention_mask: ``[B, N]`` 0/1; with it, lengths are the mask's row sums and the padding tokens are
            left out of the trees. Padding must be on the right (``padding_side="right"``).
        pad_value: head value written for the positions past each length.
        variant: the token tree's layout (:func:`align_to_tokens`).

    Returns:
        ``(heads int64 [B, N], lengths int64 [B])`` with N the longest word-id list;
        ``TreeBatch.from_heads(heads, lengths)`` builds the batch.
    """
    word_ids, attention_mask = batch_word_ids(word_ids, attention_mask)
    batch = len(word_ids)
    if len(sentences) != batch:
        raise ValueError(f"sentences has {len(sentences)} items but word_ids has {batch}")
    if sequence_ids is not None and len(sequence_ids) != batch:
        raise ValueError(f"sequence_ids has {len(sequence_ids)} items but word_ids has {batch}")
    width = max((len(w) for w in word_ids), default=0)
    lengths = _mask_lengths(word_ids, attention_mask)
    heads = torch.full((batch, width), pad_value, dtype=torch.int64)
    for b in range(batch):
        length = lengths[b]
        seq = None if sequence_ids is None else list(sequence_ids[b])[:length]
        try:
            row = align_to_tokens(sentences[b], word_ids[b][:length], connect=connect, sequence_ids=seq,
                                  missing_words=missing_words, variant=variant)
        except ValueError as exc:
            raise ValueError(f"batch item {b}: {exc}") from None
        if row:
            heads[b, :length] = torch.tensor(row, dtype=torch.int64)
    return heads, torch.tensor(lengths, dtype=torch.int64)


def _mask_lengths(word_ids: List[List[Optional[int]]], attention_mask) -> List[int]:
    """Each item's length: its word-id count, or with ``attention_mask`` ([B, N] 0/1, right padding) its row sum."""
    batch = len(word_ids)
    lengths = [len(w) for w in word_ids]
    if attention_mask is not None:
        if len(attention_mask) != batch:
            raise ValueError(f"attention_mask has {len(attention_mask)} rows but word_ids has {batch}")
        for b in range(batch):
            row = torch.as_tensor(attention_mask[b])
            if row.dim() != 1 or row.shape[0] < len(word_ids[b]):
                raise ValueError(f"batch item {b}: attention_mask row has shape {tuple(row.shape)}, expected "
                                 f"[{len(word_ids[b])}]")
            row = row[: len(word_ids[b])].to(torch.bool)
            length = int(row.sum())
            if not bool(row[:length].all()):
                raise ValueError(f"batch item {b}: attention_mask is not a prefix of ones "
                                 "(left padding is not supported; use padding_side='right')")
            lengths[b] = length
    return lengths


def _int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def align_edges_to_tokens(
    edges,
    num_nodes: int,
    word_ids: Sequence[Optional[int]],
    *,
    num_words: Optional[int] = None,
    roots: Optional[Sequence[int]] = None,
    missing_words: str = "error",
) -> List[Tuple[int, int]]:
    """A word-level graph (an enhanced UD graph, say) on the tokens of one tokenised sequence, laid out as
    :func:`align_to_tokens` lays out a tree (``connect=True``), so both see the same special-token structure.

    - an edge ``(u, v)`` between words becomes ``(first piece of u, first piece of v)``;
    - the other pieces of a word hang from its first piece: ``(first piece, piece)``;
    - the first special token (``[CLS]``) is the sequence root: ``(root token, first piece of r)`` for each root
      node r, and ``(root token, p)`` for every other special token p (``[SEP]``). Without any special token the
      first root in token order is the sequence root and the other roots hang from it;
    - nodes without tokens are contracted: the empty nodes (``num_words .. num_nodes - 1``, an elided predicate of
      enhanced UD, :attr:`Sentence.empty_nodes`) always, and with ``missing_words="reattach"`` the words the
      tokens do not cover (truncation): ``u -> e -> v`` with e tokenless gives ``u -> v`` (also through chains of
      tokenless nodes), so a word whose only head is an empty node stays connected; a tokenless root passes the
      root attachment on to the nodes it reaches.

    Edge directions are kept (head -> dependent for ``Sentence.enhanced_edges``, as the tree's parent -> child);
    ``GraphBatch.from_edges(..., directed=False)`` gives the symmetric distance, which for a tree given as its
    edges (``[(heads[i], i) for i with heads[i] >= 0]``, ``roots`` its root words) equals the token tree's
    distance from :func:`align_to_tokens`.

    Args:
        edges: ``(source, target)`` node pairs, 0-based (a list of pairs or an int tensor ``[E, 2]``); self-loops
            and repeated edges are allowed and dropped.
        num_nodes: the graph's nodes (``Sentence.num_nodes``): words ``0 .. num_words - 1``, then empty nodes.
        word_ids: length N, from ``encoding.word_ids()`` of a fast tokenizer (``None`` for special tokens); cut it
            to the valid length first (padding tokens would count as special tokens).
        num_words: the words among the nodes (default ``num_nodes``: no empty nodes).
        roots: the nodes attached to the sequence root (the ``0:root`` of the DEPS column; enhanced graphs can
            give the root word incoming edges, so say which); default: the nodes without an incoming edge.
        missing_words: "error" (default): a word with no token is refused; "reattach": it is contracted.

    Returns:
        ``list[(source, target)]`` of token positions in ``0 .. N - 1``, without repeats or self-loops, ready for
        ``GraphBatch.from_edges([edges], lengths=[N])``.

    Raises ``ValueError`` for a bad edge (naming it), node counts, roots or word ids out of range, and uncovered
    words with ``missing_words="error"``.
    """
    if missing_words not in ("error", "reattach"):
        raise ValueError(f"missing_words must be 'error' or 'reattach', got {missing_words!r}")
    if not _int(num_nodes) or num_nodes < 0:
        raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    num_nodes = int(num_nodes)
    num_words = num_nodes if num_words is None else num_words
    if not _int(num_words) or not 0 <= num_words <= num_nodes:
        raise ValueError(f"num_words must be an int in 0..num_nodes ({num_nodes}), got {num_words!r}")
    num_words = int(num_words)
    if isinstance(edges, (torch.Tensor, np.ndarray)):
        edges = edges.tolist()
    out_edges: List[List[int]] = [[] for _ in range(num_nodes + 1)]  # node num_nodes: the sequence root
    has_head = [False] * num_nodes
    for e, pair in enumerate(edges):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_int(x) for x in pair)):
            raise ValueError(f"edge {e}: {pair!r} is not a pair of ints")
        u, v = int(pair[0]), int(pair[1])
        for name, x in (("source", u), ("target", v)):
            if not 0 <= x < num_nodes:
                raise ValueError(f"edge {e}: ({u}, {v}): {name} {x} out of range (num_nodes {num_nodes}; "
                                 f"expected 0..{num_nodes - 1})")
        if u != v:
            out_edges[u].append(v)
            has_head[v] = True
    if roots is None:
        roots = [v for v in range(num_nodes) if not has_head[v]]
    for r in roots:
        if not _int(r) or not 0 <= r < num_nodes:
            raise ValueError(f"roots: {r!r} out of range (num_nodes {num_nodes})")
    out_edges[num_nodes] = [int(r) for r in roots]

    word_ids = list(word_ids)
    first_piece: List[Optional[int]] = [None] * num_words
    root_token: Optional[int] = None
    pieces: List[Tuple[int, int]] = []
    specials: List[int] = []
    for p, w in enumerate(word_ids):
        if w is None:
            if root_token is None:
                root_token = p
            else:
                specials.append(p)
            continue
        if not _int(w) or not 0 <= w < num_words:
            raise ValueError(f"token {p}: word_ids[{p}] = {w!r} out of range: the graph has {num_words} words")
        if first_piece[w] is None:
            first_piece[w] = p
        else:
            pieces.append((first_piece[w], p))
    missing = [w for w in range(num_words) if first_piece[w] is None]
    if missing and missing_words == "error":
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise ValueError(f"word_ids do not cover every word: the graph ({num_words} words) has no token for "
                         f"word(s) {shown}; after truncation pass missing_words='reattach'")

    def token(node: int) -> Optional[int]:
        return first_piece[node] if node < num_words else None

    # Contracted edges from the sequence root, then from each word with a token, in token order.
    sources = [num_nodes] + sorted((w for w in range(num_words) if first_piece[w] is not None),
                                   key=lambda w: first_piece[w])
    root_targets: List[int] = []
    result: List[Tuple[int, int]] = []
    seen = set()
    for u in sources:
        visited = {u}
        stack = list(reversed(out_edges[u]))
        reached: List[int] = []
        while stack:
            v = stack.pop()
            if v in visited:
                continue
            visited.add(v)
            t = token(v)
            if t is None:
                stack.extend(reversed(out_edges[v]))  # tokenless: pass through
            else:
                reached.append(t)
        if u == num_nodes:
            root_targets = sorted(set(reached))
            continue
        for t in reached:
            if (first_piece[u], t) not in seen and first_piece[u] != t:
                seen.add((first_piece[u], t))
                result.append((first_piece[u], t))
    top = root_token if root_token is not None else (root_targets[0] if root_targets else None)
    head_edges = [(top, t) for t in root_targets if t != top] + [(top, p) for p in specials]
    for pair in head_edges + pieces:
        if pair not in seen:
            seen.add(pair)
            result.append(pair)
    return result


def align_edges_batch(graphs: Sequence, word_ids, *, attention_mask=None,
                      missing_words: str = "error") -> Tuple[List[List[Tuple[int, int]]], torch.Tensor]:
    """:func:`align_edges_to_tokens` for a batch: token edge lists and lengths for ``GraphBatch.from_edges``.

    Args:
        graphs: B items, each a mapping with ``edges`` and ``num_nodes`` and optionally ``num_words`` and
            ``roots`` (the keyword arguments of :func:`align_edges_to_tokens`).
        word_ids: B lists of word ids (length N_b), or a ``BatchEncoding`` of a fast tokenizer.
        attention_mask: ``[B, N]`` 0/1 (right padding); with it, lengths are its row sums and padding is left out.

    Returns:
        ``(edges, lengths int64 [B])``: B lists of token pairs; ``GraphBatch.from_edges(edges, lengths,
        size=N)`` builds the batch padded to the tokenizer's width N.
    """
    word_ids, attention_mask = batch_word_ids(word_ids, attention_mask)
    if len(graphs) != len(word_ids):
        raise ValueError(f"graphs has {len(graphs)} items but word_ids has {len(word_ids)}")
    lengths = _mask_lengths(word_ids, attention_mask)
    out = []
    for b, graph in enumerate(graphs):
        try:
            if not hasattr(graph, "keys") or "edges" not in graph or "num_nodes" not in graph:
                raise ValueError("expected a mapping with 'edges' and 'num_nodes' (and optionally 'num_words', "
                                 f"'roots'), got {type(graph).__name__}")
            out.append(align_edges_to_tokens(graph["edges"], graph["num_nodes"], word_ids[b][: lengths[b]],
                                             num_words=graph.get("num_words"), roots=graph.get("roots"),
                                             missing_words=missing_words))
        except ValueError as exc:
            raise ValueError(f"batch item {b}: {exc}") from None
    return out, torch.tensor(lengths, dtype=torch.int64)
