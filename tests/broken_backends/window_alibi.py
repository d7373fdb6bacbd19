"""Spec 1.4: window and ALiBi mistakes of kinds real kernels shipped (WIN-1, ALIBI-1)."""

from __future__ import annotations

import numpy as np

from .base import BrokenFeature


def _window_args(kw: dict, q, k) -> dict:
    """The call's window, alignment and causal as plain values (the oracle rejects the invalid)."""
    return {"window": kw.get("window"), "alignment": kw.get("alignment"), "causal": kw.get("causal")}


class _WindowOrAlibiMistake(BrokenFeature):
    """The reference backend with :meth:`_fix` rewriting the keyword arguments of every call."""

    def _fix(self, q, k, kw: dict) -> dict:
        return kw

    def _attention(self, q, k, v, **kw):
        return super()._attention(q, k, v, **self._fix(q, k, kw))

    def _vjp(self, q, k, v, d_output, **kw):
        return super()._vjp(q, k, v, d_output, **self._fix(q, k, kw))

    def _mha(self, query, key, value, params, **kw):
        return super()._mha(query, key, value, params, **self._fix(query, key, kw))


def _valid_window(window) -> bool:
    return (isinstance(window, tuple) and len(window) == 2
            and all(s is None or (type(s) is int and s >= 0) for s in window))


class WindowRightIgnoredWhenLeftUnbounded(_WindowOrAlibiMistake):
    """A window whose left side is unbounded is causal when its right side is 0 and no window at
    all otherwise (FlashAttention 2 maps (-1, 0) to its causal flag; a kernel that then switches
    local masking on only for ``left >= 0``): (None, r > 0) lets in every key right of r."""

    def _fix(self, q, k, kw):
        window = kw.get("window")
        if _valid_window(window) and window[0] is None and window[1] not in (0, None):
            return {**kw, "window": None}
        return kw


class WindowTopLeftWhenBottomRight(_WindowOrAlibiMistake):
    """A left-only window (right side unbounded, a "sliding window" of the last keys) measured from
    the top-left diagonal (p_q(i) = i) although the call's alignment is bottom-right and no causal
    mask is given (a sliding-window kernel that forgets the offset L_k - L_q): wrong whenever
    L_q != L_k, right for every other window."""

    def _fix(self, q, k, kw):
        window = kw.get("window")
        if (_valid_window(window) and window[0] is not None and window[1] is None
                and kw.get("causal") is None and kw.get("alignment") == "bottom_right"
                and kw.get("past_key") is None):
            return {**kw, "alignment": "top_left"}
        return kw


class AlibiPerBatchSlopesOfFirstItem(_WindowOrAlibiMistake):
    """Slopes of shape (B, h) read as (h,): every batch item gets item 0's slopes (a kernel whose
    slope stride over the batch is 0)."""

    def _fix(self, q, k, kw):
        slopes = kw.get("alibi_slopes")
        if slopes is not None and np.ndim(slopes) == 2 and np.asarray(slopes).dtype.kind == "f":
            return {**kw, "alibi_slopes": np.broadcast_to(np.asarray(slopes)[:1],
                                                          np.shape(slopes)).copy()}
        return kw


class AlibiSignedDistance(_WindowOrAlibiMistake):
    """Adds -m (p_q(i) - p_k(j)) without the absolute value (the causal form used everywhere):
    right under a causal mask, but future keys get +m |i - j| (their penalty's sign flipped)."""

    def _attention(self, q, k, v, **kw):
        slopes = kw.get("alibi_slopes")
        if (slopes is None or kw.get("causal") is not None or kw.get("past_key") is not None
                or np.asarray(slopes).dtype.kind != "f"):
            return super()._attention(q, k, v, **kw)
        h, len_q, len_k = q.shape[1], q.shape[2], k.shape[2]
        shift = len_k - len_q if kw.get("alignment", "bottom_right") != "top_left" else 0
        distance = (np.arange(len_q)[:, None] + shift) - np.arange(len_k)[None, :]
        m = np.asarray(slopes, dtype=np.float64).reshape(-1, h)[:, :, None, None]
        signed = -m * distance  # the right term is -m |distance|
        extra = signed + m * np.abs(distance)  # what the mistake adds to the right bias
        bias = kw.get("bias")
        return super()._attention(q, k, v, **{**kw, "bias": extra if bias is None else bias + extra})
