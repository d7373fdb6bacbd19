"""Replay one conformance case on one backend and say how far it is from the oracle.

:func:`replay_case` is what a failure's printed reproducer calls (a case rebuilt from its
:class:`~mhaspec.conformance.strategies.CaseSpec`); ``mhaspec replay`` reruns a saved case (see
:mod:`mhaspec.conformance.failure_file`) through :func:`judge_case`.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from mhaspec.backends import load_backend

from . import harness, tolerance
from .strategies import Case, CaseSpec, build_case


def replay_case(backend: str, op: str, spec: CaseSpec, *, device: str = "cpu", dtype: str = "float32",
           overrides: dict | None = None) -> list[harness.Check]:
    """Run ``op`` ("sdpa" or "mha") of ``backend`` (name or ``module:attr``) on ``spec``; print and
    return the NUM-3 checks of output and weights."""
    impl = harness.Cell(load_backend(backend), device, dtype)
    checks = judge_case(impl, build_case(spec), op, overrides or {})
    for line in describe(impl.id, op, checks):
        print(line)
    return checks


#: the name reproducers printed before spec 1.4 call
replay = replay_case


class Unjudgeable(ValueError):
    """A case NUM-3 cannot judge: the oracle refuses it (input the spec calls invalid), or the
    allowance NUM-3 gives is not finite (inputs that overflow the naive algorithm's dtype: outside
    NUM-3's domain, where no result passes, :func:`tolerance.within`)."""


def judgeable_reference(impl: harness.Cell, case: Case, op: str,
                        overrides: dict) -> harness.Reference:
    """The oracle and naive results that judge ``op`` on ``case`` in ``impl``'s dtype, computed
    before the backend runs; :class:`Unjudgeable` when the case cannot be judged. The allowance
    is found by judging the oracle's own result (error 0) with the suite's one judgement."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            ref = harness.reference(case, op, impl.dtype, overrides)
            checks = harness.check(impl, case, ref.expected, op=op, clause="replay",
                                   overrides=overrides, ref=ref)
        except (ValueError, AssertionError) as exc:
            raise Unjudgeable(f"the spec's oracle refuses it: {' '.join(str(exc).split())}") from None
    for c in checks:
        if not math.isfinite(c.verdict.allowed):
            raise Unjudgeable(f"NUM-3 has no finite allowance for its {c.what} (the naive "
                              f"algorithm's error is {c.verdict.ref_error:.3g}: its inputs overflow "
                              f"{tolerance.naive_precision(impl.dtype)}): outside NUM-3's domain, "
                              f"no result could pass")
    return ref


def judge_case(impl: harness.Cell, case: Case, op: str, overrides: dict, *,
               clause: str = "replay") -> list[harness.Check]:
    """Run ``op`` of ``impl`` on ``case`` and judge it (the suite's one run and one judgement);
    :class:`Unjudgeable` before the backend runs for a case that cannot be judged; the backend's
    own exceptions pass through."""
    ref = judgeable_reference(impl, case, op, overrides)
    got = harness.run(impl, op, case, **overrides)
    return harness.check(impl, case, got, op=op, clause=clause, overrides=overrides, ref=ref)


def describe(impl_id: str, op: str, checks: list[harness.Check]) -> list[str]:
    """One line per check: ``<impl> <op> output|weights: conforms|DOES NOT CONFORM: <detail>``."""
    return [f"{impl_id} {op} {c.what}: {'conforms' if c.verdict.ok else 'DOES NOT CONFORM'}: "
            f"{c.verdict.describe()}" for c in checks]
