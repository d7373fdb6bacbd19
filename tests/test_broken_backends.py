"""The suite rejects plausible wrong implementations, each with the right clause, and passes the
clean backends. Broken backends live outside the package (``broken_backends/``) and are loaded
with ``--backend module:attr``, exactly as a third-party backend would be."""

from __future__ import annotations

import pytest

import broken_backends
from suite_runner import outcomes_by_clause, run_suite

#: backend name -> the reference the run loads it from; the oracle-backed reference backend
#: (tests/oracle_backend.py) claims every capability but grad, so every clause of spec 1.2 runs
CLEAN_REFS = {"numpy-batched": "numpy-batched", "numpy-perhead": "numpy-perhead",
              "oracle-reference": "oracle_backend:ORACLE_REFERENCE"}
CLEAN = tuple(CLEAN_REFS)
#: NumPy has no automatic differentiation: its backends do not claim the optional capability
#: "grad", so the GRAD clauses, INPUT-1's check of mha_vjp and DET-1's repeated backward passes
#: (spec 1.4) are reported not implemented beside their passes
NO_AUTODIFF = {"GRAD-1", "GRAD-2", "INPUT-1", "DET-1"}


def _expected_outcomes(clause: str) -> set[str]:
    return {"pass", "not-implemented"} if clause in NO_AUTODIFF else {"pass"}


#: the backends that run every test of the suite: the clean ones and the stale deviations (whose
#: every other clause must pass)
EVERY_TEST = (*CLEAN, "stale-deviation")


def selection() -> str:
    """The ``-k`` expression of the run: every test of :data:`EVERY_TEST`'s backends, and for each
    catalogue entry the tests of the clauses it must fail (the plugin gives each test its clause
    ids as keywords). A substring match, as ``-k`` is: a few more tests may run, never fewer."""
    own = [f"({name} and ({' or '.join(sorted(clauses))}))"
           for name, clauses in broken_backends.EXPECTED.values()]
    return " or ".join([*EVERY_TEST, *own])


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    refs = [*CLEAN_REFS.values(), *(f"broken_backends:{attr}" for attr in broken_backends.EXPECTED),
            "broken_backends:STALE_DEVIATION", "broken_backends:STALE_DEVIATION_IN_FLOAT32"]
    return run_suite(tmp_path_factory.mktemp("suite"), refs, "-k", selection())


@pytest.mark.parametrize("attr", sorted(broken_backends.EXPECTED))
def test_broken_backend_is_rejected_with_the_right_clause(results, attr):
    name, clauses = broken_backends.EXPECTED[attr]
    outcomes = outcomes_by_clause(results, name)
    assert outcomes, f"{name} was not run"
    failed = {c for c, o in outcomes.items() if "fail" in o}
    assert failed & clauses, f"{name} should fail one of {sorted(clauses)}; failed {sorted(failed)}"
    messages = [r.get("message", "") for r in results if r["backend"] == name and r["outcome"] == "fail"]
    assert any(f"[{c}" in m or f", {c}]" in m or "Error" in m for m in messages for c in failed), \
        "failure messages should name the clause"


@pytest.mark.parametrize("name", CLEAN)
def test_clean_backend_passes_every_clause(results, name):
    outcomes = outcomes_by_clause(results, name)
    bad = {c: o for c, o in outcomes.items() if o - _expected_outcomes(c)}
    assert not bad, f"{name} should pass every clause, got {bad}"
    from mhaspec.spec import load

    # this run covers float64 and float32: ERR-9 and GRAD-10 (16-bit gradients) run in float16/bfloat16
    float16_only = {"ERR-9", "GRAD-10"}
    assert set(load().testable_ids) - float16_only <= set(outcomes), "every clause must have run"


def test_declared_deviation_that_does_not_deviate_is_reported_stale(results):
    outcomes = outcomes_by_clause(results, "stale-deviation")
    assert outcomes["MASK-9"] == {"stale-deviation"}
    assert all(o <= _expected_outcomes(c) for c, o in outcomes.items() if c != "MASK-9")


def test_a_deviation_declared_for_some_cells_applies_to_those_cells_only(results):
    by_dtype = {"float64": set(), "float32": set()}
    for r in results:
        if r["backend"] == "stale-deviation-float32" and "MASK-9" in r["clauses"]:
            by_dtype[r["dtype"]].add(r["outcome"])
    assert by_dtype == {"float64": {"pass"}, "float32": {"stale-deviation"}}
