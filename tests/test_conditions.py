"""Condition spaces (conformance/conditions.py): every testable clause declares one, the covering
rows cover their spaces, each row's case holds what it names, and a ci run records, in every cell,
every value and pair of values of every space."""

from __future__ import annotations

import pytest

from mhaspec.backends import load_backend
from mhaspec.conformance import condition_audit, conditions, covering, observation
from mhaspec.conformance.invalid_inputs import BAD_INPUTS
from mhaspec.spec import load
from suite_runner import run_suite

import oracle_backend


def test_every_testable_clause_declares_a_space():
    assert conditions.undeclared(load().testable_ids) == []
    assert conditions.undeclared(["SHAPE-1", "NO-SUCH-1"]) == ["NO-SUCH-1"]


def test_the_error_spaces_are_the_catalogues_arguments():
    catalogue: dict = {}
    for (clause, op), bad in BAD_INPUTS.items():
        catalogue.setdefault(clause, {})[op] = tuple(dict.fromkeys(b.arg.strip("'") for b in bad))
    assert catalogue == conditions.ERROR_ARGUMENTS


@pytest.mark.parametrize("clause", sorted(conditions.SPACES))
def test_covering_rows_hold_every_value_and_pair(clause):
    space = conditions.SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    wanted = set().union(*(covering.pairs(r) for r in covering.possible_rows(space, dims)))
    covered = set().union(*(covering.pairs(dict(r)) for r in covering.covering_rows(clause)))
    assert wanted <= covered
    assert all(space.possible(dict(r)) for r in covering.covering_rows(clause))


@pytest.mark.parametrize("clause", sorted(conditions.SPACES))
def test_each_rows_case_holds_the_row_and_nothing_is_rewritten(clause):
    space = conditions.SPACES[clause]
    dims = tuple(d for d in space.dimensions if d not in conditions.RECORDED)
    for row in covering.covering_rows(clause):
        spec = covering.row_spec(clause, dict(row))
        for op in space.ops or ("sdpa",):
            seen = observation.observe(spec, op, dims)
            want = {d: v for d, v in {**dict(row), "op": op}.items() if d in dims}
            assert want in seen, (row, spec, seen)


def test_a_missing_value_or_pair_is_reported():
    rows = [{"op": "sdpa", "lengths": order} for order in conditions.LENGTH_ORDERS]
    missing = condition_audit.uncovered("MASK-6", rows, {"sdpa", "mha", "causal"})
    assert "op=mha" in missing and "lengths=decode & op=mha" in missing
    assert condition_audit.uncovered("MASK-6", rows, {"sdpa", "causal"}) == []
    assert "empty_by=window (needs window)" in condition_audit.not_implemented("MASK-9", {"masks"})


def test_impossible_rows_are_not_required():
    required = condition_audit.required("MASK-9", {"sdpa", "mha", "masks", "causal", "bias",
                                                   "window", "segments"})
    assert (("empty_by", "causal_bottom_right"), ("lengths", "decode")) not in required
    assert (("bias", "none"), ("empty_by", "minus_inf_bias")) not in required
    assert (("bias", "finite"), ("empty_by", "mask")) in required


def test_free_sizes_draw_the_case_of_a_row():
    """Off the ci menu (the dev and certify profiles) a row's sizes come from the length menu."""
    from hypothesis import HealthCheck, given, settings

    # the suite's own plugin (and its profile) is not active in the project's tests: slow draws
    # (a case is built and its rows observed) are expected here, as in the suite's profiles
    @settings(max_examples=5, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(spec=covering.specs("GRAD-7"))
    def draw(spec):
        assert spec.len_q in covering.SIZES and spec.len_k in covering.SIZES

    draw()


REFS = {"numpy-batched": "numpy-batched", "oracle-reference": "oracle_backend:ORACLE_REFERENCE"}
#: clauses this run cannot hold: no NumPy autodiff (GRAD), float16 only (ERR-9), float16 and
#: bfloat16 only (GRAD-10's own test)
NOT_IN_THIS_RUN = {"GRAD-1", "GRAD-2", "ERR-9", "GRAD-10"}


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory) -> list[dict]:
    """The whole suite's ci examples (triage: ci without shrinking) in float64 and float32."""
    return run_suite(tmp_path_factory.mktemp("conditions"), list(REFS.values()),
                     "--mhaspec-partial")


def test_a_ci_run_covers_every_space_in_every_cell(ci_run):
    claims = {"numpy-batched": frozenset(load_backend("numpy-batched").capabilities),
              "oracle-reference": frozenset(oracle_backend.ORACLE_REFERENCE.capabilities)}
    cells = {(r["backend"], r["device"], r["dtype"], c) for r in ci_run for c in r["clauses"]
             if r["outcome"] in condition_audit.RAN_OUTCOMES and r.get("conditions", {}).get(c)}
    expected = set(load().testable_ids) - NOT_IN_THIS_RUN
    for backend in REFS:
        for dtype in ("float64", "float32"):
            recorded = {c for b, _, d, c in cells if (b, d) == (backend, dtype)}
            assert expected - recorded == set(), (backend, dtype, sorted(expected - recorded))
    assert condition_audit.run_gaps(ci_run, claims) == {}
