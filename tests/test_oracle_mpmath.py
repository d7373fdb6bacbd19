"""The float64 oracle against 50-digit mpmath arithmetic on tiny cases, masks included: the spec
1.1 core and the spec 1.2 masking features (GQA, soft-capping, windows, ALiBi, segments and
sequence lengths), also against their explicit mask and bias."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from mhaspec.spec import oracle
from mpmath_reference import assert_head_matches, mp_head, qkv  # sets mpmath.mp.dps = 50


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


# ---------------------------------------------------------------- spec 1.2 features
# The reference mp_head (tests/mpmath_reference.py) is written from the clause's equation
# (spec/clauses.toml) with plain loops and 50-digit mpmath; none calls the oracle's helpers.


@pytest.mark.parametrize("h,g", [(4, 2), (4, 1), (6, 3), (3, 3)])
def test_gqa_in_sdpa_matches_mpmath(h, g):
    """GQA-1: query head i attends with key/value head i // (h / g)."""
    q, k, v = qkv(h * 10 + g, h=h, g=g)
    res = oracle.attention_result(q, k, v, causal="bottom_right")
    for i in range(h):
        kv = i // (h // g)
        ref = mp_head(q[0, i], k[0, kv], v[0, kv], 1 / math.sqrt(3),
                      allowed=lambda a, j: j <= a + 2)
        assert_head_matches(res, 0, i, ref)
    out, w = oracle.attention(q, k, v, causal="bottom_right")
    np.testing.assert_array_equal(out, res.output)
    np.testing.assert_array_equal(w, res.weights)


@pytest.mark.parametrize("softcap", [0.3, 2.0, 50.0])
def test_softcap_matches_mpmath_and_comes_before_bias_and_masks(softcap):
    """SOFTCAP-1: S = c tanh(s q.k / c) + bias; -inf bias and False mask stay excluded."""
    q, k, v = qkv(7, spread=3.0)
    rng = np.random.default_rng(8)
    bias = rng.standard_normal((1, 2, 3, 5))
    bias[0, :, 1, 2] = -np.inf
    mask = np.ones((3, 5), bool)
    mask[2, 0] = False
    res = oracle.attention_result(q, k, v, bias=bias, mask=mask, softcap=softcap, scale=0.9)
    for i in range(2):
        ref = mp_head(q[0, i], k[0, i], v[0, i], 0.9, softcap=softcap,
                      allowed=lambda a, j: mask[a, j], bias=lambda a, j: bias[0, i, a, j])
        assert_head_matches(res, 0, i, ref)
    assert res.weights[0, 0, 1, 2] == 0 and res.weights[0, 0, 2, 0] == 0


WINDOWS = [(0, 0), (1, 0), (0, 2), (None, 1), (2, None), (None, None), (9, 9)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("causal", [False, True])
def test_window_matches_mpmath(window, alignment, causal):
    """WIN-1: key j visible to query i iff i + o - left <= j <= i + o + right, o = 0 (top_left)
    or L_k - L_q (bottom_right), AND the causal mask of the same alignment when given."""
    q, k, v = qkv(11)
    left, right = window
    o = 0 if alignment == "top_left" else 5 - 3

    def allowed(i, j):
        ok = (left is None or j >= i + o - left) and (right is None or j <= i + o + right)
        return ok and (not causal or j <= i + o)

    kw = {"causal": alignment} if causal else {"alignment": alignment}
    res = oracle.attention_result(q, k, v, window=window, **kw)
    for i in range(2):
        assert_head_matches(res, 0, i, mp_head(q[0, i], k[0, i], v[0, i], 1 / math.sqrt(3),
                                               allowed=allowed))


def test_window_by_hand():
    """WIN-1 pinned: L_q = 3, L_k = 5, window (1, 0)."""
    q, k, v = qkv(0)
    tl = oracle.attention_result(q, k, v, window=(1, 0), alignment="top_left").weights[0, 0] > 0
    br = oracle.attention_result(q, k, v, window=(1, 0), alignment="bottom_right").weights[0, 0] > 0
    assert tl.astype(int).tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
    assert br.astype(int).tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("slopes_shape", ["per_head", "per_batch"])
def test_alibi_matches_mpmath(alignment, slopes_shape):
    """ALIBI-1: bias -m_h |i + o - j| (FlashAttention's alibi_slopes, o = L_k - L_q)."""
    q, k, v = qkv(13, b=2)
    slopes = np.array([0.5, 0.0625]) if slopes_shape == "per_head" else np.array([[0.5, 0.0], [1.5, 0.25]])
    m = np.broadcast_to(slopes, (2, 2))
    o = 0 if alignment == "top_left" else 2
    res = oracle.attention_result(q, k, v, alibi_slopes=slopes, alignment=alignment)
    for b in range(2):
        for i in range(2):
            ref = mp_head(q[b, i], k[b, i], v[b, i], 1 / math.sqrt(3),
                          bias=lambda a, j: -m[b, i] * abs(a + o - j))
            assert_head_matches(res, b, i, ref)


def test_alibi_equals_its_explicit_bias_and_the_causal_form():
    """ALIBI-2: slopes equal the explicit bias; under causal masking the one-sided form
    -m (i + o - j) (the ALiBi paper's) gives the same result."""
    q, k, v = qkv(17)
    slopes = np.array([0.25, 1.0])
    i = np.arange(3)[:, None]
    j = np.arange(5)[None, :]
    explicit = -slopes[:, None, None] * np.abs(i + 2 - j)
    a = oracle.attention(q, k, v, alibi_slopes=slopes, causal="bottom_right")
    b = oracle.attention(q, k, v, bias=explicit[None], causal="bottom_right")
    c = oracle.attention(q, k, v, bias=(-slopes[:, None, None] * (i + 2 - j))[None], causal="bottom_right")
    for x, y in ((a, b), (a, c)):
        np.testing.assert_allclose(x[0], y[0], rtol=0, atol=1e-15)
        np.testing.assert_allclose(x[1], y[1], rtol=0, atol=1e-15)


def _rank(ids, valid, t):
    return sum(1 for u in range(t) if valid[u] and ids[u] == ids[t])


@pytest.mark.parametrize("alignment", [None, "top_left", "bottom_right"])
def test_segments_match_mpmath(alignment):
    """SEG-1, SEG-3: attend only within a segment (per batch item); causal positions count within
    the segment, bottom-right offset n_k(s) - n_q(s)."""
    q, k, v = qkv(19, b=2, lq=5, lk=6)
    q_ids = np.array([[0, 0, 1, 1, 1], [3, 3, 3, 7, 7]])
    k_ids = np.array([[0, 1, 1, 1, 1, 0], [7, 3, 3, 7, 7, 9]])
    res = oracle.attention_result(q, k, v, q_segment_ids=q_ids, kv_segment_ids=k_ids, causal=alignment)
    ones_q, ones_k = [True] * 5, [True] * 6
    for b in range(2):
        def allowed(i, j, b=b):
            if q_ids[b, i] != k_ids[b, j]:
                return False
            if alignment is None:
                return True
            s = q_ids[b, i]
            o = 0 if alignment == "top_left" else \
                sum(k_ids[b] == s) - sum(q_ids[b] == s)
            return _rank(k_ids[b], ones_k, j) <= _rank(q_ids[b], ones_q, i) + o
        for i in range(2):
            assert_head_matches(res, b, i, mp_head(q[b, i], k[b, i], v[b, i], 1 / math.sqrt(3),
                                                   allowed=allowed))


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_sequence_lengths_match_mpmath(causal):
    """SEG-2: queries i >= query_seq_lengths[b] and keys j >= key_value_seq_lengths[b] take part
    in nothing (zero rows); causal aligns to the valid lengths (ONNX nonpad_kv_seqlen)."""
    q, k, v = qkv(23, b=3, lq=4, lk=6)
    ql, kl = np.array([4, 2, 3]), np.array([6, 3, 1])
    res = oracle.attention_result(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl,
                                  causal=causal)
    for b in range(3):
        o = 0 if causal != "bottom_right" else kl[b] - ql[b]

        def allowed(i, j, b=b, o=o):
            return i < ql[b] and j < kl[b] and (causal is None or j <= i + o)
        for i in range(2):
            assert_head_matches(res, b, i, mp_head(q[b, i], k[b, i], v[b, i], 1 / math.sqrt(3),
                                                   allowed=allowed))


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_packed_call_equals_separate_calls(causal):
    """SEG-4: packing sequences by segment ids gives each sequence's separate result, with its
    own causal alignment, window and ALiBi positions."""
    rng = np.random.default_rng(29)
    lens_q, lens_k = [2, 3, 1], [4, 3, 2]
    q = rng.standard_normal((1, 2, sum(lens_q), 3))
    k = rng.standard_normal((1, 2, sum(lens_k), 3))
    v = rng.standard_normal((1, 2, sum(lens_k), 2))
    q_ids = np.repeat([[5, 1, 8]], lens_q, axis=1)
    k_ids = np.repeat([[5, 1, 8]], lens_k, axis=1)
    kw = {"causal": causal, "window": (1, 1), "alibi_slopes": np.array([0.5, 0.25])}
    if causal is None:
        kw["alignment"] = "bottom_right"
    packed = oracle.attention_result(q, k, v, q_segment_ids=q_ids, kv_segment_ids=k_ids, **kw)
    qs, ks = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    for n in range(3):
        part = oracle.attention_result(q[:, :, qs[n]:qs[n + 1]], k[:, :, ks[n]:ks[n + 1]],
                                       v[:, :, ks[n]:ks[n + 1]], **kw)
        np.testing.assert_allclose(packed.output[:, :, qs[n]:qs[n + 1]], part.output, atol=1e-15)
        np.testing.assert_allclose(packed.lse[:, :, qs[n]:qs[n + 1]], part.lse, atol=1e-14)
        np.testing.assert_allclose(packed.weights[:, :, qs[n]:qs[n + 1], ks[n]:ks[n + 1]],
                                   part.weights, atol=1e-15)


def test_lengths_equal_their_segment_ids():
    """SEG-2: the length form is the segment-id form with one segment and padding."""
    q, k, v = qkv(31, b=2, lq=4, lk=5)
    ql, kl = np.array([3, 4]), np.array([5, 2])
    a = oracle.attention_result(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl,
                                causal="bottom_right")
    q_ids = np.where(np.arange(4)[None] < ql[:, None], 0, -1)
    k_ids = np.where(np.arange(5)[None] < kl[:, None], 0, -2)
    b = oracle.attention_result(q, k, v, q_segment_ids=q_ids, kv_segment_ids=k_ids,
                                causal="bottom_right")
    np.testing.assert_array_equal(a.output, b.output)
    np.testing.assert_array_equal(a.weights, b.weights)


def _explicit_positions(ids_q, ids_k, n_valid_q, n_valid_k, alignment):
    """SEG-3 by plain loops for one batch item: (same (L_q, L_k), p_q (L_q,), p_k (L_k,))."""
    valid_q = [i < n_valid_q for i in range(len(ids_q))]
    valid_k = [j < n_valid_k for j in range(len(ids_k))]
    p_q = [sum(1 for u in range(i) if valid_q[u] and ids_q[u] == ids_q[i]) for i in range(len(ids_q))]
    p_k = [sum(1 for u in range(j) if valid_k[u] and ids_k[u] == ids_k[j]) for j in range(len(ids_k))]
    if alignment == "bottom_right":
        for i, s in enumerate(ids_q):
            n_q = sum(1 for u in range(len(ids_q)) if valid_q[u] and ids_q[u] == s)
            n_k = sum(1 for u in range(len(ids_k)) if valid_k[u] and ids_k[u] == s)
            p_q[i] += n_k - n_q
    same = np.array([[valid_q[i] and valid_k[j] and ids_q[i] == ids_k[j] for j in range(len(ids_k))]
                     for i in range(len(ids_q))])
    return same, p_q, p_k


@pytest.mark.parametrize("seed", range(40))
def test_features_equal_their_explicit_mask_and_bias(seed):
    """GQA-1, WIN-1, ALIBI-1/2, SEG-1..3 on random shapes: the features equal the 1.1 oracle given
    the explicit boolean mask and bias the clauses define, with key/value heads repeated."""
    rng = np.random.default_rng(1000 + seed)
    b, g = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    h = g * int(rng.integers(1, 3))
    lq, lk = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    q, k, v = rng.standard_normal((b, h, lq, 3)) * 2, rng.standard_normal((b, g, lk, 3)) * 2, \
        rng.standard_normal((b, g, lk, 2))
    alignment = ("top_left", "bottom_right")[seed % 2]
    causal = alignment if seed % 3 else None
    window = tuple(None if rng.random() < 0.3 else int(rng.integers(0, 4)) for _ in range(2))
    slopes = rng.random((b, h)) * (seed % 4 != 0)
    ids_q, ids_k = rng.integers(0, 3, (b, lq)), rng.integers(0, 3, (b, lk))
    ql, kl = rng.integers(0, lq + 1, b), rng.integers(0, lk + 1, b)
    res = oracle.attention_result(q, k, v, causal=causal, alignment=alignment, window=window,
                                  alibi_slopes=slopes, q_segment_ids=ids_q, kv_segment_ids=ids_k,
                                  query_seq_lengths=ql, key_value_seq_lengths=kl)
    allowed = np.zeros((b, h, lq, lk), bool)
    bias = np.zeros((b, h, lq, lk))
    for bi in range(b):
        same, p_q, p_k = _explicit_positions(ids_q[bi], ids_k[bi], ql[bi], kl[bi], alignment)
        for i in range(lq):
            for j in range(lk):
                ok = same[i, j] and (causal is None or p_k[j] <= p_q[i])
                ok = ok and (window[0] is None or p_k[j] >= p_q[i] - window[0])
                ok = ok and (window[1] is None or p_k[j] <= p_q[i] + window[1])
                allowed[bi, :, i, j] = ok
                bias[bi, :, i, j] = -slopes[bi] * abs(p_q[i] - p_k[j])
    rep = h // g
    out, w = oracle.attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1),
                              mask=allowed, bias=bias)
    np.testing.assert_allclose(res.output, out, rtol=0, atol=1e-14)
    np.testing.assert_allclose(res.weights, w, rtol=0, atol=1e-15)
