"""The few array operations the adapter helpers need, for NumPy, PyTorch, JAX and TensorFlow.

:func:`ops_for` picks the operations of the framework an array belongs to (by its type's module,
without importing a framework the caller has not imported), so :mod:`.layouts` and :mod:`.masks`
take and return the caller's own arrays: NumPy arrays, torch tensors (autograd flows through),
JAX arrays and tracers (inside ``jax.jit``), TensorFlow tensors. Anything else is treated as NumPy.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NamedTuple

import numpy as np


class ArrayOps(NamedTuple):
    """Operations on one framework's arrays; ``like`` gives the dtype and device of a result."""

    framework: str
    reshape: Callable[[Any, tuple], Any]
    transpose: Callable[[Any, tuple], Any]
    concat: Callable[[list, int], Any]
    where: Callable[[Any, Any, Any], Any]        # where(cond, a, b): b an array or a Python float
    constant: Callable[[np.ndarray, Any], Any]   # a NumPy array on like's device (dtype kept)
    cast: Callable[[Any, Any], Any]              # x in like's dtype (and on its device)
    zeros: Callable[[tuple, Any], Any]           # zeros of shape in like's dtype and device
    broadcast_to: Callable[[Any, tuple], Any]
    logical_not: Callable[[Any], Any]


@functools.cache
def _numpy_ops() -> ArrayOps:
    return ArrayOps(
        "numpy", np.reshape, np.transpose, lambda xs, axis: np.concatenate(xs, axis=axis),
        lambda c, a, b: np.where(c, a, np.asarray(b, dtype=np.asarray(a).dtype)),
        lambda array, like: np.asarray(array), lambda x, like: np.asarray(x).astype(like.dtype),
        lambda shape, like: np.zeros(shape, dtype=like.dtype), np.broadcast_to, np.logical_not)


@functools.cache
def _torch_ops() -> ArrayOps:
    import torch

    def where(c, a, b):
        if not isinstance(b, torch.Tensor):
            b = torch.tensor(b, dtype=a.dtype, device=a.device)
        return torch.where(c, a, b)

    return ArrayOps(
        "torch", lambda x, shape: x.reshape(shape), lambda x, axes: x.permute(*axes),
        lambda xs, axis: torch.cat(list(xs), dim=axis), where,
        lambda array, like: torch.as_tensor(array, device=like.device),
        lambda x, like: x.to(dtype=like.dtype, device=like.device),
        lambda shape, like: torch.zeros(shape, dtype=like.dtype, device=like.device),
        lambda x, shape: x.expand(*shape), torch.logical_not)


@functools.cache
def _jax_ops() -> ArrayOps:
    import jax.numpy as jnp

    def where(c, a, b):
        return jnp.where(c, a, jnp.asarray(b, dtype=a.dtype))

    return ArrayOps(
        "jax", jnp.reshape, jnp.transpose, lambda xs, axis: jnp.concatenate(list(xs), axis=axis),
        where, lambda array, like: jnp.asarray(array), lambda x, like: x.astype(like.dtype),
        lambda shape, like: jnp.zeros(shape, dtype=like.dtype), jnp.broadcast_to,
        jnp.logical_not)


@functools.cache
def _tf_ops() -> ArrayOps:
    import tensorflow as tf

    def where(c, a, b):
        return tf.where(c, a, tf.cast(b, a.dtype))

    return ArrayOps(
        "tensorflow", tf.reshape, tf.transpose, lambda xs, axis: tf.concat(list(xs), axis=axis),
        where, lambda array, like: tf.constant(array), lambda x, like: tf.cast(x, like.dtype),
        lambda shape, like: tf.zeros(shape, dtype=like.dtype), tf.broadcast_to,
        tf.logical_not)


_BUILDERS = {"torch": _torch_ops, "jax": _jax_ops, "jaxlib": _jax_ops,
             "tensorflow": _tf_ops, "keras": _tf_ops}


def ops_for(x) -> ArrayOps:
    """The :class:`ArrayOps` of the framework ``x`` belongs to (NumPy for anything unknown).

    A framework is recognised only when it is already imported (``x`` could not exist otherwise),
    so this never imports one."""
    root = type(x).__module__.split(".", 1)[0]
    if root not in _BUILDERS or root not in sys.modules:
        return _numpy_ops()
    return _BUILDERS[root]()


def shape_of(x) -> tuple[int, ...]:
    """``x.shape`` as a tuple of ints (works for every framework above)."""
    return tuple(int(n) for n in x.shape)
