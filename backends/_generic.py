"""Multi-head attention written once, over a dozen array primitives each framework provides.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

:class:`ArrayBackend` validates (``_validate``), gathers the masking arguments of the call into one
:class:`MaskArgs`, builds the boolean "allowed" mask, and runs the :class:`Algorithm` it was
constructed with (read-only: :attr:`ArrayBackend.algorithm`):

* ``Algorithm.PER_HEAD``: the definition (MHA-1), head by head: slice the column block of each
  projection, attend, concatenate. ``split_heads``/``combine_heads`` slice and concatenate.
* ``Algorithm.BATCHED``: the optimisation (MHA-2): one GEMM per projection over ``B*L`` rows (for
  self-attention, ``query is key is value``, one GEMM against ``[W_q | W_k | W_v]``), reshape into
  heads, one batched attention over ``(B, h)``, reshape back, one output GEMM.

Compiled variants (``jax.jit``, ``tf.function``) wrap the algorithm they are given; they do not
choose another. A framework subclass supplies the primitives (``_matmul`` ... ``_constant``) and
conversions. The update primitives (``_iadd`` ... ``_ifill_masked``) receive a temporary the
algorithm owns and will not read again; by default they return a new array, and a framework with
mutable arrays (NumPy) may overwrite the temporary instead, which saves the allocations of the
(B, h, L_q, L_k) logits. The caller's arrays are never written (INPUT-1).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _features, _validate, sink_key
from ._base import CAPABILITIES, AttentionOutputs, Backend, MHAParams
from ._validate import Arg, Features, KVGeometry

LEGACY_MASK_VALUE = -1e9


class Algorithm(enum.Enum):
    """How an :class:`ArrayBackend` computes: fixed when the backend is constructed."""

    PER_HEAD = "perhead"  # the definition, head by head (MHA-1)
    BATCHED = "batched"   # all heads at once (MHA-2)


class MaskArgs(NamedTuple):
    """The arguments of one call that shape its logits, validated, in one value (internal form).

    mask: boolean, broadcastable to (B, h, L_q, L_k), True = may attend, or None;
    bias, legacy_mask: float, broadcastable to (B, h, L_q, L_k), or None;
    key_padding_mask: boolean (B, L_k) or None; causal: None, "top_left" or "bottom_right";
    scale: the logit scale as a float (the default 1/sqrt(d_k) already applied), or a scalar
    tensor inside a compiled function; softcap: the soft-cap c (SOFTCAP-1) as a float or scalar
    tensor, or None; alibi: the ALiBi bias (B, h, L_q, L_k) in the inputs' dtype, or None
    (ALIBI-1; a compiled variant adds it to ``bias``). With a KV cache L_k is L_K = L_past + L_k.
    """

    mask: Any = None
    bias: Any = None
    legacy_mask: Any = None
    key_padding_mask: Any = None
    causal: str | None = None
    scale: Any = None
    softcap: Any = None
    alibi: Any = None


class ArrayBackend(Backend):
    """A backend built from array primitives, computing with one :class:`Algorithm`.

    ``algorithm`` (an :class:`Algorithm` or its value, ``"perhead"`` / ``"batched"``) is fixed
    here; ``name`` defaults to ``"<framework_label>-<algorithm value>"``.
    """

    def __init__(self, algorithm: Algorithm | str, *, name: str | None = None):
        try:
            self._algorithm = Algorithm(algorithm)
        except ValueError:
            choices = [a.value for a in Algorithm]
            raise ValueError(f"argument 'algorithm' must be an Algorithm or one of {choices}, "
                             f"got {algorithm!r}") from None
        self.name = name or f"{self.framework_label}-{self._algorithm.value}"

    #: what only ``ArrayBackend.__init__`` sets: a subclass that redefines one is refused
    _ALGORITHM_MEMBERS = frozenset({"algorithm", "_algorithm", "_batched"})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        redefined = sorted(ArrayBackend._ALGORITHM_MEMBERS & set(vars(cls)))
        if redefined:
            raise TypeError(f"{cls.__name__} redefines {redefined}: choose the algorithm by "
                            f"passing it to ArrayBackend.__init__")

    def __setattr__(self, name, value):
        if name == "_algorithm" and "_algorithm" in vars(self):
            raise AttributeError(f"{self.name}: the algorithm is chosen once, at construction")
        super().__setattr__(name, value)

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm this backend runs (read-only: set once by ``__init__``; a subclass can
        neither reassign nor redefine it)."""
        return self._algorithm

    @property
    def _batched(self) -> bool:
        return self._algorithm is Algorithm.BATCHED

    framework_label = "array"
    #: grouped-query attention is part of the algorithms; gradients need a framework's autodiff
    #: (:meth:`_vjp`), so "grad" is claimed by the framework subclasses that supply it.
    capabilities = CAPABILITIES - {"grad"}

    # -- primitives a framework supplies -------------------------------------------------------
    def _shape(self, x) -> tuple[int, ...]:
        return tuple(int(n) for n in x.shape)

    def _dtype_name(self, x) -> str:
        raise NotImplementedError

    def _matmul(self, a, b):
        raise NotImplementedError

    def _transpose(self, x, axes):
        raise NotImplementedError

    def _reshape(self, x, shape):
        raise NotImplementedError

    def _exp(self, x):
        raise NotImplementedError

    def _max_last(self, x):
        """Max over the last axis, keeping it."""
        raise NotImplementedError

    def _sum_last(self, x):
        """Sum over the last axis, keeping it."""
        raise NotImplementedError

    def _where(self, cond, a, b: float):
        """Elementwise ``cond ? a : b`` with a Python float ``b``, in ``a``'s dtype."""
        raise NotImplementedError

    def _isfinite(self, x):
        raise NotImplementedError

    def _concat(self, xs, axis: int):
        raise NotImplementedError

    def _stack(self, xs, axis: int):
        raise NotImplementedError

    def _constant(self, array: np.ndarray, like):
        """A NumPy constant (a causal mask) as an array on ``like``'s device."""
        raise NotImplementedError

    def _constant_as(self, array: np.ndarray, like):
        """A float64 NumPy constant (the ALiBi bias) in ``like``'s dtype on its device."""
        raise NotImplementedError

    def _tanh(self, x):
        raise NotImplementedError

    def _to_float32(self, x):
        """``x`` converted to float32 (the soft-cap's working precision for float16/bfloat16)."""
        raise NotImplementedError

    def _cast_like(self, x, like):
        """``x`` converted to ``like``'s dtype."""
        raise NotImplementedError

    def _log(self, x):
        raise NotImplementedError

    def _take_keys(self, x, index):
        """x (B, ..., L, d), integer index (B, L') from :meth:`_constant` -> (B, ..., L', d):
        ``x[b, ..., index[b, j], :]`` (the present cache of a KV cache, CACHE-1)."""
        raise NotImplementedError

    # -- update primitives: ``x`` is a temporary the caller owns; may be overwritten -------------
    def _iadd(self, x, y):
        """``x + y`` (``y`` broadcasts to ``x``)."""
        return x + y

    def _isub(self, x, y):
        """``x - y`` (``y`` broadcasts to ``x``)."""
        return x - y

    def _imul(self, x, y):
        """``x * y`` (``y`` broadcasts to ``x``)."""
        return x * y

    def _idiv(self, x, y):
        """``x / y`` (``y`` broadcasts to ``x``)."""
        return x / y

    def _iexp(self, x):
        """``exp(x)``."""
        return self._exp(x)

    def _ifill_masked(self, x, allowed):
        """``x`` with ``-inf`` where the boolean ``allowed`` (broadcasting to ``x``) is False."""
        return self._where(allowed, x, -np.inf)

    # -- the four operations ---------------------------------------------------------------------
    def _arg(self, op: str, name: str, x) -> Arg | None:
        """``x`` as validation sees it; None stays None. Not an array: ValueError naming it."""
        if x is None:
            return None
        _validate.require_array(op, name, x)
        return Arg(name, self._shape(x), self._dtype_name(x))

    def split_heads(self, x, num_heads: int):
        op = "split_heads"
        num_heads = _validate.check_heads(op, self._arg(op, "x", x), num_heads)
        if self._batched:
            return self._split(x, num_heads)
        d = self._shape(x)[2] // num_heads
        return self._stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)

    def combine_heads(self, x):
        op = "combine_heads"
        _validate.check_heads(op, self._arg(op, "x", x))
        return self._combine(x)

    def _combine(self, x):
        if self._batched:
            b, h, length, d = self._shape(x)
            return self._reshape(self._transpose(x, (0, 2, 1, 3)), (b, length, h * d))
        return self._concat([x[:, i] for i in range(self._shape(x)[1])], axis=-1)

    def _mask_args(self, op: str, mask, bias, legacy_mask, key_padding_mask) -> dict[str, Arg | None]:
        """The mask arrays of a call as validation's keyword arguments."""
        return {n: self._arg(op, n, x) for n, x in (("mask", mask), ("bias", bias),
                                                    ("legacy_mask", legacy_mask),
                                                    ("key_padding_mask", key_padding_mask))}

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None, **features):
        masks, feats, _ = self._sdpa_call("scaled_dot_product_attention", q, k, v, mask, bias,
                                          legacy_mask, key_padding_mask, causal, scale, features)
        if not feats.in_use:
            return self._sdpa(q, k, v, masks)
        return self._sdpa_features(q, k, v, masks, feats)

    def _sdpa_call(self, op, q, k, v, mask, bias, legacy_mask, key_padding_mask, causal, scale,
                   features) -> tuple[MaskArgs, Features, _validate.Dims]:
        """Validate an attention call (``scaled_dot_product_attention`` and ``attention_vjp``)."""
        qa, ka, va = self._arg(op, "q", q), self._arg(op, "k", k), self._arg(op, "v", v)
        dims = self._sdpa_dims(qa, ka, va)
        kv = KVGeometry(dims.batch, ka.shape[1], dims.d_k, dims.d_v, f"k with shape {ka.shape}",
                        f"v with shape {va.shape}")
        feats = self._check_features(op, dims, features, qa.dtype, kv, causal)
        _validate.check_masks(op, dims, qa.dtype, causal=causal, len_past=feats.len_past,
                              **self._mask_args(op, mask, bias, legacy_mask, key_padding_mask))
        masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                         self._scale(op, scale, dims.d_k))
        return masks, feats, dims

    # -- spec 1.3: the backward pass of attention (GRAD-3..9); the math lives in np_vjp /
    #    autodiff_vjp, this is the glue ---------------------------------------------------------
    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad: bool = False,
                      mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                      scale=None, **features):
        op = "scaled_dot_product_attention"
        masks, feats, dims = self._sdpa_call(op, q, k, v, mask, bias, legacy_mask,
                                             key_padding_mask, causal, scale, features)
        _validate.check_cotangents(op, dims, self._arg(op, "d_output", d_output),
                                   self._arg(op, "d_lse", d_lse), self._shape(q)[1],
                                   bias_grad=bias_grad, bias=bias, backend=self)
        return self._attention_vjp(q, k, v, d_output, d_lse, masks, feats, bool(bias_grad))

    def _attention_vjp(self, q, k, v, d_output, d_lse, masks: MaskArgs, feats: Features,
                       bias_grad: bool) -> dict:
        """The gradients of a validated call: the framework's autodiff (:meth:`_vjp`) through
        :meth:`_sdpa_features` (NumPy backends override it with a hand-written backward)."""
        from . import autodiff_vjp

        return autodiff_vjp.attention_vjp(self, q, k, v, d_output, d_lse, masks, feats, bias_grad)

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, **features):
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads, features)
        if not call.features.in_use:
            return self._mha(query, key, value, call.params, call.num_heads, call.masks,
                             **call.grouping)
        return self._mha_features(query, key, value, call)

    def _sdpa_dims(self, q: Arg, k: Arg, v: Arg) -> _validate.Dims:
        """The validated sizes of an attention call (``_validate.sdpa_dims``)."""
        return _validate.sdpa_dims(q, k, v, gqa="gqa" in self.capabilities)

    def _scale(self, op: str, scale, d_k: int):
        """The call's logit scale as a float: ``scale`` validated (ERR-10), or the default
        1/sqrt(d_k) (SDPA-2)."""
        _validate.check_scale(op, scale)
        return _default_scale(scale, d_k)

    def _check_features(self, op: str, dims, features: dict, dtype: str, kv: KVGeometry,
                        causal) -> Features:
        """The spec 1.2 keyword arguments of a call, validated (``_validate.check_features``)."""
        return _validate.check_features(op, dims, features, dtype=dtype, kv=kv, causal=causal,
                                        backend=self,
                                        describe=lambda name, x: self._arg(op, name, x))

    def _mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                  key_padding_mask, causal, scale, num_kv_heads, features=None) -> "MHACall":
        """Validate a multi-head call (``multi_head_attention`` and ``mha_vjp``)."""
        op = "multi_head_attention"
        params = _params(op, params)
        if num_kv_heads is not None and "gqa" not in self.capabilities:
            raise NotImplementedError(f"{self.name}: grouped-query attention (num_kv_heads) is not "
                                      f"supported")
        query_arg = self._arg(op, "query", query)
        dims = _validate.mha_dims(
            query_arg, self._arg(op, "key", key), self._arg(op, "value", value),
            {n: self._arg(op, n, p) for n, p in params._asdict().items()}, num_heads=num_heads,
            num_kv_heads=num_kv_heads)
        g = dims.heads if num_kv_heads is None else _validate.as_int(num_kv_heads)
        projected = (dims.batch, g, dims.len_k)
        kv = KVGeometry(dims.batch, g, dims.d_k, dims.d_v,
                        f"the projected keys (B, g, L_k, d_k) = {(*projected, dims.d_k)}",
                        f"the projected values (B, g, L_k, d_v) = {(*projected, dims.d_v)}")
        feats = self._check_features(op, dims, features or {}, query_arg.dtype, kv, causal)
        _validate.check_masks(op, dims, query_arg.dtype, causal=causal, len_past=feats.len_past,
                              **self._mask_args(op, mask, bias, legacy_mask, key_padding_mask))
        masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                         self._scale(op, scale, dims.d_k))
        grouping = {} if num_kv_heads is None else {"num_kv_heads": g}
        return MHACall(params, dims.heads, masks, grouping, feats)

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """Gradients of ``sum(output * cotangent)`` (GRAD) by the framework's autodiff through the
        same ``_mha`` forward: ``query``, ``key``, ``value`` and the parameters present."""
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        primals = {"query": query, "key": key, "value": value,
                   **{n: t for n, t in call.params._asdict().items() if t is not None}}

        def forward(x):
            p = MHAParams(**{n: x.get(n) for n in MHAParams._fields})
            return self._vjp_forward(x["query"], x["key"], x["value"], p, call.num_heads,
                                     call.masks, **call.grouping)[0]

        return self._vjp(forward, primals, cotangent)

    def _vjp_forward(self, *args, **kwargs):
        """The forward :meth:`mha_vjp` differentiates: ``_mha`` (an attention-only adapter uses
        :meth:`_mha_over_sdpa`, its own kernel between the projections)."""
        return self._mha(*args, **kwargs)

    def _mha_over_sdpa(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs):
        """Multi-head attention as projections, split_heads, ``self._sdpa``, combine_heads and the
        output projection (the batched form, MHA-2), whatever ``_sdpa`` is."""
        q, k, v = (self._split(self._linear(x, w, b), num_heads)
                   for x, w, b in ((query, p.w_q, p.b_q), (key, p.w_k, p.b_k),
                                   (value, p.w_v, p.b_v)))
        out, weights = self._sdpa(q, k, v, masks)
        b, h, length, d = self._shape(out)
        out = self._reshape(self._transpose(out, (0, 2, 1, 3)), (b, length, h * d))
        return self._linear(out, p.w_o, p.b_o), weights

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` (a framework's autodiff)."""
        raise NotImplementedError(f"{self.name}: no automatic differentiation (capability 'grad')")

    # -- spec 1.2 feature calls (validated; AttentionOutputs with lse or a cache) -----------------
    def _sdpa_features(self, q, k, v, masks: MaskArgs, feats: Features):
        """A validated attention call with spec 1.2 features: the structural mask, ALiBi and
        soft-cap folded into ``masks``, the present cache laid out (CACHE-1), then ``_sdpa_ext``."""
        len_q, len_k = self._shape(q)[2], self._shape(k)[2]
        plan = _features.plan(feats, batch=self._shape(q)[0], len_q=len_q, len_k=len_k,
                              causal=masks.causal)
        masks = self._feature_masks(q, masks, feats, plan, len_q, feats.len_past + len_k)
        present = (None, None)
        if feats.cached:
            cache = self._cache(feats, plan, q)
            k = self._present(cache.past_key, k, cache.index)
            v = self._present(cache.past_value, v, cache.index)
            present = (k, v)
        if feats.sinks is not None:  # SINK-1: the sink as one more key (spec 1.3, sink_key)
            k, v, masks = sink_key.with_sink_key(self, q, k, v, masks, feats.sinks)
        out, weights, lse = self._sdpa_ext(q, k, v, masks, feats.lse)
        if feats.sinks is not None:
            weights = sink_key.without_sink_column(weights)
        return self._outputs(feats, AttentionOutputs(out, weights, lse, *present), len_k, q)

    def _mha_features(self, query, key, value, call: "MHACall"):
        """A validated multi-head call with spec 1.2 features (as :meth:`_sdpa_features`; the
        cache holds projected keys and values, so ``_mha_ext`` lays out the present cache)."""
        feats = call.features
        len_q, len_k = self._shape(query)[1], self._shape(key)[1]
        plan = _features.plan(feats, batch=self._shape(query)[0], len_q=len_q, len_k=len_k,
                              causal=call.masks.causal)
        masks = self._feature_masks(query, call.masks, feats, plan, len_q, feats.len_past + len_k)
        cache = self._cache(feats, plan, query) if feats.cached else None
        res = self._mha_ext(query, key, value, call.params, call.num_heads, masks,
                            num_kv_heads=call.grouping.get("num_kv_heads"), lse=feats.lse,
                            cache=cache)
        return self._outputs(feats, res, len_k, query)

    def _feature_masks(self, like, masks: MaskArgs, feats: Features, plan: _features.Plan,
                       len_q: int, len_all: int) -> MaskArgs:
        """``masks`` with every boolean condition in one ``mask`` (B|1, h|1, L_q, L_K): mask,
        key padding, causal and the structural mask; the ALiBi bias and the soft-cap added."""
        allowed = self._combine_masks(len_q, len_all, like, masks.mask, masks.key_padding_mask,
                                      plan.causal)
        if plan.allowed is not None:
            structural = self._constant(plan.allowed, like)
            allowed = structural if allowed is None else allowed & structural
        alibi = None if plan.alibi is None else self._constant_as(plan.alibi, like)
        return masks._replace(mask=allowed, key_padding_mask=None, causal=None,
                              softcap=feats.softcap, alibi=alibi)

    def _cache(self, feats: Features, plan: _features.Plan, like) -> _features.Cache:
        index = None if plan.index is None else self._constant(plan.index, like)
        return _features.Cache(feats.past_key, feats.past_value, index)

    def _present(self, past, new, index):
        """CACHE-1: past (B, ..., L_past, d), new (B, ..., L_k, d) -> the present cache (B, ...,
        L_past + L_k, d): the valid past, the new entries, zeros; ``index`` None: a full cache."""
        if index is None:
            return self._concat([past, new], axis=-2)
        shape = self._shape(new)
        zero = self._full((*shape[:-2], 1, shape[-1]), 0.0, new)
        return self._take_keys(self._concat([past, new, zero], axis=-2), index)

    def _outputs(self, feats: Features, res: AttentionOutputs, len_k: int, like):
        """What a feature call returns: (output, weights), or AttentionOutputs with lse or a cache
        (present_lengths = past_lengths + L_k as the backend's int64 array)."""
        if not feats.outputs:
            return res.output, res.weights
        lengths = None
        if feats.cached:
            lengths = self._constant(feats.past_lengths + len_k, like)
        return res._replace(lse=res.lse if feats.lse else None, present_lengths=lengths)

    # -- the algorithms (unvalidated; compiled variants wrap these) -----------------------------
    def _sdpa(self, q, k, v, masks: MaskArgs):
        """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v) -> (out, weights): what
        ``scaled_dot_product_attention`` runs after validation (compiled variants and native
        adapters override it)."""
        return self._attention(q, k, v, masks)[:2]

    def _sdpa_ext(self, q, k, v, masks: MaskArgs, lse: bool):
        """:meth:`_sdpa` of a spec 1.2 call: k, v may have g heads (GQA-1), ``masks`` may carry a
        soft-cap and ALiBi; returns (out, weights, lse (B, h, L_q) or None)."""
        return self._attention(q, k, v, masks, lse)

    def _attention(self, q, k, v, masks: MaskArgs, lse: bool | None = None):
        """The attention of the algorithm (shapes as :meth:`_sdpa`, k and v with g heads, g
        dividing h: query head i uses key/value head i // (h / g), GQA-1) -> (out, weights, lse).
        ``lse`` None: a spec 1.1 call through :meth:`_attend` (lse None); a bool: through
        :meth:`_attend_ext`. The batched multi-head algorithm calls it directly, so a compiled
        ``_mha`` does not nest a compiled ``_sdpa``."""
        attend = self._attend_fn(masks, lse)
        allowed = self._allowed(q, k, masks.mask, masks.key_padding_mask, masks.causal)
        additive = self._additive_terms(masks)
        heads, group = self._shape(q)[1], self._shape(q)[1] // self._shape(k)[1]
        if self._batched:
            if group > 1:
                k, v = self._repeat_heads(k, group), self._repeat_heads(v, group)
            return attend(q, k, v, allowed, additive)
        outs, weights, lses = self._attend_heads(
            heads, lambda i: (q[:, i], k[:, i // group], v[:, i // group]), allowed, additive,
            attend)
        return self._stack(outs, axis=1), weights, lses

    def _repeat_heads(self, x, group: int):
        """(B, g, L, d) -> (B, g * group, L, d): each head repeated ``group`` times in place."""
        return self._stack([x[:, i // group] for i in range(self._shape(x)[1] * group)], axis=1)

    def _attend_fn(self, masks: MaskArgs, lse: bool | None):
        """Attention over the last two axes as ``f(q, k, v, allowed, additive) -> (out, weights,
        lse)``: :meth:`_attend` for a spec 1.1 call (``lse`` None), else :meth:`_attend_ext`."""
        if lse is None:
            return lambda q, k, v, allowed, additive: (
                *self._attend(q, k, v, allowed, additive, masks.scale), None)
        return lambda q, k, v, allowed, additive: self._attend_ext(
            q, k, v, allowed, additive, masks.scale, masks.softcap, lse)

    def _mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
             num_kv_heads: int | None = None):
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) -> (out, weights).

        ``num_kv_heads`` g (MHA-6, None: g = h): query head i uses key/value head i // (h / g)."""
        return self._mha_algorithm(query, key, value, p, num_heads, masks, num_kv_heads)[:2]

    def _mha_ext(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                 num_kv_heads: int | None = None, lse: bool = False,
                 cache: _features.Cache | None = None) -> AttentionOutputs:
        """:meth:`_mha` of a spec 1.2 call: ``masks`` may carry a soft-cap and ALiBi; ``cache``
        the projected past keys and values. Returns AttentionOutputs(out, weights, lse or None,
        present_key (B, g, L_K, d_k) or None, present_value (B, g, L_K, d_v) or None)."""
        return AttentionOutputs(*self._mha_algorithm(query, key, value, p, num_heads, masks,
                                                     num_kv_heads, lse, cache))

    def _mha_algorithm(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                       num_kv_heads: int | None, lse: bool | None = None,
                       cache: _features.Cache | None = None):
        """-> (out, weights, lse, present_key, present_value) by the backend's algorithm
        (``lse`` None: a spec 1.1 call, see :meth:`_attention`)."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        algorithm = self._mha_batched if self._batched else self._mha_per_head
        return algorithm(query, key, value, p, num_heads, masks, g, lse, cache)

    def _mha_batched(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                     g: int, lse: bool | None = None, cache: _features.Cache | None = None):
        """MHA-2: project once, split into heads (g key/value heads, each repeated for its h / g
        query heads), one batched attention, combine, project. With ``cache``, the projected keys
        and values join the cache's first (CACHE-1)."""
        if g == num_heads:
            q, k, v = self._project_qkv(query, key, value, p)
        else:
            q, k, v = (self._linear(query, p.w_q, p.b_q), self._linear(key, p.w_k, p.b_k),
                       self._linear(value, p.w_v, p.b_v))
        q, k, v = self._split(q, num_heads), self._split(k, g), self._split(v, g)
        present = (None, None)
        if cache is not None:
            k = self._present(cache.past_key, k, cache.index)
            v = self._present(cache.past_value, v, cache.index)
            present = (k, v)
        out, weights, lse = self._attention(q, k, v, masks, lse)
        return self._linear(self._combine(out), p.w_o, p.b_o), weights, lse, *present

    def _mha_per_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                      g: int, lse: bool | None = None, cache: _features.Cache | None = None):
        """MHA-1: head i projects with its column block of W_q and key/value head i // (h / g)'s
        blocks of W_k and W_v, attends, and the heads are concatenated before W_o. With
        ``cache``, key/value head j's projections join the cache's head j first (CACHE-1)."""
        group = num_heads // g
        d_k = self._shape(p.w_q)[1] // num_heads
        d_v = self._shape(p.w_v)[1] // g

        def kv_head(j):
            kc, vc = slice(j * d_k, (j + 1) * d_k), slice(j * d_v, (j + 1) * d_v)
            k = self._linear(key, p.w_k[:, kc], _columns(p.b_k, kc))
            v = self._linear(value, p.w_v[:, vc], _columns(p.b_v, vc))
            if cache is None:
                return k, v
            return (self._present(cache.past_key[:, j], k, cache.index),
                    self._present(cache.past_value[:, j], v, cache.index))

        kv_heads = [kv_head(j) for j in range(g)]

        def head(i):
            qc = slice(i * d_k, (i + 1) * d_k)
            return (self._linear(query, p.w_q[:, qc], _columns(p.b_q, qc)), *kv_heads[i // group])

        allowed = self._allowed_mha(query, key, masks.mask, masks.key_padding_mask, masks.causal)
        heads, weights, lse = self._attend_heads(num_heads, head, allowed,
                                                 self._additive_terms(masks),
                                                 self._attend_fn(masks, lse))
        present = (None, None)
        if cache is not None:
            present = tuple(self._stack([kv[n] for kv in kv_heads], axis=1) for n in (0, 1))
        return self._linear(self._concat(heads, axis=-1), p.w_o, p.b_o), weights, lse, *present

    def _attend_heads(self, num_heads: int, head_inputs: Callable[[int], tuple], allowed,
                      additive, attend):
        """Attention head by head: ``head_inputs(i)`` gives head i's (q, k, v), ``attend`` is
        :meth:`_attend_fn`'s; masks broadcast to (B, h, L_q, L_k) are cut per head. Returns the
        list of head outputs, the weights stacked to (B, h, L_q, L_k) and the log-sum-exps
        stacked to (B, h, L_q) (None when ``attend`` gives none)."""
        allowed = _as_rank4(self, allowed)
        additive = [_as_rank4(self, t) for t in additive]
        outs, weights, lses = [], [], []
        for i in range(num_heads):
            o, w, lse = attend(*head_inputs(i), _head(allowed, i), [_head(t, i) for t in additive])
            outs.append(o)
            weights.append(w)
            lses.append(lse)
        lse = None if lses[0] is None else self._stack(lses, axis=1)
        return outs, self._stack(weights, axis=1), lse

    def _project_qkv(self, query, key, value, p: MHAParams):
        """The three input projections of the batched variant. For self-attention (``query is key
        is value``) with all or none of b_q, b_k, b_v: one GEMM against the column concatenation
        ``[W_q | W_k | W_v]`` (built per call: a copy of the weights, cheap next to the GEMM), then
        column slices of the result."""
        biases = (p.b_q, p.b_k, p.b_v)
        same_bias = all(b is None for b in biases) or all(b is not None for b in biases)
        if not (query is key and key is value and same_bias):
            return (self._linear(query, p.w_q, p.b_q), self._linear(key, p.w_k, p.b_k),
                    self._linear(value, p.w_v, p.b_v))
        w = self._concat([p.w_q, p.w_k, p.w_v], axis=1)
        b = None if p.b_q is None else self._concat(list(biases), axis=0)
        qkv = self._linear(query, w, b)
        n_qk, n_v = self._shape(p.w_q)[1], self._shape(p.w_v)[1]
        return qkv[..., :n_qk], qkv[..., n_qk:2 * n_qk], qkv[..., 2 * n_qk:2 * n_qk + n_v]

    def _split(self, x, num_heads):
        b, length, width = self._shape(x)
        return self._transpose(self._reshape(x, (b, length, num_heads, width // num_heads)),
                               (0, 2, 1, 3))

    def _linear(self, x, w, b):
        """x (..., in) @ w (in, out) + b (out,); the batched algorithm runs one 2-D GEMM."""
        if self._batched:
            lead = self._shape(x)[:-1]
            y = self._reshape(self._matmul(self._reshape(x, (-1, self._shape(x)[-1])), w),
                              (*lead, self._shape(w)[1]))
        else:
            y = self._matmul(x, w)
        return y if b is None else self._iadd(y, b)

    def _attend(self, q, k, v, allowed, additive, scale):
        """Attention over the last two axes; any leading axes. allowed is boolean or None."""
        return self._attend_ext(q, k, v, allowed, additive, scale, None, False)[:2]

    def _attend_ext(self, q, k, v, allowed, additive, scale, softcap, lse: bool):
        """:meth:`_attend` with the soft-cap c (None: none) applied after the scale and before
        the additive terms and masks (SOFTCAP-1), and, with ``lse``, the per-row log-sum-exp of
        the final logits over the allowed keys, -inf for an empty row (LSE-1) -> (out, weights,
        lse (..., L_q) or None)."""
        logits = self._matmul(q, self._transpose(k, (*range(len(self._shape(k)) - 2), -1, -2)))
        if self._shape(k)[-2] == 0:  # L_k = 0: every row is fully masked (SHAPE-4, MASK-9)
            out = self._matmul(logits, v)  # (..., L_q, 0) @ (..., 0, d_v) = zeros
            if not lse:
                return out, logits, None
            zeros = self._sum_last(logits)
            return out, logits, self._drop_last(self._where(zeros != 0, zeros, -np.inf))
        logits = self._imul(logits, scale)
        if softcap is not None:
            logits = self._soft_cap(logits, softcap)
        for term in additive:
            logits = self._iadd(logits, term)
        if allowed is not None:
            logits = self._ifill_masked(logits, allowed)
        row_max = self._max_last(logits)
        row_max = self._where(self._isfinite(row_max), row_max, 0.0)
        e = self._iexp(self._isub(logits, row_max))
        total = self._sum_last(e)
        nonempty = total != 0
        safe_total = self._where(nonempty, total, 1.0)
        weights = self._idiv(e, safe_total)
        out = self._matmul(weights, v)
        if not lse:
            return out, weights, None
        return out, weights, self._drop_last(
            self._where(nonempty, row_max + self._log(safe_total), -np.inf))

    def _soft_cap(self, logits, softcap):
        """``c·tanh(S/c)`` (SOFTCAP-1). float16/bfloat16 logits are capped in float32 and rounded
        back once: c itself may lie outside their range (c = 1e6 is inf in float16, and
        ``S/inf · inf`` is NaN), and the extra rounding of ``S/c`` would add error NUM-3 does not
        budget for."""
        if self._dtype_name(logits) in ("float16", "bfloat16"):
            wide = self._to_float32(logits)
            return self._cast_like(self._imul(self._tanh(self._idiv(wide, softcap)), softcap),
                                   logits)
        return self._imul(self._tanh(self._idiv(logits, softcap)), softcap)

    def _drop_last(self, x):
        """(..., n, 1) -> (..., n)."""
        return self._reshape(x, self._shape(x)[:-1])

    def _additive(self, bias, legacy_mask):
        terms = [] if bias is None else [bias]
        if legacy_mask is not None:
            terms.append(legacy_mask * LEGACY_MASK_VALUE)
        return terms

    def _additive_terms(self, masks: MaskArgs):
        """The terms added to the logits: bias, legacy mask (:meth:`_additive`) and ALiBi."""
        terms = self._additive(masks.bias, masks.legacy_mask)
        return terms if masks.alibi is None else [*terms, masks.alibi]

    def _allowed(self, q, k, mask, key_padding_mask, causal):
        """Boolean broadcastable to (B, h, L_q, L_k), or None when nothing is masked."""
        return self._combine_masks(self._shape(q)[2], self._shape(k)[2], q, mask, key_padding_mask,
                                   causal)

    def _allowed_mha(self, query, key, mask, key_padding_mask, causal):
        return self._combine_masks(self._shape(query)[1], self._shape(key)[1], query, mask,
                                   key_padding_mask, causal)

    def _full(self, shape, value: float, like):
        """An array of ``shape`` filled with ``value`` in ``like``'s dtype and device."""
        raise NotImplementedError

    def _canonical_masks(self, like, full, masks: MaskArgs) -> MaskArgs:
        """All masking as full (B, h, L_q, L_k) arrays: one boolean mask (key padding and causal
        folded in, so both become None) and one bias (zeros when absent, ALiBi added); the scale
        and soft-cap are kept.
        Compiled variants call this before compiling so that every call of one shape and dtype has
        the same signature and compiles once."""
        allowed = self._combine_masks(full[2], full[3], like, masks.mask, masks.key_padding_mask,
                                      masks.causal)
        ones = self._constant(np.ones(full, dtype=bool), like)
        zeros = self._full(full, 0.0, like)
        bias = zeros if masks.bias is None else zeros + masks.bias
        return MaskArgs(mask=ones if allowed is None else ones & allowed,
                        bias=bias if masks.alibi is None else bias + masks.alibi,
                        legacy_mask=None if masks.legacy_mask is None else zeros + masks.legacy_mask,
                        scale=masks.scale, softcap=masks.softcap)

    def _combine_masks(self, len_q, len_k, like, mask, key_padding_mask, causal):
        allowed = mask
        if key_padding_mask is not None:
            b = self._shape(key_padding_mask)[0]
            kpm = self._reshape(key_padding_mask, (b, 1, 1, len_k))
            allowed = kpm if allowed is None else allowed & kpm
        if causal is not None:
            offset = 0 if causal == "top_left" else len_k - len_q
            tri = np.arange(len_k)[None, :] <= np.arange(len_q)[:, None] + offset
            tri = self._constant(tri, like)
            allowed = tri if allowed is None else allowed & tri
        return allowed


class MHACall(NamedTuple):
    """A validated multi-head call: the parameters as :class:`MHAParams`, ``num_heads`` as an int,
    the masking arguments, ``{"num_kv_heads": g}`` for grouped-query attention (MHA-6) or
    ``{}`` (passed to ``_mha`` as keywords only when given), and the spec 1.2 features."""

    params: MHAParams
    num_heads: int
    masks: MaskArgs
    grouping: dict
    features: Features


def _default_scale(scale, d_k: int) -> float:
    """The validated ``scale`` as a float, or the default 1/sqrt(d_k) (SDPA-2)."""
    return 1.0 / float(np.sqrt(d_k)) if scale is None else _validate.as_real(scale)


def _params(op: str, params) -> MHAParams:
    """``params`` as :class:`MHAParams`: a sequence of the four weights and up to four biases."""
    if isinstance(params, (str, bytes)) or not isinstance(params, (tuple, list)) \
            or not 4 <= len(params) <= len(MHAParams._fields):
        _validate.fail(op, f"argument 'params' must be MHAParams(w_q, w_k, w_v, w_o[, b_q, b_k, "
                           f"b_v, b_o]), got {type(params).__name__}")
    return MHAParams(*params)


def _columns(b, cols: slice):
    """Columns ``cols`` of a bias, or None for an absent bias."""
    return None if b is None else b[cols]


def _as_rank4(backend: ArrayBackend, m):
    """Left-pad a mask/bias broadcastable to (B, h, L_q, L_k) to rank 4."""
    if m is None:
        return None
    shape = backend._shape(m)
    return backend._reshape(m, (1,) * (4 - len(shape)) + shape) if len(shape) < 4 else m


def _head(m, i: int):
    """Head ``i``'s part of a rank-4 mask/bias: (B|1, h|1, L_q|1, L_k|1) -> (B|1, L_q|1, L_k|1)."""
    if m is None:
        return None
    return m[:, i] if m.shape[1] > 1 else m[:, 0]
