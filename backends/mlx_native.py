"""Adapter for MLX's fused attention, ``mlx.core.fast.scaled_dot_product_attention``:
``mlx-sdpa``, on :class:`~.foreign.ForeignAdapter` (the suite's arrays NumPy, converted at the op).

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k keys, d_k / d_v widths.

The op takes q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) with g dividing h (its own
grouped-query attention), a ``scale`` and one ``mask``: boolean (True = may attend) or additive,
broadcastable to (B, h, L_q, L_k), into which the base folds the spec's mask, key padding, causal,
bias and legacy mask. Its gradients are MLX's own (``mlx.core.vjp``), so the adapter claims
``attention_vjp``. dtypes: float32, float16 and bfloat16 on the CPU (MLX's CPU build for Linux is
``mlx[cpu]``); float64 is not claimed: the op takes float64 arrays, but its result is 4e-9 to
1e-8 from a float64 evaluation (measured on mlx 0.32.4), not float64 arithmetic (NUM-1, declared).
Without MLX, importing the module raises ``ImportError("unavailable: ...")`` and a run over the
backends leaves the adapter out.
"""

from __future__ import annotations

import numpy as np

from .foreign import ForeignAdapter, bfloat16
from .optional import require

require("mlx.core", extra="mlx")

import mlx.core as mx  # noqa: E402  (after the availability check)


class MLXSDPA(ForeignAdapter):
    """``mlx.core.fast.scaled_dot_product_attention`` behind the spec's SDPA."""

    framework = "mlx"
    native_op = "mlx.core.fast.scaled_dot_product_attention"
    capabilities = frozenset({"sdpa", "masks", "bias", "causal", "legacy_mask", "errors", "gqa",
                              "attention_vjp"})
    library_dtypes = ("float32", "float16", "bfloat16")
    deviations = {
        "MASK-9": "fully masked row -> mean of V: the adapter passes blocked entries as a boolean "
                  "mask, or with a bias as the dtype's lowest finite value, and the op normalises "
                  "a row of equal logits; a row emptied by -inf in the bias itself is NaN (MASK-11)",
        "MASK-11": "a fully masked row differs between mask=M (mean of V) and "
                   "bias=where(M, 0, -inf) (NaN: the op's softmax of a row of -inf); rows with an "
                   "allowed key agree",
        "GRAD-7": "a query whose every key is blocked by -inf in the bias gets NaN in dq (the "
                  "backward of MASK-11's NaN row), not 0",
        "NUM-1": "float64 is not claimed: the op's float64 result is 4e-9 to 1e-8 from a float64 "
                 "evaluation (float32-like accumulation), so float64 is not supported",
    }

    def framework_version(self) -> str:
        return mx.__version__

    def devices(self) -> dict[str, str | None]:
        return {"cpu": None, "cuda": "mlx-sdpa runs on the CPU here (MLX's CUDA build is another "
                                     "install)"}

    def to_native(self, x: np.ndarray):
        if x.dtype.name == "bfloat16":  # NumPy's bfloat16 (ml_dtypes) is not one MLX reads
            return mx.array(x.astype(np.float32)).astype(mx.bfloat16)
        return mx.array(x)

    def from_native(self, y) -> np.ndarray:
        if y.dtype == mx.bfloat16:
            return np.array(y.astype(mx.float32)).astype(bfloat16())
        return np.array(y)

    def native_attention(self, q, k, v, mask, scale: float):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        names = list(primals)
        _, grads = mx.vjp(lambda *xs: fn(dict(zip(names, xs))), [primals[n] for n in names],
                          [cotangent])
        return dict(zip(names, grads))


SDPA = MLXSDPA("mlx-sdpa")
