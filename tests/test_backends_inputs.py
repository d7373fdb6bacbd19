"""What every registered backend accepts and rejects, through the shared validation.

Valid although not Python built-ins: NumPy scalars (``np.float32(0.5)`` as scale, ``np.int64(2)`` as
num_heads), 0-d arrays, big-endian arrays. Rejected with a ValueError naming the argument: a Python
list in an array's place, ``params=None``, integer, complex and object arrays. Every registered
backend whose framework imports is checked, on both operations it claims.

Axis legend: B batch, L lengths (L_q = L_k), h heads, d_k per-head width, d_model = h * d_k.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.backends import MHAParams, load_backend
from registered import loaded
from mhaspec.backends.claim_readers import OPS

B, H, L, D_K = 2, 2, 3, 4
D_MODEL = H * D_K
SCALE = 0.5  # = 1/sqrt(d_k): the default, so backends without the "scale" capability take it too


def _claims() -> list[tuple[str, str]]:
    """(backend name, operation) for every registered backend and operation it claims."""
    return [(name, op) for name, backend in loaded().items() for op in OPS
            if op in backend.capabilities]


def _numpy_backends() -> list[tuple[str, str]]:
    """The claims of backends whose own arrays are NumPy arrays."""
    return [(name, op) for name, op in _claims() if load_backend(name).framework == "numpy"]


CLAIMS = _claims()
IDS = [f"{name}-{op}" for name, op in CLAIMS]


def _backend(name: str):
    backend = load_backend(name)
    cpu = backend.devices().get("cpu", "no CPU device")
    if cpu is not None:  # these checks run on the CPU (a CUDA-only kernel says why it does not)
        pytest.skip(f"{name}: cpu: {cpu}")
    try:
        backend.framework_version()
    except ImportError as exc:
        pytest.skip(f"{name}: its framework {backend.framework} does not import: {exc}")
    return backend


def _numpy_inputs(op: str) -> dict:
    """Float64 NumPy arrays of a valid call of ``op`` (self-attention widths), by argument name."""
    rng = np.random.default_rng(3)
    if op == "sdpa":
        return {n: rng.standard_normal((B, H, L, D_K)) for n in ("q", "k", "v")}
    inputs = {n: rng.standard_normal((B, L, D_MODEL)) for n in ("query", "key", "value")}
    inputs.update({n: rng.standard_normal((D_MODEL, D_MODEL)) for n in ("w_q", "w_k", "w_v", "w_o")})
    inputs.update({n: rng.standard_normal(D_MODEL) for n in ("b_q", "b_k", "b_v", "b_o")})
    return inputs


def _convert(backend, arrays: dict, dtype: str = "float32") -> dict:
    return {n: backend.asarray(x, dtype=dtype) for n, x in arrays.items()}


def _call(backend, op: str, arrays: dict, **kw):
    """Run ``op`` on the backend arrays ``arrays``; returns the output as NumPy."""
    if op == "sdpa":
        out, _ = backend.scaled_dot_product_attention(arrays["q"], arrays["k"], arrays["v"], **kw)
    else:
        kw.setdefault("num_heads", H)
        params = arrays.get("params", MHAParams(*(arrays[n] for n in MHAParams._fields)))
        out, _ = backend.multi_head_attention(arrays["query"], arrays["key"], arrays["value"],
                                              params, **kw)
    return backend.to_numpy(out)


@pytest.mark.parametrize("scale", [np.float32(SCALE), np.float64(SCALE), np.array(SCALE),
                                   np.array(SCALE, dtype=np.float32)],
                         ids=["np.float32", "np.float64", "0-d float64", "0-d float32"])
@pytest.mark.parametrize(("name", "op"), CLAIMS, ids=IDS)
def test_numpy_scalar_and_0d_scales_are_accepted(name, op, scale):
    backend = _backend(name)
    arrays = _convert(backend, _numpy_inputs(op))
    np.testing.assert_array_equal(_call(backend, op, arrays, scale=scale),
                                  _call(backend, op, arrays, scale=SCALE))


@pytest.mark.parametrize("num_heads", [np.int64(H), np.int32(H), np.array(H)],
                         ids=["np.int64", "np.int32", "0-d int64"])
@pytest.mark.parametrize("name", [name for name, op in CLAIMS if op == "mha"])
def test_numpy_integer_num_heads_is_accepted(name, num_heads):
    backend = _backend(name)
    arrays = _convert(backend, _numpy_inputs("mha"))
    np.testing.assert_array_equal(_call(backend, "mha", arrays, num_heads=num_heads),
                                  _call(backend, "mha", arrays, num_heads=H))


@pytest.mark.parametrize("num_heads", [2.0, np.float64(2.0), True, np.array([2])],
                         ids=["float", "np.float64", "bool", "1-d array"])
@pytest.mark.parametrize("name", [name for name, op in CLAIMS if op == "mha"])
def test_num_heads_that_is_not_an_integer_is_rejected(name, num_heads):
    backend = _backend(name)
    with pytest.raises(ValueError, match="'num_heads'"):
        _call(backend, "mha", _convert(backend, _numpy_inputs("mha")), num_heads=num_heads)


@pytest.mark.parametrize(("name", "op"), CLAIMS, ids=IDS)
def test_asarray_accepts_big_endian_arrays(name, op):
    backend = _backend(name)
    native = _numpy_inputs(op)
    swapped = {n: x.astype(x.dtype.newbyteorder(">" if x.dtype.byteorder != ">" else "<"))
               for n, x in native.items()}
    np.testing.assert_array_equal(_call(backend, op, _convert(backend, swapped)),
                                  _call(backend, op, _convert(backend, native)))


@pytest.mark.parametrize(("name", "op"), _numpy_backends(),
                         ids=[f"{n}-{o}" for n, o in _numpy_backends()])
def test_numpy_backends_compute_on_big_endian_arrays(name, op):
    backend = _backend(name)
    native = _convert(backend, _numpy_inputs(op))
    big = {n: x.astype(">f4") for n, x in native.items()}
    np.testing.assert_allclose(_call(backend, op, big), _call(backend, op, native), rtol=0, atol=0)


def _first_array(op: str) -> str:
    return "q" if op == "sdpa" else "query"


@pytest.mark.parametrize(("name", "op"), CLAIMS, ids=IDS)
def test_a_list_in_place_of_an_array_is_rejected_naming_it(name, op):
    backend = _backend(name)
    numpy_arrays = _numpy_inputs(op)
    for arg in numpy_arrays:
        arrays = _convert(backend, numpy_arrays)
        arrays[arg] = numpy_arrays[arg].tolist()
        with pytest.raises(ValueError, match=f"argument '{arg}' must be an array"):
            _call(backend, op, arrays)
    mask = np.ones((B, 1, L, L), dtype=bool).tolist()
    with pytest.raises(ValueError, match="argument 'mask' must be an array"):
        _call(backend, op, _convert(backend, numpy_arrays), mask=mask)


@pytest.mark.parametrize("params", [None, "w_q", 3, ()], ids=["None", "str", "int", "empty"])
@pytest.mark.parametrize("name", [name for name, op in CLAIMS if op == "mha"])
def test_params_that_are_not_a_parameter_tuple_are_rejected(name, params):
    backend = _backend(name)
    arrays = {**_convert(backend, _numpy_inputs("mha")), "params": params}
    with pytest.raises(ValueError, match="argument 'params'"):
        _call(backend, "mha", arrays)


@pytest.mark.parametrize("dtype", ["int64", "int32", "complex64"])
@pytest.mark.parametrize(("name", "op"), CLAIMS, ids=IDS)
def test_integer_and_complex_arrays_are_rejected_naming_the_argument(name, op, dtype):
    backend = _backend(name)
    arg = _first_array(op)
    arrays = _convert(backend, _numpy_inputs(op))
    arrays[arg] = backend.asarray(_numpy_inputs(op)[arg], dtype=dtype)
    with pytest.raises(ValueError, match=f"argument '{arg}' must be floating point"):
        _call(backend, op, arrays)


@pytest.mark.parametrize(("name", "op"), _numpy_backends(),
                         ids=[f"{n}-{o}" for n, o in _numpy_backends()])
def test_object_arrays_are_rejected_naming_the_argument(name, op):
    backend = _backend(name)
    arg = _first_array(op)
    arrays = _convert(backend, _numpy_inputs(op))
    arrays[arg] = arrays[arg].astype(object)
    with pytest.raises(ValueError, match=f"argument '{arg}' must be floating point"):
        _call(backend, op, arrays)
