"""NUM-4's cases hold logits up to the magnitude its clause names, and reach it: the largest finite
logit of every case (every head, masked keys included, float64 inputs) is the drawn magnitude to
within a relative 1e-6, never above. Before, a case's ``logit_scale`` was the spread of its
logits, so a few logits of every case lay past NUM-4's 10^4 (4.5e4 in the certify-profile case
that failed tinygrad-sdpa in bfloat16)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mhaspec.backends import load_backend
from mhaspec.conformance import judge
from mhaspec.conformance.cell import Cell
from mhaspec.conformance.strategies import CaseSpec, build_case, case_specs
from mhaspec.conformance.test_numerics import at_largest_logit

CELL = Cell(load_backend("numpy-batched"), "cpu", "float32")

#: the case of tinygrad-sdpa's certify-profile NUM-4 failure (seed 2857987508), as it was drawn
TINYGRAD_CASE = CaseSpec(batch=2, heads=1, len_q=5, len_k=5, d_k=1, d_v=1, d_model=1, k_dim=1,
                         v_dim=1, d_out=1, self_attention=True, use_bias=False, mask_shape=(1, 5),
                         mask_density=0.95, logit_scale=1e4, seed=553)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(spec=case_specs(masks=True), op=st.sampled_from(["sdpa", "mha"]),
       magnitude=st.sampled_from([1e3, 1e4]))
def test_the_largest_logit_is_the_magnitude(spec, op, magnitude):
    case = at_largest_logit(CELL, spec, op, magnitude)
    largest = judge.oracle_info(case, op)["largest_logit"]
    assert magnitude * (1 - 1e-6) <= largest <= magnitude, (largest, case.spec)


def test_the_spread_alone_put_logits_past_the_clause():
    """The failing case as drawn had logits of 4.5e4; its NUM-4 case now stops at 1e4."""
    assert judge.oracle_info(build_case(TINYGRAD_CASE), "sdpa")["largest_logit"] == pytest.approx(
        45098.76, rel=1e-6)
    case = at_largest_logit(CELL, TINYGRAD_CASE, "sdpa", 1e4)
    q, k = case.q[..., 0], case.k[..., 0]
    assert np.max(np.abs(q[..., :, None] * k[..., None, :])) <= 1e4  # d_k = 1: scale 1
