"""What runs below an array backend's validation: features folded, a KV cache laid out, attention.

Axis legend: B batch, L_q / L_k lengths (L_K = L_past + L_k with a KV cache), h heads, g key/value
heads, d_model query width, k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out
output width.

:class:`Computation` is the second part of ``ArrayBackend(ops, algorithm)`` (the first is the
validated front door, :mod:`._generic`): it takes a validated call, the same for spec 1.1 and 1.2
calls, folds its features into the masks (through the algorithm object, :mod:`.algorithms`), lays
out the present cache and runs the algorithm on the framework's ``ops``. Every method is public,
and a variant overrides some of them in a subclass, chosen once when its backend is built: the
compiled variants (``jax_backend.JitComputation``, ``tf_backend.FunctionComputation``) wrap
:meth:`~Computation.attention` and :meth:`~Computation.multi_head` in ``jax.jit`` /
``tf.function``; a native adapter's (``adapters.NativeComputation``) calls the library's op there.
"""

from __future__ import annotations

from . import algorithms
from ._base import AttentionOutputs, MHAParams
from .algorithms import Cache
from .calls import MaskArgs
from .feature_checks import Features


class Computation:
    """A validated call computed by ``algorithm`` (an :class:`.algorithms.AttentionAlgorithm`) on
    ``ops`` (a framework's operations)."""

    def __init__(self, ops, algorithm: algorithms.AttentionAlgorithm):
        self.ops = ops
        self.algorithm = algorithm

    def sdpa(self, q, k, v, masks: MaskArgs, feats: Features) -> AttentionOutputs:
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> AttentionOutputs(out,
        weights, lse or None, present_key, present_value): the features folded into ``masks``
        (:meth:`fold_features`), the present cache laid out (CACHE-1), then :meth:`attention`
        (with the sinks as the algorithm adds them)."""
        shape = self.ops.shape
        masks, index = self.folded(q, masks, feats, shape(q)[2], shape(k)[2])
        kept = (None, None)
        if feats.cached:
            k = algorithms.present(self.ops, feats.past_key, k, index)
            v = algorithms.present(self.ops, feats.past_value, v, index)
            kept = (k, v)
        out, weights, lse = self.algorithm.attention_with_sinks(
            self.ops, q, k, v, masks, feats.lse, feats.sinks, self.attention)
        return AttentionOutputs(out, weights, lse, *kept)

    def mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
            feats: Features, num_kv_heads: int | None = None) -> AttentionOutputs:
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) ->
        AttentionOutputs(out (B, L_q, d_out), weights, lse or None, present_key (B, g, L_K, d_k)
        or None, present_value or None); ``num_kv_heads`` g (MHA-6, None: g = h). The features
        folded as in :meth:`sdpa`; a cache holds projected keys and values, so the algorithm lays
        out the present cache."""
        shape = self.ops.shape
        masks, index = self.folded(query, masks, feats, shape(query)[1], shape(key)[1])
        cache = Cache(feats.past_key, feats.past_value, index) if feats.cached else None
        return AttentionOutputs(*self.multi_head(query, key, value, p, num_heads, masks,
                                                 num_kv_heads, feats.lse, cache))

    # -- the computation itself: what the compiled variants wrap ---------------------------------
    def attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        """-> (out, weights, lse or None) by the algorithm (``masks`` already folded)."""
        return self.algorithm.attention(self.ops, q, k, v, masks, lse)

    def multi_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                   num_kv_heads: int | None = None, lse: bool = False, cache: Cache | None = None):
        """-> (out, weights, lse, present_key, present_value) by the algorithm."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        return self.algorithm.mha(self.ops, query, key, value, p, num_heads, masks, g, lse, cache)

    # -- features and masks ----------------------------------------------------------------------
    def logits_shape(self, q, k) -> tuple[int, int, int, int]:
        """(B, h, L_q, L_k) of an attention call (q (B, h, L_q, d_k), k (B, g, L_k, d_k)): the
        shape of its canonical masks (:meth:`.algorithms.AttentionAlgorithm.canonical_masks`)."""
        shape = self.ops.shape
        return (*shape(q)[:3], shape(k)[2])

    def mha_logits_shape(self, query, key, num_heads: int,
                         cache: Cache | None) -> tuple[int, int, int, int]:
        """(B, h, L_q, L_past + L_k) of a multi-head call (query (B, L_q, d_model), key (B, L_k,
        k_dim), ``cache`` the past keys (B, g, L_past, d_k) or None): its canonical masks' shape."""
        shape = self.ops.shape
        len_all = shape(key)[1] + (0 if cache is None else shape(cache.past_key)[2])
        return (shape(query)[0], num_heads, shape(query)[1], len_all)

    def fold_features(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): the call's ``feats`` folded into ``masks`` as every operation folds
        them: one boolean ``mask`` (B|1, h|1, L_q, L_K) with the mask, key padding, causal and the
        structural mask (``key_padding_mask`` and ``causal`` then None), ``softcap`` and the
        ``alibi`` bias set, L_K = L_past + L_k; ``index``: the present-cache index (B, L_K) as
        NumPy (CACHE-1), None without a cache or with a full one. ``like``: an input of the call
        (device, dtype, batch size). The backward passes fold a call with it too."""
        return self.algorithm.fold_features(self.ops, like, masks, feats, len_q, len_k)

    def folded(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): a 1.1 call's ``masks`` as they are and None; a 1.2 call's folded
        (:meth:`fold_features`) and its present-cache index as a backend array, or None."""
        if not feats.in_use:
            return masks, None
        masks, index = self.fold_features(like, masks, feats, len_q, len_k)
        return masks, None if index is None else self.ops.constant(index, like)
