"""The analytic gradient (spec/oracle_grad.py) against central finite differences of the oracle.

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads.

The loss is ``sum(oracle.multi_head_attention(...) * G)``; each input entry is moved by +-eps in
float64 and the difference quotient compared with the analytic gradient (error O(eps^2) from the
third derivative plus O(u / eps) rounding: eps = 1e-5 gives agreement to ~1e-8).
"""

from __future__ import annotations

import numpy as np
import pytest

from finite_differences import central_differences
from mhaspec.spec import oracle
from mhaspec.spec.oracle_grad import GRAD_NAMES, mha_vjp


def _case(seed, *, b=2, h=2, g=None, l_q=3, l_k=4, d_k=3, d_v=2, d_model=5, k_dim=4, v_dim=3,
          d_out=4, biases=True):
    rng = np.random.default_rng(seed)
    g = h if g is None else g
    x = {"query": rng.standard_normal((b, l_q, d_model)), "key": rng.standard_normal((b, l_k, k_dim)),
         "value": rng.standard_normal((b, l_k, v_dim))}

    def bias(n):
        return rng.standard_normal(n) * 0.3 if biases else None

    params = oracle.Params(
        w_q=rng.standard_normal((d_model, h * d_k)), w_k=rng.standard_normal((k_dim, g * d_k)),
        w_v=rng.standard_normal((v_dim, g * d_v)), w_o=rng.standard_normal((h * d_v, d_out)),
        b_q=bias(h * d_k), b_k=bias(g * d_k), b_v=bias(g * d_v), b_o=bias(d_out))
    cot = rng.standard_normal((b, l_q, d_out))
    return x, params, cot


def _loss(x, params, cot, kw):
    out, _ = oracle.multi_head_attention(x["query"], x["key"], x["value"], params, **kw)
    return float(np.sum(out * cot))


def _finite_differences(x, params, cot, kw) -> dict[str, np.ndarray]:
    arrays = {**x, **{n: t for n, t in params._asdict().items() if t is not None}}

    def loss(moved: dict) -> float:
        return _loss({n: moved[n] for n in x},
                     params._replace(**{n: t for n, t in moved.items() if n in params._fields}),
                     cot, kw)

    return central_differences(loss, arrays)


CASES = {
    "plain": ({}, {}),
    "cross, no biases": (dict(biases=False), {}),
    "custom scale, 3 heads": (dict(h=3), {"scale": 0.7}),
    "bias and mask": (dict(), "bias_mask"),
    "causal bottom-right, fully masked rows": (dict(l_q=4, l_k=3), {"causal": "bottom_right"}),
    "key padding": (dict(), "kpm"),
    "legacy mask": (dict(), "legacy"),
    "grouped-query 4 heads / 2": (dict(h=4, g=2), {}),
    "multi-query 3 heads / 1, masked": (dict(h=3, g=1), "bias_mask"),
}


def _kwargs(extra, case_kw, rng, b, h, l_q, l_k):
    kw = {}
    if extra == "bias_mask":
        kw["bias"] = rng.standard_normal((1, h, l_q, l_k))
        mask = rng.random((b, 1, l_q, l_k)) < 0.6
        mask[:, :, 0] = False  # a fully masked query row
        mask[:, :, 1:, 0] = True
        kw["mask"] = mask
    elif extra == "kpm":
        kpm = np.ones((b, l_k), dtype=bool)
        kpm[0, -1] = kpm[1, 0] = False
        kw["key_padding_mask"] = kpm
    elif extra == "legacy":
        legacy = (rng.random((l_q, l_k)) < 0.4).astype(float)
        legacy[:, 0] = 0.0
        kw["legacy_mask"] = legacy
    else:
        kw.update(extra)
    return kw


@pytest.mark.parametrize("name", list(CASES))
def test_analytic_gradient_matches_finite_differences(name):
    shape_kw, extra = CASES[name]
    x, params, cot = _case(7, **shape_kw)
    h = shape_kw.get("h", 2)
    rng = np.random.default_rng(11)
    b, l_q, l_k = x["query"].shape[0], x["query"].shape[1], x["key"].shape[1]
    kw = {"num_heads": h, **_kwargs(extra, shape_kw, rng, b, h, l_q, l_k)}
    if "g" in shape_kw:
        kw["num_kv_heads"] = shape_kw["g"]
    out, grads = mha_vjp(x["query"], x["key"], x["value"], params, cot, **kw)
    np.testing.assert_allclose(
        out, oracle.multi_head_attention(x["query"], x["key"], x["value"], params, **kw)[0],
        rtol=1e-12, atol=1e-12)
    fd = _finite_differences(x, params, cot, kw)
    assert set(grads) == set(fd) <= set(GRAD_NAMES)
    for n in fd:
        scale = max(1.0, float(np.max(np.abs(fd[n]))))
        np.testing.assert_allclose(grads[n], fd[n], rtol=0, atol=1e-7 * scale, err_msg=n)


def test_masked_positions_have_exactly_zero_gradient():
    """GRAD-2 in the oracle: a fully masked query row and a padded key get exact zeros."""
    x, params, cot = _case(3)
    kpm = np.ones((2, 4), dtype=bool)
    kpm[1, 2] = False
    mask = np.ones((2, 2, 3, 4), dtype=bool)
    mask[0, :, 1] = False
    _, grads = mha_vjp(x["query"], x["key"], x["value"], params, cot, num_heads=2, mask=mask,
                       key_padding_mask=kpm)
    assert np.all(grads["query"][0, 1] == 0) and np.all(grads["query"][0, [0, 2]] != 0)
    assert np.all(grads["key"][1, 2] == 0) and np.all(grads["value"][1, 2] == 0)
    assert all(np.all(np.isfinite(g)) for g in grads.values())


def test_grouped_query_equals_repeated_heads():
    """MHA-6: g key/value heads equal h heads with each key/value block repeated h / g times."""
    x, params, cot = _case(5, h=4, g=2)
    d_k, d_v = params.w_q.shape[1] // 4, params.w_v.shape[1] // 2

    def repeat(w, d):
        return np.concatenate([w[..., (i // 2) * d:(i // 2 + 1) * d] for i in range(4)], axis=-1)

    rep = params._replace(w_k=repeat(params.w_k, d_k), w_v=repeat(params.w_v, d_v),
                          b_k=repeat(params.b_k, d_k), b_v=repeat(params.b_v, d_v))
    got = oracle.multi_head_attention(x["query"], x["key"], x["value"], params, num_heads=4,
                                      num_kv_heads=2)
    want = oracle.multi_head_attention(x["query"], x["key"], x["value"], rep, num_heads=4)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-13)


def test_float32_precision_is_close_but_not_exact():
    x, params, cot = _case(9)
    _, g64 = mha_vjp(x["query"], x["key"], x["value"], params, cot, num_heads=2)
    _, g32 = mha_vjp(x["query"], x["key"], x["value"], params, cot, num_heads=2,
                     precision="float32")
    for n in g64:
        assert g32[n].dtype == np.float32
        err = np.max(np.abs(g32[n] - g64[n])) / max(1.0, np.max(np.abs(g64[n])))
        assert 0 < err < 1e-5, n
