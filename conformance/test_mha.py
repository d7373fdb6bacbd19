"""Chapter MHA: the per-head definition, the batched form, self- and cross-attention, the example."""

import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import covering, extremes, harness
from mhaspec.conformance.strategies import REFERENCE_EXAMPLE, case_specs

pytestmark = pytest.mark.requires("mha")


@pytest.mark.clause("MHA-1")
@covering.cover("MHA-1")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_mha_equals_the_per_head_definition(cell, spec):
    case = cell.case(spec)
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="MHA-1")


@pytest.mark.clause("MHA-2")
@covering.cover("MHA-2")
@given(spec=case_specs(cross=True, masks=True,
                           sizes=lambda z: z.len_q != z.len_k and z.heads > 1))
def test_all_heads_at_once_agrees_with_head_by_head(cell, spec):
    """Different L_q and L_k catch keys and values reshaped with the query length."""
    case = cell.case(spec)
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="MHA-2")


@pytest.mark.clause("MHA-3")
@covering.cover("MHA-3", only=lambda row: row["shared"] == "self")
@given(spec=case_specs(cross=False, masks=True, causal=True))
def test_self_attention_passes_one_array_three_times(cell, spec):
    case = cell.case(spec)
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="MHA-3")


@pytest.mark.clause("MHA-4")
@pytest.mark.requires("cross")
@covering.cover("MHA-4")
@given(spec=case_specs(
    cross=True, sizes=lambda z: len({z.d_model, z.k_dim, z.v_dim}) > 1))
def test_cross_attention_with_other_lengths_and_widths(cell, spec):
    case = cell.case(spec)
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="MHA-4")


@pytest.mark.clause("MHA-5")
def test_the_source_documents_example(cell):
    """(32, 50, 512) self-attention with 8 heads -> output (32, 50, 512), weights (32, 8, 50, 50)."""
    case = cell.case(REFERENCE_EXAMPLE)
    got = cell.mha(case)
    assert got.out.shape == (32, 50, 512), f"[MHA-5] output shape {got.out.shape}"
    if got.weights is not None:
        assert got.weights.shape == (32, 8, 50, 50), f"[MHA-5] weights shape {got.weights.shape}"
    harness.expect_oracle(cell, case, got, op="mha", clause="MHA-5")


@pytest.mark.clause("MHA-3")
@covering.cover("MHA-3", only=lambda row: row["shared"] != "self")
@given(spec=case_specs(cross=True, masks=True), which=st.sampled_from(extremes.SHARED))
def test_two_inputs_that_are_one_array(cell, spec, which):
    """key is value (encoder memory), or query is key with a separate value: an implementation
    that chooses a fused projection by array identity must still project each input with its own
    weights (MHA-3: inputs that are one array are nothing special). Cross-attention widths only
    where the backend claims ``cross``; MHA-4 itself is tested with them above."""
    if which == "key=value":
        spec = spec._replace(v_dim=spec.k_dim)
    else:
        spec = spec._replace(len_k=spec.len_q, k_dim=spec.d_model, mask_shape=None)
    spec = spec._replace(self_attention=False, extreme=extremes.shared(which))
    case = cell.case(spec)
    harness.expect_oracle(cell, case, cell.mha(case), op="mha", clause="MHA-3")
