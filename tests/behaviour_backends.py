"""Backends for the declared-behaviour tests (tests/test_declared_behaviours.py): the NumPy
backend with PaddlePaddle's ``nn.MultiHeadAttention`` softmax, which clamps ``x - max`` at -64
before ``exp`` (a blocked key gets e^-64 = 1.6e-28, not 0), declaring the behaviour or not, and
with a clamp at -12 (6e-6: beyond the behaviour's bound), declaring it.

Rows with an allowed key are clamped; a row without one keeps its -inf and stays 0 (MASK-9 is
another behaviour, declared by clause)."""

from __future__ import annotations

import numpy as np

from broken_backends.base import Broken
from mhaspec.backends.behaviours import MASKED_WEIGHTS_NOT_ZERO
from mhaspec.backends.np_backend import NumpyOps

DECLARED = {MASKED_WEIGHTS_NOT_ZERO.key: "exp(max(x - max, -64)): a blocked key gets 1.6e-28"}


def clamped_ops(floor: float) -> type:
    """NumpyOps whose softmax exponent is clamped at ``floor`` in rows with an allowed key."""

    class ClampedOps(NumpyOps):
        def iexp(self, x):
            some = np.isfinite(x).any(axis=-1, keepdims=True)
            return np.exp(np.where(some, np.maximum(x, floor), x))

    return ClampedOps


class Clamped(Broken):
    Ops = clamped_ops(-64.0)


class ClampedDeclared(Clamped):
    """Declares the behaviour where it shows: not in float16, where e^-64 underflows to 0."""
    deviations = DECLARED

    def deviations_on(self, device: str, dtype: str):
        return {} if dtype == "float16" else self.deviations


class ClampedTooHigh(Broken):
    """Clamped at -12 (a blocked weight up to e^-12 = 6e-6): the declaration does not cover it."""
    Ops = clamped_ops(-12.0)
    deviations = DECLARED


class ExactDeclared(Broken):
    """The NumPy backend, exact zeros, declaring the behaviour anyway: stale."""
    deviations = DECLARED


UNDECLARED = Clamped("clamped-undeclared")
CLAMPED = ClampedDeclared("clamped-declared")
TOO_HIGH = ClampedTooHigh("clamped-too-high")
EXACT = ExactDeclared("exact-declared")
