"""Adapter for Flax's ``nnx.MultiHeadAttention`` (JAX, eager): ``flax-mha``.

Axis legend: B batch, L_q / L_k lengths, h query heads, g key/value heads, d_model query width,
k_dim key/value width, d_k per-head width, d_out output width.

Inputs are validated with :mod:`.arg_checks` (through :class:`~.jax_backend.JaxBackend`'s entry
points) before anything reaches Flax. One module per call, built with ``num_heads = h``,
``in_features = d_model``, ``qkv_features = h*d_k``, ``out_features = d_out``, ``in_kv_features =
k_dim``, ``num_kv_heads = g`` (GQA, MHA-6), ``dtype`` and ``param_dtype`` the inputs' dtype,
``precision="highest"`` for float32 (NUM-2), dropout 0, ``decode=False``; its parameters are
overwritten with the spec's:

* ``query.kernel = W_q.reshape(d_model, h, d_k)``, ``key.kernel = W_k.reshape(k_dim, g, d_k)``,
  ``value.kernel = W_v.reshape(k_dim, g, d_k)``, ``out.kernel = W_o.reshape(h, d_k, d_out)``;
  biases reshaped the same way (``(h, d_k)``, ``(g, d_k)``, ``(d_out,)``); an absent bias is zero
  (``use_bias=False`` when every one is absent);
* the module has one ``qkv_features`` (so ``d_v = d_k``) and one ``in_kv_features`` (so
  ``v_dim = k_dim``): other widths raise ``NotImplementedError`` and "cross" is not claimed; it has
  no scale and no additive logit term: a scale other than ``1/sqrt(d_k)``, ``bias`` and
  ``legacy_mask`` raise ``NotImplementedError``;
* ``mask`` (True = may attend, the spec's polarity) ANDed with ``key_padding_mask``
  (``[:, None, None, :]``) is passed broadcast to ``(B, h, L_q, L_k)``;
* causal: ``is_causal=True`` (top-left, ``tril`` of ones) when it is the only mask and top-left or
  ``L_q == L_k``; otherwise an explicit mask (with another mask, Flax broadcasts its ``(L_q, L_k)``
  triangle to the mask's shape, which fails for a mask with a size-1 query axis);
* weights: ``sow_weights=True`` under ``nnx.capture(module, nnx.Intermediate)``, which returns
  the sown ``attention_weights`` ``(B, h, L_q, L_k)``; parameters are written as
  ``variable[...] = array`` (flax 0.12 deprecates ``.value`` and a ``sow`` outside ``capture``).

Observed with flax 0.12.8 on jax 0.10.2 (CPU): masked logits are set to ``finfo(dtype).min``, so a
fully masked row attends to every key uniformly: output the mean of V and weights ``1/L_k``
(declared against MASK-9). A NaN key behind the mask is replaced and does not leak (MASK-13
holds). GRAD: ``jax.vjp`` through the module (the parameters written into it are the primals);
a fully masked row depends on every key and value, so those rows' gradients are not 0 (declared
against GRAD-2).
"""

from __future__ import annotations

import functools

from .optional import require

require("flax", extra="flax")

from . import layouts  # noqa: E402
from . import masks as mask_forms  # noqa: E402
from ._base import MHAParams  # noqa: E402
from .adapters import JaxAdapter, MaskArgs  # noqa: E402
from .optional import jax_module, jnp_module  # noqa: E402


@functools.cache
def _nnx():
    jax_module()  # x64 on before Flax builds float64 parameters
    from flax import nnx

    return nnx


class FlaxMHA(JaxAdapter):
    """``flax.nnx.MultiHeadAttention`` behind the spec's multi-head attention."""

    framework = "flax"
    native_op = "flax.nnx.MultiHeadAttention"
    capabilities = frozenset({"mha", "weights", "masks", "causal", "errors", "gqa", "grad"})
    deviations = {
        "MASK-9": "fully masked row -> output the mean of V, weights 1/L_k (masked logits are "
                  "set to finfo(dtype).min, so the row's softmax is uniform)",
        "GRAD-2": "key and value rows that no query may attend get non-zero gradients: a fully "
                  "masked row attends to every key uniformly (MASK-9: mean of V), so it depends "
                  "on them",
    }
    conventions = {"causal-alignment": (
        "MASK-7", "is_causal=True is top-left (tril of ones); bottom-right with L_q != L_k goes "
                  "through an explicit mask")}

    def __init__(self, name: str = "flax-mha"):
        super().__init__(name)

    def framework_version(self) -> str:
        import flax

        return flax.__version__

    def module(self, p: MHAParams, num_heads: int, num_kv_heads: int, like):
        """An ``nnx.MultiHeadAttention`` holding the spec's parameters (PARAM-1, PARAM-2)."""
        nnx, jnp = _nnx(), jnp_module()
        d_model, hd_k = p.w_q.shape
        k_dim, v_dim = p.w_k.shape[0], p.w_v.shape[0]
        hd_v, d_out = p.w_o.shape
        g, d_k = num_kv_heads, hd_k // num_heads
        if hd_v // num_heads != d_k or v_dim != k_dim:
            self.unsupported(f"d_v = {hd_v // num_heads} with d_k = {d_k}, or v_dim = {v_dim} with "
                             f"k_dim = {k_dim} (one qkv_features and one in_kv_features)")
        use_bias = layouts.has_bias(p)
        dt = like.dtype
        mod = nnx.MultiHeadAttention(
            num_heads=num_heads, in_features=d_model, qkv_features=hd_k, out_features=d_out,
            num_kv_heads=g, in_kv_features=k_dim, dtype=dt, param_dtype=dt,
            precision="highest" if dt == jnp.float32 else None, dropout_rate=0.0,
            use_bias=use_bias, decode=False, rngs=nnx.Rngs(0))
        dense = layouts.to_einsum(layouts.with_zero_biases(p) if use_bias else p, num_heads, g)
        for layer, (kernel, bias) in zip((mod.query, mod.key, mod.value, mod.out), dense):
            layer.kernel[...] = kernel.astype(dt)
            if use_bias:
                layer.bias[...] = bias.astype(dt)
        return mod

    def mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
            num_kv_heads: int | None = None):
        nnx, jnp = _nnx(), jnp_module()
        if masks.bias is not None or masks.legacy_mask is not None:
            self.unsupported("an additive 'bias' or 'legacy_mask' (the module passes none to its "
                              "attention function)")
        d_k = p.w_q.shape[1] // num_heads
        if not mask_forms.is_default_scale(masks.scale, d_k):
            self.unsupported(f"scale = {masks.scale!r} (it always uses 1/sqrt(d_k) = "
                              f"{1 / d_k ** 0.5!r})")
        (b, len_q, _), len_k = query.shape, key.shape[1]
        only_causal = masks.mask is None and masks.key_padding_mask is None
        is_causal = only_causal and self.native_causal(masks.causal, len_q, len_k)
        allowed = mask_forms.allowed_mask(len_q, len_k, like=query, mask=masks.mask,
                                          key_padding_mask=masks.key_padding_mask,
                                          causal=None if is_causal else masks.causal)
        mask = None if allowed is None else jnp.broadcast_to(allowed, (b, num_heads, len_q, len_k))
        mod = self.module(p, num_heads, num_heads if num_kv_heads is None else num_kv_heads,
                           query)
        out, sown = nnx.capture(mod, nnx.Intermediate)(
            query, key, value, mask=mask, is_causal=is_causal, deterministic=True, sow_weights=True)
        (weights,) = sown["attention_weights"].get_value()
        return out, weights


MHA = FlaxMHA("flax-mha")
