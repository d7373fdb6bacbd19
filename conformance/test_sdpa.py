"""Chapter SDPA: the attention equation, its scale, and the symmetries it implies."""

import numpy as np
import pytest
from hypothesis import example, given

from mhaspec.conformance import covering, harness
from mhaspec.conformance._transform import permute_keys, permute_queries, sub_batch
from mhaspec.conformance.strategies import CaseSpec, case_specs

pytestmark = pytest.mark.requires("sdpa")


@pytest.mark.clause("SDPA-1")
@covering.cover("SDPA-1")
@given(spec=case_specs())
def test_attention_equals_softmax_of_scaled_logits_times_v(cell, spec):
    case = cell.case(spec, "sdpa")
    harness.expect_oracle(cell, case, cell.sdpa(case), op="sdpa", clause="SDPA-1")


@pytest.mark.clause("SDPA-2")
@pytest.mark.requires("scale")
@covering.cover("SDPA-2")
@given(spec=case_specs(custom_scale=True))
def test_scale_defaults_to_rsqrt_dk_and_can_be_overridden(cell, spec):
    case = cell.case(spec, "sdpa")
    harness.expect_oracle(cell, case, cell.sdpa(case), op="sdpa", clause="SDPA-2")


@pytest.mark.clause("SDPA-3")
@covering.cover("SDPA-3")
@given(spec=case_specs(cross=True, sizes=lambda z: z.d_v != z.d_k))
def test_value_width_may_differ_from_key_width(cell, spec):
    case = cell.case(spec, "sdpa")
    harness.expect_oracle(cell, case, cell.sdpa(case), op="sdpa", clause="SDPA-3")


@pytest.mark.clause("SDPA-4")
@pytest.mark.requires("weights")
@covering.cover("SDPA-4")
@given(spec=case_specs(masks=True, key_padding=True, causal=True))
# always run: bottom-right causal with L_q > L_k leaves the first L_q - L_k rows without a key
@example(spec=CaseSpec(batch=1, len_q=8, len_k=5, d_k=8, causal="bottom_right", seed=0))
def test_weights_are_the_probabilities_that_multiply_v(cell, spec):
    case = cell.case(spec, "sdpa")
    got = cell.sdpa(case)
    harness.expect_oracle(cell, case, got, op="sdpa", clause="SDPA-4")
    out_tol, w_tol = harness.allowance(case, "sdpa", cell)
    v = cell.backend.to_numpy(cell.arr(case.v)).astype(np.float64)
    harness.expect_close(cell, case, got.out, got.weights.astype(np.float64) @ v,
                         allowed=2 * out_tol + 2 * w_tol * np.abs(v).sum(axis=-2).max(),
                         clause="SDPA-4", what="output vs returned weights @ v", op="sdpa")
    # 1, and 0 on a row with no allowed key (bottom-right causal with L_q > L_k empties rows):
    # the oracle's sums; a cell that declares MASK-9 leaves those rows to MASK-9's verdict
    expected = harness.oracle_result(case, "sdpa")
    sums, want = got.weights.sum(-1), expected.weights.sum(-1)
    left = harness.rows_left_to_mask9(cell, "sdpa", expected)
    if left is not None:
        sums, want = np.where(left, 0.0, sums), np.where(left, 0.0, want)
    harness.expect_close(cell, case, sums, want, allowed=2 * w_tol * spec.len_k, clause="SDPA-4",
                         what="row sums of the weights", op="sdpa")


def _perm(spec, n):
    return np.random.default_rng(spec.seed + 1).permutation(n)


@pytest.mark.clause("SDPA-5")
@covering.cover("SDPA-5")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, legacy=True))
def test_permuting_keys_and_values_jointly_keeps_the_output(cell, spec):
    case = cell.case(spec, "sdpa")
    perm = _perm(spec, spec.len_k)
    base, moved = cell.sdpa(case), cell.sdpa(permute_keys(case, perm))
    out_tol, w_tol = harness.allowance(case, "sdpa", cell)
    harness.expect_close(cell, case, moved.out, base.out, allowed=2 * out_tol, clause="SDPA-5",
                         what="output after permuting keys and values", op="sdpa")
    if base.weights is not None:
        harness.expect_close(cell, case, moved.weights, base.weights[..., perm], allowed=2 * w_tol,
                             clause="SDPA-5", what="weights after permuting keys", op="sdpa")


@pytest.mark.clause("SDPA-6")
@covering.cover("SDPA-6")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, legacy=True))
def test_permuting_queries_permutes_the_output(cell, spec):
    case = cell.case(spec, "sdpa")
    perm = _perm(spec, spec.len_q)
    base, moved = cell.sdpa(case), cell.sdpa(permute_queries(case, perm))
    out_tol, w_tol = harness.allowance(case, "sdpa", cell)
    harness.expect_close(cell, case, moved.out, base.out[:, :, perm], allowed=2 * out_tol,
                         clause="SDPA-6", what="output after permuting queries", op="sdpa")
    if base.weights is not None:
        harness.expect_close(cell, case, moved.weights, base.weights[:, :, perm], allowed=2 * w_tol,
                             clause="SDPA-6", what="weights after permuting queries", op="sdpa")


@pytest.mark.clause("SDPA-7")
@covering.cover("SDPA-7")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, causal=True,
                           sizes=lambda z: z.batch > 1))
def test_batch_items_are_independent(cell, spec):
    case = cell.case(spec, "sdpa")
    items = np.arange(1, spec.batch)
    full, part = cell.sdpa(case), cell.sdpa(sub_batch(case, items))
    out_tol, _ = harness.allowance(case, "sdpa", cell)
    harness.expect_close(cell, case, part.out, full.out[items], allowed=2 * out_tol,
                         clause="SDPA-7", what="sub-batch output vs slice of full output", op="sdpa")
