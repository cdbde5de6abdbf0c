"""spaCy ``Doc`` objects to :class:`~syntaxkernels.trees.Sentence`.

``from_spacy(doc)`` converts a parsed spaCy ``Doc`` (from a pipeline with a ``parser`` component, or built
directly with ``Doc(vocab, words=..., heads=..., deps=...)``) sentence by sentence. spaCy's heads are token
indices into the whole document and a root is its own head; a :class:`Sentence` holds 0-based indices into
its own words and ``-1`` for the root.

spaCy is never imported here: the function reads the attributes of the objects it is given, so importing
``syntaxkernels.trees`` does not need spaCy (and this module's name does not shadow the library).
"""
from __future__ import annotations

from typing import List

from .conllu import Sentence

__all__ = ["from_spacy"]


def _column(value) -> str:
    return "_" if value is None or str(value) == "" else str(value)


def _is_spacy(obj, name: str) -> bool:
    """``obj`` is an instance of spaCy's class ``name`` (``Doc`` or ``Span``), judged by its type's module."""
    return any(cls.__name__ == name and cls.__module__.startswith("spacy.") for cls in type(obj).__mro__)


def from_spacy(doc) -> List[Sentence]:
    """Convert a parsed spaCy ``Doc`` (or one sentence of it, a ``Span``) to a list of :class:`Sentence`.

    One :class:`Sentence` per ``doc.sents``: ``words`` the token texts, ``heads`` from ``token.head`` (0-based
    within the sentence, -1 for the root, which spaCy makes its own head), ``upos`` ``token.pos_``, ``xpos``
    ``token.tag_``, ``lemmas``, ``deprel`` ``token.dep_`` (spaCy's labels as they are, e.g. ``ROOT``), ``feats``
    ``token.morph``, ``misc`` ``SpaceAfter=No`` for a token without trailing whitespace, ``text`` the
    sentence's text. Empty annotations become ``"_"``.

    Raises ``ValueError`` for an object that is neither a ``Doc`` nor a ``Span`` (naming its type), a document
    without a dependency parse (a pipeline without a ``parser``; the message says so), and a head outside its
    sentence.
    """
    if _is_spacy(doc, "Doc"):
        if not doc.has_annotation("DEP"):
            raise ValueError(
                "from_spacy: the Doc has no dependency parse (token.dep_ is unset): parse it with a pipeline "
                "that has a 'parser' component, e.g. spacy.load('en_core_web_sm'), or build it with "
                "Doc(vocab, words=..., heads=..., deps=...)"
            )
        sentences = list(doc.sents)
    elif _is_spacy(doc, "Span"):
        if not doc.doc.has_annotation("DEP"):
            raise ValueError("from_spacy: the Span's Doc has no dependency parse (token.dep_ is unset)")
        sentences = [doc]
    else:
        raise ValueError(f"from_spacy: expected a parsed spaCy Doc (or a Span of one), got {type(doc).__name__}")
    out: List[Sentence] = []
    for k, sent in enumerate(sentences):
        start, end = sent.start, sent.end
        heads: List[int] = []
        for token in sent:
            head = token.head.i
            if head == token.i:
                heads.append(-1)
            elif start <= head < end:
                heads.append(head - start)
            else:
                raise ValueError(f"from_spacy: sentence {k}, word {token.i - start} ({token.text!r}): head token "
                                 f"{head} is outside the sentence (tokens {start}..{end - 1})")
        tokens = list(sent)
        out.append(Sentence(
            words=[t.text for t in tokens], heads=heads,
            upos=[_column(t.pos_) for t in tokens], deprel=[_column(t.dep_) for t in tokens],
            xpos=[_column(t.tag_) for t in tokens], lemmas=[_column(t.lemma_) for t in tokens],
            feats=[_column(t.morph) for t in tokens],
            misc=["_" if t.whitespace_ else "SpaceAfter=No" for t in tokens],
            text=sent.text,
        ))
    return out
