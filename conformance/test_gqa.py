"""Clause MHA-6: grouped-query and multi-query attention (optional capability "gqa").

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads (``num_kv_heads``).

A case of the suite is turned into a grouped one by keeping the first ``g`` key/value column blocks
of ``W_k``, ``W_v`` (and ``b_k``, ``b_v``); the oracle evaluates the clause's definition (query head
``i`` uses key/value head ``i // (h / g)``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, case_specs
from mhaspec.spec import oracle

pytestmark = pytest.mark.requires("mha", "gqa")

#: h = 4 and 6 (beyond the suite's head menu) so that 1 < g < h occurs.
GROUPED = [CaseSpec(batch=2, heads=4, len_q=5, len_k=8, d_k=4, d_v=4, d_model=16, k_dim=16,
                    v_dim=16, d_out=16, self_attention=False, seed=41),
           CaseSpec(batch=1, heads=6, len_q=8, len_k=8, d_k=1, d_v=1, d_model=6, k_dim=6, v_dim=6,
                    d_out=6, self_attention=True, mask_shape=(1, 6, 8, 8), seed=42)]


def grouped_params(params: oracle.Params, h: int, g: int) -> oracle.Params:
    """The first g key/value head blocks of ``params`` (h heads)."""
    d_k, d_v = params.w_k.shape[1] // h, params.w_v.shape[1] // h
    return params._replace(
        w_k=params.w_k[:, :g * d_k], w_v=params.w_v[:, :g * d_v],
        b_k=None if params.b_k is None else params.b_k[:g * d_k],
        b_v=None if params.b_v is None else params.b_v[:g * d_v],
        w_o=params.w_o[:h * d_v])


def expect_grouped_oracle(cell, case, g: int) -> None:
    """Run ``case`` with its first ``g`` key/value heads and judge it against the oracle."""
    grouped = case._replace(params=grouped_params(case.params, case.spec.heads, g))
    got = harness.run(cell, "mha", grouped, num_kv_heads=g)
    harness.expect_oracle(cell, grouped, got, op="mha", clause="MHA-6",
                          overrides={"num_kv_heads": g}, context=f" with num_kv_heads = {g}")


@st.composite
def grouped_specs(draw):
    spec = draw(st.one_of(case_specs(masks=True, bias=True, key_padding=True, causal=True,
                                     custom_scale=True), st.sampled_from(GROUPED)))
    divisors = [g for g in range(1, spec.heads + 1) if spec.heads % g == 0]
    return spec, draw(st.sampled_from(divisors))


@pytest.mark.clause("MHA-6")
@given(spec_g=grouped_specs())
def test_grouped_query_attention_uses_key_value_head_i_over_group(cell, spec_g):
    spec, g = spec_g
    expect_grouped_oracle(cell, cell.case(spec), g)


@pytest.mark.clause("MHA-6")
@pytest.mark.parametrize("g", [1, 2])
def test_grouped_query_attention_fixed_cases(cell, g):
    """Multi-query (g = 1) and g = 2 on h = 4 and h = 6, and on the sizes of every ordering of
    L_q and L_k (MHA-6's covering rows) where g divides h."""
    for spec in [*GROUPED, *covering.row_specs("MHA-6", GROUPED[0])]:
        if spec.heads % g == 0:
            expect_grouped_oracle(cell, cell.case(spec), g)


@pytest.mark.clause("MHA-6", "ERR-1")
@pytest.mark.requires("errors")
@pytest.mark.parametrize("g", [0, 3, 2.0, True])
def test_num_kv_heads_must_divide_num_heads(cell, g):
    """h = 4: 0, 3 (no divisor), 2.0 and True (not integers) raise ValueError naming it."""
    case = cell.case(GROUPED[0])
    with pytest.raises(ValueError, match="num_kv_heads"):
        harness.run(cell, "mha", case, num_kv_heads=g)
