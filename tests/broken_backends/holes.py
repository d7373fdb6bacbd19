"""Spec 1.4: holes of 1.3's suite (INPUT-1 in the backward, grouped sinks, broadcast bias)
and DET-1 (determinism), on the oracle-backed reference backend."""

from __future__ import annotations

import numpy as np

from oracle_backend import OracleBackend


# -- spec 1.4: holes of 1.3's suite (INPUT-1 in the backward, grouped sinks, broadcast bias, WIN/ALIBI) -
# Each derives from the oracle-backed reference backend: one mistake, every other clause exact.

class QueryScaledInPlaceInTheBackward(OracleBackend):
    """attention_vjp folds the scale into q in place (``q *= scale``, as kernels that pre-scale
    the queries do) after computing right gradients: the caller's q is scaled (INPUT-1)."""

    def attention_vjp(self, q, k, v, d_output, **kwargs) -> dict:
        grads = super().attention_vjp(q, k, v, d_output, **kwargs)
        scale = kwargs.get("scale")
        np.multiply(q, 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale, out=q)
        return grads


def _sinks_by_kv_head(sinks, q, k):
    """sinks (h,) read at each query head's key/value head index (i // (h/g)) instead of at i."""
    if sinks is None or np.ndim(sinks) != 1 or np.ndim(q) != 4 or np.ndim(k) != 4:
        return sinks
    h, g = q.shape[1], k.shape[1]
    if not (0 < g <= h and h % g == 0 and len(sinks) == h):
        return sinks  # left for validation to reject (SINK-4, GQA-2)
    return np.asarray(sinks)[np.arange(h) // (h // g)]


class SinkIndexedByKvHead(OracleBackend):
    """Reads each query head's sink at its key/value head's index (sinks[i // (h/g)]): right
    without grouped heads, wrong for every head of a group but the first with them."""

    def _attention(self, q, k, v, **kwargs):
        if kwargs.get("sinks") is not None:
            kwargs = {**kwargs, "sinks": _sinks_by_kv_head(kwargs["sinks"], q, k)}
        return super()._attention(q, k, v, **kwargs)

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("sinks") is not None:
            kwargs = {**kwargs, "sinks": _sinks_by_kv_head(kwargs["sinks"], q, k)}
        return super()._vjp(q, k, v, d_output, **kwargs)


class BiasGradientNotReduced(OracleBackend):
    """d_bias of a broadcast bias is the full-shape gradient's first entry along each broadcast
    axis (a kernel writing d_bias per (batch, head, query) into a buffer of the bias's shape:
    the last write wins) instead of its sum over those axes (GRAD-9)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        bias = kwargs.get("bias")
        if not kwargs.get("bias_grad") or bias is None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        shape = np.shape(bias)
        full = (q.shape[0], q.shape[1], q.shape[2], shape[-1])
        res = super()._vjp(q, k, v, d_output, **{**kwargs, "bias": np.broadcast_to(bias, full)})
        d = res.d_bias
        pad = (1,) * (4 - len(shape)) + tuple(shape)
        for axis, n in enumerate(pad):
            if n == 1 and d.shape[axis] != 1:
                d = d[(slice(None),) * axis + (slice(0, 1),)]
        return res._replace(d_bias=d.reshape(shape))


# -- spec 1.4: DET-1 (determinism) -----------------------------------------------------------------

def _one_ulp_at_the_largest(x, nudge: bool):
    """``x`` (a copy) with its largest-magnitude entry moved one ulp away from zero when ``nudge``
    (zeros, NaNs and empty arrays as they are)."""
    x = np.array(x, copy=True)
    if nudge and x.size and np.isfinite(x).any():
        i = int(np.nanargmax(np.where(np.isfinite(x), np.abs(x), -1.0)))
        if x.flat[i] != 0:
            x.flat[i] = np.nextafter(x.flat[i], np.sign(x.flat[i]) * np.inf)
    return x


class RunToRunNoise(OracleBackend):
    """Exact but for one ulp at the largest entry of the output and of dq on every other call (an
    accumulation whose order varies from run to run, as atomic adds give): within NUM-3 and GRAD-1
    everywhere, but two calls on the same inputs differ (DET-1)."""

    def __init__(self, name: str):
        super().__init__(name)
        self._calls = 0

    def _nudge(self) -> bool:
        self._calls += 1
        return self._calls % 2 == 0

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)
        return res._replace(output=_one_ulp_at_the_largest(res.output, self._nudge()))

    def _mha(self, query, key, value, params, **kwargs):
        res = super()._mha(query, key, value, params, **kwargs)
        return res._replace(output=_one_ulp_at_the_largest(res.output, self._nudge()))

    def _vjp(self, q, k, v, d_output, **kwargs):
        res = super()._vjp(q, k, v, d_output, **kwargs)
        return res._replace(dq=_one_ulp_at_the_largest(res.dq, self._nudge()))
