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


def test_an_overflowed_naive_algorithm_grants_no_allowance():
    """Old: a naive run that overflowed its dtype (inf where the oracle is finite) made e_ref and the
    allowance infinite, and any result passed, a wrong one too. Now the comparison is outside
    NUM-3's domain and never passes."""
    exact = np.array([0.5, 0.25])
    overflowed = np.array([np.inf, 0.25])
    for got in (exact + 1.0, exact, np.array([np.nan, 0.25])):
        v = tolerance.judge(got, exact, [exact, overflowed], dtype="float16", scale=1.0)
        assert not v.ok and v.allowed == np.inf and v.ratio == np.inf
        assert "overflow the naive algorithm's dtype" in v.describe() and "never a pass" in v.describe()


def test_a_floor_beyond_float64_or_nan_grants_no_allowance():
    y = np.array([1.0])
    assert not tolerance.judge(y + 1.0, y, y, dtype="float32", scale=1e300, condition=1e300).ok
    assert "exceeds float64's range" in tolerance.judge(y, y, y, dtype="float32", scale=1e300,
                                                         condition=1e300).describe()
    assert not tolerance.judge(y, y, y, dtype="float32", scale=float("nan")).ok
    assert tolerance.within(0.0, 0.0) and not tolerance.within(0.0, np.inf)
    assert not tolerance.within(0.0, np.nan)


def test_a_wrong_result_on_a_case_that_overflows_float16_never_conforms():
    """End to end through the suite's one judgement (harness.check): q and k 300x a drawn case make
    the float16 naive logits overflow (inf) where the float64 oracle is finite. Old: allowed inf,
    an output off by one conformed."""
    from mhaspec.backends.np_backend import BATCHED
    from mhaspec.conformance import harness
    from mhaspec.conformance.strategies import CaseSpec

    impl = harness.Cell(BATCHED, "cpu", "float16")
    drawn = impl.case(CaseSpec(), "sdpa")
    case = drawn._replace(q=drawn.q * 300, k=drawn.k * 300)
    with np.errstate(all="ignore"):
        ref = harness.reference(case, "sdpa", "float16", {})
        assert np.isfinite(ref.expected.out).all() and not np.isfinite(ref.naive[0].out).all()
        wrong = ref.expected._replace(out=ref.expected.out + 1.0)
        checks = harness.check(impl, case, wrong, op="sdpa", clause="SDPA-1", ref=ref)
    assert [c.what for c in checks] == ["output", "weights"]
    assert not any(c.verdict.ok for c in checks)
