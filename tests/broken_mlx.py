"""Plausible wrong adapters of MLX's attention on :class:`~mhaspec.backends.foreign.ForeignAdapter`,
for tests/test_mlx_adapter.py: the gradients of q and k swapped in the library's vjp (GRAD-3 must
reject it), and the additive mask's polarity inverted (MASK-2). Imported only where mlx is
installed."""

from __future__ import annotations

from mhaspec.backends import mlx_native


class SwappedGradients(mlx_native.MLXSDPA):
    """mlx-sdpa whose vjp returns dk as dq and dq as dk."""

    def vjp(self, fn, primals, cotangent):
        grads = super().vjp(fn, primals, cotangent)
        return {**grads, "q": grads["k"], "k": grads["q"]}


class NegatedBias(mlx_native.MLXSDPA):
    """mlx-sdpa that subtracts the additive mask instead of adding it (a bias sign slip)."""

    def native_attention(self, q, k, v, mask, scale):
        if mask is not None and mask.dtype != mlx_native.mx.bool_:
            mask = mlx_native.mx.where(mask == -float("inf"), mask, -mask)
        return super().native_attention(q, k, v, mask, scale)


SWAPPED_GRADIENTS = SwappedGradients("mlx-sdpa-swapped-gradients")
NEGATED_BIAS = NegatedBias("mlx-sdpa-negated-bias")
