"""The NumPy backend: per-head and batched variants, CPU, float64 / float32 / float16.

The softmax runs in place on the logits (the update operations of :mod:`.primitives`), so the
batched variant holds one (B, h, L_q, L_k) array, which becomes the returned weights.
"""

from __future__ import annotations

import numpy as np

from . import np_float16, np_vjp
from ._generic import Algorithm, ArrayBackend
from .primitives import Ops


class NumpyOps(Ops):
    """The operations of numpy (:mod:`.primitives`)."""

    framework = "numpy"

    def shape(self, x) -> tuple[int, ...]:
        return x.shape  # already a tuple of Python ints

    def dtype_name(self, x) -> str:
        return x.dtype.name  # "float32" for either byte order

    def matmul(self, a, b):
        # NumPy's float16 matmul is a scalar loop; np_float16.matmul gives its bits, vectorised
        return np_float16.matmul(a, b) if a.dtype == np.float16 else np.matmul(a, b)

    def transpose(self, x, axes):
        return np.transpose(x, axes)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def exp(self, x):
        return np.exp(x)

    def max_last(self, x):
        return np.max(x, axis=-1, keepdims=True)

    def sum_last(self, x):
        return np.sum(x, axis=-1, keepdims=True)

    def where(self, cond, a, b: float):
        return np.where(cond, a, np.asarray(b, dtype=a.dtype))

    def isfinite(self, x):
        return np.isfinite(x)

    def concat(self, xs, axis: int):
        return np.concatenate(xs, axis=axis)

    def stack(self, xs, axis: int):
        return np.stack(xs, axis=axis)

    def constant(self, array: np.ndarray, like):
        return array

    def constant_as(self, array: np.ndarray, like):
        return array.astype(like.dtype)

    def full(self, shape, value: float, like):
        return np.full(shape, value, dtype=like.dtype)

    def to_float32(self, x):
        return x.astype(np.float32)

    def cast_like(self, x, like):
        return x.astype(like.dtype)

    def tanh(self, x):
        return np.tanh(x)

    def log(self, x):
        return np.log(x)

    def take_keys(self, x, index):
        return np.take_along_axis(x, _key_index(index, x.ndim), axis=-2)

    # in place: the algorithm hands these a temporary it owns (see .primitives)
    def iadd(self, x, y):
        return np.add(x, y, out=x)

    def isub(self, x, y):
        return np.subtract(x, y, out=x)

    def imul(self, x, y):
        return np.multiply(x, y, out=x)

    def idiv(self, x, y):
        return np.divide(x, y, out=x)

    def iexp(self, x):
        return np.exp(x, out=x)

    def ifill_masked(self, x, allowed):
        np.copyto(x, -np.inf, where=np.logical_not(allowed))
        return x


class NumpyBackend(ArrayBackend):
    """Multi-head attention in NumPy (algorithms in :mod:`mhaspec.backends.algorithms`)."""

    framework = "numpy"
    framework_label = "numpy"
    ops = NumpyOps()  # the default; adapters on this class share it

    def __init__(self, algorithm, *, name: str | None = None, ops: Ops | None = None):
        # spec 1.3: no autodiff in NumPy, so the backward pass is written by hand (np_vjp)
        super().__init__(ops or type(self).ops, algorithm, name=name,
                         backward=np_vjp.attention_vjp)

    def framework_version(self) -> str:
        return np.__version__

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16")

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        return np.array(x, dtype=dtype)  # a new array in native byte order

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x)


def _key_index(index, ndim: int):
    """(B, L') key indices shaped to index the key axis of a rank-``ndim`` (B, ..., L, d) array."""
    return index.reshape(index.shape[0], *(1,) * (ndim - 3), index.shape[1], 1)


PER_HEAD = NumpyBackend(Algorithm.PER_HEAD)
BATCHED = NumpyBackend(Algorithm.BATCHED)
