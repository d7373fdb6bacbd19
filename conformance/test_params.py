"""Chapter PARAM: the projection layout and which columns belong to which head."""

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import case_specs

pytestmark = pytest.mark.requires("mha")


@pytest.mark.clause("PARAM-1")
@covering.cover("PARAM-1")
@given(spec=case_specs(cross=True))
def test_projections_are_x_at_w_plus_b(cell, spec):
    case = _visible_biases(cell.case(spec))
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="PARAM-1")


#: PARAM-1's biases: as large as a projection's outputs (standard deviation 1 against the suite's
#: 0.1), so that a bias added along the wrong axes errs by far more than the allowance of every
#: dtype, bfloat16's included (keras-mha's width-1 bias erred within it at 0.1)
BIAS_GAIN = 10.0


def _visible_biases(case):
    """``case`` with its projection biases multiplied by :data:`BIAS_GAIN` (none stays none)."""
    p = case.params
    return case._replace(params=p._replace(**{
        name: None if getattr(p, name) is None else getattr(p, name) * BIAS_GAIN
        for name in ("b_q", "b_k", "b_v", "b_o")}))


def _swap_heads(case, i, j):
    """Swap heads i and j in every projection: columns of W_q, W_k, W_v (and biases), rows of W_o."""
    p, h = case.params, case.spec.heads
    d_k, d_v = p.w_q.shape[1] // h, p.w_v.shape[1] // h

    def perm(d):
        idx = np.arange(h * d).reshape(h, d)
        idx[[i, j]] = idx[[j, i]]
        return idx.reshape(-1)

    pk, pv = perm(d_k), perm(d_v)
    params = p._replace(w_q=p.w_q[:, pk], w_k=p.w_k[:, pk], w_v=p.w_v[:, pv], w_o=p.w_o[pv],
                        b_q=None if p.b_q is None else p.b_q[pk],
                        b_k=None if p.b_k is None else p.b_k[pk],
                        b_v=None if p.b_v is None else p.b_v[pv])
    return case._replace(params=params)


@pytest.mark.clause("PARAM-2")
@covering.cover("PARAM-2")
@given(spec=case_specs(cross=True, sizes=lambda z: z.heads > 1))
def test_head_i_owns_column_block_i(cell, spec):
    """Swapping two heads' column blocks (and W_o row blocks) swaps their weights and keeps the output."""
    case = cell.case(spec)
    swapped = _swap_heads(case, 0, spec.heads - 1)
    base, other = cell.mha(case), cell.mha(swapped)
    out_tol, w_tol = harness.allowance(case, "mha", cell)
    harness.expect_close(cell, case, other.out, base.out, allowed=2 * out_tol, clause="PARAM-2",
                         what="output after swapping head blocks", op="mha")
    if base.weights is not None:
        order = list(range(spec.heads))
        order[0], order[-1] = order[-1], order[0]
        harness.expect_close(cell, case, other.weights, base.weights[:, order], allowed=2 * w_tol,
                             clause="PARAM-2", what="weights of swapped heads", op="mha")
