"""keras-mha's width-1 projection bias (a bias added along the tokens when L = h) shows under
PARAM-1 in every dtype the adapter claims, bfloat16 included: PARAM-1's cases draw biases as large
as the projections' outputs, so the declared deviation is confirmed there, not stale, and the other
clauses' cases are built without biases in that cell (conformance/governed.py)."""

from __future__ import annotations

import pytest

from mhaspec import runner

pytest.importorskip("keras")
pytest.importorskip("tensorflow")


def test_keras_width_one_bias_is_a_confirmed_deviation_in_bfloat16(tmp_path):
    run = runner.run_subprocess(
        runner.suite_args(backends=["keras-mha"], profile="ci", dtypes="bfloat16",
                          extra=["-p", "no:xdist", "--tb=no", "-k",
                                 "test_projections_are_x_at_w_plus_b"]),
        cwd=tmp_path, timeout=600)
    cells = {(r["device"], r["dtype"]): r for r in run.results if r["backend"] == "keras-mha"}
    result = cells[("cpu", "bfloat16")]
    assert result["outcome"] == "deviation", result
    assert result["ratios"]["PARAM-1"] > 4, result["ratios"]
