"""``attention_vjp`` of the ``jax.nn.dot_product_attention`` adapters is the op's own backward.

Axis legend: B batch, T time (the op's layout, ``(B, T, N, H)``), h query heads, g key/value
heads, L_q / L_k lengths, d per-head width.

One tiny grouped case (B 1, h 4, g 2, L_q 3, L_k 4, d 2, float32), so each test compiles a few
small programs only: the adapter's gradients equal ``jax.vjp`` of the op called by hand, and a
variant whose backward is not the op's (dk, dv of the first query head of each group only, the
catalogue's GQA bug) is rejected by the suite's judge under GRAD-4 while the adapter passes it.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from mhaspec.backends.jax_native import DPA, DPA_JIT, JaxDPA  # noqa: E402
from mhaspec.conformance import vjp  # noqa: E402
from mhaspec.conformance.harness import Cell  # noqa: E402
from mhaspec.conformance.strategies import CaseSpec  # noqa: E402

SPEC = CaseSpec(batch=1, heads=4, kv_heads=2, len_q=3, len_k=4, d_k=2, d_v=2, d_model=8,
                k_dim=8, v_dim=8, d_out=8, self_attention=False, causal="top_left",
                key_padding=True, seed=5)


class FirstHeadOfGroup(JaxDPA):
    """The op's forward with a backward that keeps, for each key/value head, the gradient through
    the first query head of its group only (a GQA kernel that forgets to sum, GRAD-4)."""

    def _native_sdpa(self, q, k, v, m, **kw):
        forward = super()._native_sdpa
        group = self.ops.shape(q)[1] // self.ops.shape(k)[1]

        @jax.custom_vjp
        def op(q, k, v):
            return forward(q, k, v, m, **kw)

        def fwd(q, k, v):
            return op(q, k, v), (q, k, v)

        def bwd(res, d_out):
            q, k, v = res
            wide = [jnp.repeat(x, group, axis=1) for x in (k, v)]  # (B, h, L_k, d): plain MHA
            _, pullback = jax.vjp(lambda q, k, v: forward(q, k, v, m, **kw), q, *wide)
            dq, dk, dv = pullback(d_out)
            return dq, dk[:, ::group], dv[:, ::group]

        op.defvjp(fwd, bwd)
        return op(q, k, v)


def _op_by_hand(case, d_out):
    """jax.vjp of ``jax.nn.dot_product_attention`` on the case, in the op's (B, T, N, H) layout
    with its own grouped heads, is_causal and the key padding as its boolean mask."""
    btnh = [jnp.asarray(np.transpose(x, (0, 2, 1, 3)), jnp.float32) for x in (case.q, case.k, case.v)]
    padding = jnp.asarray(case.key_padding_mask[:, None, None, :])

    def op(q, k, v):
        with jax.default_matmul_precision("highest"):
            return jax.nn.dot_product_attention(q, k, v, mask=padding, is_causal=True)

    _, pullback = jax.vjp(op, *btnh)
    grads = pullback(jnp.asarray(np.transpose(d_out, (0, 2, 1, 3)), jnp.float32))
    return {n: np.transpose(np.asarray(g), (0, 2, 1, 3)) for n, g in zip("qkv", grads)}


@pytest.mark.parametrize("adapter", [DPA, DPA_JIT], ids=lambda a: a.name)
def test_gradients_are_jax_vjp_of_the_op(adapter):
    impl = Cell(adapter, "cpu", "float32")
    case = impl.case(SPEC, "sdpa")
    assert case.key_padding_mask is not None and not case.key_padding_mask.all()
    got = vjp.run(impl, case)
    want = _op_by_hand(case, vjp.cotangents(case)[0])
    for name in "qkv":
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_backward_that_is_not_the_ops_fails_under_its_clause():
    case = Cell(DPA, "cpu", "float32").case(SPEC, "sdpa")
    vjp.expect_gradients(Cell(DPA, "cpu", "float32"), case, "GRAD-4")
    broken = Cell(FirstHeadOfGroup("jax-dpa-first-head-of-group"), "cpu", "float32")
    with pytest.raises(AssertionError, match=r"\[GRAD-4\].*gradient of '[kv]'"):
        vjp.expect_gradients(broken, case, "GRAD-4")

