"""Adapters around a library with a boolean mask and no window argument, for the certificate's
account of who served a feature: the library's own mechanism or the adapter's fold.

* ``FOLDING``: claims "window" and leaves it to the generic path, which folds the window into the
  boolean mask before the library is called: WIN-1 passes, "by the adapter fold";
* ``OWN_WINDOW``: the same library given a window argument of its own (``attention_features``
  answers every windowed call): WIN-1 passes as the library's;
* ``HALF_OWN``: its own window argument for causal calls only, the fold for the rest: each
  call says who served it, and one call by the library keeps the credit the library's.

Axis legend: B batch, h heads, L_q / L_k lengths, d_k / d_v per-head widths.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends import masks
from mhaspec.backends.adapters import NumpyAdapter


def masked_attention(q, k, v, *, scale: float, allowed):
    """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v), ``allowed`` boolean
    broadcastable to (B, h, L_q, L_k) or None -> (B, h, L_q, d_v); a row with no allowed key is 0."""
    s = q @ k.swapaxes(-1, -2) * scale
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)
    p = np.exp(s - np.where(np.isfinite(top), top, 0))
    return p / np.maximum(p.sum(axis=-1, keepdims=True), np.finfo(p.dtype).tiny) @ v


class Folding(NumpyAdapter):
    native_op = "masked_attention"
    capabilities = frozenset({"sdpa", "errors", "masks", "causal", "window"})

    def dtypes(self, device):
        return ("float64", "float32")

    def attention(self, q, k, v, m):
        if m.bias is not None or m.alibi is not None or m.softcap is not None:
            self.unsupported("a bias")
        allowed = masks.allowed_mask(q.shape[2], k.shape[2], like=q, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask, causal=m.causal)
        return masked_attention(q, k, v, scale=m.scale, allowed=allowed), None


class OwnWindow(Folding):
    """The library's window argument: the same computation, reached through
    ``attention_features`` (what a library with its own window argument does)."""

    def attention_features(self, q, k, v, m, features):
        if not self.own_window(m):
            return NotImplemented
        folded, _ = self.computation.fold_features(q, m, features, q.shape[2], k.shape[2])
        return self.attention(q, k, v, folded)

    def own_window(self, m) -> bool:
        return True


class HalfOwn(OwnWindow):
    def own_window(self, m) -> bool:
        return m.causal is not None


FOLDING = Folding("window-by-fold")
OWN_WINDOW = OwnWindow("window-by-library")
HALF_OWN = HalfOwn("window-by-library-when-causal")
