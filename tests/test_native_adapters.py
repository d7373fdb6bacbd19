"""The native-op adapters against the float64 oracle on a few fixed cases.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

Each adapter is skipped (with the reason) when its framework is not importable. Fully masked rows
are checked against what each adapter declares for MASK-9.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mhaspec.backends import MHAParams
from registered import registered
from mhaspec.spec import oracle



REGISTERED = registered()


def adapters(capability: str | None = None) -> list:
    """pytest params: every registered native-op adapter (a backend naming its ``native_op``)
    claiming ``capability``; a backend whose framework does not import is a skipped param with
    the reason (whether it is an adapter cannot be known without its framework)."""
    params = []
    for name, backend in REGISTERED.items():
        if isinstance(backend, str):
            params.append(pytest.param(name, marks=pytest.mark.skip(reason=backend)))
        elif getattr(backend, "native_op", "") and (capability is None
                                                    or capability in backend.capabilities):
            try:
                cpu = backend.devices().get("cpu", "no CPU device")
            except ImportError as e:  # its framework is not installed
                cpu = f"{backend.framework} does not import: {e}"
            params.append(name if cpu is None else
                          pytest.param(name, marks=pytest.mark.skip(reason=f"cpu: {cpu}")))
    return params


# float32 tolerance for these small, well-conditioned cases; float64 is relaxed for the adapters
# that declare a NUM-3 deviation (float32 softmax or float32-rounded scale).
TOL = {"float32": 2e-5, "float64": 1e-12}


def load(name):
    return REGISTERED[name]


def tol(be, dtype):
    if dtype not in be.dtypes("cpu"):  # float64 of jax-dpa, keras-mha: computed via float32 (NUM-1)
        return 1e-6
    return TOL[dtype]


SDPA_CASES = {
    "plain": {},
    "mask-2d": {"mask": "m2"},
    "mask-4d-heads": {"mask": "m4"},
    "bias": {"bias": "b2"},
    "key-padding": {"key_padding_mask": "kpm"},
    "causal-top-left": {"causal": "top_left"},
    "causal-bottom-right": {"causal": "bottom_right"},
    "causal-bottom-right+mask+bias": {"causal": "bottom_right", "mask": "m2", "bias": "b2"},
    "legacy": {"legacy_mask": "legacy"},
    "scale": {"scale": 0.3},
}


def _arrays(rng, b, h, l_q, l_k):
    m2 = rng.random((l_q, l_k)) < 0.8
    m2[:, 0] = True
    m4 = rng.random((b, h, l_q, l_k)) < 0.8
    m4[..., -1] = True
    kpm = rng.random((b, l_k)) < 0.8
    kpm[:, 0] = True
    legacy = (rng.random((b, 1, 1, l_k)) < 0.3) * 1.0
    legacy[..., 0] = 0.0
    return {"m2": m2, "m4": m4, "b2": rng.standard_normal((l_q, l_k)), "kpm": kpm,
            "legacy": legacy}


def _convert(be, kw, arrays, dtype):
    out = {}
    for k, v in kw.items():
        if isinstance(v, str) and v in arrays:
            a = arrays[v]
            out[k] = be.asarray(a, dtype="bool" if a.dtype == bool else dtype)
            kw[k] = a
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(SDPA_CASES))
@pytest.mark.parametrize("name", adapters("sdpa"))
def test_sdpa_adapter_matches_oracle(name, case, dtype):
    be = load(name)
    if dtype not in be.dtypes("cpu"):
        pytest.skip(f"{name} does not claim {dtype} on cpu")
    rng = np.random.default_rng(0)
    b, h, l_q, l_k, d_k, d_v = 2, 3, 4, 6, 5, 3
    q, k, v = (rng.standard_normal(s) for s in ((b, h, l_q, d_k), (b, h, l_k, d_k), (b, h, l_k, d_v)))
    kw = dict(SDPA_CASES[case])
    arrays = _arrays(rng, b, h, l_q, l_k)
    be_kw = _convert(be, kw, arrays, dtype)
    out, w = be.scaled_dot_product_attention(*(be.asarray(x, dtype=dtype) for x in (q, k, v)),
                                             **be_kw)
    ref, ref_w = oracle.attention(q, k, v, **kw)
    got = be.to_numpy(out)
    assert got.shape == ref.shape and str(got.dtype) == dtype
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol(be, dtype))
    assert (w is None) == ("weights" not in be.capabilities), "weights returned iff claimed"
    if w is not None:
        np.testing.assert_allclose(be.to_numpy(w), ref_w, rtol=0, atol=tol(be, dtype))


MHA_CASES = {
    "plain": {},
    "mask-4d-heads": {"mask": "m4"},
    "key-padding+causal-top-left": {"key_padding_mask": "kpm", "causal": "top_left"},
    "causal-bottom-right": {"causal": "bottom_right"},
    "bias": {"bias": "b2"},
    "bias+key-padding": {"bias": "b2", "key_padding_mask": "kpm"},
    "legacy": {"legacy_mask": "legacy"},
}


def _mha_inputs(rng, name, b, h, l_q, l_k):
    if name == "torch-mha":  # nn.MultiheadAttention ties every width to embed_dim
        d_model, k_dim, v_dim, d_k, d_v, d_out = 6, 5, 7, 2, 2, 6
    elif "cross" not in load(name).capabilities:  # one width for every projection
        d_model, k_dim, v_dim, d_k, d_v, d_out = 6, 6, 6, 2, 2, 6
    else:  # cross-attention widths (MHA-4)
        d_model, k_dim, v_dim, d_k, d_v, d_out = 6, 5, 7, 4, 3, 8
    shapes = ((d_model, h * d_k), (k_dim, h * d_k), (v_dim, h * d_v), (h * d_v, d_out))
    weights = [rng.standard_normal(s) / math.sqrt(s[0]) for s in shapes]
    biases = [rng.standard_normal(h * d_k), None, rng.standard_normal(h * d_v),
              rng.standard_normal(d_out)]  # a partial set: the absent one is zero (PARAM-1)
    x = [rng.standard_normal(s) for s in ((b, l_q, d_model), (b, l_k, k_dim), (b, l_k, v_dim))]
    return x, oracle.Params(*weights, *biases)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(MHA_CASES))
@pytest.mark.parametrize("name", adapters("mha"))
def test_mha_adapter_matches_oracle(name, case, dtype):
    be = load(name)
    rng = np.random.default_rng(1)
    b, h, l_q, l_k = 2, 3, 4, 6
    (query, key, value), params = _mha_inputs(rng, name, b, h, l_q, l_k)
    kw = dict(MHA_CASES[case])
    arrays = _arrays(rng, b, h, l_q, l_k)
    be_kw = _convert(be, kw, arrays, dtype)
    conv = lambda x: None if x is None else be.asarray(x, dtype=dtype)  # noqa: E731
    try:
        out, w = be.multi_head_attention(conv(query), conv(key), conv(value),
                                          MHAParams(*(conv(t) for t in params)), num_heads=h,
                                          **be_kw)
    except NotImplementedError as exc:
        assert "bias" in kw or "legacy_mask" in kw, exc
        assert "legacy_mask" not in be.capabilities or "legacy_mask" not in kw
        pytest.skip(f"{name} cannot express this case: {exc}")
    ref_out, ref_w = oracle.multi_head_attention(query, key, value, params, num_heads=h, **kw)
    np.testing.assert_allclose(be.to_numpy(out), ref_out, rtol=0, atol=tol(be, dtype))
    assert (w is None) == ("weights" not in be.capabilities), "weights returned iff claimed"
    if w is not None:
        got_w = be.to_numpy(w)
        assert got_w.shape == ref_w.shape == (b, h, l_q, l_k)
        np.testing.assert_allclose(got_w, ref_w, rtol=0, atol=tol(be, dtype))


@pytest.mark.parametrize("name", adapters())
def test_fully_masked_rows_match_declaration(name):
    """MASK-9: zeros unless declared; the declared behaviour is what the op really does."""
    be = load(name)
    if not {"sdpa", "mha"} & be.capabilities:
        pytest.skip(f"{name}: claims neither attention operation (MASK-9 judges theirs)")
    rng = np.random.default_rng(2)
    b, h, l_q, d = 1, 2, 3, 2
    l_k = 4 if "sdpa" in be.capabilities else l_q  # MHA below is self-attention
    mask = np.ones((l_q, l_k), bool)
    mask[1] = False
    if "sdpa" in be.capabilities:
        q, k, v = (rng.standard_normal(s) for s in ((b, h, l_q, d), (b, h, l_k, d), (b, h, l_k, d)))
        out, _ = be.scaled_dot_product_attention(
            *(be.asarray(x, dtype="float32") for x in (q, k, v)),
            mask=be.asarray(mask, dtype="bool"))
        row = be.to_numpy(out)[:, :, 1]
        expected_zero = np.zeros_like(row)
    else:
        x = rng.standard_normal((b, l_q, h * d))
        params = [rng.standard_normal((h * d, h * d)) for _ in range(4)] + \
                 [rng.standard_normal(h * d) for _ in range(4)]
        out, w = be.multi_head_attention(
            *(be.asarray(x, dtype="float32") for _ in range(3)),
            MHAParams(*(be.asarray(p, dtype="float32") for p in params)), num_heads=h,
            mask=be.asarray(mask, dtype="bool"))
        row = be.to_numpy(out)[:, 1]
        expected_zero = np.broadcast_to(params[-1].astype(np.float32), row.shape)  # b_o
    if "MASK-9" in be.deviations:
        assert np.isnan(row).any() or not np.allclose(row, expected_zero, atol=1e-6), \
            f"{name} declares MASK-9 but a fully masked row gives the spec's result"
    else:
        np.testing.assert_allclose(row, expected_zero, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", adapters())
def test_invalid_input_raises_value_error(name):
    be = load(name)
    rng = np.random.default_rng(3)
    f = lambda a, dt="float32": be.asarray(np.asarray(a), dtype=dt)  # noqa: E731
    if "sdpa" in be.capabilities:
        q, k = f(rng.standard_normal((1, 2, 3, 4))), f(rng.standard_normal((1, 2, 5, 4)))
        with pytest.raises(ValueError, match="mask"):
            be.scaled_dot_product_attention(q, k, k, mask=f(np.ones((3, 4), bool), "bool"))
        with pytest.raises(ValueError, match="causal"):
            be.scaled_dot_product_attention(q, k, k, causal="upper")
    else:
        x = f(rng.standard_normal((1, 3, 4)))
        p = MHAParams(*(f(rng.standard_normal((4, 4))) for _ in range(4)))
        with pytest.raises(ValueError, match="num_heads"):
            be.multi_head_attention(x, x, x, p, num_heads=3)
        with pytest.raises(ValueError, match="key_padding_mask"):
            be.multi_head_attention(x, x, x, p, num_heads=2,
                                    key_padding_mask=f(np.ones((1, 4), bool), "bool"))


@pytest.mark.parametrize("name", adapters())
def test_every_translated_convention_is_confirmed(name):
    """Each convention an adapter declares is really a native difference (the untranslated call
    does not conform) and the translation is right (the adapter as shipped does)."""
    from mhaspec import conventions

    be = load(name)
    if not be.conventions:  # declared empty: the op takes the spec's forms as they are
        pytest.skip(f"{name}: {be.native_op} takes the spec's polarity, alignment and layout")
    rows = conventions.confirm(be)
    assert all(r.confirmed for r in rows), rows


@pytest.mark.parametrize("case", ["plain", "mask-4d-heads", "causal-bottom-right", "key-padding"])
@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("name", [n for n in adapters("gqa") if n in adapters("sdpa")])
def test_sdpa_adapter_with_grouped_key_value_heads(name, g, case):
    """GQA-1: k and v with g of the h = 6 heads; query head i attends with kv head i // (h / g)."""
    be = load(name)
    rng = np.random.default_rng(4)
    b, h, l_q, l_k, d_k, d_v = 2, 6, 4, 6, 5, 3
    q, k, v = (rng.standard_normal(s) for s in ((b, h, l_q, d_k), (b, g, l_k, d_k), (b, g, l_k, d_v)))
    kw = dict(SDPA_CASES[case])
    arrays = _arrays(rng, b, h, l_q, l_k)
    be_kw = _convert(be, kw, arrays, "float32")
    out, _ = be.scaled_dot_product_attention(*(be.asarray(x, dtype="float32") for x in (q, k, v)),
                                             **be_kw)
    ref, _ = oracle.attention(q, k, v, **kw)
    np.testing.assert_allclose(be.to_numpy(out), ref, rtol=0, atol=TOL["float32"])
