"""One front for parsing raw text with stanza or spaCy, with an on-disk cache: ``sk.trees.parse``.

::

    nlp = spacy.load("en_core_web_sm")                  # or stanza.Pipeline("en", processors=...)
    texts = sk.trees.parse(["The cat sat.", "Dogs bark. Cats purr."], parser=nlp)
    batch = sk.trees.TreeCollator(tokenizer=tokenizer)(texts)

Each text becomes one :class:`~syntaxkernels.trees.Sentence` (a text of several sentences is a forest: one
root per sentence), which is what ``TreeCollator`` items and ``align_to_tokens`` take; ``split_sentences=True``
returns each text's sentences instead (a list, also a text for ``align_to_tokens``).

The cache is an SQLite file, ``parses.sqlite``, in ``cache_dir``; an entry is keyed by the parser's identity
and the text, so a corpus is parsed once and a changed pipeline parses again. The identity of a library
pipeline is derived from it (see :func:`parser_identity`); a plain callable has none and needs ``parser_id=``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .conllu import Sentence
from .spacy import _is_spacy, from_spacy
from .stanza import from_stanza

__all__ = ["parse", "parser_identity", "default_cache_dir", "join_sentences", "CACHE_ENV_VAR"]

#: Environment variable naming the default cache directory of :func:`parse`.
CACHE_ENV_VAR = "SYNTAXKERNELS_CACHE_DIR"
_CACHE_FILE = "parses.sqlite"
_FORMAT = 1  # bump when the stored form of a parse changes: old entries are then never read


def default_cache_dir() -> Path:
    """``$SYNTAXKERNELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/syntaxkernels/parses`` (``~/.cache/...``)."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "syntaxkernels" / "parses"


# ------------------------------------------------------------------------------------------ parser kinds


def _is_spacy_language(obj) -> bool:
    spacy = sys.modules.get("spacy")  # a Language object exists only once spaCy has been imported
    return spacy is not None and isinstance(obj, spacy.language.Language)


def _is_stanza_pipeline(obj) -> bool:
    stanza = sys.modules.get("stanza")
    return stanza is not None and isinstance(obj, stanza.Pipeline)


def _describe(obj) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _parser_kind(parser) -> str:
    if _is_spacy_language(parser):
        return "spacy"
    if _is_stanza_pipeline(parser):
        return "stanza"
    if isinstance(parser, type):
        raise TypeError(f"parse: parser must be a pipeline object, got the class {parser.__module__}."
                        f"{parser.__qualname__}: build one first, e.g. parser=spacy.load('en_core_web_sm') or "
                        "parser=stanza.Pipeline('en', processors='tokenize,pos,lemma,depparse')")
    if callable(parser):
        return "callable"
    hint = ""
    if isinstance(parser, (str, os.PathLike)):
        hint = (f": load the pipeline first, e.g. parser=spacy.load({str(parser)!r}) or "
                f"parser=stanza.Pipeline({str(parser)!r})")
    raise TypeError("parse: parser must be a spaCy Language (spacy.load(...)), a stanza Pipeline, or a callable "
                    "that takes a text and returns a parsed spaCy Doc or stanza Document (or a list of "
                    f"Sentence); got {_describe(parser)}{hint}")


def _file_stamp(value) -> Optional[str]:
    if isinstance(value, str) and len(value) < 4096 and os.path.isfile(value):
        st = os.stat(value)
        return f"{value}:{st.st_size}:{st.st_mtime_ns}"
    return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def parser_identity(parser) -> Optional[str]:
    """The cache identity of a library pipeline, or None for a plain callable (or anything else).

    - spaCy ``Language``: spaCy's version, the pipeline's ``meta`` (lang, name, version), its component names and
      a digest of its config (``nlp.config.to_str()``).
    - stanza ``Pipeline``: stanza's version, its language and a digest of its config, including the size and
      modification time of every model file the config names.

    Weights changed in memory (a pipeline trained in this process) leave the identity as it was: pass your own
    ``parser_id`` to :func:`parse` for those.
    """
    if _is_spacy_language(parser):
        spacy = sys.modules["spacy"]
        meta = parser.meta
        return (f"spacy-{spacy.__version__}/{meta.get('lang')}_{meta.get('name')}-{meta.get('version')}/"
                f"{'+'.join(parser.pipe_names)}/{_digest(parser.config.to_str())}")
    if _is_stanza_pipeline(parser):
        stanza = sys.modules["stanza"]
        config = dict(getattr(parser, "config", {}) or {})
        stamps = sorted(s for s in (_file_stamp(v) for v in config.values()) if s is not None)
        text = json.dumps(config, sort_keys=True, default=str) + "\n" + "\n".join(stamps)
        processors = "+".join(getattr(parser, "processors", {}) or {})
        return f"stanza-{stanza.__version__}/{getattr(parser, 'lang', None)}/{processors}/{_digest(text)}"
    return None


# ------------------------------------------------------------------------------------------ conversion


def _sentences_of(result, index: int) -> List[Sentence]:
    """A parser's output for ``texts[index]`` as Sentences (spaCy Doc, stanza Document or Sentences)."""
    if _is_spacy(result, "Doc"):
        return from_spacy(result)
    if type(result).__name__ == "Document" and type(result).__module__.startswith("stanza."):
        return from_stanza(result)
    if isinstance(result, Sentence):
        return [result]
    if isinstance(result, (list, tuple)) and all(isinstance(s, Sentence) for s in result):
        return list(result)
    raise TypeError(f"parse: the parser returned {_describe(result)} for texts[{index}]; expected a parsed "
                    "spaCy Doc, a stanza Document, or a list of Sentence")


def join_sentences(sentences: Sequence[Sentence], text: Optional[str] = None) -> Sentence:
    """One :class:`Sentence` holding ``sentences`` one after another: a forest with one root per sentence.

    Heads and multiword-token positions are shifted by the words before them; a column is kept when every
    sentence has it (else left empty). ``text``: the joined sentence's text (default: the sentences' texts
    joined by spaces, when they all have one). ``ValueError`` for no sentences.
    """
    sentences = list(sentences)
    if not sentences:
        raise ValueError("join_sentences: no sentences")
    if len(sentences) == 1 and text is None:
        return sentences[0]
    words: List[str] = []
    heads: List[int] = []
    multiword: List[Tuple[int, int, str]] = []
    columns = ("upos", "deprel", "xpos", "lemmas", "feats", "deps", "misc")
    values: Dict[str, List[str]] = {c: [] for c in columns}
    keep = {c: all(getattr(s, c) for s in sentences) for c in columns}
    for s in sentences:
        offset = len(words)
        words += s.words
        heads += [-1 if h == -1 else h + offset for h in s.heads]
        multiword += [(a + offset, b + offset, form) for a, b, form in s.multiword_tokens]
        for c in columns:
            if keep[c]:
                values[c] += getattr(s, c)
    if text is None and all(s.text is not None for s in sentences):
        text = " ".join(s.text for s in sentences)
    return Sentence(words=words, heads=heads, multiword_tokens=multiword, text=text,
                    **{c: values[c] for c in columns})


def _to_json(sentences: List[Sentence]) -> str:
    return json.dumps([dataclasses.asdict(s) for s in sentences], ensure_ascii=False)


def _from_json(text: str) -> List[Sentence]:
    out = []
    for d in json.loads(text):
        d["multiword_tokens"] = [tuple(m) for m in d["multiword_tokens"]]
        out.append(Sentence(**d))
    return out


# ------------------------------------------------------------------------------------------ the cache


class _Cache:
    """Parses by (parser identity, text) in an SQLite file; every method is one short transaction."""

    def __init__(self, directory: Path, parser_id: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / _CACHE_FILE
        self.parser_id = parser_id
        self.db = sqlite3.connect(str(self.path), timeout=60)
        with self.db:
            self.db.execute("CREATE TABLE IF NOT EXISTS parses (key TEXT PRIMARY KEY, parser TEXT, value TEXT)")

    def key(self, text: str) -> str:
        payload = f"{_FORMAT}\x00{self.parser_id}\x00{text}"
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def get(self, texts: Sequence[str]) -> Dict[str, List[Sentence]]:
        found: Dict[str, List[Sentence]] = {}
        keys = {self.key(t): t for t in texts}
        items = list(keys)
        for start in range(0, len(items), 500):
            chunk = items[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for key, value in self.db.execute(f"SELECT key, value FROM parses WHERE key IN ({marks})", chunk):
                found[keys[key]] = _from_json(value)
        return found

    def put(self, parsed: Dict[str, List[Sentence]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO parses (key, parser, value) VALUES (?, ?, ?)",
                                [(self.key(t), self.parser_id, _to_json(s)) for t, s in parsed.items()])

    def close(self) -> None:
        self.db.close()


# ------------------------------------------------------------------------------------------ the front


def _check_texts(texts) -> List[str]:
    if isinstance(texts, str):
        texts = [texts]
    elif isinstance(texts, (bytes, bytearray, Mapping)) or not isinstance(texts, Iterable):
        raise TypeError(f"parse: texts must be a str or a sequence (or iterable) of str, got {type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"parse: texts[{i}] must be a str, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"parse: texts[{i}] is empty (or only whitespace): there is nothing to parse")
    return texts


def _run_parser(parser, kind: str, texts: List[str], batch_size: int) -> Dict[str, List[Sentence]]:
    out: Dict[str, List[Sentence]] = {}
    if kind == "spacy":
        results = parser.pipe(texts, batch_size=batch_size)
    else:  # a stanza Pipeline takes one text per call; so does a plain callable
        results = (parser(t) for t in texts)
    for i, (text, result) in enumerate(zip(texts, results)):
        sentences = _sentences_of(result, i)
        if not sentences:
            raise ValueError(f"parse: the parser found no sentence in texts[{i}] ({text[:40]!r})")
        out[text] = sentences
    return out


def parse(
    texts: Union[str, Sequence[str]],
    parser: Union[Callable, object],
    *,
    cache_dir: Union[str, os.PathLike, None, bool] = None,
    parser_id: Optional[str] = None,
    split_sentences: bool = False,
    batch_size: int = 64,
) -> list:
    """Parse raw texts with a stanza or spaCy pipeline into trees ready for ``TreeCollator`` and
    ``align_to_tokens``, caching every parse on disk.

    Args:
        texts: a sequence or iterable of str (or one str, taken as one text).
        parser: a spaCy ``Language`` (``spacy.load(...)``; texts go through ``nlp.pipe``), a stanza ``Pipeline``
            with ``depparse``, or any callable that takes one text and returns a parsed spaCy ``Doc``, a stanza
            ``Document`` or a list of :class:`Sentence`.
        cache_dir: where the cache lives (``parses.sqlite`` inside); None: :func:`default_cache_dir`; False: no
            cache (every text is parsed).
        parser_id: the parser's identity in the cache keys, overriding :func:`parser_identity`; needed for a
            plain callable (unless ``cache_dir=False``) and for a pipeline whose weights changed in memory.
        split_sentences: False (default): one :class:`Sentence` per text, its sentences joined into a forest
            (:func:`join_sentences`; ``text`` is the input text); True: a list of Sentences per text.
        batch_size: texts per ``nlp.pipe`` batch (spaCy).

    Returns:
        a list with one entry per text, in order: a :class:`Sentence` (0-based heads, -1 for each sentence's
        root), or with ``split_sentences`` a list of them. A text given twice is parsed once.

    Raises:
        ``TypeError`` for a parser of another kind (naming what was passed: a model name string, a class, a
        non-callable), texts that are not strings, or a parser output that is not a parse; ``ValueError`` for
        an empty text, a text without a sentence, a parse without dependencies (``from_spacy``,
        ``from_stanza``), or a plain callable with the cache on but no ``parser_id``.
    """
    kind = _parser_kind(parser)
    texts = _check_texts(texts)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"parse: batch_size must be a positive int, got {batch_size!r}")
    cache = None
    if cache_dir is not False:
        identity = parser_id if parser_id is not None else parser_identity(parser)
        if identity is None:
            raise ValueError(f"parse: the parser ({_describe(parser)}) is a plain callable, so its identity for "
                             "the cache is unknown: pass parser_id='a name that changes when the parser does', "
                             "or cache_dir=False to parse without a cache")
        if not isinstance(identity, str) or not identity:
            raise ValueError(f"parse: parser_id must be a non-empty str, got {identity!r}")
        directory = default_cache_dir() if cache_dir is None or cache_dir is True else Path(os.fspath(cache_dir))
        cache = _Cache(directory, identity)
    try:
        unique = list(dict.fromkeys(texts))
        parsed = cache.get(unique) if cache is not None else {}
        todo = [t for t in unique if t not in parsed]
        if todo:
            fresh = _run_parser(parser, kind, todo, batch_size)
            if cache is not None:
                cache.put(fresh)
            parsed.update(fresh)
    finally:
        if cache is not None:
            cache.close()
    if split_sentences:
        return [[dataclasses.replace(s) for s in parsed[t]] for t in texts]
    return [join_sentences(parsed[t], text=t) for t in texts]
