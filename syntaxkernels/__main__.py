"""Command line: ``python -m syntaxkernels {info,verify,bench,inspect,show}``.

Each command is one entry of ``COMMANDS`` (a subparser with its own arguments and a ``run(args) -> exit code``
function); :func:`add_command` adds another. torch and Triton are imported inside the commands, never at the
top of this module, so ``--help`` and argument errors answer without loading them.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

#: Width every table of this command line fits in.
WIDTH = 100

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: Dict[str, Command] = {}


def add_command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int]) -> None:
    """Register ``python -m syntaxkernels <name>``: ``add_arguments(parser)`` fills its subparser and
    ``run(args)`` returns the exit code. ``args.argv`` holds the command line's arguments (after the program)."""
    COMMANDS[name] = Command(help, add_arguments, run)


# ------------------------------------------------------------------------------------------------ helpers


def _device_argument(value: str) -> str:
    if not _DEVICE.match(value):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {value!r}")
    return value


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=_device_argument, default=None,
                        help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")


def _resolve_device(command: str, requested: Optional[str]) -> Optional[str]:
    """The device to use, or None after printing one line saying why the requested one cannot be used."""
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            why = ("this torch is a CPU build" if torch.version.cuda is None
                   else f"torch {torch.__version__} sees no CUDA GPU")
            print(f"syntaxkernels {command}: --device {requested}, but CUDA is not available here ({why}).",
                  file=sys.stderr)
            return None
        index = int(requested.split(":")[1]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            print(f"syntaxkernels {command}: --device {requested}, but only {torch.cuda.device_count()} CUDA "
                  "device(s) are visible.", file=sys.stderr)
            return None
    return requested


def _pack(items: Sequence[str], width: int) -> List[str]:
    """Items (", "-separated pieces of a detail) packed into lines of at most ``width`` characters; an item is
    split (at spaces) only when it alone is longer than a line, so figures are never cut."""
    lines: List[str] = []
    current = ""
    for item in items:
        candidate = f"{current}, {item}" if current else item
        if len(candidate) <= width:
            current = candidate
            continue
        if current:
            lines.append(current + ",")
        if len(item) <= width:
            current = item
        else:
            wrapped = textwrap.wrap(item, width, break_long_words=False, break_on_hyphens=False) or [""]
            lines.extend(wrapped[:-1])
            current = wrapped[-1]
    if current:
        lines.append(current)
    return lines


def _detail_lines(detail: str, width: int) -> List[str]:
    first = detail.splitlines()[0] if detail else ""
    return _pack([p for p in first.split(", ") if p], width)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _table(rows: List[Dict], columns: List[str], indent: str = "") -> List[str]:
    """A plain text table; a column is cut to what is left of :data:`WIDTH` only as a last resort."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    overflow = len(indent) + sum(widths) + 2 * (len(widths) - 1) - WIDTH
    if overflow > 0:  # shrink the widest column
        widest = max(range(len(widths)), key=widths.__getitem__)
        widths[widest] = max(8, widths[widest] - overflow)
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             indent + "  ".join("-" * w for w in widths)]
    for row in cells:
        shown = [v if len(v) <= w else v[: w - 1] + "~" for v, w in zip(row, widths)]
        lines.append(indent + "  ".join(v.ljust(w) for v, w in zip(shown, widths)).rstrip())
    return lines


# ------------------------------------------------------------------------------------------------ info


def _first_line(command: List[str], last: bool = False, containing: str = "") -> Optional[str]:
    """The first (or last) line of a command's output that contains ``containing``; None if it does not run."""
    import subprocess

    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in (out.stdout or out.stderr).splitlines() if containing in line and line.strip()]
    if out.returncode != 0 or not lines:
        return None
    return lines[-1] if last else lines[0]


def _cpu_description() -> str:
    import platform

    name = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    count = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else count
    return f"{name} ({platform.machine()}, {count} logical cores, {usable} usable)"


def _os_description() -> str:
    import platform

    system = f"{platform.system()} {platform.release()}"
    try:
        with open("/etc/os-release") as f:
            fields = dict(line.rstrip().split("=", 1) for line in f if "=" in line)
        system = f"{fields.get('PRETTY_NAME', '').strip(chr(34))} ({system})"
    except OSError:
        pass
    libc = " ".join(platform.libc_ver()).strip()
    return f"{system}{', ' + libc if libc else ''}"


def _version(module: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed"


def _backends(torch, cuda: bool) -> List[tuple]:
    """(what, on CPU tensors, on CUDA tensors) for the tree builder and every public fused op, backend="auto": what
    each op's own ``implementation`` says it runs (``ops.IMPLEMENTATION``) for a typical input (D = 64; float32 on
    CPU, with what float64 runs where it differs; bfloat16 on CUDA)."""
    from . import _ext, ops
    from .ops._dispatch import triton_status, triton_unsupported

    names = {"triton": "Triton kernels", "reference": "PyTorch reference", "cpp": "C++ kernels"}
    no_cuda = "n/a (no CUDA here)"
    rows = []
    if _ext.available():
        cpu_builder = f"C++ builder ({torch.get_num_threads()} threads)"
    else:
        cpu_builder = "NumPy fallback (no C++ extension)"
    if not cuda:
        gpu_builder = no_cuda
    elif _ext.has_cuda_builder():
        gpu_builder = "CUDA builder"
    else:
        gpu_builder = "C++ builder after a copy (no CUDA builder)"
    rows.append(("tree_distance / TreeBatch", cpu_builder, gpu_builder))
    on_cpu_probe = torch.empty(1, 1, 1, 64)
    for name in ops.__all__:
        implementation = ops.IMPLEMENTATION[name]
        on_cpu = names[implementation(on_cpu_probe, on_cpu_probe)]
        float64 = implementation(on_cpu_probe.double(), on_cpu_probe.double())
        if names[float64] != on_cpu:
            on_cpu += f" (float64: {float64})"
        on_gpu = no_cuda
        if cuda:
            probe = torch.empty(1, 1, 1, 64, dtype=torch.bfloat16, device="cuda")
            on_gpu = names[implementation(probe, probe)]
            if triton_status() != "ok":
                on_gpu += " (no Triton)"
            elif on_gpu == names["reference"] and triton_unsupported(probe, probe):  # e.g. a T4 (sm_75): say why
                major, minor = torch.cuda.get_device_capability()
                on_gpu += f" (sm_{major}{minor}: the kernels need sm_80+)"
        rows.append((name, on_cpu, on_gpu))
    return rows


def _run_info(args) -> int:
    import platform
    import shutil

    import torch

    from . import __version__, _ext, data
    from .ops._dispatch import triton_status

    cuda = torch.cuda.is_available()
    cxx = os.environ.get("CXX") or "c++"
    lines = [
        ("syntaxkernels", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        ("OS", _os_description()),
        ("CPU", _cpu_description()),
        ("C++ compiler", f"{_first_line([cxx, '--version']) or 'not found'} ({cxx})"),
        ("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'}, "
                  f"{torch.get_num_threads()} threads)"),
        ("triton", f"{_version('triton')} ({triton_status()})"),
        ("numpy", _version("numpy")),
        ("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset")),
        ("C++ extension", _ext.status()),
    ]
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                    if os.environ.get("CUDA_HOME") else None)
    nvcc_version = _first_line([nvcc, "--version"], last=True, containing="release") if nvcc else None
    lines.append(("nvcc", f"{nvcc_version or 'does not run'} ({nvcc})" if nvcc else "not found"))
    if cuda:
        driver = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        lines.append(("CUDA", f"runtime {torch.version.cuda}, driver {driver or 'unknown (no nvidia-smi)'}"))
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append((f"cuda:{i}", f"{props.name}, sm_{props.major}{props.minor}, "
                                       f"{props.total_memory >> 20} MiB, {props.multi_processor_count} SMs"))
    else:
        lines.append(("CUDA", "not available" + (" (CPU build of torch)" if torch.version.cuda is None else "")))
    path = data.treebank_path()
    lines.append(("treebank", f"{data.ENV_VAR} unset (treebank tests skip)" if path is None else
                  f"{path} ({'found' if path.is_file() else 'absent'})"))
    optional = ("scipy", "networkx", "transformers", "tokenizers", "stanza", "hypothesis")
    lines.append(("optional", ", ".join(f"{m} {_version(m)}" for m in optional)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        wrapped = textwrap.wrap(value, WIDTH - width - 2, break_long_words=False, break_on_hyphens=False) or [""]
        print(f"{key:<{width}}  {wrapped[0]}")
        for more in wrapped[1:]:
            print(f"{'':<{width}}    {more}")
    print()
    print('What runs here (backend="auto"):')
    rows = [{"op": w, "CPU tensors": c, "CUDA tensors": g} for w, c, g in _backends(torch, cuda)]
    for line in _table(rows, ["op", "CPU tensors", "CUDA tensors"], indent="  "):
        print(line)
    if triton_status() == "ok":
        print("  backend='triton' runs the kernels on CPU tensors too when TRITON_INTERPRET=1 is set.")
    else:
        print(f"  Triton: {triton_status()}")
    return 0


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    return None


# ------------------------------------------------------------------------------------------------ verify


LEGEND = ("Figures: 'name err/bound' = the largest |kernel - float64 reference| over that tensor / the error "
          "allowed (twice the error of the same computation done by the reference in the kernel's dtype, plus "
          "a small floor); a check passes when err <= bound for every tensor. out = output; dq, dk, dv, dtable, "
          "dscale = gradients of q, k, v, the distance-bias table and the bias strength c (its bound is the "
          "dtable bound carried through sum(table*G), and [..] is the relative mismatch of c*dscale against "
          "sum(table*dtable), which must be below 1e-3).")


def _verify_progress(index: int, total: int, name: str, row: Optional[dict]) -> None:
    width = len(str(total))
    if row is None:
        print(f"[{index + 1:>{width}}/{total}] {name} ...", end="", file=sys.stderr, flush=True)
    else:
        print(f" {row['status']} ({row['seconds']:.1f} s)", file=sys.stderr, flush=True)


def _print_verify_table(rows: List[dict]) -> None:
    name_width = min(max([5] + [len(r["check"]) for r in rows]), WIDTH - 20)
    print(f"{'check':<{name_width}}  status  {'seconds':>7}")
    print(f"{'-' * name_width}  ------  -------")
    for r in rows:
        name = r["check"] if len(r["check"]) <= name_width else r["check"][: name_width - 1] + "~"
        print(f"{name:<{name_width}}  {r['status']:<6}  {r['seconds']:>7.1f}")
        for line in _detail_lines(r["detail"], WIDTH - 4):
            print(f"    {line}")


def _run_verify(args) -> int:
    device = _resolve_device("verify", args.device)
    if device is None:
        return 2
    from ._interpreter import interpreting

    if device == "cpu" and not args.no_interpret and not interpreting():
        # The Triton kernels run on CPU only under the interpreter, which must be chosen before triton is
        # imported: run the checks in a fresh process with it on.
        import subprocess

        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.call([sys.executable, "-m", "syntaxkernels", *args.argv], env=env)
    from .checks import check_names, run_checks

    mode = ""
    if device == "cpu":
        mode = " (Triton kernels under TRITON_INTERPRET=1)" if interpreting() else \
            " (Triton kernels skipped: --no-interpret)"
    print(f"syntaxkernels verify on {device}{mode}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    rows = run_checks(device, args.select, progress=_verify_progress)
    if not rows:
        names = check_names()
        print(f"syntaxkernels verify: no check matches --select {args.select!r}. The checks are:\n  "
              + "\n  ".join(names), file=sys.stderr)
        return 2
    print()
    _print_verify_table(rows)
    failed = [r for r in rows if r["status"] == "FAIL"]
    passed = sum(r["status"] == "pass" for r in rows)
    skipped = sum(r["status"] == "skip" for r in rows)
    if any(r["check"].startswith("bias_attention") and r["status"] != "skip" for r in rows):
        print()  # the legend explains the bias checks' figures: only when one of them ran
        for line in textwrap.wrap(LEGEND, WIDTH):
            print(line)
    for r in failed:
        print(f"\nFAIL {r['check']}:\n{r['detail']}", file=sys.stderr)
    print(f"\n{passed} passed, {len(failed)} failed, {skipped} skipped on {device}{mode} in "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(dict(device=device, results=rows), f, indent=1)
    return 1 if failed or passed == 0 else 0


def _verify_arguments(parser: argparse.ArgumentParser) -> None:
    _add_device(parser)
    parser.add_argument("--select", default="", help="only checks whose name contains this (case-insensitive)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--no-interpret", action="store_true",
                        help="on CPU, do not run the Triton kernels under TRITON_INTERPRET=1 (they are then skipped)")


# ------------------------------------------------------------------------------------------------ bench


def _print_bench(rows: List[dict]) -> None:
    groups: Dict[str, List[dict]] = {}
    for r in rows:
        groups.setdefault(r["bench"], []).append(r)
    for name, group in groups.items():
        print(f"\n{name}")
        # A row is a note when it has nothing else to show; a data row's own note is printed once, under the table.
        notes = [r for r in group if "skipped" in r or "error" in r
                 or ("note" in r and not set(r) - {"bench", "provider", "note"})]
        table = [r for r in group if not any(r is n for n in notes)]
        columns: List[str] = []
        for r in table:
            columns += [k for k in r if k not in ("bench", "note") and k not in columns]
        constant = [c for c in columns if len(table) > 1 and len({_fmt(r.get(c)) for r in table}) == 1]
        for c in constant:
            for line in textwrap.wrap(f"{c}: {_fmt(table[0].get(c))}", WIDTH - 2, subsequent_indent="    ",
                                      break_long_words=False, break_on_hyphens=False):
                print(f"  {line}")
        if table:
            for line in _table(table, [c for c in columns if c not in constant], indent="  "):
                print(line)
        table_notes = list(dict.fromkeys(r["note"] for r in table if "note" in r))
        for note in table_notes:
            for line in textwrap.wrap(f"note: {note}", WIDTH - 2):
                print(f"  {line}")
        for r in notes:
            label = f"{r['provider']}: " if r.get("provider") else ""
            what = (f"skipped: {r['skipped']}" if "skipped" in r else f"note: {r['note']}" if "note" in r
                    else f"ERROR: {r['error']}")
            for line in textwrap.wrap(label + what, WIDTH - 2):
                print(f"  {line}")


def _run_bench(args) -> int:
    device = _resolve_device("bench", args.device)
    if device is None:
        return 2
    import torch

    from .checks import bench_names, run_benches

    print(f"syntaxkernels bench on {device} ({'full' if args.full else 'quick'})", flush=True)
    rows = run_benches(device, quick=not args.full, select=args.select)
    if not rows:
        print(f"syntaxkernels bench: no benchmark matches --select {args.select!r}. The benchmarks are:\n  "
              + "\n  ".join(bench_names()), file=sys.stderr)
        return 2
    _print_bench(rows)
    errors = [r for r in rows if "error" in r]
    skipped = [r for r in rows if "skipped" in r]
    notes = [r for r in rows if "note" in r and not set(r) - {"bench", "provider", "note"}]  # as _print_bench
    print(f"\n{len(rows) - len(errors) - len(skipped) - len(notes)} rows, {len(skipped)} skipped, {len(errors)} errors")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(dict(device=device, torch=torch.__version__, rows=rows), f, indent=1)
    return 1 if errors else 0


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    _add_device(parser)
    parser.add_argument("--select", default="", help="only benchmarks whose name contains this (case-insensitive)")
    parser.add_argument("--full", action="store_true", help="larger sizes (default: a quick run)")
    parser.add_argument("--json", default=None, help="write the rows as JSON to this file")


add_command("info", "versions, OS, CPU, compiler, CUDA and driver, and which backend each op uses here",
            _info_arguments, _run_info)
add_command("verify", "every op against its reference on this device; non-zero exit on a mismatch",
            _verify_arguments, _run_verify)
add_command("bench", "the quick benchmarks available on this machine (optional dependencies skip their rows)",
            _bench_arguments, _run_bench)


# ------------------------------------------------------------------------------------------------ inspect

INSPECT_LEGEND = (
    "other: non-tensor-core instructions per score element on the main loop's cheapest path (what every tile "
    "executes); all: the same counting every branch of the loop; ex2: MUFU.EX2 per element; plain: 'other' of "
    "the same kernel compiled without the distance bias and masks (SYNTAX=False), x = other / plain; worst: "
    "the largest 'all' over every loop holding tensor-core instructions; a/w/n: async copies (cp.async/TMA) in "
    "the main loop, wgmma on sm_90, loops nested in it. A model of cost read from the SASS of each kernel "
    "compiled as a real launch specialises it, not a measurement: an SM issues ~128 thread-instructions per "
    "clock, its tensor cores finish ~16 bf16 score elements per clock at D = 64 (8 at D = 128), its MUFU ~16 "
    "ex2 per clock; a loop is bounded near min(128 / other, 16 / ex2, tensor cores) elements per clock."
)


def _reexec_without_interpreter(args) -> Optional[int]:
    from ._interpreter import interpreting

    if not interpreting():
        return None
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.call([sys.executable, "-m", "syntaxkernels", *args.argv], env=env)


def _numbers(option: str, value: str, all_values: Sequence[int]) -> Optional[tuple]:
    if value == "all":
        return tuple(all_values)
    try:
        return tuple(int(a) for a in value.split(",") if a.strip())
    except ValueError:
        print(f"syntaxkernels inspect: {option} takes comma-separated numbers or 'all', got {value!r}",
              file=sys.stderr)
        return None


def _package_version() -> str:
    from . import __version__

    return __version__


def _run_inspect_workloads(args, I) -> int:
    from . import workloads as W

    try:
        names = W.workload_names(args.workload)
    except ValueError as exc:
        print(f"syntaxkernels inspect: --workload: {exc}", file=sys.stderr)
        return 2
    archs = _numbers("--arch", args.arch or "all", I.ALL_ARCHS)
    head_dims = _numbers("--head-dim", args.head_dim, (32, 64, 128))
    dtypes = tuple(d for d in args.dtype.split(",") if d)
    if archs is None or head_dims is None:
        return 2
    if not set(dtypes) <= {"bf16", "fp16", "fp32"}:
        print(f"syntaxkernels inspect: --dtype takes bf16, fp16, fp32 (comma-separated), got {args.dtype!r}",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    used = [W.named_workload(n) for n in names]
    print(f"syntaxkernels inspect: {len(names)} workloads x {', '.join(dtypes)} x D {', '.join(map(str, head_dims))} "
          f"x sm_{', sm_'.join(map(str, archs))}, one layer's forward and backward compiled as launched (no GPU "
          f"needed); one line per case as it finishes", file=sys.stderr, flush=True)
    reports = I.inspect_workloads(names, archs, dtypes, head_dims, processes=args.processes,
                                  progress=lambda line: print("  " + line, file=sys.stderr, flush=True))
    summary = I.workload_summary(reports)
    conditions = (f"python -m syntaxkernels {' '.join(args.argv)}: syntaxkernels {_package_version()}, triton "
                  f"{_version('triton')}, torch {_version('torch')}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                  f"{len(names)} workloads x {', '.join(dtypes)} x D {', '.join(map(str, head_dims))} x "
                  f"sm_{', sm_'.join(map(str, archs))}, one nn.DistanceBias layer (H = "
                  f"{I.WORKLOAD_HEADS}, BucketSpec() table and strength with their gradients, no window) compiled as launched, no GPU; a cost model read from the SASS")
    for line in textwrap.wrap(conditions, WIDTH):
        print(line)
    print()
    print(I.format_workload_summary(summary, used))
    print()
    print(I.format_workload_reports(reports))
    problems = I.workload_problems(reports)
    print()
    for arch in I.workload_unsupported(reports):
        print(f"sm_{arch}: no Triton configs (by design: backend='auto' runs the reference there, 'triton' raises "
              "a ValueError); not counted as a problem")
    if problems:
        print(f"{len(problems)} problems (every one is listed; figures above are for the kernels that compiled):")
        for p in problems:
            for line in textwrap.wrap(p, WIDTH - 2, subsequent_indent="    "):
                print(f"  {line}")
    else:
        compiled = sum(1 for r in reports if not r.error)
        print(f"all {compiled} kernels of the families with Triton configs compiled, none spills, and each fits "
              "its family's shared memory")
    print(f"{len(reports)} kernels in {time.perf_counter() - start:.0f} s")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(dict(workloads=[dict(name=w.name, N=w.N, lengths=w.lengths, source=w.source,
                                           description=w.description) for w in used],
                           summary=summary, reports=[r.as_dict() for r in reports], problems=problems), f, indent=1)
    return 1 if problems else 0


def _run_inspect_edges(args, I) -> int:
    """``inspect --edges``: the edge-list kernels on real batches (slots per real edge, instructions per real edge,
    the window's path by the cost model); one arch, dtype and head dim a run."""
    archs = _numbers("--arch", args.arch or "90", I.ALL_ARCHS)
    head_dims = _numbers("--head-dim", args.head_dim if args.head_dim != "64,128" else "64", (32, 64, 128))
    if archs is None or head_dims is None:
        return 2
    if len(archs) != 1 or len(head_dims) != 1 or args.dtype not in ("bf16", "fp16", "fp32"):
        print("syntaxkernels inspect --edges: one --arch, one --head-dim and one --dtype a run", file=sys.stderr)
        return 2
    argv = ["edges", "--arch", str(archs[0]), "--dtype", args.dtype, "--head-dim", str(head_dims[0])]
    if args.workload:
        argv += ["--workload", args.workload]
    if args.json:
        argv += ["--json", args.json]
    return I._edge_main(argv)


def _run_inspect(args) -> int:
    code = _reexec_without_interpreter(args)
    if code is not None:  # the interpreter replaces @triton.jit: compile in a fresh process without it
        return code
    from . import inspection as I

    if args.edges:
        return _run_inspect_edges(args, I)
    if args.workload:
        return _run_inspect_workloads(args, I)
    archs = _numbers("--arch", args.arch or "80,90", I.ALL_ARCHS)
    if archs is None:
        return 2
    cases = I.launch_cases(args.select)
    if not cases:
        names = sorted({f"{c.op} {c.name}" for c in I.launch_cases()})
        print(f"syntaxkernels inspect: no launch case matches --select {args.select!r}. The cases are:\n  "
              + "\n  ".join(names), file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(f"syntaxkernels inspect: {len(cases)} launch cases x sm_{', sm_'.join(map(str, archs))}, compiled as "
          f"launched (no GPU needed); one line per case as it finishes", file=sys.stderr, flush=True)
    reports = I.inspect_kernels(archs, args.select, processes=args.processes, plain=not args.no_plain,
                                progress=lambda line: print("  " + line, file=sys.stderr, flush=True))
    print(I.format_reports(reports))
    print()
    for line in textwrap.wrap(INSPECT_LEGEND, WIDTH):
        print(line)
    tiles = None
    if args.tiles:
        tiles = I.table_gradient_summary(reports)
        if tiles:
            print()
            print(tiles["text"])
    problems = I.check_targets(reports, cases)
    known = I.known_limitations(reports)
    if known:
        print()
        print("known limitations (not counted as problems; see docs/kernels.md):")
        for line in known:
            print(f"  {line}")
    print()
    if problems:
        print(f"{len(problems)} problems:")
        for p in problems:
            print(f"  {p}")
    print(I.verdict(reports, problems, known))
    print(f"{len(reports)} kernels in {time.perf_counter() - start:.0f} s")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(dict(reports=[r.as_dict() for r in reports], problems=problems,
                           tiles=None if tiles is None else tiles["rows"]), f, indent=1)
    return 1 if problems else 0


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None,
                        help="GPU architectures to compile for, comma-separated or 'all' (75,80,86,89,90,100,120); "
                             "default: 80,90 for the launch cases, all with --workload")
    parser.add_argument("--workload", default="",
                        help="inspect these named workloads instead of the N = 1024 launch cases (comma-separated: "
                             "sentences, pairs, finetune-128, finetune-512, packed, long-4096, long-8192, odd-77, "
                             "odd-1000; groups long, odd, finetune, all); built from the treebank "
                             "($SYNTAXKERNELS_UD) or, without it, generated trees")
    parser.add_argument("--dtype", default="bf16", help="with --workload: dtypes, comma-separated (default bf16)")
    parser.add_argument("--head-dim", default="64,128", help="with --workload: head dims (default 64,128)")
    parser.add_argument("--select", default="", help="only launch cases whose 'op name' contains this")
    parser.add_argument("--processes", type=int, default=2, help="compiler processes (default: 2)")
    parser.add_argument("--no-plain", action="store_true", help="skip the SYNTAX=False twins (faster)")
    parser.add_argument("--tiles", action="store_true",
                        help="also how often the table gradient's extra work runs on treebank trees, and the "
                             "weighted cost per element (needs the treebank, see SYNTAXKERNELS_UD)")
    parser.add_argument("--edges", action="store_true",
                        help="the edge-list kernels on real batches instead: slots and instructions per real edge "
                             "(one --arch, default 90; one --head-dim, default 64; --workload: edge workloads "
                             "packed-4x1024, cls-4x1024, sentences, pairs, packed, long-4096, odd-1000)")
    parser.add_argument("--json", default=None, help="write every report as JSON to this file")


add_command("inspect", "compile every fused kernel as launched for GPUs this machine lacks (sm_80/sm_90, or every "
                       "family on named workloads) and report its cost model",
            _inspect_arguments, _run_inspect)


# ------------------------------------------------------------------------------------------------ show


def _show_batch(args, source: str):
    """Keyword arguments of one forward on the first ``--sentences`` sentences of ``--conllu``."""
    from pathlib import Path

    if not Path(source).is_dir():
        raise ValueError("--conllu needs a save_pretrained directory as the source (its model is run on the "
                         "sentences); for other models call syntaxkernels.show.plot_learned(model, batch=...)")
    import json

    from transformers import AutoTokenizer

    from .trees import TreeCollator, read_conllu

    tokenizer_dir = args.tokenizer or source
    if args.tokenizer is None and not any((Path(source) / f).is_file()
                                          for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{source} holds no tokenizer: pass --tokenizer DIR (a local fast tokenizer, e.g. saved "
                         "with tokenizer.save_pretrained next to the model)")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sentences = read_conllu(args.conllu)[: args.sentences]
    if not sentences:
        raise ValueError(f"{args.conllu} holds no sentence")
    collated = TreeCollator(tokenizer=tokenizer, max_length=args.max_length)(sentences)
    batch = {k: collated[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in collated}
    batch["syntax_trees"] = collated["trees"]
    with open(Path(source) / "config.json", encoding="utf-8") as f:
        method = (json.load(f).get("syntax_attention") or {}).get("method")
    if method == "gat":
        from .integrations.upos import token_pos_ids

        batch["syntax_pos"] = token_pos_ids(sentences, collated["word_ids"], width=collated["input_ids"].shape[1])
    return batch


def _run_show(args) -> int:
    try:
        import matplotlib
    except ModuleNotFoundError:
        print("syntaxkernels show: needs matplotlib, which is not installed: pip install matplotlib "
              "(or install syntaxkernels with its [plot] extra)", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    from .show import plot_learned
    from .specs import BucketSpec

    try:
        buckets = None
        if args.max_distance is not None or args.log_distance is not None or args.no_unreachable_bucket:
            buckets = BucketSpec(max_distance=args.max_distance if args.max_distance is not None else 10,
                                 log_distance=args.log_distance, unreachable_bucket=not args.no_unreachable_bucket)
        batch = _show_batch(args, args.source) if args.conllu else None
        learned, figure = plot_learned(args.source, args.out, buckets=buckets, batch=batch,
                                       trusted=args.trust_pickle, columns=args.columns)
    except (ValueError, TypeError, ImportError, OSError) as exc:
        print(f"syntaxkernels show: {exc}", file=sys.stderr)
        return 2
    import matplotlib.pyplot as plt

    plt.close(figure)
    print(learned.summary())
    print(f"wrote {args.out}")
    if args.json:
        import json

        def plain(value):
            if hasattr(value, "tolist"):
                return value.tolist()
            if hasattr(value, "__dataclass_fields__"):
                return {k: plain(getattr(value, k)) for k in value.__dataclass_fields__}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value if isinstance(value, (int, float, str, type(None))) else str(value)

        with open(args.json, "w") as f:
            json.dump(plain(learned), f, indent=1)
    return 0


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a directory saved by save_pretrained after enable_syntax_attention, a "
                                       "*.safetensors file, or a torch.save'd state dict / checkpoint dict")
    parser.add_argument("--out", default="learned_syntax.png", help="image to write (default: learned_syntax.png)")
    parser.add_argument("--conllu", default=None, help="also run the model (a directory) on these sentences: "
                                                        "attention by tree distance, topical mixing weights")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer for --conllu (default: the source directory)")
    parser.add_argument("--sentences", type=int, default=32, help="sentences of --conllu to use (default: 32)")
    parser.add_argument("--max-length", type=int, default=128, help="truncate --conllu sentences to this many tokens")
    parser.add_argument("--max-distance", type=int, default=None, help="BucketSpec of a state dict (default: inferred)")
    parser.add_argument("--log-distance", type=int, default=None, help="BucketSpec.log_distance of a state dict")
    parser.add_argument("--no-unreachable-bucket", action="store_true", help="BucketSpec(unreachable_bucket=False)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow a file that holds a pickled module (unpickling runs code: trusted files only)")
    parser.add_argument("--columns", type=int, default=3, help="panels per row (default: 3)")
    parser.add_argument("--json", default=None, help="also write the plotted values as JSON to this file")


add_command("show", "plot what a syntax model learned (bias per tree distance per layer, bias scale, topical mixing)",
            _show_arguments, _run_show)


# ------------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m syntaxkernels",
                                     description="syntaxkernels: syntax-tree-aware attention for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
