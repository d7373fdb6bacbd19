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
    return _judge(impl, build_case(spec), op, overrides or {})


def _judge(impl: harness.Impl, case, op: str, overrides: dict) -> list[tolerance.Verdict]:
    dtype = impl.dtype
    got = impl.sdpa(case, **overrides) if op == "sdpa" else impl.mha(case, **overrides)
    expected = harness.oracle_result(case, op, **overrides)
    naive = harness.naive_results(case, op, dtype, **overrides)
    length = harness.sum_length(case.spec)
    verdicts = [tolerance.judge(got.out, expected.out, [n.out for n in naive], dtype=dtype,
                                scale=harness._scale(case, op, expected), sum_length=length,
                                condition=expected.condition)]
    if got.weights is not None:
        verdicts.append(tolerance.judge(got.weights, expected.weights,
                                        [n.weights for n in naive], dtype=dtype, scale=1.0,
                                        sum_length=length, condition=expected.condition))
    for what, v in zip(("output", "weights"), verdicts):
        print(f"{impl.id} {op} {what}: {'conforms' if v.ok else 'DOES NOT CONFORM'}: {v.describe()}")
    return verdicts


# The saved-failure format lives in failure_file; ``save_case`` is re-exported here until the
# harness imports it from there.
from .failure_file import save_case  # noqa: E402,F401
