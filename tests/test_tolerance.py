"""The NUM-3 rule: exact results pass, results one notch worse than the naive algorithm pass,
low-precision results fail, NaN never passes."""

import numpy as np

from mhaspec.conformance import tolerance


def test_exact_result_passes_with_ratio_zero():
    y = np.array([1.0, 2.0])
    v = tolerance.judge(y, y, y + 1e-7, dtype="float32", scale=2.0)
    assert v.ok and v.ratio == 0.0


def test_k_times_naive_error_is_the_boundary():
    y = np.zeros(3)
    naive = np.array([1e-6, 0, 0])
    floor = tolerance.C * tolerance.UNIT_ROUNDOFF["float32"] * 1.0
    edge = tolerance.K * 1e-6 + floor
    assert tolerance.judge(np.array([edge * 0.999, 0, 0]), y, naive, dtype="float32", scale=1.0).ok
    assert not tolerance.judge(np.array([edge * 1.001, 0, 0]), y, naive, dtype="float32", scale=1.0).ok


def test_float64_reference_is_scaled_from_float32():
    assert tolerance.reference_error("float64", 2.0**-24) == 2.0**-53


def test_nan_where_the_oracle_is_finite_fails():
    v = tolerance.judge(np.array([np.nan]), np.array([0.5]), np.array([0.5]), dtype="float32", scale=1)
    assert not v.ok and v.error == np.inf


def test_float16_accuracy_fails_a_float32_claim():
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(1000)
    naive32 = exact.astype(np.float32).astype(np.float64)
    half = exact.astype(np.float16).astype(np.float64)
    assert not tolerance.judge(half, exact, naive32, dtype="float32", scale=4.0).ok
