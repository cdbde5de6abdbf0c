"""The examples of README.md and of every page of docs/ run as written, so they cannot go stale.

Every fenced ``python`` block of README.md and docs/*.md runs alone, in a fresh namespace and a temporary working
directory (a block that uses transformers, spaCy, matplotlib or tree-sitter is skipped when that package is not
installed): a block may not lean on a name another block defined. Every ``python -m syntaxkernels ...`` command
the README shows must parse with the real command line, and the settings it documents must be the ones the code
reads.
"""
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
#: Every document whose examples run: the README and each page of docs/.
DOCUMENTS = [README] + sorted((ROOT / "docs").glob("*.md"))


def _blocks(language, text=TEXT):
    """``(first line number, code)`` of every fenced block of ``language`` in ``text`` (the README by default)."""
    out = []
    for match in re.finditer(r"^```" + language + r"\n(.*?)^```", text, re.S | re.M):
        out.append((text[: match.start()].count("\n") + 2, match.group(1)))
    return out


#: ``(document path relative to the repository, first line, code)`` of every python block of :data:`DOCUMENTS`.
PYTHON_BLOCKS = [(str(path.relative_to(ROOT)), line, code) for path in DOCUMENTS
                 for line, code in _blocks("python", path.read_text(encoding="utf-8"))]


def test_readme_and_docs_have_python_examples():
    documents = {document for document, _, _ in PYTHON_BLOCKS}
    assert sum(document == "README.md" for document, _, _ in PYTHON_BLOCKS) >= 2, "the quickstart, transformers"
    assert {"docs/api.md", "docs/packed.md"} <= documents, documents


@pytest.mark.parametrize("document, line, code", PYTHON_BLOCKS,
                         ids=[f"{document}:line{line}" for document, line, _ in PYTHON_BLOCKS])
@pytest.mark.long_on_cpu
def test_python_block_runs(document, line, code, tmp_path, monkeypatch, one_thread):
    for module in ("transformers", "spacy", "matplotlib", "tree_sitter"):  # optional packages a block may need
        if re.search(rf"^\s*(from|import) {module}\b", code, re.M) or (module == "matplotlib"
                                                                       and "plot_learned(" in code):
            pytest.importorskip(module)
    if "from_tree_sitter(" in code:  # the code source: tree-sitter and the Python grammar
        pytest.importorskip("tree_sitter")
        pytest.importorskip("tree_sitter_python")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"{Path(document).stem}_line{line}"}
    exec(compile(code, f"{document} (block at line {line})", "exec"), namespace)


def test_a_block_that_leans_on_another_fails(tmp_path, monkeypatch, one_thread):
    """The runner gives each block a namespace of its own: a block using a name it does not define fails (as
    docs/packed.md's second block did, without its import)."""
    test_python_block_runs("docs/x.md", 1, "import syntaxkernels as sk\n", tmp_path, monkeypatch, None)
    with pytest.raises(NameError, match="'sk'"):
        test_python_block_runs("docs/x.md", 2, "out = sk.BucketSpec()\n", tmp_path, monkeypatch, None)


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


def test_readme_test_commands_run_everything_and_the_quick_subset():
    """The block CI runs (.ci/run reads the line two below ``<!-- test-command -->``) runs the whole suite; the
    quick subset is a block of its own, selecting the marker conftest.py sets; pyproject.toml registers the marks."""
    lines = TEXT.splitlines()
    ci = lines[lines.index("<!-- test-command -->") + 2]
    assert ci.endswith("python -m pytest python_tests -q") and " -m " not in ci.split("pytest", 1)[1], ci
    assert "python -m pytest python_tests -q -m quick" in [code.strip() for _, code in _blocks("bash")]
    pyproject = (ROOT / "pyproject.toml").read_text()
    for mark in ("slow", "long_on_cpu", "quick"):
        assert re.search(rf'^    "{mark}: ', pyproject, re.M), mark


def test_quick_is_every_test_marked_neither_slow_nor_long_on_cpu():
    import conftest

    class Item:
        def __init__(self, *marks):
            self.marks = list(marks)

        def get_closest_marker(self, name):
            return next((m for m in self.marks if m.name == name), None)

        def add_marker(self, mark):
            self.marks.append(mark.mark)

    items = [Item(), Item(pytest.mark.slow.mark), Item(pytest.mark.long_on_cpu.mark),
             Item(pytest.mark.parametrize("x", [1]).mark)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.get_closest_marker("quick") is not None for item in items] == [True, False, False, True]

