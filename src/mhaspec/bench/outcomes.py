"""Per-test outcomes of two runs of the suite, compared: did a change alter what the suite found?

    python -m mhaspec.bench.outcomes BEFORE.json AFTER.json

Each file is a run's ``--mhaspec-report`` (the same backends, profile and ``--hypothesis-seed``).
A test is keyed by (backend, device, dtype, test name); it differs when it is in one run only or
when any of :data:`FIELDS` differs (the NUM-3 ratios compared exactly). Prints one line per run
pair and the first differences; exit status 1 when any test differs.
"""

from __future__ import annotations

import argparse
import sys

from mhaspec import usage
from mhaspec.runner import read_report

#: what must be identical per test: the outcome, the worst NUM-3 ratio per clause, the backend
#: calls, the examples, the conditions covered and those not implemented, the clauses
FIELDS = ("outcome", "ratios", "calls", "examples", "conditions", "conditions_not_implemented",
          "clauses")


def by_test(results: list[dict]) -> dict[tuple, dict]:
    """A run's results keyed by (backend, device, dtype, test)."""
    return {(r["backend"], r["device"], r["dtype"], r["test"]): r for r in results}


def differences(before: list[dict], after: list[dict]) -> dict[tuple, dict]:
    """key -> {field: (before, after)} for every test whose :data:`FIELDS` differ, or that is in
    one run only (field "present")."""
    a, b = by_test(before), by_test(after)
    found = {}
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            found[key] = {"present": (key in a, key in b)}
            continue
        changed = {f: (a[key].get(f), b[key].get(f)) for f in FIELDS
                   if a[key].get(f) != b[key].get(f)}
        if changed:
            found[key] = changed
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhaspec.bench.outcomes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--show", type=int, default=10, help="differences to print (default 10)")
    args = parser.parse_args(argv)
    try:
        before, after = read_report(args.before), read_report(args.after)
    except usage.UsageError as exc:
        usage.fail(str(exc))
    found = differences(before, after)
    print(f"{len(before)} tests before, {len(after)} after: {len(found)} differ")
    for key, changed in list(found.items())[:args.show]:
        print(f"  {' '.join(key)}: {changed}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
