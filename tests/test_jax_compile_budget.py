"""The jit-compiled JAX backends keep their compiled code within the kernel's memory-map limit.

A soak round of jax-jit (250 examples per test) died with a segmentation fault inside XLA's
compiler once the process held vm.max_map_count memory maps (about a dozen per CPU executable)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from mhaspec.backends import jax_compile_budget as budget  # noqa: E402
from mhaspec.backends.jax_backend import JIT  # noqa: E402

pytestmark = pytest.mark.skipif(budget.map_count() is None or budget.map_limit() is None,
                                reason="needs Linux /proc/self/maps and vm.max_map_count")


def _call_with_new_shapes(n: int) -> None:
    rng = np.random.default_rng(0)
    for length in range(1, n + 1):  # each length is a new shape: one compilation each
        q = JIT.asarray(rng.standard_normal((1, 1, length, 2)), dtype="float32")
        JIT.scaled_dot_product_attention(q, q, q)


def test_each_compiled_shape_costs_memory_maps_until_the_caches_are_cleared():
    jax.clear_caches()
    before = budget.map_count()
    _call_with_new_shapes(40)
    grown = budget.map_count()
    assert grown > before + 40, (before, grown)  # the growth the budget exists for
    jax.clear_caches()
    assert budget.map_count() < grown


def test_caches_are_cleared_above_half_the_limit_and_results_stay(monkeypatch):
    monkeypatch.setattr(budget, "CHECK_EVERY", 1)
    monkeypatch.setattr(budget, "map_limit", lambda: 2 * (budget.map_count() - 1))
    rng = np.random.default_rng(1)
    q = JIT.asarray(rng.standard_normal((2, 2, 5, 3)), dtype="float64")
    first = JIT.to_numpy(JIT.scaled_dot_product_attention(q, q, q)[0])
    clears = budget.clears
    again = JIT.to_numpy(JIT.scaled_dot_product_attention(q, q, q)[0])
    assert budget.clears > clears
    np.testing.assert_array_equal(first, again)


def test_no_clearing_below_half_the_limit(monkeypatch):
    monkeypatch.setattr(budget, "CHECK_EVERY", 1)
    monkeypatch.setattr(budget, "map_limit", lambda: 10 ** 9)
    clears = budget.clears
    _call_with_new_shapes(3)
    assert budget.clears == clears
