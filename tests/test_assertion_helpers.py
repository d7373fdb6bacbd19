"""The suite's assertion helpers hide their own frames (``__tracebackhide__``), so a failure's
traceback ends at the check in the test, as array-api-tests' helpers do.

Axis legend: none (no arrays are judged).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mhaspec.conformance import expect, harness, vjp

#: every helper a chapter test calls to assert
HELPERS = (expect.expect_oracle, expect.expect_close, expect.expect_rejections, harness.check,
           vjp.judge_gradients, vjp.expect_gradients)


@pytest.mark.parametrize("helper", HELPERS, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_each_assertion_helper_hides_its_frame(helper):
    assert "__tracebackhide__" in helper.__code__.co_varnames


def test_a_failing_check_shows_the_test_line_last():
    cell = SimpleNamespace(id="numpy-batched-cpu-float32", dtype="float32")
    with pytest.raises(AssertionError, match="gradients for") as info:
        vjp.judge_gradients(cell, "GRAD-3", {"dq": np.zeros(1)}, {"dk": np.zeros(1)},
                            {"dk": np.zeros(1)}, 1.0, "")
    shown = info.traceback.filter(info)
    assert shown[-1].name == "test_a_failing_check_shows_the_test_line_last"
