"""The peers' conventions, written from their sources and compared with the float64 oracle.

Each peer's rule is a small NumPy function transcribed from the peer's own source (repository,
commit, file and line in its docstring): the keys it allows, the bias it adds, the log-sum-exp it
returns; the rules, with the list of their sources, are in ``tests/peer_rules.py``. Each test
runs the rule and the oracle (:mod:`mhaspec.spec.oracle`) through the mapping that
docs/conventions.md documents, on random cases, and asserts agreement where the page says the two
agree and the documented difference where it says they differ. The spec's side of these facts is
the 1.2 errata E1-E6 (``[[erratum]]`` in spec/clauses.toml, docs/errata.md).

Axis legend: B batch, h heads, L_q queries, L_k keys, d per-head width.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mhaspec.conformance.features import geometric_slopes
from mhaspec.spec import oracle

from peer_rules import (
    attention_gym_document, attention_gym_sliding, fa2_alibi, fa2_allowed, fa2_effective_window,
    fa2_kvcache_allowed, fa2_lse, fa2_window, fa_varlen_allowed, flashinfer_lse, flashinfer_merge,
    flashinfer_window_left, gemma_pytorch_local, gpt_oss_sliding, hf_sliding_bidirectional,
    hf_sliding_causal, jax_lse, mistral_decode, mistral_prefill, ort_cpu_local_window, paper_slopes,
    splash_allowed, vllm_window, xformers_local)

#: Random cases per test: each is a few microseconds of NumPy at these sizes.
CASES = 150
EXACT = dict(rtol=1e-12, atol=1e-12)


def _qkv(rng, b, h, l_q, l_k, d=4):
    return (rng.standard_normal((b, h, l_q, d)), rng.standard_normal((b, h, l_k, d)),
            rng.standard_normal((b, h, l_k, d)))


def _lengths(rng, low=1, high=8):
    return int(rng.integers(low, high + 1)), int(rng.integers(low, high + 1))


def _explicit(q, k, v, allowed, bias=None):
    """The oracle on a peer's explicit keys (B, L_q, L_k) bool and bias (B, h, L_q, L_k): the
    spec's MASK-1 / MASK-2 forms, which carry any rule a peer has."""
    return oracle.attention_result(q, k, v, mask=allowed[:, None], bias=bias)


def _spec_allowed(b, l_q, l_k, *, causal=False, window=None, alignment="bottom_right", **seg):
    """The spec's keys (B, L_q, L_k) for causal / window on the positions of SEG-3."""
    positions = oracle.token_positions(b, l_q, l_k, alignment=alignment, **seg)
    return oracle.structural_allowed(positions, causal=causal, window=window)


# ------------------------------------------------------------------ FlashAttention 2

def test_fa2_lse_is_plus_inf_on_empty_rows_and_carries_m_times_p_q_under_causal_alibi():
    """Erratum E1. Causal ALiBi: FA2's lse = LSE-1's + m * p_q(i) with p_q(i) = i + L_k - L_q
    (its logits are LSE-1's plus the row constant m * p_q(i)); outputs agree; an empty row (L_q >
    L_k empties the first rows) is +inf in FA2, -inf in LSE-1, output 0 in both."""
    rng = np.random.default_rng(25)
    saw_empty = saw_moved = 0
    for _ in range(CASES):
        b, h = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        l_q, l_k = _lengths(rng)
        q, k, v = _qkv(rng, b, h, l_q, l_k)
        slopes = rng.random((b, h))
        is_causal, left, right = fa2_window(True, (-1, -1), l_q, l_k, alibi=True)
        assert is_causal
        allowed = fa2_allowed(b, l_q, l_k, left, right)
        bias = fa2_alibi(slopes, True, l_q, l_k)
        peer = _explicit(q, k, v, allowed, bias)
        spec = oracle.attention_result(q, k, v, causal="bottom_right", alibi_slopes=slopes)
        np.testing.assert_allclose(peer.output, spec.output, **EXACT)
        lse = fa2_lse(q, k, allowed, bias, 1 / math.sqrt(q.shape[-1]))
        empty = ~allowed.any(-1)[:, None] & np.ones((1, h, 1), bool)
        saw_empty += int(empty.any())
        p_q = np.arange(l_q) + l_k - l_q
        shifted = spec.lse + slopes[:, :, None] * p_q
        np.testing.assert_allclose(lse[~empty], shifted[~empty], **EXACT)
        assert np.all(lse[empty] == np.inf) and np.all(spec.lse[empty] == -np.inf)
        assert np.all(spec.output[empty] == 0)
        moved = ~empty & (slopes[:, :, None] * p_q > 1e-6)
        assert np.all(np.abs(lse[moved] - spec.lse[moved]) > 1e-7)
        saw_moved += int(moved.any())
    assert saw_empty and saw_moved, "no case emptied a row or moved an lse"


def test_fa2_lse_equals_lse_1_when_a_window_makes_the_call_non_causal():
    """Erratum E1: a bounded left window with causal=True is FA2's local path (``is_causal`` is
    false, flash_api.cpp:157), whose ALiBi is LSE-1's -m|i + L_k - L_q - j|: the lse agrees."""
    rng = np.random.default_rng(26)
    for _ in range(CASES):
        b, h = 2, 2
        l_q, l_k = _lengths(rng)
        left = int(rng.integers(0, l_k))
        q, k, v = _qkv(rng, b, h, l_q, l_k)
        slopes = rng.random((b, h))
        is_causal, fl, fr = fa2_window(True, (left, -1), l_q, l_k, alibi=True)
        assert not is_causal and (fl, fr) == (left, 0)
        allowed = fa2_allowed(b, l_q, l_k, fl, fr)
        bias = fa2_alibi(slopes, False, l_q, l_k)
        spec = oracle.attention_result(q, k, v, causal="bottom_right", window=(left, None),
                                       alibi_slopes=slopes)
        lse = fa2_lse(q, k, allowed, bias, 1 / math.sqrt(q.shape[-1]))
        nonempty = np.broadcast_to(allowed.any(-1)[:, None], lse.shape)
        np.testing.assert_allclose(lse[nonempty], spec.lse[nonempty], **EXACT)
        np.testing.assert_allclose(_explicit(q, k, v, allowed, bias).output, spec.output, **EXACT)


def test_fa2_window_sides_are_clamped_against_l_k():
    """Erratum E2: FA2's ``-1`` is WIN-3's ``None`` (and any side >= L_k changes nothing) when
    L_q <= L_k + 1. With L_q >= L_k + 2 the clamping shows: a bounded left side makes a right side
    of -1 (or >= L_k) act as L_k, so rows i < L_q - L_k - 1 lose their last keys; with an
    unbounded left side, a right side r >= L_k acts as unbounded although r < L_q - 1 binds."""
    rng = np.random.default_rng(27)
    lost_rows = differ = 0
    for _ in range(4 * CASES):
        l_q, l_k = int(rng.integers(1, 12)), int(rng.integers(1, 8))
        sides = [-1, 0, 1, 2, l_k - 1, l_k, l_k + 3]
        left, right = int(rng.choice(sides)), int(rng.choice(sides))
        _, fl, fr = fa2_window(False, (left, right), l_q, l_k, alibi=False)
        peer = fa2_allowed(1, l_q, l_k, fl, fr)
        exact = _spec_allowed(1, l_q, l_k, window=fa2_effective_window(left, right, l_k))
        assert np.array_equal(peer, exact), (l_q, l_k, left, right)
        naive = _spec_allowed(1, l_q, l_k, window=(None if left < 0 else left,
                                                   None if right < 0 else right))
        if l_q <= l_k + 1:
            assert np.array_equal(peer, naive), (l_q, l_k, left, right)
        differ += int(not np.array_equal(peer, naive))
        if 0 <= left < l_k and right == -1 and l_q >= l_k + 2:
            lost = naive & ~peer
            assert not (peer & ~naive).any()
            assert np.nonzero(lost.any(-1)[0])[0].max() == l_q - l_k - 2
            lost_rows += 1
    assert lost_rows and differ


def test_fa3_minus_one_is_unbounded():
    """hopper/flash_api.cpp:152-153: FA3 replaces a negative left by L_k - 1 and a negative right by
    L_q - 1, which never binds (j <= i + L_k - 1): WIN-3's ``None`` holds for FA3."""
    for l_q in range(1, 12):
        for l_k in range(1, 8):
            for left in range(l_k):
                right = l_q - 1  # FA3's replacement of -1
                peer = fa2_allowed(1, l_q, l_k, left, right)
                assert np.array_equal(peer, _spec_allowed(1, l_q, l_k, window=(left, None)))


# ------------------------------------------------------------------ jax.nn.dot_product_attention

def test_jax_return_residual_is_lse_1_except_on_empty_rows():
    """Fixed on the conventions page: ``dot_product_attention(..., return_residual=True)`` returns
    an lse. It equals LSE-1 (transposed from (B, T, N)) on rows with a key; an empty row gets the
    finite -0.7 * finfo(float32).max + log(L_k) instead of -inf."""
    rng = np.random.default_rng(28)
    for _ in range(CASES):
        b, h = 2, 2
        l_q, l_k = _lengths(rng)
        q, k, v = _qkv(rng, b, h, l_q, l_k)
        kv_len = rng.integers(0, l_k + 1, b)
        spec = oracle.attention_result(q, k, v, causal="top_left", key_value_seq_lengths=kv_len)
        allowed = _spec_allowed(b, l_q, l_k, causal=True, alignment="top_left",
                                key_value_seq_lengths=kv_len)
        lse = jax_lse(q, k, allowed, 1 / math.sqrt(q.shape[-1]))
        empty = np.broadcast_to(~allowed.any(-1)[:, None], lse.shape)
        np.testing.assert_allclose(lse[~empty], spec.lse[~empty], **EXACT)
        assert np.all(np.isfinite(lse[empty])) and np.all(lse[empty] < -1e38)


# ------------------------------------------------------------------ one integer: sliding_window = W

def _causal_band(l_q, l_k, offset, back, forward=0):
    """(L_q, L_k) bool: key j for query i iff i + offset - back <= j <= i + offset + forward."""
    i = np.arange(l_q)[:, None] + offset
    j = np.arange(l_k)[None, :]
    return (j >= i - back) & (j <= i + forward)


def _same_as_oracle(rng, allowed, l_q, l_k, **spec_arguments):
    """Outputs of the oracle on the peer's keys and on the spec's arguments agree."""
    q, k, v = _qkv(rng, 1, 2, l_q, l_k)
    peer = _explicit(q, k, v, allowed[None])
    spec = oracle.attention_result(q, k, v, **spec_arguments)
    np.testing.assert_allclose(peer.output, spec.output, **EXACT)
    np.testing.assert_allclose(peer.weights, spec.weights, **EXACT)


@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_sliding_window_w_means_w_keys_in_hf_gemma_xformers_vllm(w):
    """Erratum E3: W keys, the spec's ``window=(W - 1, 0)`` with a bottom-right causal mask."""
    rng = np.random.default_rng(w)
    for _ in range(CASES // 10):
        n, past = int(rng.integers(1, 10)), int(rng.integers(0, 6))
        causal = dict(causal="bottom_right", window=(w - 1, 0))
        _same_as_oracle(rng, hf_sliding_causal(w, n, past), n, past + n, **causal)
        _same_as_oracle(rng, gemma_pytorch_local(w, n), n, n, **causal)
        l_k = n + past
        _same_as_oracle(rng, xformers_local(w, n, l_k), n, l_k, **causal)
        _, fl, fr = fa2_window(True, vllm_window(w), n, l_k, alibi=False)
        _same_as_oracle(rng, fa2_allowed(1, n, l_k, fl, fr)[0], n, l_k, **causal)


@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_sliding_window_w_means_w_plus_1_keys_in_mistral_prefill_and_attention_gym(w):
    """Erratum E3: W + 1 keys, ``window=(W, 0)``; Hugging Face's bidirectional form is (W, W)."""
    rng = np.random.default_rng(10 + w)
    for n in range(1, 10):
        _same_as_oracle(rng, mistral_prefill(w, n), n, n, causal="top_left", window=(w, 0))
        _same_as_oracle(rng, attention_gym_sliding(w, n), n, n, causal="top_left", window=(w, 0))
        _same_as_oracle(rng, hf_sliding_bidirectional(w, n), n, n, alignment="top_left",
                        window=(w, w))


@pytest.mark.parametrize("w", [1, 2, 3])
def test_mistral_reference_decode_sees_w_keys_so_it_is_not_its_prefill(w):
    """Erratum E3: Mistral's reference decodes with W keys ((W - 1, 0)) but prefills with W + 1
    ((W, 0)): its decoding is not one call over the sequence (CACHE-3) once t >= W."""
    rng = np.random.default_rng(20 + w)
    n = w + 4
    q, k, v = _qkv(rng, 1, 2, n, n)
    decoded = np.stack([
        _explicit(q[:, :, t:t + 1], ks[None], vs[None], np.ones((1, 1, ks.shape[1]), bool)).output[0, :, 0]
        for t, (ks, vs) in enumerate(mistral_decode(k[0], v[0], w))], axis=1)
    as_window = oracle.attention_result(q, k, v, causal="bottom_right", window=(w - 1, 0)).output
    np.testing.assert_allclose(decoded, as_window[0], **EXACT)
    prefill = _explicit(q, k, v, mistral_prefill(w, n)[None]).output[0]
    np.testing.assert_allclose(decoded[:, :w], prefill[:, :w], **EXACT)
    assert np.all(np.abs(decoded[:, w:] - prefill[:, w:]).max(axis=-1) > 1e-6)


# ------------------------------------------------------------------ flash_attn_with_kvcache

def test_flash_attn_with_kvcache_diagonal_is_cache_seqlens_plus_l_new_minus_l_q():
    """Erratum E4: ``flash_attn_with_kvcache`` is SEG-3's bottom-right causal mask with
    ``key_value_seq_lengths = cache_seqlens + L_new`` over the updated cache, always; it is CACHE-2
    with ``past_lengths = cache_seqlens`` only when L_new = L_q (k=None is L_new = 0)."""
    rng = np.random.default_rng(29)
    differs = 0
    for _ in range(CASES):
        b, l_past, l_q = 2, int(rng.integers(0, 6)), int(rng.integers(1, 5))
        l_new = int(rng.choice([0, l_q, int(rng.integers(1, 6))]))
        c = rng.integers(0, l_past + 1, b)
        q, cache_k, cache_v = _qkv(rng, b, 2, l_q, l_past)
        _, k_new, v_new = _qkv(rng, b, 2, 1, l_new)
        present_k = np.zeros((b, 2, l_past + l_new, 4))
        present_v = np.zeros_like(present_k)
        for bi in range(b):  # what the kernel attends after writing k, v at cache_seqlens
            present_k[bi, :, :c[bi]], present_v[bi, :, :c[bi]] = cache_k[bi, :, :c[bi]], cache_v[bi, :, :c[bi]]
            present_k[bi, :, c[bi]:c[bi] + l_new] = k_new[bi]
            present_v[bi, :, c[bi]:c[bi] + l_new] = v_new[bi]
        allowed = fa2_kvcache_allowed(c, l_q, l_new, l_past + l_new)
        peer = _explicit(q, present_k, present_v, allowed)
        seg = oracle.attention_result(q, present_k, present_v, causal="bottom_right",
                                      key_value_seq_lengths=c + l_new)
        np.testing.assert_allclose(peer.output, seg.output, **EXACT)
        if l_new == 0:
            continue
        cache2 = oracle.attention_result(q, k_new, v_new, past_key=cache_k, past_value=cache_v,
                                         past_lengths=c, causal="bottom_right")
        cache2_allowed = oracle.structural_allowed(
            oracle.cache_positions(c, l_past, l_q, l_new), causal=True, window=None)
        if l_new == l_q:
            np.testing.assert_allclose(peer.output, cache2.output, **EXACT)
            assert np.array_equal(allowed, cache2_allowed)
        else:
            assert not np.array_equal(allowed, cache2_allowed)
            differs += 1
    assert differs


# ------------------------------------------------------------------ segments

def _contiguous(rng, length, n):
    return np.sort(rng.integers(0, n, length))


def test_fa_varlen_and_attention_gym_documents_are_seg_3():
    """SEG-3's positions within a segment are FlashAttention varlen's (bottom-right per sequence,
    any n_q(s), n_k(s)) and attention-gym's document mask (top-left, self-attention packing)."""
    rng = np.random.default_rng(30)
    for _ in range(CASES // 3):
        n_q, n_k = rng.integers(1, 5, 3), rng.integers(1, 5, 3)
        q_ids, kv_ids = np.repeat(np.arange(3), n_q), np.repeat(np.arange(3), n_k)
        _same_as_oracle(rng, fa_varlen_allowed(n_q, n_k)[0], n_q.sum(), n_k.sum(),
                        causal="bottom_right", q_segment_ids=q_ids[None], kv_segment_ids=kv_ids[None])
        ids = _contiguous(rng, int(rng.integers(1, 12)), 3)
        _same_as_oracle(rng, attention_gym_document(ids, lambda i, j: j <= i)[0], len(ids), len(ids),
                        causal="top_left", q_segment_ids=ids[None], kv_segment_ids=ids[None])


def test_splash_global_index_masks_equal_seg_3_only_for_ids_laid_out_alike():
    """Erratum E5: splash's causal mask on global indices is SEG-3's when query and key ids are the
    same array (ranks within a segment order like indices); its local (window) mask also needs each
    segment contiguous (distances then agree). Otherwise they differ: scattered ids under a window,
    or query and key ids laid out differently (cross-attention packing)."""
    rng = np.random.default_rng(31)
    window_differs = layout_differs = 0
    for _ in range(CASES):
        n = int(rng.integers(2, 12))
        scattered = rng.integers(0, 3, n)
        contiguous = _contiguous(rng, n, 3)
        seg = lambda ids: dict(q_segment_ids=ids[None], kv_segment_ids=ids[None])  # noqa: E731
        for ids in (scattered, contiguous):
            assert np.array_equal(splash_allowed(ids, ids),
                                  _spec_allowed(1, n, n, causal=True, alignment="top_left", **seg(ids)))
        window = (1, 0)
        assert np.array_equal(splash_allowed(contiguous, contiguous, window=window),
                              _spec_allowed(1, n, n, window=window, alignment="top_left", **seg(contiguous)))
        window_differs += not np.array_equal(
            splash_allowed(scattered, scattered, window=window),
            _spec_allowed(1, n, n, window=window, alignment="top_left", **seg(scattered)))
        kv_ids = _contiguous(rng, int(rng.integers(2, 12)), 3)
        layout_differs += not np.array_equal(
            splash_allowed(contiguous, kv_ids),
            _spec_allowed(1, n, len(kv_ids), causal=True, alignment="top_left",
                          q_segment_ids=contiguous[None], kv_segment_ids=kv_ids[None]))
    assert window_differs and layout_differs


# ------------------------------------------------------------------ ALiBi slopes and signs

def test_the_papers_slopes_are_the_geometric_sequence_only_for_a_power_of_two():
    """Erratum E6: ``2^(-8 (h' + 1) / h)`` (conformance.features.geometric_slopes) is the paper's
    slopes for h a power of two; for other h the paper interleaves two sequences and slopes differ
    by up to 0.25 (h = 3), 0.84 (h <= 32, at h = 17), 0.91 (h <= 64, at h = 33)."""
    gap = {h: float(np.abs(np.array(paper_slopes(h)) - geometric_slopes(h)).max()) for h in range(1, 65)}
    assert all(gap[h] < 1e-15 for h in (1, 2, 4, 8, 16, 32, 64))
    assert all(gap[h] > 0.1 for h in gap if h & (h - 1))
    assert round(gap[3], 2) == 0.25
    assert max(gap[h] for h in range(1, 33)) == pytest.approx(0.837, abs=1e-3) == gap[17]
    assert max(gap.values()) == pytest.approx(0.913, abs=1e-3) == gap[33]


def test_the_papers_plus_m_j_and_attention_gyms_signed_alibi_under_causal_are_alibi_1():
    """ALIBI-1 / erratum E6: under a causal mask the paper's ``+m j`` (transformer.py:760) and
    attention-gym's signed ``(kv_idx - q_idx) * m`` (attn_gym/mods/alibi.py:17-20) give
    ``alibi_slopes``' output; without one, attention-gym's form is an explicit ``bias`` that
    favours keys after the query, not ``alibi_slopes``."""
    rng = np.random.default_rng(32)
    for _ in range(CASES // 3):
        n, h = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        q, k, v = _qkv(rng, 1, h, n, n)
        m = geometric_slopes(h)
        j, i = np.arange(n)[None, :], np.arange(n)[:, None]
        paper = m[None, :, None, None] * (j + 0 * i)
        signed = m[None, :, None, None] * (j - i)
        causal = np.tril(np.ones((n, n), bool))[None]
        alibi = oracle.attention_result(q, k, v, causal="top_left", alibi_slopes=m)
        for bias in (paper, signed):
            np.testing.assert_allclose(_explicit(q, k, v, causal, bias).output, alibi.output, **EXACT)
        full = np.ones((1, n, n), bool)
        unmasked = oracle.attention_result(q, k, v, alignment="top_left", alibi_slopes=m)
        assert not np.allclose(_explicit(q, k, v, full, signed).output, unmasked.output)


def test_onnx_stores_scale_and_softcap_as_float32():
    """Erratum E7 (note): ONNX ``Attention``'s ``scale`` and ``softcap`` are FLOAT attributes
    (``AttributeProto.f``, 32 bits): a float64 model through ONNX computes with the scale rounded
    to float32, which moves float64 outputs by 1e-9 to 1e-8 (2e-8 on this case): visible to a
    float64 certification."""
    onnx = pytest.importorskip("onnx")
    schema = onnx.defs.get_schema("Attention", 23)
    for name in ("scale", "softcap"):
        assert schema.attributes[name].type == onnx.AttributeProto.FLOAT
    scale = 1 / math.sqrt(3.0)
    stored = onnx.helper.make_attribute("scale", scale).f
    assert stored == float(np.float32(scale)) != scale
    rng = np.random.default_rng(33)
    q, k, v = _qkv(rng, 2, 2, 5, 6, d=3)
    moved = np.abs(oracle.attention_result(q, k, v, scale=stored).output
                   - oracle.attention_result(q, k, v, scale=scale).output).max()
    assert 1e-12 < moved < 1e-7


# ------------------------------------------------------------------ spec 1.3's notes (E8-E11)
#
# gpt-oss @ 7b58334; FlashInfer @ fb28d72; onnxruntime @ 008eeb96 (the CPU GroupQueryAttention
# kernel of an older release); the installed jax 0.10.2 and torch 2.13 (files on disk).

@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_sliding_window_w_is_w_keys_in_gpt_oss_and_w_plus_1_in_flashinfer_and_older_ort_cpu(w):
    """Erratum 1.3-E9: gpt-oss's ``sliding_window = W`` is W keys, ``window=(W - 1, 0)``; FlashInfer's
    ``window_left = W`` with its causal mask and the older ONNX Runtime CPU kernel's
    ``local_window_size = W`` are W + 1 keys, ``window=(W, 0)`` (bottom-right, CACHE-2's positions
    with a cache)."""
    rng = np.random.default_rng(40 + w)
    for _ in range(CASES // 10):
        n, past = int(rng.integers(1, 10)), int(rng.integers(0, 6))
        _same_as_oracle(rng, gpt_oss_sliding(w, n), n, n, causal="bottom_right", window=(w - 1, 0))
        l_k = n + past
        _same_as_oracle(rng, flashinfer_window_left(w, n, l_k), n, l_k, causal="bottom_right",
                        window=(w, 0))
        _same_as_oracle(rng, ort_cpu_local_window(w, n, past), n, l_k, causal="bottom_right",
                        window=(w, 0))
    n = w + 3  # the conventions differ by one key once a row has more than W + 1 keys before it
    assert not np.array_equal(gpt_oss_sliding(w, n), flashinfer_window_left(w, n, n))


def test_flashinfer_lse_is_lse_1_in_base_2():
    """Erratum 1.3-E11: FlashInfer's lse is LSE-1's divided by ln 2, and its merge (base 2) equals
    LSE-2's merge (natural) after that conversion; read as natural, it is not LSE-1."""
    rng = np.random.default_rng(44)
    for _ in range(CASES // 5):
        l_q, l_k = _lengths(rng, 1, 8)
        q, k, v = _qkv(rng, 2, 2, l_q, l_k + 1)
        allowed = np.ones((2, l_q, l_k + 1), bool)
        spec = oracle.attention_result(q, k, v)
        lse2 = flashinfer_lse(q, k, allowed, 1 / math.sqrt(q.shape[-1]))
        np.testing.assert_allclose(lse2 * math.log(2), spec.lse, **EXACT)
        assert not np.allclose(lse2, spec.lse)
        split = int(rng.integers(1, l_k + 1))
        left = oracle.attention_result(q, k[:, :, :split], v[:, :, :split])
        right = oracle.attention_result(q, k[:, :, split:], v[:, :, split:])
        out, lse = flashinfer_merge(left.output, left.lse / math.log(2),
                                    right.output, right.lse / math.log(2))
        np.testing.assert_allclose(out, spec.output, **EXACT)
        np.testing.assert_allclose(lse * math.log(2), spec.lse, **EXACT)


def test_installed_jax_return_residual_is_its_transcription():
    """Erratum 1.3-E10: the installed jax (0.10.2: jax/_src/nn/functions.py:859-866
    ``_get_large_negative``, :921-922 the ``where``, :978-981 and :1022-1026 the residual, laid
    out (B, T, N)) returns :func:`jax_lse`: LSE-1 on rows with a key, -0.7 * finfo(float32).max
    (+ log L_k, lost to rounding in float32) on an empty row."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(45)
    for l_q, l_k in [(3, 5), (5, 3), (4, 4)]:
        q, k, v = _qkv(rng, 2, 2, l_q, l_k)
        kv_len = np.array([0, l_k - 1], np.int32)
        to_jax = lambda x: np.asarray(x.transpose(0, 2, 1, 3), np.float32)  # noqa: E731
        _, lse = jax.nn.dot_product_attention(to_jax(q), to_jax(k), to_jax(v), is_causal=True,
                                              key_value_seq_lengths=kv_len, return_residual=True)
        lse = np.asarray(lse, np.float64).transpose(0, 2, 1)
        allowed = _spec_allowed(2, l_q, l_k, causal=True, alignment="top_left",
                                key_value_seq_lengths=kv_len)
        want = jax_lse(q, k, allowed, 1 / math.sqrt(q.shape[-1]))
        np.testing.assert_allclose(lse, want, rtol=1e-5, atol=1e-5)
        empty = np.broadcast_to(~allowed.any(-1)[:, None], lse.shape)
        assert empty.any() and np.all(lse[empty] == np.float32(-0.7 * np.finfo(np.float32).max))


def test_cudnn_through_jax_and_torch_memory_efficient_backward_return_a_bias_gradient():
    """Erratum 1.3-E8: both backward passes return dBias. JAX's cuDNN path exports it whenever a
    bias is given (jax 0.10.2 jax/_src/cudnn/fused_attention_stablehlo.py:91-92
    ``should_export_dbias`` returns True; :2060-2062 ``variadic_args = (has_bias, has_dbias)``;
    :611-623 the backward's abstract value adds ``grad bias`` with the bias's shape; :466-481 the
    VJP rule returns it). PyTorch's ``_scaled_dot_product_efficient_attention_backward`` returns
    ``grad_bias`` with the bias's shape when ``grad_input_mask[3]`` (torch 2.13
    torch/_meta_registrations.py:6540-6597). Shapes only (the kernels run on CUDA): the values are
    GRAD-9's to judge."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    from jax import core
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    f16 = jax.numpy.float16
    q, k, bias = (core.ShapedArray(s, f16) for s in [(2, 5, 3, 8), (2, 7, 3, 8), (1, 3, 5, 7)])
    unused = core.ShapedArray((0,), f16)
    assert cudnn.should_export_dbias(bias.shape, q.shape, 0)
    grads = cudnn._dot_product_attention_bwd_abstract(
        q, k, k, bias, *[unused] * 6, core.ShapedArray((2, 3, 5), np.float32), q, q, scale=1.0,
        seed=0, dropout_rate=0.0, variadic_args=(True, True), mask_type=0, layout=0,
        sliding_window_length=None)
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape, bias.shape]

    meta = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    args = (meta(2, 3, 5, 8), meta(2, 3, 5, 8), meta(2, 3, 7, 8), meta(2, 3, 7, 8), meta(1, 3, 5, 7),
            meta(2, 3, 5, 8), meta(2, 3, 5), meta(), meta(), 0.0)
    backward = torch.ops.aten._scaled_dot_product_efficient_attention_backward
    assert backward(*args, [True] * 4, False)[3].shape == (1, 3, 5, 7)
    assert backward(*args, [True, True, True, False], False)[3] is None
