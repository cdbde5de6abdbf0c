"""Checks and benches of the fused distance-bias attention (``python -m syntaxkernels verify|bench``).

CHECKS: the Triton kernels against the fp64 reference (forward and the q, k, v, table and bias-scale
gradients) on the current device: CUDA at real sizes, or CPU under ``TRITON_INTERPRET=1`` at small sizes
(skipped otherwise); plus a bit-identical check of ``deterministic=True``.
BENCHES: forward and forward+backward times of the kernel and the reference on CUDA (skipped on CPU).
"""
from __future__ import annotations

import os
import random

import torch

from . import Bench, Check, Skip


def _usable(device: str) -> None:
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise Skip("the Triton kernels run on CPU only under TRITON_INTERPRET=1")


def _inputs(device, B, H, N, D, dtype, lengths=None, per_head=False, seed=0):
    import syntaxkernels as sk

    rng = random.Random(seed)
    lengths = lengths or [N] * B
    heads = [[-1] + [rng.randrange(0, i) for i in range(1, L)] if L else [] for L in lengths]
    distance = sk.tree_distance(heads, torch.tensor(lengths))
    if distance.shape[-1] < N:
        padded = torch.full((B, N, N), 255, dtype=torch.uint8)
        padded[:, :distance.shape[-1], :distance.shape[-1]] = distance
        distance = padded
    gen = torch.Generator().manual_seed(seed)
    buckets = sk.BucketSpec()
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    table = torch.randn((H, buckets.num_buckets) if per_head else (buckets.num_buckets,), generator=gen)
    return dict(q=q, k=k, v=v, distance=distance.to(device), table=table, buckets=buckets,
                lengths=torch.tensor(lengths, device=device), device=device)


def _grads(inp, dtype, backend, grad_out, **kw):
    import syntaxkernels as sk

    device = inp["device"]
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (inp[n].to(device, dtype).requires_grad_() for n in ("q", "k", "v"))
    table = inp["table"].to(device, pdtype).requires_grad_()
    c = torch.tensor([0.9], device=device, dtype=pdtype, requires_grad=True)
    out = sk.syntax_bias_attention(q, k, v, inp["distance"], table, buckets=inp["buckets"], bias_scale=c,
                                   lengths=inp["lengths"], backend=backend, **kw)
    grads = torch.autograd.grad(out, (q, k, v, table), grad_out.to(device, dtype))
    return [out, *grads]


def _compare(device, shape, dtype, **kw):
    from ..testing import compare_to_reference

    _usable(device)
    lengths = kw.pop("lengths", None)
    per_head = kw.pop("per_head", False)
    inp = _inputs(device, *shape, dtype, lengths=lengths, per_head=per_head)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    got = _grads(inp, dtype, "triton", grad_out, **kw)
    ref64 = _grads(inp, torch.float64, "reference", grad_out, **kw)
    reflp = _grads(inp, dtype, "reference", grad_out, **kw)
    details, ok = [], True
    for name, a, r64, rlp in zip(("out", "dq", "dk", "dv", "dtable"), got, ref64, reflp):
        good, err, bound = compare_to_reference(a, r64, rlp)
        ok &= good
        details.append(f"{name} {err:.1e}/{bound:.1e}")
    return ok, ", ".join(details)


def _shape(device, small, large):
    return small if device == "cpu" else large


def check_bf16(device):
    shape = _shape(device, (2, 2, 100, 64), (4, 8, 1024, 64))
    return _compare(device, shape, torch.bfloat16, lengths=[shape[2], shape[2] // 3] + [shape[2]] * (shape[0] - 2))


def check_fp16_perhead_causal(device):
    shape = _shape(device, (2, 2, 77, 32), (2, 8, 777, 128))
    return _compare(device, shape, torch.float16, per_head=True, causal=True)


def check_fp32_window(device):
    shape = _shape(device, (2, 2, 129, 32), (2, 4, 2048, 64))
    return _compare(device, shape, torch.float32, window=3)


def check_deterministic(device):
    _usable(device)
    shape = _shape(device, (2, 2, 64, 32), (2, 8, 1024, 64))
    inp = _inputs(device, *shape, torch.bfloat16)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    a = _grads(inp, torch.bfloat16, "triton", grad_out, deterministic=True)
    b = _grads(inp, torch.bfloat16, "triton", grad_out, deterministic=True)
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    return same, "bit-identical" if same else "gradients differ between two runs"


CHECKS = [
    Check("bias_attention.triton_bf16_ragged", check_bf16),
    Check("bias_attention.triton_fp16_perhead_causal", check_fp16_perhead_causal),
    Check("bias_attention.triton_fp32_window", check_fp32_window),
    Check("bias_attention.deterministic", check_deterministic),
]


def bench_times(device, quick):
    if device != "cuda":
        raise Skip("GPU timings need CUDA")
    import triton

    import syntaxkernels as sk

    rows = []
    for N in ([1024] if quick else [512, 2048, 4096]):
        B, H, D = max(1, 8192 // N), 8, 64
        inp = _inputs("cuda", B, H, N, D, torch.bfloat16)
        q, k, v = (inp[n].cuda().bfloat16().requires_grad_() for n in ("q", "k", "v"))
        table = inp["table"].cuda().requires_grad_()
        for backend in ("triton", "reference"):
            def fwd():
                return sk.syntax_bias_attention(q, k, v, inp["distance"], table, buckets=inp["buckets"],
                                                backend=backend)

            def fwd_bwd():
                fwd().sum().backward()
            rows.append(dict(N=N, B=B, H=H, D=D, backend=backend, fwd_ms=triton.testing.do_bench(fwd),
                             fwd_bwd_ms=triton.testing.do_bench(fwd_bwd)))
    return rows


BENCHES = [Bench("bias_attention.times", bench_times)]
