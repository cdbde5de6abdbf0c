"""Checks and benches of the C++ distance-bias attention on the CPU (``python -m syntaxkernels verify|bench``).

CHECKS: the C++ kernels against the fp64 reference (forward and the q, k, v, table and bias-scale gradients) on CPU
tensors, whatever ``--device`` says (they take CPU tensors only): fp32 ragged with a window, bf16 per-head causal,
attention dropout; and the same bits run to run and for 1 and 2 threads.
BENCHES: forward and forward + backward against plain SDPA (``F.scaled_dot_product_attention`` without a mask, same
q, k, v) and the reference, fp32, H = 8, D = 64, N = 512 and 2048 on treebank sentences packed into rows
(``$SYNTAXKERNELS_UD``; generated sentences without it, said in the row), one torch thread (and two with ``--full``);
each size is checked against the fp64 reference first and a size that fails is not timed. Times are medians of
interleaved rounds and reported as ratios (the machine may be shared); peak memory of one forward + backward from
the torch profiler's allocator events.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import torch

from . import Bench, Check, Skip
from syntaxkernels.tools.testing import bias_attention_case
from .bias_attention import BIAS_SCALE, OUTPUTS, _against_reference, _bits_differ

#: Rounds of the interleaved timing per provider (quick, full).
ROUNDS = (5, 9)


def _usable() -> None:
    from syntaxkernels.ops.bias_attention._host import cpu_kernels_take

    probe = torch.empty(1, 1, 1, 8)
    if not cpu_kernels_take(probe, probe):
        raise Skip("the C++ extension with the CPU bias-attention kernels is not built")


def _inputs(B, H, N, D, lengths=None, per_head=False, seed=0, heads=None):
    """The shared case (:func:`syntaxkernels.tools.testing.bias_attention_case`: two random trees per item, or the given
    ``heads`` rows; c = :data:`BIAS_SCALE`) on the CPU."""
    lengths = lengths or ([len(h) for h in heads] if heads else [N] * B)
    return dict(bias_attention_case(B, H, N, D, lengths=lengths, per_head=per_head, seed=seed, heads=heads,
                                    bias_scale=BIAS_SCALE), device="cpu")


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


def check_dropout(device):
    """Attention dropout (p = 0.2, a seed above 2^63) on the C++ kernels against the reference drawing the same
    mask: fp32, ragged, N = 301 (several query blocks)."""
    return _compare((2, 2, 301, 64), torch.float32, lengths=[301, 150], dropout_p=0.2, dropout_seed=2 ** 63 + 12345)


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
    Check("bias_attention.cpp_dropout", check_dropout),
]


# ------------------------------------------------------------------------------------------------ benches


def treebank_rows(N: int, B: int):
    """``(heads rows, source)``: B rows of whole treebank sentences packed one after another (at most N tokens),
    or generated sentences when the treebank is absent."""
    from syntaxkernels import data
    from ..workloads import generated_sentences, pack_sentences, treebank_heads

    if data.treebank_available():
        sentences, source = treebank_heads(), "UD English-EWT dev (packed)"
    else:
        sentences, source = generated_sentences(2000), "generated sentences (treebank absent, packed)"
    return pack_sentences(sentences, N, rows=B), source


_PEAK_SCRIPT = """
import gc, sys, torch
torch.set_num_threads(1)
from syntaxkernels.tools.checks.bias_attention_cpu import _step_for
step = _step_for(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
step()
gc.collect()

def field(name):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name)) * 1024

before = field("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from the current one
step()
print(field("VmHWM:") - before)
"""


def peak_bytes(provider: str, N: int, B: int) -> Optional[int]:
    """Peak resident memory added by one forward + backward of ``provider`` ("cpp", "sdpa", "reference") on the
    bench inputs, in a fresh process whose allocator returns large blocks to the system on free
    (``MALLOC_MMAP_THRESHOLD_``), measured from the kernel's own counters (VmHWM reset by ``clear_refs``);
    None where /proc does not offer them."""
    import os
    import subprocess
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        return None
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, provider, str(N), str(B)], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"peak memory of {provider} at N={N}: {done.stderr[-1000:]}")
    return int(done.stdout.split()[-1])


def _bench_inputs(N: int, B: int, heads: int = 8, dim: int = 64):
    heads_rows, source = treebank_rows(N, B)
    inp = _inputs(len(heads_rows), heads, N, dim, heads=heads_rows)
    grad_out = torch.randn(len(heads_rows), heads, N, dim, generator=torch.Generator().manual_seed(1))
    return inp, grad_out, source


def _providers(inp, grad_out, with_reference=True):
    """``{name: (forward, forward + backward)}`` on the same q, k, v: the C++ op, plain SDPA, the reference."""
    import torch.nn.functional as F

    import syntaxkernels as sk

    q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
    table = inp["table"].clone().requires_grad_()
    kw = dict(buckets=inp["buckets"], lengths=inp["lengths"])

    def op(backend):
        return lambda: sk.syntax_bias_attention(q, k, v, inp["distance"], table, backend=backend, **kw)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v)

    def step(fn, wrt):
        return lambda: torch.autograd.grad(fn(), wrt, grad_out)

    providers = {"cpp": (op("auto"), step(op("auto"), (q, k, v, table))),
                 "sdpa": (sdpa, step(sdpa, (q, k, v)))}
    if with_reference:
        providers["reference"] = (op("reference"), step(op("reference"), (q, k, v, table)))
    return providers


def _step_for(provider: str, N: int, B: int):
    inp, grad_out, _ = _bench_inputs(N, B)
    return _providers(inp, grad_out)[provider][1]


def interleaved_ms(fns: Dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> Dict[str, float]:
    """Median milliseconds of each function, timed in turn round after round (noise hits them alike), after
    ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(values)[len(values) // 2] for name, values in samples.items()}


def cpu_rows(sizes, threads=(1,), rounds=5, check=True, memory=True, reference_max_n=2048):
    """Rows of the CPU comparison: per (N, B) and thread count, the forward and forward + backward medians of the
    C++ op over plain SDPA on the same q, k, v (fp32, H = 8, D = 64), the reference's over the C++ op's, and the
    peak memory of one forward + backward over SDPA's. Each size is checked against the fp64 reference first
    (forward and every gradient); a size that fails raises instead of being timed."""
    rows = []
    for N, B in sizes:
        inp, grad_out, source = _bench_inputs(N, B)
        if check:
            ok, detail = _against_reference(inp, torch.float32, grad_out, _cpp(inp, torch.float32, grad_out))
            if not ok:
                raise RuntimeError(f"N={N}: the C++ kernels disagree with the reference, so they are not timed: "
                                   f"{detail}")
        providers = _providers(inp, grad_out, with_reference=N <= reference_max_n)
        peaks = {name: peak_bytes(name, N, B) for name in providers} if memory else {}
        for count in threads:
            previous = torch.get_num_threads()
            torch.set_num_threads(count)
            try:
                with torch.no_grad():
                    fwd = interleaved_ms({name: pair[0] for name, pair in providers.items()}, rounds)
                both = interleaved_ms({name: pair[1] for name, pair in providers.items()}, rounds)
            finally:
                torch.set_num_threads(previous)
            row = dict(N=N, B=inp["q"].shape[0], H=inp["q"].shape[1], D=inp["q"].shape[3], threads=count,
                       tokens=int(inp["lengths"].sum()), fwd_vs_sdpa=fwd["cpp"] / fwd["sdpa"],
                       fwd_bwd_vs_sdpa=both["cpp"] / both["sdpa"])
            if "reference" in providers:
                row["reference_vs_cpp"] = both["reference"] / both["cpp"]
            if peaks.get("cpp") and peaks.get("sdpa"):
                row["peak_mem_vs_sdpa"] = peaks["cpp"] / peaks["sdpa"]
                for name, peak in peaks.items():
                    row[f"{name}_peak_MiB"] = peak / 2**20
            row["checked"] = "out, dq, dk, dv, dtable, dscale vs fp64" if check else "no"
            row["trees"] = source
            rows.append(row)
    return rows


def bench_cpu(device, quick):
    _usable()
    sizes = [(512, 4), (2048, 1)]
    return cpu_rows(sizes, threads=(1,) if quick else (1, 2), rounds=ROUNDS[0] if quick else ROUNDS[1])


BENCHES = [Bench("bias_attention cpu (C++ vs SDPA, fp32, H=8, D=64; ratios, fwd+bwd; check first)", bench_cpu)]
