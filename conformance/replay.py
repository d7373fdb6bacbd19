"""Replay one conformance case on one backend and say how far it is from the oracle.

:func:`replay_case` is what a failure's printed reproducer calls (a case rebuilt from its
:class:`~mhaspec.conformance.strategies.CaseSpec`); ``mhaspec replay`` reruns a saved case (see
:mod:`mhaspec.conformance.failure_file`) through :func:`judge_case` (a gradient case, op
"attention_vjp": :func:`judge_vjp`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from mhaspec.backends import load_backend
from mhaspec.spec import oracle

from . import harness, tolerance, vjp
from .strategies import Case, CaseSpec, build_case


def replay_case(backend: str, op: str, spec: CaseSpec, *, device: str = "cpu", dtype: str = "float32",
                overrides: dict | None = None) -> list[harness.Check] | list[str]:
    """Run ``op`` ("sdpa", "mha" or "attention_vjp") of ``backend`` (name or ``module:attr``) on
    ``spec`` (list overrides, as a reproducer prints arrays, become arrays); print and return the
    NUM-3 checks of output and weights (for "attention_vjp": the lines of :func:`judge_vjp`)."""
    impl = harness.Cell(load_backend(backend), device, dtype)
    overrides = {k: np.asarray(v) if isinstance(v, list) else v for k, v in (overrides or {}).items()}
    if op == "attention_vjp":
        lines = judge_vjp(impl, build_case(spec), overrides)
        print("\n".join(lines))
        return lines
    checks = judge_case(impl, build_case(spec), op, overrides)
    for line in describe(impl.id, op, checks):
        print(line)
    return checks


#: the name reproducers printed before spec 1.4 call
replay = replay_case


def judge_vjp(impl: harness.Cell, case: Case, overrides: dict, *,
              clause: str = "replay") -> list[str]:
    """Run ``attention_vjp`` of ``impl`` on ``case`` with the suite's cotangents (``overrides``:
    ``d_lse``, ``bias_grad``, ``sinks``, :func:`vjp.replay_overrides`) and judge every gradient
    under GRAD-1's rule (the suite's one judgement, :func:`vjp.expect_gradients`): one line,
    ``<impl> attention_vjp gradients: conforms`` or ``... DOES NOT CONFORM: <the failure>``;
    :class:`Unjudgeable` when the oracle refuses the case; the backend's own exceptions pass
    through."""
    unknown = sorted(set(overrides) - {"d_lse", "bias_grad", "sinks"})
    if unknown:
        raise ValueError(f"overrides: attention_vjp replays d_lse, bias_grad and sinks, not {unknown}")
    try:
        oracle.attention_problem(case.q, case.k, case.v, **vjp.kwargs_of(case))
    except ValueError as exc:
        raise Unjudgeable(f"the spec's oracle refuses it: {' '.join(str(exc).split())}") from None
    try:
        vjp.expect_gradients(impl, case, clause, **overrides)
    except AssertionError as exc:
        return [f"{impl.id} attention_vjp gradients: DOES NOT CONFORM: "
                f"{str(exc).split(chr(10))[0]}"]
    return [f"{impl.id} attention_vjp gradients: conforms"]


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
    """One line per check: ``<impl> <op> output|weights: conforms|DOES NOT CONFORM: <detail>``,
    and for a check that does not conform a second line with the two values at its largest error
    (``got ... where the oracle gives ... at index ...``)."""
    lines = []
    for c in checks:
        lines.append(f"{impl_id} {op} {c.what}: {'conforms' if c.verdict.ok else 'DOES NOT CONFORM'}: "
                     f"{c.verdict.describe()}")
        if not c.verdict.ok and c.verdict.describe_values():
            lines.append(f"  {c.what}: {c.verdict.describe_values()}")
    return lines
