"""Central finite differences of a scalar loss of named float64 arrays: the reference the oracle's
analytic gradients are tested against (tests/test_oracle_grad.py, tests/test_oracle_vjp.py).

Each entry is moved by +-``eps`` and the difference quotient taken: its error is O(eps^2) from the
third derivative plus O(u / eps) rounding (``eps`` = 1e-5 agrees to ~1e-8 or better here).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

EPS = 1e-5


def central_differences(loss: Callable[[dict], float], arrays: dict[str, np.ndarray],
                        eps: float = EPS) -> dict[str, np.ndarray]:
    """name -> d loss / d arrays[name], by central differences; an entry that is not finite (a
    -inf bias) gets 0. ``loss`` takes ``arrays`` with one of them replaced."""
    fd = {}
    for name, arr in arrays.items():
        grad = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            vals = []
            for sign in (1, -1):
                moved = arr.copy()
                moved[idx] += sign * eps
                vals.append(loss({**arrays, name: moved}))
            grad[idx] = (vals[0] - vals[1]) / (2 * eps) if np.isfinite(arr[idx]) else 0.0
        fd[name] = grad
    return fd
