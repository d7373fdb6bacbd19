"""The proposed SINK definition (spec/oracle_vjp.py) against the two peers that run on this machine:
Hugging Face's gpt-oss ``eager_attention_forward`` (forward and PyTorch autograd gradients, float64)
and ONNX Runtime's ``com.microsoft.GroupQueryAttention`` ``head_sink`` input (forward, float32).
docs/sinks-peers.md cites the sources these runs confirm.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d head width.
Each peer is skipped, with the reason, when its package is not installed.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from mhaspec.spec.oracle_vjp import attention_vjp, attention_with_sinks

B, H, G, L, D = 2, 4, 2, 5, 8


def _case(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, D)) * 2
    k = rng.standard_normal((B, G, L, D)) * 2
    v = rng.standard_normal((B, G, L, D))
    sinks = rng.standard_normal(H) * 2
    allowed = np.tril(np.ones((L, L), bool))[None, None].repeat(B, axis=0)
    allowed[0, 0, 2] = False  # batch 0, query 2: no allowed key, the sink only
    return rng, q, k, v, sinks, allowed


def test_hugging_face_gpt_oss_eager_attention_forward_and_gradients():
    """gpt-oss's eager attention: the sink is concatenated to the scaled, masked logits and its
    column dropped after the softmax; autograd gives dq, dk, dv and d_sinks."""
    torch = pytest.importorskip("torch")
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss",
                                  reason="transformers is not installed (pip install 'mhaspec[hf]')")
    rng, q, k, v, sinks, allowed = _case(1)
    scale = D ** -0.5
    t = {n: torch.tensor(a, requires_grad=True) for n, a in (("q", q), ("k", k), ("v", v),
                                                             ("sinks", sinks))}
    module = types.SimpleNamespace(num_key_value_groups=H // G, sinks=t["sinks"], training=False)
    additive = torch.tensor(np.where(allowed, 0.0, -np.inf))
    out, weights = gpt_oss.eager_attention_forward(module, t["q"], t["k"], t["v"], additive,
                                                   scaling=scale)
    out = out.transpose(1, 2)  # (B, L_q, h, d) -> (B, h, L_q, d)
    d_out = rng.standard_normal(out.shape)
    (out * torch.tensor(d_out)).sum().backward()
    want = attention_with_sinks(q, k, v, sinks=sinks, mask=allowed)
    np.testing.assert_allclose(out.detach().numpy(), want.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(weights.detach().numpy(), want.weights, rtol=0, atol=1e-15)
    assert np.all(want.output[0, 0, 2] == 0)
    grads = attention_vjp(q, k, v, d_out, sinks=sinks, mask=allowed)
    for name, got in (("q", grads.dq), ("k", grads.dk), ("v", grads.dv), ("sinks", grads.d_sinks)):
        np.testing.assert_allclose(got, t[name].grad.numpy(), rtol=0, atol=1e-13, err_msg=name)


def _ort_group_query_attention(q, k, v, sinks, softcap, bias):
    """ONNX Runtime's GroupQueryAttention (prompt, no cache) on (B, h, L, d) inputs, float32."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'mhaspec[onnx]')")
    ort = pytest.importorskip("onnxruntime",
                              reason="onnxruntime is not installed (pip install 'mhaspec[onnx]')")
    from onnx import TensorProto, helper

    def packed(x):  # (B, n, L, d) -> (B, L, n*d)
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(B, L, -1), dtype=np.float32)

    feeds = {"query": packed(q), "key": packed(k), "value": packed(v),
             "seqlens_k": np.full(B, L - 1, np.int32), "total_sequence_length": np.array(L, np.int32),
             "attention_bias": bias.astype(np.float32), "head_sink": sinks.astype(np.float32)}
    names = ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length", "", "", "",
             "attention_bias", "head_sink"]
    node = helper.make_node("GroupQueryAttention", names, ["output"], domain="com.microsoft",
                            num_heads=H, kv_num_heads=G, softcap=softcap)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if a.dtype == np.int32
                                            else TensorProto.FLOAT, a.shape)
              for n, a in feeds.items()]
    graph = helper.make_graph([node], "gqa", inputs,
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(["output"], feeds)[0]
    return out.reshape(B, L, H, D).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_onnx_runtime_group_query_attention_head_sink(softcap):
    """ONNX Runtime: head_sink is neither scaled nor soft-capped, and a row that a -inf bias
    empties gives output 0 (its causal mask is bottom-right, L_q = L_k here)."""
    _, q, k, v, sinks, _ = _case(2)
    bias = np.zeros((1, H, L, L))
    bias[0, :, 2] = -np.inf
    got = _ort_group_query_attention(q, k, v, sinks, softcap, bias)
    want = attention_with_sinks(q, k, v, sinks=sinks, bias=bias, causal="bottom_right",
                                softcap=softcap or None)
    np.testing.assert_allclose(got, want.output, rtol=0, atol=2e-6)
    assert np.all(got[:, :, 2] == 0)
    # a scaled or a capped sink would be told apart
    for other in (sinks * D ** -0.5, softcap * np.tanh(sinks / softcap) if softcap else None):
        if other is not None:
            alt = attention_with_sinks(q, k, v, sinks=other, bias=bias, causal="bottom_right",
                                       softcap=softcap or None)
            assert np.max(np.abs(got - alt.output)) > 1e-2
