"""Every Markdown table in docs/ renders as written: no row has more cells than its header, and
no paragraph is glued onto a table (a missing blank line makes its lines extra table rows).

Axis legend: none (Markdown text).
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DELIMITER = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def cells(row: str) -> list[str]:
    """The cells of a table row as Python-Markdown's tables extension splits it: on ``|`` outside
    code spans and not escaped; a leading and a trailing ``|`` are the row's borders."""
    parts, current, ticks, i = [], "", 0, 0
    row = row.strip()
    while i < len(row):
        c = row[i]
        if c == "\\" and i + 1 < len(row):
            current += row[i:i + 2]
            i += 2
            continue
        if c == "`":
            run = len(row[i:]) - len(row[i:].lstrip("`"))
            if ticks == 0 and "`" * run in row[i + run:]:
                ticks = run
            elif ticks == run:
                ticks = 0
            current += "`" * run
            i += run
            continue
        if c == "|" and ticks == 0:
            parts.append(current)
            current = ""
        else:
            current += c
        i += 1
    parts.append(current)
    if row.startswith("|"):
        parts = parts[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        parts = parts[:-1]
    return parts


def table_problems(text: str) -> list[str]:
    """``line N: ...`` for each row with more cells than its header and each line of text glued
    onto a table (outside fenced code blocks)."""
    problems, lines, fence = [], text.split("\n"), None
    n = 0
    while n < len(lines):
        line = lines[n]
        marker = re.match(r"^\s*(`{3,}|~{3,})", line)
        if marker and (fence is None or marker[1].startswith(fence)):
            fence = None if fence else marker[1]
        elif fence is None and n + 1 < len(lines) and "|" in line and DELIMITER.match(lines[n + 1]):
            width = len(cells(line))
            n += 2
            while n < len(lines) and lines[n].strip():
                row = lines[n]
                if not row.lstrip().startswith("|"):
                    problems.append(f"line {n + 1}: text glued onto the table above (add a blank "
                                    f"line): {row.strip()[:60]!r}")
                elif len(cells(row)) > width:
                    problems.append(f"line {n + 1}: {len(cells(row))} cells, the header has "
                                    f"{width}: {row.strip()[:60]!r}")
                n += 1
            continue
        n += 1
    return problems


def test_the_checker_finds_extra_cells_and_glued_text():
    text = ("| a | b |\n|---|---|\n| `x|y` | z \\| w |\n| 1 | 2 | 3 |\nglued on\n\n"
            "```\n| a |\n|---|\n| 1 | 2 |\n```\n")
    assert table_problems(text) == [
        "line 4: 3 cells, the header has 2: '| 1 | 2 | 3 |'",
        "line 5: text glued onto the table above (add a blank line): 'glued on'"]
    assert cells("| `a | b` | c |") == [" `a | b` ", " c "]


@pytest.mark.parametrize("page", sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")))
def test_no_table_row_has_more_cells_than_its_header(page):
    problems = table_problems((DOCS / page).read_text(encoding="utf-8"))
    assert not problems, f"docs/{page}:\n" + "\n".join(problems)
