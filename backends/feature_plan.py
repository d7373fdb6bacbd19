"""What the spec 1.2 features add to a call of an array backend, computed in NumPy.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k keys attended (L_k without a cache).

The integer data of a call (segment ids, sequence and cache lengths) is known before any array is
touched, so everything it decides is computed here once, as NumPy arrays that a backend moves to
its device: the structural mask (segments, lengths, cache padding, causal on positions, the
window and chunks: SEG-1, SEG-3, CACHE-2, WIN-1, CHUNK-1), the ALiBi bias (ALIBI-1) and the index
that lays out the present cache (CACHE-1). Compiled variants fold them into their canonical mask
and bias before compiling, so they compile once per shape.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import positions
from .feature_checks import Features


class Plan(NamedTuple):
    """The NumPy side of a feature call (:func:`plan`).

    allowed: bool (B, 1, L_q, L_K) structural mask, or None (nothing removed by position);
    causal: the ``causal`` left to the 1.1 masks (None once the structural mask holds it);
    alibi: float64 (B, h, L_q, L_K) ALiBi bias, or None; index: int64 (B, L_K) gather index of the
    present cache into ``concat([past, new, zero])`` along the key axis, or None (no cache, or a
    full cache: the present cache is ``concat([past, new])``).
    """

    allowed: np.ndarray | None
    causal: str | None
    alibi: np.ndarray | None
    index: np.ndarray | None


def plan(features: Features, *, batch: int, len_q: int, len_k: int, causal) -> Plan:
    """The structural mask, ALiBi bias and present-cache index of a validated call with ``len_k``
    new keys and the ``causal`` argument."""
    pos = features.positions
    if pos is None and features.needs_positions:
        pos = positions.token_positions(batch, len_q, len_k, alignment=features.diagonal)
    allowed = None
    if features.structural:
        allowed = positions.structural_allowed(pos, causal=causal is not None,
                                               window=features.window,
                                               chunk=features.chunk)[:, None]
        causal = None
    alibi = None if features.slopes is None else positions.alibi_bias(features.slopes, pos)
    index = None
    if features.cached and np.any(features.past_lengths != features.len_past):
        index = positions.present_index(features.past_lengths, features.len_past, len_k)
    return Plan(allowed, causal, alibi, index)
