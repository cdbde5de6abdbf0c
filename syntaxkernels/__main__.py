"""Command line: ``python -m syntaxkernels {info,verify,bench}``."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys


def _info() -> int:
    import torch

    from . import __version__, _ext
    from .ops._dispatch import triton_status

    lines = [
        ("syntaxkernels", __version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
    ]
    try:
        import triton

        lines.append(("triton", f"{triton.__version__} ({triton_status()})"))
    except Exception as exc:  # noqa: BLE001
        lines.append(("triton", f"not available ({exc!r})"))
    lines.append(("C++ extension", _ext.status()))
    lines.append(("CUDA available", str(torch.cuda.is_available())))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append((f"cuda:{i}", f"{props.name}, sm_{props.major}{props.minor}, {props.total_memory >> 20} MiB"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    return 0


def _table(rows, columns):
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def _verify(args) -> int:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.no_interpret and os.environ.get("TRITON_INTERPRET") != "1":
        # The Triton kernels run on CPU only under the interpreter, which must be chosen before triton is
        # imported: run the checks in a fresh process with it on.
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.call([sys.executable, "-m", "syntaxkernels", *sys.argv[1:]], env=env)
    from .checks import run_checks

    rows = run_checks(device, args.select)
    shown = [dict(r, seconds=f"{r['seconds']:.2f}", detail=r["detail"].splitlines()[0][:90] if r["detail"] else "")
             for r in rows]
    print(f"syntaxkernels verify on {device}")
    _table(shown, ["check", "status", "seconds", "detail"])
    failed = [r for r in rows if r["status"] == "FAIL"]
    for r in failed:
        print(f"\nFAIL {r['check']}:\n{r['detail']}", file=sys.stderr)
    passed = sum(r["status"] == "pass" for r in rows)
    skipped = sum(r["status"] == "skip" for r in rows)
    print(f"\n{passed} passed, {len(failed)} failed, {skipped} skipped")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, results=rows), f, indent=1)
    return 1 if failed or passed == 0 else 0


def _bench(args) -> int:
    import torch

    from .checks import run_benches

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = run_benches(device, quick=not args.full, select=args.select)
    columns = []
    for r in rows:
        for key in r:
            if key not in columns:
                columns.append(key)
    print(f"syntaxkernels bench on {device} ({'full' if args.full else 'quick'})")
    _table([{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows], columns)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, torch=torch.__version__, rows=rows), f, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syntaxkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, devices, extension and Triton status")
    p = sub.add_parser("verify", help="every op against its reference on this device; non-zero exit on mismatch")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--select", default="", help="only checks whose name contains this")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--no-interpret", action="store_true",
                   help="on CPU, do not run the Triton kernels under TRITON_INTERPRET=1 (they are then skipped)")
    p = sub.add_parser("bench", help="the benchmarks available on this machine")
    p.add_argument("--device", default=None)
    p.add_argument("--select", default="", help="only benchmarks whose name contains this")
    p.add_argument("--full", action="store_true", help="larger sizes (default: a quick run)")
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    if args.command == "verify":
        return _verify(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
