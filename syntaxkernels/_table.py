"""The plain-text table of the command line and the benchmarks: one printer, stdlib only.

``python -m syntaxkernels info`` prints one (which backend each op uses), ``verify`` and ``bench`` print theirs
through it (``syntaxkernels/tools/commands.py``), and so do the benchmark scripts (``benchmarks/_bench_utils.py``).
"""
from __future__ import annotations

import re
import textwrap
from typing import Callable, Iterable, List, Mapping, Optional, Sequence

#: Width the tables of the command line fit in (a cell is never cut to fit: :func:`table`).
WIDTH = 100


def cell(value) -> str:
    """How a value shows in a table: floats with 4 significant digits, None as nothing."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _header_lines(name: str, width: int) -> List[str]:
    """``name`` over as few lines as its pieces allow, each at most ``width`` characters or as long as its longest
    piece, cut only after an underscore (``reference_peak_MiB`` -> ``reference_``, ``peak_MiB``)."""
    pieces = re.split(r"(?<=_)", name)
    width = max([width] + [len(piece) for piece in pieces])
    lines = [""]
    for piece in pieces:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append(piece)
        else:
            lines[-1] += piece
    return lines


def table(rows: Sequence[Mapping], columns: Sequence[str], indent: str = "", width: Optional[int] = WIDTH,
          right: Iterable[str] = (), below: Optional[Callable[[Mapping], List[str]]] = None) -> List[str]:
    """The lines of a table of ``rows`` (mappings) under ``columns``: a header, a rule, then each row.

    Columns are as wide as their widest cell and two spaces apart; the ``right`` ones are right-aligned (the
    others left-aligned). Nothing is ever cut: when the table is wider than ``width`` (None: no limit), first the
    headers that are wider than their column's cells break after an underscore onto more header lines, then the
    widest column whose cells hold spaces wraps them onto more lines (words whole), as often as that helps, then
    the columns move one space apart; a table that still does not fit is printed wider than ``width``.
    ``below(row)`` gives lines printed under a row (indented by ``indent`` and four spaces).
    """
    right = set(right)
    cells = [[[cell(r.get(c))] for c in columns] for r in rows]  # every cell a list of lines
    headers = [[c] for c in columns]

    def widths() -> List[int]:
        return [max(len(line) for lines in [headers[i]] + [row[i] for row in cells] for line in lines)
                for i in range(len(columns))]

    gap = 2

    def overflow() -> int:
        return len(indent) + sum(widths()) + gap * (len(columns) - 1) - width if width else 0

    if overflow() > 0:
        for i, name in enumerate(columns):
            data = max([len(line) for row in cells for line in row[i]] + [1])
            headers[i] = _header_lines(name, data)
    while overflow() > 0:
        current = widths()
        wrappable = [i for i in range(len(columns))
                     if any(" " in line for row in cells for line in row[i])
                     and current[i] > max((len(word) for row in cells for line in row[i] for word in line.split()),
                                           default=0)]
        if not wrappable:
            break
        i = max(wrappable, key=current.__getitem__)
        longest_word = max((len(word) for row in cells for line in row[i] for word in line.split()), default=1)
        target = max(longest_word, current[i] - overflow())
        for row in cells:
            row[i] = textwrap.wrap(" ".join(row[i]), target, break_long_words=False, break_on_hyphens=False) or [""]

    if overflow() > 0:
        gap = 1  # the last resort before a table wider than width: columns one space apart
    final = widths()

    def lines_of(values: Sequence[List[str]]) -> List[str]:
        height = max(len(v) for v in values)
        out = []
        for k in range(height):
            parts = [(v[k] if k < len(v) else "") for v in values]
            out.append(indent + (" " * gap).join(p.rjust(w) if c in right else p.ljust(w)
                                                 for p, w, c in zip(parts, final, columns)).rstrip())
        return out

    header_height = max(len(h) for h in headers)
    lines = lines_of([[""] * (header_height - len(h)) + h for h in headers])  # headers bottom-aligned
    lines.append(indent + (" " * gap).join("-" * w for w in final))
    for row, values in zip(rows, cells):
        lines.extend(lines_of(values))
        if below is not None:
            lines.extend(f"{indent}    {extra}" for extra in below(row))
    return lines
