"""Run the conformance suite in a subprocess on backends given as ``--backend`` references."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def run_suite(tmp_path: pathlib.Path, refs: list[str], *extra: str) -> list[dict]:
    """Run the conformance suite on ``refs`` in a subprocess; return its JSON results."""
    report = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "mhaspec.conformance", "-p", "no:cacheprovider",
           "-q", "--no-header", "-p", "no:randomly", "--mhaspec-profile", "triage",
           "--mhaspec-dtypes", "float64,float32", "--mhaspec-report", str(report), "-n", "2",
           *extra]
    for ref in refs:
        cmd += ["--backend", ref]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert report.exists(), f"suite did not finish:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(report.read_text())
