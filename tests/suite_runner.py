"""Run the conformance suite in a subprocess on backends given as ``--backend`` references."""

from __future__ import annotations

import os
import pathlib

from mhaspec import runner

HERE = pathlib.Path(__file__).parent


def run_suite(tmp_path: pathlib.Path, refs: list[str], *extra: str, profile: str = "triage",
              workers: int = 2) -> list[dict]:
    """Run the conformance suite on ``refs`` (``profile``, float64 and float32, ``workers``
    pytest-xdist workers, 0: one process) in a subprocess whose cwd is ``tmp_path``, with this
    folder importable; return its results.

    ``--tb=no``: the results (and each failure's message) come from the run's report; pytest's
    own failure summary scans every report once per failure (``_get_teardown_reports``), which
    for the broken backends' thousands of failures took longer than the suite itself."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = runner.run_subprocess(
        runner.suite_args(backends=refs, profile=profile, dtypes="float64,float32",
                          extra=["-n", str(workers), "--tb=no", *extra]),
        cwd=tmp_path, env=env, timeout=1800)
    assert run.results, f"suite did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.results


def outcomes_by_clause(results: list[dict], backend: str,
                       device: str | None = None) -> dict[str, set[str]]:
    """clause -> the outcomes of ``backend``'s tests of that clause in ``results`` (on ``device``
    only, when given)."""
    by_clause: dict[str, set[str]] = {}
    for r in results:
        if r["backend"] == backend and device in (None, r["device"]):
            for clause in r["clauses"]:
                by_clause.setdefault(clause, set()).add(r["outcome"])
    return by_clause
