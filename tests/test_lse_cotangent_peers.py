"""What the installed libraries do with a cotangent on the log-sum-exp they return (GRAD-11,
docs/ecosystem.md): library-only reproductions, no mhaspec code in the computation.

* ``jax.nn.dot_product_attention(..., return_residual=True)`` returns the lse but wraps it in
  ``stop_gradient``: the gradients are bit-identical with and without a cotangent on it, where
  the derivative of ``sum(lse * d_lse)`` (an explicit ``logsumexp``) is far from 0 -- *dropped*.
* PyTorch's CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``) returns a
  logsumexp that is not differentiable (``requires_grad`` False: ``derivatives.yaml`` gives it no
  gradient): in a loss it is a constant -- *dropped* -- and ``autograd.grad`` with a cotangent
  for it raises.

Axis legend: B batch, T/S query/key positions, N heads, H head width (JAX's (B, T, N, H)).
"""

from __future__ import annotations

import numpy as np
import pytest


def _qkv(seed=0, b=1, t=4, n=2, h=8):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, t, n, h)).astype(np.float32) for _ in range(3)]


def test_jax_dot_product_attention_drops_the_lse_cotangent():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q, k, v = _qkv()

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, return_residual=True)

    (out, lse), pull = jax.vjp(attend, q, k, v)
    rng = np.random.default_rng(1)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    d_lse = rng.standard_normal(lse.shape).astype(np.float32)
    with_lse = pull((d_out, d_lse))
    without = pull((d_out, np.zeros_like(d_lse)))
    assert all(np.array_equal(a, b) for a, b in zip(with_lse, without))  # dropped, bit for bit

    def explicit_lse(q):  # (B, T, N): the residual's layout, checked equal below
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
        return jnp.transpose(jax.nn.logsumexp(s, axis=-1), (0, 2, 1))

    np.testing.assert_allclose(explicit_lse(q), lse, rtol=1e-6, atol=1e-6)
    missing = jax.grad(lambda q: jnp.sum(explicit_lse(q) * d_lse))(q)
    assert float(jnp.max(jnp.abs(missing))) > 0.1  # what GRAD-8 adds to dq


def test_torch_cpu_flash_kernel_lse_is_not_differentiable():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(x.transpose(0, 2, 1, 3), requires_grad=True) for x in _qkv())
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2]
    assert out.requires_grad and not lse.requires_grad
    d_out = torch.randn_like(out)
    d_lse = torch.randn_like(lse)
    (dq_loss,) = torch.autograd.grad((out * d_out).sum() + (lse * d_lse).sum(), (q,),
                                     retain_graph=True)
    (dq_plain,) = torch.autograd.grad((out * d_out).sum(), (q,), retain_graph=True)
    assert torch.equal(dq_loss, dq_plain)  # in a loss the lse is a constant: dropped
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad((out, lse), (q,), (d_out, d_lse))
