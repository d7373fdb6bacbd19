"""Expecting and reporting: a test's assertions and what a failure tells (a reproducer, the saved case).

:func:`expect_oracle` asserts a result agrees with the oracle (:func:`judge.check`) and raises an
``AssertionError`` naming the clause, the error and a reproducer a user can paste;
:func:`expect_close` asserts two results of one backend agree (a property);
:func:`expect_rejections` asserts invalid calls raise ``ValueError`` naming the argument. A failure
is recorded on the running test (:mod:`.item_state`) and its case saved for ``mhaspec replay``
when the run keeps failures (:func:`save_failure`); a passing test's last case is saved when the
run keeps a sample of passes (:func:`save_passing_sample`).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np

from . import failure_file, failure_save, tolerance, verdicts
from .cell import Cell, Result, run
from .item_state import ItemState, run_settings, running
from .judge import Reference, check, finite_max_abs, float32_hint, magnitude, reference
from .strategies import Case, CaseSpec


def reproducer(impl: Cell, op: str, spec: CaseSpec, overrides: dict | None = None) -> str:
    """Python a user can paste to replay exactly this case on this backend."""
    shown = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in (overrides or {}).items()}
    extra = f", overrides={shown!r}" if shown else ""  # arrays as lists: replay takes them back
    ref = backend_ref(impl, run_settings())
    return ("from mhaspec.conformance.strategies import CaseSpec\n"
            "from mhaspec.conformance.replay import replay_case\n"
            f"replay_case({ref!r}, {op!r}, {spec!r}, device={impl.device!r}, "
            f"dtype={impl.dtype!r}{extra})")


def save_failure(impl: Cell, case: Case, op: str, clause: str, overrides: dict,
                 state: ItemState | None = None) -> str:
    """Save the failing case (array overrides folded in, :func:`failure_save.saveable`) for
    ``mhaspec replay`` when the run of the test ``state`` records (default: the running test) has a
    failures directory, and check that it reads back; returns the line telling how to replay it
    ("" when not saved) and keeps it in the test's record (``replay``)."""
    state = state if state is not None else running()
    settings = run_settings() if state is None else state.settings
    ref = backend_ref(impl, settings)
    path = _save_case(settings.failures_dir, state.name if state is not None else clause, impl,
                      case, op, clause, overrides, ref)
    if path is None:
        return ""
    line = f"mhaspec replay {path} --backend {ref}"
    if state is not None:
        state.replay = line
    return "\nor: " + line


def backend_ref(impl: Cell, settings) -> str:
    """The reference ``impl``'s backend was loaded from in the run of ``settings`` (its name when
    the run does not know it): what a reproducer or a replay line names."""
    return settings.backend_refs.get(impl.backend.name, impl.backend.name)


def _save_case(directory, name: str, impl: Cell, case: Case, op: str, clause: str,
               overrides: dict, ref: str) -> pathlib.Path | None:
    """Write ``case`` as ``directory/<name>.npz`` (a replay file naming the backend reference
    ``ref``) and check that it reads back; None when there is no directory or the case cannot be
    saved."""
    fitting = failure_save.saveable(case, overrides)
    if directory is None or fitting is None:
        return None
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    path = failure_save.save_case(directory / f"{stem}.npz", impl, fitting[0], op=op,
                                  clause=clause, backend_ref=ref, overrides=fitting[1])
    try:
        failure_file.read_case(path)
    except failure_file.FailureFileError:
        path.unlink()
        return None
    return path


def save_last_call(state: ItemState, clause: str) -> str:
    """After the test ``state`` records failed: save the last case it ran (:func:`run`) unless a
    failure was saved already; returns the replay line ("" when none)."""
    if state.replay:
        return state.replay
    last = state.last_call
    if last is None:
        return ""
    impl, op, case, overrides = last
    return save_failure(impl, case, op, clause, overrides, state=state).removeprefix("\nor: ")


def save_passing_sample(state: ItemState, clause: str) -> None:
    """After the test ``state`` records passed: save the last case it ran into the run's passes
    directory (``--mhaspec-passes``; none: nothing saved), one case per passing test: a sample a
    second party can replay (``mhaspec replay``) to see the same pass."""
    if state.last_call is not None:
        impl, op, case, overrides = state.last_call
        _save_case(state.settings.passes_dir, state.name, impl, case, op, clause, overrides,
                   backend_ref(impl, state.settings))


def record_failure(clause: str, what: str, error: float, scale: float, detail: str,
                   spec: CaseSpec, *, in_empty_row: bool = False) -> None:
    """Keep what a value check found on the running test (the plugin reports it and groups
    failures by likely cause): the error, the magnitude it is relative to, expected vs got, the
    case's fields (:func:`verdicts.case_fields`) and whether the largest error lies in a row with
    no allowed key (``in_empty_row``)."""
    state = running()
    if state is not None:
        state.failure = {"clause": clause, "what": what, "error": float(error),
                         "scale": float(scale), "detail": detail, "case": repr(spec),
                         "case_fields": verdicts.case_fields(spec),
                         "in_empty_row": bool(in_empty_row)}


def in_empty_row(expected, what: str, where) -> bool:
    """Whether index ``where`` of part ``what`` of the oracle's result ``expected`` lies in a query
    row with no allowed key: every weight of that row 0 (for multi-head attention's output
    (B, L_q, d_out), in every head). False when the oracle has no weights or ``where`` is not an
    index of the output or weights."""
    weights = getattr(expected, "weights", None)
    if weights is None or where is None or what not in ("output", "weights"):
        return False
    weights = np.asarray(weights)
    if weights.ndim != 4:
        return False
    out = np.asarray(expected.out)
    if what == "weights" or out.ndim == 4:  # (B, h, L_q, ...)
        b, h, i = where[:3]
        return bool(np.all(weights[b, h, i] == 0))
    b, i = where[:2]  # multi-head output (B, L_q, d_out): every head's row
    return bool(np.all(weights[b, :, i] == 0))


def expect_oracle(impl: Cell, case: Case, got: Result, *, op: str, clause: str,
                  overrides: dict | None = None, ref: Reference | None = None,
                  context: str = "") -> None:
    """Assert ``got`` agrees with the oracle under NUM-3 (:func:`check`); the message names the
    clause, the part, the error and a reproducer (and the saved case when the run saves them).
    A float64 result whose error NUM-3 would allow in float32 says so (NUM-2's concern)."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    ref = ref or reference(case, op, impl.dtype, overrides or {})
    for what, verdict in check(impl, case, got, op=op, clause=clause, overrides=overrides, ref=ref):
        if not verdict.ok:
            scale = magnitude(case, op, ref.expected) if what == "output" else 1.0
            record_failure(clause, f"{op} {what}{context}", verdict.error, scale,
                           f"differs from the float64 oracle: {verdict.describe()}", case.spec,
                           in_empty_row=in_empty_row(ref.expected, what, verdict.where))
            saved = save_failure(impl, case, op, clause, overrides or {})
            raise AssertionError(
                f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {op} {what}{context} "
                f"differs from the float64 oracle: {verdict.describe()}"
                f"{float32_hint(impl.dtype, what, verdict, ref)}\n"
                f"reproduce with:\n{reproducer(impl, op, case.spec, overrides)}" + saved)


def expect_close(impl: Cell, case: Case, got: np.ndarray, want: np.ndarray, *, allowed: float,
                 clause: str, what: str, op: str) -> None:
    """Assert two results of the same backend agree within ``allowed`` (a property's bound; one
    that is not finite never passes, :func:`tolerance.within`)."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    error, where = tolerance.max_abs_error(got, want)
    if not tolerance.within(error, allowed):
        record_failure(clause, what, error, max(finite_max_abs(want), 1.0), f"max abs difference "
                       f"{error:.3e} at index {where}, allowed {allowed:.3e}", case.spec)
        saved = save_failure(impl, case, op, clause, {})
        raise AssertionError(
            f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {what}: max abs "
            f"difference {error:.3e} at index {where}, allowed {allowed:.3e} (twice NUM-3)\n"
            f"reproduce the base case with:\n{reproducer(impl, op, case.spec)}" + saved)



def rejection_problem(impl: Cell, op: str, case: Case, names: str | tuple[str, ...], what: str,
                      **overrides) -> str | None:
    """Make the invalid call ``run(impl, op, case, **overrides)`` (overrides of ``q``, ``k``, ``v``,
    ``query``, ``key`` or ``value`` replace the case's array) and judge it by
    :func:`call_problem`."""
    inputs = {n: overrides.pop(n) for n in ("q", "k", "v", "query", "key", "value") if n in overrides}
    return call_problem(lambda: run(impl, op, case._replace(**inputs), **overrides), names, what)


def call_problem(call, names: str | tuple[str, ...], what: str) -> str | None:
    """The rejection rule (ERR): None when the invalid ``call()`` raises ValueError whose message
    names one of ``names`` (the argument, as a word), else the problem found: accepted, another
    exception type, or a message that names no argument of ``names``."""
    names = (names,) if isinstance(names, str) else names
    try:
        call()
    except ValueError as exc:
        if not any(re.search(rf"\b{re.escape(n)}\b", str(exc)) for n in names):
            return f"{what}: message does not name {' or '.join(names)}: {str(exc)!r:.300}"
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception type is the finding
        return f"{what}: raised {type(exc).__name__} instead of ValueError: {exc!s:.300}"
    return f"{what}: accepted (no ValueError)"


def expect_rejections(impl: Cell, op: str, case: Case, clause: str, bad: list[tuple]) -> None:
    """Assert every ``(what, names, overrides)`` of ``bad`` is rejected (:func:`rejection_problem`)."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    problems = [p for what, names, kw in bad
                if (p := rejection_problem(impl, op, case, names, what, **kw)) is not None]
    assert not problems, f"[{clause}] {impl.id} {op}:\n  " + "\n  ".join(problems)
