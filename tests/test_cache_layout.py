"""backends.cache_layout: a library cache that keeps every past entry, moved to and from CACHE-1's
present layout (index None: a full cache, where the layouts coincide)."""

from __future__ import annotations

import numpy as np

from mhaspec.backends.adapters import NumpyAdapter
from mhaspec.backends.cache_layout import LibraryCache, library_index


class Probe(LibraryCache, NumpyAdapter):
    """The mixin on the NumPy adapter base, for its two moves only."""


PROBE = Probe("cache-layout-probe")
# B=1, L_past=3 with 2 valid past entries, L_k=1: present layout [p0, p1, new0, zero] gathered
# from Concat(past, new, zero) = [p0, p1, p2, new0, zero]
INDEX = np.array([[0, 1, 3, 4]])


def test_the_library_index_blocks_the_invalid_past_entry():
    assert library_index(INDEX).tolist() == [[0, 1, 4, 2]]


def test_a_mask_moves_to_the_library_layout_with_the_invalid_entry_blocked():
    mask = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    moved = PROBE.to_library_layout(mask, INDEX, -np.inf)
    assert moved.reshape(-1).tolist() == [1.0, 2.0, -np.inf, 3.0]


def test_weights_and_cache_move_back_to_the_present_layout():
    weights = np.array([0.1, 0.2, 0.3, 0.4]).reshape(1, 1, 1, 4)
    keys = np.arange(4.0).reshape(1, 1, 4, 1)
    back_w, back_k, back_v = PROBE.from_library_layout(weights, keys, keys + 10, INDEX)
    assert back_w.reshape(-1).tolist() == [0.1, 0.2, 0.4, 0.0]
    assert back_k.reshape(-1).tolist() == [0.0, 1.0, 3.0, 0.0]
    assert back_v.reshape(-1).tolist() == [10.0, 11.0, 13.0, 0.0]


def test_a_full_cache_has_no_index_and_moves_nothing():
    mask = np.ones((1, 1, 2, 3), bool)
    weights, keys = np.full((1, 1, 2, 3), 0.5), np.zeros((1, 1, 3, 2))
    assert PROBE.to_library_layout(mask, None, False) is mask
    moved = PROBE.from_library_layout(weights, keys, keys, None)
    assert all(a is b for a, b in zip(moved, (weights, keys, keys)))
    assert PROBE.from_library_layout(None, keys, keys, None)[0] is None
