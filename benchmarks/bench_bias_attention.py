"""Distance-bias attention: syntaxkernels vs the alternatives a user would pick (GPU only).

Providers (one grid, bf16):
    syntaxkernels   the fused Triton kernel (bias gathered in-kernel, table gradient on chip);
    reference       syntaxkernels.reference (materialises [B, H, N, N]);
    sdpa_dense_bias SDPA, memory-efficient backend, with a dense float bias [B, 1, N, N] gathered from the
                    same learnable table by PyTorch (its gradient flows back through the gather);
    flex            FlexAttention with a score_mod gathering the same learnable table per score;
    sdpa_flash      SDPA flash backend without any bias (the ceiling).
Modes fwd, bwd, fwd+bwd; N from 256 to 8192 with B*N fixed; D 64 and 128. TFLOP/s by the FlashAttention
convention, peak memory per call. Every provider's forward output is checked against syntaxkernels'
reference before it is timed (a provider that disagrees is reported, not timed).

    python benchmarks/bench_bias_attention.py [--quick] [--json out.json]

With ``--workloads sentences,pairs,...`` it times the named workloads of the inspection report instead
(:mod:`syntaxkernels.tools.workloads`: real batches, padded to the batch's longest or to a fixed N, ragged lengths;
12 heads of 64, a shared ``BucketSpec()`` table): syntaxkernels with the batch's lengths against SDPA with the
same bias and the padding masked (-inf for keys past the length), each checked against the reference on the
valid rows first, and reports valid (query, key) pairs per second beside the time.
On a machine without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from _bench_utils import (attention_tflops, base_parser, peak_memory_mib, require_cuda, save_rows, time_ms,  # noqa: E402
                          write_results)

PROVIDERS = ("syntaxkernels", "reference", "sdpa_dense_bias", "flex", "sdpa_flash")
MODES = ("fwd", "bwd", "fwd+bwd")


def make_inputs(B, H, N, D, dtype=torch.bfloat16, seed=0):
    import random

    import syntaxkernels as sk

    rng = random.Random(seed)
    heads = [[-1] + [rng.randrange(0, i) for i in range(1, N)] for _ in range(B)]
    distance = sk.tree_distance(heads).cuda()
    buckets = sk.BucketSpec()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    table = (0.5 * torch.randn(buckets.num_buckets, device="cuda", generator=gen)).requires_grad_()
    return dict(q=q, k=k, v=v, distance=distance, table=table, buckets=buckets)


def provider_fn(name, inputs):
    """``f(q, k, v, table) -> out`` for one provider, or None when it is unavailable here."""
    import syntaxkernels as sk

    distance, buckets = inputs["distance"], inputs["buckets"]
    if name == "syntaxkernels":
        return lambda q, k, v, t: sk.syntax_bias_attention(q, k, v, distance, t, buckets=buckets, backend="triton")
    if name == "reference":
        return lambda q, k, v, t: sk.reference.syntax_bias_attention(q, k, v, distance, t, buckets=buckets)
    if name == "sdpa_dense_bias":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        bucket = buckets.lut(distance.device)[distance.long()]

        def f(q, k, v, t):
            bias = t[bucket].to(q.dtype)[:, None]
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(
                    q.shape[0], q.shape[1], -1, -1))
        return f
    if name == "flex":
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError:
            return None
        bucket = buckets.lut(distance.device)[distance.long()].to(torch.int32)
        compiled = torch.compile(flex_attention, dynamic=False)

        def f(q, k, v, t):
            def score_mod(score, b, h, i, j):
                return score + t[bucket[b, i, j]]
            return compiled(q, k, v, score_mod=score_mod)
        return f
    if name == "sdpa_flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def f(q, k, v, t):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return f
    raise ValueError(name)


def check_provider(name, fn, inputs):
    """(ok, detail): the provider's forward against the reference (bf16 tolerance of syntaxkernels.tools.testing)."""
    import syntaxkernels as sk
    from syntaxkernels.tools.testing import compare_to_reference

    q, k, v, t = inputs["q"], inputs["k"], inputs["v"], inputs["table"]
    if name == "sdpa_flash":
        ref64 = sk.reference.syntax_bias_attention(q.double(), k.double(), v.double(), inputs["distance"],
                                                   torch.zeros_like(t).double(), buckets=inputs["buckets"])
        reflp = sk.reference.syntax_bias_attention(q, k, v, inputs["distance"], torch.zeros_like(t),
                                                   buckets=inputs["buckets"])
    else:
        ref64 = sk.reference.syntax_bias_attention(q.double(), k.double(), v.double(), inputs["distance"],
                                                   t.detach().double(), buckets=inputs["buckets"])
        reflp = sk.reference.syntax_bias_attention(q, k, v, inputs["distance"], t.detach(), buckets=inputs["buckets"])
    with torch.no_grad():
        out = fn(q, k, v, t)
    ok, err, bound = compare_to_reference(out, ref64, reflp)
    return ok, f"max err {err:.3e} (bound {bound:.3e})"


def run_mode(fn, inputs, mode):
    q, k, v, t = (inputs[n] for n in ("q", "k", "v", "table"))
    if mode == "fwd":
        return lambda: fn(q, k, v, t)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    if mode == "fwd+bwd":
        def step():
            out = fn(qg, kg, vg, t)
            out.backward(torch.ones_like(out))
        return step
    out = fn(qg, kg, vg, t)
    grad = torch.ones_like(out)
    return lambda: out.backward(grad, retain_graph=True)


WORKLOAD_PROVIDERS = ("syntaxkernels", "sdpa_dense_bias")


def workload_inputs(name, H=12, D=64, dtype=torch.bfloat16, seed=0):
    """q, k, v, the trees and a learnable table for one named workload's whole batch, on the GPU."""
    from syntaxkernels.tools import workloads

    import syntaxkernels as sk

    workload = workloads.named_workload(name)
    batch = workload.tree_batch().to("cuda")
    B, N = batch.distance.shape[0], batch.distance.shape[1]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    buckets = sk.BucketSpec()
    table = (0.5 * torch.randn(buckets.num_buckets, device="cuda", generator=gen)).requires_grad_()
    return dict(q=q, k=k, v=v, distance=batch.distance, lengths=batch.lengths, table=table, buckets=buckets,
                workload=workload)


def workload_fn(name, inputs):
    """``f(q, k, v, table) -> out`` on a padded batch with lengths; rows past the length are not compared."""
    import syntaxkernels as sk

    distance, lengths, buckets = inputs["distance"], inputs["lengths"], inputs["buckets"]
    if name == "syntaxkernels":
        return lambda q, k, v, t: sk.syntax_bias_attention(q, k, v, distance, t, buckets=buckets, lengths=lengths,
                                                           backend="triton")
    if name == "sdpa_dense_bias":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        N = distance.shape[-1]
        bucket = buckets.lut(distance.device)[distance.long()]
        keys_ok = (torch.arange(N, device=distance.device)[None, :] < lengths[:, None].long())[:, None, None, :]

        def f(q, k, v, t):
            bias = t[bucket].to(q.dtype)[:, None].masked_fill(~keys_ok, float("-inf"))
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(
                    q.shape[0], q.shape[1], -1, -1))
        return f
    raise ValueError(name)


def check_workload_provider(fn, inputs):
    """(ok, detail): the forward on the valid rows against the reference with the batch's lengths."""
    import syntaxkernels as sk
    from syntaxkernels.tools.testing import compare_to_reference

    q, k, v, t = inputs["q"], inputs["k"], inputs["v"], inputs["table"]
    kw = dict(buckets=inputs["buckets"], lengths=inputs["lengths"])
    ref64 = sk.reference.syntax_bias_attention(q.double(), k.double(), v.double(), inputs["distance"],
                                               t.detach().double(), **kw)
    reflp = sk.reference.syntax_bias_attention(q, k, v, inputs["distance"], t.detach(), **kw)
    with torch.no_grad():
        out = fn(q, k, v, t)
    N = q.shape[2]
    rows = (torch.arange(N, device=q.device)[None, :] < inputs["lengths"][:, None].long())[:, None, :, None]
    ok, err, bound = compare_to_reference(out * rows, ref64 * rows, reflp * rows)
    return ok, f"max err {err:.3e} (bound {bound:.3e})"


def run_workloads(names, providers, modes, json_path) -> int:
    rows = []
    title = "bias attention on named workloads, bf16, H = 12, D = 64"

    def add(row):
        rows.append(row)
        print(row, flush=True)
        save_rows(rows, json_path, title)

    for name in names:
        inputs = workload_inputs(name)
        w = inputs["workload"]
        B, H, N, D = inputs["q"].shape
        valid = w.valid_pairs()
        for provider in providers:
            base = dict(workload=name, provider=provider, B=B, N=N, H=H, D=D, valid=round(valid / (B * N * N), 3))
            try:
                fn = workload_fn(provider, inputs)
                ok, detail = check_workload_provider(fn, inputs)
            except Exception as exc:  # noqa: BLE001 - one provider failing must not stop the others
                add(dict(base, mode="-", note=f"error: {exc!r}"[:200]))
                continue
            if not ok:
                add(dict(base, mode="-", note=f"WRONG RESULT, not timed: {detail}"))
                continue
            for mode in modes:
                try:
                    step = run_mode(fn, inputs, mode)
                    timing = time_ms(step)
                    add(dict(base, mode=mode, **timing, gpairs_s=round(valid * H / timing["ms"] / 1e6, 2),
                             peak_mib=peak_memory_mib(step), note=detail))
                except Exception as exc:  # noqa: BLE001
                    add(dict(base, mode=mode, note=f"error: {exc!r}"[:200]))
                torch.cuda.empty_cache()
    write_results(rows, json_path, title,
                  ["workload", "provider", "B", "N", "valid", "mode", "ms", "gpairs_s", "peak_mib", "note"])
    return 0


def _names(allowed):
    """argparse type: a comma-separated subset of ``allowed`` (a typo is an argument error, not a missing row)."""
    def parse(value):
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or value!r}; choose from {','.join(allowed)}")
        return names
    return parse


def main(argv=None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--providers", type=_names(PROVIDERS), default=list(PROVIDERS),
                        help=f"comma-separated subset of {','.join(PROVIDERS)}")
    parser.add_argument("--modes", type=_names(MODES), default=list(MODES),
                        help=f"comma-separated subset of {','.join(MODES)}")
    from syntaxkernels.tools.workloads import WORKLOADS

    parser.add_argument("--workloads", type=_names(tuple(WORKLOADS)), default=None,
                        help="time these named workloads (comma-separated) instead of the N grid: "
                             f"{','.join(WORKLOADS)}")
    args = parser.parse_args(argv)
    if not require_cuda("bench_bias_attention.py"):
        return 0
    if args.workloads:
        providers = [p for p in args.providers if p in WORKLOAD_PROVIDERS] or list(WORKLOAD_PROVIDERS)
        return run_workloads(args.workloads, providers, args.modes, args.json)
    tokens = 16384
    sizes = [1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096, 8192]
    head_dims = [64] if args.quick else [64, 128]
    title = "bias attention, bf16, B*N = 16384"
    rows = []

    def add(row):
        rows.append(row)
        print(row, flush=True)
        save_rows(rows, args.json, title)  # kept if the run is cut short

    for D in head_dims:
        H = 2048 // D // 2  # 16 heads of 64, 8 of 128
        for N in sizes:
            B = max(1, tokens // N)
            inputs = make_inputs(B, H, N, D)
            for name in args.providers:
                if name == "reference" and N > 4096:
                    add(dict(provider=name, N=N, B=B, H=H, D=D, mode="-", note="skipped: O(B H N^2) memory"))
                    continue
                try:
                    fn = provider_fn(name, inputs)
                    if fn is None:
                        add(dict(provider=name, N=N, B=B, H=H, D=D, mode="-", note="unavailable"))
                        continue
                    ok, detail = check_provider(name, fn, inputs)
                except Exception as exc:  # noqa: BLE001 - one provider failing must not stop the grid
                    add(dict(provider=name, N=N, B=B, H=H, D=D, mode="-", note=f"error: {exc!r}"[:200]))
                    torch.cuda.empty_cache()
                    continue
                if not ok:
                    add(dict(provider=name, N=N, B=B, H=H, D=D, mode="-", note=f"WRONG RESULT, not timed: {detail}"))
                    continue
                for mode in args.modes:
                    try:
                        step = run_mode(fn, inputs, mode)
                        timing = time_ms(step)
                        memory = peak_memory_mib(step)
                        add(dict(provider=name, N=N, B=B, H=H, D=D, mode=mode, **timing,
                                 tflops=attention_tflops(B, H, N, D, mode, timing["ms"]), peak_mib=memory,
                                 note=detail))
                    except Exception as exc:  # noqa: BLE001
                        add(dict(provider=name, N=N, B=B, H=H, D=D, mode=mode, note=f"error: {exc!r}"[:200]))
                    torch.cuda.empty_cache()
    write_results(rows, args.json, title,
                  ["provider", "D", "N", "B", "H", "mode", "ms", "tflops", "peak_mib", "note"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
