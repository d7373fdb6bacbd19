"""A declared deviation is reported under its own clause and never as a failure of another clause
(conformance/governed.py): the rule as data, and two catalogue backends that declare their
mistake, run through every chapter that draws the feature."""

from __future__ import annotations

import pytest

import declared_backends
from mhaspec.conformance import governed
from mhaspec.conformance.strategies import CaseSpec
from suite_runner import run_suite


def test_a_declared_clause_withholds_its_feature_from_the_other_clauses():
    assert governed.withheld({"WIN-1"}, {"GQA-1"}) == {"window"}
    assert governed.withheld({"WIN-1"}, {"WIN-1"}) == frozenset()
    assert governed.withheld({"WIN-1"}, {"SEG-3"}, required={"window"}) == frozenset()
    assert governed.withheld({"SEG-1"}, {"SEG-2"}) == frozenset()  # SEG-2 governs segments too
    assert governed.withheld({"MASK-9", "SHAPE-4"}, {"GQA-1"}) == frozenset()
    assert governed.leaves_empty_rows({"MASK-9"}, {"GQA-1"})
    assert not governed.leaves_empty_rows({"MASK-9"}, {"MASK-9"})
    assert governed.withheld({"GRAD-7"}, {"GRAD-3"}) == frozenset()  # rows cannot be taken out
    # PARAM-1 governs the projections' biases: the other clauses' cases are built without them
    assert governed.withheld({"PARAM-1"}, {"MHA-2"}) == {governed.PROJECTION_BIASES}
    assert governed.withheld({"PARAM-1"}, {"PARAM-1"}) == frozenset()
    spec, held = governed.withhold(CaseSpec(use_bias=True), {"PARAM-1"}, {"MHA-2"})
    assert spec.use_bias is False and held == {governed.PROJECTION_BIASES}
    spec, held = governed.withhold(CaseSpec(use_bias=True), {"SOFTCAP-1"}, {"MHA-2"})
    assert spec.use_bias is True and held == {"softcap"}
    assert governed.leaves_empty_rows({"GRAD-7"}, {"GRAD-3"}, governed.EMPTY_ROW_GRADIENTS)
    assert not governed.leaves_empty_rows({"GRAD-7"}, {"GRAD-3"})  # the forward rows stay judged
    assert not governed.leaves_empty_rows({"GRAD-7"}, {"GRAD-7"}, governed.EMPTY_ROW_GRADIENTS)


CHAPTERS = ("test_window or test_alibi or test_gqa_sdpa or test_lse or test_softcap "
            "or test_segments or test_kv_cache")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    refs = [f"declared_backends:{attr}" for attr in
            ("WINDOW_OFF_BY_ONE_DECLARED", "ALIBI_SIGN_FLIPPED_DECLARED",
             "LSE_COTANGENT_REFUSED_DECLARED")]
    found = run_suite(tmp_path_factory.mktemp("governed"), refs, "-k", CHAPTERS,
                      "--mhaspec-partial")
    # the backward chapter, in the certify profile's free sizes (L_q > L_k under a bottom-right
    # causal mask empties rows in GRAD-3's and GRAD-4's cases, which the ci menu seldom does)
    return found + run_suite(tmp_path_factory.mktemp("governed_grad"),
                             ["declared_backends:EMPTY_ROWS_NAN_BACKWARD_DECLARED"],
                             "-k", "test_attention_vjp", "--mhaspec-partial",
                             "--mhaspec-shapes", "free", "--mhaspec-examples", "40")


@pytest.mark.parametrize("name", sorted(declared_backends.DECLARED))
def test_a_declared_deviation_fails_no_other_clause(results, name):
    declared = declared_backends.DECLARED[name]
    mine = [r for r in results if r["backend"] == name]
    assert mine, f"{name} did not run"
    deviating = {c for r in mine if r["outcome"] == "deviation" for c in r["clauses"]}
    assert deviating == declared
    failed = sorted({c for r in mine if r["outcome"] == "fail" for c in r["clauses"]})
    assert failed == [], f"{name} declares {sorted(declared)} only, yet failed {failed}"
