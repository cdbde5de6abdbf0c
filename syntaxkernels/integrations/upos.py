"""Universal POS tags as token-level ids: the POS input of the syntax GAT (21 ids for the paper and release
variants, 18 for the package's).

Needs only torch: tags come from :class:`syntaxkernels.trees.Sentence` objects (``upos``), tokens from a fast
tokenizer's ``word_ids()``. :mod:`syntaxkernels.integrations.transformers` re-exports both names.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..variants import POS_CLS, POS_SEP, POS_UNK, check_variant

__all__ = ["UPOS_TAGS", "token_pos_ids"]

#: Universal POS tags in their UD order; :func:`token_pos_ids` maps them to 1..17 and anything else to 0.
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
             "SCONJ", "SYM", "VERB", "X")
_UPOS_INDEX = {tag: i + 1 for i, tag in enumerate(UPOS_TAGS)}


def token_pos_ids(texts: Sequence, word_ids: Sequence[Sequence[Optional[int]]],
                  width: Optional[int] = None, *, variant: str = "paper", lengths=None) -> torch.Tensor:
    """Token-level UPOS ids for ``syntax_pos`` (the GAT's POS input).

    Every piece of a word gets the word's tag id (1..17, :data:`UPOS_TAGS` order). The rest depends on
    ``variant`` (docs/semantics.md, "Paper, release and package"):

    - ``"paper"`` (default) and ``"release"``: the release's 21 ids (``processors/constants.py``, ``UPOS_MAP``):
      0 padding, 18 the first special token (``[CLS]``), 19 every other special token (``[SEP]``), 20 a tag
      outside UPOS (``[UNK]``); for ``SyntaxGAT(num_pos_tags=21)``;
    - ``"package"``: 0 for special tokens, padding and unknown tags; for ``num_pos_tags=18``.

    Args:
        texts: B items, each a :class:`~syntaxkernels.trees.Sentence` (anything with ``upos``) or a list of
            them (their words concatenated, as in ``align_to_tokens``).
        word_ids: B lists from ``encoding.word_ids(b)`` (None for special tokens).
        width: N (default: the longest word-id list); longer word-id lists are cut at N.
        variant: "paper", "release" or "package".
        lengths: int ``[B]`` (or a list): the tokens of item b are its first ``lengths[b]`` (the rest is padding,
            id 0). Default: the length of each word-id list (a padded encoding's ``word_ids`` also say None for
            its padding: pass the attention mask's row sums then).
    Returns:
        ``int64 [B, N]``.
    Raises:
        ``ValueError`` when ``texts`` and ``word_ids`` differ in length or a word id is out of range (the
        message names the batch item and token); ``TypeError`` when an item has no ``upos``.
    """
    check_variant(variant)
    if len(texts) != len(word_ids):
        raise ValueError(f"texts has {len(texts)} items but word_ids has {len(word_ids)}")
    width = max((len(w) for w in word_ids), default=0) if width is None else width
    if lengths is not None:
        lengths = [int(n) for n in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
        if len(lengths) != len(word_ids):
            raise ValueError(f"lengths has {len(lengths)} items but word_ids has {len(word_ids)}")
    out = torch.zeros(len(texts), width, dtype=torch.int64)
    release_ids = variant != "package"
    unknown = POS_UNK if release_ids else 0
    for b, (text, ids) in enumerate(zip(texts, word_ids)):
        sentences = [text] if hasattr(text, "upos") else list(text)
        for s in sentences:
            if not hasattr(s, "upos"):
                raise TypeError(f"batch item {b}: expected a Sentence (with upos) or a list of them, got "
                                f"{type(s).__name__}")
        tags = [t for s in sentences for t in s.upos]
        length = len(ids) if lengths is None else min(lengths[b], len(ids))
        special = POS_CLS
        for p, w in enumerate(ids[:min(length, width)]):
            if w is None:
                if release_ids:
                    out[b, p] = special
                    special = POS_SEP
                continue
            if not 0 <= w < len(tags):
                raise ValueError(f"batch item {b}, token {p}: word id {w} out of range ({len(tags)} tags)")
            out[b, p] = _UPOS_INDEX.get(tags[w], unknown)
    return out
