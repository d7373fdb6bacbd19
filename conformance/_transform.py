"""Input transformations for the property clauses: permute keys or queries, take a sub-batch.

Masks and bias broadcast to (B, h, L_q, L_k) with any rank <= 4: the key axis is -1, the query axis
-2 and the batch axis -4 (when present). A size-1 axis is left alone: it broadcasts.
"""

from __future__ import annotations

import numpy as np

from .strategies import Case


def _take(x, index, axis: int):
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return np.take(x, index, axis=axis)


def permute_keys(case: Case, perm: np.ndarray) -> Case:
    """Permute keys and values jointly (and the key axis of every mask) by ``perm``."""
    kpm = None if case.key_padding_mask is None else case.key_padding_mask[:, perm]
    return case._replace(
        k=case.k[:, :, perm], v=case.v[:, :, perm], key=case.key[:, perm], value=case.value[:, perm],
        mask=_take(case.mask, perm, -1), bias=_take(case.bias, perm, -1),
        legacy_mask=_take(case.legacy_mask, perm, -1), key_padding_mask=kpm)


def permute_queries(case: Case, perm: np.ndarray) -> Case:
    """Permute the queries (and the query axis of every mask) by ``perm``."""
    return case._replace(
        q=case.q[:, :, perm], query=case.query[:, perm], mask=_take(case.mask, perm, -2),
        bias=_take(case.bias, perm, -2), legacy_mask=_take(case.legacy_mask, perm, -2))


def sub_batch(case: Case, items: np.ndarray) -> Case:
    """Keep batch ``items`` of every input and mask."""
    def b(x):
        return _take(x, items, -4)

    spec = case.spec._replace(batch=len(items))
    return case._replace(
        spec=spec, q=case.q[items], k=case.k[items], v=case.v[items], query=case.query[items],
        key=case.key[items], value=case.value[items], mask=b(case.mask), bias=b(case.bias),
        legacy_mask=b(case.legacy_mask),
        key_padding_mask=None if case.key_padding_mask is None else case.key_padding_mask[items])
