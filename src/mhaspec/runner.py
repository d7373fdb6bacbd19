"""Run the conformance suite: the one place that builds the pytest command and loads its results.

Every command and report that runs the suite goes through here: ``mhaspec certify`` in-process
(:func:`run_in_process`), ``mhaspec matrix``, ``mhaspec soak`` and the project's own tests in a
subprocess (:func:`command`, :func:`run_subprocess`, :func:`load_results`), and the nox sessions
through ``python -m mhaspec.runner [pytest arguments]`` (:func:`main`).

An in-process run is isolated from its caller: pytest is given an empty ini file in a temporary
directory (``-c``), so ``pytest.ini`` / ``tox.ini`` / ``setup.cfg`` / ``pyproject.toml`` in the
current directory add nothing, and the suite's own folder (the installed ``mhaspec.conformance``)
as ``--rootdir``, so the FAILED lines name the test files, which outlive the run; ``PYTEST_ADDOPTS`` is
dropped for the run; the cache provider is off; Hypothesis keeps its files in the temporary
directory (no ``.hypothesis/`` in the current directory); no ``conftest.py`` is loaded
(``--noconftest``: the suite ships none, and one in an ancestor directory of the installed package
or of the current directory would otherwise join the run and could rewrite its reports); and no
plugin but the suite's and Hypothesis's (:data:`PLUGINS`). The backends are handed over already
loaded (the plugin's ``PROVIDER``), and the results are read from the plugin's collector object,
with no report file in between.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Iterable, NamedTuple

import pytest

from mhaspec import usage
from mhaspec.conformance import plugin

#: Arguments every run of the suite starts with.
#: The only pytest plugins an in-process run loads, besides pytest's own: the suite's and
#: Hypothesis's. ``pytest11`` entry points of other installed packages are not auto-loaded
#: (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``): a package installed beside the backend could otherwise
#: hook the judging process (rewrite reports, patch the judge).
PLUGINS = ("-p", "mhaspec.conformance.plugin", "-p", "_hypothesis_pytestplugin")

BASE_ARGS = ("--pyargs", "mhaspec.conformance", "-p", "no:cacheprovider", "-p", "no:randomly",
             "-q", "--no-header",
             # hypothesis is imported before an in-process run starts: nothing to rewrite there
             "-W", "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning")


def suite_args(*, backends: Iterable[str] = (), profile: str | None = None, dtypes: str | None = None,
               seed: int | None = None, examples: int | None = None, shapes: str | None = None,
               report: str | os.PathLike | None = None, failures: str | os.PathLike | None = None,
               passes: str | os.PathLike | None = None, call_timeout: float | None = None,
               extra: Iterable[str] = ()) -> list[str]:
    """The pytest arguments of one run of the conformance suite (``--mhaspec-backend`` per
    reference; the plugin's own spellings, never the short ``--backend`` a conftest may own;
    None leaves an option at the plugin's default; ``extra`` goes last)."""
    args = list(BASE_ARGS)
    for ref in backends:
        args += ["--mhaspec-backend", ref]
    options = [("--mhaspec-profile", profile), ("--mhaspec-dtypes", dtypes),
               ("--mhaspec-examples", examples), ("--mhaspec-shapes", shapes),
               ("--mhaspec-report", report), ("--mhaspec-failures", failures),
               ("--mhaspec-passes", passes),
               ("--mhaspec-call-timeout", call_timeout)]
    args += [a for name, value in options if value is not None for a in (name, str(value))]
    if seed is not None:
        args.append(f"--hypothesis-seed={seed}")
    return args + list(extra)


def command(args: Iterable[str]) -> list[str]:
    """The subprocess command line running pytest with ``args`` in this interpreter."""
    return [sys.executable, "-m", "pytest", *args]


def load_results(report: str | os.PathLike) -> list[dict]:
    """The results a run wrote with ``--mhaspec-report`` ([] when it wrote none)."""
    path = pathlib.Path(report)
    return json.loads(path.read_text("utf-8")) if path.exists() else []


#: what every record of a ``--mhaspec-report`` file holds
REPORT_FIELDS = ("backend", "device", "dtype", "test", "outcome", "clauses")


def read_report(report: str | os.PathLike) -> list[dict]:
    """The results of a ``--mhaspec-report`` file a user names: a :class:`usage.UsageError`
    naming it when it cannot be read, is not JSON, or is not a list of test results (each a
    mapping with :data:`REPORT_FIELDS`)."""
    results = usage.read_json(report, "report")
    if not isinstance(results, list) or not all(
            isinstance(r, dict) and all(f in r for f in REPORT_FIELDS) for r in results):
        raise usage.UsageError(f"report {usage.printable(report)} is not a --mhaspec-report "
                               f"file: a list of test results, each with "
                               f"{', '.join(REPORT_FIELDS)}")
    return results


class SubprocessRun(NamedTuple):
    returncode: int
    results: list[dict]
    stdout: str
    stderr: str


def run_subprocess(args: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None,
                   capture: bool = True) -> SubprocessRun:
    """Run the suite with ``args`` (from :func:`suite_args`, without ``--mhaspec-report``) in a
    subprocess and load its results (written to a temporary report)."""
    with tempfile.TemporaryDirectory(prefix="mhaspec-run-") as tmp:
        report = pathlib.Path(tmp) / "results.json"
        cmd = command([*args, "--mhaspec-report", str(report)])
        if not capture:
            print("running:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, text=True,
                              capture_output=capture)
        return SubprocessRun(proc.returncode, load_results(report), proc.stdout or "",
                             proc.stderr or "")


class RunError(Exception):
    """An in-process run that could not start or selected what it must not (one line)."""


class _Provider:
    """The plugin object of an in-process run (registered under the plugin's ``PROVIDER`` name):
    hands the plugin the loaded backends, refuses any other backend the arguments select, and
    keeps the run's collector."""

    def __init__(self, name: str, backends: list, refs: dict[str, str], only: bool,
                 after_collection=None) -> None:
        self.__name__ = name  # pytest registers a plugin object under its __name__
        self.backends, self.refs, self.only = backends, refs, only
        self.collector = None
        self.after_collection, self.found = after_collection, None

    def pytest_collection_finish(self, session) -> None:
        """``after_collection()``: a line means stop, and no test runs."""
        if self.after_collection is not None:
            self.found = self.after_collection()
            if self.found:
                session.items[:] = []

    @pytest.hookimpl(trylast=True)  # after the mhaspec plugin has set up its stash
    def pytest_configure(self, config) -> None:
        self.collector = config.stash[plugin.COLLECTOR_KEY]
        for backend in self.backends:  # a backend in its own process times its calls itself
            if hasattr(backend, "call_timeout"):
                backend.call_timeout = config.getoption("--mhaspec-call-timeout") or None
        mine = {b.name for b in self.backends}
        others = sorted({b.name for b in config.stash[plugin.BACKENDS_KEY]} - mine)
        if self.only and others:
            raise pytest.UsageError(
                f"the run selects other backends besides {', '.join(sorted(mine))}: "
                f"{', '.join(others)} (remove --mhaspec-backend/--mhaspec-framework, or their short "
                f"spellings --backend/--framework, from the pytest arguments)")


class InProcessRun(NamedTuple):
    """What an in-process run found. ``args``: the exact pytest arguments; ``collector``: the
    plugin's :class:`~mhaspec.conformance.results.Collector` (results, not-run records, seconds
    per backend, Hypothesis settings as run)."""

    exit_code: int
    args: list[str]
    collector: object
    after_collection: str | None = None


def run_in_process(args: list[str], *, backends: list, refs: dict[str, str] | None = None,
                   only: bool = True, after_collection=None, plugins: tuple = ()) -> InProcessRun:
    """Run pytest with ``args`` in this process, isolated from the caller (module docstring), on
    the already loaded ``backends`` (``refs``: name -> reference, for reproducers).

    ``only``: refuse a run whose arguments select any other backend; ``after_collection``: called
    once the tests are collected, before any runs; a line it returns runs no test and is kept
    (``InProcessRun.after_collection``); ``plugins``: more plugin objects for the run. Raises
    :class:`RunError`
    when pytest reports a usage error or no result could be collected."""
    from hypothesis import configuration

    provider = _Provider(plugin.PROVIDER, list(backends), refs or {}, only, after_collection)
    with tempfile.TemporaryDirectory(prefix="mhaspec-run-") as tmp:
        ini = pathlib.Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n", "utf-8")
        full = ["--noconftest", *PLUGINS, *args, "-c", str(ini), "--rootdir", str(pathlib.Path(plugin.__file__).parent)]
        hypothesis_home = pathlib.Path(tmp) / "hypothesis"
        errors = io.StringIO()
        with _environment(PYTEST_ADDOPTS=None, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                          HYPOTHESIS_STORAGE_DIRECTORY=str(hypothesis_home)):
            configuration.set_hypothesis_home_dir(hypothesis_home)
            try:
                with contextlib.redirect_stderr(errors):
                    code = int(pytest.main(full, plugins=[provider, *plugins]))
            finally:
                configuration.set_hypothesis_home_dir(None)
    if code == int(pytest.ExitCode.USAGE_ERROR) or provider.collector is None:
        message = " ".join(line.removeprefix("ERROR:").strip() for line in
                           errors.getvalue().splitlines() if line.strip()) or f"pytest exit status {code}"
        raise RunError(f"the conformance run did not start: {message}")
    sys.stderr.write(errors.getvalue())
    return InProcessRun(code, full, provider.collector, provider.found)


def main(argv: list[str] | None = None) -> int:
    """``python -m mhaspec.runner [pytest arguments]``: the suite (:data:`BASE_ARGS`) run in this
    process with the given arguments after its own; the exit status is pytest's."""
    return int(pytest.main(suite_args(extra=sys.argv[1:] if argv is None else argv)))


@contextlib.contextmanager
def _environment(**changes: str | None):
    """Environment variables set (None: removed) for the duration of the block."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        _set_environment(changes)
        yield
    finally:
        _set_environment(saved)


def _set_environment(values: dict[str, str | None]) -> None:
    """Set each variable of ``values`` (None: remove it)."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


if __name__ == "__main__":
    raise SystemExit(main())
