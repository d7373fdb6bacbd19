"""``hf-gemma2-eager``: Gemma 2's eager attention function with a ``DynamicCache``, against the
float64 oracle, and each declared deviation reproduced with Transformers alone.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, L_past cached keys,
d per-head width. Skipped, with the reason, when transformers is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.spec import oracle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed "
                                           "(pip install 'mhaspec[hf]')")

from transformers import DynamicCache  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward  # noqa: E402

B, H, G, D = 2, 4, 2, 8
FLOAT32_TOL = 2e-6


class _Layer:
    num_key_value_groups = H // G
    head_dim = D
    training = False


def _eager(q, k, v, attention_mask, **kw):
    """The library's function alone: output (B, h, L_q, d), weights."""
    out, weights = eager_attention_forward(_Layer(), q, k, v, attention_mask, dropout=0.0,
                                           scaling=D ** -0.5, **kw)
    return out.transpose(1, 2), weights


def _qkv(rng, len_q, len_k, dtype=torch.float32):
    return (torch.tensor(rng.standard_normal((B, n, length, D)), dtype=dtype)
            for n, length in ((H, len_q), (G, len_k), (G, len_k)))


def _additive(allowed, dtype=torch.float32):
    """Transformers' mask: 0 where allowed, finfo(dtype).min elsewhere."""
    return torch.where(torch.as_tensor(allowed), 0.0, torch.finfo(dtype).min).to(dtype)


def _f64(*xs):
    return [x.double().numpy() for x in xs]


def test_a_fully_masked_row_is_the_mean_of_v():
    """MASK-9 (declared): finfo.min logits make the row's softmax uniform."""
    rng = np.random.default_rng(50)
    q, k, v = _qkv(rng, 3, 5)
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[:, :, 1] = False
    out, weights = _eager(q, k, v, _additive(allowed))
    mean_v = torch.repeat_interleave(v, H // G, dim=1).mean(dim=2)
    assert torch.allclose(out[:, :, 1], mean_v, atol=1e-6)
    assert torch.allclose(weights[:, :, 1], torch.full_like(weights[:, :, 1], 1 / 5))


def test_a_nan_key_behind_the_mask_leaks():
    """MASK-13 (declared): NaN + finfo.min is NaN."""
    rng = np.random.default_rng(51)
    q, k, v = _qkv(rng, 3, 5)
    k[:, :, 2] = float("nan")
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[..., 2] = False
    assert torch.isnan(_eager(q, k, v, _additive(allowed))[0]).all()


def test_a_minus_inf_bias_on_a_fully_masked_row_is_nan():
    """MASK-11 (declared): where(M, 0, -inf) as the mask gives NaN on a fully masked row, where
    the boolean's finfo.min gives the mean of V."""
    rng = np.random.default_rng(52)
    q, k, v = _qkv(rng, 3, 5)
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[:, :, 0] = False
    bias = torch.where(torch.as_tensor(allowed), 0.0, float("-inf"))
    assert torch.isnan(_eager(q, k, v, bias)[0][:, :, 0]).all()
    assert torch.isfinite(_eager(q, k, v, _additive(allowed))[0]).all()


def test_float64_is_computed_with_a_float32_softmax():
    """NUM-1 (float64 not claimed): the softmax runs in float32, so float64 results carry float32
    errors (about 1e-8), far above float64 rounding."""
    rng = np.random.default_rng(53)
    q, k, v = _qkv(rng, 4, 6, torch.float64)
    got = _eager(q, k, v, None)[0].numpy()
    want = oracle.attention_result(*_f64(q, k, v), scale=D ** -0.5).output
    assert 1e-10 < np.abs(got - want).max() < 1e-6


def test_decoding_through_a_dynamic_cache_equals_one_causal_call():
    """CACHE-3 with the library alone: one token at a time through a DynamicCache (the keys
    attended are what ``update`` returns) equals the oracle's one causal call."""
    rng = np.random.default_rng(54)
    q, k, v = _qkv(rng, 6, 6)
    cache = DynamicCache()
    outputs = []
    for t in range(6):
        keys, values = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1], 0)
        outputs.append(_eager(q[:, :, t:t + 1], keys, values, None)[0])
    want = oracle.attention_result(*_f64(q, k, v), causal="bottom_right", scale=D ** -0.5)
    assert np.abs(torch.cat(outputs, dim=2).numpy() - want.output).max() < FLOAT32_TOL


@pytest.fixture(scope="module")
def backend():
    from mhaspec.backends import hf_decoder

    return hf_decoder.EAGER


@pytest.mark.parametrize("past_lengths", [None, [3, 1], [0, 2]])
@pytest.mark.parametrize("len_q, len_k", [(2, 2), (1, 3), (3, 1)])
def test_the_adapter_lays_out_a_dynamic_cache_as_cache_1(backend, past_lengths, len_q, len_k):
    """CACHE-1, CACHE-2 through the DynamicCache: a full or partly valid past (the mask moved
    into the cache's Concat(past, new) layout, weights and present cache moved back), with a
    soft-cap and a mask."""
    rng = np.random.default_rng(55)
    q, k, v = _qkv(rng, len_q, len_k)
    past_key, past_value = (torch.tensor(rng.standard_normal((B, G, 3, D)), dtype=torch.float32)
                            for _ in range(2))
    mask = rng.random((B, 1, len_q, 3 + len_k)) < 0.8
    kw = {"causal": "bottom_right", "softcap": 5.0, "mask": mask}
    if past_lengths is not None:
        kw["past_lengths"] = np.array(past_lengths)
    got = backend.scaled_dot_product_attention(q, k, v, past_key=past_key, past_value=past_value,
                                               **{n: torch.as_tensor(x) if isinstance(x, np.ndarray)
                                                  else x for n, x in kw.items()})
    want = oracle.attention_result(*_f64(q, k, v, past_key, past_value)[:3],
                                   past_key=past_key.double().numpy(),
                                   past_value=past_value.double().numpy(), **kw)
    rows = want.weights.sum(-1) > 0  # rows with an allowed key (MASK-9 is declared)
    for name in ("output", "weights"):
        assert np.abs(getattr(got, name).numpy()[rows] - getattr(want, name)[rows]).max() \
            < FLOAT32_TOL, name
    for name in ("present_key", "present_value"):
        assert np.array_equal(getattr(got, name).numpy(), getattr(want, name).astype(np.float32))
    assert np.array_equal(got.present_lengths.numpy(), want.present_lengths)


@pytest.mark.parametrize("batch, len_q, fails", [(0, 2, True), (2, 0, True), (2, 2, False)])
def test_the_sdpa_function_cannot_take_an_empty_batch_or_query_axis(batch, len_q, fails):
    """SHAPE-4 (declared for hf-decoder-sdpa): ``sdpa_attention_forward`` reshapes its output to
    (B, -1, L_q, d_v); -1 is ambiguous for a tensor of 0 elements."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layer = _Layer()
    layer.is_causal = False
    q = torch.zeros((batch, H, len_q, D))
    k = v = torch.zeros((batch, G, 3, D))
    if fails:
        with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
            sdpa_attention_forward(layer, q, k, v, None, scaling=1.0, is_causal=False)
    else:
        out, _ = sdpa_attention_forward(layer, q, k, v, None, scaling=1.0, is_causal=False)
        assert out.shape == (batch, len_q, H, D)


def _sdpa(q, k, v, attention_mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layer = _Layer()
    layer.is_causal = False
    return sdpa_attention_forward(layer, q, k, v, attention_mask, scaling=D ** -0.5,
                                  is_causal=False)[0]


def test_the_sdpa_function_leaks_a_nan_key_behind_the_mask():
    """MASK-13 (declared for hf-decoder-sdpa): torch's kernel adds the boolean mask as -inf."""
    rng = np.random.default_rng(56)
    q, k, v = _qkv(rng, 3, 5)
    k[:, :, 2] = float("nan")
    allowed = torch.ones((B, 1, 3, 5), dtype=torch.bool)
    allowed[..., 2] = False
    assert torch.isnan(_sdpa(q, k, v, allowed)).all()


def test_the_sdpa_function_turns_a_nan_query_row_into_zeros():
    """NUM-6 (declared for hf-decoder-sdpa): torch's fused CPU kernel gives 0 for NaN logits."""
    rng = np.random.default_rng(57)
    q, k, v = _qkv(rng, 3, 5)
    q[:, :, 1] = float("nan")
    out = _sdpa(q, k, v, None)
    assert (out[:, 1] == 0).all() and torch.isfinite(out[:, [0, 2]]).all()
