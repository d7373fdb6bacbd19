"""numpy-chunked's blocks: any block sizes, masks cut per head and block, agree with the oracle;
the blockwise kernel and the backend's spec 1.2 calls (grouped heads, softcap, windows, ALiBi,
segments, sequence lengths, the KV cache, lse) against ``oracle.attention_result``."""

import numpy as np
import pytest

from mhaspec.backends import CAPABILITIES, AttentionOutputs, MHAParams, np_chunked, positions
from mhaspec.backends.np_chunked import (Alibi, BlockMask, Blocks, ChunkedNumpyBackend,
                                         blockwise_attention)
from mhaspec.spec import oracle


def _case(rng):
    b, h, l_q, l_k, d = (int(x) for x in rng.integers(1, [3, 5, 30, 30, 9]))
    q = rng.standard_normal((b, h, l_q, d)) * 3
    k, v = rng.standard_normal((b, h, l_k, d)), rng.standard_normal((b, h, l_k, d))
    kw = {"mask": rng.random((b, 1, l_q, l_k)) < 0.7 if rng.random() < 0.5 else None,
          "causal": ("top_left", "bottom_right", None)[int(rng.integers(3))],
          "bias": rng.standard_normal((h, l_q, l_k)) if rng.random() < 0.4 else None,
          "key_padding_mask": rng.random((b, l_k)) < 0.8 if rng.random() < 0.4 else None}
    return q, k, v, kw


@pytest.mark.parametrize("block_q, block_k", [(None, None), (1, 1), (3, 4), (7, 2), (64, 5)])
def test_blocks_of_any_size_agree_with_the_oracle(block_q, block_k):
    backend = ChunkedNumpyBackend(block_q=block_q, block_k=block_k)
    rng = np.random.default_rng(0 if block_q is None else block_q * 100 + block_k)
    for _ in range(30):
        q, k, v, kw = _case(rng)
        out, weights = backend.scaled_dot_product_attention(q, k, v, **kw)
        want, _ = oracle.attention(q, k, v, **kw)
        assert weights is None
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


def test_long_rows_are_split_into_key_blocks_and_heads_into_groups(monkeypatch):
    """L_q * L_k above one block: one head per block and several key blocks per query row."""
    monkeypatch.setattr(np_chunked, "BLOCK_ELEMENTS", 100)  # 40 x 40 logits per head: 2 x 40 blocks
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 40, 4)) for _ in range(3))
    out, _ = ChunkedNumpyBackend(block_k=16).scaled_dot_product_attention(q, k, v, causal="bottom_right")
    want, _ = oracle.attention(q, k, v, causal="bottom_right")
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


# -- the blockwise kernel with the spec 1.2 features, against oracle.attention_result ------------

ALIGNMENTS = ("top_left", "bottom_right")


def _feature_case(rng, *, gqa: bool):
    """Random (q, k, v) and oracle keyword arguments drawing every feature the kernel has."""
    b, l_q, l_k, d = (int(x) for x in rng.integers(1, [3, 12, 12, 6]))
    g = int(rng.integers(1, 3))
    h = g * (int(rng.integers(1, 3)) if gqa else 1)
    q = rng.standard_normal((b, h, l_q, d)) * 3
    k, v = rng.standard_normal((b, g, l_k, d)), rng.standard_normal((b, g, l_k, d))
    kw = {"causal": (None, *ALIGNMENTS)[int(rng.integers(3))]}
    diagonal = kw["causal"] or ALIGNMENTS[int(rng.integers(2))]
    if rng.random() < 0.5:
        kw["softcap"] = float(rng.choice([0.5, 2.0, 30.0]))
    if rng.random() < 0.6:
        kw["window"] = tuple(None if rng.random() < 0.3 else int(rng.integers(0, 4))
                             for _ in range(2))
    if rng.random() < 0.4:
        kw["alibi_slopes"] = rng.random((h,) if rng.random() < 0.5 else (b, h))
    if rng.random() < 0.5:
        kw["q_segment_ids"] = rng.integers(0, 3, (b, l_q))
        kw["kv_segment_ids"] = rng.integers(0, 3, (b, l_k))
    if rng.random() < 0.3:
        kw["query_seq_lengths"] = rng.integers(0, l_q + 1, b)
    if rng.random() < 0.3:
        kw["key_value_seq_lengths"] = rng.integers(0, l_k + 1, b)
    if rng.random() < 0.3:
        kw["mask"] = rng.random((b, 1, l_q, l_k)) < 0.8
    if rng.random() < 0.3:
        kw["bias"] = rng.standard_normal((h, l_q, l_k))
    if "window" in kw or "alibi_slopes" in kw:
        kw["alignment"] = diagonal
    return q, k, v, kw


def _kernel(q, k, v, kw, blocks, dtype):
    """The kernel on the case (positions from backends.positions), in ``dtype``."""
    b, l_q, l_k = q.shape[0], q.shape[2], k.shape[2]
    diagonal = kw.get("causal") or kw.get("alignment")
    pos = positions.token_positions(
        b, l_q, l_k, alignment=diagonal,
        **{n: kw.get(n) for n in ("q_segment_ids", "kv_segment_ids", "query_seq_lengths",
                                  "key_value_seq_lengths")})
    allowed = BlockMask(mask=kw.get("mask"), positions=pos, causal=kw.get("causal") is not None,
                        window=kw.get("window"))
    alibi = None if kw.get("alibi_slopes") is None else Alibi(kw["alibi_slopes"], pos)
    return blockwise_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                               scale=1 / np.sqrt(q.shape[-1]), allowed=allowed,
                               additive=[] if kw.get("bias") is None else [kw["bias"]],
                               alibi=alibi, softcap=kw.get("softcap"), lse=True, blocks=blocks)


@pytest.mark.parametrize("dtype, atol", [("float64", 1e-12), ("float32", 1e-5)])
@pytest.mark.parametrize("blocks", [Blocks(2, 3, 1), Blocks(3, 2, 2), Blocks(64, 64, 8)])
@pytest.mark.parametrize("gqa", [False, True])
def test_kernel_features_agree_with_the_oracle(dtype, atol, blocks, gqa):
    """Windows, segments (ids and lengths), softcap, ALiBi, masks, bias and grouped heads, in
    blocks of 2-3 so that skipped, partial and full blocks all occur; output and lse."""
    rng = np.random.default_rng([blocks.block_q, blocks.block_k, int(gqa), len(dtype)])
    for _ in range(40):
        q, k, v, kw = _feature_case(rng, gqa=gqa)
        want = oracle.attention_result(q, k, v, precision=dtype, **kw)
        out, lse = _kernel(q, k, v, kw, blocks, dtype)
        assert out.dtype == lse.dtype == np.dtype(dtype)
        np.testing.assert_allclose(out, want.output, rtol=0, atol=atol, err_msg=str(kw))
        finite = np.isfinite(want.lse)
        np.testing.assert_array_equal(np.isfinite(lse), finite, err_msg=str(kw))
        np.testing.assert_allclose(lse[finite], want.lse[finite], rtol=0, atol=atol * 10,
                                   err_msg=str(kw))


def test_kernel_lse_is_minus_infinity_for_empty_rows():
    """A row whose window holds no key (window (0, 0) off the diagonal, L_q > L_k top-left):
    output 0 and lse -inf (MASK-9, LSE-1)."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((1, 1, 5, 2)), rng.standard_normal((1, 1, 2, 2)), \
        rng.standard_normal((1, 1, 2, 2))
    kw = {"window": (0, 0), "alignment": "top_left"}
    out, lse = _kernel(q, k, v, kw, Blocks(2, 2, 1), "float64")
    assert np.all(out[0, 0, 2:] == 0) and np.all(lse[0, 0, 2:] == -np.inf)
    assert np.all(np.isfinite(lse[0, 0, :2]))


def test_kernel_skips_blocks_the_window_blocks(monkeypatch):
    """With a window of 1 around the diagonal, only the key blocks near it are multiplied."""
    calls = []
    real = np.matmul

    def counting(a, b, *args, **kwargs):
        calls.append(a.shape)
        return real(a, b, *args, **kwargs)

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, 32, 4)) for _ in range(3))
    kw = {"window": (1, 1), "alignment": "top_left"}
    want = oracle.attention_result(q, k, v, **kw)
    monkeypatch.setattr(np_chunked.np, "matmul", counting)
    out, _ = _kernel(q, k, v, kw, Blocks(4, 4, 1), "float64")
    monkeypatch.undo()
    np.testing.assert_allclose(out, want.output, rtol=0, atol=1e-12)
    # 8 query blocks, each touching its own key block and at most one neighbour on each side
    # (2 matmuls per block: QK^T and PV), against 8 x 8 blocks without skipping
    assert len(calls) <= 2 * (8 + 2 * 7)


# -- the backend's spec 1.2 calls (validation and plumbing of the generic layer, this kernel) ----


def _call_case(rng, op: str):
    """Random inputs of ``op`` (float64 NumPy) with grouped heads and spec 1.2 arguments,
    including a KV cache with per-item valid lengths (no segments or lengths with a cache)."""
    b, g = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    h = g * int(rng.integers(1, 3))
    l_q, l_k, d_k, d_v = (int(x) for x in rng.integers(1, [7, 7, 5, 5]))
    kw = {"lse": True}
    cached = rng.random() < 0.4
    if cached:
        l_past = int(rng.integers(0, 6))
        kw["past_key"] = rng.standard_normal((b, g, l_past, d_k))
        kw["past_value"] = rng.standard_normal((b, g, l_past, d_v))
        if rng.random() < 0.7:
            kw["past_lengths"] = rng.integers(0, l_past + 1, b)
        kw["causal"] = (None, "bottom_right")[int(rng.integers(2))]
        diagonal = "bottom_right"
    else:
        kw["causal"] = (None, "top_left", "bottom_right")[int(rng.integers(3))]
        diagonal = kw["causal"] or ("top_left", "bottom_right")[int(rng.integers(2))]
        if rng.random() < 0.5:
            kw["q_segment_ids"] = rng.integers(0, 2, (b, l_q))
            kw["kv_segment_ids"] = rng.integers(0, 2, (b, l_k))
        if rng.random() < 0.3:
            kw["key_value_seq_lengths"] = rng.integers(0, l_k + 1, b)
    if rng.random() < 0.5:
        kw["softcap"] = float(rng.choice([0.3, 1.0, 20.0]))
    if rng.random() < 0.5:
        kw["window"] = tuple(None if rng.random() < 0.3 else int(rng.integers(0, 3))
                             for _ in range(2))
    if rng.random() < 0.4:
        kw["alibi_slopes"] = rng.random((h,))
    if ("window" in kw or "alibi_slopes" in kw) and kw["causal"] is None:
        kw["alignment"] = diagonal
    normal = rng.standard_normal
    if op == "sdpa":
        x = {"q": normal((b, h, l_q, d_k)) * 2, "k": normal((b, g, l_k, d_k)),
             "v": normal((b, g, l_k, d_v))}
    else:  # d_model 5, k_dim 4, v_dim 3, d_out 6; biases b_q and b_v only
        x = {"query": normal((b, l_q, 5)), "key": normal((b, l_k, 4)),
             "value": normal((b, l_k, 3)),
             "params": MHAParams(normal((5, h * d_k)), normal((4, g * d_k)), normal((3, g * d_v)),
                                 normal((h * d_v, 6)), normal(h * d_k), None, normal(g * d_v),
                                 None)}
    return x, kw, h, g


def _backend_call(backend, op, x, kw, h, g, dtype):
    def conv(a):
        if not isinstance(a, np.ndarray):
            return a
        return backend.asarray(a, dtype="int64" if a.dtype.kind == "i" else dtype)

    kw = {n: conv(a) for n, a in kw.items()}
    if op == "sdpa":
        return backend.scaled_dot_product_attention(conv(x["q"]), conv(x["k"]), conv(x["v"]), **kw)
    params = MHAParams(*(None if p is None else conv(p) for p in x["params"]))
    return backend.multi_head_attention(conv(x["query"]), conv(x["key"]), conv(x["value"]), params,
                                        num_heads=h, num_kv_heads=g, **kw)


@pytest.mark.parametrize("dtype, atol", [("float64", 1e-12), ("float32", 2e-5)])
@pytest.mark.parametrize("op", ["sdpa", "mha"])
def test_feature_calls_agree_with_the_oracle(op, dtype, atol):
    """Both operations with grouped heads, softcap, windows, ALiBi, segments, lengths and the KV
    cache, lse asked for, in blocks of 2 x 3: output, lse and the present cache vs the oracle."""
    backend = ChunkedNumpyBackend(block_q=2, block_k=3)
    rng = np.random.default_rng([len(op), len(dtype)])
    for _ in range(60):
        x, kw, h, g = _call_case(rng, op)
        reference = {n: a for n, a in kw.items() if n != "lse"}
        if op == "sdpa":
            want = oracle.attention_result(x["q"], x["k"], x["v"], precision=dtype, **reference)
        else:
            want = oracle.multi_head_attention_result(
                x["query"], x["key"], x["value"], oracle.Params(*x["params"]), num_heads=h,
                num_kv_heads=g, precision=dtype, **reference)
        got = _backend_call(backend, op, x, kw, h, g, dtype)
        assert isinstance(got, AttentionOutputs) and got.weights is None
        np.testing.assert_allclose(got.output, want.output, rtol=0, atol=atol, err_msg=str(kw))
        np.testing.assert_array_equal(np.isneginf(got.lse), np.isneginf(want.lse), err_msg=str(kw))
        finite = np.isfinite(want.lse)
        np.testing.assert_allclose(got.lse[finite], want.lse[finite], rtol=0, atol=10 * atol)
        if "past_key" not in kw:
            assert got.present_key is None and got.present_lengths is None
            continue
        np.testing.assert_array_equal(got.present_lengths, want.present_lengths)
        for field in ("present_key", "present_value"):
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=0,
                                       atol=0 if op == "sdpa" else atol)


def test_without_lse_or_cache_a_feature_call_returns_a_pair():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((1, 2, 4, 3)), rng.standard_normal((1, 1, 5, 3)), \
        rng.standard_normal((1, 1, 5, 3))
    out, weights = ChunkedNumpyBackend(block_q=2, block_k=2).scaled_dot_product_attention(
        q, k, v, softcap=1.0, window=(1, 1), causal="bottom_right")
    want = oracle.attention_result(q, k, v, softcap=1.0, window=(1, 1), causal="bottom_right")
    assert weights is None
    np.testing.assert_allclose(out, want.output, rtol=0, atol=1e-12)


def test_capabilities_are_every_feature_but_weights_and_gradients():
    """No weights, no mha_vjp and no bias gradient (the blockwise backward keeps no dS); the
    backward pass of attention (spec 1.3) and sinks are claimed."""
    assert set(ChunkedNumpyBackend.capabilities) == set(CAPABILITIES) - {"weights", "grad",
                                                                          "bias_grad"}
