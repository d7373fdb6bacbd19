"""The audit of a run's conditions: what each cell must run of a clause's condition space
(:mod:`.conditions`) given what its backend claims (:func:`required`), what the rows that ran
(:mod:`.observation`) miss (:func:`uncovered`, :func:`run_gaps`), what a backend cannot run
(:func:`not_implemented`, :func:`unclaimed`), and the command that prints the table
(``python -m mhaspec.conformance.condition_audit REPORT.json``).
"""

from __future__ import annotations

import json
import sys
from typing import Mapping

from mhaspec.backends import load_backend
from mhaspec.spec import generated_marker, load as load_spec

from .conditions import NEEDS, SPACES, dimensions_of, values_of
from .covering import covering_rows, pairs, possible_rows
from .observation import sub_cases_left_out


def required(clause: str, capabilities) -> set[tuple]:
    """The single values and pairs a cell must run for ``clause``: those of possible rows whose
    values need only ``capabilities`` (the operations among them)."""
    space = SPACES[clause]
    rows = [r for r in possible_rows(space, space.dimensions)
            if all(NEEDS.get(item, None) in (None, *capabilities) for item in r.items())]
    return set().union(set(), *(pairs(r) for r in rows))


def uncovered(clause: str, rows_ran, capabilities) -> list[str]:
    """What of :func:`required` the rows that ran (dicts over the clause's dimensions) miss, each
    as ``"dim=value"`` or ``"dim=value & dim=value"``; [] when covered."""
    seen = set().union(set(), *(pairs(r) for r in rows_ran))
    return sorted(" & ".join(f"{d}={v}" for d, v in p)
                  for p in required(clause, capabilities) - seen)


def not_implemented(clause: str, capabilities) -> list[str]:
    """The values of ``clause``'s space a backend with ``capabilities`` cannot run (reported as
    not implemented sub-cases): ``"dim=value (needs capability)"``."""
    space = SPACES[clause]
    return [f"{d}={v} (needs {NEEDS[(d, v)]})" for d in space.dimensions
            for v in values_of(space, d) if NEEDS.get((d, v), None) not in (None, *capabilities)]


def unclaimed(clauses, capabilities, state=None) -> dict[str, list[str]]:
    """clause -> :func:`not_implemented` for the ``clauses`` with a declared space, and the
    sub-cases of capabilities the calls of the test ``state`` records used that the backend does
    not support (only clauses with some)."""
    left_out = [] if state is None else [f"sub-case {s}" for s in sub_cases_left_out(state)]
    out = {c: not_implemented(c, capabilities) + left_out for c in clauses if c in SPACES}
    return {c: values for c, values in out.items() if values}


#: outcomes of results whose test ran its cases (a declared deviation ran them too)
RAN_OUTCOMES = ("pass", "fail", "deviation", "stale-deviation")


def run_gaps(results, capabilities: Mapping[str, frozenset]) -> dict[tuple, list[str]]:
    """(backend, device, dtype, clause) -> :func:`uncovered` for every cell of a run's
    ``results`` that ran a test of a clause with a declared space; ``capabilities``: backend
    name -> what it claims. Cells with nothing missing are left out ({}: every space covered)."""
    seen: dict[tuple, list] = {}
    for r in results:
        if r["outcome"] not in RAN_OUTCOMES:
            continue
        for clause in r["clauses"]:
            if clause in SPACES:
                key = (r["backend"], r["device"], r["dtype"], clause)
                seen.setdefault(key, []).extend(r.get("conditions", {}).get(clause, []))
    gaps = {key: uncovered(key[3], rows, capabilities[key[0]]) for key, rows in seen.items()}
    return {key: missing for key, missing in gaps.items() if missing}


def audit_table(results, clause_ids, capabilities: Mapping[str, frozenset]) -> str:
    """Markdown: per clause, its dimensions, the values each took in the run's ``results`` (in
    every cell: a value some cell missed is marked ``(not every cell)``), the number of covering
    rows, and what a cell missed (:func:`run_gaps`; a clause without a space: "undeclared")."""
    by_clause: dict[str, dict[tuple, list]] = {}
    for r in results:
        if r["outcome"] in RAN_OUTCOMES:
            for clause in r["clauses"]:
                cell = (r["backend"], r["device"], r["dtype"])
                by_clause.setdefault(clause, {}).setdefault(cell, []).extend(
                    r.get("conditions", {}).get(clause, []))
    gaps = run_gaps(results, capabilities)
    lines = ["| clause | dimensions | values run (every cell) | covering rows | missed |",
             "|---|---|---|---|---|"]
    for clause in clause_ids:
        if clause not in SPACES:
            lines.append(f"| {clause} | - | - | - | undeclared |")
            continue
        cells = by_clause.get(clause, {})
        shown = []
        for d in dimensions_of(clause):
            per_cell = [{row.get(d) for row in rows} for rows in cells.values()] or [set()]
            every, some = set.intersection(*per_cell), set.union(*per_cell)
            values = [v for v in dict.fromkeys((*values_of(SPACES[clause], d), "none"))
                      if v in some]
            shown.append(f"{d}: " + ", ".join(v if v in every else f"{v} (not every cell)"
                                               for v in values) if values else f"{d}: -")
        missed = sorted({m for key, ms in gaps.items() if key[3] == clause for m in ms})
        lines.append(f"| {clause} | {', '.join(dimensions_of(clause))} | "
                     f"{'; '.join(shown) if any(cells.values()) else _silent(cells)} | "
                     f"{len(covering_rows(clause))} | {', '.join(missed) or '-'} |")
    return "\n".join(lines) + "\n"


def _silent(cells) -> str:
    return "ran, no case recorded" if cells else "did not run"


def main(argv=None) -> int:
    """``python -m mhaspec.conformance.condition_audit REPORT.json``: the audit table (markdown)
    of a run's ``--mhaspec-report`` results, for registered backends."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mhaspec.conformance.condition_audit REPORT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        results = json.load(f)
    claims = {name: frozenset(load_backend(name).capabilities)
              for name in {r["backend"] for r in results}}
    spec = load_spec()
    print(generated_marker(spec.version))
    print(audit_table(results, spec.testable_ids, claims), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
