"""Chapter GRAD: gradients of sum(output * G) against the analytic float64 gradient.

Axis legend: B batch, L_q / L_k lengths, h heads, d_out output width.

The cotangent ``G (B, L_q, d_out)`` is fixed random data derived from the case's seed. Each
gradient is judged as NUM-3 judges an output: against ``spec/oracle_grad.py`` in float64, with the
reference error of the same analytic gradient evaluated in float32 (scaled to float64's unit
roundoff for float64 candidates) and, as the scale, the largest magnitude among all the oracle's
gradients of the case times the condition factor max(1, max |logit|) (:func:`grad_scale`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, governed, harness, tolerance, vjp
from mhaspec.conformance.strategies import case_specs
from mhaspec.spec import oracle
from mhaspec.spec.oracle_grad import mha_vjp as oracle_vjp

pytestmark = pytest.mark.requires("grad")


def cotangent(case, left_out: np.ndarray | None = None) -> np.ndarray:
    """The fixed cotangent of ``case``: standard normal (B, L_q, d_out) from its seed, 0 on the
    output rows ``left_out`` (B, L_q) (:func:`output_rows_left_to_mask9`; None: none)."""
    s = case.spec
    cot = np.random.default_rng([s.seed, 7]).standard_normal((s.batch, s.len_q, s.d_out))
    if left_out is not None:
        cot[left_out] = 0.0
    return cot


def output_rows_left_to_mask9(cell, case) -> np.ndarray | None:
    """The output rows (B, L_q) of ``case`` holding a query row without an allowed key in some
    head, where the cell leaves such rows to MASK-9's verdict (it declares a deviation there:
    :func:`harness.rows_left_to_mask9`), else None. GRAD-1's cotangent is 0 on them, as
    attention_vjp's is (:func:`vjp.rows_left_to_mask9`): what the op computes there (the mean of
    V, say) is the declared deviation, which W_o mixes into the whole output row, and the other
    rows' gradients are judged without it (a NaN there still reaches every gradient: where it
    goes, :func:`gradients_left_to_grad2`). GRAD-2, which judges the gradients of such rows,
    keeps their cotangent."""
    empty = harness.rows_left_to_mask9(cell, "mha", harness.oracle_result(case, "mha"))
    return None if empty is None else empty.any(axis=1)


def backend_grads(cell, case, cot) -> dict[str, np.ndarray]:
    """Run the backend's mha_vjp on ``case``; self-attention passes one array three times."""
    grads = cell.call("mha_vjp", *cell.mha_inputs(case), cell.params(case.params), cell.arr(cot),
                      num_heads=case.spec.heads, spec=case.spec, **cell.masks(case))
    return {n: cell.backend.to_numpy(g) for n, g in grads.items()}


def oracle_grads(case, cot, precision="float64", info=None) -> dict[str, np.ndarray]:
    _, grads = oracle_vjp(case.query, case.key, case.value, case.params, cot,
                          num_heads=case.spec.heads, precision=precision, info=info,
                          **case.mask_kwargs())
    return grads


def grad_scale(want: dict, info: dict) -> float:
    """GRAD-1's scale: the largest gradient magnitude times the condition factor
    max(1, max |logit|). One scale for the whole gradient: small entries (b_k's is exactly 0, the
    softmax being shift invariant) are differences of terms as large as the largest gradient; and
    a logit S carries a rounding error ~ u |S|, which the softmax passes on as a relative error of
    P and so of every gradient (fused kernels that recompute P from a log-sum-exp show it)."""
    largest = max(float(np.max(np.abs(g), initial=0.0)) for g in want.values())
    return largest * max(1.0, info["max_abs_logit"])


def gradients_left_to_grad2(cell, case, clause: str) -> dict[str, np.ndarray]:
    """Where the gradients of the case's rows without an allowed key reach, when the cell
    declares GRAD-2 (:data:`.governed.EMPTY_ROW_MHA_GRADIENTS`) and ``clause``, the one judged, is
    another: gradient name -> a boolean mask broadcasting to it, every input gradient of their
    batch items (B, 1, 1) and every parameter's gradient (the projections mix every row). A NaN
    such a row computes (MASK-9) reaches all of them however its cotangent is chosen, and is
    GRAD-2's deviation, not GRAD-1's. {} otherwise."""
    empty = harness.rows_left_to_mask9(cell, "mha", harness.oracle_result(case, "mha"), clause,
                                       subject=governed.EMPTY_ROW_MHA_GRADIENTS)
    if empty is None:
        return {}
    items = empty.any(axis=(1, 2))[:, None, None]
    params = {name: np.ones((1,) * np.ndim(p), dtype=bool)
              for name, p in case.params._asdict().items() if p is not None}
    return {"query": items, "key": items, "value": items, **params}


def expect_oracle_grads(cell, case, got: dict, clause: str, cot: np.ndarray | None = None) -> None:
    """Every gradient agrees with the analytic one under the NUM-3 rule (GRAD-1), but those
    :func:`gradients_left_to_grad2` leaves unjudged; ``cot``: the cotangent ``got`` was computed
    with (None: :func:`cotangent` of the case)."""
    cot = cotangent(case) if cot is None else cot
    info = {}
    want = oracle_grads(case, cot, info=info)
    naive = oracle_grads(case, cot, tolerance.naive_precision(cell.dtype))
    scale = grad_scale(want, info)
    got, want, naive = dict(got), dict(want), dict(naive)
    for name, where in gradients_left_to_grad2(cell, case, clause).items():
        if name in got and name in want:
            got[name], want[name], naive[name] = harness.unjudged(
                [got[name], want[name], naive[name]], where)
    vjp.judge_gradients(cell, clause, got, want, naive, scale,
                        harness.reproducer(cell, "mha", case.spec))


@pytest.mark.clause("GRAD-1")
@covering.cover("GRAD-1")
@given(spec=case_specs(masks=True, bias=True, legacy=True, key_padding=True, causal=True,
                       custom_scale=True))
def test_gradients_agree_with_the_analytic_gradient(cell, spec):
    case = cell.case(spec)
    cot = cotangent(case, output_rows_left_to_mask9(cell, case))
    expect_oracle_grads(cell, case, backend_grads(cell, case, cot), "GRAD-1", cot)


@pytest.mark.clause("GRAD-2")
@pytest.mark.requires("masks")
@covering.cover("GRAD-2")
@given(spec=case_specs(masks=True, fully_masked=True, key_padding=True, causal=True))
def test_masked_rows_and_keys_have_finite_and_zero_gradients(cell, spec):
    case = cell.case(spec)
    got = backend_grads(cell, case, cotangent(case))
    bad = [n for n, g in got.items() if not np.all(np.isfinite(g))]
    assert not bad, f"[GRAD-2] {cell.id}: NaN or infinity in the gradients of {bad}"
    s = case.spec
    allowed = oracle.allowed_mask(s.batch, s.heads, s.len_q, s.len_k, mask=case.mask,
                                  key_padding_mask=case.key_padding_mask, causal=s.causal)
    dead_queries = ~allowed.any(axis=(1, 3))  # (B, L_q): empty in every head
    dead_keys = ~allowed.any(axis=(1, 2))     # (B, L_k): attended by no query in any head
    for name, dead in (("query", dead_queries), ("key", dead_keys), ("value", dead_keys)):
        leaked = np.abs(got[name][dead]).max(initial=0.0)
        assert leaked == 0.0, (f"[GRAD-2] {cell.id}: gradient {leaked:.3e} for a row of '{name}' "
                               f"the output does not depend on; it must be exactly 0")
    expect_oracle_grads(cell, case, got, "GRAD-2")
