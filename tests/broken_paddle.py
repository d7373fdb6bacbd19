"""Plausible wrong adapters of PaddlePaddle's attention on
:class:`~mhaspec.backends.foreign.ForeignAdapter`, for tests/test_paddle_adapter.py: the gradients
of q and k swapped in the library's vjp (GRAD-3 must reject it), and the additive mask's polarity
inverted (MASK-2). Imported only where paddle is installed."""

from __future__ import annotations

from mhaspec.backends import paddle_native


class SwappedGradients(paddle_native.PaddleSDPA):
    """paddle-sdpa whose vjp returns dk as dq and dq as dk."""

    def vjp(self, fn, primals, cotangent):
        grads = super().vjp(fn, primals, cotangent)
        return {**grads, "q": grads["k"], "k": grads["q"]}


class NegatedBias(paddle_native.PaddleSDPA):
    """paddle-sdpa that subtracts the additive mask instead of adding it (a bias sign slip)."""

    def native_attention(self, q, k, v, mask, scale):
        if mask is not None and mask.dtype != paddle_native.paddle.bool:
            mask = paddle_native.paddle.where(mask == -float("inf"), mask, -mask)
        return super().native_attention(q, k, v, mask, scale)


SWAPPED_GRADIENTS = SwappedGradients("paddle-sdpa-swapped-gradients")
NEGATED_BIAS = NegatedBias("paddle-sdpa-negated-bias")
