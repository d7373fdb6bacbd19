"""Chapter NUM: dtypes, no silent loss of precision, the tolerance rule, large logits."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import harness
from mhaspec.conformance.strategies import case_specs



@pytest.mark.clause("NUM-1")
@given(spec=case_specs())
def test_results_keep_the_input_dtype(impl, op, spec):
    case = impl.case(spec, op)
    want = np.dtype("float32") if impl.dtype == "bfloat16" else np.dtype(impl.dtype)
    got = impl.sdpa(case) if op == "sdpa" else impl.mha(case)
    assert got.out.dtype == want, f"[NUM-1] {impl.id} {op}: output dtype {got.out.dtype}"


@pytest.mark.clause("NUM-2")
@pytest.mark.requires("sdpa")
@pytest.mark.dtypes("float32")
@given(spec=case_specs(logit_scales=(10.0, 100.0)).map(lambda s: s._replace(
    len_k=32, d_k=64, d_v=64, d_model=s.heads * 64, k_dim=s.heads * 64, v_dim=s.heads * 64)))
def test_float32_is_computed_in_float32(impl, spec):
    """Long dot products and large logits: float16, bfloat16 or TF32 arithmetic falls far outside."""
    flags = impl.backend.precision_flags(impl.device)
    tf32 = {k: v for k, v in flags.items() if "tf32" in k.lower() or "tensor_float_32" in k}
    assert not any(tf32.values()), f"[NUM-2] {impl.id}: TF32 is enabled: {tf32}"
    case = impl.case(spec, "sdpa")
    harness.expect_oracle(impl, case, impl.sdpa(case), op="sdpa", clause="NUM-2")


@pytest.mark.clause("NUM-3")
@pytest.mark.requires("sdpa")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, causal=True, custom_scale=True,
                       legacy=True))
def test_results_are_within_the_tolerance_rule(impl, spec):
    case = impl.case(spec, "sdpa")
    harness.expect_oracle(impl, case, impl.sdpa(case), op="sdpa", clause="NUM-3")


@pytest.mark.clause("NUM-4")
@pytest.mark.requires("sdpa")
@pytest.mark.dtypes("float64", "float32", "bfloat16")
@given(spec=case_specs(masks=True), magnitude=st.sampled_from([1e3, 1e4]))
def test_large_logits_stay_finite_and_accurate(impl, spec, magnitude):
    case = impl.case(spec._replace(logit_scale=magnitude), "sdpa")
    got = impl.sdpa(case)
    assert np.all(np.isfinite(got.out)), f"[NUM-4] {impl.id}: non-finite output for logits ~{magnitude:g}"
    harness.expect_oracle(impl, case, got, op="sdpa", clause="NUM-4")
