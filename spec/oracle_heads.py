"""The oracle's head layouts: HEAD-1 and HEAD-2 written element by element, and the part of a
mask or bias that applies to one head (MHA-1's per-head definition).

Axis legend: B batch, L length, h heads, d per-head width, L_q / L_k query / key lengths.
"""

from __future__ import annotations

import numpy as np


def split_heads(x, num_heads: int):
    """HEAD-1, written element by element: (B, L, h*d) -> (B, h, L, d)."""
    x = np.asarray(x)
    b, length, width = x.shape
    d = width // num_heads
    y = np.empty((b, num_heads, length, d), dtype=x.dtype)
    for i in range(num_heads):
        for j in range(d):
            y[:, i, :, j] = x[:, :, i * d + j]
    return y


def combine_heads(y):
    """HEAD-2: (B, h, L, d) -> (B, L, h*d), the concatenation of the heads along the last axis."""
    y = np.asarray(y)
    return np.concatenate([y[:, i] for i in range(y.shape[1])], axis=-1)


def head_slice(m, i: int):
    """The part of a mask/bias broadcastable to (B, h, L_q, L_k) that applies to head i, keeping a
    size-1 head axis: (..., h or 1, L_q, L_k) -> (B or 1, 1, L_q or 1, L_k or 1)."""
    if m is None:
        return None
    m = np.asarray(m)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    return m[:, i:i + 1] if m.shape[1] > 1 else m
