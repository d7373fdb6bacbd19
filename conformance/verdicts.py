"""Outcomes, their severity and the verdicts built from them: per clause, per chapter, per backend.

The one place that turns test outcomes into verdicts; the terminal summary, the certificate, the
matrix and the command line all call it, and no other module holds a verdict rule.

* A **result** is one test item's record (the plugin's collector): ``backend``, ``device``,
  ``dtype``, ``clauses``, ``outcome`` (one of :data:`OUTCOMES`), ``ratios``, ``calls``, ...
* A **not-run record** is a test item of a claimed cell that did not run: deselected (``-k``,
  ``-m``, ``--deselect``), left out by ``--mhaspec-dtypes``, never reached (``-x``, an interrupt)
  or in a test module that was not collected. Same keys as a result, without ``outcome``.
* A **clause entry** (the certificate's ``clauses``) comes from :func:`clause_verdicts`; its
  ``verdict`` is one of :data:`CLAUSE_VERDICTS` and ``not_run_on`` lists the ``device/dtype`` cells
  where some of its tests did not run.
* The **backend verdict** is :func:`overall_verdict` over the clause entries, one of
  :data:`BACKEND_VERDICTS`.
"""

from __future__ import annotations

import math

from collections import Counter
from typing import Iterable

#: Outcome of one test item, worst first.
SEVERITY = ["fail", "stale-deviation", "deviation", "pass", "not-implemented", "unavailable"]
OUTCOMES = tuple(SEVERITY)
#: Verdict of one clause (``not-run``: not testable, or none of its tests ran).
CLAUSE_VERDICTS = ("pass", "fail", "deviation", "stale-deviation", "not-implemented", "not-run")
#: Short form of each outcome for the terminal table.
SYMBOL = {"pass": "ok", "fail": "FAIL", "deviation": "dev", "stale-deviation": "STALE",
          "not-implemented": "n/i", "unavailable": "-"}

DOES_NOT_CONFORM = "does not conform"
INCOMPLETE = "incomplete"
CONFORMS = "conforms"
NOT_CHECKED = "not checked"
#: The backend verdicts, worst first.
BACKEND_VERDICTS = (DOES_NOT_CONFORM, INCOMPLETE, CONFORMS, NOT_CHECKED)
#: Outcomes that make a backend not conform.
BAD = ("fail", "stale-deviation")


def worst(outcomes: Iterable[str]) -> str | None:
    """The most severe of ``outcomes`` (None for none)."""
    return min(outcomes, key=SEVERITY.index, default=None)


def cell(result: dict) -> str:
    """``device/dtype`` of a result or not-run record."""
    return f"{result['device']}/{result['dtype']}"


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(backend, clause) -> {"outcome": worst outcome, "ratio": worst NUM-3 ratio, "runs": n}."""
    table: dict[tuple[str, str], dict] = {}
    for r in results:
        for clause in r["clauses"]:
            entry = table.setdefault((r["backend"], clause), {"outcome": "unavailable", "ratio": 0.0,
                                                              "runs": 0})
            entry["outcome"] = worst([entry["outcome"], r["outcome"]])
            entry["ratio"] = max(entry["ratio"], r["ratios"].get(clause, 0.0))
            entry["runs"] += r["outcome"] != "unavailable"
    return table


def clause_verdicts(results: list[dict], spec, claimed: dict[str, list[str]],
                    not_run: list[dict] = ()) -> list[dict]:
    """One entry per spec clause for ONE backend's ``results`` and ``not_run`` records.

    ``claimed``: device -> dtypes the backend claims on its available devices; only not-run
    records of those cells count (an unclaimed dtype or absent device is not a gap)."""
    cells = {f"{d}/{t}" for d, dtypes in claimed.items() for t in dtypes}
    out = []
    for clause in spec.clauses:
        runs = [r for r in results if clause.id in r["clauses"]]
        outcomes = {r["outcome"] for r in runs if r["outcome"] != "unavailable"}
        verdict = "not-run"
        if clause.testable:
            verdict = next((v for v in SEVERITY if v in outcomes), "not-run")
        missing = sorted({cell(r) for r in not_run if clause.id in r["clauses"]} & cells)
        out.append({
            "id": clause.id, "title": clause.title, "verdict": verdict,
            "worst_ratio": finite_or_none(max((r["ratios"].get(clause.id, 0.0) for r in runs),
                                              default=0.0)),
            "runs": sum(r["outcome"] != "unavailable" for r in runs),
            "ran_on": sorted({cell(r) for r in runs
                              if r["outcome"] not in ("unavailable", "not-implemented")}),
            "not_run_on": missing if clause.testable else [],
            "failures": [r["message"] for r in runs if r["outcome"] in BAD and r.get("message")][:3],
        })
    return out


def finite_or_none(ratio: float) -> float | None:
    """A worst NUM-3 ratio as JSON can hold it: None when it is not finite (a NaN or inf result
    where the oracle is finite)."""
    return ratio if math.isfinite(ratio) else None


def count_verdicts(clauses: list[dict]) -> dict[str, int]:
    """Clause verdict -> number of clauses (only verdicts that occur)."""
    return dict(sorted(Counter(c["verdict"] for c in clauses).items()))


def overall_verdict(clauses: list[dict]) -> str:
    """THE backend verdict from its clause entries.

    "does not conform": a clause failed or a declared deviation is stale; "incomplete": some
    claimed device x dtype cell did not run all the tests of a testable clause (``not_run_on``);
    "conforms": otherwise, when at least one clause passed; "not checked": nothing passed (every
    clause skipped, not implemented or a declared deviation)."""
    verdicts = {c["verdict"] for c in clauses}
    if verdicts & set(BAD):
        return DOES_NOT_CONFORM
    if any(c.get("not_run_on") for c in clauses):
        return INCOMPLETE
    return CONFORMS if "pass" in verdicts else NOT_CHECKED


def chapter_verdict(verdicts: dict[str, str]) -> str | None:
    """The worst clause verdict of one chapter (None when none of its clauses ran)."""
    return worst(v for v in verdicts.values() if v in SEVERITY)


def backend_report(results: list[dict], spec, claimed: dict[str, dict[str, list[str]]],
                   not_run: list[dict] = ()) -> dict[str, dict]:
    """backend -> {"clauses": entries, "verdict": overall verdict, "counts": ...} for every backend
    that has results or not-run records; ``claimed``: backend -> device -> dtypes."""
    names = sorted({r["backend"] for r in results} | {r["backend"] for r in not_run})
    report = {}
    for name in names:
        clauses = clause_verdicts([r for r in results if r["backend"] == name], spec,
                                  claimed.get(name, {}), [r for r in not_run if r["backend"] == name])
        report[name] = {"clauses": clauses, "verdict": overall_verdict(clauses),
                        "counts": count_verdicts(clauses)}
    return report
