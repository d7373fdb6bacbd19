"""Determinism and reproducibility (issue: trustworthy verdicts).

* The same ``--hypothesis-seed`` draws the same examples and reaches the same verdicts; another seed
  draws other examples (so the comparison can fail).
* The ``ci`` profile is derandomized: its examples do not depend on the seed.
* A failure's printed ``replay_case(...)`` reproducer reruns the identical case: the same error, at the
  same index.

Each run is a subprocess in its own directory (no shared Hypothesis example database).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from mhaspec import runner

TESTS = pathlib.Path(__file__).resolve().parent
SELECTION = (
    "test_attention_equals_softmax_of_scaled_logits_times_v or test_results_are_within_the_tolerance_rule")


def conformance_report(tmp: pathlib.Path, *args: str) -> list[dict]:
    """Run the conformance suite with ``args``; return the report without timings."""
    tmp.mkdir(parents=True, exist_ok=True)
    run = runner.run_subprocess(runner.suite_args(extra=["-W", "ignore::RuntimeWarning", *args]),
                                cwd=tmp, timeout=600, env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert run.results, run.stdout[-3000:] + run.stderr[-2000:]
    entries = run.results
    for e in entries:
        e.pop("duration", None)
    return sorted(entries, key=lambda e: (e["test"], e["backend"], e["dtype"]))


def fingerprint(entries: list[dict]) -> list[tuple]:
    """What must repeat: per result its outcome, backend calls and worst NUM-3 ratios."""
    return [(e["test"], e["outcome"], e["calls"], sorted(e["ratios"].items())) for e in entries]


BASE = ["--backend", "numpy-batched", "--mhaspec-dtypes", "float32", "-k", SELECTION]


def test_the_same_seed_gives_the_same_examples_and_verdicts(tmp_path):
    certify = [*BASE, "--mhaspec-profile", "certify"]
    first = conformance_report(tmp_path / "a", *certify, "--hypothesis-seed=20261129")
    again = conformance_report(tmp_path / "b", *certify, "--hypothesis-seed=20261129")
    other = conformance_report(tmp_path / "c", *certify, "--hypothesis-seed=7")
    assert first and all(e["outcome"] == "pass" for e in first), first
    assert fingerprint(first) == fingerprint(again)
    assert fingerprint(first) != fingerprint(other), "the seed does not reach the examples"


def test_the_ci_profile_is_derandomized(tmp_path):
    ci = [*BASE, "--mhaspec-profile", "ci"]
    one = conformance_report(tmp_path / "a", *ci, "--hypothesis-seed=1")
    two = conformance_report(tmp_path / "b", *ci, "--hypothesis-seed=2")
    assert one and fingerprint(one) == fingerprint(two)


def test_a_failures_reproducer_replays_the_identical_case(tmp_path):
    proc = subprocess.run(
        runner.command(runner.suite_args(
            backends=["broken_backends:WRONG_SCALE"], profile="certify", seed=3, dtypes="float64",
            extra=["-k", "test_attention_equals_softmax_of_scaled_logits_times_v", "-x"])),
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 1, proc.stdout[-3000:]
    error = re.search(r"differs from the float64 oracle: (max abs error \S+ at index \([^)]*\))",
                      proc.stdout)
    snippet = re.search(r"^E\s+(from mhaspec\.conformance\.strategies import CaseSpec)\n"
                        r"E\s+(from mhaspec\.conformance\.replay import replay_case)\n"
                        r"E\s+(replay_case\(.*\))$", proc.stdout, re.M)
    assert error and snippet, proc.stdout[-3000:]
    replayed = subprocess.run([sys.executable, "-c", "\n".join(snippet.groups())], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert "DOES NOT CONFORM" in replayed.stdout and error.group(1) in replayed.stdout, (
        error.group(1), replayed.stdout)


@pytest.mark.parametrize("name", ["strategies", "extremes"])
def test_case_arrays_depend_only_on_the_case_spec(name):
    """build_case is a pure function of its CaseSpec (the basis of every reproducer)."""
    import numpy as np

    from mhaspec.conformance.extremes import nonfinite
    from mhaspec.conformance.strategies import CaseSpec, build_case

    spec = CaseSpec(mask_shape=(2, 1, 3, 3), key_padding=True, seed=11,
                    extreme=nonfinite("nan", "k") if name == "extremes" else None)
    a = build_case(spec)
    build_case.cache_clear()
    b = build_case(spec)
    for x, y in zip(a[1:], b[1:]):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
