"""Adapter for Keras 3 ``keras.layers.MultiHeadAttention`` on the TensorFlow backend.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

``KERAS_BACKEND`` is set to ``tensorflow`` (unless already set) before Keras is imported; the adapter
refuses to run on another Keras backend. The adapter is a :class:`~.adapters.TensorFlowAdapter`:
inputs are validated before anything reaches Keras, then converted with the public helpers
(:mod:`.layouts`, :mod:`.masks`):

* the layer is ``MultiHeadAttention(num_heads=h, key_dim=d_k, value_dim=d_v, output_shape=d_out,
  use_bias=..., dtype=<inputs' dtype>)``, called as ``layer(query, value, key)`` (Keras puts value
  before key) with ``return_attention_scores=True`` (per-head weights ``(B, h, L_q, L_k)``);
* parameters: the ``EinsumDense`` kernels are reshaped views of the spec's matrices (PARAM-2,
  :func:`.layouts.to_einsum`):
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

from . import calls, layouts, masks
from ._base import MHAParams
from .adapters import MaskArgs, TensorFlowAdapter
from .optional import tf_module


@functools.cache
def keras_module():
    """Keras 3 on its TensorFlow backend (``KERAS_BACKEND`` set to ``tensorflow`` unless set);
    RuntimeError when Keras was already imported with another backend."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    tf_module()
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"keras-mha needs KERAS_BACKEND=tensorflow; Keras was imported with "
                           f"backend {keras.backend.backend()!r}")
    return keras


#: the projections' bias with a width of 1 (keras 3.15.1, a library-only reproduction in
#: docs/ecosystem.md): EinsumDense("abc,cde->abde", bias_axes="de") adds a bias (h, 1) to an output
#: (B, L, h, 1) along the tokens, not the heads, when L = h
_EINSUM_BIAS = ("a projection with per-head width 1 and a bias adds the bias along the tokens, not "
                "the heads, when a sequence has as many tokens as there are heads (Keras's "
                "EinsumDense with bias_axes 'de' and output (B, L, h, 1), L = h)")


class KerasMHA(TensorFlowAdapter):
    """``keras.layers.MultiHeadAttention`` (TensorFlow backend) behind the spec's MHA."""

    framework = "keras"
    native_op = "keras.layers.MultiHeadAttention"
    capabilities = frozenset({"mha", "weights", "masks", "causal", "cross", "errors", "grad"})
    deviations = {
        "NUM-1": "float64 is not supported: the scale 1/sqrt(d_k) is rounded to float32 (ops.cast "
                 "of a Python float goes through a float32 tensor), ~3e-8 relative logit error, "
                 "so float64 is not claimed",
        # PARAM-1 governs the projections' biases: the other clauses' cases are built without
        # them in the cells that declare it (conformance/governed.py)
        "PARAM-1": _EINSUM_BIAS,
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
        super().__init__(name)

    def framework_version(self) -> str:
        return keras_module().__version__

    def _layer(self, p: MHAParams, num_heads: int, query, key, value):
        keras, tf = keras_module(), tf_module()
        hd_k, (hd_v, d_out) = self.ops.shape(p.w_q)[1], self.ops.shape(p.w_o)
        layer = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=hd_k // num_heads,
                                                value_dim=hd_v // num_heads, output_shape=d_out,
                                                use_bias=layouts.has_bias(p),
                                                dtype=query.dtype.name)
        layer.build(tuple(query.shape), tuple(value.shape), tuple(key.shape))
        if layouts.has_bias(p):
            p = layouts.with_zero_biases(p)
        dense = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
        for target, (kernel, bias) in zip(dense, layouts.to_einsum(p, num_heads)):
            target.kernel.assign(tf.cast(kernel, query.dtype))
            if bias is not None:
                target.bias.assign(tf.cast(bias, query.dtype))
        return layer

    def mha(self, query, key, value, p: MHAParams, num_heads: int, m: MaskArgs):
        out, weights, _ = self._call(query, key, value, p, num_heads, m)
        return out, weights

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """GRAD: the layer's own tape gradients with respect to fresh copies of the inputs and its
        kernels and biases (the variables holding the spec's parameters), mapped back to the
        spec's layout (:func:`.layouts.from_einsum`: kernels and biases reshaped)."""
        tf = tf_module()
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        x = {n: tf.identity(t) for n, t in (("query", query), ("key", key), ("value", value))}
        with tf.GradientTape() as tape:
            tape.watch(list(x.values()))
            out, _, layer = self._call(x["query"], x["key"], x["value"], call.params,
                                       call.num_heads, call.masks)
        use_bias = layouts.has_bias(call.params)
        dense = [(d.kernel, d.bias if use_bias else None) for d in
                 (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)]
        sources = [*x.values(), *(v for pair in dense for v in pair if v is not None)]
        grads = iter(tape.gradient(out, sources, output_gradients=cotangent,
                                   unconnected_gradients=tf.UnconnectedGradients.ZERO))
        result = {n: next(grads) for n in x}
        spec = layouts.from_einsum([tuple(None if v is None else next(grads) for v in pair)
                                    for pair in dense])._asdict()
        result.update((n, g) for n, g in spec.items()
                      if n.startswith("w_") or getattr(call.params, n) is not None)
        return result

    def _call(self, query, key, value, p: MHAParams, num_heads: int, m: MaskArgs):
        """The layer call of :meth:`mha`: (output, weights, layer)."""
        tf = tf_module()
        if m.bias is not None:
            self.unsupported("an additive 'bias' (the layer has no additive logit term)")
        if m.legacy_mask is not None:
            self.unsupported("the additive 'legacy_mask' (the layer has no additive logit term)")
        d_k = self.ops.shape(p.w_q)[1] // num_heads
        if not masks.is_default_scale(m.scale, d_k):
            self.unsupported(f"scale = {m.scale!r} (it always uses 1/sqrt(d_k) = "
                             f"{1 / d_k ** 0.5!r})")
        b, len_q, len_k = self.ops.shape(query)[0], self.ops.shape(query)[1], self.ops.shape(key)[1]
        use_causal = self.native_causal(m.causal, len_q, len_k)
        allowed = masks.allowed_mask(len_q, len_k, like=query, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask,
                                     causal=None if use_causal else m.causal)
        attention_mask = None
        if allowed is not None:  # (B, L_q, L_k) without a head axis, else (B, h, L_q, L_k)
            if self.ops.shape(allowed)[1] == 1:
                attention_mask = tf.broadcast_to(allowed, (b, 1, len_q, len_k))[:, 0]
            else:
                attention_mask = tf.broadcast_to(allowed, (b, num_heads, len_q, len_k))
        layer = self._layer(p, num_heads, query, key, value)
        with warnings.catch_warnings():  # Keras warns about a softmax over L_k = 1
            warnings.filterwarnings("ignore", message="You are using a softmax over axis")
            second, third = (value, key) if self.translates("argument-order") else (key, value)
            out, weights = layer(query, second, third, attention_mask=attention_mask,
                                 use_causal_mask=use_causal, return_attention_scores=True,
                                 training=False)
        return out, weights, layer


MHA = KerasMHA("keras-mha")
