"""The tolerance rule of spec clause NUM-3, measured per case against the naive algorithm.

    e      = max |y - y*|                 error of the candidate against the float64 oracle
    e_ref  = max |naive_dtype - y*|       error of the spec's naive algorithm in the same dtype
    pass  <=>  e <= K * e_ref + C * u * kappa * S + C * lambda * N

``u`` is the dtype's unit roundoff, ``kappa`` the softmax condition (a logit ``S_ij`` carries a
rounding error of about ``u |S_ij|``, which moves the result by up to ``2 u kappa`` times the
values) and ``S`` the magnitude scale of the compared quantity;
``lambda`` is the dtype's smallest positive normal number and ``N`` the longest sum of the
computation (the subnormal allowance of NUM-5, negligible for data in the normal range). For
float64 the float64 oracle cannot see the naive algorithm's error, so ``e_ref`` is the float32
figure times ``u64 / u32`` (first-order error analysis). The reported *ratio* is
``e / (e_ref + C * u * S / K)``: a case passes iff its ratio is at most ``K``.

NUM-3 judges only where its allowance is finite. A naive run that is not finite where the oracle is
(its inputs overflow the dtype) makes ``e_ref`` infinite, and a floor beyond float64's range does
the same; the spec (1.0-1.2) is silent on both, and the suite reads them conservatively: such a
comparison is outside NUM-3's domain and never passes (:func:`within`, ratio inf), whatever the
candidate returns; ``mhaspec replay`` refuses the case before running the backend
(docs/tolerance.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

K = 16.0
C = 16.0

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
#: lambda of NUM-5: the smallest positive normal number (bfloat16 has float32's exponent range).
SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14,
                   "bfloat16": 2.0**-126}


class Comparison(NamedTuple):
    """The outcome of one comparison with the oracle."""

    ok: bool
    error: float
    ref_error: float
    allowed: float
    ratio: float
    where: tuple[int, ...] | None  # index of the largest error
    #: the candidate's value and the oracle's at ``where``, kept for a comparison that fails
    #: (None otherwise)
    values: tuple[float, float] | None = None

    def describe_values(self) -> str:
        """``got <actual> where the oracle gives <expected> at index <where>``, or "" when no
        entry differs."""
        if self.values is None or self.where is None:
            return ""
        got, want = self.values
        return f"got {got!r} where the oracle gives {want!r} at index {self.where}"

    def describe(self) -> str:
        loc = "" if self.where is None else f" at index {self.where}"
        if not math.isfinite(self.allowed):
            why = ("the inputs overflow the naive algorithm's dtype" if not
                   math.isfinite(self.ref_error) else "its floor exceeds float64's range")
            return (f"max abs error {self.error:.3e}{loc}; NUM-3 has no finite allowance here "
                    f"({why}): outside its domain, never a pass")
        return (f"max abs error {self.error:.3e}{loc}, allowed {self.allowed:.3e} "
                f"(naive-algorithm error {self.ref_error:.3e}, ratio {format_ratio(self.ratio)} "
                f"vs K={K:g})")


def format_ratio(ratio: float) -> str:
    """A NUM-3 ratio for a reader: two decimals up to 1000 (``1.01``), scientific beyond
    (``1.48e+15``), where the digits before the point say nothing."""
    return f"{ratio:.2f}" if abs(ratio) < 1000 else f"{ratio:.2e}"


def max_abs_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, tuple[int, ...] | None]:
    """Largest |actual - expected| and its index. Two non-finite values (NaN or +-inf) compare equal
    (NUM-6 asks only that the candidate is non-finite where the oracle is); a non-finite value
    against a finite one counts as inf."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"shape {actual.shape} where the spec requires {expected.shape}")
    if actual.size == 0:
        return 0.0, None
    with np.errstate(invalid="ignore"):  # inf - inf where both are non-finite
        diff = np.abs(actual - expected)
    same_nonfinite = (actual == expected) | (~np.isfinite(actual) & ~np.isfinite(expected))
    diff = np.where(same_nonfinite, 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[idx]), tuple(int(i) for i in idx)


def reference_error(dtype: str, naive_error: float) -> float:
    """``e_ref`` for ``dtype`` from the naive algorithm's measured error (float32's for float64)."""
    if dtype == "float64":
        return naive_error * UNIT_ROUNDOFF["float64"] / UNIT_ROUNDOFF["float32"]
    return naive_error


def within(error: float, allowed: float) -> bool:
    """NUM-3's test ``e <= allowed``; false where the allowance is not finite (inf or NaN: an
    overflowed naive algorithm measures nothing, so the comparison is outside NUM-3's domain and
    never a pass, whatever ``error`` is)."""
    return math.isfinite(allowed) and error <= allowed


def judge(actual: np.ndarray, expected: np.ndarray, naive, *, dtype: str, scale: float,
          sum_length: int = 0, condition: float = 1.0) -> Comparison:
    """Apply NUM-3. ``naive``: the naive algorithm's result(s) in ``dtype`` (float32 for float64),
    one array or a list (one per :func:`naive_precisions` entry); the largest error counts.
    ``sum_length``: N of the subnormal allowance (0: none); ``condition``: the softmax condition
    kappa >= 1 (the oracle's largest probability-weighted |logit| of a row, at least 1).
    An allowance that is not finite fails with ratio inf (:func:`within`)."""
    error, where = max_abs_error(actual, expected)
    runs = naive if isinstance(naive, (list, tuple)) else [naive]
    ref_error = reference_error(dtype, max(max_abs_error(n, expected)[0] for n in runs))
    floor = C * UNIT_ROUNDOFF[dtype] * condition * scale + C * SMALLEST_NORMAL[dtype] * sum_length
    allowed = K * ref_error + floor
    if not math.isfinite(allowed):
        ratio = np.inf
    else:
        ratio = error / (ref_error + floor / K) if allowed > 0 else (0.0 if error == 0 else np.inf)
    ok = within(error, allowed)
    values = None if ok or where is None else value_pair(actual, expected, where)
    return Comparison(ok, error, ref_error, allowed, float(ratio), where, values)


def value_pair(actual, expected, where: tuple[int, ...]) -> tuple[float, float]:
    """``(actual[where], expected[where])`` as Python floats (for a reader: which value was off)."""
    return float(np.asarray(actual)[where]), float(np.asarray(expected)[where])


def naive_precisions(dtype: str) -> tuple[str, ...]:
    """The precisions in which to run the naive algorithm for ``dtype``.

    float32 (and float64, scaled from it) uses two summation orders, BLAS and left to right: one
    order alone is sometimes accurate by luck on an input (measured: 20-50x below the other on
    near-tied softmax rows), which would make the reference, not the candidate, the outlier."""
    return ("float32", "float32-sequential") if dtype in ("float64", "float32") else (dtype,)


def naive_precision(dtype: str) -> str:
    """The first of :func:`naive_precisions` (for checks that afford one reference run)."""
    return naive_precisions(dtype)[0]
