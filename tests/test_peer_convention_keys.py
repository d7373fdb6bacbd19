"""The ``window-size`` key of ``mhaspec conventions``, checked on a Hugging Face-style adapter.

An adapter that translates the spec's ``window=(left, 0)`` into ``sliding_window = W`` must pass
W = left + 1 (:func:`peer_rules.hf_sliding_causal`, W keys); ``conventions.confirm`` shows the
difference on its case.
"""

from __future__ import annotations

import numpy as np

from peer_rules import hf_sliding_causal


def test_the_window_size_convention_key_catches_a_window_one_key_short():
    """``mhaspec conventions``' ``window-size`` key: an adapter that passes the spec's
    ``window=(left, 0)`` to a Hugging Face-style ``sliding_window = W`` (W keys,
    :func:`hf_sliding_causal`) must translate W = left + 1; untranslated (W = left) it is one key
    short, and the check confirms the difference on its case."""
    from mhaspec import conventions
    from mhaspec.backends import masks
    from mhaspec.backends.adapters import NumpyAdapter

    def softmax_attention(q, k, v, m, band):
        allowed = masks.allowed_mask(q.shape[2], k.shape[2], like=q, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask)
        allowed = band if allowed is None else allowed & band
        logits = np.where(allowed, q @ k.swapaxes(-1, -2) * m.scale, -np.inf)
        top = logits.max(axis=-1, keepdims=True)
        w = np.exp(logits - np.where(np.isfinite(top), top, 0))
        return w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300) @ v, None

    class SlidingWindow(NumpyAdapter):
        native_op = "a sliding_window = W function (Hugging Face's rule)"
        capabilities = frozenset({"sdpa", "masks", "causal", "errors", "window"})
        conventions = {"window-size": ("WIN-1", "sliding_window = W means W keys: the spec's "
                                                "window=(W - 1, 0) is passed as W = left + 1")}

        def attention(self, q, k, v, m):
            band = masks.allowed_mask(q.shape[2], k.shape[2], like=q, causal=m.causal)
            return softmax_attention(q, k, v, m, True if band is None else band)

        def attention_features(self, q, k, v, m, features):
            if features.window is None or features.window[1] != 0 or m.causal != "bottom_right" \
                    or features.positions is not None or features.window[0] is None:
                return NotImplemented
            w = features.window[0] + (1 if self.translates("window-size") else 0)
            return softmax_attention(q, k, v, m, hf_sliding_causal(w, q.shape[2],
                                                                   k.shape[2] - q.shape[2]))

    [row] = conventions.confirm(SlidingWindow("sliding-window-test"))
    assert row.convention == "window-size" and row.confirmed, row
    assert row.translated.startswith("agrees") and "differs" in row.untranslated
