"""Chapter ALIBI: attention with linear biases (optional capability "alibi").

Both operations (``op``). Slopes: the paper's geometric sequence, random per head, all zero and
per (batch item, head); both diagonals, L_q != L_k, within segments and with a cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs
from mhaspec.spec import oracle

pytestmark = pytest.mark.requires("alibi")


@pytest.mark.clause("ALIBI-1")
@covering.cover("ALIBI-1")
@given(spec=feature_specs(require=("alibi",), allow=("softcap", "window", "segments", "cache",
                                                     "lse"),
                          masks=True, key_padding=True, causal=True))
def test_alibi_adds_minus_slope_times_distance(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="ALIBI-1")


def explicit_alibi_bias(case) -> np.ndarray:
    """ALIBI-1's bias (B, h, L_q, L_K) of ``case``'s slopes, from the oracle's positions."""
    s, f = case.spec, case.features
    b, h = s.batch, s.heads
    if f.past_key is not None:
        past = f.past_key.shape[2]
        lengths = np.full(b, past) if f.past_lengths is None else f.past_lengths
        positions = oracle.cache_positions(lengths, past, s.len_q, s.len_k)
    else:
        positions = oracle.token_positions(
            b, s.len_q, s.len_k, alignment=s.causal or s.alignment,
            q_segment_ids=f.q_segment_ids, kv_segment_ids=f.kv_segment_ids,
            query_seq_lengths=f.query_seq_lengths, key_value_seq_lengths=f.key_value_seq_lengths)
    slopes = np.broadcast_to(f.alibi_slopes, (b, h))
    return oracle.alibi_bias(slopes, positions)


@pytest.mark.clause("ALIBI-2")
@covering.cover("ALIBI-2")
@pytest.mark.requires("bias")
@given(spec=feature_specs(require=("alibi",), allow=("segments", "cache"), bias=True,
                          causal=True))
def test_alibi_equals_its_explicit_bias(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    bias = explicit_alibi_bias(case)
    if case.bias is not None:
        bias = bias + case.bias
    explicit = harness.run(cell, op, case, alibi_slopes=None, alignment=None, bias=bias)
    out_tol, w_tol = harness.allowance(case, op, cell)
    harness.expect_close(cell, case, got.out, explicit.out, allowed=2 * out_tol, clause="ALIBI-2",
                         what="output with alibi_slopes vs with its explicit bias", op=op)
    if got.weights is not None and explicit.weights is not None:
        harness.expect_close(cell, case, got.weights, explicit.weights, allowed=2 * w_tol,
                             clause="ALIBI-2", what="weights with alibi_slopes vs explicit bias",
                             op=op)
    harness.expect_oracle(cell, case, got, op=op, clause="ALIBI-2")


@pytest.mark.clause("ALIBI-3")
@pytest.mark.requires("errors")
def test_invalid_slopes_are_rejected(cell, op):
    for spec in covering.row_specs("ALIBI-3", CaseSpec(seed=81, alignment="top_left"),
                                   keep=("batch", "heads")):
        case = cell.case(spec, op)
        h, b = spec.heads, spec.batch
        harness.expect_rejections(cell, op, case, "ALIBI-3", [
            ("h + 1 slopes", "alibi_slopes", {"alibi_slopes": np.ones(h + 1), "alignment": "top_left"}),
            ("slopes (B, h, 1)", "alibi_slopes", {"alibi_slopes": np.ones((b, h, 1)),
                                                  "alignment": "top_left"}),
            ("slopes (h, B) with h != B", "alibi_slopes", {"alibi_slopes": np.ones((h + 1, b)),
                                                           "alignment": "top_left"}),
            ("a NaN slope", "alibi_slopes", {"alibi_slopes": np.array([0.5] * (h - 1) + [np.nan]),
                                             "alignment": "top_left"}),
            ("an infinite slope", "alibi_slopes", {"alibi_slopes": np.full(h, np.inf),
                                                   "alignment": "top_left"}),
            ("boolean slopes", "alibi_slopes", {"alibi_slopes": np.ones(h, bool),
                                                "alignment": "top_left"})])
