"""``mhaspec certify --backend-python PYTHON`` (issue 36): the backend served by an interpreter of
its own (its own virtual environment), so that the judge's environment needs no framework; the two
must have the same mhaspec, since they speak one wire protocol.

The tests stand in for another environment with a wrapper script that runs this interpreter with
a variable set (the backend names itself by it) or with mhaspec's version changed at start-up.

Axis legend: none (the subjects are certificates and processes).
"""

from __future__ import annotations

import sys

import pytest

from hostile_certify import HEADS_ONLY, certificate, certify, output
# work: a fixture
from hostile_certify import work  # noqa: F401


def wrapper(folder, *lines: str):
    """An executable script that runs this Python after ``lines`` (shell)."""
    script = folder / "python-wrapper"
    script.write_text("#!/bin/sh\n" + "".join(f"{line}\n" for line in lines)
                      + f'exec "{sys.executable}" "$@"\n', "utf-8")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_backend_runs_under_the_interpreter_given(work, workers):
    python = wrapper(work, "export MHASPEC_TEST_WRAPPER=1")
    proc = certify(work, "OWN_INTERPRETER", "--backend-python", str(python), "--workers", workers,
                   "--", *HEADS_ONLY)
    assert proc.returncode in (0, 1), output(proc)
    assert not (work / "certs" / "judges-interpreter.json").exists(), output(proc)
    run = certificate(work, "own-interpreter")["run"]
    assert run["backend_interpreter"].startswith("its own (--backend-python): Python 3."), run
    assert "python-wrapper" not in run["backend_interpreter"]  # no path of the issuing machine


def test_without_it_the_judges_interpreter_serves_the_backend(work):
    proc = certify(work, "OWN_INTERPRETER", "--", *HEADS_ONLY)
    assert proc.returncode in (0, 1), output(proc)
    run = certificate(work, "judges-interpreter")["run"]
    assert run["backend_interpreter"].startswith("the judge's: Python 3."), run


def test_another_mhaspec_in_the_backends_interpreter_is_one_line(work):
    (work / "other").mkdir()
    (work / "other" / "sitecustomize.py").write_text(
        "import mhaspec\nmhaspec.__version__ = '0.0.1'\n", "utf-8")
    python = wrapper(work, f'export PYTHONPATH="{work / "other"}:$PYTHONPATH"')
    proc = certify(work, "OWN_INTERPRETER", "--backend-python", str(python), "--", *HEADS_ONLY)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the backend's interpreter has mhaspec 0.0.1" in lines[0], output(proc)


def test_a_missing_interpreter_is_one_line(work):
    proc = certify(work, "OWN_INTERPRETER", "--backend-python", str(work / "no-such-python"))
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--backend-python" in lines[0] and "not an executable" in lines[0]
