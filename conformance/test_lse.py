"""Chapter LSE: the per-row log-sum-exp of the logits (optional capability "lse").

Both operations (``op``) for LSE-1, compared with the oracle under NUM-3 with the scale
max(1, max |lse|) and -inf only equal to -inf (fully masked rows); LSE-2 merges two key blocks of
scaled dot-product attention by their log-sum-exps.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import feature_specs
from mhaspec.spec import oracle

pytestmark = pytest.mark.requires("lse")


@pytest.mark.clause("LSE-1")
@covering.cover("LSE-1")
@given(spec=feature_specs(require=("lse",), allow=("softcap", "window", "alibi", "segments",
                                                   "seq_lengths", "cache"),
                          masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_lse_is_the_log_sum_exp_over_the_allowed_keys(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    assert got.lse is not None, f"[LSE-1] {cell.id} {op}: no lse returned with lse=True"
    harness.expect_oracle(cell, case, got, op=op, clause="LSE-1")


@pytest.mark.clause("LSE-1")
@pytest.mark.requires("masks")
@given(spec=feature_specs(require=("lse",), masks=True, fully_masked=True,
                          logit_scales=(1.0, 100.0)))
def test_lse_of_a_fully_masked_row_is_minus_infinity(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    assert got.lse is not None, f"[LSE-1] {cell.id} {op}: no lse returned with lse=True"
    harness.expect_oracle(cell, case, got, op=op, clause="LSE-1")


@pytest.mark.clause("LSE-2")
@pytest.mark.requires("sdpa")
@covering.cover("LSE-2", cut=0.5)
@given(spec=feature_specs(require=("lse",), allow=("softcap",), key_padding=True,
                            sizes=lambda z: z.len_k > 1), cut=st.floats(0.1, 0.9))
def test_merging_two_key_blocks_by_lse_equals_the_whole(cell, spec, cut):
    """Keys [0, m) and [m, L_k) attended separately (key padding sliced with them), merged by
    LSE-2's formula, against the oracle over all keys."""
    case = cell.case(spec, "sdpa")
    m = min(max(1, round(cut * spec.len_k)), spec.len_k - 1)
    blocks = []
    for cols in (slice(0, m), slice(m, spec.len_k)):
        kpm = case.key_padding_mask
        part = case._replace(k=case.k[:, :, cols], v=case.v[:, :, cols],
                             key_padding_mask=None if kpm is None else kpm[:, cols])
        got = cell.sdpa(part)
        assert got.lse is not None, f"[LSE-2] {cell.id}: no lse returned with lse=True"
        blocks.append(got)
    out, lse = oracle.merge_by_lse(blocks[0].out, blocks[0].lse, blocks[1].out, blocks[1].lse)
    harness.expect_oracle(cell, case, harness.Result(out, None, lse=lse), op="sdpa",
                          clause="LSE-2", context=f" merged from key blocks [0, {m}) and [{m}, "
                                                  f"{spec.len_k})")
