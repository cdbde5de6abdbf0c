"""The parse front's own cost per word: ``sk.trees.parse_dataset`` with a parser that costs ~0.

Texts: the UD treebank's sentences (``$SYNTAXKERNELS_UD``, default the English EWT dev file), each
``" ".join(words)``. Parser: a toy (whitespace words, each word headed by the previous, the first the root), so
what is timed is the front: reading the batch, calling the parser, converting, the SQLite cache (lookup, JSON,
insert), ``join_sentences`` and writing the Arrow columns through ``datasets.map``.

For 1 and 2 processes it reports words/s of

- ``cold``: an empty cache (every text parsed and stored),
- ``cached``: the same call again (every parse read from the cache),
- ``no cache``: ``cache_dir=False`` (the parser and the Arrow writing only),

and, for scale, the toy parser alone over the texts and ``sk.trees.parse`` (a list, one process). The dataset is
in memory, so ``datasets`` keeps no Arrow cache of the map and every run does the work. Median of ``--repeats``.

    python benchmarks/parse_front.py [--repeats 3] [--limit N] [--batch-size 256]
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


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    args.add_argument("--batch-size", type=int, default=256)
    opts = args.parse_args(argv)
    import datasets
    datasets.disable_progress_bars()

    path = os.environ.get("SYNTAXKERNELS_UD") or DEFAULT_UD
    sentences = sk.trees.read_conllu(path)[: opts.limit]
    texts = [" ".join(s.words) for s in sentences]
    words = sum(len(t.split()) for t in texts)
    ds = datasets.Dataset.from_dict({"text": texts})
    print(f"{Path(path).name}: {len(texts)} texts ({len(set(texts))} distinct), {words} words; "
          f"datasets {datasets.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"batch_size {opts.batch_size}; median of {opts.repeats}")

    # warm-up (imports, the first map's setup), untimed
    with tempfile.TemporaryDirectory() as tmp:
        sk.trees.parse_dataset(ds.select(range(min(50, len(ds)))), toy, parser_id="toy", cache_dir=tmp,
                               progress=False)
    rows = []
    t, _ = _median_time(lambda: [toy(x) for x in texts], opts.repeats)
    rows.append(("toy parser alone", "-", t))
    with tempfile.TemporaryDirectory() as tmp:
        def list_front(i=[0]):
            i[0] += 1
            sk.trees.parse(texts, parser=toy, parser_id="toy", cache_dir=Path(tmp) / f"list{i[0]}")
        t, _ = _median_time(list_front, opts.repeats)
        rows.append(("sk.trees.parse (list), cold", 1, t))
        for num_proc in (1, 2):
            nproc = None if num_proc == 1 else num_proc
            counter = [0]

            def cold():
                counter[0] += 1
                directory = Path(tmp) / f"p{num_proc}_{counter[0]}"
                out = sk.trees.parse_dataset(ds, toy, parser_id="toy", cache_dir=directory, num_proc=nproc,
                                             batch_size=opts.batch_size, progress=False)
                assert len(out) == len(texts)
                return directory

            t, _ = _median_time(cold, opts.repeats)
            rows.append(("parse_dataset, cold cache", num_proc, t))
            warm_dir = Path(tmp) / f"p{num_proc}_1"
            t, _ = _median_time(lambda: sk.trees.parse_dataset(ds, toy, parser_id="toy", cache_dir=warm_dir,
                                                               num_proc=nproc, batch_size=opts.batch_size,
                                                               progress=False), opts.repeats)
            rows.append(("parse_dataset, cached rerun", num_proc, t))
            t, _ = _median_time(lambda: sk.trees.parse_dataset(ds, toy, parser_id="toy", cache_dir=False,
                                                               num_proc=nproc, batch_size=opts.batch_size,
                                                               progress=False), opts.repeats)
            rows.append(("parse_dataset, no cache", num_proc, t))
    print(f"{'what':34s} {'processes':>9s} {'seconds':>8s} {'words/s':>10s} {'us/word':>8s}")
    for name, procs, t in rows:
        print(f"{name:34s} {str(procs):>9s} {t:8.3f} {words / t:10,.0f} {1e6 * t / words:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
