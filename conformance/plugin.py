"""The mhaspec pytest plugin (registered through the ``pytest11`` entry point).

* ``--backend NAME|module:attr`` (repeatable) chooses the backends; default: every registered
  in-repo backend whose framework imports.
* ``--mhaspec-profile dev|ci|certify`` chooses the Hypothesis profile (``ci`` is derandomized).
* ``--mhaspec-report FILE.json`` writes every result with its clause, backend, device and dtype.

Each conformance test names its clause(s) with ``@pytest.mark.clause("MASK-9")`` and the
capability it needs with ``@pytest.mark.requires("sdpa")``. The plugin parametrizes the ``impl``
argument over backend x device x dtype. Skips and deviations are data, applied here as marks:
an unclaimed capability is skipped as "not implemented", an absent device is skipped with its
reason, and a clause the backend declares a deviation from is ``xfail(strict=True)`` — so a
declaration that no longer deviates fails as stale. A testable clause that no collected test names
is a usage error.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, Phase, settings, statistics

from mhaspec.backends import BackendLoadError, load_backend, registered_backends
from mhaspec.spec import load as load_spec

from . import harness, strategies, tolerance

NOT_IMPLEMENTED = "not implemented"
OPS = ("sdpa", "mha")
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
for _name, _kw in PROFILES.items():
    settings.register_profile(
        f"mhaspec-{_name}", deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **_kw)

CONFORMANCE_DIR = pathlib.Path(__file__).parent
RESULTS_KEY = pytest.StashKey[list]()
BACKENDS_KEY = pytest.StashKey[list]()


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
                    help="free: draw every size from the menus of sizes; menu: draw whole shapes "
                         "from the fixed list of 7 (compiled variants then compile 7 shapes); "
                         "default: menu for the ci and triage profiles, free otherwise")
    group.addoption("--mhaspec-examples", default=None, type=int, metavar="N",
                    help="Hypothesis examples per test, overriding the profile's max_examples "
                         "(the soak uses it to make fewer, longer rounds)")
    group.addoption("--mhaspec-partial", action="store_true",
                    help="developing new clauses: do not fail when a testable clause has no test")
    group.addoption("--mhaspec-failures", default=None, metavar="DIR",
                    help="save each failing case as DIR/<test>.npz for `mhaspec replay`")


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
    shapes = config.getoption("--mhaspec-shapes") or ("menu" if profile in ("ci", "triage") else "free")
    strategies.shape_menu = strategies.CI_SHAPES if shapes == "menu" else None
    config.stash[RESULTS_KEY] = []
    config.stash[BACKENDS_KEY] = _backends(config)
    failures = config.getoption("--mhaspec-failures")
    harness.failures_dir = pathlib.Path(failures) if failures else None


def _backends(config: pytest.Config) -> list:
    refs = config.getoption("--backend")
    frameworks = set(config.getoption("--framework"))
    loaded = []
    for ref in refs or registered_backends():
        try:
            backend = load_backend(ref)
        except BackendLoadError as exc:
            if refs:
                raise pytest.UsageError(str(exc)) from None
            continue  # framework not installed: `--backend` it explicitly to see why
        if frameworks and backend.framework not in frameworks:
            continue
        harness.BACKEND_REFS[backend.name] = ref
        loaded.append(backend)
    return loaded


def _deviations(backend, device: str, dtype: str):
    """The backend's declared deviations for one cell (``deviations_on`` is optional)."""
    on = getattr(backend, "deviations_on", None)
    return on(device, dtype) if on is not None else backend.deviations


def _impl_params(metafunc: pytest.Metafunc, backends: list, op: str | None = None) -> list:
    clauses = [c for m in metafunc.definition.iter_markers("clause") for c in m.args]
    needs = {c for m in metafunc.definition.iter_markers("requires") for c in m.args}
    needs |= {op} if op else set()
    only = {d for m in metafunc.definition.iter_markers("dtypes") for d in m.args}
    chosen = metafunc.config.getoption("--mhaspec-dtypes")
    chosen = set(chosen.split(",")) if chosen else None
    params = []
    for backend in backends:
        missing = sorted(needs - set(backend.capabilities))
        for device, unavailable in backend.devices().items():
            dtypes = backend.dtypes(device) if unavailable is None else ("float32",)
            for dtype in dtypes:
                deviations = _deviations(backend, device, dtype)
                declared = [c for c in clauses if c in deviations]
                if (only and dtype not in only) or (chosen and dtype not in chosen):
                    continue
                marks = []
                if unavailable is not None:
                    marks.append(pytest.mark.skip(reason=f"device unavailable: {unavailable}"))
                elif missing:
                    marks.append(pytest.mark.skip(
                        reason=f"{NOT_IMPLEMENTED}: {backend.name} does not claim {missing}"))
                elif declared:
                    marks.append(pytest.mark.xfail(
                        strict=True, reason="declared deviation: " + "; ".join(
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    """Every testable clause must be named by a test when the whole suite is collected."""
    modules = {pathlib.Path(str(item.fspath)).resolve() for item in items}
    suite = {p.resolve() for p in CONFORMANCE_DIR.glob("test_*.py")}
    if not suite or not suite <= modules or config.getoption("--mhaspec-partial"):
        return
    named = {c for item in items for m in item.iter_markers("clause") for c in m.args}
    spec = load_spec()
    unknown = sorted(named - {c.id for c in spec.clauses})
    untested = sorted(set(spec.testable_ids) - named)
    if unknown or untested:
        raise pytest.UsageError(f"conformance suite out of step with spec {spec.version}: "
                                f"clauses without a test: {untested}; unknown clause ids: {unknown}")


#: the phases whose valid test cases count as examples run (shrinking re-runs are not counted)
COUNTED_PHASES = ("explicit", "reuse", "generate", "target")


@pytest.hookimpl(wrapper=True, trylast=True)  # innermost: inside Hypothesis's own wrapper
def pytest_runtest_call(item: pytest.Item):
    token = harness.current_item.set(item)
    outer = statistics.collector.value  # Hypothesis's own (for --hypothesis-show-statistics)

    def count_examples(stats: dict) -> None:
        item.mhaspec_examples = getattr(item, "mhaspec_examples", 0) + sum(
            case["status"] == "valid" for phase in COUNTED_PHASES
            for case in stats.get(f"{phase}-phase", {}).get("test-cases", []))
        if outer is not None:
            outer(stats)

    try:
        with statistics.collector.with_value(count_examples):
            return (yield)
    finally:
        harness.current_item.reset(token)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    impl = getattr(getattr(item, "callspec", None), "params", {}).get("impl")
    clauses = [c for m in item.iter_markers("clause") for c in m.args]
    if isinstance(impl, harness.Impl) and clauses:
        report.user_properties.append(("mhaspec", {
            "backend": impl.backend.name, "device": impl.device, "dtype": impl.dtype,
            "clauses": clauses, "ratios": getattr(item, "mhaspec_ratios", {}),
            "calls": getattr(item, "mhaspec_calls", 0),
            "examples": getattr(item, "mhaspec_examples", 0)}))
    return report


def classify(report: pytest.TestReport) -> str | None:
    """pass / fail / deviation / stale-deviation / not-implemented / unavailable, or None."""
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "deviation" if report.skipped else "stale-deviation"
        if report.failed and "[XPASS(strict)]" in str(report.longrepr):
            return "stale-deviation"
        return "pass" if report.passed else "fail"
    if report.skipped and report.when == "setup":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        return "not-implemented" if NOT_IMPLEMENTED in reason else "unavailable"
    if report.failed:
        return "fail"
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    info = dict(report.user_properties).get("mhaspec")
    outcome = classify(report)
    if info is None or outcome is None:
        return
    entry = {**info, "test": report.nodeid.split("::")[-1], "outcome": outcome,
             "duration": report.duration}
    if outcome in ("fail", "stale-deviation"):
        entry["message"] = report.longreprtext[-4000:]
    _RESULTS.append(entry)


_RESULTS: list[dict] = []

SYMBOL = {"pass": "ok", "fail": "FAIL", "deviation": "dev", "stale-deviation": "STALE",
          "not-implemented": "n/i", "unavailable": "-"}
SEVERITY = ["fail", "stale-deviation", "deviation", "pass", "not-implemented", "unavailable"]


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(backend, clause) -> {"outcome": worst outcome, "ratio": worst NUM-3 ratio, "runs": n}."""
    table: dict[tuple[str, str], dict] = {}
    for r in results:
        for clause in r["clauses"]:
            cell = table.setdefault((r["backend"], clause), {"outcome": "unavailable", "ratio": 0.0,
                                                             "runs": 0})
            if SEVERITY.index(r["outcome"]) < SEVERITY.index(cell["outcome"]):
                cell["outcome"] = r["outcome"]
            cell["ratio"] = max(cell["ratio"], r["ratios"].get(clause, 0.0))
            cell["runs"] += r["outcome"] != "unavailable"
    return table


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    results = list(_RESULTS)
    if not results:
        return
    table = summarize(results)
    backends = sorted({b for b, _ in table})
    clauses = [c.id for c in load_spec().clauses if any((b, c.id) in table for b in backends)]
    tr = terminalreporter
    tr.section(f"mhaspec {load_spec().version} conformance by clause")
    width = max(len(b) for b in backends)
    tr.write_line("clause    " + " ".join(b.rjust(max(width, 6))[:max(width, 6)] for b in backends))
    for c in clauses:
        cells = [SYMBOL[table[(b, c)]["outcome"]] if (b, c) in table else "" for b in backends]
        tr.write_line(f"{c:<9} " + " ".join(s.rjust(max(width, 6)) for s in cells))
    tr.section("mhaspec conformance by backend")
    for b in backends:
        counts = defaultdict(int)
        for (bb, _), cell in table.items():
            if bb == b:
                counts[cell["outcome"]] += 1
        worst = max(((cell["ratio"], c) for (bb, c), cell in table.items() if bb == b), default=(0, ""))
        combos = sorted({(r["device"], r["dtype"]) for r in results
                         if r["backend"] == b and r["outcome"] != "unavailable"})
        if counts["fail"] or counts["stale-deviation"]:
            verdict = "DOES NOT CONFORM"
        else:  # a backend whose every clause was skipped has shown nothing (as `mhaspec certify`)
            verdict = "CONFORMS" if counts["pass"] else "NOT CHECKED (no clause ran)"
        tr.write_line(f"{b}: {verdict} - " + ", ".join(f"{counts[k]} {k}" for k in SEVERITY if counts[k])
                      + f"; worst NUM-3 ratio {worst[0]:.2f} ({worst[1]}, K={tolerance.K:g}); ran on "
                      + ", ".join(f"{d}/{t}" for d, t in combos))
    path = config.getoption("--mhaspec-report")
    if path:
        pathlib.Path(path).write_text(json.dumps(results, indent=1), encoding="utf-8")
        tr.write_line(f"mhaspec: results written to {path}")
