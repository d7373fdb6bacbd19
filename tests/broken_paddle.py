"""Plausible wrong adapters of PaddlePaddle's attention on
:class:`~mhaspec.backends.foreign.ForeignAdapter`, for tests/test_paddle_adapter.py: the gradients
of q and k swapped in the library's vjp (GRAD-3 must reject it), and the additive mask's polarity
inverted (MASK-2); and paddle-mha holding each projection's weight transposed, as a layer storing
(out, in) would (PARAM-1). Imported only where paddle is installed."""

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


class TransposedWeights(paddle_native.PaddleMHA):
    """paddle-mha that loads every projection's weight transposed (torch's (out, in) layout into
    Paddle's (in, out) Linear): square weights load without complaint."""

    def module(self, p, num_heads, dtype):
        return super().module(p._replace(**{n: getattr(p, n).T for n in ("w_q", "w_k", "w_v", "w_o")}),
                              num_heads, dtype)


SWAPPED_GRADIENTS = SwappedGradients("paddle-sdpa-swapped-gradients")
NEGATED_BIAS = NegatedBias("paddle-sdpa-negated-bias")
TRANSPOSED_WEIGHTS = TransposedWeights("paddle-mha-transposed-weights")
