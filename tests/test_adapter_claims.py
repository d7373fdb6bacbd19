"""An adapter that claims attention_vjp with no way to compute it is refused when it is built, with
one line naming what to implement (spec 1.4: a NumpyAdapter claiming it failed on the first call
with ``AttributeError: '_algorithm'``), and the documented route, a hand-written attention_vjp,
certifies."""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.backends import CAPABILITIES
from mhaspec.backends.adapters import NumpyAdapter
from mhaspec.spec import oracle, oracle_vjp

CLAIMS = frozenset({"sdpa", "masks", "bias", "scale", "causal", "errors", "attention_vjp"})


class _Attention(NumpyAdapter):
    native_op = "the spec's oracle"
    capabilities = CLAIMS

    def attention(self, q, k, v, masks):
        res = oracle.attention_result(q, k, v, mask=masks.mask, bias=masks.bias,
                                      legacy_mask=masks.legacy_mask,
                                      key_padding_mask=masks.key_padding_mask,
                                      causal=masks.causal, scale=masks.scale, precision=str(q.dtype))
        return res.output.astype(q.dtype), res.weights.astype(q.dtype)


class HandWrittenBackward(_Attention):
    """The documented route: attention_vjp written by hand (here the oracle's analytic gradient)."""

    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad=False, **kwargs):
        self.scaled_dot_product_attention(q, k, v, **kwargs)  # validates the call (ERR)
        res = oracle_vjp.attention_vjp(q, k, v, d_output, d_lse=d_lse, bias_grad=bias_grad,
                                       precision=str(q.dtype), **kwargs)
        return {"q": res.dq.astype(q.dtype), "k": res.dk.astype(q.dtype),
                "v": res.dv.astype(q.dtype),
                **({"bias": res.d_bias.astype(q.dtype)} if bias_grad else {})}


def test_claiming_attention_vjp_without_a_backward_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        _Attention("no-backward")
    message = str(err.value)
    assert "\n" not in message
    assert "no-backward: claims 'attention_vjp'" in message
    assert "implement attention_vjp(q, k, v, d_output" in message


def test_a_hand_written_backward_is_accepted_and_computes():
    backend = HandWrittenBackward("hand-written")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    d_out = rng.standard_normal((1, 2, 3, 4))
    grads = backend.attention_vjp(q, k, v, d_out, causal="top_left")
    want = oracle_vjp.attention_vjp(q, k, v, d_out, causal="top_left")
    np.testing.assert_allclose(grads["q"], want.dq, rtol=1e-12, atol=1e-12)
    assert "attention_vjp" in CAPABILITIES
