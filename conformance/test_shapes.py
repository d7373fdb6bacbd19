"""Chapter SHAPE: output shapes and dtypes of both operations."""

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance.strategies import case_specs


def _expected_dtype(impl):
    return np.dtype("float32") if impl.dtype == "bfloat16" else np.dtype(impl.dtype)


@pytest.mark.clause("SHAPE-1")
@pytest.mark.requires("mha")
@given(spec=case_specs())
def test_mha_output_is_b_lq_dout_in_the_input_dtype(impl, spec):
    case = impl.case(spec)
    spec = case.spec
    got = impl.mha(case)
    assert got.out.shape == (spec.batch, spec.len_q, spec.d_out), "[SHAPE-1] output shape"
    assert got.out.dtype == _expected_dtype(impl), "[SHAPE-1] output dtype differs from the input's"


@pytest.mark.clause("SHAPE-2")
@pytest.mark.requires("weights")
@given(spec=case_specs())
def test_weights_are_per_head_b_h_lq_lk(impl, op, spec):
    case = impl.case(spec, op)
    spec = case.spec
    got = impl.sdpa(case) if op == "sdpa" else impl.mha(case)
    assert got.weights is not None, "[SHAPE-2] backend claims 'weights' but returned None"
    assert got.weights.shape == (spec.batch, spec.heads, spec.len_q, spec.len_k), "[SHAPE-2] shape"
    assert got.weights.dtype == _expected_dtype(impl), "[SHAPE-2] weights dtype"


@pytest.mark.clause("SHAPE-3")
@pytest.mark.requires("sdpa")
@given(spec=case_specs())
def test_sdpa_output_is_b_h_lq_dv(impl, spec):
    case = impl.case(spec, "sdpa")
    spec = case.spec
    got = impl.sdpa(case)
    assert got.out.shape == (spec.batch, spec.heads, spec.len_q, spec.d_v), "[SHAPE-3] output shape"
    assert got.out.dtype == _expected_dtype(impl), "[SHAPE-3] output dtype"
