"""GRAD-1's multi-head checks leave a row without an allowed key to the clauses that govern it,
in cells that declare them: MASK-9 (what the row computes: its cotangent is 0) and GRAD-2 (the
gradients it reaches: unjudged by GRAD-1). Before, a certify-profile run of jax-dpa-jit failed
GRAD-1 on such a case (the declared mean of V mixed by W_o into dW_o and dV), and torch-mha's NaN
row (its declared MASK-9 and GRAD-2) failed GRAD-1 on the same case.

Axis legend: B batch, L_q / L_k lengths, h heads.
"""

from __future__ import annotations

import pytest

from mhaspec.backends import load_backend
from mhaspec.conformance import test_grad
from mhaspec.conformance.cell import Cell
from mhaspec.conformance.strategies import CaseSpec

#: a multi-head case whose first query row has no allowed key (bottom-right causal, L_q > L_k),
#: as a certify-profile run of jax-dpa-jit drew it for GRAD-1 (seed 10511)
EMPTIED_ROW = CaseSpec(batch=1, heads=2, len_q=2, len_k=1, d_k=1, d_v=1, d_model=2, k_dim=2,
                       v_dim=2, d_out=2, self_attention=False, mask_shape=(2, 1, 1),
                       mask_density=0.3, causal="bottom_right", logit_scale=100.0, seed=10511)


def _cell(name: str) -> Cell:
    pytest.importorskip({"jax-dpa": "jax", "torch-mha": "torch"}[name])
    return Cell(load_backend(name), "cpu", "float32")


def _judge(impl, case, cot, clause):
    test_grad.expect_oracle_grads(impl, case, test_grad.backend_grads(impl, case, cot), clause, cot)


@pytest.mark.parametrize("name", ["jax-dpa", "torch-mha"])
def test_grad1_leaves_an_emptied_row_to_mask9_and_grad2(name):
    impl = _cell(name)
    case = impl.case(EMPTIED_ROW)
    left = test_grad.output_rows_left_to_mask9(impl, case)
    assert left is not None and left.tolist() == [[True, False]]
    _judge(impl, case, test_grad.cotangent(case, left), "GRAD-1")
    with pytest.raises(AssertionError, match=r"\[GRAD-2\].*gradient of"):  # its declared clause
        _judge(impl, case, test_grad.cotangent(case), "GRAD-2")


def test_jax_dpa_with_the_rows_cotangent_and_no_grad2_fails_grad1():
    """In a cell declaring MASK-9 but not GRAD-2, GRAD-1 judges every gradient: with the row's
    zero cotangent they pass (the mean of V is finite); with its cotangent the declared mean of V
    reaches dW_o and dV and GRAD-1 fails."""
    impl = _cell("jax-dpa")
    declared = {c: t for c, t in impl.backend.deviations.items() if c != "GRAD-2"}
    mask9_only = Cell(type(impl.backend)("jax-dpa-mask9-only"), "cpu", "float32")
    mask9_only.backend.deviations = declared
    case = mask9_only.case(EMPTIED_ROW)
    left = test_grad.output_rows_left_to_mask9(mask9_only, case)
    _judge(mask9_only, case, test_grad.cotangent(case, left), "GRAD-1")
    with pytest.raises(AssertionError, match=r"\[GRAD-1\].*gradient of"):
        _judge(mask9_only, case, test_grad.cotangent(case), "GRAD-1")
