"""NumPy's float16 matrix product, bit for bit, at the speed of vectorised float32 arithmetic.

NumPy has no BLAS for float16: ``np.matmul`` on float16 runs a scalar loop that forms every
product in float32 (exact: a float16 has 11 significant bits, a product at most 22 of float32's
24), adds the products of one dot product left to right in float32, and rounds the sum once to
float16. :func:`matmul` does the same arithmetic, one step of the dot products at a time across
the whole result, which is many times faster for the shapes of attention.
"""

from __future__ import annotations

import numpy as np


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (..., n, d) @ b (..., d, m) for float16 a and b -> float16 (..., n, m), equal bit for bit
    to ``np.matmul(a, b)`` (tests/test_np_float16.py checks it on random shapes and values)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float16 or b.dtype != np.float16 or a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: a {a.shape} and b {b.shape} have different inner widths")
    if b.ndim == 2 and a.ndim > 2:  # one right-hand matrix: every row of a is a row of the result
        out = matmul(a.reshape(-1, a.shape[-1]), b)
        return out.reshape(a.shape[:-1] + out.shape[-1:])
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, m = a.shape[-2], b.shape[-1]
    a_cols = np.moveaxis(a, -1, 0).astype(np.float32)  # (d, ..., n)
    b_rows = np.moveaxis(b, -2, 0).astype(np.float32)  # (d, ..., m)
    # the longer of n and m innermost: the sums are accumulated as (..., m, n) when n > m
    wide = n > m
    total = np.zeros(lead + ((m, n) if wide else (n, m)), dtype=np.float32)
    product = np.empty_like(total)
    for a_j, b_j in zip(a_cols, b_rows):
        left, right = (b_j, a_j) if wide else (a_j, b_j)
        np.multiply(left[..., :, None], right[..., None, :], out=product)
        total += product
    if wide:
        total = np.swapaxes(total, -1, -2)
    return total.astype(np.float16)
