"""Sub-cases of a capability (mhaspec.backends.sub_cases): the rule as data, its check as a claim,
and a backend whose windows work only with a causal mask, certified through the window, segment
and cache chapters: the rest of windows is not implemented, never a pass or a failure, and the
record says which supported calls took the library's own path and which the generic one; and a
backend whose cache needs d_v = d_k: stated as a shape rule, the other cached calls are not
implemented; unstated, its NotImplementedError fails CACHE-1."""

from __future__ import annotations

import pytest

from mhaspec.backends.sub_cases import Sizes, check_rules, judge
from mhaspec.claims import ClaimError, _sub_cases
from suite_runner import run_suite

RULES = {"window": {"with": ("causal",), "generic": ("q_segment_ids",)}}


def test_a_call_outside_the_declared_sub_cases_is_not_supported():
    assert judge(RULES, {"window", "alignment"}) == (["window without causal"], {})
    assert judge(RULES, {"window", "causal"}) == ([], {"window": "library"})
    assert judge(RULES, {"window", "causal", "q_segment_ids"}) == ([], {"window": "generic"})
    assert judge(RULES, {"mask"}) == ([], {})
    assert judge({"softcap": {"without": ("mask",)}}, {"softcap", "mask"})[0] == [
        "softcap with mask"]


def test_a_shape_rule_judges_the_sizes_of_a_call_using_its_capability():
    rules = {"kv_cache": {"shapes": ("d_v == d_k",)}, "sdpa": {"shapes": ("d_k <= 256",)}}
    square, wide = Sizes(2, 2, 3, 3, 4, 4), Sizes(2, 2, 3, 3, 4, 5)
    assert judge(rules, {"past_key", "past_value"}, "sdpa", wide) == (
        ["kv_cache with d_v != d_k"], {})
    assert judge(rules, {"past_key", "past_value"}, "sdpa", square) == ([], {"kv_cache": "library"})
    assert judge(rules, {"mask"}, "sdpa", wide) == ([], {})  # no cache: the rule does not apply
    assert judge(rules, set(), "sdpa", Sizes(1, 1, 1, 1, 512, 4))[0] == ["sdpa with d_k > 256"]
    assert judge(rules, set(), "mha", Sizes(1, 1, 1, 1, 512, 4)) == ([], {})


def test_rules_are_checked_as_claims():
    assert check_rules({"window": {"with": "causal"}}) == {"window": {"with": ("causal",)}}
    for bad in ({"windows": {}}, {"window": {"only": ("causal",)}},
                {"window": {"with": ("casual",)}}, ["window"],
                {"kv_cache": {"shapes": ("d_v = d_k",)}}, {"kv_cache": {"with": ("d_v == d_k",)}}):
        with pytest.raises(ClaimError, match="sub_cases"):
            _sub_cases(bad)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_suite(tmp_path_factory.mktemp("sub_cases"),
                     ["sub_case_backends:WINDOW_ONLY_WITH_CAUSAL"],
                     "-k", "test_window or test_segments or test_kv_cache", "--mhaspec-partial")


def test_unsupported_sub_cases_are_not_implemented_never_failures(results):
    assert results
    assert not [r["test"] for r in results if r["outcome"] == "fail"]
    win1 = {r["outcome"] for r in results if "WIN-1" in r["clauses"]}
    assert win1 == {"pass", "not-implemented"}, win1  # the clause's example has no causal mask
    left_out = {v for r in results for vs in r.get("conditions_not_implemented", {}).values()
                for v in vs}
    assert any(v.startswith("sub-case window without causal") for v in left_out), left_out


def test_the_record_names_the_path_of_the_supported_calls(results):
    paths = {row["path"] for r in results for rows in r.get("conditions", {}).values()
             for row in rows if "path" in row}
    assert {"window=library", "window=generic"} <= paths, paths


@pytest.fixture(scope="module")
def cache_results(tmp_path_factory) -> list[dict]:
    return run_suite(tmp_path_factory.mktemp("shapes"),
                     ["sub_case_backends:CACHE_NEEDS_EQUAL_WIDTHS",
                      "sub_case_backends:CACHE_LIMIT_UNSTATED"],
                     "-k", "test_kv_cache or test_cache_gradients", "--mhaspec-partial")


def test_a_stated_shape_limit_is_not_implemented_an_unstated_one_fails(cache_results):
    by = {name: [r for r in cache_results if r["backend"] == name]
          for name in ("cache-needs-equal-widths", "cache-limit-unstated")}
    stated, unstated = by["cache-needs-equal-widths"], by["cache-limit-unstated"]
    assert stated and unstated
    assert not [r["test"] for r in stated if r["outcome"] == "fail"]
    assert {r["outcome"] for r in stated if "CACHE-1" in r["clauses"]} >= {"pass"}
    left_out = {v for r in stated for vs in r.get("conditions_not_implemented", {}).values()
                for v in vs}
    assert any(v.startswith("sub-case kv_cache with d_v != d_k") for v in left_out), left_out
    failed = {c for r in unstated if r["outcome"] == "fail" for c in r["clauses"]}
    assert "CACHE-1" in failed, failed


def test_the_backward_pass_follows_the_same_shape_rule(cache_results):
    """attention_vjp with a cache (GRAD-6's cache test): the stated limit is not implemented and
    the other draws pass; unstated, the NotImplementedError fails the clause."""
    def grads(name):
        return [r for r in cache_results if r["backend"] == name and "GRAD-6" in r["clauses"]]
    stated, unstated = grads("cache-needs-equal-widths"), grads("cache-limit-unstated")
    assert stated and unstated
    assert {r["outcome"] for r in stated} == {"pass"}, [r["outcome"] for r in stated]
    left_out = {v for r in stated for vs in r.get("conditions_not_implemented", {}).values()
                for v in vs}
    assert any(v.startswith("sub-case kv_cache with d_v != d_k") for v in left_out), left_out
    assert {r["outcome"] for r in unstated} == {"fail"}


@pytest.fixture(scope="module")
def direct_results(tmp_path_factory) -> list[dict]:
    return run_suite(tmp_path_factory.mktemp("direct"),
                     ["sub_case_backends:SQUARE_ONLY", "sub_case_backends:SQUARE_ONLY_UNSTATED"],
                     "-k", "test_inputs or test_legacy_offset_is_exactly_minus_1e9 and sdpa",
                     "--mhaspec-partial")


def test_direct_calls_follow_the_rules_as_drawn_cases_do(direct_results):
    """INPUT-1's calls of the operations and their gradients, and MASK-3's hand-built case (L_q
    = 1, L_k = 2), go through the same sub-case judgement as every other call: stated, the calls
    with L_q != L_k are not implemented and the rest pass; unstated, they fail."""
    def of(name, clause):
        return [r for r in direct_results if r["backend"] == name and clause in r["clauses"]]
    stated = of("square-only", "INPUT-1")  # mha_vjp's test: not implemented (no "grad" claimed)
    assert {r["outcome"] for r in stated} == {"pass", "not-implemented"}, [
        (r["test"], r["outcome"]) for r in stated]
    left_out = {v for r in stated for vs in r.get("conditions_not_implemented", {}).values()
                for v in vs}
    assert any(v.startswith("sub-case sdpa with L_q != L_k") for v in left_out), left_out
    assert {r["outcome"] for r in of("square-only", "MASK-3")} == {"not-implemented"}
    assert "fail" in {r["outcome"] for r in of("square-only-unstated", "INPUT-1")}
    assert {r["outcome"] for r in of("square-only-unstated", "MASK-3")} == {"fail"}
