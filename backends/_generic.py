"""The validated front door of an array backend: check a call, fold its features, run an algorithm.

Axis legend: B batch, L_q / L_k lengths (L_K = L_past + L_k with a KV cache), h heads, g key/value
heads, d_model query width, k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out
output width.

:class:`ArrayBackend` validates (``_validate``), gathers the masking arguments of the call into one
:class:`MaskArgs`, and hands the call to one hook per operation, the same for spec 1.1 and 1.2
calls:

* ``_sdpa(q, k, v, masks, features) -> AttentionOutputs`` and
* ``_mha(query, key, value, params, num_heads, masks, features, num_kv_heads) -> AttentionOutputs``

(``features``: the validated :class:`~._validate.Features`, empty for a 1.1 call). By default
they fold the features into the masks (the structural mask, ALiBi, the soft-cap: the public
:meth:`~ArrayBackend.fold_features`, which the backward passes use too), lay out a KV cache, and
run the :mod:`.algorithms` object chosen at construction through
``_attention`` / ``_multi_head``: the one function per operation that the compiled variants
(``jax.jit``, ``tf.function``) wrap. The primitives come from :class:`~.primitives.ArrayPrimitives`,
implemented by each framework module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _features, _validate, algorithms, serving, sink_key
from ._base import CAPABILITIES, AttentionOutputs, Backend, MHAParams
from ._validate import Arg, Features, KVGeometry
from .algorithms import Algorithm, Cache
from .primitives import ArrayPrimitives

LEGACY_MASK_VALUE = -1e9


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


class ArrayBackend(ArrayPrimitives, Backend):
    """A backend built from array primitives, computing with one :class:`Algorithm`.

    ``algorithm`` (an :class:`Algorithm`, its value ``"perhead"`` / ``"batched"``, or an
    algorithm object: an instance of :class:`.algorithms.Batched` or :class:`.algorithms.PerHead`,
    or of a subclass) is fixed here: the algorithm object is chosen once; ``name`` defaults to
    ``"<framework_label>-<algorithm value>"``.
    """

    framework_label = "array"
    #: grouped-query attention is part of the algorithms; gradients need a framework's autodiff
    #: (:meth:`_vjp`), so "grad" is claimed by the framework subclasses that supply it.
    capabilities = CAPABILITIES - {"grad"}

    def __init__(self, algorithm, *, name: str | None = None):
        if isinstance(algorithm, (algorithms.Batched, algorithms.PerHead)):
            self._algorithm = algorithm  # an algorithm object (a variant of one of the two)
        else:
            try:
                self._algorithm = algorithms.ALGORITHMS[Algorithm(algorithm)]
            except ValueError:
                choices = [a.value for a in Algorithm]
                raise ValueError(f"argument 'algorithm' must be an Algorithm or one of {choices}, "
                                 f"got {algorithm!r}") from None
        self.name = name or f"{self.framework_label}-{self._algorithm.kind.value}"

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm this backend runs (read-only: chosen once, at construction)."""
        return self._algorithm.kind

    # -- the four operations (validated) ---------------------------------------------------------
    def _arg(self, op: str, name: str, x) -> Arg | None:
        """``x`` as validation sees it; None stays None. Not an array: ValueError naming it."""
        if x is None:
            return None
        _validate.require_array(op, name, x)
        return Arg(name, self._shape(x), self._dtype_name(x))

    def split_heads(self, x, num_heads: int):
        op = "split_heads"
        num_heads = _validate.check_heads(op, self._arg(op, "x", x), num_heads)
        return self._algorithm.split(self, x, num_heads)

    def combine_heads(self, x):
        op = "combine_heads"
        _validate.check_heads(op, self._arg(op, "x", x))
        return self._algorithm.combine(self, x)

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None, **features):
        masks, feats, _ = self._sdpa_call("scaled_dot_product_attention", q, k, v, mask, bias,
                                          legacy_mask, key_padding_mask, causal, scale, features)
        return self._outputs(feats, self._sdpa(q, k, v, masks, feats), k, q)

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
        :meth:`_sdpa` (NumPy backends override it with a hand-written backward)."""
        from . import autodiff_vjp

        return autodiff_vjp.attention_vjp(self, q, k, v, d_output, d_lse, masks, feats, bias_grad)

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, **features):
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads, features)
        res = self._mha(query, key, value, call.params, call.num_heads, call.masks, call.features,
                        call.num_kv_heads)
        return self._outputs(call.features, res, key, query)

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """Gradients of ``sum(output * cotangent)`` (GRAD) by the framework's autodiff through the
        computation of the forward call (:meth:`_multi_head`; a gradient call has no spec 1.2
        features): ``query``, ``key``, ``value`` and the parameters present."""
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        primals = {"query": query, "key": key, "value": value,
                   **{n: t for n, t in call.params._asdict().items() if t is not None}}

        def forward(x):
            p = MHAParams(**{n: x.get(n) for n in MHAParams._fields})
            return self._multi_head(x["query"], x["key"], x["value"], p, call.num_heads,
                                    call.masks, call.num_kv_heads)[0]

        return self._vjp(forward, primals, cotangent)

    # -- spec 1.4: merging partial states (MERGE), the paged cache (PAGE); the algorithms live in
    #    serving ------------------------------------------------------------------------------------
    merge_conventions = serving.MERGE_CONVENTIONS

    def merge_states(self, outputs, lses, *, sinks=None, lse_base: str = "e",
                     empty_lse: str = "-inf", lse_layout: str = "batch"):
        return serving.merge_states(self, outputs, lses, sinks=sinks, lse_base=lse_base,
                                    empty_lse=empty_lse, lse_layout=lse_layout)

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal: bool = False, scale=None):
        return serving.paged_attention(self, q, k_pages, v_pages, block_table, seq_lens,
                                       query_start_loc, causal=causal, scale=scale)

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        return serving.write_pages(self, k_pages, v_pages, k, v, slot_mapping)

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` (a framework's autodiff)."""
        raise NotImplementedError(f"{self.name}: no automatic differentiation (capability 'grad')")

    # -- validation --------------------------------------------------------------------------------
    def _mask_args(self, op: str, mask, bias, legacy_mask, key_padding_mask) -> dict[str, Arg | None]:
        """The mask arrays of a call as validation's keyword arguments."""
        return {n: self._arg(op, n, x) for n, x in (("mask", mask), ("bias", bias),
                                                    ("legacy_mask", legacy_mask),
                                                    ("key_padding_mask", key_padding_mask))}

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
        return MHACall(params, dims.heads, masks, None if num_kv_heads is None else g, feats)

    # -- one hook per operation (validated input; 1.1 and 1.2 calls alike) -------------------------
    def _sdpa(self, q, k, v, masks: MaskArgs, feats: Features) -> AttentionOutputs:
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> AttentionOutputs(out,
        weights, lse or None, present_key, present_value): the features folded into ``masks``
        (:meth:`fold_features`), the present cache laid out (CACHE-1), then :meth:`_attention`."""
        masks, index = self._folded(q, masks, feats, self._shape(q)[2], self._shape(k)[2])
        kept = (None, None)
        if feats.cached:
            k = algorithms.present(self, feats.past_key, k, index)
            v = algorithms.present(self, feats.past_value, v, index)
            kept = (k, v)
        out, weights, lse = self._attention_with_sinks(q, k, v, masks, feats.lse, feats.sinks)
        return AttentionOutputs(out, weights, lse, *kept)

    def _mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
             feats: Features, num_kv_heads: int | None = None) -> AttentionOutputs:
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) ->
        AttentionOutputs(out (B, L_q, d_out), weights, lse or None, present_key (B, g, L_K, d_k)
        or None, present_value or None); ``num_kv_heads`` g (MHA-6, None: g = h): query head i
        uses key/value head i // (h / g). The features folded as in :meth:`_sdpa`; a cache holds
        projected keys and values, so the algorithm lays out the present cache."""
        masks, index = self._folded(query, masks, feats, self._shape(query)[1],
                                    self._shape(key)[1])
        cache = Cache(feats.past_key, feats.past_value, index) if feats.cached else None
        return AttentionOutputs(*self._multi_head(query, key, value, p, num_heads, masks,
                                                  num_kv_heads, feats.lse, cache))

    # -- the computation: what the compiled variants wrap ------------------------------------------
    def _attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        """-> (out, weights, lse or None) by the algorithm (``masks`` already folded)."""
        return self._algorithm.attention(self, q, k, v, masks, lse)

    def _attention_with_sinks(self, q, k, v, masks: MaskArgs, lse: bool, sinks):
        """:meth:`_attention` with the sinks (h,) (SINK-1, spec 1.3; None: none) as one more key
        whose weights column is dropped again (:mod:`.sink_key`)."""
        if sinks is None:
            return self._attention(q, k, v, masks, lse)
        k, v, masks = sink_key.with_sink_key(self, q, k, v, masks, sinks)
        out, weights, row_lse = self._attention(q, k, v, masks, lse)
        return out, sink_key.without_sink_column(weights), row_lse

    def _multi_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                    num_kv_heads: int | None = None, lse: bool = False, cache: Cache | None = None):
        """-> (out, weights, lse, present_key, present_value) by the algorithm."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        return self._algorithm.mha(self, query, key, value, p, num_heads, masks, g, lse, cache)

    def _attend(self, q, k, v, allowed, additive, masks: MaskArgs, lse: bool = False):
        """The attention kernel over the last two axes (:func:`.algorithms.attend`) -> (out,
        weights, lse or None); both algorithms call it."""
        return algorithms.attend(self, q, k, v, allowed, additive, masks, lse)

    # -- features and masks ------------------------------------------------------------------------
    def fold_features(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): the call's ``feats`` folded into ``masks`` as every operation folds
        them: one boolean ``mask`` (B|1, h|1, L_q, L_K) with the mask, key padding, causal and the
        structural mask (``key_padding_mask`` and ``causal`` then None), ``softcap`` and the
        ``alibi`` bias set, L_K = L_past + L_k; ``index``: the present-cache index (B, L_K) as
        NumPy (CACHE-1), None without a cache or with a full one. ``like``: an input of the call
        (device, dtype, batch size). The backward passes fold a call with it too."""
        plan = _features.plan(feats, batch=self._shape(like)[0], len_q=len_q, len_k=len_k,
                              causal=masks.causal)
        allowed = self._combine_masks(len_q, feats.len_past + len_k, like, masks.mask,
                                      masks.key_padding_mask, plan.causal)
        if plan.allowed is not None:
            structural = self._constant(plan.allowed, like)
            allowed = structural if allowed is None else allowed & structural
        alibi = None if plan.alibi is None else self._constant_as(plan.alibi, like)
        return masks._replace(mask=allowed, key_padding_mask=None, causal=None,
                              softcap=feats.softcap, alibi=alibi), plan.index

    def _folded(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): a 1.1 call's ``masks`` as they are and None; a 1.2 call's folded
        (:meth:`fold_features`) and its present-cache index as a backend array, or None."""
        if not feats.in_use:
            return masks, None
        masks, index = self.fold_features(like, masks, feats, len_q, len_k)
        return masks, None if index is None else self._constant(index, like)

    def _outputs(self, feats: Features, res: AttentionOutputs, key, like):
        """What a call returns: (output, weights), or AttentionOutputs with lse or a cache
        (present_lengths = past_lengths + L_k as the backend's int64 array; ``key``: the call's
        k (B, g, L_k, d_k) or key (B, L_k, k_dim), L_k its second-last axis)."""
        if not feats.outputs:
            return res.output, res.weights
        lengths = None
        if feats.cached:
            lengths = self._constant(feats.past_lengths + self._shape(key)[-2], like)
        return res._replace(lse=res.lse if feats.lse else None, present_lengths=lengths)

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

    def _canonical_masks(self, like, full, masks: MaskArgs) -> MaskArgs:
        """All masking as full (B, h, L_q, L_k) arrays: one boolean mask (key padding and causal
        folded in, so both become None) and one bias (zeros when absent, ALiBi added); the other
        fields (the scale, the soft-cap) are kept.
        Compiled variants call this before compiling so that every call of one shape and dtype has
        the same signature and compiles once."""
        allowed = self._combine_masks(full[2], full[3], like, masks.mask, masks.key_padding_mask,
                                      masks.causal)
        ones = self._constant(np.ones(full, dtype=bool), like)
        zeros = self._full(full, 0.0, like)
        bias = zeros if masks.bias is None else zeros + masks.bias
        return masks._replace(
            mask=ones if allowed is None else ones & allowed,
            bias=bias if masks.alibi is None else bias + masks.alibi,
            legacy_mask=None if masks.legacy_mask is None else zeros + masks.legacy_mask,
            key_padding_mask=None, causal=None, alibi=None)

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
    the masking arguments, g for grouped-query attention (MHA-6) or None, and the spec 1.2
    features (empty for a 1.1 call)."""

    params: MHAParams
    num_heads: int
    masks: MaskArgs
    num_kv_heads: int | None
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
