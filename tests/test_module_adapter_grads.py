"""GRAD-1 of the module adapters that claim "grad" by their library's own backward: keras-mha (the
layer's ``GradientTape`` gradients of its variables, mapped back by ``layouts.from_einsum``) and
flax-mha (``jax.vjp`` through the module).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths, d_out output width.

One small case (B 2, h 2, L_q 3, L_k 4, widths 4, float32, key padding): each adapter's gradients
pass the suite's GRAD-1 judge, and a keras-mha variant that maps the output kernel's gradient back
in the wrong axis order (``(d_v, h)`` flattened instead of ``(h, d_v)``) fails it.
"""

from __future__ import annotations

import pytest

from mhaspec.conformance import test_grad
from mhaspec.conformance.harness import Cell
from mhaspec.conformance.strategies import CaseSpec

SPEC = CaseSpec(batch=2, heads=2, len_q=3, len_k=4, d_k=2, d_v=2, d_model=4, k_dim=4, v_dim=4,
                d_out=4, self_attention=False, use_bias=True, key_padding=True, seed=3)


def _load(name):
    from mhaspec.backends import BackendLoadError, load_backend

    try:
        backend = load_backend(name)
        backend.devices()  # imports its framework
    except BackendLoadError as e:
        pytest.skip(str(e))
    except ImportError as e:  # its framework is not installed
        pytest.skip(f"{name}: {e}")
    return backend


def _judge(backend):
    impl = Cell(backend, "cpu", "float32")
    case = impl.case(SPEC)
    got = test_grad.backend_grads(impl, case, test_grad.cotangent(case))
    test_grad.expect_oracle_grads(impl, case, got, "GRAD-1")


@pytest.mark.parametrize("name", ["keras-mha", "flax-mha"])
def test_the_library_backward_passes_grad_1(name):
    _judge(_load(name))


def test_a_wrong_mapping_of_the_layer_gradients_fails_grad_1():
    keras_mha = _load("keras-mha")

    class SwappedOutputKernel(type(keras_mha)):
        def mha_vjp(self, *args, num_heads: int, **kwargs):
            grads = super().mha_vjp(*args, num_heads=num_heads, **kwargs)
            hd_v, d_out = grads["w_o"].shape
            kernel = self.ops.reshape(grads["w_o"], (num_heads, hd_v // num_heads, d_out))
            grads["w_o"] = self.ops.reshape(self.ops.transpose(kernel, (1, 0, 2)), (hd_v, d_out))
            return grads

    with pytest.raises(AssertionError, match=r"\[GRAD-1\].*gradient of 'w_o'"):
        _judge(SwappedOutputKernel("keras-mha-swapped-output-kernel"))
