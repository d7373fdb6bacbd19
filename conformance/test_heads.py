"""Chapter HEAD: split_heads and combine_heads are exact layout changes."""

import numpy as np
import pytest
from hypothesis import given

from mhaspec.spec import oracle

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import case_specs

pytestmark = pytest.mark.requires("heads")


def _exact(cell, x):
    """``x`` rounded to the cell's dtype, as NumPy: what a layout change must reproduce exactly."""
    return cell.backend.to_numpy(cell.arr(x))


@pytest.mark.clause("HEAD-1")
@covering.cover("HEAD-1")
@given(spec=case_specs())
def test_split_heads_gives_head_i_columns_i_d_to_i_plus_1_d(cell, spec):
    case = cell.case(spec)
    harness.note("heads", case.spec)
    x = oracle.combine_heads(case.q)  # (B, L_q, h*d_k)
    got = cell.backend.to_numpy(cell.call("split_heads", cell.arr(x), spec.heads))
    np.testing.assert_array_equal(got, _exact(cell, oracle.split_heads(x, spec.heads)),
                                  err_msg="[HEAD-1] split_heads moved elements to the wrong place")


@pytest.mark.clause("HEAD-2")
@covering.cover("HEAD-2")
@given(spec=case_specs())
def test_combine_heads_concatenates_heads_and_inverts_split(cell, spec):
    case = cell.case(spec)
    harness.note("heads", case.spec)
    got = cell.backend.to_numpy(cell.call("combine_heads", cell.arr(case.q)))
    np.testing.assert_array_equal(got, _exact(cell, oracle.combine_heads(case.q)),
                                  err_msg="[HEAD-2] combine_heads is not the concatenation of heads")
    x = cell.arr(oracle.combine_heads(case.q))
    round_trip = cell.call("combine_heads", cell.call("split_heads", x, spec.heads))
    np.testing.assert_array_equal(cell.backend.to_numpy(round_trip), cell.backend.to_numpy(x),
                                  err_msg="[HEAD-2] combine_heads(split_heads(x)) != x")
