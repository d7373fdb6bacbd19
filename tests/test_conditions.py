"""Condition spaces (conformance/conditions.py): the covering rows cover their spaces, each row's
case holds what it names, and a ci run records, in every cell, every value and pair of values of
every declared space."""

from __future__ import annotations

import pytest

from mhaspec.backends import load_backend
from mhaspec.conformance import conditions
from suite_runner import run_suite

import oracle_backend


@pytest.mark.parametrize("clause", sorted(conditions.SPACES))
def test_covering_rows_hold_every_value_and_pair(clause):
    space = conditions.SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    wanted = set().union(*(conditions.pairs(r) for r in conditions._rows(space, dims)))
    covered = set().union(*(conditions.pairs(dict(r)) for r in conditions.covering_rows(clause)))
    assert wanted <= covered
    assert all(space.possible(dict(r)) for r in conditions.covering_rows(clause))


@pytest.mark.parametrize("clause", sorted(conditions.SPACES))
def test_each_rows_case_holds_the_row_and_nothing_is_rewritten(clause):
    dims = conditions.SPACES[clause].dimensions
    for row in conditions.covering_rows(clause):
        spec = conditions.row_spec(clause, dict(row))
        for op in ("sdpa", "mha"):  # a space without "op" is one operation's (GRAD-7, SINK-2)
            seen = conditions.observe(spec, op, dims)
            assert {**dict(row), **({"op": op} if "op" in dims else {})} in seen, (row, spec, seen)


def test_a_missing_value_or_pair_is_reported():
    rows = [{"op": "sdpa", "lengths": order} for order in conditions.LENGTH_ORDERS]
    missing = conditions.uncovered("MASK-6", rows, {"sdpa", "mha", "causal"})
    assert "op=mha" in missing and "lengths=decode & op=mha" in missing
    assert conditions.uncovered("MASK-6", rows, {"sdpa", "causal"}) == []
    assert "empty_by=window (needs window)" in conditions.not_implemented("MASK-9", {"masks"})


def test_impossible_rows_are_not_required():
    required = conditions.required("MASK-9", {"sdpa", "mha", "masks", "causal", "bias",
                                              "window", "segments"})
    assert (("empty_by", "causal_bottom_right"), ("lengths", "decode")) not in required
    assert (("bias", "none"), ("empty_by", "minus_inf_bias")) not in required
    assert (("bias", "finite"), ("empty_by", "mask")) in required


REFS = {"numpy-batched": "numpy-batched", "oracle-reference": "oracle_backend:ORACLE_REFERENCE"}


@pytest.fixture(scope="module")
def masking_run(tmp_path_factory) -> list[dict]:
    """The chapters with declared spaces in the ci examples (triage: ci without shrinking)."""
    return run_suite(tmp_path_factory.mktemp("conditions"), list(REFS.values()),
                     "-k", "test_masking or test_window or test_alibi or test_kv_cache or "
                     "test_attention_vjp or test_sink",
                     "--mhaspec-partial")


def test_a_ci_run_covers_every_declared_space_in_every_cell(masking_run):
    claims = {"numpy-batched": frozenset(load_backend("numpy-batched").capabilities),
              "oracle-reference": frozenset(oracle_backend.ORACLE_REFERENCE.capabilities)}
    cells = {(r["backend"], r["device"], r["dtype"], c) for r in masking_run for c in r["clauses"]
             if c in conditions.SPACES and r["outcome"] in conditions.RAN_OUTCOMES}
    assert len(cells) == len(REFS) * 2 * len(conditions.SPACES), sorted(cells)
    assert conditions.run_gaps(masking_run, claims) == {}
