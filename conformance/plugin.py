"""The mhaspec pytest plugin (registered through the ``pytest11`` entry point).

**Inert unless the run asks for mhaspec.** Installed, the plugin is loaded into every pytest run
of the environment; it acts only when the run names the suite (``--pyargs mhaspec.conformance``,
a path inside the suite's folder), passes an ``--mhaspec-...`` option or ``-p mhaspec``, or is
the runner's in-process run (the rule: :mod:`.activation`). In any other run it removes itself
once the initial conftests are loaded: no Hypothesis profile, no markers, no parametrization, no
option (not even in ``--help``). Its options are all ``--mhaspec-...``; where the plugin is
active, the short spellings ``--backend`` and ``--framework`` are added too, unless a conftest or
another plugin already defines them (then only the ``--mhaspec-`` spelling selects backends).

* ``--mhaspec-backend NAME|module:attr`` (repeatable; short: ``--backend``) chooses the backends;
  default: every registered in-repo backend whose framework imports. ``--mhaspec-framework NAME``
  (short: ``--framework``) keeps the registered backends of that framework.
* ``--mhaspec-profile dev|ci|certify|triage`` chooses the Hypothesis profile (``ci`` is
  derandomized; ``triage`` is ``ci`` without shrinking).
* ``--mhaspec-report FILE.json`` writes every result with its clause, backend, device and dtype.
* ``--mhaspec-call-timeout SECONDS`` limits every backend call (default 60 s; 0: no limit).
* ``--mhaspec-failures DIR`` saves every failing case that has arrays for ``mhaspec replay``;
  ``--mhaspec-passes DIR`` the last case of every passing test (a sample to replay).
* ``--mhaspec-shrink-all`` shrinks every failure; by default only the first failure of each
  backend x device x dtype cell (per worker) is shrunk, later ones run without Hypothesis's shrink
  phase (one cause often fails many clauses).
* The items run cell by cell; with pytest-xdist workers (``-n``) and no ``--dist``, distributed by
  work stealing, so each cell's compilations happen in one worker (:mod:`.scheduling`).

A failed result carries a readable ``message`` (:func:`results.readable_failure`), the exception
(``crash``), the value check's finding (``failure``: error and magnitude, from :mod:`.expect`), the
replay line and whether it was shrunk; the terminal summary groups failures by likely cause
(:func:`verdicts.failure_groups`). A test may name a clause only if it requires the capabilities
the clause needs (:mod:`clause_capabilities`); a backend may scope capabilities and deviations to
one operation (``capabilities_for(op)``, ``"CLAUSE@op"`` keys;
:func:`~mhaspec.backends.claim_readers.op_capabilities`).

The run's state lives in ``config.stash``: :data:`COLLECTOR_KEY` holds the
:class:`~.results.Collector` (results, not-run records, progress: the result model, in
:mod:`.results`), :data:`BACKENDS_KEY` the loaded backends and ``item_state.SETTINGS_KEY`` the
settings the suite reads; each test's state is one record in its ``item.stash``
(:mod:`.item_state`). A program that runs pytest in-process
(``mhaspec.runner``) may register a plugin object named :data:`PROVIDER` with a ``backends``
attribute (already loaded backend objects, used instead of ``--mhaspec-backend``) and read the collector
afterwards. Verdicts come from :mod:`mhaspec.conformance.verdicts`.

Each conformance test names its clause(s) with ``@pytest.mark.clause("MASK-9")`` and the
capability it needs with ``@pytest.mark.requires("sdpa")``. The plugin parametrizes the ``cell``
argument (``impl``, its former name, still works) over backend x device x dtype. Skips and
deviations are data, applied here as marks: an unclaimed capability is skipped as "not
implemented", an absent device is skipped with its reason, and a clause the backend declares a
deviation from is ``xfail(strict=True)`` — so a declaration that no longer deviates fails as stale. Any other xfail (``pytest.xfail()`` raised by a
backend, a mark the suite did not set) is a failure (:func:`foreign_xfail`). A testable clause that no collected test names
is a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, Phase, settings, statistics
from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from mhaspec.backends import loadable, registered_backends
from mhaspec.backends.claim_readers import OPS, op_capabilities
from mhaspec.spec import load as load_spec

from . import (activation, adapter_credit, behaviour_checks, cell, clause_capabilities,
               condition_audit, expect, observation, results, scheduling, strategies)
from .cell_params import DECLARED, cell_params
from .item_state import SETTINGS_KEY, RunSettings, running_test, state_of
from .results import COLLECTOR_KEY, NOT_IMPLEMENTED, Collector, clause_lines

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
#: the option group of the suite's options
GROUP = "mhaspec"
#: the repeatable options naming what to run: option -> (dest, argparse keywords)
LISTS = {
    "--mhaspec-backend": ("mhaspec_backend", dict(
        action="append", default=[], metavar="NAME|module:attr",
        help="backend to check (repeatable); default: every registered in-repo backend "
             "(short: --backend)")),
    "--mhaspec-framework": ("mhaspec_framework", dict(
        action="append", default=[], metavar="NAME",
        help="only registered backends of this framework (numpy, torch, jax, tensorflow, "
             "keras); repeatable (short: --framework)")),
}
#: short spelling -> the option it stands for, added where the plugin is active and the
#: spelling is free
SHORT = {"--backend": "--mhaspec-backend", "--framework": "--mhaspec-framework"}


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args):
    """After the initial conftests: remove this plugin from a run that does not ask for mhaspec
    (:mod:`.activation`); in one that does, add the suite's options (:func:`add_options`) and
    the short spellings no conftest or other plugin defines."""
    result = yield
    known = early_config.known_args_namespace
    if not activation.asks_for_mhaspec(
            args, test_args=getattr(known, "file_or_dir", None) or [],
            plugins=getattr(known, "plugins", None) or [],
            invocation_dir=early_config.invocation_params.dir, suite_dir=CONFORMANCE_DIR,
            provided=early_config.pluginmanager.get_plugin(PROVIDER) is not None):
        early_config.pluginmanager.unregister(sys.modules[__name__])
        return result
    add_options(parser)
    group = parser.getgroup(GROUP)
    for short, full in SHORT.items():
        dest, kwargs = LISTS[full]
        try:
            group.addoption(short, dest=dest, **{**kwargs, "help": f"the same as {full}"})
        except (ValueError, argparse.ArgumentError):  # defined by a conftest or another plugin
            pass
    return result


def add_options(parser: pytest.Parser) -> None:
    """The suite's ``--mhaspec-...`` options, added only to a run that asks for mhaspec (a run that
    does not shows none, not even in ``--help``: ``pytest --pyargs mhaspec.conformance --help``
    lists them)."""
    group = parser.getgroup(GROUP, "mhaspec conformance")
    for name, (dest, kwargs) in LISTS.items():
        group.addoption(name, dest=dest, **kwargs)
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
    group.addoption("--mhaspec-passes", default=None, metavar="DIR",
                    help="save the last case of each passing test as DIR/<test>.npz: a sample "
                         "a second party can replay")
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
    refs: dict[str, str] = {}
    backends = _backends(config, refs)
    config.stash[BACKENDS_KEY] = backends
    collector = Collector(config, backends)
    config.pluginmanager.register(collector, "mhaspec-collector")
    collector.hypothesis = {"profile": profile, "shapes": shapes}
    config.stash[COLLECTOR_KEY] = collector
    failures, passes = config.getoption("--mhaspec-failures"), config.getoption("--mhaspec-passes")
    config.stash[SETTINGS_KEY] = RunSettings(
        failures_dir=pathlib.Path(failures) if failures else None,
        passes_dir=pathlib.Path(passes) if passes else None, backend_refs=refs,
        call_timeout=timeout or None, shapes=strategies.CI_SHAPES if shapes == "menu" else None)


def _backends(config: pytest.Config, refs: dict[str, str]) -> list:
    """The backends of this run: those a :data:`PROVIDER` plugin hands over, then
    ``--mhaspec-backend`` references (or, without either, every registered backend whose framework imports)."""
    provider = config.pluginmanager.get_plugin(PROVIDER)
    loaded = list(getattr(provider, "backends", []))
    refs.update({b.name: getattr(provider, "refs", {}).get(b.name, b.name) for b in loaded})
    given = config.getoption("--mhaspec-backend")
    frameworks = set(config.getoption("--mhaspec-framework"))
    provided = set(getattr(provider, "refs", {}).values())
    wanted = [r for r in given if r not in provided] or ([] if loaded or given else
                                                          list(registered_backends()))
    found = loadable(wanted)
    if given and found.failures:
        raise pytest.UsageError(next(iter(found.failures.values())))
    # without --mhaspec-backend, a backend whose framework is not installed is left out: name it
    # explicitly to see why
    for ref, backend in found.backends.items():
        if frameworks and backend.framework not in frameworks:
            continue
        refs.setdefault(backend.name, ref)
        loaded.append(backend)
    return loaded


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``cell`` (or ``impl``, its former name) and ``op``: "sdpa" / "mha"."""
    names = [n for n in (cell.ARGUMENT, cell.FORMER_ARGUMENT) if n in metafunc.fixturenames]
    if not names:
        return
    backends = metafunc.config.stash[BACKENDS_KEY]
    if "op" in metafunc.fixturenames:
        metafunc.parametrize((names[0], "op"),
                             [p for op in OPS for p in cell_params(metafunc, backends, op)])
    else:
        metafunc.parametrize(names[0], cell_params(metafunc, backends))


def _record(item: pytest.Item, why: str = "") -> dict | None:
    """The not-run record of a conformance test item (None for other items)."""
    impl = cell.of_item(item)
    clauses = [c for m in item.iter_markers("clause") for c in m.args]
    if impl is None or not clauses:
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
    """Order the items cell by cell, by spec clause within a cell (:func:`scheduling.by_cell`),
    each with its clause ids as keywords (``-k "MASK-1"``; a substring match, as ``-k`` is).
    Every testable clause must be named by a test when the whole suite is collected; when only part of it is, the clauses no
    collected test names are recorded as not run."""
    items[:] = scheduling.by_cell(items, [b.name for b in config.stash.get(BACKENDS_KEY, [])],
                                  [c.id for c in load_spec().clauses])
    for item in items:  # ``-k MASK-1`` selects the tests of a clause (before -k deselects)
        item.extra_keyword_matches.update(c for m in item.iter_markers("clause") for c in m.args)
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
    """Run the test with its record (:mod:`.item_state`) as the running one: the suite's code
    writes what the test does there, and the examples Hypothesis runs are counted into it."""
    state = state_of(item)
    outer = statistics.collector.value  # Hypothesis's own (for --hypothesis-show-statistics)

    def count_examples(stats: dict) -> None:
        state.examples += sum(
            case["status"] == "valid" for phase in COUNTED_PHASES
            for case in stats.get(f"{phase}-phase", {}).get("test-cases", []))
        if outer is not None:
            outer(stats)

    restore = _no_shrink_after_a_failure(item, state)
    try:
        with running_test(state), statistics.collector.with_value(count_examples):
            return (yield)
    finally:
        restore()


def _no_shrink_after_a_failure(item: pytest.Item, state):
    """Run ``item`` without Hypothesis's shrink (and explain) phases when its cell already has a
    failed test and ``--mhaspec-shrink-all`` is not given; returns what undoes it. The settings
    are the wrapped test's own, read by Hypothesis when the test is called."""
    collector = item.config.stash.get(COLLECTOR_KEY, None)
    impl = cell.of_item(item)
    test = getattr(item, "obj", None)
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    # True: may shrink; False: not shrunk after an earlier failure; None: nothing to shrink (not a
    # Hypothesis test, or a profile without shrinking such as triage)
    state.shrink = True if own is not None and Phase.shrink in own.phases else None
    if (collector is None or collector.shrink_all or impl is None or own is None
            or (impl.backend.name, impl.device, impl.dtype) not in collector.failed_cells
            or Phase.shrink not in own.phases):
        return lambda: None
    state.shrink = False
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
    state = state_of(item)  # the one record of the item (pytest_runtest_call made it)
    left_out = observation.sub_cases_left_out(state) if report.when == "call" else []
    if left_out and report.failed and call.excinfo.errisinstance(
            (Unsatisfiable, FailedHealthCheck)):  # every case drew a sub-case the backend does
        # not support (Hypothesis found none to run): not implemented, not a failure
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"{NOT_IMPLEMENTED}: sub-cases {'; '.join(left_out)}")
    record = _record(item)
    if record is not None:
        del record["why"]
        info = {**record, "ratios": state.ratios, "calls": state.calls, "examples": state.examples,
                "validated_by_adapter": adapter_credit.validated_by_adapter(
                    cell.of_item(item).backend, record["clauses"])}
        if report.when == "call":  # what the adapter served by folding in the test's calls; the
            # rows of each clause's condition space its cases held, and the values a capability
            # the backend does not claim kept out (not implemented)
            info["folded_by_adapter"] = adapter_credit.folded_by_adapter(cell.of_item(item).backend)
            info.update(behaviour_checks.report_fields(cell.of_item(item), state))
            claims = op_capabilities(cell.of_item(item).backend, item.callspec.params.get("op"))
            info["conditions"] = observation.ran(state, record["clauses"])
            info["conditions_not_implemented"] = condition_audit.unclaimed(
                record["clauses"], claims, state)
        if report.when == "call" and report.failed:
            report.sections.append(("mhaspec: the clause", clause_lines(record["clauses"])))
            info["replay"] = expect.save_last_call(state, record["clauses"][0]) or None
            info["failure"] = state.failure
            info["shrunk"] = state.shrink
        if report.when == "call" and report.passed:
            expect.save_passing_sample(state, record["clauses"][0])
        if report.when == "call":
            state.last_call = None  # its arrays are not kept for the rest of the run
        report.user_properties.append(("mhaspec", info))
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    collector = config.stash.get(COLLECTOR_KEY, None)
    if collector is not None and config.pluginmanager.is_registered(collector):
        config.pluginmanager.unregister(collector)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    collector = config.stash.get(COLLECTOR_KEY, None)
    if collector is None or not (collector.results or collector.unselected):
        return
    results.write_summary(terminalreporter, collector)
