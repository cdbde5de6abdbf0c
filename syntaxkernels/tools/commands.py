"""The developer commands of ``python -m syntaxkernels``: ``verify``, ``bench`` and ``inspect``.

``syntaxkernels/__main__.py`` defines their arguments and imports this module only when one of them runs; each
function here takes the parsed arguments (``args.argv``: the command line after the program) and returns the
exit code. What they run lives beside this module: :mod:`.checks` (``verify``, ``bench``) and
:mod:`.inspection` with :mod:`.workloads` (``inspect``). Tables are printed by :func:`syntaxkernels._table.table`.
"""
from __future__ import annotations

import sys
import textwrap
import time
from typing import Dict, List, Optional, Sequence

from syntaxkernels import _interpreter
from syntaxkernels._table import WIDTH, cell, table


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


# ------------------------------------------------------------------------------------------------ verify


#: What the bias checks' figures mean, one entry a figure: ``(figure, meaning)``, printed under verify's table
#: (:func:`legend_lines`) when one of them ran.
LEGEND = (
    ("name err/bound", "each tensor a bias check compares, its error and the error allowed; the check passes "
                       "when err <= bound for every tensor"),
    ("err", "the largest |kernel - float64 reference| over that tensor"),
    ("bound", "twice the error of the same computation done by the reference in the kernel's dtype, plus a small "
              "floor"),
    ("out", "the output"),
    ("dq, dk, dv", "the gradients of q, k, v"),
    ("dtable", "the gradient of the distance-bias table"),
    ("dscale", "the gradient of the bias strength c; its bound: twice the error the reference's per-bucket dtable "
               "errors give through sum(table*G), plus 1e-4 of dscale in fp16/bf16, at least the rule above in "
               "fp32"),
    ("[..]", "after dscale: |c*dscale - sum(table*dtable)| / sum|table*dtable|, allowed 1e-5 of the smaller of "
             "that sum and |c| + |sum(table*dtable)|"),
)


def legend_lines(width: int = WIDTH) -> List[str]:
    """:data:`LEGEND` as printed: a heading, then one entry a figure, its meaning wrapped under itself."""
    key_width = max(len(figure) for figure, _ in LEGEND)
    lines = ["Figures of the bias_attention checks:"]
    for figure, meaning in LEGEND:
        wrapped = textwrap.wrap(meaning, width - key_width - 4) or [""]
        lines.append(f"  {figure:<{key_width}}  {wrapped[0]}")
        lines.extend(f"  {'':<{key_width}}  {more}" for more in wrapped[1:])
    return lines


def _verify_progress(index: int, total: int, name: str, row: Optional[dict]) -> None:
    width = len(str(total))
    if row is None:
        print(f"[{index + 1:>{width}}/{total}] {name} ...", end="", file=sys.stderr, flush=True)
    else:
        print(f" {row['status']} ({row['seconds']:.1f} s)", file=sys.stderr, flush=True)


def _print_verify_table(rows: List[dict]) -> None:
    shown = [dict(check=r["check"], status=r["status"], seconds=f"{r['seconds']:.1f}", detail=r["detail"])
             for r in rows]
    for line in table(shown, ["check", "status", "seconds"], right=["seconds"],
                      below=lambda r: _detail_lines(r["detail"], WIDTH - 4)):
        print(line)


def verify(args) -> int:
    """``python -m syntaxkernels verify``: every check of :mod:`.checks` on one device, then their table."""
    device = _resolve_device("verify", args.device)
    if device is None:
        return 2
    if device == "cpu" and not args.no_interpret and not _interpreter.interpreting():
        # The Triton kernels run on CPU only under the interpreter, which must be chosen before triton is
        # imported: run the checks in a fresh process with it on.
        import subprocess

        return subprocess.call([sys.executable, "-m", "syntaxkernels", *args.argv],
                               env=_interpreter.environment(interpret=True))
    from .checks import check_names, run_checks

    mode = ""
    if device == "cpu":
        mode = " (Triton kernels under TRITON_INTERPRET=1)" if _interpreter.interpreting() else \
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
        for line in legend_lines():
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
        data = [r for r in group if not any(r is n for n in notes)]
        columns: List[str] = []
        for r in data:
            columns += [k for k in r if k not in ("bench", "note") and k not in columns]
        # A column that holds one value in every row is a condition of the table (D: 64, family: sm90): printed
        # once above it. Not a figure (a float): a measured 0 in every row stays in the table.
        constant = [c for c in columns if len(data) > 1 and len({cell(r.get(c)) for r in data}) == 1
                    and not any(isinstance(r.get(c), float) for r in data)]
        for c in constant:
            for line in textwrap.wrap(f"{c}: {cell(data[0].get(c))}", WIDTH - 2, subsequent_indent="    ",
                                      break_long_words=False, break_on_hyphens=False):
                print(f"  {line}")
        if data:
            for line in table(data, [c for c in columns if c not in constant], indent="  "):
                print(line)
        table_notes = list(dict.fromkeys(r["note"] for r in data if "note" in r))
        for note in table_notes:
            for line in textwrap.wrap(f"note: {note}", WIDTH - 2):
                print(f"  {line}")
        for r in notes:
            label = f"{r['provider']}: " if r.get("provider") else ""
            what = (f"skipped: {r['skipped']}" if "skipped" in r else f"note: {r['note']}" if "note" in r
                    else f"ERROR: {r['error']}")
            for line in textwrap.wrap(label + what, WIDTH - 2):
                print(f"  {line}")


def bench(args) -> int:
    """``python -m syntaxkernels bench``: the quick benchmarks of :mod:`.checks` on one device, a table each."""
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
    if not _interpreter.interpreting():
        return None
    import subprocess

    return subprocess.call([sys.executable, "-m", "syntaxkernels", *args.argv],
                           env=_interpreter.environment(interpret=False))


def _numbers(option: str, value: str, all_values: Sequence[int]) -> Optional[tuple]:
    if value == "all":
        return tuple(all_values)
    try:
        return tuple(int(a) for a in value.split(",") if a.strip())
    except ValueError:
        print(f"syntaxkernels inspect: {option} takes comma-separated numbers or 'all', got {value!r}",
              file=sys.stderr)
        return None


def _run_inspect_workloads(args, I) -> int:
    import torch
    import triton

    from syntaxkernels import __version__

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
    buckets = None
    relation_names = [n for n in names if n in W.RELATION_WORKLOADS]
    if args.buckets and any(n in W.RELATION_BATCHES for n in relation_names):
        print("syntaxkernels inspect: --buckets does not apply to the relation batches (two-parse, code-r4): the "
              "kernels run their relations' codes (256 buckets)", file=sys.stderr)
        return 2
    if args.buckets:
        from syntaxkernels.specs import BucketSpec

        try:
            parts = [int(x) for x in args.buckets.split(":")]
            if len(parts) not in (1, 2):
                raise ValueError("one or two integers")
            buckets = BucketSpec(parts[0], log_distance=parts[1] if len(parts) == 2 else None)
        except (TypeError, ValueError) as exc:
            print(f"syntaxkernels inspect: --buckets takes MAX_DISTANCE[:LOG_DISTANCE], got {args.buckets!r} ({exc})",
                  file=sys.stderr)
            return 2
    dropout = _dropout_option(args)
    if dropout is None:
        return 2
    kv_heads = int(getattr(args, "kv_heads", 0) or 0)
    if kv_heads and (kv_heads < 0 or I.WORKLOAD_HEADS % kv_heads):
        print(f"syntaxkernels inspect: --kv-heads must divide the layer's {I.WORKLOAD_HEADS} heads, got {kv_heads}",
              file=sys.stderr)
        return 2
    causal = bool(getattr(args, "causal", False))
    band = int(getattr(args, "position_window", -1))
    if band < -1:
        print(f"syntaxkernels inspect: --position-window takes an int >= 0 (or -1: none), got {band}", file=sys.stderr)
        return 2
    window = int(getattr(args, "window", -1))
    if window < -1 or window > 255:
        print(f"syntaxkernels inspect: --window takes an int in 0..255 (or -1: none), got {window}", file=sys.stderr)
        return 2
    ok, position = _position_spec(args, causal)
    if not ok:
        return 2
    start = time.perf_counter()
    used = [W.named_workload(n) for n in names]
    packed = [w.name for w in used if w.packed]
    if (window >= 0 or band >= 0) and packed:
        print(f"syntaxkernels inspect: --window and --position-window apply to padded workloads only, not "
              f"{', '.join(packed)}", file=sys.stderr)
        return 2
    print(f"syntaxkernels inspect: {len(names)} workloads x {', '.join(dtypes)} x D {', '.join(map(str, head_dims))} "
          f"x sm_{', sm_'.join(map(str, archs))}, one layer's forward and backward compiled as launched (no GPU "
          f"needed); one line per case as it finishes", file=sys.stderr, flush=True)
    reports = I.inspect_workloads(names, archs, dtypes, head_dims, processes=args.processes,
                                  progress=lambda line: print("  " + line, file=sys.stderr, flush=True),
                                  buckets=buckets, dropout=dropout, kv_heads=kv_heads, causal=causal, band=band,
                                  position=position, window=window)
    summary = I.workload_summary(reports)
    conditions = (f"python -m syntaxkernels {' '.join(args.argv)}: syntaxkernels {__version__}, triton "
                  f"{triton.__version__}, torch {torch.__version__}, "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                  f"{len(names)} workloads x {', '.join(dtypes)} x D {', '.join(map(str, head_dims))} x "
                  f"sm_{', sm_'.join(map(str, archs))}, one nn.DistanceBias layer (H = "
                  f"{I.WORKLOAD_HEADS}, {buckets or 'BucketSpec()'} table"
                  f"{f' ({buckets.num_buckets} buckets)' if buckets else ''} and strength with their gradients, "
                  f"{f'distance window {window}' if window >= 0 else 'no window'}"
                  f"{f', attention dropout {dropout}' if dropout else ''}"
                  f"{f', {kv_heads} key/value heads (grouped-query)' if kv_heads else ''}"
                  f"{', causal' if causal else ''}{f', positional window {band}' if band >= 0 else ''}"
                  f"{f', T5 relative-position term {position}, scale 1' if position is not None else ''}) compiled as "
                  "launched, no GPU; a cost model read from the SASS"
                  + ("; the relation batches (a RelationBatch of R relations) through DistanceBias(12, their R "
                     "BucketSpecs, relations=R): R tables and R strengths with their gradients, the kernels on the "
                     "relations' one-byte code (CODE_BUCKETS, 256 buckets: the runtime bucket loop, each tile's "
                     "code range walked); the graph batch (a GraphBatch) through the default layer"
                     if relation_names else ""))
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


def _dropout_option(args) -> Optional[float]:
    """``--dropout``'s probability, or None after saying on stderr that it is not in ``[0, 1)``."""
    dropout = float(getattr(args, "dropout", 0.0) or 0.0)
    if not 0.0 <= dropout < 1.0:
        print(f"syntaxkernels inspect: --dropout takes a probability in [0, 1), got {dropout!r}", file=sys.stderr)
        return None
    return dropout


def _position_spec(args, causal: bool):
    """``(ok, RelativePositionSpec or None)`` from ``--position-buckets NUM_BUCKETS:MAX_DISTANCE`` (bidirectional
    unless causal); a bad value is said on stderr (ok False)."""
    if not getattr(args, "position_buckets", ""):
        return True, None
    from ..specs import RelativePositionSpec
    try:
        parts = [int(x) for x in args.position_buckets.split(":")]
        if len(parts) != 2:
            raise ValueError("two integers")
        return True, RelativePositionSpec(parts[0], parts[1], bidirectional=not causal)
    except (TypeError, ValueError) as exc:
        print(f"syntaxkernels inspect: --position-buckets takes NUM_BUCKETS:MAX_DISTANCE, got "
              f"{args.position_buckets!r} ({exc})", file=sys.stderr)
        return False, None


def _tree_workloads(spec: str, default: Sequence[str], option: str) -> Optional[List[str]]:
    """The tree workloads ``--workload`` names (``default`` without one), or None after saying on stderr what is
    wrong (an unknown name; a relation workload, which ``option``'s report does not take)."""
    from . import workloads as W

    try:
        names = W.workload_names(spec) if spec else list(default)
    except ValueError as exc:
        print(f"syntaxkernels inspect: --workload: {exc}", file=sys.stderr)
        return None
    if any(n in W.RELATION_WORKLOADS for n in names):
        print(f"syntaxkernels inspect {option}: takes the tree workloads ({', '.join(W.WORKLOADS)}), not the relation "
              "workloads", file=sys.stderr)
        return None
    return names


def _run_inspect_host(args) -> int:
    """``inspect --host``: host work and device kernels per layer (:mod:`.host`); one arch, dtype and head dim."""
    from . import host as Hs

    archs = _numbers("--arch", args.arch or "90", (80, 86, 89, 90, 100, 120))
    head_dims = _numbers("--head-dim", args.head_dim if args.head_dim != "64,128" else "64", (32, 64, 128))
    if archs is None or head_dims is None:
        return 2
    if len(archs) != 1 or len(head_dims) != 1 or args.dtype not in ("bf16", "fp16", "fp32"):
        print("syntaxkernels inspect --host: one --arch, one --head-dim and one --dtype a run", file=sys.stderr)
        return 2
    names = _tree_workloads(args.workload, Hs.HOST_WORKLOADS, "--host")
    if names is None:
        return 2
    print(f"syntaxkernels inspect --host: {len(names)} workloads, launches compiled for sm_{archs[0]} (the first "
          "call of each kernel compiles: a minute or so)", file=sys.stderr, flush=True)
    ok, position = _position_spec(args, False)
    if not ok:
        return 2
    dropout = _dropout_option(args)
    if dropout is None:
        return 2
    rows = Hs.host_report(names, arch=archs[0], dtype=args.dtype, head_dim=head_dims[0], position=position,
                          dropout=dropout)
    print(Hs.format_host_report(rows))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


#: The workloads ``inspect --traffic`` models by default: every backward path (one tile, two blocks, tiled, packed).
TRAFFIC_WORKLOADS = ("sentences", "pairs", "finetune-128", "finetune-512", "odd-77", "sentences-packed", "long-4096")


def _run_inspect_traffic(args) -> int:
    """``inspect --traffic``: the backward's bytes per valid pair and head (:mod:`.traffic`), nothing compiled."""
    from . import traffic as Tr
    from . import workloads as W

    archs = _numbers("--arch", args.arch or "90", (80, 86, 89, 90, 100, 120))
    head_dims = _numbers("--head-dim", args.head_dim, (32, 64, 128))
    if archs is None or head_dims is None:
        return 2
    dtypes = [d.strip() for d in args.dtype.split(",")]
    if len(archs) != 1 or any(d not in ("bf16", "fp16", "fp32") for d in dtypes):
        print("syntaxkernels inspect --traffic: one --arch; --dtype of bf16, fp16, fp32", file=sys.stderr)
        return 2
    names = _tree_workloads(args.workload, TRAFFIC_WORKLOADS, "--traffic")
    if names is None:
        return 2
    rows = []
    for name in names:
        workload = W.named_workload(name)
        for dtype in dtypes:
            for head_dim in head_dims:
                row = Tr.backward_traffic(workload, head_dim=head_dim, dtype=dtype, arch=archs[0],
                                          causal=args.causal)
                row.update(workload=name if dtype == "bf16" else f"{name} {dtype}", head_dim=head_dim)
                rows.append(row)
    print(f"sm_{archs[0]}'s tiles, {'causal' if args.causal else 'not causal'}; {W.sentence_source()[1]}")
    print(Tr.format_traffic(rows))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


def inspect(args) -> int:
    """``python -m syntaxkernels inspect``: the launch cases, the named workloads (``--workload``) or the edge-list
    kernels (``--edges``) compiled as launched, and the cost model's report."""
    code = _reexec_without_interpreter(args)
    if code is not None:  # the interpreter replaces @triton.jit: compile in a fresh process without it
        return code
    from . import inspection as I

    if args.edges:
        return _run_inspect_edges(args, I)
    if getattr(args, "host", False):
        return _run_inspect_host(args)
    if getattr(args, "traffic", False):
        return _run_inspect_traffic(args)
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


