"""Chapter DET, spec 1.4 (optional capability "deterministic"): repeated calls on the same inputs
give bitwise-identical results (DET-1).

Each test calls one operation :data:`REPEATS` times on one case, in this process and cell, and
compares every result bit for bit with the first call's (NaN equals NaN): output, weights and lse
of both attention operations, every gradient of ``attention_vjp`` (with an lse cotangent where
claimed) and of ``mha_vjp``.

Axis legend: B batch, h heads, L_q / L_k lengths, d_out output width.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.conformance import covering, harness, vjp
from mhaspec.conformance.judge import same_bits
from mhaspec.conformance.strategies import case_specs, feature_specs

#: how many times DET-1's tests call an operation on the same inputs
REPEATS = 3


def _expect_identical(impl, what: str, runs: list[dict[str, np.ndarray]]) -> None:
    """Every run of ``runs`` (name -> NumPy result) has the first run's bits (DET-1)."""
    for i, later in enumerate(runs[1:], start=2):
        differ = [n for n, x in runs[0].items()
                  if x is not None and not same_bits(np.asarray(x), np.asarray(later[n]))]
        assert not differ, (f"[DET-1] {impl.id}: call {i} of {what} on the same inputs gave other "
                            f"bits than call 1 in {', '.join(differ)} (it claims 'deterministic')")


@pytest.mark.clause("DET-1")
@pytest.mark.requires("deterministic")
@covering.cover("DET-1")
@given(spec=feature_specs(allow=("gqa", "softcap", "window", "alibi", "lse"), masks=True,
                          bias=True, key_padding=True, causal=True, custom_scale=True))
def test_repeated_calls_give_identical_results(impl, op, spec):
    """Output, weights and lse (where returned) of :data:`REPEATS` calls on one case."""
    case = impl.case(spec, op)
    runs = [harness.run(impl, op, case) for _ in range(REPEATS)]
    _expect_identical(impl, op, [{"output": r.out, "weights": r.weights, "lse": r.lse}
                                 for r in runs])


@pytest.mark.clause("DET-1")
@pytest.mark.requires("deterministic", "sdpa", "attention_vjp")
@pytest.mark.dtypes("float64", "float32")
@covering.cover("DET-1")
@given(spec=feature_specs(allow=("gqa", "softcap", "window", "alibi"), masks=True, bias=True,
                          key_padding=True, causal=True, custom_scale=True))
def test_repeated_gradients_of_attention_are_identical(impl, spec):
    """Every gradient of :data:`REPEATS` ``attention_vjp`` calls on one case (with d_lse where
    the backend claims "lse")."""
    case = impl.case(spec, "sdpa")
    harness.note("attention_vjp", case.spec)
    d_lse = "lse" in harness.op_capabilities(impl.backend, "sdpa")
    _expect_identical(impl, "attention_vjp",
                      [vjp.run(impl, case, d_lse=d_lse) for _ in range(REPEATS)])


@pytest.mark.clause("DET-1")
@pytest.mark.requires("deterministic", "mha", "grad")
@pytest.mark.dtypes("float64", "float32")
@covering.cover("DET-1")
@given(spec=case_specs(masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_repeated_gradients_of_multi_head_attention_are_identical(impl, spec):
    """Every gradient of :data:`REPEATS` ``mha_vjp`` calls on one case."""
    case = impl.case(spec)
    harness.note("vjp", case.spec)
    s = case.spec
    cotangent = impl.arr(np.random.default_rng([s.seed, 7]).standard_normal(
        (s.batch, s.len_q, s.d_out)))

    def once() -> dict[str, np.ndarray]:
        grads = impl.call("mha_vjp", *impl.mha_inputs(case), impl.params(case.params), cotangent,
                          num_heads=s.heads, spec=s, **impl.masks(case))
        return {n: impl.backend.to_numpy(g) for n, g in grads.items()}
    _expect_identical(impl, "mha_vjp", [once() for _ in range(REPEATS)])
