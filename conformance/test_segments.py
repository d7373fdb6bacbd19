"""Chapter SEG: packed variable-length sequences (optional capability "segments").

Both operations (``op``) for SEG-1..3 and SEG-5; SEG-4 compares a packed call of scaled dot-product
attention with the separate calls on each sequence. Segment ids: one segment, a segment per token,
contiguous packing and arbitrary scattered ids; lengths from 0 to L.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("segments")


@pytest.mark.clause("SEG-1")
@covering.cover("SEG-1")
@given(spec=feature_specs(require=("segments",), allow=("softcap", "lse"), masks=True, bias=True,
                          key_padding=True))
def test_queries_attend_only_keys_of_their_segment(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SEG-1")


@pytest.mark.clause("SEG-2")
@covering.cover("SEG-2")
@given(spec=feature_specs(require=("seq_lengths",), allow=("segments", "lse"), masks=True,
                          key_padding=True))
def test_sequence_lengths_pad_queries_and_keys(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SEG-2")


@pytest.mark.clause("SEG-3")
@pytest.mark.requires("causal")
@covering.cover("SEG-3")
@given(spec=feature_specs(require=("segments",), allow=("seq_lengths", "window", "alibi"),
                          causal=True).map(lambda s: s._replace(causal=s.causal or s.alignment or "top_left")))
def test_causal_window_and_alibi_count_positions_within_a_segment(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SEG-3")


@pytest.mark.clause("SEG-3")
@pytest.mark.requires("window")
@given(spec=feature_specs(require=("seq_lengths", "window"), allow=("alibi",)).map(
    lambda s: s._replace(alignment="bottom_right")))
def test_bottom_right_aligns_with_the_last_valid_key(cell, op, spec):
    """Windows on the bottom-right diagonal with key_value_seq_lengths: ONNX's nonpad_kv_seqlen."""
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="SEG-3")


def _sequences(case):
    """(batch item, query rows, key columns) of every sequence packed in ``case`` with queries."""
    q_ids, k_ids = case.features.q_segment_ids, case.features.kv_segment_ids
    for b in range(q_ids.shape[0]):
        for s in np.unique(q_ids[b]):
            yield b, np.flatnonzero(q_ids[b] == s), np.flatnonzero(k_ids[b] == s)


@pytest.mark.clause("SEG-4")
@pytest.mark.requires("sdpa")
@covering.cover("SEG-4")
@given(spec=feature_specs(require=("segments",), allow=("softcap", "window", "alibi"),
                          causal=True, cross=False).map(
    lambda s: s._replace(segments="packed") if s.segments == "scattered" else s))
def test_a_packed_call_equals_the_separate_calls(cell, spec):
    case = cell.case(spec, "sdpa")
    packed = cell.sdpa(case)
    out_tol, w_tol = harness.allowance(case, "sdpa", cell)
    slopes = case.features.alibi_slopes
    for b, rows, cols in _sequences(case):
        if cols.size == 0:
            continue
        alone = case._replace(q=case.q[b:b + 1, :, rows], k=case.k[b:b + 1, :, cols],
                              v=case.v[b:b + 1, :, cols])
        extra = {"q_segment_ids": None, "kv_segment_ids": None}
        if slopes is not None and slopes.ndim == 2:
            extra["alibi_slopes"] = slopes[b:b + 1]
        got = harness.run(cell, "sdpa", alone, **extra)
        what = f"batch item {b}, sequence of queries {rows.tolist()}: packed vs alone"
        harness.expect_close(cell, case, packed.out[b:b + 1, :, rows], got.out, allowed=2 * out_tol,
                             clause="SEG-4", what=f"output of {what}", op="sdpa")
        if packed.weights is not None and got.weights is not None:
            inside = packed.weights[b:b + 1][:, :, rows][:, :, :, cols]
            harness.expect_close(cell, case, inside, got.weights, allowed=2 * w_tol,
                                 clause="SEG-4", what=f"weights of {what}", op="sdpa")
            outside = np.delete(packed.weights[b:b + 1][:, :, rows], cols, axis=-1)
            harness.expect_blocked_weights_zero(
                cell, outside, "SEG-4", f"outside the sequence, {what}")


@pytest.mark.clause("SEG-5")
@pytest.mark.requires("errors")
def test_invalid_segment_ids_and_lengths_are_rejected(cell, op):
    for spec in covering.row_specs("SEG-5", CaseSpec(batch=2, seed=91), keep=("batch",)):
        case = cell.case(spec, op)
        b, lq, lk = spec.batch, spec.len_q, spec.len_k
        q_ids, k_ids = np.zeros((b, lq), np.int64), np.zeros((b, lk), np.int64)
        harness.expect_rejections(cell, op, case, "SEG-5", [
            ("float q_segment_ids", "q_segment_ids", {"q_segment_ids": np.zeros((b, lq)),
                                                      "kv_segment_ids": k_ids}),
            ("kv_segment_ids (B, L_k + 1)", "kv_segment_ids",
             {"q_segment_ids": q_ids, "kv_segment_ids": np.zeros((b, lk + 1), np.int64)}),
            ("q_segment_ids of another length than L_q", "q_segment_ids",
             {"q_segment_ids": np.zeros((b, lk if lk != lq else lq + 1), np.int64),
              "kv_segment_ids": k_ids}),
            ("q_segment_ids alone", ("q_segment_ids", "kv_segment_ids"), {"q_segment_ids": q_ids}),
            ("kv_segment_ids alone", ("q_segment_ids", "kv_segment_ids"), {"kv_segment_ids": k_ids}),
            ("query_seq_lengths (B, 1)", "query_seq_lengths",
             {"query_seq_lengths": np.ones((b, 1), np.int64)}),
            ("float query_seq_lengths", "query_seq_lengths", {"query_seq_lengths": np.ones(b)}),
            ("negative key_value_seq_lengths", "key_value_seq_lengths",
             {"key_value_seq_lengths": np.array([-1, 1])}),
            ("key_value_seq_lengths past L_k", "key_value_seq_lengths",
             {"key_value_seq_lengths": np.array([lk + 1, 1])}),
            ("query_seq_lengths past L_q", "query_seq_lengths",
             {"query_seq_lengths": np.array([1, lq + 1])})])
