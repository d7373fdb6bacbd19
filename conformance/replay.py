"""Replay one conformance case on one backend and say how far it is from the oracle.

:func:`replay` is what a failure's printed reproducer calls (a case rebuilt from its
:class:`~mhaspec.conformance.strategies.CaseSpec`); ``mhaspec replay`` reruns a saved case (see
:mod:`mhaspec.conformance.failure_file`) through :func:`judge_case`.
"""

from __future__ import annotations

from mhaspec.backends import load_backend

from . import harness
from .strategies import Case, CaseSpec, build_case


def replay(backend: str, op: str, spec: CaseSpec, *, device: str = "cpu", dtype: str = "float32",
           overrides: dict | None = None) -> list[harness.Check]:
    """Run ``op`` ("sdpa" or "mha") of ``backend`` (name or ``module:attr``) on ``spec``; print and
    return the NUM-3 checks of output and weights."""
    impl = harness.Impl(load_backend(backend), device, dtype)
    checks = judge_case(impl, build_case(spec), op, overrides or {})
    for line in describe(impl.id, op, checks):
        print(line)
    return checks


def judge_case(impl: harness.Impl, case: Case, op: str, overrides: dict, *,
               clause: str = "replay") -> list[harness.Check]:
    """Run ``op`` of ``impl`` on ``case`` and judge it (the suite's one run and one judgement);
    the backend's own exceptions pass through."""
    got = harness.run(impl, op, case, **overrides)
    return harness.check(impl, case, got, op=op, clause=clause, overrides=overrides)


def describe(impl_id: str, op: str, checks: list[harness.Check]) -> list[str]:
    """One line per check: ``<impl> <op> output|weights: conforms|DOES NOT CONFORM: <detail>``."""
    return [f"{impl_id} {op} {c.what}: {'conforms' if c.verdict.ok else 'DOES NOT CONFORM'}: "
            f"{c.verdict.describe()}" for c in checks]
