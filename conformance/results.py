"""The plugin's result model: what a run found, test by test, and how it is shown.

:class:`Collector` keeps every result (one dict per test item, see :mod:`.verdicts`), the not-run
records and per-backend progress and seconds; :func:`classify` turns a pytest report into an
outcome; :func:`readable_failure` writes a failure as people read it; :func:`write_summary` prints
the run's tables by clause and by backend and its failures by likely cause. Verdicts come from
:mod:`.verdicts`, beside it.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections import defaultdict

import pytest
from hypothesis import settings

from mhaspec.spec import load as load_spec

from . import diagnosis, tolerance, verdicts

NOT_IMPLEMENTED = "not implemented"


class Collector:
    """What one run found: every result, every test item of a claimed cell that did not run, and
    per-backend progress. Kept in ``config.stash[COLLECTOR_KEY]``.

    ``results``: one dict per test item (see :mod:`~mhaspec.conformance.verdicts`), also written by
    ``--mhaspec-report``; :meth:`not_run` the not-run records; ``seconds``: backend -> seconds its
    tests took (setup, call and teardown); ``hypothesis``: the settings the run used."""

    def __init__(self, config: pytest.Config, backends: list) -> None:
        self.config = config
        self.backends = backends
        self.results: list[dict] = []
        self.unselected: dict[tuple, dict] = {}  # (test, backend, device, dtype) -> record
        self.expected: dict[str, dict] = {}  # nodeid -> record of every item selected to run
        self.unnamed: set[str] = set()  # testable clauses no collected test names
        self.totals: dict[str, int] = defaultdict(int)  # backend -> items selected
        self.done: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()
        self.last_progress: dict[str, float] = {}
        self.hypothesis: dict = {}
        self.selection: dict = {}
        #: (backend, device, dtype) cells with a failed test: later failures there are not shrunk
        self.failed_cells: set[tuple[str, str, str]] = set()
        self.shrink_all: bool = bool(config.getoption("--mhaspec-shrink-all"))
        timeout = config.getoption("--mhaspec-call-timeout")
        self.call_timeout: float | None = timeout or None

    def claimed(self) -> dict[str, dict[str, list[str]]]:
        """backend name -> available device -> claimed dtypes."""
        return {b.name: {d: list(b.dtypes(d)) for d, why in b.devices().items() if why is None}
                for b in self.backends}

    def not_run(self) -> list[dict]:
        """Test items of claimed cells that did not run, and testable clauses no test named."""
        reported = {r["nodeid"] for r in self.results}
        records = list(self.unselected.values())
        records += [rec for nodeid, rec in self.expected.items() if nodeid not in reported]
        for name, devices in self.claimed().items():
            records += [{"backend": name, "device": d, "dtype": t, "clauses": sorted(self.unnamed),
                         "test": "(not collected)", "why": "no collected test names these clauses"}
                        for d, dtypes in devices.items() for t in dtypes if self.unnamed]
        return records

    def add_not_run(self, record: dict) -> None:
        self.unselected[(record["test"], record["backend"], record["device"], record["dtype"])] = record

    def report(self) -> dict[str, dict]:
        """backend -> clause entries and verdict (:func:`verdicts.backend_report`)."""
        return verdicts.backend_report(self.results, load_spec(), self.claimed(), self.not_run())

    # hooks: the collector is registered as a plugin of its run (pytest_configure)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Record the Hypothesis settings as the run uses them (after every plugin's configure)."""
        now = settings()
        seed = self.config.getoption("hypothesis_seed", None)
        self.hypothesis.update(max_examples=now.max_examples, derandomize=now.derandomize,
                               phases=[p.name for p in now.phases],
                               seed=None if seed is None else str(seed))
        option = self.config.getoption
        self.selection = {"keyword": option("keyword") or None, "markers": option("markexpr") or None,
                          "deselect": list(option("deselect") or []),
                          "dtypes": option("--mhaspec-dtypes")}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        info = dict(report.user_properties).get("mhaspec")
        if info is None:
            return
        self.seconds[info["backend"]] += report.duration
        outcome = verdicts.with_behaviours(classify(report), info)
        if outcome is None:
            return
        entry = {**info, "nodeid": report.nodeid, "outcome": outcome, "duration": report.duration}
        if outcome in ("fail", "deviation"):
            self.failed_cells.add((info["backend"], info["device"], info["dtype"]))
        if outcome in verdicts.BAD:
            entry["crash"] = _crash(report)
            entry["message"] = readable_failure(entry, report)
        else:
            for key in ("failure", "replay", "shrunk"):
                entry.pop(key, None)
        self.results.append(entry)
        self.done[info["backend"]] += 1
        _progress(self.config, self, info["backend"])


COLLECTOR_KEY = pytest.StashKey[Collector]()


def _write_diagnoses(tr, backends: list, failed: set[str]) -> None:
    """A line per failing backend that a cheap differential check explains
    (:func:`diagnosis.diagnose`), e.g. "agrees with the oracle at scale = 1"."""
    for backend in backends:
        if backend.name in failed:
            try:
                found = diagnosis.diagnose(backend)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - a hint, never a crash: also a call past
                # its time limit or a backend process that died (BaseExceptions, as CallTimeout)
                found = f"(no diagnosis: the checks raised {type(exc).__name__})"
            if found:
                tr.write_line(f"{backend.name}: diagnosis: {found}")


def clause_lines(clause_ids) -> str:
    """Each clause a failing test checks, as a reader looks it up: id, title, and the anchor on
    the site's frozen page of this spec version (``spec/1.2/#SDPA-2``), which keeps its meaning
    when a later version changes the clause."""
    spec = load_spec()
    known = {c.id: c for c in spec.clauses}
    return "\n".join(f"{spec.name} {spec.version}, clause {cid}: {known[cid].title} "
                     f"(spec/{spec.version}/#{cid} on the mhaspec site)"
                     for cid in clause_ids if cid in known)


def _crash(report: pytest.TestReport) -> str:
    """The exception a failed test raised, as ``Type: message`` (AssertionError's type left out);
    for several distinct failures (Hypothesis's exception group: the covering rows are explicit
    examples, and each failing one is reported) each of them, in the order raised, so the message
    names the clause as a single failure's does."""
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "") or ""
    if crash.startswith(("ExceptionGroup", "BaseExceptionGroup")):
        leaves = GROUPED_FAILURE.findall(report.longreprtext)
        if leaves:
            crash = f"{len(leaves)} distinct failures: " + "; ".join(
                f"{kind}: {text}".removeprefix("AssertionError: ") for kind, text in leaves)
    return crash.removeprefix("AssertionError: ")


#: one failure inside an exception group's traceback (``  | ValueError: ...``)
GROUPED_FAILURE = re.compile(r"^\s*\| ([A-Za-z_][\w.]*(?:Error|Exception|Timeout)): (.+)$", re.M)


#: Hypothesis's note naming the failing example (the wording changed across versions)
FALSIFYING = re.compile(r"^(?:Falsifying (?:explicit )?example|Failing test case): (\w+\(.*?^\))",
                        re.M | re.S)
#: Hypothesis's advice on @reproduce_failure: the replay line is the suite's way
REPRODUCE_FAILURE = re.compile(r"^You can reproduce this (?:test case|example) by temporarily.*$\n?",
                               re.M)


def readable_failure(entry: dict, report: pytest.TestReport, limit: int = 4000) -> str:
    """A failure as people read it: the test, its cell and clauses; what it found (the expected
    vs got of the check, or the exception); the case Hypothesis found; how to replay it."""
    lines = [f"{entry['test']} on {entry['backend']} ({entry['device']}, {entry['dtype']}), "
             f"clauses {', '.join(entry['clauses'])}:"]
    crash = REPRODUCE_FAILURE.sub("", entry.get("crash") or report.longreprtext[-limit // 2:])
    lines.append(crash.strip()[:3 * limit // 4])
    example = FALSIFYING.search(report.longreprtext)
    if example is not None and example.group(1) not in crash:
        lines.append("case: " + " ".join(example.group(1).split())[:limit // 4])
    if entry.get("replay") and entry["replay"] not in crash:
        lines.append("replay: " + entry["replay"])
    if entry.get("shrunk") is False:
        lines.append("(not shrunk: an earlier test of this cell failed; --mhaspec-shrink-all)")
    return "\n".join(lines)[:limit]


def classify(report: pytest.TestReport) -> str | None:
    """pass / fail / deviation / stale-deviation / not-implemented / unavailable, or None."""
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "deviation" if report.skipped else "stale-deviation"
        if report.skipped:  # every case a sub-case the backend does not support (conditions)
            return "not-implemented"
        if report.failed and "[XPASS(strict)]" in str(report.longrepr):
            return "stale-deviation"
        return "pass" if report.passed else "fail"
    if report.skipped and report.when == "setup":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        return "not-implemented" if NOT_IMPLEMENTED in reason else "unavailable"
    if report.failed:
        return "fail"
    return None


PROGRESS_EVERY = 10.0  # seconds between two progress lines of one backend


def _progress(config: pytest.Config, collector: Collector, backend: str) -> None:
    """A progress line per backend: its items done of those selected, and the time elapsed;
    at most every :data:`PROGRESS_EVERY` seconds, and when the backend's last item is done."""
    done, total = collector.done[backend], collector.totals.get(backend, 0)
    now = time.monotonic()
    if done != total and now - collector.last_progress.get(backend, collector.started) < PROGRESS_EVERY:
        return
    collector.last_progress[backend] = now
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    tw = getattr(tr, "_tw", None)  # -q writes its dots with no file name, so ensure_newline()
    if tw is not None and tw.width_of_current_line:  # alone would glue the line onto them
        tr.write("\n")
    tr.write_line(f"mhaspec progress: {backend} {done}/{total or '?'} tests, "
                  f"{now - collector.started:.1f} s elapsed")


def write_summary(tr, collector: Collector) -> None:
    """The run's terminal summary: verdicts by clause and by backend, failures by likely cause,
    and the report file when ``--mhaspec-report`` asks for one."""
    config = collector.config
    results = collector.results
    report = collector.report()
    backends = sorted(report)
    spec = load_spec()
    table = verdicts.summarize(results)
    clauses = [c.id for c in spec.clauses if any((b, c.id) in table for b in backends)]
    tr.section(f"mhaspec {spec.version} conformance by clause")
    width = max(max(len(b) for b in backends), 6)
    tr.write_line("clause    " + " ".join(b.rjust(width)[:width] for b in backends))
    entries = {b: {c["id"]: c for c in report[b]["clauses"]} for b in backends}
    for c in clauses:
        cells = [verdicts.table_symbol(table[(b, c)]["outcome"], entries[b].get(c))
                 if (b, c) in table else "" for b in backends]
        tr.write_line(f"{c:<9} " + " ".join(s.rjust(width) for s in cells))
    if any(c.get("satisfied_by") for b in backends for c in report[b]["clauses"]):
        tr.write_line("ok*: passed by the adapter (its shared argument validation, or its fold of a "
                      "feature into the masks), not by the library")
    for b in backends:
        for c in report[b]["clauses"]:
            if c.get("stale_on"):
                tr.write_line(f"{verdicts.SYMBOL[c['verdict']]}* {b} {c['id']}: stale on "
                              f"{', '.join(c['stale_on'])}")
    tr.section("mhaspec conformance by backend")
    for b in backends:
        # a confirmed deviation's ratio (often inf: NaN where the oracle is finite) is its own story
        worst = max(((e["ratio"], c) for (bb, c), e in table.items()
                     if bb == b and e["outcome"] in ("pass", "fail")), default=None)
        combos = sorted({(r["device"], r["dtype"]) for r in results
                         if r["backend"] == b and r["outcome"] != "unavailable"})
        verdict = report[b]["verdict"]
        gaps = sorted({f"{c['id']} ({', '.join(c['not_run_on'])})"
                       for c in report[b]["clauses"] if c["not_run_on"]})
        line = (f"{b}: {verdict.upper()} - "
                + ", ".join(f"{n} {k}" for k, n in verdicts.outcome_counts(table, b).items())
                + ("; no NUM-3 ratio measured" if worst is None else
                   f"; worst NUM-3 ratio {tolerance.format_ratio(worst[0])} ({worst[1]}, "
                   f"K={tolerance.K:g})")
                + "; ran on " + (", ".join(f"{d}/{t}" for d, t in combos) or "nothing")
                + f"; {collector.seconds.get(b, 0.0):.1f} s in its tests")
        if gaps:
            line += f"; not run: {len(gaps)} clauses, e.g. " + "; ".join(gaps[:3])
        tr.write_line(line)
        for note in verdicts.backend_notes(report[b]["clauses"]):
            tr.write_line(f"  {b}: {note}")
    groups = verdicts.failure_groups(results)
    if groups:
        tr.section("mhaspec failures by likely cause")
        _write_diagnoses(tr, collector.backends, {r["backend"] for r in results if r["outcome"] == "fail"})
        for g in groups:
            tr.write_line(verdicts.describe_group(g))
    path = config.getoption("--mhaspec-report")
    if path:
        pathlib.Path(path).write_text(json.dumps(results, indent=1), encoding="utf-8")
        tr.write_line(f"mhaspec: results written to {path}")
