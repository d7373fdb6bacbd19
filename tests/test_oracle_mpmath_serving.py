"""The float64 oracle against 50-digit mpmath for spec 1.2's serving features (the KV cache,
incremental decoding, the log-sum-exp and merging by it), multi-head attention with the features,
the neutral-argument path against 1.1, invalid arguments, and the clause coverage of
tests/test_oracle_mpmath.py and this module."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mhaspec.spec import oracle
from mpmath_reference import assert_head_matches, mp_head, qkv


@pytest.mark.parametrize("past_lengths", [None, [4, 1], [0, 4]])
def test_kv_cache_matches_mpmath(past_lengths):
    """CACHE-1, CACHE-2: the valid past then the new keys; query i at position p_b + i; causal
    allows present key j iff j <= p_b + i; the present cache is returned."""
    rng = np.random.default_rng(37)
    b, h, g, lq, lp, dk, dv = 2, 4, 2, 2, 4, 3, 2
    q = rng.standard_normal((b, h, lq, dk))
    k, v = rng.standard_normal((b, g, lq, dk)), rng.standard_normal((b, g, lq, dv))
    pk, pv = rng.standard_normal((b, g, lp, dk)), rng.standard_normal((b, g, lp, dv))
    res = oracle.attention_result(q, k, v, past_key=pk, past_value=pv, past_lengths=past_lengths,
                                  causal="bottom_right", window=(2, None))
    p = [lp, lp] if past_lengths is None else past_lengths
    assert res.present_lengths.tolist() == [p[0] + lq, p[1] + lq]
    for bi in range(b):
        keys = np.concatenate([pk[bi, :, :p[bi]], k[bi]], axis=1)
        vals = np.concatenate([pv[bi, :, :p[bi]], v[bi]], axis=1)
        pad = lp + lq - keys.shape[1]
        np.testing.assert_array_equal(res.present_key[bi], np.pad(keys, ((0, 0), (0, pad), (0, 0))))
        np.testing.assert_array_equal(res.present_value[bi], np.pad(vals, ((0, 0), (0, pad), (0, 0))))
        for i in range(h):
            kv = i // 2
            kk = np.pad(keys[kv], ((0, pad), (0, 0)))
            vv = np.pad(vals[kv], ((0, pad), (0, 0)))
            ref = mp_head(q[bi, i], kk, vv, 1 / math.sqrt(dk),
                          allowed=lambda a, j, n=p[bi]: j < n + lq and n + a - 2 <= j <= n + a)
            assert_head_matches(res, bi, i, ref)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_incremental_decoding_equals_one_causal_call(step):
    """CACHE-3: feeding a sequence `step` tokens at a time through the cache (from an empty one)
    equals one bottom-right causal call over the whole sequence, with ALiBi and a window."""
    rng = np.random.default_rng(41)
    b, h, g, n, dk, dv = 2, 4, 2, 7, 3, 2
    q = rng.standard_normal((b, h, n, dk))
    k, v = rng.standard_normal((b, g, n, dk)), rng.standard_normal((b, g, n, dv))
    kw = {"causal": "bottom_right", "window": (3, None), "alibi_slopes": np.array([0.5, 0.25, 0, 1]),
          "softcap": 4.0}
    whole = oracle.attention_result(q, k, v, **kw)
    pk, pv = np.zeros((b, g, 0, dk)), np.zeros((b, g, 0, dv))
    outs, lses = [], []
    for t in range(0, n, step):
        r = oracle.attention_result(q[:, :, t:t + step], k[:, :, t:t + step], v[:, :, t:t + step],
                                    past_key=pk, past_value=pv, **kw)
        pk, pv = r.present_key, r.present_value
        outs.append(r.output)
        lses.append(r.lse)
    np.testing.assert_allclose(np.concatenate(outs, axis=2), whole.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.concatenate(lses, axis=2), whole.lse, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(pk, k)


def test_ragged_cache_decoding_equals_separate_sequences():
    """CACHE-1: per-batch past lengths: item b continues its own sequence of p_b tokens."""
    rng = np.random.default_rng(43)
    lp, dk = 5, 3
    pk, pv = rng.standard_normal((2, 1, lp, dk)), rng.standard_normal((2, 1, lp, 2))
    q, k, v = rng.standard_normal((2, 2, 1, dk)), rng.standard_normal((2, 1, 1, dk)), rng.standard_normal((2, 1, 1, 2))
    res = oracle.attention_result(q, k, v, past_key=pk, past_value=pv, past_lengths=[2, 5],
                                  causal="bottom_right")
    for bi, p in enumerate([2, 5]):
        kk = np.concatenate([pk[bi:bi + 1, :, :p], k[bi:bi + 1]], axis=2)
        vv = np.concatenate([pv[bi:bi + 1, :, :p], v[bi:bi + 1]], axis=2)
        alone = oracle.attention_result(q[bi:bi + 1], kk, vv, causal="bottom_right")
        np.testing.assert_allclose(res.output[bi:bi + 1], alone.output, rtol=0, atol=1e-15)
        np.testing.assert_allclose(res.weights[bi, :, :, :p + 1], alone.weights[0], atol=1e-15)
        assert not res.weights[bi, :, :, p + 1:].any()


def test_lse_matches_mpmath_and_is_minus_inf_for_empty_rows():
    """LSE-1: lse_i = log sum over the allowed set of exp(S_ij) of the final logits."""
    q, k, v = qkv(47, spread=4.0)
    mask = np.ones((3, 5), bool)
    mask[1] = False
    bias = np.random.default_rng(48).standard_normal((3, 5))
    res = oracle.attention_result(q, k, v, mask=mask, bias=bias, softcap=3.0,
                                  alibi_slopes=np.array([0.3, 0.1]), alignment="top_left")
    for i in range(2):
        m = (0.3, 0.1)[i]
        ref = mp_head(q[0, i], k[0, i], v[0, i], 1 / math.sqrt(3), softcap=3.0,
                      allowed=lambda a, j: mask[a, j], bias=lambda a, j: bias[a, j] - m * abs(a - j))
        assert_head_matches(res, 0, i, ref)
    assert np.all(res.lse[0, :, 1] == -np.inf)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_merging_two_key_chunks_by_lse_equals_the_whole(split):
    """LSE-2: attention over keys [0, split) and [split, L_k) merged by their lse is the whole."""
    q, k, v = qkv(53, lq=4, lk=6)
    mask = np.random.default_rng(54).random((4, 6)) < 0.6
    mask[0] = False
    whole = oracle.attention_result(q, k, v, mask=mask, softcap=5.0)
    a = oracle.attention_result(q, k[:, :, :split], v[:, :, :split], mask=mask[:, :split], softcap=5.0)
    b = oracle.attention_result(q, k[:, :, split:], v[:, :, split:], mask=mask[:, split:], softcap=5.0)
    out, lse = oracle.merge_by_lse(a.output, a.lse, b.output, b.lse)
    np.testing.assert_allclose(out, whole.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(lse, whole.lse, rtol=1e-15, atol=1e-14)
    assert np.all(out[:, :, 0] == 0) and np.all(lse[:, :, 0] == -np.inf)


@pytest.mark.parametrize("precision", ["float64", "float32", "float32-sequential", "float16", "bfloat16"])
def test_new_path_without_features_is_the_1_1_oracle_bitwise(precision):
    """A spec 1.2 call whose new arguments are all neutral reproduces the 1.1 computation exactly,
    in every working precision (the 1.2 path and the 1.1 path share their arithmetic)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        lq, lk = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        q, k = rng.standard_normal((2, 2, lq, 4)) * 3, rng.standard_normal((2, 2, lk, 4)) * 3
        v = rng.standard_normal((2, 2, lk, 3))
        kw = {"mask": rng.random((lq, lk)) < 0.8, "bias": rng.standard_normal((2, 1, lq, lk)),
              "key_padding_mask": rng.random((2, lk)) < 0.9,
              "causal": (None, "top_left", "bottom_right")[seed % 3], "precision": precision}
        old = oracle.attention(q, k, v, **kw)
        new = oracle.attention(q, k, v, softcap=None, window=None, past_key=None, **kw)
        np.testing.assert_array_equal(old[0], new[0])
        np.testing.assert_array_equal(old[1], new[1])


def _bad(**kw):
    q, k, v = qkv(0, b=2, h=4, g=2)
    return q, k, v, kw


BAD_CALLS = {
    "softcap zero": ("softcap", {"softcap": 0.0}),
    "softcap negative": ("softcap", {"softcap": -1.0}),
    "softcap inf": ("softcap", {"softcap": float("inf")}),
    "softcap nan": ("softcap", {"softcap": float("nan")}),
    "softcap string": ("softcap", {"softcap": "1"}),
    "window negative": ("window", {"window": (-1, 0), "causal": "top_left"}),
    "window not a pair": ("window", {"window": 3, "causal": "top_left"}),
    "window float": ("window", {"window": (1.5, None), "causal": "top_left"}),
    "window without diagonal": ("alignment", {"window": (1, 1)}),
    "alignment contradicts causal": ("alignment", {"causal": "top_left", "alignment": "bottom_right"}),
    "alignment unknown": ("alignment", {"alignment": "centre", "window": (1, 1)}),
    "slopes wrong length": ("alibi_slopes", {"alibi_slopes": np.ones(2), "alignment": "top_left"}),
    "slopes nan": ("alibi_slopes", {"alibi_slopes": np.array([1, np.nan, 1, 1]), "alignment": "top_left"}),
    "q ids wrong shape": ("q_segment_ids", {"q_segment_ids": np.zeros((2, 4), int),
                                            "kv_segment_ids": np.zeros((2, 5), int)}),
    "kv ids float": ("kv_segment_ids", {"q_segment_ids": np.zeros((2, 3), int),
                                        "kv_segment_ids": np.zeros((2, 5))}),
    "ids alone": ("kv_segment_ids", {"q_segment_ids": np.zeros((2, 3), int)}),
    "length too long": ("key_value_seq_lengths", {"key_value_seq_lengths": np.array([6, 1])}),
    "length negative": ("query_seq_lengths", {"query_seq_lengths": np.array([-1, 1])}),
    "lengths wrong shape": ("query_seq_lengths", {"query_seq_lengths": np.array([1])}),
    "past_key alone": ("past_value", {"past_key": np.zeros((2, 2, 3, 3))}),
    "cache batch": ("past_key", {"past_key": np.zeros((1, 2, 3, 3)), "past_value": np.zeros((1, 2, 3, 2))}),
    "cache heads": ("past_key", {"past_key": np.zeros((2, 4, 3, 3)), "past_value": np.zeros((2, 4, 3, 2))}),
    "cache width": ("past_value", {"past_key": np.zeros((2, 2, 3, 3)), "past_value": np.zeros((2, 2, 3, 3))}),
    "cache lengths differ": ("past_value", {"past_key": np.zeros((2, 2, 3, 3)), "past_value": np.zeros((2, 2, 4, 2))}),
    "past length too long": ("past_lengths", {"past_key": np.zeros((2, 2, 3, 3)),
                                              "past_value": np.zeros((2, 2, 3, 2)), "past_lengths": [4, 1]}),
    "cache top_left": ("causal", {"past_key": np.zeros((2, 2, 3, 3)), "past_value": np.zeros((2, 2, 3, 2)),
                                  "causal": "top_left"}),
    "cache and lengths": ("past_key", {"past_key": np.zeros((2, 2, 3, 3)), "past_value": np.zeros((2, 2, 3, 2)),
                                       "key_value_seq_lengths": np.array([1, 1])}),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_invalid_new_arguments_raise_value_error_naming_them(case):
    """GQA-2, SOFTCAP-2, WIN-2, ALIBI-3, SEG-5, CACHE-4: bad spec 1.2 arguments raise ValueError naming the argument."""
    argument, kw = BAD_CALLS[case]
    q, k, v = qkv(0, b=2, h=4, g=2)
    with pytest.raises(ValueError, match=f"^{argument}:"):
        oracle.attention_result(q, k, v, **kw)


def test_kv_heads_must_divide_query_heads():
    """GQA-2: g must divide h (naming k) and v must have k's heads (naming v)."""
    q, k, v = qkv(0, h=4, g=3)
    with pytest.raises(ValueError, match="^k:"):
        oracle.attention(q, k, v)
    q, k, v = qkv(0, h=4, g=2)
    with pytest.raises(ValueError, match="^v:"):
        oracle.attention(q, k, v[:, :1])


def _mha_case(seed, *, h=4, g=2, b=2, n=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, n, 6))
    p = oracle.Params(rng.standard_normal((6, h * 3)), rng.standard_normal((6, g * 3)),
                      rng.standard_normal((6, g * 2)), rng.standard_normal((h * 2, 5)),
                      rng.standard_normal(h * 3), rng.standard_normal(g * 3), None,
                      rng.standard_normal(5))
    return x, p


def test_mha_features_by_the_per_head_definition():
    """MHA-1 with spec 1.2 features: head i is the mpmath attention of column block i of the
    query projection and block i // (h / g) of the key/value projections, softcap, window, ALiBi
    slope i and segments applied; the output is Concat(heads) W_o + b_o."""
    x, p = _mha_case(59)
    slopes = np.array([0.5, 0.25, 0.125, 0.0])
    ids = np.array([[0, 0, 0, 1, 1], [2, 2, 2, 2, 2]])
    res = oracle.multi_head_attention_result(
        x, x, x, p, num_heads=4, num_kv_heads=2, causal="top_left", softcap=1.5, window=(1, None),
        alibi_slopes=slopes, q_segment_ids=ids, kv_segment_ids=ids)
    for b in range(2):
        heads = []
        for i in range(4):
            j = i // 2
            qi = x[b] @ p.w_q[:, 3 * i:3 * i + 3] + p.b_q[3 * i:3 * i + 3]
            kj = x[b] @ p.w_k[:, 3 * j:3 * j + 3] + p.b_k[3 * j:3 * j + 3]
            vj = x[b] @ p.w_v[:, 2 * j:2 * j + 2]
            start = [0 if ids[b, t] == ids[b, 0] else 3 for t in range(5)]

            def allowed(a, c, b=b, start=start):
                return ids[b, a] == ids[b, c] and a - 1 <= c <= a

            ref = mp_head(qi, kj, vj, 1 / math.sqrt(3), softcap=1.5, allowed=allowed,
                          bias=lambda a, c, i=i, start=start: -slopes[i] * abs((a - start[a]) - (c - start[c])))
            np.testing.assert_allclose(res.weights[b, i], ref[1], rtol=0, atol=1e-14)
            np.testing.assert_allclose(res.lse[b, i], ref[2], rtol=1e-13, atol=1e-13)
            heads.append(ref[0])
        np.testing.assert_allclose(res.output[b], np.concatenate(heads, 1) @ p.w_o + p.b_o,
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("step", [1, 2])
def test_mha_incremental_decoding_equals_one_causal_call(step):
    """CACHE-3 for multi-head attention: a cache of projected keys and values, fed `step` tokens at
    a time, equals one bottom-right causal call over the whole sequence."""
    x, p = _mha_case(61, n=6)
    kw = {"num_heads": 4, "num_kv_heads": 2, "causal": "bottom_right", "window": (2, None)}
    whole = oracle.multi_head_attention_result(x, x, x, p, **kw)
    pk, pv = np.zeros((2, 2, 0, 3)), np.zeros((2, 2, 0, 2))
    outs = []
    for t in range(0, 6, step):
        xs = x[:, t:t + step]
        r = oracle.multi_head_attention_result(xs, xs, xs, p, past_key=pk, past_value=pv, **kw)
        pk, pv = r.present_key, r.present_value
        outs.append(r.output)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole.output, rtol=0, atol=1e-13)
    assert pk.shape == (2, 2, 6, 3) and pv.shape == (2, 2, 6, 2)


def test_mha_new_path_without_features_is_the_1_1_oracle_bitwise():
    for seed, prec in enumerate(["float64", "float32", "float32-sequential", "float16", "bfloat16"]):
        x, p = _mha_case(seed)
        kw = {"num_heads": 4, "num_kv_heads": 2, "causal": "top_left", "precision": prec}
        old = oracle.multi_head_attention(x, x, x, p, **kw)
        new = oracle.multi_head_attention(x, x, x, p, window=None, **kw)
        np.testing.assert_array_equal(old[0], new[0])
        np.testing.assert_array_equal(old[1], new[1])


#: The chapters spec 1.2 added for its optional features (moved from the draft into clauses.toml).
FEATURE_CHAPTERS = ("GQA", "SOFTCAP", "WIN", "ALIBI", "SEG", "CACHE", "LSE")


def test_every_testable_feature_clause_is_checked_here():
    """Every testable clause of spec 1.2's feature chapters (spec/clauses.toml) is named by a test
    of this module or of tests/test_oracle_mpmath.py (its docstring), and the chapters are there."""
    import pathlib
    import re

    from mhaspec import spec

    table = spec.load()
    assert set(FEATURE_CHAPTERS) <= {c.id for c in table.chapters}
    here = pathlib.Path(__file__)
    text = "".join(f.read_text(encoding="utf-8") for f in (here.with_name("test_oracle_mpmath.py"), here))
    named = set(re.findall(r"\b([A-Z]+-\d+)\b", text))
    missing = [c.id for c in table.clauses
               if c.chapter in FEATURE_CHAPTERS and c.testable and c.id not in named]
    assert not missing, f"feature clauses no test names: {missing}"


def test_features_constant_lists_the_new_keyword_arguments():
    import inspect

    params = inspect.signature(oracle.attention_result).parameters
    names = list(params)[list(params).index("info") + 1:]
    assert tuple(names) == oracle.FEATURES
