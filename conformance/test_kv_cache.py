"""Chapter CACHE: KV cache and incremental decoding (optional capability "kv_cache").

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k, d_k / d_v widths.

Both operations (``op``); for multi-head attention the cache holds projected keys and values.
Caches are empty, shorter and longer than the new keys, with every or only some entries valid
(``past_lengths``); the present cache and its lengths are compared with the oracle's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("kv_cache")


@pytest.mark.clause("CACHE-1")
@covering.cover("CACHE-1")
@given(spec=feature_specs(require=("cache",), allow=("gqa", "softcap", "lse"), masks=True,
                          bias=True, key_padding=True))
def test_past_is_prepended_and_the_present_cache_returned(cell, op, spec):
    case = cell.case(spec, op)
    got = harness.run(cell, op, case)
    assert got.present_key is not None and got.present_value is not None, (
        f"[CACHE-1] {cell.id} {op}: no present cache returned with past_key")
    harness.expect_oracle(cell, case, got, op=op, clause="CACHE-1")


@pytest.mark.clause("CACHE-2")
@pytest.mark.requires("causal")
@covering.cover("CACHE-2")
@given(spec=feature_specs(require=("cache",), allow=("window", "alibi", "softcap"), masks=True,
                          causal=True).map(lambda s: s._replace(causal="bottom_right")))
def test_query_i_sits_at_past_length_plus_i(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="CACHE-2")


def _decode(cell, op: str, case, step: int):
    """Feed ``case``'s L tokens through the cache ``step`` at a time from an empty cache, passing
    each call's present cache as the next call's past; the outputs concatenated on the L axis."""
    s = case.spec
    g = s.kv_heads or s.heads
    past_key = np.zeros((s.batch, g, 0, s.d_k))
    past_value = np.zeros((s.batch, g, 0, s.d_v))
    outputs = []
    axis = 2 if op == "sdpa" else 1
    for start in range(0, s.len_q, step):
        rows = slice(start, min(start + step, s.len_q))
        if op == "sdpa":
            part = case._replace(q=case.q[:, :, rows], k=case.k[:, :, rows], v=case.v[:, :, rows])
        else:
            tokens = case.query[:, rows]
            part = case._replace(query=tokens, key=tokens, value=tokens)
        got = harness.run(cell, op, part, causal="bottom_right", past_key=past_key,
                          past_value=past_value)
        assert got.present_key is not None, f"[CACHE-3] {cell.id} {op}: no present cache returned"
        past_key, past_value = got.present_key, got.present_value
        outputs.append(got.out)
    return np.concatenate(outputs, axis=axis)


@pytest.mark.clause("CACHE-3")
@pytest.mark.requires("causal")
@covering.cover("CACHE-3")
@given(spec=feature_specs(allow=("softcap", "window", "alibi"), cross=False).map(
    lambda s: s._replace(causal="bottom_right", alignment=None, self_attention=True)),
    step=st.sampled_from([1, 2, 3]))
def test_decoding_through_the_cache_equals_one_causal_call(cell, op, spec, step):
    """Token by token (step 1) and t tokens at a time, for attention and for multi-head
    attention with its projections (self-attention: each call's tokens are query, key and
    value)."""
    case = cell.case(spec, op)
    harness.note(op, case.spec, step=str(step))
    got = harness.Result(_decode(cell, op, case, step), None)
    harness.expect_oracle(cell, case, got, op=op, clause="CACHE-3",
                          context=f" decoded {step} token(s) at a time through the cache")


@pytest.mark.clause("CACHE-4")
@pytest.mark.requires("errors")
def test_invalid_caches_are_rejected(cell, op):
    for spec in covering.row_specs("CACHE-4", CaseSpec(batch=2, seed=95),
                                   keep=("batch", "d_k", "d_v")):
        case = cell.case(spec, op)
        b, h, d = spec.batch, spec.heads, spec.d_k
        pk, pv = np.zeros((b, h, 2, d)), np.zeros((b, h, 2, d))
        harness.expect_rejections(cell, op, case, "CACHE-4", [
            ("past_key without past_value", ("past_key", "past_value"), {"past_key": pk}),
            ("past_value without past_key", ("past_key", "past_value"), {"past_value": pv}),
            ("rank-3 past_key", "past_key", {"past_key": np.zeros((b, 2, d)), "past_value": pv}),
            ("batch of past_key differs", "past_key",
             {"past_key": np.zeros((b + 1, h, 2, d)), "past_value": pv}),
            ("heads of past_key differ", "past_key",
             {"past_key": np.zeros((b, h + 1, 2, d)), "past_value": pv}),
            ("width of past_value differs", "past_value",
             {"past_key": pk, "past_value": np.zeros((b, h, 2, d + 1))}),
            ("caches of different lengths", ("past_key", "past_value"),
             {"past_key": pk, "past_value": np.zeros((b, h, 3, d))}),
            ("past_lengths past L_past", "past_lengths",
             {"past_key": pk, "past_value": pv, "past_lengths": np.array([3, 1])}),
            ("negative past_lengths", "past_lengths",
             {"past_key": pk, "past_value": pv, "past_lengths": np.array([-1, 1])}),
            ("past_lengths (B, 1)", "past_lengths",
             {"past_key": pk, "past_value": pv, "past_lengths": np.ones((b, 1), np.int64)}),
            ("float past_lengths", "past_lengths",
             {"past_key": pk, "past_value": pv, "past_lengths": np.ones(b)}),
            ("past_lengths without a cache", "past_lengths", {"past_lengths": np.ones(b, np.int64)})])


@pytest.mark.clause("CACHE-4")
@pytest.mark.requires("errors", "causal")
def test_a_top_left_causal_mask_with_a_cache_is_rejected(cell, op):
    for spec in covering.row_specs("CACHE-4", CaseSpec(seed=96), keep=("d_k", "d_v")):
        case = cell.case(spec, op)
        pk = np.zeros((spec.batch, spec.heads, 2, spec.d_k))
        harness.expect_rejections(cell, op, case, "CACHE-4", [
            ("causal='top_left' with past_key", "causal",
             {"causal": "top_left", "past_key": pk, "past_value": pk})])


@pytest.mark.clause("CACHE-4")
@pytest.mark.requires("errors", "window")
def test_a_top_left_alignment_with_a_cache_is_rejected(cell, op):
    for spec in covering.row_specs("CACHE-4", CaseSpec(seed=97), keep=("d_k", "d_v")):
        case = cell.case(spec, op)
        pk = np.zeros((spec.batch, spec.heads, 2, spec.d_k))
        harness.expect_rejections(cell, op, case, "CACHE-4", [
            ("alignment='top_left' with past_key", "alignment",
             {"window": (1, 0), "alignment": "top_left", "past_key": pk, "past_value": pk})])


@pytest.mark.clause("CACHE-4")
@pytest.mark.requires("errors", "segments")
def test_a_cache_with_segments_or_lengths_is_rejected(cell, op):
    for spec in covering.row_specs("CACHE-4", CaseSpec(seed=98), keep=("d_k", "d_v")):
        case = cell.case(spec, op)
        b, lq = spec.batch, spec.len_q
        pk = np.zeros((b, spec.heads, 2, spec.d_k))
        ids = np.zeros((b, lq), np.int64)
        harness.expect_rejections(cell, op, case, "CACHE-4", [
            ("cache with segment ids", ("past_key", "q_segment_ids", "kv_segment_ids"),
             {"past_key": pk, "past_value": pk, "q_segment_ids": ids, "kv_segment_ids": ids}),
            ("cache with lengths", ("past_key", "query_seq_lengths"),
             {"past_key": pk, "past_value": pk, "query_seq_lengths": np.ones(b, np.int64)})])
