"""``ort-attention``: ONNX ``Attention`` on ONNX Runtime (CPU) against the float64 oracle on tiny
cases, its translated convention confirmed by running without it, the facts its declarations rest
on, and the bounded session cache.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d_k / d_v per-head
widths, d_model query width, k_dim / v_dim key / value widths, d_out output width.

Everything that runs ONNX Runtime is skipped, with the reason, when onnx or onnxruntime is not
installed; the missing-package message is checked in a child process that blocks the import.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from load_errors import load_error_line
from mhaspec.backends import MHAParams
from mhaspec.spec import oracle

B, H, L_Q, L_K, D_K, D_V = 2, 3, 4, 6, 5, 3
FLOAT32_TOL = 2e-6  # these cases' float32 error is below 3e-7


@pytest.fixture(scope="module")
def ort_native():
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'mhaspec[onnx]')")
    pytest.importorskip("onnxruntime",
                        reason="onnxruntime is not installed (pip install 'mhaspec[onnx]')")
    from mhaspec.backends import ort_native

    return ort_native


@pytest.fixture(scope="module")
def backend(ort_native):
    return ort_native.OrtAttention("ort-attention-test")


def _qkv(seed=0, len_q=L_Q, len_k=L_K, kv_heads=H):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, len_q, D_K)), rng.standard_normal((B, kv_heads, len_k, D_K)),
            rng.standard_normal((B, kv_heads, len_k, D_V)))


def _arrays(seed=1):
    rng = np.random.default_rng(seed)
    mask = rng.random((B, H, L_Q, L_K)) < 0.7
    mask[..., 0] = True
    kpm = rng.random((B, L_K)) < 0.7
    kpm[:, 0] = True
    legacy = (rng.random((B, 1, 1, L_K)) < 0.3) * 1.0
    legacy[..., 0] = 0.0
    return {"mask": mask, "bias": rng.standard_normal((L_Q, L_K)), "key_padding_mask": kpm,
            "legacy_mask": legacy}


SDPA_CASES = {
    "plain": {},
    "mask": {"mask": "mask"},
    "bias": {"bias": "bias"},
    "mask+bias": {"mask": "mask", "bias": "bias"},
    "key-padding": {"key_padding_mask": "key_padding_mask"},
    "legacy": {"legacy_mask": "legacy_mask"},
    "causal-top-left": {"causal": "top_left"},
    "causal-bottom-right": {"causal": "bottom_right"},
    "causal-bottom-right+key-padding": {"causal": "bottom_right",
                                        "key_padding_mask": "key_padding_mask"},
    "scale": {"scale": 0.3},
}


def _call_sdpa(be, q, k, v, kwargs, dtype="float32"):
    arrays = _arrays()
    spec_kw = {n: arrays[a] if isinstance(a, str) and a in arrays else a for n, a in kwargs.items()}
    be_kw = {n: be.asarray(a, dtype="bool" if a.dtype == bool else dtype)
             if isinstance(a, np.ndarray) else a for n, a in spec_kw.items()}
    out, weights = be.scaled_dot_product_attention(*(be.asarray(x, dtype=dtype) for x in (q, k, v)),
                                                   **be_kw)
    return out, weights, spec_kw


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_matches_the_oracle(backend, case):
    q, k, v = _qkv()
    out, weights, spec_kw = _call_sdpa(backend, q, k, v, SDPA_CASES[case])
    ref_out, ref_weights = oracle.attention(q, k, v, **spec_kw)
    assert out.dtype == np.float32 and out.shape == (B, H, L_Q, D_V)
    assert weights.shape == (B, H, L_Q, L_K)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=FLOAT32_TOL)
    np.testing.assert_allclose(weights, ref_weights, rtol=0, atol=FLOAT32_TOL)


def test_fully_masked_row_gives_zero_output_and_weights(backend):
    q, k, v = _qkv()
    mask = np.ones((L_Q, L_K), dtype=bool)
    mask[1] = False
    out, weights, _ = _call_sdpa(backend, q, k, v, {"mask": mask})
    assert np.all(out[:, :, 1] == 0) and np.all(weights[:, :, 1] == 0)


@pytest.mark.parametrize("kv_heads", [H, 1], ids=["mha", "gqa-g1"])
def test_mha_with_cross_widths_matches_the_oracle(backend, kv_heads):
    rng = np.random.default_rng(2)
    d_model, k_dim, v_dim, d_out = 6, 5, 7, 8
    shapes = ((d_model, H * D_K), (k_dim, kv_heads * D_K), (v_dim, kv_heads * D_V),
              (H * D_V, d_out))
    params = MHAParams(*(rng.standard_normal(s) / math.sqrt(s[0]) for s in shapes),
                       b_q=rng.standard_normal(H * D_K), b_v=rng.standard_normal(kv_heads * D_V))
    query, key, value = (rng.standard_normal((B, n, w))
                         for n, w in ((L_Q, d_model), (L_K, k_dim), (L_K, v_dim)))
    grouping = {} if kv_heads == H else {"num_kv_heads": kv_heads}

    def as32(x):
        return None if x is None else backend.asarray(x, dtype="float32")

    out, weights = backend.multi_head_attention(
        as32(query), as32(key), as32(value), MHAParams(*(as32(p) for p in params)), num_heads=H,
        causal="bottom_right", **grouping)
    ref_out, ref_weights = oracle.multi_head_attention(query, key, value, params, num_heads=H,
                                                       causal="bottom_right", **grouping)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=FLOAT32_TOL)
    np.testing.assert_allclose(weights, ref_weights, rtol=0, atol=FLOAT32_TOL)


def test_causal_alignment_translation_is_needed(backend):
    """is_causal=1 is top-left: without the translation, bottom-right with L_q < L_k is wrong;
    with L_q == L_k both alignments are one mask and the untranslated adapter agrees."""
    raw = backend.untranslated("causal-alignment")
    q, k, v = _qkv()
    ref, _ = oracle.attention(q, k, v, causal="bottom_right")
    shipped = _call_sdpa(backend, q, k, v, {"causal": "bottom_right"})[0]
    untranslated = _call_sdpa(raw, q, k, v, {"causal": "bottom_right"})[0]
    assert np.abs(shipped - ref).max() < FLOAT32_TOL
    assert np.abs(untranslated - ref).max() > 0.1
    q, k, v = _qkv(len_k=L_Q)
    ref, _ = oracle.attention(q, k, v, causal="bottom_right")
    assert np.abs(_call_sdpa(raw, q, k, v, {"causal": "bottom_right"})[0] - ref).max() \
        < FLOAT32_TOL


def _run_node(ort_native, q, k, v, attn_mask=None, scale=None, softcap=None):
    """One Attention node run on its own: output Y."""
    mask_sig = None if attn_mask is None else (attn_mask.shape, attn_mask.dtype.name)
    spec = ort_native.NodeSpec(q.shape, k.shape, v.shape, mask_sig, q.dtype.name, False, scale,
                               softcap)
    feeds = {"Q": q, "K": k, "V": v}
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    return ort_native.cpu_session(ort_native.attention_model(spec)).run(["Y"], feeds)[0]


def test_boolean_attn_mask_has_the_specs_polarity(ort_native):
    """No polarity translation: True = may attend in ONNX as in the spec (MASK-1)."""
    q, k, v = (x.astype(np.float32) for x in _qkv())
    mask = _arrays()["mask"]
    ref, _ = oracle.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                              mask=mask)
    assert np.abs(_run_node(ort_native, q, k, v, mask) - ref).max() < FLOAT32_TOL
    inverted = ~mask
    inverted[..., 0] = True
    assert np.abs(_run_node(ort_native, q, k, v, inverted) - ref).max() > 0.1


@pytest.mark.parametrize("scale, exact", [(0.25, True), (1.0, True), (0.5, False), (0.3, False)])
def test_float64_kernel_takes_the_square_root_of_the_scale_in_float32(ort_native, scale, exact):
    """Why float64 is not claimed (NUM-1): exact when sqrt(scale) is a float32 number, float32
    accuracy otherwise. If this starts failing, onnxruntime has changed: re-check float64."""
    q, k, v = _qkv()
    err = np.abs(_run_node(ort_native, q, k, v, scale=scale)
                 - oracle.attention(q, k, v, scale=scale)[0]).max()
    assert (err < 1e-14) if exact else (1e-9 < err < 1e-6), err


def test_nan_key_behind_a_boolean_mask_leaks(ort_native):
    """MASK-13: the mask is applied as -inf added to the logits, so a masked NaN key is NaN."""
    q, k, v = (x.astype(np.float32) for x in _qkv())
    k[:, :, 2] = np.nan
    mask = np.ones((B, H, L_Q, L_K), dtype=bool)
    mask[..., 2] = False
    assert np.isnan(_run_node(ort_native, q, k, v, mask)).all()


@pytest.mark.parametrize("softcap, finite", [(1e6, False), (7e4, False), (6e4, True), (2.0, True)])
def test_float16_softcap_beyond_its_range_is_nan(ort_native, softcap, finite):
    """SOFTCAP-1 (declared for float16): the kernel rounds c to float16, so c > 65504 is inf and
    the output NaN; float32 follows the oracle with the same cap."""
    q, k, v = _qkv()
    want = oracle.attention_result(q, k, v, softcap=softcap).output
    half = _run_node(ort_native, *(x.astype(np.float16) for x in (q, k, v)), softcap=softcap)
    assert np.isfinite(half).all() == finite
    single = _run_node(ort_native, *(x.astype(np.float32) for x in (q, k, v)), softcap=softcap)
    assert np.abs(single - want).max() < FLOAT32_TOL


@pytest.mark.parametrize("which", ["B", "L_q", "L_k"])
def test_sizes_of_zero_are_rejected(ort_native, which):
    """SHAPE-4: the kernel's parameter check refuses a batch, query or key length of 0."""
    b, len_q, len_k = (0 if which == n else s for n, s in (("B", B), ("L_q", L_Q), ("L_k", L_K)))
    q = np.zeros((b, H, len_q, D_K), np.float32)
    k, v = np.zeros((b, H, len_k, D_K), np.float32), np.zeros((b, H, len_k, D_V), np.float32)
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    with pytest.raises(Fail, match="must be greater than 0"):
        _run_node(ort_native, q, k, v)


def test_session_cache_is_bounded_and_reused(ort_native):
    be = ort_native.OrtAttention("ort-attention-cache", cache_size=2)
    for len_q in (2, 3, 2, 4, 5):
        q, k, v = _qkv(len_q=len_q)
        _call_sdpa(be, q, k, v, {})
    # shapes 2, 3, (2 again: held), 4 (drops 3), 5 (drops 2)
    assert be.sessions.builds == 4 and len(be.sessions) == 2


def test_session_cache_rejects_a_size_below_one(ort_native):
    with pytest.raises(ValueError, match="maxsize"):
        ort_native.SessionCache(0)


def test_missing_onnxruntime_is_one_line():
    """Loading the backend without onnxruntime names the package and the extra."""
    line = load_error_line("ort-attention", "import sys; sys.modules['onnxruntime'] = None")
    assert line.endswith("onnxruntime not installed: pip install 'mhaspec[onnx]'")


@pytest.mark.parametrize("kw, native", [
    ({"key_value_seq_lengths": np.array([4, 0])}, True),
    ({"key_value_seq_lengths": np.array([4, 6]), "causal": "top_left"}, False),
    ({"query_seq_lengths": np.array([2, 4]), "key_value_seq_lengths": np.array([5, 1])}, False),
    ({"q_segment_ids": np.array([[0, 0, 1, 1]] * B),
      "kv_segment_ids": np.array([[0, 0, 0, 1, 1, 1]] * B)}, False),
], ids=["kv-lengths", "with-causal", "both-lengths", "segments"])
def test_key_lengths_go_to_nonpad_kv_seqlen_where_exact(backend, kw, native):
    """SEG-2: key lengths alone become the node's nonpad_kv_seqlen; everything else is folded into
    attn_mask. Both agree with the oracle (a row with no key: output 0, as MASK-9 asks)."""
    backend.sessions = type(backend.sessions)(8)
    q, k, v = (x.astype(np.float32) for x in _qkv(seed=4))
    call = {n: x.astype(np.int64) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    out, _ = backend.scaled_dot_product_attention(q, k, v, **call)
    want = oracle.attention_result(*(x.astype(np.float64) for x in (q, k, v)), **kw).output
    assert np.abs(out - want).max() < FLOAT32_TOL
    assert [spec.lengths for spec in backend.sessions.keys()] == [native]


# -- KV cache (CACHE): the node's past_key / past_value

def _cached_node(ort_native, q, k, v, past_key, past_value, *, reference: bool):
    """One causal Attention node with a cache, run by onnxruntime or by ONNX's own reference
    evaluator: (Y, present_key, W)."""
    from onnx.reference import ReferenceEvaluator

    spec = ort_native.NodeSpec(q.shape, k.shape, v.shape, None, q.dtype.name, True, None, None,
                               False, (past_key.shape, past_value.shape))
    model = ort_native.attention_model(spec)
    feeds = {"Q": q, "K": k, "V": v, "past_key": past_key, "past_value": past_value}
    names = ["Y", "present_key", "W"]
    if reference:
        return ReferenceEvaluator(model).run(names, feeds)
    return ort_native.cpu_session(model).run(names, feeds)


@pytest.mark.parametrize("len_q, len_k", [(1, 2), (1, 4), (2, 3), (3, 2), (1, 1)])
def test_onnxruntime_is_causal_with_a_cache_ignores_the_mask_for_one_query(ort_native, len_q,
                                                                           len_k):
    """With ``past_key`` and ``is_causal=1``, ONNX (its reference) and CACHE-2 allow present key
    j for query i iff j <= L_past + i; onnxruntime 1.32 does so, except with one query and several
    new keys, where it allows every key. The adapter therefore sends that call an explicit mask."""
    rng = np.random.default_rng(40)
    l_past = 3
    q, k, v = (rng.standard_normal((1, 2, n, 4)).astype(np.float32)
               for n in (len_q, len_k, len_k))
    past_key, past_value = (rng.standard_normal((1, 2, l_past, 4)).astype(np.float32)
                            for _ in range(2))
    runtime = _cached_node(ort_native, q, k, v, past_key, past_value, reference=False)
    onnx_ref = _cached_node(ort_native, q, k, v, past_key, past_value, reference=True)
    want = oracle.attention_result(*(x.astype(np.float64) for x in (q, k, v)),
                                   past_key=past_key.astype(np.float64),
                                   past_value=past_value.astype(np.float64), causal="bottom_right")
    assert np.abs(onnx_ref[0] - want.output).max() < FLOAT32_TOL
    assert np.array_equal(runtime[1], np.concatenate([past_key, k], axis=2))  # CACHE-1, full
    ignored = len_q == 1 < len_k
    assert np.array_equal(runtime[2] > 0, want.weights > 0) != ignored
    assert (runtime[2] > 0).all() or not ignored
    assert (np.abs(runtime[0] - want.output).max() < FLOAT32_TOL) != ignored


@pytest.mark.parametrize("past_lengths, mask", [(None, False), ([3, 1], False), ([0, 2], True)])
@pytest.mark.parametrize("len_q, len_k", [(2, 2), (1, 3), (3, 1)])
def test_cache_calls_match_the_oracle(backend, past_lengths, mask, len_q, len_k):
    """CACHE-1, CACHE-2 through the node's past_key / past_value: a full or partly valid cache
    (the mask scattered into the node's layout, the present cache gathered back), with a mask."""
    rng = np.random.default_rng(41)
    l_past = 3
    q = rng.standard_normal((B, H, len_q, D_K)).astype(np.float32)
    k = rng.standard_normal((B, 1, len_k, D_K)).astype(np.float32)
    v = rng.standard_normal((B, 1, len_k, D_V)).astype(np.float32)
    past_key = rng.standard_normal((B, 1, l_past, D_K)).astype(np.float32)
    past_value = rng.standard_normal((B, 1, l_past, D_V)).astype(np.float32)
    kw = {"causal": "bottom_right", "past_key": past_key, "past_value": past_value}
    if past_lengths is not None:
        kw["past_lengths"] = np.array(past_lengths)
    if mask:
        kw["mask"] = rng.random((B, 1, len_q, l_past + len_k)) < 0.7
    got = backend.scaled_dot_product_attention(q, k, v, **kw)
    want = oracle.attention_result(*(x.astype(np.float64) for x in (q, k, v)),
                                   **{n: x.astype(np.float64) if n.startswith("past_") and
                                      n != "past_lengths" else x for n, x in kw.items()})
    for name in ("output", "weights", "present_key", "present_value"):
        assert np.abs(getattr(got, name) - getattr(want, name)).max() < FLOAT32_TOL, name
    assert np.array_equal(got.present_lengths, want.present_lengths)


def test_group_query_attention_local_window_size_w_means_w_keys(ort_native):
    """Erratum 1.2-E3's table: onnxruntime's ``com.microsoft.GroupQueryAttention`` with
    ``local_window_size = W`` lets query i see keys i - W < j <= i: W keys, the spec's
    ``window=(W - 1, 0)`` with a bottom-right causal mask (CACHE-2's positions with a cache).
    The op takes packed (B, L, heads * d) inputs and a head size that is a multiple of 8."""
    onnx, ort = ort_native._onnx(), ort_native._ort()
    helper, f32, i32 = onnx.helper, onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    rng = np.random.default_rng(42)
    for w, past, new in [(1, 0, 4), (2, 0, 5), (3, 0, 6), (2, 4, 2), (3, 5, 1)]:
        q, k, v = (rng.standard_normal((1, new, 8)).astype(np.float32) for _ in range(3))
        past_key, past_value = (rng.standard_normal((1, 1, past, 8)).astype(np.float32)
                                for _ in range(2))
        inputs = [helper.make_tensor_value_info(n, f32, x.shape) for n, x in
                  (("q", q), ("k", k), ("v", v), ("pk", past_key), ("pv", past_value))]
        inputs += [helper.make_tensor_value_info("seqlens_k", i32, (1,)),
                   helper.make_tensor_value_info("total", i32, ())]
        node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k",
                                                        "total"], ["y", "pk_out", "pv_out"],
                                domain="com.microsoft", num_heads=1, kv_num_heads=1,
                                local_window_size=w)
        graph = helper.make_graph([node], "gqa", inputs,
                                  [helper.make_tensor_value_info(n, f32, None)
                                   for n in ("y", "pk_out", "pv_out")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 10
        y = ort_native.cpu_session(model).run(["y"], {
            "q": q, "k": k, "v": v, "pk": past_key, "pv": past_value,
            "seqlens_k": np.array([past + new - 1], np.int32),
            "total": np.array(past + new, np.int32)})[0]
        heads = [x[:, None].astype(np.float64) for x in (q, k, v)]  # (B, 1, L, d)
        want = oracle.attention_result(*heads, past_key=past_key.astype(np.float64),
                                       past_value=past_value.astype(np.float64),
                                       causal="bottom_right", window=(w - 1, 0)).output
        one_short = oracle.attention_result(*heads, past_key=past_key.astype(np.float64),
                                            past_value=past_value.astype(np.float64),
                                            causal="bottom_right", window=(w, 0)).output
        assert np.abs(y - want[:, 0]).max() < FLOAT32_TOL, (w, past, new)
        assert np.abs(y - one_short[:, 0]).max() > 1e-3, (w, past, new)
