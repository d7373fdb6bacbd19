"""Chapter WIN: sliding-window (local) attention (optional capability "window").

Both operations (``op``). Windows are drawn with sides 0, 1, 3, wider than L_k and unbounded, on
either diagonal (``causal`` or ``alignment``), with every mask, with L_q != L_k and with a cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("window")

#: WIN-1's own example: bottom-right, L_q = 3, L_k = 5, window (1, 0): query 0 sees keys 1 and 2.
EXAMPLE = CaseSpec(batch=1, heads=1, len_q=3, len_k=5, d_k=4, d_v=4, seed=71, window=(1, 0),
                   alignment="bottom_right")


@pytest.mark.clause("WIN-1")
@covering.cover("WIN-1")
@given(spec=feature_specs(require=("window",), allow=("softcap", "alibi", "segments", "cache",
                                                      "lse"),
                          masks=True, bias=True, key_padding=True, causal=True))
def test_window_allows_keys_within_left_and_right_of_the_diagonal(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="WIN-1")


@pytest.mark.clause("WIN-1")
@pytest.mark.parametrize("window", [(1, 0), (0, 0), (0, None), (None, 1), (2, 2), (None, None)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_the_clauses_example_and_its_neighbours(cell, op, window, alignment):
    """L_q = 3, L_k = 5: with bottom-right and (1, 0) query 0 attends exactly keys 1 and 2."""
    case = cell.case(EXAMPLE._replace(window=window, alignment=alignment), op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="WIN-1")
    if got.weights is not None and (window, alignment) == ((1, 0), "bottom_right"):
        seen = np.flatnonzero(harness.attended(cell, got.weights[0, 0, 0]))
        assert seen.tolist() == [1, 2], f"[WIN-1] {cell.id} {op}: query 0 attends keys {seen}"


@pytest.mark.clause("WIN-2")
@pytest.mark.requires("errors")
def test_invalid_window_or_missing_diagonal_is_rejected(cell, op):
    for spec in covering.row_specs("WIN-2", CaseSpec(seed=72)):
        case = cell.case(spec, op)
        harness.expect_rejections(cell, op, case, "WIN-2", [
            ("window without causal, alignment or cache", "alignment", {"window": (1, 1)}),
            ("unknown alignment", "alignment", {"window": (1, 1), "alignment": "diagonal"}),
            ("window not a pair", "window", {"window": (1,), "alignment": "top_left"}),
            ("window an integer", "window", {"window": 3, "alignment": "top_left"}),
            ("negative side", "window", {"window": (-1, 0), "alignment": "top_left"}),
            ("non-integer side", "window", {"window": (1.5, 0), "alignment": "top_left"}),
            ("boolean side", "window", {"window": (True, 0), "alignment": "top_left"})])


@pytest.mark.clause("WIN-2")
@pytest.mark.requires("errors", "causal")
def test_alignment_contradicting_causal_is_rejected(cell, op):
    for spec in covering.row_specs("WIN-2", CaseSpec(seed=73)):
        case = cell.case(spec, op)
        harness.expect_rejections(cell, op, case, "WIN-2", [
            ("alignment differs from causal", "alignment",
             {"window": (1, 0), "causal": "top_left", "alignment": "bottom_right"})])
