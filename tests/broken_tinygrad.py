"""Plausible wrong adapters of tinygrad's attention on
:class:`~mhaspec.backends.foreign.ForeignAdapter`, for tests/test_tinygrad_adapter.py: the gradients
of q and k swapped in the library's vjp (GRAD-3 must reject it), and the additive mask's polarity
inverted (MASK-2). Imported only where tinygrad is installed."""

from __future__ import annotations

from mhaspec.backends import tinygrad_native


class SwappedGradients(tinygrad_native.TinygradSDPA):
    """tinygrad-sdpa whose vjp returns dk as dq and dq as dk."""

    def vjp(self, fn, primals, cotangent):
        grads = super().vjp(fn, primals, cotangent)
        return {**grads, "q": grads["k"], "k": grads["q"]}


class NegatedBias(tinygrad_native.TinygradSDPA):
    """tinygrad-sdpa that subtracts the additive mask instead of adding it (a bias sign slip)."""

    def native_attention(self, q, k, v, mask, scale):
        if mask is not None and mask.dtype != tinygrad_native.dtypes.bool:
            mask = (mask == -float("inf")).where(mask, -mask)
        return super().native_attention(q, k, v, mask, scale)


SWAPPED_GRADIENTS = SwappedGradients("tinygrad-sdpa-swapped-gradients")
NEGATED_BIAS = NegatedBias("tinygrad-sdpa-negated-bias")
