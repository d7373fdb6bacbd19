"""The array operations a framework supplies (its ``Ops``): the only thing a framework implements.

Axis legend: B batch, L / L' lengths, d a width; ``...`` any leading axes.

An ``Ops`` object has one public method per operation of :data:`OPERATIONS` (einops'
``_backends.py`` and the array API's ``xp`` are the models); ``np_backend.NumpyOps``,
``torch_backend.TorchOps``, ``jax_backend.JaxOps`` and ``tf_backend.TensorFlowOps`` implement them
in one line or two, and :func:`check_ops` names the missing ones when a backend is built. The
algorithms (:mod:`.algorithms`) are written over them once.

=================  ====================================================================
``shape(x)``       ``x.shape`` as a tuple of ints (default here)
``dtype_name(x)``  "float32", "bfloat16", ...
``matmul(a, b)``, ``transpose(x, axes)``, ``reshape(x, shape)``, ``exp``, ``tanh``, ``log``,
``isfinite``, ``concat(xs, axis)``, ``stack(xs, axis)``: as NumPy's
``max_last(x)``    max over the last axis, keeping it (``sum_last`` likewise)
``where(c, a, b)`` ``c ? a : b`` with a Python float ``b``, in ``a``'s dtype
``constant(array, like)``     a NumPy constant (a causal mask, an index) on ``like``'s device
``constant_as(array, like)``  a float64 NumPy constant (ALiBi) in ``like``'s dtype and device
``full(shape, value, like)``  ``value`` everywhere, in ``like``'s dtype and device
``to_float32(x)``, ``cast_like(x, like)``: conversions
``take_keys(x, index)``  x (B, ..., L, d), integer index (B, L') -> ``x[b, ..., index[b, j], :]``
                         (the present cache of a KV cache, CACHE-1)
=================  ====================================================================

The update operations (``iadd`` ... ``ifill_masked``, defaults here) receive a temporary the
algorithm owns and will not read again; by default they return a new array, and a framework with
mutable arrays (NumPy) may overwrite the temporary instead, which saves the allocations of the
(B, h, L_q, L_k) logits. The caller's arrays are never written (INPUT-1). ``vjp(fn, primals,
cotangent)`` (optional): ``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` by the
framework's autodiff (capability "grad").
"""

from __future__ import annotations

import numpy as np

#: The operations an ``Ops`` object must have (``vjp`` is optional: autodiff, "grad").
OPERATIONS = ("shape", "dtype_name", "matmul", "transpose", "reshape", "exp", "max_last",
              "sum_last", "where", "isfinite", "concat", "stack", "constant", "constant_as",
              "full", "tanh", "to_float32", "cast_like", "log", "take_keys", "iadd", "isub",
              "imul", "idiv", "iexp", "ifill_masked")


class Ops:
    """The defaults of a framework's operations: ``shape`` and the update operations."""

    framework = "array"

    def shape(self, x) -> tuple[int, ...]:
        return tuple(int(n) for n in x.shape)

    def iadd(self, x, y):
        """``x + y`` (``y`` broadcasts to ``x``)."""
        return x + y

    def isub(self, x, y):
        return x - y

    def imul(self, x, y):
        return x * y

    def idiv(self, x, y):
        return x / y

    def iexp(self, x):
        return self.exp(x)

    def ifill_masked(self, x, allowed):
        """``x`` with ``-inf`` where the boolean ``allowed`` (broadcasting to ``x``) is False."""
        return self.where(allowed, x, -np.inf)


def missing_ops(ops) -> list[str]:
    """The operations of :data:`OPERATIONS` that ``ops`` lacks (or has as a non-callable)."""
    return [n for n in OPERATIONS if not callable(getattr(ops, n, None))]


def check_ops(ops) -> None:
    """Raise ``TypeError`` naming every operation ``ops`` lacks, before any call needs one."""
    missing = missing_ops(ops)
    if missing:
        raise TypeError(f"argument 'ops' ({type(ops).__name__}) lacks the operations "
                        f"{', '.join(missing)} (see mhaspec.backends.primitives.OPERATIONS)")
