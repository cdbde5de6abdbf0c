"""What the command line prints for a reader (issue 33, point 7): tables never cut a name, a header or a figure;
bench's workload table means what its note says (``valid`` = valid pairs / (B N^2), computed here from the workloads
themselves) and says why a CPU bench shows an sm_90 cost model; ``inspect --help`` lists every workload; ``info``
lists the optional packages and whether each is installed; ``verify`` names its checks in one style and prints its
legend one figure a line.
"""
import json
import re

import pytest

from syntaxkernels._table import WIDTH, table


def test_table_never_cuts_a_cell_or_a_header():
    """Too wide for its width: headers break after an underscore, text cells wrap at spaces, and every name,
    header and figure is printed whole (before, the widest column was cut with '~')."""
    rows = [dict(workload="sentences-packed", reference_peak_MiB=811.9, fwd_vs_sdpa=1.117, trees="generated "
                 "sentences (treebank absent, packed)"),
            dict(workload="odd-1000", reference_peak_MiB=209.0, fwd_vs_sdpa=0.9896, trees="treebank sentences")]
    columns = ["workload", "reference_peak_MiB", "fwd_vs_sdpa", "trees"]
    lines = table(rows, columns, indent="  ", width=60)
    text = "\n".join(lines)
    assert all(len(line) <= 60 for line in lines), text
    assert "~" not in text
    for value in ("sentences-packed", "odd-1000", "811.9", "1.117", "0.9896", "treebank sentences"):
        assert value in text
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) <= {"-", " "})
    header = lines[:rule]
    starts = [m.start() for m in re.finditer(r"-+", lines[rule])]
    for name, start, end in zip(columns, starts, starts[1:] + [None]):  # each header, read down its column
        assert "".join(line[start:end].strip() for line in header) == name
    assert len(table(rows, columns)) == 4  # wide enough: one line each, as before
    assert table(rows[:1], ["workload"], width=3) == ["workload", "----------------", "sentences-packed"]


@pytest.fixture(scope="module")
def workload_rows():
    from syntaxkernels.tools.checks.bias_attention import bench_workloads

    return bench_workloads("cpu", True)


@pytest.mark.long_on_cpu
def test_bench_workload_valid_column_is_valid_pairs_over_b_n2(workload_rows):
    """valid = (sum of the squared lengths) / (B N^2), from the workloads' own heads: a packed batch's B sequences
    of at most N tokens included (it divided by T^2 there: 0.005 for ~0.37)."""
    from syntaxkernels.tools.workloads import named_workload

    assert {row["workload"] for row in workload_rows} >= {"sentences", "sentences-packed", "packed"}
    for row in workload_rows:
        workload = named_workload(row["workload"])
        lengths = [len(heads) for heads in workload.heads]
        expected = sum(n * n for n in lengths) / (len(lengths) * workload.N ** 2)
        assert row["B"] == len(lengths) and row["N"] == workload.N >= max(lengths)
        assert abs(row["valid"] - expected) <= 5e-4, (row["workload"], row["valid"], expected)
    packed = next(row for row in workload_rows if row["workload"] == "sentences-packed")
    assert packed["valid"] > 0.1


@pytest.mark.long_on_cpu
def test_bench_workload_table_prints_whole_names_and_says_why_sm90(workload_rows, capsys):
    from syntaxkernels.tools.commands import _print_bench

    _print_bench([dict(bench="bias_attention.workloads", **row) for row in workload_rows])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) <= WIDTH for line in lines), out
    assert "~" not in out
    for row in workload_rows:
        assert re.search(rf"^\s+{re.escape(row['workload'])}\s", out, re.M), row["workload"]
    assert not re.search(r"^\s+one: ", out, re.M), "a figure (one) printed as a condition above the table"
    assert re.search(r"^\s+D: 64$", out, re.M) and re.search(r"^\s+family: sm90$", out, re.M)
    assert "no GPU here" in " ".join(out.split()) and "sm_90" in out


def test_bench_inspect_says_why_it_shows_sm90(monkeypatch, capsys):
    """On a machine without a GPU, bias_attention.inspect compiles for sm_90 instead of timing: its note says so
    and why (the child ``inspect`` is replaced here by one that writes a report)."""
    import subprocess

    from syntaxkernels.tools.checks.bias_attention import bench_inspect
    from syntaxkernels.tools.commands import _print_bench

    def fake_inspect(argv, **kwargs):
        report = dict(kernel="_bias_fwd_kernel", arch=90, tile="128x64", registers=208, other_per_unit=14.62,
                      all_per_unit=14.62, ex2_per_unit=1.062, plain_other_per_unit=9.688, ratio=1.51)
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(dict(reports=[report]), f)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_inspect)
    rows = bench_inspect("cpu", True)
    _print_bench([dict(bench="bias_attention.inspect", **row) for row in rows])
    out = " ".join(capsys.readouterr().out.split())  # (the note is wrapped)
    assert "14.62" in out and "no GPU here" in out and "sm_90" in out and "not a measurement" in out


def test_inspect_help_lists_every_workload(capsys):
    from syntaxkernels import __main__ as cli
    from syntaxkernels.tools import inspection, workloads

    assert cli._WORKLOADS == workloads.WORKLOADS and set(cli._WORKLOAD_GROUPS) == set(workloads.WORKLOAD_GROUPS)
    assert cli._RELATION_WORKLOADS == workloads.RELATION_WORKLOADS
    assert cli._EDGE_WORKLOADS == inspection.EDGE_WORKLOADS
    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    text = re.sub(r"-\s+", "-", re.sub(r"\s+", " ", capsys.readouterr().out))  # argparse may wrap after a hyphen
    for name in (workloads.WORKLOADS + workloads.RELATION_WORKLOADS + tuple(workloads.WORKLOAD_GROUPS)
                 + inspection.EDGE_WORKLOADS):
        assert re.search(rf"[ :,]{re.escape(name)}[,;)]", text), name


def test_info_lists_the_optional_packages_and_whether_each_is_installed(monkeypatch, capsys):
    from importlib import metadata

    from syntaxkernels import __main__ as cli

    names = [name for name, _ in cli.OPTIONAL_PACKAGES]
    assert {"matplotlib", "spacy", "stanza", "transformers"} <= set(names)
    real = cli._version
    monkeypatch.setattr(cli, "_version", lambda name: "not installed" if name == "stanza" else real(name))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= WIDTH for line in out.splitlines()), out
    for name in names:
        line = next((line for line in out.splitlines() if re.match(rf"^\s+{name}\s", line)), None)
        assert line is not None, f"info does not list {name}"
        if name == "stanza":
            assert "not installed" in line
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        assert installed in line, line


def test_verify_names_its_checks_in_one_style():
    """module.snake_case, the module being the one the check lives in (they read 'trees: C++ builder == ...',
    'subnetwork_attention triton fp32 N=37 (...)' and 'bias_attention.triton_bf16_ragged' before)."""
    from syntaxkernels.tools import checks

    names = checks.check_names()
    assert len(names) >= 15
    for module_name, module, error in checks._modules():
        if module is None:
            continue
        short = module_name.rsplit(".", 1)[1].replace("_cpu", "")
        for check in module.CHECKS:
            assert re.fullmatch(rf"{short}\.[a-z0-9_]+", check.name), check.name


def test_verify_legend_is_one_figure_a_line():
    from syntaxkernels.tools.commands import LEGEND, legend_lines

    lines = legend_lines()
    assert all(len(line) <= WIDTH for line in lines)
    starts = [line.split("  ")[1] if line.startswith("  ") and line[2] != " " else None for line in lines]
    for figure, meaning in LEGEND:  # each figure opens a line of its own; its meaning follows, wrapped under it
        assert sum(line.startswith(f"  {figure} ") for line in lines) == 1, figure
    assert [s for s in starts if s] == [figure for figure, _ in LEGEND]
    assert " ".join(" ".join(line.split()) for line in lines).count("err <= bound") == 1
