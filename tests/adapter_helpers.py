"""The shapes, tolerance, seeded parameter and input builders and the ``jax`` fixture shared by
tests/test_adapters.py and tests/test_adapter_bases.py (import the fixture by name to use it), and
the reading of a suite run the any-library adapters' tests share (:func:`outcomes_of`).

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads, d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.
"""

from __future__ import annotations

import math

import pytest

from mhaspec.backends import MHAParams

B, H, L_Q, L_K = 2, 3, 4, 6
TOL64 = 1e-12


def random_params(rng, d_model, k_dim, v_dim, d_k, d_v, d_out, *, heads=H, kv_heads=H, biases=True):
    """Random MHAParams (weights scaled by 1/sqrt(fan-in)), biases unless biases=False."""
    shapes = ((d_model, heads * d_k), (k_dim, kv_heads * d_k), (v_dim, kv_heads * d_v),
              (heads * d_v, d_out))
    weights = [rng.standard_normal(s) / math.sqrt(s[0]) for s in shapes]
    b = [rng.standard_normal(s[1]) for s in shapes] if biases else [None] * 4
    return MHAParams(*weights, *b)


def random_qkv(rng, len_q=L_Q, len_k=L_K, d=5, kv_heads=H):
    """Random q (B, H, len_q, d) and k, v (B, kv_heads, len_k, d)."""
    return (rng.standard_normal((B, H, len_q, d)), rng.standard_normal((B, kv_heads, len_k, d)),
            rng.standard_normal((B, kv_heads, len_k, d)))


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def outcomes_of(results) -> dict[tuple[str, str], set[str]]:
    """(backend, clause) -> the outcomes of its tests that ran in a suite run's ``results`` (not
    those of the CUDA cells, unavailable here, nor of the operations the backend does not claim):
    what the any-library adapters' tests (MLX, PaddlePaddle, tinygrad) read of a run."""
    found: dict[tuple[str, str], set[str]] = {}
    for r in results:
        if r["outcome"] in ("unavailable", "not-implemented"):
            continue
        for clause in r["clauses"]:
            found.setdefault((r["backend"], clause), set()).add(r["outcome"])
    return found
