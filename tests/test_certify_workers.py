"""``mhaspec certify --workers N`` (issue 36): the suite judged by N pytest-xdist workers, each
with a sealed backend process of its own (:mod:`mhaspec.sealed_workers`).

What one judging process guarantees must hold in every worker: the backend never runs inside a
judging process (a wrong backend whose import patches the judge, or that is right only where it
can see the running test, does not conform), a worker killed by its backend leaves no certificate,
and the verdicts are those of one process on the same inputs. An edit of the installed judge with
two workers is tested beside the one-process case, in test_hostile_backend_same_machine.py.

Axis legend: none (the subjects are certificates and processes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hostile_certify import HEADS_ONLY, certificate, certify, clause, output
# work: a fixture
from hostile_certify import work  # noqa: F401

WORKERS = ("--workers", "2")


@pytest.mark.parametrize("ref, stem, cid, selection", [
    ("ZERO", "zero-attention", "SDPA-1", ("-k", "test_attention_equals_softmax")),
    ("ONLY_IN_HARNESS", "only-in-harness", "HEAD-1", HEADS_ONLY)])
def test_a_wrong_backend_does_not_conform_in_workers(work, ref, stem, cid, selection):
    """Loaded inside a worker, ZERO's import would replace the judge (every comparison a pass) and
    ONLY_IN_HARNESS would see the running test (right only there): both would conform. Each
    worker's backend is a process of its own, so both fail their clause."""
    proc = certify(work, ref, *WORKERS, "--", *selection)
    assert proc.returncode == 1, output(proc)
    cert = certificate(work, stem)
    assert clause(cert, cid)["verdict"] == "fail", output(proc)
    assert cert["run"]["workers"] == 2 and cert["run"]["backend_process"] == "sealed"


def test_a_worker_killed_by_its_backend_leaves_no_certificate(work):
    """The backend's process kills its parent, a judging worker (same user, no sandbox): the
    worker is not replaced, and certify writes no certificate for a run a worker did not finish
    (one line, exit 2)."""
    proc = certify(work, "KILLS_ITS_JUDGE", *WORKERS, "--", *HEADS_ONLY)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a judging worker died during the run" in lines[-1], output(proc)
    assert not (work / "certs" / "kills-its-judge.json").exists()


def _verdicts(cert: dict) -> dict:
    return {c["id"]: (c["verdict"], c.get("worst_ratio")) for c in cert["clauses"]}


def test_workers_give_the_verdicts_of_one_process(tmp_path):
    """numpy-batched, ci profile, masking and heads chapters: the same clause verdicts and worst
    ratios with two workers as in one process (the same derandomized inputs), every selected
    test run once."""
    selection = ("--", "-k", "split_heads or MASK-1 or MASK-2")
    certs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", "numpy-batched",
                               "--profile", "ci", "--workers", workers, "--output-dir", str(out),
                               *selection], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode in (0, 1), output(proc)
        certs[workers] = json.loads((out / "numpy-batched.json").read_text("utf-8"))
    one, two = certs["1"], certs["2"]
    assert _verdicts(one) == _verdicts(two)
    assert one["run"]["tests_run"] == two["run"]["tests_run"] > 0
    assert one["run"]["tests_not_run"] == two["run"]["tests_not_run"]
    assert (one["run"]["workers"], two["run"]["workers"]) == (1, 2)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_fewer_than_one_worker_is_one_line(tmp_path, value):
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", "numpy-batched",
                           "--workers", value], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"mhaspec: error: --workers must be at least 1, got {value}"], output(proc)
