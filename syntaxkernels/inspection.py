"""Kernel inspection: compile every fused kernel the way a real launch compiles it, for GPUs this machine lacks.

``python -m syntaxkernels inspect`` (and :func:`inspect_kernels`) runs each op's launchers on small CPU tensors
with the real shapes of a call (N = 1024, D = 64/128, ...), while Triton's driver is replaced by one that
reports an sm_80 or sm_90 device and every launch is turned into ``JITFunction.run(..., warmup=True)``. The
JIT therefore specialises each kernel exactly as it would on that GPU (pointers aligned to 16 bytes and
integers divisible by 16 marked ``tt.divisibility``, integer 1 folded to a constant) and compiles it to a
cubin, but nothing runs. Each cubin is then read with the ``cuobjdump`` shipped in Triton's package:

- resources: registers, local memory (spills), shared memory, warps, stages;
- the **main loop**: the backward branch that encloses the most tensor-core instructions (``HMMA`` on sm_80,
  ``HGMMA`` on sm_90); for it, the tensor-core instructions, every other instruction per unit of work (a score
  element of a ``BLOCK_M x BLOCK_N`` tile, or an edge of an edge-list kernel), ``MUFU.EX2`` per unit, whether
  it issues asynchronous copies (``LDGSTS`` = cp.async, ``UTMALDG``/``UBLKCP`` = TMA), and the loops nested in
  it;
- the **worst loop**: the largest per-unit count over every loop that holds tensor-core instructions (a
  kernel may split its work into an unmasked interior loop and a masked boundary loop);
- the **plain** twin: kernels with a ``SYNTAX`` constexpr are compiled a second time with ``SYNTAX=False``,
  which compiles out the distance tile, the bias and the masks (a textbook flash kernel with the same tiles),
  so the report shows what the syntax work costs as a ratio.

The issue-slot model (a model, not a measurement): an SM issues about 128 thread-instructions per clock (4
schedulers x 32 lanes); its tensor cores finish about 16 score elements per clock at D = 64 and 8 at
D = 128 (bf16, H100/H200: ~4,096 dense FLOP per clock per SM, 4 D FLOP per score element for QK^T and PV), and
its MUFU units about 16 ``ex2`` per clock. A kernel whose main loop issues ``x`` non-tensor-core instructions
per score element is therefore bounded near ``128 / x`` elements per clock by issue slots and ``16 / e``
by ``ex2`` (``e`` per element), against the tensor-core bound; the smallest of the three bounds the loop.
Memory stalls, latency and occupancy are not in the model: only a GPU measures time.

Runs with ``TRITON_INTERPRET`` unset (the interpreter replaces ``@triton.jit``); the CLI re-executes itself
without it when needed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["KernelReport", "LaunchCase", "launch_cases", "inspect_case", "inspect_kernels", "format_reports",
           "check_targets", "TARGETS", "tool_path", "analyse_sass", "fake_gpu", "capture_launches"]

ARCHS = (80, 90)

# Targets on sm_90 (bf16/fp16, D = 64 and 128, N = 1024): main-loop non-tensor-core instructions per score
# element and ex2 per element, per kernel; sm_80 may be up to 25% higher. Every loop of every kernel stays
# under WORST_LIMIT. Keys are kernel names; ``None`` = no per-kernel target (only the limits below).
TARGETS: Dict[str, Dict[str, float]] = {
    "_bias_fwd_kernel": {"other_64": 20.0, "other_128": 24.0, "ex2": 1.15},
    "_bias_bwd_dkdv_kernel": {"other_64": 40.0, "other_128": 40.0},
    "_bias_bwd_dq_kernel": {"other_64": 40.0, "other_128": 40.0},
}
WORST_LIMIT = 80.0
SM80_SLACK = 1.25
# (op, dtype, head dim) whose spills are a known, documented limitation rather than a failure: exact fp32
# products at D = 128 (see the CONFIGS comment in ops/bias_attention.py).
KNOWN_SPILLS = {("bias_attention", "fp32", 128)}
# Dynamic shared memory one block may use (bytes): A100, H100/H200, and the ~100 KB GPUs (sm_86/sm_89).
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


# ---------------------------------------------------------------------------------------------------------
# A fake driver and launch capture
# ---------------------------------------------------------------------------------------------------------


class _FakeCudaDriver:
    """What ``JITFunction.run(..., warmup=True)`` asks of a driver: a target, a device and a stream."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        # The JIT caches its target per device id: one id per architecture keeps sm_80 and sm_90 compilations
        # apart in one process.
        return self.target.arch

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def fake_gpu(arch: int):
    """Make Triton's JIT compile for ``sm_<arch>`` (no GPU needed; nothing can be launched meanwhile)."""
    from triton.runtime import driver

    previous = getattr(driver, "_active", None)  # ``driver.active`` raises on a machine without a GPU
    driver.set_active(_FakeCudaDriver(arch))
    try:
        yield
    finally:
        driver._active = previous


@dataclass
class Launch:
    """One kernel launch of an op, compiled (not run) as the JIT specialises it."""

    kernel: object  # the JITFunction
    grid: tuple
    args: tuple
    kwargs: dict
    compiled: object = None


@contextlib.contextmanager
def capture_launches():
    """Inside, :func:`syntaxkernels.ops._primitives.launch` compiles instead of launching and records each launch."""
    from .ops import _primitives

    launches: List[Launch] = []

    def hook(kernel, grid, args, kwargs):
        record = Launch(kernel, tuple(grid), tuple(args), dict(kwargs))
        record.compiled = kernel.run(*args, grid=grid, warmup=True, **kwargs)
        launches.append(record)

    previous = _primitives.set_launch_hook(hook)
    try:
        yield launches
    finally:
        _primitives.set_launch_hook(previous)


# ---------------------------------------------------------------------------------------------------------
# SASS analysis
# ---------------------------------------------------------------------------------------------------------


def tool_path(name: str) -> str:
    """A CUDA binary shipped in Triton's package (``ptxas``, ``cuobjdump``, ``nvdisasm``)."""
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} not found at {path} (it ships with triton's NVIDIA backend)")
    return path


_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"(0x[0-9a-f]+)")
_TENSOR_CORE = ("HMMA", "HGMMA", "IMMA", "DMMA", "QMMA", "UTCHMMA")
_ASYNC = ("LDGSTS", "UTMALDG", "UBLKCP")


@dataclass
class Loop:
    start: int  # index of the first instruction
    end: int  # index of the backward branch
    tensor_core: int = 0
    instructions: int = 0  # every instruction of the body, every branch counted
    shortest: int = 0  # instructions on the cheapest path through one iteration (what every iteration executes)
    ex2: int = 0
    asynchronous: bool = False
    wgmma: bool = False


def _sass(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool_path("cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout


def _resources(cubin: bytes) -> Dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([tool_path("cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                              check=True).stdout
    found = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):  # STACK > 0 or LOCAL > 0: registers spilled
        match = re.search(rf"\b{key}:(\d+)", text)
        found[key] = int(match.group(1)) if match else -1
    return found


def _shortest_path(instructions, start: int, end: int) -> int:
    """Fewest non-NOP instructions executed from ``start`` to the back edge at ``end`` (inclusive).

    Dijkstra over single instructions: each steps to the next one unless it is an unconditional branch, and a
    branch (conditional or not) also steps to its target when that lies inside the body.
    """
    import heapq

    index_of = {address: i for i, (address, _, _, _) in enumerate(instructions)}
    best = {start: 0}
    queue = [(0, start)]
    while queue:
        cost, i = heapq.heappop(queue)
        if cost > best.get(i, math.inf):
            continue
        address, opcode, operands, predicated = instructions[i]
        cost_here = cost + (0 if opcode == "NOP" else 1)
        if i == end:
            return cost_here
        successors = []
        if opcode.startswith("BRA"):
            target = _BRANCH_TARGET.search(operands)
            if target and int(target.group(1), 16) in index_of:
                successors.append(index_of[int(target.group(1), 16)])
            if predicated:
                successors.append(i + 1)
        elif opcode.startswith("EXIT") and not predicated:
            pass
        else:
            successors.append(i + 1)
        for j in successors:
            if start <= j <= end and cost_here < best.get(j, math.inf):
                best[j] = cost_here
                heapq.heappush(queue, (cost_here, j))
    return 0


def analyse_sass(sass: str) -> Tuple[List[Tuple[int, str]], List[Loop]]:
    """Instructions ``(address, opcode)`` and every loop (backward branch) with its instruction mix.

    ``NOP`` padding is not counted. Loops are returned outermost-first by start address.
    """
    instructions: List[Tuple[int, str, str, bool]] = []
    for match in _LINE.finditer(sass):
        address = int(match.group(1), 16)
        instructions.append((address, match.group(3), match.group(4), bool(match.group(2))))
    index_of = {address: i for i, (address, _, _, _) in enumerate(instructions)}
    loops: List[Loop] = []
    for i, (address, opcode, operands, _) in enumerate(instructions):
        if not opcode.startswith("BRA"):
            continue
        target = _BRANCH_TARGET.search(operands)
        if not target:
            continue
        to = int(target.group(1), 16)
        if to >= address or to not in index_of:
            continue
        loop = Loop(index_of[to], i)
        for _, op, _, _ in instructions[loop.start:loop.end + 1]:
            if op == "NOP":
                continue
            loop.instructions += 1
            if op.startswith(_TENSOR_CORE):
                loop.tensor_core += 1
            if op.startswith("HGMMA"):
                loop.wgmma = True
            if op.startswith("MUFU.EX2"):
                loop.ex2 += 1
            if op.startswith(_ASYNC):
                loop.asynchronous = True
        loop.shortest = _shortest_path(instructions, loop.start, loop.end)
        loops.append(loop)
    loops.sort(key=lambda l: (l.start, -l.end))
    return [(a, op) for a, op, _, _ in instructions], loops


# ---------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------


@dataclass
class KernelReport:
    """What :func:`inspect_case` reads off one compiled kernel (see the module docstring)."""

    op: str
    case: str
    kernel: str
    arch: int
    tile: str = ""
    unit: str = "element"
    units_per_iteration: int = 0
    num_warps: int = 0
    num_stages: int = 0
    registers: int = -1
    local_bytes: int = -1
    stack_bytes: int = -1
    spill_instructions: int = 0
    shared_bytes: int = -1
    loops: int = 0
    main_tensor_core: int = 0
    main_instructions: int = 0
    main_async: bool = False
    main_wgmma: bool = False
    nested_loops: int = 0
    other_per_unit: Optional[float] = None  # main loop, cheapest path (what every iteration executes)
    all_per_unit: Optional[float] = None  # main loop, every instruction (every branch counted)
    ex2_per_unit: Optional[float] = None
    worst_per_unit: Optional[float] = None
    plain_other_per_unit: Optional[float] = None
    plain_ex2_per_unit: Optional[float] = None
    head_dim: int = 0
    dtype: str = ""
    error: Optional[str] = None

    @property
    def ratio(self) -> Optional[float]:
        if self.other_per_unit is None or not self.plain_other_per_unit:
            return None
        return self.other_per_unit / self.plain_other_per_unit

    @property
    def spills(self) -> bool:
        return self.local_bytes > 0 or self.stack_bytes > 0 or self.spill_instructions > 0

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["ratio"] = self.ratio
        return data


def _work_per_iteration(kernel_name: str, kwargs: dict) -> Tuple[int, str]:
    """Units of work one main-loop iteration does, and their name."""
    if "BLOCK_E" in kwargs:
        return int(kwargs["BLOCK_E"]), "edge"
    if "BLOCK_M" in kwargs and "BLOCK_N" in kwargs:
        return int(kwargs["BLOCK_M"]) * int(kwargs["BLOCK_N"]), "element"
    return 0, "element"


def _loop_figures(compiled, kwargs: dict, kernel_name: str):
    _, loops = analyse_sass(_sass(compiled.asm["cubin"]))
    units, unit = _work_per_iteration(kernel_name, kwargs)
    threads = 32 * int(compiled.metadata.num_warps)
    with_tc = [l for l in loops if l.tensor_core]
    main = max(with_tc, key=lambda l: (l.tensor_core, -l.start)) if with_tc else (
        max(loops, key=lambda l: l.instructions) if loops else None)
    per = (lambda count: count * threads / units) if units else (lambda count: None)
    return loops, main, with_tc, per, units, unit


def _report_for(op: str, case: str, launch: Launch, arch: int, plain=None) -> KernelReport:
    name = getattr(getattr(launch.kernel, "fn", launch.kernel), "__name__", str(launch.kernel))
    kwargs = launch.kwargs
    if kwargs.get("BOUNDARY_PASS"):
        name += ":boundary"
    compiled = launch.compiled
    report = KernelReport(op, case, name, arch)
    try:
        metadata = compiled.metadata
        report.num_warps = int(metadata.num_warps)
        report.num_stages = int(metadata.num_stages)
        report.shared_bytes = int(getattr(metadata, "shared", -1))
        if "BLOCK_M" in kwargs and "BLOCK_N" in kwargs:
            report.tile = f"{kwargs['BLOCK_M']}x{kwargs['BLOCK_N']}"
        elif "BLOCK_E" in kwargs:
            report.tile = f"E{kwargs['BLOCK_E']}"
        resources = _resources(compiled.asm["cubin"])
        report.registers = resources["REG"]
        report.local_bytes = resources["LOCAL"]
        report.stack_bytes = resources["STACK"]
        sass = _sass(compiled.asm["cubin"])
        report.spill_instructions = len(re.findall(r"\*/\s+(?:@!?P\w+\s+)?(?:STL|LDL)\b", sass))
        loops, main, with_tc, per, units, unit = _loop_figures(compiled, kwargs, name)
        report.unit, report.units_per_iteration, report.loops = unit, units, len(loops)
        if main is not None:
            report.main_tensor_core = main.tensor_core
            report.main_instructions = main.instructions
            report.main_async = main.asynchronous
            report.main_wgmma = main.wgmma
            report.nested_loops = sum(1 for l in loops if l is not main and main.start <= l.start and l.end < main.end)
            report.other_per_unit = per(main.shortest - main.tensor_core)
            report.all_per_unit = per(main.instructions - main.tensor_core)
            report.ex2_per_unit = per(main.ex2)
            candidates = with_tc or [main]
            worst = [per(l.instructions - l.tensor_core) for l in candidates]
            report.worst_per_unit = max(w for w in worst if w is not None) if any(w is not None for w in worst) else None
        if plain is not None:
            _, plain_main, _, plain_per, _, _ = _loop_figures(plain, kwargs, name)
            if plain_main is not None:
                report.plain_other_per_unit = plain_per(plain_main.shortest - plain_main.tensor_core)
                report.plain_ex2_per_unit = plain_per(plain_main.ex2)
    except Exception as exc:  # noqa: BLE001 - reported with the kernel
        report.error = f"{type(exc).__name__}: {exc}"[:500]
    return report


# ---------------------------------------------------------------------------------------------------------
# Launch cases: each op's launchers, called as a user's call would call them
# ---------------------------------------------------------------------------------------------------------


@dataclass
class LaunchCase:
    """One call of an op's launchers on CPU tensors of real shapes (``run()`` performs the launches)."""

    op: str
    name: str
    dtype: str
    head_dim: int
    run: Callable[[], None]
    targets: bool = False  # the case the targets of TARGETS apply to (and that gets SYNTAX=False twins)
    ci: bool = False  # in the subset the test suite compiles (python_tests/test_inspection.py)


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _bias_case(dtype: str, head_dim: int, variant: str, N: int = 1024, B: int = 1, H: int = 2):
    def run():
        import torch

        from .ops import bias_attention as op
        from .specs import BucketSpec

        dt = _torch_dtype(dtype)
        q = torch.zeros(B, H, N, head_dim, dtype=dt)
        k, v, dout = torch.zeros_like(q), torch.zeros_like(q), torch.zeros_like(q)
        distance = torch.full((B, N, N), 3, dtype=torch.uint8)
        buckets = BucketSpec(16, log_distance=4) if variant == "log-buckets" else BucketSpec()
        T = buckets.num_buckets
        table = torch.zeros((H, T) if variant == "per-head" else (T,))
        window = 4 if variant == "window" else -1
        causal = variant == "causal"
        lut = op.bias_lut(table, torch.ones(1), buckets, window)
        lengths = torch.full((B,), N, dtype=torch.int32)
        out, lse = op.bias_attention_forward(q, k, v, distance, lut, lengths, 0.125, window, causal)
        op.bias_attention_backward(dout, q, k, v, out, lse, distance, lut, lengths, 0.125, window, causal,
                                   *op.bucket_args(buckets), True)

    return run


def _edge_case(dtype: str, head_dim: int, N: int = 1024, H: int = 2):
    """The edge-list attention launchers (``syntaxkernels::edge_attention_fwd`` / ``_bwd``) on one packed document
    of N tokens (sentences of 5..40 tokens, one tree each) with ``MaskSpec()`` (9 relation masks)."""

    def run():
        import random

        import torch

        from . import workloads
        from .ops import edge_attention as op
        from .specs import MaskSpec
        from .trees import TreeBatch

        dt = _torch_dtype(dtype)
        rng = random.Random(0)
        lengths = []
        while sum(lengths) < N:
            lengths.append(min(rng.randint(5, 40), N - sum(lengths)))
        lists = TreeBatch.from_heads([workloads.random_document(rng, lengths)]).relation_lists(MaskSpec())
        q = torch.zeros(1, H, N, head_dim, dtype=dt)
        k, v = torch.zeros_like(q), torch.zeros_like(q)
        out, lse = op.edge_attention_forward(q, k, v, lists.row_ptr, lists.col, lists.num_relations, 0.125)
        op.edge_attention_backward(torch.zeros_like(out), q, k, v, out, lse, lists.row_ptr, lists.col, lists.rel,
                                   lists.t_ptr, lists.t_col, lists.t_rel, 0.125)

    return run


# The subset the test suite compiles: the target cases, the heaviest variants and fp32 (spills).
_CI_CASES = {("bf16", 64, "dense"), ("bf16", 128, "dense"), ("bf16", 64, "window"), ("bf16", 128, "causal"),
             ("fp32", 64, "dense")}
_CI_EDGE_CASES = {("bf16", 64)}


def launch_cases(select: str = "", ci: bool = False) -> List[LaunchCase]:
    """Every op's launch cases: the configurations real calls launch (dtype x head dim x variant).

    ``select`` keeps the cases whose ``"op name"`` contains it; ``ci`` keeps the test suite's subset.
    """
    cases: List[LaunchCase] = []
    for dtype in ("bf16", "fp16", "fp32"):
        for head_dim in (32, 64, 128):
            variants = ["dense"]
            if dtype == "bf16":
                variants += ["window", "causal", "per-head", "log-buckets"]
            for variant in variants:
                cases.append(LaunchCase("bias_attention", f"{dtype} D{head_dim} N1024 {variant}", dtype, head_dim,
                                        _bias_case(dtype, head_dim, variant),
                                        targets=dtype != "fp32" and head_dim in (64, 128) and variant == "dense",
                                        ci=(dtype, head_dim, variant) in _CI_CASES))
    for dtype in ("bf16", "fp16", "fp32"):
        for head_dim in (32, 64, 128):
            cases.append(LaunchCase("edge_attention", f"{dtype} D{head_dim} N1024 MaskSpec()", dtype, head_dim,
                                    _edge_case(dtype, head_dim), ci=(dtype, head_dim) in _CI_EDGE_CASES))
    return [c for c in cases if (not select or select in f"{c.op} {c.name}") and (c.ci or not ci)]


# ---------------------------------------------------------------------------------------------------------
# How often the table gradient's extra work runs, on real trees
# ---------------------------------------------------------------------------------------------------------


def table_gradient_tiles(rows, N: int, head_dim: int = 64, dtype: str = "bf16", family: str = "sm90",
                         buckets=None) -> Dict[str, float]:
    """Fractions of the dK/dV kernel's tiles by the table-gradient work they do, for trees ``rows``.

    ``rows``: 0-based heads per row (padded to N). At the kernel's tiling for ``(dtype, head_dim, family)``,
    every live tile is one of: an interior tile wholly in its key block's common bucket (one row sum of dS),
    another interior tile (one compare-select-add per element for each bucket it holds), or a boundary tile
    (summed by the boundary pass, which recomputes dS). Returns those fractions of the live tiles and the
    mean number of buckets a mixed tile walks.
    """
    import torch

    from .ops import bias_attention as op
    from .ops.block_meta import block_bucket_masks_torch, boundary_tiles
    from .specs import BucketSpec
    from .trees import tree_distance

    spec = buckets or BucketSpec()
    lengths = torch.tensor([len(r) for r in rows])
    distance = torch.full((len(rows), N, N), 255, dtype=torch.uint8)
    built = tree_distance([list(r) for r in rows], lengths)
    distance[:, :built.shape[1], :built.shape[2]] = built
    config = op.select_config("dkdv", _torch_dtype(dtype), head_dim, family)
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if spec.num_buckets > op.STATIC_BUCKET_LIMIT:
        raise ValueError(f"table_gradient_tiles covers tables of up to {op.STATIC_BUCKET_LIMIT} buckets")
    # The kernels' metadata, computed in PyTorch here (no Triton launch, any machine): [B, nK, nQ], [B, nK].
    masks = block_bucket_masks_torch(distance, lengths, spec.lut(), bm, bn).transpose(1, 2).contiguous()
    common = op.common_buckets(masks, spec.num_buckets)
    count = sum((masks >> t) & 1 for t in range(spec.num_buckets))
    live = count > 0
    boundary = boundary_tiles(lengths, masks.shape[2], masks.shape[1], bm, bn, False, by_key=False).transpose(1, 2)
    total = max(int(live.sum()), 1)
    common_bit = torch.where(common >= 0, 1 << common.clamp(min=0), 0)[..., None]
    fast = (count == 1) & (masks == common_bit) & ~boundary
    mixed = live & ~fast & ~boundary
    walked = count[mixed].double()
    return dict(tiles=int(live.sum()), tile=f"{bm}x{bn}", one_bucket=float(fast.sum()) / total,
                mixed=float(mixed.sum()) / total, boundary=float((live & boundary).sum()) / total,
                mean_buckets=float(walked.mean()) if walked.numel() else 0.0)


def weighted_table_cost(report: "KernelReport", tiles: Dict[str, float], num_buckets: int) -> Optional[float]:
    """An upper bound of the dK/dV main loop's instructions per element averaged over real tiles.

    Every tile executes the cheapest path (``other_per_unit``); the table-gradient branches cost at most
    ``(all - other) / T`` per element per bucket walked (all branch overhead charged to the buckets), a
    one-bucket tile walks one, a mixed tile ``mean_buckets``. Boundary tiles are left to the boundary pass.
    """
    if report.other_per_unit is None or report.all_per_unit is None:
        return None
    per_bucket = (report.all_per_unit - report.other_per_unit) / num_buckets
    walked = tiles["one_bucket"] + tiles["mixed"] * tiles["mean_buckets"]
    return report.other_per_unit + per_bucket * walked / max(tiles["one_bucket"] + tiles["mixed"], 1e-9)


def table_gradient_summary(reports: Sequence["KernelReport"], N: int = 1024, rows: int = 16) -> Optional[dict]:
    """The weighted table-gradient cost of the dK/dV kernel on treebank trees (None without the treebank).

    For each dense bf16 target report of ``_bias_bwd_dkdv_kernel`` (D = 64, 128; every arch inspected) and
    three workloads built from the treebank's sentences at N tokens (:mod:`syntaxkernels.workloads`: packed
    sentences, sentences chained into one tree, sentences under one root token), the tile fractions of
    :func:`table_gradient_tiles` and :func:`weighted_table_cost`. Returns ``{"rows": [...], "text": str}``.
    """
    from . import data, workloads
    from .specs import BucketSpec

    if not data.treebank_available():
        return dict(rows=[], text=f"table-gradient tiles: skipped, {data.missing_message()}")
    sentences = workloads.treebank_heads()
    builders = dict(packed=workloads.pack_sentences, chained=workloads.chain_sentences,
                    connected=workloads.connect_sentences)
    T = BucketSpec().num_buckets
    out = []
    for r in reports:
        if r.kernel != "_bias_bwd_dkdv_kernel" or r.dtype != "bf16" or not r.case.endswith("dense") or r.error:
            continue
        family = "sm90" if r.arch >= 90 else "sm80"
        for workload, build in builders.items():
            tiles = table_gradient_tiles(build(sentences, N, rows=rows), N, r.head_dim, "bf16", family)
            out.append(dict(workload=workload, arch=r.arch, head_dim=r.head_dim, tile=tiles["tile"],
                            one_bucket=tiles["one_bucket"], mixed=tiles["mixed"], boundary=tiles["boundary"],
                            mean_buckets=tiles["mean_buckets"], other=r.other_per_unit, all=r.all_per_unit,
                            weighted=weighted_table_cost(r, tiles, T)))
    lines = [f"table gradient in the dK/dV kernel on treebank trees (N = {N}, {rows} rows, BucketSpec(), bf16):",
             f"{'workload':<10} {'sm':>2} {'D':>3} {'tile':>6} {'common':>6} {'other':>6} {'bound':>5} "
             f"{'buckets':>7} {'other':>5} {'all':>5} {'weighted':>8}"]
    for row in out:
        lines.append(f"{row['workload']:<10} {row['arch']:>2} {row['head_dim']:>3} {row['tile']:>6} "
                     f"{row['one_bucket']:>6.2f} {row['mixed']:>6.2f} {row['boundary']:>5.2f} "
                     f"{row['mean_buckets']:>7.1f} {_fmt(row['other']):>5} {_fmt(row['all']):>5} "
                     f"{_fmt(row['weighted']):>8}")
    lines.append("common/other/bound: fractions of live tiles summed on the fast path (the key block's commonest "
                 "bucket), walking their buckets, or in the boundary pass; buckets: mean buckets walked by the "
                 "second kind; weighted: an upper bound of the main loop's instructions per element over these "
                 "tiles.")
    return dict(rows=out, text="\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# Driving the compilation
# ---------------------------------------------------------------------------------------------------------


def _require_compiler() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("kernel inspection compiles for real GPUs: run it with TRITON_INTERPRET unset")


def inspect_case(case: LaunchCase, arch: int, plain: bool = True) -> List[KernelReport]:
    """Compile every kernel ``case`` launches for ``sm_<arch>`` (and its ``SYNTAX=False`` twin) and report."""
    _require_compiler()
    reports = []
    seen = set()
    with fake_gpu(arch), capture_launches() as launches:
        try:
            case.run()
        except Exception as exc:  # noqa: BLE001 - one failing case is reported, the others go on
            return [KernelReport(case.op, case.name, "(launcher)", arch, error=f"{type(exc).__name__}: {exc}"[:500])]
        for launch in launches:
            name = getattr(launch.kernel, "fn", launch.kernel).__name__
            key = (name, tuple(sorted((k, str(v)) for k, v in launch.kwargs.items())))
            if key in seen:
                continue
            seen.add(key)
            twin = None
            if plain and "SYNTAX" in launch.kernel.arg_names:
                twin = launch.kernel.run(*launch.args, grid=launch.grid, warmup=True,
                                         **dict(launch.kwargs, SYNTAX=False))
            report = _report_for(case.op, case.name, launch, arch, twin)
            report.head_dim, report.dtype = case.head_dim, case.dtype
            reports.append(report)
    return reports


def _job(job):
    case_index, arch, select, plain, ci = job
    case = launch_cases(select, ci)[case_index]
    return inspect_case(case, arch, plain and case.targets)


def inspect_kernels(archs: Sequence[int] = ARCHS, select: str = "", processes: int = 2, plain: bool = True,
                    progress: Optional[Callable[[str], None]] = None, ci: bool = False) -> List[KernelReport]:
    """Inspect every launch case (whose ``op name`` contains ``select``; the test suite's subset with ``ci``)
    for every arch; the target cases also get their ``SYNTAX=False`` twins unless ``plain`` is False.

    Runs in a process pool (``spawn``; each worker imports the package afresh, with ``TRITON_INTERPRET``
    unset). ``progress`` receives one line per finished case.
    """
    _require_compiler()
    cases = launch_cases(select, ci)
    jobs = [(i, arch, select, plain, ci) for i in range(len(cases)) for arch in archs]
    reports: List[KernelReport] = []
    if processes <= 1:
        results = map(_job, jobs)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(processes)
        results = pool.imap(_job, jobs)
    try:
        for done, (job, batch) in enumerate(zip(jobs, results), 1):
            reports.extend(batch)
            if progress:
                case = cases[job[0]]
                progress(f"[{done}/{len(jobs)}] sm_{job[1]} {case.op} {case.name}: {len(batch)} kernels")
    finally:
        if processes > 1:
            pool.close()
            pool.join()
    return reports


def _fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(kernel: str) -> str:
    return kernel.strip("_").replace("_kernel", "")


def format_reports(reports: Sequence[KernelReport]) -> str:
    """A table that fits 100 columns: one line per kernel and arch."""
    header = (f"{'kernel':<20} {'case':<22} {'sm':>2} {'tile':>7} {'w/s':>4} {'reg':>3} {'spl':>3} "
              f"{'other':>5} {'all':>5} {'ex2':>4} {'plain':>5} {'x':>4} {'worst':>5} {'a/w/n':>5}")
    lines = [header, "-" * len(header)]
    for r in reports:
        if r.error:
            lines.append(f"{r.kernel[:20]:<20} {r.case[:22]:<22} {r.arch:>2}  ERROR {r.error[:50]}")
            continue
        flags = ("a" if r.main_async else "-") + ("w" if r.main_wgmma else "-") + str(r.nested_loops)
        lines.append(
            f"{_short(r.kernel)[:20]:<20} {r.case[:22]:<22} {r.arch:>2} {r.tile:>7} "
            f"{r.num_warps}/{r.num_stages:<2} {r.registers:>3} {('yes' if r.spills else 'no'):>3} "
            f"{_fmt(r.other_per_unit):>5} {_fmt(r.all_per_unit):>5} {_fmt(r.ex2_per_unit, 2):>4} "
            f"{_fmt(r.plain_other_per_unit):>5} "
            f"{_fmt(r.ratio, 2):>4} {_fmt(r.worst_per_unit):>5} {flags:>5}")
    return "\n".join(lines)


def known_limitations(reports: Iterable[KernelReport]) -> List[str]:
    """The spills of :data:`KNOWN_SPILLS` (reported by ``inspect``, not counted as problems)."""
    return [f"sm_{r.arch} {r.op} {r.case} {r.kernel}: spills {r.stack_bytes + max(r.local_bytes, 0)} B"
            for r in reports if r.spills and (r.op, r.dtype, r.head_dim) in KNOWN_SPILLS]


def check_targets(reports: Iterable[KernelReport], cases: Optional[Sequence[LaunchCase]] = None) -> List[str]:
    """Every violation of the rules: compile errors, spills (except :data:`KNOWN_SPILLS`), a worst loop above
    WORST_LIMIT, and the main-loop targets of :data:`TARGETS` for the target cases (sm_80 allowed
    ``SM80_SLACK`` times more)."""
    target_cases = {(c.op, c.name) for c in (cases if cases is not None else launch_cases()) if c.targets}
    problems = []
    for r in reports:
        where = f"sm_{r.arch} {r.op} {r.case} {r.kernel}"
        if r.error:
            problems.append(f"{where}: {r.error}")
            continue
        if r.spills and (r.op, r.dtype, r.head_dim) not in KNOWN_SPILLS:
            problems.append(f"{where}: spills ({r.local_bytes} B local, {r.stack_bytes} B stack, "
                            f"{r.spill_instructions} STL/LDL)")
        limit = SHARED_LIMIT.get(r.arch)
        if limit is not None and r.shared_bytes > limit:
            problems.append(f"{where}: {r.shared_bytes} B of shared memory (sm_{r.arch} allows {limit})")
        slack = SM80_SLACK if r.arch < 90 else 1.0
        if (r.worst_per_unit is not None and r.unit == "element" and r.dtype != "fp32"
                and r.worst_per_unit > WORST_LIMIT * slack):
            problems.append(f"{where}: a loop issues {r.worst_per_unit:.1f} instructions per {r.unit} "
                            f"(limit {WORST_LIMIT * slack:.0f})")
        target = TARGETS.get(r.kernel)
        if target and (r.op, r.case) in target_cases:
            limit = target.get(f"other_{r.head_dim}")
            if limit is not None and r.other_per_unit is not None and r.other_per_unit > limit * slack:
                problems.append(f"{where}: main loop {r.other_per_unit:.1f} instructions per {r.unit} "
                                f"(target {limit * slack:.1f})")
            ex2 = target.get("ex2")
            if ex2 is not None and r.ex2_per_unit is not None and r.ex2_per_unit > ex2 * slack:
                problems.append(f"{where}: main loop {r.ex2_per_unit:.2f} ex2 per {r.unit} (target {ex2 * slack:.2f})")
            if r.main_tensor_core and not r.main_async:
                problems.append(f"{where}: no asynchronous copy in the main loop")
            if r.nested_loops:
                problems.append(f"{where}: {r.nested_loops} loop(s) nested in the main loop")
    return problems
