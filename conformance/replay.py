"""Replay one conformance case on one backend and print how far it is from the oracle."""

from __future__ import annotations

from mhaspec.backends import load_backend

from . import harness, tolerance
from .strategies import CaseSpec, build_case


def replay(backend: str, op: str, spec: CaseSpec, *, device: str = "cpu", dtype: str = "float32",
           overrides: dict | None = None) -> list[tolerance.Verdict]:
    """Run ``op`` ("sdpa" or "mha") of ``backend`` (name or ``module:attr``) on ``spec``; print and
    return the NUM-3 verdicts for output and weights."""
    impl = harness.Impl(load_backend(backend), device, dtype)
    case = build_case(spec)
    overrides = overrides or {}
    got = impl.sdpa(case, **overrides) if op == "sdpa" else impl.mha(case, **overrides)
    expected = harness.oracle_result(case, op, **overrides)
    naive = harness.oracle_result(case, op, tolerance.naive_precision(dtype), **overrides)
    verdicts = [tolerance.judge(got.out, expected.out, naive.out, dtype=dtype,
                                scale=harness._scale(case, op, expected))]
    if got.weights is not None:
        verdicts.append(tolerance.judge(got.weights, expected.weights, naive.weights, dtype=dtype,
                                        scale=1.0))
    for what, v in zip(("output", "weights"), verdicts):
        print(f"{impl.id} {op} {what}: {'conforms' if v.ok else 'DOES NOT CONFORM'}: {v.describe()}")
    return verdicts
