"""Build time and memory of ``sk.trees.from_tree_sitter`` on this package's own sources (benchmarks/RESULTS.md,
"Code as a structure source").

The package's ``.py`` files concatenated (sorted by path) are cut after the first T tokens of a regex tokenizer
(words, whitespace runs, single other characters; byte offsets); each size runs in a fresh process so that its peak
resident memory is its own. Needs tree-sitter and tree-sitter-python.

    python benchmarks/code_trees.py --tokens 2048 8192 --repeats 5

``--relations path,ancestor,sibling`` (a comma list, ``sk.RelationBatch.code_model``'s names; clips with
``--clips max_sibling=1,...``) times the code-model relations built from the plan too (``relations_*`` fields:
median and best of the repeats, the node tables' bytes, the process's peak RSS growth over the plan's build).
"""
import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package


def corpus_and_spans(tokens: int):
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "syntaxkernels").rglob("*.py")))
    data = text.encode("utf-8")
    spans = [m.span() for m in re.finditer(rb"\w+|\s+|[^\w\s]", data)][:tokens]
    return data[:spans[-1][1]], spans


def one(tokens: int, repeats: int, relations=None, clips=None) -> dict:
    import numpy as np
    import torch

    from syntaxkernels.trees import code

    source, spans = corpus_and_spans(tokens)
    parser = code._parser("python")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total, parse, nodes_time = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = code.from_tree_sitter(source, spans, language=parser)
        total.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tree = parser.parse(source)
        t1 = time.perf_counter()
        code.syntax_nodes(tree)
        parse.append(t1 - t0)
        nodes_time.append(time.perf_counter() - t1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    M = len(plan.node_types[0])
    starts, _, _, _ = code.syntax_nodes(parser.parse(source))
    extra = {}
    if relations:
        from syntaxkernels.trees import RelationBatch

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            built = RelationBatch.code_model(plan, relations, **(clips or {}))
            times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        extra = dict(relations=list(relations), clips=clips or {}, relation_codes=int(built.distance.max()) + 1,
                     relations_seconds_median=statistics.median(times), relations_seconds_min=min(times),
                     relations_node_table_bytes=2 * M * M, relations_code_bytes=int(
                         built.distance.untyped_storage().nbytes()),
                     relations_peak_rss_growth_mib=(after - peak) / 1024)
    return dict(tokens=len(spans), bytes=len(source), named_nodes=int(starts.size), kept_nodes=M,
                seconds_median=statistics.median(total), seconds_min=min(total),
                parse_s=statistics.median(parse), walk_s=statistics.median(nodes_time),
                node_distance_bytes=(-(-M // 16) * 16) ** 2,
                distance_bytes=int(plan.distance.untyped_storage().nbytes()),
                peak_rss_growth_mib=(peak - before) / 1024, torch_threads=torch.get_num_threads(),
                max_distance=int(plan.distance[0][plan.distance[0] < 255].max()), numpy=np.__version__, **extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--relations", default="", help="also build these code-model relations (comma list)")
    parser.add_argument("--clips", default="", help="their clips, e.g. max_sibling=1,max_steps=1")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    relations = tuple(n for n in args.relations.split(",") if n)
    clips = {k: int(v) for k, v in (c.split("=") for c in args.clips.split(",") if c)}
    if args.one:
        print(json.dumps(one(args.tokens[0], args.repeats, relations, clips)))
        return
    for tokens in args.tokens:
        out = subprocess.run([sys.executable, __file__, "--one", "--tokens", str(tokens), "--repeats",
                              str(args.repeats), "--relations", args.relations, "--clips", args.clips],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
