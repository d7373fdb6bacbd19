"""A library's KV cache in CACHE-1's layout: for adapters whose library keeps every past entry.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k, d per-head width.

A library cache (ONNX ``past_key``, a Hugging Face ``DynamicCache``) attends ``Concat(past, new)``:
every one of the L_past past entries, then the new ones. CACHE-1's present cache holds the valid
past of item b (``past_lengths[b]`` entries), the new entries, then zeros. With a full cache the
two coincide; otherwise the adapter moves the call's mask into the library's layout (past entries
beyond ``past_lengths[b]`` blocked) and the weights and present cache back. Both moves are
gathers along the key axis with the backend's own ``_take_keys``, by indices computed in NumPy
from the present-cache index (:func:`.positions.present_index`, the ``index`` of a feature plan).
"""

from __future__ import annotations

import numpy as np

from .adapters import PROJECTIONS
from .array_ops import ops_for


def library_index(present_index: np.ndarray) -> np.ndarray:
    """present_index (B, L_K), values in [0, L_K] (L_K: the zero slot) -> (B, L_K): for each slot
    of ``Concat(past, new)``, the present-cache entry it holds, or L_K (one extra slot, blocked)
    for a past entry beyond the valid length."""
    b, l_all = present_index.shape
    out = np.full((b, l_all + 1), l_all, np.int64)
    np.put_along_axis(out, present_index, np.broadcast_to(np.arange(l_all), (b, l_all)), axis=1)
    return out[:, :l_all]


class LibraryCache:
    """Mixin for an adapter (an array backend) whose library attends ``Concat(past, new)``: a call
    with a KV cache goes to the adapter's ``cached_attention(q, k, v, masks, past_key,
    past_value, index, **options)`` -> AttentionOutputs, ``masks`` folded over CACHE-1's present
    layout, ``index`` the present-cache index as NumPy, or None for a full cache; ``options``
    (none by default) are what an attention call's :meth:`cache_call` adds."""

    def attention_features(self, q, k, v, masks, features):
        """A call with a KV cache (without lse): :meth:`cache_call`, then ``cached_attention``;
        other feature calls as the adapter's base does them."""
        if not features.cached or features.lse:
            return super().attention_features(q, k, v, masks, features)
        folded, index, options = self.cache_call(q, masks, features, self.ops.shape(q)[2],
                                                 self.ops.shape(k)[2])
        return self.cached_attention(q, k, v, folded, features.past_key, features.past_value,
                                     index, **options)

    def cache_call(self, like, masks, features, len_q: int, len_k: int):
        """-> (masks, index, options): how an attention call with a KV cache reaches
        ``cached_attention``: the call's ``masks`` with its ``features`` folded and the
        present-cache index as NumPy (``fold_features``), and ``options``, the keyword arguments
        of ``cached_attention`` (none). Override to pass the library's own arguments where they
        are exact (a causal flag)."""
        return (*self.fold_features(like, masks, features, len_q, len_k), {})

    def mha_features(self, query, key, value, p, num_heads: int, masks, features,
                     num_kv_heads: int | None = None):
        """Multi-head attention with a KV cache (projected past keys and values): the spec's
        projections (MHA-2) around ``cached_attention``; other calls as the adapter's base does
        them."""
        if not features.cached or features.lse:
            return super().mha_features(query, key, value, p, num_heads, masks, features,
                                        num_kv_heads)
        folded, index = self.fold_features(query, masks, features, self.ops.shape(query)[1],
                                           self.ops.shape(key)[1])
        g = num_heads if num_kv_heads is None else num_kv_heads
        split, linear = PROJECTIONS.split, PROJECTIONS.linear
        q = split(self.ops, linear(self.ops, query, p.w_q, p.b_q), num_heads)
        k = split(self.ops, linear(self.ops, key, p.w_k, p.b_k), g)
        v = split(self.ops, linear(self.ops, value, p.w_v, p.b_v), g)
        res = self.cached_attention(q, k, v, folded, features.past_key, features.past_value,
                                    index)
        combined = PROJECTIONS.combine(self.ops, res.output)
        return res._replace(output=linear(self.ops, combined, p.w_o,
                                          p.b_o))

    def _keys_last(self, x, index, fill: float):
        """x (B|1, h|1, L_q, L) -> (B, h', L_q, L'): ``Concat(x, fill)`` gathered by ``index``
        (B, L') along the last (key) axis."""
        b = self.ops.shape(index)[0]
        shape = self.ops.shape(x)
        x = ops_for(x).broadcast_to(x, (b, *shape[1:]))
        extra = self.ops.full((*self.ops.shape(x)[:-1], 1), fill, x)
        keys_second = self.ops.transpose(self.ops.concat([x, extra], axis=-1), (0, 1, 3, 2))
        return self.ops.transpose(self.ops.take_keys(keys_second, index), (0, 1, 3, 2))

    def to_library_layout(self, mask, index, blocked: float):
        """The call's ``attn_mask`` (B|1, h|1, L_q, L_K) in CACHE-1's layout -> the library's
        (B, h|1, L_q, L_past + L_k); ``blocked``: the value of a blocked entry (False or -inf).
        ``index``: the present-cache index (B, L_K) as NumPy, or None for a full cache (the two
        layouts coincide: ``mask`` as it is)."""
        if index is None:
            return mask
        return self._keys_last(mask, self.ops.constant(library_index(index), mask), blocked)

    def from_library_layout(self, weights, present_key, present_value, index):
        """The library's weights (B, h, L_q, L_past + L_k) and present cache (B, g, L_past + L_k,
        d) -> CACHE-1's layout (invalid past entries dropped, zeros at the end); ``index`` None
        (a full cache): the same arrays, the two layouts coinciding."""
        if index is None:
            return weights, present_key, present_value
        at = self.ops.constant(index, present_key)
        present = []
        for x in (present_key, present_value):
            zero = self.ops.full((*self.ops.shape(x)[:2], 1, self.ops.shape(x)[3]), 0.0, x)
            present.append(self.ops.take_keys(self.ops.concat([x, zero], axis=-2), at))
        return (None if weights is None else self._keys_last(weights, at, 0.0), *present)
