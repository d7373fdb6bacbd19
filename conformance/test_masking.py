"""Chapter MASK: polarity, bias, the legacy form, key padding, causal alignment, fully masked rows.

Every test runs on both operations (``op``): scaled_dot_product_attention and multi_head_attention.
"""

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from mhaspec.backends import MHAParams
from mhaspec.spec import oracle

from mhaspec.conformance import covering, extremes, harness
from mhaspec.conformance.strategies import CaseSpec, case_specs, with_causal

pytestmark = pytest.mark.requires("masks")


def _allowed(case):
    s = case.spec
    return oracle.allowed_mask(s.batch, s.heads, s.len_q, s.len_k, mask=case.mask,
                               key_padding_mask=case.key_padding_mask, causal=s.causal)


def _expect_zero_where_blocked(cell, op, got, allowed, clause):
    """Weights exactly 0 where ``allowed`` (B, h, L_q, L_k) is False (or within the bound of a
    declared behaviour, :mod:`.behaviour_checks`); rows with no allowed key are MASK-9's verdict
    where the cell declares a MASK-9 deviation (harness.rows_left_to_mask9)."""
    if got.weights is not None:
        empty = harness.rows_left_to_mask9(cell, op, harness.Result(None, allowed.astype(float)))
        allowed = allowed if empty is None else allowed | empty[..., None]
        harness.expect_blocked_weights_zero(
            cell, np.where(allowed, 0.0, got.weights), clause, "at a masked position")


@pytest.mark.clause("MASK-1")
@covering.cover("MASK-1")
@given(spec=case_specs(masks=True, require=("masks",)))
def test_boolean_mask_true_means_may_attend(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-1")
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-1")


@pytest.mark.clause("MASK-1")
@pytest.mark.dtypes("float64", "float32")
@given(spec=case_specs(masks=True, logit_scales=(1e5,), require=("masks",)))
def test_masked_keys_get_zero_weight_even_at_large_logits(cell, op, spec):
    """A finite fill value (e.g. -1e4) leaks weight when every allowed logit of a row is below it."""
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-1")
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-1")


@pytest.mark.clause("MASK-2")
@pytest.mark.requires("bias")
@covering.cover("MASK-2")
@given(spec=case_specs(bias=True, require=("bias",)))
def test_bias_is_added_to_the_scaled_logits(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="MASK-2")


@pytest.mark.clause("MASK-3")
@pytest.mark.requires("legacy_mask")
@pytest.mark.dtypes("float64", "float32", "bfloat16")
@covering.cover("MASK-3")
@given(spec=case_specs(legacy=True, require=("legacy",)))
def test_legacy_mask_one_means_blocked_times_minus_1e9(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-3")
    as_bool = harness.run(cell, op, case, legacy_mask=None, mask=case.legacy_mask == 0)
    out_tol, w_tol = harness.allowance(case, op, cell)
    harness.expect_close(cell, case, got.out, as_bool.out, allowed=2 * out_tol, clause="MASK-3",
                         what="legacy mask vs mask=(legacy_mask == 0)", op=op)


@pytest.mark.clause("MASK-3")
@pytest.mark.requires("legacy_mask")
@pytest.mark.dtypes("float64", "float32")
def test_legacy_offset_is_exactly_minus_1e9(cell, op):
    """The offset is -1e9, not merely "large": a blocked key whose logit is 1.5e9 above the other
    key's still wins (S = 1.5e9 - 1e9 > 0, MASK-4 c), where -inf or -2e9 would block it."""
    one = np.ones((1, 1, 1, 1))
    k = np.array([1.5e9, 0.0]).reshape(1, 1, 2, 1)
    v = np.array([1.0, 2.0]).reshape(1, 1, 2, 1)
    legacy = np.array([[1.0, 0.0]])
    sizes = CaseSpec(batch=1, heads=1, len_q=1, len_k=2, d_k=1, d_v=1, d_model=1, k_dim=1, v_dim=1,
                     d_out=1, legacy_shape=legacy.shape)
    if op == "sdpa":
        got = cell.call("scaled_dot_product_attention", cell.arr(one), cell.arr(k), cell.arr(v),
                        spec=sizes, legacy_mask=cell.arr(legacy))
    else:
        eye = cell.arr(np.ones((1, 1)))
        params = MHAParams(eye, eye, eye, eye, None, None, None, None)
        got = cell.call("multi_head_attention", cell.arr(one[0]), cell.arr(k[0]),
                        cell.arr(v[0]), params, num_heads=1, spec=sizes,
                        legacy_mask=cell.arr(legacy))
    out = cell.backend.to_numpy(got[0]).ravel()
    assert abs(out[0] - 1.0) <= 1e-6, (
        f"[MASK-3] {cell.id} {op}: output {out[0]!r}, the source form gives 1.0 (the blocked key "
        f"at logit 1.5e9 keeps all the weight under an offset of -1e9)")


@pytest.mark.clause("MASK-5")
@covering.cover("MASK-5")
@given(spec=case_specs(key_padding=True, require=("key_padding",)))
def test_key_padding_mask_true_means_key_present(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-5")
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-5")


@pytest.mark.clause("MASK-6")
@pytest.mark.requires("causal")
@covering.cover("MASK-6")
@given(spec=case_specs(cross=True).map(lambda s: with_causal(s, "top_left")))
def test_causal_top_left_allows_j_le_i(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-6")
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-6")


@pytest.mark.clause("MASK-7")
@pytest.mark.requires("causal")
@covering.cover("MASK-7")
@given(spec=case_specs(cross=True).map(lambda s: with_causal(s, "bottom_right")))
def test_causal_bottom_right_allows_j_le_i_plus_lk_minus_lq(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-7")
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-7")


@pytest.mark.clause("MASK-8")
@pytest.mark.requires("causal")
@covering.cover("MASK-8")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_masks_combine_by_and_and_bias_adds(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-8")
    _expect_zero_where_blocked(cell, op, got, _allowed(case), "MASK-8")


@pytest.mark.clause("MASK-9")
@covering.cover("MASK-9")
@given(spec=st.one_of(covering.specs("MASK-9"),
                      case_specs(masks=True, fully_masked=True, key_padding=True)))
def test_fully_masked_rows_give_zero_output_and_zero_weights(cell, op, spec):
    """Every way a row empties (conditions.SPACES["MASK-9"]), with and without a bias."""
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    ref = harness.reference(case, op, cell.dtype)
    empty = ~np.any(ref.expected.weights != 0, axis=-1)  # (B, h, L_q): no allowed key
    rows_out = got.out[empty] if op == "sdpa" else got.out[empty.all(axis=1)]
    if op == "mha":  # a row masked in every head gives b_o: Concat(0, ..., 0) W_o + b_o
        b_o = case.params.b_o if case.params.b_o is not None else np.zeros(case.spec.d_out)
        rows_out = rows_out - cell.backend.to_numpy(cell.arr(b_o))
    assert np.all(rows_out == 0), (f"[MASK-9] {cell.id}: fully masked rows must give output 0, "
                                   f"got {rows_out[~(rows_out == 0)][:4]} ...")
    if got.weights is not None:
        assert np.all(got.weights[empty] == 0), (f"[MASK-9] {cell.id}: fully masked rows must give "
                                                 f"weights 0, got {got.weights[empty][:2]} ...")
    harness.expect_oracle(cell, case, got, op=op, clause="MASK-9", ref=ref)


@pytest.mark.clause("MASK-10")
@covering.cover("MASK-10")
@given(spec=case_specs(bias=True, key_padding=True, causal=True))
def test_all_true_mask_equals_no_mask(cell, op, spec):
    case = cell.case(spec, op)
    ones = np.ones((spec.batch, spec.heads, spec.len_q, spec.len_k), dtype=bool)
    base, with_mask = harness.run(cell, op, case), harness.run(cell, op, case, mask=ones)
    out_tol, w_tol = harness.allowance(case, op, cell)
    harness.expect_close(cell, case, with_mask.out, base.out, allowed=2 * out_tol, clause="MASK-10",
                         what="all-True mask vs no mask", op=op)


@pytest.mark.clause("MASK-11")
@pytest.mark.requires("bias")
@covering.cover("MASK-11")
@given(spec=st.one_of(case_specs(masks=True, fully_masked=True),
                      case_specs(masks=True, require=("masks",))))
# always run: fully masked rows (a mask giving the mean of V where the -inf bias gives 0 or NaN)
@example(spec=CaseSpec(mask_shape=(2, 1, 3, 3), fully_masked_rows=True, seed=1))
def test_boolean_mask_equals_its_minus_inf_bias(cell, op, spec):
    """Including fully masked rows, drawn about half the time: both forms must give the same."""
    case = cell.case(spec, op)
    as_bias = np.where(case.mask, 0.0, -np.inf)
    base, biased = harness.run(cell, op, case), harness.run(cell, op, case, mask=None, bias=as_bias)
    out_tol, w_tol = harness.allowance(case, op, cell)
    harness.expect_close(cell, case, biased.out, base.out, allowed=2 * out_tol, clause="MASK-11",
                         what="mask=M vs bias=where(M, 0, -inf)", op=op)
    if base.weights is not None:
        harness.expect_close(cell, case, biased.weights, base.weights, allowed=2 * w_tol,
                             clause="MASK-11", what="weights, mask vs -inf bias", op=op)


@pytest.mark.clause("MASK-12")
@covering.cover("MASK-12")
@given(spec=case_specs(key_padding=True, require=("key_padding",),
                           sizes=lambda z: z.len_k > 1))
def test_values_at_masked_keys_do_not_matter(cell, op, spec):
    case = cell.case(spec, op)
    blocked = ~case.key_padding_mask  # (B, L_k)
    rng = np.random.default_rng(spec.seed + 2)
    # large but finite in the dtype, also after the value projection |value| * max column sum |W_v|
    gain = 1.0 if op == "sdpa" else 1.0 + float(np.abs(case.params.w_v).sum(axis=0).max())
    big = min(1e6, float(np.finfo(np.float16).max) / (8 * gain)) if cell.dtype == "float16" else 1e6

    def noise(shape):
        return np.clip(rng.standard_normal(shape), -4, 4) * big

    v = np.where(blocked[:, None, :, None], noise(case.v.shape), case.v)
    if spec.self_attention:
        spec = spec._replace(self_attention=False)
        case = case._replace(spec=spec, key=case.query, value=case.query)
    value = np.where(blocked[:, :, None], noise(case.value.shape), case.value)
    changed = case._replace(v=v, value=value)
    base, other = harness.run(cell, op, case), harness.run(cell, op, changed)
    out_tol, _ = harness.allowance(case, op, cell)
    harness.expect_close(cell, case, other.out, base.out, allowed=2 * out_tol, clause="MASK-12",
                         what="output after changing values at masked keys", op=op)


@pytest.mark.clause("MASK-13")
@pytest.mark.requires("masks")
@extremes.EXPECTED_NONFINITE_WARNINGS
@covering.cover("MASK-13")
@given(spec=case_specs(masks=True, causal=True, key_padding=True,
                           require=("key_padding",), sizes=lambda z: z.len_k > 1),
       value=st.sampled_from(sorted(extremes.NONFINITE)))
# always run: a NaN key behind key padding (PyTorch issue 101967)
@example(spec=CaseSpec(len_k=5, key_padding=True, seed=3), value="nan")
def test_nonfinite_keys_outside_the_allowed_set_do_not_leak(cell, op, spec, value):
    """NaN or inf in the key that the masks exclude most often: rows that exclude it must be
    exactly as the oracle's (finite); rows that allow it are non-finite, as the oracle's (NUM-6)."""
    spec = spec._replace(self_attention=False, extreme=extremes.masked_key(value))
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="MASK-13")
