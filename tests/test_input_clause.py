"""INPUT-1 rejects backends that write into the caller's arrays, which every other clause passes.

The backends (``broken_backends.MODIFIES_INPUTS``) compute right results from the inputs they are
given, so before spec 1.2 the suite certified them (measured: three of the four fail INPUT-1 only;
the one that scales W_q in place also fails MHA-6, whose test calls it twice with the same
parameters). The whole suite runs on them (and on a clean backend) as it runs on a
third-party backend, through ``--backend broken_backends:<NAME>``.
"""

from __future__ import annotations

import pytest

import broken_backends
from suite_runner import run_suite

CLEAN = "numpy-batched"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    """The suite's results on the clean backend and every input-modifying one."""
    broken = [f"broken_backends:{attr}" for attr in broken_backends.MODIFIES_INPUTS]
    return run_suite(tmp_path_factory.mktemp("suite"), [CLEAN, *broken])


def clauses_with(results, backend: str, outcome: str) -> set[str]:
    """The clauses of ``backend``'s tests whose outcome was ``outcome``."""
    return {c for r in results if r["backend"] == backend and r["outcome"] == outcome
            for c in r["clauses"]}


@pytest.mark.parametrize("attr", sorted(broken_backends.MODIFIES_INPUTS))
def test_a_backend_that_modifies_its_inputs_fails_input_1(results, attr):
    name, clauses = broken_backends.MODIFIES_INPUTS[attr]
    assert any(r["backend"] == name for r in results), f"{name} was not run"
    failed = clauses_with(results, name, "fail")
    assert clauses <= failed, f"{name} should fail {sorted(clauses)}; failed {sorted(failed)}"
    messages = [r.get("message", "") for r in results
                if r["backend"] == name and r["outcome"] == "fail" and "INPUT-1" in r["clauses"]]
    assert any("[INPUT-1]" in m and "modified its argument" in m for m in messages), messages


def test_the_clean_backend_passes_input_1(results):
    assert "INPUT-1" in clauses_with(results, CLEAN, "pass")
    # its other INPUT-1 outcome: "not-implemented", the gradient's test (NumPy does not claim "grad")
    assert not clauses_with(results, CLEAN, "fail")
