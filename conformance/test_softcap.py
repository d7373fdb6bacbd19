"""Chapter SOFTCAP: soft-capping of the logits (optional capability "softcap").

Both operations (``op``). Soft caps range from tiny (every logit squeezed into (-c, c): masks
then decide almost alone) to huge (no visible capping); boolean masks and fully masked rows are
drawn so that capping after the masks (a masked -inf becoming -c) leaks weight and fails.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("softcap")


@pytest.mark.clause("SOFTCAP-1")
@covering.cover("SOFTCAP-1")
@given(spec=feature_specs(require=("softcap",), allow=("window", "alibi", "lse"), masks=True,
                          bias=True, key_padding=True, causal=True, custom_scale=True,
                          logit_scales=(1.0, 10.0, 100.0)))
# always run: a cap beyond float16's range (65504), which must not overflow in float16
@example(spec=CaseSpec(softcap=1e6, seed=62))
def test_softcap_after_the_scale_and_before_bias_and_masks(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SOFTCAP-1")


@pytest.mark.clause("SOFTCAP-1")
@pytest.mark.requires("masks")
@given(spec=feature_specs(require=("softcap",), masks=True, fully_masked=True))
@example(spec=CaseSpec(mask_shape=(2, 1, 3, 3), fully_masked_rows=True, softcap=1e6, seed=63))
def test_masked_keys_get_no_weight_under_a_softcap(cell, op, spec):
    """Fully masked rows stay 0 and masked keys get weight 0 (capping after masking gives them
    e^-c / sum)."""
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SOFTCAP-1")


@pytest.mark.clause("SOFTCAP-2")
@pytest.mark.requires("errors")
def test_invalid_softcap_is_rejected(cell, op):
    for spec in covering.row_specs("SOFTCAP-2", CaseSpec(seed=61)):
        case = cell.case(spec, op)
        harness.expect_rejections(cell, op, case, "SOFTCAP-2", [
            (f"softcap={value!r}", "softcap", {"softcap": value})
            for value in (0.0, -1.0, float("inf"), float("nan"), True, "1")])
