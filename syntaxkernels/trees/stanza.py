"""stanza Documents to :class:`~syntaxkernels.trees.Sentence`, and a parsing helper that never downloads.

``from_stanza(doc)`` converts a parsed ``stanza.Document`` (from a Pipeline with ``depparse``, or read with
``stanza.utils.conll.CoNLL.conll2doc``). ``parse_with_stanza`` runs a Pipeline from a local model directory
with ``download_method=None``; when the models are not there it raises :class:`StanzaModelsNotFoundError`
saying which directory was searched and how to download the models explicitly.

The library is imported inside the functions (by its absolute name), so importing ``syntaxkernels.trees``
does not need stanza, and this module's name does not shadow the library; calling ``parse_with_stanza``
without stanza installed raises an ``ImportError`` that says how to install it.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .conllu import Sentence

__all__ = ["from_stanza", "parse_with_stanza", "StanzaModelsNotFoundError"]

DEFAULT_PROCESSORS = "tokenize,pos,lemma,depparse"


class StanzaModelsNotFoundError(FileNotFoundError):
    """The stanza models needed by :func:`parse_with_stanza` are not in the model directory."""


def _column(value) -> str:
    return "_" if value is None or value == "" else str(value)


def from_stanza(doc) -> List[Sentence]:
    """Convert a parsed stanza ``Document`` to a list of :class:`Sentence` (0-based heads, -1 for the root).

    Uses the syntactic words of each sentence (multiword tokens are recorded in ``multiword_tokens``,
    empty nodes are left out). Raises ``ValueError`` when a sentence has no dependency parse (a Pipeline
    without ``depparse``) or a head out of range.
    """
    if not hasattr(doc, "sentences"):
        raise ValueError(f"from_stanza: expected a stanza Document, got {type(doc).__name__}")
    out: List[Sentence] = []
    for k, sent in enumerate(doc.sentences):
        words = list(sent.words)
        n = len(words)
        heads: List[int] = []
        for i, word in enumerate(words):
            if word.id != i + 1:
                raise ValueError(f"from_stanza: sentence {k}, word {i}: id {word.id} out of sequence (expected {i + 1})")
            if word.head is None:
                raise ValueError(
                    f"from_stanza: sentence {k}, word {i} ({word.text!r}) has no head: the document has no "
                    "dependency parse (run a Pipeline with the 'depparse' processor)"
                )
            head = int(word.head)
            if not 0 <= head <= n or head == i + 1:
                raise ValueError(f"from_stanza: sentence {k}, word {i}: head {head} out of range for {n} words "
                                 "(1-based, 0 for the root)")
            heads.append(head - 1)
        multiword = []
        for token in sent.tokens:
            token_id = token.id if isinstance(token.id, tuple) else (token.id,)
            if len(token_id) == 2:
                multiword.append((token_id[0] - 1, token_id[1] - 1, token.text))
        comments = [c.lstrip("#").strip() for c in (getattr(sent, "comments", None) or [])]
        out.append(Sentence(
            words=[w.text for w in words], heads=heads,
            upos=[_column(w.upos) for w in words], deprel=[_column(w.deprel) for w in words],
            xpos=[_column(w.xpos) for w in words], lemmas=[_column(w.lemma) for w in words],
            feats=[_column(w.feats) for w in words], deps=[_column(w.deps) for w in words],
            misc=[_column(w.misc) for w in words], multiword_tokens=multiword,
            sent_id=getattr(sent, "sent_id", None), text=getattr(sent, "text", None), comments=comments,
        ))
    return out


def _import_stanza(module: str = "stanza"):
    """Import ``module`` of the optional stanza library, or raise an ``ImportError`` saying how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "stanza":
            raise  # stanza is there but something it needs is not: its own message is the useful one
        raise ImportError("parse_with_stanza needs the optional stanza library, which is not installed: "
                          "pip install stanza (from_stanza needs nothing: it reads a parsed Document)") from exc


def _default_model_dir() -> str:
    env = os.environ.get("STANZA_RESOURCES_DIR")
    if env:
        return env
    return _import_stanza("stanza.resources.common").DEFAULT_MODEL_DIR


def _missing(model_dir: str, lang: str, processors: str, why: str) -> StanzaModelsNotFoundError:
    return StanzaModelsNotFoundError(
        f"stanza models for lang={lang!r} not found: searched model_dir={model_dir!r} ({why}). "
        "syntaxkernels never downloads models; download them explicitly once, e.g.\n"
        f"    python -c \"import stanza; stanza.download({lang!r}, model_dir={model_dir!r}, "
        f"processors={processors!r})\"\n"
        "then pass model_dir= to parse_with_stanza."
    )


_PIPELINES: Dict[Tuple, object] = {}
_PIPELINES_LOCK = threading.Lock()


def _pipeline(lang: str, model_dir: str, processors: str, package: str, pretokenized: bool, use_gpu: bool):
    key = (lang, os.path.abspath(model_dir), processors, package, pretokenized, use_gpu)
    with _PIPELINES_LOCK:
        if key in _PIPELINES:
            return _PIPELINES[key]
    resources_path = os.path.join(model_dir, "resources.json")
    if not os.path.isfile(resources_path):
        raise _missing(model_dir, lang, processors, "no resources.json there")
    try:
        with open(resources_path, encoding="utf-8") as f:
            resources = json.load(f)
    except (OSError, ValueError) as exc:
        raise _missing(model_dir, lang, processors, f"resources.json is unreadable: {exc}") from exc
    entry = resources.get(lang) if isinstance(resources, dict) else None
    if isinstance(entry, dict) and "alias" in entry:
        lang = entry["alias"]
        entry = resources.get(lang)
    if not isinstance(entry, dict):
        raise _missing(model_dir, lang, processors, f"resources.json has no entry for {lang!r}")
    if not os.path.isdir(os.path.join(model_dir, lang)):
        raise _missing(model_dir, lang, processors, f"no {lang}/ subdirectory")
    stanza = _import_stanza()

    try:
        pipeline = stanza.Pipeline(
            lang=lang, dir=model_dir, processors=processors, package=package, tokenize_pretokenized=pretokenized,
            use_gpu=use_gpu, download_method=None, logging_level="WARN",
        )
    except FileNotFoundError as exc:  # a processor's model file is absent
        raise _missing(model_dir, lang, processors, f"{exc}") from exc
    with _PIPELINES_LOCK:
        _PIPELINES.setdefault(key, pipeline)
    return pipeline


def parse_with_stanza(
    text_or_tokens: Union[str, Sequence[str], Sequence[Sequence[str]]],
    *,
    lang: str = "en",
    model_dir: Optional[Union[str, os.PathLike]] = None,
    pretokenized: bool = False,
    use_gpu: bool = False,
    processors: str = DEFAULT_PROCESSORS,
    package: str = "default",
    pipeline=None,
) -> List[Sentence]:
    """Parse text with a local stanza Pipeline and return its sentences (0-based heads, -1 for the root).

    Args:
        text_or_tokens: raw text (``str``); or pre-tokenised input: one sentence as a list of tokens, or a
            list of sentences, each a list of tokens (lists are always treated as pre-tokenised). With
            ``pretokenized=True`` a ``str`` is split on whitespace into tokens and on newlines into sentences.
        lang: stanza language code.
        model_dir: directory holding ``resources.json`` and ``<lang>/`` (default: ``$STANZA_RESOURCES_DIR``
            or stanza's default directory). Nothing is ever downloaded.
        pretokenized: the input is already tokenised (no tokenizer or multiword expansion is run).
        use_gpu: run the models on the GPU.
        processors, package: passed to ``stanza.Pipeline``.
        pipeline: an already built Pipeline to use instead (the other model options are then ignored).

    Pipelines are cached per (lang, model_dir, processors, package, pretokenized, use_gpu).
    Raises :class:`StanzaModelsNotFoundError` (a ``FileNotFoundError``) when the models are missing.
    """
    if isinstance(text_or_tokens, str):
        document = text_or_tokens
    elif isinstance(text_or_tokens, (list, tuple)):
        items = list(text_or_tokens)
        if all(isinstance(t, str) for t in items):
            document = [items]
        elif all(isinstance(s, (list, tuple)) and all(isinstance(t, str) for t in s) for s in items):
            document = [list(s) for s in items]
        else:
            raise ValueError("parse_with_stanza: text_or_tokens must be a str, a list of token strings, "
                             "or a list of sentences (lists of token strings)")
        if any(len(s) == 0 for s in document):
            raise ValueError("parse_with_stanza: a pre-tokenised sentence is empty")
        pretokenized = True
    else:
        raise ValueError(f"parse_with_stanza: text_or_tokens must be a str or a list of tokens, "
                         f"got {type(text_or_tokens).__name__}")
    if pipeline is None:
        directory = os.fspath(model_dir) if model_dir is not None else _default_model_dir()
        pipeline = _pipeline(lang, directory, processors, package, bool(pretokenized), bool(use_gpu))
    return from_stanza(pipeline(document))
