"""Plausible wrong implementations of multi-head attention: the suite must reject every one.

Each is the NumPy backend with one mistake, loaded by the tests through
``--backend broken_backends:<NAME>`` exactly as a third-party backend would be. ``EXPECTED`` names
the clause(s) each must fail; the tests assert the suite reports at least one of them as failing.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends.np_backend import NumpyBackend


class _Broken(NumpyBackend):
    def __init__(self, name: str, variant: str = "batched"):
        super().__init__(variant)
        self.name = name


class WrongScale(_Broken):
    """Scales logits by 1/d_k instead of 1/sqrt(d_k) (and squares a given scale)."""

    def _attend(self, q, k, v, allowed, additive, scale):
        return super()._attend(q, k, v, allowed, additive, scale * scale)


class SoftmaxOverQueries(_Broken):
    """Normalises over the query axis instead of the key axis."""

    def _max_last(self, x):
        return np.max(x, axis=-2, keepdims=True)

    def _sum_last(self, x):
        return np.sum(x, axis=-2, keepdims=True)


class MaskPolarityFlipped(_Broken):
    """Treats True in a boolean mask as 'blocked' (PyTorch nn.MultiheadAttention's convention)."""

    def _combine_masks(self, len_q, len_k, like, mask, key_padding_mask, causal):
        return super()._combine_masks(len_q, len_k, like, None if mask is None else ~mask,
                                      key_padding_mask, causal)


class HeadsSplitWrongOrder(_Broken):
    """Splits h*d as (d, h) instead of (h, d): heads take interleaved columns."""

    def _split(self, x, num_heads):
        b, length, width = self._shape(x)
        return np.transpose(x.reshape(b, length, width // num_heads, num_heads), (0, 3, 1, 2))

    def _combine(self, x):
        b, h, length, d = self._shape(x)
        return np.transpose(x, (0, 2, 3, 1)).reshape(b, length, h * d)

    def split_heads(self, x, num_heads):
        return self._split(x, num_heads)


class KeysReshapedWithQueryLength(_Broken):
    """The source's 'efficient' form: reshapes K and V with the query length L_q."""

    def _mha(self, query, key, value, p, num_heads, *rest):
        self._len_q = self._shape(query)[1]
        return super()._mha(query, key, value, p, num_heads, *rest)

    def _split(self, x, num_heads):
        b, _, width = self._shape(x)
        x = x.reshape(b, self._len_q, num_heads, width // num_heads)
        return np.transpose(x, (0, 2, 1, 3))


class SilentFloat16(_Broken):
    """Computes every matmul in float16 and casts back: a float32 result with float16 accuracy."""

    def _matmul(self, a, b):
        return np.matmul(a.astype(np.float16), b.astype(np.float16)).astype(a.dtype)


class StaleDeviation(_Broken):
    """Correct, but declares a deviation it does not have: reported as stale."""

    deviations = {"MASK-9": "fully masked rows give NaN (not true: this backend gives 0)"}


WRONG_SCALE = WrongScale("broken-wrong-scale")
SOFTMAX_OVER_QUERIES = SoftmaxOverQueries("broken-softmax-axis")
MASK_POLARITY_FLIPPED = MaskPolarityFlipped("broken-mask-polarity")
HEADS_SPLIT_WRONG_ORDER = HeadsSplitWrongOrder("broken-head-order")
KEYS_RESHAPED_WITH_QUERY_LENGTH = KeysReshapedWithQueryLength("broken-kv-reshape")
SILENT_FLOAT16 = SilentFloat16("broken-silent-fp16")
STALE_DEVIATION = StaleDeviation("stale-deviation")

#: attribute -> (backend name, clauses of which at least one must be reported failing)
EXPECTED = {
    "WRONG_SCALE": ("broken-wrong-scale", {"SDPA-1", "SDPA-2", "MHA-1"}),
    "SOFTMAX_OVER_QUERIES": ("broken-softmax-axis", {"SDPA-1", "SDPA-4", "MHA-1"}),
    "MASK_POLARITY_FLIPPED": ("broken-mask-polarity", {"MASK-1", "MASK-10", "MASK-11"}),
    "HEADS_SPLIT_WRONG_ORDER": ("broken-head-order", {"HEAD-1", "HEAD-2", "MHA-1", "PARAM-2"}),
    "KEYS_RESHAPED_WITH_QUERY_LENGTH": ("broken-kv-reshape", {"MHA-2", "MHA-4"}),
    "SILENT_FLOAT16": ("broken-silent-fp16", {"NUM-2", "NUM-3", "SDPA-1"}),
}
