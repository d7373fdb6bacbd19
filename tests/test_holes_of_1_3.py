"""Spec 1.4 closes holes of 1.3's suite: wrong backends that 1.3's ci profile certified now fail
their own clause in ci (``broken_backends.HOLES_OF_1_3``), and the clean reference still passes.

Measured on the suite of 1.3 (commit f31b6a3), ci profile, float64 and float32: the backend whose
attention_vjp scales q in place and the one reading sinks by key/value head passed every clause
run (INPUT-1 tested mha_vjp only; no covering row paired grouped heads with sinks); the d_bias not
summed over its broadcast axes failed GRAD-9 on a drawn case only (the covering rows had a
full-shape bias).
"""

from __future__ import annotations

import pytest

import broken_backends
from suite_runner import run_suite

#: the chapters whose tests the holes' clauses run in
CHAPTERS = "test_inputs or test_sink or test_attention_vjp or test_determinism"
CLEAN = "oracle_backend:ORACLE_REFERENCE"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    refs = [CLEAN, *(f"broken_backends:{attr}" for attr in broken_backends.HOLES_OF_1_3)]
    return run_suite(tmp_path_factory.mktemp("suite"), refs, "-k", CHAPTERS, profile="ci",
                     workers=0)


def _failed(results, backend: str) -> set[str]:
    return {c for r in results if r["backend"] == backend and r["outcome"] == "fail"
            for c in r["clauses"]}


@pytest.mark.parametrize("attr", sorted(broken_backends.HOLES_OF_1_3))
def test_a_hole_of_1_3_fails_its_own_clause_in_ci(results, attr):
    name, clauses = broken_backends.HOLES_OF_1_3[attr]
    assert any(r["backend"] == name for r in results), f"{name} was not run"
    failed = _failed(results, name)
    assert failed == clauses, f"{name} should fail exactly {sorted(clauses)}; failed {sorted(failed)}"
    for r in results:
        if r["backend"] == name and r["outcome"] == "fail":
            assert any(f"[{c}]" in r["message"] for c in clauses), r["message"][:500]


def test_the_reference_passes_those_chapters_in_ci(results):
    outcomes = {r["outcome"] for r in results if r["backend"] == "oracle-reference"}
    assert outcomes <= {"pass", "not-implemented"}, outcomes


# -- 5f: window and ALiBi mistakes of kinds real kernels shipped, under WIN-1 and ALIBI-1 ---------
# Measured on the suite of 1.3 (ci, float64 and float32): slopes (B, h) read as item 0's failed
# GRAD-6 only (no covering row had per-batch slopes: ALIBI-1 passed); the two window mistakes and the
# signed ALiBi distance failed WIN-1 / ALIBI-1 already (kept as the spaces' regression checks).

@pytest.fixture(scope="module")
def feature_results(tmp_path_factory) -> list[dict]:
    refs = [CLEAN, *(f"broken_backends:{attr}" for attr in broken_backends.WINDOW_AND_ALIBI)]
    return run_suite(tmp_path_factory.mktemp("suite"), refs, "-k", "test_window or test_alibi",
                     profile="ci", workers=0)


@pytest.mark.parametrize("attr", sorted(broken_backends.WINDOW_AND_ALIBI))
def test_a_window_or_alibi_mistake_fails_its_own_clause_in_ci(feature_results, attr):
    name, clauses = broken_backends.WINDOW_AND_ALIBI[attr]
    failed = _failed(feature_results, name)
    assert clauses <= failed, f"{name} should fail {sorted(clauses)}; failed {sorted(failed)}"


def test_the_reference_passes_the_window_and_alibi_chapters_in_ci(feature_results):
    outcomes = {r["outcome"] for r in feature_results if r["backend"] == "oracle-reference"}
    assert outcomes <= {"pass", "not-implemented"}, outcomes
