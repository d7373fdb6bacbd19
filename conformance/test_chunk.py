"""Chapter CHUNK: chunked local attention (optional capability "chunk", spec 1.4).

Both operations (``op``). Chunk sizes 1, 2, 3 and wider than L_K, on either diagonal (``causal``
or ``alignment``), with and without a causal mask, on the array's positions and within packed
segments (the covering rows), with every mask, windows, ALiBi and an lse (the drawn cases), and
with a KV cache (its own cases: CACHE-2's positions).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = pytest.mark.requires("chunk")

#: CHUNK-1's own example: bottom-right, causal, L_q = 2, L_k = 6, C = 4: query 0 sits at
#: position 4 and sees key 4 only; query 1 sees keys 4 and 5.
EXAMPLE = CaseSpec(batch=1, heads=1, len_q=2, len_k=6, d_k=4, d_v=4, seed=81, chunk=4,
                   causal="bottom_right")


@pytest.mark.clause("CHUNK-1")
@covering.cover("CHUNK-1")
@given(spec=feature_specs(require=("chunk",), allow=("window", "softcap", "alibi", "segments",
                                                     "cache", "lse"),
                          masks=True, bias=True, key_padding=True, causal=True))
def test_a_query_attends_to_the_keys_of_its_own_chunk(cell, op, spec):
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="CHUNK-1")


@pytest.mark.clause("CHUNK-1")
@pytest.mark.parametrize("chunk, causal, alignment", [
    (4, "bottom_right", None), (4, None, "bottom_right"), (3, "top_left", None),
    (1, None, "top_left")])
def test_the_clauses_example_and_its_neighbours(cell, op, chunk, causal, alignment):
    """L_q = 2, L_k = 6: bottom-right, causal and C = 4 leave query 0 key 4 alone."""
    case = cell.case(EXAMPLE._replace(chunk=chunk, causal=causal, alignment=alignment), op)
    got = harness.run(cell, op, case)
    harness.expect_oracle(cell, case, got, op=op, clause="CHUNK-1")
    if got.weights is not None and (chunk, causal) == (4, "bottom_right"):
        seen = [np.flatnonzero(harness.attended(cell, got.weights[0, 0, i])).tolist()
                for i in range(2)]
        assert seen == [[4], [4, 5]], f"[CHUNK-1] {cell.id} {op}: queries attend keys {seen}"


@pytest.mark.clause("CHUNK-1")
@pytest.mark.requires("kv_cache")
@pytest.mark.parametrize("chunk", [2, 3])
@pytest.mark.parametrize("past_valid", [False, True])
def test_chunks_count_cache_positions(cell, op, chunk, past_valid):
    """With a cache, query i sits at past_lengths[b] + i (CACHE-2) and its chunk is counted from
    position 0 of the cache, whatever the cache's padding."""
    spec = CaseSpec(batch=2, heads=2, len_q=3, len_k=2, d_k=4, d_v=4, seed=82 + chunk,
                    chunk=chunk, causal="bottom_right", past_len=5, past_valid=past_valid)
    case = cell.case(spec, op)
    harness.expect_oracle(cell, case, harness.run(cell, op, case), op=op, clause="CHUNK-1")


@pytest.mark.clause("CHUNK-2")
@pytest.mark.requires("errors")
def test_invalid_chunk_or_missing_diagonal_is_rejected(cell, op):
    for spec in covering.row_specs("CHUNK-2", CaseSpec(seed=83)):
        case = cell.case(spec, op)
        harness.expect_rejections(cell, op, case, "CHUNK-2", [
            ("chunk without causal, alignment or cache", "alignment", {"chunk": 2}),
            ("zero", "chunk", {"chunk": 0, "alignment": "top_left"}),
            ("negative", "chunk", {"chunk": -2, "alignment": "top_left"}),
            ("non-integer", "chunk", {"chunk": 1.5, "alignment": "top_left"}),
            ("integral float", "chunk", {"chunk": 2.0, "alignment": "top_left"}),
            ("boolean", "chunk", {"chunk": True, "alignment": "top_left"}),
            ("a sequence", "chunk", {"chunk": (2,), "alignment": "top_left"}),
            ("a string", "chunk", {"chunk": "2", "alignment": "top_left"})])


@pytest.mark.clause("CHUNK-2")
@pytest.mark.requires("errors", "causal")
def test_alignment_contradicting_causal_is_rejected(cell, op):
    for spec in covering.row_specs("CHUNK-2", CaseSpec(seed=84)):
        case = cell.case(spec, op)
        harness.expect_rejections(cell, op, case, "CHUNK-2", [
            ("alignment differs from causal", "alignment",
             {"chunk": 2, "causal": "top_left", "alignment": "bottom_right"})])
