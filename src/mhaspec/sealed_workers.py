"""``mhaspec certify --workers N``: pytest-xdist workers, each judging with a sealed backend
process of its own.

The controller (certify's process, which holds no backend process during the run) registers a
:class:`Controller`: it hands every worker the backend's reference, the claims certify read and
froze before the run, the sandbox choice and the interpreter (``pytest_configure_node``), and takes back each worker's
report when it ends (``pytest_testnodedown``). In a worker, this module's hooks (loaded with
``-p mhaspec.sealed_workers`` in every process of the run) import every judge module first
(:func:`mhaspec.judge_files.preload`), then hand the suite a
:class:`~mhaspec.sealed.SealedBackend` built from those claims, whose process starts at its first
call. pytest-xdist runs no test before every worker has collected, so no backend process exists
while a judging process imports judge code; each worker hashes the judge's files when its
collection ends and reports them with its backend process's restarts. Certify refuses the run when
any hash differs from its own, taken before the first backend process started
(:meth:`Controller.changed`). A worker that dies is not replaced (``--max-worker-restart 0``): a
replacement would import the judge's code from the disk during the run.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from mhaspec import judge_files, sealed
from mhaspec.conformance import plugin

#: the key of a worker's input (from the controller) and output (its report)
INPUT = "mhaspec_sealed"
OUTPUT = "mhaspec_sealed_report"


def worker_args(n: int) -> list[str]:
    """pytest-xdist (its plugin named: certify's runs disable plugin autoload), this module in every
    process, ``n`` workers, none replaced when it dies."""
    return ["-p", "xdist.plugin", "-p", __name__, "-n", str(n), "--max-worker-restart", "0"]


class Controller:
    """The controller's side: what each worker is given, and what it reported."""

    def __init__(self, backend: sealed.SealedBackend, ref: str) -> None:
        self.input = json.dumps({"ref": ref, "claims": backend.process.first["claims"],
                                 "sandbox": backend.process.sandbox,
                                 "python": backend.process.python})
        self.reports: dict[str, dict | None] = {}

    def pytest_configure_node(self, node) -> None:
        node.workerinput[INPUT] = self.input

    def pytest_testnodedown(self, node, error) -> None:
        out = (getattr(node, "workeroutput", None) or {}).get(OUTPUT)
        self.reports[str(node.gateway.id)] = json.loads(out) if out else None

    def restarts(self) -> int:
        """How many times a backend process was started again in any worker (after a hang or a
        death)."""
        return sum(r["restarts"] for r in self.reports.values() if r)

    def unreported(self) -> str | None:
        """A line naming the workers that ended without their report (a worker that died: its
        judge files are unknown), or None."""
        missing = sorted(w for w, report in self.reports.items() if report is None)
        if not self.reports:
            return "no worker reported"
        return f"worker {', '.join(missing)} ended without its report" if missing else None

    def changed(self, before: dict[str, str]) -> str | None:
        """A line naming the judge files some worker loaded in another version than ``before``
        (the controller's hashes; a file the controller did not hash is compared with the disk
        now); None when every reporting worker judged with the same code."""
        found: list[str] = []
        for report in self.reports.values():
            for path, sha in sorted((report or {}).get("judge_files", {}).items()):
                if before.get(path, judge_files.digest(pathlib.Path(path))) != sha and path not in found:
                    found.append(path)
        return ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "") \
            if found else None


class _WorkerProvider:
    """A worker's backend, handed to the suite as the run's provided backend
    (:data:`mhaspec.conformance.plugin.PROVIDER`); hashes the judge's files once collection ends."""

    def __init__(self, backend: sealed.SealedBackend, ref: str) -> None:
        self.backends, self.refs = [backend], {backend.name: ref}
        self.judge_files: dict[str, str] = {}

    def pytest_collection_finish(self, session) -> None:
        self.judge_files = judge_files.snapshot()


@pytest.hookimpl(tryfirst=True)  # before the suite's plugin reads the provided backends
def pytest_configure(config: pytest.Config) -> None:
    given = getattr(config, "workerinput", {}).get(INPUT)
    if given is None:  # the controller, or a run without workers
        return
    judge_files.preload()
    data = json.loads(given)
    backend = sealed.sealed_with_claims(
        data["ref"], data["claims"], sandbox=data["sandbox"], python=data["python"],
        call_timeout=config.getoption("--mhaspec-call-timeout") or None)
    config.pluginmanager.register(_WorkerProvider(backend, data["ref"]), plugin.PROVIDER)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker ends its backend's process (and every descendant) and reports."""
    provider = session.config.pluginmanager.get_plugin(plugin.PROVIDER)
    out = getattr(session.config, "workeroutput", None)
    if out is None or not isinstance(provider, _WorkerProvider):
        return
    backend = provider.backends[0]
    backend.close()
    out[OUTPUT] = json.dumps({"judge_files": provider.judge_files,
                              "restarts": backend.process.restarts})
