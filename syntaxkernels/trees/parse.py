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
import numbers
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .conllu import Sentence
from .spacy import _is_spacy, from_spacy
from .stanza import from_stanza

__all__ = ["parse", "parse_dataset", "sentence_from_row", "parser_identity", "default_cache_dir",
           "join_sentences", "CACHE_ENV_VAR", "DATASET_COLUMNS"]

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


def _sentences_of(result, index: int, where: Optional[str] = None) -> List[Sentence]:
    """A parser's output for ``texts[index]`` as Sentences (spaCy Doc, stanza Document or Sentences)."""
    if _is_spacy(result, "Doc"):
        return from_spacy(result)
    if type(result).__name__ == "Document" and type(result).__module__.startswith("stanza."):
        return from_stanza(result)
    if isinstance(result, Sentence):
        return [result]
    if isinstance(result, (list, tuple)) and all(isinstance(s, Sentence) for s in result):
        return list(result)
    raise TypeError(f"parse: the parser returned {_describe(result)} for "
                    f"{where or f'texts[{index}]'}; expected a parsed "
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


_FIELDS = tuple(f.name for f in dataclasses.fields(Sentence))


def _to_json(sentences: List[Sentence]) -> str:
    # the fields read directly (the JSON dataclasses.asdict would give, without its deep copies)
    return json.dumps([{f: getattr(s, f) for f in _FIELDS} for s in sentences], ensure_ascii=False)


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


def _run_parser(parser, kind: str, texts: List[str], batch_size: int,
                out: Optional[Dict[str, List[Sentence]]] = None, where=None) -> Dict[str, List[Sentence]]:
    """Parse ``texts`` into ``out`` (text -> Sentences), one text at a time: when the parser raises, ``out``
    holds every text parsed before. ``where(i, text)`` names ``texts[i]`` in error messages."""
    out = {} if out is None else out
    where = where or (lambda i, text: f"texts[{i}]")
    if kind == "spacy":
        results = parser.pipe(texts, batch_size=batch_size)
    else:  # a stanza Pipeline takes one text per call; so does a plain callable
        results = (parser(t) for t in texts)
    for i, (text, result) in enumerate(zip(texts, results)):
        sentences = _sentences_of(result, i, where and where(i, text))
        if not sentences:
            raise ValueError(f"parse: the parser found no sentence in {where(i, text)} ({text[:40]!r})")
        out[text] = sentences
    return out


def _parse_through(parser, kind: str, unique: List[str], cache: Optional["_Cache"], batch_size: int,
                   where=None) -> Tuple[Dict[str, List[Sentence]], int]:
    """Parses of the distinct texts ``unique``: cached ones read, the others parsed and stored. Whatever was
    parsed is stored even when the parser (or a conversion) raises part way. Returns (parses, texts parsed)."""
    parsed = cache.get(unique) if cache is not None else {}
    todo = [t for t in unique if t not in parsed]
    if todo:
        fresh: Dict[str, List[Sentence]] = {}
        try:
            _run_parser(parser, kind, todo, batch_size, fresh, where)
        finally:
            if cache is not None and fresh:
                cache.put(fresh)
        parsed.update(fresh)
    return parsed, len(todo)


def _cache_settings(parser, cache_dir, parser_id, name: str) -> Tuple[Optional[str], Optional[Path]]:
    """(parser identity, cache directory), or (``parser_id``, None) with ``cache_dir=False``."""
    if cache_dir is False:
        return parser_id, None
    identity = parser_id if parser_id is not None else parser_identity(parser)
    if identity is None:
        raise ValueError(f"{name}: the parser ({_describe(parser)}) is a plain callable, so its identity for "
                         "the cache is unknown: pass parser_id='a name that changes when the parser does', "
                         "or cache_dir=False to parse without a cache")
    if not isinstance(identity, str) or not identity:
        raise ValueError(f"{name}: parser_id must be a non-empty str, got {identity!r}")
    directory = default_cache_dir() if cache_dir is None or cache_dir is True else Path(os.fspath(cache_dir))
    return identity, directory


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
    identity, directory = _cache_settings(parser, cache_dir, parser_id, "parse")
    cache = _Cache(directory, identity) if directory is not None else None
    try:
        parsed, _ = _parse_through(parser, kind, list(dict.fromkeys(texts)), cache, batch_size)
    finally:
        if cache is not None:
            cache.close()
    if split_sentences:
        return [[dataclasses.replace(s) for s in parsed[t]] for t in texts]
    return [join_sentences(parsed[t], text=t) for t in texts]


# ------------------------------------------------------------------------------------------ 🤗 datasets

#: The columns :func:`parse_dataset` writes, one list per row (per text): four in word order, and
#: ``sentence_lengths`` (the words of each sentence of the text, in order).
DATASET_COLUMNS = ("words", "heads", "upos", "deprel", "sentence_lengths")


def _import_datasets():
    try:
        import datasets
    except ImportError as error:
        raise ImportError("parse_dataset needs the 🤗 datasets library: pip install datasets") from error
    return datasets


class _ParseRows:
    """The ``dataset.map`` function of :func:`parse_dataset`: a batch of rows -> their parse columns.

    Picklable (so ``num_proc > 1`` works when the parser pickles): the SQLite connection is opened in each
    process on its first batch and never pickled.
    """

    def __init__(self, parser, kind: str, identity: Optional[str], directory: Optional[Path], text_column: str,
                 parse_batch_size: int, progress: bool, num_proc: Optional[int]):
        self.parser, self.kind, self.identity, self.directory = parser, kind, identity, directory
        self.text_column, self.parse_batch_size = text_column, parse_batch_size
        self.progress, self.num_proc = progress, num_proc
        self._cache: Optional[_Cache] = None
        self._counts = [0, 0, 0]  # words, texts, texts parsed (not from the cache)
        self._start = self._last = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None
        state["_counts"], state["_start"], state["_last"] = [0, 0, 0], None, None
        return state

    def __call__(self, batch: Mapping[str, list], indices: List[int], rank: Optional[int] = None) -> Dict[str, list]:
        texts = batch[self.text_column]
        for text, index in zip(texts, indices):
            if not isinstance(text, str):
                raise TypeError(f"parse_dataset: row {index}: column {self.text_column!r} must hold str, got "
                                f"{type(text).__name__}")
            if not text.strip():
                raise ValueError(f"parse_dataset: row {index}: the text is empty (or only whitespace): there is "
                                 f"nothing to parse; drop such rows first, e.g. dataset.filter(lambda r: "
                                 f"r[{self.text_column!r}].strip())")
        if self._start is None:
            self._start = self._last = time.perf_counter()
        if self._cache is None and self.directory is not None:
            self._cache = _Cache(self.directory, self.identity)
        unique = list(dict.fromkeys(texts))
        first = {}
        for text, index in zip(texts, indices):
            first.setdefault(text, index)
        parsed, fresh = _parse_through(self.parser, self.kind, unique, self._cache, self.parse_batch_size,
                                       where=lambda i, text: f"row {first[text]}")
        out: Dict[str, list] = {c: [] for c in DATASET_COLUMNS}
        words = 0
        for text, index in zip(texts, indices):
            parts = parsed[text]
            s = parts[0] if len(parts) == 1 else join_sentences(parts)
            n = len(s.words)
            words += n
            out["words"].append(s.words)
            out["heads"].append(s.heads)
            out["upos"].append(s.upos if len(s.upos) == n else [])
            out["deprel"].append(s.deprel if len(s.deprel) == n else [])
            out["sentence_lengths"].append([len(part.words) for part in parts])
        self._counts[0] += words
        self._counts[1] += len(texts)
        self._counts[2] += fresh
        if self.progress:
            now = time.perf_counter()
            if now - self._last >= 2.0:
                self._last = now
                self._report(now, rank)
        return out

    def _report(self, now: float, rank: Optional[int]) -> None:
        words, texts, fresh = self._counts
        elapsed = max(now - self._start, 1e-9)
        who = f" [process {rank}]" if rank is not None and self.num_proc and self.num_proc > 1 else ""
        print(f"parse_dataset{who}: {texts:,} texts, {words:,} words in {elapsed:.1f} s "
              f"({words / elapsed:,.0f} words/s; {texts - fresh:,} texts from the cache)", file=sys.stderr,
              flush=True)


def _row_sentence_lengths(row: Mapping, words: int) -> Optional[List[int]]:
    """The row's ``sentence_lengths`` checked against its ``words`` count, or None when it has none."""
    value = row.get("sentence_lengths")
    if value is None:
        return None
    lengths = value.tolist() if hasattr(value, "tolist") else list(value)
    if not lengths:
        return None
    for k, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"sentence_from_row: 'sentence_lengths'[{k}] = {n!r}: each sentence length must be a "
                             "positive int")
    lengths = [int(n) for n in lengths]
    if sum(lengths) != words:
        raise ValueError(f"sentence_from_row: 'sentence_lengths' {lengths} add up to {sum(lengths)} words but 'words' "
                         f"has {words}")
    return lengths


def sentence_from_row(row: Mapping, text_column: Optional[str] = "text", *, split_sentences: bool = False):
    """A row written by :func:`parse_dataset` (a dict with ``words`` and ``heads``, and ``upos``/``deprel``/
    ``sentence_lengths`` when present) back as a :class:`Sentence`, or as the list of its sentences.

    ``TreeCollator(tokenizer=...)`` takes the rows themselves; this is for ``align_to_tokens`` and own code.

    ``text_column``: the row's key holding the text (kept as ``Sentence.text``; None or a missing key: none).
    ``sentence_lengths`` (the words of each sentence; absent or empty in rows written without it: the row is one
    sentence) is checked: its entries add up to the words, and every head stays inside its own sentence.
    ``split_sentences``: False (default): one :class:`Sentence` (a forest: one root per sentence, as
    :func:`join_sentences` gives); True: the list of the row's sentences (heads 0-based within each sentence; no
    ``text``), which is what :func:`parse` with ``split_sentences=True`` returns and ``align_to_tokens`` takes as a
    text. ``ValueError`` naming the key for a row without ``words`` or ``heads``, with columns of unequal lengths,
    with ``sentence_lengths`` that do not add up to the words, or with a head outside its sentence.
    """
    if not isinstance(row, Mapping):
        raise TypeError(f"sentence_from_row: row must be a mapping (a dataset row), got {type(row).__name__}")
    for key in ("words", "heads"):
        if key not in row:
            raise ValueError(f"sentence_from_row: the row has no {key!r} column (columns: {sorted(row)}); "
                             "rows come from sk.trees.parse_dataset")
    words = list(row["words"])
    heads = [int(h) for h in row["heads"]]
    if len(heads) != len(words):
        raise ValueError(f"sentence_from_row: 'heads' has {len(heads)} entries but 'words' has {len(words)}")
    columns = {}
    for key in ("upos", "deprel"):
        value = list(row.get(key) or [])
        if value and len(value) != len(words):
            raise ValueError(f"sentence_from_row: {key!r} has {len(value)} entries but 'words' has {len(words)}")
        columns[key] = value
    lengths = _row_sentence_lengths(row, len(words))
    bounds = []
    start = 0
    for k, n in enumerate(lengths or [len(words)]):
        for i in range(start, start + n):
            h = heads[i]
            if h != -1 and not start <= h < start + n:
                raise ValueError(f"sentence_from_row: word {i} (sentence {k}, words {start}..{start + n - 1}) has "
                                 f"head {h}, outside its sentence ('sentence_lengths' {lengths})")
        bounds.append((start, start + n))
        start += n
    if split_sentences:
        return [Sentence(words=words[a:b], heads=[h if h == -1 else h - a for h in heads[a:b]],
                         **{key: value[a:b] for key, value in columns.items()}) for a, b in bounds]
    text = row.get(text_column) if text_column is not None else None
    return Sentence(words=words, heads=heads, text=text if isinstance(text, str) else None, **columns)


def parse_dataset(
    dataset,
    parser: Union[Callable, object],
    *,
    text_column: str = "text",
    batch_size: int = 256,
    num_proc: Optional[int] = None,
    cache_dir: Union[str, os.PathLike, None, bool] = None,
    parser_id: Optional[str] = None,
    progress: bool = True,
    parse_batch_size: int = 64,
):
    """Parse the texts of a 🤗 ``datasets`` dataset once, into Arrow columns of trees, through the parse cache.

    ``dataset.map(..., batched=True, num_proc=num_proc)`` adds five list columns per row (one row = one text;
    a text of several sentences is one forest, as :func:`join_sentences` gives, with one ``-1`` per sentence):

    - ``words`` (str, length L), ``heads`` (int32, 0-based, ``-1`` for a root, length L),
    - ``upos`` and ``deprel`` (str, length L; empty when the parser gives none),
    - ``sentence_lengths`` (int32, length S: the words of each of the text's S sentences, in order, adding up to
      L): the sentence boundaries of the forest (sentence k is words ``sum(lengths[:k]) ..``), which the forest's
      heads alone do not give.

    Columns of those names already in the dataset are replaced; the others are kept. ``TreeCollator`` takes
    the rows as they are: without a tokenizer, word-level trees from ``heads`` (the other columns come back as
    lists); with one (``TreeCollator(tokenizer=...)``) the text's words are tokenised and the trees aligned to the
    subword tokens, each sentence checked within its ``sentence_lengths`` bounds. :func:`sentence_from_row` turns
    a row back into a :class:`Sentence` (or its sentences).

    Every parse goes through the SQLite cache of :func:`parse` (same keys: the parser's identity and the text),
    committed after each map batch and also when the parser raises: a crash loses at most the batch in
    progress (nothing when the parser raises an exception), and a rerun parses only the texts not yet cached.
    Two parsers of one text (different identities) have separate entries. The map's own fingerprint includes
    the parser identity, so the Arrow cache of ``datasets`` never hands one parser's columns to another.

    Args:
        dataset: a ``datasets.Dataset``, ``DatasetDict`` (each split) or ``IterableDataset`` (lazy; no
            ``num_proc``).
        parser: as for :func:`parse`: a spaCy ``Language``, a stanza ``Pipeline``, or a callable taking one
            text and returning a spaCy ``Doc``, a stanza ``Document`` or a list of :class:`Sentence`. With
            ``num_proc > 1`` it must pickle (a callable: a module-level function).
        text_column: the column holding the texts (str; an empty text is a ``ValueError`` naming its row).
        batch_size: rows per map batch (and per cache transaction).
        num_proc: processes for ``dataset.map`` (None: this process). They share the cache file.
        cache_dir: as for :func:`parse` (None: :func:`default_cache_dir`; False: no cache, nothing resumes).
        parser_id: as for :func:`parse`; needed for a plain callable unless ``cache_dir=False``.
        progress: a line on stderr every 2 s per process (texts, words, words/s, texts read from the cache)
            and a summary at the end.
        parse_batch_size: texts per ``nlp.pipe`` batch (spaCy).

    Returns:
        the dataset (same type) with the five columns.

    Raises:
        ``ImportError`` naming ``pip install datasets`` when it is missing; ``TypeError``/``ValueError`` as
        :func:`parse` does (naming the row), and ``ValueError`` for a missing ``text_column``.
    """
    datasets = _import_datasets()
    kind = _parser_kind(parser)
    for name, value in (("batch_size", batch_size), ("parse_batch_size", parse_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"parse_dataset: {name} must be a positive int, got {value!r}")
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ValueError(f"parse_dataset: num_proc must be None or a positive int, got {num_proc!r}")
    identity, directory = _cache_settings(parser, cache_dir, parser_id, "parse_dataset")
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return type(dataset)({split: parse_dataset(part, parser, text_column=text_column, batch_size=batch_size,
                                                   num_proc=num_proc, cache_dir=cache_dir, parser_id=parser_id,
                                                   progress=progress, parse_batch_size=parse_batch_size)
                              for split, part in dataset.items()})
    iterable = isinstance(dataset, datasets.IterableDataset)
    if not iterable and not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"parse_dataset: dataset must be a datasets.Dataset, DatasetDict or IterableDataset, got "
                        f"{type(dataset).__name__} (for a list of texts use sk.trees.parse)")
    names = dataset.column_names
    if names is not None and text_column not in names:
        raise ValueError(f"parse_dataset: the dataset has no column {text_column!r} (columns: {names}); pass "
                         "text_column=")
    strings = datasets.List(datasets.Value("string")) if hasattr(datasets, "List") else \
        datasets.Sequence(datasets.Value("string"))
    ints = datasets.List(datasets.Value("int32")) if hasattr(datasets, "List") else \
        datasets.Sequence(datasets.Value("int32"))
    features = None
    if dataset.features is not None:
        features = datasets.Features(dict(dataset.features))
        features.update({"words": strings, "heads": ints, "upos": strings, "deprel": strings,
                         "sentence_lengths": ints})
    function = _ParseRows(parser, kind, identity, directory, text_column, parse_batch_size, progress, num_proc)
    start = time.perf_counter()
    if iterable:
        if num_proc not in (None, 1):
            raise ValueError("parse_dataset: an IterableDataset is mapped lazily in one process: num_proc must "
                             "be None")
        return dataset.map(function, with_indices=True, batched=True, batch_size=batch_size, features=features)
    fingerprint = None
    if identity is not None:
        # the columns written are part of it: a version writing other columns never reads an older map's output
        payload = "\x00".join([str(_FORMAT), dataset._fingerprint, identity, text_column, "parse_dataset",
                               ",".join(DATASET_COLUMNS)])
        fingerprint = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]
    out = dataset.map(function, with_indices=True, with_rank=True, batched=True, batch_size=batch_size,
                      num_proc=num_proc, features=features, new_fingerprint=fingerprint,
                      desc="sk.trees.parse_dataset")
    if progress:
        elapsed = max(time.perf_counter() - start, 1e-9)
        words = _count_words(out)
        print(f"parse_dataset: {len(out):,} texts, {words:,} words in {elapsed:.1f} s ({words / elapsed:,.0f} "
              f"words/s{f', {num_proc} processes' if num_proc and num_proc > 1 else ''})", file=sys.stderr,
              flush=True)
    return out


def _count_words(dataset) -> int:
    try:
        import pyarrow.compute as pc
        column = dataset.with_format("arrow")[:]["words"]
        return int(pc.sum(pc.list_value_length(column)).as_py() or 0)
    except Exception:  # a summary only: never fail the parse for it
        return sum(len(w) for w in dataset["words"])
