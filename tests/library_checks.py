"""Adapters around a library that silently accepts ``softcap=0`` (it reads 0 as "multiply the
logits by 0" and returns the mean of V), for the certificate's account of who satisfied a clause.

* ``LEFT_TO_LIBRARY``: the adapter leaves SOFTCAP-2 to the library (``library_validates``), so the
  library's silence is judged and SOFTCAP-2 fails;
* ``SHARED``: the adapter's shared validation rejects ``softcap=0`` before the library is called,
  so SOFTCAP-2 passes, satisfied by the adapter.

Axis legend: B batch, h heads, L_q / L_k lengths, d_k / d_v per-head widths.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends.adapters import NumpyAdapter


def silent_softcap_attention(q, k, v, *, scale: float, softcap):
    """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v) -> (B, h, L_q, d_v); any
    ``softcap`` is taken: c tanh(S / c) for c != 0, and 0 * S (the mean of V) for c = 0."""
    s = q @ k.swapaxes(-1, -2) * scale
    if softcap is not None:
        s = s * 0 if softcap == 0 else softcap * np.tanh(s / softcap)
    p = np.exp(s - s.max(axis=-1, keepdims=True, initial=-np.inf))
    return p / np.maximum(p.sum(axis=-1, keepdims=True), np.finfo(p.dtype).tiny) @ v


class SilentSoftcap(NumpyAdapter):
    native_op = "silent_softcap_attention"
    capabilities = frozenset({"sdpa", "errors", "softcap"})

    def dtypes(self, device):
        return ("float64", "float32")

    def attention(self, q, k, v, m):
        return silent_softcap_attention(q, k, v, scale=m.scale, softcap=m.softcap), None


class LibraryJudged(SilentSoftcap):
    library_validates = frozenset({"SOFTCAP-2"})


LEFT_TO_LIBRARY = LibraryJudged("silent-softcap-library-judged")
SHARED = SilentSoftcap("silent-softcap-shared-validation")


class NegativeScaleTaken(SilentSoftcap):
    """The library takes any scale (a negative one flips the softmax) and is judged on it."""

    library_validates = frozenset({"ERR-10"})


SCALE_LEFT_TO_LIBRARY = NegativeScaleTaken("negative-scale-library-judged")


class HeadsRepeated(SilentSoftcap):
    """Grouped heads by ``np.repeat(k, h // g)``, with no check that g divides h: judged on it,
    a k of 3 heads against 4 query heads fails inside NumPy, not naming ``k``."""

    capabilities = SilentSoftcap.capabilities | {"gqa"}
    library_validates = frozenset({"GQA-2"})

    def attention(self, q, k, v, m):
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        return super().attention(q, k, v, m)


GROUPING_LEFT_TO_LIBRARY = HeadsRepeated("heads-repeated-library-judged")
