"""The hand-written NumPy backward pass of attention (GRAD-3 to GRAD-9, SINK-3; spec 1.3).

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k keys attended, d_k / d_v per-head widths.

Per row, with X = s Q K^T, T = tanh(X / c) (soft-capping), S = c T + additive terms, the allowed
set A, the sink sigma (or none) and Z = e^sigma + sum_{j in A} e^S_ij::

    P = e^S / Z on A (0 elsewhere)   O = P V   lse = log Z   P_sink = e^sigma / Z
    D = rowsum(dO * O)   dS = P * (dO V^T - D + dlse)   dX = dS * (1 - T^2)
    dQ = s dX K   dK = s dX^T Q   dV = P^T dO   d sigma = sum P_sink * (dlse - D)

float16 inputs are computed in float32 (D and the softmax statistics included) and the gradients
rounded once. :func:`dense_vjp` runs all heads at once (the batched backend, k and v repeated per
group and the gradients summed back) or head by head (the per-head backend).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import algorithms


class Grads(NamedTuple):
    """dq (B, h, L_q, d_k); dk (B, g, L_K, d_k), dv (B, g, L_K, d_v) of the keys attended;
    d_sinks (h,) or None; d_scores (B, h, L_q, L_K) = dS, or None unless asked for."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    d_sinks: np.ndarray | None
    d_scores: np.ndarray | None


def attention_vjp(backend, q, k, v, d_output, d_lse, masks, feats, bias_grad: bool) -> dict:
    """The gradients of a validated call of a NumPy ``ArrayBackend`` (``masks``: ``MaskArgs``,
    ``feats``: ``Features``): the features folded into one allowed mask and the additive terms
    exactly as the forward pass folds them (``fold_features``), then :func:`dense_vjp` (head by
    head for the per-head algorithm)."""
    len_q, len_k = q.shape[2], k.shape[2]
    masks, index = backend.fold_features(q, masks, feats, len_q, len_k)
    k_all, v_all = k, v
    if feats.cached:
        index = None if index is None else backend.ops.constant(index, q)
        k_all = algorithms.present(backend.ops, feats.past_key, k, index)
        v_all = algorithms.present(backend.ops, feats.past_value, v, index)
    additive = backend.algorithm_object.additive_terms(backend.ops, masks)
    grads = dense_vjp(q, k_all, v_all, d_output, d_lse, masks.mask, additive, masks.scale,
                      masks.softcap, feats.sinks,
                      per_head=backend.algorithm is algorithms.Algorithm.PER_HEAD,
                      scores=bias_grad)
    return gradient_dict(q.dtype, grads, feats, len_k, bias=masks.bias if bias_grad else None)


def gradient_dict(dtype, grads: Grads, feats, len_k: int, bias=None) -> dict:
    """The result of ``attention_vjp`` in ``dtype``: q, k, v, and sinks, the past cache (the
    present cache's gradient split back, CACHE-1) and the bias where the call has them."""
    out = {"q": grads.dq, "k": grads.dk, "v": grads.dv}
    if feats.cached:
        out["k"], out["past_key"] = split_present(grads.dk, feats.past_lengths, feats.len_past,
                                                  len_k)
        out["v"], out["past_value"] = split_present(grads.dv, feats.past_lengths, feats.len_past,
                                                    len_k)
    if grads.d_sinks is not None:
        out["sinks"] = grads.d_sinks
    if bias is not None:
        out["bias"] = sum_to_shape(grads.d_scores, np.shape(bias))
    return {n: g.astype(dtype, copy=False) for n, g in out.items()}


def dense_vjp(q, k, v, d_out, d_lse, allowed, additive, scale: float, softcap, sinks, *,
              per_head: bool, scores: bool = False) -> Grads:
    """q (B, h, L_q, d_k), k (B, g, L_K, d_k), v (B, g, L_K, d_v), d_out (B, h, L_q, d_v), d_lse
    (B, h, L_q) or None; ``allowed`` boolean broadcastable to (B, h, L_q, L_K) or None;
    ``additive`` arrays broadcastable to it; ``sinks`` float64 (h,) or None -> :class:`Grads` in
    the working precision (float32 for float16 inputs). ``scores``: also return dS."""
    work = np.promote_types(q.dtype, np.float32)
    q, k, v, d_out = (np.asarray(x, dtype=work) for x in (q, k, v, d_out))
    b, h, len_q, _ = q.shape
    g, len_k = k.shape[1], k.shape[2]
    group = h // g
    full = (b, h, len_q, len_k)
    allowed = None if allowed is None else np.broadcast_to(allowed, full)
    additive = [np.broadcast_to(np.asarray(t, dtype=work), full) for t in additive]
    d_lse = None if d_lse is None else np.asarray(d_lse, dtype=work)
    sinks = None if sinks is None else np.asarray(sinks, dtype=work)
    if not per_head:  # all heads at once: k and v repeated per group, gradients summed back
        rep = (np.repeat(k, group, axis=1), np.repeat(v, group, axis=1))
        dq, dk, dv, d_sink, d_s = head_vjp(q, *rep, d_out, d_lse, allowed, additive, scale,
                                           softcap, None if sinks is None else sinks[:, None])
        dk = dk.reshape(b, g, group, len_k, -1).sum(axis=2)
        dv = dv.reshape(b, g, group, len_k, -1).sum(axis=2)
        return Grads(dq, dk, dv, None if d_sink is None else d_sink.sum(axis=(0, 2)),
                     d_s if scores else None)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    d_sinks = None if sinks is None else np.zeros(h, dtype=work)
    d_scores = np.zeros(full, dtype=work) if scores else None
    for i in range(h):
        j = i // group
        dq[:, i], dk_i, dv_i, d_sink, d_s = head_vjp(
            q[:, i], k[:, j], v[:, j], d_out[:, i], None if d_lse is None else d_lse[:, i],
            None if allowed is None else allowed[:, i], [t[:, i] for t in additive], scale,
            softcap, None if sinks is None else sinks[i])
        dk[:, j] += dk_i
        dv[:, j] += dv_i
        if d_sinks is not None:
            d_sinks[i] = d_sink.sum()
        if scores:
            d_scores[:, i] = d_s
    return Grads(dq, dk, dv, d_sinks, d_scores)


def head_vjp(q, k, v, d_out, d_lse, allowed, additive, scale: float, softcap, sink):
    """One attention over the last two axes (any leading axes, all in the working dtype): q
    (..., L_q, d_k), k (..., L_K, d_k), v (..., L_K, d_v), d_out (..., L_q, d_v), d_lse (..., L_q)
    or None, allowed (..., L_q, L_K) or None, ``sink`` a logit broadcastable to (..., 1) or None
    -> (dq, dk, dv, d_sink (..., L_q) or None, dS)."""
    dt = q.dtype.type
    x = np.matmul(q, np.swapaxes(k, -1, -2)) * dt(scale)
    tanh = None if softcap is None else np.tanh(x / dt(softcap))
    logits = x if tanh is None else tanh * dt(softcap)
    for term in additive:
        logits = logits + term
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True, initial=-np.inf)
    if sink is not None:
        sink = np.broadcast_to(np.asarray(sink, dtype=q.dtype)[..., None], row_max.shape)
        row_max = np.maximum(row_max, sink)
    row_max = np.where(np.isfinite(row_max), row_max, 0)
    e = np.exp(logits - row_max)
    total = e.sum(axis=-1, keepdims=True)
    sink_e = None if sink is None else np.exp(sink - row_max)
    if sink_e is not None:
        total = total + sink_e
    safe = np.where(total != 0, total, 1)
    probs = e / safe
    out = np.matmul(probs, v)
    row = -np.sum(d_out * out, axis=-1, keepdims=True)  # -D_i, then + dlse_i
    if d_lse is not None:
        row = row + d_lse[..., None]
    d_s = probs * (np.matmul(d_out, np.swapaxes(v, -1, -2)) + row)
    d_x = d_s if tanh is None else d_s * (1 - tanh * tanh)
    dq = np.matmul(d_x, k) * dt(scale)
    dk = np.matmul(np.swapaxes(d_x, -1, -2), q) * dt(scale)
    dv = np.matmul(np.swapaxes(probs, -1, -2), d_out)
    d_sink = None if sink_e is None else (sink_e / safe * row)[..., 0]
    return dq, dk, dv, d_sink, d_s


def split_present(d_present, past_lengths, len_past: int, len_k: int):
    """The present cache's gradient (B, g, L_past + L_k, d) -> (new (B, g, L_k, d), past (B, g,
    L_past, d)): present slot j < past_lengths[b] is past slot j, the next L_k slots the new
    entries (CACHE-1); past slots at or beyond past_lengths[b] get exact zeros."""
    b, g, _, d = d_present.shape
    new = np.empty((b, g, len_k, d), dtype=d_present.dtype)
    past = np.zeros((b, g, len_past, d), dtype=d_present.dtype)
    for bi, p in enumerate(np.asarray(past_lengths, dtype=np.int64)):
        past[bi, :, :p] = d_present[bi, :, :p]
        new[bi] = d_present[bi, :, p:p + len_k]
    return new, past


def sum_to_shape(full: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """full (B, h, L_q, L_K) summed over the axes along which an array of ``shape`` broadcasts."""
    padded = (1,) * (full.ndim - len(shape)) + tuple(shape)
    axes = tuple(a for a, n in enumerate(padded) if n == 1 and full.shape[a] != 1)
    return np.sum(full, axis=axes, keepdims=True).reshape(shape)
