"""Checks and benches of the fused distance-bias attention (``python -m syntaxkernels verify|bench``).

CHECKS: the Triton kernels against the fp64 reference (forward and the q, k, v, table and bias-scale
gradients) on the current device: CUDA at real sizes, or CPU under ``TRITON_INTERPRET=1`` at small sizes
(skipped otherwise); and ``deterministic=True``: close to the reference, and bit-identical over repeated runs
(on CPU the interpreter runs the programs in shuffled orders, see
:func:`syntaxkernels.tools.checks.shuffled_program_order`, since in index order every run is trivially the same);
attention dropout against the reference drawing the same mask.
BENCHES: forward and forward+backward times of the kernel and the reference on CUDA, each size checked against
the reference before it is timed (skipped on CPU, where the cost model of the compiled kernels is reported).
"""
from __future__ import annotations

import contextlib
import functools
import os
import random

import torch

from . import Bench, Check, Skip, shuffled_program_order
from syntaxkernels._interpreter import environment, interpreting
from syntaxkernels.tools.testing import GRADIENTS, bias_attention_case, bias_attention_grads, compare_bias_attention

#: Names of what :func:`_grads` returns, in order (the gradients are :data:`syntaxkernels.tools.testing.GRADIENTS`).
OUTPUTS = ("out", "dq", "dk", "dv", "dtable", "dscale")
#: The bias strength c (``bias_scale``) every check differentiates.
BIAS_SCALE = 0.9


def _usable(device: str) -> None:
    if device == "cpu" and not interpreting():
        raise Skip("the Triton kernels run on CPU only under TRITON_INTERPRET=1")


def _inputs(device, B, H, N, D, dtype, lengths=None, per_head=False, seed=0, kv_heads=None):
    """The shared case (:func:`syntaxkernels.tools.testing.bias_attention_case`, c = :data:`BIAS_SCALE`) on one random
    tree per item (each token's head an earlier token), with ``distance`` and ``lengths`` on ``device`` and the
    ``device`` named (``kv_heads``: k, v with that many heads, grouped-query attention)."""
    rng = random.Random(seed)
    lengths = lengths or [N] * B
    heads = [[-1] + [rng.randrange(0, i) for i in range(1, L)] if L else [] for L in lengths]
    case = bias_attention_case(B, H, N, D, dtype, lengths=lengths, per_head=per_head, seed=seed, heads=heads,
                               bias_scale=BIAS_SCALE, kv_heads=kv_heads)
    return dict(case, distance=case["distance"].to(device), lengths=case["lengths"].to(device), device=device)


def _grads(inp, dtype, backend, grad_out, **kw):
    """``[out, dq, dk, dv, dtable, dscale]`` of ``syntax_bias_attention(backend=backend)`` on ``inp``."""
    import syntaxkernels as sk

    op = functools.partial(sk.syntax_bias_attention, backend=backend)
    out, grads = bias_attention_grads(op, inp, dtype, grad_out, inp["device"], **kw)
    return [out, *grads.values()]


def _against_reference(inp, dtype, grad_out, got, **kw):
    """``(ok, detail)``: each of :data:`OUTPUTS` of ``got`` against the fp64 reference, as ``name err/bound``
    (:func:`syntaxkernels.tools.testing.compare_bias_attention`: ``dscale`` by the bias-scale gradient rule, its
    identity mismatch in brackets)."""
    ref64 = _grads(inp, torch.float64, "reference", grad_out, **kw)
    reflp = _grads(inp, dtype, "reference", grad_out, **kw)
    runs = [(run[0], dict(zip(GRADIENTS, run[1:]))) for run in (got, ref64, reflp)]
    details, ok = [], True
    for name, (_, good, err, bound, mismatch) in zip(OUTPUTS, compare_bias_attention(inp, *runs, dtype)):
        ok &= good
        identity = "" if mismatch is None else f" [c*dscale vs sum(table*dtable): {mismatch:.0e}]"
        details.append(f"{name} {err:.1e}/{bound:.1e}{identity}" + ("" if good else " FAIL"))
    return ok, ", ".join(details)


def _compare(device, shape, dtype, **kw):
    _usable(device)
    lengths = kw.pop("lengths", None)
    per_head = kw.pop("per_head", False)
    kv_heads = kw.pop("kv_heads", None)
    inp = _inputs(device, *shape, dtype, lengths=lengths, per_head=per_head, kv_heads=kv_heads)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    got = _grads(inp, dtype, "triton", grad_out, **kw)
    return _against_reference(inp, dtype, grad_out, got, **kw)


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


def _short_rows_check(device, shape, **kw):
    from syntaxkernels.ops.bias_attention import configs as op
    from syntaxkernels.ops._primitives import arch_family, current_arch

    _usable(device)
    arch = current_arch()
    config = op._short_config(shape[2], torch.bfloat16, shape[3], 1, arch_family(arch), arch)
    lengths = [shape[2], 0] + [shape[2] // 2 - b for b in range(shape[0] - 2)]
    ok, detail = _compare(device, shape, torch.bfloat16, lengths=lengths, **kw)
    if config is None:
        path = "tiled kernels (no short-row tiles for this GPU family)"
    elif shape[2] > op.SHORT_ROW_LIMIT:
        from syntaxkernels.ops.bias_attention._launch import short2_grouping

        config = short2_grouping(config, shape[0], shape[1], torch.device(device))[0]  # (grouped: its own tiles)
        path = ("two-block short-row backward, key blocks outer" if config.get("KEYS_OUTER")
                else "two-block short-row backward")
    else:
        path = ("short-row forward, keys-major short-row backward" if config.get("KEYS_MAJOR")
                else "short-row forward and backward")
    return ok, f"{path}; {detail}"


def check_short_rows(device):
    """Sentence-sized rows (N = 57 <= 64, ragged, one empty) with a shared table: the short-row forward and
    backward (one tile a sequence) where this GPU family has them, else the tiled kernels; the detail says which
    ran."""
    return _short_rows_check(device, _shape(device, (3, 4, 57, 64), (32, 12, 57, 64)))


def check_two_block_rows(device):
    """Rows of 65..128 tokens (N = 100, two sentences of a pair; ragged, one empty, some of at most 64) with a
    shared table: the two-block short-row backward where this GPU family has it; the detail says which ran."""
    return _short_rows_check(device, _shape(device, (4, 2, 100, 64), (32, 12, 100, 64)))


def check_dropout(device):
    """Attention dropout (p = 0.2, a seed above 2^63) against the reference drawing the same mask: the short-row
    kernels where the family has them (sentence-sized bf16 rows, ragged, one empty) and the tiled ones (fp32)."""
    seed = 2 ** 63 + 12345
    short = _short_rows_check(device, _shape(device, (3, 2, 40, 64), (32, 12, 57, 64)), dropout_p=0.2,
                              dropout_seed=seed)
    shape = _shape(device, (2, 2, 90, 32), (2, 8, 1024, 64))
    tiled = _compare(device, shape, torch.float32, lengths=[shape[2], shape[2] // 2], dropout_p=0.2,
                     dropout_seed=seed)
    return short[0] and tiled[0], f"rows of {'40' if device == 'cpu' else '57'}: {short[1]}; fp32 N = {shape[2]} " \
                                  f"(tiled): {tiled[1]}"


def check_grouped_query(device):
    """Grouped-query attention against the reference: sentence-sized causal bf16 rows with half of q's heads for k
    and v (ragged, one empty; the short-row kernels where the family has them) and fp32 rows on the tiled kernels
    with one key/value head (multi-query)."""
    shape = _shape(device, (3, 4, 40, 64), (32, 12, 57, 64))
    short = _short_rows_check(device, shape, kv_heads=shape[1] // 2, causal=True)
    shape = _shape(device, (2, 4, 90, 32), (2, 8, 1024, 64))
    tiled = _compare(device, shape, torch.float32, lengths=[shape[2], shape[2] // 2], kv_heads=1)
    return short[0] and tiled[0], f"H_kv = H / 2, causal: {short[1]}; fp32 N = {shape[2]}, H_kv = 1: {tiled[1]}"


def check_relative_position(device):
    """T5's relative-position term (``RelativePositionSpec()``: 32 buckets, reach 128; unscaled scores, a per-head
    position table taking its gradient) beside the tree bias, bf16 sentence-sized rows (ragged, one empty) on the
    one-tile short-row kernels, against the reference: the usual outputs and the position table's gradient."""
    import syntaxkernels as sk
    from syntaxkernels.specs import RelativePositionSpec
    from syntaxkernels.tools.testing import compare_to_reference

    _usable(device)
    shape = _shape(device, (3, 4, 40, 64), (32, 12, 57, 64))
    B, H, N, _ = shape
    inp = _inputs(device, *shape, torch.bfloat16, lengths=[N, 0] + [N // 2 - b for b in range(B - 2)], seed=3)
    spec = RelativePositionSpec()
    ptable = torch.randn(H, spec.num_buckets, generator=torch.Generator().manual_seed(4))
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    runs = []
    for dtype, backend in ((torch.bfloat16, "triton"), (torch.float64, "reference"), (torch.bfloat16, "reference")):
        where = inp["device"] if backend == "triton" else "cpu"
        pdtype = torch.float64 if dtype == torch.float64 else torch.float32
        leaves = [inp[n].to(where, dtype) for n in ("q", "k", "v")]
        leaves += [inp["table"].to(where, pdtype), inp["bias_scale"].to(where, pdtype), ptable.to(where, pdtype)]
        leaves = [t.detach().requires_grad_() for t in leaves]
        q, k, v, table, c, pt = leaves
        out = sk.syntax_bias_attention(q, k, v, inp["distance"].to(where), table, buckets=inp["buckets"],
                                       bias_scale=c, lengths=inp["lengths"].to(where), scale=1.0,
                                       position_buckets=spec, position_table=pt, backend=backend)
        grads = torch.autograd.grad(out, leaves, grad_out.to(where, dtype))
        runs.append(((out, dict(zip(GRADIENTS, grads[:5]))), grads[5]))
    details, ok = [], True
    for name, (_, good, err, bound, _) in zip(OUTPUTS, compare_bias_attention(inp, *(r[0] for r in runs),
                                                                             torch.bfloat16)):
        ok &= good
        details.append(f"{name} {err:.1e}/{bound:.1e}" + ("" if good else " FAIL"))
    good, err, bound = compare_to_reference(*(r[1] for r in runs))
    ok &= good
    details.append(f"dposition {err:.1e}/{bound:.1e}" + ("" if good else " FAIL"))
    return ok, f"N = {N}, T5 buckets (32, reach 128), scale 1: " + ", ".join(details)


def check_relations(device):
    """Several relations per score (a ``RelationBatch`` of two random trees of each item and their directed steps:
    three relations, 7 x 7 x 5 codes, per-head tables of their own lengths, one strength each) on the kernels this
    device runs (``backend="auto"``: Triton on CUDA, the C++ kernels on CPU), fp32, ragged with an empty item, against
    the fp64 reference computed relation by relation: the output and the q, k, v, tables' and strengths' gradients."""
    import syntaxkernels as sk
    from syntaxkernels import reference
    from syntaxkernels.tools.testing import compare_to_reference

    shape = _shape(device, (3, 2, 40, 32), (16, 8, 128, 64))
    B, H, N, D = shape
    rng = random.Random(5)
    lengths = [N, 0] + [N // 2 - b for b in range(B - 2)]
    trees = [sk.TreeBatch.from_heads([[-1] + [rng.randrange(0, i) for i in range(1, n)] if n else []
                                      for n in lengths]) for _ in range(2)]
    padded = [sk.TreeBatch.from_heads(t.heads, t.lengths) for t in trees]
    up_down = sk.RelationBatch.directed_tree(padded[0], max_steps=3)
    specs = [sk.BucketSpec(max_distance=5), sk.BucketSpec(max_distance=5)]
    distances = [t.distance for t in padded] + [up_down.code_buckets[0][up_down.distance.long()].to(torch.uint8)]
    specs.append(sk.BucketSpec(max_distance=4, unreachable_bucket=False))  # the steps up: 0..3 and 255 -> 4
    plan = sk.RelationBatch.from_distances(torch.stack(distances, 1), specs, padded[0].lengths, symmetric=False)
    gen = torch.Generator().manual_seed(6)
    q, k, v, grad_out = (torch.randn(*shape, generator=gen) for _ in range(4))
    tables = [torch.randn(H, s.num_buckets, generator=gen) for s in specs]
    scales = torch.tensor([0.8, 1.1, -0.5])
    runs = []
    for dtype, backend in ((torch.float32, "auto"), (torch.float64, "reference"), (torch.float32, "reference")):
        where = device if backend == "auto" else "cpu"
        leaves = [t.to(where, dtype).requires_grad_() for t in (q, k, v, *tables, scales)]
        if backend == "auto":
            out = sk.syntax_bias_attention(*leaves[:3], plan.to(where), leaves[3:6], buckets=plan.buckets,
                                           bias_scale=leaves[6])
        else:
            out = reference.syntax_bias_attention(*leaves[:3], torch.stack(distances, 1), leaves[3:6], buckets=specs,
                                                  bias_scale=leaves[6], lengths=padded[0].lengths)
        runs.append([out] + list(torch.autograd.grad(out, leaves, grad_out.to(where, dtype))))
    names = ("out", "dq", "dk", "dv", "dtable0", "dtable1", "dtable2", "dscales")
    details, ok = [], True
    for name, got, ref64, reflp in zip(names, *runs):
        good, err, bound = compare_to_reference(got.cpu(), ref64, reflp)
        ok &= good
        details.append(f"{name} {err:.1e}/{bound:.1e}" + ("" if good else " FAIL"))
    return ok, f"3 relations (7 x 7 x 5 codes), N = {N}, fp32, backend auto on {device}: " + ", ".join(details)


def _runs(device, count, run):
    """``count`` results of ``run()``: on CUDA plain repeats; under the interpreter each with its programs in
    another order (seeds 1..count), the way a GPU may schedule them."""
    if device == "cpu":
        results = []
        for seed in range(1, count + 1):
            with shuffled_program_order(seed):
                results.append(run())
        return results
    return [run() for _ in range(count)]


def _bits_differ(a, b):
    return [name for name, x, y in zip(OUTPUTS, a, b) if not torch.equal(x, y)]


def check_deterministic(device):
    """``deterministic=True`` gives the reference's values and the same bits on every run.

    A kernel compared with itself in one fixed order cannot fail, so: (1) the values are checked against the
    fp64 reference, which a consistently wrong kernel fails; (2) repeated runs must match bit for bit, on CPU
    with the programs of every launch in a shuffled order (an order-dependent reduction then changes bits);
    (3) as a control, ``deterministic=False`` is run the same way and the detail says whether its bits varied.
    """
    _usable(device)
    if device == "cpu":  # 16 x 32 tiles (the tiled kernels; N = 80 would take the two-block short-row ones):
        # 5 query blocks a row, so the table gradient adds 10 programs' partials and a shuffled order can show
        with _tiles((16, 32)):
            return _check_deterministic(device, (2, 2, 80, 32))
    return _check_deterministic(device, (2, 8, 1024, 64))


@contextlib.contextmanager
def _tiles(blocks):
    """The bias op's tiles forced to ``blocks`` (``BLOCK_M, BLOCK_N``) inside (the interpreter's small shapes)."""
    from syntaxkernels.ops.bias_attention import configs as op

    previous = op._BLOCK_OVERRIDE
    op._BLOCK_OVERRIDE = blocks
    try:
        yield
    finally:
        op._BLOCK_OVERRIDE = previous


def _check_deterministic(device, shape):
    lengths = [shape[2], shape[2] // 2 + 1]
    inp = _inputs(device, *shape, torch.bfloat16, lengths=lengths)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    first = _grads(inp, torch.bfloat16, "triton", grad_out, deterministic=True)
    ok, detail = _against_reference(inp, torch.bfloat16, grad_out, first, deterministic=True)
    repeats = 2 if device == "cpu" else 4
    how = "shuffled program order" if device == "cpu" else "repeated run"
    for k, again in enumerate(_runs(device, repeats, lambda: _grads(inp, torch.bfloat16, "triton", grad_out,
                                                                      deterministic=True))):
        differ = _bits_differ(first, again)
        if differ:
            return False, f"deterministic=True: {', '.join(differ)} differ in {how} {k + 1}; {detail}"
    control = _runs(device, 2, lambda: _grads(inp, torch.bfloat16, "triton", grad_out, deterministic=False))
    varied = _bits_differ(control[0], control[1])
    control_note = (f"deterministic=False varied in {', '.join(varied)}" if varied
                    else "deterministic=False did not vary either")
    summary = (f"bit-identical in index order and {repeats} shuffled program orders" if device == "cpu"
               else f"bit-identical over {repeats + 1} runs")
    summary += f" (control: {control_note})"
    return ok, f"{summary}; {detail}"


def check_replay(device):
    """Launcher replay (``syntaxkernels.ops._replay``): a padded batch of sentences and a packed one, each recorded
    on one batch and replayed on another of the same shapes (other trees, other values), give outputs and every
    gradient bit-identical to the launchers as written on that batch, and every recorded program was replayed."""
    import syntaxkernels as sk
    from syntaxkernels.ops import _replay

    _usable(device)
    B, H, N, D = _shape(device, (2, 2, 40, 32), (32, 12, 57, 64))
    enabled = _replay.set_enabled(True)
    details, ok = [], True
    try:
        for packed in (False, True):
            _replay.clear()
            runs = []
            for seed in (3, 4):
                inp = _inputs(device, B, H, N, D, torch.bfloat16, lengths=[N, N // 2 + 1] + [N - 3] * (B - 2),
                              seed=seed)
                grad_out = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(seed))
                if packed:
                    rng = random.Random(seed)
                    lengths = inp["lengths"].tolist()
                    heads = [[-1] + [rng.randrange(0, i) for i in range(1, n)] for n in lengths]
                    batch = sk.TreeBatch.from_heads(heads, packed=True).to(device)
                    T = batch.num_tokens
                    gen = torch.Generator().manual_seed(seed)
                    tensors = [torch.randn(T, H, D, generator=gen).to(device, torch.bfloat16) for _ in range(3)]
                    table = torch.randn(inp["table"].shape, generator=gen).to(device)
                    grad = torch.randn(T, H, D, generator=gen).to(device, torch.bfloat16)

                    def run(batch=batch, tensors=tensors, table=table, grad=grad):
                        leaves = [t.detach().requires_grad_() for t in tensors + [table]]
                        c = torch.tensor([BIAS_SCALE], device=device, requires_grad=True)
                        out = sk.syntax_bias_attention(*leaves[:3], batch, leaves[3], buckets=sk.BucketSpec(),
                                                       bias_scale=c, backend="triton")
                        return [out, *torch.autograd.grad(out, leaves + [c], grad)]
                else:
                    def run(inp=inp, grad_out=grad_out):
                        return _grads(inp, torch.bfloat16, "triton", grad_out)
                runs.append(run)
            runs[0]()
            replayed = runs[1]()
            programs = list(_replay.programs().values())
            _replay.set_enabled(False)
            written = runs[1]()
            _replay.set_enabled(True)
            differ = _bits_differ(replayed, written)
            used = len(programs) == 2 and all(p is not None and p.replays == 1 for p in programs)
            ok &= not differ and used
            what = "packed" if packed else "padded"
            details.append(f"{what}: {len(programs)} programs, " + ("each replayed once" if used else "NOT replayed")
                           + (f", {', '.join(differ)} differ FAIL" if differ else ", bit-identical to as written"))
    finally:
        _replay.set_enabled(enabled)
    return ok, "; ".join(details)


CHECKS = [
    Check("bias_attention.triton_bf16_ragged", check_bf16),
    Check("bias_attention.triton_fp16_perhead_causal", check_fp16_perhead_causal),
    Check("bias_attention.triton_fp32_window", check_fp32_window),
    Check("bias_attention.triton_bf16_short_rows", check_short_rows),
    Check("bias_attention.triton_bf16_two_block_rows", check_two_block_rows),
    Check("bias_attention.deterministic", check_deterministic),
    Check("bias_attention.triton_dropout", check_dropout),
    Check("bias_attention.triton_grouped_query", check_grouped_query),
    Check("bias_attention.triton_relative_position", check_relative_position),
    Check("bias_attention.relations", check_relations),
    Check("bias_attention.launcher_replay", check_replay),
]


def time_rows(device, sizes, timer, heads=8, dim=64, tokens=8192):
    """Forward and forward+backward times (``timer(fn) -> ms``) of the kernel and the reference in bf16 on
    random trees, B = ``tokens // N`` items of N tokens. Each size is first checked against the fp64 reference
    (forward and every gradient, as the checks do); a size that fails raises instead of being timed."""
    import syntaxkernels as sk

    rows = []
    for N in sizes:
        B = max(1, tokens // N)
        shape = (B, heads, N, dim)
        inp = _inputs(device, *shape, torch.bfloat16)
        grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        ok, detail = _against_reference(inp, torch.bfloat16, grad_out,
                                        _grads(inp, torch.bfloat16, "triton", grad_out))
        if not ok:
            raise RuntimeError(f"N={N}: the kernel disagrees with the reference, so it is not timed: {detail}")
        q, k, v = (inp[n].to(device, torch.bfloat16).requires_grad_() for n in ("q", "k", "v"))
        table = inp["table"].to(device).requires_grad_()
        for backend in ("triton", "reference"):
            def fwd():
                return sk.syntax_bias_attention(q, k, v, inp["distance"], table, buckets=inp["buckets"],
                                                backend=backend)

            def fwd_bwd():
                fwd().sum().backward()
            rows.append(dict(N=N, B=B, H=heads, D=dim, backend=backend, fwd_ms=timer(fwd),
                             fwd_bwd_ms=timer(fwd_bwd), checked="out, dq, dk, dv, dtable, dscale vs fp64"))
    return rows


def bench_times(device, quick):
    if torch.device(device).type != "cuda":
        raise Skip("GPU timings need CUDA")
    import triton

    return time_rows(device, [1024] if quick else [512, 2048, 4096], triton.testing.do_bench)


def bench_inspect(device, quick):
    """Without a GPU: the cost model of the bias kernels as a real sm_90 launch compiles them (bf16, D = 64,
    N = 1024; ``python -m syntaxkernels inspect`` reports every kernel and config for sm_80 and sm_90)."""
    if torch.device(device).type == "cuda":
        raise Skip("a GPU is here: bias_attention.times measures instead")
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/inspect.json"
        env = environment(interpret=False)
        proc = subprocess.run([sys.executable, "-m", "syntaxkernels", "inspect", "--arch", "90", "--processes", "1",
                               "--select", "bias_attention bf16 D64 N1024 dense", "--json", out], env=env,
                              capture_output=True, text=True)
        if not os.path.exists(out):
            raise RuntimeError(f"inspect failed: {proc.stderr[-2000:]}")
        with open(out) as f:
            reports = json.load(f)["reports"]
    rows = []
    for r in reports:
        if r["other_per_unit"] is None:
            continue
        rows.append(dict(kernel=r["kernel"].strip("_").replace("_kernel", ""), sm=r["arch"], tile=r["tile"],
                         regs=r["registers"], instr_per_elem=r["other_per_unit"], all_branches=r["all_per_unit"],
                         ex2_per_elem=r["ex2_per_unit"], plain=r["plain_other_per_unit"], ratio=r["ratio"],
                         note=WHY_SM90))
    return rows


#: Why a CPU bench shows an sm_90 cost model (the note under bias_attention.inspect and .workloads).
WHY_SM90 = ("no GPU here, so instead of timing the Triton kernels this compiles them as a real sm_90 (H100/H200) "
            "launch would, without running them, and reads their cost from the SASS: a model, not a measurement. "
            "sm_90 because the kernels' cost targets are set for it (docs/checking.md); python -m syntaxkernels "
            "inspect --arch 80,90 (or --workload all for every GPU family) gives the others")


def bench_workloads(device, quick):
    """Without a GPU: the named workloads (``python -m syntaxkernels inspect --workload all`` compiles their
    launches for every GPU family) and how the sm_90 tiles cover them, computed without compiling: valid pairs
    as a fraction of B x N^2, score elements computed per valid pair by the forward and the dK/dV kernel, and
    the dK/dV kernel's boundary, one-bucket and mixed tiles."""
    if torch.device(device).type == "cuda":
        raise Skip("a GPU is here: bias_attention.times measures instead")
    from .. import inspection, workloads

    rows = inspection.workload_overview(workloads.WORKLOADS, "sm90", (64,) if quick else (64, 128))
    for row in rows:
        row["note"] = ("the tiles the kernels take on sm_90 (H100/H200: the family their cost targets are set for; "
                       "no GPU here, so nothing is timed). "
                       "valid: valid pairs / (B N^2) (a packed batch: B sequences, N the longest); f_area, b_area: "
                       "score elements the forward and the dK/dV "
                       "kernel (rows of at most 128 tokens: the short-row kernels, one or two 64-token blocks a "
                       "sequence) "
                       "compute per valid pair; bnd: that kernel's walked tiles that are boundary tiles; one, "
                       "mixed: the table kernel's walked tiles in one bucket or in several (dS summed over the "
                       "heads, reduced per bucket once a tile); bkts: buckets per mixed tile. No compile: the cost "
                       "per kernel and GPU family comes from python -m syntaxkernels inspect --workload all")
    return rows


BENCHES = [Bench("bias_attention.times", bench_times), Bench("bias_attention.inspect", bench_inspect),
           Bench("bias_attention.workloads", bench_workloads)]
