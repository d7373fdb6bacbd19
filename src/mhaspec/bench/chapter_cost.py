"""What a spec version's new chapters cost the suite, per backend, from one run's report.

    python -m mhaspec.bench.chapter_cost REPORT [--since 1.3]

REPORT is a run's ``--mhaspec-report`` (``nox -s conformance`` writes
results/conformance/report.json). A test is **new** when every clause it names was added in
``--since`` (``since = "1.3"`` in clauses.toml); every other test is the earlier suite. Per
backend the table gives the seconds of each (the durations the report records: each test's
call, and the setup of a test that did not run) and the ratio of the whole to the earlier suite: the factor by which the new chapters lengthened that backend's tests in this very run.
Both halves ran in the same process on the same machine, so the ratio is not skewed by load that
changed between two runs.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from mhaspec import usage
from mhaspec.runner import read_report
from mhaspec.spec import load


def new_clauses(since: str) -> frozenset[str]:
    """The clauses the spec says were added in ``since``."""
    return frozenset(c.id for c in load().clauses if c.since == since)


def seconds_by_part(results: list[dict], new: frozenset[str]) -> dict[str, tuple[float, float]]:
    """backend -> (seconds of the earlier suite's tests, seconds of the new tests)."""
    parts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in results:
        is_new = bool(r["clauses"]) and set(r["clauses"]) <= new
        parts[r["backend"]][is_new] += r.get("duration", 0.0)
    return {b: (old, added) for b, (old, added) in sorted(parts.items())}


def ratio(old: float, added: float) -> float:
    """(old + added) / old: the whole suite's seconds over the earlier suite's (inf when old is 0)."""
    return (old + added) / old if old else float("inf")


def table(parts: dict[str, tuple[float, float]], since: str) -> str:
    """A Markdown table of :func:`seconds_by_part`, with the total last."""
    lines = [f"| backend | earlier suite s | new in {since} s | ratio |", "|---|---:|---:|---:|"]
    rows = [(b, old, added) for b, (old, added) in parts.items() if old + added > 0]
    total = (sum(r[1] for r in rows), sum(r[2] for r in rows))
    for name, old, added in [*rows, ("**all**", *total)]:
        lines.append(f"| {name} | {old:.1f} | {added:.1f} | {ratio(old, added):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhaspec.bench.chapter_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("report", help="a run's --mhaspec-report file")
    parser.add_argument("--since", default="1.3", help="the version whose new clauses are timed "
                        "(default 1.3)")
    args = parser.parse_args(argv)
    try:
        results = read_report(args.report)
    except usage.UsageError as exc:
        usage.fail(str(exc))
    if not results:
        parser.error(f"report: no results in {args.report}")
    new = new_clauses(args.since)
    if not new:
        parser.error(f"--since: no clause of the spec was added in {args.since!r}")
    print(table(seconds_by_part(results, new), args.since))
    return 0


if __name__ == "__main__":
    sys.exit(main())
