"""The 50-digit mpmath reference for one attention head with spec 1.2's features, and the seeded
inputs, shared by tests/test_oracle_mpmath.py and tests/test_oracle_mpmath_serving.py.

Each reference is written from the clause's equation (spec/clauses.toml) with plain loops and
50-digit mpmath; none calls the oracle's helpers. Importing this module sets mpmath.mp.dps = 50.
"""

from __future__ import annotations

import mpmath
import numpy as np

mpmath.mp.dps = 50


def mp_head(q, k, v, scale, *, allowed=lambda i, j: True, bias=lambda i, j: 0.0, softcap=None):
    """One head in mpmath with soft-capping and the log-sum-exp.

    q (L_q, d_k), k (L_K, d_k), v (L_K, d_v); allowed(i, j) -> bool, bias(i, j) -> float.
    Returns (out (L_q, d_v), weights (L_q, L_K), lse (L_q,)), lse -inf for an empty row."""
    l_q, l_k = q.shape[0], k.shape[0]
    out, weights = np.zeros((l_q, v.shape[1])), np.zeros((l_q, l_k))
    lse = np.full(l_q, -np.inf)
    s = mpmath.mpf(scale)
    for i in range(l_q):
        keep = [j for j in range(l_k) if allowed(i, j) and bias(i, j) != -np.inf]
        if not keep:
            continue
        logits = {}
        for j in keep:
            raw = mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(c) for a, c in zip(q[i], k[j])) * s
            if softcap is not None:
                cap = mpmath.mpf(softcap)
                raw = cap * mpmath.tanh(raw / cap)
            logits[j] = raw + mpmath.mpf(bias(i, j))
        total = mpmath.fsum(mpmath.exp(x) for x in logits.values())
        lse[i] = float(mpmath.log(total))
        for j in keep:
            weights[i, j] = float(mpmath.exp(logits[j]) / total)
        for c in range(v.shape[1]):
            out[i, c] = float(mpmath.fsum(mpmath.exp(logits[j]) / total * mpmath.mpf(v[j, c])
                                          for j in keep))
    return out, weights, lse


def assert_head_matches(result, b, h, ref):
    out, weights, lse = ref
    np.testing.assert_allclose(result.output[b, h], out, rtol=0, atol=1e-14)
    np.testing.assert_allclose(result.weights[b, h], weights, rtol=0, atol=1e-15)
    np.testing.assert_allclose(result.lse[b, h], lse, rtol=1e-14, atol=1e-14)

def qkv(seed, *, b=1, h=2, g=None, lq=3, lk=5, dk=3, dv=2, spread=2.0):
    """Seeded q (b, h, lq, dk) and k, v with g key/value heads (g = h when None)."""
    rng = np.random.default_rng(seed)
    g = h if g is None else g
    return (rng.standard_normal((b, h, lq, dk)) * spread, rng.standard_normal((b, g, lk, dk)) * spread,
            rng.standard_normal((b, g, lk, dv)))
