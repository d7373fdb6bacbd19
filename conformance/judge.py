"""Judging: a result against the float64 oracle under NUM-3 (:func:`check`, :func:`allowance`).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

:func:`reference` computes what a result is compared with: the float64 oracle and the naive
algorithm in the precisions :func:`tolerance.naive_precisions` gives (:func:`oracle_result`, cached
by case). :func:`check` judges every part of a result and returns the verdicts; it raises nothing
for a mismatch (:mod:`.expect` turns a failed verdict into the test's failure).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from mhaspec.backends.claim_readers import OPS, cell_deviations, op_deviations
from mhaspec.spec import oracle, oracle_vjp

from . import governed, tolerance
from .cell import Cell, Result
from .item_state import record_ratio, running_clauses
from .strategies import Case, CaseSpec, build_case


def oracle_result(case: Case, op: str, precision: str = "float64", **overrides) -> Result:
    """The oracle (or the naive algorithm in ``precision``) on ``case``; cached for unmodified
    cases. ``overrides`` as for :func:`run` (NumPy arrays)."""
    if not overrides and case is build_case(case.spec):
        return _cached_oracle(case.spec, op, precision)
    return _run_oracle(case, op, precision, **overrides)


#: oracle results kept: every case of a ci run, so that the next cell finds the results of the
#: same cases (the run goes cell by cell, :mod:`.scheduling`); a few kB each, shapes up to 8
ORACLE_CACHE_SIZE = 8192


@functools.lru_cache(maxsize=ORACLE_CACHE_SIZE)
def _cached_oracle(spec: CaseSpec, op: str, precision: str) -> Result:
    return _run_oracle(build_case(spec), op, precision)


def clear_oracle_cache() -> None:
    """Forget the cached oracle results (a benchmark run computes its own)."""
    _cached_oracle.cache_clear()


def oracle_info(case: Case, op: str) -> dict:
    """What the float64 oracle records of ``case`` beside its result (:func:`oracle.note_head`):
    ``logit_condition`` (NUM-3) and ``largest_logit`` (NUM-4)."""
    info: dict = {}
    _run_oracle(case, op, "float64", info=info)
    return info


def _run_oracle(case: Case, op: str, precision: str, info: dict | None = None, **overrides) -> Result:
    """The oracle's result; NUM-3's condition only for the float64 oracle (the judge reads none
    of a naive run's, :class:`Result`), so a naive run does not compute it. ``info``: a dict the
    float64 oracle fills (:func:`oracle_info`)."""
    kw = {**case.call_kwargs(), **overrides}
    if precision != "float64":
        info = None
    elif info is None:
        info = {}
    if kw.get("sinks") is not None:  # spec 1.3: attention sinks (SINK-1), sdpa only
        return _oracle_with_sinks(case, precision, kw)
    if kw.pop("lse", False) or any(kw.get(name) is not None for name in oracle.FEATURES):
        res = _oracle_result(case, op, precision, info, kw)  # spec 1.2: lse and the cache too
    elif op == "sdpa":
        res = oracle.attention(case.q, case.k, case.v, precision=precision, info=info, **kw)
    elif op == "mha":
        params = kw.pop("params", case.params)
        res = oracle.multi_head_attention(case.query, case.key, case.value, params,
                                          num_heads=case.spec.heads, precision=precision,
                                          info=info, **kw)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return Result(*res[:2], 1.0 if info is None else max(1.0, info.get("logit_condition", 0.0)),
                  *res[2:])


def _oracle_with_sinks(case: Case, precision: str, kw: dict) -> Result:
    """The sdpa oracle with ``kw["sinks"]`` (``oracle_vjp.attention_with_sinks``); NUM-3's
    condition is that of the call without sinks or the largest |sink|, whichever is larger.
    The sequential float32 order is float32's (the sink oracle has one summation order)."""
    kw = dict(kw)
    sinks, _ = kw.pop("sinks"), kw.pop("lse", None)
    res = oracle_vjp.attention_with_sinks(case.q, case.k, case.v, sinks=sinks,
                                          precision=precision.removesuffix("-sequential"), **kw)
    if precision != "float64":  # a naive run: its condition is not read
        return Result(*res[:2], 1.0, *res[2:])
    info: dict = {}
    oracle.attention_result(case.q, case.k, case.v, precision=precision, info=info, **kw)
    condition = max(1.0, info.get("logit_condition", 0.0), float(np.max(np.abs(sinks))))
    return Result(*res[:2], condition, *res[2:])


def _oracle_result(case: Case, op: str, precision: str, info: dict, kw: dict):
    """The oracle's :class:`~mhaspec.spec.oracle.AttentionResult` of ``op`` on ``case``."""
    if op == "sdpa":
        return oracle.attention_result(case.q, case.k, case.v, precision=precision, info=info,
                                       **kw)
    if op == "mha":
        params = kw.pop("params", case.params)
        return oracle.multi_head_attention_result(case.query, case.key, case.value, params,
                                                  num_heads=case.spec.heads, precision=precision,
                                                  info=info, **kw)
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


class Reference(NamedTuple):
    """What NUM-3 compares a result with: the float64 oracle and the naive algorithm's results in
    each precision :func:`tolerance.naive_precisions` gives for the dtype."""

    expected: Result
    naive: list[Result]


def reference(case: Case, op: str, dtype: str, overrides: dict | None = None) -> Reference:
    """The oracle and naive results for one check (each computed once)."""
    overrides = overrides or {}
    return Reference(oracle_result(case, op, **overrides),
                     [oracle_result(case, op, p, **overrides) for p in tolerance.naive_precisions(dtype)])


def magnitude(case: Case, op: str, expected: Result) -> float:
    """NUM-3's magnitude scale: the largest finite magnitude among the oracle's output and the
    attended values (non-finite entries, NUM-6, are judged by class, not by size)."""
    values = case.v if op == "sdpa" else case.value
    return max(finite_max_abs(expected.out), finite_max_abs(values))


def same_bits(before: np.ndarray, after: np.ndarray) -> bool:
    """Equal shape, dtype and bits, except that NaN equals NaN whatever its payload (INPUT-1's
    unchanged inputs, DET-1's repeated results)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    if before.dtype.kind != "f":
        return bool(np.array_equal(before, after))
    both_nan = np.isnan(before) & np.isnan(after)
    bits = before.view(f"u{before.dtype.itemsize}") == after.view(f"u{after.dtype.itemsize}")
    return bool(np.all(bits | both_nan))


def finite_max_abs(x: np.ndarray) -> float:
    """The largest magnitude among the finite entries of ``x`` (0 when none)."""
    x = np.asarray(x)
    return float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))


def sum_length(spec: CaseSpec) -> int:
    """N of NUM-3's subnormal allowance: the longest sum of the computation."""
    return max(spec.len_k, spec.d_k, spec.heads * spec.d_v, spec.d_model, spec.k_dim, spec.v_dim)


def allowance(case: Case, op: str, impl: Cell, ref: Reference | None = None) -> tuple[float, float]:
    """NUM-3's allowed absolute error for (output, weights) of this case in ``impl.dtype``."""
    ref = ref or reference(case, op, impl.dtype)
    expected, length = ref.expected, sum_length(case.spec)
    out = tolerance.judge(expected.out, expected.out, [n.out for n in ref.naive], dtype=impl.dtype,
                          scale=magnitude(case, op, expected), sum_length=length,
                          condition=expected.condition)
    w = tolerance.judge(expected.weights, expected.weights, [n.weights for n in ref.naive],
                        dtype=impl.dtype, scale=1.0, sum_length=length, condition=expected.condition)
    return out.allowed, w.allowed


class Check(NamedTuple):
    """One judged part of a result: ``what`` is "output", "weights", "lse", "present_key" or
    "present_value" (spec 1.2), or "present_lengths" (compared exactly)."""

    what: str
    verdict: tolerance.Comparison


def lse_scale(lse: np.ndarray) -> float:
    """LSE-1's magnitude scale: max(1, max |lse_i|) over the finite entries."""
    return max(1.0, finite_max_abs(lse))


def lse_for_comparison(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``got`` with every entry that is not -inf where the oracle's is -inf (an empty row, LSE-1)
    replaced by 0, so it counts as an infinite error: -inf compares equal only to -inf."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != np.shape(expected):
        return got
    return np.where((expected == -np.inf) & (got != -np.inf), 0.0, got)


def _exact(got: np.ndarray, want: np.ndarray) -> tolerance.Comparison:
    """Integer results (present_lengths, CACHE-1): equal or not."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} where the spec requires {want.shape}")
    wrong = np.argwhere(got != want)
    where = None if wrong.size == 0 else tuple(int(i) for i in wrong[0])
    error = 0.0 if where is None else float(np.max(np.abs(got.astype(np.float64) - want)))
    values = None if where is None else tolerance.value_pair(got, want, where)
    return tolerance.Comparison(where is None, error, 0.0, 0.0, 0.0 if where is None else np.inf,
                                where, values)


def check(impl: Cell, case: Case, got: Result, *, op: str, clause: str,
          overrides: dict | None = None, ref: Reference | None = None) -> list[Check]:
    """Judge ``got`` (from :func:`run` with the same ``overrides``) against the oracle under NUM-3:
    the output, and the weights when returned; with spec 1.2's outputs also the log-sum-exp (scale
    of LSE-1) and the present cache (scale: its largest magnitude; its lengths exactly). Returns
    one :class:`Check` per part, in that order; records the worst ratio for ``clause`` on the
    running test; raises nothing for a mismatch.

    Stable interface: ``ref`` lets a caller that already computed :func:`reference` (or the
    oracle of a modified call, e.g. grouped heads) pass it; otherwise it is computed once here.
    Non-finite oracle results (NUM-6) must be non-finite in ``got`` too; weight rows whose oracle
    row is not finite are not compared (NUM-6 leaves them free). A result of the wrong shape
    raises ``AssertionError`` naming both shapes."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    overrides = overrides or {}
    ref = ref or reference(case, op, impl.dtype, overrides)
    expected, naive = ref.expected, ref.naive
    empty = rows_left_to_mask9(impl, op, expected, clause)
    rows = None if empty is None else empty.any(axis=1) if op == "mha" else empty
    outputs = unjudged([got.out, expected.out, *(n.out for n in naive)],
                        None if rows is None else rows[..., None])
    parts = [("output", outputs[0], outputs[1], outputs[2:], magnitude(case, op, expected))]
    if got.weights is not None:
        free = ~np.all(np.isfinite(expected.weights), axis=-1)
        free = free if empty is None else free | empty
        weights = unjudged([got.weights, expected.weights, *(n.weights for n in naive)],
                            free[..., None])
        parts.append(("weights", weights[0], weights[1], weights[2:], 1.0))
    if got.lse is not None:
        lses = unjudged([lse_for_comparison(got.lse, expected.lse), expected.lse,
                          *(n.lse for n in naive)], empty)
        parts.append(("lse", lses[0], lses[1], lses[2:], lse_scale(expected.lse)))
    for what in ("present_key", "present_value"):
        mine, want = getattr(got, what), getattr(expected, what)
        if mine is not None or want is not None:
            if mine is None or want is None:
                raise AssertionError(f"{what} {'missing' if mine is None else 'returned'} where "
                                     f"the spec {'requires' if mine is None else 'has'} one")
            parts.append((what, mine, want, [getattr(n, what) for n in naive],
                          finite_max_abs(want)))
    checks = judge_parts(parts, dtype=impl.dtype, clause=clause, sum_length=sum_length(case.spec),
                         condition=expected.condition)
    if expected.present_lengths is not None:
        if got.present_lengths is None:
            raise AssertionError("present_lengths missing where the spec requires it (CACHE-1)")
        checks.append(Check("present_lengths", _exact(got.present_lengths, expected.present_lengths)))
    return checks


def judge_parts(parts, *, dtype: str, clause: str, sum_length: int = 0,
                condition: float = 1.0) -> list[Check]:
    """One :class:`Check` per ``(what, got, expected, naive, scale)`` of ``parts`` under NUM-3
    (:func:`tolerance.judge`; ``naive``: one array or one per naive precision), recording the
    worst ratio for ``clause`` on the running test. The parts of :func:`check`, and of any other
    result judged like an output (GRAD-1's gradients)."""
    checks = []
    for what, actual, exp, nv, scale in parts:
        verdict = tolerance.judge(actual, exp, nv, dtype=dtype, scale=scale, sum_length=sum_length,
                                  condition=condition)
        record_ratio(clause, verdict.ratio)
        checks.append(Check(what, verdict))
    return checks


def rows_left_to_mask9(impl: Cell, op: str, expected: Result, clause: str | None = None,
                       subject: str = governed.EMPTY_ROWS) -> np.ndarray | None:
    """The oracle's fully masked rows (no allowed key: all-zero weights, MASK-9) as a boolean
    ``(B, h, L_q)``, when the cell declares a deviation for ``op`` of a clause governing them
    (:mod:`.governed`; ``subject``: the rows, or with :data:`.governed.EMPTY_ROW_GRADIENTS` the
    gradients they reach, GRAD-7) that the check of ``clause`` (default: the running test's
    clauses) is not; else None. Such a backend's behaviour on those rows is MASK-9's verdict (its
    own test reports the deviation), so the other clauses -- a window, segments or lengths can
    leave a row empty -- judge the other rows only."""
    deviations = op_deviations(cell_deviations(impl.backend, impl.device, impl.dtype), op)
    judging = running_clauses() if clause is None else {clause}
    if not governed.leaves_empty_rows(deviations, judging, subject) or expected.weights is None:
        return None
    empty = ~np.any(expected.weights != 0, axis=-1)
    return empty if empty.any() else None


def unjudged(arrays: list, where) -> list:
    """``arrays`` (a result, the oracle's and the naive ones; None stays None) set to 0 where the
    boolean ``where`` (same rank, broadcasting; None: nowhere) holds, so that the comparison leaves
    those entries out. A result of another shape is left for the shape check."""
    if where is None or not where.any() or arrays[0] is None or np.ndim(arrays[0]) != where.ndim \
            or any(w not in (1, a) for w, a in zip(where.shape, np.shape(arrays[0]))):
        return arrays
    return [None if a is None else np.where(where, 0.0, a) for a in arrays]


def float32_hint(dtype: str, what: str, verdict: tolerance.Comparison, ref: Reference) -> str:
    """For a float64 failure within float32's error: a note that the result has float32
    accuracy, i.e. a float64 path that rounds through float32 (NUM-2); "" otherwise."""
    if dtype != "float64" or what not in ("output", "weights", "lse") \
            or not np.isfinite(verdict.error) or not np.isfinite(verdict.allowed):
        return ""
    naive32 = max(tolerance.max_abs_error(getattr(n, _FIELD.get(what, what)),
                                          getattr(ref.expected, _FIELD.get(what, what)))[0]
                  for n in ref.naive if getattr(n, _FIELD.get(what, what)) is not None)
    if verdict.error <= tolerance.K * max(naive32, verdict.allowed):
        return (f"; the error is of float32's size (naive float32 error {naive32:.3e}): a float64 "
                f"path that rounds through float32 (NUM-2)")
    return ""


_FIELD = {"output": "out"}
