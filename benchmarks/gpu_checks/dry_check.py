"""Dry checks of the GPU suite's steps (benchmarks/gpu_suite.sh), all in one process so that imports are shared.

    python benchmarks/gpu_checks/dry_check.py KIND ARGS...       # check one command line (exit code: 0 = ok)
    python benchmarks/gpu_checks/dry_check.py --batch QUEUE      # check every line of QUEUE

QUEUE holds one step a line, ``NAME<TAB>KIND<TAB>ARGS...`` with tabs between the arguments; each step's output
goes to ``NAME.out`` beside QUEUE and one ``NAME<TAB>EXIT CODE<TAB>SECONDS`` line per step to stdout. Kinds:

- ``script PATH ARGS`` / ``module NAME ARGS``: import the script or module and parse its arguments with its own
  argparse parser, then stop before any work;
- ``pytest ARGS``: collect that selection (files, node ids, options, markers) and check that every
  ``--ignore``/``--deselect`` path (and test name) exists;
- ``program FILE ARGS``: run one of the suite's step programs (benchmarks/gpu_checks/) with ``--dry-run``;
- ``pip ARGS``: pip and setup.py are there.

No GPU is needed or used. Run from the repository root (the suite does).
"""
import argparse, contextlib, io, os, runpy, sys, time


class Parsed(Exception):
    pass


_real_parse_args = argparse.ArgumentParser.parse_args


def _parse_and_stop(self, args=None, namespace=None):
    raise Parsed(_real_parse_args(self, args, namespace))


def check_command(kind, target, argv):
    """Import the script/module and parse ``argv`` with its own argparse parser; stop before any work."""
    argparse.ArgumentParser.parse_args = _parse_and_stop
    saved = sys.argv
    sys.argv = [target, *argv]
    try:
        if kind == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=False)
    except Parsed as parsed:
        print(f"dry run: {target} {' '.join(argv)}: imports and arguments ok -> {vars(parsed.args[0])}")
        return 0
    except SystemExit as exc:
        print(f"dry run: {target} {' '.join(argv)}: exited with {exc.code!r} before its arguments parsed")
        return 2
    finally:
        argparse.ArgumentParser.parse_args = _real_parse_args
        sys.argv = saved
    print(f"dry run: {target} ran to the end without parsing its arguments with argparse")
    return 1


def check_pytest(args):
    problems = []
    for a in args:  # paths pytest would silently accept when stale
        for prefix in ("--ignore=", "--deselect="):
            if a.startswith(prefix):
                path, _, name = a[len(prefix):].partition("::")
                if not os.path.exists(path):
                    problems.append(f"{a}: {path} does not exist")
                elif name and f"def {name.split('[')[0]}(" not in open(path).read():
                    problems.append(f"{a}: {path} has no test {name}")
    for p in problems:
        print(f"dry run: {p}")
    if problems:
        return 1
    import pytest

    code = pytest.main(["--collect-only", "-q", *args])
    print(f"dry run: pytest collection exit code {int(code)}")
    return int(code)


def check_program(path, argv):
    saved = sys.argv
    sys.argv = [path, *argv, "--dry-run"]
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else (print(exc.code) or 1))
    finally:
        sys.argv = saved


def check(kind, args):
    if kind in ("script", "module"):
        return check_command(kind, args[0], args[1:])
    if kind == "pytest":
        return check_pytest(args)
    if kind == "program":
        return check_program(args[0], args[1:])
    if kind == "pip":
        import importlib.util

        ok = importlib.util.find_spec("pip") is not None and os.path.exists("setup.py")
        print(f"dry run: pip {'and setup.py present' if ok else 'or setup.py missing'}; would run pip {' '.join(args)}")
        return 0 if ok else 1
    print(f"dry run: unknown step kind {kind!r}")
    return 1


if sys.argv[1:2] == ["--batch"]:
    queue = sys.argv[2]
    folder = os.path.dirname(queue)
    for line in open(queue):
        name, kind, *args = line.rstrip("\n").split("\t")
        start = time.time()
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                rc = check(kind, args)
            except Exception:  # noqa: BLE001 - the step's problem, reported as its failure
                import traceback

                traceback.print_exc()
                rc = 1
        open(os.path.join(folder, name + ".out"), "w").write(buffer.getvalue())
        print(f"{name}\t{rc}\t{int(time.time() - start)}", flush=True)
else:
    sys.exit(check(sys.argv[1], sys.argv[2:]))
