"""Sub-cases of a capability (mhaspec.backends.sub_cases): the rule as data, its check as a claim,
and a backend whose windows work only with a causal mask, certified through the window, segment
and cache chapters: the rest of windows is not implemented, never a pass or a failure, and the
record says which supported calls took the library's own path and which the generic one."""

from __future__ import annotations

import pytest

from mhaspec.backends.sub_cases import check_rules, judge
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


def test_rules_are_checked_as_claims():
    assert check_rules({"window": {"with": "causal"}}) == {"window": {"with": ("causal",)}}
    for bad in ({"windows": {}}, {"window": {"only": ("causal",)}},
                {"window": {"with": ("casual",)}}, ["window"]):
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
