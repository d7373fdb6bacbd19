"""``hf-gptoss-eager``: gpt-oss's eager attention function of Transformers with its sinks, against
the float64 oracle; each declared deviation reproduced with Transformers alone; a copy of the
function with the sink added to every logit rejected under SINK-1.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d per-head width.
Skipped, with the reason, when transformers is not installed.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from mhaspec.conformance import harness, vjp
from mhaspec.conformance.harness import Cell
from mhaspec.conformance.strategies import CaseSpec
from mhaspec.spec import oracle_vjp

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed "
                                           "(pip install 'mhaspec[hf]')")

from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

B, H, G, D = 2, 4, 2, 8


def _eager(q, k, v, attention_mask, sinks):
    """The library's function alone: output (B, h, L_q, d), weights."""
    layer = types.SimpleNamespace(num_key_value_groups=H // G, sinks=sinks, training=False)
    out, weights = modeling_gpt_oss.eager_attention_forward(layer, q, k, v, attention_mask,
                                                            scaling=D ** -0.5)
    return out.transpose(1, 2), weights


def _qkv(rng, len_q, len_k):
    return (torch.tensor(rng.standard_normal((B, n, length, D)), dtype=torch.float32)
            for n, length in ((H, len_q), (G, len_k), (G, len_k)))


def _additive(allowed):
    """Transformers' mask: 0 where allowed, finfo(float32).min elsewhere."""
    return torch.where(torch.as_tensor(allowed), 0.0, torch.finfo(torch.float32).min)


NO_SINK = torch.full((H,), -math.inf)


def test_a_fully_masked_row_is_the_mean_of_v_without_a_sink_and_zero_with_one():
    """MASK-9 (declared, calls without sinks): finfo.min logits and a -inf sink make the row's
    softmax uniform; a finite sink takes the whole row (SINK-2's zeros)."""
    rng = np.random.default_rng(60)
    q, k, v = _qkv(rng, 3, 5)
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[:, :, 1] = False
    out, weights = _eager(q, k, v, _additive(allowed), NO_SINK)
    mean_v = torch.repeat_interleave(v, H // G, dim=1).mean(dim=2)
    assert torch.allclose(out[:, :, 1], mean_v, atol=1e-6)
    assert torch.allclose(weights[:, :, 1], torch.full_like(weights[:, :, 1], 1 / 5))
    out, weights = _eager(q, k, v, _additive(allowed), torch.zeros(H))
    assert not out[:, :, 1].any() and not weights[:, :, 1].any()


def test_a_minus_inf_bias_on_a_fully_masked_row_is_nan_without_a_sink():
    """MASK-11 (declared): where(M, 0, -inf) gives NaN on a fully masked row (every logit and the
    sink -inf), where the boolean's finfo.min gives the mean of V."""
    rng = np.random.default_rng(61)
    q, k, v = _qkv(rng, 3, 5)
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[:, :, 0] = False
    bias = torch.where(torch.as_tensor(allowed), 0.0, float("-inf"))
    assert torch.isnan(_eager(q, k, v, bias, NO_SINK)[0][:, :, 0]).all()
    assert torch.isfinite(_eager(q, k, v, _additive(allowed), NO_SINK)[0]).all()


def test_a_nan_key_behind_the_mask_leaks():
    """MASK-13 (declared): NaN + finfo.min is NaN, with or without a sink."""
    rng = np.random.default_rng(62)
    q, k, v = _qkv(rng, 3, 5)
    k[:, :, 2] = float("nan")
    allowed = np.ones((B, 1, 3, 5), bool)
    allowed[..., 2] = False
    for sinks in (NO_SINK, torch.zeros(H)):
        assert torch.isnan(_eager(q, k, v, _additive(allowed), sinks)[0]).all()


def test_the_backward_of_a_minus_inf_bias_row_is_nan_without_a_sink():
    """GRAD-7 (declared): the NaN row's backward makes its dq and every key's dk and dv NaN, with
    a zero cotangent on the row; with a finite sink the row is 0 and no gradient is NaN."""
    rng = np.random.default_rng(64)
    q, k, v = (x.requires_grad_() for x in _qkv(rng, 3, 5))
    bias = torch.zeros((1, 1, 3, 5))
    bias[..., 1, :] = float("-inf")
    for sinks, nan in ((NO_SINK, True), (torch.zeros(H), False)):
        out = _eager(q, k, v, bias, sinks)[0]
        d_out = torch.ones_like(out)
        d_out[:, :, 1] = 0
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
        assert bool(dq[:, :, 1].isnan().all()) is nan and not dq[:, :, [0, 2]].isnan().any()
        assert bool(dk.isnan().all()) is nan and bool(dv.isnan().all()) is nan


@pytest.fixture(scope="module")
def backend():
    from mhaspec.backends import hf_gpt_oss

    return hf_gpt_oss.EAGER


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of the library's ``eager_attention_forward``."""
    count = [0]
    library = modeling_gpt_oss.eager_attention_forward

    def counted(*args, **kwargs):
        count[0] += 1
        return library(*args, **kwargs)

    monkeypatch.setattr(modeling_gpt_oss, "eager_attention_forward", counted)
    return count


def _case(backend):
    """float64 q (B, h, 3, d), k, v (B, g, 4, d), a mask that empties query row 1 of item 0,
    sinks (h,), a cotangent (B, h, 3, d), as the backend's arrays and as NumPy."""
    rng = np.random.default_rng(63)
    arrays = {"q": rng.standard_normal((B, H, 3, D)), "k": rng.standard_normal((B, G, 4, D)),
              "v": rng.standard_normal((B, G, 4, D)), "sinks": rng.standard_normal(H),
              "d_out": rng.standard_normal((B, H, 3, D))}
    mask = rng.random((B, 1, 3, 4)) < 0.7
    mask[0, 0, 1] = False
    t = {n: backend.asarray(x, dtype="float64") for n, x in arrays.items()}
    return arrays, mask, t, backend.asarray(mask, dtype="bool")


def test_the_forward_and_backward_are_the_library_function_s(backend, calls):
    """SINK-1, SINK-2, SINK-3 through the library's function (called once for the forward and
    once for the backward), float64, grouped heads and an empty row: agree with the oracle."""
    a, mask, t, m = _case(backend)
    out, weights = backend.scaled_dot_product_attention(t["q"], t["k"], t["v"], mask=m,
                                                        sinks=t["sinks"])
    assert calls[0] == 1
    want = oracle_vjp.attention_with_sinks(a["q"], a["k"], a["v"], sinks=a["sinks"], mask=mask)
    np.testing.assert_allclose(backend.to_numpy(out), want.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(backend.to_numpy(weights), want.weights, rtol=0, atol=1e-14)
    assert not backend.to_numpy(out)[0, :, 1].any()
    got = backend.attention_vjp(t["q"], t["k"], t["v"], t["d_out"], mask=m, sinks=t["sinks"])
    assert calls[0] == 2
    grads = oracle_vjp.attention_vjp(a["q"], a["k"], a["v"], a["d_out"], sinks=a["sinks"],
                                     mask=mask)
    for name, field in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("sinks", "d_sinks")):
        np.testing.assert_allclose(backend.to_numpy(got[name]), getattr(grads, field), rtol=0,
                                   atol=1e-13, err_msg=name)


def test_a_call_without_sinks_is_spec_1_2_s_softmax(backend, calls):
    """Without sinks the function runs with a -inf sink: rows with an allowed key agree with the
    sink-free oracle, gradients too (no "sinks" key)."""
    a, mask, t, m = _case(backend)
    out, _ = backend.scaled_dot_product_attention(t["q"], t["k"], t["v"], mask=m)
    got = backend.attention_vjp(t["q"], t["k"], t["v"], t["d_out"], mask=m)
    assert calls[0] == 2 and set(got) == {"q", "k", "v"}
    mask[0, 0, 1] = True  # the empty row is MASK-9's (declared): judge the others
    want = oracle_vjp.attention_with_sinks(a["q"], a["k"], a["v"], mask=mask).output
    rows = np.ones(out.shape[:3], bool)
    rows[0, :, 1] = False
    np.testing.assert_allclose(backend.to_numpy(out)[rows], want[rows], rtol=0, atol=1e-14)


def _sink_in_every_logit(module, query, key, value, attention_mask, scaling, dropout=0.0,
                         **kwargs):
    """The library's function with one slip: the sink added to every logit (the numerator)
    instead of joining the denominator as one more column, so the softmax cancels it."""
    key_states = modeling_gpt_oss.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_gpt_oss.repeat_kv(value, module.num_key_value_groups)
    logits = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        logits = logits + attention_mask
    logits = logits + module.sinks.reshape(1, -1, 1, 1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    weights = torch.softmax(logits, dim=-1).to(value_states.dtype)
    return torch.matmul(weights, value_states).transpose(1, 2).contiguous(), weights


SPEC = CaseSpec(batch=2, heads=4, kv_heads=2, len_q=3, len_k=4, d_k=4, d_v=4, seed=5)


def _judge_sink_1(backend):
    impl = Cell(backend, "cpu", "float32")
    case = impl.case(SPEC, "sdpa")
    sinks = {"sinks": vjp.sinks_of(case, 1.0)}
    harness.expect_oracle(impl, case, harness.run(impl, "sdpa", case, **sinks), op="sdpa",
                          clause="SINK-1", overrides=sinks)


def test_the_library_function_passes_sink_1(backend, calls):
    _judge_sink_1(backend)
    assert calls[0] == 1


def test_the_sink_added_to_every_logit_fails_sink_1(backend, monkeypatch):
    monkeypatch.setattr(modeling_gpt_oss, "eager_attention_forward", _sink_in_every_logit)
    with pytest.raises(AssertionError, match=r"SINK-1"):
        _judge_sink_1(backend)
