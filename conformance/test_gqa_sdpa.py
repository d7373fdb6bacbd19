"""Chapter GQA: grouped key/value heads in scaled dot-product attention (optional capability "gqa").

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d_k / d_v widths.

A case with ``kv_heads = g`` keeps the first g heads of its k and v; the oracle evaluates GQA-1's
definition (query head i attends with key/value head i // (h / g)).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("sdpa", "gqa")

#: h = 4 and 6 (beyond the suite's head menu) so that 1 < g < h occurs.
GROUPED = [CaseSpec(batch=2, heads=4, len_q=5, len_k=8, d_k=4, d_v=4, seed=51, kv_heads=2),
           CaseSpec(batch=1, heads=6, len_q=8, len_k=8, d_k=1, d_v=1, seed=52, kv_heads=3,
                    mask_shape=(1, 6, 8, 8)),
           CaseSpec(batch=1, heads=6, len_q=8, len_k=5, d_k=8, d_v=4, seed=53, kv_heads=2,
                    causal="top_left")]


@pytest.mark.clause("GQA-1")
@covering.cover("GQA-1")
@given(spec=feature_specs(require=("gqa",), allow=("softcap", "window", "alibi", "lse"),
                          masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_query_head_i_uses_key_value_head_i_over_group(cell, spec):
    case = cell.case(spec, "sdpa")
    harness.expect_oracle(cell, case, cell.sdpa(case), op="sdpa", clause="GQA-1",
                          context=f" with k, v of {spec.kv_heads} of {spec.heads} heads")


@pytest.mark.clause("GQA-1")
@pytest.mark.parametrize("spec", GROUPED, ids=lambda s: f"h{s.heads}-g{s.kv_heads}")
def test_grouped_heads_fixed_cases(cell, spec):
    """1 < g < h: consecutive query heads share a key/value head (not i % g)."""
    case = cell.case(spec, "sdpa")
    harness.expect_oracle(cell, case, cell.sdpa(case), op="sdpa", clause="GQA-1")


@pytest.mark.clause("GQA-2")
@pytest.mark.requires("errors")
def test_head_counts_that_do_not_group_are_rejected(cell):
    """h = 4: k with 3 heads names k; v with other heads than k names v."""
    for spec in covering.row_specs("GQA-2", GROUPED[0]._replace(kv_heads=None), keep=("heads",)):
        case = cell.case(spec, "sdpa")
        rng = np.random.default_rng(0)
        b, h, l_k, d = case.k.shape
        harness.expect_rejections(cell, "sdpa", case, "GQA-2", [
            ("k with 3 of 4 heads", "k", {"k": rng.standard_normal((b, 3, l_k, d)),
                                          "v": rng.standard_normal((b, 3, l_k, d))}),
            ("k with 2 heads, v with 1", "v", {"k": rng.standard_normal((b, 2, l_k, d)),
                                               "v": rng.standard_normal((b, 1, l_k, d))})])
