"""backends.positions (the structural masks every backend builds in NumPy) against the oracle's own
definition (spec/oracle_positions.py: token_positions, cache_positions, structural_allowed, alibi_bias)."""

import numpy as np
import pytest

from mhaspec.backends import positions
from mhaspec.spec import oracle


@pytest.mark.parametrize("seed", range(40))
def test_positions_masks_and_alibi_equal_the_oracle(seed):
    rng = np.random.default_rng(seed)
    b, l_q, l_k, h = 2, int(rng.integers(0, 7)), int(rng.integers(0, 7)), 3
    kw = {}
    if rng.random() < 0.6:
        kw["q_segment_ids"] = rng.integers(-1, 3, (b, l_q))
        kw["kv_segment_ids"] = rng.integers(-1, 3, (b, l_k))
    if rng.random() < 0.4:
        kw["query_seq_lengths"] = rng.integers(0, l_q + 1, b)
    if rng.random() < 0.4:
        kw["key_value_seq_lengths"] = rng.integers(0, l_k + 1, b)
    alignment = ["top_left", "bottom_right"][seed % 2]
    causal = bool(rng.random() < 0.5)
    window = None if rng.random() < 0.3 else tuple(
        None if rng.random() < 0.3 else int(rng.integers(0, 4)) for _ in range(2))
    slopes = rng.random((b, h))
    want = oracle.token_positions(b, l_q, l_k, alignment=alignment, **kw)
    got = positions.token_positions(b, l_q, l_k, alignment=alignment, **kw)
    allowed_want = oracle.structural_allowed(want, causal=causal, window=window)
    allowed_got = positions.structural_allowed(got, causal=causal, window=window)
    np.testing.assert_array_equal(allowed_got, allowed_want)
    alibi_want = np.where(allowed_want[:, None], oracle.alibi_bias(slopes, want), 0)
    alibi_got = np.where(allowed_got[:, None], positions.alibi_bias(slopes, got), 0)
    np.testing.assert_array_equal(alibi_got, alibi_want)
    rows, cols = slice(1, 4), slice(2, 6)
    np.testing.assert_array_equal(
        positions.structural_allowed(got, causal=causal, window=window, rows=rows, cols=cols),
        allowed_got[:, rows, cols])


@pytest.mark.parametrize("l_past,l_q,l_k", [(0, 1, 1), (4, 1, 1), (4, 3, 2), (5, 2, 3)])
def test_cache_positions_and_present_layout(l_past, l_q, l_k):
    past_lengths = np.array([l_past, max(l_past - 2, 0)])
    want = oracle.cache_positions(past_lengths, l_past, l_q, l_k)
    got = positions.cache_positions(past_lengths, l_past, l_q, l_k)
    for window in (None, (1, 0), (0, None)):
        np.testing.assert_array_equal(
            positions.structural_allowed(got, causal=True, window=window),
            oracle.structural_allowed(want, causal=True, window=window))
    rng = np.random.default_rng(0)
    past, new = rng.random((2, 1, l_past, 2)), rng.random((2, 1, l_k, 2))
    stacked = np.concatenate([past, new, np.zeros((2, 1, 1, 2))], axis=2)
    idx = positions.present_index(past_lengths, l_past, l_k)
    present = np.take_along_axis(stacked, idx[:, None, :, None], axis=2)
    for bi, p in enumerate(past_lengths):  # CACHE-1: valid past, new keys, zero padding
        want_b = np.concatenate([past[bi, :, :p], new[bi], np.zeros((1, l_past - p, 2))], axis=1)
        np.testing.assert_array_equal(present[bi], want_b)
