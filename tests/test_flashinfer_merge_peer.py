"""FlashInfer's merge (``tests/flashinfer_merge.py``, transcribed from its CUDA sources) as the peer
of MERGE's declared-base path: a backend that declares ``lse_base`` "2" alone is judged on every
MERGE clause in base 2, and FlashInfer's merge before PR 4401 fails MERGE-2 as its issues say
(two empty states merged to NaN).

Axis legend: n tokens, N states, h heads, d value width.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashinfer_merge import SENTINEL, merge_state, merge_states
from suite_runner import outcomes_by_clause, run_suite

REFS = {"fixed": "flashinfer_merge:FIXED", "before": "flashinfer_merge:BEFORE_4401"}


def _empty(n=3, count=2, h=2, d=4):
    return np.zeros((n, count, h, d)), np.full((n, count, h), -np.inf)


def _lse_2_merge(v, s):
    """LSE-2 in base 2: lse = log2 sum 2^s_m, O = sum 2^(s_m - lse) O_m over axis 1."""
    total = np.log2(np.exp2(s).sum(axis=1))
    return (np.exp2(s - total[:, None])[..., None] * v).sum(axis=1), total


@pytest.mark.parametrize("fixed", [True, False])
def test_the_transcription_merges_finite_states_as_lse_2_says(fixed):
    """Both forms agree on finite states, the two-state kernel and the N-state one."""
    rng = np.random.default_rng(3)
    v, s = rng.standard_normal((5, 3, 2, 4)), rng.uniform(-3, 3, (5, 3, 2))
    for got, want in ((merge_states(v, s, fixed=fixed), _lse_2_merge(v, s)),
                      (merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], fixed=fixed),
                       _lse_2_merge(v[:, :2], s[:, :2]))):
        for mine, expected in zip(got, want):
            np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-12)


def test_two_empty_states_merge_to_the_empty_state_after_pr_4401_and_to_nan_before():
    v, s = _empty()
    out, lse = merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], fixed=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)
    out, lse = merge_states(v, s, fixed=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)
    out, _ = merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], fixed=False)
    assert np.all(np.isnan(out))
    out, lse = merge_states(v, s, fixed=False)  # state_t starts at m = -5e4, d = 1
    assert np.all(out == 0) and np.all(lse == -SENTINEL)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_suite(tmp_path_factory.mktemp("flashinfer"), list(REFS.values()), "-k", "test_merge")


def test_a_base_2_merge_conforms_on_every_merge_clause_in_its_declared_base(results):
    """MERGE-1, 2, 3, 5 and 6 pass in base 2; MERGE-4 is not implemented (FlashInfer's merges
    take no sinks and the backend does not claim "sink"). Before MERGE-1, 2 and 5 used the
    backend's declared conventions, MERGE-1 and 2 were not implemented and MERGE-5 failed."""
    outcomes = outcomes_by_clause(results, "flashinfer-merge")
    for clause in ("MERGE-1", "MERGE-2", "MERGE-3", "MERGE-5", "MERGE-6"):
        assert outcomes.get(clause) == {"pass"}, (clause, outcomes)
    assert "pass" not in outcomes["MERGE-4"] and "fail" not in outcomes["MERGE-4"], outcomes


def test_flashinfers_merge_before_pr_4401_fails_merge_2(results):
    outcomes = outcomes_by_clause(results, "flashinfer-merge-before-4401")
    assert "fail" in outcomes["MERGE-2"], outcomes
    assert outcomes["MERGE-3"] == {"pass"} and outcomes["MERGE-5"] == {"pass"}, outcomes
    messages = [r.get("message", "") for r in results
                if r["backend"] == "flashinfer-merge-before-4401" and r["outcome"] == "fail"
                and "MERGE-2" in r["clauses"]]
    assert any("[MERGE-2]" in m for m in messages), messages
