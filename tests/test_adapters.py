"""The public adapter helpers (``mhaspec.backends.layouts``, ``.masks``, ``.array_ops``): every
conversion in both directions against real framework modules computing the same output as the
float64 oracle, and every mask form against the oracle through a native op. The adapter base
classes (``.adapters``) are tested in tests/test_adapter_bases.py.

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads, d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from mhaspec.backends import MHAParams, layouts, masks
from mhaspec.spec import oracle
from adapter_helpers import B, H, L_K, L_Q, TOL64, jax, random_params, random_qkv  # jax: a fixture


def _inputs(rng, d_model, k_dim, v_dim, len_q=L_Q, len_k=L_K):
    return (rng.standard_normal((B, len_q, d_model)), rng.standard_normal((B, len_k, k_dim)),
            rng.standard_normal((B, len_k, v_dim)))


def _same(a, b):
    return all((x is None and y is None) or np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(a, b))


# -- layouts: exact round trips ------------------------------------------------------------------

def test_round_trips_are_exact_numpy():
    rng = np.random.default_rng(0)
    p = random_params(rng, 6, 6, 6, 2, 2, 6)
    assert _same(layouts.from_linear(layouts.to_linear(p)), p)
    assert _same(layouts.from_torch_mha(layouts.to_torch_mha(p)), p)
    assert _same(layouts.from_torch_mha(layouts.to_torch_mha(p, packed=False)), p)
    assert _same(layouts.from_state_dict(layouts.to_state_dict(p, layouts.EQUINOX),
                                         layouts.EQUINOX), p)
    cross = random_params(rng, 6, 5, 7, 4, 3, 8, kv_heads=1)
    assert _same(layouts.from_einsum(layouts.to_einsum(cross, H, 1)), cross)
    assert _same(layouts.from_state_dict(layouts.to_state_dict(cross)), cross)


def test_absent_biases():
    rng = np.random.default_rng(1)
    p = random_params(rng, 6, 6, 6, 2, 2, 6)._replace(b_k=None)
    assert not layouts.has_bias(p._replace(b_q=None, b_v=None, b_o=None))
    filled = layouts.with_zero_biases(p)
    assert np.array_equal(filled.b_k, np.zeros(6)) and filled.b_q is p.b_q
    state = layouts.to_torch_mha(p)
    assert np.array_equal(state["in_proj_bias"][6:12], np.zeros(6))
    assert "self.key.bias" not in layouts.to_state_dict(p)
    assert layouts.from_state_dict(layouts.to_state_dict(p)).b_k is None
    assert layouts.to_einsum(p, H).key.bias is None


def test_einsum_and_torch_reject_widths_they_cannot_hold():
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="embed_dim"):
        layouts.to_torch_mha(random_params(rng, 6, 5, 7, 4, 3, 8))
    with pytest.raises(ValueError, match="heads"):
        layouts.to_einsum(random_params(rng, 6, 6, 6, 2, 2, 6), 4)


# -- layouts against real modules -----------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("widths", [(6, 6, 6), (6, 5, 7)], ids=["packed", "kdim-vdim"])
def test_torch_mha_both_directions(torch, widths):
    """Spec -> nn.MultiheadAttention computes the oracle's output; a module's own random
    parameters -> spec give the module's output through the oracle."""
    d_model, k_dim, v_dim = widths
    rng = np.random.default_rng(3)
    query, key, value = _inputs(rng, d_model, k_dim, v_dim)
    p = random_params(rng, d_model, k_dim, v_dim, 2, 2, d_model)._replace(b_k=None)
    mod = torch.nn.MultiheadAttention(d_model, H, kdim=k_dim, vdim=v_dim, batch_first=True,
                                      dtype=torch.float64).eval()
    t = lambda x: torch.as_tensor(x)  # noqa: E731
    with torch.no_grad():
        for name, value_ in layouts.to_torch_mha(MHAParams(*(None if x is None else t(x)
                                                             for x in p))).items():
            mod.get_parameter(name).copy_(value_)
        out, w = mod(t(query), t(key), t(value), need_weights=True, average_attn_weights=False)
    ref, ref_w = oracle.multi_head_attention(query, key, value, oracle.Params(*p), num_heads=H)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=TOL64)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=0, atol=TOL64)

    fresh = torch.nn.MultiheadAttention(d_model, H, kdim=k_dim, vdim=v_dim, batch_first=True,
                                        dtype=torch.float64).eval()
    torch.nn.init.normal_(fresh.in_proj_bias) if fresh.in_proj_bias is not None else None
    with torch.no_grad():
        out, _ = fresh(t(query), t(key), t(value))
    back = layouts.from_torch_mha({n: x.detach().numpy() for n, x in fresh.named_parameters()})
    ref, _ = oracle.multi_head_attention(query, key, value, oracle.Params(*back), num_heads=H)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=TOL64)


def _torch_attention(torch, query, key, value, lin, num_heads):
    """Multi-head attention from four torch Linear modules (the Hugging Face / Equinox form)."""
    def heads(x, layer):
        y = layer(x)
        return y.reshape(*y.shape[:2], num_heads, -1).transpose(1, 2)

    q, k, v = heads(query, lin[0]), heads(key, lin[1]), heads(value, lin[2])
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return lin[3](o.transpose(1, 2).reshape(*o.shape[:1], o.shape[2], -1))


def test_linear_modules_both_directions(torch):
    """Spec -> four nn.Linear modules under Hugging Face BERT names (to_state_dict, load_state_dict)
    computes the oracle's output, cross widths included; a module's own parameters -> spec
    (from_state_dict) give its output through the oracle."""
    rng = np.random.default_rng(4)
    d_model, k_dim, v_dim, d_k, d_v, d_out = 6, 5, 7, 4, 3, 8
    query, key, value = _inputs(rng, d_model, k_dim, v_dim)
    p = random_params(rng, d_model, k_dim, v_dim, d_k, d_v, d_out)
    nn = torch.nn
    lin = [nn.Linear(d_model, H * d_k), nn.Linear(k_dim, H * d_k), nn.Linear(v_dim, H * d_v),
           nn.Linear(H * d_v, d_out)]
    module = nn.ModuleDict({"self": nn.ModuleDict({"query": lin[0], "key": lin[1],
                                                   "value": lin[2]}),
                            "output": nn.ModuleDict({"dense": lin[3]})}).double()
    state = layouts.to_state_dict(MHAParams(*(torch.as_tensor(x) for x in p)), layouts.HF_BERT)
    module.load_state_dict(state, strict=True)
    t = [torch.as_tensor(x) for x in (query, key, value)]
    with torch.no_grad():
        out = _torch_attention(torch, *t, lin, H)
    ref, _ = oracle.multi_head_attention(query, key, value, oracle.Params(*p), num_heads=H)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=TOL64)

    for layer in lin:
        nn.init.normal_(layer.weight)
    back = layouts.from_state_dict({n: x.numpy() for n, x in module.state_dict().items()})
    with torch.no_grad():
        out = _torch_attention(torch, *t, lin, H)
    ref, _ = oracle.multi_head_attention(query, key, value, oracle.Params(*back), num_heads=H)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=TOL64)


def test_round_trip_keeps_autograd(torch):
    """Gradients pass through the conversions (torch-mha maps module gradients back with them)."""
    w = torch.ones(6, 6, dtype=torch.float64, requires_grad=True)
    state = layouts.to_torch_mha(MHAParams(w, w, w, w))
    state["in_proj_weight"].sum().backward()
    assert torch.equal(w.grad, torch.full((6, 6), 3.0, dtype=torch.float64))


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"Keras runs on {keras.backend.backend()!r}, not tensorflow")
    return keras


def _keras_layer(keras, d_k, d_v, d_out, shapes):
    layer = keras.layers.MultiHeadAttention(num_heads=H, key_dim=d_k, value_dim=d_v,
                                            output_shape=d_out, dtype="float64")
    layer.build(*shapes)
    return layer


def _keras_dense(layer):
    return layouts.Projections(*((d.kernel, d.bias) for d in (
        layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)))


def test_keras_mha_both_directions(keras):
    """Spec -> Keras MultiHeadAttention's EinsumDense kernels (to_einsum) computes the oracle's
    output with cross widths; a layer's own kernels -> spec (from_einsum) give its output."""
    rng = np.random.default_rng(5)
    d_model, k_dim, v_dim, d_k, d_v, d_out = 6, 5, 7, 4, 3, 8
    query, key, value = _inputs(rng, d_model, k_dim, v_dim)
    p = random_params(rng, d_model, k_dim, v_dim, d_k, d_v, d_out)
    layer = _keras_layer(keras, d_k, d_v, d_out, (query.shape, value.shape, key.shape))
    for dense, target in zip(_keras_dense(layer), layouts.to_einsum(p, H)):
        dense[0].assign(target.kernel)
        dense[1].assign(target.bias)
    out, w = layer(query, value, key, return_attention_scores=True)
    ref, ref_w = oracle.multi_head_attention(query, key, value, oracle.Params(*p), num_heads=H)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-7)  # scale rounded to float32
    np.testing.assert_allclose(np.asarray(w), ref_w, rtol=0, atol=1e-7)

    fresh = _keras_layer(keras, d_k, d_v, d_out, (query.shape, value.shape, key.shape))
    for dense in _keras_dense(fresh):
        dense[1].assign(rng.standard_normal(dense[1].shape))
    back = layouts.from_einsum([(np.asarray(k), np.asarray(b)) for k, b in _keras_dense(fresh)])
    out = fresh(query, value, key)
    ref, _ = oracle.multi_head_attention(query, key, value, oracle.Params(*back), num_heads=H)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-7)


# -- masks ----------------------------------------------------------------------------------------

def _mask_args(rng, len_q=L_Q, len_k=L_K):
    mask = rng.random((B, H, len_q, len_k)) < 0.7
    mask[..., -1] = True
    kpm = rng.random((B, len_k)) < 0.7
    kpm[:, -1] = True
    legacy = (rng.random((B, 1, 1, len_k)) < 0.3) * 1.0
    return {"mask": mask, "key_padding_mask": kpm, "bias": rng.standard_normal((len_q, len_k)),
            "legacy_mask": legacy}


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_allowed_and_additive_forms_through_torch_sdpa(torch, causal):
    """allowed_mask (boolean, True = may attend) and additive_mask + fill_blocked (-inf or a finite
    fill) passed to torch SDPA give the oracle's output."""
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng)
    kw = _mask_args(rng)
    t = {n: torch.as_tensor(x) for n, x in kw.items()}
    tq, tk, tv = (torch.as_tensor(x) for x in (q, k, v))
    allowed = masks.allowed_mask(L_Q, L_K, like=tq, mask=t["mask"],
                                 key_padding_mask=t["key_padding_mask"], causal=causal)
    additive = masks.additive_mask(like=tq, bias=t["bias"], legacy_mask=t["legacy_mask"])
    F = torch.nn.functional
    ref, _ = oracle.attention(q, k, v, causal=causal, **kw)
    # rows with an allowed key: a finite fill gives the mean of V on the others (MASK-9)
    live = np.broadcast_to(allowed.numpy(), (B, H, L_Q, L_K)).any(axis=-1)[..., None]
    for fill in (-math.inf, -1e30):
        got = F.scaled_dot_product_attention(
            tq, tk, tv, attn_mask=masks.fill_blocked(allowed, like=tq, additive=additive,
                                                     fill=fill))
        expected = ref if fill == -math.inf else np.where(live, ref, v.mean(axis=2, keepdims=True))
        np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=TOL64)
    ref, _ = oracle.attention(q, k, v, causal=causal, mask=kw["mask"],
                              key_padding_mask=kw["key_padding_mask"])
    got = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=allowed)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=TOL64)


def test_blocked_form_through_nn_multihead_attention(torch):
    """blocked() of the allowed mask and of the key padding mask: nn.MultiheadAttention's
    polarity (True = may not attend)."""
    rng = np.random.default_rng(7)
    d_model = 6
    query, key, value = _inputs(rng, d_model, d_model, d_model, len_q=L_K)
    p = random_params(rng, d_model, d_model, d_model, 2, 2, d_model)
    kw = _mask_args(rng, L_K, L_K)
    kw["mask"][..., 0] = kw["key_padding_mask"][:, 0] = True  # no fully masked row (torch: NaN)
    mod = torch.nn.MultiheadAttention(d_model, H, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        for name, x in layouts.to_torch_mha(MHAParams(*(torch.as_tensor(x) for x in p))).items():
            mod.get_parameter(name).copy_(x)
        allowed = masks.allowed_mask(L_K, L_K, like=torch.zeros(()), mask=torch.as_tensor(
            kw["mask"]), causal="top_left")
        out, _ = mod(*(torch.as_tensor(x) for x in (query, key, value)),
                     attn_mask=masks.blocked(allowed).reshape(B * H, L_K, L_K),
                     key_padding_mask=masks.blocked(torch.as_tensor(kw["key_padding_mask"])))
    ref, _ = oracle.multi_head_attention(query, key, value, oracle.Params(*p), num_heads=H,
                                         mask=kw["mask"], causal="top_left",
                                         key_padding_mask=kw["key_padding_mask"])
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=TOL64)


def test_key_lengths_and_lengths_mask():
    kpm = masks.lengths_mask(np.array([3, 0, 6]), 6)
    assert kpm.tolist()[0] == [True] * 3 + [False] * 3 and not kpm[1].any() and kpm[2].all()
    assert masks.key_lengths(kpm).tolist() == [3, 0, 6]
    assert masks.key_lengths(kpm).dtype == np.int32
    assert masks.key_lengths(np.array([[True, False, True]])) is None


def test_causal_forms():
    assert masks.causal_mask(2, 4, "bottom_right").tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert masks.causal_mask(2, 4, "top_left").tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert masks.native_causal_serves("top_left", 2, 4)
    assert not masks.native_causal_serves("bottom_right", 2, 4)
    assert masks.native_causal_serves("bottom_right", 3, 3)
    assert masks.native_causal_serves("bottom_right", 2, 4, native="bottom_right")
    assert not masks.native_causal_serves(None, 3, 3)
    assert masks.is_default_scale(1 / math.sqrt(5), 5) and not masks.is_default_scale(0.3, 5)


@pytest.mark.parametrize("alignment,len_q,len_k", [("top_left", 4, 6), ("bottom_right", 5, 5),
                                                   ("top_left", 6, 3)])
@pytest.mark.parametrize("window", [(1, 0), (0, 2), (None, 1), (2, None)])
def test_native_window_through_jax(jax, alignment, len_q, len_k, window):
    """native_window maps the spec's window to jax's local_window_size exactly where it is exact."""
    rng = np.random.default_rng(8)
    q, k, v = random_qkv(rng, len_q, len_k)
    native = masks.native_window(window, alignment, len_q, len_k)
    btnh = lambda x: jax.numpy.asarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    got = jax.nn.dot_product_attention(btnh(q), btnh(k), btnh(v), local_window_size=native,
                                       implementation="xla")
    ref, _ = oracle.attention(q, k, v, window=window, alignment=alignment)
    rows = masks.structural_mask(B, len_q, len_k, window=window, alignment=alignment)
    keep = rows.any(axis=-1)[..., None].transpose(0, 2, 1, 3)  # rows with an allowed key
    np.testing.assert_allclose(np.where(keep, np.asarray(got), 0),
                               np.where(keep, ref.transpose(0, 2, 1, 3), 0), rtol=0, atol=1e-6)


def test_native_window_refuses_what_is_not_exact():
    assert masks.native_window((1, 0), "bottom_right", 3, 5) is None
    assert masks.native_window((None, None), "top_left", 3, 5) == (5, 5)


@pytest.mark.parametrize("kw", [
    {"window": (1, 0), "alignment": "bottom_right"},
    {"causal": "bottom_right", "key_value_seq_lengths": np.array([4, 6]),
     "query_seq_lengths": np.array([2, 4])},
    {"causal": "top_left", "q_segment_ids": np.array([[0, 0, 1, 1], [5, 5, 5, 7]]),
     "kv_segment_ids": np.array([[0, 0, 0, 1, 1, 1], [5, 7, 7, 7, 7, 7]])},
], ids=["window", "lengths", "segments"])
def test_structural_mask_matches_oracle(kw):
    """structural_mask passed as a boolean mask gives the oracle's result for the 1.2 arguments
    (fully masked rows are zeros on both sides)."""
    rng = np.random.default_rng(9)
    q, k, v = random_qkv(rng)
    allowed = masks.structural_mask(B, L_Q, L_K, **kw)
    got, _ = oracle.attention(q, k, v, mask=allowed)
    ref, _ = oracle.attention(q, k, v, **kw)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL64)
    assert masks.structural_mask(B, L_Q, L_K) is None


def test_rank4_and_numpy_ops():
    x = np.ones((L_Q, L_K), bool)
    assert masks.rank4(x).shape == (1, 1, L_Q, L_K) and masks.rank4(None) is None
    assert masks.blocked(None) is None and not masks.blocked(x).any()
    assert masks.additive_mask(like=np.zeros(1, np.float32)) is None
    add = masks.additive_mask(like=np.zeros(1, np.float32), legacy_mask=np.ones(L_K))
    assert add.dtype == np.float32 and add.shape == (1, 1, 1, L_K) and add[0, 0, 0, 0] == -1e9


# -- array_ops ------------------------------------------------------------------------------------

def test_ops_for_each_framework(torch, jax):
    from mhaspec.backends.array_ops import ops_for

    assert ops_for(np.zeros(1)).framework == "numpy"
    assert ops_for(torch.zeros(1)).framework == "torch"
    assert ops_for(jax.numpy.zeros(1)).framework == "jax"
    assert ops_for([1.0]).framework == "numpy"
    tf = pytest.importorskip("tensorflow")
    assert ops_for(tf.zeros(1)).framework == "tensorflow"
    assert masks.rank4(tf.ones((L_Q, L_K))).shape == (1, 1, L_Q, L_K)
