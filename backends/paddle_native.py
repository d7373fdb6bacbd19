"""Adapters for PaddlePaddle's attention, on :class:`~.foreign.ForeignAdapter` (the suite's arrays
NumPy, converted at the op): ``paddle-sdpa``, ``paddle.nn.functional.scaled_dot_product_attention``,
and ``paddle-mha``, the module ``paddle.nn.MultiHeadAttention``.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k keys, d_k / d_v widths,
d_model = E the module's width.

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

The module (``paddle-mha``) holds the spec's parameters as they are (its ``Linear`` layers compute
``x @ weight + bias`` with weight (in, out), the spec's layout), ties every width to ``embed_dim``
= d_model (h * d_k = h * d_v = d_out = d_model; key and value widths too, as the adapter claims no
"cross"), always scales by 1/sqrt(d_k), and takes one ``attn_mask`` broadcast to (B, h, L_q,
L_k): boolean (True = may attend), which it adds as ``(mask - 1) * 1e9``, or additive, into which
the adapter folds bias and legacy mask (blocked entries the dtype's lowest finite value). Its
softmax clamps x - max at -64, so a blocked key's weight is e^-64 = 1.6e-28, not 0: the catalogued
behaviour ``masked-weights-not-zero`` (:mod:`.behaviours`), declared as such. It returns the
weights (``need_weights=True``).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from . import masks as mask_helpers
from ._base import MHAParams
from .calls import MaskArgs
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


class PaddleArrays(ForeignAdapter):
    """Paddle tensors at the op: what both adapters share (conversion, version, devices)."""

    framework = "paddle"

    def framework_version(self) -> str:
        return paddle.__version__

    def devices(self) -> dict[str, str | None]:
        return {"cpu": None, "cuda": f"{self.name} runs on the CPU here (Paddle's CUDA build is "
                                     f"another install)"}

    def to_native(self, x: np.ndarray):
        if x.dtype.name == "bfloat16":  # NumPy's bfloat16 (ml_dtypes) is not one Paddle reads
            return paddle.to_tensor(x.astype(np.float32)).astype("bfloat16")
        return paddle.to_tensor(x)

    def from_native(self, y) -> np.ndarray:
        if y.dtype == paddle.bfloat16:  # Paddle hands bfloat16 to NumPy as its uint16 bits
            return y.astype("float32").numpy().astype(bfloat16())
        return y.numpy()


class PaddleSDPA(PaddleArrays):
    """``paddle.nn.functional.scaled_dot_product_attention`` behind the spec's SDPA."""

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


class PaddleMHA(PaddleArrays):
    """``paddle.nn.MultiHeadAttention`` behind the spec's multi-head attention (the module
    docstring says what it ties and how it masks)."""

    native_op = "paddle.nn.MultiHeadAttention"
    capabilities = frozenset({"mha", "weights", "masks", "bias", "causal", "legacy_mask",
                              "errors"})
    library_dtypes = ("float64", "float32")
    deviations = {
        "behaviour:masked-weights-not-zero":
            "the softmax clamps x - max at -64 (paddle/phi/kernels/funcs/softmax_impl.h, "
            "ValueClip), so a blocked key, whose logit the module lowers by 1e9, keeps the weight "
            "e^-64 = 1.6e-28 instead of 0",
        "MASK-9": "a row with no allowed key gives the softmax of its own logits, not zeros: a "
                  "boolean attn_mask is added as (mask - 1) * 1e9 (paddle/nn/layer/transformer.py, "
                  "_convert_attention_mask), which lowers every logit of the row alike (float32: "
                  "-1e9 swallows logits below 32 in size, giving about the mean of V); with a bias, "
                  "where the adapter passes the dtype's lowest finite value, the mean of V",
        "MASK-11": "in a row with no allowed key the boolean mask and its -inf bias differ: the "
                   "mask gives the softmax of the row's logits (MASK-9), the -inf bias NaN",
        "MASK-13": "a NaN or inf key behind a boolean mask reaches every row: the module adds the "
                   "mask (q.k - 1e9 is NaN for a NaN key) instead of excluding the key",
        "NUM-6": "float32: a NaN logit row gives a finite output: the CPU softmax clamps x - max "
                 "at -64 and its vectorised path (rows of 8 or more) turns NaN into -64",
        "SHAPE-4": "an empty batch, query length or key length gives an output of shape (0, 0, E) "
                   "and weights with an empty batch: the module reshapes with shape=[0, 0, ...] "
                   "(paddle/nn/layer/transformer.py), 0 meaning 'copy the input's dimension'",
    }

    def deviations_on(self, device: str, dtype: str) -> dict[str, str]:
        """NUM-6 holds in float32 only, as for paddle-sdpa (the same softmax)."""
        if dtype != "float32":
            return {c: r for c, r in self.deviations.items() if c != "NUM-6"}
        return dict(self.deviations)

    def mha(self, query, key, value, p: MHAParams, num_heads: int, m: MaskArgs, **grouping):
        d_model, hd_k = p.w_q.shape
        if not mask_helpers.is_default_scale(m.scale, hd_k // num_heads):
            self.unsupported(f"scale = {m.scale!r} (it always uses 1/sqrt(d_k) = "
                             f"{(hd_k // num_heads) ** -0.5!r})")
        module = self.module(p, num_heads, query.dtype)
        out, weights = module(*(self.as_native(x) for x in (query, key, value)),
                              attn_mask=self.one_mask(query, m, query.shape[1], key.shape[1]))
        return self.from_native(out), self.from_native(weights)

    def module(self, p: MHAParams, num_heads: int, dtype):
        """A ``paddle.nn.MultiHeadAttention`` in ``dtype`` (eval, dropout 0, weights returned)
        holding the spec's parameters (PARAM-1, PARAM-2: with any bias, every layer has one, the
        absent ones 0); widths other than d_model are not expressible (it claims no "cross")."""
        d_model, hd_k = p.w_q.shape
        hd_v, d_out = p.w_o.shape
        if hd_k != d_model or hd_v != d_model or d_out != d_model:
            self.unsupported(f"h*d_k = {hd_k}, h*d_v = {hd_v}, d_out = {d_out} with d_model = "
                             f"{d_model}: every projection width must equal embed_dim = d_model")
        biased = any(b is not None for b in (p.b_q, p.b_k, p.b_v, p.b_o))  # absent ones are 0
        module = paddle.nn.MultiHeadAttention(
            d_model, num_heads, dropout=0.0, kdim=p.w_k.shape[0], vdim=p.w_v.shape[0],
            need_weights=True, bias_attr=None if biased else False)
        module.to(dtype=np.dtype(dtype).name)
        module.eval()
        for layer, weight, bias in (("q_proj", p.w_q, p.b_q), ("k_proj", p.w_k, p.b_k),
                                    ("v_proj", p.w_v, p.b_v), ("out_proj", p.w_o, p.b_o)):
            linear = getattr(module, layer)
            linear.weight.set_value(self.as_native(np.asarray(weight, dtype=dtype)))
            if biased:
                linear.bias.set_value(self.as_native(
                    np.zeros(weight.shape[1], dtype) if bias is None else np.asarray(bias, dtype)))
        return module


SDPA = PaddleSDPA("paddle-sdpa")
MHA = PaddleMHA("paddle-mha")
