"""The array primitives a framework supplies: the only thing a framework module implements.

Axis legend: B batch, L / L' lengths, d a width; ``...`` any leading axes.

:class:`ArrayPrimitives` declares them, one method each (einops' ``_backends.py`` is the model);
``np_backend``, ``torch_backend``, ``jax_backend`` and ``tf_backend`` implement them in one line
or two. The algorithms (:mod:`.algorithms`) and the front door (:mod:`._generic`) are written over
them once.

The update primitives (``_iadd`` ... ``_ifill_masked``) receive a temporary the algorithm owns and
will not read again; by default they return a new array, and a framework with mutable arrays
(NumPy) may overwrite the temporary instead, which saves the allocations of the (B, h, L_q, L_k)
logits. The caller's arrays are never written (INPUT-1).
"""

from __future__ import annotations

import numpy as np


class ArrayPrimitives:
    """The primitives of one framework (override each in a framework module)."""

    def _shape(self, x) -> tuple[int, ...]:
        return tuple(int(n) for n in x.shape)

    def _dtype_name(self, x) -> str:
        raise NotImplementedError

    def _matmul(self, a, b):
        raise NotImplementedError

    def _transpose(self, x, axes):
        raise NotImplementedError

    def _reshape(self, x, shape):
        raise NotImplementedError

    def _exp(self, x):
        raise NotImplementedError

    def _max_last(self, x):
        """Max over the last axis, keeping it."""
        raise NotImplementedError

    def _sum_last(self, x):
        """Sum over the last axis, keeping it."""
        raise NotImplementedError

    def _where(self, cond, a, b: float):
        """Elementwise ``cond ? a : b`` with a Python float ``b``, in ``a``'s dtype."""
        raise NotImplementedError

    def _isfinite(self, x):
        raise NotImplementedError

    def _concat(self, xs, axis: int):
        raise NotImplementedError

    def _stack(self, xs, axis: int):
        raise NotImplementedError

    def _constant(self, array: np.ndarray, like):
        """A NumPy constant (a causal mask) as an array on ``like``'s device."""
        raise NotImplementedError

    def _constant_as(self, array: np.ndarray, like):
        """A float64 NumPy constant (the ALiBi bias) in ``like``'s dtype on its device."""
        raise NotImplementedError

    def _full(self, shape, value: float, like):
        """An array of ``shape`` filled with ``value`` in ``like``'s dtype and device."""
        raise NotImplementedError

    def _tanh(self, x):
        raise NotImplementedError

    def _to_float32(self, x):
        """``x`` converted to float32 (the soft-cap's working precision for float16/bfloat16)."""
        raise NotImplementedError

    def _cast_like(self, x, like):
        """``x`` converted to ``like``'s dtype."""
        raise NotImplementedError

    def _log(self, x):
        raise NotImplementedError

    def _take_keys(self, x, index):
        """x (B, ..., L, d), integer index (B, L') from :meth:`_constant` -> (B, ..., L', d):
        ``x[b, ..., index[b, j], :]`` (the present cache of a KV cache, CACHE-1)."""
        raise NotImplementedError

    # -- update primitives: ``x`` is a temporary the caller owns; may be overwritten -------------
    def _iadd(self, x, y):
        """``x + y`` (``y`` broadcasts to ``x``)."""
        return x + y

    def _isub(self, x, y):
        """``x - y`` (``y`` broadcasts to ``x``)."""
        return x - y

    def _imul(self, x, y):
        """``x * y`` (``y`` broadcasts to ``x``)."""
        return x * y

    def _idiv(self, x, y):
        """``x / y`` (``y`` broadcasts to ``x``)."""
        return x / y

    def _iexp(self, x):
        """``exp(x)``."""
        return self._exp(x)

    def _ifill_masked(self, x, allowed):
        """``x`` with ``-inf`` where the boolean ``allowed`` (broadcasting to ``x``) is False."""
        return self._where(allowed, x, -np.inf)
