"""An adapter base for any array library (MLX, tinygrad, PaddlePaddle, ...): the suite's arrays
are NumPy (bfloat16 from ``ml_dtypes``), converted to the library's at its op, and the library's
own autodiff certifies ``attention_vjp``.

Axis legend: B batch, h query heads, g key/value heads (g = h unless "gqa" is claimed), L_q
queries, L_k keys, d_k / d_v per-head widths.

An adapter subclasses :class:`ForeignAdapter` and writes, in the library's own terms:

* ``to_native(x)``: a NumPy array (float64, float32, float16, ``ml_dtypes.bfloat16`` or bool) ->
  the library's array of the same dtype;
* ``from_native(y)``: the library's array -> NumPy (same dtype; bfloat16 as ``ml_dtypes``');
* ``native_attention(q, k, v, mask, scale)``: q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g,
  L_k, d_v) library arrays -> output (B, h, L_q, d_v); ``mask`` None, a boolean (True = may
  attend) or an additive float library array of rank 4 broadcastable to (B, h, L_q, L_k) (what
  the call's mask, key padding, causal, bias and legacy mask come to, built by
  :func:`~.masks.allowed_mask`, :func:`~.masks.additive_mask` and :func:`~.masks.fill_blocked`);
  ``scale`` a float (blocked entries of an additive mask hold the dtype's lowest finite value,
  :meth:`ForeignAdapter.blocked_fill`);
* optionally ``vjp(fn, primals, cotangent) -> dict``: the library's vector-Jacobian product of
  ``fn`` (a dict of library arrays -> a library array) at ``primals`` against ``cotangent``, one
  gradient per primal; with it the adapter may claim ``attention_vjp`` (GRAD-3 and on: the
  gradients of what ``native_attention`` computes, by the library's autodiff);
* ``library_dtypes``: the dtypes the op computes in (any of float64, float32, float16, bfloat16).

A module (multi-head attention with its own projections) writes ``mha`` instead (the signature of
:meth:`~.adapters.NativeAdapter.mha`, NumPy arrays in and out, converted with ``as_native`` and
``from_native``) and claims "mha" (and "weights" where it returns them): ``paddle-mha``.

The base validates every call, folds the spec's masking arguments into the one mask, and judges
nothing itself. It returns no attention weights (the op has none), a gradient call with an lse
cotangent, a bias gradient, a KV cache or sinks is not implemented (the capabilities the base
can claim: sdpa, mha, weights, masks, bias, causal, legacy_mask, errors, gqa where the op groups
heads, attention_vjp).
"""

from __future__ import annotations

import numpy as np

from . import masks as mask_helpers
from .adapters import MaskArgs, NumpyAdapter

#: what the base can carry; an adapter claims the part its op computes
FOREIGN_CAPABILITIES = frozenset({"sdpa", "mha", "weights", "masks", "bias", "causal", "legacy_mask",
                                  "errors", "gqa", "attention_vjp"})


def bfloat16():
    """NumPy's bfloat16 (``ml_dtypes``, which every JAX and TensorFlow install brings)."""
    import ml_dtypes  # optional: only a bfloat16 cell needs it

    return np.dtype(ml_dtypes.bfloat16)


class ForeignAdapter(NumpyAdapter):
    """A library's attention op behind the spec's SDPA, the suite's arrays NumPy (see the module
    docstring for what a subclass writes)."""

    capabilities = frozenset({"sdpa", "masks", "causal", "legacy_mask", "errors"})
    library_dtypes: tuple[str, ...] = ("float32",)

    def __init__(self, name: str):
        unknown = sorted(set(self.capabilities) - FOREIGN_CAPABILITIES)
        if unknown:
            raise ValueError(f"{name}: capabilities {unknown} are not carried by ForeignAdapter "
                             f"(it carries {sorted(FOREIGN_CAPABILITIES)})")
        super().__init__(name)
        self.backward = library_backward

    @property
    def differentiates_itself(self) -> bool:
        """Whether the subclass wrote :meth:`vjp` (the library's autodiff)."""
        return type(self).vjp is not ForeignAdapter.vjp

    # -- what a subclass writes ----------------------------------------------------------------
    def to_native(self, x: np.ndarray):
        """A NumPy array -> the library's array of the same dtype."""
        raise NotImplementedError(f"{self.name}: to_native is not written")

    def from_native(self, y) -> np.ndarray:
        """The library's array -> NumPy, same dtype."""
        raise NotImplementedError(f"{self.name}: from_native is not written")

    def native_attention(self, q, k, v, mask, scale: float):
        """Library arrays q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v), ``mask``
        (None, boolean True = may attend, or additive float, rank 4) -> output (B, h, L_q, d_v)."""
        raise NotImplementedError(f"{self.name}: native_attention is not written")

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` by the library's
        autodiff."""
        raise NotImplementedError(f"{self.name}: no automatic differentiation of its own")

    # -- the base's part -----------------------------------------------------------------------
    def dtypes(self, device: str) -> tuple[str, ...]:
        return tuple(self.library_dtypes)

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        return np.array(x, dtype=bfloat16() if dtype == "bfloat16" else dtype)

    def to_numpy(self, x) -> np.ndarray:
        x = np.asarray(x)
        return x.astype(np.float32) if x.dtype.name == "bfloat16" else x

    def as_native(self, x: np.ndarray):
        """:meth:`to_native` of ``x`` laid out C-contiguous (broadcast masks and transposed views
        included), the one way the base hands an array to the library."""
        return self.to_native(np.ascontiguousarray(x))

    def one_mask(self, like: np.ndarray, m: MaskArgs, len_q: int, len_k: int):
        """The call's folded masking arguments ``m`` (for L_q queries and L_k keys, in ``like``'s
        dtype: q of an SDPA call, the query of a module's) as the op's one ``mask`` (a library
        array, rank 4, broadcastable to (B, h, L_q, L_k)), or None: boolean where nothing is
        added, else additive with :meth:`blocked_fill` where blocked (the base carries no ALiBi,
        so ``m`` has none)."""
        allowed = mask_helpers.allowed_mask(len_q, len_k, like=like, mask=m.mask,
                                            key_padding_mask=m.key_padding_mask, causal=m.causal)
        additive = mask_helpers.additive_mask(like=like, bias=m.bias, legacy_mask=m.legacy_mask)
        if additive is None:
            return None if allowed is None else self.as_native(allowed)
        return self.as_native(mask_helpers.fill_blocked(
            allowed, like=like, additive=additive, fill=self.blocked_fill(like.dtype)))

    def blocked_fill(self, dtype) -> float:
        """The value of a blocked entry in an additive ``mask``: the dtype's lowest finite value
        (as a boolean mask is applied by most fused ops), so a row the call empties is one the op
        sees with every logit equally low, as with a boolean mask, and never -inf - -inf = NaN.
        Override to pass -inf."""
        if dtype.name == "bfloat16":
            import ml_dtypes  # NumPy's finfo does not know bfloat16

            return float(ml_dtypes.finfo(dtype).min)
        return float(np.finfo(dtype).min)

    def attention(self, q, k, v, masks: MaskArgs):
        mask = self.one_mask(q, masks, q.shape[2], k.shape[2])
        out = self.native_attention(self.as_native(q), self.as_native(k), self.as_native(v), mask,
                                    float(masks.scale))
        return self.from_native(out), None


def library_backward(backend: ForeignAdapter, q, k, v, d_output, d_lse, masks: MaskArgs, feats,
                     bias_grad: bool) -> dict:
    """``attention_vjp`` of a :class:`ForeignAdapter`: the call folded as the forward pass folds
    it, then ``backend.vjp`` over ``native_attention`` at the library's q, k, v -> ``{"q", "k",
    "v"}`` as NumPy."""
    if d_lse is not None or bias_grad or feats.cached or feats.sinks is not None:
        backend.unsupported("a gradient of the lse or the bias, or one with a KV cache or sinks")
    folded, _ = backend.fold_features(q, masks, feats, q.shape[2], k.shape[2])
    mask = backend.one_mask(q, folded, q.shape[2], k.shape[2])
    scale = float(folded.scale)
    primals = {name: backend.as_native(x) for name, x in (("q", q), ("k", k), ("v", v))}

    def forward(x):
        return backend.native_attention(x["q"], x["k"], x["v"], mask, scale)

    grads = backend.vjp(forward, primals, backend.as_native(d_output))
    return {name: backend.from_native(grads[name]) for name in primals}
