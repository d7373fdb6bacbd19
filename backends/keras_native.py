"""Adapter for Keras 3 ``keras.layers.MultiHeadAttention`` on the TensorFlow backend.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

``KERAS_BACKEND`` is set to ``tensorflow`` (unless already set) before Keras is imported; the adapter
refuses to run on another Keras backend. Inputs are validated with :mod:`._validate` (through
:class:`~.tf_backend.TensorFlowBackend`'s entry point) before anything reaches Keras, then converted:

* the layer is ``MultiHeadAttention(num_heads=h, key_dim=d_k, value_dim=d_v, output_shape=d_out,
  use_bias=..., dtype=<inputs' dtype>)``, called as ``layer(query, value, key)`` (Keras puts value
  before key) with ``return_attention_scores=True`` (per-head weights ``(B, h, L_q, L_k)``);
* parameters: the ``EinsumDense`` kernels are reshaped views of the spec's matrices (PARAM-2):
  query kernel ``W_q.reshape(d_model, h, d_k)``, key kernel ``W_k.reshape(k_dim, h, d_k)``, value
  kernel ``W_v.reshape(v_dim, h, d_v)``, output kernel ``W_o.reshape(h, d_v, d_out)``; biases
  ``b_q.reshape(h, d_k)``, ``b_k.reshape(h, d_k)``, ``b_v.reshape(h, d_v)``, ``b_o``. Keras has one
  ``use_bias`` switch; an absent spec bias is zero (PARAM-1), so a partial set is passed with zeros;
* ``attention_mask`` has the spec's polarity (True = may attend). The ANDed boolean masks (``mask``,
  ``key_padding_mask`` as ``[:, None, None, :]``, bottom-right causal) are passed as ``(B, L_q, L_k)``
  when they have no head axis, else as ``(B, h, L_q, L_k)``;
* causal top-left, and bottom-right when ``L_q == L_k``, use ``use_causal_mask=True`` (top-left);
  bottom-right with ``L_q != L_k`` is an explicit boolean mask;
* what cannot be expressed raises ``NotImplementedError``: an additive ``bias`` and the
  ``legacy_mask`` (the layer has no additive logit term), and a scale other than ``1/sqrt(d_k)``.
  "sdpa" is not claimed (the layer always projects), nor "legacy_mask".

Observed with Keras 3.15 on TensorFlow 2.21 (CPU): masked logits are replaced by a large negative
number and the softmax output is then zeroed where the mask is False, so a fully masked row gives
weights 0 and head output 0 (the layer's output is then ``b_o``), as MASK-9 asks. In float64 the
layer multiplies the query by ``ops.cast(1/sqrt(d_k), "float64")``, which rounds the scale to
float32 first, so float64 results carry a ~3e-8 relative error (declared against NUM-3).
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np

from ._base import MHAParams
from ._generic import MaskArgs
from ._native_common import NativeMixin, is_default_scale
from .tf_backend import TensorFlowBackend, _tf


@functools.cache
def _keras():
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    _tf()
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"keras-mha needs KERAS_BACKEND=tensorflow; Keras was imported with "
                           f"backend {keras.backend.backend()!r}")
    return keras


class KerasMHA(NativeMixin, TensorFlowBackend):
    """``keras.layers.MultiHeadAttention`` (TensorFlow backend) behind the spec's MHA."""

    framework = "keras"
    native_op = "keras.layers.MultiHeadAttention"
    capabilities = frozenset({"mha", "weights", "masks", "causal", "cross", "errors"})
    deviations = {
        "NUM-1": "float64 is not supported: the scale 1/sqrt(d_k) is rounded to float32 (ops.cast "
                 "of a Python float goes through a float32 tensor), ~3e-8 relative logit error, "
                 "so float64 is not claimed",
    }

    conventions = {
        "argument-order": ("MHA-4", "the layer is called as (query, value, key): value before key; "
                                    "the adapter passes them in that order"),
        "causal-alignment": ("MASK-7", "use_causal_mask=True is top-left; bottom-right with "
                                       "L_q != L_k goes through an explicit attention_mask"),
    }

    def dtypes(self, device: str) -> tuple[str, ...]:
        # float64 is not claimed: the scale 1/sqrt(d_k) is rounded to float32 (ops.cast of a
        # Python float goes through a float32 tensor), logit errors ~3e-8 relative.
        return ("float32", "float16", "bfloat16")

    def __init__(self, name: str = "keras-mha"):
        NativeMixin.__init__(self, name)

    def framework_version(self) -> str:
        return _keras().__version__

    def _cast_like(self, x, like):
        return _tf().cast(x, like.dtype)

    def _sdpa(self, *args):
        self._unsupported("scaled dot-product attention on its own (the layer always projects)")

    def _layer(self, p: MHAParams, num_heads: int, query, key, value):
        keras, tf = _keras(), _tf()
        d_model, hd_k = self._shape(p.w_q)
        k_dim, v_dim = self._shape(p.w_k)[0], self._shape(p.w_v)[0]
        hd_v, d_out = self._shape(p.w_o)
        d_k, d_v = hd_k // num_heads, hd_v // num_heads
        has_bias = any(b is not None for b in (p.b_q, p.b_k, p.b_v, p.b_o))
        layer = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=d_k, value_dim=d_v,
                                                output_shape=d_out, use_bias=has_bias,
                                                dtype=query.dtype.name)
        layer.build(tuple(query.shape), tuple(value.shape), tuple(key.shape))
        dt = query.dtype

        def put(var, x, shape):
            var.assign(tf.reshape(tf.cast(x, dt), shape))

        put(layer.query_dense.kernel, p.w_q, (d_model, num_heads, d_k))
        put(layer.key_dense.kernel, p.w_k, (k_dim, num_heads, d_k))
        put(layer.value_dense.kernel, p.w_v, (v_dim, num_heads, d_v))
        put(layer.output_dense.kernel, p.w_o, (num_heads, d_v, d_out))
        if has_bias:
            for dense, b, shape in ((layer.query_dense, p.b_q, (num_heads, d_k)),
                                    (layer.key_dense, p.b_k, (num_heads, d_k)),
                                    (layer.value_dense, p.b_v, (num_heads, d_v)),
                                    (layer.output_dense, p.b_o, (d_out,))):
                put(dense.bias, np.zeros(shape) if b is None else b, shape)
        return layer

    def _mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs):
        tf = _tf()
        if masks.bias is not None:
            self._unsupported("an additive 'bias' (the layer has no additive logit term)")
        if masks.legacy_mask is not None:
            self._unsupported("the additive 'legacy_mask' (the layer has no additive logit term)")
        d_k = self._shape(p.w_q)[1] // num_heads
        if not is_default_scale(masks.scale, d_k):
            self._unsupported(f"scale = {masks.scale!r} (it always uses 1/sqrt(d_k) = "
                              f"{1 / d_k ** 0.5!r})")
        b, len_q, len_k = self._shape(query)[0], self._shape(query)[1], self._shape(key)[1]
        use_causal = self._native_causal(masks.causal, len_q, len_k)
        allowed = self._allowed_rank4(len_q, len_k, query, masks.mask, masks.key_padding_mask,
                                      None if use_causal else masks.causal)
        attention_mask = None
        if allowed is not None:
            if self._shape(allowed)[1] == 1:
                attention_mask = tf.broadcast_to(allowed, (b, 1, len_q, len_k))[:, 0]
            else:
                attention_mask = tf.broadcast_to(allowed, (b, num_heads, len_q, len_k))
        layer = self._layer(p, num_heads, query, key, value)
        with warnings.catch_warnings():  # Keras warns about a softmax over L_k = 1
            warnings.filterwarnings("ignore", message="You are using a softmax over axis")
            second, third = (value, key) if "argument-order" in self.translated else (key, value)
            out, weights = layer(query, second, third, attention_mask=attention_mask,
                                 use_causal_mask=use_causal, return_attention_scores=True,
                                 training=False)
        return out, weights


MHA = KerasMHA("keras-mha")
