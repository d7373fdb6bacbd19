"""The validated front door of an array backend: check a call, fold its features, run an algorithm.

Axis legend: B batch, L_q / L_k lengths (L_K = L_past + L_k with a KV cache), h heads, g key/value
heads, d_model query width, k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out
output width.

:class:`ArrayBackend` validates a call (:mod:`.calls`: its masking arguments gathered into one
:class:`~.calls.MaskArgs`), and hands it to one hook per operation, the same for spec 1.1 and 1.2
calls:

* ``_sdpa(q, k, v, masks, features) -> AttentionOutputs`` and
* ``_mha(query, key, value, params, num_heads, masks, features, num_kv_heads) -> AttentionOutputs``

(``features``: the validated :class:`~.feature_checks.Features`, empty for a 1.1 call). By default
they fold the features into the masks (the public :meth:`~ArrayBackend.fold_features`, which the
backward passes use too), lay out a KV cache, and run the :mod:`.algorithms` object chosen at
construction through ``_attention`` / ``_multi_head``: the one function per operation that the
compiled variants (``jax.jit``, ``tf.function``) wrap. An array backend is composed, not
inherited: ``ArrayBackend(ops, algorithm)`` takes a framework's operations (``ops``, public
methods, checked by :func:`~.primitives.check_ops`) and an algorithm object, which owns the masks
and the kernel and calls only ``ops``.
"""

from __future__ import annotations

from . import algorithms, arg_checks, autodiff_vjp, calls, serving
from ._base import CAPABILITIES, AttentionOutputs, Backend, MHAParams
from .feature_checks import Features
from .algorithms import LEGACY_MASK_VALUE, Algorithm, Cache  # noqa: F401  (re-exported)
from .calls import MaskArgs, MHACall  # noqa: F401  (re-exported)
from .primitives import check_ops


class ArrayBackend(Backend):
    """A backend composed of a framework's operations and one algorithm: validation, features,
    outputs.

    ``ops``: the framework's operations (:mod:`.primitives`; every one of
    :data:`~.primitives.OPERATIONS` present, else ``TypeError`` naming the missing ones).
    ``algorithm`` (an :class:`Algorithm`, its value ``"perhead"`` / ``"batched"``, or an
    algorithm object: an instance of :class:`.algorithms.AttentionAlgorithm`, e.g. a subclass of
    :class:`.algorithms.Batched`) is fixed here; ``name`` defaults to
    ``"<framework_label>-<algorithm value>"``. ``backward``: the backward pass of
    ``attention_vjp`` (``backward(backend, q, k, v, d_output, d_lse, masks, feats, bias_grad)``;
    default the framework's autodiff, :mod:`.autodiff_vjp`).
    """

    framework_label = "array"
    #: grouped-query attention is part of the algorithms; gradients need a framework's autodiff
    #: (:meth:`_vjp`), so "grad" is claimed by the framework subclasses that supply it.
    capabilities = CAPABILITIES - {"grad"}

    def __init__(self, ops, algorithm, *, name: str | None = None, backward=None):
        check_ops(ops)
        self.ops = ops
        self.backward = backward or autodiff_vjp.attention_vjp
        if isinstance(algorithm, algorithms.AttentionAlgorithm):
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

    @property
    def algorithm_object(self) -> algorithms.AttentionAlgorithm:
        """The algorithm object: the masks, the kernel and the projections (read-only)."""
        return self._algorithm

    # -- the four operations (validated) ---------------------------------------------------------
    def split_heads(self, x, num_heads: int):
        op = "split_heads"
        num_heads = arg_checks.check_heads(op, calls.arg(self, op, "x", x), num_heads)
        return self._algorithm.split(self.ops, x, num_heads)

    def combine_heads(self, x):
        op = "combine_heads"
        arg_checks.check_heads(op, calls.arg(self, op, "x", x))
        return self._algorithm.combine(self.ops, x)

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None, **features):
        masks, feats, _ = calls.sdpa_call(self, "scaled_dot_product_attention", q, k, v, mask,
                                          bias, legacy_mask, key_padding_mask, causal, scale,
                                          features)
        return self._outputs(feats, self._sdpa(q, k, v, masks, feats), k, q)

    # -- spec 1.3: the backward pass of attention (GRAD-3..9); the math lives in np_vjp /
    #    autodiff_vjp, this is the glue ---------------------------------------------------------
    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad: bool = False,
                      mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                      scale=None, **features):
        op = "scaled_dot_product_attention"
        masks, feats, dims = calls.sdpa_call(self, op, q, k, v, mask, bias, legacy_mask,
                                             key_padding_mask, causal, scale, features)
        arg_checks.check_cotangents(op, dims, calls.arg(self, op, "d_output", d_output),
                                    calls.arg(self, op, "d_lse", d_lse), self.ops.shape(q)[1],
                                    bias_grad=bias_grad, bias=bias, backend=self)
        return self._attention_vjp(q, k, v, d_output, d_lse, masks, feats, bool(bias_grad))

    def _attention_vjp(self, q, k, v, d_output, d_lse, masks: MaskArgs, feats: Features,
                       bias_grad: bool) -> dict:
        """The gradients of a validated call by :attr:`backward` (the framework's autodiff
        through :meth:`_sdpa` unless the backend was given another, NumPy's by hand)."""
        return self.backward(self, q, k, v, d_output, d_lse, masks, feats, bias_grad)

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, **features):
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
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
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
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
        return serving.merge_states(self.ops, outputs, lses, sinks=sinks, lse_base=lse_base,
                                    empty_lse=empty_lse, lse_layout=lse_layout)

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal: bool = False, scale=None):
        return serving.paged_attention(self, q, k_pages, v_pages, block_table, seq_lens,
                                       query_start_loc, causal=causal, scale=scale)

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        return serving.write_pages(self, k_pages, v_pages, k, v, slot_mapping)

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` by ``ops.vjp`` (the
        framework's autodiff)."""
        if not callable(getattr(self.ops, "vjp", None)):
            raise NotImplementedError(f"{self.name}: no automatic differentiation (capability "
                                      f"'grad')")
        return self.ops.vjp(fn, primals, cotangent)

    # -- one hook per operation (validated input; 1.1 and 1.2 calls alike) -------------------------
    def _sdpa(self, q, k, v, masks: MaskArgs, feats: Features) -> AttentionOutputs:
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> AttentionOutputs(out,
        weights, lse or None, present_key, present_value): the features folded into ``masks``
        (:meth:`fold_features`), the present cache laid out (CACHE-1), then :meth:`_attention`."""
        masks, index = self._folded(q, masks, feats, self.ops.shape(q)[2], self.ops.shape(k)[2])
        kept = (None, None)
        if feats.cached:
            k = algorithms.present(self.ops, feats.past_key, k, index)
            v = algorithms.present(self.ops, feats.past_value, v, index)
            kept = (k, v)
        out, weights, lse = self._algorithm.attention_with_sinks(
            self.ops, q, k, v, masks, feats.lse, feats.sinks, self._attention)
        return AttentionOutputs(out, weights, lse, *kept)

    def _mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
             feats: Features, num_kv_heads: int | None = None) -> AttentionOutputs:
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) ->
        AttentionOutputs(out (B, L_q, d_out), weights, lse or None, present_key (B, g, L_K, d_k)
        or None, present_value or None); ``num_kv_heads`` g (MHA-6, None: g = h): query head i
        uses key/value head i // (h / g). The features folded as in :meth:`_sdpa`; a cache holds
        projected keys and values, so the algorithm lays out the present cache."""
        masks, index = self._folded(query, masks, feats, self.ops.shape(query)[1],
                                    self.ops.shape(key)[1])
        cache = Cache(feats.past_key, feats.past_value, index) if feats.cached else None
        return AttentionOutputs(*self._multi_head(query, key, value, p, num_heads, masks,
                                                  num_kv_heads, feats.lse, cache))

    # -- the computation: what the compiled variants wrap ------------------------------------------
    def _attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        """-> (out, weights, lse or None) by the algorithm (``masks`` already folded)."""
        return self._algorithm.attention(self.ops, q, k, v, masks, lse)

    def _multi_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                    num_kv_heads: int | None = None, lse: bool = False, cache: Cache | None = None):
        """-> (out, weights, lse, present_key, present_value) by the algorithm."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        return self._algorithm.mha(self.ops, query, key, value, p, num_heads, masks, g, lse, cache)

    # -- features and masks ------------------------------------------------------------------------
    def fold_features(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): the call's ``feats`` folded into ``masks`` as every operation folds
        them: one boolean ``mask`` (B|1, h|1, L_q, L_K) with the mask, key padding, causal and the
        structural mask (``key_padding_mask`` and ``causal`` then None), ``softcap`` and the
        ``alibi`` bias set, L_K = L_past + L_k; ``index``: the present-cache index (B, L_K) as
        NumPy (CACHE-1), None without a cache or with a full one. ``like``: an input of the call
        (device, dtype, batch size). The backward passes fold a call with it too."""
        return self._algorithm.fold_features(self.ops, like, masks, feats, len_q, len_k)

    def _folded(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): a 1.1 call's ``masks`` as they are and None; a 1.2 call's folded
        (:meth:`fold_features`) and its present-cache index as a backend array, or None."""
        if not feats.in_use:
            return masks, None
        masks, index = self.fold_features(like, masks, feats, len_q, len_k)
        return masks, None if index is None else self.ops.constant(index, like)

    def _outputs(self, feats: Features, res: AttentionOutputs, key, like):
        """What a call returns: (output, weights), or AttentionOutputs with lse or a cache
        (present_lengths = past_lengths + L_k as the backend's int64 array; ``key``: the call's
        k (B, g, L_k, d_k) or key (B, L_k, k_dim), L_k its second-last axis)."""
        if not feats.outputs:
            return res.output, res.weights
        lengths = None
        if feats.cached:
            lengths = self.ops.constant(feats.past_lengths + self.ops.shape(key)[-2], like)
        return res._replace(lse=res.lse if feats.lse else None, present_lengths=lengths)
