"""The analytic gradient of multi-head attention (spec chapter GRAD), written from the chain rule.

Axis legend: B batch, L_q query length, L_k key/value length, h heads, g key/value heads
(``num_kv_heads``, MHA-6; ``g = h`` without grouping), d_model / k_dim / v_dim input widths,
d_k / d_v per-head widths, d_out output width.

For a fixed cotangent ``G (B, L_q, d_out)`` the loss is ``L = sum(MultiHead(query, key, value) * G)``.
Per batch item and head, with ``S = s Q K^T + beta``, ``P = softmax(S)`` over the allowed keys
(a row with no allowed key is 0, MASK-9) and ``O = P V``:

    dY = G                       dW_o = O_cat^T dY          db_o = sum of dY over (B, L_q)
    dO_cat = dY W_o^T            dO   = head i's column block of dO_cat
    dV = P^T dO                  dP   = dO V^T
    dS = P * (dP - rowsum(dP * P))                          (0 wherever P is 0)
    dQ = s dS K                  dK   = s dS^T Q
    dW_x[:, cols] += x^T dX_i    db_x[cols] += sum of dX_i   d(x) += dX_i W_x[:, cols]^T

for x in (query, key, value) and X in (Q, K, V). With grouped heads the key/value column block of
query head ``i`` is ``i // (h / g)``, so several heads add into the same block. ``query``, ``key``
and ``value`` are separate arguments: for self-attention the total derivative is their sum.

Like :mod:`mhaspec.spec.oracle` this module shares no code with any backend; it takes the mask
helpers of the oracle. It loops over batch items and heads. ``precision="float32"`` runs the same
steps in float32: the tolerance rule for gradients (GRAD-1) measures that error, as NUM-3 does.
``"float16"`` and ``"bfloat16"`` (GRAD-10, spec 1.4) hold the inputs, the parameters and the
cotangent in the dtype and accumulate every product in float32, rounding to the dtype where
kernels round (as :mod:`mhaspec.spec.oracle_vjp` does for attention): each projection, the logits,
P and the output; dP and rowsum(dP * P) stay in float32, dS is rounded before the dQ/dK products,
and the gradients are summed in float32 over heads and batch items and rounded once at the end.
"""

from __future__ import annotations

import math

import numpy as np

from .oracle import LEGACY_MASK_VALUE, Params, allowed_mask, head_slice, rounding

GRAD_NAMES = ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")

#: the precisions of :func:`mha_vjp` (module docstring)
PRECISIONS = ("float64", "float32", "float16", "bfloat16")


def _softmax(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Row softmax of (L_q, L_k) over ``allowed`` (and finite logits); an empty row is 0."""
    allowed = allowed & (logits != -np.inf)
    p = np.zeros_like(logits)
    for r in range(logits.shape[0]):
        keep = allowed[r]
        if keep.any():
            e = np.exp(logits[r, keep] - np.max(logits[r, keep]))
            p[r, keep] = e / np.sum(e)
    return p


def _additive(term, bi: int, head: int, full_head: tuple[int, int], dt) -> np.ndarray | 0.0:
    """Batch item ``bi``, head ``head`` of a bias-like term broadcastable to (B, h, L_q, L_k)."""
    if term is None:
        return 0.0
    t = head_slice(np.asarray(term, dtype=dt), head)
    return np.broadcast_to(t[bi if t.shape[0] > 1 else 0, 0], full_head)


def mha_vjp(query, key, value, params: Params, cotangent, *, num_heads: int,
            num_kv_heads: int | None = None, mask=None, bias=None, legacy_mask=None,
            key_padding_mask=None, causal=None, scale=None, precision: str = "float64",
            info: dict | None = None):
    """Output and gradients of ``sum(MultiHead(...) * cotangent)``.

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim), cotangent (B, L_q, d_out)
    -> (output (B, L_q, d_out), {name: gradient} for the names of :data:`GRAD_NAMES` whose
    argument is present; an absent bias has no entry). ``precision``: one of :data:`PRECISIONS`.
    ``info``, when given, receives ``"max_abs_logit"``: the largest ``|s q.k + bias|`` over the
    allowed pairs of every head (the legacy mask's offset left out), the condition factor of GRAD-1.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {list(PRECISIONS)}, got {precision!r}")
    dt, rnd = rounding(precision)
    x_in = {n: rnd(np.asarray(x, dt)) for n, x in (("query", query), ("key", key),
                                                    ("value", value))}
    p = {n: None if t is None else rnd(np.asarray(t, dt)) for n, t in params._asdict().items()}
    g_out = rnd(np.asarray(cotangent, dt))
    h = num_heads
    g = h if num_kv_heads is None else num_kv_heads
    group = h // g
    d_k = p["w_q"].shape[1] // h
    d_v = p["w_v"].shape[1] // g
    b_n, l_q, _ = x_in["query"].shape
    l_k = x_in["key"].shape[1]
    s = dt(1.0 / math.sqrt(d_k) if scale is None else scale)
    allowed = allowed_mask(b_n, h, l_q, l_k, mask=mask, key_padding_mask=key_padding_mask,
                           causal=causal)
    legacy = None if legacy_mask is None else np.asarray(legacy_mask, dt) * dt(LEGACY_MASK_VALUE)

    grads = {n: np.zeros_like(x) for n, x in x_in.items()}
    grads.update({n: np.zeros_like(t) for n, t in p.items() if t is not None})

    def project(x, w, bvec, cols):
        y = rnd(x @ w[:, cols])
        return y if bvec is None else rnd(y + bvec[cols])

    def back_project(name_x, name_w, name_b, x, dy, cols):
        grads[name_w][:, cols] += x.T @ dy
        if p[name_b] is not None:
            grads[name_b][cols] += dy.sum(axis=0)
        grads[name_x][bi] += dy @ p[name_w][:, cols].T

    concat = np.zeros((b_n, l_q, h * d_v), dtype=dt)
    max_abs_logit = 0.0
    for bi in range(b_n):
        xq, xk, xv = x_in["query"][bi], x_in["key"][bi], x_in["value"][bi]
        d_concat = rnd(g_out[bi] @ p["w_o"].T)  # (L_q, h*d_v)
        for i in range(h):
            j = i // group
            qc = slice(i * d_k, (i + 1) * d_k)
            kc = slice(j * d_k, (j + 1) * d_k)
            vc = slice(j * d_v, (j + 1) * d_v)
            oc = slice(i * d_v, (i + 1) * d_v)
            q_i = project(xq, p["w_q"], p["b_q"], qc)
            k_i = project(xk, p["w_k"], p["b_k"], kc)
            v_i = project(xv, p["w_v"], p["b_v"], vc)
            logits = rnd(rnd(q_i @ k_i.T) * s)
            logits = rnd(logits + _additive(bias, bi, i, (l_q, l_k), dt))
            live = allowed[bi, i] & np.isfinite(logits)
            max_abs_logit = max(max_abs_logit, float(np.max(np.abs(logits[live]), initial=0.0)))
            logits = rnd(logits + _additive(legacy, bi, i, (l_q, l_k), dt))
            probs = rnd(_softmax(logits, allowed[bi, i]))
            concat[bi, :, oc] = rnd(probs @ v_i)
            d_o = d_concat[:, oc]
            d_v_i = rnd(probs.T @ d_o)
            d_p = d_o @ v_i.T
            d_s = rnd(probs * (d_p - np.sum(d_p * probs, axis=1, keepdims=True)))
            d_q_i = rnd((d_s @ k_i) * s)
            d_k_i = rnd((d_s.T @ q_i) * s)
            back_project("query", "w_q", "b_q", xq, d_q_i, qc)
            back_project("key", "w_k", "b_k", xk, d_k_i, kc)
            back_project("value", "w_v", "b_v", xv, d_v_i, vc)
    out = rnd(concat @ p["w_o"])
    if p["b_o"] is not None:
        out = rnd(out + p["b_o"])
    grads["w_o"] = np.einsum("blc,blo->co", concat, g_out)
    if p["b_o"] is not None:
        grads["b_o"] = g_out.sum(axis=(0, 1))
    if info is not None:
        info["max_abs_logit"] = max_abs_logit
    return out, {n: rnd(g) for n, g in grads.items()}
