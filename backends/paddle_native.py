"""Adapter for PaddlePaddle's attention, ``paddle.nn.functional.scaled_dot_product_attention``:
``paddle-sdpa``, on :class:`~.foreign.ForeignAdapter` (the suite's arrays NumPy, converted at the
op).

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k keys, d_k / d_v widths.

The op takes q (B, L_q, h, d_k), k (B, L_k, g, d_k), v (B, L_k, g, d_v): sequence before heads,
so the adapter transposes the spec's (B, h, L, d) in and the output back; g dividing h (its own
grouped-query attention, ``enable_gqa=True``: query head i reads key/value head i // (h / g)), a
``scale`` and one ``attn_mask``: boolean (True = may attend, which the op itself turns into 0 and
-inf) or additive, broadcastable to (B, h, L_q, L_k), into which the base folds the spec's mask,
key padding, causal, bias and legacy mask. On the CPU it computes with Paddle's own operators
(``_math_attention``: ``matmul(q * scale, k^T) + mask``, softmax, ``matmul`` with v). Its
gradients are Paddle's own (``paddle.grad``), so the adapter claims ``attention_vjp``. dtypes:
float64 and float32; float16 and bfloat16 are not claimed: Paddle's CPU build registers no
``matmul`` kernel for them (``NotFound: The kernel with key (CPU, ..., float16) of kernel
`matmul` is not registered``, paddlepaddle 3.3.1). Without Paddle, importing the module raises
``ImportError("unavailable: ...")`` and a run over the backends leaves the adapter out; so does
a process that has imported TensorFlow before it (importing paddle 3.3.1 after tensorflow-cpu
crashes with a segmentation fault; paddle first, then tensorflow, works).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from .foreign import ForeignAdapter, bfloat16
from .optional import require

require("paddle", extra="paddle")
if "tensorflow" in sys.modules:  # importing paddle after tensorflow crashes the process
    raise ImportError("unavailable: paddle cannot be imported in a process that has imported "
                      "tensorflow (paddlepaddle 3.3.1 after tensorflow-cpu ends in a segmentation "
                      "fault); run paddle-sdpa in a process of its own (mhaspec certify "
                      "paddle-sdpa) or import paddle first")

with warnings.catch_warnings():  # Paddle's import warns that ccache (for C++ extensions) is absent
    warnings.filterwarnings("ignore", message="No ccache found")
    import paddle  # noqa: E402  (after the availability check)
    import paddle.nn.functional as F  # noqa: E402

#: (B, h, L, d) <-> (B, L, h, d): the spec's layout and the op's (the permutation is its own
#: inverse)
SEQUENCE_FIRST = [0, 2, 1, 3]


class PaddleSDPA(ForeignAdapter):
    """``paddle.nn.functional.scaled_dot_product_attention`` behind the spec's SDPA."""

    framework = "paddle"
    native_op = "paddle.nn.functional.scaled_dot_product_attention"
    capabilities = frozenset({"sdpa", "masks", "bias", "causal", "legacy_mask", "errors", "gqa",
                              "attention_vjp"})
    library_dtypes = ("float64", "float32")
    deviations = {
        "MASK-9": "fully masked row -> NaN: the op turns a boolean mask into 0 / -inf and its "
                  "softmax of a row of -inf is NaN (float32 rows of 8 or more keys: the mean of V, "
                  "by its softmax's clamp of x - max at -64); with a bias, where the adapter "
                  "passes the dtype's lowest finite value, the mean of V",
        "MASK-13": "a NaN or inf key behind a boolean mask reaches every row: the op adds the mask "
                   "(q.k + -inf = NaN) instead of excluding the key",
        "GRAD-7": "a query whose every key is blocked gets NaN in dq, and the dk and dv of every "
                  "key of its batch item and head are NaN, with a zero cotangent on the row too "
                  "(the backward of MASK-9's NaN row), not 0",
        "NUM-6": "float32: a NaN logit row gives a finite output: the CPU softmax clamps x - max "
                 "at -64 and its vectorised path (rows of 8 or more) turns NaN into -64",
    }

    def deviations_on(self, device: str, dtype: str) -> dict[str, str]:
        """NUM-6 holds in float32 only (float64's softmax keeps a NaN row NaN; paddlepaddle
        3.3.1)."""
        if dtype != "float32":
            return {c: r for c, r in self.deviations.items() if c != "NUM-6"}
        return dict(self.deviations)

    def framework_version(self) -> str:
        return paddle.__version__

    def devices(self) -> dict[str, str | None]:
        return {"cpu": None, "cuda": "paddle-sdpa runs on the CPU here (Paddle's CUDA build is "
                                     "another install)"}

    def to_native(self, x: np.ndarray):
        if x.dtype.name == "bfloat16":  # NumPy's bfloat16 (ml_dtypes) is not one Paddle reads
            return paddle.to_tensor(x.astype(np.float32)).astype("bfloat16")
        return paddle.to_tensor(x)

    def from_native(self, y) -> np.ndarray:
        if y.dtype == paddle.bfloat16:  # Paddle hands bfloat16 to NumPy as its uint16 bits
            return y.astype("float32").numpy().astype(bfloat16())
        return y.numpy()

    def native_attention(self, q, k, v, mask, scale: float):
        q, k, v = (paddle.transpose(x, SEQUENCE_FIRST) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                             training=False)
        return paddle.transpose(out, SEQUENCE_FIRST)

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        names = list(primals)
        inputs = []
        for name in names:
            x = primals[name].detach()
            x.stop_gradient = False
            inputs.append(x)
        out = fn(dict(zip(names, inputs)))
        grads = paddle.grad([out], inputs, grad_outputs=[cotangent])
        return dict(zip(names, grads))


SDPA = PaddleSDPA("paddle-sdpa")
