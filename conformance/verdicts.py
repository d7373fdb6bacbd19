"""Outcomes, their severity and the verdicts built from them: per clause, per chapter, per backend.

The one place that turns test outcomes into verdicts; the terminal summary, the certificate, the
matrix and the command line all call it, and no other module holds a verdict rule.

* A **result** is one test item's record (the plugin's collector): ``backend``, ``device``,
  ``dtype``, ``clauses``, ``outcome`` (one of :data:`OUTCOMES`), ``ratios``, ``calls``, ...
* A **not-run record** is a test item of a claimed cell that did not run: deselected (``-k``,
  ``-m``, ``--deselect``), left out by ``--mhaspec-dtypes``, never reached (``-x``, an interrupt)
  or in a test module that was not collected. Same keys as a result, without ``outcome``.
  A result's ``validated_by_adapter`` lists its clauses that the backend's adapter satisfied by
  its shared argument validation, before the library was called (``validated_clauses`` of
  :class:`~mhaspec.backends.adapters.NativeAdapter`).
* A **clause entry** (the certificate's ``clauses``) comes from :func:`clause_verdicts`; its
  ``verdict`` is one of :data:`CLAUSE_VERDICTS` and ``not_run_on`` lists the ``device/dtype`` cells
  where some of its tests did not run. A pass that the adapter's validation made, not the library,
  carries ``satisfied_by: "adapter"``, and one whose feature the adapter folded into the masks in
  every test that ran (windows, segments, ALiBi, ...: each result's ``folded_by_adapter``)
  ``satisfied_by: "adapter fold"`` (:func:`satisfied_by`); a stale deviation names the cells
  where it did not deviate in ``stale_on`` (:func:`stale_cells`). A deviation by a declared
  behaviour (``"behaviour:NAME"``, :mod:`mhaspec.backends.behaviours`) names it in ``behaviours``:
  a passing test in which it showed is a deviation (:func:`with_behaviours`), and one declared in
  a cell where it showed in no test makes its home clause stale there
  (:func:`unshown_behaviour_cells`). :func:`entry_problem` is the rule those fields follow;
  :func:`verdict_label` and :func:`backend_notes` word them.
* The **backend verdict** is :func:`overall_verdict` over the clause entries, one of
  :data:`BACKEND_VERDICTS`.
* **Failure groups** (:func:`failure_groups`): the failed results of a backend grouped by their
  likely common cause (one cause, such as float32 arithmetic in a float64 path or an unsupported
  ``d_v != d_k``, fails many clauses at once).
"""

from __future__ import annotations

import math
import re
import statistics

from collections import Counter
from typing import Iterable

from mhaspec.backends.behaviours import CATALOGUE
from mhaspec.backends.sub_cases import FOLDED

from .clause_capabilities import NEEDS

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
#: ``satisfied_by`` of a pass made by an adapter's shared argument validation, not by the library
ADAPTER = "adapter"
#: ``satisfied_by`` of a pass whose feature the adapter folded into the masks (or laid out, for a
#: KV cache; merged, for sinks) in every test that ran, not the library's own mechanism
ADAPTER_FOLD = "adapter fold"
#: what such a pass means, in the words every summary and the scoreboard use
FOLD_MEANING = ("passed by the adapter's fold, not by the library's own mechanism (the feature "
                "folded into the masks, or the cache laid out, before the library was called)")
#: Outcomes of results that did not exercise the backend.
NOT_EXERCISED = ("unavailable", "not-implemented")


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


def outcome_counts(table: dict[tuple[str, str], dict], backend: str) -> dict[str, int]:
    """Outcome -> number of ``backend``'s clauses with that worst outcome in a :func:`summarize`
    table, worst first (only outcomes that occur)."""
    counts = Counter(entry["outcome"] for (b, _), entry in table.items() if b == backend)
    return {o: counts[o] for o in SEVERITY if counts[o]}


def clause_verdicts(results: list[dict], spec, claimed: dict[str, list[str]],
                    not_run: list[dict] = ()) -> list[dict]:
    """One entry per spec clause for ONE backend's ``results`` and ``not_run`` records.

    ``claimed``: device -> dtypes the backend claims on its available devices; only not-run
    records of those cells count (an unclaimed dtype or absent device is not a gap)."""
    cells = {f"{d}/{t}" for d, dtypes in claimed.items() for t in dtypes}
    unshown = unshown_behaviour_cells(results)
    out = []
    for clause in spec.clauses:
        runs = [r for r in results if clause.id in r["clauses"]]
        outcomes = {r["outcome"] for r in runs if r["outcome"] != "unavailable"}
        verdict = "not-run"
        if clause.testable:
            verdict = next((v for v in SEVERITY if v in outcomes), "not-run")
        missing = sorted({cell(r) for r in not_run if clause.id in r["clauses"]} & cells)
        by = satisfied_by(clause.id, runs) if verdict == "pass" else None
        stale = stale_cells(runs)
        quiet = [c for c in unshown.get(clause.id, ()) if c not in stale]
        if quiet and verdict in ("pass", "deviation", "stale-deviation"):
            verdict, by, stale = "stale-deviation", None, sorted(stale + quiet)
        shown = sorted({n for r in runs for n in r.get("behaviours", ())})
        out.append({
            "id": clause.id, "title": clause.title, "verdict": verdict,
            **({"satisfied_by": by} if by else {}), **({"stale_on": stale} if stale else {}),
            **({"behaviours": shown} if shown else {}),
            "worst_ratio": finite_or_none(max((r["ratios"].get(clause.id, 0.0) for r in runs),
                                              default=0.0)),
            "runs": sum(r["outcome"] != "unavailable" for r in runs),
            "ran_on": sorted({cell(r) for r in runs
                              if r["outcome"] not in ("unavailable", "not-implemented")}),
            "not_run_on": missing if clause.testable else [],
            "failures": [r["message"] for r in runs if r["outcome"] in BAD and r.get("message")][:3],
            "conditions": ran_conditions(runs, clause.id),
        })
    return out


def satisfied_by(clause_id: str, runs: list[dict]) -> str | None:
    """Who satisfied a passed clause, when not the library: "adapter" when every test of it that
    ran was satisfied by the adapter's shared argument validation (each result's
    ``validated_by_adapter`` names the clause: the library never saw the invalid input); "adapter
    fold" when the clause's feature (:func:`folded_feature`) was served by the adapter's fold in
    every test of it that ran (each result's ``folded_by_adapter`` names it); None when the
    library's own behaviour was judged in at least one."""
    ran = [r for r in runs if r["outcome"] not in NOT_EXERCISED]
    if ran and all(clause_id in r.get("validated_by_adapter", ()) for r in ran):
        return ADAPTER
    feature = folded_feature(clause_id)
    if ran and feature and all(feature <= set(r.get("folded_by_adapter", ())) for r in ran):
        return ADAPTER_FOLD
    return None


def folded_feature(clause_id: str) -> frozenset[str]:
    """The capabilities of a clause an adapter may serve by folding (:data:`NEEDS` met with
    :data:`~mhaspec.backends.sub_cases.FOLDED`: WIN-1's "window"); empty for the others."""
    return NEEDS.get(clause_id, frozenset()) & FOLDED


def with_behaviours(outcome: str | None, result: dict) -> str | None:
    """A test's outcome given the declared behaviours that showed in it (``result["behaviours"]``,
    :mod:`.behaviour_checks`): a pass in which one showed is a ``deviation``; others unchanged."""
    return "deviation" if outcome == "pass" and result.get("behaviours") else outcome


def unshown_behaviour_cells(results: list[dict]) -> dict[str, list[str]]:
    """Home clause -> the ``device/dtype`` cells where a behaviour declared there
    (:data:`~mhaspec.backends.behaviours.CATALOGUE`, its ``clause`` the home) showed in no test of
    one backend's ``results`` while its home clause ran: a stale declaration, reported on the home
    clause."""
    declared: dict[str, set[str]] = {}
    shown: dict[str, set[str]] = {}
    ran: set[tuple[str, str]] = set()
    for r in results:
        declared.setdefault(cell(r), set()).update(
            n for n in r.get("behaviours_declared", ()) if n in CATALOGUE)
        shown.setdefault(cell(r), set()).update(r.get("behaviours", ()))
        if r["outcome"] not in NOT_EXERCISED:
            ran.update((c, cell(r)) for c in r["clauses"])
    out: dict[str, set[str]] = {}
    for where, names in declared.items():
        for name in names - shown[where]:
            home = CATALOGUE[name].clause
            if (home, where) in ran:
                out.setdefault(home, set()).add(where)
    return {home: sorted(where) for home, where in out.items()}


def stale_cells(runs: list[dict]) -> list[str]:
    """The ``device/dtype`` cells where a declared deviation of the clause did not deviate."""
    return sorted({cell(r) for r in runs if r["outcome"] == "stale-deviation"})


def entry_problem(entry: dict, adapter_clauses: frozenset[str]) -> str | None:
    """What is wrong with a clause entry's ``satisfied_by`` and ``stale_on`` (None: nothing).
    ``satisfied_by`` "adapter" goes with a pass of a clause in ``adapter_clauses`` (those shared
    validation can satisfy), "adapter fold" with a pass of a clause of a folded feature;
    ``stale_on`` names cells where the clause ran, and goes with every stale
    deviation and with a failure (worse than stale, in other cells or tests) only; ``behaviours``
    goes with a deviation or worse, of a clause each of them shows in."""
    by = entry.get("satisfied_by")
    if by == ADAPTER and (entry["verdict"] != "pass" or entry["id"] not in adapter_clauses):
        return (f"clause {entry['id']} is {entry['verdict']} and says it was satisfied by the "
                f"{by}, which only a pass of a rejection clause can be")
    if by == ADAPTER_FOLD and (entry["verdict"] != "pass" or not folded_feature(entry["id"])):
        return (f"clause {entry['id']} is {entry['verdict']} and says it was satisfied by the "
                f"{by}, which only a pass of a clause of a folded feature can be")
    if by not in (None, ADAPTER, ADAPTER_FOLD):
        return f"clause {entry['id']} says it was satisfied by {by!r}"
    stale = entry.get("stale_on")
    if entry["verdict"] == "stale-deviation" and not stale or stale and entry["verdict"] not in BAD:
        return f"clause {entry['id']} is {entry['verdict']} with stale_on {stale}"
    if stale and not set(stale) <= set(entry["ran_on"]):
        return f"clause {entry['id']} is stale on {stale}, where it did not run ({entry['ran_on']})"
    shown = entry.get("behaviours", ())
    if shown and (entry["verdict"] not in ("deviation",) + BAD or any(
            n not in CATALOGUE or entry["id"] not in CATALOGUE[n].shows_in for n in shown)):
        return (f"clause {entry['id']} is {entry['verdict']} with behaviours {list(shown)}, which "
                f"only a deviation (or worse) of a clause they show in can have")
    return None


def verdict_label(entry: dict, informative_ids=frozenset()) -> str:
    """A clause entry's verdict as people read it: ``pass (adapter)``, ``stale-deviation (stale
    on cpu/float64)``, ``deviation (behaviour masked-weights-not-zero)``, ``informative`` for a
    ``not-run`` clause of ``informative_ids`` (it has no test, as :func:`describe_counts` words
    it), or the verdict alone."""
    if entry["verdict"] == "not-run" and entry["id"] in informative_ids:
        return "informative"
    if entry.get("satisfied_by"):
        return f"{entry['verdict']} ({entry['satisfied_by']})"
    if entry.get("stale_on"):
        return f"{entry['verdict']} (stale on {', '.join(entry['stale_on'])})"
    if entry.get("behaviours"):
        return f"{entry['verdict']} (behaviour {', '.join(entry['behaviours'])})"
    return entry["verdict"]


def table_symbol(outcome: str, entry: dict | None = None) -> str:
    """A cell of the terminal's clause table: :data:`SYMBOL` of the worst outcome, marked ``*``
    when the clause entry has a note of :func:`backend_notes` (a pass by the adapter, ``ok*``; a
    stale deviation's cells, ``STALE*``)."""
    marked = entry is not None and (entry.get("satisfied_by") or entry.get("stale_on"))
    return SYMBOL[outcome] + ("*" if marked else "")


def backend_notes(clauses: list[dict]) -> list[str]:
    """The lines a summary adds under a backend's verdict: the clauses its adapter's validation
    satisfied instead of the library, and the cells of each stale deviation."""
    by_adapter = [c["id"] for c in clauses if c.get("satisfied_by") == ADAPTER]
    by_fold = [c["id"] for c in clauses if c.get("satisfied_by") == ADAPTER_FOLD]
    stale = [f"{c['id']} on {', '.join(c['stale_on'])}" for c in clauses if c.get("stale_on")]
    notes = []
    if by_adapter:
        notes.append(f"{len(by_adapter)} passed by the adapter's shared argument validation, not "
                     f"by the library (invalid input never reached it): {', '.join(by_adapter)}")
    if by_fold:
        notes.append(f"{len(by_fold)} {FOLD_MEANING}: {', '.join(by_fold)}")
    if stale:
        notes.append("declared deviations that did not deviate (stale) in these cells: "
                     + "; ".join(stale) + " (where one deviates in other cells, narrow it to "
                     "those with deviations_on)")
    return notes


def ran_conditions(runs: list[dict], clause: str) -> list[str]:
    """The distinct rows of ``clause``'s condition space (:mod:`.conditions`) its ``runs``
    recorded, each as ``"dim=value, ..."``, then the values a capability the backend does not
    claim kept out, each as ``"not implemented: dim=value (needs capability)"``; sorted."""
    rows = {", ".join(f"{d}={v}" for d, v in row.items())
            for r in runs for row in r.get("conditions", {}).get(clause, [])}
    kept_out = {f"not implemented: {v}" for r in runs
                for v in r.get("conditions_not_implemented", {}).get(clause, [])}
    return sorted(rows) + sorted(kept_out)


def finite_or_none(ratio: float) -> float | None:
    """A worst NUM-3 ratio as JSON can hold it: None when it is not finite (a NaN or inf result
    where the oracle is finite)."""
    return ratio if math.isfinite(ratio) else None


def count_verdicts(clauses: list[dict]) -> dict[str, int]:
    """Clause verdict -> number of clauses (only verdicts that occur)."""
    return dict(sorted(Counter(c["verdict"] for c in clauses).items()))


def describe_counts(clauses: list[dict], testable_ids) -> str:
    """The clause counts in words (``"11 pass, 9 fail, 3 informative"``): a ``not-run`` clause
    outside ``testable_ids`` is informative, it has no test to run; the others stay "not run"."""
    counts = Counter("informative" if c["verdict"] == "not-run" and c["id"] not in testable_ids
                     else c["verdict"].replace("-", " ") for c in clauses)
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def overall_verdict(clauses: list[dict]) -> str:
    """THE backend verdict from its clause entries.

    "does not conform": a clause failed or a declared deviation is stale; "incomplete": some
    claimed device x dtype cell did not run all the tests of a testable clause (``not_run_on``);
    "conforms": otherwise, when at least one clause passed by the library's own behaviour; "not
    checked": nothing did (every clause skipped, not implemented, a declared deviation or passed
    by the adapter's validation alone)."""
    verdicts = {c["verdict"] for c in clauses}
    if verdicts & set(BAD):
        return DOES_NOT_CONFORM
    if any(c.get("not_run_on") for c in clauses):
        return INCOMPLETE
    own = any(c["verdict"] == "pass" and not c.get("satisfied_by") for c in clauses)
    return CONFORMS if own else NOT_CHECKED


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


#: (dtype, lowest, highest, hint): a failed value check whose error relative to the result's
#: magnitude lies in [lowest, highest) in a result of that dtype suggests the hint
PRECISION_HINTS = (
    ("float64", 1e-12, 1e-5, "float64 results carry float32 rounding errors: float32 arithmetic "
                             "inside the float64 path?"),
    ("float64", 1e-5, 3e-2, "float64 results carry float16/bfloat16/TF32 rounding errors: lower "
                            "precision inside the float64 path?"),
    ("float32", 1e-5, 3e-2, "float32 results carry float16/bfloat16/TF32 rounding errors: lower "
                            "precision inside the float32 path?"),
)
#: relative error from which a value failure is a wrong computation rather than lost precision
WRONG_VALUE = 3e-2
#: the first line of an exception (``Type: message``; the suite's own checks are AssertionErrors,
#: reported without their type)
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Timeout|Interrupt|Exit)\b")


def relative_error(result: dict) -> float | None:
    """A failed value check's error relative to the magnitude of the result (None when the
    failure was not a value check)."""
    failure = result.get("failure") or {}
    if failure.get("error") is None:
        return None
    return failure["error"] / max(failure.get("scale") or 1.0, 1e-300)


#: the cause of a failure of MASK-9 itself, or of another clause whose largest error lies in a row
#: the oracle leaves without an allowed key: one behaviour there fails every clause whose cases
#: empty a row
EMPTY_ROW_CAUSE = ("the largest error is in a row with no allowed key: what the backend gives a "
                   "fully masked row (MASK-9)?")
#: the fields of a failing case that :func:`common_fields` reads: the dimensions a cause usually
#: hides in (widths, biases, masks, features), not the sizes the shape menu draws
CASE_DIMENSIONS = ("d_k", "d_v", "self_attention", "use_bias", "mask_shape", "fully_masked_rows",
                   "bias_shape", "legacy_shape", "key_padding", "causal", "scale", "extreme",
                   "kv_heads", "softcap", "window", "alignment", "alibi", "segments",
                   "seq_lengths", "past_len", "past_valid", "lse", "chunk")


def case_fields(spec) -> dict[str, str]:
    """The :data:`CASE_DIMENSIONS` of a case spec as strings (what a failure records)."""
    return {name: str(getattr(spec, name)) for name in CASE_DIMENSIONS if hasattr(spec, name)}


def common_fields(results: list[dict]) -> dict[str, str]:
    """The case fields with one value in every failed result that recorded its case
    (``failure.case_fields``), when at least two did (one case has everything in common with
    itself); a field whose common value is None or False (a feature absent) says nothing and is
    left out."""
    cases = [(r.get("failure") or {}).get("case_fields") for r in results]
    cases = [c for c in cases if c]
    if len(cases) < 2:
        return {}
    return {k: v for k, v in cases[0].items()
            if v not in ("None", "False") and all(c.get(k) == v for c in cases[1:])}


def likely_cause(result: dict) -> str:
    """The likely cause of one failed result, worded so that results of one cause share it."""
    if (result.get("failure") or {}).get("in_empty_row") or "MASK-9" in result.get("clauses", ()):
        return EMPTY_ROW_CAUSE
    rel = relative_error(result)
    if rel is not None:
        if not math.isfinite(rel):
            return ("non-finite where the oracle is finite, or finite where it is not: an unguarded "
                    "softmax, NaN/inf leaking past a mask, or results sanitised?")
        for dtype, low, high, hint in PRECISION_HINTS:
            if result["dtype"] == dtype and low <= rel < high:
                return hint
        if rel >= WRONG_VALUE:
            return ("values wrong by more than rounding: the computation itself (scale, softmax "
                    "axis, masks, layout)?")
        return "values just outside the tolerance"
    crash = (result.get("crash") or "").strip().splitlines()
    if crash and EXCEPTION_LINE.match(crash[0]):  # raised by the backend, not a check of the suite
        line = re.sub(r"\d+", "N", crash[0])[:160]
        return (f"the same exception, {line}: an input the backend does not support (d_v != d_k, "
                f"a size of 0, cross widths)?")
    return "other failed assertions (see each failure)"


def failure_groups(results: list[dict]) -> list[dict]:
    """The failed results grouped by backend and :func:`likely_cause`, largest group first:
    ``backend``, ``cause``, ``clauses``, ``cells`` (``device/dtype``), ``tests`` and, for value
    failures, ``typical_relative_error`` (the median; None when not finite or not a value check)
    and ``common`` (:func:`common_fields` of its failures)."""
    groups: dict[tuple[str, str], dict] = {}
    for r in results:
        if r["outcome"] != "fail":
            continue
        g = groups.setdefault((r["backend"], likely_cause(r)), {
            "backend": r["backend"], "cause": likely_cause(r), "clauses": set(), "cells": set(),
            "tests": 0, "results": []})
        g["clauses"].update(r["clauses"])
        g["cells"].add(cell(r))
        g["tests"] += 1
        g["results"].append(r)
    out = []
    for g in groups.values():
        errors = [e for e in map(relative_error, g["results"]) if e is not None]
        typical = statistics.median(errors) if errors else None
        out.append({**g, "clauses": sorted(g["clauses"]), "cells": sorted(g["cells"]),
                    "typical_relative_error": None if typical is None else finite_or_none(typical),
                    "common": common_fields(g.pop("results"))})
    return sorted(out, key=lambda g: (g["backend"], -len(g["clauses"]), -g["tests"], g["cause"]))


def describe_group(group: dict) -> str:
    """One line for a failure group, e.g. ``b: 21 clauses (24 tests) on cpu/float64 fail by ~1e-07
    relative: every such float64 value check fails by a little: float32 arithmetic inside ...``."""
    typical = group.get("typical_relative_error")
    by = f" fail by ~{typical:.0e} relative" if typical is not None else " fail"
    common = describe_common(group.get("common") or {})
    return (f"{group['backend']}: {len(group['clauses'])} clauses ({group['tests']} tests) on "
            f"{', '.join(group['cells'])}{by}: {group['cause']} "
            f"[{', '.join(group['clauses'][:12])}{', ...' if len(group['clauses']) > 12 else ''}]"
            + (f"; common to every failing case: {common}" if common else ""))


def describe_common(common: dict) -> str:
    """``d_k=1, d_v=1, use_bias=True`` (the first 8 fields), or "" when none."""
    items = [f"{k}={v}" for k, v in list(common.items())[:8]]
    return ", ".join(items) + (", ..." if len(common) > 8 else "")
