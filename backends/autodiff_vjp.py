"""The backward pass of attention (GRAD-3 to GRAD-9, SINK-3; spec 1.3) by a framework's autodiff.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, d_v value width.

The loss ``sum(output * d_output) + sum(lse * d_lse)`` is one vector-Jacobian product of the
forward pass's output and log-sum-exp laid side by side, (B, h, L_q, d_v + 1), against the
cotangent ``[d_output | d_lse]``; without ``d_lse`` the forward pass returns the output alone (the
lse is not asked for, so an op without one, a native adapter's, is differentiated too). The
primals are q, k, v and, where the call has them, the past cache, the sinks and (``bias_grad``)
the bias; everything else (masks, positions, ALiBi, the scale and the cap) is a constant of the
forward function. The forward pass is the backend's own computation (``backend.computation.sdpa``;
a native adapter's op), so the gradient is that of what it computes.
"""

from __future__ import annotations


def attention_vjp(backend, q, k, v, d_output, d_lse, masks, feats, bias_grad: bool) -> dict:
    """Gradients of a validated call (``masks``: ``MaskArgs``, ``feats``: ``Features``) by
    :func:`vjp`: ``{"q", "k", "v"[, "past_key", "past_value"][, "sinks"][, "bias"]}``."""
    primals = {"q": q, "k": k, "v": v}
    if feats.cached:
        primals.update(past_key=feats.past_key, past_value=feats.past_value)
    if feats.sinks is not None:
        primals["sinks"] = backend.ops.constant_as(feats.sinks, q)
    if bias_grad:
        primals["bias"] = masks.bias
    b, h, len_q, _ = backend.ops.shape(d_output)
    with_lse = d_lse is not None

    def forward(x):
        f = feats._replace(lse=with_lse, past_key=x.get("past_key"),
                           past_value=x.get("past_value"), sinks=x.get("sinks"))
        res = backend.computation.sdpa(x["q"], x["k"], x["v"],
                                       masks._replace(bias=x.get("bias", masks.bias)), f)
        if not with_lse:
            return res.output
        ops = backend.ops
        return ops.concat([res.output, ops.reshape(res.lse, (b, h, len_q, 1))], axis=-1)

    ops = backend.ops
    cotangent = (ops.concat([d_output, ops.reshape(d_lse, (b, h, len_q, 1))], axis=-1)
                 if with_lse else d_output)
    return vjp(backend, forward, primals, cotangent)


def vjp(backend, fn, primals: dict, cotangent) -> dict:
    """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` by ``backend.ops.vjp`` (the
    framework's autodiff); ``NotImplementedError`` for a backend whose ops have none."""
    if not callable(getattr(backend.ops, "vjp", None)):
        raise NotImplementedError(f"{backend.name}: no automatic differentiation (capability "
                                  f"'grad')")
    return dict(backend.ops.vjp(fn, primals, cotangent))
