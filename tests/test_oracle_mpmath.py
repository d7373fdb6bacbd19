"""The float64 oracle against 50-digit mpmath arithmetic on tiny cases, masks included."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from mhaspec.spec import oracle

mpmath.mp.dps = 50


def mp_attention(q, k, v, allowed, bias, scale):
    """One head in mpmath: q (L_q, d_k), k (L_k, d_k), v (L_k, d_v), allowed (L_q, L_k) bool."""
    out = np.zeros((q.shape[0], v.shape[1]))
    weights = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        logits = [mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(q[i], k[j])) * scale
                  + mpmath.mpf(bias[i, j]) for j in range(k.shape[0])]
        keep = [j for j in range(k.shape[0]) if allowed[i, j]]
        if not keep:
            continue
        m = max(logits[j] for j in keep)
        e = {j: mpmath.exp(logits[j] - m) for j in keep}
        total = mpmath.fsum(e.values())
        for j in keep:
            weights[i, j] = float(e[j] / total)
        for c in range(v.shape[1]):
            out[i, c] = float(mpmath.fsum(e[j] / total * mpmath.mpf(v[j, c]) for j in keep))
    return out, weights


@pytest.mark.parametrize("seed", range(12))
def test_oracle_attention_matches_mpmath(seed):
    rng = np.random.default_rng(seed)
    b, h, lq, lk, dk, dv = 1, 2, int(rng.integers(1, 5)), int(rng.integers(1, 6)), 3, 2
    q, k = rng.standard_normal((b, h, lq, dk)) * 3, rng.standard_normal((b, h, lk, dk)) * 3
    v = rng.standard_normal((b, h, lk, dv))
    mask = rng.random((lq, lk)) < 0.7
    bias = rng.standard_normal((b, h, lq, lk))
    causal = ("top_left", "bottom_right", None)[seed % 3]
    scale = 0.7 if seed % 2 else None
    out, w = oracle.attention(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale)
    allowed = oracle.allowed_mask(b, h, lq, lk, mask=mask, causal=causal)
    s = mpmath.mpf(scale) if scale else 1 / mpmath.sqrt(dk)
    for hi in range(h):
        mo, mw = mp_attention(q[0, hi], k[0, hi], v[0, hi], allowed[0, hi], bias[0, hi], s)
        np.testing.assert_allclose(out[0, hi], mo, rtol=0, atol=1e-14)
        np.testing.assert_allclose(w[0, hi], mw, rtol=0, atol=1e-15)


def test_causal_alignments_follow_the_spec():
    """MASK-6/7 by hand: L_q = 2, L_k = 4."""
    tl = oracle.allowed_mask(1, 1, 2, 4, causal="top_left")[0, 0]
    br = oracle.allowed_mask(1, 1, 2, 4, causal="bottom_right")[0, 0]
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_fully_masked_row_gives_zero_output_and_weights():
    q = np.ones((1, 1, 2, 2))
    out, w = oracle.attention(q, q, q, mask=np.array([[False, False], [True, False]]))
    assert np.all(out[0, 0, 0] == 0) and np.all(w[0, 0, 0] == 0)
    assert w[0, 0, 1].tolist() == [1.0, 0.0]


def test_legacy_mask_is_applied_as_minus_1e9():
    """MASK-4 (a): a fully blocked legacy row is the unmasked softmax in float64, uniform in float32."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 1, 4)) for _ in range(3))
    k = rng.standard_normal((1, 1, 3, 4))
    v = rng.standard_normal((1, 1, 3, 2))
    blocked = np.ones((1, 3))
    _, w64 = oracle.attention(q, k, v, legacy_mask=blocked)
    _, plain = oracle.attention(q, k, v)
    np.testing.assert_allclose(w64, plain, atol=1e-6)
    _, w32 = oracle.attention(q, k, v, legacy_mask=blocked, precision="float32")
    np.testing.assert_allclose(w32, np.full((1, 1, 1, 3), 1 / 3), atol=1e-7)


def test_mha_per_head_definition_by_hand():
    """MHA-1 with h=2 computed directly from the equation, without the oracle's helpers."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 4))
    p = oracle.Params(*(rng.standard_normal((4, 4)) for _ in range(4)), b_o=rng.standard_normal(4))
    out, w = oracle.multi_head_attention(x, x, x, p, num_heads=2)
    heads = []
    for i in range(2):
        cols = slice(2 * i, 2 * i + 2)
        qi, ki, vi = x[0] @ p.w_q[:, cols], x[0] @ p.w_k[:, cols], x[0] @ p.w_v[:, cols]
        s = qi @ ki.T / math.sqrt(2)
        pr = np.exp(s - s.max(1, keepdims=True))
        pr /= pr.sum(1, keepdims=True)
        np.testing.assert_allclose(w[0, i], pr, atol=1e-15)
        heads.append(pr @ vi)
    np.testing.assert_allclose(out[0], np.concatenate(heads, 1) @ p.w_o + p.b_o, atol=1e-14)


def test_split_and_combine_heads_are_inverse():
    x = np.arange(2 * 3 * 6, dtype=float).reshape(2, 3, 6)
    y = oracle.split_heads(x, 3)
    assert y.shape == (2, 3, 3, 2) and y[0, 1, 0].tolist() == [2.0, 3.0]
    np.testing.assert_array_equal(oracle.combine_heads(y), x)


def test_bfloat16_rounding_is_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.005859375, 1.0078125, -3.14159, 65504.0], dtype=np.float32)
    got = oracle.round_to_bfloat16(x)
    assert got[:4].tolist() == [1.0, 1.0, 1.0078125, 1.0078125]  # tie to even, then up
    assert got[4] == np.float32(-3.140625)
