"""Attention sinks (SINK-1, spec 1.3) as one more key, over a framework's operations (``ops``).

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_K keys attended.

A sink sigma_h joins the softmax denominator of every row of head h and carries no value. It is
exactly one extra key whose logit is sigma_h and whose value is 0: key and value rows of zeros (so
``s q . 0 = 0``, and ``c tanh(0 / c) = 0``: the sink is neither scaled nor capped), always allowed,
with sigma_h added as an additive term at that column only (no bias, legacy mask or ALiBi there).
The output, the log-sum-exp (which then includes the sink) and, by autodiff, every gradient
follow; an empty row gives output 0, weights 0 and lse sigma_h (SINK-2). The weights' sink
column is dropped afterwards (:func:`without_sink_column`).
"""

from __future__ import annotations

import numpy as np


def with_sink_key(ops, q, k, v, masks, sinks):
    """(k, v, masks) with the sink key appended: k (B, g, L_K + 1, d_k), v (B, g, L_K + 1, d_v),
    every mask and additive term one column wider. ``masks`` is a ``MaskArgs`` whose boolean
    conditions are all in ``mask`` (as :meth:`ArrayBackend.fold_features` leaves them);
    ``sinks`` (h,) is float64 NumPy or a backend array (differentiated by autodiff)."""
    b, g, len_k, d_k = ops.shape(k)
    heads = ops.shape(q)[1]
    k = ops.concat([k, ops.full((b, g, 1, d_k), 0.0, k)], axis=2)
    v = ops.concat([v, ops.full((b, g, 1, ops.shape(v)[3]), 0.0, v)], axis=2)
    if isinstance(sinks, np.ndarray):
        sinks = ops.constant_as(sinks, q)
    sink_term = ops.concat([ops.full((1, heads, 1, len_k), 0.0, q),
                                 ops.reshape(sinks, (1, heads, 1, 1))], axis=-1)
    alibi = sink_term if masks.alibi is None else ops.iadd(
        _pad(ops, masks.alibi, len_k, 0.0, q), sink_term)
    return k, v, masks._replace(
        mask=None if masks.mask is None else _pad(ops, masks.mask, len_k, True, q),
        bias=None if masks.bias is None else _pad(ops, masks.bias, len_k, 0.0, q),
        legacy_mask=None if masks.legacy_mask is None else _pad(ops, masks.legacy_mask, len_k,
                                                                0.0, q),
        alibi=alibi)


def without_sink_column(weights):
    """weights (B, h, L_q, L_K + 1) -> (B, h, L_q, L_K); None stays None."""
    return None if weights is None else weights[..., :-1]


def _pad(ops, x, len_k: int, fill, like):
    """x broadcastable to (..., L_K) -> (..., L_K + 1): the key axis made whole, then one column
    of ``fill`` (True for a boolean mask: the sink is always allowed; 0 for an additive term)."""
    shape = ops.shape(x)
    if fill is True:
        whole = x & ops.constant(np.ones(len_k, dtype=bool), like)
        column = ops.constant(np.ones((*shape[:-1], 1), dtype=bool), like)
    else:
        whole = x + ops.full((len_k,), 0.0, x)
        column = ops.full((*shape[:-1], 1), fill, x)
    return ops.concat([whole, column], axis=-1)
