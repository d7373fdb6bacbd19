"""The spec 1.2 features of the backends built on the generic algorithms, against the oracle.

Every registered backend that computes with the generic algorithms and their dense kernel (NumPy,
PyTorch, JAX, TensorFlow; per-head, batched and compiled) claims every feature. Each feature alone and a few
combinations are compared with ``spec.oracle.attention_result`` / ``multi_head_attention_result``:
float64 within 1e-10 relative, float32 within 1e-4; the present cache of attention is compared
exactly (it is a copy of its inputs); every error rule of the draft clauses raises ValueError
naming its argument. The native adapters (their framework's op computes) and numpy-chunked (its
blockwise kernel) have their own tests. Shapes are few and small, so the compiled variants compile a few
times only.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, d_k / d_v per-head widths, d_model query width.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from mhaspec.backends import Algorithm, AttentionOutputs, MHAParams, load_backend, loadable
from mhaspec.spec import oracle
from mhaspec.backends.claim_readers import OPS

B, H, G, L_Q, L_K, L_PAST, D_K, D_V = 2, 4, 2, 3, 5, 3, 4, 3
D_MODEL, K_DIM, V_DIM, D_OUT = 6, 5, 4, 7
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
FEATURES = ("softcap", "window", "alibi", "segments", "kv_cache", "lse")


def _generic_backends() -> list[str]:
    """Registered backends that run one of the generic algorithms with its dense kernel, which
    forms the weights: not the native adapters (``native_op``: the framework's op computes) nor
    a blockwise kernel that forms no weights (numpy-chunked: tests/test_np_chunked.py)."""
    # an adapter whose framework is missing is not a generic backend
    return [name for name, backend in loadable().backends.items()
            if isinstance(getattr(backend, "algorithm", None), Algorithm)
            and not getattr(backend, "native_op", "") and "weights" in backend.capabilities]


BACKENDS = _generic_backends()


def _backend(name: str):
    backend = load_backend(name)
    try:
        backend.framework_version()
    except ImportError as exc:
        pytest.skip(f"{name}: its framework {backend.framework} does not import: {exc}")
    return backend


def _cases() -> dict[str, dict]:
    """Feature keyword arguments as NumPy values, by case name (each feature alone, then a few
    combinations). The query, key and value shapes are those of :func:`_inputs`."""
    rng = np.random.default_rng(12)
    q_ids = np.array([[0, 0, 1], [7, 7, 7]])
    kv_ids = np.array([[0, 1, 1, 0, 1], [3, 7, 7, 0, 7]])
    cache = {"past_key": rng.standard_normal((B, G, L_PAST, D_K)),
             "past_value": rng.standard_normal((B, G, L_PAST, D_V))}
    return {
        "gqa": {},
        "softcap": {"softcap": 0.75},
        "window": {"window": (1, 0), "alignment": "bottom_right"},
        "window-causal": {"window": (None, 1), "causal": "top_left"},
        "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0]), "alignment": "top_left"},
        "alibi-batch": {"alibi_slopes": rng.random((B, H)), "causal": "bottom_right"},
        "segments": {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids, "causal": "bottom_right"},
        "lengths": {"query_seq_lengths": np.array([2, 3]),
                    "key_value_seq_lengths": np.array([4, 0])},
        "lse": {"lse": True, "mask": rng.random((B, 1, L_Q, L_K)) < 0.6},
        "cache": {**cache, "past_lengths": np.array([1, 3])},
        "cache-empty": {"past_key": np.zeros((B, G, 0, D_K)),
                        "past_value": np.zeros((B, G, 0, D_V)), "causal": "bottom_right"},
        "cache-causal": {**cache, "past_lengths": np.array([2, 0]), "causal": "bottom_right",
                         "lse": True, "key_padding_mask": rng.random((B, L_PAST + L_K)) < 0.8},
        "window-segments-softcap-alibi-lse": {
            "window": (2, 1), "alignment": "top_left", "q_segment_ids": q_ids,
            "kv_segment_ids": kv_ids, "softcap": 1.5, "alibi_slopes": rng.random((B, H)),
            "lse": True, "bias": rng.standard_normal((B, H, L_Q, L_K))},
        "cache-window-alibi-softcap": {
            **cache, "past_lengths": np.array([3, 1]), "window": (2, None), "softcap": 2.0,
            "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]), "lse": True},
    }


CASES = _cases()


def _inputs(op: str) -> dict:
    """Float64 NumPy inputs of ``op``: q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k,
    d_v); or query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) and the
    projections of h query and g key/value heads with biases."""
    rng = np.random.default_rng(5)
    if op == "sdpa":
        return {"q": rng.standard_normal((B, H, L_Q, D_K)), "k": rng.standard_normal((B, G, L_K, D_K)),
                "v": rng.standard_normal((B, G, L_K, D_V))}
    shapes = {"w_q": (D_MODEL, H * D_K), "w_k": (K_DIM, G * D_K), "w_v": (V_DIM, G * D_V),
              "w_o": (H * D_V, D_OUT), "b_q": (H * D_K,), "b_k": (G * D_K,), "b_v": (G * D_V,),
              "b_o": (D_OUT,)}
    return {"query": rng.standard_normal((B, L_Q, D_MODEL)),
            "key": rng.standard_normal((B, L_K, K_DIM)),
            "value": rng.standard_normal((B, L_K, V_DIM)),
            "params": oracle.Params(*(rng.standard_normal(shapes[n]) for n in MHAParams._fields))}


def _convert(backend, value, dtype: str):
    """A NumPy argument as the backend's: float arrays in ``dtype``, integer ones as int64."""
    if not isinstance(value, np.ndarray):
        return value
    kind = {"b": "bool", "i": "int64"}.get(value.dtype.kind, dtype)
    return backend.asarray(value, dtype=kind)


def _run(backend, op: str, dtype: str, kwargs: dict):
    """Call ``op`` on the backend with the inputs of :func:`_inputs` and ``kwargs``."""
    x = _inputs(op)
    kw = {n: _convert(backend, v, dtype) for n, v in kwargs.items()}
    if op == "sdpa":
        return backend.scaled_dot_product_attention(
            *(_convert(backend, x[n], dtype) for n in ("q", "k", "v")), **kw)
    params = MHAParams(*(_convert(backend, p, dtype) for p in x["params"]))
    return backend.multi_head_attention(
        *(_convert(backend, x[n], dtype) for n in ("query", "key", "value")), params,
        num_heads=H, num_kv_heads=G, **kw)


def _reference(op: str, kwargs: dict) -> oracle.AttentionResult:
    x = _inputs(op)
    kw = {n: v for n, v in kwargs.items() if n != "lse"}
    if op == "sdpa":
        return oracle.attention_result(x["q"], x["k"], x["v"], **kw)
    return oracle.multi_head_attention_result(x["query"], x["key"], x["value"], x["params"],
                                              num_heads=H, num_kv_heads=G, **kw)


def _assert_close(name: str, got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """``got`` equals ``want`` within the dtype's relative tolerance (scaled by max |want|, at
    least 1); -inf only where ``want`` has -inf."""
    assert got.shape == want.shape, f"{name}: shape {got.shape}, want {want.shape}"
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{name}: -inf")
    finite = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    err = float(np.max(np.abs(got[finite] - want[finite]), initial=0.0)) / scale
    assert err <= TOLERANCE[dtype], f"{name}: relative error {err:.3g} > {TOLERANCE[dtype]}"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", BACKENDS)
def test_feature_matches_the_oracle(name, op, case):
    backend = _backend(name)
    kwargs = CASES[case]
    want = _reference(op, kwargs)
    outputs = bool(kwargs.get("lse")) or "past_key" in kwargs
    for dtype in TOLERANCE:
        got = _run(backend, op, dtype, kwargs)
        if not outputs:
            assert isinstance(got, tuple) and len(got) == 2, "without lse or a cache: a pair"
            got = AttentionOutputs(*got)
        assert isinstance(got, AttentionOutputs), "with lse or a cache: AttentionOutputs"
        _assert_close("output", backend.to_numpy(got.output), want.output, dtype)
        _assert_close("weights", backend.to_numpy(got.weights), want.weights, dtype)
        if kwargs.get("lse"):
            _assert_close("lse", backend.to_numpy(got.lse), want.lse, dtype)
        else:
            assert got.lse is None
        if "past_key" not in kwargs:
            assert got.present_key is got.present_value is got.present_lengths is None
            continue
        np.testing.assert_array_equal(backend.to_numpy(got.present_lengths), want.present_lengths)
        for field in ("present_key", "present_value"):
            present = backend.to_numpy(getattr(got, field))
            if op == "sdpa":  # CACHE-1: a copy of the past and new entries, then zeros
                np.testing.assert_array_equal(present, getattr(want, field).astype(dtype))
            else:  # projected keys and values: exact zeros past present_lengths
                _assert_close(field, present, getattr(want, field), dtype)
                padding = np.arange(present.shape[2]) >= want.present_lengths[:, None]
                assert not np.any(present.transpose(0, 2, 1, 3)[padding])


@pytest.mark.parametrize("name", BACKENDS)
def test_every_feature_is_claimed(name):
    backend = _backend(name)
    assert {"gqa", *FEATURES} <= set(backend.capabilities)


@pytest.mark.parametrize("name", BACKENDS)
def test_incremental_decoding_through_the_cache_equals_one_causal_call(name):
    """CACHE-3 for multi-head attention with soft-capping: a sequence of L_k tokens fed two, one,
    then two at a time through the cache equals one bottom-right causal call over all of them."""
    backend = _backend(name)
    x = _inputs("mha")
    tokens = {"query": np.random.default_rng(9).standard_normal((B, L_K, D_MODEL)),
              "key": x["key"], "value": x["value"]}
    dtype = "float64"
    params = MHAParams(*(_convert(backend, p, dtype) for p in x["params"]))
    cache = {"past_key": backend.asarray(np.zeros((B, G, 0, D_K)), dtype=dtype),
             "past_value": backend.asarray(np.zeros((B, G, 0, D_V)), dtype=dtype)}
    outs = []
    for start, stop in ((0, 2), (2, 3), (3, L_K)):
        step = [backend.asarray(tokens[n][:, start:stop], dtype=dtype)
                for n in ("query", "key", "value")]
        res = backend.multi_head_attention(*step, params, num_heads=H, num_kv_heads=G,
                                           causal="bottom_right", softcap=3.0, **cache)
        outs.append(backend.to_numpy(res.output))
        cache = {"past_key": res.present_key, "past_value": res.present_value}
    want = oracle.multi_head_attention_result(
        tokens["query"], tokens["key"], tokens["value"], x["params"], num_heads=H,
        num_kv_heads=G, causal="bottom_right", softcap=3.0).output
    _assert_close("decoded output", np.concatenate(outs, axis=1), want, dtype)


def _errors(op: str) -> list[tuple[str, dict, str]]:
    """(case id, keyword arguments as NumPy values, the argument the ValueError names)."""
    kv_shape = (B, G, L_PAST)
    good_cache = {"past_key": np.zeros((*kv_shape, D_K)), "past_value": np.zeros((*kv_shape, D_V))}
    cases = [
        ("softcap-zero", {"softcap": 0.0}, "softcap"),
        ("softcap-negative", {"softcap": -1.0}, "softcap"),
        ("softcap-inf", {"softcap": float("inf")}, "softcap"),
        ("softcap-nan", {"softcap": float("nan")}, "softcap"),
        ("softcap-bool", {"softcap": True}, "softcap"),
        ("softcap-str", {"softcap": "1"}, "softcap"),
        ("window-negative", {"window": (-1, 0), "causal": "top_left"}, "window"),
        ("window-not-a-pair", {"window": (1, 2, 3), "causal": "top_left"}, "window"),
        ("window-int", {"window": 2, "causal": "top_left"}, "window"),
        ("window-float-side", {"window": (1.5, 0), "causal": "top_left"}, "window"),
        ("window-without-alignment", {"window": (1, 1)}, "alignment"),
        ("alibi-without-alignment", {"alibi_slopes": np.ones(H)}, "alignment"),
        ("alignment-unknown", {"window": (1, 1), "alignment": "centre"}, "alignment"),
        ("alignment-differs-from-causal",
         {"window": (1, 1), "alignment": "top_left", "causal": "bottom_right"}, "alignment"),
        ("alibi-length", {"alibi_slopes": np.ones(H + 1), "causal": "top_left"}, "alibi_slopes"),
        ("alibi-shape", {"alibi_slopes": np.ones((B, H, 1)), "causal": "top_left"},
         "alibi_slopes"),
        ("alibi-inf", {"alibi_slopes": np.array([1.0, np.inf, 0.0, 0.0]), "causal": "top_left"},
         "alibi_slopes"),
        ("alibi-bool", {"alibi_slopes": np.ones(H, bool), "causal": "top_left"}, "alibi_slopes"),
        ("q-ids-alone", {"q_segment_ids": np.zeros((B, L_Q), np.int64)}, "kv_segment_ids"),
        ("kv-ids-alone", {"kv_segment_ids": np.zeros((B, L_K), np.int64)}, "q_segment_ids"),
        ("q-ids-shape", {"q_segment_ids": np.zeros((B, L_Q + 1), np.int64),
                         "kv_segment_ids": np.zeros((B, L_K), np.int64)}, "q_segment_ids"),
        ("kv-ids-float", {"q_segment_ids": np.zeros((B, L_Q), np.int64),
                          "kv_segment_ids": np.zeros((B, L_K))}, "kv_segment_ids"),
        ("q-lengths-range", {"query_seq_lengths": np.array([L_Q + 1, 0])}, "query_seq_lengths"),
        ("kv-lengths-negative", {"key_value_seq_lengths": np.array([-1, 0])},
         "key_value_seq_lengths"),
        ("kv-lengths-shape", {"key_value_seq_lengths": np.array([1, 1, 1])},
         "key_value_seq_lengths"),
        ("past-key-alone", {"past_key": good_cache["past_key"]}, "past_value"),
        ("past-value-alone", {"past_value": good_cache["past_value"]}, "past_key"),
        ("past-key-rank", {**good_cache, "past_key": np.zeros((B, G, D_K))}, "past_key"),
        ("past-key-heads", {**good_cache, "past_key": np.zeros((B, G + 1, L_PAST, D_K))},
         "past_key"),
        ("past-key-batch", {**good_cache, "past_key": np.zeros((B + 1, G, L_PAST, D_K))},
         "past_key"),
        ("past-value-width", {**good_cache, "past_value": np.zeros((*kv_shape, D_V + 1))},
         "past_value"),
        ("past-value-length", {**good_cache, "past_value": np.zeros((B, G, L_PAST + 1, D_V))},
         "past_value"),
        ("past-lengths-range", {**good_cache, "past_lengths": np.array([L_PAST + 1, 0])},
         "past_lengths"),
        ("past-lengths-float", {**good_cache, "past_lengths": np.array([1.0, 0.0])},
         "past_lengths"),
        ("past-lengths-alone", {"past_lengths": np.array([1, 1])}, "past_lengths"),
        ("cache-top-left-causal", {**good_cache, "causal": "top_left"}, "causal"),
        ("cache-top-left-alignment", {**good_cache, "window": (1, 0), "alignment": "top_left"},
         "alignment"),
        ("cache-with-segments", {**good_cache, "q_segment_ids": np.zeros((B, L_Q), np.int64),
                                 "kv_segment_ids": np.zeros((B, L_K), np.int64)}, "past_key"),
        ("cache-with-lengths", {**good_cache, "key_value_seq_lengths": np.array([1, 1])},
         "past_key"),
        ("mask-without-cache-length", {**good_cache, "mask": np.ones((L_Q, L_K), bool)}, "mask"),
        ("lse-not-bool", {"lse": "yes"}, "lse"),
    ]
    if op == "sdpa":
        cases.append(("gqa-k-heads", {"k": np.zeros((B, 3, L_K, D_K))}, "k"))
        cases.append(("gqa-v-heads", {"v": np.zeros((B, 1, L_K, D_V))}, "v"))
    return cases


ERROR_CASES = [(op, case) for op in OPS for case in _errors(op)]


@pytest.mark.parametrize(("op", "case"), ERROR_CASES,
                         ids=[f"{op}-{case[0]}" for op, case in ERROR_CASES])
@pytest.mark.parametrize("name", BACKENDS)
def test_invalid_feature_argument_is_rejected_naming_it(name, op, case):
    backend = _backend(name)
    _, kwargs, argument = case
    with pytest.raises(ValueError, match=f"'{argument}'"):
        if "k" in kwargs or "v" in kwargs:  # GQA-2: the inputs themselves
            x = {**_inputs("sdpa"), **kwargs}
            backend.scaled_dot_product_attention(
                *(_convert(backend, x[n], "float64") for n in ("q", "k", "v")))
        else:
            _run(backend, op, "float64", kwargs)


@pytest.mark.parametrize("capability", FEATURES)
def test_a_feature_the_backend_does_not_claim_is_refused(capability):
    """NotImplementedError for an unclaimed capability; ValueError naming lse for lse (LSE-1)."""
    backend = copy.copy(_backend(BACKENDS[0]))
    backend.capabilities = frozenset(backend.capabilities) - {capability}
    kwargs = {"softcap": {"softcap": 1.0}, "window": {"window": (1, 1), "causal": "top_left"},
              "alibi": {"alibi_slopes": np.ones(H), "causal": "top_left"},
              "segments": {"query_seq_lengths": np.array([1, 1])},
              "kv_cache": {"past_key": np.zeros((B, G, 1, D_K)),
                           "past_value": np.zeros((B, G, 1, D_V))},
              "lse": {"lse": True}}[capability]
    for op in OPS:
        if capability == "lse":
            with pytest.raises(ValueError, match="'lse'"):
                _run(backend, op, "float64", kwargs)
        else:
            with pytest.raises(NotImplementedError, match=capability):
                _run(backend, op, "float64", kwargs)


def test_grouped_keys_are_refused_without_gqa():
    """Without "gqa", k with fewer heads than q is the ERR-4 error of spec 1.1."""
    backend = copy.copy(_backend(BACKENDS[0]))
    backend.capabilities = frozenset(backend.capabilities) - {"gqa"}
    with pytest.raises(ValueError, match="'q', 'k', 'v' must share batch and head axes"):
        _run(backend, "sdpa", "float64", {})
