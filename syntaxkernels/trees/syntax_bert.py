"""Syntax-BERT's masks on wordpieces: word-level trees seen from the tokens (docs/semantics.md, "Syntax-BERT: paper,
release, package").

Syntax-BERT relates *words*: ``parent_d``, ``child_d`` and ``sibling_d`` are relations of the word-level tree,
``pairwise`` pairs the two texts of a sentence pair. The release (``data/processors/glue.py``,
``generate_syntax_masks_with_parser`` and ``generate_mask_cross_two_texts``; the word index of every token from
``tokenization_bert.py``, ``build_word_indices_with_special_tokens``) puts them on tokens like this:

- every piece of a word relates to every piece of the related word (pieces of one word are in no relation with
  each other);
- ``[CLS]`` acts as a piece of the first word of the first text, every ``[SEP]`` as a piece of the last word of the
  text before it;
- relations stay within a sentence; ``pairwise`` holds the pairs of tokens of different texts (the special tokens
  count with the word they stand for) and, in the release, every token with itself.

:func:`syntax_bert_batch` builds a :class:`WordTreeBatch` that says exactly this to the sub-network op: a
:class:`~syntaxkernels.trees.TreeBatch` whose ``distance``, ``depth`` and ``segment`` are those of the words (the
distance of two tokens is the distance of their words within one sentence, 0 for pieces of one word, 255 across
sentences and texts; the depth is the word's; the segment is the text). The relation masks follow from them by the
package's rule (docs/semantics.md, "Syntax-BERT masks"), so every backend (reference, C++, Triton) takes the batch
unchanged; its relation lists are built from those tensors (:func:`~syntaxkernels.trees.batch.python_edge_lists`).
The paper states none of these token rules: its variant takes the release's, except the diagonal of ``pairwise``
(the paper's ``M_ij = 1`` iff i and j come from different sentences).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ..specs import MaskSpec, UNREACHABLE
from ..variants import DEFAULT_VARIANT, check_variant
from .align import _texts, _word_heads, align_batch, batch_word_ids
from .batch import (EdgeLists, TreeBatch, _map_distance, _prepared, _relation_arguments, build_tree_tensors,
                    python_edge_lists)

__all__ = ["WordTreeBatch", "syntax_bert_batch"]


@dataclass(eq=False)
class WordTreeBatch(TreeBatch):
    """A :class:`TreeBatch` over tokens whose structure is the words' (module docstring): Syntax-BERT's paper and
    release masks on wordpieces, ``[CLS]`` / ``[SEP]`` and sentence pairs.

    Attributes (besides TreeBatch's):
        heads: the token tree of the package's layout (:func:`~syntaxkernels.trees.align_to_tokens`), kept for
            what reads heads; the masks come from ``distance``, ``depth`` and ``segment``.
        distance: ``uint8 [B, N, N]``: the words' distance within one sentence (0 for pieces of one word), 255
            across sentences, texts and padding.
        depth: ``int32 [B, N]``: the depth of the token's word in its sentence (-1 padding).
        segment: ``int32 [B, N]``: the token's text (0, or 1 for the second text of a pair; -1 padding).
        words: ``int64 [B, N]``: the word the token stands for, numbered over the item's texts (-1 padding).
        pairwise_self: ``pairwise`` also holds every token itself (the release).
        variant: the builder's variant ("paper" or "release").

    The relation lists (:meth:`relation_lists`) and windows (:meth:`window_lists`) come from those tensors
    (PyTorch; on a GPU built once per batch with a synchronisation: build them in the data pipeline). Padded
    batches only (no packed form).
    """

    words: Optional[torch.Tensor] = None
    pairwise_self: bool = False
    variant: str = DEFAULT_VARIANT

    #: Tells the sub-network op that ``pairwise`` is "another segment", not "distance 255" (class attribute).
    word_level = True

    def _map(self, fn) -> "WordTreeBatch":
        mapped = WordTreeBatch(fn(self.heads), fn(self.lengths), _map_distance(fn, self.distance), fn(self.depth),
                               fn(self.segment), words=None if self.words is None else fn(self.words),
                               pairwise_self=self.pairwise_self, variant=self.variant, short_rows=self.short_rows)
        return self._carry_derived(mapped, fn)

    def relation_lists(self, masks: MaskSpec) -> EdgeLists:
        """The parent/child/sibling lists of ``masks`` on the words' structure (built once per batch)."""
        if not isinstance(masks, MaskSpec):
            raise TypeError(f"masks must be a MaskSpec, got {type(masks).__name__}")
        return self.derived(("relation lists", masks.relation_key()),
                            lambda: _prepared(python_edge_lists(self.distance, self.depth, self.segment,
                                                                **_relation_arguments(masks))))

    def window_lists(self, window: int) -> EdgeLists:
        """The pairs within ``window`` of the words' distance (built once per batch)."""
        return self.derived(("window lists", window),
                            lambda: _prepared(python_edge_lists(self.distance, self.depth, self.segment,
                                                                window=window, lengths=self.lengths)))

    def __repr__(self) -> str:
        return super().__repr__().replace("TreeBatch(", f"WordTreeBatch(variant={self.variant!r}, ", 1)


def _token_words(word_ids: List[Optional[int]], sequence_ids: Optional[List[Optional[int]]]) -> List[Tuple[int, int]]:
    """``(text, word)`` of every token: a word's pieces their word; the first special token the word of the first
    token after it that is not special, every other special token the word of the nearest one before it."""
    def word(p: int) -> Tuple[int, int]:
        return (0 if sequence_ids is None else int(sequence_ids[p]), int(word_ids[p]))

    out: List[Optional[Tuple[int, int]]] = [None] * len(word_ids)
    last = None
    for p, w in enumerate(word_ids):
        if w is not None:
            last = out[p] = word(p)
        elif last is not None:
            out[p] = last
    following = None
    for p in range(len(word_ids) - 1, -1, -1):  # specials before any word: the first word after them
        if word_ids[p] is not None:
            following = out[p]
        elif out[p] is None:
            out[p] = following if following is not None else (0, -1)
    return out


def syntax_bert_batch(texts: Sequence, word_ids, *, sequence_ids=None, attention_mask=None,
                      variant: str = DEFAULT_VARIANT, backend: str = "auto", missing_words: str = "error") -> TreeBatch:
    """The trees of a batch as Syntax-BERT's masks see them, for :func:`syntaxkernels.syntax_subnetwork_attention`,
    :class:`syntaxkernels.nn.SyntaxBertSelfAttention` and ``enable_syntax_attention(method="subnetwork")``.

    Args:
        texts: B items, each what :func:`~syntaxkernels.trees.align_to_tokens` takes (a text: a Sentence, a list
            of heads, or a list of those; with ``sequence_ids``, ``[text_a, text_b]``).
        word_ids: B lists from ``encoding.word_ids(b)``, or a fast tokenizer's ``BatchEncoding``.
        sequence_ids: B lists from ``encoding.sequence_ids(b)`` for sentence pairs.
        attention_mask: ``[B, N]`` 0/1 (right padding), as for :func:`~syntaxkernels.trees.align_batch`.
        variant: "paper" (default) or "release": a :class:`WordTreeBatch` (module docstring; "release" adds the
            diagonal to ``pairwise``). "package": the token tree of :func:`~syntaxkernels.trees.align_batch` as a
            plain :class:`TreeBatch` (pieces are children of their first piece, ``[CLS]`` roots the sequence,
            ``pairwise`` pairs different trees).
        backend: the tree builder of the word-level trees ("auto", "cpp", "python").
        missing_words: "error" or "reattach" (truncation), as for :func:`~syntaxkernels.trees.align_batch`; a word
            without tokens is simply absent from the masks.
    Returns:
        a :class:`WordTreeBatch` ("paper", "release") or a :class:`TreeBatch` ("package") with ``[B, N]`` tensors.
    Raises:
        ``ValueError`` as :func:`~syntaxkernels.trees.align_batch` (word ids out of range, missing words, bad
        heads), or for an unknown variant.
    """
    check_variant(variant)
    word_ids, attention_mask = batch_word_ids(word_ids, attention_mask)
    heads, lengths = align_batch(texts, word_ids, sequence_ids=sequence_ids, attention_mask=attention_mask,
                                 missing_words=missing_words)
    if variant == "package":
        return TreeBatch.from_heads(heads, lengths, backend=backend)
    B, N = heads.shape
    distance = torch.full((B, N, N), UNREACHABLE, dtype=torch.uint8)
    depth = torch.full((B, N), -1, dtype=torch.int32)
    segment = torch.full((B, N), -1, dtype=torch.int32)
    words = torch.full((B, N), -1, dtype=torch.int64)
    for b in range(B):
        n = int(lengths[b])
        if n == 0:
            continue
        seq = None if sequence_ids is None else list(sequence_ids[b])[:n]
        per_text = [_word_heads(t, text) for t, text in enumerate(_texts(texts[b], seq))]
        sizes = [len(h) for h in per_text]
        width = max(sizes)
        rows = torch.full((len(per_text), width), -1, dtype=torch.int64)
        for t, h in enumerate(per_text):
            rows[t, :len(h)] = torch.tensor(h, dtype=torch.int64)
        _, _, word_distance, word_depth, _ = build_tree_tensors(rows, torch.tensor(sizes), backend=backend)
        pairs = _token_words(word_ids[b][:n], seq)
        text = torch.tensor([t for t, _ in pairs], dtype=torch.int64)
        word = torch.tensor([max(w, 0) for _, w in pairs], dtype=torch.int64)
        lone = torch.tensor([w < 0 for _, w in pairs])  # a sequence of special tokens only: no word at all
        d = word_distance[text[:, None], word[:, None], word[None, :]].clone()
        d[(text[:, None] != text[None, :]) | lone[:, None] | lone[None, :]] = UNREACHABLE
        d.fill_diagonal_(0)
        distance[b, :n, :n] = d
        depth[b, :n] = torch.where(lone, 0, word_depth[text, word]).to(torch.int32)
        segment[b, :n] = text.to(torch.int32)
        offsets = torch.tensor([0] + sizes[:-1]).cumsum(0)
        words[b, :n] = torch.where(lone, -1, offsets[text] + word)
    return WordTreeBatch(heads, lengths, distance, depth, segment, words=words, pairwise_self=variant == "release",
                         variant=variant)
