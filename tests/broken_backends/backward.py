"""Spec 1.3: backward passes and sinks with one mistake each (GRAD-3..9, SINK), on the
oracle-backed reference backend: only the clause of its mistake can fail."""

from __future__ import annotations

import numpy as np

from mhaspec.spec import oracle, oracle_vjp
from oracle_backend import OracleBackend


def _scores_and_tanh(q, k, v, kwargs):
    """The oracle's dS (B, h, L_q, L_K) of a call (through a zero full-shape bias and the bias
    gradient, GRAD-9), its weights P, D = rowsum(dO * O) and tanh(X / c) (None without a cap)."""
    d_output, rest = kwargs.pop("d_output"), dict(kwargs)
    p = oracle.attention_problem(q, k, v, **{n: x for n, x in rest.items()
                                             if n not in ("d_lse", "sinks", "bias_grad")})
    full = p.allowed.shape
    bias = np.zeros(full) + (0 if rest.get("bias") is None else rest["bias"])
    res = oracle_vjp.attention_vjp(q, k, v, d_output, **{**rest, "bias": bias, "bias_grad": True})
    fwd = oracle_vjp.attention_with_sinks(q, k, v, sinks=rest.get("sinks"),
                                          **{n: x for n, x in rest.items()
                                             if n not in ("d_lse", "sinks", "bias_grad", "bias")},
                                          bias=bias)
    group = full[1] // p.k.shape[1]
    x = np.einsum("bhqd,bhkd->bhqk", p.q, np.repeat(p.k, group, axis=1)) * p.scale
    tanh = None if p.softcap is None else np.tanh(x / p.softcap)
    d = np.sum(d_output * fwd.output, axis=-1)
    return res, fwd.weights, d, tanh, p


def _grads_from_dx(res, d_x, p):
    """dq and dk (summed over each group) from dX = dS * cap derivative; v's gradient unchanged."""
    b, h, _, len_k = d_x.shape
    g = p.k.shape[1]
    dq = p.scale * np.einsum("bhqk,bhkd->bhqd", d_x, np.repeat(p.k, h // g, axis=1))
    dk = p.scale * np.einsum("bhqk,bhqd->bhkd", d_x, p.q).reshape(b, g, h // g, len_k, -1).sum(2)
    return res._replace(dq=dq, dk=dk)


class _BrokenBackward(OracleBackend):
    """The reference backend whose backward pass (``_vjp``) has one mistake."""


class GroupGradientFirstHeadOnly(_BrokenBackward):
    """dk and dv of each key/value head come from the first query head of its group only."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        group = q.shape[1] // k.shape[1]
        first = (np.arange(q.shape[1]) % group == 0)[None, :, None]
        d_lse = kwargs.get("d_lse")
        only = super()._vjp(q, k, v, d_output * first[..., None], **{
            **kwargs, "d_lse": None if d_lse is None else d_lse * first})
        return super()._vjp(q, k, v, d_output, **kwargs)._replace(dk=only.dk, dv=only.dv)


class SoftcapDerivativeDropped(_BrokenBackward):
    """dX = dS: the soft-cap's 1 - tanh^2 factor is missing (no cache: a cached call is exact)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("softcap") is None or kwargs.get("past_key") is not None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        res, _, _, _, p = _scores_and_tanh(q, k, v, {**kwargs, "d_output": d_output})
        return _grads_from_dx(super()._vjp(q, k, v, d_output, **kwargs), res.d_bias, p)


class WindowWiderInTheBackward(_BrokenBackward):
    """The backward pass recomputes P with the window's left side one key wider (the forward pass
    is right): an off-by-one edge in the backward kernel only."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        window = kwargs.get("window")
        if window is not None:
            left = None if window[0] is None else window[0] + 1
            kwargs = {**kwargs, "window": (left, window[1])}
        return super()._vjp(q, k, v, d_output, **kwargs)


class GradientIntoPaddedKeys(_BrokenBackward):
    """The backward pass ignores key padding and key lengths: padded keys get gradient."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        return super()._vjp(q, k, v, d_output, **{**kwargs, "key_padding_mask": None,
                                                  "key_value_seq_lengths": None})


class DeltaInHalfPrecision(_BrokenBackward):
    """D = rowsum(dO * O) is kept in a float16 buffer (a float32 kernel storing D at half
    precision; no cache: a cached call is exact)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("past_key") is not None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        res, probs, d, tanh, p = _scores_and_tanh(q, k, v, {**kwargs, "d_output": d_output})
        d_s = res.d_bias + probs * (d - d.astype(np.float16))[..., None]
        d_x = d_s if tanh is None else d_s * (1 - tanh ** 2)
        right = super()._vjp(q, k, v, d_output, **kwargs)
        return _grads_from_dx(right, d_x, p)


class EmptyRowsNanInTheBackward(_BrokenBackward):
    """The backward of a query row with no allowed key is NaN (the backward of a softmax over a
    row of -inf, as PaddlePaddle's and MLX's ops give): that row of dq, and dk and dv of every key
    of its batch item and key/value head. The forward pass is right (zeros)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        res = super()._vjp(q, k, v, d_output, **kwargs)
        p = oracle.attention_problem(q, k, v, **{n: x for n, x in kwargs.items()
                                                 if n not in ("d_lse", "sinks", "bias_grad")})
        empty = ~p.allowed.any(axis=-1)  # (B, h, L_q)
        b, h, _ = empty.shape
        shared = empty.any(axis=2).reshape(b, p.k.shape[1], -1).any(axis=2)[:, :, None, None]
        return res._replace(dq=np.where(empty[..., None], np.nan, res.dq),
                            dk=np.where(shared, np.nan, res.dk), dv=np.where(shared, np.nan, res.dv))


class LseCotangentIgnored(_BrokenBackward):
    """d_lse is accepted and ignored."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        return super()._vjp(q, k, v, d_output, **{**kwargs, "d_lse": None})


class LseCotangentRefused(_BrokenBackward):
    """A non-zero d_lse raises NotImplementedError (as Pallas splash attention does): no GRAD-8
    gradient, but GRAD-11 conforms (declared_backends declares GRAD-8)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        d_lse = kwargs.get("d_lse")
        if d_lse is not None and np.any(np.asarray(d_lse) != 0):
            raise NotImplementedError("d_lse: a cotangent on the log-sum-exp is not supported")
        return super()._vjp(q, k, v, d_output, **kwargs)


class SinkAddedToEveryLogit(OracleBackend):
    """The sink is added to each logit (the numerator) instead of joining the denominator: the
    softmax ignores it and the lse is shifted by it."""

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)  # validates the sinks (SINK-4)
        sinks = kwargs.pop("sinks", None)
        if sinks is None:
            return res
        res = super()._attention(q, k, v, **kwargs)
        return res._replace(lse=res.lse + np.asarray(sinks)[None, :, None])


class SinkLeftOutOfTheLse(OracleBackend):
    """Output and weights with the sink, the lse without it (the lse of spec 1.2's call)."""

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)
        if kwargs.get("sinks") is None:
            return res
        kwargs.pop("sinks")
        return res._replace(lse=super()._attention(q, k, v, **kwargs).lse)
