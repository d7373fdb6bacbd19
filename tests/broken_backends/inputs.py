"""Backends that write into the caller's arrays (INPUT-1); their results are right."""

from __future__ import annotations

import numpy as np

from mhaspec.backends.algorithms import PerHead

from .base import Broken


class QueryDoubledInPlace(Broken):
    """Attention doubles ``q`` in place and halves the scale: exact results, the caller's q
    doubled."""

    def scaled_dot_product_attention(self, q, k, v, *, scale=None, **kw):
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        np.multiply(q, 2, out=q)
        return super().scaled_dot_product_attention(q, k, v, scale=scale / 2, **kw)


class QueryWeightScaledThroughView(Broken):
    """The per-head algorithm folds the scale into each head's block of W_q and b_q, slices that
    share the caller's buffer, and attends with scale 1: the caller's W_q and b_q are scaled."""

    class Kernel(PerHead):
        def mha(self, ops, query, key, value, p, num_heads, masks, *rest):
            d_k = p.w_q.shape[1] // num_heads
            for i in range(num_heads):
                head = slice(i * d_k, (i + 1) * d_k)
                block = p.w_q[:, head]  # a view
                block *= masks.scale
                if p.b_q is not None:
                    bias = p.b_q[head]
                    bias *= masks.scale
            return super().mha(ops, query, key, value, p, num_heads, masks._replace(scale=1.0),
                               *rest)


class MaskInvertedInPlace(Broken):
    """Turns the caller's boolean mask into a kernel's polarity (True = blocked) in place and never
    turns it back: the caller's mask is cleared where it allowed and set where it blocked."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            if mask is not None:
                blocked = np.logical_not(mask, out=mask)
                mask = np.logical_not(blocked)
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, causal)


class PaddedValuesZeroedInPlace(Broken):
    """Zeroes the value rows of padded keys in place ("they are masked anyway") when value is an
    array of its own: the output is unchanged, the caller's value is not."""

    def multi_head_attention(self, query, key, value, params, *, num_heads, key_padding_mask=None,
                             **kw):
        if key_padding_mask is not None and value is not key and value is not query:
            value[~key_padding_mask] = 0.0
        return super().multi_head_attention(query, key, value, params, num_heads=num_heads,
                                            key_padding_mask=key_padding_mask, **kw)
