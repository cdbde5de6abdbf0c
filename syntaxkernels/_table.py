"""The plain-text table of the command line and the benchmarks: one printer, stdlib only.

``python -m syntaxkernels info`` prints one (which backend each op uses), ``verify`` and ``bench`` print theirs
through it (``syntaxkernels/tools/commands.py``), and so do the benchmark scripts (``benchmarks/_bench_utils.py``).
"""
from __future__ import annotations

from typing import Callable, Iterable, List, Mapping, Optional, Sequence

#: Width every table of the command line fits in.
WIDTH = 100


def cell(value) -> str:
    """How a value shows in a table: floats with 4 significant digits, None as nothing."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def table(rows: Sequence[Mapping], columns: Sequence[str], indent: str = "", width: Optional[int] = WIDTH,
          right: Iterable[str] = (), below: Optional[Callable[[Mapping], List[str]]] = None) -> List[str]:
    """The lines of a table of ``rows`` (mappings) under ``columns``: a header, a rule, one line per row.

    Columns are as wide as their widest cell and two spaces apart; the ``right`` ones are right-aligned (the
    others left-aligned). When the table is wider than ``width`` (None: no limit), the widest column is narrowed
    and the cells that no longer fit end in ``~``: a last resort. ``below(row)`` gives lines printed under a
    row (indented by ``indent`` and four spaces).
    """
    right = set(right)
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    overflow = len(indent) + sum(widths) + 2 * (len(widths) - 1) - width if width else 0
    if overflow > 0:
        widest = max(range(len(widths)), key=widths.__getitem__)
        widths[widest] = max(8, widths[widest] - overflow)

    def line(values: Sequence[str]) -> str:
        shown = [v if len(v) <= w else v[: w - 1] + "~" for v, w in zip(values, widths)]
        return indent + "  ".join(v.rjust(w) if c in right else v.ljust(w)
                                  for v, w, c in zip(shown, widths, columns)).rstrip()

    lines = [line(list(columns)), indent + "  ".join("-" * w for w in widths)]
    for row, values in zip(rows, cells):
        lines.append(line(values))
        if below is not None:
            lines.extend(f"{indent}    {extra}" for extra in below(row))
    return lines
