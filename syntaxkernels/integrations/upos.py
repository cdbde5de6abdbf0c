"""Universal POS tags as token-level ids: the POS input of the syntax GAT (``num_pos_tags=18``).

Needs only torch: tags come from :class:`syntaxkernels.trees.Sentence` objects (``upos``), tokens from a fast
tokenizer's ``word_ids()``. :mod:`syntaxkernels.integrations.transformers` re-exports both names.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["UPOS_TAGS", "token_pos_ids"]

#: Universal POS tags in their UD order; :func:`token_pos_ids` maps them to 1..17 and anything else to 0.
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
             "SCONJ", "SYM", "VERB", "X")
_UPOS_INDEX = {tag: i + 1 for i, tag in enumerate(UPOS_TAGS)}


def token_pos_ids(texts: Sequence, word_ids: Sequence[Sequence[Optional[int]]],
                  width: Optional[int] = None) -> torch.Tensor:
    """Token-level UPOS ids for ``syntax_pos`` (the GAT's POS input; ``num_pos_tags=18``).

    Every piece of a word gets the word's tag id (1..17, :data:`UPOS_TAGS` order); special tokens, padding
    and unknown tags get 0.

    Args:
        texts: B items, each a :class:`~syntaxkernels.trees.Sentence` (anything with ``upos``) or a list of
            them (their words concatenated, as in ``align_to_tokens``).
        word_ids: B lists from ``encoding.word_ids(b)`` (None for special tokens).
        width: N (default: the longest word-id list); longer word-id lists are cut at N.
    Returns:
        ``int64 [B, N]``.
    Raises:
        ``ValueError`` when ``texts`` and ``word_ids`` differ in length or a word id is out of range (the
        message names the batch item and token); ``TypeError`` when an item has no ``upos``.
    """
    if len(texts) != len(word_ids):
        raise ValueError(f"texts has {len(texts)} items but word_ids has {len(word_ids)}")
    width = max((len(w) for w in word_ids), default=0) if width is None else width
    out = torch.zeros(len(texts), width, dtype=torch.int64)
    for b, (text, ids) in enumerate(zip(texts, word_ids)):
        sentences = [text] if hasattr(text, "upos") else list(text)
        for s in sentences:
            if not hasattr(s, "upos"):
                raise TypeError(f"batch item {b}: expected a Sentence (with upos) or a list of them, got "
                                f"{type(s).__name__}")
        tags = [t for s in sentences for t in s.upos]
        for p, w in enumerate(ids):
            if w is not None and p < width:
                if not 0 <= w < len(tags):
                    raise ValueError(f"batch item {b}, token {p}: word id {w} out of range ({len(tags)} tags)")
                out[b, p] = _UPOS_INDEX.get(tags[w], 0)
    return out
