"""The arithmetic of the oracle's narrow working precisions (spec/oracle.py, ``precision``):
rounding float32 values to bfloat16 and float16, and float32 matrix products whose dot products
are summed left to right (``"float32-sequential"``).

Axis legend: n, m rows and columns of a product, d the summed axis, ``...`` leading batch axes.
"""

from __future__ import annotations

import math

import numpy as np


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), out, x)


def round_to_float16(x) -> np.ndarray:
    """``x`` rounded to float16 (held in float32); beyond float16's range it becomes inf, as
    float16 arithmetic does (so NumPy's overflow warning is expected and silenced)."""
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(np.float16).astype(np.float32)


#: the most elements (d * ... * n * m) :func:`sequential_matmul` holds as one array of products
SMALL_PRODUCT = 1 << 13  # measured: faster than the loop below about 8k elements


def sequential_matmul(a, b, dtype) -> np.ndarray:
    """a (..., n, d) @ b (..., d, m) in ``dtype``, each dot product summed left to right with a
    rounding after every multiply and add, vectorised over every axis but d: step j adds the
    outer product of column j of a and row j of b, laid out with the longer of n and m innermost
    (a rounded product does not depend on the order of its factors)."""
    a, b = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    if b.ndim == 2 and a.ndim > 2:  # one right-hand matrix: stack every row of a
        out = sequential_matmul(a.reshape(-1, a.shape[-1]), b, dtype)
        return out.reshape(a.shape[:-1] + out.shape[-1:])
    a_cols = np.moveaxis(a, -1, 0).copy()  # (d, ..., n)
    b_rows = np.moveaxis(b, -2, 0).copy()  # (d, ..., m)
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, m = a.shape[-2], b.shape[-1]
    if a.ndim == b.ndim and a.shape[-1] * math.prod(lead) * n * m <= SMALL_PRODUCT:
        # every rounded product at once, summed left to right along d (np.add.accumulate is
        # sequential); + 0 makes a zero sum +0, as the loop's sum from +0 is
        terms = np.multiply(a_cols[..., :, None], b_rows[..., None, :])  # (d, ..., n, m)
        if terms.shape[0] == 0:
            return np.zeros(lead + (n, m), dtype=dtype)
        return np.add.accumulate(terms, axis=0)[-1] + dtype(0)
    transposed = n > m  # then accumulate the product's transpose (..., m, n)
    acc = np.zeros(lead + ((m, n) if transposed else (n, m)), dtype=dtype)
    term = np.empty_like(acc)
    for a_j, b_j in zip(a_cols, b_rows):
        if transposed:
            np.multiply(b_j[..., :, None], a_j[..., None, :], out=term)
        else:
            np.multiply(a_j[..., :, None], b_j[..., None, :], out=term)
        acc += term
    return np.ascontiguousarray(np.swapaxes(acc, -1, -2)) if transposed else acc
