"""The spec 1.3 oracle (spec/oracle_vjp.py): sinks and the gradient of scaled dot-product attention,
against central finite differences in float64, 50-digit mpmath derivatives on tiny cases, and
explicit constructions.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K keys attended, d_k / d_v per-head widths.

The loss is ``sum(output * dO) + sum(lse * dlse)`` (rows with lse -inf left out); each input entry
is moved by +-EPS and the difference quotient compared with the analytic gradient (error O(EPS^2)
from the third derivative plus O(u / EPS) rounding: EPS = 1e-5 agrees to 2e-10 here).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from finite_differences import central_differences
from mhaspec.spec import oracle
from mhaspec.spec.oracle_vjp import attention_vjp, attention_with_sinks
DIFFERENTIABLE = ("q", "k", "v", "sinks", "bias", "past_key", "past_value")


def _qkv(seed, *, b=2, h=4, g=2, lq=3, lk=4, dk=2, dv=2, spread=1.5):
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((b, h, lq, dk)) * spread,
            "k": rng.standard_normal((b, g, lk, dk)) * spread,
            "v": rng.standard_normal((b, g, lk, dv))}


def _loss(arrays, const, d_out, d_lse) -> float:
    res = attention_with_sinks(arrays["q"], arrays["k"], arrays["v"],
                               **{n: a for n, a in arrays.items() if n not in "qkv"}, **const)
    loss = float(np.sum(res.output * d_out))
    if d_lse is not None:
        loss += float(np.sum(np.where(np.isfinite(res.lse), res.lse * d_lse, 0.0)))
    return loss


def _finite_differences(arrays, const, d_out, d_lse) -> dict[str, np.ndarray]:
    return central_differences(lambda moved: _loss(moved, const, d_out, d_lse), arrays)


def _segments(b, lq, lk):
    q_ids = np.array([[0, 0, 1], [2, 1, 1]])[:b, :lq]  # batch 1, query 0: segment 2 has no key
    k_ids = np.array([[0, 1, 1, 0], [1, 1, 0, 0]])[:b, :lk]
    return {"q_segment_ids": q_ids, "kv_segment_ids": k_ids,
            "key_value_seq_lengths": np.array([4, 3]), "query_seq_lengths": np.array([3, 3]),
            "causal": "top_left"}


def _empty_row_mask(b, h, lq, lk):
    mask = np.ones((b, 1, lq, lk), dtype=bool)
    mask[0, 0, 1] = False  # batch 0, query 1: no allowed key
    mask[1, 0, :, 2] = False  # batch 1, key 2: attended by no query
    return mask


#: name -> (shape keywords, extra differentiable arrays, constant keywords, with a dlse cotangent)
CASES = {
    "plain": ({}, {}, {}, False),
    "grouped 4 / 2, custom scale": ({}, {}, {"scale": 0.7}, False),
    "multi-query 3 / 1": ({"h": 3, "g": 1}, {}, {}, False),
    "soft-cap": ({"spread": 3.0}, {}, {"softcap": 1.5}, False),
    "window bottom-right, L_q < L_k": ({"lk": 5}, {}, {"window": (1, 0), "alignment": "bottom_right"},
                                       False),
    "ALiBi, causal top-left": ({}, {}, {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]),
                                        "causal": "top_left"}, False),
    "segments and lengths": ({}, {}, "segments", False),
    "mask with an empty row, lse cotangent": ({}, {}, "empty_row", True),
    "legacy mask, lse cotangent": ({}, {}, "legacy", True),
    "bias (broadcast over batch) with a -inf entry": ({}, "bias", {}, True),
    "sinks": ({}, "sinks", {}, False),
    "sinks, lse cotangent, empty row": ({}, "sinks", "empty_row", True),
    "sinks, soft-cap, window, ALiBi, bias": ({"spread": 3.0, "lk": 5}, "sinks+bias",
                                             {"softcap": 2.0, "window": (2, 1),
                                              "alignment": "top_left",
                                              "alibi_slopes": np.array([0.3, 0.2, 0.1, 0.05])},
                                             True),
    "ragged KV cache, causal": ({"lq": 2, "lk": 2}, "cache", {"causal": "bottom_right"}, True),
    "KV cache with sinks and a window": ({"lq": 2, "lk": 2}, "cache+sinks",
                                         {"window": (2, 0), "alignment": "bottom_right"}, True),
}


def _build(name, seed=7):
    shape_kw, extra, const, with_lse = CASES[name]
    arrays = _qkv(seed, **shape_kw)
    b, h, lq = arrays["q"].shape[:3]
    g, lk = arrays["k"].shape[1:3]
    rng = np.random.default_rng(seed + 1)
    if const == "segments":
        const = _segments(b, lq, lk)
    elif const == "empty_row":
        const = {"mask": _empty_row_mask(b, h, lq, lk)}
    elif const == "legacy":
        const = {"legacy_mask": (rng.random((lq, lk)) < 0.4).astype(float)}
    const = dict(const)
    l_keys = lk
    if "cache" in extra:
        l_past = 3
        arrays["past_key"] = rng.standard_normal((b, g, l_past, arrays["k"].shape[3]))
        arrays["past_value"] = rng.standard_normal((b, g, l_past, arrays["v"].shape[3]))
        const["past_lengths"] = np.array([1, 3])[:b]
        l_keys = l_past + lk
    if "sinks" in extra:
        arrays["sinks"] = rng.standard_normal(h)
    if "bias" in extra:
        bias = rng.standard_normal((1, h, lq, l_keys))
        bias[0, 1, 0, 0] = -np.inf
        arrays["bias"] = bias
    d_out = rng.standard_normal((b, h, lq, arrays["v"].shape[3]))
    d_lse = rng.standard_normal((b, h, lq)) if with_lse else None
    return arrays, const, d_out, d_lse


def _vjp(arrays, const, d_out, d_lse, **kw):
    others = {n: a for n, a in arrays.items() if n not in "qkv"}
    return attention_vjp(arrays["q"], arrays["k"], arrays["v"], d_out, d_lse=d_lse,
                         bias_grad="bias" in arrays, **others, **const, **kw)


def _named(grads) -> dict[str, np.ndarray]:
    names = {"dq": "q", "dk": "k", "dv": "v", "d_sinks": "sinks", "d_bias": "bias",
             "d_past_key": "past_key", "d_past_value": "past_value"}
    return {names[f]: g for f, g in grads._asdict().items() if g is not None}


@pytest.mark.parametrize("name", list(CASES))
def test_vjp_matches_finite_differences(name):
    arrays, const, d_out, d_lse = _build(name)
    grads = _named(_vjp(arrays, const, d_out, d_lse))
    fd = _finite_differences(arrays, const, d_out, d_lse)
    assert set(grads) == set(fd) <= set(DIFFERENTIABLE)
    for n in fd:
        scale = max(1.0, float(np.max(np.abs(fd[n]))))
        np.testing.assert_allclose(grads[n], fd[n], rtol=0, atol=1e-8 * scale, err_msg=n)


@pytest.mark.parametrize("precision", ["float64", "float16", "bfloat16"])
@pytest.mark.parametrize("name", [n for n in CASES if "sinks" not in CASES[n][1]])
def test_forward_without_sinks_is_the_1_2_oracle_bitwise(name, precision):
    """In float16 and bfloat16 too: the same steps rounded alike (NUM-3's naive algorithm)."""
    arrays, const, _, _ = _build(name)
    others = {n: a for n, a in arrays.items() if n not in "qkv"}
    want = oracle.attention_result(arrays["q"], arrays["k"], arrays["v"], **others, **const,
                                   precision=precision)
    got = attention_with_sinks(arrays["q"], arrays["k"], arrays["v"], **others, **const,
                               precision=precision)
    for field in ("output", "weights", "lse", "present_key", "present_value", "present_lengths"):
        w, g = getattr(want, field), getattr(got, field)
        assert (w is None and g is None) or np.array_equal(w, g), field


def _explicit_sink_call(q, k, v, sinks, mask, bias, softcap, precision="float64"):
    """The sink as one more key: key vector 0 (so s q.0 = 0 and c tanh(0) = 0), bias = sink,
    value 0, always allowed; through the 1.2 oracle in ``precision``."""
    b, h, lq, _ = q.shape
    k1 = np.concatenate([k, np.zeros(k.shape[:2] + (1, k.shape[3]))], axis=2)
    v1 = np.concatenate([v, np.zeros(v.shape[:2] + (1, v.shape[3]))], axis=2)
    mask1 = np.concatenate([np.broadcast_to(mask, (b, h, lq, k.shape[2])),
                            np.ones((b, h, lq, 1), bool)], axis=-1)
    column = np.broadcast_to(sinks[None, :, None, None], (b, h, lq, 1))
    bias1 = np.concatenate([np.broadcast_to(bias, (b, h, lq, k.shape[2])), column], axis=-1)
    return (oracle.attention_result(q, k1, v1, mask=mask1, bias=bias1, softcap=softcap,
                                    precision=precision), bias1, mask1)


def _sink_case():
    """q, k, v, sinks (h,), a mask with an empty row, a bias (1, h, L_q, L_k) and the generator
    that drew them (seeded): the case of the sink-as-extra-key tests."""
    arrays = _qkv(3, spread=3.0)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    b, h, lq = q.shape[:3]
    rng = np.random.default_rng(4)
    sinks = rng.standard_normal(h) * 2
    mask = _empty_row_mask(b, h, lq, k.shape[2])
    bias = rng.standard_normal((1, h, lq, k.shape[2]))
    return q, k, v, sinks, mask, bias, rng


@pytest.mark.parametrize("softcap", [None, 1.2])
def test_sinks_equal_an_extra_key_with_value_zero(softcap):
    """SINK: the sink is a key whose logit is sigma_h and whose value is 0, never masked; the
    lse includes it; an empty row gives output 0, weights 0 and lse sigma_h."""
    q, k, v, sinks, mask, bias, rng = _sink_case()
    got = attention_with_sinks(q, k, v, sinks=sinks, mask=mask, bias=bias, softcap=softcap)
    want, bias1, mask1 = _explicit_sink_call(q, k, v, sinks, mask, bias, softcap)
    np.testing.assert_allclose(got.output, want.output, rtol=0, atol=1e-15)
    np.testing.assert_allclose(got.weights, want.weights[..., :-1], rtol=0, atol=1e-16)
    np.testing.assert_allclose(got.lse, want.lse, rtol=0, atol=1e-14)
    assert np.all(got.output[0, :, 1] == 0) and np.all(got.weights[0, :, 1] == 0)
    np.testing.assert_array_equal(got.lse[0, :, 1], sinks)
    assert np.all(got.weights.sum(-1) < 1)
    # d sigma_h is the gradient of the extra key's bias column, summed over batch items and rows
    d_out, d_lse = rng.standard_normal(got.output.shape), rng.standard_normal(got.lse.shape)
    grads = attention_vjp(q, k, v, d_out, d_lse=d_lse, sinks=sinks, mask=mask, bias=bias,
                          softcap=softcap)
    k1 = np.concatenate([k, np.zeros(k.shape[:2] + (1, k.shape[3]))], axis=2)
    v1 = np.concatenate([v, np.zeros(v.shape[:2] + (1, v.shape[3]))], axis=2)
    explicit = attention_vjp(q, k1, v1, d_out, d_lse=d_lse, mask=mask1, bias=bias1,
                             softcap=softcap, bias_grad=True)
    np.testing.assert_allclose(grads.d_sinks, explicit.d_bias[..., -1].sum(axis=(0, 2)),
                               rtol=0, atol=1e-13)
    np.testing.assert_allclose(grads.dq, explicit.dq, rtol=0, atol=1e-13)
    np.testing.assert_allclose(grads.dk, explicit.dk[:, :, :-1], rtol=0, atol=1e-13)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("softcap", [None, 1.2])
def test_sinks_in_a_narrow_dtype_round_as_the_extra_key_does(softcap, precision):
    """The naive algorithm of NUM-3 in float16 and bfloat16 (float32 rounded after every step):
    with sinks, bit for bit the 1.2 oracle's steps on the sink as one more key."""
    q, k, v, sinks, mask, bias, rng = _sink_case()
    got = attention_with_sinks(q, k, v, sinks=sinks, mask=mask, bias=bias, softcap=softcap,
                               precision=precision)
    want, _, _ = _explicit_sink_call(q, k, v, sinks, mask, bias, softcap, precision)
    assert got.output.dtype == np.float32
    np.testing.assert_array_equal(got.output, want.output)
    np.testing.assert_array_equal(got.weights, want.weights[..., :-1])
    np.testing.assert_array_equal(got.lse, want.lse)
    _, rounding = oracle.rounding(precision)
    np.testing.assert_array_equal(got.lse[0, :, 1], rounding(sinks.astype(np.float32)))
    assert not np.array_equal(got.output, attention_with_sinks(
        q, k, v, sinks=sinks, mask=mask, bias=bias, softcap=softcap, precision="float32").output)


def test_lse_with_sinks_normalises_merges_and_converts():
    """The lse includes the sink: P = exp(S - lse) and P_sink = exp(sigma - lse) (what a blockwise
    backward recomputes); LSE-2's merge of two key chunks is exact when only one chunk carries the
    sink; a sink-free lse converts by logaddexp(lse, sigma)."""
    arrays = _qkv(17, lk=6)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    rng = np.random.default_rng(18)
    sinks, bias = rng.standard_normal(4), rng.standard_normal((2, 4, 3, 6))
    whole = attention_with_sinks(q, k, v, sinks=sinks, bias=bias)
    logits = np.einsum("bhqd,bhkd->bhqk", q, np.repeat(k, 2, axis=1)) * 2 ** -0.5 + bias
    np.testing.assert_allclose(whole.weights, np.exp(logits - whole.lse[..., None]), atol=1e-15)
    np.testing.assert_allclose(1 - whole.weights.sum(-1),
                               np.exp(sinks[None, :, None] - whole.lse), atol=1e-15)
    first = attention_with_sinks(q, k[:, :, :2], v[:, :, :2], sinks=sinks, bias=bias[..., :2])
    rest = attention_with_sinks(q, k[:, :, 2:], v[:, :, 2:], bias=bias[..., 2:])
    out, lse = oracle.merge_by_lse(first.output, first.lse, rest.output, rest.lse)
    np.testing.assert_allclose(out, whole.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(lse, whole.lse, rtol=0, atol=1e-14)
    without = attention_with_sinks(q, k, v, bias=bias)
    np.testing.assert_allclose(np.logaddexp(without.lse, sinks[None, :, None]), whole.lse,
                               rtol=0, atol=1e-14)


def test_exact_zeros_where_the_result_does_not_depend_on_an_input():
    """Keys no query may attend (key padding, outside every window, another segment, a cache slot
    past past_lengths) and rows with nothing allowed get exactly 0, with and without sinks."""
    arrays = _qkv(11, lk=5)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    rng = np.random.default_rng(12)
    d_out, d_lse = rng.standard_normal((2, 4, 3, 2)), rng.standard_normal((2, 4, 3))
    kpm = np.ones((2, 5), bool)
    kpm[1, 3] = False
    mask = np.ones((2, 1, 3, 5), bool)
    mask[0, 0, 2] = False
    for sinks in (None, rng.standard_normal(4)):
        # window (0, 1) top-left: query i sees keys i and i + 1, so key 4 is seen by no query
        g = attention_vjp(q, k, v, d_out, d_lse=d_lse, sinks=sinks, key_padding_mask=kpm,
                          mask=mask, window=(0, 1), alignment="top_left",
                          bias=rng.standard_normal((2, 4, 3, 5)), bias_grad=True)
        assert np.all(g.dk[1, :, 3] == 0) and np.all(g.dv[1, :, 3] == 0)  # padded key
        assert np.all(g.dk[:, :, 4] == 0) and np.all(g.dv[:, :, 4] == 0)  # outside every window
        assert np.all(g.dq[0, :, 2] == 0)  # empty row
        assert np.all(g.d_bias[0, :, 2] == 0) and np.all(g.d_bias[:, :, 0, 2:] == 0)
        assert np.all(g.dk[0, :, :3] != 0) and np.all(g.dq[0, :, :2] != 0)
        assert all(np.all(np.isfinite(x)) for x in g if x is not None)
    # segments: batch 1, query 0 is in segment 2, which has no key; key 3 of batch 0 (segment 0)
    # is past key_value_seq_lengths
    seg = _segments(2, 3, 4)
    seg["key_value_seq_lengths"] = np.array([3, 4])
    arrays = _qkv(13)
    g = attention_vjp(arrays["q"], arrays["k"], arrays["v"], d_out, d_lse=d_lse, **seg)
    assert np.all(g.dq[1, :, 0] == 0) and np.all(g.dk[0, :, 3] == 0) and np.all(g.dv[0, :, 3] == 0)
    # cache: past slots at or past past_lengths are zero, valid ones are not
    arrays, const, d_out, d_lse = _build("ragged KV cache, causal")
    g = _vjp(arrays, const, d_out, d_lse)
    assert np.all(g.d_past_key[0, :, 1:] == 0) and np.all(g.d_past_value[0, :, 1:] == 0)
    assert np.all(g.d_past_key[0, :, :1] != 0) and np.all(g.d_past_key[1] != 0)


def test_grouped_gradients_are_sums_over_the_group():
    """GQA: dk, dv of key/value head j are the sums of the dk, dv of h/g repeated heads."""
    arrays = _qkv(5, h=4, g=2)
    rng = np.random.default_rng(6)
    d_out, d_lse = rng.standard_normal((2, 4, 3, 2)), rng.standard_normal((2, 4, 3))
    kw = {"softcap": 2.0, "causal": "bottom_right", "sinks": rng.standard_normal(4),
          "d_lse": d_lse}
    grouped = attention_vjp(arrays["q"], arrays["k"], arrays["v"], d_out, **kw)
    repeated = attention_vjp(arrays["q"], np.repeat(arrays["k"], 2, axis=1),
                             np.repeat(arrays["v"], 2, axis=1), d_out, **kw)
    np.testing.assert_allclose(grouped.dq, repeated.dq, rtol=0, atol=1e-14)
    np.testing.assert_allclose(grouped.dk, repeated.dk.reshape(2, 2, 2, 4, 2).sum(2), atol=1e-14)
    np.testing.assert_allclose(grouped.dv, repeated.dv.reshape(2, 2, 2, 4, 2).sum(2), atol=1e-14)
    np.testing.assert_allclose(grouped.d_sinks, repeated.d_sinks, rtol=0, atol=1e-14)


def test_the_path_through_the_cap_bounds_the_gradients_it_carries():
    """GRAD-5's cap_path, s max(|dS| |K|, |dS|^T |Q|), bounds |dq| and |dk| (1 - tanh^2 <= 1): close
    to them on unsaturated logits, positive where saturation makes them 0; only with a soft-cap."""
    arrays = _qkv(8, h=4, g=2)
    d_out = np.random.default_rng(9).standard_normal((2, 4, 3, 2))
    for spread, cap in ((1.0, 50.0), (100.0, 0.05)):
        info: dict = {}
        res = attention_vjp(arrays["q"] * spread, arrays["k"], arrays["v"], d_out, softcap=cap,
                            info=info)
        largest = max(np.abs(res.dq).max(), np.abs(res.dk).max())
        assert largest <= info["cap_path"] < 2 * largest or (largest == 0 < info["cap_path"])
        assert (largest == 0) == (cap == 0.05), (cap, info, largest)
    info = {}
    attention_vjp(arrays["q"], arrays["k"], arrays["v"], d_out, info=info)
    assert info == {}


def test_lse_cotangent_adds_dlse_times_p():
    """dS += dlse * P: with dO = 0 the gradients are those of sum(dlse * lse) alone, and the two
    cotangents add."""
    arrays, const, d_out, d_lse = _build("sinks, lse cotangent, empty row")
    both = _vjp(arrays, const, d_out, d_lse)
    out_only = _vjp(arrays, const, d_out, None)
    lse_only = _vjp(arrays, const, np.zeros_like(d_out), d_lse)
    for a, b, c in zip(both, out_only, lse_only):
        if a is not None:
            np.testing.assert_allclose(a, b + c, rtol=0, atol=1e-13)
    # with dO = 0, d sigma_h = sum of P_sink * dlse: every row of the sink-only row counts fully
    res = attention_with_sinks(arrays["q"], arrays["k"], arrays["v"], sinks=arrays["sinks"],
                               **const)
    p_sink = 1 - res.weights.sum(-1)
    np.testing.assert_allclose(lse_only.d_sinks, (p_sink * d_lse).sum(axis=(0, 2)), atol=1e-13)


def test_float32_precision_is_close_but_not_exact():
    arrays, const, d_out, d_lse = _build("sinks, soft-cap, window, ALiBi, bias")
    g64 = _vjp(arrays, const, d_out, d_lse)
    g32 = _vjp(arrays, const, d_out, d_lse, precision="float32")
    for a, b in zip(g64, g32):
        if a is not None:
            assert b.dtype == np.float32
            err = np.max(np.abs(b - a)) / max(1.0, np.max(np.abs(a)))
            assert 0 < err < 1e-5


@pytest.mark.parametrize("precision, bits", [("float16", 11), ("bfloat16", 8)])
def test_16bit_backward_rounds_where_kernels_round(precision, bits):
    """GRAD-10's reference evaluation: every gradient is a value of the dtype, its error against
    float64 is of the dtype's size (well above float32's) and close to the float32 evaluation of
    the same inputs."""
    arrays, const, d_out, d_lse = _build("sinks, soft-cap, window, ALiBi, bias")
    _, rnd = oracle.rounding(precision)
    g64 = _vjp(arrays, const, d_out, d_lse)
    g16 = _vjp(arrays, const, d_out, d_lse, precision=precision)
    g32 = _vjp(arrays, const, d_out, d_lse, precision="float32")
    for a, b, c in zip(g64, g16, g32):
        if a is None:
            continue
        np.testing.assert_array_equal(b, rnd(b))  # held in float32, values of the dtype
        scale = max(1.0, np.max(np.abs(a)))
        err16, err32 = np.max(np.abs(b - a)) / scale, np.max(np.abs(c - a)) / scale
        assert err32 < err16 < 64 * 2.0 ** -bits, (err16, err32)


def test_16bit_mha_gradient_rounds_to_the_dtype():
    """oracle_grad's float16 / bfloat16 evaluation (GRAD-10 for mha_vjp): dtype values, errors of
    the dtype's size."""
    from mhaspec.spec.oracle_grad import mha_vjp
    rng = np.random.default_rng(3)
    params = oracle.Params(*(rng.standard_normal(s) * 0.3 for s in ((8, 8), (8, 8), (8, 8),
                                                                     (8, 8))),
                           *(rng.standard_normal(8) * 0.1 for _ in range(4)))
    x = rng.standard_normal((2, 5, 8))
    cot = rng.standard_normal((2, 5, 8))
    _, g64 = mha_vjp(x, x, x, params, cot, num_heads=2)
    for precision, bits in (("float16", 11), ("bfloat16", 8)):
        _, rnd = oracle.rounding(precision)
        _, g16 = mha_vjp(x, x, x, params, cot, num_heads=2, precision=precision)
        for name, a in g64.items():
            np.testing.assert_array_equal(g16[name], rnd(g16[name]))
            err = np.max(np.abs(g16[name] - a)) / max(1.0, np.max(np.abs(a)))
            assert 0 < err < 64 * 2.0 ** -bits, (precision, name, err)
    with pytest.raises(ValueError, match="^precision: "):
        mha_vjp(x, x, x, params, cot, num_heads=2, precision="float8")


@pytest.mark.parametrize("kw, argument", [
    ({"sinks": np.zeros(3)}, "sinks"),
    ({"sinks": np.array([0.0, np.inf, 0.0, 0.0])}, "sinks"),
    ({"sinks": np.zeros(4, dtype=bool)}, "sinks"),
    ({"d_lse": np.zeros((2, 4))}, "d_lse"),
    ({"bias_grad": True}, "bias_grad"),
    ({"precision": "float8"}, "precision"),
])
def test_invalid_arguments_raise_value_error_naming_them(kw, argument):
    arrays = _qkv(1)
    with pytest.raises(ValueError, match=f"^{argument}: "):
        attention_vjp(arrays["q"], arrays["k"], arrays["v"], np.zeros((2, 4, 3, 2)), **kw)
    with pytest.raises(ValueError, match="^d_output: "):
        attention_vjp(arrays["q"], arrays["k"], arrays["v"], np.zeros((2, 4, 3, 3)))


# ---------------------------------------------------------------- 50-digit mpmath derivatives

mpmath.mp.dps = 50


def _mp_loss(q, k, v, sinks, bias, mask, softcap, scale, d_out, d_lse):
    """sum(dO * output) + sum(dlse * lse) of one batch item, grouped heads (g = 1), in mpmath."""
    h, lq, _ = q.shape
    total = mpmath.mpf(0)
    for hi in range(h):
        for i in range(lq):
            logits = {}
            for j in range(k.shape[1]):
                if not mask[i, j]:
                    continue
                x = mpmath.fsum(a * b for a, b in zip(q[hi][i], k[0][j])) * scale
                logits[j] = (softcap * mpmath.tanh(x / softcap) if softcap else x) + bias[hi][i][j]
            z = mpmath.exp(sinks[hi]) + mpmath.fsum(mpmath.exp(s) for s in logits.values())
            for c in range(v.shape[2]):
                o = mpmath.fsum(mpmath.exp(s) / z * v[0][j][c] for j, s in logits.items())
                total += d_out[hi, i, c] * o
            total += d_lse[hi, i] * mpmath.log(z)
    return total


#: the oracle's keywords and the same allowed set and constant bias written out by hand (L_q = 2,
#: L_k = 3): a mask that empties row 1, or window (1, 0) bottom-right (query i sits at i + 1) with
#: ALiBi slopes 0.5 and 0.25
MP_FEATURES = {
    "mask": ({"mask": np.array([[True, False, True], [False, False, False]])},
             np.array([[True, False, True], [False, False, False]]), np.zeros((2, 2, 3))),
    "window, ALiBi": ({"window": (1, 0), "alignment": "bottom_right",
                       "alibi_slopes": np.array([0.5, 0.25])},
                      np.array([[True, True, False], [False, True, True]]),
                      -np.array([0.5, 0.25])[:, None, None]
                      * np.abs(np.arange(2)[:, None] + 1 - np.arange(3)[None, :])),
}


@pytest.mark.parametrize("features", list(MP_FEATURES))
@pytest.mark.parametrize("softcap", [None, 1.3])
def test_vjp_matches_mpmath_derivatives(softcap, features):
    """dq, dk, dv, d_sinks and d_bias against 50-digit derivatives: one batch item, two query
    heads sharing one key/value head, sinks, a bias and an lse cotangent."""
    kwargs, mask, constant_bias = MP_FEATURES[features]
    rng = np.random.default_rng(21)
    h, lq, lk, d = 2, 2, 3, 2
    arrs = {"q": rng.standard_normal((h, lq, d)) * 2, "k": rng.standard_normal((1, lk, d)) * 2,
            "v": rng.standard_normal((1, lk, d)), "sinks": rng.standard_normal(h),
            "bias": rng.standard_normal((h, lq, lk))}
    d_out, d_lse = rng.standard_normal((h, lq, d)), rng.standard_normal((h, lq))
    scale = 0.6
    grads = attention_vjp(arrs["q"][None], arrs["k"][None], arrs["v"][None], d_out[None],
                          d_lse=d_lse[None], sinks=arrs["sinks"], bias=arrs["bias"][None],
                          bias_grad=True, softcap=softcap, scale=scale, **kwargs)
    got = {"q": grads.dq[0], "k": grads.dk[0], "v": grads.dv[0], "sinks": grads.d_sinks,
           "bias": grads.d_bias[0]}
    mp = {n: np.vectorize(mpmath.mpf, otypes=[object])(a) for n, a in arrs.items()}
    mp_constant = np.vectorize(mpmath.mpf, otypes=[object])(constant_bias)
    for name, arr in mp.items():
        for idx in np.ndindex(arr.shape):
            def f(t, name=name, idx=idx):
                moved = arr.copy()
                moved[idx] = arr[idx] + t
                args = {**mp, name: moved}
                return _mp_loss(args["q"], args["k"], args["v"], args["sinks"],
                                args["bias"] + mp_constant, mask,
                                softcap and mpmath.mpf(softcap), mpmath.mpf(scale), d_out, d_lse)
            want = float(mpmath.diff(f, 0))
            assert abs(got[name][idx] - want) <= 1e-14 * max(1.0, abs(want)), (name, idx)
