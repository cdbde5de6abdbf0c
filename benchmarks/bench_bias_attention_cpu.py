"""Distance-bias attention on the CPU: the fused C++ kernels against plain SDPA and the reference (ratios).

    python benchmarks/bench_bias_attention_cpu.py [--json out.json] [--threads 1,2] [--rounds 9]
    python benchmarks/bench_bias_attention_cpu.py --run cpp --n 2048 --batch 1 --steps 5   # one provider, for
                                                                                           # whole-process timers

Workload: fp32, H = 8, D = 64, UD English-EWT dev sentences (``$SYNTAXKERNELS_UD``; generated sentences without it,
named in the output) packed whole into rows of N = 512 (B = 4) and N = 2048 (B = 1). Providers on the same q, k, v:
``sk.syntax_bias_attention`` with ``backend="auto"`` (the C++ kernels), plain ``F.scaled_dot_product_attention``
without a mask, and ``backend="reference"``. Each size is checked against the fp64 reference (forward and every
gradient) before anything is timed. Times are medians of interleaved rounds (the machine may be shared: only the
ratios are meaningful); peak memory is the resident-size peak of one forward + backward in a fresh process
(:func:`syntaxkernels.tools.checks.bias_attention_cpu.peak_bytes`). The rows are those of
``python -m syntaxkernels bench --select "bias_attention cpu"``.

``--run PROVIDER`` instead builds the inputs once and runs ``--steps`` forward + backward steps of one provider
(``cpp``, ``sdpa`` or ``reference``) and nothing else, so that a whole-process timer (``/usr/bin/time -v``, or paired
A/B runs) can compare providers; ``--steps 0`` measures the set-up alone (inputs, imports and one
step at N = 16), so that (time(steps) - time(0)) / steps is the provider's step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from syntaxkernels.tools.checks import bias_attention_cpu as bench  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--threads", default="1", help="torch thread counts to time, comma-separated (default 1)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per provider (default 9)")
    parser.add_argument("--run", choices=("cpp", "sdpa", "reference"), default=None,
                        help="only run --steps forward + backward steps of this provider (whole-process timing)")
    parser.add_argument("--n", type=int, default=2048, help="--run: tokens per row (default 2048)")
    parser.add_argument("--batch", type=int, default=1, help="--run: rows (default 1)")
    parser.add_argument("--steps", type=int, default=5, help="--run: forward + backward steps (default 5)")
    args = parser.parse_args(argv)
    threads = tuple(int(t) for t in args.threads.split(","))
    if args.run is not None:
        torch.set_num_threads(threads[0])
        bench._step_for(args.run, 16, 1)()  # imports and first-call costs, so that --steps 0 holds them too
        step = bench._step_for(args.run, args.n, args.batch)
        for _ in range(args.steps):
            step()
        return 0
    torch.set_num_threads(1)
    rows = bench.cpu_rows([(512, 4), (2048, 1)], threads=threads, rounds=args.rounds)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
