"""Kernel inspection: compile every fused kernel the way a real launch compiles it, for GPUs this machine lacks.

Two reports: the launch cases (N = 1024, every dtype and variant, sm_80 and sm_90, with targets), below; and
the named workloads (:func:`inspect_workloads`, ``inspect --workload``): the batches users have, for every GPU
family of :data:`ALL_ARCHS`, with the tile classes each kernel walks on the whole batch and a weighted cost
per valid pair (see docs/checking.md).

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
without it when needed (:func:`syntaxkernels._interpreter.environment`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["KernelReport", "LaunchCase", "launch_cases", "inspect_case", "inspect_kernels", "format_reports",
           "check_targets", "TARGETS", "tool_path", "analyse_sass", "fake_gpu", "capture_launches", "verdict",
           "ALL_ARCHS", "SHARED_LIMIT", "inspect_workload", "inspect_workloads", "workload_tiles", "workload_cost",
           "workload_problems", "workload_summary", "format_workload_reports", "format_workload_summary",
           "tile_presence", "tile_bucket_sets", "tile_walk_counts"]

ARCHS = (80, 90)
WIDTH = 100  # the report tables fit this many columns
#: Every GPU family users own, for the workload inspection: T4, A100, RTX 30 / A10, RTX 40 / L4 / L40S, H100 /
#: H200, B200, RTX 50 / RTX PRO Blackwell. Triton 3.6 compiles sm_100 and newer with the ``ptxas-blackwell``
#: shipped next to ``ptxas`` in its package (``get_ptxas`` picks it for arch >= 100; ``TRITON_PTXAS_BLACKWELL_PATH``
#: overrides it), so no setting is needed here.
ALL_ARCHS = (75, 80, 86, 89, 90, 100, 120)

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
# products at D = 128 (see the CONFIGS comment in ops/bias_attention/configs.py).
KNOWN_SPILLS = {("bias_attention", "fp32", 128)}
# Dynamic shared memory one block may use (bytes, opt-in maximum), per compute capability: the table the configs
# are chosen against (T4, A100, the ~100 KB GPUs sm_86/sm_89/sm_120, H100/H200 and B200, ...).
from syntaxkernels.ops._primitives import SHARED_LIMIT  # noqa: E402


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
    error: Optional[str] = None  # the compiler's error, when this launch did not compile


@contextlib.contextmanager
def capture_launches(keep_going: bool = False):
    """Inside, :func:`syntaxkernels.ops._primitives.launch` compiles instead of launching and records each launch.

    With ``keep_going`` a launch that does not compile is recorded with its error and the op goes on (its
    outputs are allocated before the launch), so the other kernels of the call are still compiled.
    """
    from syntaxkernels.ops import _primitives

    launches: List[Launch] = []

    def hook(kernel, grid, args, kwargs):
        record = Launch(kernel, tuple(grid), tuple(args), dict(kwargs))
        try:
            record.compiled = kernel.run(*args, grid=grid, warmup=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported with the kernel
            if not keep_going:
                raise
            record.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
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
# Tensor-core instructions: mma.sync (HMMA/IMMA/DMMA/QMMA, sm_75..sm_120), wgmma (HGMMA, sm_90) and tcgen05
# (sm_100: UTC*MMA issue the MMAs of a tile from one thread; the other UTC* instructions manage tensor memory).
_TENSOR_CORE = ("HMMA", "HGMMA", "IMMA", "DMMA", "QMMA", "UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA")
_ASYNC = ("LDGSTS", "UTMALDG", "UBLKCP")


def _count_all(opcode: str) -> int:
    return 0 if opcode == "NOP" else 1


def _count_other(opcode: str) -> int:
    return 0 if opcode == "NOP" or opcode.startswith(_TENSOR_CORE) else 1


@dataclass
class Loop:
    start: int  # index of the first instruction
    end: int  # index of the backward branch
    tensor_core: int = 0
    instructions: int = 0  # every instruction of the body, every branch counted
    shortest: int = 0  # instructions on the cheapest path through one iteration (what every iteration executes)
    shortest_other: int = 0  # non-tensor-core instructions on the path with the fewest of them (never negative)
    ex2: int = 0
    asynchronous: bool = False
    wgmma: bool = False


def _disassemble(cubin: bytes) -> Tuple[str, Dict[str, int]]:
    """One ``cuobjdump -sass -res-usage`` of a cubin: its SASS, and its resources (``REG``, ``STACK``, ``SHARED``,
    ``LOCAL``; -1 when not reported). The resource block comes first; the SASS lines after it are what
    ``-sass`` alone prints."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([tool_path("cuobjdump"), "-sass", "-res-usage", path], capture_output=True,
                              text=True, check=True).stdout
    found = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):  # STACK > 0 or LOCAL > 0: registers spilled
        match = re.search(rf"\b{key}:(\d+)", text)
        found[key] = int(match.group(1)) if match else -1
    return text, found


def _sass(cubin: bytes) -> str:
    return _disassemble(cubin)[0]


def _shortest_path(instructions, start: int, end: int, weight=None, skip=None) -> int:
    """Fewest instructions executed from ``start`` to the back edge at ``end`` (inclusive); each instruction
    counts ``weight(opcode)`` (default: 1, ``NOP`` 0); instructions in the index range ``skip`` (inclusive: a
    nested loop counted on its own), or in any of a list of such ranges, count 0.

    Dijkstra over single instructions: each steps to the next one unless it is an unconditional branch, and a
    branch (conditional or not) also steps to its target when that lies inside the body.
    """
    if weight is None:
        weight = _count_all
    import heapq

    index_of = {address: i for i, (address, _, _, _) in enumerate(instructions)}
    skips = [] if not skip else [skip] if isinstance(skip[0], int) else list(skip)
    best = {start: 0}
    queue = [(0, start)]
    while queue:
        cost, i = heapq.heappop(queue)
        if cost > best.get(i, math.inf):
            continue
        address, opcode, operands, predicated = instructions[i]
        cost_here = cost + (0 if any(a <= i <= b for a, b in skips) else weight(opcode))
        if i == end:
            return cost_here
        successors = []
        # A relative call that does not return (ptxas leaves some loops through one) jumps like a branch.
        if opcode.startswith("BRA") or opcode.startswith("CALL.REL.NOINC"):
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


def _shortest_exit(instructions) -> int:
    """Fewest instructions executed from the entry to an unpredicated ``EXIT`` (:func:`_shortest_path` to each,
    the cheapest kept; 0 when none is reached)."""
    exits = [i for i, (_, opcode, _, predicated) in enumerate(instructions)
             if opcode.startswith("EXIT") and not predicated]
    paths = [p for p in (_shortest_path(instructions, 0, i) for i in exits) if p]
    return min(paths) if paths else 0


def _returns_from_out_of_line_block(instructions, target: int, address: int) -> bool:
    """A backward branch to ``target`` that closes no loop: it returns from a block placed out of line after
    the code (sm_100's waits on tensor-core barriers: ``@!P BRA wait; ...`` where ``wait`` spins and
    branches back to the instruction after the ``@!P BRA``). Recognised by the instruction before ``target``
    being a branch forward to a block that lies between ``target`` and this branch."""
    if target == 0:
        return False
    _, opcode, operands, _ = instructions[target - 1]
    if not opcode.startswith("BRA"):
        return False
    found = _BRANCH_TARGET.search(operands)
    return bool(found) and instructions[target][0] < int(found.group(1), 16) <= address


def _instructions(sass: str) -> List[Tuple[int, str, str, bool]]:
    """``(address, opcode, operands, predicated)`` of every SASS instruction, in order."""
    return [(int(m.group(1), 16), m.group(3), m.group(4), bool(m.group(2))) for m in _LINE.finditer(sass)]


def analyse_sass(sass: str) -> Tuple[List[Tuple[int, str]], List[Loop]]:
    """Instructions ``(address, opcode)`` and every loop (backward branch) with its instruction mix.

    ``NOP`` padding is not counted. Loops are returned outermost-first by start address.
    """
    return _analyse(_instructions(sass))


def _analyse(instructions: List[Tuple[int, str, str, bool]]) -> Tuple[List[Tuple[int, str]], List[Loop]]:
    """:func:`analyse_sass` of instructions already read by :func:`_instructions`."""
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
        if _returns_from_out_of_line_block(instructions, index_of[to], address):
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
        loop.shortest_other = _shortest_path(instructions, loop.start, loop.end, _count_other)
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
    # Per top-level tensor-core loop, in address order (program order: the interior loop before the masked
    # one): non-tensor-core instructions per unit on its cheapest path, and counting every branch.
    loop_other: List[float] = dataclasses.field(default_factory=list)
    loop_all: List[float] = dataclasses.field(default_factory=list)
    # A tile loop with a loop over heads inside it (the table-gradient kernel: ``HEADS`` heads a tile): per top
    # loop, the head loop's non-tensor-core instructions per unit and head on its cheapest path (0 for a loop
    # without one); loop_other / loop_all then count the tile loop without the head loop (what a tile pays
    # once, for all its heads).
    head_loop_other: List[float] = dataclasses.field(default_factory=list)
    heads: int = 1  # heads one program takes per tile (the launch's ``HEADS``; 1 for every other kernel)
    # A runtime loop over the buckets inside the tile loop (tables of more than 31 buckets): one trip's
    # non-tensor-core instructions per unit on its cheapest path (0: none), and the trips counted in the figures
    # above (the kernel's ``NUM_BUCKETS``: every bucket, what a tile pays at most). loop_other / loop_all /
    # other_per_unit / all_per_unit count every trip where the loop lies on the tile's cheapest path.
    bucket_loop_other: float = 0.0
    bucket_loop_all: float = 0.0
    bucket_trips: int = 0
    # A program of one tile whose main loop walks the heads (the short-row kernels): the instructions outside
    # that loop, per unit, paid once per tile for all its heads: on the cheapest path and counting every branch.
    once_other: Optional[float] = None
    once_all: Optional[float] = None
    # The short table kernel on more than 31 buckets: its tile loop (loop_other) is the runtime bucket loop, one
    # trip; this is the loop before it that sums dS over the heads, one head's iteration per unit (cheapest path).
    head_sum_other: Optional[float] = None
    plain_loop_other: List[float] = dataclasses.field(default_factory=list)  # loop_other of the SYNTAX=False twin
    instructions: int = 0  # every non-NOP instruction of the kernel (straight-line kernels: one program's work)
    # The block-metadata kernels: instructions on the cheapest path from the entry to an EXIT (a tile that starts
    # past the length stores its empty value and ends there).
    exit_instructions: int = 0
    block_m: int = 0
    block_n: int = 0
    workload: str = ""  # the named workload of a workload case ("" for the N = 1024 launch cases)
    shared_limit: int = 0  # the family's shared memory per block (bytes), 0 = unknown
    tiles: Optional[dict] = None  # a workload case: how the kernel walks the batch's tiles (workload_tiles)
    cost: Optional[dict] = None  # a workload case: its weighted cost per valid pair (workload_cost)
    programs: Optional[int] = None  # a workload case: the programs the whole batch's launch runs
    # The two-block kernel with the key blocks outer (:func:`_keys_nest`): per-thread non-tensor-core instructions
    # of its loop nest, and the launch's heads and head groups.
    nest: Optional[dict] = None

    @property
    def ratio(self) -> Optional[float]:
        if self.other_per_unit is None or not self.plain_other_per_unit:
            return None
        return self.other_per_unit / self.plain_other_per_unit

    @property
    def spills(self) -> bool:
        return self.local_bytes > 0 or self.stack_bytes > 0 or self.spill_instructions > 0

    @property
    def spill_bytes(self) -> int:
        return max(self.local_bytes, 0) + max(self.stack_bytes, 0)

    @property
    def over_shared_limit(self) -> bool:
        return bool(self.shared_limit) and self.shared_bytes > self.shared_limit

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["ratio"] = self.ratio
        return data


def _work_per_iteration(kwargs: dict) -> Tuple[int, str]:
    """Units of work one main-loop iteration does, and their name."""
    if "BLOCK_E" in kwargs:
        return int(kwargs["BLOCK_E"]), "edge"
    if "ROWS" in kwargs and "BLOCK_N" in kwargs:  # (a main loop over steps of ROWS query rows)
        return int(kwargs["ROWS"]) * int(kwargs["BLOCK_N"]), "element"
    if "BLOCK_M" in kwargs and "BLOCK_N" in kwargs:
        return int(kwargs["BLOCK_M"]) * int(kwargs["BLOCK_N"]), "element"
    if "BLOCK_P" in kwargs:  # the table gradient's epilogue: BLOCK_P per-program bucket sums an iteration
        return int(kwargs["BLOCK_P"]), "partial row"
    return 0, "element"


def _bucket_trips(kwargs: dict) -> int:
    """Trips of a kernel's runtime loop over the buckets per tile, at most: ``NUM_BUCKETS`` for a launch of more
    than 31 buckets (``STATIC_BUCKETS`` False), else 0 (the buckets are unrolled: no loop)."""
    if "NUM_BUCKETS" in kwargs and kwargs.get("STATIC_BUCKETS") is False:
        return int(kwargs["NUM_BUCKETS"])
    return 0


def _loop_figures(compiled, kwargs: dict, analysed=None):
    _, loops = analysed if analysed is not None else analyse_sass(_sass(compiled.asm["cubin"]))
    units, unit = _work_per_iteration(kwargs)
    threads = 32 * int(compiled.metadata.num_warps)
    with_tc = [l for l in loops if l.tensor_core]
    main = max(with_tc, key=lambda l: (l.tensor_core, -l.start)) if with_tc else (
        max(loops, key=lambda l: l.instructions) if loops else None)
    per = (lambda count: count * threads / units) if units else (lambda count: None)
    return loops, main, with_tc, per, units, unit


def _keys_nest(loops, instructions, kwargs: dict) -> Optional[dict]:
    """The loop nest of the two-block kernel with the key blocks outer, per thread (non-tensor-core instructions):
    ``step_other`` / ``step_all`` / ``step_ex2``: one trip of the step loop (the key-block loop's tensor-core loop)
    on its cheapest path, counting every branch, and its ex2; ``first_other`` / ``first_all``: one trip of the
    first pass (the tensor-core loop before the key blocks: the row sums of P * dP over the second key block, for
    the exact delta); ``key_block``: the rest of one key block's trip (every
    instruction); ``head``: the rest of one head's trip, the zeroing loops left out; ``zero_step`` /
    ``zero_block``: one trip of the loops that zero a last block's steps (one trip of each loop ptxas made of it:
    an upper bound) and of the loop that zeroes the blocks past the length;
    ``once``: everything outside the head loop (every instruction); with the launch's ``heads`` and ``groups``.
    None where the nest is not that shape."""
    tc = [l for l in loops if l.tensor_core]
    innermost = sorted((l for l in tc if not any(o is not l and l.start <= o.start and o.end <= l.end for o in tc)),
                       key=lambda l: l.start)
    if len(innermost) != 2:
        return None
    first, step = innermost
    around = sorted((o for o in tc if o is not step and o.start <= step.start and step.end <= o.end),
                    key=lambda o: o.end - o.start)
    if len(around) != 2:
        return None
    key_loop, head_loop = around
    if not (head_loop.start <= first.start and first.end < key_loop.start):
        return None
    zeros = sorted((o for o in loops if not o.tensor_core and head_loop.start <= o.start and o.end <= head_loop.end
                    and not (key_loop.start <= o.start and o.end <= key_loop.end)), key=lambda o: o.start)
    if len(zeros) < 2:
        return None

    def every(loop):
        return loop.instructions - loop.tensor_core

    total = sum(1 for _, op, _, _ in instructions if _count_other(op))
    zero_step = sum(every(z) for z in zeros[:-1])  # (ptxas may unroll it, leaving a remainder loop: one trip of each)
    return dict(step_other=step.shortest_other, step_all=every(step), step_ex2=step.ex2,
                first_other=first.shortest_other, first_all=every(first), key_block=every(key_loop) - every(step),
                head=every(head_loop) - every(key_loop) - every(first) - zero_step - every(zeros[-1]),
                zero_step=zero_step, zero_block=every(zeros[-1]), once=total - every(head_loop),
                heads=int(kwargs.get("HEADS", 1)), groups=int(kwargs.get("HEAD_GROUPS", 1)))


def _tile_loops(loops, with_tc):
    """The tile loops: the outermost loops holding tensor-core instructions; without tensor cores (a dot lowered
    to FMA, as Triton 3.6 does for bf16 on sm_75) the outermost loops of at least a quarter of the largest one's
    size. In program order (the interior loop before the masked one)."""
    pool = with_tc or [l for l in loops if l.instructions * 4 >= max(o.instructions for o in loops)]
    return [l for l in pool if not any(o is not l and o.start <= l.start and l.end <= o.end for o in loops
                                       if (o.tensor_core or not with_tc))]


def _report_for(op: str, case: str, launch: Launch, arch: int, plain=None) -> KernelReport:
    name = getattr(getattr(launch.kernel, "fn", launch.kernel), "__name__", str(launch.kernel))
    kwargs = launch.kwargs
    compiled = launch.compiled
    report = KernelReport(op, case, name, arch)
    report.shared_limit = SHARED_LIMIT.get(arch, 0)
    if launch.error:
        report.error = launch.error
        return report
    try:
        metadata = compiled.metadata
        report.num_warps = int(metadata.num_warps)
        report.num_stages = int(metadata.num_stages)
        report.shared_bytes = int(getattr(metadata, "shared", -1))
        if "ROWS" in kwargs and "BLOCK_N" in kwargs:  # (a main loop over steps of ROWS query rows)
            report.tile = f"{kwargs['ROWS']}x{kwargs['BLOCK_N']}"
        elif "BLOCK_M" in kwargs and "BLOCK_N" in kwargs:
            report.tile = f"{kwargs['BLOCK_M']}x{kwargs['BLOCK_N']}"
        elif "BLOCK_E" in kwargs:
            report.tile = f"E{kwargs['BLOCK_E']}"
        sass, resources = _disassemble(compiled.asm["cubin"])
        report.registers = resources["REG"]
        report.local_bytes = resources["LOCAL"]
        report.stack_bytes = resources["STACK"]
        analysed_instructions = _instructions(sass)
        analysed = _analyse(analysed_instructions)
        report.instructions = sum(1 for _, op in analysed[0] if op != "NOP")
        if name in _TILE_PROGRAMS:
            report.exit_instructions = _shortest_exit(analysed_instructions)
        report.block_m, report.block_n = int(kwargs.get("BLOCK_M", 0)), int(kwargs.get("BLOCK_N", 0))
        report.shared_limit = SHARED_LIMIT.get(arch, 0)
        report.spill_instructions = len(re.findall(r"\*/\s+(?:@!?P\w+\s+)?(?:STL|LDL)\b", sass))
        loops, main, with_tc, per, units, unit = _loop_figures(compiled, kwargs, analysed)
        report.unit, report.units_per_iteration, report.loops = unit, units, len(loops)
        if main is not None:
            report.main_tensor_core = main.tensor_core
            report.main_instructions = main.instructions
            report.main_async = main.asynchronous
            report.main_wgmma = main.wgmma
            report.nested_loops = sum(1 for l in loops if l is not main and main.start <= l.start and l.end < main.end)
            report.other_per_unit = per(main.shortest_other)
            report.all_per_unit = per(main.instructions - main.tensor_core)
            report.ex2_per_unit = per(main.ex2)
            # The tile loops: the outermost loops holding tensor-core instructions; without tensor cores
            # (a dot lowered to FMA, as Triton 3.6 does for bf16 on sm_75) the outermost loops of at least a
            # quarter of the largest one's size.
            top = _tile_loops(loops, with_tc)
            report.heads = max(1, int(kwargs.get("HEADS", 1)))
            if "HEAD_GROUPS" in kwargs:  # the short-row kernels: a program walks one group of heads
                report.heads = -(-report.heads // max(1, int(kwargs["HEAD_GROUPS"])))
            report.loop_other, report.loop_all, report.head_loop_other = [], [], []
            trips = _bucket_trips(kwargs)
            main_counted = None
            head_loops = []
            for l in top:
                inner = [o for o in with_tc if o is not l and l.start <= o.start and o.end < l.end]
                if not inner and kwargs.get("STORED_DS"):
                    # The packed table kernel reading the dS the dK/dV kernel stored: its head loop (the first loop
                    # inside the tile loop, before the bucket reduction) holds no tensor-core work.
                    inner = sorted((o for o in loops if o is not l and l.start < o.start and o.end < l.end),
                                   key=lambda o: o.start)[:1]
                head = max(inner, key=lambda o: (o.tensor_core, -o.start)) if inner else None
                if head is not None:
                    head_loops.append(head)
                skips = [(head.start, head.end)] if head is not None else []
                # A runtime bucket loop: a loop without tensor-core work inside the tile loop (not in the head
                # loop). The cheapest path counts one trip of it; a tile runs up to NUM_BUCKETS trips.
                buckets = [o for o in loops if trips and not o.tensor_core and l.start < o.start and o.end < l.end
                           and not (head is not None and head.start <= o.start and o.end <= head.end)]
                bucket = max(buckets, key=lambda o: o.instructions) if buckets else None
                if bucket is not None:
                    report.bucket_trips = trips
                    report.bucket_loop_other = per(bucket.shortest_other)
                    report.bucket_loop_all = per(bucket.instructions - bucket.tensor_core)
                body_all = l.instructions - l.tensor_core - (
                    head.instructions - head.tensor_core if head is not None else 0)
                if bucket is None:
                    other = _shortest_path(analysed_instructions, l.start, l.end, _count_other,
                                           skip=skips) if skips else l.shortest_other
                    body = body_all
                else:
                    around = _shortest_path(analysed_instructions, l.start, l.end, _count_other,
                                            skip=skips + [(bucket.start, bucket.end)])
                    through = _shortest_path(analysed_instructions, l.start, l.end, _count_other, skip=skips)
                    # On the cheapest path (a loop every tile runs): every trip; else the tile may skip it and
                    # the cheapest path stays the figure (the workload cost adds the trips its tiles take).
                    other = around + trips * bucket.shortest_other if through > around else through
                    body = body_all + (trips - 1) * (bucket.instructions - bucket.tensor_core)
                report.loop_other.append(per(other))
                report.loop_all.append(per(body))
                report.head_loop_other.append(per(head.shortest_other) if head is not None else 0.0)
                if l is main:
                    main_counted = (per(other), per(body))
            if main_counted is not None and report.bucket_trips:
                report.other_per_unit, report.all_per_unit = main_counted
            if name in _DOTLESS_PROGRAMS and trips and top:
                # More than 31 buckets: the heads' dS summed (a loop over the heads), then the tile's bucket range
                # walked (the tile loop above); the heads' loop: the outermost loop before it.
                before = [o for o in loops if o.end < top[0].start
                          and not any(x is not o and x.start <= o.start and o.end <= x.end for x in loops)]
                if before:
                    report.head_sum_other = per(before[-1].shortest_other)
            if (name in _HEAD_PROGRAMS or name in _SHORT2_PROGRAMS) and top:
                # One tile a program, its loop over the heads: what lies outside the loop is paid once per tile.
                # The two-block kernel: its two passes (tile loops over key blocks, each with a head loop
                # inside) and what lies between them are skipped; the rest is paid once per program.
                first, last_loop = top[0], top[-1]
                every = sum(1 for _, op, _, _ in analysed_instructions if _count_other(op))
                last = max(i for i, (_, op, _, _) in enumerate(analysed_instructions) if op.startswith("EXIT"))
                report.once_other = per(_shortest_path(analysed_instructions, 0, last, _count_other,
                                                       skip=(first.start, last_loop.end)))
                report.once_all = per(every - sum(l.instructions - l.tensor_core for l in top))

            if name in _SHORT2_PROGRAMS and len(top) == 3:
                # Three loops over the heads (the key-block loop is unrolled): the first pass on the second key
                # block, then the first and the second key block's main pass. The main-loop figures: the main
                # passes' head loop (per head and element), the costlier of the two.
                report.other_per_unit = max(report.loop_other[1:])
                report.all_per_unit = max(report.loop_all[1:])
            elif report.head_loop_other and report.head_loop_other[0]:
                # The main-loop figures per head and element: the head loop plus the tile's own share.
                report.other_per_unit = report.head_loop_other[0] + report.loop_other[0] / report.heads
                report.all_per_unit = report.head_loop_other[0] + report.loop_all[0] / report.heads
            candidates = with_tc or [main]
            worst = [per(l.instructions - l.tensor_core) for l in candidates]
            if report.bucket_trips and report.loop_all:
                worst.append(max(report.loop_all))
            report.worst_per_unit = max(w for w in worst if w is not None) if any(w is not None for w in worst) else None
            if any(report.head_loop_other):  # per head: each head's loop, every branch, plus its share of the tile's
                head_all = [per(o.instructions - o.tensor_core) for l in top for o in with_tc
                            if o is not l and l.start <= o.start and o.end < l.end]
                head_all += [per(o.instructions) for o in head_loops if not o.tensor_core]  # (STORED_DS)
                report.worst_per_unit = max(head_all) + max(report.loop_all) / report.heads
        if name in _SHORT2_KEYS and main is not None:
            report.nest = _keys_nest(loops, analysed_instructions, kwargs)
            if report.nest is not None:  # the main-loop figures: its step loop's
                report.other_per_unit = per(report.nest["step_other"])
                report.all_per_unit = report.worst_per_unit = per(report.nest["step_all"])
                report.ex2_per_unit = per(report.nest["step_ex2"])
        if plain is not None:
            plain_loops, plain_main, plain_tc, plain_per, _, _ = _loop_figures(plain, kwargs)
            if plain_main is not None:
                report.plain_other_per_unit = plain_per(plain_main.shortest_other)
                report.plain_ex2_per_unit = plain_per(plain_main.ex2)
                report.plain_loop_other = [plain_per(l.shortest_other) for l in _tile_loops(plain_loops, plain_tc)]
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


def _bias_case(dtype: str, head_dim: int, variant: str, N: int = 1024, B: int = 1, H: int = 12):
    """The bias launchers at N tokens, H heads (BERT-base's 12, like the workloads: the JIT specialises the other
    kernels on H only through its divisibility, and the table kernel takes all H heads of a shared table)."""
    def run():
        import torch

        from syntaxkernels.ops.bias_attention import _host, _launch
        from syntaxkernels.plan import structure_plan
        from syntaxkernels.specs import BucketSpec

        dt = _torch_dtype(dtype)
        q = torch.zeros(B, H, N, head_dim, dtype=dt)
        k, v, dout = torch.zeros_like(q), torch.zeros_like(q), torch.zeros_like(q)
        distance = torch.full((B, N, N), 3, dtype=torch.uint8)
        buckets = BucketSpec(16, log_distance=4) if variant == "log-buckets" else BucketSpec()
        T = buckets.num_buckets
        table = torch.zeros((H, T) if variant == "per-head" else (T,))
        window = 4 if variant == "window" else -1
        causal = variant == "causal"
        rows, one = table.reshape(-1, T), torch.ones(1)
        plan = structure_plan(distance, symmetric=True)
        configs = _launch.launch_configs(N, head_dim, head_dim, dt, rows.shape[0], window, buckets, causal=causal)
        forward = _launch.forward_metadata(plan, configs, window, causal)
        backward = _launch.backward_metadata(plan, configs, window, causal, buckets, True)
        out, lse, lut, _ = _launch.bias_attention_forward(q, k, v, plan.distance, rows, one,
                                                          _host._bucket_lut(buckets, q), plan.kernel_lengths, *forward,
                                                          0.125, window, causal)
        _launch.bias_attention_backward(dout, q, k, v, out, lse, plan.distance, lut, plan.kernel_lengths, backward,
                                        0.125, window, causal, buckets, rows, one, True, True)

    return run


def _edge_case(dtype: str, head_dim: int, N: int = 1024, H: int = 2):
    """The edge-list attention launchers (``syntaxkernels::edge_attention_fwd`` / ``_bwd``) on one document of N
    tokens (generated sentences of 5..40 tokens) under one root token, as a ``[CLS]`` root makes it, with
    ``MaskSpec()`` (9 relation masks): its sibling rows are longer than a work item, so every kernel launches
    (the merge of split rows and the sums of split tokens too)."""

    def run():
        import random

        import torch

        from . import workloads
        from syntaxkernels.ops import edge_attention as op
        from syntaxkernels.ops.edge_attention import _kernels as kernels
        from syntaxkernels.specs import MaskSpec
        from syntaxkernels.trees import TreeBatch

        dt = _torch_dtype(dtype)
        rng = random.Random(0)
        lengths = []
        while sum(lengths) < N - 1:
            lengths.append(min(rng.randint(5, 40), N - 1 - sum(lengths)))
        document = workloads.random_document(rng, lengths)
        heads = [-1] + [0 if h < 0 else h + 1 for h in document]
        lists = TreeBatch.from_heads([heads]).relation_lists(MaskSpec())
        q = torch.zeros(1, H, N, head_dim, dtype=dt)
        k, v = torch.zeros_like(q), torch.zeros_like(q)
        _edge_launches(kernels, q, k, v, lists, lists.schedule(op.SCHEDULE_CHUNK))

    return run


def _edge_launches(op, q, k, v, lists, schedule):
    """The Triton edge launchers' forward and backward on these lists, as ``edge_list_attention`` calls them."""
    import torch

    tensors, sizes = schedule.tensors(), schedule.sizes()
    out, lse = op.edge_attention_forward(q, k, v, lists.col, lists.rel, tensors, sizes, lists.num_relations, 0.125)
    op.edge_attention_backward(torch.zeros_like(out), q, k, v, out, lse, lists.col, lists.rel, lists.t_col,
                               lists.t_rel, tensors, sizes, 0.125)


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
    """Fractions of the table kernel's tiles by the per-bucket work they do, for trees ``rows``.

    ``rows``: 0-based heads per row (padded to N). At the table kernel's tiling for ``(dtype, head_dim,
    family)``, every live tile (one with an allowed pair) is a one-bucket tile (one row sum of the heads'
    summed dS) or a mixed tile (a compare-select-add per element for each bucket it holds). Returns those
    fractions of the live tiles and the mean number of buckets a mixed tile walks.
    """
    import torch

    from syntaxkernels.ops.bias_attention import configs as op
    from syntaxkernels.ops.block_meta import block_bucket_masks_torch
    from syntaxkernels.specs import BucketSpec
    from syntaxkernels.trees import tree_distance

    spec = buckets or BucketSpec()
    lengths = torch.tensor([len(r) for r in rows])
    distance = torch.full((len(rows), N, N), 255, dtype=torch.uint8)
    built = tree_distance([list(r) for r in rows], lengths)
    distance[:, :built.shape[1], :built.shape[2]] = built
    config = op.select_config("table", _torch_dtype(dtype), head_dim, family)
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if spec.num_buckets > op.STATIC_BUCKET_LIMIT:
        raise ValueError(f"table_gradient_tiles covers tables of up to {op.STATIC_BUCKET_LIMIT} buckets")
    # The kernel's metadata, computed in PyTorch here (no Triton launch, any machine): [B, nQ, nK].
    masks = block_bucket_masks_torch(distance, lengths, spec.lut(), bm, bn)
    count = sum((masks >> t) & 1 for t in range(spec.num_buckets))
    live = count > 0
    total = max(int(live.sum()), 1)
    mixed = count > 1
    walked = count[mixed].double()
    return dict(tiles=int(live.sum()), tile=f"{bm}x{bn}", one_bucket=float((count == 1).sum()) / total,
                mixed=float(mixed.sum()) / total, mean_buckets=float(walked.mean()) if walked.numel() else 0.0)


def weighted_table_cost(report: "KernelReport", tiles: Dict[str, float], num_buckets: int) -> Optional[float]:
    """An upper bound of the table kernel's main-loop instructions per element and head over real tiles.

    Each head pays the head loop's cheapest path (``head_loop_other``); the tile's own work (``loop_other``)
    and its per-bucket reduction, at most ``(all - other) / T`` per element per bucket walked (all branch
    overhead charged to the buckets; a one-bucket tile walks one, a mixed tile ``mean_buckets``), are paid once
    for the program's ``heads``.
    """
    if not report.loop_other or not report.loop_all or not report.head_loop_other:
        return None
    per_bucket = (report.loop_all[0] - report.loop_other[0]) / num_buckets
    walked = tiles["one_bucket"] + tiles["mixed"] * tiles["mean_buckets"]
    return report.head_loop_other[0] + (report.loop_other[0] + per_bucket * walked) / report.heads


def table_gradient_summary(reports: Sequence["KernelReport"], N: int = 1024, rows: int = 16) -> Optional[dict]:
    """The weighted cost of the table kernel on treebank trees (None without the treebank).

    For each dense bf16 target report of ``_bias_bwd_table_kernel`` (D = 64, 128; every arch inspected) and
    three workloads built from the treebank's sentences at N tokens (:mod:`syntaxkernels.tools.workloads`: packed
    sentences, sentences chained into one tree, sentences under one root token), the tile fractions of
    :func:`table_gradient_tiles` and :func:`weighted_table_cost`. Returns ``{"rows": [...], "text": str}``.
    """
    from syntaxkernels import data
    from . import workloads
    from syntaxkernels.specs import BucketSpec

    if not data.treebank_available():
        return dict(rows=[], text=f"table-gradient tiles: skipped, {data.missing_message()}")
    sentences = workloads.treebank_heads()
    builders = dict(packed=workloads.pack_sentences, chained=workloads.chain_sentences,
                    connected=workloads.connect_sentences)
    T = BucketSpec().num_buckets
    out = []
    for r in reports:
        if r.kernel != "_bias_bwd_table_kernel" or r.dtype != "bf16" or not r.case.endswith("dense") or r.error:
            continue
        family = "sm90" if r.arch >= 90 else "sm80"
        for workload, build in builders.items():
            tiles = table_gradient_tiles(build(sentences, N, rows=rows), N, r.head_dim, "bf16", family)
            out.append(dict(workload=workload, arch=r.arch, head_dim=r.head_dim, tile=tiles["tile"],
                            one_bucket=tiles["one_bucket"], mixed=tiles["mixed"], heads=r.heads,
                            mean_buckets=tiles["mean_buckets"], other=r.other_per_unit, all=r.all_per_unit,
                            weighted=weighted_table_cost(r, tiles, T)))
    lines = [f"table gradient (its own kernel, dS summed over the heads of a shared table) on treebank trees "
             f"(N = {N}, {rows} rows, BucketSpec(), bf16):",
             f"{'workload':<10} {'sm':>2} {'D':>3} {'tile':>6} {'heads':>5} {'one':>5} {'mixed':>5} "
             f"{'buckets':>7} {'other':>5} {'all':>5} {'weighted':>8}"]
    for row in out:
        lines.append(f"{row['workload']:<10} {row['arch']:>2} {row['head_dim']:>3} {row['tile']:>6} {row['heads']:>5} "
                     f"{row['one_bucket']:>5.2f} {row['mixed']:>5.2f} "
                     f"{row['mean_buckets']:>7.1f} {_fmt(row['other']):>5} {_fmt(row['all']):>5} "
                     f"{_fmt(row['weighted']):>8}")
    lines.extend(textwrap.wrap(
        "one/mixed: fractions of live tiles in one bucket (one row sum of the heads' summed dS) or walking their "
        "buckets; buckets: mean buckets walked by a mixed tile; other/all: the main loop per element and head "
        "(cheapest path / every branch); weighted: an upper bound of it over these tiles (the head loop per "
        "head, the tile's reduction shared by the program's heads).", WIDTH))
    return dict(rows=out, text="\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# Driving the compilation
# ---------------------------------------------------------------------------------------------------------


def _require_compiler() -> None:
    from syntaxkernels._interpreter import interpreting

    if interpreting():
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

    def describe(job, batch):
        case = cases[job[0]]
        return f"sm_{job[1]} {case.op} {case.name}: {len(batch)} kernels"

    return _run_jobs(_job, jobs, processes, progress, describe)


def _run_jobs(fn, jobs, processes: int, progress, describe) -> List[KernelReport]:
    """``fn`` over ``jobs`` (each returns a list of reports), in a ``spawn`` process pool when ``processes > 1``
    (each worker imports the package afresh, with ``TRITON_INTERPRET`` unset); ``progress`` receives
    ``[done/total] describe(job, reports)`` as each job finishes."""
    reports: List[KernelReport] = []
    if processes <= 1:
        results = map(fn, jobs)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(processes)
        results = pool.imap(fn, jobs)
    try:
        for done, (job, batch) in enumerate(zip(jobs, results), 1):
            reports.extend(batch)
            if progress:
                progress(f"[{done}/{len(jobs)}] {describe(job, batch)}")
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
    """A table, one line per kernel and arch; case names are never cut (the case column is as wide as the
    longest), and the per-unit columns say their unit (a score element, or an edge of an edge-list kernel)."""
    case_width = max([len("case")] + [len(r.case) for r in reports])
    kernel_width = min(20, max([len("kernel")] + [len(_short(r.kernel)) for r in reports]))
    header = (f"{'kernel':<{kernel_width}} {'case':<{case_width}} {'sm':>3} {'tile':>7} {'w/s':>4} {'reg':>3} "
              f"{'spl':>4} {'per':>4} {'other':>5} {'all':>5} {'ex2':>4} {'plain':>5} {'x':>4} {'worst':>5} "
              f"{'a/w/n':>5}")
    lines = [header, "-" * len(header)]
    for r in reports:
        name = _short(r.kernel)
        if len(name) > kernel_width:
            name = name[:kernel_width - 1] + "~"
        lead = f"{name:<{kernel_width}} {r.case:<{case_width}} {r.arch:>3}"
        if r.error:
            lines.extend(textwrap.wrap(f"{lead} ERROR {r.error}", WIDTH, subsequent_indent="    "))
            continue
        flags = ("a" if r.main_async else "-") + ("w" if r.main_wgmma else "-") + str(r.nested_loops)
        unit = {"element": "elem", "edge": "edge"}.get(r.unit, r.unit[:4])
        lines.append(
            f"{lead} {r.tile:>7} "
            f"{r.num_warps}/{r.num_stages:<2} {r.registers:>3} {(str(r.spill_bytes) if r.spills else 'no'):>4} "
            f"{unit:>4} {_fmt(r.other_per_unit):>5} {_fmt(r.all_per_unit):>5} {_fmt(r.ex2_per_unit, 2):>4} "
            f"{_fmt(r.plain_other_per_unit):>5} "
            f"{_fmt(r.ratio, 2):>4} {_fmt(r.worst_per_unit):>5} {flags:>5}")
    return "\n".join(lines)


def verdict(reports: Sequence[KernelReport], problems: Sequence[str], known: Sequence[str]) -> str:
    """The closing line of ``inspect``: what the lists above say, never more (a kernel listed as spilling,
    known or not, is never called spill-free)."""
    if problems:
        return (f"{len(problems)} of the rules fail (listed above)"
                + (f"; {len(known)} known limitations besides" if known else ""))
    if known:
        return (f"no problem beyond the {len(known)} known limitations above (which spill): every other "
                "launched kernel compiles without spills and within its targets")
    return f"all {len(reports)} launched kernels compile without spills and within their targets"


def _per_head_table(r: KernelReport) -> bool:
    """The table kernel of a per-head table (one head a program): it reduces each head's dS per bucket itself,
    so its loop counting every bucket's branch exceeds :data:`WORST_LIMIT` (a known limitation, reported)."""
    return r.kernel == "_bias_bwd_table_kernel" and r.heads == 1 and "per-head" in r.case


def known_limitations(reports: Iterable[KernelReport]) -> List[str]:
    """The spills of :data:`KNOWN_SPILLS` and the per-head table kernel's worst loop (reported by ``inspect``, not
    counted as problems)."""
    reports = list(reports)
    notes = [f"sm_{r.arch} {r.op} {r.case} {r.kernel}: spills {r.spill_bytes} B"
             for r in reports if r.spills and (r.op, r.dtype, r.head_dim) in KNOWN_SPILLS]
    notes += [f"sm_{r.arch} {r.op} {r.case} {r.kernel}: per-head table, each head's reduction its own: a loop "
              f"issues {r.worst_per_unit:.1f} instructions per element counting every bucket's branch"
              for r in reports if not r.error and _per_head_table(r) and r.worst_per_unit is not None
              and r.worst_per_unit > WORST_LIMIT * (SM80_SLACK if r.arch < 90 else 1.0)]
    return notes


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
        if (r.worst_per_unit is not None and r.unit == "element" and r.dtype != "fp32" and not _per_head_table(r)
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


# ---------------------------------------------------------------------------------------------------------
# Workloads: the batches users have, compiled as launched, with the tiles each kernel walks
# ---------------------------------------------------------------------------------------------------------

#: The head count of the workload calls (BERT-base); the JIT specialises on H only through its divisibility.
WORKLOAD_HEADS = 12
#: Kernels whose programs own query blocks and walk key blocks, and the dK/dV kernel (programs own key blocks).
_QUERY_PROGRAMS = ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_table_kernel")
_KEY_PROGRAMS = ("_bias_bwd_dkdv_kernel",)
#: Query-block programs that also reduce dS per bucket (one-bucket and mixed tiles).
_TABLE_PROGRAMS = ("_bias_bwd_table_kernel",)
#: Kernels with one program per tile of the whole grid (no loop), shared by every head of a call.
_TILE_PROGRAMS = ("_block_bucket_mask_kernel", "_block_distance_range_kernel")
#: The short-row kernels: one program per batch item, its sequence one tile, a loop over the heads: the forward
#: (first here), the backward, and the table kernel (it sums the heads' dS and reduces it per bucket once, after
#: its loop).
_HEAD_PROGRAMS = ("_bias_fwd_short_kernel", "_bias_bwd_short_kernel", "_bias_bwd_short_t_kernel",
                  "_bias_bwd_short_table_kernel")
#: The one-tile kernels (the forward; the backward queries-major on sm_90 and newer, keys-major on mma.sync GPUs).
_ONE_TILE = ("_bias_fwd_short_kernel", "_bias_bwd_short_kernel", "_bias_bwd_short_t_kernel")
#: The two-block short-row backward (rows of 65..128 tokens): one program per batch item and query block of 64,
#: two passes over the key blocks its rows reach, each with a loop over the heads inside.
_SHORT2_PROGRAMS = ("_bias_bwd_short2_kernel",)
#: Its shares added: one program per item and head (straight line; items of one block return at once).
_SHORT2_SUM = ("_bias_bwd_short2_sum_kernel",)
#: The two-block backward with the key blocks outer: one program per item (and head group); per head a runtime loop
#: over the key blocks, inside it a runtime loop over steps of ROWS query rows (the main loop), then two loops that
#: zero the gradient rows past the length (steps, blocks).
_SHORT2_KEYS = ("_bias_bwd_short2_keys_kernel",)
#: Kernels without a product (no tensor-core work to miss).
_DOTLESS_PROGRAMS = ("_bias_bwd_short_table_kernel",)


@contextlib.contextmanager
def _kernels_on_cpu_tensors():
    """Let ``syntax_bias_attention(backend="triton")`` take CPU tensors, so the inspection drives the public
    call (validation, lengths, the LUT, autograd) while the launch hook compiles instead of launching. The
    call's own resources stay as a GPU call would make them (nothing runs: the outputs are never read)."""
    from syntaxkernels.ops.bias_attention import _host

    previous = _host.resolve_backend
    _host.resolve_backend = lambda backend, device: "triton"
    try:
        yield
    finally:
        _host.resolve_backend = previous


def _user_call(batch, dtype: str, head_dim: int, heads: int = WORKLOAD_HEADS, buckets=None,
               dropout: float = 0.0, kv_heads: int = 0, causal: bool = False, band: int = -1,
               position=None, relations: Optional[int] = None, window: int = -1) -> None:
    """Forward and backward of one bias-attention layer as a model calls it: ``nn.DistanceBias.attend`` (a
    shared ``BucketSpec()`` table and a learnable strength, both taking gradients) on the ``TreeBatch`` itself,
    with q, k, v the ``[B, N, H * D]`` projections viewed as ``[B, H, N, D]`` (``nn``'s head split), no window,
    not causal (attention dropout ``dropout``: the kernels' DROPOUT variant; ``kv_heads``: k and v with that many
    heads, grouped-query attention, 0 = H; ``causal``: a decoder's layer; ``band``: a positional window, -1 none;
    ``window``: a distance window ``d_ij <= window``, -1 none;
    ``position``: a :class:`~syntaxkernels.specs.RelativePositionSpec`, T5's relative-position term with a
    learnable ``[H, P]`` table and unscaled scores as T5 calls it, or None); the output merged back to
    ``[B, N, H * D]`` as ``nn`` does, so its gradient has that layout. ``batch``: any padded structure plan (a
    ``TreeBatch``, a ``GraphBatch``); with ``relations`` = R a ``RelationBatch`` of R relations, the layer
    ``DistanceBias(H, buckets, relations=R)`` (``buckets``: its R BucketSpecs: a table and a strength each)."""
    import torch

    from syntaxkernels.nn import DistanceBias

    dt = _torch_dtype(dtype)
    B, N = batch.distance.shape[0], batch.distance.shape[1]
    E = heads * head_dim

    def projection(h=heads):
        return torch.zeros(B, N, h * head_dim, dtype=dt).view(B, N, h, head_dim).transpose(1, 2).requires_grad_()

    q, k, v = projection(), projection(kv_heads or heads), projection(kv_heads or heads)
    if relations is not None:
        layer = DistanceBias(heads, list(buckets), backend="triton", relations=relations)
    else:
        layer = DistanceBias(heads, backend="triton") if buckets is None else DistanceBias(heads, buckets,
                                                                                          backend="triton")
    position_args = {}
    if position is not None:  # T5: its own position table (a gradient too) and no 1/sqrt(d)
        position_args = dict(position_buckets=position, scale=1.0,
                             position_table=torch.zeros(heads, position.num_buckets, requires_grad=True))
    with _kernels_on_cpu_tensors():
        out = layer.attend(q, k, v, batch, dropout_p=dropout, causal=causal, window=None if window < 0 else window,
                           position_window=None if band < 0 else band, **position_args)
    out.transpose(1, 2).reshape(B, N, E).backward(torch.zeros(B, N, E, dtype=dt))


def _user_call_packed(batch, dtype: str, head_dim: int, heads: int = WORKLOAD_HEADS, buckets=None,
                      dropout: float = 0.0, kv_heads: int = 0, causal: bool = False) -> None:
    """Forward and backward of one bias-attention layer on a packed batch, as a padding-free model calls it:
    q, k, v the ``[T, H * D]`` projections viewed as ``[T, H, D]``, ``syntax_bias_attention(...,
    cu_seqlens=batch.cu_seqlens)`` with a shared ``BucketSpec()`` table and a learnable strength (both taking
    gradients), no window, attention dropout ``dropout`` (a fixed seed), ``kv_heads`` and ``causal`` as in
    :func:`_user_call`."""
    import torch

    from syntaxkernels.ops import syntax_bias_attention
    from syntaxkernels.specs import BucketSpec

    dt = _torch_dtype(dtype)
    T = batch.num_tokens
    E = heads * head_dim

    def projection(h=heads):
        return torch.zeros(T, h * head_dim, dtype=dt).view(T, h, head_dim).requires_grad_()

    q, k, v = projection(), projection(kv_heads or heads), projection(kv_heads or heads)
    buckets = buckets or BucketSpec()
    table = torch.zeros(buckets.num_buckets, requires_grad=True)
    bias_scale = torch.ones(1, requires_grad=True)
    with _kernels_on_cpu_tensors():
        out = syntax_bias_attention(q, k, v, batch.distance, table, buckets=buckets, bias_scale=bias_scale,
                                    cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen, backend="triton",
                                    dropout_p=dropout, dropout_seed=1 if dropout else None, causal=causal)
    out.reshape(T, E).backward(torch.zeros(T, E, dtype=dt))


#: The varlen (packed) kernels: query-block programs and key-block programs (ops/bias_attention/_varlen_kernels.py).
_VARLEN_QUERY_PROGRAMS = ("_varlen_fwd_kernel", "_varlen_dq_kernel", "_varlen_table_kernel")
_VARLEN_KEY_PROGRAMS = ("_varlen_dkdv_kernel",)


def _varlen_tiles(kernel: str, workload, block_m: int, block_n: int, buckets=None) -> dict:
    """:func:`workload_tiles` of a varlen kernel on a packed workload: every walked tile is masked (it may hold
    several sequences: *boundary*); the grid is the ``nQ x nK`` tiles of one ``T x T`` row (most never walked).
    The table kernel (:func:`varlen_table_walk`): its walked tiles without a valid pair are *dead* (not in
    *boundary*: no products), the others one-bucket or mixed by the bucket range they walk."""
    from syntaxkernels.ops.bias_attention._varlen import walked_tiles

    T = sum(workload.lengths)
    if kernel in _VARLEN_QUERY_PROGRAMS:
        _, walked = walked_tiles(workload.lengths, block_m, block_n)
    else:
        _, walked = walked_tiles(workload.lengths, block_n, block_m)
    grid = -(-T // block_m) * -(-T // block_n)
    out = dict(grid=grid, skipped=grid - walked, interior=0, boundary=walked, one_bucket=0, mixed=0,
               buckets_mixed=0, buckets_boundary=0, valid_pairs=workload.valid_pairs(), area=block_m * block_n)
    if kernel == "_varlen_table_kernel":
        walk = varlen_table_walk(workload, block_m, block_n, buckets)
        assert walk["walked"] == walked, (walk["walked"], walked)  # the two models of the loop bounds agree
        out.update(boundary=walk["live"], dead=walk["walked"] - walk["live"], one_bucket=walk["one_bucket"],
                   mixed=walk["mixed"], buckets_mixed=walk["buckets_mixed"])
    return out


def varlen_table_walk(workload, block_m: int, block_n: int, buckets=None) -> dict:
    """How :func:`~syntaxkernels.ops.bias_attention._varlen_kernels._varlen_table_kernel` walks a packed
    workload's tiles (no window, not causal; keep in step with the kernel): per query block of ``block_m`` tokens,
    the ``block_n``-wide key tiles of its sequences' span; a tile with a valid pair (same sequence) walks the
    buckets from that of its least to that of its greatest distance (:func:`_tile_buckets`). Returns counts
    ``walked``, ``live`` (with a valid pair), ``one_bucket``, ``mixed`` and ``buckets_mixed`` (the buckets the
    mixed tiles walk, summed)."""
    import torch

    from syntaxkernels.ops.bias_attention import configs as op
    from syntaxkernels.specs import BucketSpec

    spec = buckets or BucketSpec()
    lut = spec.lut()
    lengths = [int(n) for n in workload.lengths]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T = cu[-1]
    batch = workload.packed_batch()
    distance = batch.distance.to(torch.int64)
    offsets = batch.distance_offsets.tolist()
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
    start = torch.tensor(cu[:-1], dtype=torch.int64)[sequence]
    size = torch.tensor(lengths, dtype=torch.int64)[sequence]
    base = torch.tensor(offsets[:-1] if len(offsets) > len(lengths) else offsets, dtype=torch.int64)[sequence]
    out = dict(walked=0, live=0, one_bucket=0, mixed=0, buckets_mixed=0)
    for first in range(0, T, block_m):
        rows = torch.arange(first, min(first + block_m, T))
        span_start = cu[int(sequence[rows[0]])]
        span_end = cu[int(sequence[rows[-1]]) + 1]
        for start_n in range(span_start, span_end, block_n):
            cols = torch.arange(start_n, min(start_n + block_n, span_end))
            out["walked"] += 1
            same = sequence[rows][:, None] == sequence[cols][None, :]
            if not bool(same.any()):
                continue
            index = base[rows][:, None] + (rows - start[rows])[:, None] * size[rows][:, None] \
                + (cols - start[cols])[None, :]
            d = distance[index[same]]
            if op.walks_present_codes(spec.num_buckets, spec.log_distance):  # the codes held, one trip each
                count = int(torch.unique(lut[d]).numel())
            else:
                count = int(lut[int(d.max())] - lut[int(d.min())]) + 1
            out["live"] += 1
            if count == 1:
                out["one_bucket"] += 1
            else:
                out["mixed"] += 1
                out["buckets_mixed"] += count
    return out


_WORKLOAD_CACHE: Dict[str, object] = {}


def _workload(name: str):
    from . import workloads

    if name not in _WORKLOAD_CACHE:
        _WORKLOAD_CACHE[name] = workloads.named_workload(name)
    return _WORKLOAD_CACHE[name]


_PRESENCE_CACHE: Dict[tuple, object] = {}


def tile_bucket_sets(distance, lengths, block_m: int, block_n: int, bucket_lut):
    """bool ``[B, nQ, nK, T]``: which of the ``T = bucket_lut.max() + 1`` buckets (any number: a relation batch's 256
    codes too) the valid pairs of each ``block_m x block_n`` tile hold (no window, not causal; a tile without a
    valid pair holds none), computed one query stripe at a time (long trees need no ``B x N x N`` int64
    temporary)."""
    import torch

    B, N, _ = distance.shape
    num_q, num_k = -(-N // block_m), -(-N // block_n)
    lut = bucket_lut.to(torch.int64)
    T = int(lut.max()) + 1
    present = torch.zeros(B, num_q, num_k, T, dtype=torch.bool)
    key_block = (torch.arange(N) // block_n)[None, :]
    for b in range(B):
        L = min(int(lengths[b]), N)
        for qb in range(-(-L // block_m)):
            rows = distance[b, qb * block_m:min((qb + 1) * block_m, L), :L].long()
            keys = (key_block[:, :L] * T + lut[rows]).flatten()
            present[b, qb] = torch.bincount(keys, minlength=num_k * T).view(num_k, T) > 0
    return present


def tile_presence(distance, lengths, block_m: int, block_n: int, bucket_lut):
    """int64 ``[B, nQ, nK]``: the bit set of the buckets of each ``block_m x block_n`` tile's valid pairs (no
    window, not causal; 0 = no valid pair), from :func:`tile_bucket_sets`. Equal to the launcher's
    ``block_bucket_masks`` for such calls. Up to 62 buckets (``ValueError`` beyond: use :func:`tile_bucket_sets`)."""
    import torch

    T = int(bucket_lut.max()) + 1
    if T > 62:
        raise ValueError(f"tile_presence packs at most 62 buckets into an int64, the LUT has {T}: use "
                         "tile_bucket_sets")
    present = tile_bucket_sets(distance, lengths, block_m, block_n, bucket_lut)
    return (present.to(torch.int64) << torch.arange(present.shape[-1])).sum(dim=-1)


def tile_walk_counts(present, num_buckets: int, log_distance=0):
    """int64 ``[B, nQ, nK]``: the buckets the table kernels reduce per tile of bucket sets ``present``
    (:func:`tile_bucket_sets`): up to ``STATIC_BUCKET_LIMIT`` (31) buckets the ones the tile holds (its bit set);
    larger tables walk the range from the tile's lowest to its highest bucket (``_tile_buckets``: ``lowest + 256 *
    highest``, the buckets being monotone in the distance), every bucket between counted, except a table of one
    bucket per byte value (a relation batch's codes, ``configs.walks_present_codes``), which walks the codes the
    tile holds; 0 for a tile without a valid pair."""
    import torch

    from syntaxkernels.ops.bias_attention import configs as op

    held = present.sum(dim=-1)
    if num_buckets <= op.STATIC_BUCKET_LIMIT or op.walks_present_codes(num_buckets, log_distance):
        return held
    T = present.shape[-1]
    index = torch.arange(T)
    lowest = torch.where(present, index, T).amin(dim=-1)
    highest = torch.where(present, index, -1).amax(dim=-1)
    return torch.where(held > 0, highest - lowest + 1, torch.zeros_like(held))


def _workload_identity(workload) -> tuple:
    """What a workload's batch holds (not only its name: a workload of the same name built from other sentences,
    the treebank's or generated ones, is another batch)."""
    if getattr(workload, "digest", ""):
        return (workload.name, workload.source, workload.N, workload.digest)
    return (workload.name, workload.source, workload.N, hash(tuple(tuple(heads) for heads in workload.heads)))


def _workload_plan(workload):
    """The whole batch's plan (:meth:`Workload.plan`), cached per batch."""
    key = ("batch", _workload_identity(workload))
    if key not in _WORKLOAD_CACHE:
        _WORKLOAD_CACHE[key] = workload.plan()
    return _WORKLOAD_CACHE[key]


def _presence(workload, block_m: int, block_n: int, buckets=None, window: int = -1):
    """:func:`tile_bucket_sets` of the workload's whole batch at this tiling, with the bucket LUT the kernels run
    (``buckets``, else the workload's own: ``BucketSpec()`` for trees and graphs, a relation batch's 256 codes);
    with a distance ``window`` (>= 0) only the pairs within it count."""
    import torch

    spec = buckets or _kernel_buckets(workload)
    key = (_workload_identity(workload), block_m, block_n, spec, window)
    if key not in _PRESENCE_CACHE:
        batch = _workload_plan(workload)
        lut = spec.lut().to(torch.int64)
        T = int(lut.max()) + 1
        if window >= 0:  # the pairs past the window: a bucket of their own, dropped
            lut = lut.clone()
            lut[window + 1:] = T
        present = tile_bucket_sets(batch.distance, torch.tensor(workload.lengths), block_m, block_n, lut)
        _PRESENCE_CACHE[key] = present[..., :T]
    return _PRESENCE_CACHE[key]


def _listed_tiles(workload, block_m: int, block_n: int, causal: bool, window: int, band: int, by_key: bool):
    """The tiles a call with a distance ``window`` or a positional window ``band`` (-1: none) walks on ``workload``'s
    whole batch, as the launcher lists them (``_launch._build_lists``: a tile is live when it may hold an allowed
    pair, :func:`~syntaxkernels.ops.block_meta.live_blocks`, and masked when some pair of it is past the length,
    the diagonal or the positional window, :func:`~syntaxkernels.ops.block_meta.boundary_tiles`; ``by_key``: the
    programs own query blocks and walk key blocks): bool ``(live, masked)``, each ``[B, nQ, nK]``."""
    import torch

    from syntaxkernels.ops.block_meta import _block_distance_range_torch, boundary_tiles, live_blocks

    lengths = torch.tensor(workload.lengths, dtype=torch.int32)
    # (in PyTorch: inside the inspection's fake GPU the launcher's kernel would be captured, not run)
    smallest, _ = _block_distance_range_torch(_workload_plan(workload).distance, lengths, block_m, block_n)
    live = live_blocks(smallest, lengths, block_m, block_n, window=None if window < 0 else window, causal=causal,
                       band=None if band < 0 else band)
    masked = boundary_tiles(lengths, live.shape[1], live.shape[2], block_m, block_n, causal, by_key=by_key,
                            band=None if band < 0 else band)
    return live, masked


def _kernel_buckets(workload):
    """The BucketSpec the kernels run a workload with (``Workload.kernel_buckets``; ``BucketSpec()`` for a
    workload object without it)."""
    from syntaxkernels.specs import BucketSpec

    return getattr(workload, "kernel_buckets", None) or BucketSpec()


def workload_tiles(kernel: str, workload, block_m: int, block_n: int, buckets=None, rows: int = 0,
                   causal: bool = False, window: int = -1, band: int = -1) -> Optional[dict]:
    """How ``kernel`` (a report's name) walks the tiles of ``workload``'s whole batch at its launched tiling.

    A model of the kernels' loop bounds (``ops/bias_attention/``, no window, not causal; keep it in step with
    them; with a distance ``window`` or a positional window ``band`` the forward, dQ, dK/dV and table kernels walk
    the live-tile lists, :func:`_listed_tiles`, the table kernel's bucket sets those of the pairs within the window,
    causal calls' too): the forward, dQ and table kernels walk, for every query block that starts inside the length,
    the key blocks up to the length, the one holding the length's end masked (*boundary*), the others unmasked
    (*interior*); the dK/dV kernel walks, for every key block inside the length, the query blocks the same way.
    The table kernel reduces each walked tile's dS (summed over its heads) per bucket: one row sum for a tile
    wholly in one bucket (*one-bucket*), else a compare-select-add per bucket the tile holds (*mixed*; more than 31
    buckets: per bucket of the tile's range, :func:`tile_walk_counts`); up to 31 buckets it does
    not walk its query block's most frequent one-bucket tiles (``bucket_skipped``, counted as skipped).
    ``buckets``: the BucketSpec the kernels run (None: the workload's own, ``Workload.kernel_buckets``). Every
    other tile of the ``B x nQ x nK`` grid is *skipped*. The block-metadata kernels run one program per tile:
    those whose tile starts inside the length (``causal``: and reaches the diagonal) count as interior, the others
    (they exit at once) as skipped.
    The two-block kernel with the key blocks outer walks steps of ``rows`` query rows (its ROWS) per key block
    inside the length, up to the length's last step (``causal``: from the key block's diagonal), all boundary
    tiles of ``rows x block_n``, after a first pass over the second key block of the steps reaching it
    (``first_pass``: the exact delta's row sums); it also counts ``steps``, ``key_blocks``, ``items``, and the
    trips of its zeroing loops (``zero_steps``: a last block's steps past the length; ``zero_blocks``: blocks past
    it).

    Returns counts ``grid, skipped, interior, boundary, one_bucket, mixed``, ``buckets_mixed`` (buckets walked
    by the mixed tiles, summed), ``valid_pairs`` (sum of length^2) and ``area`` (``block_m * block_n``), or None for a kernel without a tiling.
    """
    import torch

    from syntaxkernels.ops.bias_attention import _launch as op

    if kernel in _VARLEN_QUERY_PROGRAMS + _VARLEN_KEY_PROGRAMS:
        return _varlen_tiles(kernel, workload, block_m, block_n, buckets) if block_m and block_n else None
    lengths = torch.tensor(workload.lengths, dtype=torch.int64)
    N = workload.N
    if kernel in _SHORT2_SUM:  # a program per item and head; items over one block add their shares
        return dict(grid=workload.batch_size, skipped=0, interior=0, boundary=0, one_bucket=0,
                    mixed=0, buckets_mixed=0, valid_pairs=workload.valid_pairs(), area=None,
                    programs_long=int((lengths > block_m).sum()))
    if not block_m or not block_n:
        return None
    if kernel in _SHORT2_KEYS and rows:
        blocks, steps_in = -(-lengths // block_m), -(-lengths // rows)
        per_block = block_m // rows
        steps = sum(int(((steps_in - (kb * per_block if causal else 0)) * (blocks > kb)).sum()) for kb in range(2))
        grid = workload.batch_size * 2 * 2 * per_block
        first = int(((steps_in - (per_block if causal else 0)) * (blocks > 1)).sum())  # (rows reaching both)
        return dict(grid=grid, skipped=grid - steps, interior=0, boundary=steps, one_bucket=0, mixed=0,
                    buckets_mixed=0, valid_pairs=workload.valid_pairs(), area=rows * block_n, steps=steps,
                    first_pass=first,
                    key_blocks=int(blocks.sum()), items=workload.batch_size,
                    zero_steps=int((blocks * per_block - steps_in).sum()), zero_blocks=int((2 - blocks).sum()))
    num_q, num_k = -(-N // block_m), -(-N // block_n)
    grid = workload.batch_size * num_q * num_k
    out = dict(grid=grid, skipped=0, interior=0, boundary=0, one_bucket=0, mixed=0, buckets_mixed=0,
               valid_pairs=workload.valid_pairs(), area=block_m * block_n)
    if kernel in _TILE_PROGRAMS:  # a program per tile; the tiles that start past the length exit at once
        q_start = torch.arange(num_q)[None, :, None] * block_m
        k_start = torch.arange(num_k)[None, None, :] * block_n
        live = (q_start < lengths[:, None, None]) & (k_start < lengths[:, None, None])
        if causal:  # (the bucket-mask kernel: a tile wholly above the diagonal too)
            live = live & (k_start <= q_start + block_m - 1)
        out["interior"] = int(live.sum())
        out["skipped"] = grid - out["interior"]
        return out
    if kernel in _ONE_TILE:  # every program walks its one tile (masked), an empty row's too
        out["boundary"] = grid
        return out
    spec = buckets or _kernel_buckets(workload)
    T = spec.num_buckets
    if kernel == "_bias_bwd_short_table_kernel":  # a program per tile; tiles without an allowed pair: skipped
        counts = tile_walk_counts(_presence(workload, block_m, block_n, spec), T, spec.log_distance)
        out["boundary"] = int((counts > 0).sum())
        out["skipped"] = grid - out["boundary"]
        out["one_bucket"], out["mixed"] = int((counts == 1).sum()), int((counts > 1).sum())
        out["buckets_mixed"] = int(counts[counts > 1].sum())
        return out
    if kernel in _SHORT2_PROGRAMS:  # a program per query block; it walks the key blocks the length reaches
        blocks = -(-lengths // block_m)  # (no window, not causal: every block up to the length)
        out["boundary"] = int((blocks * blocks).sum())
        out["programs"] = workload.batch_size * num_q
        out["first_key_block"] = int(blocks.sum())  # every program with rows walks the first key block
        out["second_key_block"] = int((blocks * (blocks - 1)).sum())  # rows reaching it: items over one block
        out["first_pass"] = out["second_key_block"]  # (the first pass runs on that tile)
        out["skipped"] = grid - out["boundary"]
        return out
    listed = (window >= 0 or band >= 0) and kernel in _QUERY_PROGRAMS + _KEY_PROGRAMS
    if listed:
        live, masked = _listed_tiles(workload, block_m, block_n, causal, window, band, kernel in _QUERY_PROGRAMS)
        out["interior"], out["boundary"] = int((live & ~masked).sum()), int((live & masked).sum())
    if kernel in _QUERY_PROGRAMS:
        rows = -(-lengths // block_m)  # query blocks that start inside the length
        if not listed:
            out["interior"] = int((rows * (lengths // block_n)).sum())
            out["boundary"] = int((rows * (-(-lengths // block_n) - lengths // block_n)).sum())
        if kernel in _TABLE_PROGRAMS:
            # Bucket sets per tile [B, nQ, nK, T]; every walked tile with an allowed pair reduces dS per bucket.
            present = _presence(workload, block_m, block_n, spec, window)
            counts = tile_walk_counts(present, T, spec.log_distance)
            position_q = torch.arange(num_q)[None, :, None]
            position_k = torch.arange(num_k)[None, None, :]
            walked = (position_q < rows[:, None, None]) & (position_k < -(-lengths // block_n)[:, None, None])
            if listed:
                walked = live
            # Each query block's most frequent one-bucket tiles are not walked (op._skip_buckets, tables of up to
            # STATIC_BUCKET_LIMIT buckets: their bit sets): a compare.
            if T <= op.STATIC_BUCKET_LIMIT:
                masks = (present.to(torch.int64) << torch.arange(present.shape[-1])).sum(dim=-1)
                skip = op._skip_buckets(masks, T).to(masks.dtype)
                skipped = walked & (skip >= 0)[..., None] & (masks == (1 << skip.clamp(min=0))[..., None])
            else:
                skipped = torch.zeros_like(walked)
            interior_tile = ~masked if listed else position_k < (lengths // block_n)[:, None, None]
            out["interior"] -= int((skipped & interior_tile).sum())
            out["boundary"] -= int((skipped & ~interior_tile).sum())
            out["bucket_skipped"] = int(skipped.sum())
            walked = walked & ~skipped
            one, mixed = walked & (counts == 1), walked & (counts > 1)
            out["one_bucket"], out["mixed"] = int(one.sum()), int(mixed.sum())
            out["buckets_mixed"] = int(counts[mixed].sum())
    elif kernel in _KEY_PROGRAMS:
        if not listed:
            keys = -(-lengths // block_n)
            interior_q = lengths // block_m
            out["interior"] = int((keys * interior_q).sum())
            out["boundary"] = int((keys * (-(-lengths // block_m) - interior_q)).sum())
    else:
        return None
    out["skipped"] = grid - out["interior"] - out["boundary"]
    return out


def workload_cost(report: KernelReport, tiles: Optional[dict], heads: int = WORKLOAD_HEADS,
                  buckets=None) -> Optional[dict]:
    """The weighted cost of ``report``'s kernel over the tiles it walks (:func:`workload_tiles`), per valid
    (query, key) pair of the batch: a model from the SASS, not a measurement.

    - ``area``: score elements the kernel computes (walked tiles x tile area) per valid pair (1 = no waste;
      the tensor-core work follows it);
    - ``instr``: non-tensor-core thread-instructions per valid pair: interior tiles at the first (unmasked)
      loop's cheapest path, boundary tiles at the last (masked) loop's; a one-bucket tile adds one bucket's
      worth and a mixed tile one per bucket it holds, a bucket's worth being the loop's instructions off its
      cheapest path divided by the table's buckets (all branch overhead charged to the buckets: an upper
      bound); the table kernel (a loop over heads inside its tile loop) pays its head loop per head and the
      rest of its tile loop, bucket reduction included, once per tile for all its heads. Straight-line kernels
      (the block metadata) count all their instructions per program whose tile starts inside the length, and
      their path to the early exit (``exit_instructions``) per program whose tile does not; they run once per call
      for every head, so their figure is divided by the head count (``heads``) to be per head like the others. A
      runtime loop over the buckets (more than 31; ``report.bucket_loop_other``) costs one trip per bucket walked
      instead, every trip counted; the packed table kernel's *dead* tiles (no valid pair) cost their tile loop's
      cheapest path only.
    """
    from syntaxkernels.specs import BucketSpec

    if tiles is None or report.error or not tiles["valid_pairs"]:
        return None
    valid = tiles["valid_pairs"]
    if report.kernel in _SHORT2_SUM:  # straight line: every instruction, per item over one block and head
        threads = 32 * report.num_warps
        return dict(area=None, instr=report.instructions * threads * tiles["programs_long"] / valid)
    walked = tiles["interior"] + tiles["boundary"]
    area = walked * tiles["area"] / valid
    if report.kernel in _TILE_PROGRAMS:  # once per call, shared by every head (a bias-free backward has none)
        threads = 32 * report.num_warps
        programs = tiles["interior"] * report.instructions + tiles["skipped"] * report.exit_instructions
        return dict(area=None, instr=programs * threads / heads / valid)
    if report.kernel in _SHORT2_KEYS:
        # Per head: each step (and first-pass step) at its loop's cheapest path, the rest of each key block's and head's trips and
        # the zeroing loops' trips counting every instruction; per program (an item's head group) the prologue,
        # every instruction, shared by the group's heads.
        n = report.nest
        if n is None or "steps" not in tiles:
            return dict(area=area, instr=None)
        per_head = (tiles["steps"] * n["step_other"] + tiles["first_pass"] * n["first_other"]
                    + tiles["key_blocks"] * n["key_block"] + tiles["items"] * n["head"]
                    + tiles["zero_steps"] * n["zero_step"] + tiles["zero_blocks"] * n["zero_block"])
        once = tiles["items"] * n["groups"] * n["once"] / n["heads"]
        return dict(area=area, instr=(per_head + once) * 32 * report.num_warps / valid)
    if not report.loop_other:
        return dict(area=area, instr=None)
    T = (buckets or BucketSpec()).num_buckets  # the kernels' buckets (a relation batch: its 256 codes)
    first_other, last_other = report.loop_other[0], report.loop_other[-1]
    per_tile = report.heads  # the heads one program takes per tile (the table kernel's HEADS)
    if report.kernel in _SHORT2_PROGRAMS:
        # Per tile each head loop once per head (the first pass on the second key block of rows reaching it,
        # the main pass on each walked tile). Outside the head loops: the cheapest path (the prologue) once per
        # program; the rest, every branch counted, is the three tile prologues (a bias gather each, before each
        # head loop) and is charged a third to each tile either pass walks; both for all the program's heads.
        if len(report.loop_other) != 3 or report.once_all is None or report.once_other is None:
            return dict(area=area, instr=None)
        first, main0, main1 = report.loop_other
        gather = (report.once_all - report.once_other) / 3
        per_element = (tiles["first_key_block"] * main0 + tiles["second_key_block"] * main1
                       + tiles["first_pass"] * first + tiles["programs"] * report.once_other / report.heads
                       + (tiles["boundary"] + tiles["first_pass"]) * gather / report.heads)
        return dict(area=area, instr=per_element * tiles["area"] / valid)
    if report.kernel in _DOTLESS_PROGRAMS and report.once_other is not None and report.head_sum_other is not None:
        # The short table kernel on more than 31 buckets, per tile for all its heads: the rest once, each head's
        # iteration of the loop summing dS, then one trip (``last_other``: the tile loop is the bucket loop) per
        # bucket of the tile's range; per head (divided by them).
        per_element = (tiles["boundary"] * (report.once_other + per_tile * report.head_sum_other)
                       + (tiles["one_bucket"] + tiles["buckets_mixed"]) * last_other) / per_tile
        return dict(area=area, instr=per_element * tiles["area"] / valid)
    if report.kernel in _HEAD_PROGRAMS and report.once_other is not None:
        # Per tile: the head loop once per head, the rest once (its branches charged per bucket the tile
        # holds, like the table kernel's: an upper bound), per head.
        per_bucket = (report.once_all - report.once_other) / T
        per_element = (tiles["boundary"] * (last_other + report.once_other / per_tile)
                       + (tiles["one_bucket"] + tiles["buckets_mixed"]) * per_bucket / per_tile)
        return dict(area=area, instr=per_element * tiles["area"] / valid)
    if report.head_loop_other and report.head_loop_other[0]:
        # The table kernel: per tile, each head's loop, then the tile's own work and its bucket reduction once
        # for all ``per_tile`` heads (charged per head: divided by them).
        if report.bucket_loop_other:  # a runtime bucket loop: each walked bucket one trip, the rest per tile
            per_bucket = report.bucket_loop_other
            fixed = max(a - o - report.bucket_trips * report.bucket_loop_all
                        for a, o in zip(report.loop_all, report.loop_other))
            per_live = max(fixed, 0.0)
        else:
            per_bucket = max((a - o) / T for a, o in zip(report.loop_all, report.loop_other))
            per_live = 0.0
        live = tiles["interior"] + tiles["boundary"]
        per_element = (tiles["interior"] * (report.head_loop_other[0] + first_other / per_tile)
                       + tiles["boundary"] * (report.head_loop_other[-1] + last_other / per_tile)
                       + tiles.get("dead", 0) * last_other / per_tile + live * per_live / per_tile
                       + (tiles["one_bucket"] + tiles["buckets_mixed"]) * per_bucket / per_tile)
        return dict(area=area, instr=per_element * tiles["area"] / valid)
    per_element = tiles["interior"] * first_other + tiles["boundary"] * last_other
    cost = dict(area=area, instr=per_element * tiles["area"] / valid)
    if report.plain_loop_other:  # the same walk at the bias-free twin's loop costs
        plain = tiles["interior"] * report.plain_loop_other[0] + tiles["boundary"] * report.plain_loop_other[-1]
        cost["plain_instr"] = plain * tiles["area"] / valid
    return cost


def _workload_job(job):
    name, dtype, head_dim, arch, *rest = job  # (name, dtype, head dim, arch[, BucketSpec, dropout, H_kv, causal, band,
    #                                            RelativePositionSpec, window])
    return inspect_workload(name, dtype, head_dim, arch, *rest)


@contextlib.contextmanager
def _whole_batch_head_groups(whole: float):
    """Inside, the short-row launchers group heads, and the table kernel splits its walks, as for ``whole`` times the
    programs the compile batch has (the whole batch's grids)."""
    from syntaxkernels.ops.bias_attention import _launch

    real, real_splits = _launch.head_groups, _launch.table_splits
    _launch.head_groups = lambda programs, H, device: real(round(programs * whole), H, device)
    _launch.table_splits = lambda programs, num_k, device: real_splits(round(programs * whole), num_k, device)
    try:
        yield
    finally:
        _launch.head_groups, _launch.table_splits = real, real_splits


def programs_per_multiprocessor(report: KernelReport) -> Optional[float]:
    """A workload case's programs over the multiprocessors of its GPU family's commonest GPU
    (:data:`~syntaxkernels.ops._primitives.MULTIPROCESSORS`): below 1 the launch leaves multiprocessors idle."""
    from syntaxkernels.ops._primitives import MULTIPROCESSORS

    if report.programs is None or report.arch not in MULTIPROCESSORS:
        return None
    return report.programs / MULTIPROCESSORS[report.arch]


def inspect_workload(name: str, dtype: str, head_dim: int, arch: int, buckets=None,
                     dropout: float = 0.0, kv_heads: int = 0, causal: bool = False,
                     band: int = -1, position=None, window: int = -1) -> List[KernelReport]:
    """Compile every kernel one layer's forward and backward launch on workload ``name`` for ``sm_<arch>``
    (the compile batch of :meth:`Workload.compile_rows`: same N, layout and alignment as the whole batch),
    and attach the whole batch's tile classes and weighted cost per valid pair to each report
    (``report.tiles``, ``report.cost``). ``buckets``: the layer's :class:`BucketSpec` (None: ``BucketSpec()``;
    another adds ``T<buckets>`` to the case name); ``dropout``: the layer's attention dropout (``p<dropout>`` in the
    case name: the kernels' DROPOUT variant); ``kv_heads``: grouped-query k, v of that many heads (``kv<kv_heads>``
    in the case name); ``causal``: a causal layer (``causal`` in the case name); ``band``: a positional window
    (``w<band>`` in the case name; padded workloads only); ``position``: T5's relative-position term, a
    :class:`~syntaxkernels.specs.RelativePositionSpec` (``rp<P>:<max_distance>`` in the case name; padded workloads
    only); ``window``: a distance window ``d_ij <= window`` (``d<window>`` in the case name; padded workloads only).
    With a window or a positional window the kernels walk the live-tile lists, and the tile classes count those."""
    workload = _workload(name)
    if workload.packed and (window >= 0 or band >= 0):
        raise ValueError(f"workload {name!r} is packed: a window or a positional window is inspected on padded "
                         "workloads only")
    if buckets is not None and workload.structure == "relations":
        raise ValueError(f"workload {name!r} is a relation batch: the kernels run its {workload.relations} relations' "
                         "codes (CODE_BUCKETS, 256 buckets); it takes no other BucketSpec")
    _require_compiler()
    kernel_buckets = buckets or _kernel_buckets(workload)
    case = (f"{name} {dtype} D{head_dim}" + (f" T{buckets.num_buckets}" if buckets is not None else "")
            + (f" p{dropout:g}" if dropout else "") + (f" kv{kv_heads}" if kv_heads else "")
            + (" causal" if causal else "") + (f" w{band}" if band >= 0 else "")
            + (f" rp{position.num_buckets}:{position.max_distance}" if position is not None else "")
            + (f" d{window}" if window >= 0 else ""))
    reports: List[KernelReport] = []
    seen = set()
    # The compile batch stands for the whole one: every grid scales with the batch size, and the short-row
    # kernels' head groups are those of the whole batch (a launch compiles with them: 1 is specialised).
    whole = 1.0 if workload.packed else workload.batch_size / len(workload.compile_rows())
    with fake_gpu(arch), capture_launches(keep_going=True) as launches, _whole_batch_head_groups(whole):
        try:
            if workload.packed:
                _user_call_packed(workload.packed_batch(), dtype, head_dim, buckets=buckets, dropout=dropout,
                                  kv_heads=kv_heads, causal=causal)
            else:
                relations = workload.relations if workload.structure == "relations" else None
                compile_plan = workload.plan(workload.compile_rows())
                compile_plan.short_rows = workload.short_rows  # (the whole batch's tiles)
                _user_call(compile_plan, dtype, head_dim,
                           buckets=workload.buckets if relations else buckets, dropout=dropout, kv_heads=kv_heads,
                           causal=causal, band=band, position=position, relations=relations, window=window)
        except Exception as exc:  # noqa: BLE001 - the call is reported, the other workloads go on
            if not launches:
                report = KernelReport("bias_attention", case, "(call)", arch, head_dim=head_dim, dtype=dtype,
                                      workload=name, shared_limit=SHARED_LIMIT.get(arch, 0),
                                      error=" ".join(f"{type(exc).__name__}: {exc}".split())[:500])
                return [report]
            launches.append(Launch(None, (), (), {}, error=" ".join(f"{type(exc).__name__}: {exc}".split())[:500]))
        if not launches:
            launches.append(Launch(None, (), (), {}, error="the call launched no kernel (did it run the reference?)"))
        for launch in launches:
            if launch.kernel is None:
                reports.append(KernelReport("bias_attention", case, "(call)", arch, head_dim=head_dim, dtype=dtype,
                                            workload=name, shared_limit=SHARED_LIMIT.get(arch, 0),
                                            error=launch.error))
                continue
            kernel_name = getattr(launch.kernel, "fn", launch.kernel).__name__
            key = (kernel_name, tuple(sorted((k, str(v)) for k, v in launch.kwargs.items())))
            if key in seen:
                continue
            seen.add(key)
            twin = None
            if "SYNTAX" in launch.kernel.arg_names:  # the bias-free twin walks the same tiles
                try:
                    twin = launch.kernel.run(*launch.args, grid=launch.grid, warmup=True,
                                             **dict(launch.kwargs, SYNTAX=False))
                except Exception:  # noqa: BLE001 - the twin is a comparison only; its figures stay empty
                    twin = None
            report = _report_for("bias_attention", case, launch, arch, twin)
            report.head_dim, report.dtype, report.workload = head_dim, dtype, name
            if not report.block_m:
                report.block_m = int(launch.kwargs.get("BLOCK_M", 0))
                report.block_n = int(launch.kwargs.get("BLOCK_N", 0))
            tiles = workload_tiles(report.kernel, workload, report.block_m, report.block_n, kernel_buckets,
                                   rows=int(launch.kwargs.get("ROWS", 0)), causal=bool(launch.kwargs.get("CAUSAL")),
                                   window=window, band=band)
            report.tiles = tiles
            report.programs = round(math.prod(launch.grid) * whole)
            report.cost = workload_cost(report, tiles, buckets=kernel_buckets)
            reports.append(report)
    return reports


def inspect_workloads(names: Sequence[str], archs: Sequence[int] = ALL_ARCHS, dtypes: Sequence[str] = ("bf16",),
                      head_dims: Sequence[int] = (64, 128), processes: int = 2,
                      progress: Optional[Callable[[str], None]] = None, buckets=None,
                      dropout: float = 0.0, kv_heads: int = 0, causal: bool = False,
                      band: int = -1, position=None, window: int = -1) -> List[KernelReport]:
    """:func:`inspect_workload` for every workload x dtype x head dim x arch, in a ``spawn`` process pool
    (``buckets``: the layers' BucketSpec, None = ``BucketSpec()``; ``dropout``: the layers' attention dropout;
    ``kv_heads``, ``causal``, ``band``, ``position``, ``window``: grouped-query k, v, a causal layer, a positional
    window, T5's relative-position term and a distance window)."""
    _require_compiler()
    jobs = [(n, dt, d, a, buckets, dropout, kv_heads, causal, band, position, window) for n in names for dt in dtypes
            for d in head_dims for a in archs]

    def describe(job, batch):
        errors = sum(1 for r in batch if r.error)
        return (f"sm_{job[3]} {job[0]} {job[1]} D{job[2]}: {len(batch)} kernels"
                + (f", {errors} not compiled" if errors else ""))

    return _run_jobs(_workload_job, jobs, processes, progress, describe)


def _kib(value: int) -> str:
    return "-" if value is None or value < 0 else f"{value / 1024:.0f}"


def workload_problems(reports: Iterable[KernelReport]) -> List[str]:
    """What a workload inspection found wrong: launches that do not compile, spills, shared memory over the
    family's limit. Every report counts (the workload cases have no known exceptions)."""
    from syntaxkernels.ops._primitives import arch_family

    problems = []
    for r in reports:
        where = f"sm_{r.arch} {r.case} {r.kernel}"
        if r.error and arch_family(r.arch) == "unsupported":
            continue  # no Triton configs by design: the ops run the reference there (see workload_unsupported)
        if r.error:
            problems.append(f"{where}: does not compile: {r.error}")
            continue
        if r.spills:
            problems.append(f"{where}: spills {r.spill_bytes} B ({r.local_bytes} B local, {r.stack_bytes} B stack, "
                            f"{r.spill_instructions} STL/LDL)")
        if r.over_shared_limit:
            problems.append(f"{where}: {r.shared_bytes} B of shared memory, sm_{r.arch} allows {r.shared_limit} B")
    return problems


def workload_unsupported(reports: Iterable[KernelReport]) -> List[int]:
    """The inspected GPUs that have no Triton configs (``arch_family(arch) == "unsupported"``: sm_75 and older),
    where ``backend="auto"`` runs the reference and ``"triton"`` raises a ValueError."""
    from syntaxkernels.ops._primitives import arch_family

    return sorted({r.arch for r in reports if arch_family(r.arch) == "unsupported"})


def _kernel_label(kernel: str) -> str:
    return _short(kernel).replace("bias_bwd_", "").replace("bias_", "").replace("block_", "")


def format_workload_reports(reports: Sequence[KernelReport]) -> str:
    """Two tables, one line per kernel of each workload case: what it compiled to, and how it walks the
    batch's tiles with its weighted cost per valid pair."""
    rows = [r for r in reports]
    case_width = max([len("case")] + [len(r.case) for r in rows])
    kernel_width = max([len("kernel")] + [len(_kernel_label(r.kernel)) for r in rows])
    head = (f"{'case':<{case_width}} {'sm':>3} {'kernel':<{kernel_width}} {'tile':>7} {'w/s':>4} {'reg':>3} "
            f"{'spill':>5} {'smem/lim':>8} {'other':>5} {'all':>5} {'ex2':>4}")
    lines = textwrap.wrap("compiled as launched (other, all, ex2: main loop, per score element; smem/lim: shared "
                          "memory and the family's limit, KiB, '!' when over; spill: bytes; fma: a half-precision "
                          "kernel without tensor-core instructions)", WIDTH)
    lines += [head, "-" * len(head)]
    for r in rows:
        lead = f"{r.case:<{case_width}} {r.arch:>3} {_kernel_label(r.kernel):<{kernel_width}}"
        if r.error:
            lines.extend(textwrap.wrap(f"{lead} ERROR {r.error}", WIDTH, subsequent_indent="    "))
            continue
        over = "!" if r.over_shared_limit else "/"
        flag = ""
        if (r.loop_other and not r.main_tensor_core and r.dtype in ("bf16", "fp16")
                and r.kernel not in _DOTLESS_PROGRAMS):
            flag = " fma"  # no tensor-core instruction: the dot compiled to FMA (Triton 3.6: bf16 on sm_75)
        lines.append(f"{lead} {r.tile or '-':>7} {r.num_warps}/{r.num_stages:<2} {r.registers:>3} "
                     f"{r.spill_bytes:>5} {_kib(r.shared_bytes) + over + _kib(r.shared_limit):>8} "
                     f"{_fmt(r.other_per_unit):>5} {_fmt(r.all_per_unit):>5} {_fmt(r.ex2_per_unit, 2):>4}{flag}")
    head = (f"{'case':<{case_width}} {'sm':>3} {'kernel':<{kernel_width}} {'tile':>7} {'tiles':>6} {'skip':>4} "
            f"{'int':>4} {'bnd':>4} {'1bkt':>4} {'mix':>4} {'bkts':>4} {'area':>5} {'instr':>6} {'p/SM':>5}")
    lines += ["", "tiles of the whole batch (fractions of the B x nQ x nK grid) and weighted cost per valid pair",
              head, "-" * len(head)]
    for r in rows:
        if r.error or not (r.tiles or (r.block_m and r.block_n)):
            continue
        if not r.tiles:
            lines.append(f"{r.case:<{case_width}} {r.arch:>3} {_kernel_label(r.kernel):<{kernel_width}} {r.tile:>7} "
                         "no model of how this kernel walks its tiles: not counted")
            continue
        t, c = r.tiles, r.cost or {}
        grid = max(t["grid"], 1)
        mean_buckets = t["buckets_mixed"] / t["mixed"] if t["mixed"] else None
        lines.append(f"{r.case:<{case_width}} {r.arch:>3} {_kernel_label(r.kernel):<{kernel_width}} "
                     f"{r.tile or '-':>7} {t['grid']:>6} {t['skipped'] / grid:>4.2f} {t['interior'] / grid:>4.2f} "
                     f"{t['boundary'] / grid:>4.2f} {t['one_bucket'] / grid:>4.2f} {t['mixed'] / grid:>4.2f} "
                     f"{_fmt(mean_buckets):>4} {_fmt(c.get('area'), 2):>5} {_fmt(c.get('instr')):>6} "
                     f"{_fmt(programs_per_multiprocessor(r), 2):>5}")
    lines += textwrap.wrap(WORKLOAD_LEGEND, WIDTH)
    return "\n".join(lines)


WORKLOAD_LEGEND = (
    "skip/int/bnd: tiles the kernel does not walk, walks unmasked, walks masked (the sequence end); 1bkt/mix: "
    "tiles whose table gradient (the table kernel, dS summed over the heads first) is one row sum (one bucket) "
    "or a compare-select-add per bucket held; bkts: mean buckets summed per mixed tile; area: score elements computed per valid (query, key) pair (1 = no padding or empty tile "
    "area); instr: non-tensor-core thread-instructions per valid pair, summed over the tiles walked at each "
    "class's loop cost (straight-line kernels: all their instructions per program; block metadata per head of "
    "a 12-head call); p/SM: the whole batch's programs per multiprocessor of the family's commonest GPU (A100 "
    "108, RTX 30 84, RTX 4090 128, H100/H200 132, B200 148, RTX 5090 170; below 1: multiprocessors left idle). "
    "A model read from the SASS, not a measurement.")


def workload_summary(reports: Sequence[KernelReport]) -> List[dict]:
    """One row per workload case and arch: the forward's and the backward's (dQ, dK/dV, the table gradient, the
    block metadata) instructions and score elements per valid pair, and what spills or does not fit;
    ``bwd_layer_instr``: the backward of a layer after the batch's first (without the block-metadata kernels, whose
    results the batch's structure plan keeps for its other layers)."""
    groups: Dict[tuple, List[KernelReport]] = {}
    for r in reports:
        groups.setdefault((r.case, r.arch), []).append(r)
    rows = []
    for (case, arch), group in groups.items():
        def total(kernels, key):
            values = [(r.cost or {}).get(key) for r in group if r.kernel in kernels and not r.error]
            values = [v for v in values if v is not None]
            return sum(values) if values else None

        forward = ("_bias_fwd_kernel", "_bias_fwd_short_kernel") + _VARLEN_QUERY_PROGRAMS[:1]
        backward = (("_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel") + _TILE_PROGRAMS
                    + _HEAD_PROGRAMS[1:] + _SHORT2_PROGRAMS + _SHORT2_SUM + _SHORT2_KEYS + _VARLEN_QUERY_PROGRAMS[1:]
                    + _VARLEN_KEY_PROGRAMS)
        rows.append(dict(case=case, arch=arch, kernels=len(group), errors=sum(1 for r in group if r.error),
                         unmodelled=sum(1 for r in group if not r.error and r.block_m and r.block_n
                                        and not r.tiles),
                         spills=sum(1 for r in group if not r.error and r.spills),
                         spill_bytes=max([r.spill_bytes for r in group if not r.error] or [0]),
                         over_shared=sum(1 for r in group if not r.error and r.over_shared_limit),
                         fwd_instr=total(forward, "instr"), bwd_instr=total(backward, "instr"),
                         # a layer after the first: the block metadata is the batch's plan's, derived once
                         bwd_layer_instr=total(tuple(k for k in backward if k not in _TILE_PROGRAMS), "instr"),
                         fwd_area=total(forward, "area"),
                         dkdv_area=total(("_bias_bwd_dkdv_kernel",) + _ONE_TILE[1:] + _SHORT2_PROGRAMS + _SHORT2_KEYS
                                         + _VARLEN_KEY_PROGRAMS,
                                         "area")))
        last = rows[-1]

        def per_element(kernels, key):
            """Per score element: each tiled kernel's instructions over its own area, summed; straight-line
            kernels (no area) over the dK/dV kernel's area."""
            reference_area = last["dkdv_area"] or last["fwd_area"]
            values = []
            for r in group:
                cost = r.cost or {}
                if r.kernel not in kernels or r.error or cost.get(key) is None:
                    continue
                area = cost.get("area") or reference_area
                if area:
                    values.append(cost[key] / area)
            return sum(values) if values else None

        backward_plain = ("_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel") + _VARLEN_QUERY_PROGRAMS[1:] + \
            _VARLEN_KEY_PROGRAMS
        last["fwd_element"] = per_element(forward, "instr")
        last["bwd_element"] = per_element(backward, "instr")
        last["plain_fwd_element"] = per_element(forward, "plain_instr")
        last["plain_bwd_element"] = per_element(backward_plain, "plain_instr")
    return rows


def _ratio(a, b):
    return a / b if a is not None and b else None


def _valid_share(area) -> str:
    return f"{1 / area:.0%}" if area else "-"


def format_workload_summary(rows: Sequence[dict], workloads_used: Sequence = ()) -> str:
    """The workload summary table (:func:`workload_summary`), with each workload's batch described first."""
    if any(getattr(w, "structure", "tree") != "tree" for w in workloads_used):
        lines = ["workloads (token trees as TreeBatch.from_heads builds them, the relation workloads' plans as each "
                 "line says; one token per word, code: regex tokens):"]
    else:
        lines = ["workloads (token trees as TreeBatch.from_heads builds them; one token per word):"]
    for w in workloads_used:
        lines.extend(textwrap.wrap(w.summary(), WIDTH, initial_indent="  ", subsequent_indent="    "))
    case_width = max([len("case")] + [len(r["case"]) for r in rows])
    head = (f"{'case':<{case_width}} {'sm':>3} {'fwd':>7} {'bwd':>7} {'area f':>6} {'area b':>6} {'valid':>5} "
            f"{'fwd/el':>6} {'bwd/el':>6} {'plain':>5} {'ratio':>5} {'spills':>6} {'max B':>5} {'>smem':>5} "
            f"{'errors':>6}")
    lines += ["", "per valid pair (instructions: non-tensor-core thread-instructions; area: score elements "
              "computed)", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<{case_width}} {r['arch']:>3} {_fmt(r['fwd_instr']):>7} {_fmt(r['bwd_instr']):>7} "
                     f"{_fmt(r['fwd_area'], 2):>6} {_fmt(r['dkdv_area'], 2):>6} {_valid_share(r['fwd_area']):>5} "
                     f"{_fmt(r.get('fwd_element')):>6} "
                     f"{_fmt(r.get('bwd_element')):>6} {_fmt(r.get('plain_bwd_element')):>5} "
                     f"{_fmt(_ratio(r.get('bwd_element'), r.get('plain_bwd_element')), 2):>5} {r['spills']:>6} "
                     f"{r['spill_bytes']:>5} {r['over_shared']:>5} {r['errors']:>6}")
    unmodelled = sum(r["unmodelled"] for r in rows)
    lines += textwrap.wrap(
        "fwd, bwd: the forward's and the backward's (dQ, dK/dV, the table gradient, block metadata; rows of "
        "at most 64 tokens on sm_90 and newer: the short-row kernels) instructions per valid pair; area f, "
        "area b: score elements the forward and the dK/dV (or short-row) kernel compute per valid pair; valid: the share of the forward's computed (tensor-core) score elements that are valid "
        "pairs (1 / area f); fwd/el, bwd/el: instructions per score element, every branch the tiles take: each tiled "
        "kernel's instructions over its own score elements, summed over the pass's kernels (straight-line kernels "
        "over area b); plain: bwd/el of the bias-free backward (the "
        "same kernels compiled without the distance and the bias, with no block metadata and no table "
        "gradient, walking the same tiles; '-' where the short-row kernels run), ratio: bwd/el over it; spills: kernels that spill (max B: the most bytes); >smem: kernels over the family's "
        "shared memory; errors: launches that did not compile (their figures are missing from fwd/bwd)."
        + (f" {unmodelled} tiled kernels have no walk model and are not in fwd/bwd." if unmodelled else ""), WIDTH)
    return "\n".join(lines)


#: The GPU whose multiprocessors :func:`workload_overview` sizes a family's grids for (an A100, an A10-class GPU,
#: an H100) when no arch is named.
_FAMILY_ARCHS = {"sm80": 80, "small": 86, "sm90": 90}


@contextlib.contextmanager
def _multiprocessors_of(arch: int):
    """Size the launchers' grids for ``arch``'s multiprocessors
    (:data:`~syntaxkernels.ops._primitives.MULTIPROCESSORS`) where nothing else set a count: what a launch on that
    GPU would fill, asked without a GPU or the interpreter."""
    from syntaxkernels.ops import _primitives as P

    previous = P._MULTIPROCESSORS_OVERRIDE
    if previous is None:
        P._MULTIPROCESSORS_OVERRIDE = P.MULTIPROCESSORS.get(arch, 132)
    try:
        yield
    finally:
        P._MULTIPROCESSORS_OVERRIDE = previous


def workload_overview(names: Sequence[str], family: str = "sm90", head_dims: Sequence[int] = (64,),
                      dtype: str = "bf16", arch: Optional[int] = None) -> List[dict]:
    """Without compiling anything: per workload and head dim, the batch (B, N, lengths, valid pairs as a
    fraction of ``B x N^2``) and how the forward and the dK/dV kernel walk its tiles at the tiling a call on the
    whole batch's plan launches on ``family`` (``launch_configs`` with the plan's row class, ``short_rows``: the
    padded batches' tiles, the long rows'; ``arch``: a GPU of the family, for the tiles of its own, e.g. 100 or
    120; default the family's first) (score elements computed per valid pair; the dK/dV kernel's interior
    tiles; the table kernel's walked tiles on its one-bucket and mixed paths). Columns: ``valid`` (valid pairs
    / B N^2), ``f_area``/``b_area`` (score elements per valid pair, forward / dK/dV), ``bnd`` (the dK/dV
    kernel's walked tiles that are boundary tiles), ``one``/``mixed`` (the table kernel's walked tiles on each
    path), ``bkts`` (mean buckets per mixed tile). Cheap: ``bench`` prints it on machines without
    a GPU; ``inspect --workload`` adds what each kernel compiles to."""
    from syntaxkernels.ops.bias_attention import _varlen_kernels as varlen

    from .traffic import _path

    rows = []

    for name in names:
        workload = _workload(name)
        for head_dim in head_dims:
            if workload.packed:  # the varlen kernels, the table kernel's tiles with a valid pair
                # (a shared table: on short sequences the dK/dV kernel stores dS and the table kernel reads it)
                lengths = [int(n) for n in workload.lengths]
                stored = "_ds" if varlen.stores_ds(True, sum(n * n for n in lengths), sum(lengths)) else ""
                fwd = varlen.select_varlen_config("fwd", _torch_dtype(dtype), head_dim, family, arch)
                dkdv = varlen.select_varlen_config("dkdv" + stored, _torch_dtype(dtype), head_dim, family, arch)
                table = varlen.select_varlen_config("table" + stored, _torch_dtype(dtype), head_dim, family, arch)
                f = workload_tiles("_varlen_fwd_kernel", workload, fwd["BLOCK_M"], fwd["BLOCK_N"])
                b = workload_tiles("_varlen_dkdv_kernel", workload, dkdv["BLOCK_M"], dkdv["BLOCK_N"])
                t = workload_tiles("_varlen_table_kernel", workload, table["BLOCK_M"], table["BLOCK_N"])
                walked = max(t["boundary"], 1)
            else:  # the tiles a call on the whole batch's plan launches (its row class: the padded batches' tiles)
                target = arch or _FAMILY_ARCHS[family]
                with _multiprocessors_of(target):
                    path, configs = _path(workload.N, head_dim, _torch_dtype(dtype), target, False,
                                          workload.batch_size, WORKLOAD_HEADS, int(workload.short_rows))
                if configs.fwd_short is not None:  # one tile a sequence
                    fwd = configs.fwd_short
                    f = workload_tiles("_bias_fwd_short_kernel", workload, fwd["BLOCK_M"], fwd["BLOCK_N"])
                else:
                    fwd = configs.fwd
                    f = workload_tiles("_bias_fwd_kernel", workload, fwd["BLOCK_M"], fwd["BLOCK_N"])
                short = configs.short
                if short is not None:  # rows of at most 128 tokens: the short-row kernels, one or two blocks
                    dkdv = short
                    kernel = ("_bias_bwd_short_kernel" if path == "short" else
                              "_bias_bwd_short2_keys_kernel" if short.get("KEYS_OUTER") else "_bias_bwd_short2_kernel")
                    b = workload_tiles(kernel, workload, short["BLOCK_M"], short["BLOCK_N"], rows=short.get("ROWS", 0))
                    t = workload_tiles("_bias_bwd_short_table_kernel", workload, short["BLOCK_M"], short["BLOCK_N"])
                else:
                    dkdv, table = configs.dkdv, configs.table
                    b = workload_tiles("_bias_bwd_dkdv_kernel", workload, dkdv["BLOCK_M"], dkdv["BLOCK_N"])
                    t = workload_tiles("_bias_bwd_table_kernel", workload, table["BLOCK_M"], table["BLOCK_N"])
                walked = max(t["interior"] + t["boundary"], 1)
            lengths = workload.lengths
            rows.append(dict(workload=name, D=head_dim, B=workload.batch_size, N=workload.N,
                             lengths=f"{min(lengths)}..{max(lengths)}",
                             valid=round(workload.valid_pairs() / (workload.batch_size * workload.N ** 2), 3),
                             fwd_tile=f"{fwd['BLOCK_M']}x{fwd['BLOCK_N']}",
                             f_area=round((f["interior"] + f["boundary"]) * f["area"] / f["valid_pairs"], 2),
                             dkdv_tile=f"{dkdv['BLOCK_M']}x{dkdv['BLOCK_N']}",
                             b_area=round((b["interior"] + b["boundary"]) * b["area"] / b["valid_pairs"], 2),
                             bnd=round(b["boundary"] / max(b["interior"] + b["boundary"], 1), 2),
                             one=round(t["one_bucket"] / walked, 2), mixed=round(t["mixed"] / walked, 2),
                             bkts=round(t["buckets_mixed"] / t["mixed"], 1) if t["mixed"] else 0.0,
                             family=family, source=workload.source))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Edge-list kernels on real batches: slots per edge and instructions per real edge
# ---------------------------------------------------------------------------------------------------------

#: The batches the edge report walks: two of its own (the lists of 4 x 1024 tokens of whole sentences, packed
#: as a forest or under one [CLS]-like root) and named workloads of :mod:`syntaxkernels.tools.workloads`.
EDGE_WORKLOADS = ("packed-4x1024", "cls-4x1024", "sentences", "pairs", "packed", "long-4096", "odd-1000")
#: The lists per batch: the relation masks of ``MaskSpec()`` and the GAT windows 1..4.
EDGE_LISTS = ("relations", "window-1", "window-2", "window-3", "window-4")
#: Instructions per edge slot of the kernels before the balanced schedule (bf16, sm_90, main loop, cheapest path;
#: the same instrument, ``inspect --select edge_attention`` on the kernels of commit a52447c, 2026-12-01, equal to
#: benchmarks/RESULTS.md's 2026-11-30 table): forward, dQ, dK/dV, by head dim.
LOCKSTEP_SLOT_COST = {32: (344.0, 498.0, 496.0), 64: (692.0, 1032.0, 1024.0), 128: (1416.0, 2104.0, 2056.0)}


def edge_workload_batch(name: str):
    """``(TreeBatch, source)`` of an :data:`EDGE_WORKLOADS` batch (the treebank's sentences, or generated ones)."""
    from . import workloads as W
    from syntaxkernels.trees import TreeBatch

    if name in ("packed-4x1024", "cls-4x1024"):
        sentences, source = W.sentence_source()
        pool = [W._single_root(s) for s in sentences if 5 <= len(s) <= 40]
        make = W.pack_sentences if name.startswith("packed") else W.connect_sentences
        rows = make(pool, 1024, rows=4)
        heads = [list(r) for r in rows]
        N = 1024
    else:
        workload = _workload(name)
        heads, N, source = workload.heads, workload.N, workload.source
    import torch

    padded = torch.full((len(heads), N), -1, dtype=torch.int64)
    for b, row in enumerate(heads):
        padded[b, :len(row)] = torch.tensor(row, dtype=torch.int64)
    return TreeBatch.from_heads(padded, torch.tensor([len(r) for r in heads])), source


def _edge_lists(batch, which: str):
    from syntaxkernels.specs import MaskSpec

    if which == "relations":
        return batch.relation_lists(MaskSpec())
    return batch.window_lists(int(which.split("-")[1]))


def lockstep_slots(lists, block_e: int) -> Dict[str, int]:
    """Edge slots the kernels walked before the balanced schedule (a model of their loop bounds, per head): the
    forward took ``block_e`` consecutive rows of one (batch, relation) for as long as their longest list, dQ and
    dK/dV ``block_e`` consecutive tokens for as long as their longest span over every relation."""
    import torch

    B, R, N = lists.nonempty.shape
    nb = -(-N // block_e)

    def blocked(counts):  # counts [..., N] -> sum over blocks of block_e * max
        padded = torch.zeros(counts.shape[:-1] + (nb * block_e,), dtype=torch.int64)
        padded[..., :N] = counts
        return int(padded.view(*counts.shape[:-1], nb, block_e).amax(dim=-1).sum()) * block_e

    rows = (lists.row_ptr[1:] - lists.row_ptr[:-1]).long().view(B, N, R)
    t_rows = (lists.t_ptr[1:] - lists.t_ptr[:-1]).long().view(B, N, R)
    return dict(fwd=blocked(rows.permute(0, 2, 1)), dq=blocked(rows.sum(dim=2)), dkdv=blocked(t_rows.sum(dim=2)))


def schedule_slots(schedule, block_e: int) -> Dict[str, int]:
    """Edge slots the balanced kernels walk (per head): per block of ``block_e`` items (sorted longest first), the
    block's first item's count times ``block_e``."""
    def blocked(items):
        counts = items[-2].long()  # rows: coordinates, first, count, slot
        return int(counts[::block_e].sum()) * block_e

    return dict(fwd=blocked(schedule.f_items) + blocked(schedule.p_items),
                dq=blocked(schedule.q_items) + blocked(schedule.qp_items),
                dkdv=blocked(schedule.k_items) + blocked(schedule.kp_items))


def _edge_kernel_costs(arch: int, dtype: str, head_dim: int, which: str = "relations") -> Dict[str, dict]:
    """Per edge kernel compiled as launched on lists with split rows (a [CLS]-rooted batch, so the merge and sum
    kernels launch too; ``which``: the relation masks, or a window: one relation, which the JIT specialises):
    threads, the main loop's instructions per thread per iteration (cheapest path), the rest of the kernel's
    instructions (prologue and epilogue, once per program), BLOCK_E."""
    import torch

    from syntaxkernels.ops import edge_attention as op
    from syntaxkernels.ops.edge_attention import _kernels as kernels

    batch, _ = edge_workload_batch("cls-4x1024")
    lists = _edge_lists(batch, which)
    dt = _torch_dtype(dtype)
    B, N = batch.batch_size, batch.max_len
    # q, k, v as a model passes them: [B, N, H * D] projections viewed as [B, H, N, D] (H = 12; the JIT
    # specialises on H == 1, which no model layer has).
    q, k, v = (torch.zeros(B, N, WORKLOAD_HEADS * head_dim, dtype=dt).view(B, N, WORKLOAD_HEADS, head_dim)
               .transpose(1, 2) for _ in range(3))
    _require_compiler()
    costs: Dict[str, dict] = {}
    with fake_gpu(arch), capture_launches() as launches:
        _edge_launches(kernels, q, k, v, lists, lists.schedule(op.SCHEDULE_CHUNK))
    for launch in launches:
        name = launch.kernel.fn.__name__
        if name in costs:
            continue
        sass = _sass(launch.compiled.asm["cubin"])
        instructions, loops = analyse_sass(sass)
        total = sum(1 for _, o in instructions if o != "NOP")
        main = max(loops, key=lambda l: l.instructions) if loops else None
        body = main.instructions if main else 0
        costs[name] = dict(threads=32 * int(launch.compiled.metadata.num_warps), loop=main.shortest_other if main else 0,
                           rest=total - body, block=int(launch.kwargs.get("BLOCK_E", launch.kwargs.get("BLOCK_S", 0))),
                           spills=bool(re.search(r"\b(STL|LDL)\b", sass)))
    return costs


def edge_cost(lists, costs: Dict[str, dict]) -> Dict[str, float]:
    """Instructions per head of the balanced kernels on these lists (the model): each kernel's main loop per slot
    walked plus its prologue/epilogue once per program, forward (with the merge of split rows) and backward (delta,
    dQ, dK/dV and the sums of split tokens). Also the slots and the loop-only figures."""
    from syntaxkernels.ops import edge_attention as op

    schedule = lists.schedule(op.SCHEDULE_CHUNK)
    B, R, N = lists.nonempty.shape
    fwd, dq, dkdv = costs["_edge_fwd_kernel"], costs["_edge_bwd_dq_kernel"], costs["_edge_bwd_dkdv_kernel"]
    slots = {kind: schedule_slots(schedule, kernel["block"])[kind]  # each kernel's own BLOCK_E
             for kind, kernel in (("fwd", fwd), ("dq", dq), ("dkdv", dkdv))}

    def run(kernel, n_slots, items):
        programs = -(-items // kernel["block"])
        loop = kernel["loop"] * kernel["threads"] / kernel["block"] * n_slots
        return loop, loop + kernel["rest"] * kernel["threads"] * programs

    def splits(name, ptr):
        kernel = costs.get(name)
        S = ptr.numel() - 1
        if kernel is None or S == 0:
            return 0.0
        pieces = (ptr[1:] - ptr[:-1]).long()
        padded = torch.zeros(-(-S // kernel["block"]) * kernel["block"], dtype=torch.int64)
        padded[:S] = pieces
        iterations = int(padded.view(-1, kernel["block"]).amax(dim=1).sum())
        return (kernel["rest"] * -(-S // kernel["block"]) + kernel["loop"] * iterations) * kernel["threads"]

    import torch

    f_loop, f_all = run(fwd, slots["fwd"], schedule.f_items.shape[1])
    f_all += fwd["rest"] * fwd["threads"] * -(-schedule.p_items.shape[1] // fwd["block"])  # the split rows' launch
    q_loop, q_all = run(dq, slots["dq"], schedule.q_items.shape[1])
    q_all += dq["rest"] * dq["threads"] * -(-schedule.qp_items.shape[1] // dq["block"])  # the split tokens' launch
    k_loop, k_all = run(dkdv, slots["dkdv"], schedule.k_items.shape[1])
    k_all += dkdv["rest"] * dkdv["threads"] * -(-schedule.kp_items.shape[1] // dkdv["block"])
    delta = costs.get("_edge_bwd_delta_kernel")
    delta_all = delta["rest"] * delta["threads"] * sum(
        -(-items.shape[1] // delta["block"]) for items in (schedule.f_items, schedule.p_items)) if delta else 0.0
    f_all += splits("_edge_merge_kernel", schedule.merge_ptr)
    b_all = q_all + k_all + delta_all + splits("_edge_sum_kernel", schedule.dq_ptr) + \
        2 * splits("_edge_sum_kernel", schedule.dk_ptr)
    return dict(slots=slots, fwd_loop=f_loop, dq_loop=q_loop, dkdv_loop=k_loop, fwd=f_all, bwd=b_all)


def edge_report(names: Sequence[str] = EDGE_WORKLOADS, lists_kinds: Sequence[str] = EDGE_LISTS, arch: int = 90,
                dtype: str = "bf16", head_dim: int = 64) -> List[dict]:
    """One row per (workload, lists): edges, slots per edge before (:func:`lockstep_slots`) and after
    (:func:`schedule_slots`), instructions per real edge before (main loops only, :data:`LOCKSTEP_SLOT_COST`) and
    after (main loops, and with prologues/epilogues and the merge/sum kernels), and for windows the fused LUT
    kernel on live 64 x 64 tiles (``ops.edge_attention.window_costs``) with the path the model picks."""
    from syntaxkernels.ops import edge_attention as op
    from syntaxkernels.ops.edge_attention import configs

    costs = {kind: _edge_kernel_costs(arch, dtype, head_dim, kind) for kind in ("relations", "window-4")}
    dim = min(128, max(32, 1 << max(0, (head_dim - 1).bit_length())))
    before_cost = LOCKSTEP_SLOT_COST[dim]
    block_before = configs.edge_config(_torch_dtype(dtype), head_dim)["BLOCK_E"]
    rows = []
    for name in names:
        batch, source = edge_workload_batch(name)
        tokens = int(batch.lengths.sum())
        for which in lists_kinds:
            lists = _edge_lists(batch, which)
            E = lists.num_edges
            if E == 0:
                continue
            before = lockstep_slots(lists, block_before)
            after = edge_cost(lists, costs["relations" if which == "relations" else "window-4"])
            row = dict(workload=name, lists=which, source=source, B=batch.batch_size, N=batch.max_len,
                       tokens=tokens, edges=E, edges_per_token=E / max(tokens, 1),
                       slots_before={k: v / E for k, v in before.items()},
                       slots_after={k: v / E for k, v in after["slots"].items()},
                       fwd_before=before_cost[0] * before["fwd"] / E,
                       bwd_before=(before_cost[1] * before["dq"] + before_cost[2] * before["dkdv"]) / E,
                       fwd_loop=after["fwd_loop"] / E, bwd_loop=(after["dq_loop"] + after["dkdv_loop"]) / E,
                       fwd=after["fwd"] / E, bwd=after["bwd"] / E,
                       dq_loop=after["dq_loop"] / E, dkdv_loop=after["dkdv_loop"] / E)
            if which.startswith("window"):
                edge, dense = op.window_costs(lists, head_dim)
                row.update(live_tiles=lists.tile_count(), lut=dense / E, edge_model=edge / E,
                           path="edges" if edge <= dense else "lut")
            rows.append(row)
    return rows


def format_edge_report(rows: Sequence[dict], arch: int = 90, dtype: str = "bf16", head_dim: int = 64) -> str:
    lines = [f"edge-list kernels, sm_{arch} {dtype} D{head_dim}: slots per real edge (forward / dQ / dK/dV) before "
             "and after the balanced schedule, and non-tensor-core instructions per real edge (per head)",
             f"{'workload':14} {'lists':9} {'edges':>8} {'E/tok':>6} {'slots before':>16} {'slots after':>16} "
             f"{'fwd bef':>7} {'fwd':>5} {'(+pro)':>6} {'bwd bef':>7} {'bwd':>5} {'(+pro)':>6} {'lut':>5} path"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        sb, sa = r["slots_before"], r["slots_after"]
        lut = f"{r['lut']:5.0f}" if "lut" in r else "    -"
        lines.append(f"{r['workload']:14} {r['lists']:9} {r['edges']:8d} {r['edges_per_token']:6.1f} "
                     f"{sb['fwd']:4.2f}/{sb['dq']:4.2f}/{sb['dkdv']:4.2f} {sa['fwd']:4.2f}/{sa['dq']:4.2f}/{sa['dkdv']:4.2f} "
                     f"{r['fwd_before']:7.0f} {r['fwd_loop']:5.0f} {r['fwd']:6.0f} {r['bwd_before']:7.0f} "
                     f"{r['bwd_loop']:5.0f} {r['bwd']:6.0f} {lut} {r.get('path', '-')}")
    lines.append("")
    lines += textwrap.wrap(
        "slots: edge slots the kernels walk per real edge (the lockstep loop bounds, a model: before = one "
        "program per BLOCK_E rows of one relation for the forward and per BLOCK_E tokens for dQ and dK/dV, as "
        "long as their longest list; after = BLOCK_E work items sorted longest first). fwd / bwd: main-loop "
        "instructions per slot (SASS, cheapest path) x slots / real edges; before from LOCKSTEP_SLOT_COST (the "
        "kernels as they were at a52447c, same instrument); (+pro) adds each program's prologue and epilogue "
        "once, the merge of split rows (forward) and delta and the sums of split tokens (backward). lut: the "
        "fused LUT kernel on the live 64x64 tiles, forward + backward per real edge (DENSE_ELEMENT_COST per score "
        "element); path: what syntax_window_attention picks on a GPU (edges iff edge slots x EDGE_SLOT_COST <= "
        "lut). A model read from the SASS, not a measurement.", WIDTH)
    return "\n".join(lines)


def _edge_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m syntaxkernels.tools.inspection edges [--arch 90] [--dtype bf16] [--head-dim 64] [--workload a,b]``."""
    import argparse
    import json
    import sys
    import time

    parser = argparse.ArgumentParser(prog="python -m syntaxkernels.tools.inspection edges")
    parser.add_argument("command", choices=["edges"])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--workload", default=",".join(EDGE_WORKLOADS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = [n for n in args.workload.split(",") if n]
    unknown = [n for n in names if n not in EDGE_WORKLOADS]
    if unknown:
        print(f"unknown edge workloads {unknown}; they are {', '.join(EDGE_WORKLOADS)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows = edge_report(names, arch=args.arch, dtype=args.dtype, head_dim=args.head_dim)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; trees: {rows[0]['source'] if rows else '-'}")
    print(format_edge_report(rows, args.arch, args.dtype, args.head_dim))
    print(f"{len(rows)} rows in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":  # python -m syntaxkernels.tools.inspection edges
    from syntaxkernels import _interpreter

    if _interpreter.interpreting():  # the interpreter replaces @triton.jit: compile in a fresh process without it
        import sys

        os.execvpe(sys.executable, [sys.executable, "-m", "syntaxkernels.tools.inspection"] + sys.argv[1:],
                   _interpreter.environment(interpret=False))
    raise SystemExit(_edge_main())
