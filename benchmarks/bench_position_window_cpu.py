"""The positional window on the C++ kernels: forward (+ backward) with ``position_window=w`` over without it (ratios).

    python benchmarks/bench_position_window_cpu.py [--window 64] [--rounds 31] [--n 512]

Workload: fp32, B = 2, H = 4, D = 64, random forests of N tokens (:func:`syntaxkernels.tools.testing.
bias_attention_case`), one thread, ``backend="auto"`` on CPU tensors (the C++ kernels). The two calls are timed in
turn round after round (their order alternating), and each round gives one ratio (windowed / not): the median ratio
is the figure (the machine may be shared: only ratios are meaningful), with the median times beside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.tools.testing import bias_attention_case  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=64, help="position_window (default 64)")
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--n", type=int, default=512, help="tokens per item (default 512)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    case = bias_attention_case(2, 4, args.n, 64, seed=0)
    grad_out = torch.randn(2, 4, args.n, 64, generator=torch.Generator().manual_seed(1))
    q, k, v = (case[n].clone().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].clone().requires_grad_()
    if sk.ops.bias_attention.implementation(q, v) != "cpp":
        print("the C++ kernels are not built: nothing to time")
        return 1

    def step(window, backward):
        def run():
            out = sk.syntax_bias_attention(q, k, v, case["distance"], table, buckets=case["buckets"],
                                           lengths=case["lengths"], position_window=window)
            if backward:
                torch.autograd.grad(out, (q, k, v, table), grad_out)
        return run

    for label, backward in (("forward + backward", True), ("forward", False)):
        fns = [("none", step(None, backward)), ("window", step(args.window, backward))]
        for _, fn in fns:  # first-call costs
            fn()
        times = {name: [] for name, _ in fns}
        ratios = []
        for r in range(args.rounds):
            for name, fn in (fns if r % 2 == 0 else fns[::-1]):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
            ratios.append(times["window"][-1] / times["none"][-1])
        print(f"{label}: position_window={args.window} / none = {statistics.median(ratios):.3f} (median of "
              f"{args.rounds} rounds; {statistics.median(times['window']):.2f} ms against "
              f"{statistics.median(times['none']):.2f} ms), N = {args.n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
