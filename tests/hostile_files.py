"""Helpers shared by the hostile-file tests (``test_hostile_files.py``,
``test_hostile_certificates.py``, ``test_hostile_markdown.py``, ``test_hostile_cli.py``): run
``mhaspec`` in this process or in a subprocess, check that a usage error is one line, save a valid
failure file and rewrite its members, build a valid certificate body.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np

from mhaspec import certificate, cli
from mhaspec.conformance import failure_save
from mhaspec.conformance.clause_capabilities import NEEDS
from mhaspec.conformance.strategies import CaseSpec, build_case
from mhaspec.conformance.verdicts import count_verdicts, overall_verdict
from mhaspec.spec import load as load_spec


class Parametrization:
    """What ``failure_save.save_case`` reads of a parametrization: device and dtype."""

    device = "cpu"
    dtype = "float64"


CASE = CaseSpec(mask_shape=(2, 1, 3, 3), bias_shape=(3, 3))


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``mhaspec ARGS`` in this process: (exit status, stdout, stderr); an uncaught exception fails
    the test (it would be a traceback for the user)."""
    try:
        code = cli.main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_usage_error(result: tuple[int, str, str], *words: str) -> None:
    code, out, err = result
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), err
    assert "Traceback" not in out + err
    for word in words:
        assert word in lines[0], (word, lines[0])


def mhaspec(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """``mhaspec ARGS`` in a subprocess run from ``cwd``, with ``cwd`` on the import path (the worst
    case: a module next to a hostile file is importable)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def saved_case(tmp_path, *, op="sdpa", backend_ref="numpy-batched", spec=CASE,
               name="case.npz") -> pathlib.Path:
    return failure_save.save_case(tmp_path / name, Parametrization(), build_case(spec), op=op,
                                  clause="MASK-1", backend_ref=backend_ref, overrides={})


def certificate_body(**changes) -> dict:
    """A schema-valid certificate body over the current spec: every testable clause passes."""
    spec = load_spec()
    clauses = [{"id": c.id, "title": c.title, "verdict": "pass" if c.testable else "not-run",
                "worst_ratio": 0.5 if c.testable else 0.0, "runs": int(c.testable),
                "ran_on": ["cpu/float64"] if c.testable else [], "not_run_on": [],
                "failures": []} for c in spec.clauses]
    body = {
        "schema": certificate.SCHEMA_ID, "spec": {"name": spec.name, "version": spec.version, "status": spec.status},
        "suite": {"version": "0", "git_commit": None},
        "backend": {"ref": "numpy-batched", "name": "numpy-batched", "framework": "numpy",
                    "framework_version": "2.0", "protocol_version": 1,
                    "capabilities": sorted(set().union(*NEEDS.values())), "deviations": {}},
        "environment": {"python": "3", "platform": "x", "devices": {
            "cpu": {"name": "x86_64", "dtypes": ["float64"], "precision_flags": {}}}},
        "hypothesis": {"profile": "ci", "seed": 0, "max_examples": 8, "backend_calls": 1},
        "issued": "2026-01-01T00:00:00+00:00", "clauses": clauses,
        "summary": {"verdict": overall_verdict(clauses), "counts": count_verdicts(clauses)}}
    body.update(changes)
    return body


def members(path: pathlib.Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def rewrite(path: pathlib.Path, *, meta: dict | str | None = None, **arrays) -> pathlib.Path:
    """``path`` with its meta (a dict, or raw text) and some members replaced (bytes or arrays)."""
    content = members(path)
    if meta is not None:
        content["meta.npy"] = npy_bytes(np.array(meta if isinstance(meta, str) else json.dumps(meta)))
    for name, value in arrays.items():
        content[f"{name}.npy"] = value if isinstance(value, bytes) else npy_bytes(value)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            z.writestr(name, data)
    return path
