"""Chapter SHAPE: output shapes and dtypes of both operations."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import conditions, covering, harness
from mhaspec.conformance.strategies import case_specs


def _expected_dtype(cell):
    return np.dtype("float32") if cell.dtype == "bfloat16" else np.dtype(cell.dtype)


@pytest.mark.clause("SHAPE-1")
@pytest.mark.requires("mha")
@covering.cover("SHAPE-1")
@given(spec=case_specs())
def test_mha_output_is_b_lq_dout_in_the_input_dtype(cell, spec):
    case = cell.case(spec)
    spec = case.spec
    got = cell.mha(case)
    assert got.out.shape == (spec.batch, spec.len_q, spec.d_out), "[SHAPE-1] output shape"
    assert got.out.dtype == _expected_dtype(cell), "[SHAPE-1] output dtype differs from the input's"


@pytest.mark.clause("SHAPE-2")
@pytest.mark.requires("weights")
@covering.cover("SHAPE-2")
@given(spec=case_specs())
def test_weights_are_per_head_b_h_lq_lk(cell, op, spec):
    case = cell.case(spec, op)
    spec = case.spec
    got = harness.run(cell, op, case)
    assert got.weights is not None, "[SHAPE-2] backend claims 'weights' but returned None"
    assert got.weights.shape == (spec.batch, spec.heads, spec.len_q, spec.len_k), "[SHAPE-2] shape"
    assert got.weights.dtype == _expected_dtype(cell), "[SHAPE-2] weights dtype"


@pytest.mark.clause("SHAPE-3")
@pytest.mark.requires("sdpa")
@covering.cover("SHAPE-3")
@given(spec=case_specs())
def test_sdpa_output_is_b_h_lq_dv(cell, spec):
    case = cell.case(spec, "sdpa")
    spec = case.spec
    got = cell.sdpa(case)
    assert got.out.shape == (spec.batch, spec.heads, spec.len_q, spec.d_v), "[SHAPE-3] output shape"
    assert got.out.dtype == _expected_dtype(cell), "[SHAPE-3] output dtype"


@pytest.mark.clause("SHAPE-4")
@covering.cover("SHAPE-4")
@given(spec=case_specs(causal=True, custom_scale=True),
       empty=st.sampled_from(("batch", "len_q", "len_k", "batch+len_k")))
def test_empty_sizes_give_empty_or_zero_results(cell, op, spec, empty):
    """B = 0 and L_q = 0: empty results; L_k = 0: every row fully masked (zeros, or b_O)."""
    sizes = {name: 0 for name in empty.split("+")}
    spec = spec._replace(**sizes, self_attention=spec.self_attention and empty == "batch")
    case = cell.case(spec, op)
    spec = case.spec
    try:
        got = harness.run(cell, op, case)
    except Exception as exc:  # noqa: BLE001 - any exception is the finding
        raise AssertionError(f"[SHAPE-4] {cell.id} {op} with {empty} = 0 raised "
                             f"{type(exc).__name__}: {exc}") from exc
    width = spec.d_v if op == "sdpa" else spec.d_out
    lead = (spec.batch, spec.heads, spec.len_q) if op == "sdpa" else (spec.batch, spec.len_q)
    assert got.out.shape == (*lead, width), f"[SHAPE-4] {op} output shape {got.out.shape}"
    assert got.out.dtype == _expected_dtype(cell), "[SHAPE-4] output dtype"
    if got.weights is not None:
        want = (spec.batch, spec.heads, spec.len_q, spec.len_k)
        assert got.weights.shape == want, f"[SHAPE-4] weights shape {got.weights.shape}"
    assert np.all(np.isfinite(got.out)), f"[SHAPE-4] {cell.id} {op}: NaN or inf with {empty} = 0"
    harness.expect_oracle(cell, case, got, op=op, clause="SHAPE-4")


@pytest.mark.clause("SHAPE-5")
@covering.cover("SHAPE-5")
@given(spec=case_specs(key_padding=True, causal=True, custom_scale=True),
       which=st.sampled_from(sorted(conditions.DEGENERATE)))
def test_degenerate_sizes_are_ordinary_cases(cell, op, spec, which):
    sizes = conditions.DEGENERATE[which]
    self_attention = spec.self_attention and spec.len_q == spec.len_k and "len_q" not in sizes \
        and "len_k" not in sizes
    spec = spec._replace(**sizes, mask_shape=None, bias_shape=None, legacy_shape=None,
                         self_attention=self_attention)
    if spec.causal == "bottom_right" and spec.len_q > spec.len_k:  # no fully masked rows (MASK-9)
        spec = spec._replace(causal="top_left")
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="SHAPE-5")
