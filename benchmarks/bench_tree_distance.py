"""All-pairs tree distance on batches of 32 real sentences: the C++ builder against scipy, networkx and a
pure-Python per-pair LCA walk (and the package's Python/NumPy fallback).

Data: the UD English-EWT dev treebank when present (``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`),
generated forests otherwise (the data line says so). Every provider's output is checked against scipy before it
is timed (scipy and networkx are needed here: ``pip install -e ".[bench]"``).

    python -m pytest benchmarks/bench_tree_distance.py --benchmark-only     # pytest-benchmark
    python benchmarks/bench_tree_distance.py [--json out.json] [--batches K] # printed table (+ JSON)

Columns: per-batch time, speed-up over scipy (scipy time / provider time) and valid pairs per second
(a batch's pairs = the sum of its squared sentence lengths). The goal is >= 100x scipy on one core.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import _ext  # noqa: E402
from syntaxkernels.tools import workloads  # noqa: E402
from syntaxkernels.tools.checks import trees as tree_checks  # noqa: E402

SLOW_BATCHES = 4  # networkx and the LCA walk run on the first few batches only


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def providers():
    """``(name, fn, input kind, slow)``: fn takes one batch prepared as ``input kind`` ("lists" or "tensors")."""
    module = _ext.load()
    rows = []
    if module is not None:
        rows.append(("C++ builder, 1 thread", lambda t: module.tree_distance(t[0], t[1], 1)[0], "tensors", False))
        rows.append(("sk.tree_distance(list of lists), end to end", lambda s: sk.tree_distance(s), "lists", False))
    rows += [
        ("Python/NumPy fallback", lambda t: sk.trees.python_tree_tensors(t[0], t[1])[0], "tensors", False),
        ("scipy shortest_path", tree_checks.scipy_tree_distance, "lists", False),
        ("networkx all_pairs_shortest_path_length", tree_checks.networkx_tree_distance, "lists", True),
        ("pure-Python LCA walk", tree_checks.lca_tree_distance, "lists", True),
    ]
    return rows


def _as_numpy(result) -> np.ndarray:
    return result.numpy() if isinstance(result, torch.Tensor) else result


def check_correctness(batch_list, tensors, expected, skip_slow=False) -> None:
    """Every provider == scipy on every batch it will be timed on (raises AssertionError otherwise)."""
    for name, fn, kind, slow in providers():
        if slow and skip_slow:
            continue
        inputs = tensors if kind == "tensors" else batch_list
        for k in range(SLOW_BATCHES if slow else len(batch_list)):
            got = _as_numpy(fn(inputs[k]))
            if not np.array_equal(got, expected[k]):
                raise AssertionError(f"{name} differs from scipy on batch {k}")


def run(batches: int | None = None, min_seconds: float = 0.5, pack_tokens: int | None = None) -> dict:
    torch.set_num_threads(1)
    source, batch_list = tree_checks.benchmark_batches(32, count=batches)
    if pack_tokens:
        sentences = [s for b in tree_checks.benchmark_batches(32)[1] for s in b]
        batch_list = tree_checks.batches(workloads.pack_sentences(sentences, pack_tokens), 32)[:batches]
        source += f", packed into forests of <= {pack_tokens} tokens"
    tensors = [tree_checks.padded(b) for b in batch_list]
    expected = [tree_checks.scipy_tree_distance(b) for b in batch_list]
    check_correctness(batch_list, tensors, expected, skip_slow=bool(pack_tokens))

    rows = []
    for name, fn, kind, slow in providers():
        if slow and pack_tokens:
            continue
        inputs = tensors if kind == "tensors" else batch_list
        count = SLOW_BATCHES if slow else len(batch_list)
        seconds = tree_checks.time_per_batch(fn, inputs[:count], min_seconds=min_seconds)
        pairs = sum(tree_checks.pair_count(b) for b in batch_list[:count]) / count
        rows.append(dict(provider=name, batches=count, batch_ms=seconds * 1e3, pairs_per_batch=pairs,
                         pairs_per_s=pairs / seconds))
    scipy_row = next(r for r in rows if r["provider"].startswith("scipy"))
    scipy_pair_s = scipy_row["batch_ms"] / scipy_row["pairs_per_batch"]
    for r in rows:
        # Ratio per pair, so providers timed on the first batches only compare fairly.
        r["vs_scipy"] = scipy_pair_s / (r["batch_ms"] / r["pairs_per_batch"])
    import scipy

    conditions = dict(
        date=datetime.date.today().isoformat(),
        cpu=_cpu_model(),
        threads=1,
        data=source,
        tokens_per_batch=sum(len(x) for b in batch_list for x in b) / len(batch_list),
        batch_size=32,
        python=platform.python_version(),
        torch=torch.__version__,
        numpy=np.__version__,
        scipy=scipy.__version__,
        networkx=__import__("networkx").__version__,
        extension=_ext.status(),
    )
    return dict(conditions=conditions, rows=rows)


def print_table(result: dict) -> None:
    for key, value in result["conditions"].items():
        print(f"{key:>10}: {value}")
    print()
    header = f"{'provider':<46} {'batches':>7} {'ms/batch':>10} {'x scipy':>9} {'pairs/s':>12}"
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        print(f"{r['provider']:<46} {r['batches']:>7} {r['batch_ms']:>10.4f} {r['vs_scipy']:>9.1f} "
              f"{r['pairs_per_s']:>12.3e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=None, help="use the first K batches (default: all)")
    parser.add_argument("--min-seconds", type=float, default=0.5, help="minimum timed seconds per repeat")
    parser.add_argument("--pack", type=int, default=None, metavar="TOKENS",
                        help="pack consecutive sentences into forests of at most TOKENS tokens (long sequences); "
                             "networkx and the LCA walk are left out")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    result = run(args.batches, args.min_seconds, args.pack)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


# --------------------------------------------------------------------------------- pytest-benchmark

@pytest.fixture(scope="module")
def data():
    torch.set_num_threads(1)
    source, batch_list = tree_checks.benchmark_batches(32, count=SLOW_BATCHES)
    tensors = [tree_checks.padded(b) for b in batch_list]
    expected = [tree_checks.scipy_tree_distance(b) for b in batch_list]
    check_correctness(batch_list, tensors, expected)
    return source, batch_list, tensors


@pytest.mark.parametrize("name", [p[0] for p in providers()])
def test_tree_distance(benchmark, data, name):
    source, batch_list, tensors = data
    _, fn, kind, _ = next(p for p in providers() if p[0] == name)
    inputs = tensors if kind == "tensors" else batch_list
    benchmark.group = f"tree distance: one pass over {SLOW_BATCHES} batches of 32 sentences"
    benchmark.extra_info.update(data=source, batches=len(inputs), threads=1)

    def one_pass():
        for item in inputs:
            fn(item)

    benchmark(one_pass)


if __name__ == "__main__":
    sys.exit(main())
