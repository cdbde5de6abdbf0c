"""Checks and benches of the C++ distance-bias attention on the CPU (``python -m syntaxkernels verify|bench``).

CHECKS: the C++ kernels against the fp64 reference (forward and the q, k, v, table and bias-scale gradients) on CPU
tensors, whatever ``--device`` says (they take CPU tensors only): fp32 ragged with a window, bf16 per-head causal;
and the same bits run to run and for 1 and 2 threads.
BENCHES: forward and forward + backward against plain SDPA (``F.scaled_dot_product_attention`` without a mask, same
q, k, v) and the reference, fp32, H = 8, D = 64, N = 512 and 2048 on treebank sentences packed into rows
(``$SYNTAXKERNELS_UD``; generated sentences without it, said in the row), one torch thread (and two with ``--full``);
each size is checked against the fp64 reference first and a size that fails is not timed. Times are medians of
interleaved rounds and reported as ratios (the machine may be shared); peak memory of one forward + backward from
the torch profiler's allocator events.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Dict, List

import torch

from . import Bench, Check, Skip
from .bias_attention import OUTPUTS, _against_reference, _bits_differ

#: Rounds of the interleaved timing per provider (quick, full).
ROUNDS = (5, 9)


def _usable() -> None:
    from ..ops.bias_attention_cpu import cpu_kernels_take

    probe = torch.empty(1, 1, 1, 8)
    if not cpu_kernels_take(probe, probe):
        raise Skip("the C++ extension with the CPU bias-attention kernels is not built")


def _inputs(B, H, N, D, lengths=None, per_head=False, seed=0, heads=None):
    import syntaxkernels as sk
    from ..workloads import random_forest

    rng = random.Random(seed)
    lengths = lengths or ([len(h) for h in heads] if heads else [N] * B)
    if heads is None:
        heads = [random_forest(rng, L, num_trees=2) if L else [] for L in lengths]
    distance = torch.full((B, N, N), 255, dtype=torch.uint8)
    built = sk.tree_distance(heads, torch.tensor(lengths))
    distance[:, :built.shape[-1], :built.shape[-1]] = built
    gen = torch.Generator().manual_seed(seed)
    buckets = sk.BucketSpec()
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    table = torch.randn((H, buckets.num_buckets) if per_head else (buckets.num_buckets,), generator=gen)
    return dict(q=q, k=k, v=v, distance=distance, table=table, buckets=buckets, lengths=torch.tensor(lengths),
                device="cpu")


def _cpp(inp, dtype, grad_out, **kw):
    """``[out, dq, dk, dv, dtable, dscale]`` of ``backend="auto"`` on CPU tensors (the C++ kernels)."""
    from .bias_attention import _grads

    return _grads(inp, dtype, "auto", grad_out, **kw)


def _compare(shape, dtype, lengths=None, per_head=False, **kw):
    _usable()
    inp = _inputs(*shape, lengths=lengths, per_head=per_head)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    return _against_reference(inp, dtype, grad_out, _cpp(inp, dtype, grad_out, **kw), **kw)


def check_fp32_window(device):
    return _compare((2, 2, 300, 64), torch.float32, lengths=[300, 181], window=3)


def check_bf16_perhead_causal(device):
    return _compare((2, 2, 130, 64), torch.bfloat16, per_head=True, causal=True)


def check_threads(device):
    """The same bits run to run and with 1 and 2 threads, and close to the fp64 reference (so a consistently wrong
    result fails)."""
    _usable()
    shape = (2, 3, 200, 32)
    inp = _inputs(*shape, lengths=[200, 97], per_head=True)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 1, 2):
            torch.set_num_threads(count)
            runs.append(_cpp(inp, torch.float32, grad_out, causal=True))
    finally:
        torch.set_num_threads(threads)
    for k, again in enumerate(runs[1:]):
        differ = _bits_differ(runs[0], again)
        if differ:
            return False, f"{', '.join(differ)} differ between run 1 and run {k + 2} (threads 1, 2, 1, 2)"
    ok, detail = _against_reference(inp, torch.float32, grad_out, runs[0], causal=True)
    return ok, f"bit-identical over 4 runs with 1, 2, 1, 2 threads ({', '.join(OUTPUTS)}); {detail}"


CHECKS = [
    Check("bias_attention.cpp_fp32_ragged_window", check_fp32_window),
    Check("bias_attention.cpp_bf16_perhead_causal", check_bf16_perhead_causal),
    Check("bias_attention.cpp_threads_bit_identical", check_threads),
]


# ------------------------------------------------------------------------------------------------ benches


def treebank_rows(N: int, B: int):
    """``(heads rows, source)``: B rows of whole treebank sentences packed one after another (at most N tokens),
    or generated sentences when the treebank is absent."""
    from .. import data
    from ..workloads import generated_sentences, pack_sentences, treebank_heads

    if data.treebank_available():
        sentences, source = treebank_heads(), "UD English-EWT dev (packed)"
    else:
        sentences, source = generated_sentences(2000), "generated sentences (treebank absent, packed)"
    return pack_sentences(sentences, N, rows=B), source


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes allocated through torch's CPU allocator during ``fn()``, above the start (profiler events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.time_range.start, e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]")
    current = peak = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def interleaved_ms(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, float]:
    """Median milliseconds of each function, timed in turn round after round (noise hits them alike)."""
    for fn in fns.values():
        fn()
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(values)[len(values) // 2] for name, values in samples.items()}


def cpu_rows(sizes, threads=(1,), rounds=5, heads=8, dim=64, check=True, reference_max_n=2048):
    """Rows of the CPU comparison: per N and thread count, fwd and fwd+bwd medians (ms) of the C++ op, plain SDPA
    and the reference, their ratios, and peak memory of one fwd+bwd. Each N is checked against the fp64 reference
    first (forward and every gradient); a size that fails raises instead of being timed."""
    import torch.nn.functional as F

    import syntaxkernels as sk

    rows = []
    for N, B in sizes:
        heads_rows, source = treebank_rows(N, B)
        B = len(heads_rows)
        inp = _inputs(B, heads, N, dim, heads=heads_rows)
        shape = (B, heads, N, dim)
        grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        if check:
            ok, detail = _against_reference(inp, torch.float32, grad_out, _cpp(inp, torch.float32, grad_out))
            if not ok:
                raise RuntimeError(f"N={N}: the C++ kernels disagree with the reference, so they are not timed: "
                                   f"{detail}")
        q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
        table = inp["table"].clone().requires_grad_()
        kw = dict(buckets=inp["buckets"], lengths=inp["lengths"])

        def op(backend):
            return lambda: sk.syntax_bias_attention(q, k, v, inp["distance"], table, backend=backend, **kw)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v)

        def step(fn):
            def run():
                out = fn()
                torch.autograd.grad(out, (q, k, v, table) if fn is not sdpa else (q, k, v), grad_out)
            return run

        providers = {"cpp": op("auto"), "sdpa": sdpa}
        if N <= reference_max_n:
            providers["reference"] = op("reference")
        memory = {name: peak_bytes(step(fn)) for name, fn in providers.items()}
        for count in threads:
            previous = torch.get_num_threads()
            torch.set_num_threads(count)
            try:
                with torch.no_grad():
                    fwd = interleaved_ms(providers, rounds)
                both = interleaved_ms({name: step(fn) for name, fn in providers.items()}, rounds)
            finally:
                torch.set_num_threads(previous)
            row = dict(N=N, B=B, H=heads, D=dim, threads=count, tokens=int(inp["lengths"].sum()),
                       fwd_vs_sdpa=fwd["cpp"] / fwd["sdpa"], fwd_bwd_vs_sdpa=both["cpp"] / both["sdpa"])
            if "reference" in providers:
                row["reference_vs_cpp"] = both["reference"] / both["cpp"]
            row["peak_mem_vs_sdpa"] = memory["cpp"] / max(memory["sdpa"], 1)
            row["cpp_ms"] = both["cpp"]
            row["trees"] = source
            rows.append(row)
    return rows


def bench_cpu(device, quick):
    _usable()
    sizes = [(512, 4), (2048, 1)]
    return cpu_rows(sizes, threads=(1,) if quick else (1, 2), rounds=ROUNDS[0] if quick else ROUNDS[1])


BENCHES = [Bench("bias_attention cpu (C++ vs SDPA, fp32, H=8, D=64; ratios, fwd+bwd; check first)", bench_cpu)]
