"""Chapter SINK, spec 1.3: attention sinks (optional capability "sink").

Axis legend: B batch, h query heads, L_q / L_k lengths.

The sinks (h,) come from the case's seed times a drawn scale (:func:`vjp.sinks_of`): 0, the size
of the logits, and sinks that dominate every row or vanish next to it. Output, weights and lse are
judged against ``oracle_vjp.attention_with_sinks`` (SINK-1, SINK-2), the gradient against
``oracle_vjp.attention_vjp`` (SINK-3). Every clause runs in every dtype the backend claims;
SINK-3 follows GRAD-1's rule (GRAD-10's in float16 and bfloat16).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import covering, harness, vjp
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("sdpa", "sink")

SINK_SCALE_MENU = (0.0, 1.0, -8.0, 8.0)
SINK_SCALES = st.sampled_from(SINK_SCALE_MENU)


@pytest.mark.clause("SINK-1")
@covering.cover("SINK-1", sink_scale=1.0)
@given(spec=feature_specs(require=("lse",), allow=("softcap", "window", "alibi", "gqa", "cache"),
                          masks=True, bias=True, key_padding=True, causal=True, custom_scale=True),
       sink_scale=SINK_SCALES)
def test_a_sink_joins_every_denominator(cell, spec, sink_scale):
    case = cell.case(spec, "sdpa")
    sinks = {"sinks": vjp.sinks_of(case, sink_scale)}
    harness.expect_oracle(cell, case, harness.run(cell, "sdpa", case, **sinks), op="sdpa",
                          clause="SINK-1", overrides=sinks)


@pytest.mark.clause("SINK-2")
@pytest.mark.requires("masks")
@covering.cover("SINK-2")
@given(spec=covering.specs("SINK-2"))
def test_a_row_with_no_allowed_key_gives_zeros_and_the_sink_as_lse(cell, spec):
    """Each row of MASK-9's ways, with lse asked for; the sink scale cycles with the seed."""
    case = cell.case(spec._replace(lse=True), "sdpa")
    sinks = {"sinks": vjp.sinks_of(case, SINK_SCALE_MENU[spec.seed % len(SINK_SCALE_MENU)])}
    harness.expect_oracle(cell, case, harness.run(cell, "sdpa", case, **sinks), op="sdpa",
                          clause="SINK-2", overrides=sinks)


@pytest.mark.clause("SINK-3")
@pytest.mark.requires("attention_vjp")
@covering.cover("SINK-3", sink_scale=1.0)
@given(spec=feature_specs(allow=("softcap", "gqa", "window"), masks=True, fully_masked=True,
                          causal=True), sink_scale=SINK_SCALES)
def test_the_gradient_with_respect_to_the_sinks(cell, spec, sink_scale):
    case = cell.case(spec, "sdpa")
    vjp.expect_gradients(cell, case, "SINK-3", sinks=vjp.sinks_of(case, sink_scale))


@pytest.mark.clause("SINK-3")
@pytest.mark.requires("attention_vjp", "lse")
@given(spec=feature_specs(masks=True, fully_masked=True), sink_scale=SINK_SCALES)
def test_the_sink_gradient_with_an_lse_cotangent(cell, spec, sink_scale):
    case = cell.case(spec, "sdpa")
    vjp.expect_gradients(cell, case, "SINK-3", d_lse=True, sinks=vjp.sinks_of(case, sink_scale))


@pytest.mark.clause("SINK-4")
@pytest.mark.requires("errors")
def test_invalid_sinks_are_rejected(cell):
    for spec in covering.row_specs("SINK-4", CaseSpec(seed=71)):
        case = cell.case(spec, "sdpa")
        h = case.q.shape[1]
        harness.expect_rejections(cell, "sdpa", case, "SINK-4", [
            ("sinks of shape (h + 1,)", "sinks", {"sinks": np.zeros(h + 1)}),
            ("sinks of shape (1, h)", "sinks", {"sinks": np.zeros((1, h))}),
            ("a NaN sink", "sinks", {"sinks": np.full(h, np.nan)}),
            ("an infinite sink", "sinks", {"sinks": np.full(h, np.inf)})])
