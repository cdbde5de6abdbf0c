"""The README's examples run as written, so the quickstart cannot go stale.

Every fenced ``python`` block of README.md runs in a fresh namespace, in a temporary working directory
(a block that uses transformers, spaCy or matplotlib is skipped when that package is not installed). Every
``python -m syntaxkernels ...`` command the README shows must parse with the real command line, and the
settings it documents must be the ones the code reads.
"""
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")


def _blocks(language):
    """``(first line number, code)`` of every fenced block of ``language``."""
    out = []
    for match in re.finditer(r"^```" + language + r"\n(.*?)^```", TEXT, re.S | re.M):
        out.append((TEXT[: match.start()].count("\n") + 2, match.group(1)))
    return out


PYTHON_BLOCKS = _blocks("python")


def test_readme_has_python_examples():
    assert len(PYTHON_BLOCKS) >= 2, "the quickstart and the transformers example"


@pytest.mark.parametrize("line, code", PYTHON_BLOCKS, ids=[f"line{line}" for line, _ in PYTHON_BLOCKS])
def test_python_block_runs(line, code, tmp_path, monkeypatch, one_thread):
    for module in ("transformers", "spacy", "matplotlib"):  # optional packages a block may need
        if re.search(rf"^\s*(from|import) {module}\b", code, re.M) or (module == "matplotlib"
                                                                       and "plot_learned(" in code):
            pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"readme_line{line}"}
    exec(compile(code, f"README.md (block at line {line})", "exec"), namespace)


def _cli_commands():
    """Argument lists of every ``python -m syntaxkernels ...`` the README shows ("a / b / c" lists expand)."""
    commands = []
    for match in re.finditer(r"python -m syntaxkernels ([^`\n&|;)]*)", TEXT):
        text = match.group(1).strip()
        for part in text.split(" / "):
            args = shlex.split(part)
            if args:
                commands.append(args)
    return commands


def test_readme_cli_commands_parse():
    from syntaxkernels.__main__ import build_parser

    commands = _cli_commands()
    assert {c[0] for c in commands} >= {"info", "verify", "bench"}, commands
    parser = build_parser()
    for args in commands:
        try:
            parser.parse_args(args)
        except SystemExit as exc:  # argparse's way of rejecting
            raise AssertionError(f"README shows `python -m syntaxkernels {' '.join(args)}`, which does not parse") \
                from exc


def test_readme_documents_the_treebank_setting():
    from syntaxkernels import data

    assert f"export {data.ENV_VAR}=" in TEXT
