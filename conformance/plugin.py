"""The mhaspec pytest plugin (registered through the ``pytest11`` entry point).

* ``--backend NAME|module:attr`` (repeatable) chooses the backends; default: every registered
  in-repo backend whose framework imports.
* ``--mhaspec-profile dev|ci|certify|triage`` chooses the Hypothesis profile (``ci`` is
  derandomized; ``triage`` is ``ci`` without shrinking).
* ``--mhaspec-report FILE.json`` writes every result with its clause, backend, device and dtype.
* ``--mhaspec-call-timeout SECONDS`` limits every backend call (default 60 s; 0: no limit).
* ``--mhaspec-failures DIR`` saves every failing case that has arrays for ``mhaspec replay``.
* ``--mhaspec-shrink-all`` shrinks every failure; by default only the first failure of each
  backend x device x dtype cell (per worker) is shrunk, later ones run without Hypothesis's shrink
  phase (one cause often fails many clauses).
* The items run cell by cell; with pytest-xdist workers (``-n``) and no ``--dist``, distributed by
  work stealing, so each cell's compilations happen in one worker (:mod:`.scheduling`).

A failed result carries a readable ``message`` (:func:`readable_failure`), the exception
(``crash``), the value check's finding (``failure``: error and magnitude, from the harness), the
replay line and whether it was shrunk; the terminal summary groups failures by likely cause
(:func:`verdicts.failure_groups`). A test may name a clause only if it requires the capabilities
the clause needs (:mod:`clause_capabilities`); a backend may scope capabilities and deviations to
one operation (``capabilities_for(op)``, ``"CLAUSE@op"`` keys; :func:`harness.op_capabilities`).

The run's state lives in ``config.stash``: :data:`COLLECTOR_KEY` holds the :class:`Collector`
(results, not-run records, progress), :data:`BACKENDS_KEY` the loaded backends and
``harness.SETTINGS_KEY`` the settings the suite reads. A program that runs pytest in-process
(``mhaspec.runner``) may register a plugin object named :data:`PROVIDER` with a ``backends``
attribute (already loaded backend objects, used instead of ``--backend``) and read the collector
afterwards. Verdicts come from :mod:`mhaspec.conformance.verdicts`.

Each conformance test names its clause(s) with ``@pytest.mark.clause("MASK-9")`` and the
capability it needs with ``@pytest.mark.requires("sdpa")``. The plugin parametrizes the ``impl``
argument over backend x device x dtype. Skips and deviations are data, applied here as marks:
an unclaimed capability is skipped as "not implemented", an absent device is skipped with its
reason, and a clause the backend declares a deviation from is ``xfail(strict=True)`` — so a
declaration that no longer deviates fails as stale. Any other xfail (``pytest.xfail()`` raised by a
backend, a mark the suite did not set) is a failure (:func:`foreign_xfail`). A testable clause that no collected test names
is a usage error.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, Phase, settings, statistics
from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from mhaspec.backends import BackendLoadError, load_backend, registered_backends
from mhaspec.spec import load as load_spec

from . import (clause_capabilities, conditions, diagnosis, harness, scheduling, strategies,
               tolerance, verdicts)

NOT_IMPLEMENTED = "not implemented"
#: how the reason of the suite's own xfail mark, a declared deviation, starts
DECLARED = "declared deviation: "
OPS = harness.OPS
#: seconds a backend call may take unless ``--mhaspec-call-timeout`` says otherwise
DEFAULT_CALL_TIMEOUT = 60.0
#: name under which an in-process runner registers its plugin object providing loaded backends
PROVIDER = "mhaspec-provider"
# derandomize is explicit in every profile: Hypothesis derandomizes by default when it detects a CI
# environment, which would make dev and certify runs ignore --hypothesis-seed there.
PROFILES = {
    "dev": dict(max_examples=10, derandomize=False),
    "ci": dict(max_examples=8, derandomize=True, database=None),
    "certify": dict(max_examples=100, derandomize=False),
    # for checking the suite itself on broken backends: no shrinking, only the verdicts matter
    "triage": dict(max_examples=8, derandomize=True, database=None,
                   phases=[Phase.explicit, Phase.reuse, Phase.generate]),
}
# print_blob off: Hypothesis's "add @reproduce_failure to your test" cannot apply to a test in an
# installed suite; each failure message carries its own reproducer (replay code, mhaspec replay)
for _name, _kw in PROFILES.items():
    settings.register_profile(
        f"mhaspec-{_name}", deadline=None, print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **_kw)

CONFORMANCE_DIR = pathlib.Path(__file__).parent
BACKENDS_KEY = pytest.StashKey[list]()
SHAPES_KEY = pytest.StashKey[tuple]()


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
        outcome = classify(report)
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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mhaspec", "mhaspec conformance")
    group.addoption("--backend", action="append", default=[], metavar="NAME|module:attr",
                    help="backend to check (repeatable); default: every registered in-repo backend")
    group.addoption("--framework", action="append", default=[], metavar="NAME",
                    help="only registered backends of this framework (numpy, torch, jax, "
                         "tensorflow, keras); repeatable")
    group.addoption("--mhaspec-profile", default=None, choices=sorted(PROFILES),
                    help="Hypothesis profile: dev (default), ci (derandomized), certify (thorough), "
                         "triage (ci without shrinking)")
    group.addoption("--mhaspec-report", default=None, metavar="FILE",
                    help="write every result (clause, backend, device, dtype, outcome) as JSON")
    group.addoption("--mhaspec-dtypes", default=None, metavar="D1,D2",
                    help="only these dtypes (comma-separated), e.g. float64,float32")
    group.addoption("--mhaspec-shapes", default=None, choices=("free", "menu"),
                    help=f"free: draw every size from the menus of sizes; menu: draw whole shapes "
                         f"from the fixed list of {len(strategies.CI_SHAPES)} (compiled variants "
                         f"then compile each once); default: menu for the ci and triage "
                         f"profiles, free otherwise")
    group.addoption("--mhaspec-examples", default=None, type=int, metavar="N",
                    help="Hypothesis examples per test, overriding the profile's max_examples "
                         "(the soak uses it to make fewer, longer rounds)")
    group.addoption("--mhaspec-call-timeout", default=DEFAULT_CALL_TIMEOUT, type=float,
                    metavar="SECONDS",
                    help=f"time limit of every backend call; past it the test fails (default "
                         f"{DEFAULT_CALL_TIMEOUT:g}; 0: no limit)")
    group.addoption("--mhaspec-partial", action="store_true",
                    help="developing new clauses: do not fail when a testable clause has no test")
    group.addoption("--mhaspec-failures", default=None, metavar="DIR",
                    help="save each failing case as DIR/<test>.npz for `mhaspec replay`")
    group.addoption("--mhaspec-shrink-all", action="store_true",
                    help="shrink every failing test's example; default: only the first failure "
                         "of each backend x device x dtype cell (one cause often fails many "
                         "clauses, and shrinking each costs most of the run)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(*ids): the spec clause(s) a conformance test checks")
    config.addinivalue_line("markers", "requires(*capabilities): backend capabilities a test needs")
    config.addinivalue_line("markers", "dtypes(*names): restrict a test to these dtypes")
    profile = config.getoption("--mhaspec-profile") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(f"mhaspec-{profile}")
    examples = config.getoption("--mhaspec-examples")
    if examples is not None:
        if examples < 1:
            raise pytest.UsageError(f"--mhaspec-examples must be at least 1, got {examples}")
        settings.register_profile(f"mhaspec-{profile}-{examples}", settings(), max_examples=examples)
        settings.load_profile(f"mhaspec-{profile}-{examples}")
    timeout = config.getoption("--mhaspec-call-timeout")
    if not timeout >= 0:  # also NaN
        raise pytest.UsageError(f"--mhaspec-call-timeout must be at least 0, got {timeout}")
    shapes = config.getoption("--mhaspec-shapes") or ("menu" if profile in ("ci", "triage") else "free")
    config.stash[SHAPES_KEY] = strategies.CI_SHAPES if shapes == "menu" else None
    refs: dict[str, str] = {}
    backends = _backends(config, refs)
    config.stash[BACKENDS_KEY] = backends
    collector = Collector(config, backends)
    config.pluginmanager.register(collector, "mhaspec-collector")
    collector.hypothesis = {"profile": profile, "shapes": shapes}
    config.stash[COLLECTOR_KEY] = collector
    failures = config.getoption("--mhaspec-failures")
    config.stash[harness.SETTINGS_KEY] = harness.RunSettings(
        failures_dir=pathlib.Path(failures) if failures else None, backend_refs=refs,
        call_timeout=timeout or None)


def _backends(config: pytest.Config, refs: dict[str, str]) -> list:
    """The backends of this run: those a :data:`PROVIDER` plugin hands over, then ``--backend``
    references (or, without either, every registered backend whose framework imports)."""
    provider = config.pluginmanager.get_plugin(PROVIDER)
    loaded = list(getattr(provider, "backends", []))
    refs.update({b.name: getattr(provider, "refs", {}).get(b.name, b.name) for b in loaded})
    given = config.getoption("--backend")
    frameworks = set(config.getoption("--framework"))
    provided = set(getattr(provider, "refs", {}).values())
    for ref in [r for r in given if r not in provided] or ([] if loaded or given else
                                                             registered_backends()):
        try:
            backend = load_backend(ref)
        except BackendLoadError as exc:
            if given:
                raise pytest.UsageError(str(exc)) from None
            continue  # framework not installed: `--backend` it explicitly to see why
        if frameworks and backend.framework not in frameworks:
            continue
        refs.setdefault(backend.name, ref)
        loaded.append(backend)
    return loaded


def operation_of(op: str | None, needs: set[str]) -> str | None:
    """The operation a test exercises, for per-operation scoping: its ``op`` parameter, else the
    one of "mha" / "sdpa" it requires (None for neither)."""
    return op or next((o for o in ("mha", "sdpa") if o in needs), None)


def _scoped(backend, op: str | None) -> frozenset:
    """:func:`harness.op_capabilities`, refused when it claims more than ``capabilities``."""
    scoped = harness.op_capabilities(backend, op)
    extra = sorted(scoped - set(backend.capabilities))
    if extra:
        raise pytest.UsageError(f"backend {backend.name}: capabilities_for({op!r}) claims {extra}, "
                                f"which its capabilities (every operation's together) lack")
    return scoped


def _impl_params(metafunc: pytest.Metafunc, backends: list, op: str | None = None) -> list:
    clauses = [c for m in metafunc.definition.iter_markers("clause") for c in m.args]
    needs = {c for m in metafunc.definition.iter_markers("requires") for c in m.args}
    needs |= {op} if op else set()
    scope = operation_of(op, needs)
    only = {d for m in metafunc.definition.iter_markers("dtypes") for d in m.args}
    chosen = metafunc.config.getoption("--mhaspec-dtypes")
    chosen = set(chosen.split(",")) if chosen else None
    collector = metafunc.config.stash[COLLECTOR_KEY]
    params = []
    for backend in backends:
        missing = sorted(needs - _scoped(backend, scope))
        for device, unavailable in backend.devices().items():
            dtypes = backend.dtypes(device) if unavailable is None else ("float32",)
            for dtype in dtypes:
                deviations = harness.op_deviations(harness.cell_deviations(backend, device, dtype),
                                                     scope)
                declared = [c for c in clauses if c in deviations]
                if only and dtype not in only:
                    continue
                if chosen and dtype not in chosen:
                    if clauses and unavailable is None and not missing:
                        collector.add_not_run({
                            "backend": backend.name, "device": device, "dtype": dtype,
                            "clauses": clauses, "why": "--mhaspec-dtypes",
                            "test": f"{metafunc.definition.name}[{op or ''}]"})
                    continue
                marks = []
                if unavailable is not None:
                    marks.append(pytest.mark.skip(reason=f"device unavailable: {unavailable}"))
                elif missing:
                    marks.append(pytest.mark.skip(
                        reason=f"{NOT_IMPLEMENTED}: {backend.name} does not claim {missing}"
                               + (f" for {scope}" if set(missing) <= set(backend.capabilities) else "")))
                elif declared:
                    marks.append(pytest.mark.xfail(
                        strict=True, reason=DECLARED + "; ".join(
                            f"{c}: {deviations[c]}" for c in declared)))
                impl = harness.Impl(backend, device, dtype)
                if op is None:
                    params.append(pytest.param(impl, id=impl.id, marks=marks))
                else:
                    params.append(pytest.param(impl, op, id=f"{impl.id}-{op}", marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``impl`` (and ``op``: "sdpa" / "mha", each needing its capability)."""
    if "impl" not in metafunc.fixturenames:
        return
    backends = metafunc.config.stash[BACKENDS_KEY]
    if "op" in metafunc.fixturenames:
        metafunc.parametrize(("impl", "op"), [p for op in OPS for p in _impl_params(metafunc, backends, op)])
    else:
        metafunc.parametrize("impl", _impl_params(metafunc, backends))


def _record(item: pytest.Item, why: str = "") -> dict | None:
    """The not-run record of a conformance test item (None for other items)."""
    impl = getattr(getattr(item, "callspec", None), "params", {}).get("impl")
    clauses = [c for m in item.iter_markers("clause") for c in m.args]
    if not isinstance(impl, harness.Impl) or not clauses:
        return None
    return {"backend": impl.backend.name, "device": impl.device, "dtype": impl.dtype,
            "clauses": clauses, "test": item.nodeid.split("::")[-1], "why": why}


def _not_run_record(item: pytest.Item, why: str) -> dict | None:
    """The not-run record of an item of a claimed cell: None for other items and for items of a
    capability the backend does not claim (those report "not implemented" whether run or not)."""
    skip = item.get_closest_marker("skip")
    if skip is not None and str(skip.kwargs.get("reason", "")).startswith(NOT_IMPLEMENTED):
        return None
    return _record(item, why)


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config):
    """With pytest-xdist workers and no ``--dist``, distribute by work stealing over the items
    ordered cell by cell (:mod:`scheduling`)."""
    scheduling.default_dist(config.option)
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    """Order the items cell by cell, by spec clause within a cell (:func:`scheduling.by_cell`).
    Every testable clause must be named by a test when the whole suite is collected; when only part of it is, the clauses no
    collected test names are recorded as not run."""
    items[:] = scheduling.by_cell(items, [b.name for b in config.stash.get(BACKENDS_KEY, [])],
                                  [c.id for c in load_spec().clauses])
    if not any(_record(item) for item in items):
        return
    _check_clause_tags(items)
    modules = {pathlib.Path(str(item.fspath)).resolve() for item in items}
    suite = {p.resolve() for p in CONFORMANCE_DIR.glob("test_*.py")}
    named = {c for item in items for m in item.iter_markers("clause") for c in m.args}
    spec = load_spec()
    untested = sorted(set(spec.testable_ids) - named)
    config.stash[COLLECTOR_KEY].unnamed = set(untested)
    if not suite or not suite <= modules or config.getoption("--mhaspec-partial"):
        return
    unknown = sorted(named - {c.id for c in spec.clauses})
    if unknown or untested:
        raise pytest.UsageError(f"conformance suite out of step with spec {spec.version}: "
                                f"clauses without a test: {untested}; unknown clause ids: {unknown}")


def _check_clause_tags(items) -> None:
    """Refuse a test that names a clause it cannot exercise: every capability the clause needs
    (:data:`clause_capabilities.NEEDS`) must be one the test requires or its operation."""
    wrong: dict[str, str] = {}
    for item in items:
        if _record(item) is None:
            continue
        have = {c for m in item.iter_markers("requires") for c in m.args}
        have |= {item.callspec.params["op"]} if "op" in item.callspec.params else set()
        clauses = [c for m in item.iter_markers("clause") for c in m.args]
        for clause, missing in clause_capabilities.untestable_tags(clauses, have).items():
            name = getattr(item, "originalname", None) or item.name
            wrong[f"{name} names {clause}"] = f"needs {missing}"
    if wrong:
        raise pytest.UsageError(
            "conformance tests name clauses they cannot exercise (require the capabilities or "
            "drop the clause): " + "; ".join(f"{k} ({v})" for k, v in sorted(wrong.items())))


def pytest_deselected(items) -> None:
    """Items dropped by ``-k``, ``-m`` or ``--deselect`` did not run."""
    for item in items:
        record = _not_run_record(item, "deselected")
        if record is not None:
            item.config.stash[COLLECTOR_KEY].add_not_run(record)


def pytest_collection_finish(session: pytest.Session) -> None:
    collector = session.config.stash[COLLECTOR_KEY]
    for item in session.items:
        record = _record(item, "not reached")
        if record is not None:
            collector.totals[record["backend"]] += 1
            if _not_run_record(item, "not reached") is not None:
                collector.expected[item.nodeid] = record


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """The controller of an xdist run learns the items (for progress and not-run records) from
    the node ids, whose parameter id starts with the backend's name."""
    collector = node.config.stash[COLLECTOR_KEY]
    if collector.totals:
        return
    names = sorted((b.name for b in collector.backends), key=len, reverse=True)
    for nodeid in ids:
        param = nodeid.rpartition("[")[2]
        name = next((n for n in names if param.startswith(f"{n}-")), None)
        if name is not None:
            collector.totals[name] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its not-run records to the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        collector = session.config.stash[COLLECTOR_KEY]
        out["mhaspec_not_run"] = json.dumps(list(collector.unselected.values()))
        out["mhaspec_expected"] = json.dumps(collector.expected)
        out["mhaspec_unnamed"] = json.dumps(sorted(collector.unnamed))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    out = getattr(node, "workeroutput", {}) or {}
    collector = node.config.stash[COLLECTOR_KEY]
    for record in json.loads(out.get("mhaspec_not_run", "[]")):
        collector.add_not_run(record)
    collector.expected.update(json.loads(out.get("mhaspec_expected", "{}")))
    collector.unnamed |= set(json.loads(out.get("mhaspec_unnamed", "[]")))


#: the phases whose valid test cases count as examples run (shrinking re-runs are not counted)
COUNTED_PHASES = ("explicit", "reuse", "generate", "target")


@pytest.hookimpl(wrapper=True, trylast=True)  # innermost: inside Hypothesis's own wrapper
def pytest_runtest_call(item: pytest.Item):
    token = harness.current_item.set(item)
    shapes = strategies.shape_menu.set(item.config.stash.get(SHAPES_KEY, None))
    outer = statistics.collector.value  # Hypothesis's own (for --hypothesis-show-statistics)

    def count_examples(stats: dict) -> None:
        item.mhaspec_examples = getattr(item, "mhaspec_examples", 0) + sum(
            case["status"] == "valid" for phase in COUNTED_PHASES
            for case in stats.get(f"{phase}-phase", {}).get("test-cases", []))
        if outer is not None:
            outer(stats)

    restore = _no_shrink_after_a_failure(item)
    try:
        with statistics.collector.with_value(count_examples):
            return (yield)
    finally:
        restore()
        strategies.shape_menu.reset(shapes)
        harness.current_item.reset(token)


def _no_shrink_after_a_failure(item: pytest.Item):
    """Run ``item`` without Hypothesis's shrink (and explain) phases when its cell already has a
    failed test and ``--mhaspec-shrink-all`` is not given; returns what undoes it. The settings
    are the wrapped test's own, read by Hypothesis when the test is called."""
    collector = item.config.stash.get(COLLECTOR_KEY, None)
    impl = getattr(getattr(item, "callspec", None), "params", {}).get("impl")
    test = getattr(item, "obj", None)
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    # True: may shrink; False: not shrunk after an earlier failure; None: nothing to shrink (not a
    # Hypothesis test, or a profile without shrinking such as triage)
    item.mhaspec_shrink = True if own is not None and Phase.shrink in own.phases else None
    if (collector is None or collector.shrink_all or not isinstance(impl, harness.Impl) or own is None
            or (impl.backend.name, impl.device, impl.dtype) not in collector.failed_cells
            or Phase.shrink not in own.phases):
        return lambda: None
    item.mhaspec_shrink = False
    test._hypothesis_internal_use_settings = settings(
        own, phases=[p for p in own.phases if p not in (Phase.shrink, Phase.explain)])

    def restore() -> None:
        test._hypothesis_internal_use_settings = own

    return restore


def foreign_xfail(item: pytest.Item, call) -> str | None:
    """Why an expected failure of ``item`` is not the suite's (None when it is): the test raised
    pytest's xfail exception (a backend's code, not a declaration), or an xfail mark other than the
    suite's strict declared-deviation mark applies. Such an xfail is a failure."""
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.xfail.Exception):
        return f"pytest.xfail() raised during the test ({call.excinfo.value})"
    for mark in item.iter_markers("xfail"):
        if mark.kwargs.get("strict") is not True or not str(mark.kwargs.get("reason", "")).startswith(
                DECLARED):
            return f"an xfail mark the suite did not set ({mark.kwargs.get('reason', '')!r:.200})"
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: sees the report skipping made
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if report.when == "call" and hasattr(report, "wasxfail") and (why := foreign_xfail(item, call)):
        del report.wasxfail
        report.outcome = "failed"
        report.longrepr = f"an expected failure the suite did not declare is a failure: {why}"
    left_out = conditions.sub_cases_left_out(item) if report.when == "call" else []
    if left_out and report.failed and call.excinfo.errisinstance(
            (Unsatisfiable, FailedHealthCheck)):  # every case drew a sub-case the backend does
        # not support (Hypothesis found none to run): not implemented, not a failure
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"{NOT_IMPLEMENTED}: sub-cases {'; '.join(left_out)}")
    record = _record(item)
    if record is not None:
        del record["why"]
        info = {**record, "ratios": getattr(item, "mhaspec_ratios", {}),
                "calls": getattr(item, "mhaspec_calls", 0),
                "examples": getattr(item, "mhaspec_examples", 0),
                "validated_by_adapter": _validated_by_adapter(item.callspec.params["impl"].backend,
                                                              record["clauses"])}
        if report.when == "call":  # the rows of each clause's condition space its cases held,
            # and the values a capability the backend does not claim kept out (not implemented)
            params = item.callspec.params
            claims = harness.op_capabilities(params["impl"].backend, params.get("op"))
            info["conditions"] = conditions.ran(item, record["clauses"])
            info["conditions_not_implemented"] = conditions.unclaimed(record["clauses"], claims,
                                                                      item)
        if report.when == "call" and report.failed:
            report.sections.append(("mhaspec: the clause", clause_lines(record["clauses"])))
            info["replay"] = harness.save_last_call(item, record["clauses"][0]) or None
            info["failure"] = getattr(item, "mhaspec_failure", None)
            info["shrunk"] = getattr(item, "mhaspec_shrink", None)
        if report.when == "call":
            item.mhaspec_last_call = None  # its arrays are not kept for the rest of the run
        report.user_properties.append(("mhaspec", info))
    return report


def _validated_by_adapter(backend, clauses: list[str]) -> list[str]:
    """The clauses of a test that the backend's adapter satisfies by its shared validation
    (``validated_clauses``): none when the test names a clause left to the library
    (``library_validates``), whose invalid input then reaches the library."""
    if set(clauses) & set(getattr(backend, "library_validates", ())):
        return []
    return sorted(set(clauses) & set(getattr(backend, "validated_clauses", ())))


def _write_diagnoses(tr, config: pytest.Config, failed: set[str]) -> None:
    """A line per failing backend that a cheap differential check explains
    (:func:`diagnosis.diagnose`), e.g. "agrees with the oracle at scale = 1"."""
    for backend in config.stash.get(BACKENDS_KEY, []):
        if backend.name in failed:
            try:
                found = diagnosis.diagnose(backend)
            except Exception as exc:  # noqa: BLE001 - a diagnosis is a hint, never a crash
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
    """The exception a failed test raised, as ``Type: message`` (AssertionError's type left out)."""
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "") or ""
    return crash.removeprefix("AssertionError: ")


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


def pytest_unconfigure(config: pytest.Config) -> None:
    collector = config.stash.get(COLLECTOR_KEY, None)
    if collector is not None and config.pluginmanager.is_registered(collector):
        config.pluginmanager.unregister(collector)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    collector = config.stash.get(COLLECTOR_KEY, None)
    if collector is None or not (collector.results or collector.unselected):
        return
    results = collector.results
    report = collector.report()
    backends = sorted(report)
    spec = load_spec()
    table = verdicts.summarize(results)
    clauses = [c.id for c in spec.clauses if any((b, c.id) in table for b in backends)]
    tr = terminalreporter
    tr.section(f"mhaspec {spec.version} conformance by clause")
    width = max(max(len(b) for b in backends), 6)
    tr.write_line("clause    " + " ".join(b.rjust(width)[:width] for b in backends))
    entries = {b: {c["id"]: c for c in report[b]["clauses"]} for b in backends}
    for c in clauses:
        cells = [verdicts.table_symbol(table[(b, c)]["outcome"], entries[b].get(c))
                 if (b, c) in table else "" for b in backends]
        tr.write_line(f"{c:<9} " + " ".join(s.rjust(width) for s in cells))
    if any(c.get("satisfied_by") for b in backends for c in report[b]["clauses"]):
        tr.write_line("ok*: passed by the adapter's shared argument validation, not by the library")
    for b in backends:
        for c in report[b]["clauses"]:
            if c.get("stale_on"):
                tr.write_line(f"{verdicts.SYMBOL[c['verdict']]}* {b} {c['id']}: stale on "
                              f"{', '.join(c['stale_on'])}")
    tr.section("mhaspec conformance by backend")
    for b in backends:
        counts = defaultdict(int)
        for (bb, _), entry in table.items():
            if bb == b:
                counts[entry["outcome"]] += 1
        # a confirmed deviation's ratio (often inf: NaN where the oracle is finite) is its own story
        worst = max(((e["ratio"], c) for (bb, c), e in table.items()
                     if bb == b and e["outcome"] in ("pass", "fail")), default=None)
        combos = sorted({(r["device"], r["dtype"]) for r in results
                         if r["backend"] == b and r["outcome"] != "unavailable"})
        verdict = report[b]["verdict"]
        gaps = sorted({f"{c['id']} ({', '.join(c['not_run_on'])})"
                       for c in report[b]["clauses"] if c["not_run_on"]})
        line = (f"{b}: {verdict.upper()} - "
                + ", ".join(f"{counts[k]} {k}" for k in verdicts.SEVERITY if counts[k])
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
        _write_diagnoses(tr, config, {r["backend"] for r in results if r["outcome"] == "fail"})
        for g in groups:
            tr.write_line(verdicts.describe_group(g))
    path = config.getoption("--mhaspec-report")
    if path:
        pathlib.Path(path).write_text(json.dumps(results, indent=1), encoding="utf-8")
        tr.write_line(f"mhaspec: results written to {path}")
