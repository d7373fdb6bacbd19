"""The adapter base classes (``mhaspec.backends.adapters``): NumpyAdapter and the framework bases
filling in the protocol, module adapters and untranslated conventions, and how spec 1.2 feature
calls reach an adapter (attention_features or the folded mask, native windows and lengths, the
softcap)."""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.backends import masks
from mhaspec.spec import oracle
from adapter_helpers import B, H, L_K, L_Q, TOL64, jax, random_params, random_qkv  # jax: a fixture


def test_numpy_adapter_base_fills_in_the_protocol():
    from mhaspec.backends.adapters import NumpyAdapter

    class Softmax(NumpyAdapter):
        native_op = "a NumPy function"
        capabilities = frozenset({"sdpa", "mha", "masks", "errors"})  # mha: projections around it

        def attention(self, q, k, v, m):
            allowed = masks.allowed_mask(q.shape[2], k.shape[2], like=q, mask=m.mask,
                                         key_padding_mask=m.key_padding_mask)
            logits = q @ k.swapaxes(-1, -2) * m.scale
            logits = masks.fill_blocked(allowed, like=q, additive=logits)
            w = np.exp(logits - logits.max(axis=-1, keepdims=True))
            return (w / w.sum(axis=-1, keepdims=True)) @ v, None

    be = Softmax("softmax-test")
    assert be.name == "softmax-test" and be.dtypes("cpu") == ("float64", "float32", "float16")
    rng = np.random.default_rng(10)
    q, k, v = random_qkv(rng)
    mask = rng.random((L_Q, L_K)) < 0.7
    mask[:, 0] = True
    x = be.asarray(q, dtype="float32")
    assert x.dtype == np.float32 and be.device_of(x) == "cpu"
    out, w = be.scaled_dot_product_attention(*(be.asarray(a, dtype="float64") for a in (q, k, v)),
                                             mask=be.asarray(mask, dtype="bool"))
    np.testing.assert_allclose(be.to_numpy(out), oracle.attention(q, k, v, mask=mask)[0],
                               rtol=0, atol=TOL64)
    with pytest.raises(ValueError, match="mask"):
        be.scaled_dot_product_attention(q, k, v, mask=np.ones((3, 2), bool))
    with pytest.raises(NotImplementedError, match="split_heads"):
        be.split_heads(q, 2)
    params = random_params(rng, 6, 6, 6, 2, 2, 6)
    query = rng.standard_normal((B, L_Q, 6))
    out, _ = be.multi_head_attention(query, query, query, params, num_heads=H)
    ref, _ = oracle.multi_head_attention(query, query, query, oracle.Params(*params), num_heads=H)
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOL64)


def test_a_numpy_adapter_claiming_attention_vjp_says_it_has_no_autodiff():
    """An adapter's backward pass is the framework's autodiff through its op; NumPy has none, so a
    NumPy adapter that claims "attention_vjp" without writing one is refused when it is built, in
    one line naming what to implement (tests/test_adapter_claims.py), not met by an AttributeError
    from the array machinery on the first call."""
    from mhaspec.backends.adapters import NumpyAdapter

    class Claims(NumpyAdapter):
        native_op = "a NumPy function"
        capabilities = frozenset({"sdpa", "errors", "attention_vjp"})

        def attention(self, q, k, v, m):
            w = np.exp(q @ k.swapaxes(-1, -2) * m.scale)
            return (w / w.sum(axis=-1, keepdims=True)) @ v, None

    with pytest.raises(ValueError, match="no automatic differentiation: implement attention_vjp"):
        Claims("claims-vjp")


def test_module_adapter_base_and_untranslated():
    from mhaspec.backends.adapters import NumpyAdapter

    class Module(NumpyAdapter):
        native_op = "a module"
        capabilities = frozenset({"errors"})
        conventions = {"order": ("MHA-4", "value before key")}

    be = Module("module-test")
    rng = np.random.default_rng(11)
    with pytest.raises(NotImplementedError, match="a module cannot express multi-head"):
        x = rng.standard_normal((B, L_Q, 6))
        be.multi_head_attention(x, x, x, random_params(rng, 6, 6, 6, 2, 2, 6), num_heads=H)
    with pytest.raises(NotImplementedError, match="scaled dot-product attention"):
        be.attention(None, None, None, None)
    raw = be.untranslated("order")
    assert raw.name == "module-test[untranslated order]" and not raw.translates("order")
    assert be.translates("order")
    with pytest.raises(ValueError, match="no convention"):
        be.untranslated("layout")


@pytest.mark.parametrize("base", ["TorchAdapter", "JaxAdapter", "TensorFlowAdapter"])
def test_framework_adapter_bases(base):
    from mhaspec.backends import adapters

    module = {"TorchAdapter": "torch", "JaxAdapter": "jax", "TensorFlowAdapter": "tensorflow"}[base]
    pytest.importorskip(module)
    be = type("Probe", (getattr(adapters, base),), {"native_op": "probe"})("probe")
    assert be.capabilities == frozenset({"errors"})
    x = be.asarray(np.arange(6.0).reshape(2, 3), dtype="float32")
    assert be.device_of(x) == "cpu" and be.to_numpy(x).dtype == np.float32
    assert np.array_equal(be.to_numpy(x), np.arange(6.0).reshape(2, 3))
    assert "bfloat16" in be.dtypes("cpu") and be.framework_version()


def _softmax_attention(q, k, v, m):
    """NumPy attention over the allowed set (0 for an empty row), k and v with g heads."""
    k, v = (np.repeat(t, q.shape[1] // t.shape[1], axis=1) for t in (k, v))
    allowed = masks.allowed_mask(q.shape[2], k.shape[2], like=q, mask=m.mask,
                                 key_padding_mask=m.key_padding_mask, causal=m.causal)
    logits = masks.fill_blocked(allowed, like=q, additive=q @ k.swapaxes(-1, -2) * m.scale)
    top = logits.max(axis=-1, keepdims=True)
    w = np.exp(logits - np.where(np.isfinite(top), top, 0))
    return w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300) @ v, None


@pytest.mark.parametrize("alignment,len_q,len_k,native", [("top_left", 4, 6, True),
                                                          ("bottom_right", 5, 5, True),
                                                          ("bottom_right", 3, 6, False)])
def test_feature_calls_reach_the_native_mapping_or_the_folded_mask(alignment, len_q, len_k, native):
    """A spec 1.2 call (a window, with g = 1 key/value heads) goes to attention_features, which
    maps it to a top-left index window where native_window says that is exact, and otherwise
    returns NotImplemented: the window is then folded into masks.mask for attention()."""
    from mhaspec.backends.adapters import NumpyAdapter

    class Windowed(NumpyAdapter):
        native_op = "a windowed NumPy function"
        capabilities = frozenset({"sdpa", "masks", "causal", "errors", "window", "gqa"})
        calls: list = []

        def attention(self, q, k, v, m):
            self.calls.append("folded")
            return _softmax_attention(q, k, v, m)

        def attention_features(self, q, k, v, m, features):
            window = masks.native_window(features.window, features.diagonal, q.shape[2],
                                         k.shape[2])
            if window is None:
                return NotImplemented
            self.calls.append(("native", window))
            i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
            band = (i - window[0] <= j) & (j <= i + window[1])
            return _softmax_attention(q, k, v, m._replace(mask=band))

    be = Windowed("windowed-test")
    rng = np.random.default_rng(12)
    q, k, v = random_qkv(rng, len_q, len_k, kv_heads=1)
    out, _ = be.scaled_dot_product_attention(q, k, v, window=(1, 0), alignment=alignment)
    ref, _ = oracle.attention(q, k, v, window=(1, 0), alignment=alignment)
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOL64)
    assert be.calls == ([("native", (1, 0))] if native else ["folded"])
    with pytest.raises(NotImplementedError, match="softcap"):
        be.scaled_dot_product_attention(q, k, v, softcap=2.0)


def _positions(**kw):
    from mhaspec.backends import positions
    return positions.token_positions(B, L_Q, L_K, **kw)


@pytest.mark.parametrize("kw,want", [
    ({}, (None, None)),
    ({"key_value_seq_lengths": np.array([4, 6])}, (None, [4, 6])),
    ({"query_seq_lengths": np.array([2, 4]), "key_value_seq_lengths": np.array([6, 1])},
     ([2, 4], [6, 1])),
    ({"q_segment_ids": np.full((B, L_Q), 3), "kv_segment_ids": np.full((B, L_K), 3)},
     (None, None)),
    ({"q_segment_ids": np.array([[0, 0, 1, 1]] * B), "kv_segment_ids": np.zeros((B, L_K), int)},
     "not exact"),
    ({"q_segment_ids": np.zeros((B, L_Q), int), "kv_segment_ids": np.ones((B, L_K), int)},
     "not exact"),
    ({"query_seq_lengths": np.array([2, 4]), "key_value_seq_lengths": np.array([6, 1]),
      "alignment": "bottom_right"}, "not exact"),
], ids=["none", "keys", "both", "one-segment", "two-segments", "other-segment", "shifted"])
def test_native_lengths_only_where_exact(kw, want):
    """Per-batch lengths stand for segments and lengths only when positions are indices and every
    valid token is in one segment (jax query_seq_lengths / key_value_seq_lengths)."""
    got = masks.native_lengths(_positions(**kw) if kw else None)
    if want == "not exact":
        assert got is None
        return
    assert [None if x is None else x.tolist() for x in got] == [
        None if x is None else list(x) for x in want]


@pytest.mark.parametrize("name", ["jax-dpa", "jax-dpa-jit"])
def test_jax_dpa_passes_windows_and_lengths_to_the_op(jax, monkeypatch, name):
    """jax-dpa hands an exact window and lengths to jax.nn.dot_product_attention's own arguments
    (not a folded mask), and the result is the oracle's on every row with an allowed key."""
    from mhaspec.backends import load_backend

    seen = []
    real = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        seen.append({k: kwargs.get(k) is not None for k in
                     ("local_window_size", "query_seq_lengths", "key_value_seq_lengths", "mask")})
        return real(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    be = load_backend(name)
    be.reset()
    rng = np.random.default_rng(13)
    q, k, v = random_qkv(rng)
    kw = {"window": (1, 2), "causal": "top_left", "query_seq_lengths": np.array([3, 4]),
          "key_value_seq_lengths": np.array([5, 2])}
    call = {n: be.asarray(x, dtype="int64") if isinstance(x, np.ndarray) else x
            for n, x in kw.items()}
    out, _ = be.scaled_dot_product_attention(*(be.asarray(x, dtype="float32") for x in (q, k, v)),
                                             **call)
    assert seen == [{"local_window_size": True, "query_seq_lengths": True,
                     "key_value_seq_lengths": True, "mask": False}]
    ref = oracle.attention_result(q, k, v, **kw)
    keep = np.any(ref.weights != 0, axis=-1)[..., None]
    np.testing.assert_allclose(np.where(keep, be.to_numpy(out), 0), np.where(keep, ref.output, 0),
                               rtol=0, atol=2e-6)


@pytest.mark.parametrize("native", [True, False], ids=["attention_features", "folded"])
def test_the_softcap_is_masks_softcap_in_every_adapter_method(native):
    """An adapter that reads the cap from ``masks.softcap`` gets it whether the call goes through
    attention_features or the folded path: no method sees the cap in one place and None in the
    other (reading the wrong one would silently drop the cap)."""
    from mhaspec.backends.adapters import NumpyAdapter

    def capped(q, k, v, m):  # q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v)
        s = q @ k.swapaxes(-1, -2) * m.scale
        s = m.softcap * np.tanh(s / m.softcap)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        return w / w.sum(axis=-1, keepdims=True) @ v, None

    class Capped(NumpyAdapter):
        native_op = "a capped NumPy function"
        capabilities = frozenset({"sdpa", "masks", "errors", "softcap"})
        seen: list = []

        def attention(self, q, k, v, m):
            self.seen.append(("attention", m.softcap))
            return capped(q, k, v, m)

        def attention_features(self, q, k, v, m, features):
            if not native:
                return NotImplemented
            self.seen.append(("attention_features", m.softcap, features.softcap))
            return capped(q, k, v, m)

    be = Capped("capped-test")
    q, k, v = random_qkv(np.random.default_rng(13), L_Q, L_K)
    out, _ = be.scaled_dot_product_attention(q, k, v, softcap=0.5)
    ref, _ = oracle.attention(q, k, v, softcap=0.5)
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOL64)
    assert be.seen == ([("attention_features", 0.5, 0.5)] if native else [("attention", 0.5)])
