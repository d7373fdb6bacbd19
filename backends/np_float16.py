"""NumPy's float16 matrix product, bit for bit, at the speed of vectorised float32 arithmetic.

NumPy has no BLAS for float16: ``np.matmul`` on float16 runs a scalar loop that forms every
product in float32 (exact: a float16 has 11 significant bits, a product at most 22 of float32's
24), adds the products of one dot product left to right in float32, and rounds the sum once to
float16. :func:`matmul` does the same arithmetic one step of the dot products at a time across a
tile of the result small enough to stay in cache, which is many times faster for attention's
shapes.
"""

from __future__ import annotations

import numpy as np

#: Elements of one tile of the result (256 KiB of float32 sums, as much again for the products).
TILE_ELEMENTS = 1 << 16


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (..., n, d) @ b (..., d, m) for float16 a and b -> float16 (..., n, m), equal bit for bit
    to ``np.matmul(a, b)`` (tests/test_np_float16.py checks it on random shapes and values)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float16 or b.dtype != np.float16 or a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: a {a.shape} and b {b.shape} have different inner widths")
    n, d, m = a.shape[-2], a.shape[-1], b.shape[-1]
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if b.ndim == 2:  # one right-hand matrix: the rows of a, stacked, are the rows of the result
        rows = np.broadcast_to(a, lead + (n, d)).reshape(1, int(np.prod(lead, dtype=np.int64)) * n, d)
        return _tiled(rows, b[None], tile_axis=1).reshape(lead + (n, m))
    count = int(np.prod(lead, dtype=np.int64))
    left = np.broadcast_to(a, lead + (n, d)).reshape(count, n, d)
    right = np.broadcast_to(b, lead + (d, m)).reshape(count, d, m)
    return _tiled(left, right, tile_axis=0).reshape(lead + (n, m))


def _tiled(a: np.ndarray, b: np.ndarray, tile_axis: int) -> np.ndarray:
    """a (P, n, d) @ b (P or 1, d, m) -> float16 (P, n, m), in tiles along ``tile_axis`` (0: the
    P products, 1: the n rows); in each tile step j adds column j of a times row j of b."""
    p, n, d = a.shape
    m = b.shape[-1]
    out = np.empty((p, n, m), dtype=np.float16)
    per_item = m if tile_axis == 1 else n * m
    step = max(1, TILE_ELEMENTS // max(1, per_item))
    b_rows = np.moveaxis(b, -2, 0).astype(np.float32)  # (d, P or 1, m)
    for start in range(0, a.shape[tile_axis], step):
        cut = (slice(None),) * tile_axis + (slice(start, start + step),)
        a_cols = np.moveaxis(a[cut], -1, 0).astype(np.float32)  # (d, p', n')
        rows = b_rows if tile_axis == 1 else b_rows[:, start:start + step]
        total = np.zeros(a_cols.shape[1:] + (m,), dtype=np.float32)
        product = np.empty_like(total)
        for a_j, b_j in zip(a_cols, rows):
            np.multiply(a_j[..., :, None], b_j[..., None, :], out=product)
            total += product
        out[cut] = total
    return out
