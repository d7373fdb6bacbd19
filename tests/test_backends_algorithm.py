"""Each generic backend runs the algorithm it names, compiled or not (MHA-1 vs MHA-2).

Both algorithms conform, so the conformance suite cannot tell them apart; the traced program can.
The JAX and TensorFlow backends are traced (a jaxpr; a ``tf.function`` graph with the functions it
calls) and their matrix products counted. With h heads, scaled dot-product attention is
2 products batched (QK^T, PV over all heads at once) and 2h per head; cross-attention
multi-head attention is 3 + 2 + 1 = 6 batched and 3h + 2h + 1 per head.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k per-head width, d_model query width.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.backends import Algorithm, MHAParams, load_backend
from registered import loaded, unloadable_params

B, H, L_Q, L_K, D_K = 2, 4, 3, 5, 8
D_MODEL = H * D_K
TRACEABLE = {"jax": "jax", "tensorflow": "tensorflow"}  # framework -> module to import


def _generic_backends() -> list[str]:
    """Registered backends that run one of the generic algorithms (native adapters excluded:
    the framework's op computes there) in a framework whose programs can be traced here."""
    names = []
    for name, backend in loaded().items():
        if (backend.framework in TRACEABLE and isinstance(getattr(backend, "algorithm", None),
                                                           Algorithm)
                and not getattr(backend, "native_op", "")):
            names.append(name)
    return names


def expected_products(op: str, algorithm: Algorithm) -> int:
    """Matrix products in the traced program of ``op`` with H heads (see the module docstring)."""
    batched = algorithm is Algorithm.BATCHED
    if op == "sdpa":
        return 2 if batched else 2 * H
    return 6 if batched else 5 * H + 1


def _inputs(backend, op: str) -> tuple:
    rng = np.random.default_rng(0)

    def arr(*shape):
        return backend.asarray(rng.standard_normal(shape), dtype="float32")

    if op == "sdpa":
        return arr(B, H, L_Q, D_K), arr(B, H, L_K, D_K), arr(B, H, L_K, D_K)
    return (arr(B, L_Q, D_MODEL), arr(B, L_K, D_MODEL), arr(B, L_K, D_MODEL),
            *(arr(D_MODEL, D_MODEL) for _ in range(4)))


def _call(backend, op: str):
    """A function of the input arrays returning the output of ``op``."""
    if op == "sdpa":
        return lambda q, k, v: backend.scaled_dot_product_attention(q, k, v)[0]
    return lambda query, key, value, *w: backend.multi_head_attention(
        query, key, value, MHAParams(*w), num_heads=H)[0]


def _jax_products(backend, op: str) -> int:
    jax = pytest.importorskip("jax")
    closed = jax.make_jaxpr(_call(backend, op))(*_inputs(backend, op))

    def count(jaxpr) -> int:
        n = 0
        for eqn in jaxpr.eqns:
            n += eqn.primitive.name == "dot_general"
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else (param,):
                    inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                    if hasattr(inner, "eqns"):
                        n += count(inner)
        return n

    return count(closed.jaxpr)


def _tf_products(backend, op: str) -> int:
    tf = pytest.importorskip("tensorflow")
    graph = tf.function(_call(backend, op)).get_concrete_function(
        *_inputs(backend, op)).graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    return sum(o in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") for o in ops)


PRODUCTS = {"jax": _jax_products, "tensorflow": _tf_products}


@pytest.mark.parametrize("op", ["sdpa", "mha"])
@pytest.mark.parametrize("name", _generic_backends())
def test_traced_program_is_the_named_algorithm(name, op):
    backend = load_backend(name)
    pytest.importorskip(TRACEABLE[backend.framework])
    got = PRODUCTS[backend.framework](backend, op)
    assert got == expected_products(op, backend.algorithm), (
        f"{name} ({backend.algorithm}) traced {got} matrix products for {op} with h = {H}: "
        f"batched is {expected_products(op, Algorithm.BATCHED)}, per head "
        f"{expected_products(op, Algorithm.PER_HEAD)}")


def _jit():
    pytest.importorskip("jax")
    from mhaspec.backends.jax_backend import JitJaxBackend

    return JitJaxBackend()


def _function():
    pytest.importorskip("tensorflow")
    from mhaspec.backends.tf_backend import FunctionTensorFlowBackend

    return FunctionTensorFlowBackend()


@pytest.mark.parametrize("op", ["sdpa", "mha"])
@pytest.mark.parametrize("make", [_jit, _function], ids=["jax-jit", "tf-function"])
def test_compiled_variants_compile_the_batched_algorithm(make, op):
    """What the docs promise: jax-jit and tf-function compile the batched algorithm (MHA-2)."""
    backend = make()
    assert PRODUCTS[backend.framework](backend, op) == expected_products(op, Algorithm.BATCHED)


@pytest.mark.parametrize("make", [_jit, _function], ids=["jax-jit", "tf-function"])
@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_compiled_variants_wrap_the_algorithm_they_are_given(make, algorithm):
    backend = type(make())(algorithm)
    assert backend.algorithm is algorithm
    assert PRODUCTS[backend.framework](backend, "sdpa") == expected_products("sdpa", algorithm)


@pytest.mark.parametrize("name", [*loaded(), *unloadable_params()])
def test_the_algorithm_cannot_be_reassigned(name):
    backend = load_backend(name)
    with pytest.raises(AttributeError):
        backend.algorithm = Algorithm.PER_HEAD


def test_the_algorithm_object_is_chosen_once_at_construction():
    """An array backend holds one algorithm object, chosen by its constructor; an algorithm
    object (a variant of one of the two) is accepted as it is."""
    from mhaspec.backends import algorithms
    from mhaspec.backends.np_backend import NumpyBackend

    for kind in Algorithm:
        assert NumpyBackend(kind).algorithm is kind
        assert NumpyBackend(kind.value).algorithm is kind

    class Variant(algorithms.PerHead):
        pass

    assert NumpyBackend(Variant()).algorithm is Algorithm.PER_HEAD


def test_adapters_construct_no_algorithm():
    """A native adapter computes with its op: it holds no algorithm object."""
    from mhaspec.backends.adapters import NumpyAdapter

    class Op(NumpyAdapter):
        native_op = "op"

    assert getattr(Op("op"), "algorithm", None) is None


def test_an_unknown_algorithm_is_rejected():
    from mhaspec.backends.np_backend import NumpyBackend

    with pytest.raises(ValueError, match="'algorithm'"):
        NumpyBackend("jit")


def test_check_ops_names_every_missing_operation():
    """A backend's operations are checked when it is built: each missing one is named up front,
    not met as an AttributeError in the middle of a call."""
    from mhaspec.backends.np_backend import NumpyBackend, NumpyOps
    from mhaspec.backends.primitives import OPERATIONS, Ops, check_ops, missing_ops

    assert missing_ops(NumpyOps()) == []

    class Partial(Ops):  # the defaults only (shape and the update operations)
        def matmul(self, a, b):
            return a @ b

    missing = missing_ops(Partial())
    assert "matmul" not in missing and "shape" not in missing
    assert set(missing) == set(OPERATIONS) - {"matmul", "shape", "iadd", "isub", "imul", "idiv",
                                             "iexp", "ifill_masked"}
    with pytest.raises(TypeError, match="argument 'ops' \\(Partial\\) lacks the operations "
                                        "dtype_name, transpose, reshape, exp"):
        NumpyBackend("batched", ops=Partial())
    with pytest.raises(TypeError, match="take_keys"):
        check_ops(Partial())


def test_an_algorithm_calls_only_public_operations():
    """The algorithms reach the framework through ``ops`` alone: an ``Ops`` object that exposes
    exactly the operations of OPERATIONS (nothing private) computes every call."""
    from mhaspec.backends.np_backend import NumpyBackend, NumpyOps
    from mhaspec.backends.primitives import OPERATIONS

    class Exactly:
        """NumPy's operations, and nothing else (no private names to fall back on)."""

        def __init__(self):
            inner = NumpyOps()
            for name in OPERATIONS:
                setattr(self, name, getattr(inner, name))

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 3, 8)) for _ in range(3))
    params = [rng.standard_normal((8, 8)) for _ in range(4)]
    query = rng.standard_normal((2, 3, 8))
    for kind in ("batched", "perhead"):
        plain, exact = NumpyBackend(kind), NumpyBackend(kind, ops=Exactly())
        for kw in ({"causal": "bottom_right"}, {"softcap": 5.0, "lse": True},
                   {"window": (1, 0), "causal": "top_left"}):
            want = plain.scaled_dot_product_attention(q, k, v, **kw)
            got = exact.scaled_dot_product_attention(q, k, v, **kw)
            np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(
            exact.multi_head_attention(query, query, query, params, num_heads=4)[0],
            plain.multi_head_attention(query, query, query, params, num_heads=4)[0])
