"""python -m mhaspec.bench.outcomes: two runs' per-test results compared."""

from mhaspec.bench import outcomes


def _result(test="t", **changes):
    r = {"backend": "numpy-batched", "device": "cpu", "dtype": "float32", "test": test,
         "outcome": "pass", "ratios": {"MASK-1": 1.5}, "calls": 4, "examples": 2,
         "conditions": {}, "conditions_not_implemented": {}, "clauses": ["MASK-1"]}
    return {**r, **changes}


def test_identical_runs_have_no_difference():
    assert outcomes.differences([_result()], [_result(duration=9.0)]) == {}


def test_a_changed_ratio_outcome_or_missing_test_is_a_difference():
    found = outcomes.differences([_result(), _result("u")],
                                 [_result(ratios={"MASK-1": 1.5000001}, outcome="fail")])
    key = ("numpy-batched", "cpu", "float32", "t")
    assert found[key] == {"outcome": ("pass", "fail"),
                          "ratios": ({"MASK-1": 1.5}, {"MASK-1": 1.5000001})}
    assert found[(*key[:3], "u")] == {"present": (True, False)}
