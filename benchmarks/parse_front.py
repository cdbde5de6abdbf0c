"""The parse front's own cost per word: ``sk.trees.parse_dataset`` with a toy parser that costs ~0, or with a real
spaCy pipeline (``--spacy``) against that parser alone.

Texts: the UD treebank's sentences (``$SYNTAXKERNELS_UD``, default the English EWT dev file), each
``" ".join(words)``. Parser: a toy (whitespace words, each word headed by the previous, the first the root), so
what is timed is the front: reading the batch, calling the parser, converting, the SQLite cache (lookup, JSON,
insert), ``join_sentences`` and writing the Arrow columns through ``datasets.map``. With ``--spacy NAME_OR_DIR``
the parser is that spaCy pipeline (``spacy.load(NAME_OR_DIR, exclude=--exclude)``), and the parser alone is
``nlp.pipe`` over the texts (``n_process`` 1 and 2).

For 1 and 2 processes it reports words/s of

- ``cold``: an empty cache (every text parsed and stored),
- ``cached``: the same call again (every parse read from the cache),
- ``no cache``: ``cache_dir=False`` (the parser and the Arrow writing only),

and, for scale, the parser alone over the texts, ``sk.trees.parse`` (a list, one process) and the collation of
the parsed rows into model batches (``DataLoader(parsed, batch_size=32, collate_fn=TreeCollator(tokenizer=tok))``,
a WordPiece tokenizer trained on the texts: tokenising, aligning and building the trees). The dataset is in memory,
so ``datasets`` keeps no Arrow cache of the map and every run does the work. Words are the treebank's words
(a spaCy pipeline tokenises the texts again; its token count is printed too). Median of ``--repeats``.

    python benchmarks/parse_front.py [--repeats 3] [--limit N] [--batch-size 256] [--spacy en_core_web_sm]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's syntaxkernels

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.trees import Sentence  # noqa: E402

DEFAULT_UD = "/work/shared/data/ud/en_ewt-ud-dev.conllu"


def toy(text):
    words = text.split()
    n = len(words)
    return [Sentence(words=words, heads=[-1] + list(range(n - 1)), upos=["X"] * n,
                     deprel=["root"] + ["dep"] * (n - 1))]


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _spacy_parser(name, exclude):
    import spacy

    nlp = spacy.load(name, exclude=[c for c in exclude.split(",") if c])
    return nlp, (lambda texts, n_process=1: list(nlp.pipe(texts, batch_size=64, n_process=n_process)))


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    args.add_argument("--batch-size", type=int, default=256)
    args.add_argument("--spacy", default=None, help="a spaCy pipeline (package name or directory) as the parser")
    args.add_argument("--exclude", default="ner,lemmatizer", help="spaCy components not loaded (comma-separated)")
    opts = args.parse_args(argv)
    import datasets
    datasets.disable_progress_bars()

    path = os.environ.get("SYNTAXKERNELS_UD") or DEFAULT_UD
    sentences = sk.trees.read_conllu(path)[: opts.limit]
    texts = [" ".join(s.words) for s in sentences]
    words = sum(len(t.split()) for t in texts)
    ds = datasets.Dataset.from_dict({"text": texts})
    if opts.spacy:
        parser, alone = _spacy_parser(opts.spacy, opts.exclude)
        parser_id = None  # the pipeline's own identity (sk.trees.parser_identity)
        name = f"spaCy {opts.spacy} ({'+'.join(parser.pipe_names)}, {sk.trees.parser_identity(parser)})"
    else:
        parser, parser_id, name = toy, "toy", "toy"
        alone = lambda texts, n_process=1: [toy(x) for x in texts]  # noqa: E731
    print(f"{Path(path).name}: {len(texts)} texts ({len(set(texts))} distinct), {words} words; parser {name}; "
          f"datasets {datasets.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"batch_size {opts.batch_size}; median of {opts.repeats}")

    # warm-up (imports, the first map's setup, the parser's first batch), untimed
    with tempfile.TemporaryDirectory() as tmp:
        sk.trees.parse_dataset(ds.select(range(min(50, len(ds)))), parser, parser_id=parser_id, cache_dir=tmp,
                               progress=False)
    rows = []
    t, _ = _median_time(lambda: alone(texts), opts.repeats)
    rows.append(("parser alone", 1, t))
    if opts.spacy:
        t, _ = _median_time(lambda: alone(texts, n_process=2), opts.repeats)
        rows.append(("parser alone (nlp.pipe n_process)", 2, t))
        tokens = sum(len(s.words) for s in sk.trees.parse(texts[:2000], parser=parser, cache_dir=False))
        print(f"spaCy tokens in the first {min(len(texts), 2000)} texts: {tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        def list_front(i=[0]):
            i[0] += 1
            sk.trees.parse(texts, parser=parser, parser_id=parser_id, cache_dir=Path(tmp) / f"list{i[0]}")
        t, _ = _median_time(list_front, opts.repeats)
        rows.append(("sk.trees.parse (list), cold", 1, t))
        parsed = None
        for num_proc in (1, 2):
            nproc = None if num_proc == 1 else num_proc
            counter = [0]

            def cold():
                counter[0] += 1
                directory = Path(tmp) / f"p{num_proc}_{counter[0]}"
                out = sk.trees.parse_dataset(ds, parser, parser_id=parser_id, cache_dir=directory, num_proc=nproc,
                                             batch_size=opts.batch_size, progress=False)
                assert len(out) == len(texts)
                return directory

            t, _ = _median_time(cold, opts.repeats)
            rows.append(("parse_dataset, cold cache", num_proc, t))
            warm_dir = Path(tmp) / f"p{num_proc}_1"
            t, _ = _median_time(lambda: sk.trees.parse_dataset(ds, parser, parser_id=parser_id, cache_dir=warm_dir,
                                                               num_proc=nproc, batch_size=opts.batch_size,
                                                               progress=False), opts.repeats)
            rows.append(("parse_dataset, cached rerun", num_proc, t))
            t, _ = _median_time(lambda: sk.trees.parse_dataset(ds, parser, parser_id=parser_id, cache_dir=False,
                                                               num_proc=nproc, batch_size=opts.batch_size,
                                                               progress=False), opts.repeats)
            rows.append(("parse_dataset, no cache", num_proc, t))
            if parsed is None:
                parsed = sk.trees.parse_dataset(ds, parser, parser_id=parser_id, cache_dir=warm_dir, progress=False)
        rows.append(("collate rows (TreeCollator, tokenizer)", 1, _collate_time(parsed, texts, tmp, opts.repeats)))
    print(f"{'what':40s} {'processes':>9s} {'seconds':>8s} {'words/s':>10s} {'us/word':>8s}")
    for what, procs, t in rows:
        print(f"{what:40s} {str(procs):>9s} {t:8.3f} {words / t:10,.0f} {1e6 * t / words:8.2f}")
    return 0


def _collate_time(parsed, texts, tmp, repeats):
    """Seconds to collate every parsed row into model batches of 32 (tokenise, align, build the trees)."""
    from torch.utils.data import DataLoader

    from syntaxkernels.tools.testing import wordpiece_tokenizer

    tok = wordpiece_tokenizer(texts, tmp, vocab_size=4000)
    loader = DataLoader(parsed, batch_size=32, collate_fn=sk.trees.TreeCollator(tokenizer=tok))
    t, _ = _median_time(lambda: sum(int(b["lengths"].sum()) for b in loader), repeats)
    return t


if __name__ == "__main__":
    sys.exit(main())
